#!/usr/bin/env bash
# The man page the build makes (scripts/manpage: docs/dtrain.1.in around every command's --help)
# renders without warnings and lists every flag of every command.
. "$(dirname "$0")/lib.sh"
page=${DTRAIN_MAN:-build/dtrain.1}
check "the build made $page" [ -s "$page" ]
MANWIDTH=100 man --warnings -l "$page" >"$tmp/page" 2>"$tmp/warnings"
check "man renders it" [ -s "$tmp/page" ]
check "without warnings" [ ! -s "$tmp/warnings" ]
grep -q "dtrain $("$bin" version | awk '{ print $2 }')" "$tmp/page" && ok "it names the CLI's version" \
  || bad "it names the CLI's version"
missing=
for c in $("$bin" --help | awk '/^commands:/ { on = 1; next } on && /^  [a-z]/ { print $1 }'); do
  grep -q "^   dtrain $c\$" "$tmp/page" || missing="$missing $c"
  for f in $("$bin" "$c" --help 2>/dev/null | awk '/^  --[a-z0-9_]+ / { print $1 }'); do
    grep -qE "^ +$f\b" "$tmp/page" || missing="$missing $c$f"
  done
done
[ -z "$missing" ] && ok "every command and flag of --help is in the page" || bad "missing from the page:$missing"
summary

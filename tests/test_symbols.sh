#!/usr/bin/env bash
# libdtrain.so exports the public API and nothing else: every dynamic symbol it defines starts with
# dt_ and is declared in include/dtrain.h, and every function that header declares is exported
# (the library is built with -fvisibility=hidden; dtrain.h marks its declarations default).
. "$(dirname "$0")/lib.sh"
so=${DTRAIN_SHARED:-build/libdtrain.so}
header=${DTRAIN_SRC:-.}/include/dtrain.h
cc=${DTRAIN_CC:-cc}

# The fuzz build's coverage instrumentation makes the linker define its sections' bounds
# (__start___sancov_*): not the library's symbols.
nm -D --defined-only "$so" | awk 'NF == 3 && $3 !~ /^__(start|stop)___sancov_/ { print $3 }' | sort -u >"$tmp/exported"
# The header's functions, comments stripped by the preprocessor.
"$cc" -E -P "$header" | grep -oE '\bdt_[a-z0-9_]+ *\(' | tr -d '( ' | sort -u >"$tmp/declared"
check "nm -D lists the library's symbols" [ -s "$tmp/exported" ]
check "the header declares functions" [ -s "$tmp/declared" ]

others=$(grep -v '^dt_' "$tmp/exported" | tr '\n' ' ')
[ -z "$others" ] && ok "every exported symbol starts with dt_ ($(wc -l <"$tmp/exported") of them)" \
  || bad "symbols exported without the dt_ prefix: $others"
internal=$(comm -23 "$tmp/exported" "$tmp/declared" | tr '\n' ' ')
[ -z "$internal" ] && ok "every exported symbol is declared in dtrain.h" || bad "exported but internal: $internal"
hidden=$(comm -13 "$tmp/exported" "$tmp/declared" | tr '\n' ' ')
[ -z "$hidden" ] && ok "every function of dtrain.h is exported" || bad "declared in dtrain.h but not exported: $hidden"
# Names the issue found exported before the library hid its internals.
for sym in relu_forward conv2d_forward softmax_xent dt_relu_forward dt_conv2d_forward dt_cluster_clear dt_serve_task; do
  grep -qx "$sym" "$tmp/exported" && bad "internal $sym is exported" || ok "internal $sym is hidden"
done
summary

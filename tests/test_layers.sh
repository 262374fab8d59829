# The folders of src/ form layers (docs/architecture.md): a file includes headers of its own folder
# or of folders below it, never above, so the arrows between modules run one way.
. "$(dirname "$0")/lib.sh"
order="cli api plot export train supervisor worker ps metrics update cluster transport data model compute io stats core"
rank() { local i=0 f; for f in $order; do [ "$f" = "$1" ] && { echo $i; return; }; i=$((i + 1)); done; echo -1; }
# upward ROOT: prints each include under ROOT/ that goes from a folder to one above it. One awk
# pass over grep's lines: a shell loop forking per include took ~50 s in CI.
upward() {
  grep -rn '#include "' "$1" | awk -v order="$order" '
    BEGIN { n = split(order, o, " "); for (i = 1; i <= n; i++) r[o[i]] = i - 1 }
    {
      file = $0; sub(/:.*/, "", file)
      k = split(file, parts, "/"); from = parts[k - 1]
      if (!match($0, /#include "[a-z_]*\//)) next
      to = substr($0, RSTART + 10, RLENGTH - 11)
      if (to == from) next
      rt = (to in r) ? r[to] : -1; rf = (from in r) ? r[from] : -1
      if (rt < rf) print file " includes " to "/ (above " from "/)"
    }'
}
for d in src/*/; do
  d=$(basename "$d")
  check "src/$d has a place in the layer order" [ "$(rank "$d")" -ge 0 ]
done
# Each folder's README.md says what it owns and ends with the folders it uses; that line must stay
# true: exactly the folders its files include from.
uses_of() { grep -rh '#include "' "src/$1" | sed -n 's/.*#include "\([a-z_]*\)\/.*/\1/p' | grep -vx "$1" | sort -u | tr '\n' ' '; }
said_of() { sed -n 's/^Uses (includes from): //p' "src/$1/README.md" | grep -o '`[a-z_]*/`' | tr -d '`/' | sort -u | tr '\n' ' '; }
for d in src/*/; do
  d=$(basename "$d")
  check "src/$d/README.md says what the folder owns" test -s "src/$d/README.md"
  [ -f "src/$d/README.md" ] || continue
  check "src/$d/README.md names the folders it uses ($(uses_of "$d"))" test "$(said_of "$d")" = "$(uses_of "$d")"
done
found=$(upward src)
[ -z "$found" ] || echo "$found"
check "no folder includes one above it" [ -z "$found" ]
# The scan itself can fail: an include from core/ up to train/ in a scratch tree is reported.
mkdir -p "$tmp/src/core" "$tmp/src/train"
printf '#include "core/error.h"\n#include "train/train.h"\n' >"$tmp/src/core/bad.c"
printf '#include "core/error.h"\n' >"$tmp/src/train/ok.c"
found=$(upward "$tmp/src")
check "an upward include is reported" [ "$(echo "$found" | grep -c 'bad.c includes train/')" = 1 ]
check "a downward include is not" [ "$(echo "$found" | grep -c 'ok.c')" = 0 ]
summary

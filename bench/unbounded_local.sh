#!/usr/bin/env bash
# Unbounded ids in one process (docs/sparse.md, "Unbounded ids"): training examples/s of
# models/lr_unbounded.model (26 tables of unbounded ids held in this process's hash tables, a compact
# net whose blocks are filled per batch) against models/lr.model (the same logistic regression, its ids
# hashed into flat tables of 2^20 rows), one process, the same generated click log, one epoch each,
# rounds interleaved (lr, lr_unbounded, no_admission, lr, ...), the median of each, and the maximum
# resident set. no_admission is lr_unbounded without min_count= (every id admitted at once): no
# count-min sketch (26 x 64 MiB at capacity 2^22), whose random reads and first touches cost most of
# lr_unbounded's step here (the same code and cost as on a ps task). mixed_flat and mixed_compact: lr
# with field 25 in a table of its own, of 2^20 buckets (every table flat) or of unbounded ids (then
# every table compact, the 25 hashed ones held as the ps holds them): what a model pays for one
# table of unbounded ids.
#
#   bench/unbounded_local.sh [BUILD_DIR] [ROUNDS] [LINES]   (default build, 3 rounds, 300000 lines)
set -eu
bin=$(cd "${1:-build}" && pwd)/dtrain
rounds=${2:-3}
lines=${3:-300000}
src=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
uptime
"$bin" gen-clicks --out "$tmp/clicks.tsv" --lines "$lines" --seed 7 >/dev/null
cp "$src/models/lr.model" "$src/models/lr_unbounded.model" "$tmp/"
sed 's/ min_count=2//' "$src/models/lr_unbounded.model" >"$tmp/no_admission.model"
mixed() { # mixed LAST: lr with field 25 in a table of its own, LAST its rows (buckets=N or capacity=N)
  cat <<EOM
model mixed
input dense=13 fields=26
embedding name=weights dim=1 buckets=1048576 fields=0-24 combiner=sum weight_init=constant(0)
reduce_sum name=ids
embedding name=last input=input dim=1 $1 fields=25 combiner=sum weight_init=constant(0)
reduce_sum name=ids2
dense name=linear input=input units=1 weight_init=constant(0)
add input=ids,ids2,linear
EOM
}
mixed buckets=1048576 >"$tmp/mixed_flat.model"
mixed capacity=1048576 >"$tmp/mixed_compact.model"
run() { # run MODEL: one epoch, "examples/s rss_kb"
  /usr/bin/time -f "%M" -o "$tmp/rss" "$bin" train --data "$tmp/clicks.tsv" --model "$tmp/$1.model" \
    --batch_size 256 --epochs 1 --steps_to_validate 1000000 --threads 1 --logdir "" --summary_dir "" >"$tmp/out" 2>&1 ||
    { tail -5 "$tmp/out"; exit 1; }
  echo "$(sed -nE 's/^trained .* \(([0-9.]+) examples\/sec\).*/\1/p' "$tmp/out") $(cat "$tmp/rss")"
}
median() { sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
models=(lr lr_unbounded no_admission mixed_flat mixed_compact)
for m in "${models[@]}"; do : >"$tmp/$m.eps"; done
for ((r = 1; r <= rounds; r++)); do
  for m in "${models[@]}"; do
    read -r eps rss < <(run "$m")
    echo "round $r $m: $eps examples/s, max rss $((rss / 1024)) MiB"
    echo "$eps" >>"$tmp/$m.eps"
  done
done
a=$(median <"$tmp/lr.eps")
for m in "${models[@]}"; do
  b=$(median <"$tmp/$m.eps")
  echo "median $m: $b examples/s, $(awk -v a="$a" -v b="$b" 'BEGIN { printf "%.3f", b / a }') of lr's"
done
grep -E '^tables:' "$tmp/out" || true
uptime

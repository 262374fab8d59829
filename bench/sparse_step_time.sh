#!/usr/bin/env bash
# Table size does not matter (issue 22, "Numbers"): the step time of a 1 ps + 2 sync worker cluster
# (`dtrain launch`, 127.0.0.1) training models/fm.model with 10^6 rows in all its tables against
# 10^8 (each of the 52 tables, 26 fields x weights and factors, gets a 52nd of the rows), on the
# same generated click log (--vocab 10^6 ids per field, Zipf 1.1: the small tables evict, the large
# ones grow), ROUNDS rounds in alternating order. Prints each run's per-step time (the workers' mean
# of compute + exchange, from their end lines) and the ratio of the medians.
# Usage: bench/sparse_step_time.sh [ROUNDS] [LINES] [BUILD_DIR]   (repository root)
set -u
R=${1:-3} LINES=${2:-300000}
bin=${3:-build}/dtrain
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$bin" gen-clicks --out "$tmp/clicks.tsv" --lines "$LINES" --model fm --seed 7 >"$tmp/gen" 2>&1 || { cat "$tmp/gen"; exit 1; }
for rows in 1000000 100000000; do
  per=$(((rows + 51) / 52))
  sed -e "s/buckets=1048576/buckets=$per/" -e "s/buckets=262144/buckets=$per/" models/fm.model >"$tmp/fm-$rows.model"
done
echo "uptime: $(uptime)"
for r in $(seq 1 "$R"); do
  for k in 0 1; do
    rows=$([ $(((k + r) % 2)) -eq 0 ] && echo 1000000 || echo 100000000)
    "$bin" launch --ps 1 --workers 2 --issync 1 --model "$tmp/fm-$rows.model" --data "$tmp/clicks.tsv" \
      --batch_size 512 --epochs 1 --steps_to_validate 1000000 --logdir= --summary_dir= --threads 1 \
      --progress=never >"$tmp/out" 2>&1 || { echo "rows $rows: failed"; tail -3 "$tmp/out"; continue; }
    awk -v r="$r" -v rows="$rows" '/updates \(sync replicas\): per step compute/ {
        for (i = 1; i < NF; i++) { if ($i == "compute") c += $(i + 1); if ($i == "exchange") x += $(i + 1) } n++ }
      /test auc/ { for (i = 1; i < NF; i++) if ($i == "auc") auc = $(i + 1) }
      END { printf "round %s rows %-9s step %6.2f ms (compute %.2f, exchange %.2f)  test auc %s\n", r, rows,
            (c + x) / n, c / n, x / n, auc }' "$tmp/out"
  done
done | tee "$tmp/rows"
med() { grep " rows $1 " "$tmp/rows" | awk '{print $6}' | sort -n | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}'; }
small=$(med 1000000) large=$(med 100000000)
awk -v s="$small" -v l="$large" 'BEGIN { printf "median step: 10^6 rows %s ms, 10^8 rows %s ms; 10^8 / 10^6: %.3f\n", s, l, l / s }'
echo "uptime: $(uptime)"

#!/usr/bin/env bash
# Sparse tables on a cluster (issue 22, "table size does not matter"): the largest resident set of
# any process of a 1 ps + 2 sync workers run of models/lr.model, for tables of 2^16 to 2^26 rows per
# field, against one process with whole tables. A count (kilobytes, from getrusage through
# /usr/bin/time), not a timing: the machine's load does not move it much.
#   bench/sparse_table_size.sh [BUILD_DIR]   (default build)
set -eu
bin=${1:-build}/dtrain
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$bin" gen-clicks --out "$tmp/clicks.tsv" --lines 40000 --vocab 100000 --seed 5 >/dev/null 2>&1
flags=(--data "$tmp/clicks.tsv" --optimizer sgd --learning_rate 0.05 --epochs 1
       --steps_to_validate 1000 --logdir "" --summary_dir "" --threads 1)
printf '%-8s %-22s %10s %10s\n' rows run max_rss_kb test_auc
for log2 in 16 20 24 26; do
  sed "s/buckets=1048576/buckets=$((1 << log2))/" models/lr.model >"$tmp/lr.model"
  for run in cluster one; do
    [ "$run" = one ] && [ "$log2" -gt 22 ] && continue # whole tables of 2^24 rows x 26 fields: 7 GB
    if [ "$run" = cluster ]; then
      /usr/bin/time -f "%M" -o "$tmp/rss" "$bin" launch --ps 1 --workers 2 --issync 1 --model "$tmp/lr.model" \
        "${flags[@]}" --batch_size 512 >"$tmp/out" 2>&1
    else
      /usr/bin/time -f "%M" -o "$tmp/rss" "$bin" train --model "$tmp/lr.model" "${flags[@]}" --batch_size 1024 \
        >"$tmp/out" 2>&1
    fi
    auc=$(grep -o "test auc [0-9.]*" "$tmp/out" | awk '{print $3}')
    label="1 ps + 2 sync workers"; [ "$run" = one ] && label="one process"
    printf '2^%-6s %-22s %10s %10s\n' "$log2" "$label" "$(tail -1 "$tmp/rss")" "$auc"
  done
done

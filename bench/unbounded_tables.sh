#!/usr/bin/env bash
# Unbounded ids on the ps (issue 22, docs/sparse.md "Unbounded ids"). Two measurements:
#
# rss   The ps's resident set is bounded by its tables' capacity whatever the id stream: a 1 ps + 1
#       worker cluster (started by hand, the ps under /usr/bin/time: its own maximum resident set)
#       trains a model of 26 per-field tables of unbounded ids, dim 16, Adagrad, capacity C rows per
#       table, over a click log with far more distinct ids per field than C (the ps's admissions
#       say how many it met); the same run with capacity 1 gives the fixed part (process, buffers,
#       dense variables, messages). Reported: ratio = (rss(C) - rss(1)) / (26 C x row bytes), row bytes
#       being ps/table.h's (4 x 16 x 2 + 29 = 157); and ratio_fixed, the same with the tables' own
#       fixed part taken out first (dt_table_fixed_bytes: mostly one block's slack, 4096 rows x 157
#       bytes per table, as rows are allocated 4096 at a time). Capacities: $CAPS (default 8192 10000,
#       each after a capacity-1 run).
# step  Step time with a capacity of 10^6 and 10^8 rows in every table (the issue: within 10%), the
#       same cluster and data, rounds interleaved (10^6, 10^8, 10^6, ...), the median of each.
#
#   bench/unbounded_tables.sh rss|step [BUILD_DIR] [ROUNDS]   (default build, 3 rounds)
set -eu
what=$1
bin=$(cd "${2:-build}" && pwd)/dtrain
rounds=${3:-3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
uptime

model() { # model CAPACITY: 26 tables of unbounded ids of dim 16, summed, and a linear part
  cat <<EOM
model u
input dense=13 fields=26
embedding name=factors dim=16 capacity=$1 combiner=sum weight_init=constant(0)
reduce_sum name=ids
dense name=linear input=input units=1 weight_init=constant(0)
add input=ids,linear
EOM
}

# cluster CAPACITY LOG STEPS: a 1 ps + 1 worker run, the ps's max RSS (KB) in LOG.rss
cluster() {
  model "$1" >"$tmp/u.model"
  local port=$((20000 + RANDOM % 20000))
  local c=(--ps_hosts "127.0.0.1:$port" --worker_hosts "127.0.0.1:$((port + 1))")
  local f=(--data "$tmp/clicks.tsv" --model "$tmp/u.model" --optimizer sgd --learning_rate 0.05 --batch_size 1024
           --train_steps "$3" --steps_to_validate 100000 --logdir "" --summary_dir "" --threads 1)
  /usr/bin/time -f "%M" -o "$2.rss" "$bin" train "${c[@]}" "${f[@]}" --job_name ps --task_index 0 \
    --metrics_port $((port + 2)) >"$2.ps" 2>&1 &
  local ps=$!
  # the ps's table figures, the last scrape before it exits
  (while kill -0 "$ps" 2>/dev/null; do
     curl -sf "http://127.0.0.1:$((port + 2))/metrics" >"$2.m.tmp" 2>/dev/null && mv "$2.m.tmp" "$2.metrics"
     sleep 1
   done) &
  local poll=$!
  /usr/bin/time -f "%e" -o "$2.wall" "$bin" train "${c[@]}" "${f[@]}" --job_name worker --task_index 0 >"$2" 2>&1 ||
    { tail -5 "$2" "$2.ps"; kill "$ps"; exit 1; }
  wait "$ps"
  wait "$poll"
}
# total FAMILY: the sum of a family's per-table series in the last scrape
total() { awk -v f="$1" 'index($0, f "{") == 1 { s += $NF } END { printf "%d", s }' "$tmp/run.metrics"; }

if [ "$what" = rss ]; then
  # 400,000 lines, Zipf 0.9 over 10^7 ids per field: ~100k distinct ids per field
  "$bin" gen-clicks --out "$tmp/clicks.tsv" --lines 400000 --vocab 10000000 --zipf 0.9 --seed 5 >/dev/null 2>&1
  printf '%-10s %10s %12s %12s %7s %11s %9s %10s %10s\n' capacity ps_rss_kb table_kb rows_kb ratio ratio_fixed rows \
    admitted evicted
  for cap in $(for c in ${CAPS:-8192 10000}; do echo 1 "$c"; done); do
    cluster "$cap" "$tmp/run" 300
    rss=$(tail -1 "$tmp/run.rss")
    if [ "$cap" = 1 ]; then base=$rss; printf '%-10s %10s\n' 1 "$rss"; continue; fi
    awk -v c="$cap" -v r="$rss" -v b="$base" -v rows="$(total dtrain_ps_sparse_rows)" \
      -v adm="$(total dtrain_ps_sparse_admitted_total)" -v ev="$(total dtrain_ps_sparse_evicted_total)" 'BEGIN {
      bound = 26 * c * 157 / 1024; t = r - b; fixed = 26 * (c < 4096 ? c : 4096) * 157 / 1024
      printf "%-10s %10d %12d %12.0f %7.3f %11.3f %9d %10d %10d\n", c, r, t, bound, t / bound, (t - fixed) / bound,
        rows, adm, ev }'
  done
else
  "$bin" gen-clicks --out "$tmp/clicks.tsv" --lines 200000 --vocab 1000000 --seed 5 >/dev/null 2>&1
  printf '%-10s %6s %10s\n' capacity round wall_s
  for r in $(seq "$rounds"); do
    for cap in 1000000 100000000; do
      cluster "$cap" "$tmp/run" 150
      printf '%-10s %6s %10s\n' "$cap" "$r" "$(tail -1 "$tmp/run.wall")" | tee -a "$tmp/walls"
    done
  done
  for cap in 1000000 100000000; do
    awk -v c="$cap" '$1 == c { print $3 }' "$tmp/walls" | sort -n | awk -v c="$cap" \
      '{ v[NR] = $1 } END { printf "median %-10s %8.2f s\n", c, NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
  done
  uptime
fi

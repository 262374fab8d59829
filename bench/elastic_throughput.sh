#!/usr/bin/env bash
# Dynamic against fixed sharding, throughput with membership fixed (issue 24): one epoch of
# Fashion-MNIST (60000 examples, models/fashion.model) on `dtrain launch --ps 1 --workers W`,
# asynchronous, each case ROUNDS times in rotating order; prints the wall time of each run and the
# cluster's examples/s (60000 over the wall time, start-up included, the same for every case).
# Usage: bench/elastic_throughput.sh [WORKERS] [ROUNDS]   (from the repository root, release build)
set -u
W=${1:-2} R=${2:-3} data=${FASHION:-/usr/share/datasets/fashion-mnist}
bin=${DTRAIN_BIN:-build/dtrain}
common=(--ps 1 --workers "$W" --model models/fashion.model --data "$data" --epochs 1 --logdir= --summary_dir=
        --steps_to_validate 1000000 --progress=never)
cases=("fixed:--sharding fixed" "fixed-no-overlap:--sharding fixed --overlap none" "dynamic:--sharding dynamic")
echo "uptime: $(uptime)"
for r in $(seq 1 "$R"); do
  for k in 0 1 2; do
    c=${cases[$(( (k + r) % 3 ))]}
    name=${c%%:*} flags=${c#*:}
    t0=$(date +%s.%N)
    # shellcheck disable=SC2086
    "$bin" launch "${common[@]}" $flags >/tmp/elastic_bench.log 2>&1 || { echo "$name: failed"; tail -3 /tmp/elastic_bench.log; }
    t1=$(date +%s.%N)
    awk -v n="$name" -v a="$t0" -v b="$t1" 'BEGIN { printf "round %s %-18s %6.1f s  %6.0f examples/s\n", "'"$r"'", n, b - a, 60000 / (b - a) }'
  done
done
echo "uptime: $(uptime)"

#!/usr/bin/env bash
# Issue 3's floor: 1 ps + 2 workers on loopback, asynchronous, the fashion model reaches at least
# 85% test accuracy (1 epoch); every process exits 0 and none is left behind.
# The floor is checked on the mean of three runs (seeds 1-3), not on one run: asynchronous updates
# interleave as the scheduler lets them, and one run's accuracy spreads (BENCHMARKS.md: 28 runs on a
# quiet machine 0.8517-0.8846, mean 0.871; one CI run with other tests beside it 0.8458). Each run
# must still have trained (at least 0.80).
. "$(dirname "$0")/lib.sh"
data=${FASHION:-/usr/share/datasets/fashion-mnist}
ln -s "$(cd "$data" && pwd)" "$tmp/data"
accs=()
for seed in 1 2 3; do
  timeout --foreground 900 "$bin" launch --ps 1 --workers 2 --model models/fashion.model --data "$tmp/data" --logdir= \
    --summary_dir= --epochs 1 --seed "$seed" >"$tmp/out$seed" 2>&1
  check "seed $seed: launch exits 0" test $? -eq 0
  cat "$tmp/out$seed"
  acc=$(sed -n 's/^\[worker0\] test accuracy \([0-9.]*\).*/\1/p' "$tmp/out$seed")
  check "seed $seed: test accuracy '$acc' at least 0.80 (it trained)" awk -v a="$acc" 'BEGIN { exit !(a != "" && a >= 0.80) }'
  accs+=("${acc:-0}")
  check "seed $seed: no process left behind" bash -c '! pgrep -f "$1/" >/dev/null' _ "$tmp"
done
mean=$(printf '%s\n' "${accs[@]}" | awk '{ s += $1 } END { printf "%.4f", s / NR }')
check "mean test accuracy $mean (${accs[*]}) at least 0.85" awk -v a="$mean" 'BEGIN { exit !(a >= 0.85) }'
summary

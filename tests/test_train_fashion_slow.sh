#!/usr/bin/env bash
# Issue 2's floor: the fashion model trained by `dtrain train` for 1 epoch reaches at least 88%
# Fashion-MNIST test accuracy.
set -u
bin=${DTRAIN_BIN:-build/dtrain}
data=${FASHION:-/usr/share/datasets/fashion-mnist}
out=$(mktemp)
trap 'rm -f "$out"' EXIT
if ! "$bin" train --model models/fashion.model --data "$data" --logdir= --summary_dir= --epochs 1 --logdir= --summary_dir= >"$out"; then
  echo "FAIL: training exited non-zero"; echo "0 passed, 1 failed"; exit 1
fi
cat "$out"
acc=$(sed -n 's/^test accuracy \([0-9.]*\).*/\1/p' "$out")
if [ -n "$acc" ] && awk -v a="$acc" 'BEGIN { exit !(a >= 0.88) }'; then
  echo "1 passed, 0 failed"
else
  echo "FAIL: test accuracy '$acc' below 0.88"; echo "0 passed, 1 failed"; exit 1
fi

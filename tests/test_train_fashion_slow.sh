#!/usr/bin/env bash
# Issue 2's floor: the fashion model trained by `dtrain train` for 1 epoch reaches at least 88%
# Fashion-MNIST test accuracy.
. "$(dirname "$0")/lib.sh"
data=${FASHION:-/usr/share/datasets/fashion-mnist}
"$bin" train --model models/fashion.model --data "$data" --logdir= --summary_dir= --epochs 1 >"$tmp/out"
check "training exits 0" test $? -eq 0
cat "$tmp/out"
acc=$(sed -n 's/^test accuracy \([0-9.]*\).*/\1/p' "$tmp/out")
check "test accuracy '$acc' at least 0.88" awk -v a="$acc" 'BEGIN { exit !(a != "" && a >= 0.88) }'
summary

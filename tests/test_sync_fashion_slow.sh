#!/usr/bin/env bash
# Issue 4's floor: 1 ps + 2 workers on loopback in sync mode (--issync=1), batch 32 per worker (the
# same examples per step as one process with batch 64), 1 epoch: the fashion model reaches at least
# 88% test accuracy; no gradient is stale; every process exits 0 and none is left behind.
. "$(dirname "$0")/lib.sh"
data=${FASHION:-/usr/share/datasets/fashion-mnist}
ln -s "$(cd "$data" && pwd)" "$tmp/data"
timeout --foreground 900 "$bin" launch --ps 1 --workers 2 --model models/fashion.model --data "$tmp/data" --epochs 1 \
  --issync=1 --batch_size 32 --logdir= --summary_dir= >"$tmp/out" 2>&1
check "launch exits 0" test $? -eq 0
cat "$tmp/out"
acc=$(sed -n 's/^\[worker0\] test accuracy \([0-9.]*\).*/\1/p' "$tmp/out")
check "test accuracy '$acc' at least 0.88" awk -v a="$acc" 'BEGIN { exit !(a != "" && a >= 0.88) }'
check "no stale gradient in sync mode" grep -q "^\[ps0\] ps 0: stale gradients dropped: 0 " "$tmp/out"
check "937 global steps (60000 / (2 x 32))" grep -q "^\[worker0\] trained 937 local steps.*global step 937$" "$tmp/out"
check "no process left behind" bash -c '! pgrep -f "$1/" >/dev/null' _ "$tmp"
summary

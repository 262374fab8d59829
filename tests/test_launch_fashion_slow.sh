#!/usr/bin/env bash
# Issue 3's floor: 1 ps + 2 workers on loopback, asynchronous, the fashion model reaches at least
# 85% test accuracy (1 epoch); every process exits 0 and none is left behind.
. "$(dirname "$0")/lib.sh"
data=${FASHION:-/usr/share/datasets/fashion-mnist}
ln -s "$(cd "$data" && pwd)" "$tmp/data"
timeout --foreground 900 "$bin" launch --ps 1 --workers 2 --model models/fashion.model --data "$tmp/data" --logdir= --summary_dir= \
  --epochs 1 >"$tmp/out" 2>&1
check "launch exits 0" test $? -eq 0
cat "$tmp/out"
acc=$(sed -n 's/^\[worker0\] test accuracy \([0-9.]*\).*/\1/p' "$tmp/out")
check "test accuracy '$acc' at least 0.85" awk -v a="$acc" 'BEGIN { exit !(a != "" && a >= 0.85) }'
check "no process left behind" bash -c '! pgrep -f "$1/" >/dev/null' _ "$tmp"
summary

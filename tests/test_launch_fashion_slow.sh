#!/usr/bin/env bash
# Issue 3's floor: 1 ps + 2 workers on loopback, asynchronous, the fashion model reaches at least
# 85% test accuracy (1 epoch); every process exits 0 and none is left behind.
set -u
bin=${DTRAIN_BIN:-build/dtrain}
data=${FASHION:-/usr/share/datasets/fashion-mnist}
tmp=$(mktemp -d)
ln -s "$(cd "$data" && pwd)" "$tmp/data"
trap 'pkill -KILL -f "$tmp/" 2>/dev/null; rm -rf "$tmp"' EXIT
fail=0
timeout 900 "$bin" launch --ps 1 --workers 2 --model models/fashion.model --data "$tmp/data" --logdir= --summary_dir= --epochs 1 \
  --logdir= --summary_dir= >"$tmp/out" 2>&1 || { echo "FAIL: launch exited $?"; fail=1; }
cat "$tmp/out"
acc=$(sed -n 's/^\[worker0\] test accuracy \([0-9.]*\).*/\1/p' "$tmp/out")
awk -v a="$acc" 'BEGIN { exit !(a >= 0.85) }' || { echo "FAIL: test accuracy '$acc' below 0.85"; fail=1; }
pgrep -f "$tmp/" >/dev/null && { echo "FAIL: processes left behind"; fail=1; }
[ $fail -eq 0 ] && echo "1 passed, 0 failed" || echo "0 passed, 1 failed"
exit $fail

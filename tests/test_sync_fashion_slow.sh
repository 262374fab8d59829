#!/usr/bin/env bash
# Issue 4's floor: 1 ps + 2 workers on loopback in sync mode (--issync=1), batch 32 per worker (the
# same examples per step as one process with batch 64), 1 epoch: the fashion model reaches at least
# 88% test accuracy; no gradient is stale; every process exits 0 and none is left behind.
set -u
bin=${DTRAIN_BIN:-build/dtrain}
data=${FASHION:-/usr/share/datasets/fashion-mnist}
tmp=$(mktemp -d)
ln -s "$(cd "$data" && pwd)" "$tmp/data"
trap 'pkill -KILL -f "$tmp/" 2>/dev/null; rm -rf "$tmp"' EXIT
fail=0
timeout 900 "$bin" launch --ps 1 --workers 2 --model models/fashion.model --data "$tmp/data" --epochs 1 \
  --issync=1 --batch_size 32 --logdir= --summary_dir= >"$tmp/out" 2>&1 || { echo "FAIL: launch exited $?"; fail=1; }
cat "$tmp/out"
acc=$(sed -n 's/^\[worker0\] test accuracy \([0-9.]*\).*/\1/p' "$tmp/out")
awk -v a="$acc" 'BEGIN { exit !(a >= 0.88) }' || { echo "FAIL: test accuracy '$acc' below 0.88"; fail=1; }
grep -q "^\[ps0\] ps 0: stale gradients dropped: 0 " "$tmp/out" || { echo "FAIL: stale gradients in sync mode"; fail=1; }
grep -q "^\[worker0\] trained 937 local steps.*global step 937$" "$tmp/out" \
  || { echo "FAIL: expected 937 global steps (60000 / (2 x 32))"; fail=1; }
pgrep -f "$tmp/" >/dev/null && { echo "FAIL: processes left behind"; fail=1; }
[ $fail -eq 0 ] && echo "1 passed, 0 failed" || echo "0 passed, 1 failed"
exit $fail

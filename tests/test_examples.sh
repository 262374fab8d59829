#!/usr/bin/env bash
# examples/: the distributed program differs from the single-machine one only in the three marked
# changes, and both train (the distributed one as 1 ps + 2 workers on 127.0.0.1, all exiting 0).
. "$(dirname "$0")/lib.sh"
bindir=$(dirname "${DTRAIN_BIN:-build/dtrain}")
# 100 steps see at most 6,400 images: a subset keeps the sanitizer build's loading and evaluation short.
fashion_subset "$tmp/data" 6400 2000 || { bad "Fashion-MNIST subset"; summary; exit; }

# Every line only in the distributed version is a CHANGE line (its header comment aside).
extra=$(diff examples/train_single.c examples/train_distributed.c | grep '^>' | grep -v 'CHANGE' |
        grep -vE '^> ( \*|/\*)' | grep -vE '^> *$')
removed=$(diff examples/train_single.c examples/train_distributed.c | grep '^<' | grep -vE '^< ( \*|/\*)' |
          grep -v 'dt_batches_open')
[ -z "$extra" ] && [ -z "$removed" ] && ok "examples differ only in the marked changes" \
  || bad "examples differ only in the marked changes: $extra $removed"

"$bindir/train_single" models/fashion.model "$tmp/data" 100 >"$tmp/single" 2>&1 &&
  awk '/^test accuracy/ { exit !($3 > 0.5) }' "$tmp/single" && ok "single-machine example trains" \
  || { bad "single-machine example trains"; cat "$tmp/single"; }

ports=($(free_port 3)); port=${ports[0]}
P="--ps_hosts=127.0.0.1:$port --worker_hosts=127.0.0.1:${ports[1]},127.0.0.1:${ports[2]}"
"$bindir/train_distributed" models/fashion.model "$tmp/data" 100 $P --job_name=ps >"$tmp/ps" 2>&1 & p0=$!
"$bindir/train_distributed" models/fashion.model "$tmp/data" 100 $P --job_name=worker --task_index=1 >"$tmp/w1" 2>&1 & p2=$!
"$bindir/train_distributed" models/fashion.model "$tmp/data" 100 $P --job_name=worker --task_index=0 >"$tmp/w0" 2>&1 & p1=$!
# The guard must not hold the test's output open: ctest waits for every writer to close it.
( sleep 400; kill -KILL $p0 $p1 $p2 ) >/dev/null 2>&1 & guard=$!
wait $p0; s0=$?; wait $p1; s1=$?; wait $p2; s2=$?
pkill -P $guard 2>/dev/null; kill $guard 2>/dev/null
[ $s0 -eq 0 ] && [ $s1 -eq 0 ] && [ $s2 -eq 0 ] && ok "distributed example: ps and workers exit 0" \
  || { bad "distributed example: ps and workers exit 0 ($s0 $s1 $s2)"; tail -3 "$tmp/ps" "$tmp/w0" "$tmp/w1"; }
awk '/^test accuracy/ { exit !($3 > 0.5) }' "$tmp/w0" && ok "distributed example trains" || bad "distributed example trains"

summary

#!/usr/bin/env bash
# --overlap end to end through `dtrain launch` (processes on 127.0.0.1), on a slice of Fashion-MNIST:
#   (a) sync, 2 ps and 2 workers: the parameters after 8 steps are bit for bit those of the same run
#       without overlap, with either order (priority, fifo), and so is the chief's test accuracy;
#   (b) async with overlap trains (exit 0, the global step reached, a finite loss);
#   (c) backup workers: overlap is turned off with one line and the run completes;
#   (d) emulated compute (the benchmarks' path) with overlap runs through;
#   a bad --overlap value is refused with one line.
# Every run is bounded by `timeout`; launch stops its children when it is stopped.
. "$(dirname "$0")/lib.sh"
case "$bin" in /*) ;; *) bin="$PWD/$bin" ;; esac
src=$PWD
cd "$tmp"

fashion_subset data 1024 64
common=(--model "$src/models/fashion.model" --data data --logdir= --summary_dir= --threads 1 --steps_to_validate 1000
        --batch_size 32)
run() { timeout --foreground 240 "$@" >"$log" 2>&1; }

# (a) the same sync run three ways.
for ov in none priority fifo; do
  log=a_$ov.log; run "$bin" launch --ps 2 --workers 2 "${common[@]}" --issync=1 --train_steps 8 --overlap "$ov" \
    --debug_dump_params a_$ov.bin || { bad "(a) sync run with --overlap $ov exits 0"; tail -n 5 "$log"; }
done
acc() { grep -o 'test accuracy [0-9.]*' "$1"; }
for ov in priority fifo; do
  if [ -s a_none.bin ] && cmp -s a_none.bin a_$ov.bin && [ -n "$(acc a_none.log)" ] && \
     [ "$(acc a_none.log)" = "$(acc a_$ov.log)" ]; then
    ok "(a) sync, 2 ps 2 workers: --overlap $ov gives the parameters of --overlap none bit for bit ($(acc a_$ov.log))"
  else bad "(a) sync --overlap $ov = none ($(cmp a_none.bin a_$ov.bin 2>&1 | head -1))"; fi
done
check "(a) the overlapped workers say so in their summary" grep -q "overlapped, priority order" a_priority.log

# (b) async: trains with overlap.
log=b.log; run "$bin" launch --ps 1 --workers 2 "${common[@]}" --train_steps 12 --overlap priority
rc=$?
if [ $rc -eq 0 ] && grep -q "global step" b.log && grep -Eq "loss [0-9]" b.log && ! grep -qi nan b.log; then
  ok "(b) async with overlap trains 12 steps"
else bad "(b) async with overlap (exit $rc)"; tail -n 5 b.log; fi

# (c) backup workers: no overlap, said once per worker, the run completes.
log=c.log; run "$bin" launch --ps 1 --workers 2 "${common[@]}" --issync=1 --replicas_to_aggregate 1 \
  --total_num_replicas 2 --train_steps 10
rc=$?
if [ $rc -eq 0 ] && [ "$(grep -c 'exchanging between steps instead' c.log)" -eq 2 ]; then
  ok "(c) backup workers: overlap off, said by each worker, run completes"
else bad "(c) backup workers (exit $rc)"; tail -n 5 c.log; fi

# (d) emulated compute: the hooks of the emulated layers drive the exchange.
log=d.log; run "$bin" launch --ps 2 --workers 2 "${common[@]}" --issync=1 --train_steps 10 --debug_emulate_compute_ms 20
rc=$?
if [ $rc -eq 0 ] && [ "$(grep -c '10 updates (sync replicas).*overlapped' d.log)" -eq 2 ]; then
  ok "(d) emulated compute with overlap: 10 sync steps on each worker"
else bad "(d) emulated compute (exit $rc)"; tail -n 5 d.log; fi

out=$("$bin" train "${common[@]}" --overlap sideways 2>&1)
rc=$?
check "a bad --overlap is refused with one line" \
  test $rc -ne 0 -a "$(printf '%s\n' "$out" | wc -l)" -eq 1 -a -n "$(printf '%s' "$out" | grep -- '--overlap')"
summary

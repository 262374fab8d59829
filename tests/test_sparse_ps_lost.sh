#!/usr/bin/env bash
# A ps lost in the middle of a sparse pull (docs/faults.md "Losing a ps", docs/sparse.md "A ps
# lost"), landed there on purpose: the ps stops, unanswered, at the 13th SPARSE_PULL it receives
# (--debug_ps_stop_at_sparse_pull, a test hook), while the chief waits for that pull's rows. The test
# restarts it; the chief must wait for it (--ps_timeout), roll it back to the newest checkpoint,
# declare the tables again, make the pull again and train to the end: exit 0, every step trained.
# Twice: with --sparse_prefetch 0 (the loss inside the forward's pull) and 1 (inside a pull sent
# ahead, which the re-initialisation drops).
. "$(dirname "$0")/lib.sh"
case "$bin" in /*) ;; *) bin="$PWD/$bin" ;; esac
src=$(cd "${DTRAIN_SRC:-$(dirname "$0")/..}" && pwd)
cd "$tmp"

"$bin" gen-clicks --out clicks.tsv --lines 3000 --vocab 300 --seed 5 >gen.out 2>&1
# models/lr.model with 1024 buckets a field: its checkpoints take milliseconds, not seconds
sed 's/buckets=[0-9]*/buckets=1024/' "$src/models/lr.model" >lr.model
ports=($(free_port 2))
cluster=(--ps_hosts=127.0.0.1:${ports[0]} --worker_hosts=127.0.0.1:${ports[1]})
common=(--data clicks.tsv --model lr.model --table_learning_rate 0.05 --batch_size 32
        --train_steps 30 --steps_to_validate 1000 --threads 1 --logdir "$tmp/ckpt" --summary_dir= --save_model_secs 0
        --ps_timeout 30 --connect_timeout 30 --heartbeat_timeout 5 --idle_timeout 60 "${cluster[@]}")

# lost PREFETCH WAITED: one run. The chief's pulls: one per step (step 0's included), so the 13th
# is step 12's, after the checkpoint saved at start (step 0): the rollback goes back there. Without
# the prefetch the chief is inside that pull when the ps stops; with it (the default) that pull is
# the one sent ahead under step 11, and the chief finds the ps gone in step 11's exchange (its sparse
# push or its dense one, whichever the stop beats): WAITED is the wait line the chief must log.
lost() {
  local pf=$1 waited=$2 st ps_st
  rm -rf "$tmp/ckpt"
  timeout --foreground 60 "$bin" train "${common[@]}" --sparse_prefetch "$pf" --job_name=ps --task_index=0 \
    --debug_ps_stop_at_sparse_pull 13 >ps.log 2>&1 &
  ps_pid=$!
  timeout --foreground 90 "$bin" train "${common[@]}" --sparse_prefetch "$pf" --job_name=worker --task_index=0 >worker.log 2>&1 &
  worker_pid=$!
  wait "$ps_pid"
  st=$?
  check "prefetch $pf: the ps stops at the 13th SPARSE_PULL, unanswered (status $st: stopped)" [ "$st" -eq 130 ] && \
    grep -q "ps 0: debug: stopping at SPARSE_PULL 13, unanswered" ps.log
  check "... the chief was still training then" kill -0 "$worker_pid"
  timeout --foreground 60 "$bin" train "${common[@]}" --job_name=ps --task_index=0 >ps2.log 2>&1 &
  ps_pid=$!
  wait "$worker_pid"
  st=$?
  wait "$ps_pid"
  ps_st=$?
  check "... the chief finishes (status $st) and so does the restarted ps (status $ps_st)" [ "$st" -eq 0 ] && [ "$ps_st" -eq 0 ]
  [ "$st" -eq 0 ] || tail -20 worker.log
  check "... having waited for the ps: $waited" grep -qE "^worker 0: at global step $waited.*; waiting up to 30 s for \
the ps tasks" worker.log || grep "waiting up to" worker.log
  check "... rolled every ps back to the checkpoint of step 0" \
    grep -q "^chief: a ps task lost its shard: every ps rolled back to the newest checkpoint (global step 0" worker.log
  check "... which declared the tables again" grep -q "ps 0: 26 sparse table(s) declared by the chief" ps2.log
  # 12 steps before the loss, then the 30 from step 0
  check "... and trained every step to the end: 12 + 30 local steps" \
    grep -qE "^trained 42 local steps in .*; global step 30$" worker.log
}
timed_out="no reply within 5000 ms \(--heartbeat_timeout\)"
lost 0 "12: ps 0 at .*: SPARSE_PULL: $timed_out"
# With the prefetch: the push of step 11 or its dense exchange, whichever meets the gone ps first;
# or, when step 11's push was answered before the ps read the pull sent ahead, that pull (taken at
# step 12): unanswered, or answered by the restarted ps (the socket sends it again on reconnecting),
# which refuses it until the chief has declared everything again.
lost 1 "1[12]: ps 0 at .*: ([A-Z_+]+: $timed_out|SPARSE_PULL refused: not initialised yet)"
summary

#!/usr/bin/env bash
# The supervisor on a launched cluster (2 ps, 2 asynchronous workers, a small model on a Fashion-MNIST
# subset): the chief checkpoints every shard's parameters and Adam state at one step; started again
# with more steps, it gives every ps its shard back at the checkpoint's step and training resumes
# there; `dtrain eval` on the result prints the test line the chief reported; only the chief writes;
# with sync replicas a stop and restore changes nothing, bit for bit.
. "$(dirname "$0")/lib.sh"
src=${DTRAIN_SRC:-$(cd "$(dirname "$0")/.." && pwd)}
py=/usr/bin/python3

# A subset (4000 training, 500 test images) keeps every run short, sanitizers included.
fashion_subset "$tmp/data" 4000 500
printf 'model tiny\ninput 28 28 1\nconv2d filters=4 kernel=3 stride=2\nrelu\nflatten\ndense units=10\n' >"$tmp/tiny.model"
# Each run names its --logdir and --summary_dir (a flag given twice is refused).
run() {
  timeout --foreground 300 "$bin" launch --ps 2 --workers 2 --model "$tmp/tiny.model" --data "$tmp/data" --batch_size 16 \
    --steps_to_validate 20 "$@"
}

run --train_steps 40 --logdir "$tmp/ck" --summary_dir "$tmp/sum" >"$tmp/1.out" 2>&1
check "first run exits 0" test $? -eq 0
last1=$(sed -n 's/^model_checkpoint_path: "model.ckpt-\([0-9]*\).safetensors"/\1/p' "$tmp/ck/checkpoint")
check "final checkpoint at the end (step ${last1:-none} >= 40)" test "${last1:-0}" -ge 40
check "only the chief saves" test "$(grep -c 'saved checkpoint' "$tmp/1.out")" -eq "$(grep -c '^\[worker0\] saved checkpoint' "$tmp/1.out")"
check "shards agreed on the step" test "$(grep -c 'different steps' "$tmp/1.out")" -eq 0
if "$py" -c 'import numpy' 2>/dev/null || "$py" -c 'import torch' 2>/dev/null; then
  check "the cluster's checkpoint holds every variable with its Adam slots" \
    "$py" "$src/tests/supervisor_check.py" checkpoint "$tmp/ck/model.ckpt-$last1.safetensors" "$last1"
fi
"$bin" eval --logdir "$tmp/ck" --data "$tmp/data" >"$tmp/eval1" 2>&1
want=$(sed -n 's/^\[worker0\] \(test accuracy.*\)/\1/p' "$tmp/1.out")
check "eval prints the chief's test line ($want)" grep -qxF "$want" "$tmp/eval1"

run --train_steps 80 --logdir "$tmp/ck" --summary_dir "$tmp/sum" >"$tmp/2.out" 2>&1
check "second run exits 0" test $? -eq 0
check "the chief restores the newest checkpoint" grep -q "^\[worker0\] restored $tmp/ck/model.ckpt-$last1.safetensors: global step $last1" "$tmp/2.out"
check "every ps gets its shard back at that step" \
  test "$(grep -c "^\[ps[01]\] ps [01]: initialised by the chief (worker 0) at global step $last1 (generation 1):" "$tmp/2.out")" -eq 2
check "worker 1 resumes too, and training ends at 80" grep -qE '^\[worker0\] trained [0-9]+ local steps.*global step (8[0-9]|9[0-9])$' "$tmp/2.out"
# Each worker resumes its data stream at global_step / workers batches (the log says where).
# (at least at the restored step's batch: a worker that starts late pulls a later step)
b1=$(sed -n 's/^\[worker1\] resuming the data stream at batch \([0-9]*\) .*/\1/p' "$tmp/2.out")
check "worker 1 resumes its data shard at or after the restored step (batch ${b1:-none})" test "${b1:-0}" -ge $((last1 / 2))
check "the step-0 checkpoint is not rewritten on resume" test "$(grep -c 'model.ckpt-0.safetensors (global' "$tmp/2.out")" -eq 0
"$bin" eval --logdir "$tmp/ck" --data "$tmp/data" >"$tmp/eval2" 2>&1
want=$(sed -n 's/^\[worker0\] \(test accuracy.*\)/\1/p' "$tmp/2.out")
check "eval after the resumed run prints the chief's test line ($want)" grep -qxF "$want" "$tmp/eval2"
ev=$(ls "$tmp/sum/train"/events.out.tfevents.* | wc -l)
check "one train event file per run (the chief's)" test "$ev" -eq 2

# Sync replicas are deterministic: 20 steps, then the same command with 40, ends bit-identical to
# 40 steps in one go (every shard's parameters and Adam state restored exactly, data resumed).
sync() { run --issync=1 --summary_dir= "$@"; }
sync --train_steps 40 --logdir "$tmp/s40" >"$tmp/s40.out" 2>&1
sync --train_steps 20 --logdir "$tmp/s20" >"$tmp/s20.out" 2>&1
sync --train_steps 40 --logdir "$tmp/s20" >"$tmp/s20b.out" 2>&1
check "sync: 20 + restore + 20 steps == 40 steps, bit for bit, on 2 ps" \
  cmp -s "$tmp/s40/model.ckpt-40.safetensors" "$tmp/s20/model.ckpt-40.safetensors"

summary

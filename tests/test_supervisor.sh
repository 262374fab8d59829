#!/usr/bin/env bash
# The supervisor through the CLI, on one machine (a small model on a Fashion-MNIST subset):
# checkpoints at start and end with the index; a stopped-and-restarted run is bit-identical to an
# uninterrupted one; a damaged newest checkpoint (flipped byte, truncated) makes the restart use the
# previous one with a warning; another model is refused saying what differs; summaries hold cost
# and accuracy at every --steps_to_validate step with the values the log printed (decoded by an
# independent Python reader); `dtrain eval` prints the test accuracy the training reported;
# `dtrain inspect` lists checkpoints and event files; SIGINT saves the step reached; an index entry
# outside the log folder is ignored, never deleted; a symbolic link is not followed; a checkpoint
# whose index write failed is used at the next start and deleted by retention in its turn.
. "$(dirname "$0")/lib.sh"
src=${DTRAIN_SRC:-$(cd "$(dirname "$0")/.." && pwd)}
py=/usr/bin/python3

# A subset (2000 training, 500 test images) keeps every run short, sanitizers included.
fashion_subset "$tmp/data" 2000 500
printf 'model tiny\ninput 28 28 1\nconv2d filters=4 kernel=3 stride=2\nrelu\ndropout rate=0.25\nflatten\ndense units=10\n' >"$tmp/tiny.model"
sed 's/filters=4/filters=6/' "$tmp/tiny.model" >"$tmp/wide.model"
train() { "$bin" train --model "$tmp/tiny.model" --data "$tmp/data" --batch_size 16 --steps_to_validate 10 "$@"; }

# 1. A run of 40 steps: checkpoints at 0 and 40, the index, summaries.
train --train_steps 40 --logdir "$tmp/a" --summary_dir "$tmp/sa" >"$tmp/a.out" 2>&1
check "training with checkpoints exits 0" test $? -eq 0
check "checkpoints at start and end" test -f "$tmp/a/model.ckpt-0.safetensors" -a -f "$tmp/a/model.ckpt-40.safetensors"
check "the index names the newest" grep -q '^model_checkpoint_path: "model.ckpt-40.safetensors"' "$tmp/a/checkpoint"
check "nothing but checkpoints and the index in logdir" test "$(ls "$tmp/a" | grep -cv '^model.ckpt-[0-9]*.safetensors$\|^checkpoint$')" -eq 0
"$bin" inspect "$tmp/a/model.ckpt-40.safetensors" >"$tmp/inspect" 2>&1
check "inspect lists step, tensors, metadata" grep -q '^global_step: 40' "$tmp/inspect"
check "inspect shows the Adam slot shapes" grep -qE '^conv1/kernel/adam_v +F32 +\[3,3,1,4\]' "$tmp/inspect"
check "inspect shows the model text" grep -q '| conv2d filters=4 kernel=3 stride=2' "$tmp/inspect"
if "$py" -c 'import numpy' 2>/dev/null || "$py" -c 'import torch' 2>/dev/null; then
  check "the checkpoint loads in Python (numpy/torch) with its slots and metadata" \
    "$py" "$src/tests/supervisor_check.py" checkpoint "$tmp/a/model.ckpt-40.safetensors" 40
fi

# 2. Summaries: every record decodes (both CRCs); cost/accuracy at steps 10..40 in train and test,
# the rates in train, and the values are those the log printed.
ev_train=$(ls "$tmp/sa/train"/events.out.tfevents.* 2>/dev/null | head -1)
ev_test=$(ls "$tmp/sa/test"/events.out.tfevents.* 2>/dev/null | head -1)
"$py" "$src/tests/supervisor_check.py" events "$ev_train" >"$tmp/ev_train" 2>&1
check "train event file decodes record by record" test $? -eq 0
"$py" "$src/tests/supervisor_check.py" events "$ev_test" >"$tmp/ev_test" 2>&1
check "test event file decodes record by record" test $? -eq 0
check "first record is the file version" test "$(head -1 "$tmp/ev_train")" = "file_version brain.Event:2"
check "train: cost, accuracy, global_step/sec, examples/sec, learning_rate at 10, 20, 30, 40" \
  test "$(awk 'NR > 1 { printf "%s:%s ", $1, $2 }' "$tmp/ev_train")" = \
  "$(for s in 10 20 30 40; do printf "$s:cost $s:accuracy $s:global_step/sec $s:examples/sec $s:learning_rate "; done)"
check "test: cost and accuracy at 10, 20, 30, 40" \
  test "$(awk 'NR > 1 { printf "%s:%s ", $1, $2 }' "$tmp/ev_test")" = \
  "$(for s in 10 20 30 40; do printf "$s:cost $s:accuracy "; done)"
# The log line "step S ... loss L train_acc A val_loss VL val_acc VA" against the summaries.
agree=$(awk -v T="$tmp/ev_train" -v V="$tmp/ev_test" '
  BEGIN { while ((getline l < T) > 0) { split(l, f, " "); tr[f[1] " " f[2]] = f[3] }
          while ((getline l < V) > 0) { split(l, f, " "); te[f[1] " " f[2]] = f[3] } }
  $1 == "step" { s = $2; n++
    d = (tr[s " cost"] - $6); if (d < 0) d = -d; if (d > 6e-5) bad++
    d = (tr[s " accuracy"] - $8); if (d < 0) d = -d; if (d > 6e-5) bad++
    d = (te[s " cost"] - $10); if (d < 0) d = -d; if (d > 6e-5) bad++
    d = (te[s " accuracy"] - $12); if (d < 0) d = -d; if (d > 6e-5) bad++ }
  END { print n + 0, bad + 0 }' "$tmp/a.out")
check "summary values are the logged ones (4 steps, 0 differences: got $agree)" test "$agree" = "4 0"
check "rates are positive" awk '$2 ~ /sec$/ && !($3 > 0) { exit 1 }' "$tmp/ev_train"
"$bin" inspect "$ev_train" >"$tmp/inspect_ev" 2>&1
check "inspect lists the event file's records" grep -qE '^[0-9]+ +[0-9.]+ +40  examples/sec = ' "$tmp/inspect_ev"

# 3. eval prints the test accuracy (and loss) the training reported.
"$bin" eval --logdir "$tmp/a" --data "$tmp/data" >"$tmp/eval" 2>&1
check "eval exits 0" test $? -eq 0
want=$(grep '^test accuracy' "$tmp/a.out")
check "eval prints the training's test line ($want)" grep -qxF "$want" "$tmp/eval"
check "eval prints a confusion matrix" grep -q '^confusion matrix' "$tmp/eval"
check "eval names the checkpoint and step" grep -q "model.ckpt-40.safetensors: model tiny, global step 40" "$tmp/eval"

# 4. 20 steps, then the same command with 40: resumes at 20 and ends bit-identical to run 1.
train --train_steps 20 --logdir "$tmp/b" --summary_dir "$tmp/sb" >"$tmp/b1.out" 2>&1
train --train_steps 40 --logdir "$tmp/b" --summary_dir "$tmp/sb" >"$tmp/b2.out" 2>&1
check "restart exits 0" test $? -eq 0
check "restart restores step 20" grep -q "restored $tmp/b/model.ckpt-20.safetensors: global step 20" "$tmp/b2.out"
check "restart trains only the remaining 20 steps" grep -q '^trained 20 local steps' "$tmp/b2.out"
check "20 + restore + 20 steps == 40 steps, bit for bit" cmp -s "$tmp/a/model.ckpt-40.safetensors" "$tmp/b/model.ckpt-40.safetensors"
check "same test accuracy line" grep -qxF "$want" "$tmp/b2.out"

# 5. A flipped byte or a truncated newest checkpoint: the previous one is used, with a warning.
for how in flip truncate; do
  cp -r "$tmp/b" "$tmp/c_$how"
  f="$tmp/c_$how/model.ckpt-40.safetensors"
  size=$(stat -c %s "$f")
  if [ $how = flip ]; then printf '\x55' | dd of="$f" bs=1 seek=$((size - 100)) conv=notrunc status=none
  else truncate -s $((size / 2)) "$f"; fi
  train --train_steps 45 --logdir "$tmp/c_$how" --summary_dir= >"$tmp/c_$how.out" 2>&1
  check "$how: training exits 0" test $? -eq 0
  check "$how: warning names the damaged file" grep -q "warning: .*model.ckpt-40.safetensors" "$tmp/c_$how.out"
  check "$how: the previous checkpoint is restored" grep -q "restored $tmp/c_$how/model.ckpt-20.safetensors: global step 20" "$tmp/c_$how.out"
  check "$how: training resumes at 20 and ends at 45" grep -q '^trained 25 local steps.*global step 45' "$tmp/c_$how.out"
done
check "flip: the warning says checksum" grep -q "warning: .*checksum" "$tmp/c_flip.out"
cp "$tmp/b/model.ckpt-40.safetensors" "$tmp/bad.safetensors"
size=$(stat -c %s "$tmp/bad.safetensors")
printf '\x55' | dd of="$tmp/bad.safetensors" bs=1 seek=$((size - 50)) conv=notrunc status=none
"$bin" inspect "$tmp/bad.safetensors" >"$tmp/out" 2>"$tmp/err"
check "inspect refuses a damaged checkpoint (status 1, one line)" test $? -eq 1 -a "$(wc -l <"$tmp/err")" -eq 1

# 6. Another model in the same logdir: refused, saying what differs; nothing written.
"$bin" train --model "$tmp/wide.model" --data "$tmp/data" --batch_size 16 --train_steps 5 --logdir "$tmp/a" \
  --summary_dir= >"$tmp/out" 2>"$tmp/err"
st=$?
check "another model: exit 1 with one error line" test $st -eq 1 -a "$(wc -l <"$tmp/err")" -eq 1
check "another model: says which variable and shapes differ" grep -q "another model.*conv1/kernel is F32 \[3,3,1,4\] in the checkpoint, F32 \[3,3,1,6\] here" "$tmp/err"
check "another model: says which model line differs" grep -q "model line 3" "$tmp/err"
check "another model: no checkpoint written" test "$(ls "$tmp/a" | wc -l)" -eq 3

# 7. No logdir: no checkpoint, no restore.
(cd "$tmp" && "$bin" train --model "$tmp/tiny.model" --data "$tmp/data" --batch_size 16 --train_steps 3 \
  --logdir= --summary_dir= >"$tmp/out" 2>&1)
check "--logdir= --summary_dir= writes nothing" test ! -e "$tmp/checkpoint" -a ! -e "$tmp/summary_log"

# 8. SIGINT on one machine: the step reached is saved, and the run exits 130.
"$bin" train --model "$tmp/tiny.model" --data "$tmp/data" --batch_size 16 --steps_to_validate 10 \
  --train_steps 100000 --logdir "$tmp/d" --summary_dir= --save_model_secs 0 >"$tmp/d.out" 2>&1 &
pid=$!
for _ in $(seq 100); do grep -q '^step 10 ' "$tmp/d.out" 2>/dev/null && break; sleep 0.2; done
kill -INT $pid
for _ in $(seq 50); do kill -0 $pid 2>/dev/null || break; sleep 0.2; done
kill -KILL $pid 2>/dev/null
wait $pid
st=$?
check "SIGINT: exit status 130" test $st -eq 130
last=$(sed -n 's/^model_checkpoint_path: "model.ckpt-\([0-9]*\).safetensors"/\1/p' "$tmp/d/checkpoint" 2>/dev/null)
check "SIGINT: the step reached was saved (step ${last:-none})" test "${last:-0}" -ge 10

# 9. An index entry outside the log folder ("../victim.txt" as the oldest) is ignored with one
# warning naming the index file and line; max_to_keep never deletes it. An index naming a file far
# outside (../../../../etc/passwd) is not read either: the folder's own checkpoints are used.
cp -r "$tmp/b" "$tmp/e"
echo precious >"$tmp/victim.txt"
{ head -1 "$tmp/b/checkpoint"; echo 'all_model_checkpoint_paths: "../victim.txt"'; tail -n +2 "$tmp/b/checkpoint"; } >"$tmp/e/checkpoint"
train --train_steps 60 --logdir "$tmp/e" --summary_dir= --max_to_keep 2 --save_model_secs 0 >"$tmp/e.out" 2>&1
check "outside entry: training exits 0" test $? -eq 0
check "outside entry: one warning naming the index file and line" \
  test "$(grep -c "warning: $tmp/e/checkpoint:2: ignoring checkpoint path \"../victim.txt\"" "$tmp/e.out")" -eq 1
check "outside entry: mentioned once in the whole run" test "$(grep -c victim "$tmp/e.out")" -eq 1
check "outside entry: the file outside is still there" grep -qx precious "$tmp/victim.txt"
check "outside entry: retention kept 2 (40 and 60), without it" \
  test "$(sed -n 's/^all_model_checkpoint_paths: "\(.*\)"/\1/p' "$tmp/e/checkpoint" | tr '\n' ' ')" = \
  "model.ckpt-40.safetensors model.ckpt-60.safetensors "
mkdir "$tmp/h"
cp "$tmp/b/model.ckpt-20.safetensors" "$tmp/h/"
printf 'model_checkpoint_path: "../../../../../../../../etc/passwd"\nall_model_checkpoint_paths: "/etc/passwd"\n' >"$tmp/h/checkpoint"
"$bin" inspect "$tmp/h" >"$tmp/h.out" 2>"$tmp/h.err"
check "passwd entry: inspect exits 0 with the folder's checkpoint" grep -q '^global_step: 20' "$tmp/h.out"
check "passwd entry: ignored with a warning for each line" \
  test "$(grep -c "$tmp/h/checkpoint:[12]: ignoring checkpoint path .*etc/passwd" "$tmp/h.err")" -eq 2
check "passwd entry: never opened" test "$(grep -c 'skipping\|passwd: ' "$tmp/h.err")" -eq 0

# 10. A symbolic link named like a checkpoint, pointing outside: not read (the previous checkpoint is
# used, with a warning), and retention removes the link (it is in the log folder), not its target.
mkdir "$tmp/outside"
cp "$tmp/b/model.ckpt-40.safetensors" "$tmp/outside/"
cp -r "$tmp/b" "$tmp/g"
rm "$tmp/g/model.ckpt-40.safetensors"
ln -s "$tmp/outside/model.ckpt-40.safetensors" "$tmp/g/model.ckpt-40.safetensors"
train --train_steps 45 --logdir "$tmp/g" --summary_dir= --max_to_keep 1 >"$tmp/g.out" 2>&1
check "symlink: training exits 0" test $? -eq 0
check "symlink: a warning names the link" grep -q "warning: .*$tmp/g/model.ckpt-40.safetensors.*symbolic link" "$tmp/g.out"
check "symlink: the previous checkpoint is restored" grep -q "restored $tmp/g/model.ckpt-20.safetensors: global step 20" "$tmp/g.out"
check "symlink: retention removed the link" test ! -L "$tmp/g/model.ckpt-40.safetensors"
check "symlink: its target is untouched" cmp -s "$tmp/outside/model.ckpt-40.safetensors" "$tmp/b/model.ckpt-40.safetensors"

# 11. The index write after model.ckpt-40 failed (the index still names 20 as the newest): the next
# start uses 40, saying so, and retention deletes it in its turn.
cp -r "$tmp/b" "$tmp/f"
printf 'model_checkpoint_path: "model.ckpt-20.safetensors"\nall_model_checkpoint_paths: "model.ckpt-0.safetensors"\nall_model_checkpoint_paths: "model.ckpt-20.safetensors"\n' >"$tmp/f/checkpoint"
train --train_steps 45 --logdir "$tmp/f" --summary_dir= --max_to_keep 2 >"$tmp/f.out" 2>&1
check "orphan: training exits 0" test $? -eq 0
check "orphan: the log says the newer file is used" \
  grep -qF "checkpoint: model.ckpt-40.safetensors is newer than the index's newest (model.ckpt-20.safetensors); using it" "$tmp/f.out"
check "orphan: restored step 40" grep -q "restored $tmp/f/model.ckpt-40.safetensors: global step 40" "$tmp/f.out"
check "orphan: resumes at 40 and ends at 45" grep -q '^trained 5 local steps.*global step 45' "$tmp/f.out"
train --train_steps 50 --logdir "$tmp/f" --summary_dir= --max_to_keep 2 >"$tmp/f2.out" 2>&1
check "orphan: retention deleted it two saves later" test ! -e "$tmp/f/model.ckpt-40.safetensors" -a "$(ls "$tmp/f" | tr '\n' ' ')" = \
  "checkpoint model.ckpt-45.safetensors model.ckpt-50.safetensors "

summary

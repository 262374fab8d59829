#!/usr/bin/env bash
# Graph models through the CLI: a graph mistake is one line naming FILE:LINE and a non-zero exit;
# models/resnet.model trains a few steps on a Fashion-MNIST subset, its checkpoint (moving
# statistics included) restores in 'dtrain eval' with the accuracy training reported; a cluster
# refuses batch-norm state it cannot keep in step yet, naming the variable.
. "$(dirname "$0")/lib.sh"
fashion_subset "$tmp/data" 256 200 || { bad "subset"; summary; exit 1; }

printf 'input 8 8 1\nconv2d name=a filters=2 kernel=3\nrelu input=b\nflatten\ndense units=2\n' >"$tmp/bad.model"
"$bin" train --model "$tmp/bad.model" --data "$tmp/data" --logdir= --summary_dir= >"$tmp/out" 2>"$tmp/err"
st=$?
check "graph error: non-zero exit" test "$st" -ne 0
check "graph error: one line" test "$(wc -l <"$tmp/err")" -eq 1
check "graph error names the line" grep -q "bad.model:3: input 'b' names no layer" "$tmp/err"

"$bin" train --model models/resnet.model --data "$tmp/data" --logdir="$tmp/ck" --summary_dir= --batch_size 16 \
  --train_steps 12 --steps_to_validate 6 --threads 2 >"$tmp/train" 2>&1
check "resnet trains" test $? -eq 0
train_acc=$(sed -n 's/^test accuracy \([0-9.]*\).*/\1/p' "$tmp/train")
"$bin" eval --logdir "$tmp/ck" --data "$tmp/data" --threads 2 >"$tmp/eval" 2>&1
check "resnet checkpoint evaluates" test $? -eq 0
eval_acc=$(sed -n 's/^test accuracy \([0-9.]*\).*/\1/p' "$tmp/eval")
check "eval's accuracy '$eval_acc' is training's '$train_acc'" test -n "$eval_acc" -a "$eval_acc" = "$train_acc"

p1=$(free_port) w1=$(free_port)
"$bin" train --model models/resnet.model --data "$tmp/data" --ps_hosts "127.0.0.1:$p1" \
  --worker_hosts "127.0.0.1:$w1" --job_name worker --task_index 0 --logdir= --summary_dir= >"$tmp/out" 2>"$tmp/err"
st=$?
check "cluster: batch norm refused" test "$st" -ne 0 -a "$(wc -l <"$tmp/err")" -eq 1
check "cluster: the message names the variable and the doc" grep -q "bn1/moving_mean.*docs/batchnorm.md" "$tmp/err"
summary

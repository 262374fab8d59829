#!/usr/bin/env bash
# Click-log models saved and resumed (issue 36). A model of tables only (no dense variable) under the
# default optimizers, adam for the dense variables and adagrad for the tables: the checkpoint holds
# the tables' one slot, and the updater's state had adam's two, so the save wrote past the
# checkpoint's buffer (heap overflow under ASan, a crash or a wrong model in release). It saves,
# and one process resumed at step 40 ends bit for bit where an uninterrupted run ends at 60.
. "$(dirname "$0")/lib.sh"
cd "${DTRAIN_SRC:-$(dirname "$0")/..}"

"$bin" gen-clicks --out "$tmp/clicks.tsv" --lines 4000 --vocab 300 --seed 5 >"$tmp/gen.out" 2>&1
printf 'model t\ninput dense=13 fields=26\nembedding name=w dim=1 buckets=4096 combiner=sum weight_init=constant(0)
reduce_sum name=ids\n' >"$tmp/tables.model"
common=(--data "$tmp/clicks.tsv" --model "$tmp/tables.model" --batch_size 64 --table_learning_rate 0.2
        --summary_dir "" --threads 1)

# The data section of a checkpoint (the bytes after its header): equal sections, equal tensors.
data_md5() { local n; n=$(od -An -t u8 -N8 "$1" | tr -d ' '); tail -c +$((9 + n)) "$1" | md5sum | cut -d' ' -f1; }

timeout --foreground 120 "$bin" train "${common[@]}" --train_steps 60 --logdir "$tmp/U" >"$tmp/u.out" 2>&1
st=$?
check "a model of tables only, adam + adagrad, trains 60 steps and saves (status $st)" \
  [ "$st" -eq 0 -a -f "$tmp/U/model.ckpt-60.safetensors" ]
"$bin" inspect "$tmp/U/model.ckpt-60.safetensors" >"$tmp/inspect.out" 2>&1
check "... its checkpoint holds the tables' adagrad slot, and no adam moments" \
  eval 'grep -qE "^w/embeddings_25/adagrad_accumulator +F32 +\[4096,1\]" "$tmp/inspect.out" && ! grep -q adam_ "$tmp/inspect.out"'
check "... and a trained model (not the untrained one's 0.5000)" \
  eval 'grep "^test auc" "$tmp/u.out" | grep -vq "mean prediction 0.5000"'

timeout --foreground 120 "$bin" train "${common[@]}" --train_steps 40 --logdir "$tmp/R" >"$tmp/r40.out" 2>&1 &&
  timeout --foreground 120 "$bin" train "${common[@]}" --train_steps 60 --logdir "$tmp/R" >"$tmp/r60.out" 2>&1
st=$?
check "40 steps, then resumed to 60 (status $st)" [ "$st" -eq 0 ]
check "... from step 40" grep -q "restored $tmp/R/model.ckpt-40.safetensors: global step 40" "$tmp/r60.out"
want=$(data_md5 "$tmp/U/model.ckpt-60.safetensors" 2>/dev/null)
got=$(data_md5 "$tmp/R/model.ckpt-60.safetensors" 2>/dev/null)
check "... step 60 is bit for bit the uninterrupted run's (tables and slots included)" [ -n "$want" -a "$got" = "$want" ]
summary

#!/usr/bin/env bash
# Click-log models saved and resumed (issue 36). A model of tables only (no dense variable) under the
# default optimizers, adam for the dense variables and adagrad for the tables: the checkpoint holds
# the tables' one slot, and the updater's state had adam's two, so the save wrote past the
# checkpoint's buffer (heap overflow under ASan, a crash or a wrong model in release). It saves,
# and one process resumed at step 40 ends bit for bit where an uninterrupted run ends at 60.
# A sync cluster resumed from a checkpoint: a worker other than the chief pulled the tables' rows
# before the chief's SPARSE_IMPORT had landed, so its first step ran on the initial rows. Each ps
# now holds every SPARSE_PULL until the chief's import ends (docs/sparse.md, "Checkpoints"); with
# the chief slowed between declaring the tables and importing them, 2 ps + 2 sync workers resumed
# at step 10 end at 20 bit for bit where the cluster that never stopped ends, as one process does,
# and so does a cluster whose chief died during the import and was started again.
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

# A small FM with dense variables (tests/fixtures/sparse_fm.model), on 2 ps tasks and 2 sync workers.
"$bin" gen-clicks --out "$tmp/fm.tsv" --lines 6000 --vocab 500 --model fm --seed 5 >"$tmp/genfm.out" 2>&1
fm=(--data "$tmp/fm.tsv" --model tests/fixtures/sparse_fm.model --optimizer adam --learning_rate 0.01
    --table_optimizer adagrad --batch_size 64 --summary_dir "" --threads 1 --steps_to_validate 1)
cluster=(launch --ps 2 --workers 2 --issync 1 "${fm[@]}")
timeout --foreground 120 "$bin" "${cluster[@]}" --train_steps 20 --logdir "$tmp/CU" >"$tmp/cu.out" 2>&1
check "the uninterrupted cluster (status $?)" [ -f "$tmp/CU/model.ckpt-20.safetensors" ]
timeout --foreground 120 "$bin" "${cluster[@]}" --train_steps 10 --logdir "$tmp/CR" >"$tmp/cr10.out" 2>&1 &&
  timeout --foreground 120 "$bin" "${cluster[@]}" --train_steps 20 --logdir "$tmp/CR" --debug_import_delay_ms 1000 \
    >"$tmp/cr20.out" 2>&1
st=$?
check "a cluster of 10 steps, then resumed to 20, the chief's import 1 s late (status $st)" [ "$st" -eq 0 ]
check "... the chief restored the tables onto both ps tasks" \
  grep -qE "chief: restored the 52 sparse table\(s\) of .*model.ckpt-10.safetensors onto 2 ps task\(s\)" "$tmp/cr20.out"
# worker 1's first resumed step: its loss under the restored rows (the uninterrupted run's step 11)
l1=$(sed -n 's/^\[worker1\] step 11 .* loss \([0-9.]*\) .*/\1/p' "$tmp/cu.out")
l2=$(sed -n 's/^\[worker1\] step 11 .* loss \([0-9.]*\) .*/\1/p' "$tmp/cr20.out")
check "... worker 1's first step is the uninterrupted run's (loss $l2, uninterrupted $l1)" [ -n "$l1" -a "$l1" = "$l2" ]
want=$(data_md5 "$tmp/CU/model.ckpt-20.safetensors" 2>/dev/null)
got=$(data_md5 "$tmp/CR/model.ckpt-20.safetensors" 2>/dev/null)
check "... step 20 is bit for bit the uninterrupted cluster's (tables and slots included)" [ -n "$want" -a "$got" = "$want" ]

# The chief dies during its import (killed in the 3 s between declaring the tables and sending
# their rows): the ps still holds the pulls, and says so (WELCOME, STATUS_REPLY), so the chief started
# again initialises it from the checkpoint instead of taking its half-imported tables as the model;
# worker 1 waits meanwhile, and step 20 is again the uninterrupted run's.
ports=($(free_port 3))
mkdir -p "$tmp/CK" && cp "$tmp/CR/model.ckpt-10.safetensors" "$tmp/CK/"
by_hand=(train "${fm[@]}" --ps_hosts "127.0.0.1:${ports[0]}" --worker_hosts "127.0.0.1:${ports[1]},127.0.0.1:${ports[2]}"
         --issync 1 --train_steps 20 --logdir "$tmp/CK" --heartbeat_timeout 20)
"$bin" "${by_hand[@]}" --job_name ps >"$tmp/ck_ps.out" 2>&1 &
ps_pid=$!
"$bin" "${by_hand[@]}" --job_name worker --task_index 1 >"$tmp/ck_w1.out" 2>&1 &
w1_pid=$!
"$bin" "${by_hand[@]}" --job_name worker --task_index 0 --debug_import_delay_ms 3000 >"$tmp/ck_c1.out" 2>&1 &
chief_pid=$!
for _ in $(seq 200); do grep -q "their rows follow from a checkpoint" "$tmp/ck_ps.out" && break; sleep 0.05; done
kill -KILL "$chief_pid"
wait "$chief_pid" 2>/dev/null
timeout --foreground 60 "$bin" "${by_hand[@]}" --job_name worker --task_index 0 >"$tmp/ck_c2.out" 2>&1
st=$?
timeout --foreground 30 tail --pid="$w1_pid" -f /dev/null
wait "$w1_pid"
st1=$?
kill "$ps_pid" 2>/dev/null
wait "$ps_pid" 2>/dev/null
check "the chief killed during its import; started again, it and worker 1 finish (status $st, $st1)" \
  [ "$st" -eq 0 -a "$st1" -eq 0 ]
check "... it restored the tables again, not taking the ps tasks' half-imported ones" \
  eval 'grep -q "chief: restored the 52 sparse table(s)" "$tmp/ck_c2.out" && ! grep -q "already hold the model" "$tmp/ck_c2.out"'
want=$(data_md5 "$tmp/CU/model.ckpt-20.safetensors" 2>/dev/null)
got=$(data_md5 "$tmp/CK/model.ckpt-20.safetensors" 2>/dev/null)
check "... step 20 is bit for bit the uninterrupted cluster's" [ -n "$want" -a "$got" = "$want" ]

# One process the same way: resumed at step 10, it ends at 20 as its uninterrupted run.
timeout --foreground 120 "$bin" train "${fm[@]}" --train_steps 20 --logdir "$tmp/OU" >"$tmp/ou.out" 2>&1
timeout --foreground 120 "$bin" train "${fm[@]}" --train_steps 10 --logdir "$tmp/OR" >"$tmp/or10.out" 2>&1 &&
  timeout --foreground 120 "$bin" train "${fm[@]}" --train_steps 20 --logdir "$tmp/OR" >"$tmp/or20.out" 2>&1
check "one process: 10 steps, then resumed to 20 (status $?)" \
  grep -q "restored $tmp/OR/model.ckpt-10.safetensors: global step 10" "$tmp/or20.out"
want=$(data_md5 "$tmp/OU/model.ckpt-20.safetensors" 2>/dev/null)
got=$(data_md5 "$tmp/OR/model.ckpt-20.safetensors" 2>/dev/null)
check "one process resumed at step 10 ends at 20 bit for bit as its uninterrupted run" [ -n "$want" -a "$got" = "$want" ]
summary

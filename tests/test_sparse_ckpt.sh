#!/usr/bin/env bash
# A cluster's sparse tables in its checkpoints (issue 22, docs/checkpoint-format.md "Sparse tables"):
# the chief writes each table as one process does ([rows, dim] and its slots, fetched from the ps
# tasks page by page), so `dtrain eval` on the checkpoint prints the chief's own end line, and
# `dtrain inspect` shows the tables; a cluster restored onto 1 or 3 ps tasks (the rows re-hashed to
# their new homes) and trained on ends bit for bit where a cluster that never stopped ends (LazyAdam
# for the tables: their step travels too); one process resumes the cluster's checkpoint, and a cluster
# one process's.
. "$(dirname "$0")/lib.sh"
cd "${DTRAIN_SRC:-$(dirname "$0")/..}"

"$bin" gen-clicks --out "$tmp/clicks.tsv" --lines 6000 --vocab 500 --model fm --seed 5 >"$tmp/gen.out" 2>&1
# 26 tables of dim 1 (zeros) and 26 of dim 4 (truncated normal: rows never trained are the ps's
# initial draws), and enough dense variables for 3 ps tasks.
cp tests/fixtures/sparse_fm.model "$tmp/fm.model"
common=(--data "$tmp/clicks.tsv" --model "$tmp/fm.model" --optimizer adam --learning_rate 0.01
        --table_optimizer adam --batch_size 64 --summary_dir "" --threads 1)

# The data section of a checkpoint (the bytes after its header): equal sections, equal tensors.
data_md5() { local n; n=$(od -An -t u8 -N8 "$1" | tr -d ' '); tail -c +$((9 + n)) "$1" | md5sum | cut -d' ' -f1; }

timeout --foreground 120 "$bin" launch --ps 2 --workers 1 --issync 1 "${common[@]}" --train_steps 30 --logdir "$tmp/A" \
  >"$tmp/a.out" 2>&1
st=$?
check "2 ps + 1 sync worker train 30 steps and checkpoint (status $st)" [ "$st" -eq 0 ]
check "no warning that the tables are not restored" bash -c "! grep -q 'do not hold the sparse tables' $tmp/a.out"
timeout --foreground 60 "$bin" eval --logdir "$tmp/A" --data "$tmp/clicks.tsv" >"$tmp/eval.out" 2>&1
chief=$(sed -n 's/^\[worker0\] \(test auc .*\)$/\1/p' "$tmp/a.out")
evaled=$(grep '^test auc' "$tmp/eval.out")
echo "chief: $chief"
echo "eval:  $evaled"
check "dtrain eval on the cluster's checkpoint prints the chief's end line" [ -n "$chief" -a "$chief" = "$evaled" ]

"$bin" inspect "$tmp/A/model.ckpt-30.safetensors" >"$tmp/inspect.out" 2>&1
check "inspect: the tables' tensors in one process's shape" \
  grep -qE '^factors/embeddings_3/adam_v +F32 +\[1024,4\]' "$tmp/inspect.out"
check "inspect: the tables, their optimizer and rows trained" grep -q '^tables: 52; optimizer adam' "$tmp/inspect.out"
check "inspect: each table's rows, dim and slots" \
  grep -qE '^  factors/embeddings_25 +1024 rows x dim 4, slots adam_m, adam_v: [1-9][0-9]* rows trained' "$tmp/inspect.out"

# The same 40 steps, uninterrupted on 2 ps; then 30 + restore + 10 on 1 and on 3 ps tasks.
timeout --foreground 120 "$bin" launch --ps 2 --workers 1 --issync 1 "${common[@]}" --train_steps 40 --logdir "$tmp/R" \
  >"$tmp/r.out" 2>&1
check "the uninterrupted run (status $?)" [ -f "$tmp/R/model.ckpt-40.safetensors" ]
want=$(data_md5 "$tmp/R/model.ckpt-40.safetensors")
for n in 1 3; do
  mkdir -p "$tmp/B$n" && cp "$tmp/A/model.ckpt-30.safetensors" "$tmp/B$n/"
  timeout --foreground 120 "$bin" launch --ps "$n" --workers 1 --issync 1 "${common[@]}" --train_steps 40 --logdir "$tmp/B$n" \
    >"$tmp/b$n.out" 2>&1
  st=$?
  check "restored onto $n ps task(s) and trained on (status $st)" [ "$st" -eq 0 ]
  check "... the chief sent the tables' rows to their $n ps task(s)" \
    grep -qE "chief: restored the 52 sparse table\(s\) of .* onto $n ps task\(s\): [1-9][0-9]* row\(s\)" "$tmp/b$n.out"
  got=$(data_md5 "$tmp/B$n/model.ckpt-40.safetensors" 2>/dev/null)
  check "... step 40 is bit for bit the uninterrupted run's (every tensor, tables and slots included)" \
    [ "$got" = "$want" ]
done

# One process resumes the cluster's checkpoint (its own format) and trains on.
mkdir -p "$tmp/one" && cp "$tmp/A/model.ckpt-30.safetensors" "$tmp/one/"
timeout --foreground 120 "$bin" train "${common[@]}" --train_steps 35 --logdir "$tmp/one" \
  >"$tmp/one.out" 2>&1
st=$?
check "one process resumes the cluster's checkpoint (status $st)" [ "$st" -eq 0 ]
check "... from its step" grep -q "restored $tmp/one/model.ckpt-30.safetensors: global step 30" "$tmp/one.out"
# ... and a cluster resumes one process's: its tables' rows go to their ps tasks, whose test line at
# the restored step is the one process's.
mkdir -p "$tmp/two" && cp "$tmp/one/model.ckpt-35.safetensors" "$tmp/two/"
timeout --foreground 120 "$bin" launch --ps 3 --workers 1 --issync 1 "${common[@]}" --train_steps 35 --logdir "$tmp/two" \
  >"$tmp/two.out" 2>&1
st=$?
one=$(grep '^test auc' "$tmp/one.out")
two=$(sed -n 's/^\[worker0\] \(test auc .*\)$/\1/p' "$tmp/two.out")
echo "one process: $one"
echo "3 ps from its checkpoint: $two"
check "3 ps tasks resume one process's checkpoint and test as it did (status $st)" [ "$st" -eq 0 -a -n "$one" -a "$one" = "$two" ]
summary

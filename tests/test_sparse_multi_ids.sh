#!/usr/bin/env bash
# Fields with several ids a line (libffm: a user's tags) on a cluster (docs/sparse.md, "On a
# worker"): a worker's block of rows for a batch holds max_ids= rows per example and field. A model
# without it is refused at the first batch naming max_ids=; with it, 1 ps + 1 sync worker train
# the model to where one process (which holds its tables whole) ends: the same test AUC and logloss
# to 0.001. A block past a step's bound is refused at start naming it.
. "$(dirname "$0")/lib.sh"
cd "${DTRAIN_SRC:-$(dirname "$0")/..}"

# 4000 libffm lines: fields 0-2 one id each (of 30), field 3 one to three distinct tags (of 400, so
# a batch of 64 names more than 64); the click's log-odds are the sum of per-id effects.
awk 'BEGIN {
  srand(7)
  for (k = 0; k < 400; k++) tag[k] = 2 * rand() - 1
  for (k = 0; k < 30; k++) eff[k] = rand() - 0.5
  for (i = 0; i < 4000; i++) {
    z = -0.5; line = ""
    for (f = 0; f < 3; f++) { a = int(30 * rand()); z += eff[a]; line = line " " f ":" (f * 100 + a) ":1" }
    n = 1 + int(3 * rand()); delete used
    for (j = 0; j < n; j++) {
      do t = int(400 * rand()); while (t in used)
      used[t] = 1; z += tag[t]; line = line " 3:" (1000 + t) ":1"
    }
    printf "%d%s\n", rand() < 1 / (1 + exp(-2 * z)), line
  }
}' >"$tmp/tags.ffm"
cat >"$tmp/tags.model" <<'M'
model tags
input dense=0 fields=4
embedding name=weights dim=1 buckets=4096 combiner=sum weight_init=constant(0)
reduce_sum name=ids
dense name=logit input=ids units=1 weight_init=constant(1)  # a scale and the bias: dense variables for the ps
M
common=(--data "$tmp/tags.ffm" --optimizer sgd --learning_rate 0.05 --table_learning_rate 0.2 --epochs 2
        --steps_to_validate 1000 --logdir "" --summary_dir "" --threads 1)

timeout --foreground 60 "$bin" train "${common[@]}" --batch_size 64 --model "$tmp/tags.model" \
  >"$tmp/one.out" 2>&1
check "one process trains on fields of several ids (status $?)" grep -q "^test auc" "$tmp/one.out"

cluster=(launch --ps 1 --workers 1 --issync 1 "${common[@]}")
timeout --foreground 60 "$bin" "${cluster[@]}" --batch_size 64 --model "$tmp/tags.model" \
  >"$tmp/refused.out" 2>&1
st=$?
check "a cluster without max_ids= stops (status $st), naming max_ids= and the table" \
  eval '[ "$st" -ne 0 ] && grep -q "weights/embeddings_3: a batch names more than 64 distinct rows of table 3 \
(its block holds max_ids=1 per example and field): raise max_ids=" "$tmp/refused.out"'

sed 's/combiner=sum/combiner=sum max_ids=3/' "$tmp/tags.model" >"$tmp/tags3.model"
timeout --foreground 60 "$bin" "${cluster[@]}" --batch_size 64 --model "$tmp/tags3.model" \
  >"$tmp/sync.out" 2>&1
st=$?
check "with max_ids=3, 1 ps + 1 sync worker train (status $st)" [ "$st" -eq 0 ]
read -r a1 l1 < <(awk '/^test auc/ {print $3, $6}' "$tmp/one.out")
read -r a2 l2 < <(awk '/\] test auc/ {print $4, $7}' "$tmp/sync.out")
check "... to one process's test AUC and logloss (one: $a1 $l1; cluster: $a2 $l2)" \
  awk -v a="${a1:-0}" -v b="${a2:-9}" -v c="${l1:-0}" -v d="${l2:-9}" \
  'BEGIN {x = a - b; y = c - d; exit !(a > 0.6 && x * x <= 1e-6 && y * y <= 1e-6)}'

sed 's/combiner=sum/combiner=sum max_ids=4096/' "$tmp/tags.model" >"$tmp/big.model"
timeout --foreground 60 "$bin" "${cluster[@]}" --batch_size 512 \
  --model "$tmp/big.model" >"$tmp/big.out" 2>&1
st=$?
check "a block past a step's rows of one table is refused at start (status $st), naming the bound" \
  eval '[ "$st" -ne 0 ] && grep -q "more than a ps takes of one table in a step (1048576, \
DT_WIRE_MAX_SPARSE_STEP_ROWS): lower max_ids= or the batch size" "$tmp/big.out"'
summary

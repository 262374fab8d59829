#!/usr/bin/env bash
# dtrain against PyTorch on the same click logs with the same recipe (issue 22, "Learning": a
# PyTorch model of the same, EmbeddingBag, trained with the same recipe lands within 0.002 AUC of
# dtrain). The generator's logistic-true and FM-true logs (as bench/ctr_learning.sh, whose files it
# reuses), models/lr.model and models/fm.model against bench/torch_ctr.py's lr and fm: Adagrad
# (initial accumulator 0.1) at TABLE_LR for the tables, Adam at LR with a cosine decay to 0 for the
# dense part, the linear part from zeros, batch 256, one epoch in file order, one thread. LR starts
# from zeros on both sides (one run); FM's factors are drawn, so it runs once per seed of SEEDS.
#   bench/ctr_parity.sh [OUT_DIR]      (default bench/out/ctr)
# Environment: DTRAIN (build/dtrain), LINES (2000000), LR (0.003), TABLE_LR (0.2), SEEDS ("1 2 3").
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
bin=${DTRAIN:-$here/build/dtrain}
out=${1:-$here/bench/out/ctr}
lines=${LINES:-2000000} lr=${LR:-0.003} tlr=${TABLE_LR:-0.2}
mkdir -p "$out"
for truth in lr fm; do
  [ -s "$out/$truth.tsv" ] || "$bin" gen-clicks --out "$out/$truth.tsv" --lines "$lines" --model "$truth" >"$out/$truth.gen"
done
printf '%-6s %5s %12s %12s %10s\n' model seed dtrain_auc pytorch_auc difference
for m in lr fm; do
  seeds=${SEEDS:-1 2 3}; [ "$m" = lr ] && seeds=1
  for seed in $seeds; do
    "$bin" train --data "$out/$m.tsv" --model "$here/models/$m.model" --batch_size 256 --learning_rate "$lr" \
      --lr_schedule cosine --table_optimizer adagrad --table_learning_rate "$tlr" --seed "$seed" --threads 1 \
      --logdir "" --summary_dir "" --steps_to_validate 1000000 >"$out/parity-$m-$seed.dtrain" 2>&1
    /usr/bin/python3 "$here/bench/torch_ctr.py" "$out/$m.tsv" --model "$m" --factor_buckets 262144 --lr "$tlr" \
      --dense_optimizer adam --dense_lr "$lr" --schedule cosine --seed "$seed" >"$out/parity-$m-$seed.torch" 2>&1
    a=$(awk '/^test auc/ {print $3}' "$out/parity-$m-$seed.dtrain")
    b=$(tail -1 "$out/parity-$m-$seed.torch" | /usr/bin/python3 -c 'import json,sys; print("%.4f" % json.load(sys.stdin)["auc"])')
    printf '%-6s %5s %12s %12s %10.4f\n' "$m" "$seed" "$a" "$b" "$(echo "$a - $b" | bc -l)"
  done
done

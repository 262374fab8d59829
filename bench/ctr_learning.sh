#!/usr/bin/env bash
# Click-through-rate models against the generator's Bayes-optimal AUC (issue 22, "Learning"):
# dtrain gen-clicks writes the logistic-true and the FM-true log at its defaults (2,000,000 lines),
# then models/lr.model trains on the first, models/fm.model and models/deepfm.model on the second,
# one epoch each in one process; each run's test AUC is printed beside the Bayes AUC of the same
# test split. Figures: BENCHMARKS.md, "Click-through-rate models: learning".
#   bench/ctr_learning.sh [OUT_DIR]      (default bench/out/ctr; about 2 GB of logs)
# Environment: DTRAIN (the binary, default build/dtrain), LINES (2000000), BATCH (256), LR (0.003),
# SCHEDULE (cosine), TABLE_OPT (adagrad), TABLE_LR (0.2), MODELS ("lr fm deepfm"), SEED (1); the
# figures of BENCHMARKS.md use the defaults.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
bin=${DTRAIN:-$here/build/dtrain}
out=${1:-$here/bench/out/ctr}
lines=${LINES:-2000000}
mkdir -p "$out"
for truth in lr fm; do
  [ -s "$out/$truth.tsv" ] || "$bin" gen-clicks --out "$out/$truth.tsv" --lines "$lines" --model "$truth" >"$out/$truth.gen"
done
printf '%-8s %-6s %10s %10s %8s %10s %12s\n' model truth test_auc bayes_auc gap logloss examples/s
for m in ${MODELS:-lr fm deepfm}; do
  truth=fm; [ "$m" = lr ] && truth=lr
  "$bin" train --data "$out/$truth.tsv" --model "$here/models/$m.model" --batch_size "${BATCH:-256}" \
    --learning_rate "${LR:-0.003}" --lr_schedule "${SCHEDULE:-cosine}" --table_optimizer "${TABLE_OPT:-adagrad}" \
    --table_learning_rate "${TABLE_LR:-0.2}" --seed "${SEED:-1}" --logdir "" --summary_dir "" \
    --steps_to_validate 1000000 >"$out/$m.train" 2>&1
  auc=$(awk '/^test auc/ {print $3}' "$out/$m.train")
  ll=$(awk '/^test auc/ {print $6}' "$out/$m.train")
  eps=$(awk '/^trained/ {gsub(/\(/, "", $8); print $8}' "$out/$m.train")
  bayes=$(awk '$1 == "test" {print $5}' "$out/$truth.gen")
  printf '%-8s %-6s %10s %10s %8.4f %10s %12s\n' "$m" "$truth" "$auc" "$bayes" "$(echo "$bayes - $auc" | bc -l)" \
    "$ll" "$eps"
done

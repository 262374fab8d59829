#!/usr/bin/env bash
# Training speed of a click-log model in one process, dtrain against PyTorch (issue 22, "Speed":
# dtrain >= 2x PyTorch's EmbeddingBag(sparse=True) + Adagrad, same model and batch, in examples/s).
# Rounds interleave the two, alternating which goes first; prints each run, the medians and the
# median of the per-round ratios. Figures: BENCHMARKS.md, "Click-through-rate models: speed".
#   bench/ctr_speed.sh FILE [ROUNDS] [MODEL]       (MODEL: lr, fm or deepfm; default fm, 3 rounds)
# Environment: DTRAIN (default build/dtrain), THREADS (1), BATCH (256).
# dtrain's figure is its own "trained ... examples/sec" line: the training loop with the click log
# read and parsed under it. PyTorch's is its training loop alone (bench/torch_ctr.py builds every
# batch before the clock starts). The same model: models/MODEL.model's tables (2^20 rows a field for
# the weights, 2^18 for fm's factors, dimension 8; deepfm's 200-200 network) and batch.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
bin=${DTRAIN:-$here/build/dtrain}
file=$1
rounds=${2:-3}
model=${3:-fm}
threads=${THREADS:-1}
batch=${BATCH:-256}
hidden=200,200
run_dtrain() {
  "$bin" train --data "$file" --model "$here/models/$model.model" --batch_size "$batch" --threads "$threads" \
    --learning_rate 0.003 --table_learning_rate 0.2 --logdir "" --summary_dir "" --steps_to_validate 100000000 \
    | awk '/^trained/ {gsub(/\(/, "", $8); print $8}'
}
run_torch() {
  /usr/bin/python3 "$here/bench/torch_ctr.py" "$file" --model "$model" --factor_buckets 262144 --hidden "$hidden" \
    --lr 0.2 --batch "$batch" --threads "$threads" | tail -1 |
    /usr/bin/python3 -c 'import json, sys; print(round(json.load(sys.stdin)["examples_per_s"]))'
}
d=() t=()
for ((r = 1; r <= rounds; r++)); do
  if ((r % 2)); then a=$(run_dtrain); b=$(run_torch); else b=$(run_torch); a=$(run_dtrain); fi
  d+=("$a") t+=("$b")
  echo "round $r: dtrain $a examples/s, pytorch $b examples/s, ratio $(echo "scale=2; $a / $b" | bc)"
done
median() { printf '%s\n' "$@" | sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
ratios=()
for ((i = 0; i < rounds; i++)); do ratios+=("$(echo "scale=4; ${d[i]} / ${t[i]}" | bc)"); done
echo "$model, batch $batch, $threads thread(s), $rounds rounds: dtrain median $(median "${d[@]}") examples/s," \
  "pytorch median $(median "${t[@]}") examples/s, median ratio $(median "${ratios[@]}")"

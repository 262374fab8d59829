#!/usr/bin/env bash
# Distributed equals single for click-log models (issue 22, "Numbers"): the same model and recipe
# trained one epoch on the generator's default log (2,000,000 lines, 26 fields of 10^6 ids, Zipf
# 1.1) by one process at batch 2B, by 1 ps + 2 sync workers at batch B each (the same global
# batch; the issue: within 0.001 test AUC of one process) and by 1 ps + 4 async workers at batch
# B/2 each (within 0.005). Prints each run's test AUC, logloss and wall time, and the differences.
#   bench/ctr_distributed.sh [OUT_DIR]      (default bench/out/ctr; the log is shared with ctr_learning.sh)
# Environment: DTRAIN (the binary, default build/dtrain), LINES (2000000), MODEL (lr; or fm: trained
# on the FM-true log), B (256: per sync worker), LR (0.003), TABLE_LR (0.2), SEED (1).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
bin=${DTRAIN:-$here/build/dtrain}
out=${1:-$here/bench/out/ctr}
lines=${LINES:-2000000} m=${MODEL:-lr} b=${B:-256}
truth=fm; [ "$m" = lr ] && truth=lr
mkdir -p "$out"
[ -s "$out/$truth.tsv" ] || "$bin" gen-clicks --out "$out/$truth.tsv" --lines "$lines" --model "$truth" >"$out/$truth.gen"
recipe=(--data "$out/$truth.tsv" --model "$here/models/$m.model" --learning_rate "${LR:-0.003}" --lr_schedule cosine
        --table_optimizer adagrad --table_learning_rate "${TABLE_LR:-0.2}" --seed "${SEED:-1}" --epochs 1
        --logdir "" --summary_dir "" --steps_to_validate 1000000 --threads 1 --progress=never)
echo "uptime: $(uptime)"
run() { # NAME COMMAND...: its test AUC and logloss (the chief's end line), and its wall time
  local name=$1 t0 t1; shift
  t0=$(date +%s.%N)
  "$@" >"$out/dist-$m-$name.log" 2>&1 || { echo "$name: failed: $(tail -2 "$out/dist-$m-$name.log")" >&2; return 1; }
  t1=$(date +%s.%N)
  awk -v n="$name" -v a="$t0" -v b="$t1" '/test auc/ { for (i = 1; i < NF; i++) { if ($i == "auc") auc = $(i + 1); if ($i == "logloss") ll = $(i + 1) } }
    END { printf "%-22s test auc %s  logloss %s  %6.1f s\n", n, auc, ll, b - a }' "$out/dist-$m-$name.log"
}
run "one process" "$bin" train "${recipe[@]}" --batch_size $((2 * b)) | tee "$out/dist-$m.txt"
run "1 ps + 2 sync workers" "$bin" launch --ps 1 --workers 2 --issync 1 "${recipe[@]}" --batch_size "$b" | tee -a "$out/dist-$m.txt"
run "1 ps + 4 async workers" "$bin" launch --ps 1 --workers 4 --issync 0 "${recipe[@]}" --batch_size $((b / 2)) | tee -a "$out/dist-$m.txt"
awk '{ for (i = 1; i < NF; i++) if ($i == "auc") a[NR] = $(i + 1) }
  END { printf "sync - one process: %+.4f AUC (issue: within 0.001); async - one process: %+.4f (within 0.005)\n", a[2] - a[1], a[3] - a[1] }' "$out/dist-$m.txt"
echo "uptime: $(uptime)"

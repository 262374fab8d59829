#!/usr/bin/env bash
# sim/dtrain_sim (the SimGrid model of a training step, docs/testbed.md) against the closed form
# where the closed form is exact: no compute, no CPU cost (a cost file of zeros), many small chunks,
# so a step is the exchange alone and the exchange is bandwidth alone:
#   1 worker, 1 ps:   M/B (the worker's and the ps's links, up and down at once, chunks pipelined)
#   4 workers, 1 ps:  4 M/B (the ps's link carries every worker's gradient)
#   4 workers, 4 ps:  M/B (each ps a quarter of the model from each worker: the worker's link)
# within 3%: one chunk's trip the pipeline cannot hide (1/m of the step: fashion's 1.7 MB in m = 103
# chunks of 16 KiB; catdog's 8.5 MB over 4 ps, 130 chunks each) and the 120 bytes of header a chunk
# carries. A step with compute C = 3 x the exchange must then take C
# within 3% too (the exchange fully under it). Without SimGrid (no dtrain_sim built) it exits 77.
set -euo pipefail
src=${DTRAIN_SRC:-$(cd "$(dirname "$0")/.." && pwd)}
sim=${DTRAIN_SIM_BIN:-}
if [ -z "$sim" ] || [ ! -x "$sim" ]; then
  echo "test_sim: no dtrain_sim in this build (SimGrid, libsimgrid-dev, not installed): skipped"
  exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
printf 'ps_msg 0\nps_byte 0\nps_apply_msg 0\nps_apply_byte 0\nworker_msg 0\nworker_byte 0\n' >"$tmp/zero.txt"

fail=0
# check LABEL EXPECTED_KEY MODEL ARGS...: step_ms within 3% of the key's value (closed_exchange_ms or
# compute_ms), read from the same line.
check() {
  local label=$1 key=$2 model=$3; shift 3
  local out
  out=$(timeout 120 "$sim" --model "$src/models/$model.model" --costs "$tmp/zero.txt" --chunk_kb 16 "$@")
  echo "$label: $out"
  local step want
  step=$(sed -n 's/.* step_ms=\([0-9.]*\).*/\1/p' <<<"$out")
  want=$(sed -n "s/.* $key=\([0-9.]*\).*/\1/p" <<<"$out")
  if [ -z "$step" ] || [ -z "$want" ]; then
    echo "FAIL $label: no step_ms or $key in the output"
    fail=1
    return
  fi
  if ! awk -v s="$step" -v w="$want" 'BEGIN { r = s / w; exit !(r >= 0.99 && r <= 1.03) }'; then
    echo "FAIL $label: step $step ms, expected $want ms (-1%..+3%)"
    fail=1
  fi
}
check "1w 1ps" closed_exchange_ms fashion --ps 1 --workers 1 --gbit 1 --compute_ms 0
check "4w 1ps" closed_exchange_ms fashion --ps 1 --workers 4 --gbit 1 --compute_ms 0
check "4w 4ps" closed_exchange_ms catdog --ps 4 --workers 4 --gbit 10 --compute_ms 0
check "2w 1ps async" closed_exchange_ms fashion --ps 1 --workers 2 --gbit 1 --compute_ms 0 --sync 0
# fashion's 1.69 MB take 14.1 ms at 1 Gbit: compute 45 ms hides the exchange of 1 worker.
check "1w 1ps, compute" compute_ms fashion --ps 1 --workers 1 --gbit 1 --compute_ms 45
exit $fail

#!/usr/bin/env bash
# More threads against one (issue 36): training throughput at --threads 1 and 2 for the click-log
# models (lr, fm, deepfm: `dtrain train` on a generated click log, its examples/sec) and the image
# models (fashion, resnet: bench_train on synthetic batches, its images/sec, under libgomp's default
# spinning wait as a C program gets it, and "-passive" under the OMP_WAIT_POLICY=passive that
# `dtrain` and `import dtrain` set: the thresholds differ by policy, src/compute/cpu.c), on the machine as it
# is ("idle") and beside a busy loop (`yes > /dev/null`, not pinned: "loaded"). Rounds interleave
# every case, so a change in the machine's load hits all of them alike; it prints the median per
# case and its ratio to 1 thread under the same condition (>= 1: 2 threads no slower), then the
# kernels' break-evens (bench_par, the thresholds of src/compute/cpu.h), idle and loaded.
# usage: bench/threads.sh [ROUNDS]      (default 3; a release build in build/, or BUILD=dir)
#        BEFORE=/path/to/other/build bench/threads.sh   also runs that build's binaries in the same
#        rounds (before/after a change: the same load for both), reported as a second table.
# The environment is dtrain's own (OMP_WAIT_POLICY is set by dtrain itself unless given here).
set -euo pipefail
cd "$(dirname "$0")/.."
B=${BUILD:-build}
BEFORE=${BEFORE:-}
ROUNDS=${1:-3}
tmp=$(mktemp -d)
busy=
cleanup() { [ -n "$busy" ] && kill "$busy" 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
"$B/dtrain" gen-clicks --out "$tmp/clicks.tsv" --lines 50000 --vocab 100000 >/dev/null
out=$tmp/rows
: >"$out"
one() { # build condition model threads -> a line "build condition model threads rate"
  local B=$1 cond=$2 model=$3 t=$4 rate
  case $model in
    lr|fm|deepfm)
      local steps=200
      [ "$model" = fm ] && steps=100
      [ "$model" = deepfm ] && steps=40
      rate=$("$B/dtrain" train --model "models/$model.model" --data "$tmp/clicks.tsv" --batch_size 256 \
               --train_steps $steps --threads "$t" --logdir= --summary_dir= --progress never 2>&1 |
             sed -n 's/^trained .*(\([0-9.]*\) examples\/sec).*/\1/p') ;;
    *-passive) # as `dtrain train` runs them: OMP_WAIT_POLICY=passive (src/cli/main.c)
      rate=$(OMP_WAIT_POLICY=passive "$B/bench_train" "models/${model%-passive}.model" 64 "$t" 1 |
             sed -n 's/.*"images_per_sec": *\([0-9.]*\).*/\1/p') ;;
    *)
      rate=$("$B/bench_train" "models/$model.model" 64 "$t" 1 | sed -n 's/.*"images_per_sec": *\([0-9.]*\).*/\1/p') ;;
  esac
  echo "$B $cond $model $t ${rate:-nan}" >>"$out"
}
for r in $(seq "$ROUNDS"); do
  for cond in idle loaded; do
    if [ $cond = loaded ]; then yes >/dev/null & busy=$!; fi
    for model in lr fm deepfm fashion resnet fashion-passive resnet-passive; do
      for t in 1 2; do
        one "$B" $cond $model $t
        if [ -n "$BEFORE" ]; then one "$BEFORE" $cond $model $t; fi
      done
    done
    if [ $cond = loaded ]; then kill "$busy"; wait "$busy" 2>/dev/null || true; busy=; fi
  done
done
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg) ($(nproc) cores; other processes count as 'idle')"
python3 - "$out" <<'PY'
import statistics, sys
rows, builds = {}, []
for line in open(sys.argv[1]):
    b, c, m, t, v = line.split()
    if b not in builds: builds.append(b)
    rows.setdefault((b, c, m, int(t)), []).append(float(v))
for b in builds:
    print(f"build {b}")
    print(f"{'condition':9} {'model':15} {'threads':>7} {'median/s':>10} {'vs 1 thread':>11}  rounds")
    for c in ("idle", "loaded"):
        for m in ("lr", "fm", "deepfm", "fashion", "resnet", "fashion-passive", "resnet-passive"):
            base = statistics.median(rows[(b, c, m, 1)])
            for t in (1, 2):
                v = rows[(b, c, m, t)]
                med = statistics.median(v)
                print(f"{c:9} {m:15} {t:7} {med:10.0f} {med / base:11.2f}  " + " ".join(f"{x:.0f}" for x in v))
PY
for cond in idle loaded; do
  if [ $cond = loaded ]; then yes >/dev/null & busy=$!; fi
  echo "kernels' break-evens, $cond (spinning wait):"
  "$B/bench_par" 9 | grep break-even
  echo "kernels' break-evens, $cond (OMP_WAIT_POLICY=passive):"
  OMP_WAIT_POLICY=passive "$B/bench_par" 9 | grep break-even
  if [ $cond = loaded ]; then kill "$busy"; wait "$busy" 2>/dev/null || true; busy=; fi
done

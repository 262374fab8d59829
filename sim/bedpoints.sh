#!/usr/bin/env bash
# Undilated points of the netns bed for sim/dtrain_sim's validation where the dilated bed's
# (bench/bed_points.tsv) are not there: configurations with no contention for the cores, 1 ps and
# 1 or 2 workers, sync, emulated compute (docs/testbed.md), the dense models at 1 Gbit, priority
# overlap. Writes the bed's format (tab-separated: name mode workers ps gbit compute_ms model
# param_bytes step_ms K) to stdout: step_ms is the median over REPEAT runs (interleaved rounds) of
# the workers' mean compute + exchange per step (their summary lines), K = 1.
# usage: sim/bedpoints.sh [REPEAT]   (default 3; needs root and iproute2, as scripts/netcluster)
# Environment: DTRAIN_BIN (build/dtrain), OUT (a new /tmp folder: the runs' logs), CASES (default
# below: "model C W P rate" separated by ";").
set -euo pipefail
cd "$(dirname "$0")/.."
reps=${1:-3}
bin=$(realpath "${DTRAIN_BIN:-build/dtrain}")
out=${OUT:-$(mktemp -d /tmp/bedpoints.XXXXXX)}
mkdir -p "$out/fashion-data" "$out/catdog-data/cat" "$out/catdog-data/dog"
(set +e +o pipefail; . tests/lib.sh; fashion_subset "$out/fashion-data" 100 10)
png='iVBORw0KGgoAAAANSUhEUgAAAAQAAAAECAIAAAAmkwkpAAAAEElEQVR4nGM4kWIERwzEcQBCchXhIRsTawAAAABJRU5ErkJggg=='
for i in 1 2 3 4 5 6 7 8; do
  echo "$png" | base64 -d >"$out/catdog-data/cat/$i.png"
  echo "$png" | base64 -d >"$out/catdog-data/dog/$i.png"
done
IFS=';' read -r -a cases <<<"${CASES:-fashion 0 1 1 1gbit;fashion 15 1 1 1gbit;fashion 45 1 1 1gbit;fashion 45 2 1 1gbit;catdog 0 1 1 1gbit;catdog 78 1 1 1gbit;catdog 234 1 1 1gbit;catdog 234 2 1 1gbit;catdog 0 2 1 1gbit}"
rows=$out/runs.tsv
: >"$rows"
for ((r = 1; r <= reps; r++)); do
  for spec in "${cases[@]}"; do
    set -- $spec
    model=$1 c=$2 w=$3 p=$4 rate=$5
    steps=$([ "$model" = fashion ] && echo 150 || echo 40)
    dir=$out/$model-c$c-w$w-p$p-$rate-r$r
    echo "sim/bedpoints.sh: $model C=$c ${w}w ${p}ps $rate, round $r of $reps (load $(cut -d' ' -f1 /proc/loadavg))" >&2
    scripts/netcluster cluster --ps "$p" --workers "$w" --rate "$rate" --timeout 600 --out "$dir" --tail 0 \
      --bin "$bin" -- --model "models/$model.model" --data "$out/$model-data" --issync=1 --threads 1 \
      --batch_size 1 --train_steps "$steps" --steps_to_validate 1000000 --logdir= --summary_dir= \
      --debug_emulate_compute_ms "$c" >"$dir.report" 2>&1 || { cat "$dir.report" >&2; exit 1; }
    python3 - "$dir" "$model" "$c" "$w" "$p" "$rate" >>"$rows" <<'PY'
import glob, re, sys
d, model, c, w, p, rate = sys.argv[1:]
steps = []
for f in sorted(glob.glob(d + "/worker*.log")):
    m = re.search(r"per step compute ([0-9.]+) ms, exchange ([0-9.]+) ms", open(f).read())
    steps.append(float(m.group(1)) + float(m.group(2)))
params = int(re.search(r"\(([0-9]+) parameters\)", open(d + "/worker0.log").read()).group(1))
gbit = float(rate[:-4].rstrip("gm")) / (1000 if rate.endswith("mbit") else 1)
print("%s\t%s\t%s\t%s\t%g\t%s\t%s\t%d\t%.3f" % (model, c, w, p, gbit, c, model, 4 * params, sum(steps) / len(steps)))
PY
  done
done
printf 'name\tmode\tworkers\tps\tgbit\tcompute_ms\tmodel\tparam_bytes\tstep_ms\tK\n'
python3 - "$rows" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    model, c, w, p, gbit, c2, model2, pb, step = line.split("\t")
    rows.setdefault((model, c, w, p, gbit, pb), []).append(float(step))
for (model, c, w, p, gbit, pb), v in rows.items():
    name = "%s-c%s-%sw%sp-%sg" % (model, c, w, p, gbit)
    print("%s\tsync\t%s\t%s\t%s\t%s\t%s\t%s\t%.2f\t1" % (name, w, p, gbit, c, model, pb, statistics.median(v)))
PY
echo "sim/bedpoints.sh: logs in $out (load at the end $(cut -d' ' -f1 /proc/loadavg))" >&2

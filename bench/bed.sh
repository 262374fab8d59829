#!/usr/bin/env bash
# Points on the time-dilated netns bed (scripts/netcluster cluster --dilate K, docs/testbed.md):
# each case as its own cluster, ROUNDS rounds, the cases in rotating order each round; per case the
# median over the rounds of the step time (the workers' mean compute + exchange per step, their end
# lines, already divided by K by netcluster) and of each task's CPU per step (its cgroup's count:
# user + system, every thread; what getrusage gives at exit).
# Usage: bench/bed.sh CASES [ROUNDS]     (repository root, as root)
# CASES: a file, one case a line ('#' comments):
#   NAME MODE MODEL WORKERS PS GBIT COMPUTE_MS K STEPS [TRAINING FLAGS...]
# MODE sync, async or sparse (sparse: a click-log model, its rows of gen-clicks' log; sync
# replicas); MODEL fashion, catdog or fm (models/MODEL.model); GBIT each link's rate in Gbit/s; K the
# dilation (0: not dilated, no cgroups: the bed as before; written as K 1); STEPS per run. Tokens
# among the flags for that case alone: bin=PATH another dtrain (two builds in the same rounds),
# shares=N netcluster's --cpu_shares, period=US its --dilate_period_us.
# Environment: OUT (default bench/out/bed: logs, runs.tsv), POINTS (default bench/bed_points.tsv:
# each case's median replaces any earlier row of its name; OUT/runs.DATE.tsv: every run), NC_FLAGS (more netcluster flags, e.g.
# --cpu_shares 1024), BIN (default build/dtrain), B (a click-log model's batch, default 512),
# BUSY=N (N busy loops, processes spinning outside the bed at the default weight, beside every run).
set -u
cases_file=$1 R=${2:-3}
cd "$(dirname "$0")/.." || exit 1
out=${OUT:-bench/out/bed} points=${POINTS:-bench/bed_points.tsv} bin=$(realpath "${BIN:-build/dtrain}")
echo "bench/bed.sh $* (OUT=$out POINTS=$points NC_FLAGS='${NC_FLAGS:-}' BIN=$bin B=${B:-512} BUSY=${BUSY:-0})"
mkdir -p "$out/fashion-data" "$out/catdog-data/cat" "$out/catdog-data/dog"
# Emulated steps read no batch: the smallest data each model opens (as bench/run scale).
[ -s "$out/fashion-data/t10k-labels-idx1-ubyte" ] ||
  (set +e +o pipefail; . tests/lib.sh; fashion_subset "$out/fashion-data" 100 10)
png='iVBORw0KGgoAAAANSUhEUgAAAAQAAAAECAIAAAAmkwkpAAAAEElEQVR4nGM4kWIERwzEcQBCchXhIRsTawAAAABJRU5ErkJggg=='
for i in 1 2 3 4 5 6 7 8; do
  echo "$png" | base64 -d >"$out/catdog-data/cat/$i.png"
  echo "$png" | base64 -d >"$out/catdog-data/dog/$i.png"
done
mapfile -t cases < <(grep -v '^\s*\(#\|$\)' "$cases_file")
nc=${#cases[@]}
[ "$nc" -gt 0 ] || { echo "bench/bed.sh: no case in $cases_file" >&2; exit 2; }
# A click log big enough for 16 workers x the most steps of batch B.
if grep -q ' sparse ' <<<" ${cases[*]} "; then
  lines=$((20 * ${B:-512} * 300 + 20000))
  [ -s "$out/clicks.tsv" ] && [ "$(wc -l <"$out/clicks.tsv")" -ge "$lines" ] ||
    "$bin" gen-clicks --out "$out/clicks.tsv" --lines "$lines" --model fm --seed 3 >/dev/null
fi
busy=()
for _ in $(seq 1 "${BUSY:-0}"); do
  bash -c 'while :; do :; done' &
  busy+=($!)
done
trap 'for b in "${busy[@]}"; do kill "$b" 2>/dev/null; done' EXIT
runs=$out/runs.$(date +%Y%m%d-%H%M%S).tsv  # this invocation's runs only: the medians are theirs
printf 'name\tround\tmode\tmodel\tworkers\tps\tgbit\tcompute_ms\tK\tsteps\tstep_ms\texchange_ms\tparam_bytes\tps_cpu_ms\tworker_cpu_ms\tps_throttled\tload\twall_s\tps_cpu_steady_ms\tps_cpu_steady_max_ms\tworker_cpu_steady_ms\n' >"$runs"
for r in $(seq 1 "$R"); do
  for k in $(seq 0 $((nc - 1))); do
    read -r name mode model w p gbit c K steps extra <<<"${cases[$(((k + r) % nc))]}"
    d=$out/$name-r$r
    rm -rf "$d"
    flags=(--model "models/$model.model" --threads 1 --train_steps "$steps" --steps_to_validate 1000000 --logdir=
           --summary_dir= --progress=never --debug_emulate_compute_ms "$c")
    case "$mode" in
      sync) flags+=(--issync=1 --batch_size 1 --data "$out/$model-data") ;;
      async) flags+=(--issync=0 --batch_size 1 --data "$out/$model-data") ;;
      sparse) flags+=(--issync=1 --batch_size "${B:-512}" --data "$out/clicks.tsv") ;;
      *) echo "bench/bed.sh: $name: unknown mode '$mode'" >&2; exit 2 ;;
    esac
    dil=()
    [ "$K" -gt 0 ] && dil=(--dilate "$K")
    # Tokens among the flags for this case alone: bin=PATH its dtrain (A/B of two builds in the same
    # rounds), shares=N and period=US netcluster's --cpu_shares and --dilate_period_us.
    exe=$bin ncf=()
    if [[ " $extra " =~ \ bin=([^ ]+)\  ]]; then exe=$(realpath "${BASH_REMATCH[1]}"); fi
    if [[ " $extra " =~ \ shares=([0-9]+)\  ]]; then ncf+=(--cpu_shares "${BASH_REMATCH[1]}"); fi
    if [[ " $extra " =~ \ period=([0-9]+)\  ]]; then ncf+=(--dilate_period_us "${BASH_REMATCH[1]}"); fi
    extra=$(sed -E 's/(^| )(bin|shares|period)=[^ ]+//g' <<<"$extra")
    t0=$(date +%s.%N)
    # shellcheck disable=SC2086
    scripts/netcluster cluster --ps "$p" --workers "$w" --rate "${gbit}gbit" --timeout 900 --out "$d" --tail 0 \
      --bin "$exe" "${dil[@]}" "${ncf[@]}" ${NC_FLAGS:-} -- "${flags[@]}" $extra >"$d.report" 2>&1
    rc=$?
    wall=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}')
    if [ "$rc" -ne 0 ]; then
      echo "$name round $r: netcluster exit $rc ($d.report)"
      tail -5 "$d.report"
      continue
    fi
    python3 - "$d" "$name" "$r" "$mode" "$model" "$w" "$p" "$gbit" "$c" "$K" "$steps" "$wall" "$extra" >>"$runs" <<'PY'
import glob, os, re, sys
d, name, r, mode, model, w, p, gbit, c, K, steps, wall, extra = sys.argv[1:]
st = []
for f in sorted(glob.glob(d + "/worker*.log")):
    m = re.search(r"updates \((?:sync replicas|asynchronous)\): per step compute ([0-9.]+) ms, exchange ([0-9.]+) ms",
                  open(f).read())
    st.append((float(m.group(1)), float(m.group(2))))
# The dense bytes each worker sends (and receives) per step: the floats the ps tasks serve, all of
# them together (a click-log model's tables travel as rows, not counted here).
n = sum(int(re.search(r"serving ([0-9]+) floats", open(f).read()).group(1)) for f in glob.glob(d + "/ps*.log"))
width = 2 if re.search(r"--compression[= ](bf16|fp16)", extra) else 4
cpu = {}
if os.path.exists(d + "/cpu.tsv"):
    for l in list(open(d + "/cpu.tsv"))[1:]:
        t, s, per, thr, ts = l.split("\t")
        cpu[t] = (float(s), int(thr), int(per))
ps = [v for t, v in cpu.items() if t.startswith("ps")]
wk = [v for t, v in cpu.items() if t.startswith("worker")]
mean = lambda xs: sum(xs) / len(xs) if xs else float("nan")
step = mean([a + b for a, b in st])
# The steady steps' CPU: each task's CPU over the middle of the run (30% to 80% of its wall time,
# from netcluster's samples: no start, no end) per wall second, times the wall of one step (K x the
# dilated step).
steady = {}
if os.path.exists(d + "/cpu_samples.tsv"):
    rows = [l.rstrip("\n").split("\t") for l in open(d + "/cpu_samples.tsv")]
    hdr, rows = rows[0], [[float(x) for x in r] for r in rows[1:] if len(r) == len(rows[0])]
    if len(rows) > 4:
        T = rows[-1][0]
        a = min(rows, key=lambda r: abs(r[0] - 0.3 * T))
        b = min(rows, key=lambda r: abs(r[0] - 0.8 * T))
        for j, h in enumerate(hdr[1:], 1):
            per = 1e-9 if h.endswith("_ns") else 1e-6
            if b[0] > a[0]:
                steady[h.split("_cpu")[0]] = (b[j] - a[j]) * per / ((b[0] - a[0]) * 1e-9) * int(K) * step
print("\t".join(str(x) for x in (
    name, r, mode, model, w, p, gbit, c, max(int(K), 1), steps,
    f"{step:.3f}", f"{mean([b for a, b in st]):.3f}", width * n,
    f"{1e3 * mean([v[0] for v in ps]) / int(steps):.3f}", f"{1e3 * mean([v[0] for v in wk]) / int(steps):.3f}",
    f"{mean([v[1] / max(v[2], 1) for v in ps]):.3f}", f"{os.getloadavg()[0]:.1f}", wall,
    f"{mean([v for t, v in steady.items() if t.startswith('ps')]):.3f}",
    f"{max([v for t, v in steady.items() if t.startswith('ps')] or [float('nan')]):.3f}",
    f"{mean([v for t, v in steady.items() if t.startswith('worker')]):.3f}")))
PY
    tail -1 "$runs" | awk -F'\t' '{printf "%s round %s: step %s ms (exchange %s), ps CPU %s ms/step, worker CPU %s ms/step, load %s, %s s wall\n", $1, $2, $11, $12, $14, $15, $17, $18}'
  done
done
# Medians per case, over the rows of runs.tsv with this file's names, into POINTS.
python3 - "$runs" "$points" "${cases[@]}" <<'PY'
import statistics, sys
runs, points, cases = sys.argv[1], sys.argv[2], sys.argv[3:]
names = [c.split()[0] for c in cases]
rows = [l.rstrip("\n").split("\t") for l in open(runs)]
hdr, rows = rows[0], rows[1:]
col = {h: i for i, h in enumerate(hdr)}
head = "name\tmode\tworkers\tps\tgbit\tcompute_ms\tmodel\tparam_bytes\tstep_ms\tK"
try:
    old = [l.rstrip("\n") for l in open(points)][1:]
except FileNotFoundError:
    old = []
keep = [l for l in old if l.split("\t")[0] not in names]
new = []
print(f"{'name':40} {'K':>2} {'W':>2} {'P':>2} {'C':>4} {'runs':>4} {'step ms':>8} {'exch ms':>8} {'ps CPU':>7} "
      f"{'wk CPU':>7} {'ps thr':>6}  steps of each run")
for nm in names:
    rs = [r for r in rows if r[0] == nm]
    if not rs:
        continue
    g = lambda k: statistics.median(float(r[col[k]]) for r in rs)
    r0 = rs[0]
    new.append("\t".join([nm, r0[col["mode"]], r0[col["workers"]], r0[col["ps"]], r0[col["gbit"]], r0[col["compute_ms"]],
                          r0[col["model"]], r0[col["param_bytes"]], f"{g('step_ms'):.3f}", r0[col["K"]]]))
    print(f"{nm:40} {r0[col['K']]:>2} {r0[col['workers']]:>2} {r0[col['ps']]:>2} {r0[col['compute_ms']]:>4} {len(rs):4} "
          f"{g('step_ms'):8.2f} {g('exchange_ms'):8.2f} {g('ps_cpu_steady_ms'):7.2f} {g('worker_cpu_steady_ms'):7.2f} "
          f"{g('ps_throttled'):6.2f}  {' '.join(r[col['step_ms']] for r in rs)}")
with open(points, "w") as f:
    f.write(head + "\n")
    for l in keep + new:
        f.write(l + "\n")
print("step: the workers' mean compute + exchange per step (divided by K); ps CPU, wk CPU: CPU ms per steady step "
      "of a ps and of a worker (means over the tasks; the run's middle, not its start or end), not dilated; ps thr: "
      "share of the ps's quota periods that were throttled. Medians over the runs.")
PY

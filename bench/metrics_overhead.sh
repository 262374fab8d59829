#!/usr/bin/env bash
# Cost of metrics (issue 14): fashion, 1 ps + 2 asynchronous workers (dtrain launch), the chief's
# training time per step with metrics off, and on (--metrics_port: every process serves, the
# chief polls the other two once a second) while every process's /metrics and the chief's
# /status.json are scraped once a second, as Prometheus would. Runs alternate off/on (PAIRS
# pairs, default 5) so that load from elsewhere on the machine falls on both alike; prints each
# run, the medians and the ratio on/off. BASE=path/to/dtrain (a build without metrics, e.g. of
# the commit before them) adds a third run to each round: metrics off must cost nothing against it.
# usage: bench/metrics_overhead.sh [STEPS]   (global steps per run, default 600)
set -euo pipefail
cd "$(dirname "$0")/.."
B=${BUILD:-build}
STEPS=${1:-600}
PAIRS=${PAIRS:-5}
DATA=${FASHION:-/usr/share/datasets/fashion-mnist}
export GOMP_SPINCOUNT=${GOMP_SPINCOUNT:-10000}
tmp=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || :; rm -rf "$tmp"' EXIT
# a base port with base..base+2 free (launch gives process i base + i)
port() {
  /usr/bin/python3 - <<'PY'
import socket
while True:
    s = socket.socket(); s.bind(("127.0.0.1", 0)); base = s.getsockname()[1]; s.close()
    try:
        held = [socket.socket() for _ in range(3)]
        for i, t in enumerate(held): t.bind(("127.0.0.1", base + i))
        print(base); break
    except OSError: pass
    finally:
        for t in held: t.close()
PY
}

# one RUN: prints seconds per local step of the chief (its own "trained N local steps in S s" line)
run() {
  local mode=$1 extra=() scraper= exe=$PWD/$B/dtrain
  [ "$mode" = base ] && exe=$BASE
  if [ "$mode" = on ]; then
    local base; base=$(port)
    extra=(--metrics_port "$base")
    ( while :; do
        for p in "$base" $((base + 1)) $((base + 2)); do curl -s -m 1 "http://127.0.0.1:$p/metrics" >/dev/null || :; done
        curl -s -m 1 "http://127.0.0.1:$((base + 1))/status.json" >/dev/null || :
        sleep 1
      done ) &
    scraper=$!
  fi
  [ "$mode" = base ] || extra+=(--progress=never)
  (cd "$tmp" && "$exe" launch --ps 1 --workers 2 --model "$OLDPWD/models/fashion.model" --data "$DATA" \
     --train_steps "$STEPS" --steps_to_validate 100000 --logdir= --summary_dir= "${extra[@]}") \
    >"$tmp/$mode.log" 2>&1
  [ -n "$scraper" ] && kill "$scraper" 2>/dev/null && wait "$scraper" 2>/dev/null || :
  local r
  r=$(sed -n 's/^\[worker0\] trained \([0-9]*\) local steps in \([0-9.]*\) s.*/\1 \2/p' "$tmp/$mode.log" |
    awk '{ printf "%.3f\n", 1000 * $2 / $1 }')
  [ -n "$r" ] || { echo "run $mode failed:" >&2; tail -5 "$tmp/$mode.log" >&2; return 1; }
  echo "$r"
}

echo "fashion, 1 ps + 2 async workers, $STEPS global steps per run; ms per local step of the chief"
off=() on=() base=()
for i in $(seq "$PAIRS"); do
  c=; [ -n "${BASE:-}" ] && { c=$(run base) || exit 1; base+=("$c"); }
  a=$(run off) || exit 1
  b=$(run on) || exit 1
  echo "round $i: off $a  on $b${c:+  before $c}"
  off+=("$a"); on+=("$b")
done
/usr/bin/python3 - "${off[*]}" "${on[*]}" "${base[*]}" <<'PY'
import statistics, sys
off, on, base = ([float(x) for x in a.split()] for a in sys.argv[1:4])
def fig(name, xs): return f"{name} {statistics.median(xs):.2f} [{min(xs):.2f}-{max(xs):.2f}]"
mo, mn = statistics.median(off), statistics.median(on)
line = f"median ms/step: {fig('off', off)}  {fig('on', on)}"
if base: line += f"  {fig('before', base)}"
print(line)
print(f"ratio on/off {mn / mo:.4f} ({100 * (mn / mo - 1):+.2f}%)" +
      (f"; off/before {mo / statistics.median(base):.4f}" if base else ""))
# per round (neighbouring runs share the machine's load): the median of the ratios
print(f"median of the per-round ratios on/off {statistics.median(b / a for a, b in zip(off, on)):.4f}" +
      (f", off/before {statistics.median(a / c for a, c in zip(off, base)):.4f}" if base else ""))
PY

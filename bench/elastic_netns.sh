#!/usr/bin/env bash
# Dynamic against fixed sharding at W workers on the netns bed (issue 24, "Numbers": membership
# fixed, throughput within 3% of fixed sharding; the coordinator's requests per second and CPU).
# One epoch of the first N Fashion-MNIST images (models/fashion.model, --threads 1), 1 ps and W sync
# workers, each on its own emulated host (scripts/netcluster, links capped at RATE), the two cases in
# alternating order for ROUNDS rounds. Prints each run's wall time (the bed's set-up included, the
# same for both), its examples/s, ps 0's CPU seconds (user + sys, GNU time) and, for dynamic, the
# requests ps 0's coordinator answered (one WORK_ASK per unit, one claim per batch, one DONE per
# worker) and their rate over the run. Needs root (network namespaces).
# With AB=PATH (another build's dtrain, such as main's) each round runs both builds, this one ("b")
# and AB's ("a"), alternating, and the end prints each build's medians and dynamic/fixed ratio.
# Usage: bench/elastic_netns.sh [WORKERS] [ROUNDS] [N] [RATE]   (repository root, release build)
# Environment: SYNC (1; 0: asynchronous), EXTRA (more flags for every task), KEEP (keep the logs),
# AB (a second dtrain binary to compare against).
set -u
W=${1:-8} R=${2:-3} N=${3:-16000} RATE=${4:-1gbit}
bin=$(realpath "${DTRAIN_BIN:-build/dtrain}")
out=$(mktemp -d /tmp/elastic_netns.XXXXXX)
[ -n "${KEEP:-}" ] && echo "logs: $out" || trap 'rm -rf "$out"' EXIT
(set +e +o pipefail; . tests/lib.sh; fashion_subset "$out/data" "$N" 1000)
# ps 0's CPU: every task runs under GNU time, which appends its figures to the task's log.
printf '#!/bin/sh\nexec /usr/bin/time -f "cpu_seconds %%U %%S" %s "$@"\n' "$bin" >"$out/dtrain-b"
[ -n "${AB:-}" ] && printf '#!/bin/sh\nexec /usr/bin/time -f "cpu_seconds %%U %%S" %s "$@"\n' "$(realpath "$AB")" >"$out/dtrain-a"
chmod +x "$out"/dtrain-*
builds=$([ -n "${AB:-}" ] && echo "a b" || echo b)
echo "uptime: $(uptime)"
for r in $(seq 1 "$R"); do
  for k in $([ $((r % 2)) -eq 0 ] && echo 0 1 2 3 || echo 3 2 1 0); do
    mode=$([ $((k % 2)) -eq 0 ] && echo fixed || echo dynamic) build=$([ $k -lt 2 ] && echo a || echo b)
    [[ " $builds " == *" $build "* ]] || continue
    d="$out/$build-$mode-$r"
    t0=$(date +%s.%N)
    scripts/netcluster cluster --ps 1 --workers "$W" --rate "$RATE" --timeout 600 --out "$d" --tail 0 \
      --bin "$out/dtrain-$build" -- --model models/fashion.model --data "$out/data" --epochs 1 --issync="${SYNC:-1}" \
      --threads 1 --sharding "$mode" --steps_to_validate 1000000 --logdir= --summary_dir= \
      --progress=never ${EXTRA:-} >"$d.report" 2>&1 || { echo "$mode: failed"; tail -5 "$d.report"; continue; }
    t1=$(date +%s.%N)
    cpu=$(awk '/^cpu_seconds/ {print $2 + $3}' "$d/ps0.log")
    req=$(awk -v w="$W" '/epoch .* done: its/ {for (i = 1; i < NF; i++) { if ($(i + 1) == "unit(s),") u = $i; if ($(i + 1) == "batch(es),") b = $i } }
                       END { if (u) print u + b + w }' "$d/ps0.log")
    awk -v r="$r" -v m="$build $mode" -v a="$t0" -v b="$t1" -v n="$N" -v cpu="$cpu" -v req="${req:-0}" 'BEGIN {
      printf "round %s %-10s %6.1f s %7.0f examples/s  ps0 cpu %5.2f s", r, m, b - a, n / (b - a), cpu
      if (req > 0) printf "  coordinator %d requests, %.0f/s", req, req / (b - a)
      printf "\n" }'
  done
done | tee "$out/rounds"
# Medians of each build's examples/s, and its dynamic/fixed ratio.
for b in $builds; do
  med() { grep " $b $1 " "$out/rounds" | awk '{print $7}' | sort -n | awk '{v[NR] = $1} END {if (NR) print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
  f=$(med fixed) y=$(med dynamic)
  [ -n "$f" ] && [ -n "$y" ] && awk -v b="$b" -v f="$f" -v y="$y" 'BEGIN {printf "build %s: medians fixed %.0f, dynamic %.0f examples/s: dynamic/fixed %.3f\n", b, f, y, y / f}'
done
echo "uptime: $(uptime)"

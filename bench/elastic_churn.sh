#!/usr/bin/env bash
# Elastic training under churn (issue 24, "Numbers"): Fashion-MNIST (models/fashion.model), 1 ps and
# 4 sync workers with --sharding dynamic --max_workers 6, EPOCHS epochs. Undisturbed: the 4 train
# to the end. Disturbed: KILL_AT seconds in, workers 1 and 2 are SIGKILLed and workers 4 and 5
# start and join. For each disturbed run it prints: examples trained twice and missing per epoch
# (every worker's --debug_work_log; a killed worker may have pushed its last batch without logging
# it, so up to one batch per killed worker can show as missing while ps 0 counted it), whether ps 0
# counted every epoch done, the survivors' exit statuses, each joiner's time from its start to its
# first counted gradient, and the chief's test accuracy beside the undisturbed runs'.
# Usage: bench/elastic_churn.sh [ROUNDS] [EPOCHS] [KILL_AT]   (release build, repository root)
set -u
R=${1:-3} EPOCHS=${2:-2} KILL_AT=${3:-15} data=${FASHION:-/usr/share/datasets/fashion-mnist}
bin=${DTRAIN_BIN:-build/dtrain}
out=$(mktemp -d /tmp/elastic_churn.XXXXXX)
pids=()
trap 'kill -KILL "${pids[@]}" 2>/dev/null; rm -rf "$out"' EXIT
common=(--model models/fashion.model --data "$data" --epochs "$EPOCHS" --issync=1 --sharding dynamic
        --max_workers 6 --logdir= --summary_dir= --steps_to_validate 1000000 --progress=never --threads 1)
ports() { /usr/bin/python3 -c 'import socket
s=[socket.socket() for _ in range(7)]
[x.bind(("127.0.0.1", 0)) for x in s]; print(" ".join(str(x.getsockname()[1]) for x in s))'; }
# first_line_after T0 FILE: seconds from T0 until FILE has a line (polled every 50 ms; at most 120 s)
first_line_after() { for _ in $(seq 1 2400); do [ -s "$2" ] && break; sleep 0.05; done
  awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }

undisturbed() {
  "$bin" launch --ps 1 --workers 4 "${common[@]}" >"$out/u.log" 2>&1 || echo "undisturbed run failed: $(tail -2 "$out/u.log")"
  awk '/test accuracy/ {for (i = 1; i < NF; i++) if ($i == "accuracy") print $(i + 1)}' "$out/u.log" | tail -1
}

disturbed() {
  local d="$out/d"; rm -rf "$d"; mkdir -p "$d"
  local p=($(ports)) w=() t
  local hosts="127.0.0.1:${p[1]},127.0.0.1:${p[2]},127.0.0.1:${p[3]},127.0.0.1:${p[4]}"
  local all="$hosts,127.0.0.1:${p[5]},127.0.0.1:${p[6]}"
  "$bin" train "${common[@]}" --ps_hosts=127.0.0.1:${p[0]} --worker_hosts=$hosts --job_name=ps >"$d/ps" 2>&1 &
  local ps=$!; pids+=($ps)
  for t in 0 1 2 3; do
    "$bin" train "${common[@]}" --ps_hosts=127.0.0.1:${p[0]} --worker_hosts=$hosts --job_name=worker \
      --task_index=$t --debug_work_log "$d/work$t" >"$d/w$t" 2>&1 &
    w[$t]=$!; pids+=(${w[$t]})
  done
  sleep "$KILL_AT"
  kill -KILL "${w[1]}" "${w[2]}"
  local t0=() joined=()
  for t in 4 5; do
    t0[$t]=$(date +%s.%N)
    "$bin" train "${common[@]}" --ps_hosts=127.0.0.1:${p[0]} --worker_hosts=$all --job_name=worker \
      --task_index=$t --debug_work_log "$d/work$t" >"$d/w$t" 2>&1 &
    w[$t]=$!; pids+=(${w[$t]})
  done
  for t in 4 5; do joined[$t]=$(first_line_after "${t0[$t]}" "$d/work$t"); done
  local st="" s
  for t in 0 3 4 5; do wait "${w[$t]}"; s=$?; st="$st w$t=$s"; done
  wait $ps; st="$st ps=$?"
  local counted; counted=$(grep -c "ps 0: epoch .* done: .* each counted once" "$d/ps")
  local acc; acc=$(awk '/test accuracy/ {for (i = 1; i < NF; i++) if ($i == "accuracy") print $(i + 1)}' "$d/w0" | tail -1)
  # the training examples are ids 0..N-1: N is the largest id seen, plus 1
  local once; once=$(cat "$d"/work[0-5] 2>/dev/null | awk -v epochs="$EPOCHS" '
    { for (i = 6; i <= NF; i++) { if (c[$2 " " $i]++) dup++; else seen[$2]++; if ($i + 1 > n) n = $i + 1 } }
    END { for (e = 0; e < epochs; e++) miss += n - seen[e]; printf "%d examples an epoch: twice %d, missing %d", n, dup, miss }')
  echo "$once; ps 0 counted $counted of $EPOCHS epochs done; exit statuses$st; joiners' first gradient after ${joined[4]} s, ${joined[5]} s; test accuracy $acc"
}

echo "uptime: $(uptime)"
for r in $(seq 1 "$R"); do
  echo "round $r undisturbed: test accuracy $(undisturbed)"
  echo "round $r disturbed: $(disturbed)"
done
echo "uptime: $(uptime)"

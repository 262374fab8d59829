#!/usr/bin/env bash
# What a worker's log says while it runs (issue 12): its lines reach a log file as they are
# written, not at exit (stdout line-buffered); a worker waiting for a ps that is not up yet says
# once whom it waits for and for how long. Every process is bounded and killed at exit (lib.sh).
. "$(dirname "$0")/lib.sh"
data=${FASHION:-/usr/share/datasets/fashion-mnist}
ln -s "$(cd "$data" && pwd)" "$tmp/data"
printf 'model tiny\ninput 28 28 1\nconv2d filters=4 kernel=3 stride=2\nrelu\nflatten\ndense units=10\n' >"$tmp/tiny.model"
m=(--model "$tmp/tiny.model" --data "$tmp/data" --logdir= --summary_dir= --threads 1)
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
# seen_while_running FILE PATTERN PID SECONDS: PATTERN appears in FILE within SECONDS while PID runs.
seen_while_running() {
  for _ in $(seq 1 $(($4 * 10))); do
    grep -q -- "$2" "$1" 2>/dev/null && kill -0 "$3" 2>/dev/null && return 0
    kill -0 "$3" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}

# 1. A worker's lines reach its log file while it runs: worker 1 of a cluster whose chief never
# comes waits (--connect_timeout) for the model; its "cluster:" line, written before, is in the
# file meanwhile (no library call flushes that one: only the line buffering does).
port=$(free_port)
h=(--ps_hosts=127.0.0.1:$port --worker_hosts=127.0.0.1:$((port + 1)),127.0.0.1:$((port + 2)))
timeout 120 "$bin" train "${m[@]}" "${h[@]}" --job_name=ps >"$tmp/ps1" 2>&1 &
ps=$!
timeout 120 "$bin" train "${m[@]}" "${h[@]}" --job_name=worker --task_index=1 --connect_timeout 60 >"$tmp/w1" 2>&1 &
w=$!
seen_while_running "$tmp/w1" "^cluster: worker 1 of 2" $w 30 && ok "a running worker's log line is in its log file" \
  || bad "a running worker's log line is in its log file: '$(cat "$tmp/w1")'"
kill $ps $w 2>/dev/null; wait $ps $w 2>/dev/null # TERM: timeout passes it on to dtrain

summary

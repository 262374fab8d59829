#!/usr/bin/env bash
# What a worker's log says while it runs (issue 12): its lines reach a log file as they are
# written, not at exit (stdout line-buffered); a worker waiting for a ps that is not up yet says
# once whom it waits for and for how long; a worker stopped while it waits stops at once. Every process is bounded and killed at exit (lib.sh).
. "$(dirname "$0")/lib.sh"
data=${FASHION:-/usr/share/datasets/fashion-mnist}
ln -s "$(cd "$data" && pwd)" "$tmp/data"
printf 'model tiny\ninput 28 28 1\nconv2d filters=4 kernel=3 stride=2\nrelu\nflatten\ndense units=10\n' >"$tmp/tiny.model"
m=(--model "$tmp/tiny.model" --data "$tmp/data" --logdir= --summary_dir= --threads 1)
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
timeout --foreground 120 "$bin" train "${m[@]}" "${h[@]}" --job_name=ps >"$tmp/ps1" 2>&1 &
ps=$!
timeout --foreground 120 "$bin" train "${m[@]}" "${h[@]}" --job_name=worker --task_index=1 --connect_timeout 60 >"$tmp/w1" 2>&1 &
w=$!
seen_while_running "$tmp/w1" "^cluster: worker 1 of 2" $w 30 && ok "a running worker's log line is in its log file" \
  || bad "a running worker's log line is in its log file: '$(cat "$tmp/w1")'"
# Stopped (TERM: timeout passes it on to dtrain) while it waits for the model, with its ps gone
# too: it exits within seconds (its DONE to the dead ps waits 2 s at most), not at --connect_timeout
# or after the request timeout.
kill $ps $w 2>/dev/null; t0=$(date +%s)
wait $w; st=$?; took=$(( $(date +%s) - t0 ))
wait $ps 2>/dev/null
[ $st -ne 0 ] && [ $st -ne 124 ] && [ $took -le 5 ] && grep -q "interrupted by a signal" "$tmp/w1" \
  && ok "a worker waiting for the model stops at once on SIGTERM ($st after ${took}s)" \
  || bad "a worker waiting for the model stops at once on SIGTERM ($st after ${took}s): $(tail -2 "$tmp/w1")"

# 2. A worker whose ps is not up yet says once whom it waits for and for how long, then trains once
# the ps comes.
port=$(free_port)
h=(--ps_hosts=127.0.0.1:$port --worker_hosts=127.0.0.1:$((port + 1)))
timeout --foreground 120 "$bin" train "${m[@]}" "${h[@]}" --job_name=worker --train_steps 10 --connect_timeout 45 >"$tmp/w2" 2>&1 &
w=$!
want="worker 0: waiting for ps 0 at .*127.0.0.1:$port.* (not up yet?); retrying for up to 45 s (--connect_timeout)"
seen_while_running "$tmp/w2" "$want" $w 30 && ok "a worker says whom it waits for while its ps is not up" \
  || bad "a worker says whom it waits for while its ps is not up: '$(cat "$tmp/w2")'"
sleep 2.5 # several HELLO rounds: still one line
[ "$(grep -c "waiting for ps 0" "$tmp/w2")" -eq 1 ] && ok "once" || bad "once: $(grep -c "waiting for ps 0" "$tmp/w2") lines"
timeout --foreground 120 "$bin" train "${m[@]}" "${h[@]}" --job_name=ps >"$tmp/ps2" 2>&1 &
ps=$!
wait $w; st=$?
wait $ps; pst=$?
[ $st -eq 0 ] && [ $pst -eq 0 ] && grep -q "^trained" "$tmp/w2" && ok "and trains once the ps is up" \
  || bad "and trains once the ps is up (worker $st, ps $pst): $(tail -3 "$tmp/w2")"

summary

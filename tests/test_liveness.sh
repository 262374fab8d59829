#!/usr/bin/env bash
# No silent hangs: a worker whose chief never initialises the ps gives up after --connect_timeout
# saying it waited for the chief; in sync mode without backup workers, a lost worker makes the ps
# wait for the live workers only (logged), or with --strict stops the job with a message; a ps that
# hears from nobody exits after --idle_timeout; a worker whose ps dies for good gives up after
# --ps_timeout (or at once on Ctrl-C), one whose ps only stalls waits it out and finishes. Every
# process ends in time.
. "$(dirname "$0")/lib.sh"
data=${FASHION:-/usr/share/datasets/fashion-mnist}
ln -s "$(cd "$data" && pwd)" "$tmp/data"
# A tiny model, so that the runs stay short under the sanitizers too.
printf 'model tiny\ninput 28 28 1\nconv2d filters=4 kernel=3 stride=2\nrelu\nflatten\ndense units=10\n' >"$tmp/tiny.model"
m=(--model "$tmp/tiny.model" --data "$tmp/data" --logdir= --summary_dir= --threads 1)

# 1. A ps and worker 1, no chief: worker 1 waits --connect_timeout for the model, then exits.
ports=($(free_port 3)); port=${ports[0]}
h=(--ps_hosts=127.0.0.1:$port --worker_hosts=127.0.0.1:${ports[1]},127.0.0.1:${ports[2]})
"$bin" train "${m[@]}" "${h[@]}" --job_name=ps >"$tmp/ps1" 2>&1 &
ps1=$!
start=$(date +%s)
"$bin" train "${m[@]}" "${h[@]}" --job_name=worker --task_index=1 --connect_timeout 3 >"$tmp/w1" 2>"$tmp/w1e"
st=$?
took=$(( $(date +%s) - start ))
[ $st -ne 0 ] && ok "worker without a chief exits non-zero ($st)" || bad "worker without a chief exits non-zero"
grep -q "chief" "$tmp/w1e" && grep -q "127.0.0.1:$port" "$tmp/w1e" && ok "the message names the chief and the ps" \
  || bad "the message names the chief and the ps: $(cat "$tmp/w1e")"
# Loading the data comes first (seconds under sanitizers); the wait itself is 3 s.
[ "$took" -le 40 ] && ok "gives up in time (${took}s)" || bad "gives up in time (${took}s)"
kill -KILL $ps1 2>/dev/null; wait $ps1 2>/dev/null

# 2. Sync replicas without backup workers: worker 1 is SIGKILLed. The ps notices within half the
# heartbeat timeout, each step then waits for the chief alone, and the cluster finishes (exit 0).
sync_cluster() { # $1: tag, then extra flags for every task
  local tag=$1; shift
  ports=($(free_port 3)); port=${ports[0]}
  h=(--ps_hosts=127.0.0.1:$port --worker_hosts=127.0.0.1:${ports[1]},127.0.0.1:${ports[2]})
  # Paced (20 ms a step), so that the kill lands mid-run in a release build too.
  s=(--issync=1 --train_steps 300 --debug_step_delay_ms 20 --steps_to_validate 100000 --heartbeat_timeout 3 "$@")
  "$bin" train "${m[@]}" "${h[@]}" "${s[@]}" --job_name=ps >"$tmp/ps$tag" 2>&1 &
  ps2=$!
  "$bin" train "${m[@]}" "${h[@]}" "${s[@]}" --job_name=worker --task_index=0 >"$tmp/c$tag" 2>"$tmp/ce$tag" &
  chief=$!
  "$bin" train "${m[@]}" "${h[@]}" "${s[@]}" --job_name=worker --task_index=1 >"$tmp/w$tag" 2>&1 &
  w=$!
  for _ in $(seq 1 300); do grep -q "^dtrain" "$tmp/w$tag" 2>/dev/null && grep -q "^dtrain" "$tmp/c$tag" 2>/dev/null && break; sleep 0.2; done
  sleep 1
  kill -KILL $w; wait $w 2>/dev/null
  start=$(date +%s)
  for _ in $(seq 1 600); do kill -0 $chief 2>/dev/null || kill -0 $ps2 2>/dev/null || break; sleep 0.1; done
  took=$(( $(date +%s) - start ))
}
sync_cluster a
if kill -0 $chief 2>/dev/null || kill -0 $ps2 2>/dev/null; then
  bad "sync cluster without worker 1 finishes (still running after ${took}s)"
else
  wait $chief; st=$?
  wait $ps2; pst=$?
  [ $st -eq 0 ] && [ $pst -eq 0 ] && ok "chief and ps exit 0 without worker 1 (${took}s)" \
    || bad "chief and ps exit 0 without worker 1 (chief $st, ps $pst): $(tail -3 "$tmp/ce"a)"
  grep -q "worker 1 lost (no message for 1500 ms): steps now wait for 1 gradient(s)" "$tmp/psa" \
    && ok "the ps logs the lost worker and the lower replica count" || bad "the ps logs the lost worker: $(cat "$tmp/psa")"
  grep -qE "trained [0-9]+ local steps.*global step 300$" "$tmp/ca" && ok "the chief trained to the last step" \
    || bad "the chief trained to the last step: $(tail -2 "$tmp/ca")"
fi
kill -KILL $chief $ps2 2>/dev/null; wait $chief $ps2 2>/dev/null

# 3. The same with --strict: the job stops, every survivor exits non-zero saying why.
sync_cluster b --strict
if kill -0 $chief 2>/dev/null || kill -0 $ps2 2>/dev/null; then
  bad "--strict stops the job (still running after ${took}s)"
else
  wait $chief; st=$?
  wait $ps2; pst=$?
  [ $st -ne 0 ] && [ $pst -ne 0 ] && ok "--strict: chief and ps exit non-zero ($st, $pst)" \
    || bad "--strict: chief and ps exit non-zero ($st, $pst)"
  [ "$took" -le 15 ] && ok "within the heartbeat timeout plus a step (${took}s)" || bad "within the heartbeat timeout plus a step (${took}s)"
  grep -q "worker 1 lost.*--strict is set: the job stops" "$tmp/ceb" \
    && ok "the chief's message names the lost worker and --strict" || bad "the chief's message: $(cat "$tmp/ceb")"
fi
kill -KILL $chief $ps2 2>/dev/null; wait $chief $ps2 2>/dev/null

# 4. A ps nobody talks to (its chief never came, or is gone) exits after --idle_timeout.
ports=($(free_port 2)); port=${ports[0]}
start=$(date +%s)
timeout --foreground 60 "$bin" train "${m[@]}" --ps_hosts=127.0.0.1:$port --worker_hosts=127.0.0.1:${ports[1]} --job_name=ps \
  --idle_timeout 2 >"$tmp/ps4" 2>"$tmp/ps4e"
st=$?
took=$(( $(date +%s) - start ))
[ $st -ne 0 ] && [ $st -ne 124 ] && ok "an idle ps exits non-zero ($st)" || bad "an idle ps exits non-zero ($st)"
[ "$took" -le 20 ] && ok "after --idle_timeout (${took}s)" || bad "after --idle_timeout (${took}s)"
grep -q "no message from any worker for 2 s (--idle_timeout)" "$tmp/ps4e" && ok "the message says why" \
  || bad "the idle ps says why: $(cat "$tmp/ps4e")"

# Cases 5-7: one ps and one worker (the chief), started with the flags given; returns once the
# worker trains. Sets port, ps and chief; logs in $tmp/ps$tag, $tmp/c$tag (stdout), $tmp/c${tag}e.
ps_and_chief() { # tag, then flags for both
  local tag=$1; shift
  ports=($(free_port 2)); port=${ports[0]}
  local h=(--ps_hosts=127.0.0.1:$port --worker_hosts=127.0.0.1:${ports[1]})
  "$bin" train "${m[@]}" "${h[@]}" "$@" --job_name=ps >"$tmp/ps$tag" 2>&1 &
  ps=$!
  "$bin" train "${m[@]}" "${h[@]}" "$@" --job_name=worker --task_index=0 >"$tmp/c$tag" 2>"$tmp/c${tag}e" &
  chief=$!
  for _ in $(seq 1 300); do grep -q "^dtrain" "$tmp/c$tag" 2>/dev/null && break; sleep 0.2; done
  sleep 0.5
}
# Waits up to $1 seconds for the pids that follow to exit; took = the seconds waited. Returns 1 (and
# kills them) if any is still running.
gone_within() {
  local limit=$1 start p; shift
  start=$(date +%s)
  for _ in $(seq 1 $((limit * 10))); do
    local alive=0
    for p in "$@"; do kill -0 "$p" 2>/dev/null && alive=1; done
    [ $alive = 0 ] && break
    sleep 0.1
  done
  took=$(( $(date +%s) - start ))
  for p in "$@"; do kill -0 "$p" 2>/dev/null && { kill -KILL "$@" 2>/dev/null; return 1; }; done
  return 0
}

# 5. A ps that dies and never comes back: the worker waits --ps_timeout for it, then exits
# non-zero naming the ps and the flag.
ps_and_chief 5 --train_steps 100000 --steps_to_validate 100000 --heartbeat_timeout 2 --ps_timeout 2
kill -KILL $ps; wait $ps 2>/dev/null
if ! gone_within 30 $chief; then
  bad "a worker whose ps never comes back gives up (still running after ${took}s)"
else
  wait $chief; st=$?
  [ $st -ne 0 ] && [ "$took" -le 15 ] && ok "a worker whose ps never comes back exits non-zero ($st) in ${took}s" \
    || bad "a worker whose ps never comes back exits non-zero ($st) in ${took}s"
  grep -q "did not come back within 2 s (--ps_timeout)" "$tmp/c5e" && grep -q "127.0.0.1:$port" "$tmp/c5e" \
    && ok "the message names the ps and --ps_timeout" || bad "the message names the ps and --ps_timeout: $(cat "$tmp/c5e")"
fi

# 6. A ps that stalls (SIGSTOP: its connections stay open, nothing answers, not even ZeroMQ's
# heartbeats) for longer than --heartbeat_timeout and then goes on: the worker waits it out within
# --ps_timeout, resumes, and the job finishes with exit 0.
ps_and_chief 6 --train_steps 400 --debug_step_delay_ms 10 --steps_to_validate 100000 --heartbeat_timeout 1 --ps_timeout 30
kill -STOP $ps; sleep 3; kill -CONT $ps
if ! gone_within 60 $chief $ps; then
  bad "a cluster whose ps stalled finishes"
else
  wait $chief; st=$?
  wait $ps; pst=$?
  [ $st -eq 0 ] && [ $pst -eq 0 ] && ok "after a stalled ps, worker and ps exit 0" || bad "after a stalled ps, worker and ps exit 0 ($st, $pst)"
  grep -q "waiting up to 30 s for the ps tasks" "$tmp/c6" && grep -q "the ps tasks are back after" "$tmp/c6" \
    && ok "the worker waited for the stalled ps and resumed" || bad "the worker waited for the stalled ps and resumed: $(grep -E 'worker 0' "$tmp/c6")"
fi

# 7. Ctrl-C ends the wait for a lost ps at once (not after --ps_timeout).
ps_and_chief 7 --train_steps 100000 --steps_to_validate 100000 --heartbeat_timeout 1 --ps_timeout 120
kill -KILL $ps; wait $ps 2>/dev/null
for _ in $(seq 1 100); do grep -q "waiting up to 120 s" "$tmp/c7" && break; sleep 0.1; done
sleep 0.5
kill -INT $chief
if ! gone_within 15 $chief; then
  bad "Ctrl-C ends the wait for a lost ps (still running after ${took}s)"
else
  wait $chief; st=$?
  [ $st -eq 130 ] && ok "Ctrl-C ends the wait for a lost ps: exit 130 in ${took}s" || bad "Ctrl-C during the wait: exit $st"
  grep -q "stopped by a signal" "$tmp/c7e" && ok "and says so" || bad "Ctrl-C during the wait says so: $(cat "$tmp/c7e")"
fi

summary

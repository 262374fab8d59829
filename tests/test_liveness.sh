#!/usr/bin/env bash
# No silent hangs: a worker whose chief never initialises the ps gives up after --connect_timeout
# saying it waited for the chief; a sync worker whose peer died (no backup workers) gives up after
# --heartbeat_timeout saying the barrier waits for workers that are gone. Both exit non-zero, in time.
set -u
bin=${DTRAIN_BIN:-build/dtrain}
data=${FASHION:-/usr/share/datasets/fashion-mnist}
tmp=$(mktemp -d)
ln -s "$(cd "$data" && pwd)" "$tmp/data"
cleanup() { pkill -KILL -f "$tmp/" 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
pass=0 fail=0
ok() { pass=$((pass + 1)); echo "ok   $1"; }
bad() { fail=$((fail + 1)); echo "FAIL $1"; }
m=(--model models/fashion.model --data "$tmp/data" --logdir= --summary_dir= --threads 1)

# 1. A ps and worker 1, no chief: worker 1 waits --connect_timeout for the model, then exits.
port=$(( 20000 + RANDOM % 30000 ))
h=(--ps_hosts=127.0.0.1:$port --worker_hosts=127.0.0.1:$((port + 1)),127.0.0.1:$((port + 2)))
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

# 2. Sync replicas without backup workers: worker 1 is SIGKILLed; the chief waits at the barrier
# for --heartbeat_timeout, then exits non-zero saying what it waited for.
port=$(( 20000 + RANDOM % 30000 ))
h=(--ps_hosts=127.0.0.1:$port --worker_hosts=127.0.0.1:$((port + 1)),127.0.0.1:$((port + 2)))
s=(--issync=1 --train_steps 100000 --steps_to_validate 100000 --heartbeat_timeout 3)
"$bin" train "${m[@]}" "${h[@]}" "${s[@]}" --job_name=ps >"$tmp/ps2" 2>&1 &
ps2=$!
"$bin" train "${m[@]}" "${h[@]}" "${s[@]}" --job_name=worker --task_index=0 >"$tmp/c" 2>"$tmp/ce" &
chief=$!
"$bin" train "${m[@]}" "${h[@]}" "${s[@]}" --job_name=worker --task_index=1 >"$tmp/w" 2>&1 &
w=$!
for _ in $(seq 1 300); do grep -q "^dtrain" "$tmp/w" 2>/dev/null && grep -q "^dtrain" "$tmp/c" 2>/dev/null && break; sleep 0.2; done
sleep 2
kill -KILL $w; wait $w 2>/dev/null
start=$(date +%s)
for _ in $(seq 1 300); do kill -0 $chief 2>/dev/null || break; sleep 0.1; done
took=$(( $(date +%s) - start ))
if kill -0 $chief 2>/dev/null; then
  bad "chief gives up at the barrier (still running after ${took}s)"
else
  wait $chief; st=$?
  [ $st -ne 0 ] && ok "chief exits non-zero when its sync peer is gone ($st)" || bad "chief exits non-zero when its sync peer is gone"
  [ "$took" -le 15 ] && ok "within the heartbeat timeout plus a step (${took}s)" || bad "within the heartbeat timeout plus a step (${took}s)"
  grep -q "heartbeat_timeout" "$tmp/ce" && grep -q "barrier waits for workers that are gone" "$tmp/ce" \
    && ok "the message says the barrier waited for lost workers" || bad "the message says what was waited for: $(cat "$tmp/ce")"
fi
kill -KILL $ps2 2>/dev/null; wait $ps2 2>/dev/null

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]

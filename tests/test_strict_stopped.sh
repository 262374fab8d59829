#!/usr/bin/env bash
# --strict (sync replicas): a worker that was stopped (SIGSTOP) long enough for the ps to declare it
# lost finds, once it runs again, the job stopped and the ps tasks gone (they exit half a
# --heartbeat_timeout after the loss). It must say so and exit non-zero within seconds, not wait
# out --ps_timeout for ps tasks that will not come back (issue 12, item 3). Stopped at the barrier
# (waiting for its PULL) and stopped between steps.
. "$(dirname "$0")/lib.sh"
data=${FASHION:-/usr/share/datasets/fashion-mnist}
ln -s "$(cd "$data" && pwd)" "$tmp/data"
printf 'model tiny\ninput 28 28 1\nconv2d filters=4 kernel=3 stride=2\nrelu\nflatten\ndense units=10\n' >"$tmp/tiny.model"
m=(--model "$tmp/tiny.model" --data "$tmp/data" --logdir= --summary_dir= --threads 1)

# stopped TAG SLOW_WORKER: ps, chief and worker 1 in strict sync mode (heartbeat 3 s: a worker
# silent 1.5 s is lost); SLOW_WORKER sleeps 50 ms before each push, so worker 1 is stopped mostly at
# the barrier (0: the chief is slow) or mostly between steps (1). Worker 1 is stopped for 7 s.
stopped() {
  local tag=$1 slow=$2 ports h s ps chief w st took start
  ports=($(free_port 3))
  h=(--ps_hosts=127.0.0.1:${ports[0]} --worker_hosts=127.0.0.1:${ports[1]},127.0.0.1:${ports[2]})
  s=(--issync=1 --strict --train_steps 100000 --steps_to_validate 100000 --heartbeat_timeout 3 --ps_timeout 60
     --debug_step_delay_ms 50 --debug_delay_worker "$slow")
  timeout --foreground 300 "$bin" train "${m[@]}" "${h[@]}" "${s[@]}" --job_name=ps >"$tmp/ps$tag" 2>&1 &
  ps=$!
  timeout --foreground 300 "$bin" train "${m[@]}" "${h[@]}" "${s[@]}" --job_name=worker --task_index=0 >"$tmp/c$tag" 2>&1 &
  chief=$!
  # Not under `timeout`: the signals go to dtrain itself (lib.sh kills it at exit in any case).
  "$bin" train "${m[@]}" "${h[@]}" "${s[@]}" --job_name=worker --task_index=1 >"$tmp/w$tag" 2>"$tmp/we$tag" &
  w=$!
  for _ in $(seq 1 300); do grep -q "^dtrain" "$tmp/w$tag" 2>/dev/null && grep -q "^dtrain" "$tmp/c$tag" 2>/dev/null && break; sleep 0.2; done
  sleep 1
  kill -STOP $w
  sleep 7
  kill -CONT $w
  start=$(date +%s)
  for _ in $(seq 1 300); do kill -0 $w 2>/dev/null || break; sleep 0.1; done
  took=$(( $(date +%s) - start ))
  if kill -0 $w 2>/dev/null; then
    bad "$tag: the stopped worker exits once it runs again (still running after ${took}s)"
  else
    wait $w; st=$?
    [ $st -ne 0 ] && [ $st -ne 124 ] && [ "$took" -le 10 ] && ok "$tag: the stopped worker exits non-zero ($st) ${took}s after SIGCONT" \
      || bad "$tag: the stopped worker exits non-zero within 10 s of SIGCONT ($st, ${took}s)"
    grep -q "worker 1: the ps tasks declared this worker lost and the job stopped (--strict): nothing reached them" \
      "$tmp/we$tag" && ok "$tag: and says it was lost and the job stopped" \
      || bad "$tag: and says it was lost and the job stopped: $(cat "$tmp/we$tag")"
  fi
  # The rest of the job stopped as before: the chief at once, the ps half a timeout later.
  for _ in $(seq 1 300); do kill -0 $chief 2>/dev/null || kill -0 $ps 2>/dev/null || break; sleep 0.1; done
  wait $chief; st=$?
  wait $ps; local pst=$?
  [ $st -ne 0 ] && [ $st -ne 124 ] && [ $pst -ne 0 ] && [ $pst -ne 124 ] && ok "$tag: chief and ps stopped non-zero ($st, $pst)" \
    || bad "$tag: chief and ps stopped non-zero ($st, $pst)"
  grep -q "worker 1 lost .*--strict is set: the job stops" "$tmp/ps$tag" && ok "$tag: the ps lost worker 1" \
    || bad "$tag: the ps lost worker 1: $(tail -3 "$tmp/ps$tag")"
  kill -KILL $ps $chief $w 2>/dev/null; wait $ps $chief $w 2>/dev/null
}

stopped barrier 0
stopped between 1

summary

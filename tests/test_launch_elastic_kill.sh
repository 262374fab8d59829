#!/usr/bin/env bash
# dtrain launch with --sharding dynamic survives a worker lost (docs/elastic.md, "Launching"): a
# sync job of 3 workers, worker 1 killed (SIGKILL) once it trains; launch says the job goes on
# without it, ps 0 gives its units to the others, and the job finishes with every epoch counted
# once, launch exiting 0. Before, launch stopped every process and exited 137.
. "$(dirname "$0")/lib.sh"
fashion_subset "$tmp/data" 1000 100 || { bad "fashion subset"; summary; exit; }
printf 'model tiny\ninput 28 28 1\nconv2d filters=4 kernel=3 stride=2\nrelu\nflatten\ndense units=10\n' >"$tmp/tiny.model"
# wait_for PATTERN: until launch's output has it (at most 30 s)
wait_for() { for _ in $(seq 1 300); do grep -q "$1" "$tmp/out" && return 0; sleep 0.1; done; return 1; }
: >"$tmp/out"
"$bin" launch --ps 1 --workers 3 --issync 1 --sharding dynamic --model "$tmp/tiny.model" --data "$tmp/data" \
  --logdir= --summary_dir= --threads 1 --batch_size 32 --epochs 8 --unit_batches 2 --heartbeat_timeout 2 \
  --steps_to_validate 100000 --debug_step_delay_ms 20 >"$tmp/out" 2>&1 &
launch=$!
trap 'kill -KILL $launch 2>/dev/null; lib_cleanup' EXIT
wait_for "^\[worker1\] dtrain " && wait_for "ps 0: worker 1 joined" || bad "the job starts ($(tail -3 "$tmp/out"))"
sleep 1
w1=$(ps -o pid=,args= --ppid $launch | awk '/--job_name=worker/ && /--task_index=1( |$)/ {print $1}')
[ -n "$w1" ] && kill -KILL $w1
for _ in $(seq 1 600); do kill -0 $launch 2>/dev/null || break; sleep 0.1; done # bounded: 60 s
kill -KILL $launch 2>/dev/null
wait $launch; st=$?
grep -q "worker1 exited with status 137; the job goes on without it" "$tmp/out" \
  && ok "worker 1 killed: launch goes on without it" || bad "worker 1 killed: launch goes on ($(grep 'dtrain launch' "$tmp/out" | tail -2))"
grep -q "ps 0: worker 1 lost" "$tmp/out" && ok "ps 0 counts worker 1 lost, its units returned" \
  || bad "ps 0 counts worker 1 lost"
if [ $st -eq 0 ] && grep -q "ps 0: epoch 7 done: .* each counted once; training finished" "$tmp/out"; then
  ok "the job finishes, every epoch counted once, launch exits 0"
else bad "the job finishes, launch exits 0 (status $st: $(tail -3 "$tmp/out"))"; fi
summary

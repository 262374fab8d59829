#!/usr/bin/env bash
# dtrain launch with --sharding dynamic: SIGUSR1 starts one more worker, which joins the running
# job; a second SIGUSR1 past --max_workers is refused naming the bound; SIGUSR2 stops the newest
# worker, which leaves (ps 0 takes its units back); the job finishes and launch exits 0.
. "$(dirname "$0")/lib.sh"
fashion_subset "$tmp/data" 1000 100 || { bad "fashion subset"; summary; exit; }
printf 'model tiny\ninput 28 28 1\nconv2d filters=4 kernel=3 stride=2\nrelu\nflatten\ndense units=10\n' >"$tmp/tiny.model"
# wait_for PATTERN: until launch's output has it (at most 30 s)
wait_for() { for _ in $(seq 1 300); do grep -q "$1" "$tmp/out" && return 0; sleep 0.1; done; return 1; }
# launch runs bare (signals are for it; lib.sh's cleanup kills it and its children at the latest)
"$bin" launch --ps 1 --workers 2 --sharding dynamic --max_workers 3 --model "$tmp/tiny.model" \
  --data "$tmp/data" --logdir= --summary_dir= --threads 1 --batch_size 32 --epochs 8 --unit_batches 2 \
  --heartbeat_timeout 2 --steps_to_validate 100000 --debug_step_delay_ms 40 >"$tmp/out" 2>&1 &
launch=$!
trap 'kill -KILL $launch 2>/dev/null; lib_cleanup' EXIT
wait_for "^\[worker1\] dtrain " && wait_for "ps 0: worker 1 joined" || bad "the job starts ($(tail -3 "$tmp/out"))"
kill -USR1 $launch
wait_for "ps 0: worker 2 joined" && wait_for "^\[worker2\] epoch\|^\[worker2\] step\|^\[worker2\] learning" \
  && ok "SIGUSR1: worker 2 starts and joins" || bad "SIGUSR1: worker 2 starts and joins ($(grep worker2 "$tmp/out" | tail -3))"
kill -USR1 $launch
wait_for "SIGUSR1: already 3 workers, the most --max_workers allows" && ok "SIGUSR1 past --max_workers is refused" \
  || bad "SIGUSR1 past --max_workers is refused"
kill -USR2 $launch
wait_for "ps 0: worker 2 left: " && ok "SIGUSR2: worker 2 leaves, its units go back" \
  || bad "SIGUSR2: worker 2 leaves ($(grep 'worker 2\|worker2' "$tmp/out" | tail -3))"
for _ in $(seq 1 1200); do kill -0 $launch 2>/dev/null || break; sleep 0.1; done # bounded: 120 s
kill -KILL $launch 2>/dev/null
wait $launch; st=$?
# The chief ends the job only once no member of ps 0's work plan is still training (a joiner that
# left does not stand in for worker 1: docs/elastic.md, "The end of a job").
if [ $st -eq 0 ] && grep -q "training finished" "$tmp/out"; then ok "the job finishes, launch exits 0"
else bad "the job finishes, launch exits 0 (status $st: $(tail -3 "$tmp/out"))"; fi
grep -q "did not answer a work request" "$tmp/out" && bad "a worker's work request went unanswered (the chief ended early)"
summary

#!/usr/bin/env bash
# The end of a dynamic job that names more workers than ever start (docs/elastic.md, Kubernetes:
# an elastic Job lists the most pods it may have): 1 ps and 2 workers train with --worker_hosts
# naming 4. The chief waits for the named workers only until --connect_timeout (3 s) after its
# start, then for the work plan's members alone: it ends the job well before --heartbeat_timeout
# (40 s), without "ending the cluster anyway", and every process exits 0. Before, it waited out
# the heartbeat timeout for the two that never started (42 s; twice with a final checkpoint).
. "$(dirname "$0")/lib.sh"
fashion_subset "$tmp/data" 1000 100 || { bad "fashion subset"; summary; exit; }
printf 'model tiny\ninput 28 28 1\nconv2d filters=4 kernel=3 stride=2\nrelu\nflatten\ndense units=10\n' >"$tmp/tiny.model"
ports=($(free_port 5))
h=(--ps_hosts=127.0.0.1:${ports[0]}
   --worker_hosts=127.0.0.1:${ports[1]},127.0.0.1:${ports[2]},127.0.0.1:${ports[3]},127.0.0.1:${ports[4]})
m=(--model "$tmp/tiny.model" --data "$tmp/data" --logdir= --summary_dir= --threads 1 --batch_size 32 --epochs 2
   --sharding dynamic --max_workers 4 --heartbeat_timeout 40 --connect_timeout 3 --steps_to_validate 100000)
t0=$(date +%s)
timeout --foreground 120 "$bin" train "${m[@]}" "${h[@]}" --job_name=ps >"$tmp/ps" 2>&1 &
ps=$!
timeout --foreground 120 "$bin" train "${m[@]}" "${h[@]}" --job_name=worker --task_index=1 >"$tmp/w1" 2>&1 &
w1=$!
timeout --foreground 120 "$bin" train "${m[@]}" "${h[@]}" --job_name=worker --task_index=0 >"$tmp/w0" 2>&1
s0=$?
took=$(( $(date +%s) - t0 ))
wait $w1; s1=$?
wait $ps; sp=$?
check "every process exits 0 (chief $s0, worker 1 $s1, ps $sp)" eval '[ $s0 -eq 0 ] && [ $s1 -eq 0 ] && [ $sp -eq 0 ]'
check "the chief ends the job in ${took} s, before the 40 s heartbeat timeout" test "$took" -lt 30
check "... without waiting out the two named workers that never started" \
  eval '! grep -q "ending the cluster anyway" "$tmp/w0"'
check "both workers trained" eval 'grep -q "^trained" "$tmp/w0" && grep -q "^trained" "$tmp/w1"'
summary

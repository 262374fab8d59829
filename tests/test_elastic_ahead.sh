#!/usr/bin/env bash
# Asking ahead (docs/elastic.md, "A worker's loop"): a worker asks ps 0 for its next unit under the
# last batch of its current one, so that a unit's boundary costs no round trip. 1 ps and 2 sync
# workers (dtrain launch), 2 epochs of 32 batches in units of 2 (16 units an epoch), --overlap (the
# default): each worker's units but its first and one per epoch's end (where every unit is granted
# and ps 0 answers WAIT) come granted ahead, so at most 1 + 2 of its units were asked for at their
# start; one unit boundary costing a round trip again fails it (paced at 10 ms a step so that
# worker 1, starting later, takes a share). Every batch is still counted once (ps 0) and the launch
# exits 0. Then a worker stopped past the liveness timeout and continued (below). About 7 s in all.
. "$(dirname "$0")/lib.sh"
fashion_subset "$tmp/data" 1000 100 || { bad "fashion subset"; summary; exit; }
printf 'model tiny\ninput 28 28 1\nconv2d filters=4 kernel=3 stride=2\nrelu\nflatten\ndense units=10\n' >"$tmp/tiny.model"
timeout --foreground 60 "$bin" launch --ps 1 --workers 2 --model "$tmp/tiny.model" --data "$tmp/data" --logdir= \
  --summary_dir= --threads 1 --batch_size 32 --epochs 2 --issync 1 --sharding dynamic --unit_batches 2 \
  --steps_to_validate 100000 --debug_step_delay_ms 10 >"$tmp/launch" 2>&1
st=$?
check "launch exits 0 (status $st)" test $st -eq 0
check "ps 0 counts both epochs, every batch once" \
  eval 'grep -q "ps 0: epoch 0 done: its 16 unit(s), 32 batch(es), each counted once" "$tmp/launch" &&
        grep -q "ps 0: epoch 1 done: its 16 unit(s), 32 batch(es), each counted once; training finished" "$tmp/launch"'
granted=0
for t in 0 1; do
  line=$(grep -E "^\[worker$t\] worker $t: [0-9]+ unit\(s\) granted, [0-9]+ of them asked for ahead" "$tmp/launch" |
         sed 's/^[^]]*] //')
  n=$(echo "$line" | awk '{print $3}') a=$(echo "$line" | awk '{print $6}')
  granted=$((granted + ${n:-0}))
  [ -z "$line" ] && [ $t = 1 ] && continue # it started after worker 0 had trained everything
  check "worker $t: its units but at most 3 granted ahead ($line)" eval '[ -n "$n" ] && [ $((n - a)) -le 3 ]'
done
check "32 units granted in all ($granted), most of them ahead" test "$granted" -eq 32

# A worker counted out while it holds a unit granted ahead and a claim sent before its forward:
# worker 2 of 3 is stopped (SIGSTOP) past the liveness timeout (1 s) and continued. ps 0 loses it
# and returns its units; back, its claim is refused, or names a step the cluster went past, and
# it drops its units and joins again (JOIN). Every example is still trained once per epoch (the
# workers' --debug_work_log and ps 0's count) and every process exits 0 (the job outlasts the stop:
# a worker continued after the job's end waits --ps_timeout for the ps tasks). About 5 s.
ports=($(free_port 4))
h=(--ps_hosts=127.0.0.1:${ports[0]} --worker_hosts=127.0.0.1:${ports[1]},127.0.0.1:${ports[2]},127.0.0.1:${ports[3]})
m=(--model "$tmp/tiny.model" --data "$tmp/data" --logdir= --summary_dir= --threads 1 --batch_size 32 --epochs 6
   --issync 1 --sharding dynamic --unit_batches 2 --heartbeat_timeout 2 --steps_to_validate 100000
   --debug_step_delay_ms 40)
timeout --foreground 60 "$bin" train "${m[@]}" "${h[@]}" --job_name=ps >"$tmp/ps2" 2>&1 &
ps=$!
pids=()
for t in 0 1 2; do
  timeout --foreground 60 "$bin" train "${m[@]}" "${h[@]}" --job_name=worker --task_index=$t \
    --debug_work_log "$tmp/work$t" >"$tmp/v$t" 2>&1 &
  pids[$t]=$!
done
for _ in $(seq 1 200); do [ -f "$tmp/work2" ] && [ "$(wc -l <"$tmp/work2")" -ge 3 ] && break; sleep 0.05; done
w2=$(pgrep -P "${pids[2]}" -f "task_index=2" || echo "${pids[2]}") # the process under timeout
kill -STOP $w2; sleep 1.6; kill -CONT $w2
failed=0
for t in 0 1 2; do wait "${pids[$t]}" || { failed=1; echo "worker $t: $(tail -2 "$tmp/v$t")"; }; done
wait $ps || failed=1
check "stopped and continued: every process exits 0" test $failed -eq 0
check "stopped and continued: ps 0 lost worker 2 and counts every epoch" \
  eval 'grep -q "ps 0: worker 2 lost" "$tmp/ps2" && grep -q "ps 0: epoch 5 done: .* each counted once; training finished" "$tmp/ps2"'
cat "$tmp"/work[0-2] | awk '
  { for (i = 6; i <= NF; i++) if (c[$2 " " $i]++) dup++; else seen[$2]++ }
  END { for (e = 0; e < 6; e++) { if (seen[e] != 1000) bad++; s = s " " seen[e] }
        printf "duplicates %d, per epoch%s\n", dup, s; exit !(dup == 0 && !bad) }' >"$tmp/count"
check "stopped and continued: every example once per epoch ($(cat "$tmp/count"))" test $? -eq 0
summary

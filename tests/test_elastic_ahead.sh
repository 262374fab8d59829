#!/usr/bin/env bash
# Asking ahead (docs/elastic.md, "A worker's loop"): a worker asks ps 0 for its next unit under the
# last batch of its current one, so that a unit's boundary costs no round trip. 2 sync workers, 1
# ps, 2 epochs of 32 batches in units of 2 (16 units an epoch), --overlap (the default): each
# worker's units but its first and one per epoch's end (where every unit is granted and ps 0
# answers WAIT) come granted ahead, so at most 1 + 2 of its units were asked for at their start;
# one unit boundary costing a round trip again fails it (paced at 10 ms a step so that worker 1,
# starting later, takes a share). Every batch is still counted once (ps 0) and every process exits
# 0. About 2 s.
. "$(dirname "$0")/lib.sh"
fashion_subset "$tmp/data" 1000 100 || { bad "fashion subset"; summary; exit; }
printf 'model tiny\ninput 28 28 1\nconv2d filters=4 kernel=3 stride=2\nrelu\nflatten\ndense units=10\n' >"$tmp/tiny.model"
ports=($(free_port 3))
h=(--ps_hosts=127.0.0.1:${ports[0]} --worker_hosts=127.0.0.1:${ports[1]},127.0.0.1:${ports[2]})
m=(--model "$tmp/tiny.model" --data "$tmp/data" --logdir= --summary_dir= --threads 1 --batch_size 32 --epochs 2
   --issync 1 --sharding dynamic --unit_batches 2 --heartbeat_timeout 20 --steps_to_validate 100000
   --debug_step_delay_ms 10)
timeout --foreground 60 "$bin" train "${m[@]}" "${h[@]}" --job_name=ps >"$tmp/ps" 2>&1 &
ps=$!
timeout --foreground 60 "$bin" train "${m[@]}" "${h[@]}" --job_name=worker --task_index=1 >"$tmp/w1" 2>&1 &
w1=$!
timeout --foreground 60 "$bin" train "${m[@]}" "${h[@]}" --job_name=worker --task_index=0 >"$tmp/w0" 2>&1
s0=$?
wait $w1; s1=$?
wait $ps; sp=$?
check "every process exits 0 (chief $s0, worker 1 $s1, ps $sp)" eval '[ $s0 -eq 0 ] && [ $s1 -eq 0 ] && [ $sp -eq 0 ]'
check "ps 0 counts both epochs, every batch once" \
  eval 'grep -q "ps 0: epoch 0 done: its 16 unit(s), 32 batch(es), each counted once" "$tmp/ps" &&
        grep -q "ps 0: epoch 1 done: its 16 unit(s), 32 batch(es), each counted once; training finished" "$tmp/ps"'
granted=0
for t in 0 1; do
  line=$(grep -E "^worker $t: [0-9]+ unit\(s\) granted, [0-9]+ of them asked for ahead" "$tmp/w$t")
  n=$(echo "$line" | awk '{print $3}') a=$(echo "$line" | awk '{print $6}')
  granted=$((granted + ${n:-0}))
  [ -z "$line" ] && [ $t = 1 ] && continue # it started after worker 0 had trained everything
  check "worker $t: its units but at most 3 granted ahead ($line)" eval '[ -n "$n" ] && [ $((n - a)) -le 3 ]'
done
check "32 units granted in all ($granted), most of them ahead" test "$granted" -eq 32
summary

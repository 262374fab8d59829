#!/usr/bin/env bash
# Dynamic data sharding with workers dying and joining (docs/elastic.md), real processes on
# 127.0.0.1, asynchronous and sync: three workers start (--max_workers 4), worker 1 is SIGKILLed
# mid-epoch and worker 3 joins; every example of every epoch is trained exactly once (ps 0 counts
# each epoch's batches, and the workers' --debug_work_log lines name every example: none twice, and
# none missing but at most the one batch the killed worker may have pushed without logging it);
# the survivors exit 0. A join at --max_workers is refused naming the bound. A sync step holding an
# epoch's short last batch is weighted by examples. Backup workers over 2.5 epochs: a slow worker's
# dropped gradients cost it its units, and every example is still trained once per epoch, half of
# the last one. Every process ends in time.
. "$(dirname "$0")/lib.sh"
fashion_subset "$tmp/data" 1000 100 || { bad "fashion subset"; summary; exit; }
printf 'model tiny\ninput 28 28 1\nconv2d filters=4 kernel=3 stride=2\nrelu\nflatten\ndense units=10\n' >"$tmp/tiny.model"
B=32 EPOCHS=10 N=1000 # paced (40 ms a step) so that the joins and leaves land mid-run under load too
m=(--model "$tmp/tiny.model" --data "$tmp/data" --logdir= --summary_dir= --threads 1 --batch_size $B
   --epochs $EPOCHS --sharding dynamic --unit_batches 2 --heartbeat_timeout 2
   --steps_to_validate 100000 --debug_step_delay_ms 40)
pids=()
trap 'kill -KILL "${pids[@]}" 2>/dev/null; lib_cleanup' EXIT

# wait_lines FILE N: until FILE has N lines (at most 30 s)
wait_lines() { for _ in $(seq 1 300); do [ -f "$1" ] && [ "$(wc -l <"$1")" -ge "$2" ] && return 0; sleep 0.1; done; return 1; }

run() { # $1: tag (async or sync), then flags for every task
  local tag=$1; shift
  set -- --max_workers 4 "$@"
  local d="$tmp/$tag"; mkdir -p "$d"
  local ports=($(free_port 6))
  local h=(--ps_hosts=127.0.0.1:${ports[0]} --worker_hosts=127.0.0.1:${ports[1]},127.0.0.1:${ports[2]},127.0.0.1:${ports[3]})
  local h4="--worker_hosts=127.0.0.1:${ports[1]},127.0.0.1:${ports[2]},127.0.0.1:${ports[3]},127.0.0.1:${ports[4]}"
  timeout --foreground 120 "$bin" train "${m[@]}" "${h[@]}" "$@" --job_name=ps >"$d/ps" 2>&1 & local ps=$!
  local w=()
  timeout --foreground 120 "$bin" train "${m[@]}" "${h[@]}" "$@" --job_name=worker --task_index=0 \
    --debug_work_log "$d/work0" >"$d/w0" 2>&1 &
  w[0]=$!
  # Workers 1 and 2 run bare (no timeout in between), so that the signals reach them; lib.sh's
  # cleanup kills them at the latest.
  for t in 1 2; do
    "$bin" train "${m[@]}" "${h[@]}" "$@" --job_name=worker --task_index=$t --debug_work_log "$d/work$t" >"$d/w$t" 2>&1 &
    w[$t]=$!
  done
  pids+=($ps "${w[@]}")
  if ! wait_lines "$d/work1" 4; then bad "$tag: worker 1 trains ($(tail -2 "$d/w1"))"; return; fi
  kill -KILL "${w[1]}"; wait "${w[1]}" 2>/dev/null
  timeout --foreground 120 "$bin" train "${m[@]}" "${h[0]}" "$h4" "$@" --job_name=worker --task_index=3 \
    --debug_work_log "$d/work3" >"$d/w3" 2>&1 &
  w[3]=$!; pids+=(${w[3]})
  if [ "$tag" = async ]; then # a fifth worker: task index 4 is at the bound, which it does not know
    "$bin" train "${m[@]}" "${h[0]}" "$h4,127.0.0.1:${ports[5]}" --max_workers 5 --job_name=worker --task_index=4 \
      --connect_timeout 5 >"$d/w4" 2>&1
    local st=$?
    [ $st -ne 0 ] && grep -q "worker 4 is not in this cluster (the chief declared 4 worker task(s), 0..3: its --worker_hosts, or --max_workers)" "$d/w4" \
      && ok "$tag: a join at --max_workers 4 is refused naming the bound" \
      || bad "$tag: a join at --max_workers 4 is refused naming the bound (status $st: $(tail -2 "$d/w4"))"
  fi
  local survivors="0 2 3"
  if [ "$tag" = async ]; then # worker 2 leaves cleanly: its unit goes back at once
    wait_lines "$d/work3" 2
    kill -TERM "${w[2]}"; wait "${w[2]}"; local st=$?
    grep -q "ps 0: worker 2 left: " "$d/ps" && [ $st -eq 130 ] && ok "$tag: SIGTERM: worker 2 leaves, its units returned" \
      || bad "$tag: SIGTERM: worker 2 leaves (status $st; $(grep 'worker 2' "$d/ps" | tail -2))"
    survivors="0 3"
  fi
  local failed=0
  for t in $survivors; do wait "${w[$t]}" || { failed=1; bad "$tag: worker $t exits 0 ($(tail -3 "$d/w$t"))"; }; done
  wait $ps || { failed=1; bad "$tag: ps exits 0 ($(tail -3 "$d/ps"))"; }
  [ $failed = 0 ] && ok "$tag: every survivor exits 0"
  local e
  for e in $(seq 0 $((EPOCHS - 1))); do
    grep -q "ps 0: epoch $e done: its .* each counted once" "$d/ps" || bad "$tag: ps 0 counts epoch $e done"
  done
  grep -q "training finished" "$d/ps" && ok "$tag: ps 0 counts every epoch done" || bad "$tag: training finished"
  grep -q "ps 0: worker 1 lost" "$d/ps" && ok "$tag: worker 1 lost, its units returned" \
    || bad "$tag: worker 1 lost ($(grep 'worker 1' "$d/ps" | tail -3))"
  [ -s "$d/work3" ] && grep -q "ps 0: worker 3 joined" "$d/ps" && ok "$tag: worker 3 joined and trained" \
    || bad "$tag: worker 3 joined and trained ($(tail -3 "$d/w3"))"
  # Every example once per epoch: none twice; missing at most one batch (the killed worker's last).
  cat "$d"/work[0-3] | awk -v n=$N -v b=$B -v epochs=$EPOCHS '
    { for (i = 6; i <= NF; i++) if (c[$2 " " $i]++) dup++; else seen[$2]++ }
    END { for (e = 0; e < epochs; e++) miss += n - seen[e]
          printf "duplicates %d, missing %d\n", dup, miss; exit !(dup == 0 && miss <= b) }' >"$d/count"
  [ $? -eq 0 ] && ok "$tag: every example once per epoch ($(cat "$d/count"))" \
    || bad "$tag: every example once per epoch ($(cat "$d/count"))"
}

run async
run sync --issync=1
grep -q "worker 3 trains again\|sits steps out" "$tmp/sync/ps" && ok "sync: the ps logs each change of the live workers" \
  || bad "sync: the ps logs each change of the live workers"

# Sync steps weighted by examples: 200 examples in batches of 32, so each epoch's last batch holds
# 8, alone in the epoch's fourth unit of 2 batches; the two workers train units side by side, so
# that short batch shares a step with a full one of the other worker, and the ps weighs them (the
# workers say their batches' examples in every PUSH). Worker 1 may start late, so the first epochs
# may not pair them: at least one of 8 must. (With 100 examples an epoch was 2 units, and a worker
# holding 2 units, asking ahead, could take a whole epoch while the other sat it out: no pair in
# about 1 run of 6.)
fashion_subset "$tmp/small200" 200 20 || bad "fashion subset of 200"
timeout --foreground 60 "$bin" launch --ps 1 --workers 2 --issync 1 --sharding dynamic --unit_batches 2 \
  --model "$tmp/tiny.model" --data "$tmp/small200" --logdir= --summary_dir= --threads 1 --batch_size 32 --epochs 8 \
  --steps_to_validate 100000 --debug_step_delay_ms 20 >"$tmp/weighted.out" 2>&1
st=$?
check "sync: a step holding an epoch's short last batch is weighted by examples (status $st)" \
  grep -Eq "ps 0: step [0-9]+: the mean of 2 gradient\(s\) weighted by their examples \((8, 32|32, 8); 40 in all\)" \
  "$tmp/weighted.out"

# Backup workers and a fractional --epochs (docs/elastic.md, "A dropped gradient", "Fractional
# epochs"): 3 sync workers whose steps aggregate 2 gradients, worker 2 slow (80 ms a step, the
# others 10) so that its gradients come too late and are dropped; 2.5 epochs of 100 examples in
# batches of 4 (25 batches): epochs 0 and 1 whole and the first 13 batches (52 examples) of epoch
# 2, each example once, ps 0's count and the workers' logs agreeing. About 1.5 s.
d="$tmp/backup"; mkdir -p "$d"
fashion_subset "$tmp/small" 100 20 || bad "fashion subset of 100"
bp=($(free_port 4))
bh=(--ps_hosts=127.0.0.1:${bp[0]} --worker_hosts=127.0.0.1:${bp[1]},127.0.0.1:${bp[2]},127.0.0.1:${bp[3]})
bk=(--model "$tmp/tiny.model" --data "$tmp/small" --logdir= --summary_dir= --threads 1 --batch_size 4
    --epochs 2.5 --sharding dynamic --unit_batches 2 --issync 1 --replicas_to_aggregate 2 --total_num_replicas 3
    --heartbeat_timeout 4 --steps_to_validate 100000)
timeout --foreground 60 "$bin" train "${bk[@]}" "${bh[@]}" --job_name=ps >"$d/ps" 2>&1 &
bpids=($!)
for t in 0 1 2; do
  timeout --foreground 60 "$bin" train "${bk[@]}" "${bh[@]}" --job_name=worker --task_index=$t \
    --debug_step_delay_ms $([ $t = 2 ] && echo 80 || echo 10) --debug_work_log "$d/work$t" >"$d/w$t" 2>&1 &
  bpids+=($!)
done
pids+=("${bpids[@]}")
failed=0
for p in "${bpids[@]}"; do wait "$p" || failed=1; done
[ $failed = 0 ] && ok "backup workers: every task exits 0" || bad "backup workers: every task exits 0 ($(tail -2 "$d/w2"))"
check "backup workers: ps 0 counts the short last epoch (13 batches) and finishes" \
  grep -q "ps 0: epoch 2 done: its 7 unit(s), 13 batch(es), each counted once; training finished" "$d/ps"
check "backup workers: a dropped gradient's unit goes back to another worker" \
  grep -q "ps 0: worker [0-9]'s gradient of batch [0-9]* for step [0-9]* was not applied (stale): unit [0-9]* goes back" "$d/ps"
cat "$d"/work[0-2] | awk '
  { for (i = 6; i <= NF; i++) if (c[$2 " " $i]++) dup++; else seen[$2]++ }
  END { printf "duplicates %d, per epoch %d %d %d\n", dup, seen[0], seen[1], seen[2]
        exit !(dup == 0 && seen[0] == 100 && seen[1] == 100 && seen[2] == 52 && !(3 in seen)) }' >"$d/count"
[ $? -eq 0 ] && ok "backup workers: every example once per epoch, 52 in the half epoch ($(cat "$d/count"))" \
  || bad "backup workers: every example once per epoch, 52 in the half epoch ($(cat "$d/count"))"
# --staleness beyond what ps 0 takes of one worker's claims is refused before anything starts.
timeout --foreground 30 "$bin" train "${bk[@]}" "${bh[@]}" --staleness 16 --job_name=worker --task_index=1 >"$d/s16" 2>&1
st=$?
check "sharding dynamic refuses --staleness 16, naming the bound (status $st)" \
  eval '[ "$st" -ne 0 ] && grep -q "staleness=16, at most 15" "$d/s16"'
summary

#!/usr/bin/env bash
# Sync workers joining a running elastic job, again and again (docs/elastic.md): RUNS launches of
# `dtrain launch --issync 1 --sharding dynamic`, each with 2 workers and JOINS more started by
# SIGUSR1 while it trains. The shard is cut into many chunks (--chunk_kb 1), which are applied one by
# one as gradients come, so a join often lands while a step is part applied. Every run finishes
# in time (none frozen), every joiner trains (its "trained N local steps" has N > 0) and every
# epoch is counted once. Before, a worker that joined mid-step was waited for by the chunks behind,
# for a gradient of a step chunk 0 had applied already: its claims were stale over and over and the
# job froze (or the joiner trained nothing). The epoch figures follow ps 0's grants (docs/elastic.md):
# every start line says the 30 epochs of 32 batches, no step line says more than 30 epochs, and the
# chief's last says at least 29 (before, the step over a step count fixed at each worker's start:
# the chief's said about 12, a joiner's up to 38).
. "$(dirname "$0")/lib.sh"
RUNS=${RUNS:-5} JOINS=${JOINS:-5}
fashion_subset "$tmp/data" 1000 100 || { bad "fashion subset"; summary; exit; }
printf 'model tiny\ninput 28 28 1\nconv2d filters=4 kernel=3 stride=2\nrelu\nflatten\ndense units=10\n' >"$tmp/tiny.model"
launch=
trap '[ -n "$launch" ] && kill -KILL $launch 2>/dev/null; lib_cleanup' EXIT
frozen=0 idle=0 joined=0 figures=0
for run in $(seq 1 "$RUNS"); do
  out="$tmp/out$run"
  : >"$out"
  # launch runs bare (signals are for it); the workers' command lines name $tmp: cleaned up at exit
  "$bin" launch --ps 1 --workers 2 --issync 1 --sharding dynamic --max_workers $((2 + JOINS)) \
    --model "$tmp/tiny.model" --data "$tmp/data" --logdir= --summary_dir= --threads 1 --batch_size 32 \
    --epochs 30 --unit_batches 1 --chunk_kb 1 --heartbeat_timeout 4 --steps_to_validate 100000 \
    --debug_step_delay_ms 15 >"$out" 2>&1 &
  launch=$!
  # wait_for PATTERN: until the run's output has it (at most 30 s)
  wait_for() { for _ in $(seq 1 300); do grep -q "$1" "$out" && return 0; sleep 0.1; done; return 1; }
  wait_for "ps 0: work plan from the chief" || bad "run $run starts ($(tail -3 "$out"))"
  for j in $(seq 1 "$JOINS"); do
    sleep 0.$((RANDOM % 4 + 1)) # somewhere in a step
    # joins in the first half only: one started at the job's end finds no ps (not this test's matter)
    [ "$(grep -c "ps 0: epoch .* done" "$out")" -lt 20 ] || break
    kill -USR1 $launch
    wait_for "^\[worker$((1 + j))\] dtrain " || break
  done
  for _ in $(seq 1 600); do kill -0 $launch 2>/dev/null || break; sleep 0.1; done # bounded: 60 s
  if kill -0 $launch 2>/dev/null; then
    frozen=$((frozen + 1))
    bad "run $run finishes (frozen at: $(grep -o 'global step [0-9]*' "$out" | tail -1))"
    pkill -KILL -f "$tmp/" 2>/dev/null; kill -KILL $launch 2>/dev/null
  fi
  wait $launch; st=$?; launch=
  [ -n "${KEEP:-}" ] && cp "$out" "$KEEP.$run"
  for j in $(seq 1 "$JOINS"); do
    w=$((1 + j))
    grep -q "^\[worker$w\] dtrain " "$out" || continue
    joined=$((joined + 1))
    n=$(sed -n "s/^\[worker$w\] trained \([0-9]*\) local steps.*/\1/p" "$out")
    [ "${n:-0}" -gt 0 ] || { idle=$((idle + 1)); bad "run $run: joiner $w trains (${n:-no} local steps; $(grep -c "^\[worker$w\]" "$out") lines)"; }
  done
  starts=$(grep -c "^\[worker[0-9]*\] dtrain .*, 30.00 epochs of 32 batches granted by ps 0," "$out")
  epochs=$(sed -n 's/^\[worker[0-9]*\] step [0-9]*  epoch \([0-9.]*\) .*/\1/p' "$out" | sort -g | tail -1)
  chief=$(sed -n 's/^\[worker0\] step [0-9]*  epoch \([0-9.]*\) .*/\1/p' "$out" | tail -1)
  if [ "$starts" -ne "$(grep -c "^\[worker[0-9]*\] dtrain " "$out")" ] ||
     ! awk -v m="${epochs:-99}" -v c="${chief:-0}" 'BEGIN { exit !(m <= 30.0 && c >= 29.0) }'; then
    figures=$((figures + 1))
    bad "run $run: epoch figures follow ps 0's grants ($starts start lines of 30.00 epochs, the largest step line's" \
      "epoch ${epochs:-none}, the chief's last ${chief:-none})"
  fi
  [ $st -eq 0 ] && grep -q "ps 0: epoch 29 done: .* each counted once; training finished" "$out" \
    || bad "run $run: launch exits 0 with every epoch counted (status $st: $(tail -2 "$out"))"
done
echo "$joined joins in $RUNS runs: $frozen run(s) frozen, $idle joiner(s) trained nothing"
check "at least $((RUNS * JOINS * 4 / 5)) joins happened ($joined)" test "$joined" -ge $((RUNS * JOINS * 4 / 5))
check "no run frozen, every joiner trained" test $((frozen + idle)) -eq 0
check "the epoch figures follow ps 0's grants in every run" test $figures -eq 0
summary

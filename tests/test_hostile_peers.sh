#!/usr/bin/env bash
# Hostile peers beside a real training run (docs/security.md, "What a peer can make a ps hold"):
# while a sync cluster (1 ps, 2 workers, the fashion model) trains, tests/hostile_peer attacks the
# ps every way at once: endless multipart messages, unread FETCHes and PULLs, far-future and
# excess deferred PULLs, DONE from tasks outside the cluster, idle and half-open connections. The
# ps's memory must stay under a stated bound, the attacks must be refused or cut off, and the
# training must finish with its usual accuracy, every process exiting 0.
. "$(dirname "$0")/lib.sh"
hostile=${DTRAIN_HOSTILE:-build/hostile_peer}
fashion_subset "$tmp/data" 8000 1000 || { bad "fashion subset"; summary; exit; }
ports=($(free_port 3)); port=${ports[0]}
h=(--ps_hosts=127.0.0.1:$port --worker_hosts=127.0.0.1:${ports[1]},127.0.0.1:${ports[2]})
a=(--model models/fashion.model --data "$tmp/data" --logdir= --summary_dir= --threads 1 --issync=1
   --train_steps 200 --steps_to_validate 100000 --debug_step_delay_ms 65)
# Under AddressSanitizer the ps's freed memory waits in a quarantine (256 MB by default) and counts
# in its RSS: a small one keeps the measure about the ps, not the sanitizer.
ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}quarantine_size_mb=8" \
  "$bin" train "${a[@]}" "${h[@]}" --job_name=ps >"$tmp/ps" 2>&1 &
ps=$!
"$bin" train "${a[@]}" "${h[@]}" --job_name=worker --task_index=0 >"$tmp/c" 2>&1 &
chief=$!
"$bin" train "${a[@]}" "${h[@]}" --job_name=worker --task_index=1 >"$tmp/w" 2>&1 &
w=$!
for _ in $(seq 1 600); do grep -q "initialised by the chief" "$tmp/ps" && break; sleep 0.1; done
rss() { awk '/^VmRSS:/ {print $2}' "/proc/$ps/status" 2>/dev/null || echo 0; }
base=$(rss)
# The ps serves the fashion model with Adam: S = 1.69 MB, M = 3 S = 5.1 MB. Its budget for
# unfinished messages is 2 M + 2 S + 64 MiB = 78 MB; the bound allows as much again for what a
# loopback peer sends between two checks, libzmq's per-connection buffers and the allocator.
bound_kb=$(( 160 * 1024 ))
"$hostile" "$port" 12 $((1 << 20)) >"$tmp/hostile" 2>&1 &
hp=$!
peak=$base
while kill -0 $hp 2>/dev/null; do
  r=$(rss); [ "$r" -gt "$peak" ] && peak=$r
  sleep 0.1
done
wait $hp
# The attacks ran beside the training, not after it (200 steps paced at 65 ms take over 13 s).
kill -0 $chief 2>/dev/null && ok "the training was still running when the attacks ended" \
  || bad "the training was still running when the attacks ended (it finished first: the attacks met no training)"
growth=$(( peak - base ))
echo "ps memory: ${base} KiB before the attacks, peak ${peak} KiB (+$((growth / 1024)) MiB); bound +$((bound_kb / 1024)) MiB"
sed 's/^/  hostile: /' "$tmp/hostile"
[ "$base" -gt 0 ] && [ "$growth" -lt "$bound_kb" ] && ok "ps memory stays under the bound under attack" \
  || bad "ps memory stays under the bound under attack (+${growth} KiB)"
for _ in $(seq 1 1200); do kill -0 $chief 2>/dev/null || kill -0 $w 2>/dev/null || kill -0 $ps 2>/dev/null || break; sleep 0.1; done
wait $chief; cst=$?
wait $w; wst=$?
wait $ps; pst=$?
[ $cst -eq 0 ] && [ $wst -eq 0 ] && [ $pst -eq 0 ] && ok "the cluster finishes, every process exits 0" \
  || bad "the cluster finishes (chief $cst, worker $wst, ps $pst): $(tail -3 "$tmp/c")"
acc=$(sed -n 's/^test accuracy \([0-9.]*\).*/\1/p' "$tmp/c")
echo "test accuracy ${acc:-none}"
awk -v a="${acc:-0}" 'BEGIN { exit !(a >= 0.70) }' && ok "test accuracy ${acc} >= 0.70 despite the attacks" \
  || bad "test accuracy ${acc:-none} >= 0.70: $(tail -5 "$tmp/c")"
grep -q "cut off the connection from 127.0.0.1.*unfinished message" "$tmp/ps" && ok "endless messages are cut off" \
  || bad "endless messages are cut off: $(grep -c 'cut off' "$tmp/ps") cuts logged"
grep -q "no valid message within" "$tmp/ps" && ok "silent connections are cut off" || bad "silent connections are cut off"
grep -q "far PULLs refused: [1-9]" "$tmp/hostile" && grep -q "DONE from outside refused: [1-9]" "$tmp/hostile" \
  && ok "far PULLs and DONE from outside the cluster are refused" || bad "far PULLs and DONE refused"
grep -q "worker 7 finished\|worker 65535 finished" "$tmp/ps" && bad "a DONE from outside the cluster counted" \
  || ok "no DONE from outside the cluster counted"
summary

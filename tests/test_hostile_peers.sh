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
hostile_cluster 200
base=$(ps_rss)
# The ps serves the fashion model with Adam: S = 1.69 MB, M = 3 S = 5.1 MB. Its budget B for what
# peers make it hold is 4 M + 2 x 2 S + 64 MiB = 93 MB (docs/security.md); the bound allows what a
# loopback peer sends between two checks, libzmq's per-connection buffers and the allocator on top.
bound_kb=$(( 160 * 1024 ))
"$hostile" "$port" 12 $((1 << 20)) >"$tmp/hostile" 2>&1 &
hp=$!
peak=$base
while kill -0 $hp 2>/dev/null; do
  r=$(ps_rss); [ "$r" -gt "$peak" ] && peak=$r
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
hostile_cluster_finish
grep -q "cut off the connection from 127.0.0.1.*unfinished message" "$tmp/ps" && ok "endless messages are cut off" \
  || bad "endless messages are cut off: $(grep -c 'cut off' "$tmp/ps") cuts logged"
grep -q "no valid message within" "$tmp/ps" && ok "silent connections are cut off" || bad "silent connections are cut off"
grep -q "far PULLs refused: [1-9]" "$tmp/hostile" && grep -q "DONE from outside refused: [1-9]" "$tmp/hostile" \
  && ok "far PULLs and DONE from outside the cluster are refused" || bad "far PULLs and DONE refused"
grep -q "worker 7 finished\|worker 65535 finished" "$tmp/ps" && bad "a DONE from outside the cluster counted" \
  || ok "no DONE from outside the cluster counted"
summary

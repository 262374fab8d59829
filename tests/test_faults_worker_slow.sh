#!/usr/bin/env bash
# Worker loss with backup workers (sync, 3 workers, aggregate 2), through tests/faults.sh: an
# undisturbed run, then one where worker 2 is SIGKILLed mid-run. The killed run finishes (every
# survivor exits 0, no hang), the chief's wait for the dead worker is bounded by
# --heartbeat_timeout, and the test accuracy is at most 1.5 points below the undisturbed run's. Then worker 2
# is killed and restarted: it rejoins at the current global step and finishes; then the chief.
. "$(dirname "$0")/lib.sh"
export DTRAIN_BIN=${DTRAIN_BIN:-build/dtrain}
hb=10
args=(--mode sync --workers 3 --aggregate 2 --steps 900 --heartbeat $hb --guard 600)

tests/faults.sh "${args[@]}" --kill none --keep "$tmp/base" >"$tmp/base.out" 2>&1
base=$(grep '^RESULT' "$tmp/base.out")
echo "$base"
case $base in *status=ok*) ok "undisturbed run finishes" ;; *) bad "undisturbed run finishes"; cat "$tmp/base.out" ;; esac

tests/faults.sh "${args[@]}" --kill worker:2 --after 15 --keep "$tmp/kill" >"$tmp/kill.out" 2>&1
killed=$(grep '^RESULT' "$tmp/kill.out")
echo "$killed"
case $killed in *status=ok*) ok "run with worker 2 killed finishes, survivors exit 0" ;;
  *) bad "run with worker 2 killed finishes"; cat "$tmp/kill.out" ;; esac
grep -q "^killed worker2" "$tmp/kill.out" && ok "worker 2 was killed mid-run" || bad "worker 2 was killed mid-run (it had already finished?)"

# Sync with backup workers is not deterministic (which gradient of a step arrives last and is
# dropped depends on timing). Over 20 killed and 6 undisturbed runs (BENCHMARKS.md, "Faults") the
# killed runs' mean was 0.65 points *above* the undisturbed runs' (fewer workers left, each step
# aggregates the same number of fresher gradients), and single runs spread over 1.3 points. What
# the test guards is that losing a worker costs no accuracy, so the bound is one-sided: the killed
# run at most 1.5 points below the undisturbed one (a CI run saw 0.8992 killed against 0.8827
# undisturbed, 1.65 points above, which a two-sided bound failed). Both runs must also have
# trained: at least 0.85 (the 26 runs: 0.8834-0.9003).
a0=$(echo "$base" | sed -n 's/.*acc=\([0-9.]*\).*/\1/p')
a1=$(echo "$killed" | sed -n 's/.*acc=\([0-9.]*\).*/\1/p')
if [ -n "$a0" ] && [ -n "$a1" ] && awk -v a="$a0" -v b="$a1" 'BEGIN { exit !(b >= a - 0.015) }'; then
  ok "accuracy with a worker killed not more than 1.5 points below the undisturbed run ($a1 against $a0)"
else
  bad "accuracy with a worker killed not more than 1.5 points below the undisturbed run ('$a1' against '$a0')"
fi
for a in "$a0" "$a1"; do
  check "test accuracy '$a' at least 0.85" awk -v a="$a" 'BEGIN { exit !(a != "" && a >= 0.85) }'
done
# The chief waited for the dead worker's DONE at most --heartbeat_timeout, and said so.
grep -q "ending the cluster anyway" "$tmp/kill/worker0.log" && ok "the chief's wait for the lost worker is logged" \
  || bad "the chief's wait for the lost worker is logged"

# A restarted worker (same task index) rejoins at the cluster's current global step. No accuracy is
# compared from here on: 500 steps (near step 150 at the kill on an idle machine) are enough.
tests/faults.sh "${args[@]}" --steps 500 --kill worker:2 --after 15 --restart --keep "$tmp/restart" >"$tmp/restart.out" 2>&1
line=$(grep '^RESULT' "$tmp/restart.out")
echo "$line"
case $line in *status=ok*) ok "run with worker 2 killed and restarted finishes, every process exits 0" ;;
  *) bad "run with worker 2 killed and restarted finishes"; cat "$tmp/restart.out" ;; esac
at=$(sed -n '/^--- restarted ---/,$ s/^resuming the data stream at batch \([0-9]*\).*/\1/p' "$tmp/restart/worker2.log" | head -1)
[ -n "$at" ] && [ "$at" -gt 0 ] && ok "the restarted worker rejoins at the current step (batch $at)" \
  || bad "the restarted worker rejoins at the current step ('$at')"
sed -n '/^--- restarted ---/,$p' "$tmp/restart/worker2.log" | grep -q '^trained' && ok "the restarted worker finishes" \
  || bad "the restarted worker finishes"

# The chief killed and restarted: it finds the ps tasks still holding the model, which is newer
# than its newest checkpoint, and resumes from their step (nothing is lost); the run finishes.
tests/faults.sh "${args[@]}" --steps 500 --kill worker:0 --after 15 --restart --keep "$tmp/chief" >"$tmp/chief.out" 2>&1
line=$(grep '^RESULT' "$tmp/chief.out")
echo "$line"
case $line in *killed=yes*status=ok*) ok "run with the chief killed and restarted finishes, every process exits 0" ;;
  *) bad "run with the chief killed and restarted finishes"; cat "$tmp/chief.out" ;; esac
after=$(sed -n '/^--- restarted ---/,$p' "$tmp/chief/worker0.log")
ck=$(sed -n 's/^restored .*: global step \([0-9]*\)$/\1/p' <<<"$after" | head -1)
held=$(sed -n 's/^chief: the ps tasks already hold the model (step \([0-9]*\)); not restoring step [0-9]*$/\1/p' <<<"$after" | head -1)
[ -n "$ck" ] && [ -n "$held" ] && [ "$held" -ge "$ck" ] \
  && ok "the restarted chief resumes from the ps tasks' step $held (its newest checkpoint: $ck)" \
  || bad "the restarted chief resumes ('$ck' checkpoint, '$held' held)"
grep -q '^test accuracy' <<<"$after" && ok "the restarted chief finishes and tests" || bad "the restarted chief finishes"
summary

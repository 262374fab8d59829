#!/usr/bin/env bash
# Ps loss, through tests/faults.sh: a ps is SIGKILLed mid-run and restarted. The workers wait for
# it (--ps_timeout), the chief rolls every ps back to the newest checkpoint (the same step for all
# shards, so at most --save_model_secs of progress is lost), training finishes, every process
# exits 0 and every checkpoint left reads back. Once asynchronous with 1 ps, once sync replicas
# with 2 ps where the surviving ps is ahead and goes back too.
. "$(dirname "$0")/lib.sh"
export DTRAIN_BIN=${DTRAIN_BIN:-build/dtrain}

check_run() { # name, then faults.sh arguments
  local name=$1; shift
  tests/faults.sh "$@" --restart --heartbeat 5 --guard 300 --keep "$tmp/$name" >"$tmp/$name.out" 2>&1
  local line
  line=$(grep '^RESULT' "$tmp/$name.out")
  echo "$line"
  case $line in *status=ok*killed=yes*|*killed=yes*status=ok*) ok "$name: ps killed mid-run and restarted, every process exits 0" ;;
    *) bad "$name: finishes with every process exit 0"; tail -20 "$tmp/$name.out" ;; esac
  case $line in *corrupt=0*) ok "$name: every checkpoint reads back" ;; *) bad "$name: corrupt checkpoints" ;; esac
  local from to newest
  from=$(echo "$line" | sed -n 's/.*rollback=\([0-9]*\)->.*/\1/p')
  to=$(echo "$line" | sed -n 's/.*rollback=[0-9?]*->\([0-9]*\).*/\1/p')
  newest=$(echo "$line" | sed -n 's/.*newest_saved=\([0-9]*\).*/\1/p')
  [ -n "$to" ] && [ "$to" = "$newest" ] && ok "$name: rolled back to the newest checkpoint saved before ($to)" \
    || bad "$name: rolled back to the newest checkpoint saved before ('$to' vs '$newest')"
  [ -n "$from" ] && [ -n "$to" ] && [ "$from" -ge "$to" ] && ok "$name: the global step went back from $from to $to, not further" \
    || bad "$name: the global step went back from '$from' to '$to'"
  grep -q "trained .* global step" "$tmp/$name/worker0.log" && ok "$name: the chief finished training" \
    || bad "$name: the chief finished training"
}
# Long enough that the kill lands mid-run with room to spare (at 8 s an idle machine is near step
# 400 of 1200; the sync run near step 140 of 500 at 10 s); no accuracy is compared here.
check_run async --mode async --ps 1 --workers 2 --steps 1200 --kill ps:0 --after 8
check_run sync --mode sync --ps 2 --workers 3 --aggregate 3 --steps 500 --kill ps:1 --after 10
# Both shards went back to one step: the surviving ps 0 was re-initialised too.
grep -q "ps 0: re-initialised by the chief (worker 0) at global step" "$tmp/sync/ps0.log" \
  && ok "sync: the surviving ps went back with the restarted one" || bad "sync: the surviving ps went back too"

summary

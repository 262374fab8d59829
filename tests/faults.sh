#!/usr/bin/env bash
# Fault injection: starts a local cluster process by process (not `dtrain launch`, which stops
# everything when one process fails), SIGKILLs one process after a chosen or random delay,
# optionally restarts it, and checks the outcome: no hang (every surviving process exits within
# --guard seconds), exit statuses, the chief's test accuracy.
#
#   tests/faults.sh [--mode sync|async] [--ps 1] [--workers 3] [--aggregate 2] [--steps 300]
#                   [--kill worker:2|ps:0|none] [--after SECONDS|random] [--restart]
#                   [--heartbeat 30] [--guard 600] [--repeat N] [--keep DIR]
#
# One run prints a line "RESULT kill=... after=...s status=ok|hang|fail acc=... took=...s"; when a
# ps was killed and restarted it adds "rollback=FROM->TO" (the global step the chief was at and the
# checkpoint step every ps went back to) and "newest_saved=N" (the newest checkpoint saved before);
# --repeat N runs N times (random delays of 3..22 s with --after random) and prints the counts
# (killed=no: the victim had already finished); with --keep, each run's logs in DIR/runI.
# Exit status: 0 when every run finished (chief exit 0 and every other survivor 0).
set -u
bin=${DTRAIN_BIN:-build/dtrain}
data=${FASHION:-/usr/share/datasets/fashion-mnist}
mode=sync n_ps=1 workers=3 aggregate=2 steps=300 kill=none after=10 restart=0 heartbeat=30 guard=600 repeat=0 keep=
while [ $# -gt 0 ]; do
  case $1 in
    --mode) mode=$2; shift ;;
    --ps) n_ps=$2; shift ;;
    --workers) workers=$2; shift ;;
    --aggregate) aggregate=$2; shift ;;
    --steps) steps=$2; shift ;;
    --kill) kill=$2; shift ;;
    --after) after=$2; shift ;;
    --restart) restart=1 ;;
    --heartbeat) heartbeat=$2; shift ;;
    --guard) guard=$2; shift ;;
    --repeat) repeat=$2; shift ;;
    --keep) keep=$2; shift ;;
    *) echo "faults.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done

if [ "$repeat" -gt 0 ]; then
  ok=0 hang=0 failed=0 landed=0
  args=(--mode "$mode" --ps "$n_ps" --workers "$workers" --aggregate "$aggregate" --steps "$steps" --kill "$kill"
        --heartbeat "$heartbeat" --guard "$guard")
  [ "$restart" = 1 ] && args+=(--restart)
  for i in $(seq 1 "$repeat"); do
    a=$after
    [ "$a" = random ] && a=$(( 3 + RANDOM % 20 ))
    line=$("$0" "${args[@]}" --after "$a" ${keep:+--keep "$keep/run$i"} 2>/dev/null | grep '^RESULT')
    echo "run $i: $line"
    case $line in
      *status=ok*) ok=$((ok + 1)); case $line in *killed=yes*) landed=$((landed + 1)) ;; esac ;;
      *status=hang*) hang=$((hang + 1)) ;;
      *) failed=$((failed + 1)) ;;
    esac
  done
  echo "SUMMARY runs=$repeat finished=$ok (killed mid-run: $landed) hangs=$hang failed=$failed"
  [ "$ok" -eq "$repeat" ]
  exit
fi

. "$(dirname "$0")/lib.sh" # $tmp and free_port; its exit trap is replaced below
ln -s "$(cd "$data" && pwd)" "$tmp/data"
cleanup() { pkill -KILL -f "$tmp/" 2>/dev/null; [ -n "$keep" ] && cp -r "$tmp/." "$keep/" 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
[ -n "$keep" ] && mkdir -p "$keep"

ports=($(free_port $((n_ps + workers))))
ph=127.0.0.1:${ports[0]}
for i in $(seq 1 $((n_ps - 1))); do ph=$ph,127.0.0.1:${ports[i]}; done
wh=127.0.0.1:${ports[n_ps]}
for i in $(seq 1 $((workers - 1))); do wh=$wh,127.0.0.1:${ports[n_ps + i]}; done
common=(--model models/fashion.model --data "$tmp/data" --logdir="$tmp/ckpt" --summary_dir= --save_model_secs 5
        --train_steps "$steps" --steps_to_validate 100000 --heartbeat_timeout "$heartbeat" --connect_timeout 60
        --ps_hosts=$ph --worker_hosts=$wh --threads 1)
if [ "$mode" = sync ]; then
  common+=(--issync=1 --replicas_to_aggregate="$aggregate" --total_num_replicas="$workers")
fi

declare -A pid
start() { # job index
  "$bin" train "${common[@]}" --job_name="$1" --task_index="$2" >>"$tmp/$1$2.log" 2>&1 &
  pid[$1$2]=$!
}
for i in $(seq 0 $((n_ps - 1))); do start ps "$i"; done
for i in $(seq 0 $((workers - 1))); do start worker "$i"; done
t0=$(date +%s)

killed=
if [ "$kill" != none ]; then
  sleep "$after"
  victim=${kill/:/}
  if kill -0 "${pid[$victim]}" 2>/dev/null; then
    kill -KILL "${pid[$victim]}"
    wait "${pid[$victim]}" 2>/dev/null
    killed=$victim
    echo "killed $victim after ${after}s" >&2
    if [ "$restart" = 1 ]; then
      sleep 1
      echo "--- restarted ---" >>"$tmp/$victim.log"
      start "${kill%%:*}" "${kill##*:}"
    fi
  fi
fi

# Every process still running must exit within the guard.
status=ok bad=
for k in "${!pid[@]}"; do
  [ "$k" = "$killed" ] && [ "$restart" = 0 ] && continue
  while kill -0 "${pid[$k]}" 2>/dev/null && [ $(( $(date +%s) - t0 )) -lt "$guard" ]; do sleep 0.5; done
  if kill -0 "${pid[$k]}" 2>/dev/null; then
    status=hang bad="$bad $k(hung)"
    kill -KILL "${pid[$k]}"
  fi
  wait "${pid[$k]}"; st=$?
  [ "$st" -ne 0 ] && [ "$status" = ok ] && status=fail
  [ "$st" -ne 0 ] && bad="$bad $k($st)"
done
took=$(( $(date +%s) - t0 ))
# Every checkpoint left behind must read back with its checksum verified.
nck=0 corrupt=0
for f in "$tmp"/ckpt/*.safetensors; do
  [ -e "$f" ] || continue
  nck=$((nck + 1))
  "$bin" inspect "$f" >/dev/null 2>&1 || { corrupt=$((corrupt + 1)); echo "corrupt checkpoint: $f" >&2; }
done
[ "$corrupt" -gt 0 ] && [ "$status" = ok ] && status=fail
acc=$(awk '/^test accuracy/ { print $3 }' "$tmp/worker0.log" | tail -1)
# A rollback: the step the chief was at when it lost the ps, the step every ps went back to, and
# the newest checkpoint saved before (the rollback must reach it: at most save_model_secs lost).
rollback=
from=$(sed -n 's/^worker 0: at global step \([0-9]*\): .*waiting up to.*/\1/p' "$tmp/worker0.log" | head -1)
to=$(sed -n 's/^chief: a ps task lost its shard: every ps rolled back to the newest checkpoint (global step \([0-9]*\).*/\1/p' "$tmp/worker0.log" | head -1)
if [ -n "$to" ]; then
  newest=$(sed -n '/rolled back to the newest checkpoint/q; s/^saved checkpoint .*(global step \([0-9]*\),.*/\1/p' "$tmp/worker0.log" | tail -1)
  rollback=" rollback=${from:-?}->$to newest_saved=${newest:-none}"
fi
for k in "${!pid[@]}"; do [ -s "$tmp/$k.log" ] && grep -h 'dtrain train:' "$tmp/$k.log" | sed "s/^/$k: /" >&2; done
echo "RESULT kill=$kill after=${after}s killed=$([ -n "$killed" ] && echo yes || echo no) restart=$restart status=$status checkpoints=$nck corrupt=$corrupt acc=${acc:-none} took=${took}s$rollback${bad:+ exits:$bad}"
[ "$status" = ok ]

#!/usr/bin/env bash
# Dynamic data sharding across a restore (docs/elastic.md, "Checkpoints"): a cluster (ps, chief,
# one worker, asynchronous) is SIGKILLed whole mid-epoch after a checkpoint; started again, the
# chief restores the model and the work coordinator's state from the checkpoint, and the rest of
# that epoch is trained exactly once: the examples of the batches the checkpoint counts are not
# trained again, every other example of the epoch is, once; later epochs train every example
# once; every process exits 0. Then ps 0 alone is killed and restarted: the chief gives it the
# plan of the checkpoint it rolled the model back to.
. "$(dirname "$0")/lib.sh"
fashion_subset "$tmp/data" 1000 100 || { bad "fashion subset"; summary; exit; }
printf 'model tiny\ninput 28 28 1\nconv2d filters=4 kernel=3 stride=2\nrelu\nflatten\ndense units=10\n' >"$tmp/tiny.model"
B=32 EPOCHS=4 N=1000
m=(--model "$tmp/tiny.model" --data "$tmp/data" --logdir "$tmp/ckpt" --save_model_secs 0.3 --summary_dir=
   --threads 1 --batch_size $B --epochs $EPOCHS --sharding dynamic --unit_batches 2 --heartbeat_timeout 2
   --steps_to_validate 100000 --debug_step_delay_ms 40)
pids=()
trap 'kill -KILL "${pids[@]}" 2>/dev/null; lib_cleanup' EXIT

start() { # $1: run tag; bare processes, so that a SIGKILL reaches them (lib.sh's cleanup kills them at the latest)
  local ports=($(free_port 3)) d="$tmp/$1"
  mkdir -p "$d"
  h=(--ps_hosts=127.0.0.1:${ports[0]} --worker_hosts=127.0.0.1:${ports[1]},127.0.0.1:${ports[2]})
  "$bin" train "${m[@]}" "${h[@]}" --job_name=ps >"$d/ps" 2>&1 & ps=$!
  "$bin" train "${m[@]}" "${h[@]}" --job_name=worker --task_index=0 --debug_work_log "$d/work0" >"$d/w0" 2>&1 & w0=$!
  "$bin" train "${m[@]}" "${h[@]}" --job_name=worker --task_index=1 --debug_work_log "$d/work1" >"$d/w1" 2>&1 & w1=$!
  pids+=($ps $w0 $w1)
}

# Run 1: killed after epoch 1 has begun and a checkpoint was saved in it.
start one
for _ in $(seq 1 300); do grep -q "epoch 0 done" "$tmp/one/ps" 2>/dev/null && break; sleep 0.1; done
saves=$(grep -c "saved checkpoint" "$tmp/one/w0")
for _ in $(seq 1 100); do [ "$(grep -c "saved checkpoint" "$tmp/one/w0")" -gt "$saves" ] && break; sleep 0.05; done
kill -KILL $ps $w0 $w1; wait $ps $w0 $w1 2>/dev/null
grep -q "epoch 0 done" "$tmp/one/ps" && ! grep -q "training finished" "$tmp/one/ps" \
  && ok "run 1 killed mid-run after epoch 0" || bad "run 1 killed mid-run after epoch 0 ($(tail -2 "$tmp/one/ps"))"

# Run 2: restores; ps 0 says which epoch and how many of its batches the checkpoint counted.
start two
st=0
for p in $w0 $w1 $ps; do wait $p || st=1; done
[ $st = 0 ] && ok "run 2: every process exits 0" || bad "run 2: every process exits 0 ($(tail -3 "$tmp/two/w0"))"
grep -q "^restored .*model.ckpt-" "$tmp/two/w0" && grep -q "chief: work plan on ps 0 from the checkpoint: epoch" \
  "$tmp/two/w0" && ok "run 2: the chief restores the model and the work plan" \
  || bad "run 2: the chief restores the model and the work plan ($(grep -i 'restor\|work plan' "$tmp/two/w0"))"
line=$(grep "work plan from the chief: epoch" "$tmp/two/ps")
e=$(sed -n 's/.*work plan from the chief: epoch \([0-9]*\),.*/\1/p' <<<"$line")
c=$(sed -n 's/.* \([0-9]*\) batch(es) of the epoch counted.*/\1/p' <<<"$line")
if [ -z "$e" ] || [ -z "$c" ] || [ "$e" -lt 1 ]; then
  bad "run 2: ps 0 installs a checkpoint's plan past epoch 0 ($line)"
else
  ok "run 2: ps 0 installs the checkpoint's plan: epoch $e, $c batch(es) counted"
  # The counted batches hold c*B examples, or (c-1)*B + N mod B with the short last one among them.
  cat "$tmp"/two/work[01] | awk -v n=$N -v b=$B -v epochs=$EPOCHS -v e0="$e" -v c="$c" '
    { if ($2 < e0) early++; for (i = 6; i <= NF; i++) if (k[$2 " " $i]++) dup++; else seen[$2]++ }
    END { left = n - seen[e0]; ok = left == c * b || left == (c - 1) * b + n % b
          for (e = e0 + 1; e < epochs; e++) ok = ok && seen[e] == n
          printf "epoch %d: %d examples left to train, %d trained; earlier epochs %d, duplicates %d\n", e0,
                 n - (c * b), seen[e0], early, dup
          exit !(ok && !early && !dup) }' >"$tmp/count"
  [ $? -eq 0 ] && ok "run 2: the rest of the epoch once, later epochs whole ($(cat "$tmp/count"))" \
    || bad "run 2: the rest of the epoch once, later epochs whole ($(cat "$tmp/count"))"
fi
grep -q "training finished" "$tmp/two/ps" && ok "run 2: ps 0 counts every epoch done" || bad "run 2: training finished"

# Run 3 (a fresh log folder): the ps alone is SIGKILLed after a checkpoint and started again. The
# chief rolls the model back to the checkpoint and gives ps 0 the checkpoint's plan again.
m=("${m[@]/$tmp\/ckpt/$tmp/ckpt3}" --ps_timeout 60)
start three
for _ in $(seq 1 300); do grep -q "epoch 0 done" "$tmp/three/ps" 2>/dev/null && break; sleep 0.1; done
saves=$(grep -c "saved checkpoint" "$tmp/three/w0")
for _ in $(seq 1 100); do [ "$(grep -c "saved checkpoint" "$tmp/three/w0")" -gt "$saves" ] && break; sleep 0.05; done
kill -KILL $ps; wait $ps 2>/dev/null
"$bin" train "${m[@]}" "${h[@]}" --job_name=ps >"$tmp/three/ps2" 2>&1 & ps=$!; pids+=($ps)
st=0
for p in $w0 $w1 $ps; do wait $p || st=1; done
[ $st = 0 ] && ok "run 3: every process exits 0 after ps 0 restarted" \
  || bad "run 3: every process exits 0 after ps 0 restarted ($(tail -3 "$tmp/three/w0"))"
grep -q "chief: ps 0 has lost the work plan (it restarted): installing it again" "$tmp/three/w0" \
  && grep -q "work plan from the chief: epoch [1-9]" "$tmp/three/ps2" && grep -q "training finished" "$tmp/three/ps2" \
  && ok "run 3: the chief gives the restarted ps 0 the checkpoint's plan, and every epoch is done" \
  || bad "run 3: the plan after ps 0 restarted ($(grep 'work plan\|epoch' "$tmp/three/ps2" | head -3))"
summary

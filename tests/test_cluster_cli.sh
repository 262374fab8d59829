#!/usr/bin/env bash
# The cluster through the CLI: `dtrain launch` runs a real local cluster (processes on 127.0.0.1)
# whose processes all exit 0 and leave nothing behind; bad clusters are refused naming the field;
# a worker whose ps never appears gives up after --connect_timeout naming the address.
. "$(dirname "$0")/lib.sh"
# A unique path in every command line lets us find (and must not find) leftover processes. A
# subset of Fashion-MNIST: every process reads and the chief evaluates it (the whole set took
# minutes under ASan).
fashion_subset "$tmp/data" 3000 500
leftovers() { pgrep -f "$tmp/" >/dev/null; }

# 1 ps + 2 workers, asynchronous, a short run: every process exits 0, the ps exits by itself.
if timeout --foreground 300 "$bin" launch --ps 1 --workers 2 --model models/fashion.model --data "$tmp/data" --logdir= --summary_dir= \
     --train_steps 40 --steps_to_validate 20 >"$tmp/out" 2>&1; then
  ok "launch 1 ps + 2 workers exits 0"
else
  bad "launch 1 ps + 2 workers exits 0 (status $?)"; tail -20 "$tmp/out"
fi
grep -q '^\[ps0\] .*exiting' "$tmp/out" && ok "ps exits when the chief ends training" || bad "ps exits when the chief ends training"
grep -q '^\[worker0\] test accuracy' "$tmp/out" && ok "chief reports test accuracy" || bad "chief reports test accuracy"
grep -q '^\[worker1\] trained' "$tmp/out" && ok "worker 1 finishes" || bad "worker 1 finishes"
leftovers && bad "no process left behind" || ok "no process left behind"

# Ctrl-C (SIGINT) to launch stops every process, promptly, with status 130.
timeout --foreground 300 "$bin" launch --ps 1 --workers 2 --model models/fashion.model --data "$tmp/data" --logdir= --summary_dir= --epochs 50 \
  >"$tmp/int" 2>&1 &
lpid=$!
for _ in $(seq 1 100); do grep -q '^\[worker0\] dtrain' "$tmp/int" 2>/dev/null && break; sleep 0.2; done
kill -INT $lpid
t0=$(date +%s)
wait $lpid; st=$?
took=$(( $(date +%s) - t0 ))
[ $st -eq 130 ] && [ $took -le 20 ] && ok "SIGINT stops the launched cluster (${took}s)" \
  || { bad "SIGINT stops the launched cluster (status $st, ${took}s)"; tail -5 "$tmp/int"; }
sleep 0.5
leftovers && bad "no process left behind after SIGINT" || ok "no process left behind after SIGINT"

# 2 ps: the placement splits the variables, and both ps serve and exit.
if timeout --foreground 300 "$bin" launch --ps 2 --workers 2 --model models/fashion.model --data "$tmp/data" --logdir= --summary_dir= \
     --train_steps 20 >"$tmp/out2" 2>&1 && grep -q '^\[ps1\] .*exiting' "$tmp/out2"; then
  ok "launch with 2 ps tasks exits 0"
else
  bad "launch with 2 ps tasks exits 0"; tail -20 "$tmp/out2"
fi

# --dry_run prints the placement: catdog's bytes split within 10% of even over 2 ps.
"$bin" train --dry_run --model models/catdog.model --ps_hosts=127.0.0.1:1,127.0.0.1:2 \
  --worker_hosts=127.0.0.1:3 --job_name=worker --task_index=0 >"$tmp/dry" 2>&1
if awk '/^ *ps [0-9]+:/ { for (i = 1; i <= NF; i++) if ($i ~ /^[0-9]+$/ && $(i+1) ~ /^floats/) v[n++] = $i }
        END { if (n != 2) exit 1; t = v[0] + v[1]; for (i = 0; i < n; i++) if (v[i] > 1.1 * t / 2) exit 1 }' "$tmp/dry"; then
  ok "dry run: catdog over 2 ps within 10% of even"
else
  bad "dry run: catdog over 2 ps within 10% of even"; cat "$tmp/dry"
fi

# Refusals name the field.
expect() {
  local name=$1 pat=$2; shift 2
  if "$@" >"$tmp/o" 2>"$tmp/e"; then bad "$name (exit 0)"; return; fi
  grep -qE -- "$pat" "$tmp/e" && [ "$(wc -l <"$tmp/e")" -eq 1 ] && ok "$name" || bad "$name: $(cat "$tmp/e")"
}
m="--model models/fashion.model --data $tmp/data --logdir= --summary_dir="
expect "bad port" "--ps_hosts" "$bin" train $m --ps_hosts=127.0.0.1:99999 --worker_hosts=127.0.0.1:5 --job_name=worker
expect "empty worker list" "--worker_hosts" "$bin" train $m --ps_hosts=127.0.0.1:4 --worker_hosts= --job_name=worker
expect "duplicate address" "duplicate" "$bin" train $m --ps_hosts=127.0.0.1:4 --worker_hosts=127.0.0.1:4 --job_name=worker
expect "task index out of range" "--task_index" "$bin" train $m --ps_hosts=127.0.0.1:4 --worker_hosts=127.0.0.1:5 --job_name=worker --task_index=3
expect "unknown job" "--job_name" "$bin" train $m --ps_hosts=127.0.0.1:4 --worker_hosts=127.0.0.1:5 --job_name=boss
expect "TF_CONFIG not JSON" "TF_CONFIG" env TF_CONFIG='{"cluster": ' "$bin" train $m
expect "launch refuses cluster flags" "--job_name" "$bin" launch --job_name=ps $m
expect "launch checks train's flags before starting anything" "--batch_size" "$bin" launch $m --batch_size=0
expect "launch refuses its own flag twice" "--workers: given twice" "$bin" launch $m --workers 2 --workers=3

# A worker whose ps never appears: retries, then exits non-zero naming the address, in time.
ports=($(free_port 2)); port=${ports[0]}
start=$(date +%s)
expect "worker without its ps gives up naming the address" "127.0.0.1:$port" \
  "$bin" train $m --ps_hosts=127.0.0.1:$port --worker_hosts=127.0.0.1:${ports[1]} --job_name=worker --connect_timeout 2
took=$(( $(date +%s) - start ))
[ "$took" -le 10 ] && ok "connect timeout honoured (${took}s)" || bad "connect timeout honoured (${took}s)"

# A worker started before its ps connects once the ps appears.
"$bin" train $m --ps_hosts=127.0.0.1:$port --worker_hosts=127.0.0.1:${ports[1]} --job_name=worker \
  --train_steps 5 --connect_timeout 30 >"$tmp/w" 2>&1 &
wpid=$!
sleep 1
"$bin" train $m --ps_hosts=127.0.0.1:$port --worker_hosts=127.0.0.1:${ports[1]} --job_name=ps >"$tmp/p" 2>&1 &
ppid=$!
wait $wpid; wst=$?
wait $ppid; pst=$?
[ $wst -eq 0 ] && [ $pst -eq 0 ] && ok "worker started before its ps retries and trains" \
  || bad "worker started before its ps retries and trains (worker $wst, ps $pst): $(tail -3 "$tmp/w" "$tmp/p")"

summary

#!/usr/bin/env bash
# --auth=curve (docs/security.md): keygen writes usable key pairs; a ps with CURVE keys trains an
# authorized worker bit for bit like an unauthenticated cluster, while a worker with a wrong key
# and one without CURVE, hammering it during training, are refused (their connect times out with
# a clear message, the ps logs each refusal with the key and address) and change nothing; bad key
# files are refused naming the file. Every process is started here and stopped by its pid.
. "$(dirname "$0")/lib.sh"
# Over TCP, the path between machines (a ps on 127.0.0.1 would otherwise serve local workers over
# its Unix socket, cluster.h), so the refusal lines name a TCP address.
export DTRAIN_IPC=0
pids=()
cleanup() { for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null; done; lib_cleanup; }
trap cleanup EXIT
# A small IDX data set: the first 512 training and 64 test images of Fashion-MNIST.
data=$tmp/data
fashion_subset "$data" 512 64

# ---- keygen ----
k=$tmp/keys
"$bin" keygen --out "$k" --name server >/dev/null && "$bin" keygen --out "$k" --name client >/dev/null \
  && "$bin" keygen --out "$tmp/other" --name client >/dev/null \
  && ok "keygen writes key pairs" || bad "keygen writes key pairs"
[ "$(stat -c %a "$k/server.secret")" = 600 ] && ok "secret key file is mode 600" || bad "secret key file is mode 600"
[ "$(tr -d '\n' <"$k/server.key" | wc -c)" = 40 ] && ! cmp -s "$k/server.key" "$k/client.key" \
  && ok "public keys are 40 Z85 characters, distinct" || bad "public keys are 40 Z85 characters, distinct"
"$bin" keygen --out "$k" --name server >/dev/null 2>"$tmp/e" && bad "keygen refuses to overwrite" \
  || { grep -q "$k/server.secret" "$tmp/e" && ok "keygen refuses to overwrite, naming the file" || bad "keygen overwrite message"; }

# The ps's folder: its pair and the authorized client keys. The worker's: its pair, server.key.
mkdir -p "$k/authorized" && cp "$k/client.key" "$k/authorized/worker0.key"
cp "$k/server.key" "$tmp/other/server.key"                    # a stranger who knows the server key

read -r ps_port wk_port <<<"$(free_port 2)"
cl=(--ps_hosts=127.0.0.1:$ps_port --worker_hosts=127.0.0.1:$wk_port)
base=(--model models/fashion.model --data "$data" --logdir= --summary_dir= --steps_to_validate 1000 --seed 7 --batch_size 16)
common=("${base[@]}" --train_steps 30) # launch below runs 10 steps: base, as a flag given twice is refused

# ---- reference: the same cluster without authentication ----
"$bin" train "${common[@]}" "${cl[@]}" --job_name=ps --threads=1 >"$tmp/ref_ps" 2>&1 &
pids+=($!); ref_ps=$!
timeout --foreground 120 "$bin" train "${common[@]}" "${cl[@]}" --job_name=worker --task_index=0 \
  --debug_dump_params="$tmp/ref.bin" >"$tmp/ref_w" 2>&1 && ok "reference cluster trains" \
  || { bad "reference cluster trains"; tail -5 "$tmp/ref_w"; }
wait $ref_ps

# ---- CURVE: an authorized chief trains while two strangers try to connect ----
"$bin" train "${common[@]}" "${cl[@]}" --job_name=ps --threads=1 --auth=curve --keys="$k" >"$tmp/ps" 2>&1 &
pids+=($!); ps_pid=$!
timeout --foreground 120 "$bin" train "${common[@]}" "${cl[@]}" --job_name=worker --task_index=0 --auth=curve --keys="$k" \
  --debug_step_delay_ms=150 --debug_dump_params="$tmp/curve.bin" >"$tmp/good" 2>&1 &
pids+=($!); good=$!
sleep 1
t0=$(date +%s)
timeout --foreground 60 "$bin" train "${common[@]}" "${cl[@]}" --job_name=worker --task_index=0 --auth=curve --keys="$tmp/other" \
  --connect_timeout=2 >"$tmp/wrongkey" 2>&1 &
wk=$!; pids+=($wk)
timeout --foreground 60 "$bin" train "${common[@]}" "${cl[@]}" --job_name=worker --task_index=0 --connect_timeout=2 \
  >"$tmp/nocurve" 2>&1; st_nc=$?
wait $wk; st_wk=$?
took=$(( $(date +%s) - t0 ))
[ $st_wk -ne 0 ] && [ $st_nc -ne 0 ] && [ $st_wk -ne 124 ] && [ $st_nc -ne 124 ] && [ $took -le 20 ] \
  && ok "wrong key and no CURVE: both exit non-zero within the connect timeout (${took}s)" \
  || bad "wrong key and no CURVE refused (status $st_wk, $st_nc, ${took}s)"
grep -q "no answer to HELLO within 2000 ms.*authorized" "$tmp/wrongkey" && ok "wrong key: clear message" \
  || { bad "wrong key: clear message"; tail -3 "$tmp/wrongkey"; }
grep -q "no answer to HELLO within 2000 ms.*--auth" "$tmp/nocurve" && ok "no CURVE: clear message" \
  || { bad "no CURVE: clear message"; tail -3 "$tmp/nocurve"; }
if wait $good; then ok "authorized chief trains under CURVE"; else bad "authorized chief trains under CURVE"; tail -5 "$tmp/good"; fi
wait $ps_pid && ok "CURVE ps exits 0 after the chief's SHUTDOWN" || bad "CURVE ps exits 0"
stranger=$(tr -d '\n' <"$tmp/other/client.key")
grep -qF "ps 0: refused a client from 127.0.0.1: public key not authorized (key $stranger)" "$tmp/ps" \
  && ok "ps logs the wrong key's refusal with key and address" || { bad "ps logs the wrong key's refusal"; cat "$tmp/ps"; }
grep -q "ps 0: refused a client on tcp://127.0.0.1:$ps_port: handshake failed" "$tmp/ps" \
  && ok "ps logs the refusal of a client without CURVE" || { bad "ps logs the no-CURVE refusal"; cat "$tmp/ps"; }
[ "$(grep -c 'initialised by the chief' "$tmp/ps")" = 1 ] \
  && ok "the ps was initialised once (by the authorized chief)" || { bad "ps initialised once"; grep chief "$tmp/ps"; }
grep -q "after 30 pushes" "$tmp/ps" && ok "the ps applied exactly the chief's 30 pushes" || { bad "30 pushes"; grep pushes "$tmp/ps"; }
[ -s "$tmp/ref.bin" ] && cmp -s "$tmp/ref.bin" "$tmp/curve.bin" \
  && ok "parameters bit-identical to the unauthenticated run (strangers changed nothing)" \
  || bad "parameters bit-identical to the unauthenticated run"

# ---- key files refused naming the file ----
run_ps() { timeout --foreground 20 "$bin" train "${common[@]}" "${cl[@]}" --job_name=ps "$@" >"$tmp/e" 2>&1; }
run_ps --auth=curve --keys="$tmp/nope"; [ $? -ne 0 ] && grep -q "$tmp/nope/server.secret" "$tmp/e" \
  && ok "missing keys folder: names server.secret" || { bad "missing keys folder"; cat "$tmp/e"; }
echo "not a key" >"$k/authorized/broken.key"
run_ps --auth=curve --keys="$k"; [ $? -ne 0 ] && grep -q "$k/authorized/broken.key: not a CURVE key" "$tmp/e" \
  && ok "malformed authorized key: names the file" || { bad "malformed authorized key"; cat "$tmp/e"; }
# 40 Z85 characters whose first group is beyond 32 bits (found by fuzz/fuzz_keyfile.c).
printf 'Ag6#ywoZ9/q&jDh#ywoZxu*vXlfheCe#{g)2A=#7\n' >"$k/authorized/broken.key"
run_ps --auth=curve --keys="$k"; [ $? -ne 0 ] && grep -q "$k/authorized/broken.key: not a CURVE key (its Z85 text does not decode" "$tmp/e" \
  && ok "undecodable authorized key: names the file" || { bad "undecodable authorized key"; cat "$tmp/e"; }
rm "$k/authorized/broken.key"; chmod 644 "$k/server.secret"
run_ps --auth=curve --keys="$k"; [ $? -ne 0 ] && grep -q "$k/server.secret: secret key readable by group or others" "$tmp/e" \
  && ok "secret key readable by others: refused, naming the file" || { bad "secret key mode"; cat "$tmp/e"; }
chmod 600 "$k/server.secret"
timeout --foreground 20 "$bin" train "${common[@]}" "${cl[@]}" --job_name=worker --task_index=0 --auth=curve --keys="$k/authorized" \
  >"$tmp/e" 2>&1; [ $? -ne 0 ] && grep -q "$k/authorized/client.secret" "$tmp/e" \
  && ok "worker without client.secret: names it" || { bad "worker missing client.secret"; cat "$tmp/e"; }
run_ps --auth=rsa >/dev/null; [ $? -ne 0 ] && grep -q -- "auth: expected none or curve" "$tmp/e" \
  && ok "--auth=rsa refused" || { bad "--auth=rsa refused"; cat "$tmp/e"; }

# ---- dtrain launch --auth=curve: a throwaway key set, removed afterwards ----
export TMPDIR=$tmp/launchtmp; mkdir -p "$TMPDIR"
timeout --foreground 120 "$bin" launch --ps 1 --workers 2 "${base[@]}" --train_steps 10 --auth=curve >"$tmp/launch" 2>&1 \
  && grep -q '^\[ps0\] .*exiting' "$tmp/launch" && ok "launch --auth=curve trains" \
  || { bad "launch --auth=curve trains"; tail -5 "$tmp/launch"; }
[ -z "$(ls -A "$TMPDIR")" ] && ok "launch removes its throwaway keys" || { bad "launch removes its keys"; ls -R "$TMPDIR"; }
"$bin" train --help | grep -q -- "--auth=curve" && ok "train --help points at --auth=curve" || bad "train --help"

summary

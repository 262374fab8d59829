#!/usr/bin/env bash
# Clusters across addresses (issue 12): IPv6 works end to end (a real cluster over [::1]); a ps
# binds its own address, so ps tasks on one host's different addresses share a port, and --bind
# binds another; a ps whose address is not this host's says so. Every process is bounded by
# `timeout` and killed at exit (lib.sh).
. "$(dirname "$0")/lib.sh"
data=${FASHION:-/usr/share/datasets/fashion-mnist}
ln -s "$(cd "$data" && pwd)" "$tmp/data"
# A tiny model, so that the runs stay short under the sanitizers too.
printf 'model tiny\ninput 28 28 1\nconv2d filters=4 kernel=3 stride=2\nrelu\nflatten\ndense units=10\n' >"$tmp/tiny.model"
m=(--model "$tmp/tiny.model" --data "$tmp/data" --logdir= --summary_dir= --threads 1)

# run_cluster TAG PS_HOSTS WORKER_HOSTS [flags for every task]: every task of the cluster as its own
# process (logs $tmp/TAG.ps<i>, $tmp/TAG.w<i>), a short asynchronous run; 0 if every process exits 0.
# Arrays ps_flags0, ps_flags1 add flags to ps 0, ps 1 alone; worker_ps_hosts, if set, is the
# workers' --ps_hosts. Workers give up after 20 s without their ps; ps tasks still running 15 s
# after the last worker ended are killed (and count as failed).
run_cluster() {
  local tag=$1 ps=$2 workers=$3 i p st=0 ps_pids=() w_pids=()
  shift 3
  local nps nw
  nps=$(tr ',' '\n' <<<"$ps" | wc -l)
  nw=$(tr ',' '\n' <<<"$workers" | wc -l)
  for ((i = 0; i < nps; i++)); do
    local -n extra=ps_flags$i
    timeout --foreground 300 "$bin" train "${m[@]}" --ps_hosts="$ps" --worker_hosts="$workers" --job_name=ps --task_index=$i \
      "$@" ${extra[@]+"${extra[@]}"} >"$tmp/$tag.ps$i" 2>&1 &
    ps_pids+=($!)
    unset -n extra
  done
  for ((i = 0; i < nw; i++)); do
    timeout --foreground 300 "$bin" train "${m[@]}" --ps_hosts="${worker_ps_hosts:-$ps}" --worker_hosts="$workers" --job_name=worker \
      --task_index=$i --train_steps 20 --steps_to_validate 10 --connect_timeout 20 "$@" >"$tmp/$tag.w$i" 2>&1 &
    w_pids+=($!)
  done
  for p in "${w_pids[@]}"; do wait "$p" || st=1; done
  for _ in $(seq 1 150); do
    local alive=0
    for p in "${ps_pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
    [ $alive = 0 ] && break
    sleep 0.1
  done
  # TERM: timeout passes it on to dtrain.
  for p in "${ps_pids[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null || st=1; done
  return $st
}
ps_flags0=() ps_flags1=()
show() { tail -n 3 "$tmp/$1".*; }

# 1. IPv6 end to end: ps tasks on [::1] and on 127.0.0.1 with the same port (each binds its own
# address), workers over TCP (DTRAIN_IPC=0: not the same-host Unix socket), then the default path.
if ! grep -q '^00000000000000000000000000000001 ' /proc/net/if_inet6 2>/dev/null; then
  echo "skip IPv6: this kernel has no IPv6 loopback (::1 is not in /proc/net/if_inet6)"
else
  port=$(free_port)
  if DTRAIN_IPC=0 run_cluster v6 "[::1]:$port,127.0.0.1:$port" "[::1]:$((port + 1)),127.0.0.1:$((port + 2))"; then
    ok "a cluster over [::1] (and 127.0.0.1, same port) trains, every process exits 0"
  else
    bad "a cluster over [::1] trains"; show v6
  fi
  grep -q "serving .* on tcp://\[::1\]:$port" "$tmp/v6.ps0" && ok "ps 0 serves on tcp://[::1]:$port" \
    || bad "ps 0 serves on tcp://[::1]:$port: $(cat "$tmp/v6.ps0")"
  grep -q "test accuracy" "$tmp/v6.w0" && grep -q "^trained" "$tmp/v6.w1" && ok "both workers trained over IPv6" \
    || bad "both workers trained over IPv6"
  port=$(free_port)
  run_cluster v6ipc "[::1]:$port" "[::1]:$((port + 1))" && ok "the docs' [::1]:port works with the same-host path too" \
    || { bad "the docs' [::1]:port works with the same-host path too"; show v6ipc; }
fi

# 2. Each ps binds its own address: two ps tasks of one host on different addresses share a port.
# 127.0.0.1 and 127.0.0.2 (both loopback on Linux), over TCP:
port=$(free_port)
DTRAIN_IPC=0 run_cluster lo2 "127.0.0.1:$port,127.0.0.2:$port" "127.0.0.1:$((port + 1))" \
  && ok "ps tasks on 127.0.0.1:$port and 127.0.0.2:$port both bind and serve a cluster" \
  || { bad "ps tasks on 127.0.0.1 and 127.0.0.2, same port"; show lo2; }
# This host's name, resolved, beside 127.0.0.2 with the same port (before, a name bound every
# interface, *:port, and the second ps could not bind).
name=$(hostname)
addr=$(getent ahostsv4 "$name" 2>/dev/null | awk 'NR == 1 { print $1 }')
if [ -z "$addr" ] || [ "$addr" = 127.0.0.2 ] || ! python3 -c "import socket; socket.socket().bind(('$addr', 0))" 2>/dev/null; then
  echo "skip the host-name case: $name does not resolve to an IPv4 address of this host (other than 127.0.0.2)"
else
  port=$(free_port)
  DTRAIN_IPC=0 run_cluster name "$name:$port,127.0.0.2:$port" "127.0.0.1:$((port + 1))" \
    && ok "ps tasks on $name:$port ($addr) and 127.0.0.2:$port both bind and serve a cluster" \
    || { bad "ps tasks on $name and 127.0.0.2, same port"; show name; }
  grep -q "serving .* on tcp://$addr:$port" "$tmp/name.ps0" && ok "ps 0 binds $name's address, $addr" \
    || bad "ps 0 binds $name's address: $(cat "$tmp/name.ps0")"
  if [[ $addr == 127.* ]]; then
    grep -q "warning: --ps_hosts\[0\]: $name resolves to $addr here, a loopback address" "$tmp/name.ps0" \
      && ok "a name resolving to loopback is warned about" || bad "a name resolving to loopback is warned about"
  fi
fi

# 3. --bind: a ps whose listed address is not its own (NAT: 198.51.100.7, TEST-NET-2, is on no host
# here) binds 0.0.0.0 instead; the workers reach it at the address they know it by.
port=$(free_port)
ps_flags0=(--bind 0.0.0.0)
DTRAIN_IPC=0 worker_ps_hosts=127.0.0.1:$port run_cluster nat "198.51.100.7:$port" "127.0.0.1:$((port + 1))" \
  && ok "--bind 0.0.0.0: a ps listed at a NAT'd address serves its workers" || { bad "--bind 0.0.0.0"; show nat; }
ps_flags0=()
grep -q "serving .* on tcp://0.0.0.0:$port" "$tmp/nat.ps0" && ok "and it binds 0.0.0.0:$port" \
  || bad "--bind 0.0.0.0 binds 0.0.0.0: $(cat "$tmp/nat.ps0")"
# Without --bind that ps stops at once, saying why and what to do.
timeout --foreground 20 "$bin" train "${m[@]}" --ps_hosts=198.51.100.7:$port --worker_hosts=127.0.0.1:1 --job_name=ps >/dev/null 2>"$tmp/e"
st=$?
[ $st -ne 0 ] && [ $st -ne 124 ] && grep -q "ps 0: --ps_hosts\[0\]: 198.51.100.7 is not an address of this host" "$tmp/e" \
  && grep -q -- "--bind" "$tmp/e" && ok "a ps at an address not its own is refused, pointing at --bind" \
  || bad "a ps at an address not its own is refused, pointing at --bind ($st): $(cat "$tmp/e")"
"$bin" train "${m[@]}" --ps_hosts=127.0.0.1:$port --worker_hosts=127.0.0.1:1 --job_name=ps --bind 'a b' >/dev/null 2>"$tmp/e"
[ $? -ne 0 ] && grep -q -- '--bind: "a b" is not an address' "$tmp/e" && ok "a bad --bind is refused naming it" \
  || bad "a bad --bind is refused naming it: $(cat "$tmp/e")"

summary

#!/usr/bin/env bash
# Issue 13, the environment path (fast; the real managers are in test_mpirun_fashion_slow.sh and
# test_slurm_slow.sh): dtrain train --num_ps derives the cluster from the variables Slurm, Open
# MPI and PMI launchers set, shown by --dry_run; the precedence is printed; the Kubernetes example
# rendered for 1 ps and 2 workers parses to the intended cluster. Bad input (a host list that does
# not parse, too few tasks, two ranks at one address, world sizes that disagree, a missing rank):
# every task exits non-zero with one line naming the variable and its value, within the connect
# deadline. Every task is a real process.
. "$(dirname "$0")/lib.sh"
m=models/fashion.model
dry() { "$bin" train --model $m --dry_run "$@"; }
clean_env=(env -u TF_CONFIG -u SLURM_PROCID -u SLURM_STEP_ID -u OMPI_COMM_WORLD_RANK -u PMI_RANK)

# --- Slurm: 2 nodes, block and cyclic layouts, every rank's view ---------------------------------
slurm() { # RANK LOCALID NODEID [VAR=VALUE...] -- dtrain args
  local r=$1 l=$2 n=$3; shift 3
  "${clean_env[@]}" SLURM_STEP_ID=0 SLURM_PROCID=$r SLURM_LOCALID=$l SLURM_NODEID=$n SLURM_NTASKS=5 \
    SLURM_STEP_NODELIST='gpu[07-08]' SLURM_STEP_TASKS_PER_NODE='3,2' "$@"
}
want_ps="ps=\[gpu07:2222,gpu07:2223\] workers=\[gpu07:2224,gpu08:2222,gpu08:2223\]; from slurm"
slurm 0 0 0 "$bin" train --model $m --dry_run --num_ps 2 >"$tmp/s0" 2>&1
grep -q "^cluster: ps 0 of 2; $want_ps\$" "$tmp/s0" && ok "slurm block: rank 0 is ps 0" || { bad "slurm block: rank 0"; cat "$tmp/s0"; }
slurm 2 2 0 "$bin" train --model $m --dry_run --num_ps 2 >"$tmp/s2" 2>&1
grep -q "^cluster: worker 0 of 3 (chief); $want_ps\$" "$tmp/s2" && ok "slurm block: rank 2 (= --num_ps) is the chief" \
  || { bad "slurm block: rank 2 is the chief"; cat "$tmp/s2"; }
grep -q '^cluster from slurm: rank 2 of 5 (SLURM_PROCID=2, SLURM_NTASKS=5); hosts from SLURM_STEP_NODELIST="gpu\[07-08\]", SLURM_STEP_TASKS_PER_NODE="3,2", block .*ports --base_port 2222 + local id (SLURM_LOCALID=2); ranks 0..1 are ps tasks (--num_ps 2), rank 2 is the chief$' "$tmp/s2" \
  && ok "slurm: where each value came from" || { bad "slurm: where each value came from"; cat "$tmp/s2"; }
slurm 4 1 1 "$bin" train --model $m --dry_run --num_ps 2 --base_port 3000 >"$tmp/s4" 2>&1
grep -q '^cluster: worker 2 of 3 (not chief); ps=\[gpu07:3000,gpu07:3001\] workers=\[gpu07:3002,gpu08:3000,gpu08:3001\]' "$tmp/s4" \
  && ok "slurm: --base_port" || { bad "slurm: --base_port"; cat "$tmp/s4"; }
# cyclic: ranks 0,2,4 on gpu07 and 1,3 on gpu08
slurm 3 1 1 env SLURM_DISTRIBUTION=cyclic "$bin" train --model $m --dry_run --num_ps 1 >"$tmp/sc" 2>&1
grep -q '^cluster: worker 2 of 4 (not chief); ps=\[gpu07:2222\] workers=\[gpu08:2222,gpu07:2223,gpu08:2223,gpu07:2224\]' "$tmp/sc" \
  && ok "slurm cyclic layout" || { bad "slurm cyclic layout"; cat "$tmp/sc"; }

# --- precedence ---------------------------------------------------------------------------------
slurm 1 1 0 env TF_CONFIG='{"cluster":{"worker":["a:1"]},"task":{"type":"worker","index":0}}' \
  "$bin" train --model $m --dry_run --num_ps 1 >"$tmp/p1" 2>&1
grep -q 'from slurm$' "$tmp/p1" && grep -q 'TF_CONFIG ignored (--num_ps takes the manager' "$tmp/p1" \
  && ok "--num_ps: the manager wins over TF_CONFIG, said so" || { bad "--num_ps over TF_CONFIG"; cat "$tmp/p1"; }
slurm 1 1 0 env OMPI_COMM_WORLD_RANK=2 OMPI_COMM_WORLD_SIZE=3 OMPI_COMM_WORLD_LOCAL_RANK=2 OMPI_COMM_WORLD_LOCAL_SIZE=3 \
  "$bin" train --model $m --dry_run --num_ps 1 >"$tmp/p2" 2>&1
grep -q '^cluster: worker 1 of 2 (not chief); ps=\[127.0.0.1:2222\] workers=\[127.0.0.1:2223,127.0.0.1:2224\]; from mpi$' "$tmp/p2" \
  && ok "Open MPI's variables win over Slurm's (mpirun inside an allocation)" || { bad "mpi over slurm"; cat "$tmp/p2"; }
"${clean_env[@]}" TF_CONFIG='{"cluster":{"worker":["a:1"]},"task":{"type":"worker","index":0}}' \
  "$bin" train --model $m --dry_run --ps_hosts=b:1 --worker_hosts=c:1 --job_name=worker >"$tmp/p3" 2>&1
grep -q '^cluster from flags: .*TF_CONFIG ignored (the flags win)' "$tmp/p3" && ok "flags win over TF_CONFIG, said so" \
  || { bad "flags over TF_CONFIG"; cat "$tmp/p3"; }
"${clean_env[@]}" PMI_RANK=0 PMI_SIZE=2 MPI_LOCALRANKID=0 MPI_LOCALNRANKS=2 "$bin" train --model $m --dry_run --num_ps 1 \
  >"$tmp/p4" 2>&1
grep -q '^cluster: ps 0 of 1; ps=\[127.0.0.1:2222\] workers=\[127.0.0.1:2223\]; from mpi$' "$tmp/p4" \
  && ok "a PMI launcher (PMI_RANK, PMI_SIZE)" || { bad "PMI"; cat "$tmp/p4"; }

# --- refusals: one line naming the variable (or flag) and its value, non-zero, at once -----------
expect() { # NAME PATTERN command...: fails with one line on stderr matching PATTERN
  local name=$1 pat=$2; shift 2
  if "$@" >"$tmp/o" 2>"$tmp/e"; then bad "$name (exit 0)"; return; fi
  grep -qE -- "$pat" "$tmp/e" && [ "$(wc -l <"$tmp/e")" -eq 1 ] && ok "$name" || bad "$name: $(cat "$tmp/e")"
}
expect "no manager: says what was looked for" '^dtrain train: --num_ps: no cluster manager in the environment \(looked for OMPI_COMM_WORLD_RANK, SLURM_PROCID and PMI_RANK\)' \
  "${clean_env[@]}" "$bin" train --model $m --dry_run --num_ps 1
expect "--num_ps with --ps_hosts" '^dtrain train: num_ps: .* but ps_hosts defines it too' \
  slurm 0 0 0 "$bin" train --model $m --dry_run --num_ps 1 --ps_hosts=a:1 --worker_hosts=b:1 --job_name=ps
expect "a batch script is no task" '^dtrain train: SLURM_STEP_ID: not set' \
  "${clean_env[@]}" SLURM_PROCID=0 SLURM_NTASKS=3 "$bin" train --model $m --dry_run --num_ps 1
expect "--rendezvous without --num_ps" '^dtrain train: rendezvous needs num_ps' \
  "${clean_env[@]}" "$bin" train --model $m --dry_run --rendezvous 127.0.0.1:1

# Every task of a Slurm step sees the same variables: each exits non-zero at once, naming them.
slurm_all() { # NAME PATTERN VAR=VALUE...: 3 tasks with these variables
  local name=$1 pat=$2 r st fails=0 t0; shift 2
  t0=$(date +%s%N)
  for r in 0 1 2; do
    "${clean_env[@]}" SLURM_STEP_ID=0 SLURM_PROCID=$r SLURM_NTASKS=3 SLURM_STEP_NODELIST=n1 SLURM_STEP_TASKS_PER_NODE=3 "$@" \
      "$bin" train --model $m --data "$tmp/none" --num_ps 1 --connect_timeout 5 >"$tmp/t$r.out" 2>"$tmp/t$r.err" &
  done
  for r in 0 1 2; do
    wait %$((r + 1)) 2>/dev/null; st=$?
    [ $st -ne 0 ] && [ "$(wc -l <"$tmp/t$r.err")" -eq 1 ] && grep -qE -- "$pat" "$tmp/t$r.err" || fails=$((fails + 1))
  done
  local ms=$(( ($(date +%s%N) - t0) / 1000000 ))
  [ $fails -eq 0 ] && [ $ms -lt 5000 ] && ok "$name: all 3 tasks exit non-zero in ${ms} ms" \
    || { bad "$name ($fails tasks wrong, ${ms} ms)"; cat "$tmp"/t?.err; }
}
slurm_all "host list that does not parse" '^dtrain train: SLURM_STEP_NODELIST: "node\[01-04,07\],gpu\[3": missing .\]' \
  SLURM_STEP_NODELIST='node[01-04,07],gpu[3'
slurm_all "host list range going down" '^dtrain train: SLURM_STEP_NODELIST: "n\[9-2\]": range 9-2 goes down' \
  SLURM_STEP_NODELIST='n[9-2]'
slurm_all "tasks per node that do not parse" '^dtrain train: SLURM_STEP_TASKS_PER_NODE: "2\(x3": not a tasks-per-node list' \
  SLURM_STEP_TASKS_PER_NODE='2(x3'
slurm_all "SLURM_NTASKS < --num_ps + 1" '^dtrain train: SLURM_NTASKS: 1 task, but --num_ps 1 needs at least 2' \
  SLURM_NTASKS=1 SLURM_STEP_TASKS_PER_NODE=1
slurm_all "two ranks at one address" '^dtrain train: SLURM_STEP_NODELIST="n1,n1" with SLURM_STEP_TASKS_PER_NODE="2,1": rank 2: duplicate address n1:2222 \(also rank 0\)' \
  SLURM_STEP_NODELIST=n1,n1 SLURM_STEP_TASKS_PER_NODE=2,1
slurm_all "tasks per node and the host list disagree" '^dtrain train: SLURM_STEP_TASKS_PER_NODE: "2,1" counts 2 nodes, but SLURM_STEP_NODELIST="n1" names 1' \
  SLURM_STEP_TASKS_PER_NODE=2,1
slurm_all "an unknown distribution" '^dtrain train: SLURM_DISTRIBUTION: "plane=2": dtrain derives addresses for block or cyclic only' \
  SLURM_DISTRIBUTION=plane=2

# --- MPI ranks meeting at --rendezvous (started by hand, as mpirun would) -----------------------
# mpi_all NAME PATTERN "RANK SIZE LOCAL" ...: one task per triple; every one must exit non-zero
# with one line matching PATTERN within the connect deadline (3 s) and a little.
mpi_all() {
  local name=$1 pat=$2 i=0 fails=0 st t0 rv; shift 2
  rv=$(free_port)
  t0=$(date +%s%N)
  for t in "$@"; do
    set -- $t
    "${clean_env[@]}" OMPI_COMM_WORLD_RANK=$1 OMPI_COMM_WORLD_SIZE=$2 OMPI_COMM_WORLD_LOCAL_RANK=$3 OMPI_COMM_WORLD_LOCAL_SIZE=3 \
      "$bin" train --model $m --data "$tmp/none" --num_ps 1 --rendezvous 127.0.0.1:$rv --connect_timeout 3 \
      >"$tmp/m$i.out" 2>"$tmp/m$i.err" &
    i=$((i + 1))
  done
  for j in $(seq 0 $((i - 1))); do
    wait %$((j + 1)) 2>/dev/null; st=$?
    [ $st -ne 0 ] && [ "$(wc -l <"$tmp/m$j.err")" -eq 1 ] && grep -qE -- "$pat" "$tmp/m$j.err" || fails=$((fails + 1))
  done
  local ms=$(( ($(date +%s%N) - t0) / 1000000 ))
  [ $fails -eq 0 ] && [ $ms -lt 6000 ] && ok "$name: all $i tasks exit non-zero in ${ms} ms" \
    || { bad "$name ($fails tasks wrong, ${ms} ms)"; cat "$tmp"/m?.err; }
}
mpi_all "mpi: two ranks at one address" 'OMPI_COMM_WORLD_LOCAL_RANK: 1 at ranks 1 and 2 alike, both at 127.0.0.1:2223' \
  "0 3 0" "1 3 1" "2 3 1"
mpi_all "mpi: world sizes disagree" 'OMPI_COMM_WORLD_SIZE: 4 at rank 2 \(from 127.0.0.1\), but 3 at rank 0' \
  "0 3 0" "1 3 1" "2 4 2"
mpi_all "mpi: a rank claimed twice" 'OMPI_COMM_WORLD_RANK: 1 claimed by two tasks' "0 3 0" "1 3 1" "1 3 2"
mpi_all "mpi: a rank never comes" 'OMPI_COMM_WORLD_SIZE: 3, but only 2 ranks arrived at --rendezvous 127.0.0.1:[0-9]+ within 3 s \(missing: 2\)' \
  "0 3 0" "1 3 1"
mpi_all "mpi: rank 0 never comes" '--rendezvous 127.0.0.1:[0-9]+: rank 0 \(OMPI_COMM_WORLD_RANK=0\) did not answer within 3 s' \
  "1 3 1" "2 3 2"
mpi_all "mpi: rank out of range" '^dtrain train: OMPI_COMM_WORLD_RANK: 3 is out of range 0..2$' "3 3 0"
# 64 idle connections at the rendezvous before ranks 1 and 2 come (rank 0 holds 18 at most): rank 0
# closes the ones waiting longest for the ranks, and every rank gets the list and exits 0 at once.
rv=$(free_port)
mpi_rank() { # RANK: a --dry_run task of a 3-rank world at $rv, its output in $tmp/f$RANK.{out,err}
  "${clean_env[@]}" OMPI_COMM_WORLD_RANK=$1 OMPI_COMM_WORLD_SIZE=3 OMPI_COMM_WORLD_LOCAL_RANK=$1 OMPI_COMM_WORLD_LOCAL_SIZE=3 \
    timeout --foreground 20 "$bin" train --model $m --data "$tmp/none" --dry_run --num_ps 1 --rendezvous 127.0.0.1:$rv \
    --connect_timeout 10 >"$tmp/f$1.out" 2>"$tmp/f$1.err"
}
mpi_rank 0 & r0=$!
for i in $(seq 100); do (: </dev/tcp/127.0.0.1/$rv) 2>/dev/null && break; sleep 0.05; done
idle=()
for i in $(seq 64); do exec {fd}<>/dev/tcp/127.0.0.1/$rv && idle+=("$fd"); done
sleep 0.3
t0=$(date +%s%N)
mpi_rank 1 & r1=$!
mpi_rank 2 & r2=$!
wait $r1; s1=$?
wait $r2; s2=$?
wait $r0; s0=$?
ms=$(( ($(date +%s%N) - t0) / 1000000 ))
for fd in "${idle[@]}"; do exec {fd}>&-; done
list='ps=\[127.0.0.1:2222\] workers=\[127.0.0.1:2223,127.0.0.1:2224\]; from mpi'
[ ${#idle[@]} -eq 64 ] && [ $s0 -eq 0 ] && [ $s1 -eq 0 ] && [ $s2 -eq 0 ] && [ $ms -lt 5000 ] \
  && [ "$(cat "$tmp"/f[012].out | grep -c "$list")" -eq 3 ] \
  && grep -qE '^rendezvous: [0-9]+ connections closed without a hello in all' "$tmp/f0.out" \
  && ok "mpi: 64 idle connections at the rendezvous first: every rank gets the list, exits 0 (${ms} ms)" \
  || { bad "mpi: 64 idle connections first (${#idle[@]} open; status $s0 $s1 $s2, ${ms} ms)"; cat "$tmp"/f[012].out "$tmp"/f[012].err; }
expect "mpi across hosts without --rendezvous" 'OMPI_COMM_WORLD_LOCAL_SIZE: smaller than the world, .* give --rendezvous HOST:PORT' \
  "${clean_env[@]}" OMPI_COMM_WORLD_RANK=0 OMPI_COMM_WORLD_SIZE=4 OMPI_COMM_WORLD_LOCAL_RANK=0 OMPI_COMM_WORLD_LOCAL_SIZE=2 \
  "$bin" train --model $m --dry_run --num_ps 1
expect "rendezvous not on rank 0's host" '--rendezvous 192.0.2.77:[0-9]+: 192.0.2.77 is not an address of this host, where rank 0' \
  "${clean_env[@]}" OMPI_COMM_WORLD_RANK=0 OMPI_COMM_WORLD_SIZE=2 OMPI_COMM_WORLD_LOCAL_RANK=0 \
  "$bin" train --model $m --dry_run --num_ps 1 --rendezvous 192.0.2.77:$(free_port)

# --- mpirun itself (a dry run: cheap) -----------------------------------------------------------
if command -v mpirun >/dev/null; then
  mpi=(mpirun --oversubscribe)
  [ "$(id -u)" = 0 ] && mpi+=(--allow-run-as-root)
  timeout --foreground 60 "${clean_env[@]}" "${mpi[@]}" -np 3 --tag-output "$bin" train --model $m --dry_run --num_ps 1 \
    --rendezvous 127.0.0.1:$(free_port) --connect_timeout 20 >"$tmp/mr" 2>&1
  st=$?
  [ $st -eq 0 ] && grep -q '1,0\]<stdout>:cluster: ps 0 of 1; ps=\[127.0.0.1:2222\] workers=\[127.0.0.1:2223,127.0.0.1:2224\]; from mpi' "$tmp/mr" \
    && grep -q '1,1\]<stdout>:cluster: worker 0 of 2 (chief)' "$tmp/mr" && ok "mpirun -np 3 --dry_run: the cluster from mpi" \
    || { bad "mpirun -np 3 --dry_run (status $st)"; cat "$tmp/mr"; }
  timeout --foreground 60 "${clean_env[@]}" "${mpi[@]}" -np 2 "$bin" train --model $m --dry_run --num_ps 2 >"$tmp/mr2" 2>&1
  st=$?
  n=$(grep -c '^dtrain train: OMPI_COMM_WORLD_SIZE: 2 tasks, but --num_ps 2 needs at least 3' "$tmp/mr2")
  [ $st -ne 0 ] && [ "$n" -eq 2 ] && ok "mpirun -np 2 --num_ps 2: both ranks refuse, naming OMPI_COMM_WORLD_SIZE" \
    || { bad "mpirun -np 2 --num_ps 2 (status $st)"; cat "$tmp/mr2"; }
else
  echo "(no mpirun: its checks skipped)"
fi

# --- Kubernetes: examples/kubernetes/dtrain.yaml rendered for each pod ---------------------------
if /usr/bin/python3 -c 'import yaml' 2>/dev/null; then
  /usr/bin/python3 tests/k8s_render.py examples/kubernetes/dtrain.yaml >"$tmp/pods" || bad "render the manifest"
  check "the manifest has 1 ps and 2 worker pods" test "$(cut -f1 "$tmp/pods" | tr '\n' ' ')" = \
    "dtrain-ps-0.dtrain-ps dtrain-worker-0.dtrain-worker dtrain-worker-1.dtrain-worker "
  list="ps=\[dtrain-ps-0.dtrain-ps:2222\] workers=\[dtrain-worker-0.dtrain-worker:2222,dtrain-worker-1.dtrain-worker:2222\]; from TF_CONFIG"
  while IFS=$'\t' read -r pod tf argv; do
    set -- $argv
    [ "$1 $2" = "dtrain train" ] || { bad "$pod: runs dtrain train"; continue; }
    shift 2
    args=(); for a in "$@"; do args+=("${a/#\/models\//models/}"); done # the image's /models is ours
    "${clean_env[@]}" TF_CONFIG="$tf" "$bin" train "${args[@]}" --dry_run >"$tmp/k" 2>&1 || { bad "$pod: dry run"; cat "$tmp/k"; continue; }
    case $pod in
      dtrain-ps-0.*) want="ps 0 of 1; $list" ;;
      dtrain-worker-0.*) want="worker 0 of 2 (chief); $list" ;;
      dtrain-worker-1.*) want="worker 1 of 2 (not chief); $list" ;;
    esac
    grep -qx "cluster: $want" "$tmp/k" && ok "kubernetes pod $pod: $(echo "$want" | cut -d';' -f1)" \
      || { bad "kubernetes pod $pod"; cat "$tmp/k"; }
  done <"$tmp/pods"
  # The elastic variant: 2 worker pods start, TF_CONFIG names the 4 the job may have.
  /usr/bin/python3 tests/k8s_render.py examples/kubernetes/dtrain-elastic.yaml >"$tmp/epods" || bad "render the elastic manifest"
  check "the elastic manifest starts 1 ps and 2 worker pods" test "$(cut -f1 "$tmp/epods" | tr '\n' ' ')" = \
    "dtrain-ps-0.dtrain-ps dtrain-worker-0.dtrain-worker dtrain-worker-1.dtrain-worker "
  i=0
  while IFS=$'\t' read -r pod tf argv; do
    set -- $argv
    shift 2
    args=(); for a in "$@"; do args+=("${a/#\/models\//models/}"); done
    "${clean_env[@]}" TF_CONFIG="$tf" "$bin" train "${args[@]}" --dry_run >"$tmp/k" 2>&1 || { bad "$pod: dry run"; cat "$tmp/k"; continue; }
    [ $i -eq 0 ] && want="ps 0 of 1;" || want="worker $((i - 1)) of 4"
    grep -q "^cluster: $want" "$tmp/k" && grep -q -- "--sharding dynamic --max_workers 4" <<<"$argv" &&
      ok "elastic kubernetes pod $pod: $want, dynamic sharding" || { bad "elastic kubernetes pod $pod"; cat "$tmp/k"; }
    i=$((i + 1))
  done <"$tmp/epods"
else
  echo "(no python3-yaml: the Kubernetes checks skipped)"
fi
summary

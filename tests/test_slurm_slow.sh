#!/usr/bin/env bash
# Issue 13: a real single-node Slurm, started by this test: munged (a key made here), slurmctld and
# slurmd on kernel-chosen ports, every file under $tmp. Then:
#   - `srun -n 3 --overcommit dtrain train --num_ps 1`: rank 0 serves, rank 1 is the chief; all exit 0
#   - examples/slurm/train.sbatch through `sbatch --wait`: the job completes
#   - a worker killed by SIGKILL leaves the ps and the chief running (the existing fault handling);
#     then `scancel` ends every task of the job, the ps included, within seconds
#   - `scontrol requeue` of the example's job (it has --requeue): it runs again and the chief
#     resumes from the newest checkpoint
# Every daemon is stopped at the end (trap). Needs root (slurmd), Debian slurm-wlm and munge, and a
# host name that resolves; otherwise it exits 77 (a skip), saying why. Runs by hand too:
#   DTRAIN_BIN=build/dtrain bash tests/test_slurm_slow.sh
. "$(dirname "$0")/lib.sh"
skip() { echo "SKIP: $*"; exit 77; }
for b in munged slurmctld slurmd srun sbatch scancel squeue sinfo scontrol; do
  command -v $b >/dev/null || skip "no $b (Debian slurm-wlm, munge)"
done
[ "$(id -u)" = 0 ] || skip "slurmd needs root"
node=$(hostname -s)
getent hosts "$node" >/dev/null || skip "host name $node does not resolve (tasks connect to it by name)"
chmod 755 "$tmp" # munged wants every directory above its socket searchable
s=$tmp/slurm
mkdir -p $s/state $s/spool $s/log $s/run
dd if=/dev/urandom of=$s/munge.key bs=1024 count=1 2>/dev/null && chmod 600 $s/munge.key
ctld_port=$(free_port) d_port=$(free_port)
export SLURM_CONF=$s/slurm.conf
cat >$SLURM_CONF <<CONF
ClusterName=dtraintest
SlurmctldHost=$node(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$d_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$s/run/munge.sock
CredType=cred/munge
StateSaveLocation=$s/state
SlurmdSpoolDir=$s/spool
SlurmctldPidFile=$s/run/slurmctld.pid
SlurmdPidFile=$s/run/slurmd.pid
SlurmctldLogFile=$s/log/slurmctld.log
SlurmdLogFile=$s/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
MpiDefault=none
ReturnToService=2
KillWait=5
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
NodeName=$node NodeAddr=127.0.0.1 CPUs=$(nproc) State=UNKNOWN
PartitionName=test Nodes=$node Default=YES MaxTime=10 State=UP OverSubscribe=FORCE
CONF

# A job step's slurmstepd runs in the spool folder; one whose job was cancelled just before
# slurmd stopped may outlive the daemons, retrying them: found by its folder, and ended.
stepds() {
  local p
  for p in $(pgrep -x slurmstepd); do
    case $(readlink /proc/$p/cwd 2>/dev/null) in "$s"/*) echo $p ;; esac
  done
}
stop_daemons() {
  scancel --quiet --user=root 2>/dev/null
  for _ in $(seq 1 40); do [ -z "$(squeue -h 2>/dev/null)" ] && break; sleep 0.25; done
  for f in slurmd slurmctld munged; do
    [ -s $s/run/$f.pid ] && kill "$(cat $s/run/$f.pid)" 2>/dev/null
  done
  sleep 0.5
  for f in slurmd slurmctld munged; do
    [ -s $s/run/$f.pid ] && kill -KILL "$(cat $s/run/$f.pid)" 2>/dev/null
  done
  for p in $(stepds); do kill -KILL $p; done
  lib_cleanup
}
trap stop_daemons EXIT

t0=$(date +%s)
munged -f --socket=$s/run/munge.sock --key-file=$s/munge.key --log-file=$s/log/munged.log \
  --pid-file=$s/run/munged.pid --seed-file=$s/run/munged.seed || skip "munged does not start: $(tail -2 $s/log/munged.log)"
slurmctld -f $SLURM_CONF -c -i || skip "slurmctld does not start: $(tail -3 $s/log/slurmctld.log)"
slurmd -f $SLURM_CONF || skip "slurmd does not start: $(tail -3 $s/log/slurmd.log)"
for _ in $(seq 1 60); do
  [ "$(sinfo -h -o %T 2>/dev/null)" = idle ] && break; sleep 0.25
done
[ "$(sinfo -h -o %T 2>/dev/null)" = idle ] ||
  skip "the node does not come up: $(sinfo 2>&1 | tail -1); $(tail -3 $s/log/slurmd.log)"
echo "daemons up in $(( $(date +%s) - t0 )) s"

fashion_subset "$tmp/data" 2000 500 || { bad "fashion subset"; summary; exit; }
base=$(free_port)
common=(--model models/fashion.model --data "$tmp/data" --logdir= --summary_dir= --threads 1 --connect_timeout 30)

# 1. srun: 3 tasks on one node, --overcommit for more tasks than cores.
t0=$(date +%s)
timeout --foreground 120 srun -n 3 --overcommit --label -t 2 "$bin" train --num_ps 1 --base_port "$base" "${common[@]}" \
  --epochs 1 >"$tmp/srun.out" 2>&1
st=$?
echo "srun took $(( $(date +%s) - t0 )) s"
check "srun: every task exits 0 (status $st)" test $st -eq 0
[ $st -eq 0 ] || tail -20 "$tmp/srun.out"
grep -q "^0: cluster: ps 0 of 1; ps=\[$node:$base\] workers=\[$node:$((base + 1)),$node:$((base + 2))\]; from slurm" \
  "$tmp/srun.out" && ok "srun: rank 0 is ps 0 at $node:$base, from slurm" || bad "srun: rank 0 is ps 0, from slurm"
grep -q '^1: cluster: worker 0 of 2 (chief);.*from slurm' "$tmp/srun.out" && ok "srun: rank 1 is the chief" \
  || bad "srun: rank 1 is the chief"
grep -q '^2: cluster from slurm: rank 2 of 3 (SLURM_PROCID=2, SLURM_NTASKS=3); hosts from SLURM_STEP_NODELIST=' \
  "$tmp/srun.out" && ok "srun: where each value came from is printed" || bad "srun: where each value came from is printed"
acc=$(sed -n 's/^1: test accuracy \([0-9.]*\).*/\1/p' "$tmp/srun.out")
check "srun: test accuracy '$acc' at least 0.55 (2000 images, 1 epoch)" awk -v a="$acc" 'BEGIN { exit !(a != "" && a >= 0.55) }'

# 2. The example batch script, as a user submits it (sbatch --wait returns the job's status).
t0=$(date +%s)
DTRAIN=$bin DATA=$tmp/data BASE_PORT=$base LOGDIR=$tmp/ckpt timeout --foreground 120 sbatch --wait --overcommit -t 2 \
  -o "$tmp/batch.out" examples/slurm/train.sbatch --summary_dir= --threads 1 --train_steps 20 >"$tmp/sbatch.out" 2>&1
st=$?
echo "sbatch took $(( $(date +%s) - t0 )) s"
check "sbatch examples/slurm/train.sbatch: the job completes (status $st)" test $st -eq 0
[ $st -eq 0 ] || { cat "$tmp/sbatch.out"; tail -20 "$tmp/batch.out"; }
grep -q 'test accuracy' "$tmp/batch.out" && ok "sbatch: the chief reports test accuracy" || bad "sbatch: the chief reports test accuracy"
ls "$tmp"/ckpt/model.ckpt-*.safetensors >/dev/null 2>&1 && ok "sbatch: checkpoints in LOGDIR" || bad "sbatch: checkpoints in LOGDIR"

# 3. A long job: SIGKILL one worker (the others carry on), then scancel ends every task.
jid=$(DTRAIN=$bin DATA=$tmp/data BASE_PORT=$base LOGDIR= sbatch --parsable --overcommit -t 2 -o "$tmp/long.out" \
  examples/slurm/train.sbatch --summary_dir= --threads 1 --epochs 100 --steps_to_validate 5 --connect_timeout 30)
# The tasks (srun's own command line names the same arguments, so it is told apart by name).
pids() { pgrep -f "^$bin train --num_ps 1 --base_port $base .*--data $tmp/data"; }
# (asynchronous workers log the global step they see, which need not be 5 exactly)
for _ in $(seq 1 120); do grep -qE 'step [0-9]+ ' "$tmp/long.out" 2>/dev/null && break; sleep 0.25; done
grep -qE 'step [0-9]+ ' "$tmp/long.out" && ok "scancel: the long job trains" || { bad "scancel: the long job trains"; tail "$tmp/long.out"; }
n=$(pids | wc -l)
[ "$n" -eq 3 ] && ok "scancel: 3 tasks running" || { bad "scancel: 3 tasks running ($n)"; ps -ef | grep "[t]rain --num_ps"; }
w1=$(pids | while read -r p; do
       tr '\0' '\n' </proc/$p/environ | grep -qx 'SLURM_PROCID=2' && echo $p; done)
[ -n "$w1" ] && kill -KILL $w1
sleep 3
check "a worker killed by SIGKILL leaves the ps and the chief running" test "$(pids | wc -l)" -eq 2
t0=$(date +%s)
scancel "$jid"
for _ in $(seq 1 80); do [ -z "$(pids)" ] && [ -z "$(squeue -h -j "$jid" 2>/dev/null)" ] && break; sleep 0.25; done
took=$(( $(date +%s) - t0 ))
# Slurm sends SIGTERM, then SIGKILL after KillWait (5 s here): a task still waiting on a peer that
# stopped first gives up 2 s after its SIGTERM, or is killed then.
[ -z "$(pids)" ] && ok "scancel ends every task, the ps included (${took} s)" \
  || { bad "scancel ends every task"; ps -f $(pids); tail -15 "$tmp/long.out"; }
[ -z "$(squeue -h -j "$jid" 2>/dev/null)" ] && ok "scancel: the job is gone" || bad "scancel: the job is gone"

# 4. --requeue (in the example): a requeued job runs the script again and the chief resumes from
# the newest checkpoint in LOGDIR.
jid=$(DTRAIN=$bin DATA=$tmp/data BASE_PORT=$base LOGDIR=$tmp/rq sbatch --parsable --overcommit -t 2 -o "$tmp/rq.out" \
  examples/slurm/train.sbatch --summary_dir= --threads 1 --epochs 100 --save_model_secs 1 --connect_timeout 30)
for _ in $(seq 1 120); do ls "$tmp"/rq/model.ckpt-[1-9]*.safetensors >/dev/null 2>&1 && break; sleep 0.25; done
t0=$(date +%s)
scontrol requeue "$jid" || bad "scontrol requeue"
# Slurm holds a requeued job back (BeginTime) for a while; a user would wait, the test need not.
for _ in $(seq 1 20); do squeue -h -j "$jid" -o %T | grep -q PENDING && break; sleep 0.25; done
scontrol update jobid="$jid" StartTime=now || bad "scontrol update StartTime=now"
for _ in $(seq 1 240); do grep -q '^restored .*model.ckpt-[1-9][0-9]*.safetensors: global step [1-9]' "$tmp/rq.out" && break; sleep 0.25; done
grep -q '^restored .*: global step [1-9]' "$tmp/rq.out" \
  && ok "requeue: the job starts again and the chief resumes from its checkpoint ($(( $(date +%s) - t0 )) s)" \
  || { bad "requeue: the chief resumes from its checkpoint"; squeue; tail -20 "$tmp/rq.out"; }
scancel "$jid"
for _ in $(seq 1 80); do [ -z "$(pids)" ] && [ -z "$(squeue -h 2>/dev/null)" ] && break; sleep 0.25; done
# 5. Elastic training under Slurm (issue 24, docs/elastic.md "Slurm"): the job's first step starts
# 1 ps and 2 workers with --sharding dynamic --max_workers 3; a second srun step in the same job
# (its SLURM_PROCID is 0 again, so it names the cluster with flags) joins as worker 2 and trains
# units; ps 0 counts every epoch once and both steps exit 0.
t0=$(date +%s)
el=(--sharding dynamic --max_workers 3 --epochs 20 --issync 0 --steps_to_validate 1000000)
timeout --foreground 120 srun -n 3 --overcommit --label -t 2 -J elastic "$bin" train --num_ps 1 --base_port "$base" \
  "${common[@]}" "${el[@]}" >"$tmp/el.out" 2>&1 &
first=$!
job=""
for _ in $(seq 1 120); do
  job=$(squeue -h -n elastic -o %i 2>/dev/null | head -1)
  [ -n "$job" ] && grep -q "^1: chief: work plan on ps 0" "$tmp/el.out" && break
  sleep 0.25
done
timeout --foreground 120 srun --jobid "$job" --overlap -n 1 -t 2 "$bin" train "${common[@]}" "${el[@]}" \
  --ps_hosts="$node:$base" --worker_hosts="$node:$((base + 1)),$node:$((base + 2)),$node:$((base + 3))" \
  --job_name worker --task_index 2 --debug_work_log "$tmp/el.work2" >"$tmp/el2.out" 2>&1
st2=$?
wait $first
st1=$?
check "elastic: the job's first step (1 ps, 2 workers) exits 0 (status $st1)" test $st1 -eq 0
check "elastic: a second srun step joining as worker 2 exits 0 (status $st2)" test $st2 -eq 0
check "elastic: the joiner trained batches ($(wc -l <"$tmp/el.work2" 2>/dev/null) counted)" test -s "$tmp/el.work2"
check "elastic: ps 0 counted each of the 20 epochs once" \
  test "$(grep -c '^0: ps 0: epoch .* done: .* each counted once' "$tmp/el.out")" -eq 20
echo "elastic under slurm: $(( $(date +%s) - t0 )) s"
[ $st1 -eq 0 ] && [ $st2 -eq 0 ] || { tail -5 "$tmp/el.out"; tail -5 "$tmp/el2.out"; }

summary

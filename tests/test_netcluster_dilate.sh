#!/usr/bin/env bash
# The time dilation plumbing of scripts/netcluster (cluster --dilate K, docs/testbed.md): a stand-in
# for dtrain (--bin) that records where it runs, so no training is needed. With K = 4 it checks:
# each task runs in a cpu cgroup of its own under the bed's parent, with a quota of 1/4 of a core
# (1 ms per 4 ms), the parent's weight the largest; a busy loop of 0.6 s wall in it gets about a
# quarter of that in CPU and is throttled; the link runs at 1gbit/4; the durations among the
# training flags and the four deadlines arrive 4 times as long (given ones rewritten, not repeated);
# the times of the log netcluster keeps are divided by 4 and labelled "dilated 4" (CPU seconds
# not), the wall-clock log kept beside it; the CPU table and samples are written; every cgroup is gone at the
# end, and also when netcluster is stopped by SIGTERM while the tasks run.
# Without root, iproute2 or a writable cgroup cpu controller: exit 77 (a skip). A few seconds.
. "$(dirname "$0")/lib.sh"
netcluster=$PWD/scripts/netcluster
[ "$(id -u)" -eq 0 ] || { echo "skipped: needs root (namespaces, cgroups)"; exit 77; }
cd "$tmp" || exit 1

# The stand-in: "train FLAGS..." as netcluster starts dtrain. It writes its flags and cgroups to
# DIR/<job><index>.ready, burns CPU for BUSY s (0: none), prints lines with times as dtrain does
# and the tc qdisc of its link, then sleeps SLEEP s.
cat >fake <<'EOF'
#!/usr/bin/env bash
job="" idx=""
for a in "$@"; do
  case "$a" in --job_name=*) job=${a#*=} ;; --task_index=*) idx=${a#*=} ;; esac
done
{ printf '%s\n' "$@"; grep -E '(^|:)cpu(,[a-z]*)?:|^0::' /proc/self/cgroup; } >"$FAKE_DIR/$job$idx.ready"
[ "$FAKE_BUSY" = 0 ] || timeout --foreground "$FAKE_BUSY" bash -c 'while :; do :; done'
echo "worker 0: 10 updates (sync replicas): per step compute 40.0 ms, exchange 8.0 ms"
echo "ps 0: time in requests (wall, of it CPU): PUSH 20: 0.400 s (0.100 s)"
echo "step 10  epoch 0.10  loss 0.5000  25 examples/sec"
tc qdisc show dev eth0
sleep "$FAKE_SLEEP"
EOF
chmod +x fake
mkdir ready1 ready2 out1

# cgroup_dir PATH: the folder of the cpu cgroup PATH (as /proc/PID/cgroup names it), v1 or v2.
cgroup_dir() {
  if [ -d "/sys/fs/cgroup/cpu$1" ]; then echo "/sys/fs/cgroup/cpu$1"; return; fi
  echo "$(awk '$3 == "cgroup2" {print $2; exit}' /proc/mounts)$1"
}

# 1. A whole run: 1 ps + 1 worker at K = 4.
FAKE_DIR=$PWD/ready1 FAKE_BUSY=0.6 FAKE_SLEEP=0 timeout --foreground -k 10 60 "$netcluster" cluster --ps 1 --workers 1 \
  --rate 1gbit --timeout 30 --out out1 --tail 0 --bin "$PWD/fake" --dilate 4 -- --model m --debug_emulate_compute_ms=15 \
  --heartbeat_timeout 30 >report1 2>&1
rc=$?
cat report1
if [ "$rc" -eq 77 ]; then
  echo "skipped: $(grep -m1 'skipped' report1)"
  exit 77
fi
check "netcluster exits 0 (exit $rc)" test "$rc" -eq 0
path=$(sed -n 's/^\(0::\|[0-9]*:[a-z,]*cpu[a-z,]*:\)//p' ready1/worker0.ready | head -1)
check "worker 0 ran in a cgroup of its own under the bed's parent ('$path')" \
  bash -c '[[ "$1" =~ ^/dtn-[0-9]+/worker0$ ]]' _ "$path"
ps_path=$(sed -n 's/^\(0::\|[0-9]*:[a-z,]*cpu[a-z,]*:\)//p' ready1/ps0.ready | head -1)
check "ps 0 in its own ('$ps_path')" bash -c '[[ "$1" =~ ^/dtn-[0-9]+/ps0$ ]]' _ "$ps_path"
for f in --debug_emulate_compute_ms=60 --heartbeat_timeout=120 --ps_timeout=480 --connect_timeout=240 --idle_timeout=2400; do
  check "the worker got $f" grep -qx -- "$f" ready1/worker0.ready
done
check "no duration flag given twice" bash -c '[ "$(grep -c -- "^--heartbeat_timeout" ready1/worker0.ready)" -eq 1 ]'
check "the link runs at 1gbit/4 (tbf rate 250Mbit)" grep -q 'tbf .*rate 250Mbit' out1/wall/worker0.log
check "the dilated log divides the times by 4, labelled" \
  grep -qF 'per step compute 10.00 ms, exchange 2.00 ms [dilated 4]' out1/worker0.log
check "... and multiplies the rates" grep -qF '100 examples/sec [dilated 4]' out1/worker0.log
check "... but not the CPU seconds" grep -qF 'PUSH 20: 0.1000 s (0.100 s) [dilated 4]' out1/worker0.log
check "the wall-clock log is kept as it was" grep -qF 'per step compute 40.0 ms, exchange 8.0 ms' out1/wall/worker0.log
check "the run's time is printed dilated" grep -qE '^netcluster: finished in [0-9.]+ s \[dilated 4: [0-9.]+ s of wall\]' report1
# 0.6 s of wall at 1/4 of a core: about 0.15 s of CPU (a loaded machine gives less; never the 0.6 s
# the loop would take unthrottled).
read -r _ cpu periods throttled _ < <(grep '^worker0' out1/cpu.tsv)
check "the busy worker used ${cpu:-?} s of CPU in 0.6 s of wall: at most 0.35" \
  awk -v c="${cpu:-9}" 'BEGIN { exit !(c > 0.02 && c <= 0.35) }'
check "... and was throttled (${throttled:-?} of ${periods:-?} periods)" test "${throttled:-0}" -gt 0
check "CPU samples during the run (cpu_samples.tsv: a header and rows of 3 numbers)" \
  awk -F'\t' 'NR == 1 { ok = ($1 == "wall_ns" && NF == 3) } NR > 1 && NF == 3 && $2 ~ /^[0-9]+$/ { n++ } END { exit !(ok && n >= 1) }' out1/cpu_samples.tsv
check "the cgroups are gone after the run" bash -c '[ -n "$1" ] && [ ! -e "$(dirname "$2")" ]' _ "$path" \
  "$(cgroup_dir "$path")"

# 2. Stopped by SIGTERM while its tasks run: the groups must go too. The quota is read while they run.
FAKE_DIR=$PWD/ready2 FAKE_BUSY=0 FAKE_SLEEP=30 timeout --foreground -k 10 60 "$netcluster" cluster --ps 1 --workers 1 \
  --timeout 40 --out out2 --bin "$PWD/fake" --dilate 4 -- --model m >report2 2>&1 &
nc=$!
for _ in $(seq 100); do [ -s ready2/worker0.ready ] && [ -s ready2/ps0.ready ] && break; sleep 0.1; done
path=$(sed -n 's/^\(0::\|[0-9]*:[a-z,]*cpu[a-z,]*:\)//p' ready2/worker0.ready | head -1)
dir=$(cgroup_dir "$path")
if [ -f "$dir/cpu.cfs_quota_us" ]; then
  quota="$(cat "$dir/cpu.cfs_quota_us") $(cat "$dir/cpu.cfs_period_us")"
  weight=$(cat "$(dirname "$dir")/cpu.shares")
  check "quota 1000 us per 4000 us ('$quota')" test "$quota" = "1000 4000"
  check "the bed's parent has cpu.shares 262144 ('$weight')" test "$weight" = 262144
else
  quota=$(cat "$dir/cpu.max")
  weight=$(cat "$(dirname "$dir")/cpu.weight")
  check "cpu.max '1000 4000' ('$quota')" test "$quota" = "1000 4000"
  check "the bed's parent has cpu.weight 10000 ('$weight')" test "$weight" = 10000
fi
kill -TERM "$nc"
wait "$nc"
rc=$?
check "netcluster stopped by SIGTERM exits 143 (exit $rc)" test "$rc" -eq 143
check "the cgroups are gone after SIGTERM ($(dirname "$dir"))" bash -c '[ -n "$1" ] && [ ! -e "$1" ]' _ "$(dirname "$dir")"
check "the bed is gone" bash -c '! ip netns list | grep -q "^${1#/}-"' _ "$(dirname "$path")"
summary

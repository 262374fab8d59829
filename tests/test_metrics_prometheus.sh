#!/usr/bin/env bash
# Prometheus metrics scraped by a real Prometheus server: a cluster (1 ps, 2 workers) launched with
# --metrics_port, a Prometheus started here (scrape interval 1 s, storage in the scratch folder,
# killed at exit) whose HTTP API must then show dtrain_global_step rising, exactly the label sets
# {job, task} of the three processes (plus Prometheus' own instance), and the series of each role.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/metrics_lib.sh"
case "$bin" in /*) ;; *) bin="$PWD/$bin" ;; esac
cd "$tmp"
command -v prometheus >/dev/null || { echo "prometheus is not installed (deps/debian-packages.txt)"; exit 1; }

tiny_setup

base=$(free_ports 3) || { bad "three free ports"; summary; exit; }
pport=$(free_port)
# honor_labels: the job and task labels are dtrain's (Prometheus' own job label would replace them).
cat >"$tmp/prometheus.yml" <<YML
global:
  scrape_interval: 1s
  scrape_timeout: 900ms
scrape_configs:
  - job_name: dtrain
    honor_labels: true
    static_configs:
      - targets: ['127.0.0.1:$base', '127.0.0.1:$((base + 1))', '127.0.0.1:$((base + 2))']
YML
prometheus --config.file="$tmp/prometheus.yml" --storage.tsdb.path="$tmp/prom" \
  --web.listen-address="127.0.0.1:$pport" >prometheus.log 2>&1 &
prom_pid=$!
trap 'kill $prom_pid 2>/dev/null; lib_cleanup' EXIT

timeout --foreground 120 "$bin" launch --ps 1 --workers 2 --model tiny.model --data data --batch_size 16 --train_steps 1200 \
  --steps_to_validate 100 --threads 1 --logdir= --summary_dir= --debug_step_delay_ms 40 --metrics_port "$base" \
  >launch.log 2>&1 &
launch_pid=$!

api=http://127.0.0.1:$pport/api/v1
q() { json_get "$api/query?query=$1" "$2"; }
# the label sets of dtrain_global_step, sorted: "job=ps,task=0;job=worker,task=0;..."
labels='";".join(sorted(",".join(k + "=" + v for k, v in sorted(r["metric"].items()) if k not in ("__name__", "instance")) for r in d["data"]["result"]))'
three() { [ "$(q dtrain_global_step "$labels")" = "job=ps,task=0;job=worker,task=0;job=worker,task=1" ]; }
check "Prometheus scrapes dtrain_global_step of ps0, worker0 and worker1" wait_for 60 three
keys=$(q dtrain_global_step 'sorted(set(",".join(sorted(r["metric"])) for r in d["data"]["result"]))')
check "each series has exactly the labels job, task (and Prometheus' instance): $keys" \
  test "$keys" = "['__name__,instance,job,task']"
step() { q 'dtrain_global_step{job="worker",task="0"}' 'int(float(d["data"]["result"][0]["value"][1]))'; }
s1=$(step)
rises() { s2=$(step); [ -n "$s1" ] && [ -n "$s2" ] && [ "$s2" -gt "$s1" ]; }
check "dtrain_global_step rises between scrapes" wait_for 20 rises
echo "     (worker 0's global step: $s1, then $s2)"
# Each figure is asked for until it is right (at most 20 s): a scrape that times out on a loaded
# machine leaves a gap, and the run (1200 steps of >= 40 ms over 2 workers) outlasts the checks.
want() { local name=$1 expr=$2 pyexpr=$3 expect=$4; got=""
  eq() { got=$(q "$expr" "$pyexpr"); [ "$got" = "$expect" ]; }
  wait_for 20 eq; check "$name (got '$got')" test "$got" = "$expect"
}
want "both workers' local steps increase (over 10 s)" 'increase(dtrain_local_steps_total[10s])' \
  'len([r for r in d["data"]["result"] if float(r["value"][1]) > 0])' 2
want "the ps counts 2 live workers" dtrain_ps_live_workers 'd["data"]["result"][0]["value"][1]' 2
want "both workers report push/pull latency histograms" dtrain_push_pull_seconds_count \
  'len([r for r in d["data"]["result"] if float(r["value"][1]) > 0])' 2
want "the ps reports the bytes it sent" 'dtrain_sent_bytes_total{job="ps"}' \
  'float(d["data"]["result"][0]["value"][1]) > 1e5' True
want "only the chief reports validation accuracy" dtrain_validation_accuracy 'len(d["data"]["result"])' 1

wait "$launch_pid"; rc=$?
check "the cluster finished (rc $rc)" test "$rc" -eq 0
[ "$rc" -eq 0 ] || tail -20 launch.log
summary

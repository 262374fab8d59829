#!/usr/bin/env bash
# The chief's status page in a real browser: a cluster (1 ps, 2 workers) launched with metrics,
# headless Chromium loads http://127.0.0.1:<chief's metrics port>/ while it trains, runs the page's
# script, and the DOM it leaves must show the global step (between the chief's step just before
# and just after the load), 2 workers of 2 alive, 1 ps, and a training curve with points; a
# screenshot at a phone's width is saved. Also: unknown paths are 404, other methods 405, and a
# metrics port in use stops `dtrain train` at start with a message naming it. Then a cluster
# started by hand (asynchronous, so the others train on) loses a worker to SIGKILL: the chief's
# page shows it lost within a few seconds, the other one still training.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/metrics_lib.sh"
case "$bin" in /*) ;; *) bin="$PWD/$bin" ;; esac
cd "$tmp"
command -v chromium >/dev/null || { echo "chromium is not installed (deps/debian-packages.txt)"; exit 1; }

tiny_setup

# Paced so that the page is loaded while training runs (about 20 s in all, longer under ASan).
base=$(free_ports 3) || { bad "three free ports"; summary; exit; }
chief=$((base + 1))
timeout --foreground 120 "$bin" launch --ps 1 --workers 2 --model tiny.model --data data --batch_size 16 --train_steps 800 \
  --steps_to_validate 40 --threads 1 --logdir= --summary_dir= --debug_step_delay_ms 40 --metrics_port "$base" \
  >launch.log 2>&1 &
launch_pid=$!
url=http://127.0.0.1:$chief
step_over() { s=$(json_get "$url/status.json" 'd["training"]["global_step"]'); [ -n "$s" ] && [ "$s" -ge "$1" ]; }
peers_seen() { [ "$(json_get "$url/status.json" 'sum(w["state"] == "training" for w in d["cluster"]["workers"])')" = 2 ]; }
check "the chief's status.json shows training under way" wait_for 60 step_over 60
check "the chief sees both workers training (their /status.json, polled)" wait_for 20 peers_seen

code() { curl -s -o /dev/null -w '%{http_code}' "$@"; }
check "unknown path: 404" test "$(code "$url/params")" = 404
check "POST: 405" test "$(code -X POST "$url/metrics")" = 405
check "the page is served as HTML" sh -c "curl -s '$url/' | grep -q '<svg id=\"chart-loss\"'"

before=$(json_get "$url/status.json" 'd["training"]["global_step"]')
chrome() { HOME=$tmp timeout --foreground 60 chromium --headless --no-sandbox --disable-gpu --user-data-dir="$tmp/chrome" \
  --virtual-time-budget=4000 "$@" 2>>chrome.err; }
chrome --dump-dom "$url/" >dom.html
after=$(json_get "$url/status.json" 'd["training"]["global_step"]')
chrome --window-size=412,900 --screenshot="$tmp/page.png" "$url/" >/dev/null
python3_dom() {
  /usr/bin/python3 - "$@" <<'PY'
import re, sys
dom = open("dom.html").read()
def text(i):
    m = re.search(r'id="%s"[^>]*>([^<]*)<' % i, dom)
    return m.group(1) if m else ""
step, before, after = text("step"), int(sys.argv[1]), int(sys.argv[2])
pts = [int(n) for n in re.findall(r'class="curve train"[^>]*data-points="(\d+)"', dom) +
       re.findall(r'data-points="(\d+)"[^>]*class="curve train"', dom)]
rows = re.findall(r'<tr data-job="(\w+)" data-state="(\w+)"', dom)
print("step %s in [%d, %d]; workers %s of %s alive, %s ps; train curve points %s; rows %s" %
      (step, before, after, text("workers-alive"), text("workers-total"), text("ps-total"), pts, rows))
ok = (step.isdigit() and before <= int(step) <= after and text("workers-alive") == "2" and
      text("workers-total") == "2" and text("ps-total") == "1" and pts and max(pts) >= 2 and
      rows.count(("worker", "training")) == 2 and ("ps", "serving") in rows)
sys.exit(0 if ok else 1)
PY
}
if [ -n "$before" ] && [ -n "$after" ] && out=$(python3_dom "$before" "$after"); then ok "the page in Chromium: $out"
else bad "the page in Chromium: ${out:-no figures} (before $before, after $after)"; head -c 3000 dom.html; tail -5 chrome.err; fi
size=$(stat -c %s page.png 2>/dev/null || echo 0)
check "a screenshot at a phone's width ($size bytes)" test "$size" -gt 10000
[ -n "${DTRAIN_KEEP_SCREENSHOT:-}" ] && cp page.png "$DTRAIN_KEEP_SCREENSHOT"

# A metrics port in use is an error at start, naming the port.
out=$(timeout --foreground 60 "$bin" train --model tiny.model --data data --train_steps 5 --logdir= --summary_dir= \
  --metrics_port "$chief" 2>&1); rc=$?
check "a metrics port in use stops dtrain train at start (rc $rc)" test "$rc" -ne 0
check "... with a message naming it" grep -q "port $chief: Address already in use" <<<"$out"
[ "$rc" -ne 0 ] || echo "$out" | tail -3

wait "$launch_pid"; rc=$?
check "the cluster finished (rc $rc)" test "$rc" -eq 0
[ "$rc" -eq 0 ] || tail -20 launch.log

# A worker lost: processes started one by one (launch would stop them all when one dies).
mbase=$(free_ports 3) || { bad "three free ports"; summary; exit; }
hosts=(--ps_hosts "127.0.0.1:$(free_port)" --worker_hosts "127.0.0.1:$(free_port),127.0.0.1:$(free_port)")
run_task() { # JOB INDEX METRICS_PORT [flags]
  local job=$1 idx=$2 port=$3; shift 3
  timeout --foreground 120 "$bin" train --model tiny.model --data "$tmp/data" --batch_size 16 --train_steps 3000 --threads 1 \
    --logdir= --summary_dir= --steps_to_validate 1000 --debug_step_delay_ms 40 "${hosts[@]}" --job_name "$job" \
    --task_index "$idx" --metrics_port "$port" "$@" >"$job$idx.log" 2>&1 &
}
run_task ps 0 "$mbase"
run_task worker 0 $((mbase + 1)) --metrics_peers "127.0.0.1:$mbase,127.0.0.1:$((mbase + 2))"
run_task worker 1 $((mbase + 2))
w1=$!
url=http://127.0.0.1:$((mbase + 1))
states() { json_get "$url/status.json" '",".join(w["state"] for w in d["cluster"]["workers"])'; }
both() { [ "$(states)" = training,training ]; }
lost() { [ "$(states)" = training,lost ]; }
check "a cluster started by hand: the chief sees both workers training" wait_for 60 both
kill -KILL $(pgrep -P "$w1") "$w1" # the training process under timeout, then timeout
t0=$SECONDS
check "worker 1 killed: the chief's page shows it lost, worker 0 training" wait_for 20 lost
echo "     (after $((SECONDS - t0)) s)"
summary

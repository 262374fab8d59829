# Sourced by the shell tests (tests/test_*.sh): the binary under test, a scratch folder removed at
# exit together with every process still running from it (their command lines name it), and the
# pass/fail counting every test prints ("N passed, M failed"; the exit status is 0 only with no
# failure). A test that starts processes whose command lines do not name $tmp kills them itself.
set -u
bin=${DTRAIN_BIN:-build/dtrain}
tmp=$(mktemp -d)
pass=0 fail=0
lib_cleanup() { pkill -KILL -f "$tmp/" 2>/dev/null; rm -rf "$tmp"; }
trap lib_cleanup EXIT
# Tests bound a command with `timeout --foreground`, never plain `timeout`: plain timeout follows
# each signal it passes on (ours, or its own at the limit) with a SIGCONT to the command's process
# group. In the sanitizer build an exiting process runs LeakSanitizer, which ptrace-attaches its
# threads and waits for the SIGSTOP each attach sends; a SIGCONT landing then cancels that SIGSTOP
# and the check waits forever (a ps stopped by test_worker_logs hung to ctest's 600 s limit; once
# in 42 runs under load). --foreground passes the signal to the command alone, and nothing else.
# Not a shell function: `f &` runs f in a subshell, and a signal to $! would reach that subshell.
# The test (and a file that sources this one, such as faults.sh) is checked for plain timeout here.
lib_checked=("$0")
[ "${BASH_SOURCE[1]:-$0}" = "$0" ] || lib_checked+=("${BASH_SOURCE[1]}")
plain_timeout=$(grep -nHE '(^|[[:space:](])timeout +(-k |[0-9])' "${lib_checked[@]}" | grep -v '^[^:]*:[0-9]*:[[:space:]]*#')
if [ -n "$plain_timeout" ]; then
  echo "FAIL plain timeout (use timeout --foreground; tests/lib.sh says why): $plain_timeout"
  exit 1
fi
ok() { pass=$((pass + 1)); echo "ok   $1"; }
bad() { fail=$((fail + 1)); echo "FAIL $1"; }
check() { local name=$1; shift; if "$@"; then ok "$name"; else bad "$name"; fi; }
summary() { echo "$pass passed, $fail failed"; [ "$fail" -eq 0 ]; }
# expect_error NAME STATUS PATTERN CMD...: exit status STATUS and exactly one stderr line, matching
# PATTERN (the CLI's contract for bad input); stdout and stderr are left in $tmp/out and $tmp/err.
expect_error() {
  local name=$1 want=$2 pat=$3; shift 3
  "$@" >"$tmp/out" 2>"$tmp/err"; local st=$?
  local lines; lines=$(wc -l <"$tmp/err")
  if [ "$st" -eq "$want" ] && [ "$lines" -eq 1 ] && grep -qE -- "$pat" "$tmp/err"; then ok "$name"
  else bad "$name (status $st, want $want; $lines stderr lines: $(head -c 400 "$tmp/err"))"; fi
}

# fashion_subset DIR NTRAIN NTEST: the first NTRAIN training and NTEST test images of Fashion-MNIST
# ($FASHION, default the Debian package's folder) as uncompressed IDX files in DIR (created), so a
# test trains in seconds, sanitizers included.
fashion_subset() {
  local dir=$1 src=${FASHION:-/usr/share/datasets/fashion-mnist} prefix n
  mkdir -p "$dir" || return 1
  u32() { printf "\\x$(printf %02x $(($1 >> 24 & 255)))\\x$(printf %02x $(($1 >> 16 & 255)))\\x$(printf %02x $(($1 >> 8 & 255)))\\x$(printf %02x $(($1 & 255)))"; }
  for prefix in train t10k; do
    [ "$prefix" = train ] && n=$2 || n=$3
    { printf '\x00\x00\x08\x03'; u32 "$n"; u32 28; u32 28
      gzip -dc "$src/$prefix-images-idx3-ubyte.gz" | tail -c +17 | head -c $((n * 784)); } >"$dir/$prefix-images-idx3-ubyte"
    { printf '\x00\x00\x08\x01'; u32 "$n"
      gzip -dc "$src/$prefix-labels-idx1-ubyte.gz" | tail -c +9 | head -c "$n"; } >"$dir/$prefix-labels-idx1-ubyte"
  done
}

# free_port [N]: N (default 1) different TCP ports on 127.0.0.1 that nobody listens on right now
# (the kernel's picks, held together so they differ, closed again at once), space-separated, so
# parallel tests do not collide on a random guess:  ports=($(free_port 3))
free_port() {
  if [ ! -x /usr/bin/python3 ]; then # a machine without python3 (scripts/gpu-check's): random ports nobody answers on
    local out=() p
    while [ ${#out[@]} -lt "${1:-1}" ]; do
      p=$((20000 + RANDOM % 40000))
      (: </dev/tcp/127.0.0.1/$p) 2>/dev/null || [[ " ${out[*]} " == *" $p "* ]] || out+=("$p")
    done
    echo "${out[*]}"
    return
  fi
  /usr/bin/python3 -c 'import socket, sys
socks = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in socks: s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))' "${1:-1}"
}

# gpu_skip_unless_ran STATUS LOG: in the GPU tests (tests/test_gpu_*.sh), exit 77 (ctest: skipped) when
# a --device cuda run failed because there is no usable GPU here, printing the reason from LOG;
# any other failure is the test's to report.
gpu_skip_unless_ran() {
  if [ "$1" -ne 0 ] && grep -qE "built without CUDA|no usable CUDA device|no such CUDA device|cannot load cuBLAS|sm_90 and newer" "$2"; then
    echo "skipped: $(tail -n 1 "$2")"
    exit 77
  fi
}

# A sync cluster (1 ps, 2 workers, the fashion model on $tmp/data) paced at 65 ms a step, for the
# tests that attack its ps meanwhile (test_hostile_peers, test_hostile_round2_slow). Sets port (the
# ps's), ps, chief and w (pids); returns once the chief has initialised the ps. ps_rss prints the
# ps's resident KiB (0 once it is gone).
hostile_cluster() {
  local steps=$1 ports
  ports=($(free_port 3)); port=${ports[0]}
  local h=(--ps_hosts=127.0.0.1:$port --worker_hosts=127.0.0.1:${ports[1]},127.0.0.1:${ports[2]})
  local a=(--model models/fashion.model --data "$tmp/data" --logdir= --summary_dir= --threads 1 --issync=1
           --train_steps "$steps" --steps_to_validate 100000 --debug_step_delay_ms 65)
  # Under AddressSanitizer the ps's freed memory waits in a quarantine (256 MB by default) and
  # counts in its RSS: a small one keeps the measure about the ps, not the sanitizer.
  ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}quarantine_size_mb=8" \
    "$bin" train "${a[@]}" "${h[@]}" --job_name=ps >"$tmp/ps" 2>&1 &
  ps=$!
  "$bin" train "${a[@]}" "${h[@]}" --job_name=worker --task_index=0 >"$tmp/c" 2>&1 &
  chief=$!
  "$bin" train "${a[@]}" "${h[@]}" --job_name=worker --task_index=1 >"$tmp/w" 2>&1 &
  w=$!
  for _ in $(seq 1 600); do grep -q "initialised by the chief" "$tmp/ps" && break; sleep 0.1; done
}
ps_rss() { awk '/^VmRSS:/ {print $2}' "/proc/$ps/status" 2>/dev/null || echo 0; }

# The end of hostile_cluster's run: every process exits 0 (within 3 minutes) and the chief's test
# accuracy is at least 0.70.
hostile_cluster_finish() {
  for _ in $(seq 1 1800); do kill -0 $chief 2>/dev/null || kill -0 $w 2>/dev/null || kill -0 $ps 2>/dev/null || break; sleep 0.1; done
  wait $chief; local cst=$?
  wait $w; local wst=$?
  wait $ps; local pst=$?
  [ $cst -eq 0 ] && [ $wst -eq 0 ] && [ $pst -eq 0 ] && ok "the cluster finishes, every process exits 0" \
    || bad "the cluster finishes (chief $cst, worker $wst, ps $pst): $(tail -3 "$tmp/c") / $(tail -2 "$tmp/w") / $(tail -2 "$tmp/ps")"
  local acc
  acc=$(sed -n 's/^test accuracy \([0-9.]*\).*/\1/p' "$tmp/c")
  echo "test accuracy ${acc:-none}"
  awk -v a="${acc:-0}" 'BEGIN { exit !(a >= 0.70) }' && ok "test accuracy ${acc} >= 0.70 despite the attacks" \
    || bad "test accuracy ${acc:-none} >= 0.70: $(tail -5 "$tmp/c")"
}

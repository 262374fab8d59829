# Sourced by the metrics tests (after lib.sh): a launched cluster with metrics, and its figures.

# tiny_setup: in the current folder, data/ (1024 + 64 Fashion-MNIST images) and tiny.model, a
# network that trains in seconds even under ASan.
tiny_setup() {
  fashion_subset data 1024 64
  printf 'model tiny\ninput 28 28 1\nconv2d filters=4 kernel=3 stride=2 padding=same\nrelu\nflatten\ndense units=10\n' >tiny.model
}

# free_ports N: a base port such that base..base+N-1 are all free on 127.0.0.1 right now (dtrain
# launch gives process i the metrics port base + i).
free_ports() {
  /usr/bin/python3 - "$1" <<'PY'
import socket, sys
n = int(sys.argv[1])
for _ in range(200):
    s = socket.socket(); s.bind(("127.0.0.1", 0)); base = s.getsockname()[1]; s.close()
    if base + n > 65535: continue
    try:
        held = []
        for p in range(base, base + n):
            t = socket.socket(); t.bind(("127.0.0.1", p)); held.append(t)
        for t in held: t.close()
        print(base); sys.exit(0)
    except OSError:
        for t in held: t.close()
sys.exit(1)
PY
}

# json_get URL PYEXPR: evaluates PYEXPR on the JSON at URL (as `d`); prints "" when it cannot.
json_get() {
  /usr/bin/python3 - "$1" "$2" <<'PY' 2>/dev/null
import json, sys, urllib.request
try:
    d = json.load(urllib.request.urlopen(sys.argv[1], timeout=2))
    print(eval(sys.argv[2]))
except Exception:
    print("")
PY
}

# wait_for SECONDS CMD...: runs CMD every 0.2 s until it succeeds (0) or SECONDS pass (1).
wait_for() {
  local end=$((SECONDS + $1)); shift
  while [ $SECONDS -lt $end ]; do "$@" && return 0; sleep 0.2; done
  return 1
}

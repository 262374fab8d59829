#!/usr/bin/env bash
# --compression end to end (processes on 127.0.0.1), on a slice of Fashion-MNIST so that it stays
# quick under the sanitizers: 1 ps and 2 sync workers train a tiny model for one epoch with float32,
# bf16 and fp16 on the wire, same seed; the 16-bit runs must reach the float32 run's test accuracy
# within 2 points (10 of the 500 test images; measured: equal) and end within 2% of its parameters
# (relative norm of the difference). A cluster whose workers differ (worker 0 bf16, worker 1
# float32, started by hand) trains as well. A bad value is refused naming the flag.
. "$(dirname "$0")/lib.sh"
case "$bin" in /*) ;; *) bin="$PWD/$bin" ;; esac
cd "$tmp"

fashion_subset data 2048 500
printf 'model tiny\ninput 28 28 1\nconv2d filters=4 kernel=3 stride=2 padding=same\nrelu\nflatten\ndense units=10\n' >tiny.model
# every path names $tmp, so lib.sh's cleanup finds any process left running
common=(--model "$tmp/tiny.model" --data "$tmp/data" --logdir= --summary_dir= --threads 1 --issync=1 --batch_size 16
        --seed 3 --steps_to_validate 1000)

acc() { sed -n 's/.*test accuracy \([0-9.]*\).*/\1/p' "$1" | tail -1; }
near() { awk -v a="$1" -v b="$2" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a != "" && b != "" && d <= 0.02) }'; }
# the norm of the difference of two raw float32 files relative to the first's
reldiff() {
  /usr/bin/python3 - "$1" "$2" <<'PY'
import sys
import numpy as np
a, b = (np.fromfile(f, np.float32).astype(np.float64) for f in sys.argv[1:3])
print("sizes" if a.shape != b.shape or a.size == 0 else "%.3g" % (np.linalg.norm(a - b) / np.linalg.norm(a)))
PY
}

for c in none bf16 fp16; do
  timeout --foreground 300 "$bin" launch --ps 1 --workers 2 "${common[@]}" --compression $c --debug_dump_params "$tmp/$c.bin" \
    >"$c.log" 2>&1 && ok "sync, 2 workers, --compression $c: exit 0" || { bad "--compression $c: exit $?"; tail -5 "$c.log"; }
done
a32=$(acc none.log)
for c in bf16 fp16; do
  a=$(acc $c.log) d=$(reldiff none.bin $c.bin)
  near "$a" "$a32" && ok "$c: test accuracy $a, float32 $a32 (within 0.02)" || bad "$c: test accuracy '$a', float32 '$a32'"
  awk -v d="$d" 'BEGIN { exit !(d + 0 == d && d <= 0.02) }' && ok "$c: parameters within $d of float32's (<= 0.02)" \
    || bad "$c: parameters differ from float32's by $d"
done

# One cluster, two encodings: worker 0 (the chief) sends bf16, worker 1 float32.
ports=($(free_port 3)); port=${ports[0]}
h=(--ps_hosts=127.0.0.1:$port --worker_hosts=127.0.0.1:${ports[1]},127.0.0.1:${ports[2]})
timeout --foreground 300 "$bin" train "${common[@]}" "${h[@]}" --job_name=ps >mixed_ps.log 2>&1 &
ps=$!
timeout --foreground 300 "$bin" train "${common[@]}" "${h[@]}" --job_name=worker --task_index=1 >mixed_w1.log 2>&1 &
w1=$!
timeout --foreground 300 "$bin" train "${common[@]}" "${h[@]}" --job_name=worker --task_index=0 --compression bf16 \
  --debug_dump_params "$tmp/mixed.bin" >mixed_w0.log 2>&1
st0=$?
wait $w1; st1=$?
wait $ps; stp=$?
a=$(acc mixed_w0.log)
[ $st0 -eq 0 ] && [ $st1 -eq 0 ] && [ $stp -eq 0 ] && ok "a bf16 worker and a float32 worker share a cluster: every process exits 0" \
  || { bad "mixed cluster: chief $st0, worker 1 $st1, ps $stp"; tail -3 mixed_w0.log mixed_w1.log mixed_ps.log; }
near "$a" "$a32" && ok "mixed cluster: test accuracy $a, float32 $a32 (within 0.02)" || bad "mixed cluster: test accuracy '$a', float32 '$a32'"

# A bad value: one line naming the flag, status 1.
"$bin" train "${common[@]}" --compression fp8 >bad.out 2>bad.err
st=$?
[ $st -eq 1 ] && grep -q -- "--compression: expected none, bf16 or fp16, got 'fp8'" bad.err && [ "$(wc -l <bad.err)" -eq 1 ] \
  && ok "--compression fp8 is refused naming the flag" || bad "--compression fp8: status $st, $(cat bad.err)"

summary

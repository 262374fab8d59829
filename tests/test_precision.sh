#!/usr/bin/env bash
# --precision end to end, on a slice of Fashion-MNIST and a tiny model with an im2col layer, a Winograd
# layer and a dense layer (seconds, sanitizers included):
#   - a bad name is refused naming the option, and so is bf16 on a CPU without AVX512_BF16
#     (DTRAIN_CPU_NO_BF16=1 pretends), in one line naming the instruction set, where a ps task,
#     which computes nothing, accepts it;
#   - bf16 trains differently from float32 (its products are bf16), to parameters within 2%;
#   - a bf16 run stopped at step 6 and resumed equals the uninterrupted bf16 run bit for bit (its
#     checkpoint holds all it needs), a bf16 checkpoint and a float32 one hold the same tensors, and
#     each resumes in the other precision;
#   - dtrain launch passes --precision on: a sync cluster of one bf16 worker equals the one bf16
#     process bit for bit, as in float32.
. "$(dirname "$0")/lib.sh"
case "$bin" in /*) ;; *) bin="$PWD/$bin" ;; esac
cd "$tmp"

fashion_subset data 512 100
cat >tiny.model <<'EOF'
model tiny
input 28 28 1
conv2d filters=8 kernel=3 stride=2 padding=same
relu
conv2d filters=8 kernel=3 padding=same
relu
flatten
dense units=10
EOF
common=(--model "$tmp/tiny.model" --data "$tmp/data" --summary_dir= --threads 1 --batch_size 16 --seed 3
        --steps_to_validate 1000)

expect_error "a bad --precision names the option" 1 "precision: expected float32 or bf16, got 'fp8'$" \
  "$bin" train "${common[@]}" --logdir= --train_steps 2 --precision fp8
DTRAIN_CPU_NO_BF16=1 expect_error "bf16 without AVX512_BF16: one line naming it" 1 \
  "precision bf16: this CPU lacks AVX512_BF16 \(the vdpbf16ps instruction\); use precision float32$" \
  "$bin" train "${common[@]}" --logdir= --train_steps 2 --precision bf16
if ! grep -qw avx512_bf16 /proc/cpuinfo; then
  ok "skipped the bf16 runs: this CPU lacks AVX512_BF16"
  summary
  exit
fi

run() { # LOG ARGS...: a run that must succeed
  local log=$1; shift
  timeout --foreground 300 "$@" >"$log" 2>&1 || { bad "$log: status $?"; tail -n 5 "$log"; }
}
reldiff() { # the norm of the difference of two raw float32 files relative to the first's
  /usr/bin/python3 - "$1" "$2" <<'PY'
import sys
import numpy as np
a, b = (np.fromfile(f, np.float32).astype(np.float64) for f in sys.argv[1:3])
print("sizes" if a.shape != b.shape or a.size == 0 else "%.3g" % (np.linalg.norm(a - b) / np.linalg.norm(a)))
PY
}
tensors() { # the checkpoint's tensors: name, dtype and shape, one a line
  /usr/bin/python3 - "$1" <<'PY'
import json, struct, sys
b = open(sys.argv[1], "rb").read()
h = json.loads(b[8:8 + struct.unpack("<Q", b[:8])[0]])
for k in sorted(h):
    if k != "__metadata__":
        print(k, h[k]["dtype"], h[k]["shape"])
PY
}

run f32.log "$bin" train "${common[@]}" --logdir f32 --train_steps 12 --debug_dump_params f32.bin
run bf16.log "$bin" train "${common[@]}" --logdir bf16 --train_steps 12 --precision bf16 --debug_dump_params bf16.bin
check "the bf16 run says so" grep -q "threads, precision bf16 (bf16 products, float32 accumulation and parameters)" bf16.log
check "the float32 run does not" test "$(grep -c "precision bf16" f32.log)" = 0
d=$(reldiff f32.bin bf16.bin)
awk -v d="$d" 'BEGIN { exit !(d + 0 == d && d > 0 && d <= 0.02) }' && ok "bf16 parameters differ from float32's by $d (0 < d <= 0.02)" \
  || bad "bf16 parameters against float32's: $d"

# Stopped at 6 and resumed: the same bits as the run that never stopped.
run half.log "$bin" train "${common[@]}" --logdir half --train_steps 6 --precision bf16
run resumed.log "$bin" train "${common[@]}" --logdir half --train_steps 12 --precision bf16 --debug_dump_params resumed.bin
check "bf16 resumed at step 6" grep -q "restored half/model.ckpt-6.safetensors: global step 6" resumed.log
check "bf16 stopped at 6 and resumed = the uninterrupted bf16 run, bit for bit" cmp -s bf16.bin resumed.bin

# The checkpoints of both precisions hold the same tensors, in float32, and each resumes in the other.
check "a bf16 checkpoint holds the float32 one's tensors (names, types, shapes)" \
  test "$(tensors bf16/model.ckpt-12.safetensors)" = "$(tensors f32/model.ckpt-12.safetensors)"
check "... F32 all but the step" test "$(tensors bf16/model.ckpt-12.safetensors | grep -v '^global_step I64 ' | grep -vc ' F32 ')" = 0
mkdir to32 to16
cp half/model.ckpt-6.safetensors to32/
cp f32/model.ckpt-12.safetensors to16/
run to32.log "$bin" train "${common[@]}" --logdir to32 --train_steps 12
run to16.log "$bin" train "${common[@]}" --logdir to16 --train_steps 18 --precision bf16
check "float32 resumes a bf16 checkpoint (step 6 to 12)" grep -q "restored to32/model.ckpt-6.safetensors: global step 6" to32.log
check "... and saves step 12" test -s to32/model.ckpt-12.safetensors
check "bf16 resumes a float32 checkpoint (step 12 to 18)" grep -q "restored to16/model.ckpt-12.safetensors: global step 12" to16.log
check "... and saves step 18" test -s to16/model.ckpt-18.safetensors

# dtrain launch passes it on: 1 ps + 1 sync worker in bf16 = the one bf16 process.
run launch.log "$bin" launch --ps 1 --workers 1 --issync 1 "${common[@]}" --logdir= --train_steps 12 --precision bf16 \
  --debug_dump_params launch.bin
check "launch: a sync cluster of one bf16 worker = one bf16 process, bit for bit" cmp -s bf16.bin launch.bin
# A ps task computes nothing: it takes the flag without looking at its CPU; the worker refuses.
DTRAIN_CPU_NO_BF16=1 timeout --foreground 120 "$bin" launch --ps 1 --workers 1 --issync 1 "${common[@]}" --logdir= \
  --train_steps 2 --precision bf16 >nobf16.log 2>&1
st=$?
check "launch without AVX512_BF16 fails (status $st)" test "$st" -ne 0 -a "$st" -ne 124
check "... the worker naming it" grep -q "worker0.*this CPU lacks AVX512_BF16" nobf16.log
check "... the ps not" test "$(grep -c "ps0.*AVX512_BF16" nobf16.log)" = 0
summary

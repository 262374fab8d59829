#!/usr/bin/env bash
# Graph models through the CLI: a graph mistake is one line naming FILE:LINE and a non-zero exit;
# a small residual network with batch norm (models/resnet.model's block, cheap enough for the
# sanitizer build; resnet.model itself is checked against PyTorch in test_fixtures) trains a few
# steps on a Fashion-MNIST subset, its checkpoint (moving statistics included) restores in 'dtrain
# eval' with the accuracy training reported; and the same in a sync cluster, whose ps tasks keep
# the moving statistics.
. "$(dirname "$0")/lib.sh"
fashion_subset "$tmp/data" 256 200 || { bad "subset"; summary; exit 1; }

printf 'input 8 8 1\nconv2d name=a filters=2 kernel=3\nrelu input=b\nflatten\ndense units=2\n' >"$tmp/bad.model"
cat >"$tmp/small.model" <<'EOF'
input 28 28 1
conv2d filters=8 kernel=3 stride=2 padding=same use_bias=false
batchnorm
relu name=r1
conv2d filters=8 kernel=3 padding=same use_bias=false
batchnorm
add input=bn2,r1
relu
global_avgpool
dense units=10
EOF
# dtrain inspect prints the net's plans: in training the norms' ReLUs fused in and the last norm
# applied by the sum; in evaluation the norms folded into their convolutions.
"$bin" inspect "$tmp/small.model" >"$tmp/plan" 2>&1
check "inspect prints the model" grep -q "small.model: model small, input 28x28x1, 9 layers, 802 parameters" "$tmp/plan"
check "inspect prints the training plan" grep -q '^training plan: 7 steps for 9 layers (2 fused)$' "$tmp/plan"
check "training: a norm and its ReLU in one step" grep -qE '^ +2  batchnorm\+relu +bn1, r1$' "$tmp/plan"
check "training: the sum applies the last norm" grep -qE '^ +4  batchnorm \(statistics\) +bn2 \(applied by add1\)$' "$tmp/plan"
check "training: ... and its ReLU" grep -qE '^ +5  batchnorm\+add\+relu +add1, relu2 \(applies bn2\)$' "$tmp/plan"
check "inspect prints the evaluation plan" grep -q '^evaluation plan: 6 steps for 9 layers (3 fused)$' "$tmp/plan"
check "evaluation: the norms folded" grep -qE '^ +3  conv2d\+batchnorm +conv2, bn2 \(folded\)$' "$tmp/plan"
"$bin" inspect "$tmp/bad.model" >"$tmp/out" 2>"$tmp/err"
check "inspect: a bad model is one line naming it (status 1)" test $? -eq 1 -a "$(wc -l <"$tmp/err")" -eq 1

"$bin" train --model "$tmp/bad.model" --data "$tmp/data" --logdir= --summary_dir= >"$tmp/out" 2>"$tmp/err"
st=$?
check "graph error: non-zero exit" test "$st" -ne 0
check "graph error: one line" test "$(wc -l <"$tmp/err")" -eq 1
check "graph error names the line" grep -q "bad.model:3: input 'b' names no layer" "$tmp/err"

"$bin" train --model "$tmp/small.model" --data "$tmp/data" --logdir="$tmp/ck" --summary_dir= --batch_size 16 \
  --train_steps 12 --steps_to_validate 6 --threads 1 >"$tmp/train" 2>&1
check "small resnet trains" test $? -eq 0
train_acc=$(sed -n 's/^test accuracy \([0-9.]*\).*/\1/p' "$tmp/train")
"$bin" eval --logdir "$tmp/ck" --data "$tmp/data" --threads 1 >"$tmp/eval" 2>&1
check "its checkpoint evaluates" test $? -eq 0
eval_acc=$(sed -n 's/^test accuracy \([0-9.]*\).*/\1/p' "$tmp/eval")
check "eval's accuracy '$eval_acc' is training's '$train_acc'" test -n "$eval_acc" -a "$eval_acc" = "$train_acc"

# 1 ps + 2 sync workers: the ps tasks hold the moving statistics and take the workers' mean change
# (docs/batchnorm.md): the checkpoint's are no longer the initial 0 and 1, and the checkpoint
# evaluates to the accuracy the chief reported.
if timeout --foreground 300 "$bin" launch --ps 1 --workers 2 --issync 1 --model "$tmp/small.model" --data "$tmp/data" \
     --logdir="$tmp/ck2" --summary_dir= --batch_size 16 --train_steps 6 --steps_to_validate 6 --threads 1 \
     >"$tmp/cluster" 2>&1; then
  ok "cluster: small resnet trains"
else
  bad "cluster: small resnet trains (status $?)"; tail -20 "$tmp/cluster"
fi
ckpt=$(ls -t "$tmp"/ck2/*.safetensors 2>/dev/null | head -1)
/usr/bin/python3 - "$ckpt" >"$tmp/moving" 2>&1 <<'PY'
import json, struct, sys
b = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
def get(name):
    t = h[name]
    lo, hi = t["data_offsets"]
    return struct.unpack("<%df" % ((hi - lo) // 4), b[8 + n + lo:8 + n + hi])
m, v = get("bn1/moving_mean"), get("bn1/moving_variance")
print("moved" if any(x != 0 for x in m) and any(x != 1 for x in v) and all(x > 0 for x in v) else "unchanged", m[:3], v[:3])
PY
check "cluster: the checkpoint's moving statistics moved ($(head -c 200 "$tmp/moving"))" grep -q '^moved' "$tmp/moving"
chief_acc=$(sed -n 's/^\[worker0\] test accuracy \([0-9.]*\).*/\1/p' "$tmp/cluster")
"$bin" eval --logdir "$tmp/ck2" --data "$tmp/data" --threads 1 >"$tmp/eval2" 2>&1
eval_acc=$(sed -n 's/^test accuracy \([0-9.]*\).*/\1/p' "$tmp/eval2")
check "cluster: eval's accuracy '$eval_acc' is the chief's '$chief_acc'" test -n "$eval_acc" -a "$eval_acc" = "$chief_acc"

# Batch norm's moving statistics travel with the streamed exchange too: a sync cluster gives the same
# parameters, bit for bit, with --overlap none and with the default overlap.
for ov in none priority; do
  timeout --foreground 300 "$bin" launch --ps 1 --workers 2 --issync 1 --model "$tmp/small.model" --data "$tmp/data" \
    --logdir= --summary_dir= --batch_size 16 --train_steps 6 --steps_to_validate 6 --threads 1 --overlap "$ov" \
    --debug_dump_params "$tmp/params.$ov" >"$tmp/cluster.$ov" 2>&1 || { bad "cluster with --overlap $ov"; tail -5 "$tmp/cluster.$ov"; }
done
check "cluster: batch norm, overlap on and off give the same parameters" cmp -s "$tmp/params.none" "$tmp/params.priority"
summary

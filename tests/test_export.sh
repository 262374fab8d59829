#!/usr/bin/env bash
# dtrain export --format onnx (docs/export.md). The shipped models (fashion, catdog, resnet) and one
# with every layer kind (tests/onnx/every_layer.model), each trained a few steps, are exported and
# run in two real ONNX runtimes, onnxruntime (the onnxruntime-node package, tests/onnx/run_ort.js)
# and OpenCV's dnn module (Debian's python3-opencv), on the images dtrain predict is given: each
# runtime's logits within 1e-4 relative of dtrain predict --logits, the same arg-max, probabilities
# its softmax; onnx.checker (python3-onnx) passes with the inputs, outputs and metadata docs/export.md
# names. Other opsets, the file's size against the parameters', and bad input (one line each, no
# file left behind).
. "$(dirname "$0")/lib.sh"
helper=tests/onnx/check_export.py
ort=tests/onnx/run_ort.js
. tests/onnx/export_lib.sh
need_ort

# roundtrip NAME LOGDIR H W C IMAGES [EXPORT FLAGS...]: export, dtrain predict --logits on IMAGES, the
# checker, then both runtimes on the same input floats.
roundtrip() {
  local name=$1 ck=$2 h=$3 w=$4 c=$5 images=$6; shift 6
  local m="$tmp/$name.onnx" base="$tmp/$name"
  step "$name: export" "$bin" export --format onnx "$@" "$ck" "$m" || return
  cp "$tmp/step" "$base.export"
  step "$name: predict" "$bin" predict --logdir "$ck" --threads 2 --out "$base.csv" --logits "$base.logits.csv" "$images" || return
  step "$name: checker" "$py" "$helper" checker "$m"
  step "$name: inputs" "$py" "$helper" inputs "$base.logits.csv" "$h" "$w" "$c" "$base.in.f32" || return
  node "$ort" "$m" "$base.in.f32" "$base.ort.l" "$base.ort.p" --threads 2 >"$base.ort.log" 2>&1 \
    && step "$name: onnxruntime" "$py" "$helper" compare "$base.logits.csv" "$base.ort.l" "$base.ort.p" onnxruntime \
    || bad "$name: onnxruntime: $(tail -n2 "$base.ort.log")"
  "$py" "$helper" opencv "$m" "$base.in.f32" "$base.cv.l" "$base.cv.p" >"$base.cv.log" 2>&1 \
    && step "$name: OpenCV dnn" "$py" "$helper" compare "$base.logits.csv" "$base.cv.l" "$base.cv.p" OpenCV \
    || bad "$name: OpenCV dnn: $(tail -n2 "$base.cv.log")"
}

# train NAME MODEL DATA STEPS BATCH: a checkpoint in $tmp/NAME.ck after a few steps (batch norm's
# moving statistics move away from their initial 0 and 1 then).
train() {
  "$bin" train --model "$2" --data "$3" --logdir "$tmp/$1.ck" --summary_dir= --train_steps "$4" --batch_size "$5" \
    --steps_to_validate 1000 --validation_fraction 0.25 --threads 2 >"$tmp/$1.train" 2>&1 \
    || bad "$1: training: $(tail -n2 "$tmp/$1.train")"
}

fashion_subset "$tmp/fs" 256 64
idx="$tmp/fs/t10k-images-idx3-ubyte"
train fashion models/fashion.model "$tmp/fs" 4 32
roundtrip fashion "$tmp/fashion.ck" 28 28 1 "$idx"
train every tests/onnx/every_layer.model "$tmp/fs" 4 32
roundtrip every "$tmp/every.ck" 28 28 1 "$idx"
train resnet models/resnet.model "$tmp/fs" 2 16
roundtrip resnet "$tmp/resnet.ck" 28 28 1 "$idx"

# catdog: colour PNGs of the model's 128x128 (no resize: dtrain's decoding is then exactly pixel/255)
"$py" - "$tmp/cd" <<'PY'
import os, sys
import cv2, numpy as np
rng = np.random.default_rng(7)
for split, n in (("train", 8), ("test", 4)):
    for c, cls in enumerate(("cat", "dog")):
        os.makedirs(f"{sys.argv[1]}/{split}/{cls}", exist_ok=True)
        for i in range(n):
            img = rng.integers(0, 256, (128, 128, 3), dtype=np.uint8)
            img[..., 2 * c] //= 2   # cats less blue, dogs less red (BGR): something to learn
            cv2.imwrite(f"{sys.argv[1]}/{split}/{cls}/{cls}.{i}.png", img)
PY
train catdog models/catdog.model "$tmp/cd" 2 4
roundtrip catdog "$tmp/catdog.ck" 128 128 3 "$tmp/cd/test"

# Other opsets: 17 (the newest this python3-onnx checks), 21 (the newest written; onnxruntime only)
ck=$(ls "$tmp"/every.ck/model.ckpt-4.safetensors)
"$bin" export --opset 17 "$ck" "$tmp/o17.onnx" >/dev/null && step "opset 17: checker" "$py" "$helper" checker "$tmp/o17.onnx" 17
if "$bin" export --opset 21 "$ck" "$tmp/o21.onnx" >/dev/null \
  && node "$ort" "$tmp/o21.onnx" "$tmp/every.in.f32" "$tmp/o21.l" "$tmp/o21.p" >"$tmp/o21.log" 2>&1; then
  step "opset 21: onnxruntime" "$py" "$helper" compare "$tmp/every.logits.csv" "$tmp/o21.l" "$tmp/o21.p" onnxruntime
else bad "opset 21: $(tail -n2 "$tmp/o21.log")"; fi

# The file: the parameters (folded batch norms are 3 floats per channel fewer) plus a small graph.
for name in fashion every resnet catdog; do
  read -r bytes params < <(sed -n 's/.*: \([0-9]*\) bytes (\([0-9]*\) of parameters.*/\1 \2/p' "$tmp/$name.export" 2>/dev/null)
  check "$name: $bytes bytes for $params bytes of parameters (within 1% + 16 KiB)" \
    awk -v b="${bytes:-0}" -v p="${params:-1}" 'BEGIN { exit !(b > 0 && b <= p * 1.01 + 16384) }'
done

# ---- bad input: one line, non-zero, and no file (nor a temporary one) left at the output --------
mkdir -p "$tmp/dest" "$tmp/empty"
printf 'garbage' >"$tmp/bad.safetensors"
head -c 5000 "$ck" >"$tmp/truncated.safetensors"
# a checkpoint whose stored model text is not a model: its header rewritten, the data kept
"$py" - "$ck" "$tmp/badmodel.safetensors" <<'PY'
import json, struct, sys
raw = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
h = json.loads(raw[8:8 + n])
h["__metadata__"]["model"] = "input 28 28 1\nconv2d filters=0 kernel=3\n"
hb = json.dumps(h).encode()
hb += b" " * (-len(hb) % 8)
open(sys.argv[2], "wb").write(struct.pack("<Q", len(hb)) + hb + raw[8 + n:])
PY
o="$tmp/dest/x.onnx"
expect_error "garbage checkpoint" 1 "bad.safetensors: .*too short" "$bin" export "$tmp/bad.safetensors" "$o"
expect_error "truncated checkpoint" 1 "truncated.safetensors" "$bin" export "$tmp/truncated.safetensors" "$o"
expect_error "model text that does not parse" 1 "badmodel.safetensors \(model\):2: .*filters" \
  "$bin" export "$tmp/badmodel.safetensors" "$o"
expect_error "empty log folder" 1 "no checkpoint found" "$bin" export "$tmp/empty" "$o"
expect_error "missing checkpoint" 1 "nope: cannot open" "$bin" export "$tmp/nope" "$o"
expect_error "another model's checkpoint" 1 "checkpoint of another model" "$bin" export --model models/catdog.model "$ck" "$o"
expect_error "opset too old" 2 "--opset: 12 is out of range 13\.\.21" "$bin" export --opset 12 "$ck" "$o"
expect_error "unknown format" 2 "--format: 'tflite' is not onnx" "$bin" export --format tflite "$ck" "$o"
expect_error "one argument" 2 "expected CHECKPOINT_OR_LOGDIR and OUT.onnx, got 1 argument$" "$bin" export "$ck"
expect_error "output folder missing" 1 "nodir/x.onnx: cannot create" "$bin" export "$ck" "$tmp/nodir/x.onnx"
expect_error "output over the checkpoint" 1 "the output is the checkpoint being exported" "$bin" export "$ck" "$ck"
expect_error "output is a folder" 1 "dest: rename from .* failed: Is a directory" "$bin" export "$ck" "$tmp/dest"
check "nothing written at the output, no temporary file left" test -z "$(ls -A "$tmp/dest")"
check "the checkpoint is untouched" cmp -s "$ck" "$(ls "$tmp"/every.ck/model.ckpt-4.safetensors)"
summary

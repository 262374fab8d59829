# Sourced by tests/test_export*.sh after tests/lib.sh: what the export tests share (the runtimes'
# presence, one ok/FAIL line a step), and a click-log checkpoint through dtrain export and two ONNX
# runtimes against dtrain predict, line by line (docs/export.md, "Click-log models").
py=/usr/bin/python3
ctr_check=tests/onnx/check_ctr.py

# onnxruntime must be there: a missing runtime fails the test, it never skips it.
need_ort() {
  if ! node -e "require('./tests/onnx/node_modules/onnxruntime-node')" >"$tmp/ort_err" 2>&1; then
    bad "onnxruntime-node is not installed in tests/onnx/node_modules: run scripts/deps test (npm ci --ignore-scripts --prefix tests/onnx): $(head -c 300 "$tmp/ort_err")"
    summary
    exit 1
  fi
}

# step NAME CMD...: CMD's last output line goes into the ok/FAIL line; all its output is left in $tmp/step.
step() {
  local name=$1; shift
  local out; out=$("$@" 2>&1); local st=$?
  printf '%s\n' "$out" >"$tmp/step"
  if [ $st -eq 0 ]; then ok "$name: $(tail -n1 <<<"$out")"; else bad "$name: $(tail -n3 <<<"$out" | tr '\n' ' ')"; fi
  return $st
}

# ctr_train NAME MODEL DATA STEPS: a checkpoint in $tmp/NAME.ck.
ctr_train() {
  "$bin" train --model "$2" --data "$3" --logdir "$tmp/$1.ck" --summary_dir= --train_steps "$4" --batch_size 128 \
    --table_learning_rate 0.2 --steps_to_validate 100000 --threads 1 >"$tmp/$1.train" 2>&1 \
    || bad "$1: training: $(tail -n2 "$tmp/$1.train")"
}

# ctr_roundtrip NAME LINES [EXPORT FLAGS...]: export $tmp/NAME.ck, dtrain predict on LINES, the inputs
# from scripts/ctr_features.py (the Python hash), onnxruntime and OpenCV within 1e-5 on every line.
ctr_roundtrip() {
  local name=$1 lines=$2; shift 2
  local m="$tmp/$name.onnx" base="$tmp/$name"
  step "$name: export" "$bin" export "$@" "$tmp/$name.ck" "$m" || return
  step "$name: predict" "$bin" predict --logdir "$tmp/$name.ck" --threads 1 --out "$base.csv" "$lines" || return
  step "$name: checker" "$py" "$ctr_check" checker "$m"
  step "$name: inputs (Python hash)" "$py" scripts/ctr_features.py feeds "$m" "$lines" "$base.feeds" || return
  if node tests/onnx/run_ort_ctr.js "$m" "$base.feeds" "$base.ort.f32" >"$base.ort.log" 2>&1; then
    step "$name: onnxruntime" "$py" "$ctr_check" compare "$base.csv" "$base.ort.f32" onnxruntime
  else
    bad "$name: onnxruntime: $(tail -n2 "$base.ort.log")"
  fi
  step "$name: OpenCV dnn" "$py" "$ctr_check" opencv "$m" "$base.feeds" "$base.csv"
}

#!/usr/bin/env bash
# dtrain export of the shipped click-log models (models/lr.model, fm.model, deepfm.model, their full
# tables: 109 to 328 MB files), each trained 40 steps on a log of dtrain gen-clicks: onnxruntime
# (onnxruntime-node), fed the rows scripts/ctr_features.py hashes in Python, gives dtrain predict's
# probability within 1e-5 on every test line; OpenCV's dnn runs it alike or refuses it for the
# operator docs/export.md says it lacks. Slow only by the tables' size (a minute on a loaded machine).
. "$(dirname "$0")/lib.sh"
. tests/onnx/export_lib.sh
need_ort

"$bin" gen-clicks --out "$tmp/clicks.tsv" --lines 12000 --vocab 400 --model fm --seed 9 >"$tmp/gen.out" 2>&1 \
  || bad "gen-clicks: $(tail -n2 "$tmp/gen.out")"
step "the test split" "$py" "$ctr_check" test_split "$tmp/clicks.tsv" "$tmp/test.tsv"
for m in lr fm deepfm; do
  ctr_train "$m" "models/$m.model" "$tmp/clicks.tsv" 40
  ctr_roundtrip "$m" "$tmp/test.tsv"
  rm -rf "$tmp/$m.ck" "$tmp/$m.onnx"   # up to 1.3 GB each
done
summary

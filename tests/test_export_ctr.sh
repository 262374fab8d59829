#!/usr/bin/env bash
# dtrain export of click-log models (docs/export.md, "Click-log models"), quick: tests/onnx/
# ctr_layers.model on libffm lines (per-field and shared tables, sum and mean, several ids a field
# with values, bags whose values sum to 0, empty fields, fm, a tower) at opsets 13 and 18, and
# models/lr.model with small tables on Criteo lines, inline and with its tables in ONNX external
# data (the path a model over 2 GiB takes, forced by --external_data_above): onnxruntime, fed the rows
# scripts/ctr_features.py hashes in Python, within 1e-5 of dtrain predict on every line. The Python
# hash writes tests/fixtures/ctr_hash_vectors.txt, which tests/test_ctr.c checks the C against.
# tests/test_export_ctr_slow.sh does the shipped models at their full size.
. "$(dirname "$0")/lib.sh"
. tests/onnx/export_lib.sh
need_ort

"$py" scripts/ctr_features.py vectors >"$tmp/vectors.txt"
check "the Python hash writes the vectors test_ctr checks the C with" cmp -s "$tmp/vectors.txt" tests/fixtures/ctr_hash_vectors.txt

# libffm lines over 5 fields: 0 to 3 ids a field, values of either sign, a fifth of the 2-id bags
# summing to 0 (a mean is 0 there, not a division by 0)
"$py" - "$tmp/ffm.txt" <<'PY'
import random, sys
rng = random.Random(11)
with open(sys.argv[1], "w") as f:
    for n in range(3000):
        toks, score = [], 0
        for field in range(5):
            k = rng.choice([0, 1, 1, 1, 2, 3])
            if k == 2 and rng.random() < 0.2:
                toks += [f"{field}:{rng.randrange(300)}:1", f"{field}:{rng.randrange(300)}:-1"]
                continue
            for _ in range(k):
                i = rng.randrange(300)
                score += i % 7 - 3
                toks.append(f"{field}:{i}:{rng.choice(['1', '0.5', '2', '1.5', '-1', '0.25'])}")
        rng.shuffle(toks)
        f.write(f"{int(score + rng.gauss(0, 3) > 0)} " + " ".join(toks) + "\n")
PY
head -n 600 "$tmp/ffm.txt" >"$tmp/ffm_lines.txt"
ctr_train layers tests/onnx/ctr_layers.model "$tmp/ffm.txt" 40
ctr_roundtrip layers "$tmp/ffm_lines.txt"
cp -r "$tmp/layers.ck" "$tmp/layers18.ck"
ctr_roundtrip layers18 "$tmp/ffm_lines.txt" --opset 18

# Criteo lines, models/lr.model with 4096 rows a table (26 tables of 16 KB)
"$bin" gen-clicks --out "$tmp/clicks.tsv" --lines 6000 --vocab 300 --seed 4 >"$tmp/gen.out" 2>&1 \
  || bad "gen-clicks: $(tail -n2 "$tmp/gen.out")"
step "the test split" "$py" "$ctr_check" test_split "$tmp/clicks.tsv" "$tmp/test.tsv"
sed 's/buckets=1048576/buckets=4096/' models/lr.model >"$tmp/lr_small.model"
ctr_train lr "$tmp/lr_small.model" "$tmp/clicks.tsv" 30
ctr_roundtrip lr "$tmp/test.tsv"
cp -r "$tmp/lr.ck" "$tmp/lr_ext.ck"
ctr_roundtrip lr_ext "$tmp/test.tsv" --external_data_above 100000
check "external data: the tables are in lr_ext.onnx.data (26 x 16 KB at 4 KB boundaries)" \
  test "$(stat -c %s "$tmp/lr_ext.onnx.data")" -eq $((26 * 16384))
check "external data: the model file is the graph alone" test "$(stat -c %s "$tmp/lr_ext.onnx")" -lt 20000
check "external data: the same probabilities as the inline file, bit for bit" cmp -s "$tmp/lr.ort.f32" "$tmp/lr_ext.ort.f32"

# a failed export with external data leaves neither file
expect_error "export into a missing folder" 1 "." "$bin" export --external_data_above 1000 "$tmp/lr.ck" "$tmp/nowhere/lr.onnx"
check "nothing left behind" test ! -e "$tmp/nowhere"
summary

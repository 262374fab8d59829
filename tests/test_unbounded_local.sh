#!/usr/bin/env bash
# Unbounded ids in one process (docs/sparse.md, "Unbounded ids"): `dtrain train` without a cluster
# holds each table of capacity= in the ps's hash table (train/local_tables.h) and trains as a sync
# cluster of one ps and one worker does. (a) On a model whose tables evict (capacity 40 rows, admission
# at the second update) one process and such a cluster end with the same held rows, ids and slots bit
# for bit, and the same test figures; the cluster runs without the sparse prefetch, whose pull of the
# next batch reads (touches) its rows before the validation's reads, a different recency order and so
# sometimes another row evicted. (b) The end line's table figures: capacity kept, rows = admitted -
# evicted. (c) A checkpoint restored in one process trains on to where an uninterrupted run ends, bit
# for bit, and (f) restored onto 2 ps tasks too. (d) eval and predict read the restored tables, inspect
# lists them, and a damaged row is refused. (e) ONNX export refuses a hash table, naming the layer and buckets=.
. "$(dirname "$0")/lib.sh"
case "$bin" in /*) ;; *) bin="$PWD/$bin" ;; esac
src=$(cd "${DTRAIN_SRC:-$(dirname "$0")/..}" && pwd)
cmp_tables() { /usr/bin/python3 "$src/tests/unbounded_tables.py" "$1" "$2" >"$3" 2>&1; }
cd "$tmp"

"$bin" gen-clicks --out clicks.tsv --lines 6000 --vocab 500 --seed 5 >gen.out 2>&1

# (a), (b): eviction and admission, one process against a 1 ps + 1 worker sync cluster
cp "$src/tests/fixtures/unbounded_small.model" small.model
small=(--data clicks.tsv --model small.model --optimizer sgd --learning_rate 0.05 --batch_size 32 --train_steps 150
       --steps_to_validate 50 --threads 1 --summary_dir "")
timeout --foreground 60 "$bin" train "${small[@]}" --logdir L >l.out 2>&1
check "one process trains a model of unbounded ids (status $?)" [ -f L/model.ckpt-150.safetensors ]
timeout --foreground 120 "$bin" launch --ps 1 --workers 1 --issync 1 --sparse_prefetch 0 "${small[@]}" --logdir C \
  >c.out 2>&1
check "the 1 ps + 1 worker sync cluster (status $?)" [ -f C/model.ckpt-150.safetensors ]
cmp_tables L/model.ckpt-150.safetensors C/model.ckpt-150.safetensors cmp_a.out
check "... the same held rows, ids and slots, bit for bit, and every other tensor" [ $? -eq 0 ]
one=$(grep -E '^test auc' l.out) two=$(grep -E '^\[worker0\] test auc' c.out | sed 's/^\[worker0\] //')
echo "     one process: $one"
check "... the same test figures" [ -n "$one" ] && [ "$one" = "$two" ]
line=$(grep -E '^tables: 26, rows held' l.out)
echo "     $line"
read -r rows adm ev na < <(sed -E 's/.*rows held ([0-9]+), admitted ([0-9]+), evicted ([0-9]+) .*not admitted ([0-9]+),.*/\1 \2 \3 \4/' <<<"$line")
check "the end line: at most 26 x 40 rows held ($rows), rows = admitted - evicted, evictions and refusals" \
  [ "${rows:-0}" -le 1040 ] && [ "$rows" -eq $((adm - ev)) ] && [ "$ev" -gt 0 ] && [ "$na" -gt 0 ]

# (c) save, restore, train on in one process: the uninterrupted run's step 40 bit for bit
sed -e 's/buckets=[0-9]*/capacity=100000/' -e 's/name=factors /name=factors table=shared /' \
  "$src/tests/fixtures/sparse_fm.model" >fm.model
fm=(--data clicks.tsv --model fm.model --optimizer adam --learning_rate 0.01 --table_optimizer adam --batch_size 64
    --summary_dir "" --threads 1)
timeout --foreground 60 "$bin" train "${fm[@]}" --train_steps 30 --logdir A >a.out 2>&1
timeout --foreground 60 "$bin" train "${fm[@]}" --train_steps 40 --logdir R >r.out 2>&1
check "one process: 30 and 40 steps" [ -f A/model.ckpt-30.safetensors ] && [ -f R/model.ckpt-40.safetensors ]
mkdir -p B F && cp A/model.ckpt-30.safetensors B/ && cp A/model.ckpt-30.safetensors F/
timeout --foreground 60 "$bin" train "${fm[@]}" --train_steps 40 --logdir B >b.out 2>&1
check "restored at step 30 and trained on" grep -q "resuming the data stream at batch 30" b.out && \
  grep -qE "^restored the 27 sparse table\(s\) of B/.* onto this process's tables: [1-9][0-9]* row\(s\)" b.out
cmp_tables R/model.ckpt-40.safetensors B/model.ckpt-40.safetensors cmp_c.out
check "... step 40 holds the uninterrupted run's rows, ids, slots and step bit for bit" [ $? -eq 0 ]
# (f) the same checkpoint onto a cluster of 2 ps tasks
timeout --foreground 120 "$bin" launch --ps 2 --workers 1 --issync 1 "${fm[@]}" --train_steps 40 --logdir F >f.out 2>&1
cmp_tables R/model.ckpt-40.safetensors F/model.ckpt-40.safetensors cmp_f.out
check "... and onto 2 ps tasks: the same step 40 bit for bit" [ $? -eq 0 ]

# (d) eval and predict from the checkpoint: the training run's test figures, one probability a line
"$bin" eval --logdir B --data clicks.tsv >eval.out 2>&1
check "eval: the training run's test figures" grep -qxF "$(grep -E '^test auc' r.out)" eval.out
"$bin" predict --logdir B clicks.tsv >pred.csv 2>pred.err
check "predict: a probability for each of the 6000 lines ($(wc -l <pred.csv) lines)" \
  [ "$(awk -F, 'NR > 1 && $3 > 0 && $3 < 1' pred.csv | wc -l)" -eq 6000 ]
"$bin" inspect B/model.ckpt-40.safetensors >inspect.out 2>&1
check "inspect: one process's held rows" \
  grep -qE '^  factors/embeddings +unbounded ids, [1-9][0-9]* rows held x dim 4, slots adam_m, adam_v' inspect.out
# a damaged row (a negative Adam v, which the next update would take the root of; the checksum
# dropped): refused as a ps refuses it in a SPARSE_IMPORT, naming the row
mkdir -p H
/usr/bin/python3 - B/model.ckpt-40.safetensors H/model.ckpt-40.safetensors <<'PY' || bad "forge the damaged row"
import json, struct, sys
b = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
del h["__metadata__"]["crc32c"]
data = bytearray(b[8 + n:])
at = h["factors/embeddings/adam_v"]["data_offsets"][0]
data[at:at + 4] = struct.pack("<f", -1.0)
j = json.dumps(h).encode()
j += b" " * (-len(j) % 8)
open(sys.argv[2], "wb").write(struct.pack("<Q", len(j)) + j + bytes(data))
PY
"$bin" eval --logdir H --data clicks.tsv >h.out 2>h.err
st=$?
check "eval: a checkpoint row out of its optimizer's range is refused (status $st)" [ "$st" -eq 1 ] && \
  grep -qE "^dtrain eval: .*checkpoint rows of table 26: SPARSE_IMPORT: row 0 \(id [0-9]+ of table 26\): optimizer \
slot 1, value 0, -1 must be >= 0$" h.err
# (e) ONNX has no hash table
# (the message promised that buckets=N would export, but dtrain export had no form for embeddings)
expect_error "export refuses the hash table, naming the layer, and promises no way out it does not have" 1 \
  "embedding weights has unbounded ids \(capacity=\), whose rows live in a hash table, which ONNX cannot express: \
the model cannot be exported \(docs/export.md lists the layers that can\)$" \
  "$bin" export B out.onnx
summary

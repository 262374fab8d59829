#!/usr/bin/env bash
# dtrain predict against dtrain eval on labelled splits: a Fashion-MNIST subset (IDX) and a small
# folder of PNGs in two classes. Predict's argmax must give exactly eval's accuracy and confusion
# matrix (same checkpoint, same decoding, same batches); class names come from the checkpoint; the
# Kaggle form, --list, bad images (skip and count, or fail) and bad input (one-line errors).
. "$(dirname "$0")/lib.sh"
py=/usr/bin/python3

# agree NAME EVAL_OUT PREDICT_CSV TRUTH: the confusion matrix and accuracy of predict's classes
# against TRUTH (one true class name per CSV row, in order) equal eval's printed ones.
agree() {
  "$py" - "$2" "$3" "$4" <<'PY'
import csv, sys
ev, pred, truth = open(sys.argv[1]).read().splitlines(), list(csv.reader(open(sys.argv[2]))), open(sys.argv[3]).read().split()
acc = float(next(l for l in ev if l.startswith("test accuracy")).split()[2])
i = next(k for k, l in enumerate(ev) if l.startswith("confusion matrix"))
names = ev[i + 1].split()
cm = {}
for l in ev[i + 2:i + 2 + len(names)]:
    f = l.split()
    cm[f[0]] = [int(x) for x in f[1:]]
rows = pred[1:]
assert len(rows) == len(truth), f"{len(rows)} predictions for {len(truth)} labelled images"
assert all(len(r) == 2 + len(names) for r in rows), "a row without a probability per class"
mine = {n: [0] * len(names) for n in names}
for r, t in zip(rows, truth):
    mine[t][names.index(r[1])] += 1
    p = [float(x) for x in r[2:]]
    assert abs(sum(p) - 1) < 1e-4, f"probabilities of {r[0]} sum to {sum(p)}"
    assert p[names.index(r[1])] == max(p), f"{r[0]}: class {r[1]} is not the most probable"
assert len({r[1] for r in rows}) > 1, "one class predicted for every image: agreement would prove little"
assert mine == cm, f"confusion matrices differ:\npredict {mine}\neval    {cm}"
right = sum(mine[n][k] for k, n in enumerate(names))
assert f"{right / len(rows):.4f}" == f"{acc:.4f}", f"accuracy {right / len(rows)} vs eval's {acc}"
print(f"{len(rows)} images, accuracy {acc}")
PY
}

# ---- Fashion-MNIST subset (IDX): train a few steps, then eval and predict the test file ----------
fashion_subset "$tmp/fs" 512 300
printf 'model tiny28\ninput 28 28 1\nconv2d filters=4 kernel=3 stride=2\nrelu\nflatten\ndense units=10\n' >"$tmp/tiny28.model"
"$bin" train --model "$tmp/tiny28.model" --data "$tmp/fs" --logdir "$tmp/ck" --summary_dir= --batch_size 32 \
  --train_steps 12 --steps_to_validate 100 --threads 2 >"$tmp/train.log" 2>&1 || { cat "$tmp/train.log"; bad "fashion training"; }
"$bin" eval --logdir "$tmp/ck" --data "$tmp/fs" --threads 2 >"$tmp/eval.txt" 2>"$tmp/err" || bad "fashion eval: $(cat "$tmp/err")"
if "$bin" predict --logdir "$tmp/ck" --threads 2 "$tmp/fs/t10k-images-idx3-ubyte" >"$tmp/pred.csv" 2>"$tmp/err"; then
  "$py" -c 'import sys; print(" ".join(str(b) for b in open(sys.argv[1], "rb").read()[8:]))' "$tmp/fs/t10k-labels-idx1-ubyte" >"$tmp/truth"
  check "IDX: predict agrees with eval ($(agree x "$tmp/eval.txt" "$tmp/pred.csv" "$tmp/truth" 2>&1 | tail -1))" \
    agree x "$tmp/eval.txt" "$tmp/pred.csv" "$tmp/truth"
  check "IDX: numbered classes in the header" grep -qx 'file,class,p_0,p_1,p_2,p_3,p_4,p_5,p_6,p_7,p_8,p_9' <(head -1 "$tmp/pred.csv")
  check "IDX: rows name the file and index" grep -q "^$tmp/fs/t10k-images-idx3-ubyte\[299\]," "$tmp/pred.csv"
  check "summary line on stderr" grep -q "300 images in .* 0 skipped" "$tmp/err"
else bad "fashion predict: $(cat "$tmp/err")"; fi
# --out writes the same CSV, whatever the thread count (kernels are deterministic).
"$bin" predict --logdir "$tmp/ck" --threads 1 --out "$tmp/pred1.csv" "$tmp/fs/t10k-images-idx3-ubyte" 2>/dev/null
check "--out, 1 thread: the same CSV" cmp "$tmp/pred.csv" "$tmp/pred1.csv"
# The check can fail: one prediction changed is caught.
awk -F, -v OFS=, 'NR == 2 { $2 = ($2 + 1) % 10 } 1' "$tmp/pred.csv" >"$tmp/pred_bad.csv"
if agree x "$tmp/eval.txt" "$tmp/pred_bad.csv" "$tmp/truth" >/dev/null 2>&1; then bad "a changed prediction is caught"
else ok "a changed prediction is caught"; fi

# ---- an image folder: two classes of PNGs with a train/ and a test/ split --------------------------
"$py" - "$tmp/img" <<'PY'
import os, struct, sys, zlib
def png(path, w, h, rgb):
    raw = b"".join(b"\x00" + b"".join(bytes(rgb(x, y)) for x in range(w)) for y in range(h))
    chunk = lambda t, d: struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d) & 0xffffffff)
    open(path, "wb").write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
                           + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))
root = sys.argv[1]
for split, n in (("train", 24), ("test", 9)):
    for c, cls in enumerate(("cat", "dog")):
        os.makedirs(f"{root}/{split}/{cls}", exist_ok=True)
        for i in range(n):
            s = (i * 37 + c * 101 + (split == "test") * 7) % 97
            # cats reddish, dogs bluish, with stripes and noise enough that a few are taken for the other
            rgb = lambda x, y: (min(255, 60 + s + 40 * (x % 3 == 0) + 60 * (1 - c)), (s * 3 + x * y) % 90,
                                min(255, 60 + (96 - s) + 40 * (y % 2 == 0) + 60 * c))
            png(f"{root}/{split}/{cls}/{cls[0]}{i:02d}.png", 10 + i % 5, 9 + i % 4, rgb)
os.makedirs(f"{root}/test1", exist_ok=True)
for i in (1, 2, 10):
    png(f"{root}/test1/{i}.png", 12, 12, lambda x, y: ((x * 20 + i) % 256, y * 10 % 256, (i * 50) % 256))
PY
echo "not an image" >"$tmp/img/test/cat/readme.png"
printf 'model tinyrgb\ninput 8 8 3\nconv2d filters=4 kernel=3\nrelu\nflatten\ndense units=2\n' >"$tmp/rgb.model"
"$bin" train --model "$tmp/rgb.model" --data "$tmp/img" --logdir "$tmp/ck2" --summary_dir= --batch_size 4 \
  --train_steps 40 --learning_rate 0.01 --steps_to_validate 100 --threads 2 >"$tmp/train2.log" 2>&1 || { cat "$tmp/train2.log"; bad "image training"; }
"$bin" eval --logdir "$tmp/ck2" --data "$tmp/img" --threads 2 >"$tmp/eval2.txt" 2>"$tmp/err" || bad "image eval: $(cat "$tmp/err")"
if "$bin" predict --logdir "$tmp/ck2" --threads 2 "$tmp/img/test" >"$tmp/pred2.csv" 2>"$tmp/err2"; then
  sed 1d "$tmp/pred2.csv" | cut -d, -f1 | sed 's|.*/test/\([a-z]*\)/.*|\1|' >"$tmp/truth2"
  check "image folder: predict agrees with eval ($(agree x "$tmp/eval2.txt" "$tmp/pred2.csv" "$tmp/truth2" 2>&1 | tail -1))" \
    agree x "$tmp/eval2.txt" "$tmp/pred2.csv" "$tmp/truth2"
  check "class names from the checkpoint" grep -qx 'file,class,p_cat,p_dog' <(head -1 "$tmp/pred2.csv")
  check "checkpoint records the classes" grep -q 'classes: \["cat","dog"\]' <("$bin" inspect "$tmp/ck2")
  check "bad image skipped and counted" grep -q "18 images in .* 1 skipped" "$tmp/err2"
  check "bad image: no row" test "$(grep -c readme "$tmp/pred2.csv")" -eq 0
else bad "image predict: $(cat "$tmp/err2")"; fi
expect_error "--bad_images=fail names the file" 1 "readme.png" \
  "$bin" predict --logdir "$tmp/ck2" --bad_images=fail --out "$tmp/never.csv" "$tmp/img/test"
check "--out not written after a failure" test ! -e "$tmp/never.csv"
check "no temporary file left" test -z "$(ls "$tmp" | grep never)"

# Kaggle's form: ids from the file names, label = the probability of dog (as in the CSV's p_dog).
"$bin" predict --logdir "$tmp/ck2" --format kaggle "$tmp/img/test1" "$tmp/img/test/dog/d03.png" >"$tmp/k.csv" 2>/dev/null
"$bin" predict --logdir "$tmp/ck2" "$tmp/img/test1" "$tmp/img/test/dog/d03.png" >"$tmp/c.csv" 2>/dev/null
check "kaggle: header and ids" test "$(cut -d, -f1 "$tmp/k.csv" | tr '\n' ' ')" = "id 1 10 2 d03 "
check "kaggle: label is p_dog" test "$(cut -d, -f2 "$tmp/k.csv" | sed 1d)" = "$(cut -d, -f4 "$tmp/c.csv" | sed 1d)"

# A checkpoint written before class names were recorded (the key taken out of a copy's header):
# classes are numbered, and --format kaggle takes class 1 as dog with a warning.
"$py" - "$(ls "$tmp"/ck2/model.ckpt-40.safetensors)" "$tmp/old.safetensors" <<'PY'
import json, struct, sys
raw = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
h = json.loads(raw[8:8 + n])
del h["__metadata__"]["classes"]
hb = json.dumps(h).encode()
hb += b" " * (-len(hb) % 8)
open(sys.argv[2], "wb").write(struct.pack("<Q", len(hb)) + hb + raw[8 + n:])
PY
"$bin" predict --checkpoint "$tmp/old.safetensors" "$tmp/img/test1" >"$tmp/old.csv" 2>"$tmp/olderr"
check "old checkpoint: numbered classes" grep -qx 'file,class,p_0,p_1' <(head -1 "$tmp/old.csv")
check "old checkpoint: same predictions" test "$(cut -d, -f3- "$tmp/old.csv" | sed 1d)" = "$(sed 1d "$tmp/c.csv" | head -3 | cut -d, -f3-)"
"$bin" predict --checkpoint "$tmp/old.safetensors" --format kaggle "$tmp/img/test1" >"$tmp/oldk.csv" 2>"$tmp/olderr"
check "old checkpoint: kaggle takes class 1 as dog, with a warning" \
  test "$(grep -c "warning: .*records no class names; taking class 1 as dog" "$tmp/olderr")" -eq 1 -a \
       "$(sed 1d "$tmp/oldk.csv")" = "$(sed 1d "$tmp/k.csv" | head -3)"

# --list: one path per line, in order, blank lines ignored; positional inputs come first.
printf '%s\n\n%s\n' "$tmp/img/test/dog/d01.png" "$tmp/img/test/cat/c02.png" >"$tmp/list.txt"
"$bin" predict --logdir "$tmp/ck2" --list "$tmp/list.txt" "$tmp/img/test/cat/c05.png" >"$tmp/l.csv" 2>/dev/null
check "--list" test "$(sed 1d "$tmp/l.csv" | cut -d, -f1 | sed 's|.*/||' | tr '\n' ' ')" = "c05.png d01.png c02.png "

# ---- bad input: one line each ---------------------------------------------------------------------
mkdir -p "$tmp/empty"
printf 'garbage' >"$tmp/bad.safetensors"
expect_error "unreadable checkpoint" 1 "bad.safetensors" "$bin" predict --checkpoint "$tmp/bad.safetensors" "$tmp/img/test1"
expect_error "no checkpoint in logdir" 1 "no checkpoint found" "$bin" predict --logdir "$tmp/empty" "$tmp/img/test1"
expect_error "images of the wrong size (IDX)" 1 "t10k-images-idx3-ubyte holds 28x28x1 images but the model's input is 8x8x3" \
  "$bin" predict --logdir "$tmp/ck2" "$tmp/fs/t10k-images-idx3-ubyte"
expect_error "empty folder" 1 "empty: no files" "$bin" predict --logdir "$tmp/ck2" "$tmp/empty"
expect_error "no inputs" 1 "no images named" "$bin" predict --logdir "$tmp/ck2"
expect_error "missing input" 1 "nope.png: No such file" "$bin" predict --logdir "$tmp/ck2" "$tmp/nope.png"
expect_error "labels file as input" 1 "not images" "$bin" predict --logdir "$tmp/ck" "$tmp/fs/t10k-labels-idx1-ubyte"
expect_error "IDX mixed with images" 1 "cannot be mixed" \
  "$bin" predict --logdir "$tmp/ck" "$tmp/fs/t10k-images-idx3-ubyte" "$tmp/img/test1/1.png"
expect_error "bad --format" 2 "--format: 'tsv'" "$bin" predict --format tsv "$tmp/img/test1"
expect_error "kaggle without a dog class" 1 "no class named dog" "$bin" predict --logdir "$tmp/ck" --format kaggle "$tmp/fs/t10k-images-idx3-ubyte"
expect_error "missing --list file" 1 "nolist.txt: cannot open" "$bin" predict --logdir "$tmp/ck2" --list "$tmp/nolist.txt"
printf '%s\n%s\n' "$tmp/img/test1/1.png" "$tmp/missing.png" >"$tmp/list2.txt"
expect_error "--list names the line" 1 "list2.txt:2: .*missing.png" "$bin" predict --logdir "$tmp/ck2" --list "$tmp/list2.txt"

summary

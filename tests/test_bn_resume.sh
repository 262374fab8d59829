#!/usr/bin/env bash
# Batch norm's moving statistics are never trained (issue 27, docs/batchnorm.md): for sgd, momentum
# and Adam, on a tiny conv + batch norm model and synthetic data (no data set needed, seconds):
#   - a sync cluster's checkpoint (1 ps + 1 worker) equals a single process's, bit for bit but the
#     moving statistics' values (the ps's s + (new - s) may round off new: to 1e-6 relative), and
#     their optimizer slots are all 0;
#   - 1 ps + 2 sync workers (momentum and Adam with weight decay, fp16 and bf16 compression) move the
#     statistics and leave their slots 0;
#   - the sync checkpoint resumed in one process continues exactly as the single process does;
#   - a checkpoint from before the fix, whose moving statistics hold non-zero slots, resumes the
#     same (in one process, and in a sync cluster), the slots zeroed with one note in the log.
# Every check but sgd's (no slots) fails before the fix.
. "$(dirname "$0")/lib.sh"
case "$bin" in /*) ;; *) bin="$PWD/$bin" ;; esac
py=/usr/bin/python3
cd "$tmp" || exit 1

# 8x8 IDX images: 256 training and 32 test examples, 10 classes, from a fixed LCG (no data set needed).
"$py" - <<'PY'
import struct
x = 12345
def byte():
    global x
    x = (1103515245 * x + 12345) % 2**31
    return x >> 23
for prefix, n in (("train", 256), ("t10k", 32)):
    labels = bytes(byte() % 10 for _ in range(n))
    # the label brightens one row of the image, so there is something to learn
    img = bytearray()
    for k in range(n):
        for r in range(8):
            for c in range(8):
                img.append(min(255, byte() // 2 + (120 if r == labels[k] % 8 else 0)))
    import os
    os.makedirs("data", exist_ok=True)
    open("data/%s-images-idx3-ubyte" % prefix, "wb").write(struct.pack(">IIII", 0x803, n, 8, 8) + bytes(img))
    open("data/%s-labels-idx1-ubyte" % prefix, "wb").write(struct.pack(">II", 0x801, n) + labels)
PY
cat >bn.model <<'EOF'
model bn
input 8 8 1
conv2d name=conv1 filters=4 kernel=3 padding=same use_bias=false
batchnorm name=bn1
relu
flatten
dense units=10
EOF

# ckpt.py compare A B: every tensor of A equals B's bit for bit ("same", else the first that differs),
# but the moving statistics' values, to 1e-6 relative ("statistics within X");
# ckpt.py zero A: the moving statistics' slots are all 0 and the statistics moved from 0 and 1;
# ckpt.py legacy A OUT: A with its moving statistics' slots set non-zero (as a sync cluster wrote them
# before the fix), checksum recomputed.
cat >ckpt.py <<'PY'
import json, struct, sys
def crc32c(data):
    t = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        t.append(c)
    c = 0xFFFFFFFF
    for b in data:
        c = (c >> 8) ^ t[(c ^ b) & 0xFF]
    return c ^ 0xFFFFFFFF
def load(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    return h, bytearray(b[8 + n:])
def raw(h, d, name):
    lo, hi = h[name]["data_offsets"]
    return bytes(d[lo:hi])
def floats(h, d, name):
    r = raw(h, d, name)
    return struct.unpack("<%df" % (len(r) // 4), r)
cmd, a = sys.argv[1], sys.argv[2]
h, d = load(a)
names = sorted(k for k in h if k != "__metadata__")
slots = [k for k in names if "/moving_" in k and k.count("/") == 2]
if cmd == "compare":
    h2, d2 = load(sys.argv[3])
    diff = [k for k in names if k not in h2 or raw(h, d, k) != raw(h2, d2, k)]
    if len(names) != len([k for k in h2 if k != "__metadata__"]):
        print("differ: other tensors"); sys.exit(0)
    # the moving statistics themselves to 1e-6 relative: a ps adds the change, s + (new - s), which
    # can round differently from new
    rel = 0.0
    for k in [k for k in diff if "/moving_" in k and k.count("/") == 1]:
        for x, y in zip(floats(h, d, k), floats(h2, d2, k)):
            rel = max(rel, abs(x - y) / max(abs(x), abs(y), 1e-3))
        if rel <= 1e-6:
            diff.remove(k)
    print("differ: %s (moving statistics: %.3g relative)" % (diff[:3], rel) if diff else "same" if rel == 0
          else "statistics within %.2g" % rel)
elif cmd == "zero":
    nz = ["%s %s" % (k, max(abs(x) for x in floats(h, d, k))) for k in slots if any(floats(h, d, k))]
    m, v = floats(h, d, "bn1/moving_mean"), floats(h, d, "bn1/moving_variance")
    moved = any(x != 0 for x in m) and any(x != 1 for x in v)
    print("zero" if not nz and moved else "slots %d, not zero: %s, moved %s" % (len(slots), nz, moved))
elif cmd == "legacy":
    for k in slots:
        lo, hi = h[k]["data_offsets"]
        d[lo:hi] = struct.pack("<%df" % ((hi - lo) // 4), *[0.05 * (i + 1) for i in range((hi - lo) // 4)])
    h["__metadata__"]["crc32c"] = "%08x" % crc32c(bytes(d))
    head = json.dumps(h, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    open(sys.argv[3], "wb").write(struct.pack("<Q", len(head)) + head + bytes(d))
    print("legacy %d slots" % len(slots))
PY
ck() { "$py" ckpt.py "$@" 2>&1; }
same_() { [ "$1" = same ] || [[ "$1" == "statistics within"* ]]; }

common=(--model bn.model --data data --summary_dir= --threads 1 --steps_to_validate 1000 --batch_size 16)
run() { timeout --foreground 120 "$@" >"$log" 2>&1 || { bad "$log: status $?"; tail -n 5 "$log"; }; }

for opt in sgd momentum adam; do
  lr=0.05; [ $opt = adam ] && lr=0.01
  o=(--optimizer $opt --learning_rate $lr)
  log=single_$opt.log; run "$bin" train "${common[@]}" "${o[@]}" --logdir single_$opt --train_steps 6
  log=sync_$opt.log; run "$bin" launch --ps 1 --workers 1 --issync 1 "${common[@]}" "${o[@]}" --logdir sync_$opt --train_steps 6
  s=single_$opt/model.ckpt-6.safetensors c=sync_$opt/model.ckpt-6.safetensors
  out=$(ck zero "$c")
  check "$opt: the sync checkpoint's moving statistics moved, their slots are 0 ($out)" test "$out" = zero
  out=$(ck compare "$s" "$c")
  check "$opt: 1 sync worker's checkpoint = 1 process's ($out)" same_ "$out"

  # Resumed in one process, the sync checkpoint continues as the single process does.
  cp -r sync_$opt resumed_$opt
  log=resumed_$opt.log; run "$bin" train "${common[@]}" "${o[@]}" --logdir resumed_$opt --train_steps 10
  log=single10_$opt.log; run "$bin" train "${common[@]}" "${o[@]}" --logdir single_$opt --train_steps 10
  out=$(ck compare single_$opt/model.ckpt-10.safetensors resumed_$opt/model.ckpt-10.safetensors)
  check "$opt: the sync checkpoint resumed in one process = the single process, 4 more steps ($out)" same_ "$out"
  ! grep -q "optimizer state for batch norm" resumed_$opt.log || bad "$opt: a note on a clean checkpoint"

  # 2 sync workers: the ps adds the mean change; weight decay and 16-bit transfers change nothing.
  [ $opt = sgd ] && continue
  enc=fp16; [ $opt = adam ] && enc=bf16
  log=sync2_$opt.log; run "$bin" launch --ps 1 --workers 2 --issync 1 "${common[@]}" "${o[@]}" --logdir sync2_$opt \
    --train_steps 6 --weight_decay 0.01 --weight_decay_biases --compression $enc
  out=$(ck zero sync2_$opt/model.ckpt-6.safetensors)
  check "$opt: 2 sync workers, weight decay, $enc: moving statistics moved, slots 0 ($out)" test "$out" = zero

  # A checkpoint written before the fix: the same values with non-zero slots for the statistics.
  mkdir legacy_$opt
  ck legacy "$c" legacy_$opt/model.ckpt-6.safetensors >/dev/null
  log=legacy_$opt.log; run "$bin" train "${common[@]}" "${o[@]}" --logdir legacy_$opt --train_steps 10
  nz=8; [ $opt = adam ] && nz=16 # 4 channels x 2 statistics x the optimizer's slots
  check "$opt: an old checkpoint's slots are zeroed with one note" \
    test "$(grep -c "^note: legacy_$opt/model.ckpt-6.safetensors holds non-zero optimizer slots for batch norm's moving statistics ($nz floats" legacy_$opt.log)" -eq 1
  out=$(ck compare single_$opt/model.ckpt-10.safetensors legacy_$opt/model.ckpt-10.safetensors)
  check "$opt: the old checkpoint resumes as the single process ($out)" same_ "$out"
  # ... and in a sync cluster, whose chief gives the ps its shard back with the slots zeroed.
  mkdir legacy_sync_$opt
  cp legacy_$opt/model.ckpt-6.safetensors legacy_sync_$opt/
  log=legacy_sync_$opt.log; run "$bin" launch --ps 1 --workers 1 --issync 1 "${common[@]}" "${o[@]}" --logdir legacy_sync_$opt \
    --train_steps 10
  out=$(ck compare single_$opt/model.ckpt-10.safetensors legacy_sync_$opt/model.ckpt-10.safetensors)
  check "$opt: the old checkpoint resumes in a sync cluster as the single process ($out)" same_ "$out"
done
summary

#!/usr/bin/env bash
# Hostile files (docs/security.md, "Files"): sparse multi-gigabyte checkpoints and event files cost
# nothing on disk, and a reader that takes them whole holds gigabytes. Each is refused (or, for
# plot, read up to its damage) with one error line and a bounded peak resident size (/usr/bin/time's
# "Maximum resident set size"): a sparse 3 GiB checkpoint of zeros; a 3 GiB one with a valid
# header whose table claims a 3 GiB tensor (train and eval refuse it against the model before its
# data; inspect streams its checksum); a real event file extended to 1 GiB; a record claiming 60 MiB
# of zeros. Also: a FIFO as --model, a --list file or a checkpoint is refused at once (it hung), and
# a symbolic link at the index's name is not read (its target's first word is not shown).
. "$(dirname "$0")/lib.sh"
fashion_subset "$tmp/data" 128 64 || { bad "subset"; summary; exit 1; }
printf 'input 28 28 1\nconv2d filters=4 kernel=5\nrelu\nmaxpool size=2\nflatten\ndense units=10\n' >"$tmp/tiny.model"
"$bin" train --model "$tmp/tiny.model" --data "$tmp/data" --logdir="$tmp/ck" --summary_dir="$tmp/sum" \
  --batch_size 16 --train_steps 4 --steps_to_validate 2 --threads 1 >"$tmp/train" 2>&1
check "a small run trains" test $? -eq 0
real=$(ls "$tmp"/ck/model.ckpt-*.safetensors | head -1)

# The bound: 64 MiB above what the same command holds on a real, small file (the sanitizer build's
# runtime alone holds tens of MiB; the release build stays under 64 MiB in all).
peak_kib() { /usr/bin/time -f '%M' -o "$tmp/rss" "$@" >"$tmp/out" 2>"$tmp/err"; echo $? >"$tmp/status"; tail -n1 "$tmp/rss"; }
base=$(peak_kib "$bin" inspect "$real")
check "inspect of a real checkpoint works (peak ${base} KiB)" test "$(cat "$tmp/status")" -eq 0
limit=$((base + 64 * 1024))
# expect_bounded NAME STATUS PATTERN CMD...: STATUS, exactly one stderr line matching PATTERN (or,
# with PATTERN starting "warning:", that line among others), peak under $limit KiB.
expect_bounded() {
  local name=$1 want=$2 pat=$3; shift 3
  local t0=$SECONDS kib st lines
  kib=$(peak_kib timeout --foreground 120 "$@")
  st=$(cat "$tmp/status") lines=$(wc -l <"$tmp/err")
  if [ "$st" -eq "$want" ] && grep -qE -- "$pat" "$tmp/err" && { [ "$lines" -eq 1 ] || [ "${pat#warning:}" != "$pat" ]; } &&
     [ "$kib" -lt "$limit" ]; then
    ok "$name (peak $kib KiB, limit $limit; $((SECONDS - t0)) s)"
  else
    bad "$name (status $st, want $want; peak $kib KiB, limit $limit; $lines stderr lines: $(head -c 400 "$tmp/err"))"
  fi
}

# A sparse 3 GiB file of zeros: its header length (0) is refused before anything else is read.
mkdir -p "$tmp/zero"
truncate -s 3G "$tmp/zero/model.ckpt-9.safetensors"
expect_bounded "eval: sparse 3 GiB of zeros" 1 "model.ckpt-9.safetensors: header does not start with '\{'" \
  "$bin" eval --checkpoint "$tmp/zero/model.ckpt-9.safetensors" --data "$tmp/data" --threads 1
# (byte 8 is not '{', so inspect reads it as an event file, whose first record is refused)
expect_bounded "inspect: sparse 3 GiB of zeros" 1 "record at offset 0: length CRC mismatch" "$bin" inspect "$tmp/zero/model.ckpt-9.safetensors"

# A valid header (the real checkpoint's metadata) whose table claims conv1/kernel is 3 GiB, the file
# extended sparsely to match: train and eval refuse it against the model before reading its data.
mkdir -p "$tmp/big"
/usr/bin/python3 - "$real" "$tmp/big/model.ckpt-9.safetensors" <<'PY' || bad "forge the 3 GiB header"
import json, struct, sys
src, dst = sys.argv[1], sys.argv[2]
b = open(src, "rb").read()
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
big = 3 << 30
meta = h["__metadata__"]
meta["crc32c"] = "00000000"
hdr = {"__metadata__": meta, "conv1/kernel": {"dtype": "F32", "shape": [big // 4], "data_offsets": [0, big]},
       "global_step": {"dtype": "I64", "shape": [], "data_offsets": [big, big + 8]}}
j = json.dumps(hdr).encode()
j += b" " * (-len(j) % 8)
with open(dst, "wb") as f:
    f.write(struct.pack("<Q", len(j)) + j)
    f.truncate(8 + len(j) + big)
    f.seek(8 + len(j) + big)
    f.write(struct.pack("<q", 9))
PY
check "the forged file is 3 GiB, sparse" test "$(stat -c %s "$tmp/big/model.ckpt-9.safetensors")" -gt $((3 << 30)) -a \
  "$(du -k "$tmp/big/model.ckpt-9.safetensors" | cut -f1)" -lt 1024
expect_bounded "eval: 3 GiB tensor claimed" 1 "model.ckpt-9.safetensors is a checkpoint of another model.*conv1/kernel" \
  "$bin" eval --checkpoint "$tmp/big/model.ckpt-9.safetensors" --data "$tmp/data" --threads 1
expect_bounded "eval --logdir: 3 GiB tensor claimed" 1 "model.ckpt-9.safetensors is a checkpoint of another model" \
  "$bin" eval --logdir "$tmp/big" --data "$tmp/data" --threads 1
expect_bounded "train: 3 GiB tensor claimed" 1 "model.ckpt-9.safetensors is a checkpoint of another model" \
  "$bin" train --model "$tmp/tiny.model" --data "$tmp/data" --logdir="$tmp/big" --summary_dir= --train_steps 1 --threads 1
# No model to check it against: its checksum is streamed (time, not memory) and refused.
expect_bounded "inspect: 3 GiB tensor claimed" 1 "model.ckpt-9.safetensors: checksum mismatch" \
  "$bin" inspect "$tmp/big/model.ckpt-9.safetensors"

# A real event file extended sparsely to 1 GiB: plot uses the records before the zeros (one warning)
# and draws; inspect lists them, then names the damaged record.
ev=$(ls "$tmp"/sum/train/*tfevents* | head -1)
evsize=$(stat -c %s "$ev")
truncate -s 1G "$ev"
expect_bounded "plot: 1 GiB event file" 0 "warning: .*record at offset $evsize: length CRC mismatch" \
  "$bin" plot "$tmp/sum" --out "$tmp/plot.svg"
check "plot drew the records before the damage" grep -q "<svg" "$tmp/plot.svg"
expect_bounded "inspect: 1 GiB event file" 1 "record at offset $evsize: length CRC mismatch" "$bin" inspect "$ev"
check "inspect listed the good records first" grep -q "file_version brain.Event:2" "$tmp/out"
# A record whose (valid) length claims 60 MiB of zeros: its CRC is checked through a fixed buffer.
truncate -s "$evsize" "$ev"
/usr/bin/python3 - "$ev" <<'PY' || bad "forge the 60 MiB record"
import struct, sys
def crc32c(b):
    c = 0xFFFFFFFF
    for x in b:
        c ^= x
        for _ in range(8):
            c = (c >> 1) ^ (0x82F63B78 if c & 1 else 0)
    return c ^ 0xFFFFFFFF
def mask(c):
    return ((((c >> 15) | (c << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF
n = 60 << 20
head = struct.pack("<Q", n)
with open(sys.argv[1], "r+b") as f:
    f.seek(0, 2)
    at = f.tell()
    f.write(head + struct.pack("<I", mask(crc32c(head))))
    f.truncate(at + 12 + n + 4)
PY
expect_bounded "plot: a 60 MiB record of zeros" 0 "warning: .*record at offset $evsize: data CRC mismatch" \
  "$bin" plot "$tmp/sum" --out "$tmp/plot.svg"

# Non-regular files are refused at once, in one line, where they hung.
mkfifo "$tmp/m.fifo"
expect_error "train --model FIFO" 1 "m.fifo: not a regular file \(a FIFO\)" \
  timeout --foreground 20 "$bin" train --model "$tmp/m.fifo" --data "$tmp/data" --logdir= --summary_dir=
expect_error "eval --checkpoint FIFO" 1 "m.fifo: not a regular file \(a FIFO\)" \
  timeout --foreground 20 "$bin" eval --checkpoint "$tmp/m.fifo" --data "$tmp/data"
expect_error "inspect FIFO" 1 "m.fifo: not a regular file \(a FIFO\)" timeout --foreground 20 "$bin" inspect "$tmp/m.fifo"
expect_error "predict --list FIFO" 1 "m.fifo: not a regular file \(a FIFO\)" \
  timeout --foreground 20 "$bin" predict --logdir "$tmp/ck" --list "$tmp/m.fifo"

# A link at the index's name is not read: the folder is scanned instead, and nothing of the target
# (whose first word could be a secret) is shown.
printf 'hunter2secret: "x"\n' >"$tmp/secret.txt"
mkdir -p "$tmp/ck3" && cp "$real" "$tmp/ck3/"
ln -s "$tmp/secret.txt" "$tmp/ck3/checkpoint"
"$bin" inspect "$tmp/ck3" >"$tmp/out" 2>"$tmp/err"
check "inspect through an index link works" test $? -eq 0
check "the link is named as not followed" grep -q "checkpoint: is a symbolic link (not followed" "$tmp/err"
check "the target's first word is not shown" sh -c "! grep -q hunter2 '$tmp/err' '$tmp/out'"
summary

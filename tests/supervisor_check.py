#!/usr/bin/env python3
"""Independent readers for what a dtrain training run writes (standard library, plus numpy or torch
for checkpoints), used by tests/test_supervisor.sh.

  supervisor_check.py events FILE
      Decodes every record of a TensorBoard event file: checks each length and both masked
      CRC-32Cs, decodes the Event protobuf by hand (wall_time = 1 double, step = 2 varint,
      file_version = 3 string, summary = 5 {value = 1 {tag = 1 string, simple_value = 2 float}}),
      and prints one line per scalar: "STEP TAG VALUE" (after a first line "file_version V").
  supervisor_check.py checkpoint FILE STEP
      Loads a dtrain checkpoint with tests/safetensors_load.py's loader (verifies crc32c, tiling),
      and checks global_step == STEP, that every parameter has its Adam slots of its own shape, and
      that the metadata carries the model text, optimizer, data position and RNG state.
"""
import json
import os
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from safetensors_load import crc32c, load  # noqa: E402


def masked(crc):
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


def varint(buf, i):
    shift = value = 0
    while True:
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return value, i


def fields(buf):
    """(field number, wire type, value) for every field of one message."""
    i = 0
    while i < len(buf):
        key, i = varint(buf, i)
        num, wt = key >> 3, key & 7
        if wt == 0:
            v, i = varint(buf, i)
        elif wt == 1:
            v, i = buf[i:i + 8], i + 8
        elif wt == 2:
            n, i = varint(buf, i)
            v, i = buf[i:i + n], i + n
        elif wt == 5:
            v, i = buf[i:i + 4], i + 4
        else:
            raise ValueError("wire type %d" % wt)
        yield num, wt, v


def events(path):
    raw = open(path, "rb").read()
    pos = 0
    while pos < len(raw):
        assert pos + 12 <= len(raw), "truncated length at %d" % pos
        head = raw[pos:pos + 8]
        (n,) = struct.unpack("<Q", head)
        (hcrc,) = struct.unpack("<I", raw[pos + 8:pos + 12])
        assert hcrc == masked(crc32c(head)), "length CRC at %d" % pos
        data = raw[pos + 12:pos + 12 + n]
        assert len(data) == n and pos + 16 + n <= len(raw), "truncated record at %d" % pos
        (dcrc,) = struct.unpack("<I", raw[pos + 12 + n:pos + 16 + n])
        assert dcrc == masked(crc32c(data)), "data CRC at %d" % pos
        step, wall = 0, 0.0
        out = []
        for num, wt, v in fields(data):
            if num == 1 and wt == 1:
                (wall,) = struct.unpack("<d", v)
            elif num == 2 and wt == 0:
                step = v
            elif num == 3 and wt == 2:
                out.append(("file_version", v.decode()))
            elif num == 5 and wt == 2:
                for vn, vwt, value in fields(v):
                    assert vn == 1 and vwt == 2, "Summary field %d" % vn
                    tag, val = None, None
                    for f, fwt, x in fields(value):
                        if f == 1 and fwt == 2:
                            tag = x.decode()
                        elif f == 2 and fwt == 5:
                            (val,) = struct.unpack("<f", x)
                    out.append((step, tag, val))
        assert wall > 1e9, "wall_time %r" % wall
        for o in out:
            print("file_version %s" % o[1] if o[0] == "file_version" else "%d %s %.9g" % o)
        pos += 16 + n


def checkpoint(path, step):
    try:
        import numpy  # noqa: F401
        backend = "numpy"
    except ImportError:
        backend = "torch"
    tensors, meta = load(path, backend)
    assert int(tensors["global_step"]) == step, "global_step %s" % tensors["global_step"]
    params = [k for k in tensors if k != "global_step" and not k.endswith(("/adam_m", "/adam_v"))]
    assert params, "no parameters"
    for p in params:
        for slot in ("adam_m", "adam_v"):
            s = tensors[p + "/" + slot]
            assert tuple(s.shape) == tuple(tensors[p].shape), "%s/%s shape" % (p, slot)
    assert (tensors[params[0] + "/adam_v"] >= 0).all(), "adam_v negative"
    assert meta["model"].startswith("model "), meta["model"][:40]
    assert json.loads(meta["optimizer"])["name"] == "adam"
    pos = json.loads(meta["data_position"])
    assert pos["batches_per_worker"] == (step if pos["sync"] else step // pos["workers"]), pos
    assert "seed" in json.loads(meta["rng_state"])
    print("ok: %s: %d parameters with Adam slots, global_step %d (%s)" % (path, len(params), step, backend))


if __name__ == "__main__":
    if sys.argv[1] == "events":
        events(sys.argv[2])
    else:
        checkpoint(sys.argv[2], int(sys.argv[3]))

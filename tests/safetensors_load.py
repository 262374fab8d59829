#!/usr/bin/env python3
"""Loads a safetensors file written by dtrain (tests/test_safetensors.c --write) with only the
standard library and numpy (or torch when numpy is missing) and checks names, dtypes, shapes,
values, metadata and the crc32c checksum. Exit status 0 when everything matches.

Usage: safetensors_load.py FILE [--backend numpy|torch]
"""
import json
import struct
import sys


def crc32c(data):
    """CRC-32C (Castagnoli, reflected 0x82F63B78), table-driven, pure Python."""
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    c = 0xFFFFFFFF
    for b in data:
        c = (c >> 8) ^ table[(c ^ b) & 0xFF]
    return c ^ 0xFFFFFFFF


def load(path, backend):
    """Returns ({name: array}, metadata) using only struct/json and the backend's frombuffer."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    assert 8 + n <= len(raw), "header length beyond the file"
    assert n % 8 == 0, "header not padded to 8 bytes"
    header = json.loads(raw[8:8 + n].decode("utf-8"))
    data = raw[8 + n:]
    meta = header.pop("__metadata__", {})
    assert all(isinstance(v, str) for v in meta.values()), "metadata values must be strings"
    if "crc32c" in meta:
        assert "%08x" % crc32c(data) == meta["crc32c"], "crc32c of the data section does not match"
    spans = sorted((e["data_offsets"][0], e["data_offsets"][1]) for e in header.values())
    at = 0
    for b, e in spans:
        assert b == at, "gap or overlap at %d" % b
        at = e
    assert at == len(data), "tensors do not cover the data section"
    out = {}
    if backend == "numpy":
        import numpy as np
        dt = {"F32": np.dtype("<f4"), "I64": np.dtype("<i8"), "F64": np.dtype("<f8"), "I32": np.dtype("<i4")}
        for name, e in header.items():
            b, end = e["data_offsets"]
            arr = np.frombuffer(data[b:end], dtype=dt[e["dtype"]])
            out[name] = arr.reshape(e["shape"])
    else:
        import torch
        dt = {"F32": (torch.float32, 4), "I64": (torch.int64, 8), "F64": (torch.float64, 8), "I32": (torch.int32, 4)}
        buf = bytearray(data)
        for name, e in header.items():
            b, end = e["data_offsets"]
            tdt, size = dt[e["dtype"]]
            t = torch.frombuffer(buf, dtype=tdt, offset=b, count=(end - b) // size) if end > b else torch.zeros(0, dtype=tdt)
            out[name] = t.reshape(e["shape"])
    return out, meta


def expected(backend):
    """The values test_safetensors.c writes, computed in float32 the same way."""
    if backend == "numpy":
        import numpy as np
        f32 = np.float32
        i = np.arange(36, dtype=np.int64)
        kernel = (i % 17).astype(f32) * f32(0.5) - f32(3.0)
        adam_m = i.astype(f32) * f32(1e-3)
        bias = np.arange(10).astype(f32) / f32(8.0)
    else:
        import torch
        i = torch.arange(36, dtype=torch.int64)
        kernel = (i % 17).to(torch.float32) * 0.5 - 3.0
        adam_m = i.to(torch.float32) * torch.tensor(1e-3, dtype=torch.float32)
        bias = torch.arange(10).to(torch.float32) / 8.0
    return {
        "conv1/kernel": (kernel.reshape(3, 3, 1, 4), "F32"),
        "conv1/kernel/adam_m": (adam_m.reshape(3, 3, 1, 4), "F32"),
        "dense1/bias": (bias, "F32"),
    }


def main():
    path = sys.argv[1]
    backend = sys.argv[3] if len(sys.argv) > 3 and sys.argv[2] == "--backend" else None
    if backend is None:
        try:
            import numpy  # noqa: F401
            backend = "numpy"
        except ImportError:
            backend = "torch"
    tensors, meta = load(path, backend)
    want = expected(backend)
    names = set(want) | {"global_step", "empty"}
    assert set(tensors) == names, "tensor names %s" % sorted(tensors)
    for name, (values, _) in want.items():
        got = tensors[name]
        assert tuple(got.shape) == tuple(values.shape), "%s: shape %s" % (name, got.shape)
        assert (got == values).all(), "%s: values differ" % name
    assert tuple(tensors["global_step"].shape) == (), "global_step is not a scalar"
    assert int(tensors["global_step"]) == 1234567890123, "global_step %s" % tensors["global_step"]
    assert tuple(tensors["empty"].shape) == (0, 3)
    assert meta["dtrain_version"] == "0.1.0"
    assert meta["model"] == '# a model\nconv 3x3x4 "same" relu\ndense 10 # \u00e9t\u00e9\n', repr(meta["model"])
    try:  # the reference loader, when installed, must agree
        from safetensors.numpy import load_file
        ref = load_file(path)
        assert set(ref) == names and all((ref[k] == tensors[k]).all() for k in want)
        print("safetensors package agrees")
    except ImportError:
        pass
    print("ok: %d tensors, %d metadata keys (%s)" % (len(tensors), len(meta), backend))


if __name__ == "__main__":
    main()

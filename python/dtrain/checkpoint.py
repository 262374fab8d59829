"""Checkpoints as dicts of numpy arrays: the safetensors files dtrain writes
(docs/checkpoint-format.md), read with numpy alone."""
import json
import os
import struct

import numpy as np

_DTYPES = {"F32": np.float32, "F64": np.float64, "I64": np.int64, "I32": np.int32, "U8": np.uint8,
           "U64": np.uint64, "F16": np.float16, "BF16": None}


def read_safetensors(path):
    """(dict name -> numpy array, metadata dict) of a safetensors file; ValueError naming the file
    and the tensor when it is malformed."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        raise ValueError("%s: shorter than a safetensors header" % path)
    (hlen,) = struct.unpack("<Q", data[:8])
    if hlen > len(data) - 8:
        raise ValueError("%s: header of %d bytes in a file of %d" % (path, hlen, len(data)))
    header = json.loads(data[8:8 + hlen])
    meta = header.pop("__metadata__", {}) or {}
    body = memoryview(data)[8 + hlen:]
    out = {}
    for name, t in header.items():
        dt = _DTYPES.get(t.get("dtype"))
        if dt is None:
            raise ValueError("%s: tensor %s has dtype %s, which this reader does not take" % (path, name, t.get("dtype")))
        begin, end = t["data_offsets"]
        shape = tuple(t["shape"])
        count = int(np.prod(shape)) if shape else 1
        if not (0 <= begin <= end <= len(body)) or end - begin != count * np.dtype(dt).itemsize:
            raise ValueError("%s: tensor %s's offsets %d..%d do not fit its shape %s" % (path, name, begin, end, shape))
        out[name] = np.frombuffer(body[begin:end], dtype=np.dtype(dt).newbyteorder("<")).reshape(shape).copy()
    return out, meta


def load_checkpoint(path):
    """The tensors of a checkpoint file, or of the newest one a logdir's index names, as a dict of
    numpy arrays (variables by name, optimizer slots as "<var>/<slot>", "global_step")."""
    if os.path.isdir(path):
        index = os.path.join(path, "checkpoint")
        newest = None
        if os.path.exists(index):
            with open(index) as f:
                for line in f:
                    if line.startswith("model_checkpoint_path:"):
                        newest = line.split(":", 1)[1].strip().strip('"')
        if newest is None:
            files = sorted((f for f in os.listdir(path) if f.startswith("model.ckpt-") and f.endswith(".safetensors")),
                           key=lambda f: int(f[len("model.ckpt-"):-len(".safetensors")]))
            if not files:
                raise FileNotFoundError("%s holds no checkpoint" % path)
            newest = files[-1]
        path = os.path.join(path, newest)
    return read_safetensors(path)[0]

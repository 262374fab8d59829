#!/usr/bin/env python3
"""Writes fuzz/corpus/safetensors/unbounded.safetensors: a checkpoint of fuzz_safetensors.c's model (two
per-field tables of unbounded ids, dim 2, Adagrad) holding 3 and 0 rows, as a cluster's chief writes
one (docs/checkpoint-format.md, "Sparse tables"). Standard library only."""
import json
import os
import struct

tensors = []  # (name, dtype, shape, bytes)
ids = [0x68fd1e64, 7, (1 << 64) - 1]
tensors.append(("e/embeddings_0", "F32", [3, 2], struct.pack("<6f", 0.5, -0.25, 1, 2, 3, 4)))
tensors.append(("e/embeddings_0/adagrad_accumulator", "F32", [3, 2], struct.pack("<6f", *[0.1] * 6)))
tensors.append(("e/embeddings_0/ids", "U64", [3], struct.pack("<3Q", *ids)))
tensors.append(("e/embeddings_1", "F32", [0, 2], b""))
tensors.append(("e/embeddings_1/adagrad_accumulator", "F32", [0, 2], b""))
tensors.append(("e/embeddings_1/ids", "U64", [0], b""))
tensors.append(("global_step", "I64", [], struct.pack("<q", 30)))
header, at = {}, 0
for name, dtype, shape, b in tensors:
    header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [at, at + len(b)]}
    at += len(b)
text = json.dumps(header, separators=(",", ":")).encode()
text += b" " * (-len(text) % 8)
out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus", "safetensors", "unbounded.safetensors")
with open(out, "wb") as f:
    f.write(struct.pack("<Q", len(text)) + text + b"".join(t[3] for t in tensors))

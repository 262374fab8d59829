#!/usr/bin/env python3
"""The inputs of a click-log model exported by `dtrain export` (docs/export.md, "Click-log models"),
from Criteo TSV lines, computed as dtrain computes them: the reference in Python of the hash of an
id to its row (docs/ctr-data.md; dtrain's C is dt_ctr_hash and dt_ctr_bucket in
src/model/ctr_batch.h) and of the dense features' transform (dt_ctr_dense_value).

As a library:   feeds = ctr_features.onnx_feeds(lines, meta)   # meta: the model's metadata_props
As a command:
  ctr_features.py vectors            the hash's test vectors (tests/fixtures/ctr_hash_vectors.txt)
  ctr_features.py feeds MODEL.onnx CLICKS OUT_DIR
                                     each graph input of every line of CLICKS (Criteo TSV or
                                     libffm, as dtrain tells them apart) as a raw file
                                     OUT_DIR/NAME.bin (little-endian, row-major) and OUT_DIR/feeds.json
                                     (names, types, shapes); needs python3-onnx for the metadata
The hash needs nothing beyond Python; the feeds need numpy.
"""
import json
import math
import sys

M64 = (1 << 64) - 1
DENSE, FIELDS = 13, 26   # Criteo's TSV: label, I1-I13, C1-C26


def mix64(z):
    """splitmix64's finaliser: a bijection of 64-bit values."""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def ctr_hash(field, id_):
    """The stable hash of a categorical id of a field (0-based: C1 is 0); "CTRHASH1"."""
    return mix64((id_ ^ mix64((field ^ 0x4354524841534831) & M64)) & M64)


def bucket(field, id_, buckets):
    """The row of an id in an embedding table of `buckets` rows (buckets=N): dt_ctr_bucket."""
    return ctr_hash(field, id_) % buckets


def dense_value(x):
    """An integer feature as dtrain's reader gives it: log(1 + x) in float64, 0 for negative or
    missing (None), then float32 (the caller's numpy array rounds it)."""
    return 0.0 if x is None or x <= 0 else math.log1p(x)


def parse_criteo(line):
    """A Criteo TSV line: (label, [13 ints or None], bags): bags[f] is field f's [(id, value)], an
    id the value of its hex, of value 1; [] for an empty column (a missing field)."""
    cols = line.rstrip("\r\n").split("\t")
    if len(cols) != 1 + DENSE + FIELDS:
        raise ValueError(f"{len(cols)} columns, not {1 + DENSE + FIELDS}")
    dense = [int(c) if c else None for c in cols[1:1 + DENSE]]
    bags = [[(int(c, 16), 1.0)] if c else [] for c in cols[1 + DENSE:]]
    return int(cols[0]), dense, bags


def parse_libffm(line, fields):
    """A libffm line `label field:id:value ...`: (label, [], bags), bags[f] field f's ids with
    their values in the line's order (a field may hold several, or none)."""
    tok = line.split()
    bags = [[] for _ in range(fields)]
    for t in tok[1:]:
        f, i, v = t.split(":")
        bags[int(f)].append((int(i), float(v)))
    return (1 if tok[0] in ("1", "+1") else 0), [], bags


def onnx_feeds(rows, meta):
    """The graph's inputs for rows of (label, dense, bags) (parse_criteo's or parse_libffm's):
    `input` [n, dense] float32 when the model has dense features, and for each embedding of
    meta["embeddings"] (the model's metadata) its "<layer>:rows" int64 and "<layer>:values" float32
    [n, fields, ids], ids the most ids of one field in these rows (at least 1); a field with fewer
    ids is padded with row 0 of value 0, which adds nothing."""
    import numpy as np
    n = len(rows)
    feeds = {}
    if int(meta.get("dense_features", "0")):
        feeds["input"] = np.array([[dense_value(x) for x in d] for _, d, _ in rows], np.float32)
    for emb in json.loads(meta["embeddings"]):
        fields, buckets = emb["fields"], emb["buckets"]
        k = max([1] + [len(bags[f]) for _, _, bags in rows for f in fields])
        r = np.zeros((n, len(fields), k), np.int64)
        v = np.zeros((n, len(fields), k), np.float32)
        for i, (_, _, bags) in enumerate(rows):
            for s, f in enumerate(fields):
                for j, (id_, value) in enumerate(bags[f]):
                    r[i, s, j] = bucket(f, id_, buckets)
                    v[i, s, j] = value
        feeds[emb["rows_input"]] = r
        feeds[emb["values_input"]] = v
    return feeds


def vectors():
    """Test vectors: field, id, buckets, ctr_hash, bucket (hex, decimal, decimal)."""
    out = []
    ids = [0, 1, 2, 0x68FD1E64, 0xFFFFFFFF, 0xDEADBEEF, 1 << 32, M64, 0x8000000000000000, 12345678901234567]
    fields = [0, 1, 3, 12, 25, 38, 1023]
    buckets = [1, 2, 1000, 262144, 1048576, (1 << 31) - 1]
    k = 0
    for f in fields:
        for i in ids:
            b = buckets[k % len(buckets)]
            k += 1
            out.append(f"{f} {i:#x} {b} {ctr_hash(f, i):#018x} {bucket(f, i, b)}")
    return out


def main(argv):
    if argv[:1] == ["vectors"]:
        print("# field id buckets ctr_hash(field, id) bucket(field, id, buckets): scripts/ctr_features.py vectors")
        print("\n".join(vectors()))
        return 0
    if argv[:1] == ["feeds"] and len(argv) == 4:
        import os
        import numpy as np
        import onnx
        model = onnx.load(argv[1], load_external_data=False)
        meta = {p.key: p.value for p in model.metadata_props}
        lines = [line for line in open(argv[2]) if line.strip()]
        ffm = ":" in lines[0]   # dtrain's rule: libffm when the first line holds a ':'
        fields = int(meta["fields"])
        rows = [parse_libffm(x, fields) if ffm else parse_criteo(x) for x in lines]
        feeds = onnx_feeds(rows, meta)
        os.makedirs(argv[3], exist_ok=True)
        index = []
        for name, a in feeds.items():
            fname = name.replace(":", "_") + ".bin"
            a.tofile(os.path.join(argv[3], fname))
            index.append({"name": name, "file": fname, "type": "int64" if a.dtype == np.int64 else "float32",
                          "shape": list(a.shape)})
        json.dump(index, open(os.path.join(argv[3], "feeds.json"), "w"))
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

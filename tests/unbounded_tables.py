#!/usr/bin/env python3
"""Compares two dtrain checkpoints whose embedding tables may hold unbounded ids (docs/checkpoint-format.md,
"Sparse tables"): an unbounded table "<t>" is saved as its held rows, "<t>/ids" U64 [n], "<t>" F32 [n, dim]
and its slots "<t>/<slot>" [n, dim], in an order that depends on the ps tasks; it is compared as the map
id -> (row, slots), bit for bit. Every other tensor is compared byte for byte. Standard library only.

Usage: unbounded_tables.py A B      exit 0 when equal; prints the held rows of each unbounded table
       unbounded_tables.py A        prints the held rows of each unbounded table
"""
import json
import struct
import sys


def load(path):
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n].decode("utf-8"))
    header.pop("__metadata__", None)
    data = raw[8 + n:]
    return {k: (v["dtype"], v["shape"], data[v["data_offsets"][0]:v["data_offsets"][1]]) for k, v in header.items()}


def tables(t):
    """{table: {id: bytes of its values and slots}} for each unbounded table; the other tensors' names."""
    out, used = {}, set()
    for name, (dtype, shape, b) in t.items():
        if not name.endswith("/ids") or dtype != "U64":
            continue
        base = name[:-4]
        ids = struct.unpack("<%dQ" % shape[0], b)
        parts = sorted(k for k in t if k == base or (k.startswith(base + "/") and k != name))
        rows = {}
        for i, x in enumerate(ids):
            blob = b""
            for k in parts:
                width = len(t[k][2]) // max(shape[0], 1)
                blob += t[k][2][i * width:(i + 1) * width]
            assert x not in rows, "%s: id %d twice" % (name, x)
            rows[x] = blob
        out[base] = rows
        used.update(parts + [name])
    return out, set(t) - used


def main():
    a = load(sys.argv[1])
    ta, rest_a = tables(a)
    for k in sorted(ta):
        print("%s: %d rows held" % (k, len(ta[k])))
    if len(sys.argv) < 3:
        return 0 if ta else 1
    b = load(sys.argv[2])
    tb, rest_b = tables(b)
    bad = 0
    if set(ta) != set(tb) or rest_a != rest_b:
        print("different tensors: %s / %s" % (sorted(set(ta) ^ set(tb)), sorted(rest_a ^ rest_b)))
        return 1
    for k in sorted(ta):
        if ta[k] != tb[k]:
            diff = [x for x in set(ta[k]) | set(tb[k]) if ta[k].get(x) != tb[k].get(x)]
            print("%s: %d of %d/%d rows differ (id %d first)" % (k, len(diff), len(ta[k]), len(tb[k]), diff[0]))
            bad += 1
    for k in sorted(rest_a):
        if a[k] != b[k]:
            print("%s differs" % k)
            bad += 1
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

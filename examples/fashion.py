"""Fashion-MNIST from numpy arrays: alone, or one task of a cluster (the source's three changes).

    python3 examples/fashion.py [DATA_DIR] [dtrain train flags]
    dtrain launch --ps 1 --workers 2 --issync=1 -- python3 examples/fashion.py
"""
import gzip
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import dtrain  # noqa: E402  (the checkout's package; an installed one needs no path)


def idx(path, header):
    with gzip.open(path) as f:
        return np.frombuffer(f.read(), np.uint8, offset=header)


# 1. The cluster from the same flags as `dtrain train` (--ps_hosts ... as dtrain launch passes them).
flags, args = dtrain.parse_args()
data = args[0] if args else "/usr/share/datasets/fashion-mnist"
x, tx = (idx(f"{data}/{p}-images-idx3-ubyte.gz", 16).reshape(-1, 28, 28, 1) for p in ("train", "t10k"))
y, ty = (idx(f"{data}/{p}-labels-idx1-ubyte.gz", 8) for p in ("train", "t10k"))
model = dtrain.Model(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "models", "fashion.model"),
                     **dict(dict(batch_size=64, logdir="", summary_dir=""), **flags))
# 2. A ps serves until the chief ends training; 3. workers push to it (sync with --issync=1).
result = model.fit(x, y, test=(tx, ty), every=200,
                   callback=lambda step, loss, acc: print(f"step {step}: batch loss {loss:.3f}", flush=True))
if flags.get("job_name", "worker") == "worker" and flags.get("task_index", "0") == "0":
    print(f"test accuracy {result['test_accuracy']:.4f} after {result['steps']} steps")

"""A click-log model trained from a CSV read with numpy (no pandas): a header, then per row
label,I1..I13,C1..C26 (Criteo's columns: integers, hex ids; an empty cell is missing).

    python3 examples/clicks.py clicks.csv [models/lr.model | models/fm.model] [dtrain train flags]
    dtrain launch --ps 1 --workers 2 -- python3 examples/clicks.py clicks.csv models/fm.model
"""
import numpy as np

import dtrain

flags, rest = dtrain.parse_args()  # train's flags (and the cluster's under dtrain launch)
path = rest[0] if rest else "clicks.csv"
model = rest[1] if len(rest) > 1 else "models/lr.model"

cells = np.loadtxt(path, dtype=str, delimiter=",", skiprows=1, ndmin=2)
labels = cells[:, 0].astype(np.int8)
ints = np.where(cells[:, 1:14] == "", "0", cells[:, 1:14]).astype(np.int64)
dense = np.log1p(np.maximum(ints, 0)).astype(np.float32)  # dtrain's transform of Criteo's integers

# the ids of the cells present, row by row in field order; offsets mark each row's fields
cats = cells[:, 14:40]
present = cats != ""
ids = np.array([int(c, 16) for c in cats[present]], np.uint64)
offsets = np.zeros(cats.size + 1, np.int64)
np.cumsum(present.reshape(-1), out=offsets[1:])

clicks = dtrain.Clicks(labels, ids, offsets=offsets, dense=dense, fields=26)
result = dtrain.train(model, clicks=clicks, **flags)
if result["test_examples"]:  # the chief, or one process (a ps reports none)
    print("test auc %.4f  test logloss %.4f" % (result["test_auc"], result["test_logloss"]))

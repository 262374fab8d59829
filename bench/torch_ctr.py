#!/usr/bin/python3
"""The PyTorch baseline for click-through-rate models (issue 22): LR, FM or DeepFM over a click log
in Criteo's layout, with hashed embedding tables trained by sparse Adagrad, the same recipe a dtrain
model file gives. Prints the training speed (examples per second of the training loop alone: the
batches are built before the clock starts) and the test split's AUC and logloss.

    /usr/bin/python3 bench/torch_ctr.py FILE [--model lr|fm|deepfm] [--buckets N] [--dim K]
        [--factor_buckets N] [--hidden 400,400] [--lr 0.05] [--batch 256] [--threads T] [--epochs E] [--seed S]
        [--dense_optimizer adagrad|adam] [--dense_lr R] [--schedule constant|cosine]

Reads FILE (plain TSV) with dtrain's reader's conventions (bench/ctr_lr_reference.py: the split by
a hash of the line number, log(1 + x) of the integers, negatives and empties as 0), and hashes each
(field, id) to a bucket as dtrain's embedding layer does (docs/ctr-data.md):
    bucket = mix64(id ^ mix64(field ^ 0x4354524841534831)) % buckets
An empty categorical column contributes nothing (a zero row). The tables are nn.EmbeddingBag /
nn.Embedding with sparse=True (only the touched rows' gradients are built) and every parameter is
trained by torch.optim.Adagrad (initial accumulator 0.1, TensorFlow's default), one epoch in file
order. With --dense_optimizer adam the dense part (the integer features' weights and bias, the MLP)
is trained by Adam (TensorFlow's epsilon 1e-8) at --dense_lr, cosine-decayed to 0 over the run
with --schedule cosine, and the linear part starts from zeros: dtrain's recipe for its model files
(`--optimizer adam --lr_schedule cosine --table_optimizer adagrad`), for bench/ctr_parity.sh.
Last line: one JSON object with the figures.
"""
import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ctr_lr_reference import auc_logloss, read  # noqa: E402  (the reader's conventions, once)

FIELDS, DENSE = 26, 13


def mix64(z):
    """splitmix64's finaliser over a uint64 array (numpy's uint64 arithmetic wraps mod 2^64)."""
    with np.errstate(over="ignore"):
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def buckets_of(cats, buckets):
    """[n, 26] raw ids (-1: empty) -> [n, 26] row numbers in one table of 26 x buckets + 1 rows, the
    last row (all zeros, never trained) standing for an empty column."""
    out = np.empty(cats.shape, np.int64)
    for f in range(FIELDS):
        salt = mix64(np.array([f ^ 0x4354524841534831], np.uint64))[0]
        h = mix64(cats[:, f].astype(np.uint64) ^ salt) % np.uint64(buckets)
        out[:, f] = np.where(cats[:, f] >= 0, f * buckets + h.astype(np.int64), FIELDS * buckets)
    return out


class CTR(torch.nn.Module):
    """logit = b + dense . u + sum_f w[row_f]  (lr)  + FM's pairs of v[row_f]  (fm)
    + an MLP over [dense, v[row_1..26]]  (deepfm)."""

    def __init__(self, kind, buckets, dim, hidden, factor_buckets):
        super().__init__()
        rows, frows = FIELDS * buckets + 1, FIELDS * factor_buckets + 1
        self.kind, self.dim = kind, dim
        self.w = torch.nn.EmbeddingBag(rows, 1, mode="sum", sparse=True, padding_idx=rows - 1)
        torch.nn.init.zeros_(self.w.weight)
        self.u = torch.nn.Linear(DENSE, 1)
        if kind != "lr":
            self.v = torch.nn.Embedding(frows, dim, sparse=True, padding_idx=frows - 1)
            torch.nn.init.normal_(self.v.weight, std=0.01)
            with torch.no_grad():
                self.v.weight[frows - 1].zero_()
        if kind == "deepfm":
            layers, width = [], DENSE + FIELDS * dim
            for h in hidden:
                layers += [torch.nn.Linear(width, h), torch.nn.ReLU()]
                width = h
            layers.append(torch.nn.Linear(width, 1))
            self.mlp = torch.nn.Sequential(*layers)

    def forward(self, rows, frows, dense):
        logit = self.w(rows).squeeze(1) + self.u(dense).squeeze(1)
        if self.kind != "lr":
            v = self.v(frows)  # [B, 26, k]
            s = v.sum(1)
            logit = logit + 0.5 * (s * s - (v * v).sum(1)).sum(1)  # the O(k n) sum-square form
        if self.kind == "deepfm":
            logit = logit + self.mlp(torch.cat([dense, v.flatten(1)], 1)).squeeze(1)
        return logit


def optimizers(model, a, steps):
    """Adagrad for everything (the speed baseline), or Adagrad for the tables and Adam for the rest
    (dtrain's recipe), with the dense rate's cosine decay to 0 over `steps` as dtrain's schedule."""
    if a.dense_optimizer == "adagrad":
        return [torch.optim.Adagrad(model.parameters(), lr=a.lr, initial_accumulator_value=0.1)], None
    with torch.no_grad():  # dtrain's model files start the linear part at 0
        model.u.weight.zero_()
        model.u.bias.zero_()
    tables = [p for n, p in model.named_parameters() if n.split(".")[0] in ("w", "v")]
    dense = [p for n, p in model.named_parameters() if n.split(".")[0] not in ("w", "v")]
    adam = torch.optim.Adam(dense, lr=a.dense_lr, eps=1e-8)
    sched = None
    if a.schedule == "cosine":
        sched = torch.optim.lr_scheduler.LambdaLR(adam, lambda t: 0.5 * (1 + math.cos(math.pi * min(t, steps) / steps)))
    return [torch.optim.Adagrad(tables, lr=a.lr, initial_accumulator_value=0.1), adam], sched


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("file")
    ap.add_argument("--model", choices=["lr", "fm", "deepfm"], default="lr")
    ap.add_argument("--buckets", type=int, default=1 << 20, help="rows per field's table")
    ap.add_argument("--factor_buckets", type=int, default=0,
                    help="rows per field's factor table (fm, deepfm; models/fm.model: 2^18); 0: --buckets")
    ap.add_argument("--dim", type=int, default=8)
    ap.add_argument("--hidden", default="400,400")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--dense_optimizer", choices=["adagrad", "adam"], default="adagrad",
                    help="the dense part's optimizer (adagrad: --lr, as the tables)")
    ap.add_argument("--dense_lr", type=float, default=0.003, help="with --dense_optimizer adam")
    ap.add_argument("--schedule", choices=["constant", "cosine"], default="constant",
                    help="the dense part's rate with --dense_optimizer adam (the tables' stays constant)")
    a = ap.parse_args()
    torch.manual_seed(a.seed)
    torch.set_num_threads(a.threads)
    y, dense, cats, which = read(a.file)
    fb = a.factor_buckets or a.buckets
    rows = torch.from_numpy(buckets_of(cats, a.buckets))
    frows = rows if fb == a.buckets else torch.from_numpy(buckets_of(cats, fb))
    dense_t, y_t = torch.from_numpy(dense).float(), torch.from_numpy(y).float()
    tr, te = torch.from_numpy(which == 0), torch.from_numpy(which == 2)
    model = CTR(a.model, a.buckets, a.dim, [int(h) for h in a.hidden.split(",") if h], fb)
    R, F, D, Y = rows[tr], frows[tr], dense_t[tr], y_t[tr]
    batches = [(R[s:s + a.batch], F[s:s + a.batch], D[s:s + a.batch], Y[s:s + a.batch])
               for s in range(0, len(Y), a.batch)]
    opts, sched = optimizers(model, a, len(batches) * a.epochs)
    loss_fn = torch.nn.BCEWithLogitsLoss(reduction="mean")
    t0 = time.perf_counter()
    for _ in range(a.epochs):
        for r, f, d, yy in batches:
            for o in opts:
                o.zero_grad(set_to_none=True)
            loss_fn(model(r, f, d), yy).backward()
            for o in opts:
                o.step()
            if sched:
                sched.step()
    seconds = time.perf_counter() - t0
    with torch.no_grad():
        p = torch.sigmoid(model(rows[te], frows[te], dense_t[te])).double().numpy()
    auc, ll = auc_logloss(p, y[te.numpy()])
    n = len(Y) * a.epochs
    print(f"{a.file}: pytorch {torch.__version__} {a.model}, {a.threads} thread(s), batch {a.batch}, "
          f"{a.buckets} buckets/field, dim {a.dim}: {n / seconds:.0f} examples/s, test AUC {auc:.6f}, "
          f"logloss {ll:.6f}")
    print(json.dumps({"bench": "torch_ctr", "model": a.model, "threads": a.threads, "batch": a.batch,
                      "buckets": a.buckets, "factor_buckets": fb, "dim": a.dim, "examples": n, "seconds": seconds,
                      "examples_per_s": n / seconds, "auc": auc, "logloss": ll}))


if __name__ == "__main__":
    main()

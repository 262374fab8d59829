#!/usr/bin/python3
"""A reference logistic regression on a Criteo-layout click log, in numpy only: how close a plain
learner gets to the Bayes-optimal AUC that `dtrain gen-clicks` prints (docs/ctr-data.md).

    /usr/bin/python3 bench/ctr_lr_reference.py FILE [LEARNING_RATE] [BATCH]

Reads FILE (plain TSV) with the reader's conventions: the split rule (a hash of the line number,
validation 0.1, test 0.1), log(1 + x) of the integers with negatives and empties as 0, one weight per
raw id per field (ids first seen in the test split, and missing fields, weigh 0). Trains one epoch
over the training lines in file order with Adagrad (lazy: only the rows a batch touched), then prints
the test split's AUC (rank formula, average ranks for ties) and logloss (clipped at 1e-7).
"""
import sys

import numpy as np

M = (1 << 64) - 1


def mix64(z):
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M
    return z ^ (z >> 31)


def split(line_no):
    u = (mix64(line_no ^ 0x43545253504C4954) >> 11) / 2.0**53
    return 2 if u < 0.1 else 1 if u < 0.2 else 0


def read(path):
    y, dense, cats, which = [], [], [], []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            c = line.rstrip("\n").split("\t")
            y.append(int(c[0]))
            dense.append([float(np.log1p(max(int(v), 0))) if v else 0.0 for v in c[1:14]])
            cats.append([int(v, 16) if v else -1 for v in c[14:40]])
            which.append(split(n))
    return np.array(y, np.float64), np.array(dense), np.array(cats, np.int64), np.array(which)


def auc_logloss(p, y):
    P = int(y.sum())
    N = len(y) - P
    _, inv, cnt = np.unique(p, return_inverse=True, return_counts=True)
    first = np.concatenate(([0], np.cumsum(cnt)[:-1]))
    r = ((2 * first + 1 + cnt) / 2.0)[inv]
    auc = (r[y == 1].sum() - P * (P + 1) / 2.0) / (P * N)
    pc = np.clip(p, 1e-7, 1 - 1e-7)
    return auc, float(np.mean(-(y * np.log(pc) + (1 - y) * np.log1p(-pc))))


def main():
    path = sys.argv[1]
    lr = float(sys.argv[2]) if len(sys.argv) > 2 else 0.02
    B = int(sys.argv[3]) if len(sys.argv) > 3 else 256
    y, dense, cats, which = read(path)
    tr, te = which == 0, which == 2
    # Row of each (field, id): ids seen in training get rows 1.., everything else row 0 (weight 0).
    rows_tr = np.zeros((tr.sum(), 26), np.int64)
    rows_te = np.zeros((te.sum(), 26), np.int64)
    base = 0
    for f in range(26):
        known, inv = np.unique(cats[tr, f], return_inverse=True)
        rows_tr[:, f] = np.where(cats[tr, f] >= 0, base + 1 + inv, 0)
        pos = np.clip(np.searchsorted(known, cats[te, f]), 0, len(known) - 1)
        hit = (known[pos] == cats[te, f]) & (cats[te, f] >= 0)
        rows_te[:, f] = np.where(hit, base + 1 + pos, 0)
        base += len(known)
    W, G = np.zeros(base + 1), np.full(base + 1, 1e-8)
    u, gu, b, gb = np.zeros(13), np.full(13, 1e-8), 0.0, 1e-8
    Y, D = y[tr], dense[tr]
    for s in range(0, len(Y), B):
        i, d = rows_tr[s:s + B], D[s:s + B]
        g = 1 / (1 + np.exp(-(W[i].sum(1) + d @ u + b))) - Y[s:s + B]  # d(logloss)/d(logit), summed
        rows, inv = np.unique(i.ravel(), return_inverse=True)
        gr = np.bincount(inv, weights=np.repeat(g, 26), minlength=len(rows))
        G[rows] += gr * gr
        W[rows] -= lr * gr / np.sqrt(G[rows])
        W[0] = 0
        gd = d.T @ g
        gu += gd * gd
        u -= lr * gd / np.sqrt(gu)
        gb += g.sum() ** 2
        b -= lr * g.sum() / np.sqrt(gb)
    p = 1 / (1 + np.exp(-(W[rows_te].sum(1) + dense[te] @ u + b)))
    auc, ll = auc_logloss(p, y[te])
    print(f"{path}: numpy Adagrad LR, 1 epoch, lr {lr}, batch {B}: test AUC {auc:.6f}, logloss {ll:.6f} "
          f"({tr.sum()} training lines, {te.sum()} test lines)")


if __name__ == "__main__":
    main()

#!/usr/bin/env bash
# dtrain gen-clicks from the command line: its refusals (one line, status 2), reproducibility, gzip,
# and the Bayes-optimal figures it prints checked independently: numpy recomputes each split from
# the file's labels, the true probabilities (--probs) and the split rule as docs/ctr-data.md writes
# it (skipped, passing, where /usr/bin/python3 lacks numpy).
. "$(dirname "$0")/lib.sh"
cd "${DTRAIN_SRC:-$(dirname "$0")/..}"

expect_error "no --out" 2 "gen-clicks: --out: no file given" "$bin" gen-clicks --lines 10
expect_error "a bad model" 2 "--model svm: expected lr or fm" "$bin" gen-clicks --out "$tmp/x" --model svm
expect_error "a vocabulary of 0" 2 "--vocab 0: each count must be an integer from 1 to 2\^32" \
  "$bin" gen-clicks --out "$tmp/x" --vocab 0
expect_error "3 vocabularies" 2 "give one count for every field, or 26" "$bin" gen-clicks --out "$tmp/x" --vocab 10,20,30
expect_error "zipf 0" 2 "zipf" "$bin" gen-clicks --out "$tmp/x" --zipf 0
expect_error "fractions over 1" 2 "add up to at most 1" "$bin" gen-clicks --out "$tmp/x" --test_fraction 0.6 \
  --validation_fraction 0.6
"$bin" gen-clicks --help | grep -q -- "--vocab" && ok "--help lists the flags" || bad "--help lists the flags"

run() { timeout --foreground 120 "$bin" gen-clicks --lines 20000 --vocab 1e5 "$@"; }
run --seed 3 --out "$tmp/a.tsv" --probs "$tmp/a.p" >"$tmp/a.out" 2>"$tmp/a.err"
check "writes a file and its report" [ -s "$tmp/a.tsv" ] && grep -q "^test " "$tmp/a.out"
run --seed 3 --out "$tmp/b.tsv.gz" >"$tmp/b.out"
check "the same seed gives the same lines, gzip or not" cmp -s "$tmp/a.tsv" <(gzip -dc "$tmp/b.tsv.gz")
check "and the same report" cmp -s <(tail -n +2 "$tmp/a.out") <(tail -n +2 "$tmp/b.out")
run --out "$tmp/c.tsv" --seed 4 >/dev/null
cmp -s "$tmp/a.tsv" "$tmp/c.tsv"
check "another seed, another file" [ $? -ne 0 ]
check "40 columns on every line" [ "$(awk -F'\t' 'NF != 40' "$tmp/a.tsv" | wc -l)" = 0 ]
check "a line per line of probabilities" [ "$(wc -l <"$tmp/a.p")" = 20000 ]
run --seed 3 --out "$tmp/fm.tsv" --model fm --fm_dim 4 >"$tmp/fm.out"
check "fm is named in the report" grep -q "model fm (dim 4)" "$tmp/fm.out"

py=/usr/bin/python3
if [ -x "$py" ] && "$py" -c 'import numpy' 2>/dev/null; then
  "$py" - "$tmp/a.tsv" "$tmp/a.p" "$tmp/a.out" >"$tmp/py.out" 2>&1 <<'PY'
import sys
import numpy as np
tsv, probs, report = sys.argv[1:4]
M = (1 << 64) - 1
def mix64(z):
    z = ((z ^ (z >> 30)) * 0xbf58476d1ce4e5b9) & M
    z = ((z ^ (z >> 27)) * 0x94d049bb133111eb) & M
    return z ^ (z >> 31)
def split(line):  # docs/ctr-data.md: the split rule, validation 0.1, test 0.1
    u = (mix64(line ^ 0x43545253504c4954) >> 11) / 2.0**53
    return 2 if u < 0.1 else 1 if u < 0.2 else 0
y = np.array([int(l.split("\t", 1)[0]) for l in open(tsv)], dtype=np.int64)
p = np.array([float(l) for l in open(probs)], dtype=np.float64)
s = np.array([split(i + 1) for i in range(len(y))])
printed = {}
for l in open(report):
    f = l.split()
    if f and f[0] in ("train", "validation", "test"):
        printed[f[0]] = (int(f[1]), int(f[2]), float(f[4]), float(f[5]))
bad = 0
for k, name in enumerate(("train", "validation", "test")):
    yy, pp = y[s == k], p[s == k]
    P, N = int(yy.sum()), int(len(yy) - yy.sum())
    _, inv, counts = np.unique(pp, return_inverse=True, return_counts=True)
    first = np.concatenate(([0], np.cumsum(counts)[:-1]))
    ranks = (first + 1 + first + counts) / 2.0  # average rank of each distinct value
    auc = (ranks[inv][yy == 1].sum() - P * (P + 1) / 2.0) / (P * N)
    pc = np.clip(pp, 1e-7, 1 - 1e-7)
    ll = float(np.mean(-(yy * np.log(pc) + (1 - yy) * np.log1p(-pc))))
    got = printed[name]
    ok = got[0] == len(yy) and got[1] == P and abs(got[2] - auc) <= 6e-7 and abs(got[3] - ll) <= 6e-7
    print(f"{name}: numpy lines {len(yy)} positives {P} auc {auc:.7f} logloss {ll:.7f}; printed {got}: {'ok' if ok else 'MISMATCH'}")
    bad += not ok
sys.exit(1 if bad else 0)
PY
  st=$?
  cat "$tmp/py.out"
  check "numpy's AUC and logloss of the true probabilities are the printed Bayes figures, split by the documented rule" [ $st -eq 0 ]
else
  echo "skip: $py has no numpy; the printed figures are not recomputed"
fi
summary

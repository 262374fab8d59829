"""Checks of a click-log model exported by `dtrain export` (tests/test_export_ctr.sh), run with Debian's
/usr/bin/python3 (python3-numpy, python3-onnx, python3-opencv), beside scripts/ctr_features.py (the
reference of the inputs: the hash, the transform):

  check_ctr.py test_split CLICKS OUT        the lines of CLICKS that dtrain calls test (docs/ctr-data.md)
  check_ctr.py checker MODEL.onnx           onnx.checker (full: shapes inferred), inputs, outputs, metadata
  check_ctr.py compare PRED.csv PROBS.f32 NAME
                                            every line's probability within TOLERANCE of dtrain predict's
  check_ctr.py opencv MODEL.onnx FEEDS_DIR PRED.csv
                                            OpenCV's dnn runs it and agrees as well, or refuses it for the
                                            operator docs/export.md says it lacks (Gather of indices given
                                            at run time)

A failed check prints one line and exits 1.
"""
import csv
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "scripts"))
import ctr_features  # noqa: E402

TOLERANCE = 1e-5


def fail(msg):
    print(f"FAIL {msg}")
    sys.exit(1)


def predictions(path):
    rows = list(csv.reader(open(path, newline="")))
    if not rows or rows[0][:3] != ["line", "label", "probability"]:  # then a file column (several files)
        fail(f"{path}: not a dtrain predict file of a click-log model")
    return np.array([float(r[2]) for r in rows[1:]], np.float64)


def compare(pred, probs, name):
    want = predictions(pred)
    got = np.fromfile(probs, np.float32).astype(np.float64)
    if got.shape != want.shape:
        fail(f"{name}: {got.size} probabilities for {want.size} lines")
    if not np.all(np.isfinite(got)):
        fail(f"{name}: {int(np.sum(~np.isfinite(got)))} probabilities are not finite")
    diff = np.abs(got - want)
    worst = int(diff.argmax())
    if diff[worst] > TOLERANCE:
        fail(f"{name}: line {worst + 1}: {got[worst]:.9g} against dtrain's {want[worst]:.9g} "
             f"({int(np.sum(diff > TOLERANCE))} of {want.size} lines off by more than {TOLERANCE})")
    print(f"{name}: {want.size} lines, max |p - dtrain| {diff.max():.3g} (mean {diff.mean():.3g}), "
          f"probabilities {want.min():.4f} to {want.max():.4f}")


def test_split(clicks, out):
    """dt_ctr_line_split with the default fractions: u < 0.1 is test."""
    n = 0
    with open(clicks) as f, open(out, "w") as o:
        for no, line in enumerate(f, 1):
            u = (ctr_features.mix64(no ^ 0x43545253504C4954) >> 11) / 2.0**53
            if u < 0.1:
                o.write(line)
                n += 1
    print(f"{n} test lines")


def checker(path):
    import onnx
    onnx.checker.check_model(path, full_check=True)
    m = onnx.load(path, load_external_data=False)
    meta = {p.key: p.value for p in m.metadata_props}
    for key in ("input_kind", "hash", "embeddings", "fields", "dense_features", "dense_transform"):
        if key not in meta:
            fail(f"{path}: metadata has no {key}")
    embs = json.loads(meta["embeddings"])
    want = (["input"] if int(meta["dense_features"]) else []) + \
        [n for e in embs for n in (e["rows_input"], e["values_input"])]
    got = [i.name for i in m.graph.input]
    if got != want:
        fail(f"{path}: inputs {got}, expected {want}")
    outs = [o.name for o in m.graph.output]
    if outs != ["logits", "probabilities"]:
        fail(f"{path}: outputs {outs}")
    print(f"{path}: checker passes; inputs {', '.join(got)}; {len(embs)} embeddings")


def opencv(model, feeds_dir, pred):
    import cv2
    try:
        net = cv2.dnn.readNetFromONNX(model)
    except cv2.error as e:
        msg = " ".join(str(e).split())
        if "Gather" in msg:
            print(f"OpenCV {cv2.__version__} refuses it, as docs/export.md says: {msg[msg.find('Node ['):][:160]}")
            return
        fail(f"OpenCV {cv2.__version__} refuses it for another reason than Gather: {msg[:300]}")
    feeds = json.load(open(os.path.join(feeds_dir, "feeds.json")))
    for f in feeds:
        a = np.fromfile(os.path.join(feeds_dir, f["file"]), np.int64 if f["type"] == "int64" else np.float32)
        net.setInput(a.reshape(f["shape"]), f["name"])
    out = net.forward("probabilities").astype(np.float32).ravel()
    out.tofile(model + ".cv.f32")
    compare(pred, model + ".cv.f32", f"OpenCV {cv2.__version__}")


def main(a):
    if a[:1] == ["test_split"] and len(a) == 3:
        return test_split(a[1], a[2])
    if a[:1] == ["checker"] and len(a) == 2:
        return checker(a[1])
    if a[:1] == ["compare"] and len(a) == 4:
        return compare(a[1], a[2], a[3])
    if a[:1] == ["opencv"] and len(a) == 4:
        return opencv(a[1], a[2], a[3])
    print(__doc__, file=sys.stderr)
    sys.exit(2)


if __name__ == "__main__":
    main(sys.argv[1:])

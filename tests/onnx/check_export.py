"""Checks of an ONNX file written by `dtrain export` (tests/test_export.sh, bench/onnx), run with
Debian's /usr/bin/python3 (python3-onnx, python3-opencv, python3-numpy):

  check_export.py inputs LOGITS.csv H W C OUT.f32     the images of `dtrain predict --logits`'s rows
                                                      as the graph's input (float32 NHWC, pixel / 255)
  check_export.py checker MODEL.onnx [OPSET]          onnx.checker, the inputs, outputs and metadata
  check_export.py opencv MODEL.onnx IN.f32 LOGITS.f32 PROBS.f32    OpenCV's dnn module runs it
  check_export.py compare LOGITS.csv LOGITS.f32 PROBS.f32 NAME     against dtrain's logits

Inputs are decoded here as dtrain decodes them only when no resizing is involved: IDX rows, and
PNG files of exactly the model's size (dtrain's bilinear resize is then the identity), so the
float32 values are dtrain's, bit for bit. A failed check prints one line and exits 1.
"""
import csv
import gzip
import json
import re
import sys

import numpy as np

TOLERANCE = 1e-4   # |onnx - dtrain| <= TOLERANCE * max(|dtrain|, 1e-2 * max |dtrain| over the batch)
TIE = 1e-5         # an arg-max may differ only where dtrain's two largest logits are this close


def fail(msg):
    print(f"FAIL {msg}")
    sys.exit(1)


def read_logits(path):
    rows = list(csv.reader(open(path, newline="")))
    if len(rows) < 2 or not rows[0][0] == "file":
        fail(f"{path}: not a dtrain predict --logits file")
    return [r[0] for r in rows[1:]], np.array([[float(v) for v in r[1:]] for r in rows[1:]], np.float32)


def idx_images(path, cache={}):
    if path not in cache:
        raw = open(path, "rb").read()
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
        if raw[:4] != b"\x00\x00\x08\x03":
            fail(f"{path}: not an IDX images file")
        n, h, w = (int.from_bytes(raw[4 + 4 * k:8 + 4 * k], "big") for k in range(3))
        cache[path] = np.frombuffer(raw, np.uint8, n * h * w, 16).reshape(n, h, w)
    return cache[path]


def image(name, h, w, c):
    import cv2
    m = re.fullmatch(r"(.*)\[(\d+)\]", name)
    if m:
        px = idx_images(m.group(1))[int(m.group(2))][..., None]
    else:
        px = cv2.imread(name, cv2.IMREAD_GRAYSCALE if c == 1 else cv2.IMREAD_COLOR)
        if px is None:
            fail(f"{name}: OpenCV cannot read it")
        px = px[..., None] if c == 1 else cv2.cvtColor(px, cv2.COLOR_BGR2RGB)
    if px.shape != (h, w, c):
        fail(f"{name}: {px.shape} is not the model's {h}x{w}x{c}: test images must be of the model's size")
    return px.astype(np.float32) / np.float32(255)   # dtrain: (float)pixel / 255.0f


def cmd_inputs(logits_csv, h, w, c, out):
    names, _ = read_logits(logits_csv)
    h, w, c = int(h), int(w), int(c)
    x = np.stack([image(n, h, w, c) for n in names]).astype(np.float32)
    x.tofile(out)
    json.dump(list(x.shape), open(out + ".json", "w"))
    print(f"{len(names)} inputs of {h}x{w}x{c}")


def cmd_checker(model, opset=None):
    import onnx
    m = onnx.load(model)
    onnx.checker.check_model(m, full_check=True)
    if opset and m.opset_import[0].version != int(opset):
        fail(f"opset {m.opset_import[0].version}, asked for {opset}")
    ins = [(i.name, [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim]) for i in m.graph.input]
    outs = [o.name for o in m.graph.output]
    if len(ins) != 1 or ins[0][0] != "input" or ins[0][1][0] != "batch" or outs != ["logits", "probabilities"]:
        fail(f"inputs {ins}, outputs {outs}: want input [batch, H, W, C], outputs logits, probabilities")
    meta = {p.key: p.value for p in m.metadata_props}
    for key in ("dtrain_version", "model_name", "global_step", "input_normalisation", "input_layout"):
        if key not in meta:
            fail(f"metadata {key} missing: {meta}")
    if meta["input_normalisation"] != "pixel / 255" or meta["input_layout"] != "NHWC":
        fail(f"metadata {meta}")
    ops = sorted({n.op_type for n in m.graph.node})
    print(f"onnx.checker passes (opset {m.opset_import[0].version}, IR {m.ir_version}); {len(m.graph.node)} nodes: "
          f"{' '.join(ops)}; metadata {json.dumps(meta)}")


def load_inputs(path):
    shape = json.load(open(path + ".json"))
    return np.fromfile(path, np.float32).reshape(shape)


def cmd_opencv(model, inputs, logits_out, probs_out):
    import cv2
    net = cv2.dnn.readNetFromONNX(model)
    x = load_inputs(inputs)
    logits, probs = [], []
    at, k = 0, 0
    while at < len(x):   # batches of 1, 7, then 64: the symbolic batch at work
        m = min(len(x) - at, (1, 7)[k] if k < 2 else 64)
        net.setInput(np.ascontiguousarray(x[at:at + m]))
        lo, pr = net.forward(["logits", "probabilities"])
        logits.append(lo.reshape(m, -1))
        probs.append(pr.reshape(m, -1))
        at, k = at + m, k + 1
    np.concatenate(logits).astype(np.float32).tofile(logits_out)
    np.concatenate(probs).astype(np.float32).tofile(probs_out)
    print(f"OpenCV {cv2.__version__}: {len(x)} images")


def cmd_compare(logits_csv, logits_f32, probs_f32, name):
    names, ref = read_logits(logits_csv)
    got = np.fromfile(logits_f32, np.float32)
    probs = np.fromfile(probs_f32, np.float32)
    if got.size != ref.size or probs.size != ref.size:
        fail(f"{name}: {got.size} logits and {probs.size} probabilities for dtrain's {ref.size}")
    got, probs = got.reshape(ref.shape), probs.reshape(ref.shape)
    scale = np.maximum(np.abs(ref), 1e-2 * np.abs(ref).max())
    rel = np.abs(got.astype(np.float64) - ref) / scale
    worst = np.unravel_index(rel.argmax(), rel.shape)
    top2 = np.sort(ref, axis=1)[:, -2:]
    differ = np.flatnonzero(got.argmax(1) != ref.argmax(1))
    ties = [int(i) for i in differ if top2[i, 1] - top2[i, 0] <= TIE * max(1.0, abs(top2[i, 1]))]
    e = np.exp(ref.astype(np.float64) - ref.max(1, keepdims=True))
    soft = e / e.sum(1, keepdims=True)
    perr = np.abs(probs - soft).max()
    line = (f"{name}: {len(ref)} images, logits within {rel.max():.2e} of dtrain's relative (bound {TOLERANCE:g}; "
            f"worst {names[worst[0]]} class {worst[1]}), arg-max agrees on {len(ref) - len(differ)}/{len(ref)}"
            f"{f' ({len(ties)} near-ties)' if ties else ''}, probabilities within {perr:.1e} of dtrain's softmax")
    if rel.max() > TOLERANCE or len(differ) > len(ties) or perr > 1e-5:
        fail(line)
    print(line)


if __name__ == "__main__":
    cmds = {"inputs": cmd_inputs, "checker": cmd_checker, "opencv": cmd_opencv, "compare": cmd_compare}
    if len(sys.argv) < 2 or sys.argv[1] not in cmds:
        fail(f"usage: check_export.py {{{','.join(cmds)}}} ...")
    try:
        cmds[sys.argv[1]](*sys.argv[2:])
    except Exception as e:  # one line, whatever broke (a parse error of the file, a runtime's refusal)
        fail(f"{sys.argv[1]}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")

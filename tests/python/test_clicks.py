"""Click-log models from Python (docs/python.md, "Click logs"): ids per field with offsets, dense
features and 0/1 labels as numpy arrays train as `dtrain train` trains the same rows as a click log."""
import os
import subprocess

import numpy as np
import pytest

import dtrain
from conftest import cli_env, python_cmd

QUIET = dict(threads=1, logdir="", summary_dir="")


def _libffm(n, fields, seed):
    """n rows of 0..2 ids per field (multi-valued and missing fields), weights, 0/1 labels: as
    arrays, and as the libffm lines that hold the same (ids in field order, as the reader groups them)."""
    rng = np.random.default_rng(seed)
    counts = rng.integers(0, 3, size=n * fields)
    offsets = np.zeros(n * fields + 1, np.int64)
    np.cumsum(counts, out=offsets[1:])
    ids = rng.integers(0, 1000, size=offsets[-1]).astype(np.uint64)
    values = rng.random(offsets[-1]).astype(np.float32)
    labels = rng.integers(0, 2, size=n).astype(np.int8)
    lines = []
    for i in range(n):
        toks = ["%d:%d:%.9g" % (f, ids[k], values[k]) for f in range(fields)
                for k in range(offsets[i * fields + f], offsets[i * fields + f + 1])]
        lines.append(" ".join([str(labels[i])] + toks))
    return labels, ids, offsets, values, "\n".join(lines) + "\n"


@pytest.fixture
def ffm_model(tmp_path):
    p = tmp_path / "ffm.model"
    p.write_text("model ffmlr\ninput dense=0 fields=4\nembedding name=weights dim=1 buckets=64 combiner=sum "
                 "weight_init=constant(0)\nreduce_sum name=ids\n")
    return str(p)


def test_clicks_equal_cli_bit_for_bit(ffm_model, bin_path, tmp_path):
    """Multi-valued fields with offsets and weights: the same parameters as `dtrain train` on the
    libffm lines holding those rows, the same test rows (the split rule by row = line), the same AUC."""
    labels, ids, offsets, values, text = _libffm(600, 4, 5)
    (tmp_path / "c.ffm").write_text(text)
    flags = dict(batch_size=16, train_steps=20, seed=3, learning_rate=0.05, **QUIET)
    cli = tmp_path / "cli.bin"
    args = [bin_path, "train", "--model", ffm_model, "--data", str(tmp_path / "c.ffm"), "--debug_dump_params", str(cli)]
    args += ["--%s=%s" % (k, v) for k, v in flags.items()]
    out = subprocess.run(args, check=True, capture_output=True, text=True, cwd=tmp_path, timeout=120, env=cli_env())
    py = tmp_path / "py.bin"
    clicks = dtrain.Clicks(labels, ids, offsets=offsets, values=values, fields=4)
    res = dtrain.train(ffm_model, clicks=clicks, debug_dump_params=str(py), **flags)
    a, b = np.fromfile(cli, np.float32), np.fromfile(py, np.float32)
    assert a.size == 64 * 4 and np.abs(a).max() > 0 and a.tobytes() == b.tobytes()
    assert res["steps"] == 20 and 0 < res["test_examples"] < 600
    assert "test auc %.4f" % res["test_auc"] in out.stdout


def test_clicks_dense_one_id_per_field(src, tmp_path):
    """ids [n, fields] without offsets and float32 dense features train a Criteo-shaped model (13
    dense, 26 fields); memmapped arrays train bit for bit as the arrays in memory."""
    model = tmp_path / "lr.model"
    model.write_text(open(os.path.join(src, "models", "lr.model")).read().replace("buckets=1048576", "buckets=256"))
    rng = np.random.default_rng(2)
    n = 512
    dense = np.log1p(rng.integers(0, 50, size=(n, 13))).astype(np.float32)
    ids = rng.integers(0, 2 ** 32, size=(n, 26), dtype=np.uint64)
    labels = (dense[:, 0] + rng.normal(0, 0.5, n) > 2).astype(np.int64)  # learnable from dense
    flags = dict(batch_size=32, train_steps=40, seed=1, learning_rate=0.05, **QUIET)
    py = [tmp_path / "mem.bin", tmp_path / "map.bin"]
    res = dtrain.train(str(model), clicks=dtrain.Clicks(labels, ids, dense=dense), debug_dump_params=str(py[0]), **flags)
    assert res["test_auc"] > 0.75, res
    maps = []
    for name, a in (("d", dense), ("i", ids)):
        m = np.memmap(tmp_path / name, dtype=a.dtype, mode="w+", shape=a.shape)
        m[:] = a
        m.flush()
        maps.append(np.memmap(tmp_path / name, dtype=a.dtype, mode="r", shape=a.shape))
    dtrain.train(str(model), clicks=dtrain.Clicks(labels, maps[1], dense=maps[0]), debug_dump_params=str(py[1]), **flags)
    assert py[0].read_bytes() == py[1].read_bytes()
    # the model's shape is checked against the arrays' in C
    with pytest.raises(dtrain.DtrainError, match="1 dense features and 26 fields"):
        dtrain.train(str(model), clicks=dtrain.Clicks(labels, ids, dense=dense[:, :1].copy()), **flags)


def test_clicks_bad_arrays():
    """Each bad click array raises ValueError naming it, before any C call."""
    ids = np.zeros((4, 2), np.uint64)
    y = np.array([0, 1, 1, 0])
    cases = [
        (lambda: dtrain.Clicks([0, 2, 1, 0], ids), "labels\\[1\\] is 2"),
        (lambda: dtrain.Clicks(y, ids.astype(np.float32)), "ids must be"),
        (lambda: dtrain.Clicks(y, np.array([[0, -1]] * 4, np.int64)), "ids holds -1"),
        (lambda: dtrain.Clicks(y, ids[:3]), "ids must have shape \\(4, fields\\)"),
        (lambda: dtrain.Clicks(y, np.zeros((8, 2), np.uint64)[::2]), "ids must be C-contiguous"),
        (lambda: dtrain.Clicks(y, ids.reshape(-1), offsets=np.arange(9, dtype=np.int64)), "offsets need fields="),
        (lambda: dtrain.Clicks(y, ids.reshape(-1), offsets=np.arange(8, dtype=np.int64), fields=2), "n \\* fields \\+ 1 = 9"),
        (lambda: dtrain.Clicks(y, ids.reshape(-1), offsets=np.array([0, 2, 1, 3, 4, 5, 6, 7, 8], np.int64), fields=2),
         "offsets decrease at 1"),
        (lambda: dtrain.Clicks(y, ids.reshape(-1), offsets=np.arange(0, 18, 2, dtype=np.int64), fields=2), "outside the 8 ids"),
        (lambda: dtrain.Clicks(y, ids, dense=np.array([[np.nan]] * 4, np.float32)), "dense holds nan"),
        (lambda: dtrain.Clicks(y, ids, dense=np.zeros((3, 1), np.float32)), "dense must have 4 rows"),
        (lambda: dtrain.Clicks(y, ids.reshape(-1), offsets=np.arange(9, dtype=np.int64), fields=2,
                               values=np.ones(7, np.float32)), "values must have one per id"),
    ]
    for make, match in cases:
        with pytest.raises(ValueError, match=match):
            make()


def test_clicks_bad_rows_checked_in_c(ffm_model):
    """The library checks every row it reads (arrays changed after Clicks checked them): a bad row is
    a bad line, skipped and counted, or the error naming its line (row + 1) under bad_images="fail"."""
    labels, ids, offsets, values, _ = _libffm(600, 4, 5)
    clicks = dtrain.Clicks(labels, ids, offsets=offsets, values=values, fields=4)
    offsets[4 * 9 + 2] = offsets[-1] + 5  # row 9's field 2 past the ids (line 10)
    values[offsets[4 * 20]:offsets[4 * 20 + 4]] = np.inf  # row 20's values (it has some: checked below)
    assert offsets[4 * 20 + 4] > offsets[4 * 20]
    res = dtrain.train(ffm_model, clicks=clicks, batch_size=16, train_steps=30, **QUIET)
    assert res["bad_images"] >= 1
    with pytest.raises(dtrain.DtrainError, match="click arrays:(10|21): "):
        dtrain.train(ffm_model, clicks=clicks, batch_size=16, train_steps=30, bad_images="fail", **QUIET)


def test_example_clicks_equals_cli(src, bin_path, tmp_path):
    """examples/clicks.py on a CSV (missing cells included) trains bit for bit as `dtrain train` on
    the same rows as Criteo TSV lines."""
    model = tmp_path / "lr.model"
    model.write_text(open(os.path.join(src, "models", "lr.model")).read().replace("buckets=1048576", "buckets=512"))
    rng = np.random.default_rng(4)
    rows = []
    for i in range(400):
        ints = ["" if rng.random() < 0.1 else str(rng.integers(0, 100)) for _ in range(13)]
        cats = ["" if rng.random() < 0.1 else "%08x" % rng.integers(0, 2 ** 32) for _ in range(26)]
        rows.append([str(int(ints[0] != "" and int(ints[0]) > 40))] + ints + cats)
    (tmp_path / "c.csv").write_text("label," + ",".join("I%d" % i for i in range(1, 14)) + "," +
                                    ",".join("C%d" % i for i in range(1, 27)) + "\n" +
                                    "".join(",".join(r) + "\n" for r in rows))
    (tmp_path / "c.tsv").write_text("".join("\t".join(r) + "\n" for r in rows))
    flags = ["--batch_size=16", "--train_steps=30", "--seed=2", "--learning_rate=0.05", "--threads=1", "--logdir=",
             "--summary_dir="]
    subprocess.run([bin_path, "train", "--model", str(model), "--data", str(tmp_path / "c.tsv"), "--debug_dump_params",
                    str(tmp_path / "cli.bin")] + flags, check=True, stdout=subprocess.DEVNULL, timeout=120, env=cli_env())
    out = subprocess.run(python_cmd() + [os.path.join(src, "examples", "clicks.py"), str(tmp_path / "c.csv"), str(model),
                                         "--debug_dump_params", str(tmp_path / "py.bin")] + flags,
                         check=True, capture_output=True, text=True, timeout=120, cwd=tmp_path,
                         env=dict(os.environ, PYTHONPATH=os.path.join(src, "python")))
    assert "test auc" in out.stdout
    with open(os.path.join(src, "examples", "clicks.py")) as f:
        assert len(f.read().splitlines()) <= 40
    a = (tmp_path / "cli.bin").read_bytes()
    assert len(a) > 0 and a == (tmp_path / "py.bin").read_bytes()


def test_example_clicks_on_a_cluster(src, bin_path, tmp_path):
    """examples/clicks.py as 1 ps + 2 sync workers under `dtrain launch`: each worker trains its shard
    of the rows (the tables on the ps), the chief tests, every task exits 0."""
    model = tmp_path / "lr.model"
    model.write_text(open(os.path.join(src, "models", "lr.model")).read().replace("buckets=1048576", "buckets=512"))
    rng = np.random.default_rng(6)
    ints = rng.integers(0, 100, size=(600, 13))
    lines = ["%d,%s,%s" % (r[0] > 40, ",".join(map(str, r)), ",".join("%08x" % v for v in rng.integers(0, 2 ** 32, 26)))
             for r in ints]
    (tmp_path / "c.csv").write_text("header\n" + "\n".join(lines) + "\n")
    out = subprocess.run([bin_path, "launch", "--ps", "1", "--workers", "2", "--issync=1", "--batch_size=16",
                          "--train_steps=20", "--logdir=", "--summary_dir=", "--threads=1", "--learning_rate=0.05", "--"] +
                         python_cmd() + [os.path.join(src, "examples", "clicks.py"), str(tmp_path / "c.csv"), str(model)],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path,
                         env=dict(cli_env(), PYTHONPATH=os.path.join(src, "python")))
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "[worker0] test auc" in out.stdout and "[ps0] ps 0: training over at global step 20" in out.stdout, out.stdout[-2000:]


def _line_split(n, validation_fraction=0.1, test_fraction=0.1):
    """docs/ctr-data.md's split rule of lines 1..n: 0 train, 1 validation, 2 test."""
    z = np.arange(1, n + 1, dtype=np.uint64) ^ np.uint64(0x43545253504c4954)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xbf58476d1ce4e5b9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94d049bb133111eb)
    u = ((z ^ (z >> np.uint64(31))) >> np.uint64(11)).astype(np.float64) / 2.0 ** 53
    return np.where(u < test_fraction, 2, np.where(u < test_fraction + validation_fraction, 1, 0))


def _rows(labels, ids, dense, rows):
    return dtrain.Clicks(labels[rows], np.ascontiguousarray(ids[rows]), dense=np.ascontiguousarray(dense[rows]))


@pytest.mark.parametrize("table", ["buckets=64", "capacity=100000"])
def test_click_steps_equal_cli(src, bin_path, tmp_path, table):
    """A click-log model step by step (DeepFM, 13 dense + 26 fields; bounded tables, and unbounded ids in
    this process's tables): a train_step loop over the training rows in order is `dtrain train` on the
    same rows as Criteo TSV lines, bit for bit (every tensor of the two checkpoints); predict's
    probabilities are `dtrain predict`'s of that checkpoint, and evaluate on the test rows is the
    CLI's test figures."""
    model = tmp_path / "deepfm.model"
    text = open(os.path.join(src, "models", "deepfm.model")).read()
    model.write_text(text.replace("buckets=1048576", table).replace("buckets=262144", table))
    rng = np.random.default_rng(8)
    n, B, steps = 500, 16, 12
    ints = rng.integers(0, 60, size=(n, 13))
    dense = np.log1p(ints).astype(np.float32)  # the file's integers as the reader transforms them
    ids = rng.integers(0, 2 ** 32, size=(n, 26), dtype=np.uint64)
    labels = (ints[:, 0] + rng.integers(0, 30, n) > 45).astype(np.int64)
    (tmp_path / "c.tsv").write_text("".join("%d\t%s\t%s\n" % (labels[i], "\t".join(map(str, ints[i])),
                                                               "\t".join("%x" % v for v in ids[i])) for i in range(n)))
    flags = dict(batch_size=B, train_steps=steps, seed=3, learning_rate=0.01, threads=1)
    out = subprocess.run([bin_path, "train", "--model", str(model), "--data", str(tmp_path / "c.tsv"),
                          "--logdir", str(tmp_path / "cli"), "--summary_dir="] +
                         ["--%s=%s" % kv for kv in flags.items()],
                         check=True, capture_output=True, text=True, cwd=tmp_path, timeout=120, env=cli_env()).stdout
    m = dtrain.Model(str(model), **flags)
    assert m.click_shape == (13, 26) and m.input_shape is None and m.num_classes == 1
    split = _line_split(n)
    train = np.flatnonzero(split == 0)
    for t in range(steps):  # global batch t: the training split's rows t*B .. (t+1)*B-1 in order
        loss, acc = m.train_step(_rows(labels, ids, dense, train[t * B:(t + 1) * B]))
        assert np.isfinite(loss) and 0 <= acc <= 1
    assert m.global_step == steps
    m.save(str(tmp_path / "steps"))
    a, b = dtrain.load_checkpoint(str(tmp_path / "cli")), dtrain.load_checkpoint(str(tmp_path / "steps"))
    assert sorted(a) == sorted(b) and len(a) > 3
    for k in a:
        assert a[k].tobytes() == b[k].tobytes(), k
    # predict: `dtrain predict`'s probabilities of the checkpoint the steps saved, every row
    csv = subprocess.run([bin_path, "predict", "--logdir", str(tmp_path / "steps"), "--batch_size=%d" % B,
                          str(tmp_path / "c.tsv")], check=True, capture_output=True, text=True, timeout=120,
                         env=cli_env()).stdout.splitlines()[1:]
    probs = m.predict(dtrain.Clicks(labels, ids, dense=dense), probabilities=True)
    assert probs.shape == (n,) and len(csv) == n
    assert [line.split(",")[2] for line in csv] == ["%.9g" % p for p in probs]
    logits = m.predict(dtrain.Clicks(labels, ids, dense=dense))
    assert np.allclose(1 / (1 + np.exp(-logits.astype(np.float64))), probs, rtol=1e-5)
    # evaluate: the test rows, as the CLI's run tested them
    ev = m.evaluate(_rows(labels, ids, dense, np.flatnonzero(split == 2)))
    assert "test auc %.4f  test logloss %.4f  test accuracy %.4f" % (ev["auc"], ev["logloss"], ev["accuracy"]) in out


def test_click_steps_slices_and_errors(ffm_model, tmp_path):
    """Clicks[i:j] (offsets, multi-valued fields, weights) steps as the same rows built afresh;
    restore continues bit for bit; images and clicks each refused by the other kind of model."""
    labels, ids, offsets, values, _ = _libffm(200, 4, 7)
    clicks = dtrain.Clicks(labels, ids, offsets=offsets, values=values, fields=4)
    flags = dict(batch_size=16, seed=2, learning_rate=0.05, threads=1)
    m1, m2 = dtrain.Model(ffm_model, **flags), dtrain.Model(ffm_model, **flags)
    for t in range(6):
        r = slice(t * 16, (t + 1) * 16)
        m1.train_step(clicks[r])
        o = offsets[r.start * 4:r.stop * 4 + 1]
        m2.train_step(dtrain.Clicks(labels[r], ids[o[0]:o[-1]].copy(), offsets=o - o[0], values=values[o[0]:o[-1]].copy(),
                                    fields=4))
        if t == 2:
            m1.save(str(tmp_path / "at3"))
    assert m1.get_params().tobytes() == m2.get_params().tobytes() and m1.global_step == 6
    m3 = dtrain.Model(ffm_model, **flags)
    assert m3.restore(str(tmp_path / "at3")) and m3.global_step == 3
    for t in range(3, 6):
        m3.train_step(clicks[t * 16:(t + 1) * 16])
    assert m3.get_params().tobytes() == m1.get_params().tobytes()
    with pytest.raises(ValueError, match="more than batch_size 16"):
        m1.train_step(clicks[0:17])
    with pytest.raises(ValueError, match="y must be None"):
        m1.train_step(clicks[0:4], labels[:4])
    with pytest.raises(ValueError, match="must be a dtrain.Clicks"):
        m1.train_step(np.zeros((4, 1, 1, 0), np.float32), labels[:4])
    with pytest.raises(ValueError, match="2 fields, the model takes 0 and 4"):
        m1.train_step(dtrain.Clicks([0, 1], np.zeros((2, 2), np.uint64)))
    with pytest.raises(ValueError, match="step 1"):
        clicks[0:10:2]
    offsets[5] = offsets[-1] + 3  # changed after Clicks checked it: the library names the row
    with pytest.raises(dtrain.DtrainError, match="click arrays: row 1: field 0.s offsets"):
        m1.train_step(clicks[0:4])
    with pytest.raises(dtrain.DtrainError, match="click arrays:2: field 0.s offsets"):
        m1.predict(clicks)

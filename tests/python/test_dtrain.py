"""The Python package over libdtrain (docs/python.md): numpy in and out, the CLI's results, errors
as exceptions before any C call, stopping, checkpoints."""
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import dtrain
from conftest import cli_env, python_cmd

# One thread and no files beside the test: runs compare bit for bit.
QUIET = dict(threads=1, logdir="", summary_dir="", steps_to_validate=1000)


def test_fit_equals_cli_bit_for_bit(fashion, bin_path, src, tmp_path):
    """One process trained from numpy arrays = `dtrain train` on the same pixels as IDX files."""
    x, y, tx, ty, data = fashion
    model = os.path.join(src, "models", "fashion.model")
    flags = dict(batch_size=32, train_steps=12, seed=7, optimizer="adam", learning_rate=0.002, **QUIET)
    cli = tmp_path / "cli.bin"
    args = [bin_path, "train", "--model", model, "--data", data, "--debug_dump_params", str(cli)]
    args += ["--%s=%s" % (k, v) for k, v in flags.items()]
    subprocess.run(args, check=True, stdout=subprocess.DEVNULL, cwd=tmp_path, timeout=600, env=cli_env())
    py = tmp_path / "py.bin"
    m = dtrain.Model(model, **flags)
    res = m.fit(x, y, test=(tx, ty), debug_dump_params=str(py))
    a, b = np.fromfile(cli, np.float32), np.fromfile(py, np.float32)
    assert a.size == m.param_count and a.tobytes() == b.tobytes()
    assert m.get_params().tobytes() == a.tobytes()  # the model holds what fit trained
    assert res["steps"] == 12 and res["test_examples"] == 256
    # float32 arrays scaled as dtrain scales uint8 ones train the same
    m2 = dtrain.Model(model, **flags)
    m2.fit((x / np.float32(255)).astype(np.float32), y, test=(tx, ty))
    assert m2.get_params().tobytes() == a.tobytes()


def test_train_step_and_checkpoints(fashion, tiny_model, tmp_path):
    """train_step learns; a checkpoint saved after 5 steps and restored continues bit for bit; it
    loads as a dict of numpy arrays, and the CLI evaluates it."""
    x, y, tx, ty, data = fashion
    m = dtrain.Model(tiny_model, batch_size=32, seed=3, **QUIET)
    assert (m.input_shape, m.num_classes, m.max_batch) == ((28, 28, 1), 10, 32)
    first, _ = m.train_step(x[:32], y[:32])
    for i in range(1, 5):
        m.train_step(x[32 * i:32 * i + 32], y[32 * i:32 * i + 32])
    m.save(str(tmp_path / "ck"))
    for i in range(5, 30):
        loss, acc = m.train_step(x[32 * i:32 * i + 32], y[32 * i:32 * i + 32])
    assert loss < first and m.global_step == 30
    r = dtrain.Model(tiny_model, batch_size=32, seed=3, **QUIET)
    assert r.restore(str(tmp_path / "ck")) and r.global_step == 5
    for i in range(5, 30):
        r.train_step(x[32 * i:32 * i + 32], y[32 * i:32 * i + 32])
    assert r.get_params().tobytes() == m.get_params().tobytes()
    ck = dtrain.load_checkpoint(str(tmp_path / "ck"))
    assert int(ck["global_step"]) == 5
    variables = [k for k in ck if k != "global_step" and not k.endswith(("/adam_m", "/adam_v"))]
    assert sum(ck[k].size for k in variables) == m.param_count
    assert all(ck[k].dtype == np.float32 for k in variables)
    loss, acc = m.evaluate(tx, ty)
    logits = m.predict(tx)
    assert logits.shape == (256, 10) and acc == pytest.approx(np.mean(logits.argmax(1) == ty))
    p = m.predict(tx[:3], probabilities=True)
    assert np.allclose(p.sum(1), 1, atol=1e-5)
    assert not r.restore(str(tmp_path / "empty"))


def test_bad_inputs_raise(fashion, tiny_model):
    x, y, _, _, _ = fashion
    m = dtrain.Model(tiny_model, batch_size=32, seed=1, **QUIET)
    before = m.get_params()
    cases = [
        (x[:8].astype(np.float64), y[:8], "x must be float32"),
        (x[:8, :20], y[:8], "x must have shape"),
        (x[:16:2], y[:8], "C-contiguous"),
        (np.full((4, 28, 28, 1), np.nan, np.float32), y[:4], "nan"),
        (x[:4], np.array([0, 1, 2, 10]), r"y\[3\] is 10"),
        (x[:4], np.array([0, 1, -1, 2]), r"y\[2\] is -1"),
        (x[:4], y[:4].astype(np.float32), "y must be integers"),
        (x[:4], y[:5], "y must have shape"),
        (x[:33], y[:33], "more than batch_size 32"),
        ([[0]], y[:1], "x must be a numpy array"),
    ]
    for bx, by, msg in cases:
        with pytest.raises(ValueError, match=msg):
            m.train_step(bx, by)
    assert m.get_params().tobytes() == before.tobytes() and m.global_step == 0
    with pytest.raises(ValueError, match="test y"):
        m.fit(x, y, test=(x[:4], np.array([0, 1, 2, 99])))
    with pytest.raises(dtrain.DtrainError, match="did you mean --learning_rate"):
        dtrain.Options(learning_rat=0.1)
    with pytest.raises(dtrain.DtrainError, match="out of range"):
        dtrain.Options(batch_size=0)
    with pytest.raises(dtrain.DtrainError, match="nope.model"):
        dtrain.Model("nope.model")
    # C errors raised with dtrain's message
    with pytest.raises(dtrain.DtrainError, match="optimizer"):
        dtrain.Model(tiny_model, optimizer="lbfgs")


def test_options_by_flag_name():
    o = dtrain.Options(batch_size=16, issync=1, learning_rate=0.5, lr_staircase=True)
    assert o.get("batch_size") == "16" and o.get("issync") == "1" and o.get("lr_staircase") == "true"
    assert o.get("optimizer") == "adam" and o.get("epochs") == "1"  # dtrain train's defaults
    flags, rest = dtrain.parse_args(["--ps_hosts=a:1", "--job_name", "ps", "x.csv", "--mine=3", "--task_index", "0"])
    assert flags == {"ps_hosts": "a:1", "job_name": "ps", "task_index": "0"} and rest == ["x.csv", "--mine=3"]
    flags, rest = dtrain.parse_args(["--strict", "--issync", "1", "--lr_staircase", "0", "data"])
    assert flags == {"strict": "true", "issync": "1", "lr_staircase": "0"} and rest == ["data"]


def test_precision_bf16(fashion, tiny_model, tmp_path):
    """precision="bf16" (--precision): train_step computes in bf16, not float32's bits but near them; the
    parameters and checkpoint stay float32 and restore into a float32 model; a bad name raises."""
    with open("/proc/cpuinfo") as f:
        if "avx512_bf16" not in f.read():
            pytest.skip("this CPU lacks AVX512_BF16")
    x, y, _, _, _ = fashion
    a = dtrain.Model(tiny_model, batch_size=32, seed=3, **QUIET)
    b = dtrain.Model(tiny_model, batch_size=32, seed=3, precision="bf16", **QUIET)
    assert a.options.get("precision") == "float32" and b.options.get("precision") == "bf16"
    for i in range(10):
        la, _ = a.train_step(x[32 * i:32 * i + 32], y[32 * i:32 * i + 32])
        lb, _ = b.train_step(x[32 * i:32 * i + 32], y[32 * i:32 * i + 32])
    pa, pb = a.get_params(), b.get_params()
    assert pb.dtype == np.float32 and pa.tobytes() != pb.tobytes()
    assert np.linalg.norm(pa - pb) <= 0.02 * np.linalg.norm(pa) and abs(la - lb) <= 0.05 * la
    b.save(str(tmp_path / "ck"))
    r = dtrain.Model(tiny_model, batch_size=32, seed=3, **QUIET)
    assert r.restore(str(tmp_path / "ck")) and r.global_step == 10
    assert r.get_params().tobytes() == pb.tobytes()
    with pytest.raises(dtrain.DtrainError, match="precision: expected float32 or bf16, got 'half'"):
        dtrain.Model(tiny_model, precision="half")


def test_stop_callback_and_gil(fashion, tiny_model):
    """A callback every N steps; a stop from another thread ends fit with Stopped; a Python thread
    runs while C trains (the GIL is released)."""
    x, y, tx, ty, _ = fashion
    m = dtrain.Model(tiny_model, batch_size=8, seed=1, **QUIET)
    seen = []
    m.fit(x, y, test=(tx, ty), train_steps=20, callback=lambda s, l, a: seen.append((s, l, a)), every=5)
    assert [s for s, _, _ in seen] == [5, 10, 15, 20] and all(np.isfinite(l) for _, l, _ in seen)
    with pytest.raises(dtrain.Stopped, match="callback"):
        m.fit(x, y, train_steps=50, callback=lambda s, l, a: s >= 3, every=1)

    def broken(step, loss, acc):
        raise KeyError("from the callback")
    with pytest.raises(KeyError, match="from the callback"):
        m.fit(x, y, train_steps=50, callback=broken, every=2)
    # A Python thread counts while C trains, then stops the run: were the GIL held during the C
    # call, it could not run before the 2,000,000 steps were done (ctest times out first).
    ticks = []

    def beside():
        while not m._running:
            time.sleep(0.001)
        t_end = time.time() + 0.3
        while time.time() < t_end or len(ticks) < 1000:
            ticks.append(1)
        m.stop()
    t = threading.Thread(target=beside)
    t.start()
    with pytest.raises(dtrain.Stopped):
        m.fit(x, y, train_steps=2000000, test=(tx[:8], ty[:8]))
    t.join()
    assert len(ticks) >= 1000


def test_cluster_sync_from_python(fashion, src, tmp_path):
    """1 ps + 2 sync workers, each a Python process started by `dtrain launch -- python3 ...`,
    equal one process with twice the batch (to 1e-6 relative, as test_sync_cli's (a))."""
    x, y, tx, ty, _ = fashion
    mlp = tmp_path / "mlp.model"
    mlp.write_text("model mlp\ninput 28 28 1\nflatten\ndense units=64\nrelu\ndense units=10\n")
    np.save(tmp_path / "x.npy", x), np.save(tmp_path / "y.npy", y)
    script = tmp_path / "task.py"
    script.write_text(
        "import os, sys\nimport numpy as np\nsys.path.insert(0, %r)\nimport dtrain\n"
        "flags, rest = dtrain.parse_args()\n"
        "x, y = np.load(rest[0] + '/x.npy'), np.load(rest[0] + '/y.npy')\n"
        "m = dtrain.Model(rest[1], **flags)\n"
        "r = m.fit(x, y)\n"
        "print(os.environ['DTRAIN_JOB_NAME'], os.environ['DTRAIN_TASK_INDEX'], 'steps', r['steps'])\n"
        % os.path.join(src, "python"))
    common = dict(train_steps=20, seed=5, optimizer="sgd", learning_rate=0.1, threads=1, logdir="", summary_dir="",
                  steps_to_validate=1000)
    one = dtrain.Model(str(mlp), batch_size=32, **common)
    one.fit(x, y)
    bin_path = os.environ.get("DTRAIN_BIN") or os.path.join(src, "build", "dtrain")
    args = [bin_path, "launch", "--ps", "1", "--workers", "2", "--issync=1", "--batch_size=16",
            "--debug_dump_params=%s" % (tmp_path / "sync.bin")] + ["--%s=%s" % kv for kv in common.items()]
    args += ["--"] + python_cmd() + [str(script), str(tmp_path), str(mlp)]
    out = subprocess.run(args, cwd=tmp_path, capture_output=True, text=True, timeout=300, env=cli_env())
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "worker 0 steps 20" in out.stdout and "ps 0 steps" in out.stdout
    a, b = one.get_params().astype(np.float64), np.fromfile(tmp_path / "sync.bin", np.float32).astype(np.float64)
    assert a.shape == b.shape
    assert np.linalg.norm(a - b) / np.linalg.norm(a) <= 1e-6


def test_fashion_example(fashion, src, tmp_path):
    """examples/fashion.py (at most 40 lines) trains on a gzip IDX folder and prints its figures."""
    import gzip
    data = fashion[4]
    for name in os.listdir(data):
        with open(os.path.join(data, name), "rb") as f, gzip.open(tmp_path / (name + ".gz"), "wb") as g:
            g.write(f.read())
    example = os.path.join(src, "examples", "fashion.py")
    with open(example) as f:
        assert len(f.read().splitlines()) <= 40
    out = subprocess.run(python_cmd() + [example, str(tmp_path), "--train_steps=4", "--threads=1"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "test accuracy" in out.stdout and "after 4 steps" in out.stdout


def test_memmap_trains_in_place(fashion, tiny_model, tmp_path):
    """A read-only numpy.memmap trains as the same array in memory does, bit for bit (read in place
    by the loader: no copy of the whole array)."""
    x, y, _, _, _ = fashion
    path = tmp_path / "x.u8"
    x.tofile(path)
    mm = np.memmap(path, np.uint8, "r", shape=x.shape)
    runs = []
    for arr in (x, mm):
        m = dtrain.Model(tiny_model, batch_size=16, seed=2, train_steps=8, **QUIET)
        m.fit(arr, y)
        runs.append(m.get_params())
    assert runs[0].tobytes() == runs[1].tobytes()


def test_ctrl_c_stops_fit(fashion, tiny_model, tmp_path):
    """SIGINT while fit trains (C busy in its call) stops it as Ctrl-C stops dtrain train: Stopped,
    the final checkpoint of one machine saved; the previous handler back afterwards."""
    import signal
    x, y, _, _, _ = fashion
    m = dtrain.Model(tiny_model, batch_size=8, seed=1, threads=1, summary_dir="", steps_to_validate=1000)
    before = signal.getsignal(signal.SIGINT)

    def interrupt():
        while not m._running:
            time.sleep(0.001)
        time.sleep(0.3)
        os.kill(os.getpid(), signal.SIGINT)
    t = threading.Thread(target=interrupt)
    t.start()
    with pytest.raises(dtrain.Stopped, match="stopped"):
        m.fit(x, y, test=(x[:8], y[:8]), train_steps=2000000, logdir=str(tmp_path / "ck"), save_model_secs=0)
    t.join()
    assert signal.getsignal(signal.SIGINT) is before
    ck = dtrain.load_checkpoint(str(tmp_path / "ck"))
    assert int(ck["global_step"]) > 0  # the steps trained before the stop, kept


def test_catdog_example(src, tmp_path):
    """examples/catdog.py (at most 40 lines) trains on a Kaggle-named folder of images (made here
    with OpenCV) through dtrain's image loader."""
    cv2 = pytest.importorskip("cv2")
    folder = tmp_path / "train"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for i in range(16):
        img = np.full((40, 48, 3), (200, 60, 60) if i % 2 else (60, 60, 200), np.uint8) + rng.integers(0, 30, (40, 48, 3), dtype=np.uint8)
        cv2.imwrite(str(folder / ("%s.%d.png" % ("dog" if i % 2 else "cat", i))), img)
    example = os.path.join(src, "examples", "catdog.py")
    with open(example) as f:
        assert len(f.read().splitlines()) <= 40
    out = subprocess.run(python_cmd() + [example, str(folder), "--train_steps=2", "--batch_size=4", "--threads=1",
                                         "--logdir=", "--summary_dir="],
                         cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "after 2 steps" in out.stdout


def test_fit_log_goes_to_python(fashion, tiny_model, capfd):
    """fit's log lines reach Python (sys.stdout as it is then, a file-like object, a logging.Logger, a
    function), whole lines as the CLI writes them, and nothing goes to the process's own stdout."""
    import contextlib
    import io
    import logging
    x, y, tx, ty, _ = fashion
    m = dtrain.Model(tiny_model, batch_size=8, seed=1, **QUIET)
    lines = []
    m.fit(x[:64], y[:64], test=(tx[:16], ty[:16]), train_steps=4, log=lines.append)
    assert lines and all(line.endswith("\n") and "\n" not in line[:-1] for line in lines)
    assert any("test accuracy" in line for line in lines), lines
    import re

    def steady(text):  # the same run's lines, but for its timings
        return re.sub(r"\d+(\.\d+)? (examples/sec|s\b)", r"# \2", text)
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):  # a notebook replaces sys.stdout as this does
        m.fit(x[:64], y[:64], test=(tx[:16], ty[:16]), train_steps=4)
    assert steady(buf.getvalue()) == steady("".join(lines))
    records = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())
    logger = logging.getLogger("dtrain.test")
    logger.setLevel(logging.INFO)
    logger.addHandler(Keep())
    dtrain.train(tiny_model, x[:64], y[:64], test=(tx[:16], ty[:16]), train_steps=4, batch_size=8, seed=1, log=logger,
                 **QUIET)
    assert [steady(r) for r in records] == [steady(line.rstrip("\n")) for line in lines]
    m.fit(x[:64], y[:64], test=(tx[:16], ty[:16]), train_steps=4, log=False)
    assert "test accuracy" not in capfd.readouterr().out  # C's stdout: nothing, all along
    with pytest.raises(ValueError, match="log must be"):
        m.fit(x[:64], y[:64], train_steps=1, log=3)


def test_train_step_on_a_cluster(fashion, src, tmp_path):
    """1 ps + 2 sync workers, each a Python process under `dtrain launch`, the workers driven by
    train_step (distribute(), each its half of every global batch, finish()): the chief's parameters
    equal one process's train_step loop with twice the batch (to 1e-6 relative, as the fit test)."""
    x, y, _, _, _ = fashion
    mlp = tmp_path / "mlp.model"
    mlp.write_text("model mlp\ninput 28 28 1\nflatten\ndense units=64\nrelu\ndense units=10\n")
    np.save(tmp_path / "x.npy", x), np.save(tmp_path / "y.npy", y)
    (tmp_path / "task.py").write_text(
        "import os, sys\nimport numpy as np\nsys.path.insert(0, %r)\nimport dtrain\n"
        "flags, rest = dtrain.parse_args()\n"
        "x, y = np.load('x.npy'), np.load('y.npy')\n"
        "m = dtrain.Model('mlp.model', **flags)\n"
        "role = m.distribute()\n"
        "B, k = int(flags['batch_size']), int(flags['task_index'])\n"
        "for t in range(20 if role != 'ps' else 0):\n"
        "    s = t * 2 * B + k * B\n"
        "    m.train_step(x[s:s + B], y[s:s + B])\n"
        "m.finish()\n"
        "if role == 'chief':\n"
        "    np.save('chief.npy', m.get_params())\n"
        "print(role, 'at', m.global_step)\n" % os.path.join(src, "python"))
    common = dict(seed=5, optimizer="sgd", learning_rate=0.1, threads=1, logdir="", summary_dir="")
    one = dtrain.Model(str(mlp), batch_size=32, **common)
    for t in range(20):
        one.train_step(x[t * 32:(t + 1) * 32], y[t * 32:(t + 1) * 32])
    bin_path = os.environ.get("DTRAIN_BIN") or os.path.join(src, "build", "dtrain")
    args = [bin_path, "launch", "--ps", "1", "--workers", "2", "--issync=1", "--batch_size=16"]
    args += ["--%s=%s" % kv for kv in common.items()] + ["--"] + python_cmd() + [str(tmp_path / "task.py")]
    out = subprocess.run(args, cwd=tmp_path, capture_output=True, text=True, timeout=300, env=cli_env())
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "chief at 20" in out.stdout and "worker at 20" in out.stdout and "ps at" in out.stdout, out.stdout[-2000:]
    a, b = one.get_params().astype(np.float64), np.load(tmp_path / "chief.npy").astype(np.float64)
    assert a.shape == b.shape and np.linalg.norm(a - b) / np.linalg.norm(a) <= 1e-6
    m = dtrain.Model(str(mlp), batch_size=16, **common)
    assert m.distribute() == "alone"
    with pytest.raises(dtrain.DtrainError, match="ps_hosts"):
        dtrain.Model(str(mlp), batch_size=16, job_name="worker", task_index=0, worker_hosts="127.0.0.1:1",
                     **common).distribute()

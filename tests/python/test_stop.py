"""Ctrl-C of a Python script in fit ends it as Ctrl-C ends `dtrain train`: exit status 130, the
checkpoint kept, and on a cluster the ps told (it ends too, as the CLI's does)."""
import os
import signal
import subprocess
import time

import numpy as np

from conftest import python_cmd
from test_faults import _ports

SCRIPT = """import sys
sys.path.insert(0, %r)
import numpy as np
import dtrain
flags, rest = dtrain.parse_args()
x, y = np.load(rest[0] + "/x.npy"), np.load(rest[0] + "/y.npy")
dtrain.Model(rest[1], **flags).fit(x, y)  # Stopped, uncaught: the script's exit status is the CLI's
print("fit returned")
"""


def _setup(fashion, src, tmp_path):
    x, y, _, _, _ = fashion
    np.save(tmp_path / "x.npy", x), np.save(tmp_path / "y.npy", y)
    (tmp_path / "mlp.model").write_text("model mlp\ninput 28 28 1\nflatten\ndense units=32\nrelu\ndense units=10\n")
    (tmp_path / "task.py").write_text(SCRIPT % os.path.join(src, "python"))
    return python_cmd() + [str(tmp_path / "task.py"), str(tmp_path), str(tmp_path / "mlp.model"),
                           "--logdir=%s" % (tmp_path / "ckpt"), "--summary_dir=", "--train_steps=10000000",
                           "--batch_size=8", "--threads=1", "--steps_to_validate=100000"]


def _interrupt_when_training(proc, log, timeout=60, after=0.5):
    deadline = time.time() + timeout
    while "step " not in log.read_text() and " 0 steps" not in log.read_text() and time.time() < deadline:
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    time.sleep(after)
    assert proc.poll() is None, log.read_text()[-2000:]
    proc.send_signal(signal.SIGINT)
    return proc.wait(timeout=60)


def test_ctrl_c_exit_status_130_checkpoint_kept(fashion, src, tmp_path):
    cmd = _setup(fashion, src, tmp_path) + ["--steps_to_log=50"]
    log = tmp_path / "one.log"
    with open(log, "w") as f:
        p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=tmp_path)
        rc = _interrupt_when_training(p, log)
    out = log.read_text()
    assert rc == 130, out[-2000:]
    assert "fit returned" not in out and "dtrain: Ctrl-C: " in out
    assert "Traceback" not in out and len([l for l in out.splitlines() if l.startswith("dtrain: ")]) == 1, out[-2000:]
    import dtrain  # a cluster keeps its periodic checkpoints, as the CLI's (no final save: train.c)
    assert int(dtrain.load_checkpoint(str(tmp_path / "ckpt"))["global_step"]) > 0, out[-2000:]


def test_ctrl_c_of_a_python_worker_tells_the_ps(fashion, src, tmp_path):
    p = _ports(2)
    cmd = _setup(fashion, src, tmp_path) + ["--steps_to_log=50", "--ps_hosts=127.0.0.1:%d" % p[0],
                                           "--worker_hosts=127.0.0.1:%d" % p[1], "--connect_timeout=60",
                                           "--save_model_secs=0.5"]
    logs = {k: tmp_path / (k + ".log") for k in ("ps", "worker")}
    files = {k: open(v, "w") for k, v in logs.items()}
    procs = {k: subprocess.Popen(cmd + ["--job_name=" + k, "--task_index=0"], stdout=files[k], stderr=subprocess.STDOUT,
                                 cwd=tmp_path) for k in ("ps", "worker")}
    try:
        rc = _interrupt_when_training(procs["worker"], logs["worker"], after=1.5)
        ps_rc = procs["ps"].wait(timeout=60)
    finally:
        for pr in procs.values():
            if pr.poll() is None:
                pr.kill()
                pr.wait()
        for f in files.values():
            f.close()
    assert rc == 130, logs["worker"].read_text()[-2000:]
    ps_log = logs["ps"].read_text()
    assert ps_rc == 0 and "shutdown by the chief (worker 0)" in ps_log, ps_log[-2000:]
    import dtrain  # a cluster keeps its periodic checkpoints, as the CLI's (no final save: train.c)
    assert int(dtrain.load_checkpoint(str(tmp_path / "ckpt"))["global_step"]) > 0


def test_uncaught_stopped_says_one_line_and_exits_130(fashion, src, tmp_path):
    """A Stopped nobody catches (here the step callback's) ends the script as a stop ends `dtrain
    train`: one line `dtrain: <message>` on stderr, no traceback, status 130, atexit's handlers run."""
    x, y, _, _, _ = fashion
    np.save(tmp_path / "x.npy", x[:64]), np.save(tmp_path / "y.npy", y[:64])
    (tmp_path / "mlp.model").write_text("model mlp\ninput 28 28 1\nflatten\ndense units=10\n")
    (tmp_path / "s.py").write_text(
        "import atexit, sys\nsys.path.insert(0, %r)\nimport numpy as np\nimport dtrain\n"
        "atexit.register(lambda: print('atexit ran', flush=True))\n"
        "x, y = np.load('x.npy'), np.load('y.npy')\n"
        "dtrain.Model('mlp.model', batch_size=8, threads=1, logdir='', summary_dir='').fit(\n"
        "    x, y, train_steps=100, callback=lambda step, loss, acc: step >= 3, every=1)\n"
        "print('not reached')\n" % os.path.join(src, "python"))
    out = subprocess.run(python_cmd() + ["s.py"], capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert out.returncode == 130, out.stderr[-2000:]
    assert out.stderr == "dtrain: training stopped by the step callback at global step 3\n", out.stderr
    assert out.stdout.endswith("\natexit ran\n"), out.stdout[-2000:]

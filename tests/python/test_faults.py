"""A ps killed and restarted under Python workers recovers as the CLI does (tests/test_faults_ps_slow.sh):
the workers wait for it, the chief rolls the ps back to the newest checkpoint, training finishes and
every process exits 0."""
import os
import signal
import socket
import subprocess
import time

import numpy as np

from conftest import python_cmd

SCRIPT = """import sys, time
sys.path.insert(0, %r)
import numpy as np
import dtrain
flags, rest = dtrain.parse_args()
x, y = np.load(rest[0] + "/x.npy"), np.load(rest[0] + "/y.npy")
m = dtrain.Model(rest[1], **flags)
r = m.fit(x, y, callback=lambda step, loss, acc: time.sleep(0.004), every=1)  # paced: the kill lands mid-run
print("done steps", r["steps"], flush=True)
"""


def _ports(n):
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def test_ps_killed_and_restarted_under_python_workers(fashion, src, tmp_path):
    x, y, _, _, _ = fashion
    np.save(tmp_path / "x.npy", x), np.save(tmp_path / "y.npy", y)
    mlp = tmp_path / "mlp.model"
    mlp.write_text("model mlp\ninput 28 28 1\nflatten\ndense units=32\nrelu\ndense units=10\n")
    (tmp_path / "task.py").write_text(SCRIPT % os.path.join(src, "python"))
    p = _ports(3)
    ckpt = tmp_path / "ckpt"
    common = ["--ps_hosts=127.0.0.1:%d" % p[0], "--worker_hosts=127.0.0.1:%d,127.0.0.1:%d" % (p[1], p[2]),
              "--logdir=%s" % ckpt, "--summary_dir=", "--save_model_secs=1", "--train_steps=1200", "--batch_size=16",
              "--heartbeat_timeout=5", "--connect_timeout=60", "--steps_to_validate=100000", "--threads=1"]
    procs, logs = {}, {}

    def start(job, i):
        name = "%s%d" % (job, i)
        logs[name] = open(tmp_path / (name + ".log"), "a")
        procs[name] = subprocess.Popen(python_cmd() + [str(tmp_path / "task.py"), str(tmp_path), str(mlp)] + common +
                                       ["--job_name=" + job, "--task_index=%d" % i], stdout=logs[name],
                                       stderr=subprocess.STDOUT, cwd=tmp_path)
    try:
        start("ps", 0), start("worker", 0), start("worker", 1)
        deadline = time.time() + 60  # a checkpoint past step 0 saved: something to roll back to
        saved = lambda: [int(f.name.split("-")[1].split(".")[0]) for f in ckpt.glob("model.ckpt-*.safetensors")]
        while max(saved(), default=0) == 0 and time.time() < deadline:
            time.sleep(0.05)
        assert max(saved(), default=0) > 0, "no checkpoint past step 0 within 60 s"
        time.sleep(0.3)
        assert procs["worker0"].poll() is None, "the chief finished before the kill: pace it slower"
        procs["ps0"].send_signal(signal.SIGKILL)
        procs["ps0"].wait()
        time.sleep(1)
        start("ps", 0)
        for name in ("worker0", "worker1", "ps0"):
            assert procs[name].wait(timeout=120) == 0, name + ": " + (tmp_path / (name + ".log")).read_text()[-3000:]
    finally:
        for pr in procs.values():
            if pr.poll() is None:
                pr.kill()
                pr.wait()
        for f in logs.values():
            f.close()
    chief = (tmp_path / "worker0.log").read_text()
    # as the CLI's (tests/faults.sh): rolled back to the newest checkpoint saved before the loss, past step 0
    back = chief.split("every ps rolled back to the newest checkpoint (global step ")
    assert len(back) == 2, chief[-3000:]
    to = int(back[1].split(",")[0])
    before = [int(l.split("(global step ")[1].split(",")[0]) for l in back[0].splitlines() if l.startswith("saved checkpoint")]
    assert to > 0 and to == before[-1], (to, before)
    assert "done steps" in chief and "done steps" in (tmp_path / "worker1.log").read_text()

"""A numpy.memmap larger than the cgroup's memory limit trains: the arrays are read in place (page
cache the kernel can reclaim), never loaded. The test makes a cgroup v1 memory group with a limit
below the file's size, runs a Python fit in it and removes it; skipped where it cannot."""
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import python_cmd

CGROUP = "/sys/fs/cgroup/memory"
LIMIT = 160 << 20   # the process's limit: the interpreter, numpy and the library fit in it ...
FILE = 256 << 20    # ... the images do not

SCRIPT = """import sys
sys.path.insert(0, %r)
import numpy as np
import dtrain
n = %d
x = np.memmap(sys.argv[1], dtype=np.float32, mode="r", shape=(n, 28, 28, 1))
y = (np.arange(n) %% 10).astype(np.int32)
m = dtrain.Model(sys.argv[2], batch_size=64, seed=1, threads=1, logdir="", summary_dir="", steps_to_validate=1000)
r = m.fit(x, y, train_steps=20)  # the NaN scan and the test pass read every example
print("trained", r["steps"], "tested", r["test_examples"], flush=True)
"""


def _cgroup(name):
    if not os.path.isdir(CGROUP) or not os.access(CGROUP, os.W_OK):
        pytest.skip("no writable cgroup v1 memory hierarchy at %s (needs root and cgroup v1)" % CGROUP)
    path = os.path.join(CGROUP, name)
    try:
        os.mkdir(path)
    except OSError as e:
        pytest.skip("cannot make a memory cgroup in %s: %s" % (CGROUP, e))
    return path


def test_memmap_larger_than_the_cgroup_limit_trains(src, tiny_model, tmp_path):
    if os.environ.get("DTRAIN_PRELOAD"):
        pytest.skip("sanitizer build: ASan's quarantine and shadow memory, not the library, set the footprint")
    n = FILE // (28 * 28 * 4)
    data = tmp_path / "x.f32"
    x = np.memmap(data, dtype=np.float32, mode="w+", shape=(n, 28, 28, 1))
    for i in range(0, n, 8192):  # written in slices: this process never holds it either
        x[i:i + 8192] = np.random.default_rng(i).random((min(8192, n - i), 28, 28, 1), dtype=np.float32)
    x.flush()
    del x
    fd = os.open(data, os.O_RDONLY)  # out of the page cache: the child's reads are charged to its group
    os.fsync(fd)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
    assert os.path.getsize(data) > LIMIT
    (tmp_path / "fit.py").write_text(SCRIPT % (os.path.join(src, "python"), n))
    group = _cgroup("dtrain_test_memmap_%d" % os.getpid())
    try:
        with open(os.path.join(group, "memory.limit_in_bytes"), "w") as f:
            f.write(str(LIMIT))
        if os.path.exists(os.path.join(group, "memory.memsw.limit_in_bytes")):  # no swapping past it either
            with open(os.path.join(group, "memory.memsw.limit_in_bytes"), "w") as f:
                f.write(str(LIMIT))
        cmd = ["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', group] + python_cmd() + [
            str(tmp_path / "fit.py"), str(data), tiny_model]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path)
        with open(os.path.join(group, "memory.max_usage_in_bytes")) as f:
            peak = int(f.read())
    finally:
        for _ in range(50):  # the group empties once its process has been reaped
            try:
                os.rmdir(group)
                break
            except OSError:
                import time
                time.sleep(0.1)
    assert out.returncode == 0, (out.returncode, out.stdout[-1500:], out.stderr[-1500:])
    assert "trained 20 tested %d" % n in out.stdout, out.stdout[-1500:]
    assert peak <= LIMIT < os.path.getsize(data)
    print("peak %.0f MiB under a %.0f MiB limit, memmap %.0f MiB" % (peak / 2 ** 20, LIMIT / 2 ** 20, FILE / 2 ** 20),
          file=sys.stderr)

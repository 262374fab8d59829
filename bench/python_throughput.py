"""Python against the CLI (BENCHMARKS.md, "Python"): in interleaved rounds, dtrain train's own
examples/sec, a Python train_step loop over numpy batches (timed around the loop) and fit on arrays
(its figure); fashion model, batch 64, the same threads.
    python3 bench/python_throughput.py THREADS ROUNDS [STEPS]"""
import gzip, os, re, struct, subprocess, sys, time
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))
import numpy as np
import dtrain
threads, rounds, steps, B = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) > 3 else 150, 64
D = "/usr/share/datasets/fashion-mnist/"
n = steps * B
x = np.frombuffer(gzip.open(D + "train-images-idx3-ubyte.gz").read(), np.uint8, offset=16)[:n * 784].reshape(n, 28, 28, 1)
y = np.frombuffer(gzip.open(D + "train-labels-idx1-ubyte.gz").read(), np.uint8, offset=8)[:n].astype(np.int32)
d = os.path.join(os.environ.get("TMPDIR", "/tmp"), "dtrain_pybench_idx"); os.makedirs(d, exist_ok=True)
for p, xs, ys in (("train", x, y), ("t10k", x[:64], y[:64])):
    open(f"{d}/{p}-images-idx3-ubyte", "wb").write(struct.pack(">IIII", 0x803, len(xs), 28, 28) + xs.tobytes())
    open(f"{d}/{p}-labels-idx1-ubyte", "wb").write(struct.pack(">II", 0x801, len(ys)) + ys.astype(np.uint8).tobytes())
model = os.path.join(ROOT, "models", "fashion.model")
flags = dict(batch_size=B, threads=threads, logdir="", summary_dir="", steps_to_validate=10**9, train_steps=steps)
cli, loop, fit = [], [], []
for r in range(rounds):
    out = subprocess.run([os.environ.get("DTRAIN_BIN", os.path.join(ROOT, "build", "dtrain")), "train", "--model", model, "--data", d] +
                         [f"--{k}={v}" for k, v in flags.items()], capture_output=True, text=True).stdout
    cli.append(float(re.search(r"local steps in [\d.]+ s \((\d+) examples/sec", out).group(1)))
    m = dtrain.Model(model, **flags)
    t = time.perf_counter()
    for i in range(steps):
        m.train_step(x[i * B:(i + 1) * B], y[i * B:(i + 1) * B])
    loop.append(n / (time.perf_counter() - t))
    m2 = dtrain.Model(model, **flags)
    devnull = os.open(os.devnull, os.O_WRONLY); saved = os.dup(1); os.dup2(devnull, 1)
    try:
        res = m2.fit(x, y, test=(x[:64], y[:64]))
    finally:
        os.dup2(saved, 1)
    fit.append(res["examples_per_sec"])
    print(f"round {r}: cli {cli[-1]:.0f}  train_step loop {loop[-1]:.0f}  fit {fit[-1]:.0f} ex/s", flush=True)
med = lambda v: float(np.median(v))
ratios = [a / b for a, b in zip(loop, cli)]
print(f"threads {threads}: median cli {med(cli):.0f}, loop {med(loop):.0f} ({med(ratios):.3f}x, per-round min {min(ratios):.3f} max {max(ratios):.3f}), fit {med(fit):.0f} ex/s")

"""Python against the CLI (BENCHMARKS.md, "Python"): in interleaved rounds, dtrain train's own
examples/sec, a Python train_step loop over numpy batches (timed around the loop) and fit on arrays
(its figure); fashion model, batch 64, the same threads.
    python3 bench/python_throughput.py THREADS ROUNDS [STEPS]     (STEPS default 1600)
    python3 bench/python_throughput.py calibrate THREADS [STEPS...]
calibrate runs dtrain train alone at each length (default 100 200 400 800 1600 3200): its figure
grows with the run's length while a new process's start-up (OpenMP and OpenBLAS threads, first
touch of the buffers, the loader's first batches) weighs on it; the rounds' STEPS must be past that.
The data are the first 60,000 Fashion-MNIST images; a run longer than 937 steps goes on to further
epochs (the loop takes the batches in order, the CLI its shuffled epochs: the same work)."""
import gzip, os, re, struct, subprocess, sys, time
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))
import numpy as np
import dtrain
calibrate = sys.argv[1] == "calibrate"
threads, B = int(sys.argv[2] if calibrate else sys.argv[1]), 64
D = "/usr/share/datasets/fashion-mnist/"
n = 60000 // B * B
x = np.frombuffer(gzip.open(D + "train-images-idx3-ubyte.gz").read(), np.uint8, offset=16)[:n * 784].reshape(n, 28, 28, 1)
y = np.frombuffer(gzip.open(D + "train-labels-idx1-ubyte.gz").read(), np.uint8, offset=8)[:n].astype(np.int32)
d = os.path.join(os.environ.get("TMPDIR", "/tmp"), "dtrain_pybench_idx"); os.makedirs(d, exist_ok=True)
for p, xs, ys in (("train", x, y), ("t10k", x[:64], y[:64])):
    open(f"{d}/{p}-images-idx3-ubyte", "wb").write(struct.pack(">IIII", 0x803, len(xs), 28, 28) + xs.tobytes())
    open(f"{d}/{p}-labels-idx1-ubyte", "wb").write(struct.pack(">II", 0x801, len(ys)) + ys.astype(np.uint8).tobytes())
model = os.path.join(ROOT, "models", "fashion.model")


def flags(steps):
    return dict(batch_size=B, threads=threads, logdir="", summary_dir="", steps_to_validate=10**9, train_steps=steps)


def cli(steps):
    out = subprocess.run([os.environ.get("DTRAIN_BIN", os.path.join(ROOT, "build", "dtrain")), "train", "--model", model,
                          "--data", d] + [f"--{k}={v}" for k, v in flags(steps).items()], capture_output=True, text=True).stdout
    return float(re.search(r"local steps in [\d.]+ s \((\d+) examples/sec", out).group(1))


if calibrate:
    for steps in [int(s) for s in sys.argv[3:]] or [100, 200, 400, 800, 1600, 3200]:
        t = time.perf_counter()
        print(f"threads {threads}: {steps} steps: cli {cli(steps):.0f} ex/s ({time.perf_counter() - t:.1f} s)", flush=True)
    sys.exit(0)
rounds, steps = int(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) > 3 else 1600
per_epoch = n // B
clis, loop, fit = [], [], []
for r in range(rounds):
    clis.append(cli(steps))
    m = dtrain.Model(model, **flags(steps))
    t = time.perf_counter()
    for i in range(steps):
        j = i % per_epoch
        m.train_step(x[j * B:(j + 1) * B], y[j * B:(j + 1) * B])
    loop.append(steps * B / (time.perf_counter() - t))
    res = dtrain.Model(model, **flags(steps)).fit(x, y, test=(x[:64], y[:64]), log=False)
    fit.append(res["examples_per_sec"])
    print(f"round {r}: cli {clis[-1]:.0f}  train_step loop {loop[-1]:.0f}  fit {fit[-1]:.0f} ex/s", flush=True)
med = lambda v: float(np.median(v))
ratios = [a / b for a, b in zip(loop, clis)]
print(f"threads {threads}, {steps} steps: median cli {med(clis):.0f}, loop {med(loop):.0f} ({med(ratios):.3f}x, per-round "
      f"min {min(ratios):.3f} max {max(ratios):.3f}), fit {med(fit):.0f} ex/s")

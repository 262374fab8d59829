#!/usr/bin/python3
"""PyTorch baseline for bench/run: the same models, trained on synthetic batches with Adam.
usage: torch_train.py MODEL BATCH THREADS [SECONDS] -> one JSON line with images/sec.
The models are written out by hand to mirror models/*.model (NHWC input permuted to NCHW)."""
import json, sys, time
import torch
import torch.nn as nn

def fashion():
    return nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(7 * 7 * 64, 128), nn.ReLU(), nn.Linear(128, 10)), (1, 28, 28), 10

def catdog():
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.MaxPool2d(2), nn.ReLU(),
        nn.Conv2d(32, 32, 3, padding=1), nn.MaxPool2d(2), nn.ReLU(),
        nn.Conv2d(32, 64, 3, padding=1), nn.MaxPool2d(2), nn.ReLU(),
        nn.Flatten(), nn.Linear(16 * 16 * 64, 128), nn.ReLU(), nn.Linear(128, 2)), (3, 128, 128), 2

def main():
    name, batch, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    seconds = float(sys.argv[4]) if len(sys.argv) > 4 else 5.0
    torch.set_num_threads(threads)
    torch.manual_seed(1)
    model, shape, classes = {"fashion": fashion, "catdog": catdog}[name]()
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    x = torch.rand(batch, *shape)
    y = torch.randint(0, classes, (batch,))
    loss_fn = nn.CrossEntropyLoss()
    def step():
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
    best = 0.0
    for rnd in range(-1, 5):
        steps, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < (1.0 if rnd < 0 else seconds / 5):
            step()
            steps += 1
        ips = steps * batch / (time.perf_counter() - t0)
        if rnd >= 0:
            best = max(best, ips)
    print(json.dumps({"impl": "pytorch", "version": torch.__version__, "model": name, "batch": batch,
                      "threads": threads, "images_per_sec": round(best, 1)}))

if __name__ == "__main__":
    main()

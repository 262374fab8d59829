#!/usr/bin/python3
"""PyTorch baseline for bench/run: the same models, trained on synthetic batches with Adam.
usage: torch_train.py MODEL BATCH THREADS [SECONDS] [ALLOCATOR] [PRECISION] -> one JSON line with images/sec.
PRECISION: "float32" (default), or "bf16": the forward pass and the loss under torch.autocast("cpu",
dtype=torch.bfloat16), PyTorch's own mixed precision (float32 weights and optimizer, bf16 convolutions
and linear layers).
The models are written out by hand to mirror models/*.model (NHWC input permuted to NCHW).
ALLOCATOR: "glibc" (default) runs PyTorch as it comes; "retain" sets glibc's malloc to keep freed
memory (no mmap for large blocks, no trimming), so each step's tensors reuse pages instead of
faulting fresh ones in. On a virtual machine where a page fault is dear that more than doubles its
speed (BENCHMARKS.md); Debian's jemalloc with its defaults does not help, as it too gives freed
pages back."""
import ctypes, json, sys, time

def retain_freed_memory():
    libc = ctypes.CDLL("libc.so.6")
    M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = -1, -2, -3
    for opt, val in ((M_MMAP_THRESHOLD, 1 << 30), (M_TRIM_THRESHOLD, 1 << 30), (M_TOP_PAD, 64 << 20)):
        if libc.mallopt(opt, val) != 1:
            sys.exit(f"torch_train.py: mallopt({opt}, {val}) failed")

if __name__ == "__main__" and len(sys.argv) > 5:
    if sys.argv[5] not in ("glibc", "retain"):
        sys.exit(f"torch_train.py: ALLOCATOR must be glibc or retain, not {sys.argv[5]!r}")
    if sys.argv[5] == "retain":
        retain_freed_memory()

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

class Block(nn.Module):
    """conv-bn-relu-conv-bn + shortcut (1x1 stride-2 conv + bn when the size halves), then relu."""
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.branch = nn.Sequential(
            nn.Conv2d(cin, cout, 3, stride, padding=1, bias=False), nn.BatchNorm2d(cout, eps=1e-3, momentum=0.01),
            nn.ReLU(), nn.Conv2d(cout, cout, 3, 1, padding=1, bias=False), nn.BatchNorm2d(cout, eps=1e-3, momentum=0.01))
        self.short = nn.Identity() if stride == 1 else nn.Sequential(
            nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout, eps=1e-3, momentum=0.01))

    def forward(self, x):
        return torch.relu(self.branch(x) + self.short(x))

def resnet():
    """models/resnet.model. PyTorch pads stride-2 3x3 convs by 1 on every side where TensorFlow's SAME
    (and dtrain) pads only bottom/right: the same work, windows shifted by one pixel."""
    layers = [nn.Conv2d(1, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16, eps=1e-3, momentum=0.01), nn.ReLU()]
    cin = 16
    for f in (16, 32, 64):
        for b in range(3):
            layers.append(Block(cin, f, 2 if f > 16 and b == 0 else 1))
            cin = f
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10)]
    return nn.Sequential(*layers), (1, 28, 28), 10

def main():
    name, batch, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    seconds = float(sys.argv[4]) if len(sys.argv) > 4 else 5.0
    allocator = sys.argv[5] if len(sys.argv) > 5 else "glibc"
    precision = sys.argv[6] if len(sys.argv) > 6 else "float32"
    if precision not in ("float32", "bf16"):
        sys.exit(f"torch_train.py: PRECISION must be float32 or bf16, not {precision!r}")
    torch.set_num_threads(threads)
    torch.manual_seed(1)
    model, shape, classes = {"fashion": fashion, "catdog": catdog, "resnet": resnet}[name]()
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    x = torch.rand(batch, *shape)
    y = torch.randint(0, classes, (batch,))
    loss_fn = nn.CrossEntropyLoss()
    def step():
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
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
                      "threads": threads, "allocator": allocator, "precision": precision,
                      "images_per_sec": round(best, 1)}))

if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""Communication baseline for bench/run pushpull: torch.distributed gloo all_reduce, 2 processes on
loopback, of the same bytes as dtrain's parameters (fashion 1,686,568 B, catdog 8,504,712 B).
usage: torch_gloo.py [SECONDS_PER_SIZE] [SIZE...] -> one JSON line per size, median and p90 ms.
SIZE is fashion, catdog or a byte count (a multiple of 4), as for bench_tcp. One thread per process, as dtrain's workers
talk to the ps from one thread. The whole run is bounded: past the deadline every child is killed."""
import datetime, json, os, signal, socket, sys, time
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

SIZES = {"fashion": 421_642, "catdog": 2_126_178}  # float32 parameters of models/*.model
WORLD = 2

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]

def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]

def rank_main(rank, port, sizes, seconds, queue):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD,
                            timeout=datetime.timedelta(seconds=60))  # a dead peer ends the wait
    for name, n in sizes:
        x = torch.ones(n, dtype=torch.float32)
        for _ in range(10):  # warm up: connections, allocator, caches
            dist.all_reduce(x)
        # Iteration count from a short calibration, agreed by both ranks (rank 0's) so neither waits.
        t0 = time.perf_counter()
        for _ in range(10):
            dist.all_reduce(x)
        per = (time.perf_counter() - t0) / 10
        iters = torch.tensor([max(30, min(5000, int(seconds / per)))], dtype=torch.int64)
        dist.broadcast(iters, 0)
        times = torch.empty(int(iters), dtype=torch.float64)
        for i in range(int(iters)):
            t0 = time.perf_counter()
            dist.all_reduce(x)
            times[i] = time.perf_counter() - t0
        # An iteration is done when both ranks have their sum: take the slower rank's time.
        dist.all_reduce(times, op=dist.ReduceOp.MAX)
        if rank == 0:
            ms = [t * 1e3 for t in times.tolist()]
            queue.put(json.dumps({
                "impl": "gloo", "op": "all_reduce", "version": torch.__version__, "size": name,
                "bytes": n * 4, "procs": WORLD, "threads": 1, "iters": len(ms),
                "median_ms": round(pct(ms, 0.5), 3), "p90_ms": round(pct(ms, 0.9), 3)}))
    dist.barrier()
    dist.destroy_process_group()

def main():
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 3.0
    names = sys.argv[2:] or list(SIZES)
    sizes = [(s, SIZES[s] if s in SIZES else int(s) // 4) for s in names]
    if any(n <= 0 for _, n in sizes):
        sys.exit("torch_gloo.py: SIZE: want fashion, catdog or a byte count >= 4")
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # loopback, like the dtrain cluster
    os.environ["OMP_NUM_THREADS"] = "1"
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the cleanup below on kill too
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    deadline = time.monotonic() + 60 + len(sizes) * seconds * 3
    procs = mp.start_processes(rank_main, args=(free_port(), sizes, seconds, queue), nprocs=WORLD,
                               join=False, start_method="spawn")
    ok = False
    try:
        while time.monotonic() < deadline:
            if procs.join(timeout=1):
                ok = True
                break
    finally:
        for p in procs.processes:  # bounded: whatever is left past the deadline (or on error) goes
            if p.is_alive():
                p.kill()
            p.join()
    while not queue.empty():
        print(queue.get(), flush=True)
    if not ok:
        print("torch_gloo.py: timed out, children killed", file=sys.stderr)
        sys.exit(1)

if __name__ == "__main__":
    main()

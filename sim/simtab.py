#!/usr/bin/env python3
"""Tables from sim/dtrain_sim (docs/testbed.md, "A simulated training step").

  sim/simtab.py validate BED_POINTS.tsv   the simulator at every point the bed measured, sim vs bed
  sim/simtab.py predict                   32..256 workers at 1, 10, 100 Gbit: the ps count each
                                          needs, what bounds it, the BytePS closed form beside it

Options: --sim PATH (build/dtrain_sim), --costs FILE (sim/costs.txt), --steps N; predict: --models
a,b --gbits 1,10,100 --workers 32,64,128,256 --ps_fracs 0.5,1 --cores 1,4 --first_chunk_kb 0,4.
Weak scaling = the step of 1 worker and 1 ps over the step of W workers (the same compute C = 3x
one worker's exchange, M/B, as issue 41 asks); C / step the share of the ideal, compute alone.
A bed point is a line of BED_POINTS.tsv (tab-separated, header
`name mode workers ps gbit compute_ms model param_bytes step_ms K`): mode names sync or async,
bf16 or fp32, and, for a click-log model, `ids=N` (the distinct ids a worker's batch pulls)."""
import argparse
import math
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(HERE)
TCP = 1448.0 / 1514.0


def run_sim(args, model, ps, workers, gbit, compute_ms, sync=1, enc=4, sparse_ids=0, ps_cores=1, extra=()):
    cmd = [args.sim, "--model", os.path.join(SRC, "models", model + ".model"), "--ps", str(ps),
           "--workers", str(workers), "--gbit", str(gbit), "--compute_ms", "%g" % compute_ms,
           "--sync", str(sync), "--costs", args.costs, "--steps", str(args.steps),
           "--encoding_bytes", str(enc), "--cores", str(ps_cores)]
    if sparse_ids:
        cmd += ["--sparse_ids", str(sparse_ids)]
    cmd += list(extra)
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    kv = dict(w.split("=", 1) for w in out.split())
    for k in list(kv):
        try:
            kv[k] = float(kv[k])
        except ValueError:
            pass
    return kv


def validate(args):
    rows = []
    with open(args.bed) as f:
        head = f.readline().rstrip("\n").split("\t")
        for line in f:
            if not line.strip() or line.startswith("#"):
                continue
            rows.append(dict(zip(head, line.rstrip("\n").split("\t"))))
    print("| point | mode | workers | ps | Gbit | C ms | K | bed ms | sim ms | sim/bed | bound (sim) |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    worst, n = 0.0, 0
    for r in rows:
        mode = r["mode"]
        sync = 0 if "async" in mode else 1
        enc = 2 if any(e in mode or e in r["name"] for e in ("bf16", "fp16")) else 4
        ids = args.sparse_ids if mode == "sparse" else 0
        for part in mode.replace(",", " ").split():
            if part.startswith("ids="):
                ids = int(part[4:])
        kv = run_sim(args, r["model"], int(r["ps"]), int(r["workers"]), float(r["gbit"]),
                     float(r["compute_ms"]), sync=sync, enc=enc, sparse_ids=ids)
        bed = float(r["step_ms"])
        ratio = kv["step_ms"] / bed
        if float(r.get("K", "1")) >= args.min_k:
            worst = max(worst, abs(ratio - 1))
            n += 1
        print("| %s | %s | %s | %s | %s | %s | %s | %.1f | %.1f | %.3f | %s |" % (
            r["name"], mode, r["workers"], r["ps"], r["gbit"], r["compute_ms"], r.get("K", "1"), bed,
            kv["step_ms"], ratio, kv["bound"]))
    print("\nworst |sim/bed - 1| = %.1f%% over the %d points with K >= %g" % (worst * 100, n, args.min_k))
    return 0 if worst <= 0.10 else 1


def model_bytes(args, model):
    return run_sim(args, model, 1, 1, 1, 0)["model_bytes"]


def predict(args):
    print("| model | Gbit | C ms | workers | ps | cores | first chunk KiB | step ms | 1 worker ms | weak scaling | "
          "C / step | bound | ps link | ps CPU | worker link | worker CPU | BytePS exchange ms | BytePS step ms |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|")
    for model in args.models.split(","):
        M = model_bytes(args, model)
        for gbit in [float(g) for g in args.gbits.split(",")]:
            B = gbit * 1e9 / 8 * TCP
            C = 3 * M / B * 1e3  # compute = 3 x the exchange of one worker (issue 41's case)
            ones = {}
            for W in [int(w) for w in args.workers.split(",")]:
                for frac in [float(f) for f in args.ps_fracs.split(",")]:
                    p = min(W, max(1, math.ceil(W * frac)))
                    for cores in [int(c) for c in args.cores.split(",")]:
                        for first in [float(f) for f in args.first_chunk_kb.split(",")]:
                            extra = ("--first_chunk_kb", "%g" % first) if first else ()
                            key = (cores, first)
                            if key not in ones:
                                ones[key] = run_sim(args, model, 1, 1, gbit, C, ps_cores=cores, extra=extra)["step_ms"]
                            one = ones[key]
                            kv = run_sim(args, model, p, W, gbit, C, ps_cores=cores, extra=extra)
                            closed = max(M / B, W * M / (p * B)) * 1e3
                            print("| %s | %g | %.1f | %d | %d | %d | %g | %.1f | %.1f | %.1f%% | %.1f%% | %s | %.2f | %.2f | "
                                  "%.2f | %.2f | %.1f | %.1f |" % (
                                      model, gbit, C, W, p, cores, first, kv["step_ms"], one,
                                      100 * one / kv["step_ms"], 100 * C / kv["step_ms"], kv["bound"],
                                      kv["util_ps_link"], kv["util_ps_cpu"], kv["util_worker_link"],
                                      kv["util_worker_cpu"], closed, max(C, closed)))
                            sys.stdout.flush()
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["validate", "predict"])
    ap.add_argument("bed", nargs="?")
    ap.add_argument("--sim", default=os.path.join(SRC, "build", "dtrain_sim"))
    ap.add_argument("--costs", default=os.path.join(HERE, "costs.txt"))
    ap.add_argument("--steps", type=int, default=0, help="steps simulated (default: 6 validate, 3 predict: the symmetric runs are steady from the second step)")
    ap.add_argument("--models", default="catdog,fashion")
    ap.add_argument("--gbits", default="1,10,100")
    ap.add_argument("--min_k", type=float, default=0, help="validate: judge only the points dilated this much or more")
    ap.add_argument("--sparse_ids", type=int, default=7410,
                    help="a sparse point's distinct ids per worker batch (fm, batch 512 of gen-clicks --model fm --seed 3: "
                         "7,279-7,508 over 10 batches, mean 7,410)")
    ap.add_argument("--workers", default="32,64,128,256")
    ap.add_argument("--cores", default="1,4", help="predict: cores per host (a ps's appliers)")
    ap.add_argument("--ps_fracs", default="0.5,1", help="predict: ps tasks per worker tried (P = ceil(W f))")
    ap.add_argument("--first_chunk_kb", default="0,4", help="predict: chunk 0 of every shard cut to this (0: dtrain's even cut)")
    args = ap.parse_args()
    if not args.steps:
        args.steps = 6 if args.what == "validate" else 3
    if args.what == "validate":
        if not args.bed:
            ap.error("validate needs the bed's points (bench/bed_points.tsv)")
        return validate(args)
    return predict(args)


if __name__ == "__main__":
    sys.exit(main())

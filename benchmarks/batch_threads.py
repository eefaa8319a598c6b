"""What a second thread buys a batch's step: creature-steps of the C++ path on 1 thread against N threads, side
by side in one process (the thread counts alternate within each round, so that both meet the same load).

The C++ core's loops over a batch's creatures (their energies, Hessian blocks, factorizations and solves) run on
torch's intra-op threads (``csrc/diffsoft/core/parallel.h``), in chunks of at least about 300 us of work each:
small batches of small creatures stay on one thread, where waking another costs more than it saves.

    .venv/bin/python benchmarks/batch_threads.py [--threads 2] [--rounds 3] [--dtype float32]
        [--out benchmarks/results/batch_threads]

Each measurement is the best of ``--rounds`` 8-step rollouts from rest under random activations, forward and
backward (a loss on the last state, gradients to x0 and the activations), each after an untimed one at the same
count; ``diffsoft.threads.set_num_threads`` sets the count (torch's threads and OpenBLAS's).
"""
import argparse
import json
import os
import sys
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # benchmarks/README.md, "Threads under load"

import torch

from diffsoft import _C
from diffsoft.creatures import make_creature
from diffsoft.threads import set_num_threads

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import provenance  # noqa: E402

CASES = [("biped", b) for b in (8, 32, 128, 512)] + [("tetrapod", b) for b in (8, 32, 128)]
STEPS = 8


def rollout_seconds(sim, batch, dtype, seed=0):
    """Seconds for an 8-step rollout of ``batch`` creatures and its backward."""
    g = torch.Generator().manual_seed(seed)
    x, v = sim.rest_state
    x = x.expand(batch, *x.shape[-2:]).clone().requires_grad_()
    v = v.expand(batch, *v.shape[-2:]).clone()
    acts = (0.6 + 0.4 * torch.rand(STEPS, batch, sim.body.num_muscles, generator=g, dtype=dtype)).requires_grad_()
    start = time.perf_counter()
    xt, vt = x, v
    for t in range(STEPS):
        xt, vt = sim.step(xt, vt, acts[t])
    (xt[..., 0].sum() + (vt * vt).sum()).backward()
    return time.perf_counter() - start


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2, help="the thread count set against 1")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    ap.add_argument("--out", default=None, help="folder for batch_threads.md and batch_threads.json")
    args = ap.parse_args()
    openmp = getattr(_C, "HAS_OPENMP", False)  # (builds before 04955a6 have no flag, and no OpenMP)
    dtype = getattr(torch, args.dtype)
    counts = (1, args.threads)
    rows = []
    for creature, batch in CASES:
        sim = make_creature(creature, dtype)
        rollout_seconds(sim, batch, dtype)  # warm-up: first calls (allocations, caches) are not timed
        best = {n: float("inf") for n in counts}
        for _ in range(args.rounds):
            for n in counts:
                set_num_threads(n)
                rollout_seconds(sim, batch, dtype)  # the first after a switch meets a new team of threads
                best[n] = min(best[n], rollout_seconds(sim, batch, dtype))
        us = {n: 1e6 * best[n] / (batch * STEPS) for n in counts}
        rows.append(dict(creature=creature, batch=batch, us_per_creature_step=us, speedup=us[1] / us[args.threads]))
        print(f"{creature:9s} batch {batch:4d}: {us[1]:7.1f} us per creature-step on 1 thread, "
              f"{us[args.threads]:7.1f} on {args.threads}: {rows[-1]['speedup']:.2f}x", flush=True)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        head = (f"`python benchmarks/batch_threads.py --threads {args.threads} --rounds {args.rounds} --dtype "
                f"{args.dtype}` at {provenance.commit()}; torch {torch.__version__}, built with OpenMP: "
                f"{openmp}; {os.cpu_count()} cores; best of {args.rounds}, {STEPS}-step rollouts, forward "
                f"and backward; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.")
        lines = [head, "", f"| creature | batch | us per creature-step, 1 thread | {args.threads} threads | speedup |",
                 "| --- | ---: | ---: | ---: | ---: |"]
        lines += [f"| {r['creature']} | {r['batch']} | {r['us_per_creature_step'][1]:.1f} | "
                  f"{r['us_per_creature_step'][args.threads]:.1f} | {r['speedup']:.2f}x |" for r in rows]
        with open(os.path.join(args.out, "batch_threads.md"), "w") as f:
            f.write("\n".join(lines) + "\n")
        with open(os.path.join(args.out, "batch_threads.json"), "w") as f:
            json.dump(dict(args=vars(args), commit=provenance.commit(), torch=torch.__version__,
                           openmp=openmp, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()

"""Creature-steps per second of batches of bipeds, forward and forward + backward, on every device present, with
the torch backend, against the CPU default (the C++ kernels, ``backend="cpp"``) in the same run.

Each measurement is a rollout of ``--steps`` steps of ``B`` bipeds under random activations (walking-like states:
ground contact and friction act), timed best-of-``--repeat``; on CPU the two backends alternate, so that the
ratio between them is measured under the same load. Forward: the rollout without gradients. Forward + backward:
the rollout with x0, v0 and the activations requiring grad, and ``backward()`` of a loss on the last state.

    .venv/bin/python benchmarks/device_throughput.py [--max-batch 16384] [--cpu-max-batch 1024] [--dtype float32]
        [--steps 5] [--repeat 3] [--threads 1] [--json results/device_throughput.json]
"""
import argparse
import json
import os
import platform
import sys
import time

# Idle OpenMP threads sleep instead of spinning: read once, when torch loads OpenMP (benchmarks/README.md,
# "Threads under load").
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch

from diffsoft.creatures import biped
from diffsoft.threads import set_num_threads

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import provenance  # noqa: E402


def batches(max_batch):
    b, out = 64, []
    while b <= max_batch:
        out.append(b)
        b *= 4
    return out


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def rollout_time(sim, batch, steps, backward, device, dtype, seed=0):
    """Seconds for one rollout of ``steps`` steps of ``batch`` bipeds (and its backward)."""
    g = torch.Generator().manual_seed(seed)
    x, v = sim.rest_state
    x = x.expand(batch, -1, -1).clone()
    v = (v.expand(batch, -1, -1) + torch.tensor([0.5, -0.3], dtype=dtype) * torch.rand(batch, 1, 2, generator=g,
                                                                                     dtype=dtype)).to(device)
    acts = (0.6 + 0.4 * torch.rand(steps, batch, sim.body.num_muscles, generator=g, dtype=dtype)).to(device)
    x = x.to(device)
    if backward:
        x, v, acts = (t.requires_grad_() for t in (x, v, acts))
    _sync(device)
    start = time.perf_counter()
    with torch.set_grad_enabled(backward):
        xt, vt = x, v
        for t in range(steps):
            xt, vt = sim.step(xt, vt, acts[t])
        if backward:
            ((xt[..., 0] - x[..., 0].detach()).sum() + (vt * vt).sum()).backward()
    _sync(device)
    return time.perf_counter() - start


def measure(sims, batch, steps, repeat, dtype):
    """Best-of-``repeat`` creature-steps/s for each ``(name, sim, device)`` in ``sims``, forward and forward +
    backward; the simulators alternate within each repeat."""
    out = {name: [float("inf"), float("inf")] for name, _, _ in sims}
    for name, sim, device in sims:  # warm-up: first calls (allocations, caches) are not timed
        rollout_time(sim, batch, 1, True, device, dtype)
    for _ in range(repeat):
        for name, sim, device in sims:
            for k, backward in enumerate((False, True)):
                out[name][k] = min(out[name][k], rollout_time(sim, batch, steps, backward, device, dtype))
    return {name: [batch * steps / t for t in times] for name, times in out.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--max-batch", type=int, default=16384, help="largest batch on accelerators")
    ap.add_argument("--cpu-max-batch", type=int, default=1024, help="largest batch on the CPU")
    ap.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None,
                    help="threads for torch and OpenBLAS (diffsoft.threads.set_num_threads; default: theirs)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if args.threads:
        set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    devices = [torch.device("cpu")] + [torch.device("cuda", i) for i in range(torch.cuda.device_count())]

    rows = []
    for device in devices:
        cpu = device.type == "cpu"
        for batch in batches(args.cpu_max_batch if cpu else args.max_batch):
            sims = []
            if cpu:
                sim = biped(dtype=dtype)
                sim.backend = "cpp"
                sims.append(("cpp (CPU default)", sim, device))
            sim = biped(dtype=dtype).to(device=device)
            sim.backend = "torch"
            sims.append(("torch", sim, device))
            rates = measure(sims, batch, args.steps, args.repeat, dtype)
            name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
            for backend, (fwd, fwd_bwd) in rates.items():
                rows.append(dict(device=str(device), device_name=name, backend=backend, batch=batch, forward=fwd,
                                 forward_backward=fwd_bwd))
            if cpu:
                (f_cpp, fb_cpp), (f_t, fb_t) = rates["cpp (CPU default)"], rates["torch"]
                rows[-1].update(slowdown_forward=f_cpp / f_t, slowdown_forward_backward=fb_cpp / fb_t)

    print(f"bipeds, {args.dtype}, {args.steps}-step rollouts, best of {args.repeat}; torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads")
    print(f"{'device':<8} {'backend':<18} {'batch':>6} {'forward /s':>12} {'fwd+bwd /s':>12}  torch slower than cpp")
    for r in rows:
        ratio = (f"{r['slowdown_forward']:.2f}x / {r['slowdown_forward_backward']:.2f}x"
                 if "slowdown_forward" in r else "")
        print(f"{r['device']:<8} {r['backend']:<18} {r['batch']:>6} {r['forward']:>12.0f} "
              f"{r['forward_backward']:>12.0f}  {ratio}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(args=vars(args), commit=provenance.commit(), torch=torch.__version__, rows=rows), f,
                      indent=1)


if __name__ == "__main__":
    main()

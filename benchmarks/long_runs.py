"""Long runs with memory measured at the start and the end (resident memory, VmRSS, after gc and malloc_trim):

1. ``--steps`` (10,000) steps of a creature walking under a neural policy (algovivo's frame policy, seeded
   random weights, or a trained one with ``--policy runs/.../policy.json``), no gradients: memory must stay
   flat; every step's solver record is checked (converged, finite).
2. A ``--rollout-steps`` (1,000) step rollout of the same policy with the policy's parameters requiring grad,
   then its backward through all steps: memory grows by the stored states while the graph is held, and
   returns to the start afterwards.

    .venv/bin/python benchmarks/long_runs.py [--creature quadruped] [--steps 10000] [--rollout-steps 1000]
"""
import argparse
import os
import sys
import time
import warnings

import torch

from diffsoft.creatures import make_creature
from diffsoft.policy import FramePolicy, load_algovivo_policy

# The memory probe (tests/python/memory_probe.py) is test code: it lives with the tests.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "python"))

from memory_probe import resident_bytes  # noqa: E402


def rss_mb():
    rss = resident_bytes()
    return float("nan") if rss is None else rss / 2**20


class StepLog:
    """Counts the solver's outcomes over a run (a step that failed warns; the warning is counted, not shown)."""

    def __init__(self):
        self.steps = self.unconverged = self.newton = 0

    def record(self, info):
        self.steps += 1
        self.unconverged += not info.converged
        self.newton += info.iterations


def walk(sim, policy, steps, report_every):
    log = StepLog()
    x, v = sim.rest_state
    x, v = x[None], v[None]
    a = torch.ones(1, sim.body.num_muscles, dtype=x.dtype)
    start_x = x[0, :, 0].mean().item()
    memory = [(0, rss_mb())]
    t0 = time.perf_counter()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for t in range(steps):
            a = policy.act(x, v, a)
            x, v, info = sim.step(x, v, a, return_info=True)
            log.record(info)
            if (t + 1) % report_every == 0 or t + 1 == steps:
                memory.append((t + 1, rss_mb()))
    seconds = time.perf_counter() - t0
    finite = bool(torch.isfinite(x).all() and torch.isfinite(v).all())
    return log, memory, seconds, finite, x[0, :, 0].mean().item() - start_x


def rollout_with_backward(sim, policy, steps):
    for p in policy.parameters():
        p.grad = None
    x, v = sim.rest_state
    x, v = x[None], v[None]
    a = torch.ones(1, sim.body.num_muscles, dtype=x.dtype)
    log = StepLog()
    start = rss_mb()
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        xs = [x]
        for _ in range(steps):
            a = policy.act(x, v, a)
            x, v, info = sim.step(x, v, a, return_info=True)
            log.record(info)
            xs.append(x)
    forward_s = time.perf_counter() - t0
    held = rss_mb()
    loss = -torch.stack(xs)[-1, 0, :, 0].mean()
    t0 = time.perf_counter()
    loss.backward()
    backward_s = time.perf_counter() - t0
    after_backward = rss_mb()
    del xs, x, v, a, loss
    released = rss_mb()
    grads = [p.grad for p in policy.parameters()]
    finite = all(g is not None and bool(torch.isfinite(g).all()) for g in grads)
    grad_norm = torch.cat([g.flatten() for g in grads]).norm().item()
    return log, (start, held, after_backward, released), forward_s, backward_s, finite, grad_norm


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--creature", default="quadruped")
    ap.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    ap.add_argument("--policy", help="a policy.json (algovivo's format); default: seeded random weights")
    ap.add_argument("--steps", type=int, default=10_000)
    ap.add_argument("--rollout-steps", type=int, default=1_000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    dtype = getattr(torch, args.dtype)
    torch.manual_seed(args.seed)
    sim = make_creature(args.creature, dtype)
    policy = load_algovivo_policy(args.policy, dtype) if args.policy else FramePolicy.for_simulator(sim)
    print(f"{args.creature} ({sim.body.num_vertices} vertices, {sim.body.num_muscles} muscles), {args.dtype}, "
          f"policy {'from ' + args.policy if args.policy else f'random (seed {args.seed})'}, torch {torch.__version__}")

    log, memory, seconds, finite, distance = walk(sim, policy, args.steps, max(args.steps // 10, 1))
    print(f"\n1. {args.steps} steps under the policy, no grad: {seconds:.1f} s ({args.steps / seconds:.0f} steps/s), "
          f"{log.newton / log.steps:.1f} Newton iterations per step, {log.unconverged} unconverged, "
          f"final state {'finite' if finite else 'NOT FINITE'}, centre moved {distance:+.2f} m")
    print("   step      RSS (MB)")
    for t, mb in memory:
        print(f"   {t:>6}  {mb:10.1f}")
    print(f"   growth start -> end: {memory[-1][1] - memory[0][1]:+.1f} MB; "
          f"after the first report -> end: {memory[-1][1] - memory[1][1]:+.1f} MB")

    log, (start, held, after, released), fwd, bwd, finite, gnorm = rollout_with_backward(sim, policy, args.rollout_steps)
    state_kb = sim.body.num_vertices * sim.body.dim * torch.finfo(dtype).bits / 8 / 1024
    n = args.rollout_steps
    print(f"\n2. {n}-step rollout with backward through all steps: forward {fwd:.1f} s, backward {bwd:.1f} s, "
          f"{log.unconverged} unconverged steps, gradient {'finite' if finite else 'NOT FINITE'} (norm {gnorm:.3g})")
    print(f"   RSS (MB): start {start:.1f}, graph held {held:.1f} ({held - start:+.1f}, "
          f"{(held - start) * 1024 / n:.1f} kB per step; one state is {state_kb:.2f} kB), "
          f"after backward {after:.1f} ({after - start:+.1f}), after releasing {released:.1f} ({released - start:+.1f})")


if __name__ == "__main__":
    main()

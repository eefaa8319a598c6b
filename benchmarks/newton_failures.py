"""How often the simulator's Newton solve stops at ``max_iter`` on a trained gait, and what changes it.

Takes a training checkpoint (a policy and its pool of creatures mid-gait), runs the training rollout's
forward pass (the pool's creatures, the policy plus the training noise of the checkpoint's config, no
gradient) for ``--windows`` windows under each solver setting, and counts the creature-steps that did not
converge, with the Newton iterations used and the final force residual over its tolerance.

    .venv/bin/python benchmarks/newton_failures.py runs/biped/checkpoint.pt --windows 8 --threads 1 [--variant NAME ...]
"""
import argparse
import os
import time

# Idle OpenMP threads sleep instead of spinning: read once, when torch loads OpenMP (benchmarks/README.md,
# "Threads under load").
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch

from diffsoft import training
from diffsoft._compat import load_checkpoint
from diffsoft.creatures import fingerprint_changes, make_creature
from diffsoft.threads import set_num_threads

VARIANTS = {
    "default (float32, max_iter 100)": {},
    "max_iter 200": {"max_iter": 200},
    "atol x 4": {"atol_scale": 4.0},
    "atol x 10": {"atol_scale": 10.0},
    "float64": {"dtype": torch.float64},
}


def run(ckpt, variant, windows):
    cfg = training.TrainConfig.recorded(ckpt["config"])
    dtype = variant.get("dtype", getattr(torch, cfg.dtype))
    # the creature as trained (its dtype's rounding is part of its content), then as the variant replays it
    changed = fingerprint_changes(ckpt.get("creature", {}), make_creature(cfg.creature, getattr(torch, cfg.dtype)))
    if "creature" in ckpt and changed:
        raise SystemExit(f"the checkpoint was trained on another creature than {cfg.creature!r} is now (its "
                         f"{', '.join(changed)} differ): replay it with the code it was trained with")
    sim = make_creature(cfg.creature, dtype)
    if "max_iter" in variant:
        sim.solver_options["max_iter"] = variant["max_iter"]
    if "atol_scale" in variant:
        sim.solver_options["atol"] *= variant["atol_scale"]
    policy = training.new_policy(cfg, sim)
    policy.load_state_dict(ckpt["policy"])
    policy.to(dtype)
    x, v, a = (ckpt["pool"][k].to(dtype) for k in ("x", "v", "a"))
    heading = ckpt["pool"]["heading"].to(dtype) if policy.steered else None
    failed, iterations, excess, steps = 0, [], [], 0
    t0 = time.perf_counter()
    with torch.no_grad():
        for w in range(windows):
            g = torch.Generator().manual_seed(12345 + w)
            noise = cfg.action_noise * torch.randn(cfg.window, *a.shape, generator=g, dtype=torch.float64)
            for t in range(cfg.window):
                a = policy.update(a, policy(x, v, heading), noise[t].to(dtype))
                x, v, info = sim.step(x, v, a, return_info=True)
                steps += a.shape[0]
                bad = ~torch.as_tensor(info.problem_converged)
                failed += int(bad.sum())
                iterations.append(int(info.iterations))
                if bad.any():
                    excess.append(info.message)
    return {"failed": failed, "steps": steps, "max_newton_iterations": max(iterations),
            "mean_newton_iterations_per_call": sum(iterations) / len(iterations),
            "seconds": time.perf_counter() - t0, "messages": excess[:3]}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("checkpoint")
    p.add_argument("--windows", type=int, default=8)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--variant", action="append", choices=sorted(VARIANTS), default=None,
                   help="the solver settings to run (repeatable; default: all)")
    args = p.parse_args()
    if args.threads:
        set_num_threads(args.threads)
    ckpt = load_checkpoint(args.checkpoint)
    print("| solver setting | creature-steps not converged | creature-steps | most Newton iterations in a step "
          "| mean Newton iterations per step | seconds |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name in args.variant or VARIANTS:
        r = run(ckpt, VARIANTS[name], args.windows)
        print(f"| {name} | {r['failed']} | {r['steps']} | {r['max_newton_iterations']} | "
              f"{r['mean_newton_iterations_per_call']:.1f} | {r['seconds']:.1f} |", flush=True)
        for m in r["messages"]:
            print("    ", m)


if __name__ == "__main__":
    main()

"""Sample efficiency: the differentiable simulator (diffsoft.training) against PPO (diffsoft.ppo).

Both methods train the same policy shape on the same creature, observations, action bounds, reward and
horizon, from several seeds. Both are measured the same way: the deterministic policy's distance along +x
over the horizon, from rest (:func:`diffsoft.policy.distance_walked`; PPO's mean action), against the
number of simulated creature-steps used for training so far (evaluation rollouts are not counted, for
either method). Both get the same budget of ``--steps`` simulated creature-steps per seed (the
differentiable method: ``steps // (batch * window)`` iterations, with its learning rate decaying over them).

    .venv/bin/python benchmarks/sample_efficiency.py --seeds 3 --target 2.0 --threads 1

Writes ``results.json``, ``results.md`` (the table) and ``sample_efficiency.png`` under ``--out``.
"""
import argparse
import dataclasses
import json
import os
import time

import torch

from diffsoft import ppo, training
from diffsoft.creatures import make_creature
from diffsoft.policy import distance_walked


def steps_to_target(history, target):
    """The first evaluation's simulated steps at which the distance reached ``target``, or None."""
    for r in history:
        if "eval_distance" in r and r["eval_distance"] >= target:
            return r["eval_sim_steps"]
    return None


def curve(history):
    return [(r["eval_sim_steps"], r["eval_distance"]) for r in history if "eval_distance" in r]


def run_differentiable(args, seed):
    iterations = max(args.steps // (args.batch * args.window), 1)
    cfg = training.TrainConfig(creature=args.creature, eval_horizon=args.horizon, window=args.window,
                               batch=args.batch, iterations=iterations, lr_decay_iterations=iterations,
                               eval_every=args.eval_every, checkpoint_every=10 ** 9, seed=seed,
                               out_dir=os.path.join(args.out, f"diff_seed{seed}"))
    t = time.perf_counter()
    policy, history = training.train(cfg, progress=not args.no_progress)
    wall = time.perf_counter() - t
    final = distance_walked(make_creature(cfg.creature), policy, cfg.eval_horizon)
    history.append({"eval_distance": final, "eval_sim_steps": history[-1]["sim_steps"]})
    return {"config": dataclasses.asdict(cfg), "history": history, "wall_seconds": wall,
            "train_seconds": history[-2]["seconds"], "sim_steps": history[-2]["sim_steps"]}


def run_ppo(args, seed, budget, **overrides):
    settings = dict(creature=args.creature, horizon=args.horizon, envs=args.ppo_envs, steps=budget,
                    lr=args.ppo_lr, epochs=args.ppo_epochs, minibatch=args.ppo_minibatch,
                    entropy_coef=args.ppo_entropy, clip_ratio=args.ppo_clip, eval_every=args.ppo_eval_every,
                    seed=seed)
    settings.update(overrides)
    cfg = ppo.PPOConfig(**settings)
    t = time.perf_counter()
    _, history = ppo.train_ppo(cfg, progress=not args.no_progress)
    return {"config": dataclasses.asdict(cfg), "history": history, "wall_seconds": time.perf_counter() - t,
            "train_seconds": history[-1]["seconds"], "sim_steps": history[-1]["sim_steps"]}


def table(results, target):
    lines = [f"| method | seed | simulated creature-steps | steps to reach {target} | best distance | "
             f"final distance | wall time (s) |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for method, runs in results["runs"].items():
        for seed, r in sorted(runs.items()):
            reached = steps_to_target(r["history"], target)
            dists = [d for _, d in curve(r["history"])]
            lines.append(f"| {method} | {seed} | {r['sim_steps']} | {reached if reached is not None else 'not reached'}"
                         f" | {max(dists):.3f} | {dists[-1]:.3f} | {r['wall_seconds']:.0f} |")
    for method, runs in results["runs"].items():
        reached = [steps_to_target(r["history"], target) for r in runs.values()]
        ok = sorted(s for s in reached if s is not None)
        median = ok[len(ok) // 2] if len(ok) * 2 > len(reached) else None
        lines.append(f"\n{method}: reached {target} in {len(ok)}/{len(reached)} seeds; median steps "
                     f"{median if median is not None else 'not reached (fewer than half the seeds)'}")
    return "\n".join(lines)


def plot(results, path, target):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.5))
    colours = {"differentiable": "tab:blue", "ppo": "tab:orange"}
    for method, runs in results["runs"].items():
        for k, (seed, r) in enumerate(sorted(runs.items())):
            s, d = zip(*curve(r["history"]))
            ax.plot([max(v, 1) for v in s], d, color=colours[method], alpha=0.8,
                    label=method if k == 0 else None)
    ax.axhline(target, color="grey", ls="--", label=f"target {target}")
    ax.set_xscale("log")
    ax.set_xlabel("simulated creature-steps (training)")
    ax.set_ylabel("distance along +x over the horizon (deterministic, from rest)")
    ax.set_title(f"{results['args']['creature']}: differentiable simulation vs PPO")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# PPO's search: each entry changes the command line's PPO settings (the baseline) in one or two ways.
TUNING = [{}, {"lr": 1e-3}, {"minibatch": 1600}, {"entropy_coef": 0.01}, {"clip_ratio": 0.1},
          {"envs": 64, "minibatch": 960}]


def tune_ppo(args):
    """Every :data:`TUNING` variant on seed 0 with ``--steps``; scored by the mean of the last three
    evaluations (the final one included), which is less noisy than the final one alone."""
    path = os.path.join(args.out, "tuning.json")
    runs = json.load(open(path)) if os.path.exists(path) else []
    done = [r["overrides"] for r in runs]
    for overrides in TUNING:
        if overrides in done:
            continue
        r = run_ppo(args, 0, args.steps, **overrides)
        dists = [d for _, d in curve(r["history"])]
        runs.append({"overrides": overrides, "score": sum(dists[-3:]) / 3, "final": dists[-1], "best": max(dists),
                     "wall_seconds": r["wall_seconds"], "sim_steps": r["sim_steps"], "config": r["config"],
                     "history": r["history"]})
        json.dump(runs, open(path, "w"), indent=1)
        print(runs[-1]["overrides"], f"score {runs[-1]['score']:.3f} final {runs[-1]['final']:.3f}", flush=True)
    lines = ["| PPO settings (changed from the baseline) | mean of the last 3 evaluations | final | best | "
             "wall time (s) |", "| --- | --- | --- | --- | --- |"]
    for r in sorted(runs, key=lambda r: -r["score"]):
        name = ", ".join(f"{k}={v}" for k, v in r["overrides"].items()) or "baseline"
        lines.append(f"| {name} | {r['score']:.3f} | {r['final']:.3f} | {r['best']:.3f} | {r['wall_seconds']:.0f} |")
    with open(os.path.join(args.out, "tuning.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--creature", default="biped")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--target", type=float, default=2.0, help="distance along +x over the horizon")
    p.add_argument("--horizon", type=int, default=100, help="PPO's episode length and both evaluations' steps")
    p.add_argument("--steps", type=int, default=409_600, help="simulated creature-steps per seed and method")
    p.add_argument("--window", type=int, default=training.TrainConfig.window)
    p.add_argument("--batch", type=int, default=training.TrainConfig.batch)
    p.add_argument("--eval-every", type=int, default=10, help="the differentiable method's, in iterations")
    p.add_argument("--ppo-envs", type=int, default=32)
    p.add_argument("--ppo-lr", type=float, default=3e-4)
    p.add_argument("--ppo-epochs", type=int, default=10)
    p.add_argument("--ppo-minibatch", type=int, default=480)
    p.add_argument("--ppo-entropy", type=float, default=0.0)
    p.add_argument("--ppo-clip", type=float, default=0.2)
    p.add_argument("--ppo-eval-every", type=int, default=2)
    p.add_argument("--tune", action="store_true",
                   help="PPO's settings search instead (seed 0, --steps each): writes tuning.json and tuning.md")
    p.add_argument("--only", choices=("differentiable", "ppo"), default=None)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--out", default="runs/sample_efficiency")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    os.makedirs(args.out, exist_ok=True)
    if args.tune:
        return tune_ppo(args)
    path = os.path.join(args.out, "results.json")
    results = json.load(open(path)) if os.path.exists(path) else {"runs": {"differentiable": {}, "ppo": {}}}
    results["args"] = vars(args)
    for seed in range(args.seeds):
        if args.only in (None, "differentiable"):
            results["runs"]["differentiable"][str(seed)] = run_differentiable(args, seed)
            json.dump(results, open(path, "w"))
        if args.only in (None, "ppo"):
            results["runs"]["ppo"][str(seed)] = run_ppo(args, seed, args.steps)
            json.dump(results, open(path, "w"))
    results["runs"] = {m: r for m, r in results["runs"].items() if r}
    md = table(results, args.target)
    with open(os.path.join(args.out, "results.md"), "w") as f:
        f.write(md + "\n")
    plot(results, os.path.join(args.out, "sample_efficiency.png"), args.target)
    print(md)


if __name__ == "__main__":
    main()

"""Sample efficiency: the differentiable simulator (diffsoft.training) against PPO (diffsoft.ppo, and
Stable-Baselines3's through diffsoft.envs: ``--only sb3``).

Both methods train the same policy shape on the same creature, observations, action bounds, reward and
horizon, from several seeds. Both are measured the same way: the deterministic policy's distance along +x
over the horizon, from rest (:func:`diffsoft.policy.distance_walked`; PPO's mean action), against the
number of simulated creature-steps used for training so far (evaluation rollouts are not counted, for
either method). Both get the same budget of ``--steps`` simulated creature-steps per seed (the
differentiable method: ``steps // (batch * window)`` iterations, with its learning rate decaying over them,
or over ``--lr-decay-iterations``); ``--diff-set NAME=VALUE ...`` sets other
:class:`~diffsoft.training.TrainConfig` fields of the differentiable side (e.g. ``episode=128``).

    .venv/bin/python benchmarks/sample_efficiency.py --tune --steps 96000 --threads 1 --out runs/ppo_tuning
    .venv/bin/python benchmarks/sample_efficiency.py --seeds 3 --threads 1 --out runs/se_biped
    .venv/bin/python benchmarks/sample_efficiency.py --seeds 3 --threads 1 --creature mesh.json --out runs/se_mesh

Writes under ``--out`` (default ``runs/sample_efficiency``, git-ignored): ``results.json`` (every run's config
and full history), ``summary.json`` (the compact record that ``benchmarks/results/`` keeps: each run's config,
every evaluation and its totals; :func:`summarize`), ``results.md`` (the table: creature-steps and training
time to reach 0.5, 1.0, 2.0 and PPO's own final distance, and the final distance at the common budget) and
``sample_efficiency.png``. ``--only`` runs one method; ``--side-by-side LANES`` runs every method of
``--methods`` on every seed, each run a process of its own, LANES at a time at one load (:func:`side_by_side`),
and reports them together; ``--merge`` adds other ``summary.json`` or ``results.json`` files to the report (two
methods run as two processes; ``--merge-method`` takes one method's runs from them, e.g. PPO's from an earlier
report), ``--report`` only reports. ``--tune`` is PPO's settings search (:data:`TUNING`) on seed 0.
``benchmarks/make_figures.py`` regenerates every committed table and plot from the summaries in
``benchmarks/results/``. ``--tune-sb3`` is Stable-Baselines3's settings search (:data:`SB3_TUNING`; ``--sb3-set
NAME=VALUE ...`` sets the settings of ``benchmarks/sb3_ppo.py``'s ``BASELINE`` for ``--only sb3``). SB3 needs
pip's torch 2.x (benchmarks/results/peers/README.md). The tables' "best PPO" is
the PPO (diffsoft.ppo or SB3) with the larger mean final distance.
"""
import argparse
import copy
import dataclasses
import json
import os
import platform
import re
import shlex
import sys
import time

# Idle OpenMP threads sleep instead of spinning: read once, when torch loads OpenMP (benchmarks/README.md,
# "Threads under load").
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch

from diffsoft import ppo, training
from diffsoft._checks import setting_kind
from diffsoft._compat import load_checkpoint
from diffsoft.creatures import CREATURES, make_creature
from diffsoft.policy import Gait, distance_walked, gait
from diffsoft.task import LocomotionTask
from diffsoft.threads import set_num_threads

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import provenance  # noqa: E402


def _history_evaluations(history):
    """``[(creature-steps, training seconds, distance, training CPU seconds)]`` of every evaluation in a full
    ``history``: the steps, the training wall-clock time and the process's CPU time (evaluations excluded) spent
    before it; the CPU time is None in histories recorded before the trainers kept it."""
    timed = any("cpu_seconds" in r for r in history)
    out, seconds, cpu = [], 0.0, 0.0
    for r in history:
        if "eval_distance" in r:
            out.append((r["eval_sim_steps"], seconds, r["eval_distance"], cpu if timed else None))
        seconds, cpu = r.get("seconds", seconds), r.get("cpu_seconds", cpu)
    return out


def _creature_steps(failure):
    """How many creatures one of the trainer's messages about a step that did not converge names."""
    return len(re.search(r"creature\(s\) \[([^\]]*)\]", failure).group(1).split(","))


def summarize(run):
    """The compact record of one run (a method and a seed), from its full record (``config``, ``history``,
    ``wall_seconds``, ``train_seconds``, ``sim_steps``); a compact record is returned as it is.

    Keeps the config, every evaluation as ``[creature-steps, training seconds before it, distance, training CPU
    seconds before it]`` (distance to 1e-6, seconds to 1 ms: finer than any table prints; the CPU seconds
    only where the history has them), the totals, ``terminated`` (early terminations over the run),
    ``not_converged`` (creature-steps whose Newton solve did not converge, left out of their iteration) and,
    where recorded, ``machine`` (:func:`machine`, at the run's start and end) and ``gait`` (the final policy's
    over 1,000 steps from rest, :meth:`diffsoft.policy.Gait.summary`; every method's runs since ``gait``
    existed, PPO's and SB3's through ``LocomotionTask.rollout`` of their deterministic policies). A 400-iteration
    run's full history is some 0.3 MB; this is some 10 kB.
    """
    if "evaluations" in run:
        return run
    history = run["history"]
    out = {"config": run["config"],
           "evaluations": [[s, round(t, 3), round(d, 6)] + ([] if c is None else [round(c, 3)])
                           for s, t, d, c in _history_evaluations(history)],
           "train_seconds": round(run["train_seconds"], 3), "wall_seconds": round(run["wall_seconds"], 3),
           "sim_steps": run["sim_steps"], "terminated": sum(r.get("terminated", 0) for r in history),
           "not_converged": sum(_creature_steps(f) for r in history for f in r.get("failures", ()))
           + sum(r.get("not_converged", 0) for r in history)}  # (the differentiable's failures, PPO's counts)
    cpu = [r["cpu_seconds"] for r in history if "cpu_seconds" in r]
    if cpu:
        out["train_cpu_seconds"] = round(cpu[-1], 3)
    for key in ("machine", "gait"):
        if key in run:
            out[key] = run[key]
    return out


def evaluations(run):
    """``[(creature-steps, training seconds, distance, training CPU seconds or None)]`` of every evaluation of a
    run (full or compact)."""
    return [(e[0], e[1], e[2], e[3] if len(e) > 3 else None) for e in summarize(run)["evaluations"]]


def first_reaching(run, target):
    """``(creature-steps, training seconds, training CPU seconds or None)`` of the first evaluation at or past
    ``target``, or None."""
    return next(((s, t, c) for s, t, d, c in evaluations(run) if d >= target), None)


def curve(run, x="steps"):
    """``[(creature-steps, distance)]`` of every evaluation, or with ``x="seconds"`` the training seconds."""
    return [(t if x == "seconds" else s, d) for s, t, d, _ in evaluations(run)]


def machine(threads):
    """Where and under what load a run trains: the processor, torch's thread count (``--threads``; None: torch's
    default), the 1-minute load average (to which the run's own process adds one) and torch's version."""
    try:
        with open("/proc/cpuinfo") as f:
            processor = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), None)
    except OSError:
        processor = None
    return {"processor": processor or platform.processor(), "cores": os.cpu_count(), "threads": threads,
            "load": round(os.getloadavg()[0], 2), "torch": torch.__version__}


def run_differentiable(args, seed):
    start = machine(args.threads)
    iterations = max(args.steps // (args.batch * args.window), 1)
    settings = diff_settings(args.diff_set)
    if "keep_best" in settings:
        raise SystemExit("--diff-set keep_best: the benchmark's final distance and gait are the final policy's, as "
                         "PPO's are (keep_best's choice among the evaluations would be an optimistic final)")
    # keep_best off: it changes no evaluation of the curve, only which policy the run returns
    cfg = training.TrainConfig(creature=args.creature, eval_horizon=args.horizon, window=args.window,
                               batch=args.batch, iterations=iterations,
                               lr_decay_iterations=args.lr_decay_iterations or iterations,
                               eval_every=args.eval_every, checkpoint_every=10 ** 9, seed=seed, device=args.device,
                               out_dir=os.path.join(args.out, f"diff_seed{seed}"), keep_best=False, **settings)
    t = time.perf_counter()
    policy, history = training.train(cfg, progress=not args.no_progress)
    wall = time.perf_counter() - t
    sim = make_creature(cfg.creature)
    final = distance_walked(sim, policy, cfg.eval_horizon)
    history.append({"eval_distance": final, "eval_sim_steps": history[-1]["sim_steps"]})
    return {"config": dataclasses.asdict(training.for_creature(cfg, sim)),  # min_a and mirror as the run took them
            "history": history, "wall_seconds": wall, "gait": gait(sim, policy).summary(),
            "train_seconds": history[-2]["seconds"], "sim_steps": history[-2]["sim_steps"],
            "machine": {"start": start, "end": machine(args.threads)}}


def diff_settings(pairs):
    """``--diff-set``'s ``NAME=VALUE`` pairs as :class:`~diffsoft.training.TrainConfig` fields of their
    defaults' types (``ValueError`` naming an unknown field)."""
    defaults = training.TrainConfig()
    out = {}
    for pair in pairs:
        name, _, value = pair.partition("=")
        if name not in {f.name for f in dataclasses.fields(defaults)} or not value:
            raise ValueError(f"--diff-set takes TrainConfig's NAME=VALUE, got {pair!r}")
        kind = setting_kind(training.TrainConfig, name)
        out[name] = value.lower() in ("1", "true", "yes") if kind is bool else kind(value)
    return out


def run_ppo(args, seed, budget, **overrides):
    settings = dict(creature=args.creature, horizon=args.horizon, envs=args.ppo_envs, steps=budget,
                    lr=args.ppo_lr, epochs=args.ppo_epochs, minibatch=args.ppo_minibatch,
                    entropy_coef=args.ppo_entropy, clip_ratio=args.ppo_clip, eval_every=args.ppo_eval_every,
                    seed=seed, device=args.device)
    settings.update(overrides)
    cfg = ppo.PPOConfig(**settings)
    start, t = machine(args.threads), time.perf_counter()
    model, history = ppo.train_ppo(cfg, progress=not args.no_progress)
    wall = time.perf_counter() - t
    task = LocomotionTask(make_creature(cfg.creature, getattr(torch, cfg.dtype), cfg.device), cfg.horizon,
                          cfg.min_a, cfg.max_abs_da)
    recorded = dataclasses.replace(cfg, min_a=task.min_a, mirror=model.mirrored)  # as the run took them
    return {"config": dataclasses.asdict(recorded), "history": history,
            "wall_seconds": wall, "gait": Gait.of(task.sim, ppo.rollout(task, model, 1000)).summary(),
            "train_seconds": history[-1]["seconds"], "sim_steps": history[-1]["sim_steps"],
            "machine": {"start": start, "end": machine(args.threads)}}


def sb3_settings(pairs):
    """``--sb3-set``'s ``NAME=VALUE`` pairs as settings of sb3_ppo.BASELINE, of their defaults' types."""
    from sb3_ppo import BASELINE
    out = {}
    for pair in pairs:
        name, _, value = pair.partition("=")
        if name not in BASELINE or not value:
            raise ValueError(f"--sb3-set takes NAME=VALUE with NAME one of {sorted(BASELINE)}, got {pair!r}")
        kind = type(BASELINE[name])
        out[name] = value.lower() in ("1", "true", "yes") if kind is bool else kind(value)
    return out


def run_sb3(args, seed, budget, **overrides):
    from sb3_ppo import train_sb3
    start, t = machine(args.threads), time.perf_counter()
    config, history, final = train_sb3(args.creature, args.horizon, budget, seed, eval_every=args.ppo_eval_every,
                                       device=args.device, **{**sb3_settings(args.sb3_set), **overrides})
    return {"config": config, "history": history, "wall_seconds": time.perf_counter() - t, "gait": final.summary(),
            "train_seconds": history[-1]["seconds"], "sim_steps": history[-1]["sim_steps"],
            "machine": {"start": start, "end": machine(args.threads)}}


PPOS = ("ppo", "sb3")
PPO_NAMES = {"ppo": "PPO", "sb3": "SB3's PPO"}
"""The PPOs and their names in the tables, which measure against the one with the larger mean final distance."""


def _median(values):
    """The median of the values, a value that is None (not reached) counting as larger than any number
    (with an even count, the mean of the middle two); None when the median is such a value."""
    ordered = sorted(values, key=lambda v: (v is None, v or 0))
    middle = ordered[(len(values) - 1) // 2], ordered[len(values) // 2]
    return None if None in middle else (middle[0] + middle[1]) / 2


def table(results, targets=(0.5, 1.0, 2.0)):
    """The Markdown table: for each method and seed, the creature-steps and training seconds (wall-clock, and
    the process's CPU time where recorded; evaluations excluded) to reach each of ``targets`` and PPO's own
    final distance (the mean over its seeds), and the final distance at the common budget; then each method's
    median over seeds, the medians' ratios, and where the runs trained (:func:`machine`)."""
    runs = results["runs"]
    finals = {m: {seed: evaluations(r)[-1][2] for seed, r in rs.items()} for m, rs in runs.items()}
    timed = {m: all(evaluations(r)[-1][3] is not None for r in rs.values()) for m, rs in runs.items()}
    targets = list(targets)
    header = [f"reach {t:g}" for t in targets]
    means = {m: sum(finals[m].values()) / len(finals[m]) for m in PPOS if finals.get(m)}
    best_ppo = max(means, key=means.get) if means else None
    if best_ppo:
        targets.append(means[best_ppo])
        header.append(f"reach {PPO_NAMES[best_ppo]}'s final ({means[best_ppo]:.2f})")
    lines = [f"Runs: {'; '.join(results['sources'])}.", "",
             "Cells: creature-steps / training seconds to the first evaluation at or past the distance "
             "(deterministic policy, 100 steps from rest); -: not reached within the budget. Training seconds are "
             "wall-clock with every evaluation excluded" + (", then the process's CPU seconds over the same spans"
                                                            if any(timed.values()) else "") + ".", "",
             "| method | seed | " + " | ".join(header) + " | final distance | best | creature-steps | "
             "training time (s) |", "| --- " * (len(header) + 6) + "|"]

    def seconds(wall, cpu):
        return ("-" if wall is None else f"{wall:.0f}") + ("" if cpu is None else f" / {cpu:.0f} CPU")

    def cell(hit):
        return "-" if hit is None else f"{hit[0]:,} / {seconds(hit[1], hit[2])}"

    summary, medians = [], {}
    for method, rs in runs.items():
        hits = {seed: [first_reaching(r, t) for t in targets] for seed, r in rs.items()}
        for seed, r in sorted(rs.items()):
            best = max(e[2] for e in evaluations(r))
            total = seconds(r["train_seconds"], r.get("train_cpu_seconds") if timed[method] else None)
            lines.append(f"| {method} | {seed} | " + " | ".join(cell(h) for h in hits[seed]) +
                         f" | {finals[method][seed]:.2f} | {best:.2f} | {r['sim_steps']:,} | {total} |")
        cells = []
        for k in range(len(targets)):
            column = [hits[seed][k] for seed in rs]
            steps = _median([h and h[0] for h in column])
            secs = _median([h and h[1] for h in column])
            cpu = _median([h and h[2] for h in column]) if timed[method] else None
            n = sum(h is not None for h in column)
            medians.setdefault(method, []).append((steps, secs, cpu))
            cells.append(f"{'-' if steps is None else f'{steps:,.0f}'} / {seconds(secs, cpu)} ({n}/{len(column)})")
        fin = list(finals[method].values())
        summary.append(f"| {method} | median | " + " | ".join(cells) + f" | {_median(fin):.2f} "
                       f"(mean {sum(fin) / len(fin):.2f}) | | | |")
    lines += summary
    if best_ppo and "differentiable" in medians:
        ratios = []
        for d, p in zip(medians["differentiable"], medians[best_ppo]):
            parts = ["-" if None in (d[k], p[k]) or not d[k] else f"{p[k] / d[k]:.1f}x" for k in range(3)]
            ratios.append(" / ".join(parts[:2] + ([f"{parts[2]} CPU"] if timed["differentiable"] and timed[best_ppo]
                                                   else [])))
        lines.append(f"| {PPO_NAMES[best_ppo]} / differentiable | medians' ratio | " + " | ".join(ratios) + " | | | | |")
    gaits = [(m, seed, r["gait"]) for m, rs in runs.items() for seed, r in sorted(rs.items()) if "gait" in r]
    if gaits:
        lines.append("\nGaits of the final policies over 1,000 steps from rest (diffsoft.policy.Gait: the last 100 "
                     "steps' distance over the first 100's, >= 0.7 to keep walking; the least height over rest's, "
                     ">= 0.3 to stay up): " + "; ".join(
                         f"{m} seed {seed} {g['last'] / g['first'] if g['first'] > 0 else 0:.2f}, "
                         f"{g['least_height']:.2f} ({'lasts' if g['keeps_walking'] and g['stays_up'] else 'fails'})"
                         for m, seed, g in gaits) + ".")
    lines.append("\nMedian rows: the median over seeds (a seed that did not reach counts as never; with an even "
                 "number of seeds, the mean of the middle two; (n/N): seeds that reached).")
    where = machines(results)
    if where:
        lines.append("\n" + where)
    return "\n".join(lines)


def machines(results):
    """A sentence per method saying where its runs trained (processor, threads, the load at their starts and
    ends), from the runs' ``machine`` records; empty where none has one."""
    out = []
    for method, rs in results["runs"].items():
        records = [r["machine"] for r in rs.values() if "machine" in r]
        if not records:
            continue
        loads = [m[k]["load"] for m in records for k in ("start", "end")]
        kinds = sorted({f"{m['start']['processor']} ({m['start']['cores']} cores), torch {m['start']['torch']}, "
                        f"threads {m['start']['threads']}" for m in records})
        out.append(f"{method} ({len(records)} of {len(rs)} runs recorded): {'; '.join(kinds)}; load "
                   f"{min(loads):.1f}-{max(loads):.1f} at the runs' starts and ends.")
    return ("Machines: " + " ".join(out)) if out else ""


def plot(results, path, targets=(0.5, 1.0, 2.0)):
    """A small PNG of every run's evaluations against simulated creature-steps (left) and against training
    seconds (right: wall-clock, evaluations excluded; a log axis, on which a constant ratio of times is a
    constant shift, without the evaluations at 0 s)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    colours = {"differentiable": "tab:blue", "ppo": "tab:orange", "sb3": "tab:green"}
    for ax, x, label in ((axes[0], "steps", "simulated creature-steps (training)"),
                         (axes[1], "seconds", "training seconds (wall-clock, evaluations excluded)")):
        for method, runs in results["runs"].items():
            for k, (seed, r) in enumerate(sorted(runs.items())):
                s, d = zip(*[(s, d) for s, d in curve(r, x) if x == "steps" or s > 0])
                ax.plot(s, d, color=colours[method], alpha=0.8, label=method if k == 0 else None)
        for t in targets:
            ax.axhline(t, color="grey", ls="--", lw=0.8)
        ax.set_xlabel(label)
        ax.grid(alpha=0.3)
    axes[1].set_xscale("log")
    axes[0].set_ylabel("distance in 100 steps (deterministic, from rest)")
    axes[0].legend()
    name = results["creature"]
    name = name if name in CREATURES else os.path.join(*os.path.normpath(name).split(os.sep)[-3:])
    fig.suptitle(f"{name}: differentiable simulation vs PPO "
                 f"({max(len(r) for r in results['runs'].values())} seeds)")
    fig.tight_layout()
    import io
    from PIL import Image
    png = io.BytesIO()
    fig.savefig(png, dpi=72)
    plt.close(fig)
    # a palette of 256 colours: a third of the bytes of matplotlib's RGBA, no visible difference
    Image.open(png).convert("RGB").quantize(256).save(path, optimize=True)


def speed(args, rounds):
    """Both methods' training cost per creature-step, measured side by side in one process (alternating
    one differentiable iteration and one PPO update, ``rounds`` times), so that the machine's load affects
    both alike. Both start from the policy of ``--speed``'s checkpoint (a trained gait, which costs more
    Newton iterations per step than standing still): the differentiable trainer with its pool, PPO with it
    as the mean of its Gaussian policy, restored before each of its rounds. Returns ``{method: [seconds per creature-step, ...]}`` (wall) and the
    same in process CPU time."""
    ckpt = load_checkpoint(args.speed)
    cfg = training.TrainConfig.recorded(dict(ckpt["config"], out_dir=args.out))
    if cfg.steer:
        raise SystemExit(f"--speed {args.speed}: a steered run (steer=True); PPO here walks along +x only")
    sim = make_creature(cfg.creature, getattr(torch, cfg.dtype))
    sim.solver_options["backward_rtol"] = cfg.backward_rtol
    policy = training.new_policy(cfg, sim)
    critic = training.Critic(policy.fc1.in_features, sim.body.num_muscles, cfg.critic_hidden)
    target_critic = training.Critic(policy.fc1.in_features, sim.body.num_muscles, cfg.critic_hidden)
    policy.load_state_dict(ckpt["policy"])
    critic.load_state_dict(ckpt["critic"])
    target_critic.load_state_dict(ckpt["target_critic"])
    optimizer = torch.optim.Adam(policy.parameters(), lr=cfg.lr_end)
    critic_optimizer = torch.optim.Adam(critic.parameters(), lr=cfg.critic_lr)
    x = ckpt["pool"]["x"]  # checkpoints written before randomize, terrain, steer lack scale, terrain, heading
    pool = training.Pool(**{"scale": torch.ones(x.shape[0], 3, dtype=x.dtype),
                            "terrain": torch.zeros(x.shape[0], 0, dtype=x.dtype),
                            "heading": torch.zeros(x.shape[0], dtype=x.dtype), **ckpt["pool"]})
    pcfg = ppo.PPOConfig(creature=cfg.creature, horizon=args.horizon, envs=args.ppo_envs, lr=args.ppo_lr,
                         epochs=args.ppo_epochs, minibatch=args.ppo_minibatch, entropy_coef=args.ppo_entropy,
                         clip_ratio=args.ppo_clip, mirror=cfg.mirror)
    task = LocomotionTask(sim, pcfg.horizon, pcfg.min_a, pcfg.max_abs_da)
    model = ppo.GaussianFramePolicy(task, pcfg)
    model.mean_policy.load_state_dict(ckpt["policy"])
    ppo_optimizer = torch.optim.Adam(model.parameters(), lr=pcfg.lr)
    # Every PPO round starts from the trained gait: after one update its observation normaliser (identity at the
    # start) z-scores the inputs, and the policy it collects with is no longer the gait (one update moved the
    # mean action by 0.56 of its range of 1).
    start = copy.deepcopy((model.state_dict(), ppo_optimizer.state_dict()))
    g = torch.Generator().manual_seed(0)
    out = {"differentiable": [], "ppo": [], "differentiable_cpu": [], "ppo_cpu": []}
    for r in range(rounds):
        model.load_state_dict(start[0])
        ppo_optimizer.load_state_dict(start[1])
        t, c = time.perf_counter(), time.process_time()
        training.train_iteration(cfg, sim, policy, critic, target_critic, optimizer, critic_optimizer, pool,
                                 ckpt["iteration"] + r)
        n = cfg.batch * cfg.window
        out["differentiable"].append((time.perf_counter() - t) / n)
        out["differentiable_cpu"].append((time.process_time() - c) / n)
        t, c = time.perf_counter(), time.process_time()
        ppo.learn(model, ppo_optimizer, ppo.collect(task, model, pcfg, g), pcfg, g)
        n = pcfg.envs * pcfg.horizon
        out["ppo"].append((time.perf_counter() - t) / n)
        out["ppo_cpu"].append((time.process_time() - c) / n)
    return out


# PPO's search: each entry changes the command line's PPO settings (the baseline) in one or two ways.
TUNING = [{}, {"lr": 1e-3}, {"minibatch": 1600}, {"entropy_coef": 0.01}, {"clip_ratio": 0.1},
          {"envs": 64, "minibatch": 960}]


# SB3's search: SB3's defaults (sb3_ppo.BASELINE), then one change at a time over the settings the issue names
# (learning rate, rollout length, minibatch, epochs, clip range, creatures, VecNormalize, network size) and the
# initial log std (SB3's 0 against diffsoft.ppo's -1.5: actions are clamped to +-0.3, so a std of 1 saturates).
SB3_TUNING = [{}, {"lr": 1e-3}, {"n_steps": 200}, {"batch_size": 400}, {"n_epochs": 5}, {"clip_range": 0.1},
              {"envs": 64}, {"normalize": True}, {"net": "ours"}, {"log_std_init": -1.5},
              # the second round: the first round's best (normalize) with the next best ones
              {"normalize": True, "n_epochs": 5}, {"normalize": True, "lr": 1e-3}, {"normalize": True, "net": "ours"},
              {"normalize": True, "n_epochs": 5, "lr": 1e-3}]


def tune_ppo(args, method="ppo"):
    """Every :data:`TUNING` (``method="sb3"``: :data:`SB3_TUNING`) variant not yet in ``--out``'s tuning.json
    (tuning_sb3.json; none with ``--report``) on seed 0 with ``--steps``; scored by the mean of the last three
    evaluations (the final one included), which is less noisy than the final one alone."""
    suffix, variants, run = ("", TUNING, run_ppo) if method == "ppo" else ("_sb3", SB3_TUNING, run_sb3)
    path = os.path.join(args.out, f"tuning{suffix}.json")
    runs = json.load(open(path)) if os.path.exists(path) else []
    done = [r["overrides"] for r in runs]
    for overrides in [] if args.report else variants:
        if overrides in done:
            continue
        r = summarize(run(args, 0, args.steps, **overrides))
        dists = [d for _, d in curve(r)]
        runs.append({"overrides": overrides, "score": sum(dists[-3:]) / 3, "final": dists[-1], "best": max(dists),
                     "source": _source(), **r})
        json.dump(runs, open(path, "w"), indent=1)
        print(runs[-1]["overrides"], f"score {runs[-1]['score']:.3f} final {runs[-1]['final']:.3f}", flush=True)
    md = tuning_table(runs, "PPO" if method == "ppo" else "SB3")
    with open(os.path.join(args.out, f"tuning{suffix}.md"), "w") as f:
        f.write(md + "\n")
    print(md)


def tuning_table(runs, label="PPO"):
    """The Markdown table of a PPO's settings search (``label``: PPO, diffsoft.ppo's, or SB3), best score first."""
    lines = ["Runs: " + "; ".join(dict.fromkeys(r["source"] for r in runs)) + ".", "",
             f"| {label} settings (changed from the baseline) | mean of the last 3 evaluations | final | best | "
             "wall time (s) |", "| --- | --- | --- | --- | --- |"]
    for r in sorted(runs, key=lambda r: -r["score"]):
        name = ", ".join(f"{k}={v}" for k, v in r["overrides"].items()) or "baseline"
        lines.append(f"| {name} | {r['score']:.3f} | {r['final']:.3f} | {r['best']:.3f} | {r['wall_seconds']:.0f} |")
    return "\n".join(lines)


def _source():
    """This command line and the commit it ran at, for the report's "Runs:" line."""
    return f"`benchmarks/sample_efficiency.py {shlex.join(sys.argv[1:])}` at {provenance.commit()}"


def _summary_of(results, path, creature):
    """A ``summary.json``'s content from a ``results.json`` or ``summary.json`` (of this script, or one written
    before summaries, which has ``args`` instead of ``creature`` and ``sources``)."""
    return {"creature": results.get("creature", results.get("args", {}).get("creature", creature)),
            "sources": results.get("sources", [f"the runs of {path}"] if results["runs"] else []),
            "runs": {m: {seed: summarize(r) for seed, r in rs.items()} for m, rs in results["runs"].items() if rs}}


def _load(path, empty):
    return json.load(open(path)) if os.path.exists(path) else empty


def _dump(data, path):
    with open(path, "w") as f:
        json.dump(data, f)


SIDE_BY_SIDE_OWN = ("--side-by-side", "--methods", "--seed", "--seeds", "--out", "--only", "--merge", "--report")
"""The options :func:`side_by_side` sets for each run itself (the rest of the command line passes on)."""


def _passed_on(argv):
    """``argv`` without the options of :data:`SIDE_BY_SIDE_OWN` and their values."""
    out, skip = [], False
    for token in argv:
        if token.startswith("--"):
            skip = token.split("=", 1)[0] in SIDE_BY_SIDE_OWN
        if not skip:
            out.append(token)
    return out


def side_by_side(args, seeds):
    """Trains every method of ``--methods`` on every seed, each run a process of its own (this script with
    ``--only M --seed S``, its files in ``--out``'s ``M_seedS/``), ``--side-by-side`` of them at a time: as one run
    ends the next starts, and once fewer runs are left than lanes, spinning fillers take the free lanes. So every
    run trains beside the same number of busy processes, whatever its method: the methods' wall-clock times are
    measured at one load, on one machine, with one thread count (``--threads``). Returns the runs'
    ``summary.json`` paths, in the order of ``--methods`` and seeds; raises naming a run that failed."""
    import subprocess
    argv = _passed_on(sys.argv[1:])
    queue = [(m, s) for m in args.methods for s in seeds]
    running, fillers, paths = [], [], []
    try:
        while queue or running:
            while queue and len(running) < args.side_by_side:
                method, seed = queue.pop(0)
                out = os.path.join(args.out, f"{method}_seed{seed}")
                os.makedirs(out, exist_ok=True)
                log = open(os.path.join(out, "log.txt"), "w")
                cmd = [sys.executable, os.path.abspath(__file__), *argv, "--only", method, "--seed", str(seed),
                       "--out", out]
                running.append((subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT), log, out))
                paths.append(os.path.join(out, "summary.json"))
            while len(running) + len(fillers) < args.side_by_side:
                fillers.append(subprocess.Popen([sys.executable, "-c", "while True: pass"]))
            time.sleep(1)
            for run in [r for r in running if r[0].poll() is not None]:
                running.remove(run)
                run[1].close()
                if run[0].returncode:
                    raise SystemExit(f"--side-by-side: the run in {run[2]} failed (exit {run[0].returncode}); its "
                                     f"output is {os.path.join(run[2], 'log.txt')}")
    finally:
        for proc in [r[0] for r in running] + fillers:
            proc.kill()
            proc.wait()
    return paths


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--creature", default="biped")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--seed", type=int, nargs="*", default=None, help="these seeds instead of 0..seeds-1")
    p.add_argument("--horizon", type=int, default=100, help="PPO's episode length and both evaluations' steps")
    p.add_argument("--steps", type=int, default=409_600, help="simulated creature-steps per seed and method")
    p.add_argument("--window", type=int, default=training.TrainConfig.window)
    p.add_argument("--batch", type=int, default=training.TrainConfig.batch)
    p.add_argument("--lr-decay-iterations", type=int, default=None,
                   help="the differentiable method's lr decay, in iterations (default: all of them)")
    p.add_argument("--eval-every", type=int, default=10, help="the differentiable method's, in iterations")
    p.add_argument("--diff-set", nargs="*", default=[], metavar="NAME=VALUE",
                   help="other TrainConfig fields of the differentiable method, e.g. terminate_upright=0")
    p.add_argument("--ppo-envs", type=int, default=32)
    p.add_argument("--ppo-lr", type=float, default=3e-4)
    p.add_argument("--ppo-epochs", type=int, default=10)
    p.add_argument("--ppo-minibatch", type=int, default=480)
    p.add_argument("--ppo-entropy", type=float, default=0.0)
    p.add_argument("--ppo-clip", type=float, default=0.2)
    p.add_argument("--ppo-eval-every", type=int, default=2)
    p.add_argument("--tune", action="store_true",
                   help="PPO's settings search instead (seed 0, --steps each): writes tuning.json and tuning.md")
    p.add_argument("--tune-sb3", action="store_true",
                   help="Stable-Baselines3's settings search (seed 0, --steps each): tuning_sb3.json and .md")
    p.add_argument("--sb3-set", nargs="*", default=[], metavar="NAME=VALUE",
                   help="settings of sb3_ppo.BASELINE for SB3 (e.g. normalize=1 log_std_init=-1.5)")
    p.add_argument("--only", choices=("differentiable", "ppo", "sb3"), default=None,
                   help="one method (default: differentiable and ppo; sb3 only when named)")
    p.add_argument("--side-by-side", type=int, default=None, metavar="LANES",
                   help="every method of --methods on every seed, each run a process of its own, LANES at a time "
                        "(spinning fillers keep LANES busy to the end), then the report of them all: the methods' "
                        "wall-clock at one load")
    p.add_argument("--methods", nargs="*", choices=("differentiable", "ppo", "sb3"),
                   default=["sb3", "differentiable", "ppo"], help="--side-by-side's methods, in the order they start")
    p.add_argument("--merge", nargs="*", default=[], metavar="JSON",
                   help="other runs' summary.json or results.json (e.g. the other method's, run separately), "
                        "added to --out's summary.json and its report")
    p.add_argument("--merge-method", choices=("differentiable", "ppo", "sb3"), default=None,
                   help="take only this method's runs from --merge's files (e.g. PPO's runs of an earlier report)")
    p.add_argument("--report", action="store_true", help="no training: the report of --out's (and --merge's) runs")
    p.add_argument("--device", default="cpu", help="both methods' torch device")
    p.add_argument("--speed", default=None, metavar="CHECKPOINT",
                   help="no training: both methods' cost per creature-step side by side, from a training checkpoint")
    p.add_argument("--speed-rounds", type=int, default=20,
                   help="--speed's rounds (one differentiable iteration and one PPO update each)")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--out", default="runs/sample_efficiency",
                   help="the folder of results.json (full histories), summary.json, results.md and the plot")
    args = p.parse_args()
    if args.threads:
        set_num_threads(args.threads)
    os.makedirs(args.out, exist_ok=True)
    if args.tune or args.tune_sb3:
        return tune_ppo(args, "ppo" if args.tune else "sb3")
    if args.speed:
        out = speed(args, args.speed_rounds)
        medians = {k: _median(v) for k, v in out.items()}
        json.dump({"source": _source(), "medians": medians, **out}, open(os.path.join(args.out, "speed.json"), "w"),
                  indent=1)
        for k, v in out.items():
            print(f"{k}: median {medians[k] * 1e6:.0f} us per creature-step ({len(v)} rounds)")
        for kind in ("", "_cpu"):
            print(f"a differentiable creature-step costs {medians['differentiable' + kind] / medians['ppo' + kind]:.2f}"
                  f" x a PPO one ({'process CPU time' if kind else 'wall-clock'}, medians)")
        return
    full_path, summary_path = os.path.join(args.out, "results.json"), os.path.join(args.out, "summary.json")
    full = _load(full_path, {"runs": {}})
    summary = _load(summary_path, None) or _summary_of(full, full_path, args.creature)
    seeds = [] if args.report else args.seed if args.seed is not None else range(args.seeds)
    if args.side_by_side is not None and seeds:
        if args.side_by_side < 1 or args.only:
            p.error("--side-by-side takes a positive number of lanes, and its methods from --methods, not --only")
        args.merge += side_by_side(args, list(seeds))
        # this command's runs alone (not --out's earlier ones), and its command line (each run's is this one's with a
        # method and a seed)
        seeds, summary = [], {"creature": args.creature, "sources": [_source()], "runs": {}}
    if seeds:
        for record in (full, summary):
            record.setdefault("sources", []).append(_source())
    for seed in seeds:
        for method, run in (("differentiable", run_differentiable), ("ppo", run_ppo), ("sb3", run_sb3)):
            if args.only == method or (args.only is None and method != "sb3"):
                r = run(args, seed) if method == "differentiable" else run(args, seed, args.steps)
                full["runs"].setdefault(method, {})[str(seed)] = r
                summary["runs"].setdefault(method, {})[str(seed)] = summarize(r)
                _dump(full, full_path)
                _dump(summary, summary_path)
    for other in args.merge:
        merged = _summary_of(json.load(open(other)), other, args.creature)
        if args.side_by_side is None:
            summary["sources"] += [source for source in merged["sources"] if source not in summary["sources"]]
        for method, runs in merged["runs"].items():
            if args.merge_method in (None, method):
                summary["runs"].setdefault(method, {}).update(runs)
    summary["runs"] = {m: r for m, r in summary["runs"].items() if r}
    if args.merge:
        _dump(summary, summary_path)
    md = table(summary)
    with open(os.path.join(args.out, "results.md"), "w") as f:
        f.write(md + "\n")
    plot(summary, os.path.join(args.out, "sample_efficiency.png"))
    print(md)

if __name__ == "__main__":
    main()

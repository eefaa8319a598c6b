"""The training command line: ``python -m diffsoft.cli --help`` (also ``examples/locomotion.py``).

Trains a policy (:func:`diffsoft.training.train`), then prints the distance it walks before and after
training and writes its learning curve (``learning_curve.png``) and a GIF of it walking (``walk.gif``) next
to the run's checkpoint.
"""
import argparse
import dataclasses
import inspect
import math
import os
import re
import sys
import time
import warnings

import torch

from ._checks import setting_kind
from ._optional import require
from .creatures import make_creature
from .policy import KEEPS_WALKING, STAYS_UP, distance_walked, distances_along, gait, run_policy
from .terrain import distances_on, held_out_heights, ramp_distances
from .threads import set_num_threads
from .training import TrainConfig, distributed_world, for_creature, new_policy, train


def plot_learning_curve(history, path, title=None, steered=False):
    """A PNG of the training batch's distance (and the deterministic evaluation's) against simulated
    creature-steps: along +x, or with ``steered`` along each creature's commanded heading (the evaluation's:
    the mean over :data:`~diffsoft.training.EVAL_HEADINGS`)."""
    matplotlib = require("matplotlib", "train")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot([r["sim_steps"] for r in history], [r["distance"] for r in history], label="training batch (mean)")
    ev = [r for r in history if "eval_distance" in r]
    if ev:
        ax.plot([r["eval_sim_steps"] for r in ev], [r["eval_distance"] for r in ev], "o-",
                label="deterministic, from rest")
    ax.set_xlabel("simulated creature-steps")
    ax.set_ylabel("distance along the commanded heading" if steered else "distance along +x")
    ax.set_title(title or "learning curve")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def render_policy(sim, policy, steps, path, every=2):
    """A GIF of one creature running ``policy`` from rest for ``steps`` steps, the camera following it."""
    from .render import render_rollout
    render_rollout(sim, *run_policy(sim, policy, steps), gif=path, every=every, camera="follow")


STEER_HEADINGS = {2: (0, 180), 3: (-80, -60, -30, -10, 10, 30, 60, 80)}
"""The headings (degrees) a steered policy is shown walking toward after training: in 2D both, in 3D some
that training draws no more often than any other, and that its evaluations (``training.EVAL_HEADINGS``) do not
use."""

QUICK = dict(iterations=120, lr_decay_iterations=120, eval_every=5)
"""``--quick``: 120 iterations (the default is 300), 13-36 s of training for the biped on the 2-core machines
measured, evaluated every 5 (a 100-step rollout of one creature, about 1% of an iteration's cost), so that
``keep_best`` has more policies to choose from: a short run can end on a dip (docs/training.md, "The result:
keep_best")."""


def field_help(cls):
    """``{field: its description}`` from the ``Attributes:`` section of ``cls``'s docstring (Google style: a
    line ``name: text`` per field, continued on more deeply indented lines), the one place fields are
    described; a KeyError names a field without a description."""
    lines = inspect.getdoc(cls).split("Attributes:\n", 1)[1].splitlines()
    out, name = {}, None
    for line in lines:
        entry = re.match(r"    (\w+): (.*)", line)
        if entry:
            name = entry.group(1)
            out[name] = entry.group(2)
        elif line.startswith("        ") and name:
            out[name] += " " + line.strip()
        else:
            break
    return {f.name: out[f.name] for f in dataclasses.fields(cls)}


def _boolean(text):
    if text.lower() not in ("true", "false", "1", "0", "yes", "no"):
        raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")
    return text.lower() in ("true", "1", "yes")


def _with_passive_openmp():
    """Re-executes this process's own command line with ``OMP_WAIT_POLICY=PASSIVE`` unless the environment sets
    the variable: libgomp, which torch loads on import (before this module runs), reads it once, and without it
    idle OpenMP threads spin for a while after each parallel region, taking a shared core from the thread with
    work (``diffsoft-train --threads 2`` took 10x as long as ``examples/locomotion.py``, which sets it before
    importing torch; docs/training.md, "Threads")."""
    if "OMP_WAIT_POLICY" in os.environ:
        return
    started = os.path.basename(sys.argv[0]) if sys.argv else ""
    if started != "diffsoft-train" and os.path.abspath(sys.argv[0] if sys.argv else "") != os.path.abspath(__file__):
        # called from the user's own script, a notebook or stdin: re-executing would run (or lose) the caller's
        # own work again
        warnings.warn("OMP_WAIT_POLICY is not set: idle OpenMP threads spin and can slow training several times over "
                      "on a shared machine; set OMP_WAIT_POLICY=PASSIVE in the environment before Python starts "
                      "(docs/training.md, 'Threads')", RuntimeWarning, stacklevel=3)
        return
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    # sys.orig_argv (Python >= 3.10): the interpreter's options and the script or -m module as started
    args = sys.orig_argv[1:] if hasattr(sys, "orig_argv") else ["-m", "diffsoft.cli", *sys.argv[1:]]
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, *args])


def _run_name(creature):
    """A run's folder name under ``runs/`` for ``--creature``: a name as it is (``biped``); a file as its folder
    and its name (``examples/data/algovivo/biped/mesh.json``: ``biped_mesh``), so that files of one name in
    other folders, or a file named like a built-in creature, do not share a run's folder."""
    stem = os.path.splitext(os.path.basename(creature))[0]
    if not creature.endswith(".json") and os.sep not in creature:
        return stem
    folder = os.path.basename(os.path.dirname(os.path.abspath(creature)))
    return f"{folder}_{stem}" if folder else stem


def _counting_short_steps(fn, *args, **kwargs):
    """``(fn(*args, **kwargs), n)``: n counts the steps of its rollouts that stopped short of Newton's tolerance
    (their warnings, reported once in a total instead of one per step); its other warnings pass on."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = fn(*args, **kwargs)
    short = sum("did not converge" in str(w.message) for w in caught)
    for w in caught:
        if "did not converge" not in str(w.message):
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return out, short


def main(argv=None):
    """Command line: ``python -m diffsoft.cli --help`` (also ``diffsoft-train`` and ``examples/locomotion.py``).
    Without ``argv`` (the process's own command line) and without ``OMP_WAIT_POLICY`` in the environment, it
    first re-executes that command line with ``OMP_WAIT_POLICY=PASSIVE`` (see :func:`_with_passive_openmp`)."""
    if argv is None:
        _with_passive_openmp()
    p = argparse.ArgumentParser(description="Train a neural locomotion controller by backpropagation through "
                                            "the implicit simulator.")
    defaults, descriptions = TrainConfig(), field_help(TrainConfig)
    for f in dataclasses.fields(TrainConfig):
        value = getattr(defaults, f.name)
        kind = setting_kind(TrainConfig, f.name)
        default = ("default: the creature's" if value is None else f"default {value!r}") + (
            f", {QUICK[f.name]!r} with --quick" if f.name in QUICK else "")
        text = re.sub(r":\w+:`~?([\w.]+)`", r"\1", descriptions[f.name]).replace("``", "")  # Sphinx roles, literals
        p.add_argument("--" + f.name.replace("_", "-"), type=_boolean if kind is bool else kind, default=None,
                       help=f"{text} ({default})".replace("%", "%%"))
    p.add_argument("--quick", action="store_true", help="a short run: " + ", ".join(f"{k}={v}" for k, v in QUICK.items()))
    p.add_argument("--resume", action="store_true", help="continue from out_dir/checkpoint.pt if it exists")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--threads", type=int, default=None, help="CPU threads per process, for torch and OpenBLAS")
    args = p.parse_args(argv)
    if args.threads is not None and args.threads < 1:
        p.error(f"--threads must be a positive integer, got {args.threads}")
    values = dict(QUICK) if args.quick else {}
    if args.creature is not None and args.out_dir is None:
        values["out_dir"] = os.path.join("runs", _run_name(args.creature))
    values.update({f.name: getattr(args, f.name) for f in dataclasses.fields(TrainConfig)
                   if getattr(args, f.name) is not None})
    cfg = TrainConfig(**values)
    try:
        cfg.check()  # every flag, before anything is built
        if not cfg.out_dir:
            raise ValueError("--out-dir must name a directory, got ''")
    except ValueError as e:
        p.error(str(e))
    try:
        if args.threads:
            set_num_threads(args.threads)
        rank, _ = distributed_world()
    except ValueError as e:
        p.exit(1, f"{p.prog}: error: {e}\n")
    t0 = time.perf_counter()
    try:
        # A user's mistakes found once things are built (a creature file, a checkpoint that does not fit, an
        # out_dir that is a file) are ValueErrors and OSErrors that name it: one line, as the flags' own.
        sim = make_creature(cfg.creature, getattr(torch, cfg.dtype), cfg.device)
        cfg = for_creature(cfg, sim)  # as the run records it (once: a setting without effect warns here)
        eval_horizon = cfg.eval_horizon
        policy, history = train(cfg, resume=args.resume, progress=not args.no_progress)
    except (ValueError, OSError) as e:
        p.exit(1, f"{p.prog}: error: {e}\n")
    if rank != 0:
        return
    torch.manual_seed(cfg.seed)
    initial = new_policy(cfg, sim)
    before = distance_walked(sim, initial, eval_horizon)
    after = distance_walked(sim, policy, eval_horizon)
    plot_learning_curve(history, os.path.join(cfg.out_dir, "learning_curve.png"),
                        f"{cfg.creature}: batch {cfg.batch}, window {cfg.window}, episode {cfg.episode}", cfg.steer)
    render_policy(sim, policy, max(eval_horizon, 100), os.path.join(cfg.out_dir, "walk.gif"))
    g, short = _counting_short_steps(gait, sim, policy)
    steps = history[-1]["sim_steps"] if history else 0
    print(f"distance walked along +x in {eval_horizon} steps ({eval_horizon * sim.dt:.2f} s): "
          f"before training {before:.3f}, after training {after:.3f}")
    n = len(g.distance) - 1
    print(f"after training, in 100 / 300 / {n} steps: {g.distance[100]:.2f} / {g.distance[300]:.2f} / "
          f"{g.distance[n]:.2f}; the last {g.window} steps cover {g.last / g.first if g.first > 0 else 0:.2f} of the "
          f"first {g.window} (a lasting gait: >= {KEEPS_WALKING}); least height {g.least_height:.2f} of rest "
          f"(>= {STAYS_UP}): {'lasts' if g.lasts else 'does not last'}" +
          (f" ({short} of its {n} steps stopped short of Newton's tolerance)" if short else ""))
    if cfg.steer:
        headings = STEER_HEADINGS[sim.body.dim]
        (along, off), short = _counting_short_steps(distances_along, sim, policy, eval_horizon,
                                                    [math.radians(h) for h in headings])
        print(f"steered, in {eval_horizon} steps toward each commanded heading: " + ", ".join(
            f"{h:g} degrees: {d:.2f} along it, {o:.0f} degrees off" for h, d, o in zip(headings, along, off)))
        gaits = [_counting_short_steps(gait, sim, policy, heading=math.radians(h)) for h in headings]
        lasting = [h for h, (g, _) in zip(headings, gaits) if g.lasts]
        short += sum(n for _, n in gaits)
        print(f"its gait lasts 1,000 steps toward {len(lasting)} of the {len(headings)} headings"
              + (f" ({', '.join(f'{h:g}' for h in lasting)} degrees)" if lasting else "")
              + (f"; {short} batched steps of these rollouts stopped short of Newton's tolerance" if short else ""))
    if cfg.terrain:
        walked, short = _counting_short_steps(distances_on, sim, policy, held_out_heights(sim, cfg.terrain),
                                              eval_horizon)
        (up, down), on_ramps = _counting_short_steps(ramp_distances, sim, policy, cfg.terrain, eval_horizon)
        short += on_ramps
        print(f"on {len(walked)} held-out terrains (diffsoft.terrain.held_out_heights, slopes within "
              f"{cfg.terrain:g} degrees), in {eval_horizon} steps: mean {walked.mean():.2f}, least {walked.min():.2f}; "
              f"up a {cfg.terrain:g}-degree ramp {up:.2f}, down it {down:.2f}"
              + (f"; {short} batched steps of these rollouts stopped short of Newton's tolerance (a height "
                 f"field's kinks: docs/training.md, \"Terrain\")" if short else ""))
    print(f"{len(history)} iterations, {steps} simulated creature-steps, training {history[-1]['seconds'] if history else 0:.0f} s, "
          f"total {time.perf_counter() - t0:.0f} s; outputs in {cfg.out_dir}/ (checkpoint.pt, policy.json, "
          f"history.json, learning_curve.png, walk.gif)")


if __name__ == "__main__":
    sys.exit(main())

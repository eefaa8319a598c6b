"""Where a differentiable training iteration's time goes (diffsoft.training), by part, for one or more settings
measured side by side in one process.

    .venv/bin/python benchmarks/iteration_profile.py --threads 1                       # the eighth run's batch 4 and the default 32
    .venv/bin/python benchmarks/iteration_profile.py --setting batch=8 --setting batch=4 critic_iterations=8

Each setting trains from scratch (``diffsoft.training.train``, its files in a temporary folder); the settings
take turns, ``--chunk`` iterations at a time (each resumed from its checkpoint), so that the machine's load
falls on all of them alike. The first ``--skip`` iterations of each (creatures starting from rest, the
symbolic analyses) are left out. Every part is timed exclusively (a part's time excludes the parts called
inside it; the critic's fit and the evaluations include everything they call) by wrapping the functions the
trainer calls, and the simulator's C++ Newton loop and adjoint solve by diffsoft's phase timers:

- ``step forward: C++ Newton`` / ``Python`` : ``Simulator.step`` (the C++ solve / the rest of the call);
- ``step backward: C++ adjoint`` / ``rest of the actor's backward``: the actor loss's ``backward`` (the
  adjoint solves in C++ / the policy's and the step's autograd around them);
- ``policy``: ``FramePolicy.head`` (or ``.forward``, its observation included, where the trainer calls it)
  and ``.update``;
- ``observation``, ``reward``: ``observe`` where the trainer calls it, the centre of mass and the uprightness;
- ``critic fit``, ``critic targets``: ``fit_critic`` (16 passes x 4 minibatches by default) and the target
  critic's values with the TD(lambda) targets;
- ``actor update``: gradient clipping and Adam;
- ``resets and draws``; ``evaluation``: ``distance_walked`` every ``eval_every`` iterations;
- ``rest of the window``: the rest of ``train_iteration`` (the rollout loop's own tensor work: the saturation
  penalty, returns, terminations, stacking).

Prints, per setting, each part's share of the measured time and its microseconds per creature-step, and the
whole's wall-clock and process CPU time per creature-step (on a loaded machine the CPU time varies less).
"""
import argparse
import contextlib
import dataclasses
import os
import tempfile
import time

# Idle OpenMP threads sleep instead of spinning: read once, when torch loads OpenMP (benchmarks/README.md,
# "Threads under load").
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch

from diffsoft import _C, policy as policy_module, training
from diffsoft.simulator import Simulator
from diffsoft.threads import set_num_threads
from sample_efficiency import diff_settings

EIGHTH_RUN = ("batch=4", "episode=128", "terminate_upright=0", "action_noise=0.4", "action_noise_end=0.1",
            "noise_decay_iterations=250", "lr_decay_iterations=600", "eval_every=25")
"""The sample-efficiency benchmark's eighth run (batch 4; benchmarks/README.md's ``$E7 --diff-set $D8``) as
TrainConfig fields."""
DEFAULT = ("batch=32",)

PARTS = ("step forward: C++ Newton", "step forward: Python", "step backward: C++ adjoint",
         "rest of the actor's backward", "policy", "observation", "reward", "critic fit", "critic targets",
         "actor update", "resets and draws", "evaluation", "rest of the window")


class Clock:
    """Exclusive wall-clock time per part: a wrapped call's time, less that of the wrapped calls inside it;
    inside an ``opaque`` part nothing else is counted."""

    def __init__(self):
        self.seconds = dict.fromkeys(PARTS + ("iteration",), 0.0)
        self.cpu_seconds = 0.0  # the process's CPU time in the outermost parts: less sensitive to the load
        self.counting = True
        self._stack = []  # [part, seconds of wrapped calls inside it]

    @contextlib.contextmanager
    def part(self, name, opaque=False):
        if self._stack and self._stack[-1][0] is None:  # inside an opaque part
            yield
            return
        self._stack.append([None if opaque else name, 0.0])
        start, cpu = time.perf_counter(), time.process_time()
        try:
            yield
        finally:
            spent = time.perf_counter() - start
            inner = self._stack.pop()[1]
            if self._stack:
                self._stack[-1][1] += spent
            elif self.counting:
                self.cpu_seconds += time.process_time() - cpu
            if self.counting:
                self.seconds[name] += spent - inner


@contextlib.contextmanager
def instrumented(clock):
    """The trainer's functions wrapped to charge their time to ``clock`` (restored on exit)."""
    patches = [(Simulator, "step", "step forward: Python", False),
               (policy_module.FramePolicy, "forward", "policy", False),
               (policy_module.FramePolicy, "head", "policy", False),
               (policy_module.FramePolicy, "update", "policy", False),
               (training, "observe", "observation", False),
               (training, "center_of_mass_x", "reward", False),
               (training, "uprightness", "reward", False),
               (training, "fit_critic", "critic fit", True),
               (training, "td_lambda_targets", "critic targets", False),
               (training.Critic, "forward", "critic targets", False),
               (torch.nn.utils, "clip_grad_norm_", "actor update", False),
               (torch.optim.Adam, "step", "actor update", False),
               (training, "_iteration_draws", "resets and draws", False),
               (training, "_reset", "resets and draws", False),
               (training, "distance_walked", "evaluation", True),
               (training, "train_iteration", "iteration", False),
               (torch.autograd, "backward", "rest of the actor's backward", False)]
    patches = [p for p in patches if hasattr(p[0], p[1])]  # (code before FramePolicy.head: profiles of old commits)
    saved = [(owner, name, getattr(owner, name)) for owner, name, _, _ in patches]

    def timed(fn, part, opaque):
        def call(*args, **kwargs):
            with clock.part(part, opaque):
                return fn(*args, **kwargs)
        return call

    for owner, name, part, opaque in patches:
        setattr(owner, name, timed(getattr(owner, name), part, opaque))
    try:
        yield
    finally:
        for owner, name, fn in saved:
            setattr(owner, name, fn)


def profile(settings, iterations, skip, chunk, threads):
    """``{setting: (Clock, C++ phase times, creature-steps measured)}`` for each setting (a tuple of
    ``NAME=VALUE``), trained side by side ``chunk`` iterations at a time."""
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        cfgs = {}
        for k, s in enumerate(settings):
            fields = dict(checkpoint_every=10 ** 9, keep_best=False, out_dir=os.path.join(tmp, str(k)))  # (no result)
            fields.update(diff_settings(s))
            cfgs[s] = training.TrainConfig(**fields)
            out[s] = [Clock(), {}, 0]
        done = 0
        while done < skip + iterations:
            step = min(chunk, skip + iterations - done)
            for s, cfg in cfgs.items():
                clock, cpp, _ = out[s]
                clock.counting = done >= skip
                _C._phase_timers(True)
                with instrumented(clock):
                    training.train(dataclasses.replace(cfg, iterations=done + step), resume=done > 0,
                                   progress=False, log=lambda *a: None)
                for name, (t, calls) in _C._phase_times().items():
                    if clock.counting:
                        old = cpp.get(name, (0.0, 0))
                        cpp[name] = (old[0] + t, old[1] + calls)
                _C._phase_timers(False)
                if clock.counting:
                    out[s][2] += step * cfg.batch * cfg.window
            done += step
    return {s: tuple(v) for s, v in out.items()}


def report(clock, cpp, steps):
    """The table of one setting: each part's share of the measured time and microseconds per creature-step."""
    t = dict(clock.seconds)
    newton, adjoint = cpp["newton"][0], cpp["adjoint"][0]
    t["step forward: C++ Newton"] = newton
    t["step forward: Python"] -= newton
    t["step backward: C++ adjoint"] = adjoint
    t["rest of the actor's backward"] -= adjoint
    t["rest of the window"] = t.pop("iteration")
    total = sum(t.values())
    lines = ["| part | share | us per creature-step |", "| --- | ---: | ---: |"]
    lines += [f"| {p} | {t[p] / total:.1%} | {1e6 * t[p] / steps:.0f} |" for p in PARTS]
    lines.append(f"| total | 100% | {1e6 * total / steps:.0f} |")
    return "\n".join(lines), total


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--setting", nargs="+", action="append", metavar="NAME=VALUE",
                   help="TrainConfig fields of one setting (repeat for several; default: the eighth run's and "
                        "batch 32's)")
    p.add_argument("--iterations", type=int, default=40, help="measured iterations per setting")
    p.add_argument("--skip", type=int, default=20, help="iterations trained before measuring")
    p.add_argument("--chunk", type=int, default=10, help="iterations per turn")
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args()
    if args.threads:
        set_num_threads(args.threads)
    settings = [tuple(s) for s in args.setting] if args.setting else [EIGHTH_RUN, DEFAULT]
    results = profile(settings, args.iterations, args.skip, args.chunk, args.threads)
    for s, (clock, cpp, steps) in results.items():
        text, total = report(clock, cpp, steps)
        newton_calls = cpp["newton"][1]
        print(f"\n{' '.join(s)}: {steps:,} creature-steps in {total:.1f} s "
              f"({1e6 * total / steps:.0f} us per creature-step; CPU time {1e6 * clock.cpu_seconds / steps:.0f} us); "
              f"{newton_calls} C++ Newton solves")
        print(text)


if __name__ == "__main__":
    main()

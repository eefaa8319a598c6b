"""What ``torch.compile`` of the policy and the critic buys the trainer (torch 2.x), side by side in one run.

The trainer's networks are small MLPs (the frame policy, 32 hidden units; the critic, two layers of 64) called
on a few creatures at a time, so their cost per call is mostly the framework's overhead, which compilation
targets. This times, alternating eager and compiled (after warm-up, compile time reported apart):

- the actor's network work in one window: ``window`` policy calls on ``(batch, N, d)`` states, then the
  backward of their sum (the simulator's steps left out: they run eagerly either way);
- one critic fit: ``fit_critic`` at the trainer's shapes (``batch * window`` samples, ``critic_iterations``
  passes of ``critic_minibatches`` Adam steps).

Usage: ``.venv-pip/bin/python benchmarks/compile_speed.py [--creature biped] [--batch 4 32] [--repeats 5]``.
"""
import argparse
import copy
import os
import time

# Idle OpenMP threads sleep instead of spinning: read once, when torch loads OpenMP (benchmarks/README.md,
# "Threads under load").
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

from diffsoft import training
from diffsoft.creatures import make_creature
from diffsoft.policy import FramePolicy, observe
from diffsoft.threads import set_num_threads


def _time(fn, repeats):
    """The median of ``repeats`` timed calls, in seconds."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def _actor_window(policy, xs, vs):
    def run():
        policy.zero_grad()
        total = sum(policy(x, v).square().sum() for x, v in zip(xs, vs))
        total.backward()
    return run


def _critic_fit(cfg, critic, obs, a, targets):
    target_critic = copy.deepcopy(critic)
    optimizer = torch.optim.Adam(critic.parameters(), lr=cfg.critic_lr)
    valid = torch.ones(targets.shape[0], dtype=torch.bool)
    gen = torch.Generator().manual_seed(0)
    return lambda: training.fit_critic(cfg, critic, target_critic, optimizer, obs, a, targets, valid, gen)


def measure(creature, batch, repeats):
    cfg = training.TrainConfig(creature=creature, batch=batch)
    sim = make_creature(creature)
    torch.manual_seed(0)
    policy = FramePolicy.for_simulator(sim)
    x, v = sim.rest_state
    xs = [x + 0.01 * torch.randn(batch, *x.shape) for _ in range(cfg.window)]
    vs = [0.1 * torch.randn(batch, *v.shape) for _ in range(cfg.window)]
    obs = torch.cat([observe(x, v, policy.center_vertex_id, policy.forward_vertex_id) for x, v in zip(xs, vs)])
    a = torch.rand(obs.shape[0], sim.body.num_muscles)
    critic = training.Critic(obs.shape[1], sim.body.num_muscles, cfg.critic_hidden)
    targets = torch.randn(obs.shape[0])
    row = {"creature": creature, "batch": batch}
    for name, make in (("actor window", lambda p, c: _actor_window(p, xs, vs)),
                       ("critic fit", lambda p, c: _critic_fit(cfg, c, obs, a, targets))):
        eager = make(policy, critic)
        torch._dynamo.reset()
        start = time.perf_counter()
        compiled = make(torch.compile(policy), torch.compile(critic))
        compiled()  # compiles (and recompiles for the critic's last, smaller minibatch)
        compiled()
        row[f"{name}: compile s"] = time.perf_counter() - start
        eager()
        times = {"eager": [], "compiled": []}
        for _ in range(repeats):  # alternating, so that the machine's load falls on both alike
            times["eager"].append(_time(eager, 1))
            times["compiled"].append(_time(compiled, 1))
        e, c = (sorted(t)[len(t) // 2] for t in times.values())
        row[f"{name}: eager ms"], row[f"{name}: compiled ms"] = 1e3 * e, 1e3 * c
    return row


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--creature", default="biped")
    parser.add_argument("--batch", type=int, nargs="+", default=[4, 32])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    if not hasattr(torch, "compile"):
        raise SystemExit("torch.compile needs torch 2.x; run this with .venv-pip/bin/python")
    set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} thread(s), median of {args.repeats} alternating repeats")
    print("| creature | batch | work | eager ms | compiled ms | compiled / eager | compile s |")
    print("| --- | ---: | --- | ---: | ---: | ---: | ---: |")
    for batch in args.batch:
        row = measure(args.creature, batch, args.repeats)
        for work in ("actor window", "critic fit"):
            e, c = row[f"{work}: eager ms"], row[f"{work}: compiled ms"]
            print(f"| {args.creature} | {batch} | {work} | {e:.1f} | {c:.1f} | {c / e:.2f} | "
                  f"{row[f'{work}: compile s']:.1f} |")


if __name__ == "__main__":
    main()

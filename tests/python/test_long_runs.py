"""Long runs, CI-sized (benchmarks/long_runs.py runs the 10,000-step and 1,000-step versions): a rollout's graph
keeps a fixed number of states per step, never the Newton iterations' graphs; memory with backward grows
linearly in the number of steps and is released afterwards; repeated rollouts do not grow memory at all.

Two measures: the tensors the autograd graph keeps alive (saved-tensor hooks, exact, in bytes), and the
process's resident memory (VmRSS after ``gc.collect()`` and ``malloc_trim``, coarse: the bounds below leave
megabytes of allocator slack, far below what a leaked graph per step would cost).
"""
import gc
import warnings
import weakref

import pytest
import torch

from diffsoft import creatures

from memory_probe import resident_bytes


def rss_bytes():
    """Resident memory after a garbage collection and returning free heap pages to the system."""
    rss = resident_bytes()
    if rss is None:
        pytest.skip("no VmRSS in /proc/self/status")
    return rss


def _storage_key(t):
    return t.untyped_storage().data_ptr() if hasattr(t, "untyped_storage") else t.storage().data_ptr()


def graph_bytes(fn):
    """``(fn(), bytes)``: the bytes of distinct storages that the autograd graph built by ``fn`` keeps alive
    (every tensor saved for backward, in Python or in C++, passes the saved-tensor hooks; those freed during
    the forward, such as Newton's inner graphs, are not counted)."""
    saved = []

    def pack(t):
        saved.append(weakref.ref(t))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    gc.collect()
    alive = {}
    for ref in saved:
        t = ref()
        if t is not None:
            alive[_storage_key(t)] = t.numel() * t.element_size()
    return out, sum(alive.values())


def walking_rollout(sim, steps, seed=0, **solver):
    """``steps`` steps of a periodic gait with activations that require grad; returns ``(xs, activations)``."""
    sim.solver_options.update(solver)
    m = sim.body.num_muscles
    t = torch.arange(steps, dtype=sim.body.dtype)[:, None]
    phase = torch.arange(m, dtype=sim.body.dtype) + seed
    acts = (0.75 + 0.2 * torch.sin(0.4 * t + phase)).requires_grad_()
    x, v = sim.rest_state
    xs, _ = sim.rollout(x, v, acts)
    return xs, acts


def test_graph_keeps_a_fixed_number_of_states_per_step_whatever_newton_does():
    sim = creatures.quadruped(dtype=torch.float64)
    state = sim.body.num_vertices * sim.body.dim * 8
    _, short = graph_bytes(lambda: walking_rollout(sim, 10))
    _, long = graph_bytes(lambda: walking_rollout(sim, 30))
    per_step = (long - short) / 20
    # Each step keeps its inertial prediction and its solution (and views of the inputs): ~2 states.
    assert 0 < per_step <= 4 * state, f"{per_step / state:.1f} states per step"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a tolerance near round-off may not be met everywhere
        _, tight = graph_bytes(lambda: walking_rollout(sim, 10, rtol=1e-11, atol=1e-11))
    assert tight == short, "the graph's size depends on the number of Newton iterations"


def test_rollout_memory_with_backward_is_linear_in_steps_and_released():
    sim = creatures.quadruped(dtype=torch.float32)
    walking_rollout(sim, 5)[0].sum().backward()  # warm up allocator and caches
    held = {}
    for steps in (30, 90):
        base = rss_bytes()
        xs, acts = walking_rollout(sim, steps)
        held[steps] = rss_bytes() - base
        xs[-1, :, 0].sum().backward()
        assert torch.isfinite(acts.grad).all()
        del xs, acts
        assert rss_bytes() - base < 4 << 20, "memory not released after backward"
    # 60 more steps: the stored states and graph nodes (a few kB per step), plus allocator slack; a graph
    # leaked per Newton iteration would cost tens of MB here.
    assert held[90] - held[30] < 8 << 20, f"{(held[90] - held[30]) / 60 / 1024:.0f} kB per step"


def test_repeated_rollouts_with_backward_do_not_grow_memory():
    sim = creatures.quadruped(dtype=torch.float32)
    sizes, objects = [], []
    for i in range(7):
        xs, acts = walking_rollout(sim, 15, seed=i)
        (xs[-1, :, 0].sum() + (xs[:, :, 1] ** 2).mean()).backward()
        del xs, acts
        sizes.append(rss_bytes())
        objects.append(len(gc.get_objects()))
    assert sizes[-1] - sizes[2] < 2 << 20, [s >> 10 for s in sizes]
    assert objects[-1] - objects[2] < 500, objects


def test_steps_without_grad_keep_no_graph():
    sim = creatures.quadruped(dtype=torch.float32)
    x, v = sim.rest_state
    (x1, v1), kept = graph_bytes(lambda: sim.step(x, v))
    assert x1.grad_fn is None and v1.grad_fn is None and kept == 0
    a = torch.full((sim.body.num_muscles,), 0.8, requires_grad=True)
    with torch.no_grad():
        x1, _ = sim.step(x, v, a)
    assert x1.grad_fn is None

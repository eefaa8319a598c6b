"""Several Python threads, each stepping its own Simulator (forward and backward), give the same results as one
thread, without deadlock: the C++ solver releases the GIL and re-acquires it for every energy call, in the
forward (caller's thread) and in the backward (autograd engine), on success and on failure paths.

Every join has a timeout and the threads are daemons, so a deadlock fails the test instead of hanging it.
"""
import threading
import warnings

import pytest
import torch

import diffsoft
from diffsoft import creatures
from diffsoft.body import SoftBody
from diffsoft.mesh import box
from diffsoft.simulator import Simulator

F64 = torch.float64
JOIN_TIMEOUT = 240.0


def quadruped_run(seed, steps=8):
    """A rollout of the quadruped with seeded activations and its gradient w.r.t. them."""
    sim = creatures.quadruped(dtype=F64)
    x, v = sim.rest_state
    g = torch.Generator().manual_seed(seed)
    acts = (0.7 + 0.3 * torch.rand(steps, sim.body.num_muscles, generator=g, dtype=F64)).requires_grad_()
    xs, _ = sim.rollout(x, v, acts)
    xs[-1, :, 0].sum().backward()
    return xs.detach(), acts.grad


def tetrapod_run(seed, steps=3):
    """A 3D neo-Hookean body with a batch of two creatures and gradients w.r.t. the Lame parameter mu."""
    sim = creatures.tetrapod(dtype=F64)
    sim.body.mu.requires_grad_()
    x, v = sim.rest_state
    g = torch.Generator().manual_seed(seed)
    x, v = x.expand(2, -1, -1).clone(), v.expand(2, -1, -1).clone()
    v[..., 1] -= 1.0 + torch.rand(2, 1, generator=g, dtype=F64)
    xs, _ = sim.rollout(x, v, steps=steps)
    (xs[-1, ..., 1] ** 2).sum().backward()
    return xs.detach(), sim.body.mu.grad


def run_in_threads(fn, seeds):
    """``fn(seed)`` for every seed, each in its own thread, all started together; returns the results in
    order, re-raising the first exception; fails on a thread that does not finish (a deadlock)."""
    results, errors = [None] * len(seeds), [None] * len(seeds)
    start = threading.Barrier(len(seeds))

    def worker(i):
        try:
            start.wait(timeout=JOIN_TIMEOUT)
            results[i] = fn(seeds[i])
        except BaseException as e:  # noqa: B902 - reported to the main thread below
            errors[i] = e

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(len(seeds))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=JOIN_TIMEOUT)
    stuck = [i for i, t in enumerate(threads) if t.is_alive()]
    assert not stuck, f"threads {stuck} did not finish within {JOIN_TIMEOUT:g} s (deadlock?)"
    for e in errors:
        if e is not None:
            raise e
    return results


def assert_same(a, b):
    for u, w in zip(a, b):
        torch.testing.assert_close(u, w, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("run", [quadruped_run, tetrapod_run])
def test_threads_stepping_their_own_simulators_match_one_thread(run):
    seeds = [0, 1, 2, 0]
    serial = [run(s) for s in seeds[:3]]
    threaded = run_in_threads(run, seeds)
    for s, result in zip(seeds, threaded):
        assert_same(result, serial[s])


_SHARED = {}


def shared_block_run(seed, steps=2):
    """Threads stepping ONE simulator whose Hessians go through CHOLMOD (over 1000 unknowns): its FactorCache's
    symbolic analysis is shared by every thread's factorizations."""
    if "sim" not in _SHARED:
        v, t = box((0.5, 0.25, 0.25), (10, 5, 5), dtype=F64)
        body = SoftBody(v, t, density=1000.0, youngs_modulus=1e5, poisson_ratio=0.4,
                        fixed=torch.nonzero(v[:, 0] == 0).flatten())
        _SHARED["sim"] = Simulator(body, dt=0.01, ground=None)
    sim = _SHARED["sim"]
    x, v = sim.rest_state
    g = torch.Generator().manual_seed(seed)
    v = (0.2 * torch.randn(v.shape, generator=g, dtype=F64)).requires_grad_()
    xs, _ = sim.rollout(x, v, steps=steps)
    xs[-1].square().sum().backward()
    return xs.detach(), v.grad


def test_threads_sharing_one_simulator_and_its_factor_cache_match_one_thread():
    seeds = [0, 1, 2, 0]
    serial = [shared_block_run(s) for s in seeds[:3]]
    threaded = run_in_threads(shared_block_run, seeds)
    for s, result in zip(seeds, threaded):
        for u, w in zip(result, serial[s]):
            torch.testing.assert_close(u, w, rtol=1e-9, atol=1e-12)


def _failing_step(seed):
    """A step that cannot converge (max_iter=1 after a violent impact): warns in one thread, raises in another,
    while other threads step normally."""
    v, t = box((0.2, 0.2, 0.2), (1, 1, 1), dtype=F64)
    body = SoftBody(v, t, density=1000.0, youngs_modulus=1e6, poisson_ratio=0.4)
    sim = Simulator(body, dt=0.1, max_iter=1, on_failure="raise" if seed % 2 else "warn")
    x0 = v + torch.tensor([0.0, 0.01, 0.0], dtype=F64)
    v0 = torch.zeros_like(x0)
    v0[:, 1] = -50.0
    if seed % 2:
        with pytest.raises(diffsoft.ConvergenceError):
            sim.step(x0, v0)
        return "raised"
    x1, _, info = sim.step(x0, v0, return_info=True)  # the RuntimeWarning is checked in the main thread
    assert not info.converged and torch.isfinite(x1).all()
    return "warned"


def test_failures_in_threads_raise_or_warn_in_their_own_thread_without_deadlock():
    def mixed(seed):
        return _failing_step(seed) if seed < 4 else quadruped_run(seed, steps=3)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = run_in_threads(mixed, [0, 1, 2, 3, 4, 5])
    assert out[:4] == ["warned", "raised", "warned", "raised"]
    assert sum("did not converge" in str(w.message) for w in caught) >= 2
    assert_same(out[4], quadruped_run(4, steps=3))


def test_user_exceptions_in_energies_propagate_from_threads():
    def worker(seed):
        def energy(x, k):
            if (x.abs() > 1.5).any():
                raise KeyError(f"thread {seed}")
            return 0.5 * (k * x * x).sum() - x.sum()

        k = torch.tensor(0.5, dtype=F64)  # the minimum at x = 2 is out of the energy's domain
        with pytest.raises(KeyError, match=f"thread {seed}"):
            diffsoft.minimize(energy, torch.zeros(8, dtype=F64), k)
        return seed

    assert run_in_threads(worker, list(range(4))) == list(range(4))


def test_a_thread_count_beyond_the_machine_is_refused():
    # A review: --threads 1000000 was taken, and torch's pool of a million threads never got going.
    from diffsoft.threads import set_num_threads
    with pytest.raises(ValueError, match="the number of threads must be at most"):
        set_num_threads(1_000_000)

"""diffsoft.threads.set_num_threads: what ``--threads N`` means. It sets torch's pool and every loaded OpenBLAS
(whose pthread build otherwise keeps one worker per core, busy beside a process told to use one thread)."""
import ctypes
import os
from queue import Empty

import pytest
import torch

from diffsoft import threads


def openblas_getters():
    """openblas_get_num_threads of each OpenBLAS loaded in this process (one per distinct function)."""
    getters = {}
    for path in threads._loaded_blas_paths():
        lib = ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
        getter = getattr(lib, "openblas_get_num_threads", None)
        if getter is not None:
            getter.restype = ctypes.c_int
            getters[ctypes.cast(getter, ctypes.c_void_p).value] = getter
    return list(getters.values())


@pytest.fixture
def restore_threads():
    before_torch = torch.get_num_threads()
    before_blas = [g() for g in openblas_getters()]
    yield
    torch.set_num_threads(before_torch)
    if before_blas:
        threads.set_blas_threads(before_blas[0])


@pytest.mark.parametrize("n", [1, 2])
def test_set_num_threads_sets_torch_and_every_loaded_openblas(n, restore_threads):
    getters = openblas_getters()
    threads.set_num_threads(n)
    assert torch.get_num_threads() == n
    assert [g() for g in getters] == [n] * len(getters)
    assert threads.set_blas_threads(n) == len(getters)


def test_debians_torch_runs_on_openblas():
    """The machines this project targets (Debian's python3-torch and CHOLMOD) load OpenBLAS, so the test above
    is not vacuous there; elsewhere (a pip torch with MKL) there may be none to set."""
    if not os.path.isdir("/usr/lib/x86_64-linux-gnu/openblas-pthread"):
        pytest.skip("no Debian OpenBLAS (pthread build) on this machine")
    assert openblas_getters()


@pytest.mark.parametrize("bad", [0, -1, 1.5, "2", True, None])
def test_set_num_threads_refuses_what_is_not_a_positive_integer(bad):
    with pytest.raises(ValueError, match="positive integer"):
        threads.set_num_threads(bad)


def test_the_core_runs_its_loops_over_a_batch_on_torchs_threads():
    """ATen's at::parallel_for runs serially in code compiled without OpenMP, with no word: the core is built with
    it wherever torch is an OpenMP build (Debian's and pip's are)."""
    from diffsoft import _C
    if "OpenMP" not in torch.__config__.parallel_info():
        pytest.skip("this torch is not an OpenMP build")
    assert _C.HAS_OPENMP


def test_one_openmp_runtime_serves_torch_and_the_core():
    """The core links libgomp by its name, which the loader resolves to the copy torch loaded first (pip's
    torch bundles its own): a second runtime would keep a second pool of threads that torch.set_num_threads
    does not set."""
    from diffsoft import _C  # noqa: F401
    if not os.path.exists("/proc/self/maps"):
        pytest.skip("no /proc/self/maps on this system")
    with open("/proc/self/maps") as f:
        runtimes = {line.split()[-1] for line in f if "libgomp" in line}
    assert len(runtimes) <= 1, runtimes


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_batch_steps_to_the_same_bits_on_one_thread_and_on_two(dtype, restore_threads):
    """256 bipeds: the batch's loops split it between threads (core/parallel.h). Each creature's arithmetic is
    its own, so states and gradients do not depend on the thread count."""
    from diffsoft.creatures import biped
    sim = biped(dtype=dtype)
    g = torch.Generator().manual_seed(0)
    b = 256
    x, v = sim.rest_state
    x = x.expand(b, -1, -1).clone()
    v = v.expand(b, -1, -1) + torch.tensor([0.5, -0.3], dtype=dtype) * torch.rand(b, 1, 2, generator=g, dtype=dtype)
    acts = 0.6 + 0.4 * torch.rand(3, b, sim.body.num_muscles, generator=g, dtype=dtype)

    def run():
        x0, v0, a = (t.clone().requires_grad_() for t in (x, v, acts))
        xt, vt = x0, v0
        for t in range(len(a)):
            xt, vt = sim.step(xt, vt, a[t])
        ((xt[..., 0] - x0[..., 0].detach()).sum() + (vt * vt).sum()).backward()
        return [t.detach() for t in (xt, vt, x0.grad, v0.grad, a.grad)]

    threads.set_num_threads(1)
    one = run()
    threads.set_num_threads(2)
    two = run()
    for a, b_ in zip(one, two):
        assert torch.equal(a, b_)


def _fork_child_rollout(sim, x, v, a, queue):
    queue.put(_three_steps(sim, x, v, a).tolist())  # (a tensor would be shared through a socket the child closes)


def _three_steps(sim, x, v, a):
    for _ in range(3):
        x, v = sim.step(x, v, a)
    return x


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork() on this system")
def test_a_forked_child_steps_after_its_parent_ran_the_threaded_loops(restore_threads):
    """GNU OpenMP's threads do not survive fork(): a child that enters a parallel region its parent had run waits
    for them forever. The core runs its loops on one thread in a fork's child (core/parallel.h), so a
    multiprocessing worker started by fork steps, to the same bits."""
    import multiprocessing
    from diffsoft.creatures import biped
    threads.set_num_threads(2)
    sim = biped()
    x, v = (t.expand(64, -1, -1).clone() for t in sim.rest_state)
    a = torch.full((64, sim.body.num_muscles), 0.8)
    parent = _three_steps(sim, x, v, a)  # the loops run on 2 threads here (conftest.py splits every batch)
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_fork_child_rollout, args=(sim, x, v, a, queue))
    child.start()
    try:
        got = queue.get(timeout=60)  # before join: a child blocks at exit until what it put is read
    except Empty:
        child.kill()
        pytest.fail("the forked child hung in the core's threaded loops")
    child.join(10)
    assert child.exitcode == 0
    assert torch.equal(torch.tensor(got, dtype=parent.dtype), parent)


def test_the_chunk_knob_refuses_what_is_not_a_size_and_an_infinite_chunk_keeps_a_batch_together():
    from diffsoft import _C
    from diffsoft.creatures import biped
    for bad in (float("nan"), -1.0):
        with pytest.raises(ValueError, match="min_chunk_ns must be >= 0"):
            _C._set_min_chunk_ns(bad)
    sim = biped()
    x, v = (t.expand(8, -1, -1).clone() for t in sim.rest_state)
    a = torch.full((8, sim.body.num_muscles), 0.8)
    split = _three_steps(sim, x, v, a)  # conftest.py's 0: every batch split
    before = _C._set_min_chunk_ns(float("inf"))
    try:
        assert torch.equal(_three_steps(sim, x, v, a), split)
    finally:
        _C._set_min_chunk_ns(before)

"""The torch-version-specific calls of the Python package, in one place (the C++ side keeps its own in
``csrc/bindings.cpp``)."""
import contextlib
import functools
import pickle
import pickletools
import re
import sys
import zipfile

import torch
from torch.autograd import forward_ad

TORCH_VERSION = tuple(int(n) for n in re.findall(r"\d+", torch.__version__)[:2])
"""``(major, minor)`` of the torch in use, e.g. ``(1, 13)``."""


def load_checkpoint(path):
    """``torch.load`` of a diffsoft checkpoint (tensors, numbers, strings, lists and dicts only) onto the CPU.
    From torch 2.4, with ``weights_only=True``: what torch 2.6 does by default, and 2.4-2.5 warn about. Torch
    1.13's ``weights_only`` loader cannot read floats (and its ``torch.load`` ignores a ``pickle_module``), so
    there the file's pickle is read first, and one that would import anything but a tensor's or a dict's
    rebuilding (a foreign file could run any code: end the process) is refused (pickle.UnpicklingError)."""
    if TORCH_VERSION >= (2, 4):
        return torch.load(path, map_location="cpu", weights_only=True)
    _refuse_foreign_globals(path)
    return torch.load(path, map_location="cpu")


_CHECKPOINT_GLOBALS = {("torch._utils", "_rebuild_tensor_v2"), ("torch._utils", "_rebuild_parameter"),
                       ("collections", "OrderedDict"), ("torch", "Size")}
"""What a checkpoint's pickle may import, besides torch's storage classes (``torch.FloatStorage``, ...)."""


def _refuse_foreign_globals(path):
    """A pickle.UnpicklingError unless ``path`` is a zip of torch.save whose pickle imports only
    :data:`_CHECKPOINT_GLOBALS` and storage classes, by name (``GLOBAL``, as torch.save's protocol 2 writes it;
    the opcodes that import by other means are refused)."""
    try:
        with zipfile.ZipFile(path) as z:
            pickles = [n for n in z.namelist() if n.endswith("/data.pkl") or n == "data.pkl"]
            if len(pickles) != 1:
                raise pickle.UnpicklingError("not a torch.save archive (no data.pkl)")
            data = z.read(pickles[0])
    except zipfile.BadZipFile:
        raise pickle.UnpicklingError("not a torch.save archive (not a zip file)") from None
    for op, arg, _ in pickletools.genops(data):
        if op.name in ("STACK_GLOBAL", "INST", "OBJ", "EXT1", "EXT2", "EXT4"):
            raise pickle.UnpicklingError(f"its pickle imports by {op.name}, which torch.save does not write")
        if op.name == "GLOBAL":
            module, name = arg.split(" ", 1)
            if (module, name) not in _CHECKPOINT_GLOBALS and not (module == "torch" and name.endswith("Storage")):
                raise pickle.UnpicklingError(f"it would import {module}.{name}")


def batched_vjp(output, input, v, create_graph=False):
    """``K`` vector-Jacobian products in one autograd call: ``v`` is ``(K, *output.shape)``; returns
    ``(K, *input.shape)``, the k-th being ``v[k] . d output / d input``, the graph retained (and the products'
    own graph built, with ``create_graph``). ``None`` where torch
    cannot batch this graph, and the caller takes the products one at a time.

    By ``torch.autograd.grad(..., is_grads_batched=True)``, torch's vmap over the backward: the same call in
    torch 1.13 and 2.x, which both run it on torch's legacy vmap (``torch._vmap_internals``); LibTorch's C++
    API has no equivalent. An operation without a batching rule there is looped over the K products
    inside the call (right, slower: indexing ops in 1.13); one that cannot be looped over (a custom autograd
    Function whose backward reads data, e.g. ``.item()`` or ``.numpy()``; an in-place write of a batched value
    into an unbatched tensor) raises, and so does a genuine error of the energy's backward, which the one-at-a-
    time products then raise again: hence any exception here means "take them one at a time"."""
    try:
        (hv,) = torch.autograd.grad(output, input, v, retain_graph=True, allow_unused=True, is_grads_batched=True,
                                    create_graph=create_graph)
    except Exception:  # noqa: BLE001 - see the docstring: the caller retries one at a time, which raises anew
        return None
    return v.new_zeros((v.shape[0],) + tuple(input.shape)) if hv is None else hv


def register_fake(name):
    """A decorator registering a fake (meta) implementation of the operator ``name``: torch 2.4's
    ``torch.library.register_fake``, 2.1-2.3's ``impl_abstract``; torch 1.13, which has no FakeTensor users,
    leaves the function unregistered."""
    for api in ("register_fake", "impl_abstract"):
        if hasattr(torch.library, api):
            return getattr(torch.library, api)(name)
    return lambda fn: fn


def eager_under_compile(fn):
    """``fn`` run eagerly where ``torch.compile`` meets it: a graph break at its call (``torch.compiler.disable``,
    torch 2.1+; torch 1.13 has no ``torch.compile``). For the solves: Newton's loop has data-dependent iteration
    counts and convergence tests, and the C++ solver calls back into Python energies, none of which Dynamo can
    trace; what runs around them (a policy, a loss) still compiles. Dynamo is imported only once something has
    imported it (``torch.compile`` does): importing it costs seconds that ``import diffsoft`` should not pay."""
    eager = []

    @functools.wraps(fn)
    def run(*args, **kwargs):
        if "torch._dynamo" not in sys.modules:
            return fn(*args, **kwargs)
        if not eager:
            eager.append(torch.compiler.disable(fn))
        return eager[0](*args, **kwargs)

    return run


def is_transformed(t):
    """Whether ``t`` is a wrapper of torch.func's transforms (functorch's ``vmap``, ``grad``, ``jacrev``, ...)."""
    return torch._C._functorch.is_functorch_wrapped_tensor(t)


def in_dual_level():
    """Whether a ``forward_ad.dual_level()`` is open (where a closure may hold a dual tensor)."""
    return getattr(forward_ad, "_current_level", -1) >= 0


def is_dual(t):
    """Whether ``t`` carries a forward-mode tangent (``torch.autograd.forward_ad``) at the current level; costs
    one comparison outside ``forward_ad.dual_level()`` (a private attribute that torch has kept since 1.9)."""
    if getattr(forward_ad, "_current_level", 0) < 0:
        return False
    return forward_ad.unpack_dual(t).tangent is not None


def is_batched(t):
    """Whether ``t`` is batched by a vmap: functorch's, or the legacy one of ``torch.autograd.grad(...,
    is_grads_batched=True)`` and ``torch.autograd.functional.jacobian(vectorize=True)``, whose tensors hold no
    storage (torch 1.13 has no predicate for them; their dispatch keys name them in both versions)."""
    return "Batched" in str(torch._C._dispatch_keys(t))


@contextlib.contextmanager
def own_graphs():
    """A context in which autograd saves tensors as they are, whatever saved-tensor hooks the caller has set
    (``torch.utils.checkpoint``'s non-reentrant mode, offloading to another device): for the solvers' graphs of
    their own, which they differentiate several times within one call and which never join the caller's. Where
    the caller has disabled hooks (torch >= 2.0's ``disable_saved_tensors_hooks``), there are none to bypass."""
    hooks = torch.autograd.graph.saved_tensors_hooks(_detached, _same)
    try:
        hooks.__enter__()
    except RuntimeError:
        yield
        return
    try:
        yield
    finally:
        hooks.__exit__(None, None, None)


def _same(t):
    return t


def _detached(t):
    """What a saved tensor is packed as: an alias without its autograd metadata, which autograd restores on
    unpacking. The tensor itself would make an op that saves its own output (exp, tanh, sqrt, norm) hold its
    graph node through it: a reference cycle across C++ that Python's collector cannot break, so every graph
    built in these contexts leaked (2 GB in 21 solves of an energy with an 8 MB intermediate)."""
    return t.detach()

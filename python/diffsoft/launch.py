"""``python -m diffsoft.launch``: torch's launcher (``torchrun``, :mod:`torch.distributed.run`) under the Python
that runs it, so that the processes it starts see the same diffsoft (a bare ``torchrun`` is the system
Python's script, which may not). It takes torchrun's arguments, e.g.::

    python -m diffsoft.launch --standalone --nproc_per_node 2 examples/locomotion.py --quick

On several machines, the same command on each with ``--nnodes``, ``--node_rank`` (or ``--rdzv_id``,
``--rdzv_backend c10d``, ``--rdzv_endpoint HOST:PORT`` for elastic rendezvous) instead of ``--standalone``
(see ``docs/training.md``).

It also mends torch 1.13's launcher under Python 3.11, where the default ``--redirects 0``/``--tee 0`` fail
(``'NoneType' object has no attribute 'get'``): Python 3.11's flag enums no longer list the zero flag
``Std.NONE`` when iterated, so torch's ``Std.from_str("0")`` returns None. The fix is applied only where that
is the case.
"""
import sys


def _mend_std_from_str():
    """Makes ``Std.from_str`` map "0" (alone or in a rank mapping) to ``Std.NONE`` where it gives None."""
    from torch.distributed.elastic.multiprocessing import api
    if api.Std.from_str("0") is not None:
        return
    parse = api.Std.from_str

    def from_str(vm):
        out = parse(vm)
        if isinstance(out, dict):
            return {rank: api.Std.NONE if std is None else std for rank, std in out.items()}
        return api.Std.NONE if out is None else out

    api.Std.from_str = from_str


def main(argv=None):
    """Runs torchrun with ``argv`` (default: this process's arguments)."""
    _mend_std_from_str()
    from torch.distributed import run
    args = run.parse_args(sys.argv[1:] if argv is None else argv)
    n = str(args.nproc_per_node)
    if n.lstrip("-").isdigit() and int(n) < 1:  # (torch's launcher fails on a bare assertion)
        raise SystemExit(f"diffsoft.launch: --nproc_per_node must be at least 1, got {n}")
    run.run(args)


if __name__ == "__main__":
    main()

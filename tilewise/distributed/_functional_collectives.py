"""Functional collectives: ``all_reduce`` that returns a new tensor instead of writing its input, as torch's
``torch.distributed._functional_collectives`` (its operator ``_c10d_functional::all_reduce``).

[Note: collectives in compiled programs] An in-place collective writes a tensor from the transport, so inside
``tilewise.compile`` it needs the tensor's values in memory: a graph break. The functional form is an operator
of the table (a custom operator, ``tilewise.library``) that returns its result: while a step is traced it is one
opaque node typed by its fake implementation, and the program runs it as one library-call step over planned
buffers, its result written over its input where nothing reads the input after it, on a communication stream
that waits for the steps before it and that later readers of its buffers wait for (see [Note: collectives on
their own stream] in ``compiler/lowering/streams``), so a whole training step with its gradient all-reduces is
one program (DistributedDataParallel's reducer issues it when its buckets hold trace tensors). Every rank's
program issues the same collectives in the same order, since the rank's programs are built from the same
Python, and one stream runs them in that order.
"""

from __future__ import annotations

from tilewise import library
from tilewise.distributed import c10d
from tilewise.distributed.backend import ReduceOp
from tilewise.tensor import Tensor

__all__ = ["all_reduce", "wait_tensor"]

_OPS = {"sum": ReduceOp.SUM, "avg": ReduceOp.AVG, "product": ReduceOp.PRODUCT, "min": ReduceOp.MIN,
        "max": ReduceOp.MAX}


def _group_named(group_name: str) -> c10d.ProcessGroup:
    for group, name in c10d._world.groups.items():
        if name == group_name:
            return group
    raise ValueError(f"Could not resolve the process group registered under the name {group_name}")


@library.custom_op("_c10d_functional::all_reduce", mutates_args=())
def _all_reduce(input: Tensor, reduce_op: str, group_name: str) -> Tensor:  # noqa: A002 -- torch's names
    group = _group_named(group_name)
    if getattr(group._get_backend(input.device), "allreduce_into", None) is not None and input.is_contiguous():
        out = input.new_empty(tuple(input.shape))
        _all_reduce_into(out, input, reduce_op, group_name)
        return out
    out = input.clone()
    c10d.all_reduce(out, op=_OPS[reduce_op], group=group)
    return out


# the compiler may write the result over the input (NCCL reduces in place) and run the step on a communication
# stream of its own, overlapped with the steps that do not touch its buffers (see ``compiler/lowering/streams``);
# ``ranks``: how many ranks the call's arguments reduce over (one: no bytes move, nothing runs beside the program)
_all_reduce.op.attrs.update(collective=True, in_place_of=0,
                            ranks=lambda input, reduce_op, group_name: _group_named(group_name).size())


@_all_reduce.register_fake
def _(input: Tensor, reduce_op: str, group_name: str) -> Tensor:  # noqa: A002
    return input.new_empty(tuple(input.shape))


def _all_reduce_into(out: Tensor, input: Tensor, reduce_op: str, group_name: str) -> bool:  # noqa: A002
    """The compiled program's CUDA step (see [Note: kernels into a given output]): one out-of-place NCCL call
    from ``input`` into the planned ``out``, on the current stream, which waits for it; nothing allocated, so
    the program's CUDA graph captures it."""
    backend = _group_named(group_name)._get_backend(out.device)
    allreduce_into = getattr(backend, "allreduce_into", None)
    if allreduce_into is None or not input.is_contiguous():  # NCCL reads a dense buffer: the eager kernel copies
        return False
    allreduce_into(out, input, _OPS[reduce_op]).wait()
    return True


def _register_cuda_step() -> None:
    try:
        from tilewise.backends.cuda.kernels import INTO
    except ImportError:  # no CUDA extra: programs run on the CPU only
        return
    INTO.setdefault(_all_reduce.op.full_name, _all_reduce_into)


def all_reduce(self: Tensor, reduceOp: str, group) -> Tensor:  # noqa: N803 -- torch's name
    """``self`` reduced over ``group`` (a ProcessGroup, or None for the default group) into a new tensor;
    ``reduceOp`` is ``"sum"``, ``"avg"``, ``"product"``, ``"min"`` or ``"max"``."""
    op = str(reduceOp).lower()
    if op not in _OPS:
        raise ValueError(f"all_reduce: unknown reduceOp {reduceOp!r} (choose from {', '.join(_OPS)})")
    pg = c10d._resolve(group)
    return _all_reduce(self, op, c10d._world.groups[pg])


def wait_tensor(tensor: Tensor) -> Tensor:
    """The result of a functional collective, ready (they complete in stream order here)."""
    return tensor


_register_cuda_step()

"""``out=``: an operator's result written into tensors the caller gives, as torch's functions do.

[Note: out= arguments] A public functional operator (not a view, not an in-place variant) accepts ``out=`` where
torch's function of that name does: a tensor, or a tuple of them for an operator of several results (``sort``,
``max(dim)``). torch's does where aten declares an out variant, which is not everywhere: a declaration says
``out=False`` where torch has none (``argsort``, ``einsum``, ``var_mean``, ``flip``, ``conv2d``; the operators of
tilewise.nn.functional by default, as torch's Python functions there take none), and ``out_needs="dim"`` where torch
takes ``out=`` only with that argument given (``sum(x, out=o)`` is refused, ``sum(x, 1, out=o)`` taken). Refusing is
a TypeError naming the function, before anything runs: code that runs here runs under torch.
The result is computed as without it and then written into ``out``, with torch's rules:
  * under grad mode, no argument may require grad ("functions with out=... arguments don't support automatic
    differentiation"), checked before anything runs;
  * ``out`` is on the result's device, and the result's dtype can be cast to ``out``'s (float into an int tensor is
    refused: "result type Float can't be cast to the desired output type Long");
  * an ``out`` of another shape is resized to the result's (with torch's warning when it held elements);
  * the same object comes back (a tuple of them, the operator's named tuple where it has one).
An ``out`` that is also an argument (``add(a, b, out=a)``) gets the values computed from the arguments as they were.
"""

from __future__ import annotations

import warnings

from tilewise.dispatch import STATE
from tilewise.dtypes import c10_name, castable
from tilewise.tensor import Tensor


def _requires_grad(values) -> bool:
    # ops.inplace has the same test over args and kwargs; importing it from here would close an import cycle
    # (registry -> out_args -> inplace -> registry)
    for a in values:
        if type(a) is Tensor and a.requires_grad:
            return True
        if isinstance(a, (list, tuple)) and any(type(b) is Tensor and b.requires_grad for b in a):
            return True
    return False


def check_out_autograd(name: str, args, out) -> None:
    if STATE.grad_enabled and _requires_grad((*args, *(out if isinstance(out, tuple) else (out,)))):
        raise RuntimeError(f"{name}(): functions with out=... arguments don't support automatic differentiation, but "
                           "one of the arguments requires grad.")


def write_out(name: str, result, out, named=None):
    """Write ``result`` (a tensor, or a tuple of them) into ``out`` by torch's rules; returns ``out``."""
    from tilewise._grad_mode import no_grad

    several = isinstance(result, (tuple, list))
    results = tuple(result) if several else (result,)
    outs = tuple(out) if isinstance(out, (tuple, list)) else (out,)
    if several != isinstance(out, (tuple, list)) or len(outs) != len(results):
        want = f"a tuple of {len(results)} Tensors" if several else "Tensor"
        raise TypeError(f"{name}(): argument 'out' must be {want}, not {type(out).__name__}")
    for k, (r, o) in enumerate(zip(results, outs)):
        if type(o) is not Tensor:
            raise TypeError(f"{name}(): argument 'out' must be Tensor, not {type(o).__name__}")
        if type(r) is not Tensor:
            raise TypeError(f"{name}(): its result {k} is a {type(r).__name__}, which cannot be written into out=")
        if o._device != r._device:
            raise RuntimeError(f"{name}(): Expected out tensor to have device {r._device}, but got {o._device} instead")
        if not castable(r._dtype, o._dtype):
            raise RuntimeError(f"{name}(): result type {c10_name(r._dtype)} can't be cast to the desired output "
                               f"type {c10_name(o._dtype)}")
    for r, o in zip(results, outs):
        if tuple(o._shape) != tuple(r._shape):
            if o.numel():
                warnings.warn(
                    f"An output with one or more elements was resized since it had shape {list(o._shape)}, which does "
                    f"not match the required output shape {list(r._shape)}. This behavior is deprecated, and in a "
                    "future PyTorch release outputs will not be resized unless they have zero elements. You can "
                    "explicitly reuse an out tensor t by resizing it, inplace, to zero elements with t.resize_(0).",
                    UserWarning, stacklevel=3)
            with no_grad():
                o.resize_(r._shape)
    with no_grad():
        for r, o in zip(results, outs):
            o.copy_(r)
    if not several:
        return out
    return named(*outs) if named is not None else outs


def takes_out(op) -> bool:
    """Whether the public function of ``op`` accepts ``out=``: a functional operator whose results are tensors and
    whose torch function has an out variant (its declaration does not say ``out=False``)."""
    schema = op.schema
    if schema.is_view or schema.is_inplace or op.name.endswith("_") or op.kind == "view":
        return False
    if not op.attrs.get("out", True):
        return False
    if any(p.name == "out" for p in schema.params) or not schema.returns:
        return False
    return all(r.type == "Tensor" and not r.alias for r in schema.returns)


def out_needs(op) -> str | None:
    """The parameter without which torch's function of ``op`` refuses ``out=`` (its declaration's ``out_needs=``)."""
    return op.attrs.get("out_needs") if takes_out(op) else None

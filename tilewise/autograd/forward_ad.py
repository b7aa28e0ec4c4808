"""Forward-mode automatic differentiation with torch's interface (``torch.autograd.forward_ad``).

[Note: forward-mode AD] A dual tensor carries, besides its value, one tangent per open *level*, kept in its
``__dict__`` under ``_tangents`` (level -> tangent). Levels nest as functorch's do: ``func.jvp`` inside
``func.jvp`` opens a second level, and each level's tangents are invisible to the others' rules. While any level
is open the dispatcher's ForwardAD key (``dispatch.forward_ad``) looks at each call: when an input carries a
tangent at an open level, the innermost such level L is *masked* (``STATE.dual_masked``), the call runs below it
for its primal, the operator's tangent rule runs (still masked, so that outer levels see the rule's operators
and differentiate them in turn), and the outputs receive their tangents at L. Reverse mode composes for free:
the rule's operators are ordinary calls that autograd records, and backward formulas are ordinary calls that
carry tangents (forward-over-reverse, an HVP, needs nothing more).

The rule of an operator comes from its one declaration (``ops/registry.py``), as torch's ``result:`` lines:
  - a written ``fwd=`` formula over the arguments, their tangents ``<name>_t`` and ``result``;
  - ``auto_linear`` (and every view): the operator itself applied to the tangents;
  - ``auto_element_wise`` (and every pointwise operator with a derivative): the backward formula with the
    tangent for ``grad`` — exact because a pointwise Jacobian is diagonal; conjugated around, for complex;
  - a composite without a derivative of its own: its decomposition, whose primitives carry the tangents;
  - any other operator with a derivative: the *transposed* backward formula. The formula is linear in ``grad``,
    so with ``u`` a zero cotangent that requires grad, ``<vjp(u), t>`` is linear in ``u`` and its gradient in
    ``u`` is ``J t``. Exact and automatic, at the price of a second backward: the fallback of an operator that
    has no rule yet. ``tests/test_op_rules.py`` lists the operators that take it (none, now: every declared
    operator writes its rule, the formulas in ``ops/forward_formulas.py`` and ``ops/linalg_forward.py``), so
    that the list only shrinks.
A level's tangents are removed from every tensor that got one when the level is left, as torch does.
"""

from __future__ import annotations

import itertools
import weakref
from collections import namedtuple

from tilewise import dispatch
from tilewise.dispatch import NO_TANGENT, STATE
from tilewise.dtypes import FLOAT as FLOATING
from tilewise.ops.registry import FORWARD_AUTO, Formula
from tilewise.tensor import Tensor

__all__ = ["dual_level", "enter_dual_level", "exit_dual_level", "make_dual", "unpack_dual", "UnpackedDualTensor"]

UnpackedDualTensor = namedtuple("UnpackedDualTensor", ["primal", "tangent"])
UnpackedDualTensor.__module__ = "tilewise.autograd.forward_ad"

_LEVEL_IDS = itertools.count()
_TRACKED: dict[int, list] = {}  # level -> weak references to the tensors given a tangent at it
_PUBLIC_LEVEL: list[int] = []  # the level opened through this module's API (torch allows one)


# ---------------------------------------------------------------------------- levels

def open_level() -> int:
    """A new innermost level (functorch's nesting; the public API allows one level, as torch's). Levels are
    numbered from a counter that never repeats, so a tangent left on a tensor by a closed level (one an in-place
    write copied, say) is never read as a later level's."""
    level = next(_LEVEL_IDS)
    _TRACKED[level] = []
    dispatch.set_dual_levels((*dispatch.dual_levels, level))
    return level


def close_level(level: int) -> None:
    if not dispatch.dual_levels or dispatch.dual_levels[-1] != level:
        raise RuntimeError(f"Trying to exit a forward AD level ({level}) that is not the innermost one; levels open: "
                           f"{list(dispatch.dual_levels)}")
    dispatch.set_dual_levels(dispatch.dual_levels[:-1])
    for ref in _TRACKED.pop(level, ()):
        t = ref()
        if t is not None:
            tangents = t.__dict__.get("_tangents")
            if tangents:
                tangents.pop(level, None)


def enter_dual_level() -> int:
    """Open the forward-AD level that ``make_dual`` and ``unpack_dual`` use by default; returns its index."""
    if _PUBLIC_LEVEL:
        raise RuntimeError("Nested forward mode AD is not supported at the moment")
    level = open_level()
    _PUBLIC_LEVEL.append(level)
    return level


def exit_dual_level(*, level: int | None = None) -> None:
    """Close the level ``enter_dual_level`` opened; every tangent at it is dropped."""
    if level is None:
        level = _PUBLIC_LEVEL[-1] if _PUBLIC_LEVEL else None
    if level is None or level not in _PUBLIC_LEVEL:
        raise RuntimeError("Trying to exit a forward AD level that was not the last one that was created. This is "
                           "not supported.")
    close_level(level)
    _PUBLIC_LEVEL.remove(level)


class dual_level:  # noqa: N801 — torch's name
    """Context manager for forward AD: tangents given by ``make_dual`` inside it propagate through every
    operator, and are dropped when it ends.

    >>> import tilewise as tw
    >>> import tilewise.autograd.forward_ad as fwAD
    >>> with fwAD.dual_level():
    ...     x = fwAD.make_dual(tw.tensor([1.0, 2.0]), tw.tensor([1.0, 0.0]))
    ...     fwAD.unpack_dual(x * x).tangent.tolist()
    [2.0, 0.0]
    """

    def __enter__(self) -> int:
        self.level = enter_dual_level()
        return self.level

    def __exit__(self, *exc) -> bool:
        exit_dual_level(level=self.level)
        return False


def _default_level(level: int | None, what: str) -> int | None:
    if level is not None:
        return level
    if _PUBLIC_LEVEL:
        return _PUBLIC_LEVEL[-1]
    if what == "make_dual":
        raise RuntimeError("Trying to create a dual Tensor for forward AD but no level exists, make sure to "
                           "enter_dual_level() first.")
    return None


# ---------------------------------------------------------------------------- tangents on tensors

def tangent_at(t, level: int):
    if type(t) is not Tensor:
        return None
    tangents = t.__dict__.get("_tangents")
    return tangents.get(level) if tangents and level in dispatch.dual_levels else None


def set_tangent(t: Tensor, level: int, tangent: Tensor) -> None:
    tangents = t.__dict__.get("_tangents")
    if tangents is None:
        tangents = t.__dict__["_tangents"] = {}
    tangents[level] = tangent
    _TRACKED[level].append(weakref.ref(t))


class masked:  # noqa: N801 — used as a context manager
    """Calls inside ignore the tangents at ``level``: they compute a primal, or a tangent rule, at that level."""

    def __init__(self, level: int):
        self.level = level

    def __enter__(self):
        self.before = STATE.dual_masked
        STATE.dual_masked = (*self.before, self.level)

    def __exit__(self, *exc):
        STATE.dual_masked = self.before
        return False


def _alias(t: Tensor) -> Tensor:
    """A new tensor object over ``t``'s memory that keeps its autograd history (a view of the same shape)."""
    return t.view(tuple(t._shape)) if t._shape else t.unsqueeze(0).squeeze(0)


def make_dual(tensor: Tensor, tangent: Tensor, *, level: int | None = None) -> Tensor:
    """A view of ``tensor`` whose tangent at ``level`` is ``tangent``."""
    level = _default_level(level, "make_dual")
    if level not in dispatch.dual_levels:
        raise RuntimeError(f"Trying to create a dual Tensor at level {level}, which is not open; open levels: "
                           f"{list(dispatch.dual_levels)}")
    if not (tensor.dtype.is_floating_point or tensor.dtype.is_complex):
        raise ValueError(f"Expected primal to be floating point or complex, but got: {tensor.dtype}")
    if not isinstance(tangent, Tensor):
        raise TypeError(f"make_dual: expected the tangent to be a Tensor, but got {type(tangent).__name__}")
    if not (tangent.dtype.is_floating_point or tangent.dtype.is_complex):
        raise ValueError(f"Expected tangent to be floating point or complex, but got: {tangent.dtype}")
    if tangent.shape != tensor.shape:
        raise RuntimeError("Trying to set a forward gradient that has a different size than that of the original "
                           f"Tensor, this is not supported. Tensor is of size {list(tensor.shape)} while the given "
                           f"forward gradient is of size {list(tangent.shape)}.")
    if tangent.device != tensor.device:
        raise RuntimeError(f"make_dual: the tangent is on {tangent.device} but the primal on {tensor.device}; "
                           "move the tangent with .to(primal.device)")
    with masked(level):
        dual = _alias(tensor)
    if tangent.dtype is not tensor.dtype:
        tangent = tangent.to(tensor.dtype)
    set_tangent(dual, level, tangent)
    return dual


def unpack_dual(tensor, *, level: int | None = None) -> UnpackedDualTensor:
    """``(primal, tangent)`` of a dual tensor at ``level``; the tangent is None where it has none."""
    level = _default_level(level, "unpack_dual")
    if type(tensor) is not Tensor:
        return UnpackedDualTensor(tensor, None)
    tangent = tangent_at(tensor, level) if level is not None else None
    if tangent is None:
        return UnpackedDualTensor(tensor, None)
    with masked(level):
        return UnpackedDualTensor(_alias(tensor), tangent)


# ---------------------------------------------------------------------------- the ForwardAD key

def _innermost_level(op, args: tuple) -> int | None:
    """The innermost open, unmasked level at which some tensor input of the call has a tangent."""
    found = None
    excluded = STATE.dual_masked
    for k in (*op.tensor_idx, *op.list_idx):
        value = args[k]
        for a in value if isinstance(value, (list, tuple)) else (value,):
            if type(a) is not Tensor:
                continue
            tangents = a.__dict__.get("_tangents")
            if tangents:
                for level in tangents:
                    if level not in excluded and (found is None or level > found) and level in dispatch.dual_levels:
                        found = level
    return found


def forward_call(op, args: tuple):
    """The ForwardAD key: the call's primal and, through its rule, its outputs' tangents at the innermost level."""
    if not op.differentiable:
        return NO_TANGENT
    level = _innermost_level(op, args)
    if level is None:
        return NO_TANGENT
    if op.forward is None and op.kind == "composite" and not op.derivatives:
        return op.decomposition(*args)  # its primitives carry the tangents
    with masked(level):
        out = dispatch.call_below_profiler(op, args)
        tangents = input_tangents(op, args, level)
        if tangents:
            tangent_out = rule_for(op)(op, args, out, tangents)
            _attach(op, out, tangent_out, level)
    return out


def input_tangents(op, args: tuple, level: int) -> dict:
    """(param index, list position or None) -> tangent, for each differentiable tensor input with one."""
    found = {}
    params = op.schema.params
    for k in (*op.tensor_idx, *op.list_idx):
        if op.derivatives and op.derivatives.get(params[k].name) is None and op.kind != "view":
            continue  # an index, a mask: no derivative, so no tangent flows from it
        value = args[k]
        if k in op.list_idx:
            for pos, a in enumerate(value):
                t = tangent_at(a, level)
                if t is not None:
                    found[(k, pos)] = t
        else:
            t = tangent_at(value, level)
            if t is not None:
                found[(k, None)] = t
    return found


def _attach(op, out, tangent_out, level: int) -> None:
    outputs = out if isinstance(out, tuple) else (out,)
    tangents = tangent_out if isinstance(tangent_out, (tuple, list)) else (tangent_out,)
    for i, (o, t) in enumerate(zip(outputs, tangents)):
        if t is None or type(o) is not Tensor or i in op.nondiff_outputs or o._dtype.category < FLOATING:
            continue
        set_tangent(o, level, _fit_tangent(t, o))


def _fit_tangent(t: Tensor, o: Tensor) -> Tensor:
    """A rule's tangent in its output's shape and dtype (broadcast operands give smaller tangents)."""
    if t._dtype is not o._dtype:
        if t._dtype.is_complex and not o._dtype.is_complex:
            t = t.real
        t = t.to(o._dtype)
    if t._shape != o._shape:
        t = t.expand(o._shape)
    return t


# ---------------------------------------------------------------------------- tangent rules

def rule_for(op):
    forward = op.forward
    if isinstance(forward, Formula):
        return formula_rule
    if forward == "auto_linear" or (forward is None and op.kind == "view"):
        return linear_rule
    if forward == "auto_element_wise" or (forward is None and op.kind == "pointwise"):
        return element_wise_rule
    assert forward is None or forward in FORWARD_AUTO, forward
    return transposed_rule


def forward_rule_kind(op) -> str | None:
    """How ``op``'s tangents are computed: 'formula', 'auto_linear', 'auto_element_wise', 'decomposition',
    'transposed' (the derived fallback), or None for an operator without a derivative."""
    if not op.differentiable:
        return None
    if op.forward is None and op.kind == "composite" and not op.derivatives:
        return "decomposition"
    if not any(f is not None for f in op.derivatives.values()) and op.forward is None:
        return None
    return {formula_rule: "formula", linear_rule: "auto_linear", element_wise_rule: "auto_element_wise",
            transposed_rule: "transposed"}[rule_for(op)]


def _zeros_like(a):
    from tilewise.ops.creation import zeros_like

    return zeros_like(a)


def _ones_like(a):
    from tilewise.ops.creation import ones_like

    return ones_like(a)


def _args_with_tangents(op, args: tuple, tangents: dict) -> list:
    """The arguments with every differentiable tensor input replaced by its tangent (zeros where it has none)."""
    new = list(args)
    params = op.schema.params
    for k in (*op.tensor_idx, *op.list_idx):
        if op.derivatives and op.derivatives.get(params[k].name) is None and op.kind != "view":
            continue
        value = args[k]
        if k in op.list_idx:
            new[k] = type(value)(tangents.get((k, pos)) if (k, pos) in tangents else _zeros_like(a)
                                 for pos, a in enumerate(value))
        elif type(value) is Tensor:
            t = tangents.get((k, None))
            new[k] = t if t is not None else _zeros_like(value)
        elif isinstance(value, (bool, int, float, complex)):  # a Python number where a tensor may go: a constant
            new[k] = type(value)(0)
    return new


def linear_rule(op, args: tuple, out, tangents: dict):
    """The operator is linear in its differentiable inputs: apply it to their tangents."""
    tangent_args = _args_with_tangents(op, args, tangents)
    if op.kind == "view":
        t = tangent_args[op.tensor_idx[0]]
        if not _same_layout(t, args[op.tensor_idx[0]]):  # a view's stride rule needs the primal's layout
            tangent_args[op.tensor_idx[0]] = _in_layout_of(t, args[op.tensor_idx[0]])
    return dispatch.call_below_profiler(op, tuple(tangent_args))


def _same_layout(a: Tensor, b: Tensor) -> bool:
    return a._strides == b._strides or a._shape != b._shape


def _in_layout_of(t: Tensor, like: Tensor) -> Tensor:
    """``t`` copied into a tensor with ``like``'s strides, so that the view ``like`` allows applies to it."""
    from tilewise.ops.creation import empty_strided

    base = empty_strided(like._shape, like._strides, dtype=t._dtype, device=t._device)
    return base.copy_(t)


def formula_env(op, args: tuple, out) -> dict:
    """What a derivative or tangent formula reads: the arguments by name, their shapes, ``result``."""
    env: dict = {"result": out}
    for p, value in zip(op.schema.params, args):
        env[p.name] = value
        if type(value) is Tensor:
            env[f"{p.name}_shape"] = value._shape
            env[f"{p.name}_geometry"] = (value._shape, value._strides, value._offset)
        elif p.is_tensor_list:
            env[f"{p.name}_shape"] = tuple(a._shape if type(a) is Tensor else () for a in value)
    return env


def formula_rule(op, args: tuple, out, tangents: dict):
    env = formula_env(op, args, out)
    tangent_args = _args_with_tangents(op, args, tangents)
    for k in (*op.tensor_idx, *op.list_idx):
        env[f"{op.schema.params[k].name}_t"] = tangent_args[k]
    return op.forward(env)


def _conj(x):
    return x.conj() if type(x) is Tensor and x._dtype.is_complex else x


def element_wise_rule(op, args: tuple, out, tangents: dict):
    """Pointwise: the backward formula is ``grad * d out / d input`` elementwise (conjugated for complex), so
    evaluating it at the conjugate tangent and conjugating back gives the input's share of the output's tangent."""
    total = None
    names = op.param_names()
    for (k, pos), t in tangents.items():
        env = formula_env(op, args, out)
        g = _conj(t)
        if out is not None and type(out) is Tensor and g._dtype is not out._dtype and not g._dtype.is_complex \
                and out._dtype.category >= FLOATING and not out._dtype.is_complex:
            g = g.to(out._dtype)
        env.update(grad=g, grads=(g,), output_grads=(g,))
        share = op.derivatives[names[k]](env)
        if pos is not None:
            share = share[pos]
        share = _conj(share)
        total = share if total is None else total + share
    return total


def transposed_rule(op, args: tuple, out, tangents: dict):
    """``J t`` from the backward formula alone: the gradient in the cotangent ``u`` of ``<vjp(u), t>``."""
    from tilewise.autograd.grad_mode import enable_grad
    from tilewise.autograd.graph import _fit_grad

    outputs = out if isinstance(out, tuple) else (out,)
    differentiable = [type(o) is Tensor and i not in op.nondiff_outputs and o._dtype.category >= FLOATING
                      for i, o in enumerate(outputs)]
    names = op.param_names()
    tracked = _tracked_by_autograd(args, tangents)
    with enable_grad():
        # any point will do, the formula being linear in it: ones, where a formula's log or division of the
        # cotangent (logcumsumexp's) would make zeros NaN
        cotangents = [_ones_like(o).requires_grad_() if d else None for o, d in zip(outputs, differentiable)]
        env = formula_env(op, args, out)
        filled = tuple(u if u is not None else o for u, o in zip(cotangents, outputs))
        env.update(grad=filled[0], grads=filled, output_grads=tuple(cotangents))
        pairing = None
        cache: dict = {}
        for (k, pos), t in tangents.items():
            name = names[k]
            if name not in cache:
                cache[name] = op.derivatives[name](env)
            g = cache[name] if pos is None else cache[name][pos]
            if g is None:
                continue
            primal = args[k] if pos is None else args[k][pos]
            g = _fit_grad(g, (primal._shape, primal._dtype, primal._device), op.name, name)
            term = (_conj(t) * g).sum()
            term = term.real if term._dtype.is_complex else term
            pairing = term if pairing is None else pairing + term
        live = [u for u in cotangents if u is not None]
        if pairing is None or not pairing.requires_grad:
            return tuple(None for _ in outputs) if isinstance(out, tuple) else None
        found = gradients([pairing], live, None, create_graph=tracked)
    found = iter(found)
    result = [next(found) if u is not None else None for u in cotangents]
    return tuple(result) if isinstance(out, tuple) else result[0]


def gradients(outputs: list, inputs: list, cotangents, *, create_graph: bool) -> list:
    """``autograd.grad(outputs, inputs, cotangents, allow_unused=True)``, from the engine directly (the package's
    ``grad`` sits above this module); ``cotangents`` None means ones, for single-element outputs."""
    from tilewise.autograd.engine import run_backward
    from tilewise.ops.creation import ones_like

    if cotangents is None:
        cotangents = [ones_like(o) for o in outputs]
    return run_backward(tuple(outputs), list(cotangents), retain_graph=True, create_graph=create_graph,
                        inputs=tuple(inputs), allow_unused=True, accumulate=False)


def _tracked_by_autograd(args: tuple, tangents: dict) -> bool:
    """Whether the tangent must stay differentiable in reverse mode: an input or a tangent requires grad. (Outer
    levels' tangents flow through the second backward's operators either way.)"""
    if not STATE.grad_enabled:
        return False
    if any(t._requires_grad for t in tangents.values()):
        return True
    for a in args:
        for b in a if isinstance(a, (list, tuple)) else (a,):
            if type(b) is Tensor and b._requires_grad:
                return True
    return False


def write_tangents(target: Tensor, result: Tensor) -> None:
    """An in-place write of ``result`` into ``target``: at each open level where either has a tangent, the target's
    becomes the result's (zeros where it has none); written through a view, the base's tangent gets the view's
    part replaced, as its values do."""
    base = target._base
    for level in dispatch.dual_levels:
        if level in STATE.dual_masked:  # a primal computed below that level: its tangents are not this write's
            continue
        theirs = tangent_at(result, level)
        mine = tangent_at(target, level)
        based = tangent_at(base, level) if base is not None else None
        if theirs is None and mine is None and based is None:
            continue
        with masked(level):
            if theirs is None:
                theirs = _zeros_like(target)
            elif theirs._shape != target._shape or theirs._dtype is not target._dtype:
                theirs = _fit_tangent(theirs, target)
            set_tangent(target, level, theirs)
            if base is not None and base.is_contiguous():  # view_scatter's geometry is a contiguous tensor's
                from tilewise.ops.registry import OPS

                whole = (based if based is not None else _zeros_like(base)).contiguous()
                geometry = (target._shape, target._strides, target._offset - base._offset)
                set_tangent(base, level, OPS["view_scatter"](whole, theirs, *geometry))


dispatch.register_forward_ad(forward_call, write_tangents)

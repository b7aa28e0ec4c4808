"""torch's multi-tensor functions (``tilewise._foreach_add_``, ``_foreach_lerp_``, ``_foreach_norm``, ...).

Code that updates many tensors at once calls them: an exponential moving average of weights (timm's
``ModelEmaV3``, torch's ``swa_utils.get_ema_multi_avg_fn``), a hand-written optimizer, a gradient-norm report.
Each is the per-tensor operator applied to every tensor of the list, as torch's CPU ("slow path") kernels do,
so values, dtypes, type promotion, errors and autograd are the per-tensor operator's. The functions check
what is common to the whole call, as torch does: a non-empty list of tensors, lists of one length, and a
scalar tensor of 0 dimensions. An in-place form returns the list it was given; an out-of-place form a tuple.
Where a whole update should run as a few fused kernels, ``tilewise.compile`` the function that calls these.

>>> import tilewise as tw
>>> ema, params = [tw.zeros(2)], [tw.ones(2)]
>>> tw._foreach_lerp_(ema, params, weight=0.25)[0].tolist()
[0.25, 0.25]
"""

from __future__ import annotations

from numbers import Number

from tilewise.ops.registry import public_function
from tilewise.tensor import Tensor

_UNARY = ("abs", "acos", "asin", "atan", "ceil", "cos", "cosh", "erf", "erfc", "exp", "expm1", "floor", "frac",
          "lgamma", "log", "log10", "log1p", "log2", "neg", "reciprocal", "round", "rsqrt", "sigmoid", "sign", "sin",
          "sinh", "sqrt", "tan", "tanh", "trunc")
_BINARY = ("add", "sub", "mul", "div", "clamp_min", "clamp_max", "maximum", "minimum", "pow")
_WITH_ALPHA = ("add", "sub")
_ELEMENTWISE_WITH_SCALAR = {"maximum": "clamp_min", "minimum": "clamp_max"}  # torch.maximum takes no number


def _tensors(what: str, tensors, argument: str = "self") -> list:
    if not isinstance(tensors, (list, tuple)) or not all(isinstance(t, Tensor) for t in tensors):
        raise TypeError(f"{what}(): argument '{argument}' must be a list or tuple of Tensors, not "
                        f"{type(tensors).__name__}")
    if not tensors:
        raise RuntimeError(f"{what}: Tensor list must have at least one tensor.")
    return list(tensors)


def _same_length(what: str, tensors: list, others: list) -> None:
    if len(others) != len(tensors):
        raise RuntimeError(f"{what}: Tensor lists must have the same number of tensors, got {len(tensors)} and "
                           f"{len(others)}")


def _per_tensor(what: str, tensors: list, other) -> list:
    """``other`` (a number, a list of numbers, a list of tensors or a 0-dim tensor) as one value per tensor."""
    if isinstance(other, Tensor):
        if other.ndim != 0:
            raise RuntimeError(f"{what}: scalar tensor expected to be 0 dim but it has {other.ndim} dimensions and "
                               f"{other.numel()} elements.")
        return [other] * len(tensors)
    if isinstance(other, (list, tuple)):
        if all(isinstance(o, Tensor) for o in other):
            _same_length(what, tensors, other)
        elif all(isinstance(o, Number) for o in other):
            if len(other) != len(tensors):
                raise RuntimeError(f"{what}: Tensor list must have same number of elements as scalar list.")
        else:
            raise TypeError(f"{what}(): expected a list of Tensors or a list of numbers, got "
                            f"[{', '.join(type(o).__name__ for o in other)}]")
        return list(other)
    if isinstance(other, Number):
        return [other] * len(tensors)
    raise TypeError(f"{what}(): expected a number, a list of numbers, a list of Tensors or a 0-dim Tensor, got "
                    f"{type(other).__name__}")


def _binary_method(name: str, other, inplace: bool) -> str:
    method = _ELEMENTWISE_WITH_SCALAR.get(name, name) if isinstance(other, Number) else name
    return f"{method}_" if inplace else method


def _make_unary(name: str, inplace: bool):
    what = f"_foreach_{name}{'_' if inplace else ''}"

    def foreach(self):
        tensors = _tensors(what, self)
        if inplace:
            for t in tensors:
                getattr(t, f"{name}_")()
            return self
        return tuple(getattr(t, name)() for t in tensors)

    foreach.__name__ = foreach.__qualname__ = what
    foreach.__doc__ = f"``{name}{'_' if inplace else ''}`` of every tensor of ``self``."
    return foreach


def _make_binary(name: str, inplace: bool):
    what = f"_foreach_{name}{'_' if inplace else ''}"

    def foreach(self, other, *, alpha=None):
        tensors = _tensors(what, self)
        others = _per_tensor(what, tensors, other)
        if alpha is not None and (name not in _WITH_ALPHA or isinstance(other, Number)
                                  or not isinstance(others[0], Tensor)):
            raise TypeError(f"{what}(): alpha is accepted only with a list of Tensors or a Tensor as other")
        kwargs = {} if alpha is None else {"alpha": alpha}
        results = tuple(getattr(t, _binary_method(name, o, inplace))(o, **kwargs) for t, o in zip(tensors, others))
        return self if inplace else results

    foreach.__name__ = foreach.__qualname__ = what
    foreach.__doc__ = f"``{name}`` of each tensor of ``self`` with ``other`` (a number, one number or tensor per " \
                      "tensor, or a 0-dim tensor)."
    return foreach


def _foreach_pow(self, exponent):
    """``self ** exponent`` for each tensor; ``self`` may be a number with a list of tensors as exponents."""
    if isinstance(self, Number):
        exponents = _tensors("_foreach_pow", exponent, "exponent")
        return tuple(e.__rpow__(self) for e in exponents)
    return _POW(self, exponent)


def _make_lerp(inplace: bool):
    what = f"_foreach_lerp{'_' if inplace else ''}"

    def foreach(self, tensors1, weight):
        tensors = _tensors(what, self)
        ends = _tensors(what, tensors1, "tensors1")
        _same_length(what, tensors, ends)
        weights = _per_tensor(what, tensors, weight)
        method = "lerp_" if inplace else "lerp"
        results = tuple(getattr(t, method)(e, w) for t, e, w in zip(tensors, ends, weights))
        return self if inplace else results

    foreach.__name__ = foreach.__qualname__ = what
    foreach.__doc__ = "``lerp`` of each tensor of ``self`` towards ``tensors1`` by ``weight`` (a number, one " \
                      "number or tensor per tensor, or a 0-dim tensor)."
    return foreach


def _scalars(what: str, tensors: list, scalars) -> list:
    """addcmul/addcdiv's ``scalars``: a list of numbers, or a 1-D tensor of one value per tensor."""
    if isinstance(scalars, Tensor):
        if scalars.ndim != 1:
            raise RuntimeError(f"{what}: Expected scalars to be 1-D, got {scalars.ndim}-D")
        if scalars.numel() != len(tensors):
            raise RuntimeError(f"{what}: Expected length of scalars to match input of length {len(tensors)} but got "
                               f"{scalars.numel()} instead.")
        return scalars.tolist()
    if not isinstance(scalars, (list, tuple)) or not all(isinstance(s, Number) for s in scalars):
        raise TypeError(f"{what}(): scalars must be a list of numbers or a 1-D Tensor, not {type(scalars).__name__}")
    if len(scalars) != len(tensors):
        raise RuntimeError(f"{what}: Tensor list must have same number of elements as scalar list.")
    return list(scalars)


def _make_addc(name: str, inplace: bool):
    what = f"_foreach_{name}{'_' if inplace else ''}"

    def foreach(self, tensor1, tensor2, scalars=None, *, value=1):
        tensors = _tensors(what, self)
        first, second = _tensors(what, tensor1, "tensor1"), _tensors(what, tensor2, "tensor2")
        _same_length(what, tensors, first)
        _same_length(what, tensors, second)
        values = [value] * len(tensors) if scalars is None else _scalars(what, tensors, scalars)
        method = f"{name}_" if inplace else name
        results = tuple(getattr(t, method)(a, b, value=v) for t, a, b, v in zip(tensors, first, second, values))
        return self if inplace else results

    foreach.__name__ = foreach.__qualname__ = what
    foreach.__doc__ = f"``{name}`` of each tensor of ``self`` with ``value``, or one of ``scalars`` per tensor."
    return foreach


def _foreach_norm(self, ord=2, dtype=None):  # noqa: A002 — torch's name
    """``linalg.vector_norm`` of each tensor, as a tuple of 0-dim tensors."""
    vector_norm = public_function("linalg_vector_norm")
    return tuple(vector_norm(t, ord, dtype=dtype) for t in _tensors("_foreach_norm", self))


def _foreach_max(self):
    """The largest element of each tensor, as a tuple of 0-dim tensors."""
    return tuple(t.max() for t in _tensors("_foreach_max", self))


def _foreach_zero_(self):
    for t in _tensors("_foreach_zero_", self):
        t.zero_()
    return self


def _foreach_copy_(self, src, non_blocking: bool = False):
    tensors = _tensors("_foreach_copy_", self)
    sources = _tensors("_foreach_copy_", src, "src")
    _same_length("_foreach_copy_", tensors, sources)
    for t, s in zip(tensors, sources):
        t.copy_(s, non_blocking=non_blocking)
    return self


def _foreach_clone(self, *, memory_format=None):
    kwargs = {} if memory_format is None else {"memory_format": memory_format}
    return tuple(t.clone(**kwargs) for t in _tensors("_foreach_clone", self))


def _table() -> dict:
    functions = {}
    for inplace in (False, True):
        suffix = "_" if inplace else ""
        for name in _UNARY:
            functions[f"_foreach_{name}{suffix}"] = _make_unary(name, inplace)
        for name in _BINARY:
            functions[f"_foreach_{name}{suffix}"] = _make_binary(name, inplace)
        for name in ("addcmul", "addcdiv"):
            functions[f"_foreach_{name}{suffix}"] = _make_addc(name, inplace)
        functions[f"_foreach_lerp{suffix}"] = _make_lerp(inplace)
    return functions


FUNCTIONS = _table()
_POW = FUNCTIONS["_foreach_pow"]
FUNCTIONS.update({"_foreach_pow": _foreach_pow, "_foreach_norm": _foreach_norm, "_foreach_max": _foreach_max,
                  "_foreach_zero_": _foreach_zero_, "_foreach_copy_": _foreach_copy_, "_foreach_clone": _foreach_clone})

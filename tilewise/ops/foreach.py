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


_POSITIONS = {"self": 0, "tensors1": 1, "tensor1": 1, "exponent": 1, "tensor2": 2}  # in torch's schemas


def _tensors(what: str, tensors, argument: str = "self") -> list:
    if not isinstance(tensors, (list, tuple)):
        raise TypeError(f"{what}(): argument '{argument}' must be a list or tuple of Tensors, not "
                        f"{type(tensors).__name__}")
    for k, t in enumerate(tensors):
        if not isinstance(t, Tensor):
            raise TypeError(f"expected Tensor as element {k} in argument {_POSITIONS[argument]}, but got "
                            f"{type(t).__name__}")
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
            k = next(k for k, o in enumerate(other) if not isinstance(o, Tensor))  # torch names the first
            raise TypeError(f"expected Tensor as element {k} in argument 1, but got {type(other[k]).__name__}")
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


def _parser_type(value) -> str:
    """A value's type as torch's argument parser names it in an error (``list``, ``float``, ``Tensor``)."""
    return type(value).__name__


def _keyword_fits(keyword: str, value) -> bool:
    """Whether torch's overload that names its operand ``keyword`` takes ``value``: ``scalar`` a number (or a 0-dim
    tensor), ``scalars`` a list of numbers, ``other`` a tensor or a list of tensors; ``exponent`` any of these."""
    is_list = isinstance(value, (list, tuple))
    if keyword == "scalar":
        return isinstance(value, Number) or isinstance(value, Tensor) and value.ndim == 0
    if keyword == "scalars":
        return is_list and all(isinstance(v, Number) for v in value)
    if keyword == "other":
        return isinstance(value, Tensor) or is_list and all(isinstance(v, Tensor) for v in value)
    return keyword == "exponent"


def _takes_alpha(name: str, operand) -> bool:
    """Whether torch has an overload of ``_foreach_{name}`` taking ``alpha=`` with this operand: add's and sub's
    with tensors (a list of them, or one), not with numbers."""
    is_list = isinstance(operand, (list, tuple))
    return name in _WITH_ALPHA and (isinstance(operand, Tensor) or is_list and bool(operand) and
                                    all(isinstance(o, Tensor) for o in operand))


def _binary_operand(what: str, name: str, self, args: tuple, named: dict, alpha):
    """The one operand of a binary ``_foreach_*`` call, given by position or by the name of torch's overload that
    takes it (``scalar=``, ``scalars=``, ``other=``; pow's ``exponent=``), with ``alpha`` only where an overload takes
    it; any other combination is refused with the first line of torch's argument parser's error."""
    keywords = ("exponent",) if name == "pow" else ("scalar", "scalars", "other")
    operand, found = None, False
    if len(args) == 1 and not named:
        operand, found = args[0], True
    elif not args and len(named) == 1:
        (keyword, operand), = named.items()
        found = keyword in keywords and _keyword_fits(keyword, operand)
    if found and (alpha is None or _takes_alpha(name, operand)):
        return operand
    shown = [_parser_type(a) for a in (self, *args)]
    given = {**named, **({} if alpha is None else {"alpha": alpha})}
    shown += [f"{k}={_parser_type(v)}" for k, v in reversed(given.items())]
    raise TypeError(f"{what}() received an invalid combination of arguments - got ({', '.join(shown)}), but "
                    f"expected one of: (tuple of Tensors self, {' | '.join(keywords)}"
                    f"{', *, Number alpha = 1' if name in _WITH_ALPHA else ''})")


def _make_binary(name: str, inplace: bool):
    what = f"_foreach_{name}{'_' if inplace else ''}"

    def foreach(self, *args, alpha=None, **named):
        tensors = _tensors(what, self)
        other = _binary_operand(what, name, self, args, named, alpha)
        others = _per_tensor(what, tensors, other)
        kwargs = {} if alpha is None else {"alpha": alpha}
        results = tuple(getattr(t, _binary_method(name, o, inplace))(o, **kwargs) for t, o in zip(tensors, others))
        return self if inplace else results

    foreach.__name__ = foreach.__qualname__ = what
    foreach.__doc__ = f"``{name}`` of each tensor of ``self`` with ``other`` (a number, one number or tensor per " \
                      "tensor, or a 0-dim tensor), given by position or as torch names it (``scalar=``, " \
                      "``scalars=``, ``other=``; pow's ``exponent=``)."
    return foreach


def _foreach_pow(self, exponent):
    """``self ** exponent`` for each tensor; ``self`` may be a number with a list of tensors as exponents."""
    if isinstance(self, Number):
        exponents = _tensors("_foreach_pow", exponent, "exponent")
        return tuple(e.__rpow__(self) for e in exponents)
    return _POW(self, exponent)


def _make_lerp(inplace: bool):
    what = f"_foreach_lerp{'_' if inplace else ''}"

    def foreach(self, tensors1, weight=None, *, weights=None):
        if (weight is None) == (weights is None):
            raise TypeError(f"{what}() received an invalid combination of arguments: give weight (a number or a "
                            "list of numbers) or weights (a list of Tensors)")
        weight = weight if weights is None else weights
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

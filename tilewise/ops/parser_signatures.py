"""Calls that torch's argument parser refuses although one schema here would bind them.

[Note: parser signatures] torch's Python functions and methods are bound by its argument parser against a list of
signatures per name; an operator here has one schema. Two differences reach users:

* Tensor-only operands. Every ``Tensor`` parameter of a schema here also takes a Python number (a "wrapped
  number", see [Note: schemas]): operators call one another so, and torch's ``add``, ``sub``, ``mul``, ``div`` and
  the operators with a ``Scalar`` overload (``eq``, ``pow``, ``remainder``, ``where``, ...) take one from users
  too. torch's parser takes a number for a tensor in no other operator: ``torch.maximum(x, 2.0)``,
  ``torch.max(x, 2.0)`` and ``torch.eq(2.0, x)`` are ``TypeError``s there.
* ``sort`` and ``argsort`` with ``stable=``: torch's signature that takes ``stable`` takes ``dim`` and
  ``descending`` by keyword only (``torch.sort(x, -1, stable=True)`` is refused), where the schema here has one
  parameter list for both.

So the public spellings of those operators (``tilewise.<name>`` and ``Tensor.<name>``, not the operators that
other operators call) check their arguments first, and refuse in torch's words: an operator of one signature in
torch by argument ("maximum(): argument 'other' (position 2) must be Tensor, not float"), one of several by the
list of them ("eq() received an invalid combination of arguments - got (float, Tensor), but expected one of:
..."), without the line torch adds under each on why it did not match.
"""

from __future__ import annotations

import functools

import numpy as np

from tilewise.tensor import Tensor

# torch's operators of one signature whose every tensor operand must be a tensor: operator -> those operands,
# in order (the function's first is ``input``, the method's ``self``)
ONE_SIGNATURE = {
    "maximum": ("input", "other"), "minimum": ("input", "other"), "fmax": ("input", "other"),
    "fmin": ("input", "other"), "atan2": ("input", "other"), "arctan2": ("input", "other"),
    "hypot": ("input", "other"), "heaviside": ("input", "values"), "logaddexp": ("input", "other"),
    "logaddexp2": ("input", "other"), "nextafter": ("input", "other"), "logical_and": ("input", "other"),
    "logical_or": ("input", "other"), "logical_xor": ("input", "other"),
    "addcmul": ("input", "tensor1", "tensor2"), "addcdiv": ("input", "tensor1", "tensor2"),
}

_TENSOR_OR_NUMBER_OTHER = ("Tensor input, Tensor other, *, Tensor out = None",
                           "Tensor input, Number other, *, Tensor out = None")
_COMPARISONS = ("eq", "ne", "lt", "le", "gt", "ge", "greater", "greater_equal", "less", "less_equal", "not_equal")
# torch's operators of several signatures, as functions: operator -> (its parameters in order, the ones no
# signature takes a number for, torch's signatures as its error lists them)
SEVERAL_SIGNATURES = {
    **{name: (("input", "other"), ("input",), _TENSOR_OR_NUMBER_OTHER) for name in (*_COMPARISONS, "fmod",
                                                                                   "copysign")},
    "rsub": (("input", "other"), ("input",), ("Tensor input, Tensor other, *, Number alpha = 1",
                                              "Tensor input, Number other, Number alpha = 1")),
    "lerp": (("input", "end", "weight"), ("input", "end"),
             ("Tensor input, Tensor end, Tensor weight, *, Tensor out = None",
              "Tensor input, Tensor end, Number weight, *, Tensor out = None")),
    **{name: (("input", "min", "max"), ("input",),
              ("Tensor input, Tensor min = None, Tensor max = None, *, Tensor out = None",
               "Tensor input, Number min = None, Number max = None, *, Tensor out = None"))
       for name in ("clamp", "clip")},
    "where": (("condition", "input", "other"), ("condition",),
              ("Tensor condition", "Tensor condition, Tensor input, Tensor other, *, Tensor out = None",
               "Tensor condition, Number self, Tensor other", "Tensor condition, Tensor input, Number other",
               "Tensor condition, Number self, Number other")),
}
# the same as methods (the tensor itself bound first)
SEVERAL_SIGNATURES_METHODS = {
    "lerp": (("end", "weight"), ("end",), ("Tensor end, Tensor weight", "Tensor end, Number weight")),
    "where": (("condition", "other"), ("condition",), ("Tensor condition, Tensor other",
                                                      "Tensor condition, Number other")),
}
_EXTREMA = ("Tensor input, *, Tensor out = None", "Tensor input, Tensor other, *, Tensor out = None",
            "Tensor input, int dim, bool keepdim = False, *, tuple of Tensors out = None")
_EXTREMA_METHODS = ("", "Tensor other", "int dim, bool keepdim = False")


def parser_type_name(value) -> str:
    """A value's type as torch's argument parser names it in an error: ``Tensor``, ``int``, ``numpy.float32``."""
    cls = type(value)
    if isinstance(value, Tensor) or cls.__module__ == "builtins":
        return "Tensor" if isinstance(value, Tensor) else cls.__name__
    return f"{cls.__module__}.{cls.__qualname__}"


def invalid_combination(name: str, args: tuple, kwargs: dict, signatures: tuple[str, ...]) -> TypeError:
    """The first lines of torch's argument parser's error for a call that matches none of ``signatures``."""
    shown = [parser_type_name(a) for a in args]
    keywords = [f"{k}={parser_type_name(v)}" for k, v in reversed(kwargs.items())]
    given = f"({', '.join(shown + keywords)})" if shown else f"({''.join(k + ', ' for k in keywords)})"
    lines = [f"{name}() received an invalid combination of arguments - got {given}, but expected one of:"]
    lines += [f" * ({signature})" for signature in signatures]
    return TypeError("\n".join(lines) + "\n")


def _first_non_tensor(params: tuple[str, ...], refused: tuple[str, ...], args: tuple, kwargs: dict):
    """(name, position or None where given by keyword, value) of the first refused operand that is no tensor; a
    method's position counts from the argument after the tensor it is called on, as torch's does."""
    first = 0 if params[0] == "self" else 1
    for k, value in enumerate(args[:len(params)]):
        if params[k] in refused and not isinstance(value, Tensor):
            return params[k], k + first, value
    for key in refused:
        spelling = "self" if key == "input" and key not in kwargs else key
        if spelling in kwargs and not isinstance(kwargs[spelling], Tensor):
            return key, None, kwargs[spelling]
    return None


def one_signature(fn, name: str, params: tuple[str, ...]):
    """``fn`` (a spelling of an operator of one signature in torch) refusing a non-tensor for any operand."""
    count = len(params)

    @functools.wraps(fn)
    def checked(*args, **kwargs):
        if not kwargs and len(args) == count and type(args[0]) is Tensor and type(args[1]) is Tensor and (
                count == 2 or type(args[2]) is Tensor):
            return fn(*args)  # the common call: every operand a tensor, by position
        found = _first_non_tensor(params, params, args, kwargs)
        if found is not None:
            param, position, value = found
            where = f" (position {position})" if position is not None else ""
            raise TypeError(f"{name}(): argument '{param}'{where} must be Tensor, not {parser_type_name(value)}")
        return fn(*args, **kwargs)

    checked.__name__ = checked.__qualname__ = name
    return checked


def several_signatures(fn, name: str, params: tuple[str, ...], refused: tuple[str, ...], signatures: tuple[str, ...],
                       method: bool = False):
    """``fn`` (a spelling of an operator of several signatures in torch) refusing a non-tensor for an operand that
    every signature takes as a tensor. A method's ``self`` is bound first and is not among ``params``."""
    positions = tuple(k + method for k, p in enumerate(params) if p in refused)
    first = positions[0] if len(positions) == 1 else None  # each operator here refuses numbers for one operand

    @functools.wraps(fn)
    def checked(*args, **kwargs):
        if first is not None and len(args) > first and type(args[first]) is Tensor:
            return fn(*args, **kwargs)  # the common call: the operand no signature takes a number for, by position
        given = args[1:] if method else args
        if _first_non_tensor(params, refused, given, kwargs) is not None:
            if name == "where" and not method and len(args) + len(kwargs) == 1:  # torch.where(condition) alone
                raise TypeError(f"where(): argument 'condition' (position 1) must be Tensor, not "
                                f"{parser_type_name(args[0] if args else kwargs['condition'])}")
            raise invalid_combination(name, given, kwargs, signatures)
        return fn(*args, **kwargs)

    checked.__name__ = checked.__qualname__ = name
    return checked


def _is_dim(value) -> bool:
    return (isinstance(value, int) and not isinstance(value, bool)) or isinstance(value, np.integer)


_DIM_KEYS = frozenset(("dim", "keepdim"))
_SORT_KEYS = frozenset(("dim", "descending"))


def extremum(fn, name: str, method: bool = False):
    """``fn`` (max or min) refusing a second operand that is neither a tensor nor a dim (``torch.max(x, 2.0)``)."""
    signatures = _EXTREMA_METHODS if method else _EXTREMA

    @functools.wraps(fn)
    def checked(*args, **kwargs):
        if not kwargs and len(args) == 1 and type(args[0]) is Tensor:
            return fn(*args)  # x.max(), torch.max(x)
        if len(args) == 2 and type(args[0]) is Tensor and (type(args[1]) is Tensor or type(args[1]) is int):
            return fn(*args, **kwargs)  # x.max(dim), torch.max(x, dim), torch.max(x, y)
        if len(args) == 1 and type(args[0]) is Tensor and type(kwargs.get("dim")) is int and kwargs.keys() <= _DIM_KEYS:
            return fn(*args, **kwargs)  # x.max(dim=1, keepdim=True)
        given = args[1:] if method else args
        other = given[1 - method] if len(given) > 1 - method else kwargs.get("other", kwargs.get("dim", 0))
        first = given[0] if given and not method else kwargs.get("input", kwargs.get("self", other if method else 0))
        if not (isinstance(other, Tensor) or _is_dim(other)) or not isinstance(first, Tensor) and not method:
            raise invalid_combination(name, given, kwargs, signatures)
        return fn(*args, **kwargs)

    checked.__name__ = checked.__qualname__ = name
    return checked


# ---------------------------------------------------------------------------- sort's and argsort's stable=

# spelling -> (signature taking stable, signature without it), (minimum arguments, most arguments, most positional
# arguments) of each as torch's parser counts them, and the keywords either takes
_STABLE_FIRST = "*, bool stable, int dim = -1, bool descending = False"
_SORTS = {
    ("sort", False): ((f"Tensor input, {_STABLE_FIRST}, tuple of Tensors out = None",
                       "Tensor input, int dim = -1, bool descending = False, *, tuple of Tensors out = None"),
                      (2, 5, 1), (1, 4, 3), ("input", "stable", "dim", "descending", "out")),
    ("argsort", False): ((f"Tensor input, {_STABLE_FIRST}, Tensor out = None",
                          "Tensor input, int dim = -1, bool descending = False"),
                         (2, 5, 1), (1, 3, 3), ("input", "stable", "dim", "descending", "out")),
    **{(name, True): ((_STABLE_FIRST, "int dim = -1, bool descending = False"),
                      (1, 3, 0), (0, 2, 2), ("stable", "dim", "descending")) for name in ("sort", "argsort")},
}


def _sort_refusal(name: str, method: bool, given: tuple, kwargs: dict) -> TypeError | None:
    """torch's error for a call of sort or argsort that neither of its signatures binds, or None where one does."""
    signatures, (min_a, max_a, positional_a), (min_b, max_b, positional_b), keywords = _SORTS[name, method]
    stable = kwargs.get("stable", False)
    stable_fits = isinstance(stable, bool) or (stable is None and name == "sort")
    dim_fits = len(given) < 2 - method or not isinstance(given[1 - method], bool)
    known = all(k in keywords or (k == "self" and not method) for k in kwargs)
    if "stable" in kwargs:
        fits = len(given) <= positional_a and stable_fits and known
    else:
        fits = len(given) <= positional_b and dim_fits and known and (name == "sort" or "out" not in kwargs)
    if fits:
        return None
    count = len(given) + len(kwargs)
    plausible = [fit for fit in (min_a <= count <= max_a, min_b <= count <= max_b)]
    if plausible == [True, False] and len(given) > positional_a:
        return TypeError(f"{name}() takes from {min_a} to {positional_a} positional arguments but {len(given)} were "
                         "given")
    if plausible == [True, False] and not stable_fits:
        return TypeError(f"{name}(): argument 'stable' must be bool, not {parser_type_name(stable)}")
    return invalid_combination(name, given, kwargs, signatures)


def sort_signatures(fn, name: str, method: bool = False):
    """``fn`` (a spelling of sort or argsort) refusing what torch's two signatures of it refuse."""
    @functools.wraps(fn)
    def checked(*args, **kwargs):
        if "axis" in kwargs and "dim" not in kwargs:  # numpy's spelling, which torch's parser takes for dim
            kwargs["dim"] = kwargs.pop("axis")
        if kwargs and len(args) == 1 and kwargs.keys() <= _SORT_KEYS and type(kwargs.get("dim", 0)) is int:
            return fn(*args, **kwargs)  # x.sort(dim=0, descending=True): torch's signature without stable
        given = args[1:] if method else args
        if kwargs or len(given) > 1 - method:
            refusal = _sort_refusal(name, method, given, kwargs)
            if refusal is not None:
                raise refusal
        return fn(*args, **kwargs)

    checked.__name__ = checked.__qualname__ = name
    return checked


def attach(exported: dict) -> None:
    """Give the public functions in ``exported`` and Tensor's methods these checks."""
    for name in ("sort", "argsort"):
        exported[name] = sort_signatures(exported[name], name)
        setattr(Tensor, name, sort_signatures(getattr(Tensor, name), name, method=True))
    for name, params in ONE_SIGNATURE.items():
        exported[name] = one_signature(exported[name], name, params)
        setattr(Tensor, name, one_signature(getattr(Tensor, name), name, ("self", *params[1:])))
        if hasattr(Tensor, f"{name}_"):
            setattr(Tensor, f"{name}_", one_signature(getattr(Tensor, f"{name}_"), f"{name}_", ("self", *params[1:])))
    for name, (params, refused, signatures) in SEVERAL_SIGNATURES.items():
        exported[name] = several_signatures(exported[name], name, params, refused, signatures)
    for name, (params, refused, signatures) in SEVERAL_SIGNATURES_METHODS.items():
        setattr(Tensor, name, several_signatures(getattr(Tensor, name), name, params, refused, signatures, True))
        if hasattr(Tensor, f"{name}_"):
            setattr(Tensor, f"{name}_", several_signatures(getattr(Tensor, f"{name}_"), f"{name}_", params, refused,
                                                           signatures, True))
    for name in ("max", "min"):
        exported[name] = extremum(exported[name], name)
        setattr(Tensor, name, extremum(getattr(Tensor, name), name, method=True))

"""Tensor methods and torch functions that are spellings of operators rather than operators: comparison
aliases (greater, less_equal, ...), in-place forms torch also offers as functions (``torch.abs_(x)``),
methods whose operator takes the tensor second (``x.polygamma(n)``), in-place views (``x.t_()``),
predicates (``is_nonzero``, ``is_same_size``, ``is_signed``) and shape arithmetic (``broadcast_shapes``).
``attach`` runs once, after the operators have their methods; it returns the functions to export.
"""

from __future__ import annotations

import functools

import numpy as np

from tilewise import strides as S
from tilewise.dispatch import STATE
from tilewise.ops.creation import empty_strided
from tilewise.ops.inplace import check_inference_write, make_inplace, watch_view
from tilewise.tensor import Size, Tensor

COMPARISON_ALIASES = {"greater": "gt", "greater_equal": "ge", "less": "lt", "less_equal": "le", "not_equal": "ne"}
INPLACE_VIEWS = {"t_": "t", "transpose_": "transpose", "swapaxes_": "swapaxes", "swapdims_": "swapdims",
                 "squeeze_": "squeeze", "unsqueeze_": "unsqueeze", "as_strided_": "as_strided"}
# in-place methods that torch also offers as functions of the tensor (torch.abs_(x) is x.abs_())
TORCH_INPLACE_FUNCTIONS = (
    "abs_", "acos_", "acosh_", "arccos_", "arccosh_", "arcsin_", "arcsinh_", "arctan_", "arctanh_", "asin_",
    "asinh_", "atan_", "atanh_", "ceil_", "clamp_", "clamp_max_", "clamp_min_", "clip_", "cos_", "cosh_",
    "deg2rad_", "erf_", "erfc_", "exp2_", "exp_", "expm1_", "fix_", "floor_", "frac_", "gcd_", "i0_", "lcm_",
    "ldexp_", "log10_", "log1p_", "log2_", "log_", "logit_", "neg_", "negative_", "rad2deg_", "reciprocal_",
    "round_", "rsqrt_", "sigmoid_", "sin_", "sinc_", "sinh_", "sqrt_", "square_", "tan_", "tanh_", "trunc_",
    "xlogy_", "zero_", "fill_", "index_put_", "detach_", "addmv_", "as_strided_", "nan_to_num_", "detach",
)
MADE_INPLACE = ("index_put", "addmm", "baddbmm")


def broadcast_shapes(*shapes) -> Size:
    """The shape the given shapes broadcast to (torch.broadcast_shapes)."""
    normalised = [(s,) if isinstance(s, int) else tuple(s) for s in shapes]
    return Size(S.broadcast_shapes(*normalised, op="broadcast_shapes"))


def _inplace_view(name: str, view_name: str):
    def method(self, *args, **kwargs):
        check_inference_write(self)
        recording = self.requires_grad and STATE.grad_enabled is not False
        if recording and self._grad_fn is None and self._base is None:
            raise RuntimeError(f"{name}: a leaf Variable that requires grad is being used in an in-place operation.")
        # under grad mode the shape change is recorded as the view it makes (torch's UnsqueezeBackward1 and the
        # like), and the version moves on, so that a node that saved the tensor in its old shape refuses at backward
        view = getattr(Tensor, view_name)(self if recording else self.detach(), *args, **kwargs)
        self._shape, self._strides, self._offset, self._array = view._shape, view._strides, view._offset, None
        if recording:
            self._grad_fn, self._output_nr = view._grad_fn, view._output_nr
            self._bump_version()
            if self._view_meta is not None:  # its history now holds the change: current again
                watch_view(self, self._view_meta[1])
        return self

    method.__name__ = name
    return method


def is_nonzero(self) -> bool:
    n = self.numel()
    if n != 1:
        raise RuntimeError("Boolean value of Tensor with no values is ambiguous" if n == 0 else
                           "Boolean value of Tensor with more than one value is ambiguous")
    return bool(self.item())


def is_same_size(self, other) -> bool:
    return tuple(self.shape) == tuple(other.shape)


def is_signed(self) -> bool:
    return self.dtype.is_floating_point or self.dtype.name.startswith("int")


def get_device(self) -> int:
    return -1 if self.device.type == "cpu" else (self.device.index or 0)


def fill(self, value):
    return self.clone().fill_(value)


def fill_diagonal_(self, fill_value, wrap: bool = False):
    """Fill the main diagonal (of a matrix, or of a tensor whose dims are all equal) in place; ``wrap`` continues
    below a tall matrix's square top every ``columns + 1`` elements, as numpy's fill_diagonal does."""
    if self.ndim < 2:
        raise RuntimeError(f"fill_diagonal_: dimensions must larger than 1 (got a {self.ndim}-dim tensor)")
    if self.ndim > 2 and len(set(self.shape)) != 1:
        raise RuntimeError(f"fill_diagonal_: all dimensions of input must be of equal length (got {list(self.shape)})")
    rows, columns = self.shape[0], self.shape[1]
    if wrap and self.ndim == 2 and rows > columns + 1 and self.is_contiguous():
        self.view(-1)[::columns + 1].fill_(fill_value)
        return self
    n = min(self.shape)
    self.as_strided((n,), (sum(self.stride()),), self.storage_offset()).fill_(fill_value)
    return self


def asarray(obj, *, dtype=None, device=None, copy=None, requires_grad: bool = False):
    """torch.asarray: shares ``obj``'s memory where it can (a tensor, a numpy array), copies when ``copy``."""
    from tilewise.tensor import as_tensor

    out = as_tensor(obj, dtype=dtype, device=device)
    if copy:
        out = out.clone()
    return out.requires_grad_(requires_grad) if requires_grad else out


def _attach_polygamma(functions: dict) -> None:
    polygamma = functions["polygamma"]

    def method(self, n):
        return polygamma(n, self)

    def inplace(self, n):
        return self.copy_(polygamma(n, self))

    Tensor.polygamma, Tensor.polygamma_ = method, inplace


def _attach_nonzero(functions: dict) -> dict:
    """``nonzero(as_tuple=True)``: one 1-D tensor of indices per dimension (a 0-d tensor counts as 1-D), the form
    ``x[x.nonzero(as_tuple=True)]`` indexes with."""
    nonzero = functions["nonzero"]

    def nonzero_or_tuple(input, *, out=None, as_tuple: bool = False):  # noqa: A002 — torch's argument name
        if not as_tuple:
            return nonzero(input) if out is None else nonzero(input, out=out)
        if out is not None:
            raise RuntimeError("nonzero(): as_tuple=True does not take out=")
        if input.ndim == 0:
            return (nonzero(input.reshape(1)).reshape(-1),)
        return nonzero(input).unbind(1)

    def method(self, *, as_tuple: bool = False):
        return nonzero_or_tuple(self, as_tuple=as_tuple)

    method.__name__ = nonzero_or_tuple.__name__ = "nonzero"
    Tensor.nonzero = method
    return {"nonzero": nonzero_or_tuple}


def _where_with_one_argument(where, nonzero) -> dict:
    """``where(condition)`` alone is ``nonzero(condition, as_tuple=True)``, the form MoE routers and masks use as
    ``rows, cols = torch.where(mask)``. torch's ``where`` takes ``out=`` only with tensors for both values (its
    overloads for a number have no out variant); the one operator here takes numbers for them either way."""

    def where_or_indices(condition, *args, **kwargs):
        if not args and not kwargs:
            return nonzero(condition, as_tuple=True)
        if kwargs.get("out") is not None:
            values = (*args, *(v for k, v in kwargs.items() if k in ("self", "input", "other")))
            if any(not isinstance(v, Tensor) for v in values):
                raise TypeError("where() got an unexpected keyword argument 'out' with a number for a value (torch's "
                                "where takes out= only with tensors for both)")
        return where(condition, *args, **kwargs)

    where_or_indices.__name__ = "where"
    where_or_indices.__doc__ = where.__doc__
    return {"where": where_or_indices}


# ---------------------------------------------------------------------------- clamp's bounds

_BOUND_SIGNATURES = ("Tensor min = None, Tensor max = None", "Number min = None, Number max = None")


def _parser_number(value) -> bool:
    """What torch's argument parser takes for a Number: a Python or numpy number, or a 0-dim tensor that needs no
    grad."""
    if isinstance(value, Tensor):
        return value.ndim == 0 and not value.requires_grad
    return isinstance(value, (int, float, complex, np.number, np.bool_))


def _mixed_bounds(lo, hi) -> bool:
    """A tensor bound (not one the parser reads as a number) beside a bound that is not a tensor: torch's clamp has
    a signature of two tensors and one of two numbers, and such a call matches neither."""
    return any(isinstance(a, Tensor) and not _parser_number(a) and b is not None and not isinstance(b, Tensor)
               for a, b in ((lo, hi), (hi, lo)))


def _parser_type_name(value) -> str:
    """A value's type as torch's argument parser names it in an error: ``Tensor``, ``int``, ``numpy.float32``."""
    cls = type(value)
    if isinstance(value, Tensor) or cls.__module__ == "builtins":
        return "Tensor" if cls is Tensor else cls.__name__
    return f"{cls.__module__}.{cls.__qualname__}"


def _invalid_bounds(name: str, form: str, args: tuple, kwargs: dict, bounds: list) -> TypeError:
    """torch's argument parser's error for a call of clamp's two signatures that matches neither, word for word.
    ``form``: "function" (``torch.clamp``, which takes ``out=``), "inplace_function" (``torch.clamp_``) or
    "method"."""
    shown = [_parser_type_name(a) for a in (args[1:] if form == "method" else args)]
    keywords = [f"{k}={_parser_type_name(v)}" for k, v in reversed(kwargs.items())]
    given = f"({', '.join(shown + keywords)})" if shown else f"({''.join(k + ', ' for k in keywords)})"
    lines = [f"{name}() received an invalid combination of arguments - got {given}, but expected one of:"]
    for signature in _BOUND_SIGNATURES:
        lines.append(f" * ({'' if form == 'method' else 'Tensor input, '}{signature}"
                     f"{', *, Tensor out = None' if form == 'function' else ''})")
        if form == "function":
            continue
        if kwargs:
            incorrect = ", ".join(reversed(kwargs))
            lines.append(f"      didn't match because some of the keywords were incorrect: {incorrect}")
        else:
            marks = (["Tensor"] if form == "inplace_function" else []) + [f"!{_parser_type_name(b)}!" for b in bounds]
            invalid = ", ".join(marks)
            lines.append(f"      didn't match because some of the arguments have invalid types: ({invalid})")
    return TypeError("\n".join(lines) + "\n")


def _checking_bounds(fn, name: str, form: str):
    """``fn`` (a spelling of clamp) refusing a tensor bound beside a number bound as torch's parser does."""
    @functools.wraps(fn)
    def checked(*args, **kwargs):
        rest = args if form != "method" and "input" in kwargs else args[1:]
        lo = rest[0] if len(rest) > 0 else kwargs.get("min")
        hi = rest[1] if len(rest) > 1 else kwargs.get("max")
        if _mixed_bounds(lo, hi):
            raise _invalid_bounds(name, form, args, kwargs, list(rest[:2]))
        return fn(*args, **kwargs)

    checked.__name__ = checked.__qualname__ = name
    return checked


def _attach_clamp_bounds(functions: dict, exported: dict) -> None:
    for name in ("clamp", "clip"):
        exported[name] = _checking_bounds(functions[name], name, "function")
        setattr(Tensor, name, _checking_bounds(getattr(Tensor, name), name, "method"))
        inplace = getattr(Tensor, f"{name}_")
        exported[f"{name}_"] = _checking_bounds(inplace, f"{name}_", "inplace_function")
        setattr(Tensor, f"{name}_", _checking_bounds(inplace, f"{name}_", "method"))


def _taking_zero_dim_masks(fn):
    """``fn`` (a spelling of index_put) taking a 0-dim mask among its indices as ``x[mask] = v`` takes it (see
    ``ops.indexing.zero_dim_mask_positions``)."""
    from tilewise.ops.indexing import has_zero_dim_mask, zero_dim_mask_positions

    @functools.wraps(fn)
    def index_put(*args, **kwargs):
        if not has_zero_dim_mask(args[1] if len(args) > 1 else kwargs.get("indices")):
            return fn(*args, **kwargs)
        self, rest = (args[0], args[1:]) if args else (kwargs.pop("input", None) or kwargs.pop("self"), ())
        given = {**dict(zip(("indices", "values", "accumulate"), rest)), **kwargs}
        given["indices"], given["values"] = zero_dim_mask_positions(self, given["indices"], given["values"],
                                                                    given.get("accumulate", False))
        return fn(self, **given)

    return index_put


def _attach_split(functions: dict) -> None:
    """``x.split(split_size, dim)``: torch's method names its sizes ``split_size`` where ``torch.split`` names them
    ``split_size_or_sections``; each spelling refuses the other's keyword."""
    split = functions["split"]

    def method(self, split_size, dim=0):
        return split(self, split_size, dim)

    method.__name__, method.__qualname__ = "split", "Tensor.split"
    Tensor.split = method


def attach(functions: dict) -> dict:
    """Give Tensor the methods above; return the torch-level functions to export, by name."""
    exported = {}
    for alias, name in COMPARISON_ALIASES.items():
        exported[alias] = functions[name]
        setattr(Tensor, alias, getattr(Tensor, name))
        setattr(Tensor, f"{alias}_", getattr(Tensor, f"{name}_"))
    for name in MADE_INPLACE:
        setattr(Tensor, f"{name}_", make_inplace(functions[name], name))
    for name, view_name in INPLACE_VIEWS.items():
        setattr(Tensor, name, _inplace_view(name, view_name))
    _attach_polygamma(functions)
    _attach_split(functions)
    exported.update(_attach_nonzero(functions))
    exported.update(_where_with_one_argument(functions["where"], exported["nonzero"]))
    Tensor.fill_diagonal_ = fill_diagonal_
    for fn in (is_nonzero, is_same_size, is_signed, get_device):
        setattr(Tensor, fn.__name__, fn)
        exported[fn.__name__] = fn
    for name in TORCH_INPLACE_FUNCTIONS:
        exported[name] = getattr(Tensor, name)
    _attach_clamp_bounds(functions, exported)
    exported["index_put"] = _taking_zero_dim_masks(functions["index_put"])
    for name in ("index_put", "index_put_"):
        setattr(Tensor, name, _taking_zero_dim_masks(getattr(Tensor, name)))
    exported["index_put_"] = Tensor.index_put_
    exported.update(broadcast_shapes=broadcast_shapes, fill=fill, asarray=asarray, empty_strided=empty_strided)
    return exported


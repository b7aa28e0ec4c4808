"""Tensor methods and torch functions that are spellings of operators rather than operators: comparison
aliases (greater, less_equal, ...), in-place forms torch also offers as functions (``torch.abs_(x)``),
methods whose operator takes the tensor second (``x.polygamma(n)``), in-place views (``x.t_()``),
predicates (``is_nonzero``, ``is_same_size``, ``is_signed``) and shape arithmetic (``broadcast_shapes``).
``attach`` runs once, after the operators have their methods; it returns the functions to export.
"""

from __future__ import annotations

from tilewise import _strides as S
from tilewise.ops.inplace import make_inplace
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
    "xlogy_", "zero_", "fill_", "index_put_", "detach_", "addmv_", "as_strided_",
)
MADE_INPLACE = ("index_put", "addmm", "baddbmm")


def broadcast_shapes(*shapes) -> Size:
    """The shape the given shapes broadcast to (torch.broadcast_shapes)."""
    normalised = [(s,) if isinstance(s, int) else tuple(s) for s in shapes]
    return Size(S.broadcast_shapes(*normalised, op="broadcast_shapes"))


def _inplace_view(name: str, view_name: str):
    def method(self, *args, **kwargs):
        if self.requires_grad:
            raise RuntimeError(f"{name}(): changing the shape of a tensor that requires grad in place is not "
                               f"supported (autograd records views, not shape changes); use {view_name}() instead")
        view = getattr(Tensor, view_name)(self.detach(), *args, **kwargs)
        self._shape, self._strides, self._offset, self._array = view._shape, view._strides, view._offset, None
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


def _attach_polygamma(functions: dict) -> None:
    polygamma = functions["polygamma"]

    def method(self, n):
        return polygamma(n, self)

    def inplace(self, n):
        return self.copy_(polygamma(n, self))

    Tensor.polygamma, Tensor.polygamma_ = method, inplace


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
    for fn in (is_nonzero, is_same_size, is_signed, get_device):
        setattr(Tensor, fn.__name__, fn)
        exported[fn.__name__] = fn
    for name in TORCH_INPLACE_FUNCTIONS:
        exported[name] = getattr(Tensor, name)
    exported.update(broadcast_shapes=broadcast_shapes, fill=fill)
    return exported


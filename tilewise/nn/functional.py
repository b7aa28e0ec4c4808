"""tilewise.nn.functional: the neural-network operators, as functions (torch.nn.functional's names).

Everything here is a declared operator (``tilewise/ops``); this module only gathers the names, and gives the
activations torch's ``inplace`` option and in-place forms (``relu_``), derived from the operators as the
Tensor methods' in-place forms are. torch's functions here take no ``out=`` but where they are aten's own
(``F.gelu``, ``F.avg_pool2d``): ``F.softmax(x, 1, out=o)`` is refused where ``torch.softmax`` takes it.
"""

from __future__ import annotations

import math

from tilewise import ops as _ops  # noqa: F401 — loads every declaration before the names are gathered
from tilewise.ops.inplace import make_inplace
from tilewise.ops.nn_activations import implicit_softmax_dim
from tilewise.ops.nn_linear_cross_entropy import linear_cross_entropy  # noqa: F401 — takes an options object
from tilewise.ops.nn_margin_losses import triplet_margin_with_distance_loss  # noqa: F401 — takes a callable
from tilewise.ops.nn_multi_head_attention import multi_head_attention_forward  # noqa: F401 — returns optional weights
from tilewise.ops.registry import OVERLOADS, public_function

_NN_OPS = ("relu", "relu6", "leaky_relu", "threshold", "hardtanh", "gelu", "silu", "mish", "softplus", "hardswish",
           "hardsigmoid", "elu", "selu", "celu", "softsign", "logsigmoid", "sigmoid", "tanh", "softmax",
           "log_softmax", "linear")
# those of _NN_OPS that torch.nn.functional binds to aten directly, out= and all (the others are Python functions)
_NN_OPS_WITH_OUT = ("gelu", "softplus", "logsigmoid", "linear")


def _export(names, out: bool = True) -> None:
    for name in names:
        if name in OVERLOADS:
            globals()[name] = public_function(name, out=out)


_export(_NN_OPS, out=False)
_export(_NN_OPS_WITH_OUT)
_export(name for name, ops in OVERLOADS.items() if ops[0].attrs.get("functional"))  # out= as declared


# activation -> how many options precede ``inplace`` in torch's signature (``F.leaky_relu(x, 0.2, True)``)
_INPLACE_OPTION = {"relu": 0, "relu6": 0, "selu": 0, "silu": 0, "mish": 0, "hardswish": 0, "hardsigmoid": 0,
                   "elu": 1, "celu": 1, "leaky_relu": 1, "hardtanh": 2, "threshold": 2}
_INPLACE_FORMS = ("relu", "elu", "selu", "celu", "leaky_relu", "hardtanh", "threshold", "rrelu")
def _accepting_inplace(name: str, options: int):
    out_of_place = public_function(name, out=False)
    in_place = make_inplace(out_of_place, name)
    def activation(input, *args, inplace: bool = False, **kwargs):
        if len(args) > options:
            args, inplace = args[:options], args[options]
        return in_place(input, *args, **kwargs) if inplace else out_of_place(input, *args, **kwargs)
    activation.__name__ = activation.__qualname__ = name
    activation.__doc__ = out_of_place.__doc__
    return activation
for _name in _INPLACE_FORMS:
    globals()[f"{_name}_"] = make_inplace(public_function(_name), _name)
for _name, _options in _INPLACE_OPTION.items():
    globals()[_name] = _accepting_inplace(_name, _options)
_hardtanh_of_aten = hardtanh  # noqa: F821 — defined by the loop above


_hardtanh_in_place_of_aten = hardtanh_  # noqa: F821 — defined by the loop above


def _integral_bounds(input, min_val, max_val) -> tuple:
    """torch's hardtanh bounds an integer tensor by its bounds cast to integers (toward zero)."""
    if getattr(input, "dtype", None) is None or input.dtype.is_floating_point or input.dtype.is_complex:
        return min_val, max_val
    return tuple(int(v) if isinstance(v, float) and math.isfinite(v) else v for v in (min_val, max_val))


def hardtanh(input, min_val=-1.0, max_val=1.0, inplace: bool = False):
    """torch.nn.functional.hardtanh: its own check of the bounds first (aten's kernel and ``hardtanh_`` have none)."""
    if min_val > max_val:
        raise ValueError(f"min_val cannot be greater than max_val (hardtanh: min_val={min_val!r}, max_val={max_val!r})")
    return _hardtanh_of_aten(input, *_integral_bounds(input, min_val, max_val), inplace=inplace)


def hardtanh_(input, min_val=-1.0, max_val=1.0):
    return _hardtanh_in_place_of_aten(input, *_integral_bounds(input, min_val, max_val))


hardtanh.__doc__ = hardtanh_.__doc__ = _hardtanh_of_aten.__doc__
_softmax_of_aten, _log_softmax_of_aten = softmax, log_softmax  # noqa: F821 — exported above


def softmax(input, dim=None, _stacklevel: int = 3, dtype=None):
    """torch.nn.functional.softmax: without ``dim``, torch's deprecated implicit choice (dim 0 of a 0-, 1- or 3-D
    input, else dim 1), with its warning."""
    if dim is None:
        dim = implicit_softmax_dim("softmax", input.dim(), stacklevel=3)
    return _softmax_of_aten(input, dim, dtype=dtype)


def log_softmax(input, dim=None, _stacklevel: int = 3, dtype=None):
    """torch.nn.functional.log_softmax, ``dim`` optional as in :func:`softmax`."""
    if dim is None:
        dim = implicit_softmax_dim("log_softmax", input.dim(), stacklevel=3)
    return _log_softmax_of_aten(input, dim, dtype=dtype)


softmax.__doc__ += "\n\n" + (_softmax_of_aten.__doc__ or "")
log_softmax.__doc__ += "\n\n" + (_log_softmax_of_aten.__doc__ or "")
unfold = public_function("im2col")  # torch.nn.functional's names for its im2col and col2im
fold = public_function("col2im")

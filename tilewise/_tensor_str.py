"""Printing tensors the way torch does (values, then dtype/device/grad_fn when they are not defaults)."""

from __future__ import annotations

import numpy as np

from tilewise.dtypes import default_complex_dtype, get_default_dtype
from tilewise.tensor import TRACE_HOOKS, Tensor


def _format_values(t) -> str:
    a = t._host()
    narrow_float = a.dtype.kind == "f" and a.dtype.itemsize < 4
    if narrow_float or a.dtype.kind == "V" or str(a.dtype).startswith(("bfloat", "float8")):
        a = a.astype(np.float32)
    if a.size == 0:
        return "[]"
    opts = dict(separator=", ", threshold=1000, edgeitems=3, prefix="tensor(", max_line_width=80)
    if a.dtype.kind == "f":
        opts["formatter"] = {"float_kind": _float_formatter(a)}
    elif a.dtype.kind == "c":
        opts["formatter"] = {"complex_kind": _complex_formatter(a)}
    elif a.dtype == np.bool_:
        opts["formatter"] = {"bool": lambda v: "True" if v else "False"}
    return np.array2string(a, **opts)


def _float_formatter(a: np.ndarray):
    finite = a[np.isfinite(a)]
    integral = finite.size == 0 or np.all(finite == np.round(finite))
    big = finite.size and (np.abs(finite).max() >= 1e8 or (np.abs(finite[finite != 0]).min(initial=1) < 1e-4))
    if integral and not big:
        return lambda v: f"{v:.0f}." if np.isfinite(v) else str(v)
    if big:
        return lambda v: f"{v:.4e}"
    return lambda v: f"{v:.4f}"


def _complex_formatter(a: np.ndarray):
    """torch's complex elements: the real part formatted over the real parts, then the imaginary part, formatted
    over the imaginary parts, with its sign and a ``j``."""
    real, imag = _float_formatter(a.real), _float_formatter(a.imag)

    def element(v) -> str:
        im = imag(v.imag)
        return f"{real(v.real)}{'' if im.startswith('-') else '+'}{im}j"

    return element


def tensor_repr(t) -> str:
    hook = TRACE_HOOKS.value_needed
    if hook is not None:
        hook(t, "printing a tensor", False)  # inside a traced function: a graph break gives it values, if allowed
    if t._trace is not None:
        return f"TraceTensor({t._trace}, shape={list(t.shape)}, dtype={t.dtype.name}, device={t.device})"
    suffix = []
    if t.numel() == 0 and t.ndim != 1:
        suffix.append(f"size={tuple(t.shape)}")
    if t.device.type != "cpu":
        suffix.append(f"device='{t.device}'")
    if t.dtype is not get_default_dtype() and t.dtype is not default_complex_dtype() and \
            t.dtype.name not in ("int64", "bool"):
        suffix.append(f"dtype=tilewise.{t.dtype.name}")
    elif t.dtype.name in ("int64", "bool") and t.numel() == 0:
        suffix.append(f"dtype=tilewise.{t.dtype.name}")
    if t.grad_fn is not None:
        suffix.append(f"grad_fn=<{t.grad_fn.name()}>")
    elif t.requires_grad:
        suffix.append("requires_grad=True")
    body = _format_values(t)
    return "tensor(" + body + "".join(", " + s for s in suffix) + ")"


Tensor.__repr__ = tensor_repr  # see [Note: methods from above] in tensor.py

"""Printing tensors the way torch does: values, then device/dtype/grad_fn when they are not defaults.

[Note: tensor printing] This follows torch's ``_tensor_str`` rule for rule, over a numpy copy of the values: one
formatter per tensor (per part, for complex tensors) chooses integer, fixed or scientific notation from the
nonzero finite values (scientific when the largest is more than 1000 times the smallest, above 1e8 or below 1e-4)
and pads every element to the widest; rows wrap at ``linewidth``; tensors with more than ``threshold`` elements
are summarised to ``edgeitems`` at each end of every dim. ``set_printoptions`` changes those settings for the
process, as torch's does (``precision``, ``threshold``, ``edgeitems``, ``linewidth``, ``sci_mode`` and the
"default", "short" and "full" profiles).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math

import numpy as np

from tilewise.dtypes import default_complex_dtype, float8_e8m0fnu, get_default_dtype
from tilewise.tensor import TRACE_HOOKS, Tensor

_E8M0_SMALLEST = np.float32(2.0**-127)


@dataclasses.dataclass
class PrintOptions:
    precision: int = 4
    threshold: float = 1000
    edgeitems: int = 3
    linewidth: int = 80
    sci_mode: bool | None = None


PRINT_OPTS = PrintOptions()
_PROFILES = {"default": (4, 1000, 3, 80), "short": (2, 1000, 2, 80), "full": (4, math.inf, 3, 80)}


class _Invalid:
    @staticmethod
    def name() -> str:
        return "Invalid"


_INVALID = _Invalid()


def set_printoptions(precision=None, threshold=None, edgeitems=None, linewidth=None, profile=None,
                     sci_mode=None) -> None:
    """Set how tensors print (torch.set_printoptions); ``profile`` ("default", "short", "full") first sets all
    four numbers, which the other arguments then override. ``sci_mode`` is always set: None chooses per tensor.

    >>> import tilewise as tw
    >>> tw.set_printoptions(precision=2)
    >>> tw.tensor([1.12345])
    tensor([1.12])
    >>> tw.set_printoptions(profile="default")
    """
    if profile is not None and profile in _PROFILES:
        (PRINT_OPTS.precision, PRINT_OPTS.threshold, PRINT_OPTS.edgeitems,
         PRINT_OPTS.linewidth) = _PROFILES[profile]
    if precision is not None:
        PRINT_OPTS.precision = precision
    if threshold is not None:
        PRINT_OPTS.threshold = threshold
    if edgeitems is not None:
        PRINT_OPTS.edgeitems = edgeitems
    if linewidth is not None:
        PRINT_OPTS.linewidth = linewidth
    PRINT_OPTS.sci_mode = sci_mode


def get_printoptions() -> dict:
    return dataclasses.asdict(PRINT_OPTS)


@contextlib.contextmanager
def printoptions(**kwargs):
    """The print options changed inside the block only."""
    saved = get_printoptions()
    set_printoptions(**kwargs)
    try:
        yield
    finally:
        set_printoptions(**saved)


class _Formatter:
    """One notation and width for every element of a (real) array, chosen as torch's ``_Formatter`` chooses."""

    def __init__(self, values: np.ndarray, e8m0: bool = False) -> None:
        self.floating = values.dtype.kind == "f"
        self.int_mode, self.sci_mode, self.max_width = True, False, 1
        flat = values.reshape(-1)
        if not self.floating:
            for value in flat.tolist():
                self.max_width = max(self.max_width, len(f"{value}"))
            return
        if e8m0:  # torch's isfinite calls every e8m0 value finite, NaN too, and 0 compares equal to 2^-127
            finite = flat[flat != _E8M0_SMALLEST].astype(np.float64)
        else:
            finite = flat[np.isfinite(flat) & (flat != 0)].astype(np.float64)
        if finite.size == 0:
            return
        magnitudes = np.abs(finite)
        smallest, largest = magnitudes.min(), magnitudes.max()
        self.int_mode = bool(np.all(finite == np.ceil(finite)))
        automatic = largest / smallest > 1000.0 or largest > 1.0e8 or smallest < 1.0e-4
        self.sci_mode = automatic if PRINT_OPTS.sci_mode is None else PRINT_OPTS.sci_mode
        precision = PRINT_OPTS.precision
        for value in finite.tolist():
            if self.sci_mode:
                width = len(f"{value:.{precision}e}")
            elif self.int_mode:
                width = len(f"{value:.0f}") + 1
            else:
                width = len(f"{value:.{precision}f}")
            self.max_width = max(self.max_width, width)

    def width(self) -> int:
        return self.max_width

    def format(self, value) -> str:
        if not self.floating:
            text = f"{value}"
        elif self.sci_mode:
            text = f"{value:{self.max_width}.{PRINT_OPTS.precision}e}"
        elif self.int_mode:
            text = f"{value:.0f}" + ("" if math.isinf(value) or math.isnan(value) else ".")
        else:
            text = f"{value:.{PRINT_OPTS.precision}f}"
        return (self.max_width - len(text)) * " " + text


def _element(value, real: _Formatter, imag: _Formatter | None) -> str:
    if imag is None:
        return real.format(value)
    real_text = real.format(value.real)
    imag_text = (imag.format(value.imag) + "j").lstrip()
    return real_text + imag_text if imag_text[0] in "+-" else real_text + "+" + imag_text


def _vector_str(a: np.ndarray, indent: int, summarize: bool, real: _Formatter, imag: _Formatter | None) -> str:
    element_length = real.width() + 2 + (imag.width() + 1 if imag is not None else 0)
    per_line = max(1, math.floor((PRINT_OPTS.linewidth - indent) / element_length))
    edge = PRINT_OPTS.edgeitems
    if summarize and not edge:
        data = ["..."]
    elif summarize and a.shape[0] > 2 * edge:
        data = ([_element(v, real, imag) for v in a[:edge].tolist()] + [" ..."] +
                [_element(v, real, imag) for v in a[-edge:].tolist()])
    else:
        data = [_element(v, real, imag) for v in a.tolist()]
    lines = [", ".join(data[i:i + per_line]) for i in range(0, len(data), per_line)]
    return "[" + (",\n" + " " * (indent + 1)).join(lines) + "]"


def _nested_str(a: np.ndarray, indent: int, summarize: bool, real: _Formatter, imag: _Formatter | None) -> str:
    if a.ndim == 0:
        return _element(a.item(), real, imag)
    if a.ndim == 1:
        return _vector_str(a, indent, summarize, real, imag)
    edge = PRINT_OPTS.edgeitems
    if summarize and a.shape[0] > 2 * edge:
        rows = ([_nested_str(a[i], indent + 1, summarize, real, imag) for i in range(edge)] + ["..."] +
                [_nested_str(a[i], indent + 1, summarize, real, imag) for i in range(len(a) - edge, len(a))])
    else:
        rows = [_nested_str(a[i], indent + 1, summarize, real, imag) for i in range(a.shape[0])]
    return "[" + ("," + "\n" * (a.ndim - 1) + " " * (indent + 1)).join(rows) + "]"


def _summarized(a: np.ndarray) -> np.ndarray:
    """The elements a summarised print shows (what the formatter measures)."""
    edge = PRINT_OPTS.edgeitems
    if a.ndim == 0:
        return a
    if a.ndim == 1:
        return np.concatenate((a[:edge], a[-edge:])) if a.shape[0] > 2 * edge else a
    if not edge:
        return np.empty((0,) * a.ndim, dtype=a.dtype)
    rows = list(range(edge)) + list(range(len(a) - edge, len(a))) if a.shape[0] > 2 * edge else range(len(a))
    return np.stack([_summarized(a[i]) for i in rows])


def _host_values(t) -> np.ndarray:
    a = t._host()
    if a.dtype.names:  # float4_e2m1fn_x2: torch prints each byte's value, as a float
        return a.view(np.uint8).astype(np.float32)
    if a.dtype.kind == "V" or str(a.dtype).startswith(("bfloat", "float8")) or a.dtype == np.float16:
        a = a.astype(np.float32)  # torch prints half types through their float values too
    return a


def _values_str(t, indent: int) -> str:
    a = _host_values(t)
    summarize = a.size > PRINT_OPTS.threshold
    measured = _summarized(a) if summarize else a
    if a.dtype.kind == "c":
        return _nested_str(a, indent, summarize, _Formatter(measured.real), _Formatter(measured.imag))
    return _nested_str(a, indent, summarize, _Formatter(measured, t.dtype is float8_e8m0fnu), None)


def _add_suffixes(text: str, suffixes: list[str], indent: int) -> str:
    parts = [text]
    last_line = len(text) - text.rfind("\n") + 1
    for suffix in suffixes:
        if last_line + len(suffix) + 2 > PRINT_OPTS.linewidth:
            parts.append(",\n" + " " * indent + suffix)
            last_line = indent + len(suffix)
        else:
            parts.append(", " + suffix)
            last_line += len(suffix) + 2
    parts.append(")")
    return "".join(parts)


def tensor_repr(t) -> str:
    if t._vmap is not None:  # a batched tensor of vmap prints its level and physical tensor, as torch's does
        level, physical = t._vmap
        return f"BatchedTensor(lvl={level.depth}, bdim=0, value=\n{_indented(repr(physical), 4)}\n)"
    hook = TRACE_HOOKS.value_needed
    if hook is not None:
        hook(t, "printing a tensor", False)  # inside a traced function: a graph break gives it values, if allowed
    if t._trace is not None:
        return f"TraceTensor({t._trace}, shape={list(t.shape)}, dtype={t.dtype.name}, device={t.device})"
    prefix = "tensor(" if type(t) is Tensor else f"{type(t).__name__}("  # a subclass's instance: its class's name
    indent = len(prefix)
    suffixes = []
    if t.device.type != "cpu":
        suffixes.append(f"device='{t.device}'")
    default = (get_default_dtype(), default_complex_dtype())
    if t.numel() == 0:
        if t.ndim != 1:
            suffixes.append(f"size={tuple(t.shape)}")
        if t.dtype is not get_default_dtype():
            suffixes.append(f"dtype=tilewise.{t.dtype.name}")
        body = "[]"
    else:
        if not PRINT_OPTS.edgeitems:
            suffixes.append(f"size={tuple(t.shape)}")
        if t.dtype not in default and t.dtype.name not in ("int64", "bool"):
            suffixes.append(f"dtype=tilewise.{t.dtype.name}")
        body = _values_str(t, indent)
    try:
        node = t.grad_fn
    except RuntimeError:  # a view autograd would refuse: torch prints its history as invalid
        node = _INVALID
    if node is not None:
        suffixes.append(f"grad_fn=<{node.name()}>")
    elif t.requires_grad:
        suffixes.append("requires_grad=True")
    text = _add_suffixes(prefix + body, suffixes, indent)
    return f"Parameter containing:\n{text}" if t.__dict__.get("_is_param") else text  # torch's Parameter.__repr__


def _indented(text: str, spaces: int) -> str:
    return "\n".join(" " * spaces + line for line in text.splitlines())


Tensor.__repr__ = tensor_repr  # see [Note: methods from above] in tensor.py

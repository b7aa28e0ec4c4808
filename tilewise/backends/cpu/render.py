"""Render a scalar ``Expr`` to a numpy function (the CPU eager kernel of a pointwise operator).

The generated source is kept on the function (``__source__``) so ``explain`` can show it, exactly as the
C and CUDA renderers keep theirs.
"""

from __future__ import annotations

import contextvars
import math
import threading

import numpy as np

from tilewise.ops.expr import Expr, toposort

_UNARY = {
    "neg": "np.negative", "abs": "np.abs", "sign": "np.sign", "exp": "np.exp", "exp2": "np.exp2",
    "expm1": "np.expm1", "log": "np.log", "log2": "np.log2", "log10": "np.log10", "log1p": "np.log1p",
    "sqrt": "np.sqrt", "rsqrt": "_rsqrt", "reciprocal": "_reciprocal", "sin": "np.sin", "cos": "np.cos",
    "tan": "np.tan", "asin": "np.arcsin", "acos": "np.arccos", "atan": "np.arctan", "sinh": "np.sinh",
    "cosh": "np.cosh", "tanh": "np.tanh", "erf": "_erf", "erfinv": "_erfinv", "floor": "np.floor",
    "ceil": "np.ceil", "round": "np.round", "trunc": "np.trunc", "logical_not": "np.logical_not",
    "bitwise_not": "np.invert", "isnan": "np.isnan", "isinf": "np.isinf", "signbit": "np.signbit",
}
_BINARY = {
    "add": "np.add", "sub": "np.subtract", "mul": "np.multiply", "div": "np.true_divide",
    "floordiv": "np.floor_divide", "mod": "np.remainder", "fmod": "np.fmod", "pow": "_pow",
    "maximum": "np.maximum", "minimum": "np.minimum", "atan2": "np.arctan2", "eq": "np.equal",
    "ne": "np.not_equal", "lt": "np.less", "le": "np.less_equal", "gt": "np.greater", "ge": "np.greater_equal",
    "logical_and": "np.logical_and", "logical_or": "np.logical_or", "logical_xor": "np.logical_xor",
    "bitwise_and": "np.bitwise_and", "bitwise_or": "np.bitwise_or", "bitwise_xor": "np.bitwise_xor",
    "lshift": "np.left_shift", "rshift": "np.right_shift", "copysign": "np.copysign",
}


def _rsqrt(x):
    return 1 / np.sqrt(x)


def _reciprocal(x):
    return 1 / x


def _pow(a, b):
    if isinstance(a, np.ndarray) and a.dtype.kind in "iu" and np.any(np.asarray(b) < 0):
        raise RuntimeError("pow: integers to negative integer powers are not allowed")
    return np.power(a, b)


_erf_scalar = np.frompyfunc(math.erf, 1, 1)


def _erf(x):
    x = np.asarray(x)
    return np.asarray(_erf_scalar(x.astype(np.float64)), dtype=np.float64).astype(x.dtype)


def _erfinv(y):
    """Inverse error function: Giles' single-precision approximation refined by two Newton steps on erf."""
    y = np.asarray(y)
    y64 = y.astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        w = -np.log((1.0 - y64) * (1.0 + y64))
        small = w < 5.0
        ws = w - 2.5
        p_small = 2.81022636e-08
        for c in (3.43273939e-07, -3.5233877e-06, -4.39150654e-06, 0.00021858087, -0.00125372503,
                  -0.00417768164, 0.246640727, 1.50140941):
            p_small = c + p_small * ws
        wl = np.sqrt(np.maximum(w, 5.0)) - 3.0
        p_large = -0.000200214257
        for c in (0.000100950558, 0.00134934322, -0.00367342844, 0.00573950773, -0.0076224613,
                  0.00943887047, 1.00167406, 2.83297682):
            p_large = c + p_large * wl
        x = np.where(small, p_small, p_large) * y64
        for _ in range(2):
            err = np.asarray(_erf_scalar(x), dtype=np.float64) - y64
            x = x - err / (2.0 / math.sqrt(math.pi) * np.exp(-x * x))
        x = np.where(y64 == 1.0, np.inf, np.where(y64 == -1.0, -np.inf, x))
        x = np.where(np.abs(y64) > 1.0, np.nan, x)
    return x.astype(y.dtype)


try:  # numpy >= 2 keeps its floating-point error state in a context variable
    from numpy._core._ufunc_config import _extobj_contextvar, _make_extobj

    _IGNORE_ALL = _make_extobj(all="ignore")
except ImportError:
    _extobj_contextvar = None

# Kernels run inside a context of their own in which that variable says "ignore": entering it costs a tenth of
# setting and resetting the variable (or of np.errstate), which matters on the eager path where each op is a
# few microseconds. One per thread, because a context can be entered by one thread at a time.
_quiet = threading.local()


def _quiet_context() -> contextvars.Context:
    context = _quiet.context = contextvars.Context()
    context.run(_extobj_contextvar.set, _IGNORE_ALL)
    return context


def run_quietly(fn, values: list):
    """``fn(*values)`` with numpy's floating-point warnings off (torch's kernels never warn on inf or nan)."""
    if _extobj_contextvar is None:
        with np.errstate(all="ignore"):
            return fn(*values)
    try:
        context = _quiet.context
    except AttributeError:  # the thread's first kernel
        context = _quiet_context()
    return context.run(fn, *values)  # kernels do not call run_quietly: a context cannot be entered twice


NAMESPACE = {"np": np, "_rsqrt": _rsqrt, "_reciprocal": _reciprocal, "_pow": _pow, "_erf": _erf, "_erfinv": _erfinv}


def render_numpy(expr: Expr, n_inputs: int, scalar_names: tuple[str, ...], name: str = "kernel"):
    """Return a Python function ``f(x0, ..., xN, *scalars)`` evaluating ``expr`` with numpy."""
    lines, names = [], {}
    for k, node in enumerate(toposort(expr)):
        if node.op == "input":
            names[id(node)] = f"x{node.arg}"
            continue
        if node.op == "scalar":
            names[id(node)] = f"s_{node.arg}"
            continue
        if node.op == "const":
            names[id(node)] = repr(node.arg) if not (isinstance(node.arg, float) and not math.isfinite(node.arg)) \
                else f"float('{node.arg}')"
            continue
        srcs = [names[id(s)] for s in node.srcs]
        if node.op in _UNARY:
            code = f"{_UNARY[node.op]}({srcs[0]})"
        elif node.op in _BINARY:
            code = f"{_BINARY[node.op]}({srcs[0]}, {srcs[1]})"
        elif node.op == "where":
            code = f"np.where({srcs[0]}, {srcs[1]}, {srcs[2]})"
        elif node.op == "cast":
            code = f"np.asarray({srcs[0]}).astype(np.dtype({node.arg.np.str!r}))"
        else:
            raise NotImplementedError(f"numpy renderer: no rule for scalar op {node.op!r}")
        names[id(node)] = f"t{k}"
        lines.append(f"    t{k} = {code}")
    params = [f"x{k}" for k in range(n_inputs)] + [f"s_{s}" for s in scalar_names]
    src = f"def {name}({', '.join(params)}):\n" + "\n".join(lines) + f"\n    return {names[id(expr)]}\n"
    scope: dict = {}
    exec(compile(src, f"<numpy kernel {name}>", "exec"), NAMESPACE, scope)
    fn = scope[name]
    fn.__source__ = src
    return fn

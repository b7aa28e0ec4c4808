"""Scalar expressions: the meaning of every pointwise operator.

[Note: expressions] A pointwise operator is declared by a Python function over symbolic scalars, e.g.
``lambda x: x.maximum(0)`` for relu. Calling it once builds an ``Expr`` tree over a handful of primitive
scalar operations (``UNARY``, ``BINARY``, ``where``, ``cast``). That one tree is what the numpy backend
evaluates, what the C and CUDA renderers print, and what the fusing compiler splices together, so a
formula is written once. Nodes are hash-consed: building the same expression twice returns the same
object, so structural equality is identity and nodes are usable as cache keys.
"""

from __future__ import annotations

import weakref
from numbers import Number

# name -> arity; the primitive scalar vocabulary every renderer must cover
UNARY = (
    "neg", "abs", "sign", "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sqrt", "rsqrt",
    "reciprocal", "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "tanh", "erf", "erfinv",
    "floor", "ceil", "round", "trunc", "logical_not", "bitwise_not", "isnan", "isinf", "signbit",
)
BINARY = (
    "add", "sub", "mul", "div", "floordiv", "truncdiv", "mod", "fmod", "pow", "maximum", "minimum", "atan2",
    "eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_xor",
    "bitwise_and", "bitwise_or", "bitwise_xor", "lshift", "rshift", "copysign",
)
COMPARISONS = ("eq", "ne", "lt", "le", "gt", "ge", "isnan", "isinf", "signbit",
               "logical_not", "logical_and", "logical_or", "logical_xor")


class Expr:
    """An immutable, hash-consed scalar expression node.

    op is "input" (arg: position), "scalar" (arg: parameter name), "const" (arg: the value),
    a name from UNARY/BINARY, "where", or "cast" (arg: a DType).
    """

    __slots__ = ("op", "srcs", "arg", "__weakref__")
    _cache: weakref.WeakValueDictionary[tuple, Expr] = weakref.WeakValueDictionary()

    def __new__(cls, op: str, srcs: tuple[Expr, ...] = (), arg=None):
        key = (op, tuple(id(s) for s in srcs), type(arg), arg)
        node = cls._cache.get(key)
        if node is None:
            node = object.__new__(cls)
            node.op, node.srcs, node.arg = op, srcs, arg
            cls._cache[key] = node
        return node

    # ---- construction helpers (Python operators for readability; comparisons are methods)
    def _bin(self, op: str, other) -> Expr:
        return Expr(op, (self, lift(other)))

    def _rbin(self, op: str, other) -> Expr:
        return Expr(op, (lift(other), self))

    def __add__(self, o): return self._bin("add", o)
    def __radd__(self, o): return self._rbin("add", o)
    def __sub__(self, o): return self._bin("sub", o)
    def __rsub__(self, o): return self._rbin("sub", o)
    def __mul__(self, o): return self._bin("mul", o)
    def __rmul__(self, o): return self._rbin("mul", o)
    def __truediv__(self, o): return self._bin("div", o)
    def __rtruediv__(self, o): return self._rbin("div", o)
    def __pow__(self, o): return self._bin("pow", o)
    def __rpow__(self, o): return self._rbin("pow", o)
    def __neg__(self): return Expr("neg", (self,))

    def __bool__(self):
        raise TypeError("a symbolic Expr has no truth value; use where(cond, a, b)")

    def __getattr__(self, name: str):
        if name in UNARY:
            return lambda: Expr(name, (self,))
        if name in BINARY:
            return lambda other: self._bin(name, other)
        raise AttributeError(name)

    def cast(self, dtype) -> Expr:
        return Expr("cast", (self,), dtype)

    def __repr__(self) -> str:
        return render_text(self)


def lift(value) -> Expr:
    if isinstance(value, Expr):
        return value
    if isinstance(value, Number):
        return Expr("const", (), value)
    raise TypeError(f"cannot use {type(value).__name__} in a scalar expression")


def where(cond, a, b) -> Expr:
    return Expr("where", (lift(cond), lift(a), lift(b)))


def inputs_of(expr: Expr) -> list[Expr]:
    return [n for n in toposort(expr) if n.op in ("input", "scalar")]


def toposort(root: Expr) -> list[Expr]:
    order, seen = [], set()

    def visit(node: Expr) -> None:
        if id(node) in seen:
            return
        seen.add(id(node))
        for s in node.srcs:
            visit(s)
        order.append(node)

    visit(root)
    return order


def render_text(expr: Expr) -> str:
    if expr.op == "input":
        return f"x{expr.arg}"
    if expr.op == "scalar":
        return str(expr.arg)
    if expr.op == "const":
        return repr(expr.arg)
    if expr.op == "cast":
        return f"{expr.arg.name}({render_text(expr.srcs[0])})"
    return f"{expr.op}({', '.join(render_text(s) for s in expr.srcs)})"


def substitute(expr: Expr, mapping: dict[int, Expr]) -> Expr:
    """Replace nodes (keyed by id) throughout an expression; used by fusion to splice producers in."""
    memo: dict[int, Expr] = {}

    def go(node: Expr) -> Expr:
        if id(node) in mapping:
            return mapping[id(node)]
        if id(node) in memo:
            return memo[id(node)]
        out = node if not node.srcs else Expr(node.op, tuple(go(s) for s in node.srcs), node.arg)
        memo[id(node)] = out
        return out

    return go(expr)

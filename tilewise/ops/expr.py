"""Scalar expressions: the meaning of every pointwise operator.

[Note: expressions] A pointwise operator is declared by a Python function over symbolic scalars, e.g.
``lambda x: x.maximum(0)`` for relu. Calling it once builds an ``Expr`` tree over a handful of primitive
scalar operations (``UNARY``, ``BINARY``, ``where``, ``fma``, ``cast``). That one tree is what the numpy backend
evaluates, what the C and CUDA renderers print, and what the fusing compiler splices together, so a
formula is written once. Nodes are hash-consed: building the same expression twice returns the same
object, so structural equality is identity and nodes are usable as cache keys.
"""

from __future__ import annotations

import math
import weakref
from numbers import Number

import numpy as np

from tilewise.dtypes import DType

# name -> arity; the primitive scalar vocabulary every renderer must cover
UNARY = (
    "neg", "abs", "sign", "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sqrt", "rsqrt",
    "reciprocal", "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "tanh", "erf", "erfinv",
    "floor", "ceil", "round", "trunc", "logical_not", "bitwise_not", "isnan", "isinf", "signbit",
    "asinh", "acosh", "atanh", "erfc", "lgamma",
)
BINARY = (
    "add", "sub", "mul", "div", "floordiv", "truncdiv", "mod", "fmod", "pow", "maximum", "minimum", "atan2",
    "eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_xor",
    "bitwise_and", "bitwise_or", "bitwise_xor", "lshift", "rshift", "copysign", "hypot", "nextafter",
)
# a * b + c rounded once (IEEE 754 fusedMultiplyAdd) where it computes in floating point: torch's kernels compute
# add and sub with an alpha, lerp and addcmul so (see [Note: fused multiply-add] in backends/cpu/fma.py); integers
# and bools multiply and add
TERNARY = ("fma",)
COMPARISONS = ("eq", "ne", "lt", "le", "gt", "ge", "isnan", "isinf", "signbit",
               "logical_not", "logical_and", "logical_or", "logical_xor")


class Expr:
    """An immutable, hash-consed scalar expression node.

    op is "input" (arg: position), "scalar" (arg: parameter name), "const" (arg: the value),
    a name from UNARY/BINARY/TERNARY, "where", or "cast" (arg: a DType).
    """

    __slots__ = ("op", "srcs", "arg", "__weakref__")
    _cache: weakref.WeakValueDictionary[tuple, Expr] = weakref.WeakValueDictionary()

    def __new__(cls, op: str, srcs: tuple[Expr, ...] = (), arg=None):
        # a zero constant is keyed by its sign too, or clamp(x, -0.0, 0.0) would read one bound twice
        kind = type(arg)
        key = (op, tuple(map(id, srcs)), kind, arg if kind in _OWN_KEYS else value_key(arg))
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


_OWN_KEYS = frozenset({type(None), int, bool, str, DType})  # arguments that are their own cache key


def value_key(value):
    """``value`` as a cache key: -0.0 == 0.0 and hashes alike, so a float (a numpy one too) carries its sign."""
    if type(value) is float or isinstance(value, np.floating):
        return (value, math.copysign(1.0, value) < 0)
    return value


def lift(value) -> Expr:
    if isinstance(value, Expr):
        return value
    if isinstance(value, Number):
        return Expr("const", (), value)
    raise TypeError(f"cannot use {type(value).__name__} in a scalar expression")


def where(cond, a, b) -> Expr:
    return Expr("where", (lift(cond), lift(a), lift(b)))


def fma(a, b, c) -> Expr:
    """``a * b + c`` with one rounding (see ``TERNARY``)."""
    return Expr("fma", (lift(a), lift(b), lift(c)))


def unit_product_dropped(node: Expr, is_one) -> Expr:
    """``node`` without a product by one that changes nothing (``add``'s ``alpha=1``): ``mul(x, 1)`` is ``x``,
    ``fma(x, 1, c)`` is ``c + x`` and ``fma(-x, 1, c)`` is ``c - x``, exactly (one rounding of an exact sum).
    ``is_one(operand, factor)`` says whether ``factor`` is a literal 1 that may go."""
    if node.op == "mul" and is_one(node.srcs[0], node.srcs[1]):
        return node.srcs[0]
    if node.op == "fma" and is_one(node.srcs[0], node.srcs[1]):
        x, c = node.srcs[0], node.srcs[2]
        return Expr("sub", (c, x.srcs[0])) if x.op == "neg" else Expr("add", (c, x))
    return node


def inputs_of(expr: Expr) -> list[Expr]:
    return [n for n in toposort(expr) if n.op in ("input", "scalar")]


def toposort(root: Expr, stop=()) -> list[Expr]:
    """Every node of ``root``, operands before their users; the operands of nodes whose id is in ``stop`` are
    not visited. Iterative (a fused chain of pointwise operators nests thousands of nodes deep): the path from
    the root keeps, for each node, where it is in its operands."""
    order, seen = [], {id(root)}
    path = [(root, iter(() if id(root) in stop else root.srcs))]
    while path:
        node, srcs = path[-1]
        for src in srcs:
            if id(src) not in seen:
                seen.add(id(src))
                if not src.srcs or id(src) in stop:  # a leaf, or a node not to enter: done as soon as reached
                    order.append(src)
                    continue
                path.append((src, iter(src.srcs)))
                break
        else:
            path.pop()
            order.append(node)
    return order


def rebuild(expr: Expr, make, stop=()) -> Expr:
    """``expr`` rebuilt bottom-up: ``make(node, operands)`` returns each node's replacement, given its operands'
    replacements (its own operands for nodes whose id is in ``stop``, which are not visited further)."""
    out: dict[int, Expr] = {}
    for node in toposort(expr, stop):
        out[id(node)] = make(node, node.srcs if id(node) in stop else tuple(out[id(s)] for s in node.srcs))
    return out[id(expr)]


def with_srcs(node: Expr, srcs: tuple[Expr, ...]) -> Expr:
    """``node`` over other operands (the node itself when they are its own)."""
    return node if all(a is b for a, b in zip(srcs, node.srcs)) else Expr(node.op, srcs, node.arg)


def render_text(expr: Expr, names: dict[int, str] | None = None) -> str:
    """``expr`` as nested calls, e.g. ``add(x0, 1.0)``, nodes whose id is in ``names`` written as those names;
    built from pieces, so a deep chain costs its length."""
    names = names or {}
    pieces: list[str] = []
    stack: list[Expr | str] = [expr]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            pieces.append(item)
        elif id(item) in names and item is not expr:
            pieces.append(names[id(item)])
        elif not item.srcs:
            pieces.append(_leaf_text(item))
        else:
            pieces.append(f"{item.arg.name if item.op == 'cast' else item.op}(")
            stack.append(")")
            for k in reversed(range(len(item.srcs))):
                stack.append(item.srcs[k])
                if k:
                    stack.append(", ")
    return "".join(pieces)


def render_shared(exprs: list[Expr], prefix: str = "v") -> tuple[list[tuple[str, str]], list[str]]:
    """``exprs`` as text with every subexpression they use more than once written once: (the named shared
    values as (name, text) in dependency order, the text of each expression). Written as trees, the
    expressions of a backward kernel repeat shared values so often that the text grows exponentially."""
    uses: dict[int, int] = {}
    order: list[Expr] = []
    for root in exprs:
        for node in toposort(root):
            if id(node) not in uses:
                uses[id(node)] = 0
                order.append(node)
        uses[id(root)] += 1
    for node in order:
        for src in node.srcs:
            uses[id(src)] += 1
    names: dict[int, str] = {}
    for node in order:
        if uses[id(node)] > 1 and not _is_simple(node):
            names[id(node)] = f"{prefix}{len(names)}"
    shared = [(names[id(n)], render_text(n, names)) for n in order if id(n) in names]
    return shared, [names.get(id(e)) or render_text(e, names) for e in exprs]


def _is_simple(node: Expr) -> bool:
    """A leaf, or a cast of one: as short to repeat as a name would be."""
    return not node.srcs or (node.op == "cast" and not node.srcs[0].srcs)


def _leaf_text(node: Expr) -> str:
    if node.op == "input":
        return f"x{node.arg}"
    if node.op == "scalar":
        return str(node.arg)
    if node.op == "const":
        return repr(node.arg)
    return f"{node.op}()"


def substitute(expr: Expr, mapping: dict[int, Expr]) -> Expr:
    """Replace nodes (keyed by id) throughout an expression; used by fusion to splice producers in."""
    def make(node: Expr, srcs: tuple[Expr, ...]) -> Expr:
        return mapping[id(node)] if id(node) in mapping else with_srcs(node, srcs)

    return rebuild(expr, make, stop=mapping)

"""Kernel IR: what one generated kernel computes, before any target decides how to run it.

[Note: kernel IR] A ``Kernel`` is a list of ``Nest``s over buffer parameters. A nest has an iteration
domain (a shape, some of whose dims are reduced) and three kinds of statements, all over that domain:
``Load``s (a buffer and a symbolic, affine ``Index``: offset + sum of stride * domain index), ``Reduce``s
(fold an expression over the reduced dims with a combiner, into an accumulator) and ``Store``s (write an
expression at an index). Expressions are the operators' own scalar ``Expr``s, spliced together: the
leaf ``input k`` is the nest's k-th load and ``scalar accJ`` the J-th accumulator. A reduction or store
whose expression reads accumulators belongs to a later *phase* (another loop over the reduced dims);
stores that do not vary along the reduced dims happen once per row, after the phases. Nothing here says
which loop is parallel, what is vectorised, or which thread does what: that is ``schedule``'s job, per
target, and rendering follows the schedule.

A load may be *guarded* (``Load.guard``): made only where one domain index lies in a range, and 0 elsewhere.
That is how a kernel reads a concatenation without it being written out: the result's element at ``p`` along
the joined dim is input ``k``'s element at ``p - start_k``, so input ``k`` is a load guarded by
``[start_k, end_k)`` whose offset is moved back by ``start_k`` strides, and a ``where`` over the position picks
the load whose range holds it (``compiler.lowering.lower``). Outside its range a guarded load's index may lie
outside its buffer; the guard keeps it from being read.

This module knows nothing of where a kernel comes from: the compiler lowers its fused groups into it
(``compiler.lowering.lower``), and the eager CUDA backend builds one per operator specialisation. A
kernel's ``values`` are the caller's handles for its parameters' buffers (graph values, for the compiler),
carried along untouched; ``Param.described`` is how the text form names each one.

[Note: symbolic sizes] A nest's sizes and an index's offset and strides are literals for the compiler (a
kernel per shape), or, for the eager CUDA backend (one kernel per specialisation, whatever the shape), the
name of one of the kernel's by-value ``Argument``s: ``size0``, ``stride_in1_0``. The schedule then decides
from what the kernel states statically (which dims are reduced, which accesses walk a dim with literal stride
1, the dtypes, the index width ``Kernel.index``) and leaves what depends on the values (the grid, a split's
factor) to the caller at launch; the renderer writes the names where it would write the numbers.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any

from tilewise.dtypes import DType
from tilewise.ops.expr import Expr, render_shared

COMBINER_OPS = {"add": "add", "mul": "mul", "max": "maximum", "min": "minimum", "or": "logical_or",
                "and": "logical_and"}
# an arg-reduction keeps the winning value in ``accJ`` and its position (row-major over the reduced dims, int64)
# in ``posJ``, which later statements read as the leaf ``scalar posJ``; NaN wins, and ties go to the first
ARG_COMBINERS = ("argmax", "argmin")


Size = int | str  # a literal, or the name of a by-value index argument (see [Note: symbolic sizes])


def known(*sizes: Size) -> bool:
    """Whether every one of ``sizes`` is a literal."""
    return all(type(s) is int for s in sizes)


def extent(sizes) -> Size:
    """The product of ``sizes``: a literal, or C code multiplying the symbolic ones (and the literals' product)."""
    number, names = 1, []
    for s in sizes:
        if type(s) is int:
            number *= s
        else:
            names.append(s)
    if not names:
        return number
    if number == 0:
        return 0
    return " * ".join(names + ([str(number)] if number != 1 else []))


class LoweringError(RuntimeError):
    """A fused group the kernel IR cannot express (a bug in fusion, reported with the offending node)."""


@dataclass(frozen=True)
class Index:
    """``offset + sum(stride * d[dim])`` over domain dims."""

    offset: Size
    terms: tuple[tuple[int, Size], ...]  # (domain dim, stride), each stride non-zero

    def dims(self) -> set[int]:
        return {d for d, _ in self.terms}

    def text(self, names=lambda d: f"d{d}") -> str:
        parts = [f"{names(d)}" if s == 1 else f"{s}*{names(d)}" for d, s in self.terms]
        if self.offset or not parts:
            parts.append(str(self.offset))
        text = " + ".join(parts)
        return text.replace(" + -", " - ") if type(self.offset) is int and self.offset < 0 and len(parts) > 1 else text


@dataclass(frozen=True)
class Load:
    param: int  # -1 for an ``iota``
    index: Index
    dtype: DType  # the buffer's storage dtype
    # (start, step): no buffer is read, element k of the virtual buffer is ``start + step * k`` (an integer
    # ``arange`` read by the nest: a one-hot compare reads positions, not a buffer of them)
    iota: tuple[int, int] | None = None
    # (domain dim, lo, hi): read only where ``lo <= d[dim] < hi``, 0 elsewhere (see the module note)
    guard: tuple[int, int, int] | None = None

    def dims(self) -> set[int]:
        """The domain dims the loaded value varies along: those its index walks, and its guard's."""
        return self.index.dims() | ({self.guard[0]} if self.guard is not None else set())

    def guard_code(self, names=lambda d: f"d{d}") -> str:
        """C code of the guard's condition, the domain index named by ``names``."""
        dim, lo, hi = self.guard
        at = names(dim)
        return f"{at} < {hi}" if lo == 0 else f"{at} >= {lo} && {at} < {hi}"

    def iota_code(self, where: str) -> str:
        """C code of an iota's element at position ``where``."""
        start, step = self.iota
        scaled = f"({where})" if step == 1 else f"{step} * ({where})"
        return scaled if start == 0 else f"{start} + {scaled}"


@dataclass(frozen=True)
class Reduce:
    combiner: str
    value: Expr
    dtype: DType  # the accumulator's dtype
    phase: int
    # a sum of ``exp(a - accM)`` folded in the pass that finds the maximum ``accM`` (``online_softmax`` in
    # ``schedule``): the value reads accM's running value, and the sum is rescaled whenever accM grows
    rescale: int | None = None


@dataclass(frozen=True)
class Store:
    param: int
    index: Index
    value: Expr
    dtype: DType
    phase: int | None  # None: once per row, after the phases
    saturate: bool = False  # a float8 e5m2 store clamps to the finite range (torch's saturating casts)


@dataclass
class Nest:
    shape: tuple[Size, ...]
    reduce: tuple[int, ...]
    loads: list[Load] = field(default_factory=list)
    reductions: list[Reduce] = field(default_factory=list)
    stores: list[Store] = field(default_factory=list)

    @property
    def phases(self) -> int:
        used = [r.phase for r in self.reductions] + [s.phase for s in self.stores if s.phase is not None]
        return max(used, default=-1) + 1

    @property
    def outer(self) -> tuple[int, ...]:
        return tuple(d for d in range(len(self.shape)) if d not in self.reduce)


@dataclass(frozen=True)
class Param:
    name: str
    dtype: DType
    read: bool
    written: bool
    described: str = ""  # the buffer's type as the text form shows it (``f32[64, 128]``)


@dataclass(frozen=True)
class Argument:
    """A by-value parameter: a scalar the expressions read as the leaf ``scalar <name>`` (``dtype``), or a
    size, stride or offset of the domain (``dtype`` None: the kernel's index type)."""

    name: str
    dtype: DType | None = None


@dataclass
class Kernel:
    name: str
    params: list[Param]
    nests: list[Nest]
    values: list[Any] = field(default_factory=list)  # the caller's handle for each parameter's buffer
    arguments: list[Argument] = field(default_factory=list)  # by-value parameters, after the buffers
    index: str | None = None  # C type of index arithmetic when sizes are symbolic (else worked out from them)

    def __str__(self) -> str:
        return format_kernel(self)

    def statements(self) -> int:
        """How many loads, reductions and stores the kernel's nests make: what its text and its compile grow with."""
        return sum(len(n.loads) + len(n.reductions) + len(n.stores) for n in self.nests)

    def structure(self) -> tuple:
        """Everything the kernel computes, hashable, without its name and its values' handles: kernels of equal
        structure differ only in their name (a transformer's layers make the same kernels once per layer)."""
        return (structure(self.params), structure(self.nests), structure(self.arguments), self.index)


_FIELDS: dict[type, tuple[str, ...]] = {}


def structure(value: Any) -> Any:
    """A hashable image of ``value`` that is equal for equal values: lists and tuples as tuples, dicts as tuples of
    items, a mutable dataclass as its type and fields; frozen dataclasses, expressions (hash-consed, so equal
    trees are one object) and plain values as they are."""
    kind = type(value)
    if kind is list or kind is tuple:
        return tuple(map(structure, value))
    if kind is dict:
        return tuple((k, structure(v)) for k, v in value.items())
    if kind is set:
        return frozenset(value)
    if is_dataclass(value) and not kind.__dataclass_params__.frozen:
        names = _FIELDS.get(kind)
        if names is None:
            names = _FIELDS[kind] = tuple(f.name for f in fields(kind))
        return (kind, *(structure(getattr(value, name)) for name in names))
    return value


# ---------------------------------------------------------------------------- text form

def format_kernel(kernel: Kernel) -> str:
    params = ", ".join(f"{p.name}: {p.described or p.dtype.name}{' (read)' if p.read and p.written else ''}"
                       for p in kernel.params)
    params += "".join(f", {a.name}: {a.dtype.name if a.dtype else 'index'}" for a in kernel.arguments)
    lines = [f"kernel {kernel.name}({params})"]
    for k, nest in enumerate(kernel.nests):
        lines.append(f"  nest {k} over {list(nest.shape)}, reducing dims {list(nest.reduce)}, {nest.phases} phase(s)")
        for j, load in enumerate(nest.loads):
            guard = f" where {load.guard_code()}, else 0" if load.guard is not None else ""
            if load.iota is not None:
                lines.append(f"    x{j} = {load.iota_code(load.index.text())}  (arange, {load.dtype.name}){guard}")
                continue
            lines.append(f"    x{j} = {kernel.params[load.param].name}[{load.index.text()}]{guard}")
        shared, texts = render_shared([r.value for r in nest.reductions] + [st.value for st in nest.stores])
        lines += [f"    {name} = {text}" for name, text in shared]
        for j, (red, text) in enumerate(zip(nest.reductions, texts)):
            online = f", rescaled as acc{red.rescale} grows" if red.rescale is not None else ""
            lines.append(f"    phase {red.phase}: acc{j} = {red.combiner}(acc{j}, {text}){online}")
        for st, text in zip(nest.stores, texts[len(nest.reductions):]):
            when = f"phase {st.phase}" if st.phase is not None else "per row"
            lines.append(f"    {when}: {kernel.params[st.param].name}[{st.index.text()}] = {text}")
    return "\n".join(lines)


def cast(expr: Expr, dtype: DType) -> Expr:
    """``expr`` converted to ``dtype``; a value already cast to it is not cast again."""
    if expr.op == "cast" and expr.arg is dtype:
        return expr
    return Expr("cast", (expr,), dtype)

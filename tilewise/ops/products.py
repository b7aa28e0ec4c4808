"""Products of tensors that are not one GEMM: ``einsum`` and ``cross``.

[Note: einsum] ``einsum`` parses its equation into per-operand labels, takes repeated labels as diagonals,
sums labels nobody needs any more as early as possible and contracts operands pairwise with ``bmm``; ``cross``
is the 3-vector cross product along a dim, composed of pointwise products. Both are composites, so their
gradients, autocast and every backend come from the primitives they use.
"""

from __future__ import annotations

from math import prod

from tilewise import strides as S
from tilewise.dtypes import c10_name
from tilewise.ops.movement import _stack, composite
from tilewise.tensor import Tensor


def _cross(self, other, dim=None):
    shape = S.broadcast_shapes(self.shape, other.shape, op="cross")
    if dim is None:
        d = next((k for k, n in enumerate(shape) if n == 3), None)
        if d is None:
            raise RuntimeError(f"cross(): no dimension of size 3 in the broadcast shape {list(shape)}")
    else:
        d = S.normalize_dim(dim, len(shape), "cross")
        if shape[d] != 3:
            raise RuntimeError(f"cross(): dimension {dim} must have length 3, got shapes {list(self.shape)} and "
                               f"{list(other.shape)}")
    if self.dtype is not other.dtype:  # torch's kernel converts neither (CUDA autocast promotes them to one first)
        raise RuntimeError(f"expected scalar type {c10_name(self.dtype)} but found {c10_name(other.dtype)} (cross: "
                           f"both operands must have one dtype; convert one with .to())")
    a0, a1, a2 = self.expand(shape).unbind(d)
    b0, b1, b2 = other.expand(shape).unbind(d)
    return _stack([a1 * b2 - a2 * b1, a2 * b0 - a0 * b2, a0 * b1 - a1 * b0], d)


composite("cross(Tensor self, Tensor other, int? dim=None) -> Tensor", _cross, autocast={"cuda": "promote"},
          doc="Cross product of 3-vectors along ``dim`` (the first dim of size 3 when None).")


# ---------------------------------------------------------------- einsum

_ELLIPSIS = "..."


def _einsum_error(message: str) -> RuntimeError:
    return RuntimeError(f"einsum(): {message}")


def _check_equation_characters(equation: str) -> None:
    for k, ch in enumerate(equation):
        if not (ch.isascii() and ch.isalpha()) and ch not in " ,.->":
            raise _einsum_error(f"invalid subscript given at index {k} in the equation string, subscripts must be in "
                                "[a-zA-Z]")
    if equation.count("->") > 1 or equation.replace("->", "").count(">") or equation.replace("->", "").count("-"):
        raise _einsum_error(f"the equation {equation!r} must contain '->' at most once, and '-' and '>' only there")


def _split_term(term: str, what: str) -> list[str]:
    """A term's subscripts, with one ``...`` entry where the ellipsis stands."""
    if term.count(_ELLIPSIS) > 1 or term.replace(_ELLIPSIS, "").count("."):
        raise _einsum_error(f"found '.' for {what} that is not part of any ellipsis ('...' may appear once)")
    head, found, tail = term.partition(_ELLIPSIS)
    return list(head) + ([_ELLIPSIS] if found else []) + list(tail)


def _expand_ellipsis(subscripts: list[str], ndim: int, width: int) -> list:
    """Replace ``...`` by integer labels for the trailing ellipsis dims, right-aligned to ``width`` dims."""
    if _ELLIPSIS not in subscripts:
        return subscripts
    k = subscripts.index(_ELLIPSIS)
    count = ndim - (len(subscripts) - 1)
    return subscripts[:k] + list(range(width - count, width)) + subscripts[k + 1:]


def _parse_einsum(equation: str, operands: tuple) -> tuple[list[list], list]:
    """Per-operand labels and output labels; letters are labels, integers label the ellipsis dims."""
    _check_equation_characters(equation)
    lhs, arrow, rhs = equation.replace(" ", "").partition("->")
    terms = [_split_term(t, f"operand {k}") for k, t in enumerate(lhs.split(","))]
    if len(terms) > len(operands):
        raise _einsum_error(f"fewer operands were provided than specified in the equation ({len(operands)} given, "
                            f"{len(terms)} in {equation!r})")
    if len(terms) < len(operands):
        raise _einsum_error(f"more operands were provided than specified in the equation ({len(operands)} given, "
                            f"{len(terms)} in {equation!r})")
    width = 0
    for k, (subs, t) in enumerate(zip(terms, operands)):
        letters = len(subs) - (_ELLIPSIS in subs)
        if _ELLIPSIS not in subs and letters != t.ndim:
            raise _einsum_error(f"the number of subscripts in the equation ({letters}) does not match the number of "
                                f"dimensions ({t.ndim}) for operand {k} and no ellipsis was given")
        if letters > t.ndim:
            raise _einsum_error(f"the number of subscripts in the equation ({letters}) is more than the number of "
                                f"dimensions ({t.ndim}) for operand {k}")
        width = max(width, t.ndim - letters if _ELLIPSIS in subs else 0)
    inputs = [_expand_ellipsis(subs, t.ndim, width) for subs, t in zip(terms, operands)]
    return inputs, _einsum_output(rhs if arrow else None, terms, width)


def _einsum_output(rhs: str | None, terms: list[list[str]], width: int) -> list:
    letters = [s for subs in terms for s in subs if s != _ELLIPSIS]
    if rhs is None:
        return list(range(width)) + sorted(s for s in set(letters) if letters.count(s) == 1)
    output = _split_term(rhs, "the output")
    for s in output:
        if s != _ELLIPSIS and output.count(s) > 1:
            raise _einsum_error(f"output subscript {s} appears more than once in the output")
        if s != _ELLIPSIS and s not in letters:
            raise _einsum_error(f"output subscript {s} does not appear in the equation for any input operand")
    k = output.index(_ELLIPSIS) if _ELLIPSIS in output else None
    return output if k is None else output[:k] + list(range(width)) + output[k + 1:]


def _take_diagonals(t: Tensor, labels: list, k: int) -> tuple[Tensor, list]:
    """A label repeated within one operand selects its diagonal (moved to the last dim)."""
    while True:
        repeated = next((label for label in labels if labels.count(label) > 1), None)
        if repeated is None:
            return t, labels
        i = labels.index(repeated)
        j = labels.index(repeated, i + 1)
        if t.shape[i] != t.shape[j]:
            raise _einsum_error(f"subscript {repeated} is repeated for operand {k} but the sizes don't match, "
                                f"{t.shape[j]} != {t.shape[i]}")
        t = t.diagonal(0, i, j)
        labels = [label for m, label in enumerate(labels) if m not in (i, j)] + [repeated]


def _check_label_sizes(operands: list[tuple[Tensor, list]]) -> None:
    seen: dict = {}
    for k, (t, labels) in enumerate(operands):
        for label, size in zip(labels, t.shape):
            known = seen.setdefault(label, size)
            if size != known and 1 not in (size, known):
                name = label if isinstance(label, str) else f"... (ellipsis dim {label})"
                raise _einsum_error(f"subscript {name} has size {size} for operand {k} which does not broadcast with "
                                    f"previously seen size {known}")
            if known == 1:
                seen[label] = size


def _sum_out(t: Tensor, labels: list, keep: set) -> tuple[Tensor, list]:
    dims = [k for k, label in enumerate(labels) if label not in keep]
    if not dims:
        return t, labels
    return t.sum(dims), [label for label in labels if label in keep]


def _aligned(t: Tensor, labels: list, order: list) -> Tensor:
    """``t`` with its dims in ``order``'s order and a size-1 dim for each label of ``order`` it lacks."""
    t = t.permute([labels.index(label) for label in order if label in labels])
    for k, label in enumerate(order):
        if label not in labels:
            t = t.unsqueeze(k)
    return t


def _contract(a: Tensor, la: list, b: Tensor, lb: list, later: set) -> tuple[Tensor, list]:
    """Multiply two operands and sum the labels they share that nothing later needs, as one bmm."""
    a, la = _sum_out(a, la, later | set(lb))
    b, lb = _sum_out(b, lb, later | set(la))
    summed = [label for label in la if label in lb and label not in later]
    for label in summed:  # a broadcast (size-1) summed dim: sum the other side over it first
        i, j = la.index(label), lb.index(label)
        if a.shape[i] == 1 and b.shape[j] != 1:
            b = b.sum(j, keepdim=True)
        elif b.shape[j] == 1 and a.shape[i] != 1:
            a = a.sum(i, keepdim=True)
    batch = [label for label in la if label in lb and label in later]
    a_only = [label for label in la if label not in lb]
    b_only = [label for label in lb if label not in la]
    if not summed:  # torch multiplies (promoting the dtypes) where nothing is summed, and calls bmm otherwise
        order = batch + a_only + b_only
        return _aligned(a, la, order) * _aligned(b, lb, order), order

    def size(label):
        return max(a.shape[la.index(label)] if label in la else 1, b.shape[lb.index(label)] if label in lb else 1)

    def arrange(t, labels, order):
        t = t.permute([labels.index(label) for label in order])
        return t.expand([size(label) for label in order])

    batch_sizes, m, n = [size(x) for x in batch], prod(map(size, a_only)), prod(map(size, b_only))
    k = prod(map(size, summed))
    left = arrange(a, la, batch + a_only + summed).reshape(prod(batch_sizes), m, k)
    right = arrange(b, lb, batch + summed + b_only).reshape(prod(batch_sizes), k, n)
    out = left.bmm(right).reshape(batch_sizes + [size(x) for x in a_only] + [size(x) for x in b_only])
    return out, batch + a_only + b_only


def _einsum(equation, tensors, path=None):
    tensors = tuple(tensors)
    for k, t in enumerate(tensors):
        if not isinstance(t, Tensor):
            raise TypeError(f"einsum(): operand {k} must be a Tensor, got {type(t).__name__}")
    inputs, output = _parse_einsum(equation, tensors)
    operands = [_take_diagonals(t, labels, k) for k, (t, labels) in enumerate(zip(tensors, inputs))]
    _check_label_sizes(operands)
    while len(operands) > 1:
        (a, la), (b, lb) = operands[:2]
        later = set(output).union(*(labels for _, labels in operands[2:]))
        operands = [_contract(a, la, b, lb, later)] + operands[2:]
    t, labels = _sum_out(*operands[0], set(output))
    return t.permute([labels.index(label) for label in output])


def _einsum_autocast_on_cpu(op, args) -> str | None:
    """torch's einsum multiplies two operands with bmm, which its CPU autocast list lowers, only where an index of
    size above 1 in both is summed away; one operand, outer, element-wise and broadcast products run as mul and sum,
    in the given dtypes."""
    equation, tensors = args[0].replace(" ", ""), args[1]
    if len(tensors) < 2:
        return None
    lhs, arrow, out = equation.partition("->")
    terms = lhs.split(",")
    if not arrow:  # implicit output: the indices written once
        out = "".join(c for c in lhs if c.isalpha() and lhs.count(c) == 1)
    wide: dict[str, int] = {}  # summed index -> how many operands hold it with a size above 1
    for term, t in zip(terms, tensors):
        before, _, after = term.partition("...")
        sizes = {**dict(zip(before, t.shape)), **dict(zip(after, t.shape[t.ndim - len(after):] if after else ()))}
        for c, size in sizes.items():
            if c not in out and size > 1:
                wide[c] = wide.get(c, 0) + 1
    return "lower" if any(n > 1 for n in wide.values()) else None


def _sublist_subscript(n) -> str:
    if n is Ellipsis:
        return "..."
    if 0 <= n < 26:
        return chr(ord("A") + n)
    if 26 <= n < 52:
        return chr(ord("a") + n - 26)
    raise ValueError("einsum(): subscript in subscript list is not within the valid range [0, 52)")


def _einsum_sublists(args: tuple) -> tuple:
    """torch.einsum's sublist format, ``einsum(a, [0, 1], b, [1, 2], [0, 2])`` (operands, each followed by its
    subscripts as ints in [0, 52) or Ellipsis, then optionally the output's), as the equation string format."""
    if not args or not isinstance(args[0], Tensor):
        return args
    if len(args) < 2:
        raise ValueError("einsum(): must specify the equation string and at least one operand, or at least one "
                         "operand and its subscripts list")
    equation = ",".join("".join(_sublist_subscript(s) for s in sub) for sub in args[1::2])
    if len(args) % 2 == 1:
        return (equation + "->" + "".join(_sublist_subscript(s) for s in args[-1]), *args[:-1:2])
    return (equation, *args[::2])


composite("einsum(str equation, Tensor[] tensors, *, int[]? path=None) -> Tensor", _einsum, method=False,
          varargs=True, python_spelling=_einsum_sublists, autocast={"cuda": "lower", "cpu": _einsum_autocast_on_cpu},
          doc="Einstein summation: ``einsum('bij,bjk->bik', a, b)``. Supports ``...``, repeated subscripts "
              "(diagonals), implicit output and broadcasting of size-1 dims.\n\n"
              ">>> tw.einsum('ij,j->i', tw.ones(2, 3), tw.ones(3))\ntensor([3., 3.])", out=False)

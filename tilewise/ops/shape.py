"""Shape composites: everything that reshapes or splits by composing the view primitives (and a copy
when strides forbid a view, as torch's reshape does)."""

from __future__ import annotations

from tilewise import strides as S
from tilewise.layouts import contiguous_format, preserve_format
from tilewise.ops.inplace import mark_multi_output_views
from tilewise.ops.registry import OPS, declare


def composite(schema: str, decomposition, grad: dict | None = None, **attrs):
    return declare(schema, "composite", decomposition=decomposition, grad=grad, **attrs)


def _reshape(self, shape):
    shape = S.infer_size(shape, self.numel(), "reshape")
    if S.view_strides(self._shape, self._strides, shape) is not None:
        return self.view(shape)
    out = self.clone(memory_format=contiguous_format).view(shape)
    out._base = None  # the copy is private: like torch's _unsafe_view, the result is no view of anything
    return out


def _contiguous(self, memory_format=None):
    if memory_format is None or memory_format is contiguous_format:
        return self if self.is_contiguous() else self.clone(memory_format=contiguous_format)
    if self.is_contiguous(memory_format):
        return self
    if memory_format is preserve_format:
        raise RuntimeError("preserve memory format is unsupported by the contiguous operator")
    return self.clone(memory_format=memory_format)


def _flatten(self, start_dim=0, end_dim=-1):
    if self.ndim == 0:
        return self.reshape(1)
    s, e = S.normalize_dim(start_dim, self.ndim, "flatten"), S.normalize_dim(end_dim, self.ndim, "flatten")
    if s > e:
        raise RuntimeError(f"flatten() has invalid args: start_dim {start_dim} cannot come after end_dim {end_dim}")
    if s == e:
        return self
    shape = self.shape
    return self.reshape(shape[:s] + (S.numel(shape[s:e + 1]),) + shape[e + 1:])


def _unflatten(self, dim, sizes):
    d = S.normalize_dim(dim, self.ndim, "unflatten")
    sizes = S.infer_size(sizes, self.shape[d], "unflatten")
    return self.view(self.shape[:d] + tuple(sizes) + self.shape[d + 1:])


def _movedim(self, source, destination):
    src = [S.normalize_dim(d, self.ndim, "movedim") for d in source]
    dst = [S.normalize_dim(d, self.ndim, "movedim") for d in destination]
    if len(src) != len(dst):
        raise RuntimeError(f"movedim: Invalid source or destination dims: source ({list(source)} dims) should "
                           f"contain the same number of dims as destination ({list(destination)} dims)")
    order = [None] * self.ndim
    for s, d in zip(src, dst):
        order[d] = s
    rest = iter(k for k in range(self.ndim) if k not in src)
    return self.permute([o if o is not None else next(rest) for o in order])


def _split(self, split_size_or_sections, dim=0):
    d = S.normalize_dim(dim, self.ndim, "split")
    n = self.shape[d]
    if len(split_size_or_sections) == 1:
        step = split_size_or_sections[0]
        if step <= 0 and n:
            raise RuntimeError(f"split expects split_size be positive, but got split_size={step}")
        sizes = [min(step, n - start) for start in range(0, n, step)] if n else [0]
    else:
        return _split_with_sizes(self, split_size_or_sections, dim)
    return _narrowed(self, d, sizes, "Split")


def _split_with_sizes(self, split_sizes, dim=0):
    d = S.normalize_dim(dim, self.ndim, "split_with_sizes")
    sizes, n = list(split_sizes), self.shape[d]
    if any(size < 0 for size in sizes):
        raise RuntimeError(f"split_with_sizes expects split_sizes have only non-negative entries, but got "
                           f"split_sizes={sizes}")
    if sum(sizes) != n:
        raise RuntimeError(f"split_with_sizes expects split_sizes to sum exactly to {n} (input tensor's size at "
                           f"dimension {d}), but got split_sizes={sizes}")
    return _narrowed(self, d, sizes, "SplitWithSizes")


def _narrowed(self, d: int, sizes, name: str) -> tuple:
    out, start = [], 0
    for size in sizes:
        out.append(self.narrow(d, start, size))
        start += size
    return mark_multi_output_views(tuple(out), name)


def _chunk(self, chunks, dim=0):
    if chunks <= 0:
        raise RuntimeError(f"chunk expects `chunks` to be greater than 0, got: {chunks}")
    n = self.shape[S.normalize_dim(dim, self.ndim, "chunk")]
    step = max(-(-n // chunks), 1)
    return _split(self, [step], dim)


def _narrow(self, dim, start, length):
    d = S.normalize_dim(dim, self.ndim, "narrow")
    n = self.shape[d]
    start = start + n if start < 0 else start
    if start < 0 or length < 0 or start + length > n:
        raise IndexError(f"narrow(): start ({start}) + length ({length}) exceeds dimension size ({n}) of dim {d}")
    return OPS["slice"](self, d, start, start + length)


def _unbind(self, dim=0):
    d = S.normalize_dim(dim, self.ndim, "unbind")
    return mark_multi_output_views(tuple(self.select(d, i) for i in range(self.shape[d])), "Unbind")


def _squeeze_dims(self, dim):
    return self.squeeze(dim)


composite("reshape(Tensor(a) self, int[] shape) -> Tensor(a)", _reshape)
composite("contiguous(Tensor(a) self, *, MemoryFormat? memory_format=None) -> Tensor(a)", _contiguous)
composite("flatten(Tensor(a) self, int start_dim=0, int end_dim=-1) -> Tensor(a)", _flatten)
composite("unflatten(Tensor(a) self, int dim, int[] sizes) -> Tensor(a)", _unflatten)
composite("movedim(Tensor(a) self, int[] source, int[] destination) -> Tensor(a)", _movedim, aliases=("moveaxis",))
composite("split(Tensor(a) self, int[] split_size_or_sections, int dim=0) -> Tensor[]", _split)
composite("split_with_sizes(Tensor(a) self, int[] split_sizes, int dim=0) -> Tensor[]", _split_with_sizes)
composite("chunk(Tensor(a) self, int chunks, int dim=0) -> Tensor[]", _chunk)
composite("narrow(Tensor(a) self, int dim, int start, int length) -> Tensor(a)", _narrow)
composite("unbind(Tensor(a) self, int dim=0) -> Tensor[]", _unbind)
composite("view_as(Tensor(a) self, Tensor other) -> Tensor(a)", lambda self, other: self.view(other.shape),
          function=False)
composite("reshape_as(Tensor(a) self, Tensor other) -> Tensor(a)", lambda self, other: self.reshape(other.shape),
          function=False)
composite("expand_as(Tensor(a) self, Tensor other) -> Tensor(a)", lambda self, other: self.expand(other.shape),
          function=False)
composite("broadcast_to(Tensor(a) self, int[] size) -> Tensor(a)", lambda self, size: self.expand(size))
composite("ravel(Tensor(a) self) -> Tensor(a)", lambda self: self.reshape(-1))


def _sum_to_size(self, size):
    size = tuple(size)
    if self._shape == size:
        return self
    if len(size) > self.ndim:
        raise RuntimeError(f"sum_to_size: size {list(size)} is not expandable to size {list(self._shape)} (the "
                           "size has more dims than the tensor)")
    leading, kept = S.sum_to_dims(self._shape, size)
    out = self
    if kept:
        out = out.sum(kept, keepdim=True)
    if leading:
        out = out.sum(leading)
    if out._shape != size:
        raise RuntimeError(f"sum_to_size: size {list(size)} is not expandable to size {list(self._shape)}")
    return out


composite("sum_to_size(Tensor self, int[] size) -> Tensor", _sum_to_size, function=False)

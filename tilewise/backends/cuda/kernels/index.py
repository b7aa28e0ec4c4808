"""Indexing on CUDA: gather, scatter, scatter_add, advanced indexing (index, index_put), view scatters.

[Note: indexed kernels]
All of these walk an iteration space of rank R (the result of ``x[indices]``, or the index tensor of
gather/scatter) and address the indexed tensor at

    off(c) = sum_d c[d] * a[d]  +  sum_k wrap_k(idx_k[sum_d c[d] * b_k[d]]) * s_k

where ``a`` are the indexed tensor's strides for the dims that are not indexed (0 elsewhere), ``idx_k``
the index tensors with their strides ``b_k`` broadcast over the iteration space, ``s_k`` the stride of the
dim ``idx_k`` indexes and ``wrap_k`` adds that dim's size to a negative index (where the operator counts
negative indices from the end). One kernel generator, with three modes, serves every operator: *take*
(``out[i] = x[off]``: index, gather), *put* (``x[off] = v``: index_put, scatter) and *add*
(``atomicAdd(x + off, v)``: accumulating index_put, scatter_add); the value ``v`` is read with its own
strides over the iteration space.

Every index is bounds-checked on the device, after wrapping where the operator counts negative indices from
the end (``index``, ``index_put``; not ``gather``/``scatter``, nor a composite such as ``index_select`` that
runs under ``_index_errors_named(..., negative_wraps=False)``): a thread that meets a bad index skips its
access and reports it in the device's error record, which the host reads at the next synchronisation (see
[Note: device-side bounds checks] in ``runtime/bounds.py``). The check is a compare and a predicted branch
per index; its parameters are the record's address, the launch's site number and whether negatives wrap.
"""

from __future__ import annotations

from tilewise import dtypes
from tilewise import strides as S
from tilewise.backends import flags
from tilewise.backends.cuda.device_memory import data_ptr, empty, stream_handle
from tilewise.backends.cuda.kernels import ceil_div, kernel, kernel_into, launch, load_rendered
from tilewise.backends.cuda.kernels.copy import cast, contiguous, copy_into
from tilewise.backends.cuda.kernels.creation import fill
from tilewise.backends.cuda.runtime.bounds import REPORT_C, note_site, record_pointer
from tilewise.backends.cuda.runtime.device import ensure_context
from tilewise.codegen.render import CUDA
from tilewise.codegen.render.cstyle import SUFFIX, Source
from tilewise.device import Device
from tilewise.dtypes import DType
from tilewise.ops.indexing import check_gather_shapes, mask_positions
from tilewise.ops.movement import INDEX_NAMING
from tilewise.tensor import Tensor

_BLOCK = 256
TAKE, PUT, ADD = "take", "put", "add"
_ATOMIC = {"float32", "float64", "float16", "bfloat16", "int32", "int64"}


def render_indexed(mode: str, dtype: DType, n_index: int, rank: int, idx: str = "long long") -> tuple[str, str]:
    """(name, CUDA source) of one indexed kernel. ``idx``: the C type of positions and offsets ("int" when
    every offset fits: 64-bit division per dim costs more than the memory access)."""
    source = Source(CUDA)
    source.need_storage(dtype)
    if n_index:
        source.helpers["tw_index_out_of_bounds"] = REPORT_C
    c = CUDA.ctype(dtype)
    name = f"tw_index_{mode}_{SUFFIX[dtype.name]}_k{n_index}_r{rank}" + ("_i32" if idx == "int" else "")
    params = [f"{c}* __restrict__ x", f"{'const ' if mode != TAKE else ''}{c}* __restrict__ v",
              *(f"const long long* __restrict__ idx{k}" for k in range(n_index)), f"{idx} n",
              *(f"{idx} size{d}" for d in range(rank)), *(f"{idx} a{d}" for d in range(rank)),
              *(f"{idx} v{d}" for d in range(rank)),
              *(f"{idx} b{k}_{d}" for k in range(n_index) for d in range(rank)),
              *(f"{idx} s{k}, {idx} dim{k}" for k in range(n_index))]
    if n_index:
        params += ["long long* __restrict__ record", "long long site", "int wrap"]
    lines = [f"const {idx} i = ({idx})blockIdx.x * blockDim.x + threadIdx.x;", "if (i >= n) return;",
             f"{idx} rem = i, off = 0, voff = 0;", *(f"{idx} ioff{k} = 0;" for k in range(n_index))]
    for d in range(rank - 1, -1, -1):
        coord = "rem" if d == 0 else f"rem % size{d}"
        adds = "".join(f" ioff{k} += cd * b{k}_{d};" for k in range(n_index))
        lines.append(f"{{ const {idx} cd = {coord}; off += cd * a{d}; voff += cd * v{d};{adds}"
                     + (f" rem /= size{d}; }}" if d else " }"))
    for k in range(n_index):
        lines += [f"{{ const long long j = idx{k}[ioff{k}], w = j < 0 && wrap ? j + dim{k} : j;",
                  f"  if ((unsigned long long)w >= (unsigned long long)dim{k}) "
                  f"{{ tw_index_out_of_bounds(record, site, {k}, j, dim{k}); return; }}",
                  f"  off += ({idx})w * s{k}; }}"]
    if mode == TAKE:
        lines.append("v[i] = x[off];")
    elif mode == PUT:
        lines.append("x[off] = v[voff];")
    else:
        target = "(unsigned long long*)(x + off)" if dtype is dtypes.int64 else "x + off"
        value = "(unsigned long long)v[voff]" if dtype is dtypes.int64 else "v[voff]"
        lines.append(f"atomicAdd({target}, {value});")
    text = (f'extern "C" __global__ void {name}({", ".join(params)}) {{\n'
            + "\n".join("    " + ln for ln in lines) + "\n}")
    return name, source.text(text)


def indexed(mode: str, x: Tensor, v: Tensor, shape: tuple, a: tuple, v_strides: tuple,
            indices: list[tuple[Tensor, tuple, int, int]], site: tuple | None = None) -> None:
    """Run one indexed kernel over ``shape``. ``indices``: (int64 index tensor, its strides over ``shape``,
    stride of the indexed dim in ``x``, size of that dim). ``site`` (from :func:`_site`, needed when there
    are indices) says how a bad index is reported and whether negative indices wrap."""
    n = S.numel(shape)
    if n == 0:
        return
    rank = max(len(shape), 1)

    def padded(strides) -> tuple:
        return tuple(strides) if strides else (0,) * rank

    small = max(n, x._storage.numel, v._storage.numel, *(t._storage.numel for t, _, _, _ in indices)) < 2**31 - 1
    fn = load_rendered(render_indexed, mode, x._dtype, len(indices), rank, "int" if small else "long long",
                       device=x._device.index)
    args = [data_ptr(x), data_ptr(v), *(data_ptr(t) for t, _, _, _ in indices), n, *(tuple(shape) or (1,)),
            *padded(a), *padded(v_strides)]
    for _, strides, _, _ in indices:
        args += padded(strides)
    for _, _, stride, size in indices:
        args += [stride, size]
    if indices:
        op, dims, indexed_shape, wraps, error = site
        record = record_pointer(ensure_context(x._device.index))
        args += [record, note_site(op, dims, indexed_shape, wraps, error), int(wraps)]
    launch(fn, ceil_div(n, _BLOCK), _BLOCK, args, stream_handle(x._device.index))


def _site(op: str, dims: tuple, shape: tuple, negative_wraps: bool,
          error: type[Exception] = IndexError) -> tuple[str, tuple, tuple, bool, type[Exception]]:
    """How a launch names its bounds errors: under the composite that runs it, if one does (``index_select``,
    ``embedding``, ...), which may also forbid negative indices; else as the primitive ``op``. The exception is
    the primitive's, whatever the name (torch's gather and scatter raise RuntimeError, advanced indexing
    IndexError)."""
    if INDEX_NAMING.op is not None:
        return f"{INDEX_NAMING.op}()", dims, shape, negative_wraps and INDEX_NAMING.negative_wraps, error
    return op, dims, shape, negative_wraps, error


def _long(index: Tensor) -> Tensor:
    return index if index._dtype is dtypes.int64 else cast(index, dtypes.int64)


def _check_atomic(dtype: DType, op: str) -> None:
    if dtype.name not in _ATOMIC:
        raise NotImplementedError(f"{op} with accumulation on CUDA supports {sorted(_ATOMIC)}, got {dtype.name}")


def _alert_atomic(dtype: DType, op: str) -> None:
    """Floating-point atomic adds sum in the order threads arrive, which varies from run to run: deterministic mode
    refuses them (see [Note: backend flags]). Integer atomic adds are exact in any order, so they pass."""
    if dtype.is_floating_point:
        flags.alert_not_deterministic(f"{op} on CUDA (it accumulates with floating-point atomics)")


# ---------------------------------------------------------------------------------------------- gather/scatter

def _check_index(self: Tensor, dim: int, index: Tensor, op: str, src: Tensor | None = None) -> int:
    """torch's checks of gather and scatter (``src``: a scatter's source tensor, None for a number)."""
    return check_gather_shapes(self, dim, index, op, src)


def _along(self: Tensor, d: int) -> tuple[tuple, tuple]:
    """Strides of ``self`` over an index-shaped space: 0 on the indexed dim, which the index supplies."""
    a = tuple(0 if k == d else s for k, s in enumerate(self._strides))
    return a, self._strides[d] if self.ndim else 0


@kernel("gather")
def gather(device: Device, self: Tensor, dim: int, index: Tensor, sparse_grad: bool = False) -> Tensor:
    out = empty(index._shape, self._dtype, device)
    gather_into(out, self, dim, index)
    return out


@kernel_into("gather")
def gather_into(out: Tensor, self: Tensor, dim: int, index: Tensor, sparse_grad: bool = False) -> bool:
    d = _check_index(self, dim, index, "gather")
    if index.numel() == 0:
        return True
    index = _long(index)
    a, stride = _along(self, d)
    indexed(TAKE, self, out, index._shape, a, (), [(index, index._strides, stride, self._shape[d] if self.ndim else 1)],
            _site("gather()", (d,), self._shape, False, RuntimeError))
    return True


def _scatter_values(self: Tensor, src) -> Tensor:
    """scatter's source as a tensor of ``self``'s dtype (a 0-dim device tensor for a number)."""
    if isinstance(src, Tensor):
        return src if src._dtype is self._dtype else cast(src, self._dtype)
    return fill(empty((), self._dtype, self._device), src)


def _scatter(out: Tensor, self: Tensor, dim: int, index: Tensor, values: Tensor, mode: str, op: str,
             src: Tensor | None) -> Tensor:
    """``out`` = ``self`` with ``values`` (of ``self``'s dtype) put or added at ``index`` along ``dim`` (``src``:
    the source tensor as given, None for a number)."""
    d = _check_index(self, dim, index, op, src)
    index = _long(index) if index.numel() else index
    if mode == ADD:
        _check_atomic(self._dtype, op)
        _alert_atomic(self._dtype, op)
    copy_into(out, self)
    a, stride = _along(out, d)
    v_strides = values._strides if values.ndim else (0,) * index.ndim
    indexed(mode, out, values, index._shape, a, v_strides,
            [(index, index._strides, stride, out._shape[d] if out.ndim else 1)],
            _site(f"{op}()", (d,), out._shape, False, RuntimeError))
    return out


@kernel("scatter.src")
def scatter_src(device: Device, self: Tensor, dim: int, index: Tensor, src: Tensor) -> Tensor:
    return _scatter(empty(self._shape, self._dtype, device), self, dim, index, _scatter_values(self, src), PUT,
                    "scatter", src)


@kernel("scatter.value")
def scatter_value(device: Device, self: Tensor, dim: int, index: Tensor, value) -> Tensor:
    return _scatter(empty(self._shape, self._dtype, device), self, dim, index, _scatter_values(self, value), PUT,
                    "scatter", None)


@kernel("scatter_add")
def scatter_add(device: Device, self: Tensor, dim: int, index: Tensor, src: Tensor) -> Tensor:
    return _scatter(empty(self._shape, self._dtype, device), self, dim, index, _scatter_values(self, src), ADD,
                    "scatter_add", src)


def _scatter_into(mode: str, op: str):
    def into(out: Tensor, self: Tensor, dim: int, index: Tensor, src: Tensor) -> bool:
        if not isinstance(src, Tensor) or src._dtype is not self._dtype or src._device != self._device:
            return False  # converting or moving the source needs a temporary
        _scatter(out, self, dim, index, src, mode, op, src)
        return True

    return into


kernel_into("scatter.src")(_scatter_into(PUT, "scatter"))
kernel_into("scatter_add")(_scatter_into(ADD, "scatter_add"))


# ---------------------------------------------------------------------------------------------- advanced indexing

def _advanced_geometry(self: Tensor, indices) -> tuple[tuple, tuple, list[tuple[Tensor, tuple, int, int]], tuple]:
    """numpy's rules: (result shape, self strides over it, index tensors with strides over it, the dim each
    index tensor indexes)."""
    if len(indices) > self.ndim:
        raise IndexError(f"index: too many indices for tensor of dimension {self.ndim}")
    tensors = [(d, _long(t)) for d, t in enumerate(indices) if t is not None]
    for _, t in tensors:
        if t._dtype is dtypes.bool_:
            raise RuntimeError("index: bool index tensors must be converted to positions first")
    dims = [d for d, _ in tensors]
    before, bshape, after = S.advanced_index_dims(self.ndim, dims, [t._shape for _, t in tensors])
    shape = tuple(self._shape[d] for d in before) + bshape + tuple(self._shape[d] for d in after)
    zeros = (0,) * len(bshape)
    a = tuple(self._strides[d] for d in before) + zeros + tuple(self._strides[d] for d in after)
    lead, trail = (0,) * len(before), (0,) * len(after)
    specs = [(t, lead + S.expand_strides(t._shape, t._strides, bshape) + trail, self._strides[d], self._shape[d])
             for d, t in tensors]
    return shape, a, specs, tuple(dims)


@kernel("index.Tensor")
def index(device: Device, self: Tensor, indices) -> Tensor:
    shape, a, specs, dims = _advanced_geometry(self, indices)
    out = empty(shape, self._dtype, device)
    indexed(TAKE, self, out, shape, a, (), specs, _site("index", dims, self._shape, True))
    return out


def _int64_on(device: Device, indices) -> bool:
    """Whether every index tensor is already what the kernel reads (int64, on ``device``): no conversion."""
    return all(t is None or (t._dtype is dtypes.int64 and t._device == device) for t in indices)


@kernel_into("index.Tensor")
def index_into(out: Tensor, self: Tensor, indices) -> bool:
    if not _int64_on(self._device, indices):
        return False
    shape, a, specs, dims = _advanced_geometry(self, indices)
    indexed(TAKE, self, out, shape, a, (), specs, _site("index", dims, self._shape, True))
    return True


@kernel("index_put")
def index_put(device: Device, self: Tensor, indices, values, accumulate: bool = False) -> Tensor:
    indices = mask_positions(self, indices)
    if not isinstance(values, Tensor):
        values = fill(empty((), self._dtype, device), values)
    values = values if values._dtype is self._dtype else cast(values, self._dtype)
    if values._device.type == "cpu":
        values = values.to(device)
    out = empty(self._shape, self._dtype, device, S.preserved_strides(self._shape, self._strides))  # a clone's layout
    return _index_put(out, self, indices, values, accumulate)


@kernel_into("index_put")
def index_put_into(out: Tensor, self: Tensor, indices, values, accumulate: bool = False) -> bool:
    if not (isinstance(values, Tensor) and values._dtype is self._dtype and values._device == self._device
            and _int64_on(self._device, indices)):
        return False
    _index_put(out, self, indices, values, accumulate)
    return True


def _index_put(out: Tensor, self: Tensor, indices, values: Tensor, accumulate: bool) -> Tensor:
    """``out`` = ``self`` with ``values`` (of its dtype, on its device) put or added at ``indices``."""
    shape, a, specs, dims = _advanced_geometry(out, indices)
    try:
        v_strides = S.expand_strides(values._shape, values._strides, shape)
    except RuntimeError:
        raise RuntimeError(f"index_put: shape mismatch: value tensor of shape {list(values.shape)} cannot be "
                           f"broadcast to indexing result of shape {list(shape)}") from None
    if accumulate:
        _check_atomic(self._dtype, "index_put")
        _alert_atomic(self._dtype, "index_put (accumulate=True)")
    copy_into(out, self)
    site = _site("index_put", dims, out._shape, True)
    indexed(ADD if accumulate else PUT, out, values, shape, a, v_strides, specs, site)
    return out


# ---------------------------------------------------------------------------------------------- view scatters

def _strided_view(base: Tensor, shape, strides, offset) -> Tensor:
    return Tensor._make(base._storage, tuple(shape), tuple(strides), base._offset + offset, base._dtype, base._device)


def _non_overlapping(shape, strides) -> bool:
    reach = 0
    for stride, size in sorted((stride, size) for size, stride in zip(shape, strides) if size > 1):
        if stride <= reach:
            return False
        reach += (size - 1) * stride
    return True


@kernel("view_scatter_add")
def view_scatter_add(device: Device, grad: Tensor, input_shape, view_shape, view_strides, view_offset) -> Tensor:
    out = empty(tuple(input_shape), grad._dtype, device)
    if not _non_overlapping(view_shape, view_strides):
        _check_atomic(grad._dtype, "view_scatter_add")
        if grad._shape != tuple(view_shape) or not grad.is_contiguous():
            grad = contiguous(grad.expand(tuple(view_shape)))
    view_scatter_add_into(out, grad, input_shape, view_shape, view_strides, view_offset)
    return out


@kernel_into("view_scatter_add")
def view_scatter_add_into(out: Tensor, grad: Tensor, input_shape, view_shape, view_strides, view_offset) -> bool:
    """Zero ``out``, then add ``grad`` through the view: a plain copy when the view's elements are distinct,
    else atomic adds from a contiguous ``grad`` of the view's shape (without one, it declines)."""
    overlapping = not _non_overlapping(view_shape, view_strides)
    if overlapping and (grad._shape != tuple(view_shape) or not grad.is_contiguous()):
        return False
    if overlapping:
        _check_atomic(grad._dtype, "view_scatter_add")
        _alert_atomic(grad._dtype, "the backward of an overlapping view (view_scatter_add)")
    fill(out, 0)
    view = _strided_view(out, view_shape, view_strides, view_offset)
    if overlapping:
        indexed(ADD, view, grad, tuple(view_shape), tuple(view_strides), grad._strides, [])
    else:
        copy_into(view, grad)
    return True


@kernel("view_scatter")
def view_scatter(device: Device, self: Tensor, src: Tensor, view_shape, view_strides, view_offset) -> Tensor:
    out = empty(self._shape, self._dtype, device)
    view_scatter_into(out, self, src, view_shape, view_strides, view_offset)
    return out


@kernel_into("view_scatter")
def view_scatter_into(out: Tensor, self: Tensor, src: Tensor, view_shape, view_strides, view_offset) -> bool:
    copy_into(out, self)
    copy_into(_strided_view(out, view_shape, view_strides, view_offset), src)
    return True

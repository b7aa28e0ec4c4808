"""numpy kernels for the convolution operators (``_conv2d``, ``_conv3d`` and their backwards) in row-major memory.

[Note: convolution columns per image] The operators' decomposition (``ops/nn_spatial.py``, [Note: convolution
as im2col]) lays the windows out as one (N * prod(O), C * prod(K)) matrix: every row a window, the order that
suits a channels-last input and every backend's batched GEMM. A row-major (N, C, *S) input read in that order
gives numpy's copy an innermost loop of prod(K) elements (3 for a 3x3 kernel), and the output then needs a
transposing copy back to (N, OC, *O). Measured on 2 cores for the MNIST CNN's second convolution (64x32x26x26,
3x3, 64 channels), the columns took 54 ms to lay out and the forward 154 ms, under load. These kernels lay each
image's windows out as its own (C * prod(K), prod(O)) matrix instead (Caffe's im2col): the copy's inner loop runs
along an output row (24 elements there), the product ``weight @ columns`` lands directly as (N, OC, *O), and the
input gradient scatters rows of contiguous values back, one pass per kernel offset: 2.7 ms for the columns and
37 ms for the forward in the same conditions. They serve one group, a row-major result (neither input nor weight
channels-last) and float32/float64 (half precision keeps the decomposition's rounding); every other call runs
the decomposition, which stays the operators' meaning on every backend.
"""

from __future__ import annotations

import math

import numpy as np

from tilewise import strides as S
from tilewise.backends.cpu.registry import kernel
from tilewise.backends.cpu.threads import gemm_threads, use_blas_threads
from tilewise.tensor import from_array

DTYPES = frozenset({"float32", "float64"})


def _served(groups: int, *tensors) -> bool:
    """Whether these kernels serve the call (see the note): one group, float32/float64 of one dtype, every tensor
    row-major so that torch's result is row-major too."""
    dtype = tensors[0]._dtype
    if groups != 1 or dtype.name not in DTYPES:
        return False
    for t in tensors:
        if t._dtype is not dtype or S.suggest_memory_format(t._shape, t._strides) != "contiguous_format":
            return False
        if not S.is_contiguous(t._shape, t._strides) or 0 in t._shape:
            return False
    return True


KEPT = frozenset(f"_conv{n}d{suffix}" for n in (2, 3) for suffix in ("", "_backward_input", "_backward_weight"))


def keeps(op_name: str, args: tuple) -> bool:
    """Whether the C target should keep a convolution operator whole, as one call of these kernels, rather than
    decompose it (``compiler.targets``): one group and one float32/float64 dtype. ``args`` are its bound
    arguments, tensors standing for anything with ``shape`` and ``dtype``; a call whose buffers turn out not to
    be row-major runs the decomposition inside the kernel, as in eager mode."""
    if op_name not in KEPT or args[-1] != 1:
        return False
    dtypes = {t.dtype for t in args if hasattr(t, "shape") and hasattr(t, "dtype")}
    return len(dtypes) == 1 and next(iter(dtypes)).name in DTYPES


def _decomposed(name: str, *args):
    from tilewise.ops.registry import OPS

    return OPS[name].decomposition(*args)


def _pad_pairs(pads) -> list[tuple[int, int]]:
    return [(pads[k], pads[k + 1]) for k in range(0, len(pads), 2)]


def _padded(x: np.ndarray, pairs: list[tuple[int, int]]) -> np.ndarray:
    """x (N, C, *S) with zeros before and after its spatial dims."""
    if not any(before or after for before, after in pairs):
        return x
    out = np.zeros(x.shape[:2] + tuple(n + b + a for n, (b, a) in zip(x.shape[2:], pairs)), x.dtype)
    out[(slice(None), slice(None), *(slice(b, b + n) for n, (b, _) in zip(x.shape[2:], pairs)))] = x
    return out


def _window_view(padded: np.ndarray, kernel, stride, dilation, out_sizes) -> np.ndarray:
    """The (N, C, *K, *O) view of every window of a row-major padded input: kernel offsets before positions."""
    lead, spatial = padded.strides[:2], padded.strides[2:]
    strides = (*lead, *(s * d for s, d in zip(spatial, dilation)), *(s * st for s, st in zip(spatial, stride)))
    return np.lib.stride_tricks.as_strided(padded, padded.shape[:2] + tuple(kernel) + tuple(out_sizes), strides,
                                           writeable=False)


def _out_sizes(padded_sizes, kernel, stride, dilation) -> tuple:
    return tuple((n - d * (k - 1) - 1) // s + 1 for n, k, s, d in zip(padded_sizes, kernel, stride, dilation))


def _gemm_threads(m: int, n: int, k: int) -> None:
    """BLAS threads for GEMMs of (m, k) by (k, n): by the size of each one (one image's, where numpy's matmul loops
    over the batch), as for every GEMM (see [Note: CPU threads])."""
    use_blas_threads(gemm_threads(2 * m * n * k))


def _columns_per_image(x: np.ndarray, kernel, stride, pairs, dilation) -> tuple[np.ndarray, tuple]:
    """(N, C * prod(K), prod(O)) columns of a row-major input, and the output sizes O."""
    padded = _padded(x, pairs)
    out_sizes = _out_sizes(padded.shape[2:], kernel, stride, dilation)
    windows = _window_view(padded, kernel, stride, dilation, out_sizes)
    columns = np.ascontiguousarray(windows).reshape(x.shape[0], -1, math.prod(out_sizes))
    return columns, out_sizes


def _forward(name: str):
    def conv(input, weight, stride, pads, dilation, groups):
        if not _served(groups, input, weight):
            return _decomposed(name, input, weight, stride, pads, dilation, groups)
        x, w = input._np(), weight._np()
        kernel = w.shape[2:]
        columns, out_sizes = _columns_per_image(x, kernel, stride, _pad_pairs(pads), dilation)
        flat_weight = w.reshape(w.shape[0], -1)
        _gemm_threads(flat_weight.shape[0], columns.shape[2], columns.shape[1])
        out = np.matmul(flat_weight, columns)  # (N, OC, prod(O)), row-major: torch's layout
        return from_array(out.reshape(x.shape[0], w.shape[0], *out_sizes), input._dtype)

    conv.__name__ = name
    return conv


def _backward_input(name: str):
    def conv_backward_input(grad, input, weight, stride, pads, dilation, groups):
        if not _served(groups, grad, input, weight):
            return _decomposed(f"{name}_backward_input", grad, input, weight, stride, pads, dilation, groups)
        g, w = grad._np(), weight._np()
        batch, channels, *sizes = input._shape
        kernel, out_sizes = w.shape[2:], g.shape[2:]
        flat_grad = g.reshape(batch, g.shape[1], -1)
        flat_weight = w.reshape(w.shape[0], -1)
        _gemm_threads(flat_weight.shape[1], flat_grad.shape[2], flat_weight.shape[0])
        columns = np.matmul(flat_weight.T, flat_grad).reshape(batch, channels, *kernel, *out_sizes)
        pairs = _pad_pairs(pads)
        padded = np.zeros((batch, channels, *(n + b + a for n, (b, a) in zip(sizes, pairs))), g.dtype)
        _scatter_windows(padded, columns, kernel, stride, dilation, out_sizes)
        inside = padded[(slice(None), slice(None), *(slice(b, b + n) for n, (b, _) in zip(sizes, pairs)))]
        return from_array(np.ascontiguousarray(inside), grad._dtype)

    conv_backward_input.__name__ = f"{name}_backward_input"
    return conv_backward_input


def _scatter_windows(padded: np.ndarray, columns: np.ndarray, kernel, stride, dilation, out_sizes) -> None:
    """Add each kernel offset's (N, C, *O) slab of ``columns`` into the padded input elements its windows read,
    offsets in row-major order (the order of the decomposition's ``view_scatter_add``)."""
    spatial = padded.strides[2:]
    slab_strides = padded.strides[:2] + tuple(s * st for s, st in zip(spatial, stride))
    slab_shape = padded.shape[:2] + tuple(out_sizes)
    for offset in np.ndindex(*kernel):
        start = sum(k * d * s for k, d, s in zip(offset, dilation, spatial)) // padded.itemsize
        target = np.lib.stride_tricks.as_strided(padded.reshape(-1)[start:], slab_shape, slab_strides)
        target += columns[(slice(None), slice(None), *offset)]


def _backward_weight(name: str):
    def conv_backward_weight(grad, input, weight, stride, pads, dilation, groups):
        if not _served(groups, grad, input, weight):
            return _decomposed(f"{name}_backward_weight", grad, input, weight, stride, pads, dilation, groups)
        g, x = grad._np(), input._np()
        kernel = weight._shape[2:]
        padded = _padded(x, _pad_pairs(pads))
        windows = _window_view(padded, kernel, stride, dilation, g.shape[2:])
        spatial = len(kernel)
        # (C, *K, N, *O): one (C * prod(K), N * prod(O)) matrix, so the batch is summed inside one GEMM
        order = (1, *range(2, 2 + spatial), 0, *range(2 + spatial, 2 + 2 * spatial))
        columns = np.ascontiguousarray(windows.transpose(order)).reshape(-1, g.shape[0] * math.prod(g.shape[2:]))
        flat_grad = np.ascontiguousarray(np.moveaxis(g, 1, 0)).reshape(g.shape[1], -1)
        _gemm_threads(flat_grad.shape[0], columns.shape[0], flat_grad.shape[1])
        out = np.matmul(flat_grad, columns.T)
        return from_array(out.reshape(weight._shape), grad._dtype)

    conv_backward_weight.__name__ = f"{name}_backward_weight"
    return conv_backward_weight


for _n in (2, 3):
    _name = f"_conv{_n}d"
    kernel(_name)(_forward(_name))
    kernel(f"{_name}_backward_input")(_backward_input(_name))
    kernel(f"{_name}_backward_weight")(_backward_weight(_name))

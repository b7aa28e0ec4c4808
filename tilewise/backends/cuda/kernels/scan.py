"""Inclusive scans on CUDA: cumsum and cumprod, and the running extrema cummax and cummin, along one dim.

One warp scans one row: 32 elements at a time with a shuffle-up (Hillis-Steele) scan, carrying the running
total from chunk to chunk, so any row length works and the other dims are run-time sizes and strides.
Accumulation is in the operator's compute dtype (float32 for half types, int64 for integers), as on the CPU.

cummax/cummin scan (value, index) pairs with one rule: a later element takes over from an earlier running
extreme when it is at least as large (cummax) or small (cummin), and a NaN always takes over, so ties report
the latest position and a NaN stays from where it appears, as in torch. The rule picks the later side of
any two adjacent segments unless the earlier is strictly better, which is associative, so a tree-shaped
warp scan gives the same answer as the left-to-right loop. The value written is the element at the
reported index, loaded exactly (half types widen to float32 losslessly), so even the sign of a zero matches.
"""

from __future__ import annotations

from tilewise import _strides as S
from tilewise import dtypes
from tilewise.backends.cuda import data_ptr, empty, stream_handle
from tilewise.backends.cuda.kernels import ceil_div, kernel, launch, load
from tilewise.compiler.render import CUDA
from tilewise.compiler.render.cstyle import SUFFIX, Source, literal, load_code, store_code
from tilewise.device import Device
from tilewise.dtypes import DType
from tilewise.tensor import Tensor

WARPS = 4


def row_params(rank: int) -> list[str]:
    """The run-time geometry every row-wise kernel takes: rows, the row length, the stride along the row of
    the input and of the (contiguous) outputs, then the other dims' sizes, input strides, output strides."""
    return ["long long rows", "long long n", "long long in_stride", "long long out_stride",
            *(f"long long size{d}" for d in range(rank)), *(f"long long ist{d}" for d in range(rank)),
            *(f"long long ost{d}" for d in range(rank))]


def row_offsets(rank: int, row: str = "row") -> list[str]:
    """Lines setting ``in_base``/``out_base``, the offsets of row ``row``'s first element."""
    lines = [f"long long rem = {row}, in_base = 0, out_base = 0;"]
    for d in range(rank - 1, -1, -1):
        coord = "rem" if d == 0 else f"rem % size{d}"
        lines.append(f"{{ const long long c = {coord}; in_base += c * ist{d}; out_base += c * ost{d};"
                     + (f" rem /= size{d}; }}" if d else " }"))
    return lines


def _warp_per_row() -> list[str]:
    return [f"const long long row = (long long)blockIdx.x * {WARPS} + (threadIdx.x >> 5);",
            "const int lane = threadIdx.x & 31;", "if (row >= rows) return;"]


def _kernel_text(name: str, params: list[str], lines: list[str]) -> str:
    body = "\n".join("    " + ln for ln in lines)
    return (f'extern "C" __global__ void __launch_bounds__({32 * WARPS}) {name}({", ".join(params)}) '
            f"{{\n{body}\n}}")


def render_scan(name: str, combiner: str, input_dtype: DType, acc: DType, output: DType, rank: int) -> str:
    source = Source(CUDA)
    source.need_storage(input_dtype)
    source.need_storage(output)
    c_acc = CUDA.ctype(acc)
    ident = literal(0 if combiner == "add" else 1, acc, CUDA)
    op = "+" if combiner == "add" else "*"
    params = [f"{CUDA.ctype(output)}* __restrict__ out", f"const {CUDA.ctype(input_dtype)}* __restrict__ in",
              *row_params(rank)]
    loaded = load_code(CUDA, input_dtype, "in[in_base + j * in_stride]")
    lines = [*_warp_per_row(), *row_offsets(rank),
             f"{c_acc} carry = {ident};",
             "for (long long start = 0; start < n; start += 32) {",
             "    const long long j = start + lane;",
             f"    {c_acc} v = j < n ? ({c_acc})({loaded}) : {ident};",
             "    for (int s = 1; s < 32; s <<= 1) {",
             f"        const {c_acc} o = __shfl_up_sync(0xffffffffu, v, s);",
             f"        if (lane >= s) v = o {op} v;",
             "    }",
             f"    v = carry {op} v;",
             f"    if (j < n) out[out_base + j * out_stride] = {store_code(CUDA, output, 'v', acc)};",
             "    carry = __shfl_sync(0xffffffffu, v, 31);",
             "}"]
    return source.text(_kernel_text(name, params, lines))


def extreme_carrier(dtype: DType) -> DType:
    """The type a running extreme travels in: one ``__shfl_sync`` takes it, and it holds every value exactly."""
    if dtype.is_floating_point:
        return dtypes.float64 if dtype is dtypes.float64 else dtypes.float32
    return dtypes.int64 if dtype is dtypes.int64 else dtypes.int32


def _takes_over(combiner: str, dtype: DType, later: str, earlier: str) -> str:
    """C condition: the later element ``later`` replaces the running extreme ``earlier``."""
    cmp = ">=" if combiner == "max" else "<="
    if not dtype.is_floating_point:
        return f"({later} {cmp} {earlier})"
    return f"({later} != {later} || ({earlier} == {earlier} && {later} {cmp} {earlier}))"


def render_running_extreme(name: str, combiner: str, dtype: DType, rank: int) -> str:
    """cummax (``combiner`` "max") or cummin ("min"): values and int64 indices, one warp per row."""
    source = Source(CUDA)
    source.need_storage(dtype)
    carrier = extreme_carrier(dtype)
    c = CUDA.ctype(carrier)
    params = [f"{CUDA.ctype(dtype)}* __restrict__ values", "long long* __restrict__ indices",
              f"const {CUDA.ctype(dtype)}* __restrict__ in", *row_params(rank)]
    loaded = load_code(CUDA, dtype, "in[in_base + j * in_stride]")
    full = "0xffffffffu"
    lines = [*_warp_per_row(), *row_offsets(rank),
             f"{c} carry_v = 0;",
             "long long carry_i = -1;  // no running extreme before the first chunk",
             "for (long long start = 0; start < n; start += 32) {",
             "    const long long j = start + lane;",
             f"    {c} v = j < n ? ({c})({loaded}) : ({c})0;",
             "    long long i = j;",
             "    for (int s = 1; s < 32; s <<= 1) {",
             f"        const {c} ov = __shfl_up_sync({full}, v, s);",
             f"        const long long oi = __shfl_up_sync({full}, i, s);",
             f"        if (lane >= s && !{_takes_over(combiner, dtype, 'v', 'ov')}) {{ v = ov; i = oi; }}",
             "    }",
             f"    if (carry_i >= 0 && !{_takes_over(combiner, dtype, 'v', 'carry_v')}) {{",
             "        v = carry_v;",
             "        i = carry_i;",
             "    }",
             "    if (j < n) {",
             f"        values[out_base + j * out_stride] = {store_code(CUDA, dtype, 'v', carrier)};",
             "        indices[out_base + j * out_stride] = i;",
             "    }",
             f"    carry_v = __shfl_sync({full}, v, 31);",
             f"    carry_i = __shfl_sync({full}, i, 31);",
             "}"]
    return source.text(_kernel_text(name, params, lines))


def row_geometry(x: Tensor, d: int, out_shape: tuple):
    """(rows, n, in_stride, out_stride, rank, geometry tail) of ``x`` scanned or sorted along dim ``d`` into
    contiguous outputs of ``out_shape`` (``x``'s shape, or with another length along ``d``); a 0-dim ``x`` is
    one row of one element."""
    shape = x._shape if x.ndim else (1,)
    strides = x._strides if x.ndim else (1,)
    out_strides = S.contiguous_strides(out_shape if x.ndim else (1,))
    keep = [k for k in range(len(shape)) if k != d]
    outer, (in_outer, out_outer) = S.coalesce(tuple(shape[k] for k in keep), tuple(strides[k] for k in keep),
                                              tuple(out_strides[k] for k in keep))
    geometry = (*(outer or (1,)), *(in_outer or (0,)), *(out_outer or (0,)))
    return S.numel(outer), shape[d], strides[d], out_strides[d], max(len(outer), 1), geometry


def scan(op, combiner: str, x: Tensor, dim: int, dtype) -> Tensor:
    out_dtype, compute = op.dtype_rule(op, (x, dim, dtype))
    d = S.normalize_dim(dim, max(x.ndim, 1), op.name)
    out = empty(x._shape, out_dtype, x._device)
    rows, n, in_stride, out_stride, rank, geometry = row_geometry(x, d, x._shape)
    if rows == 0 or n == 0:
        return out
    name = f"tw_{op.name}_{SUFFIX[x._dtype.name]}_{SUFFIX[compute.name]}_{SUFFIX[out_dtype.name]}_r{rank}"
    fn = load(render_scan(name, combiner, x._dtype, compute, out_dtype, rank), name, x._device.index)
    launch(fn, ceil_div(rows, WARPS), 32 * WARPS, [data_ptr(out), data_ptr(x), rows, n, in_stride, out_stride,
                                                    *geometry], stream_handle(x._device.index))
    return out


def running_extreme(name: str, combiner: str, x: Tensor, dim: int) -> tuple[Tensor, Tensor]:
    d = S.normalize_dim(dim, max(x.ndim, 1), name)
    values, indices = empty(x._shape, x._dtype, x._device), empty(x._shape, dtypes.int64, x._device)
    rows, n, in_stride, out_stride, rank, geometry = row_geometry(x, d, x._shape)
    if rows == 0 or n == 0:
        return values, indices
    kernel_name = f"tw_{name}_{SUFFIX[x._dtype.name]}_r{rank}"
    fn = load(render_running_extreme(kernel_name, combiner, x._dtype, rank), kernel_name, x._device.index)
    launch(fn, ceil_div(rows, WARPS), 32 * WARPS, [data_ptr(values), data_ptr(indices), data_ptr(x), rows, n,
                                                    in_stride, out_stride, *geometry], stream_handle(x._device.index))
    return values, indices


@kernel("cumsum")
def cumsum(device: Device, self: Tensor, dim: int, dtype=None) -> Tensor:
    from tilewise.ops.registry import OPS

    return scan(OPS["cumsum"], "add", self, dim, dtype)


@kernel("cumprod")
def cumprod(device: Device, self: Tensor, dim: int, dtype=None) -> Tensor:
    from tilewise.ops.registry import OPS

    return scan(OPS["cumprod"], "mul", self, dim, dtype)


@kernel("cummax")
def cummax(device: Device, self: Tensor, dim: int) -> tuple[Tensor, Tensor]:
    return running_extreme("cummax", "max", self, dim)


@kernel("cummin")
def cummin(device: Device, self: Tensor, dim: int) -> tuple[Tensor, Tensor]:
    return running_extreme("cummin", "min", self, dim)

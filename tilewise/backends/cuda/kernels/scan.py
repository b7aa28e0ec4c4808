"""Inclusive scans on CUDA: cumsum and cumprod along one dim.

One warp scans one row: 32 elements at a time with a shuffle-up (Hillis-Steele) scan, carrying the running
total from chunk to chunk, so any row length works and the other dims are run-time sizes and strides.
Accumulation is in the operator's compute dtype (float32 for half types, int64 for integers), as on the CPU.
cummax/cummin, which also report indices, run on the host for now.
"""

from __future__ import annotations

from tilewise import _strides as S
from tilewise.backends.cuda import data_ptr, empty, stream_handle
from tilewise.backends.cuda.kernels import ceil_div, kernel, launch, load
from tilewise.compiler.render import CUDA
from tilewise.compiler.render.cstyle import SUFFIX, Source, literal, load_code, store_code
from tilewise.device import Device
from tilewise.dtypes import DType
from tilewise.tensor import Tensor

WARPS = 4


def render_scan(name: str, combiner: str, input_dtype: DType, acc: DType, output: DType, rank: int) -> str:
    source = Source(CUDA)
    source.need_storage(input_dtype)
    source.need_storage(output)
    c_acc = CUDA.ctype(acc)
    ident = literal(0 if combiner == "add" else 1, acc, CUDA)
    op = "+" if combiner == "add" else "*"
    params = [f"{CUDA.ctype(output)}* __restrict__ out", f"const {CUDA.ctype(input_dtype)}* __restrict__ in",
              "long long rows", "long long n", "long long in_stride", "long long out_stride",
              *(f"long long size{d}" for d in range(rank)), *(f"long long ist{d}" for d in range(rank)),
              *(f"long long ost{d}" for d in range(rank))]
    lines = [f"const long long row = (long long)blockIdx.x * {WARPS} + (threadIdx.x >> 5);",
             "const int lane = threadIdx.x & 31;", "if (row >= rows) return;",
             "long long rem = row, in_base = 0, out_base = 0;"]
    for d in range(rank - 1, -1, -1):
        coord = "rem" if d == 0 else f"rem % size{d}"
        lines.append(f"{{ const long long c = {coord}; in_base += c * ist{d}; out_base += c * ost{d};"
                     + (f" rem /= size{d}; }}" if d else " }"))
    loaded = load_code(CUDA, input_dtype, "in[in_base + j * in_stride]")
    lines += [f"{c_acc} carry = {ident};",
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
    body = "\n".join("    " + ln for ln in lines)
    return source.text(f'extern "C" __global__ void __launch_bounds__({32 * WARPS}) {name}({", ".join(params)}) '
                       f"{{\n{body}\n}}")


def scan(op, combiner: str, x: Tensor, dim: int, dtype) -> Tensor:
    out_dtype, compute = op.dtype_rule(op, (x, dim, dtype))
    d = S.normalize_dim(dim, max(x.ndim, 1), op.name)
    shape = x._shape if x.ndim else (1,)
    strides = x._strides if x.ndim else (1,)
    out = empty(x._shape, out_dtype, x._device)
    out_strides = S.contiguous_strides(shape)
    keep = [k for k in range(len(shape)) if k != d]
    outer, (in_outer, out_outer) = S.coalesce(tuple(shape[k] for k in keep), tuple(strides[k] for k in keep),
                                              tuple(out_strides[k] for k in keep))
    rows, n = S.numel(outer), shape[d]
    if rows == 0 or n == 0:
        return out
    rank = max(len(outer), 1)
    name = f"tw_{op.name}_{SUFFIX[x._dtype.name]}_{SUFFIX[compute.name]}_{SUFFIX[out_dtype.name]}_r{rank}"
    fn = load(render_scan(name, combiner, x._dtype, compute, out_dtype, rank), name, x._device.index)
    geometry = (*(outer or (1,)), *(in_outer or (0,)), *(out_outer or (0,)))
    launch(fn, ceil_div(rows, WARPS), 32 * WARPS, [data_ptr(out), data_ptr(x), rows, n, strides[d], out_strides[d],
                                                    *geometry], stream_handle(x._device.index))
    return out


@kernel("cumsum")
def cumsum(device: Device, self: Tensor, dim: int, dtype=None) -> Tensor:
    from tilewise.ops.registry import OPS

    return scan(OPS["cumsum"], "add", self, dim, dtype)


@kernel("cumprod")
def cumprod(device: Device, self: Tensor, dim: int, dtype=None) -> Tensor:
    from tilewise.ops.registry import OPS

    return scan(OPS["cumprod"], "mul", self, dim, dtype)

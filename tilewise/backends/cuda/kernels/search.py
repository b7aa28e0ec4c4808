"""Searching, and outputs whose size depends on the data, on CUDA: searchsorted, nonzero, and the positions of
repeat_interleave (``repeat_interleave.Tensor``).

[Note: CUDA searchsorted]
One thread per value runs torch's binary search (see [Note: searchsorted] in ``ops/scans.py``) over its row
of the sequence: the row of the value's leading coordinates for an N-D sequence, the one row of a 1-D
sequence, addressed through run-time sizes and strides, so neither side needs to be contiguous. Both sides
are first converted to their promoted dtype (on the device, and only the side that differs) and compared in
its compute type (half types widen exactly), with torch's comparisons, so NaN lands where torch puts it. A
sorter is made contiguous and read at ``sorter[row * n + mid]``. Its entries are checked on the device like
any index (see [Note: device-side bounds checks]): the launch covers the sorter as well as the values, each
thread checking one entry, so a bad entry is reported even where no search visits it, and a search that meets
one stops instead of reading outside the row.

[Note: counts to output positions]
nonzero and repeat_interleave write each input element's share of the output at a position that depends on
every element before it, and the output's size is known only once everything is counted. Both run the same
steps over tiles of ``TILE`` elements (a block of 256 threads, in 8 rounds of 256 consecutive elements):
1. a block per tile adds up the tile's counts (nonzero: 1 per non-zero element; repeat_interleave: the
   repeats, noting the least one);
2. one block of 1024 threads turns the tile totals into exclusive offsets (each thread adds up a stretch of
   them, one block-wide scan offsets the stretches, each thread writes its stretch) and stores the total;
3. a block per tile scans its counts again, round by round from its tile's offset, and writes.
The host reads the total (and the least repeat) back after step 2: one small copy and one synchronisation
per call, as torch does, to size the output. repeat_interleave reads it even when given ``output_size``, to
refuse a wrong one and negative repeats as the CPU does (torch trusts it there and skips the read). nonzero's
step 3 writes the coordinates of each non-zero element at its rank among them (row-major order, as torch;
a strided input is read through a contiguous copy). repeat_interleave's writes each element's end position
(the inclusive cumulative sum), and a last kernel gives output position j the element whose run holds it,
by binary search over those ends, so each thread writes one output element however uneven the repeats are.
"""

from __future__ import annotations

import numpy as np

from tilewise import dtypes
from tilewise import strides as S
from tilewise.backends.cuda.device_memory import data_ptr, empty, stream_handle
from tilewise.backends.cuda.kernels import ceil_div, kernel, launch, load_rendered
from tilewise.backends.cuda.kernels.copy import cast, contiguous, copy_into
from tilewise.backends.cuda.kernels.creation import fill
from tilewise.backends.cuda.runtime.bounds import REPORT_C, note_site, record_pointer
from tilewise.backends.cuda.runtime.device import ensure_context
from tilewise.codegen.render import CUDA
from tilewise.codegen.render.cstyle import SUFFIX, Source, compute_of, load_code
from tilewise.device import Device
from tilewise.dtypes import DType
from tilewise.tensor import Tensor

BLOCK = 256
ROUNDS = 8
TILE = BLOCK * ROUNDS  # elements a block of steps 1 and 3 covers
SCAN_THREADS = 1024  # the one block of step 2

BLOCK_SCAN_C = """\
#ifndef TW_BLOCK_EXCLUSIVE_SCAN
#define TW_BLOCK_EXCLUSIVE_SCAN
// The sum of v over the threads before this one in the block; *total gets the block's sum. Every thread of
// the block calls it (blockDim.x a multiple of 32); warp_sums is shared memory for 32 values.
static __device__ __forceinline__ long long tw_block_exclusive_scan(long long v, long long* warp_sums,
                                                                    long long* total) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    long long x = v;
    for (int s = 1; s < 32; s <<= 1) {
        const long long o = __shfl_up_sync(0xffffffffu, x, s);
        if (lane >= s) x += o;
    }
    if (lane == 31) warp_sums[warp] = x;
    __syncthreads();
    if (warp == 0) {
        long long w = lane < warps ? warp_sums[lane] : 0;
        for (int s = 1; s < 32; s <<= 1) {
            const long long o = __shfl_up_sync(0xffffffffu, w, s);
            if (lane >= s) w += o;
        }
        warp_sums[lane] = w;
    }
    __syncthreads();
    const long long before = warp ? warp_sums[warp - 1] : 0;
    *total = warp_sums[warps - 1];
    __syncthreads();  // the next call may overwrite warp_sums
    return before + x - v;
}
#endif"""


def _kernel_text(name: str, block: int, params: list[str], lines: list[str]) -> str:
    body = "\n".join("    " + ln for ln in lines)
    return f'extern "C" __global__ void __launch_bounds__({block}) {name}({", ".join(params)}) {{\n{body}\n}}'


def _coordinates(rank: int, index: str, sizes: str) -> list[str]:
    """Lines opening a block in which ``c{d}`` is coordinate d of row-major position ``index``."""
    lines = [f"long long rem = {index};"]
    for d in range(rank - 1, 0, -1):
        lines.append(f"const long long c{d} = rem % {sizes}{d}; rem /= {sizes}{d};")
    lines.append("const long long c0 = rem;")
    return lines


def read_back(t: Tensor) -> list[int]:
    """The values of the small int64 device tensor ``t``, once the work queued before it has finished: one copy
    and one synchronisation. Like every download it raises an index error a kernel has recorded meanwhile."""
    from tilewise._cuda_api import check, driver_api
    from tilewise.backends.cuda.runtime import copy_dtoh
    from tilewise.backends.cuda.runtime.bounds import raise_index_errors

    host = np.empty(t.numel(), np.int64)
    stream = stream_handle(t._device.index)
    copy_dtoh(host.ctypes.data, data_ptr(t), host.nbytes, stream)
    check(driver_api().cuStreamSynchronize(stream), "cuStreamSynchronize")
    raise_index_errors()
    return host.tolist()


# ---------------------------------------------------------------------------------------------- searchsorted

def render_searchsorted(dtype: DType, out_dtype: DType, rank: int, sorted_by: bool) -> tuple[str, str]:
    """(name, CUDA source) of searchsorted over values of ``rank`` dims, with or without a sorter.

    Parameters: out, seq, values, [sorter, sorter_count], count (values), n (row length), seq_step (the
    sequence's stride along its rows), right, then per value dim its size, the values' stride and the strides
    that find the row it searches in the sequence [and in the sorter] (0 along the last dim, and everywhere
    for a 1-D sequence), then [the bounds record and site]."""
    source = Source(CUDA)
    source.need_storage(dtype)
    c, cc = CUDA.ctype(dtype), CUDA.ctype(compute_of(dtype))
    name = f"tw_searchsorted_{SUFFIX[dtype.name]}_{SUFFIX[out_dtype.name]}_r{rank}" + ("_sorter" if sorted_by else "")
    strides = ("vst", "sst", "ost") if sorted_by else ("vst", "sst")
    params = [f"{CUDA.ctype(out_dtype)}* __restrict__ out", f"const {c}* __restrict__ seq",
              f"const {c}* __restrict__ values",
              *(("const long long* __restrict__ sorter", "long long sorter_count") if sorted_by else ()),
              "long long count", "long long n", "long long seq_step", "int right",
              *(", ".join(f"long long {p}{d}" for p in ("size", *strides)) for d in range(rank)),
              *(("long long* __restrict__ record", "long long site") if sorted_by else ())]

    def offset(name: str, stride: str) -> str:
        return f"const long long {name} = " + " + ".join(f"c{d} * {stride}{d}" for d in range(rank)) + ";"

    lines = ["const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;"]
    if sorted_by:
        source.helpers["tw_index_out_of_bounds"] = REPORT_C
        lines += ["if (i < sorter_count) {",
                  "    const long long s = sorter[i];",
                  "    if ((unsigned long long)s >= (unsigned long long)n) {",
                  "        tw_index_out_of_bounds(record, site, 0, s, n);",
                  "    }",
                  "}"]
    lines += ["if (i >= count) return;", *_coordinates(rank, "i", "size"), offset("voff", "vst"),
              offset("row", "sst")]
    if sorted_by:
        lines.append(offset("sorted_row", "ost"))
    lines += [f"const {cc} v = {load_code(CUDA, dtype, 'values[voff]')};",
              "long long lo = 0, hi = n;",
              "while (lo < hi) {",
              "    const long long mid = lo + ((hi - lo) >> 1);"]
    if sorted_by:
        lines += ["    const long long at = sorter[sorted_row + mid];",
                  "    if ((unsigned long long)at >= (unsigned long long)n) {  // reported by the thread checking it",
                  "        lo = 0;",
                  "        break;",
                  "    }"]
    else:
        lines.append("    const long long at = mid;")
    lines += [f"    const {cc} m = {load_code(CUDA, dtype, 'seq[row + at * seq_step]')};",
              "    if (right ? !(m > v) : !(m >= v)) lo = mid + 1;",
              "    else hi = mid;",
              "}",
              f"out[i] = ({CUDA.ctype(out_dtype)})lo;"]
    return name, source.text(_kernel_text(name, BLOCK, params, lines))


def _on_device(value, dtype: DType, device: Device) -> Tensor:
    """``value`` (a device tensor, a 0-dim CPU tensor or a number) as a tensor of ``dtype`` on ``device``."""
    if not isinstance(value, Tensor) or value._device.type == "cpu":
        return fill(empty((), dtype, device), value.item() if isinstance(value, Tensor) else value)
    return value if value._dtype is dtype else cast(value, dtype)


@kernel("searchsorted")
def searchsorted(device: Device, sorted_sequence: Tensor, self, out_int32: bool = False, right: bool = False,
                 side=None, sorter=None) -> Tensor:
    from tilewise.ops.scans import check_searchsorted

    from_right, common = check_searchsorted(sorted_sequence, self, out_int32, right, side, sorter)
    seq = _on_device(sorted_sequence, common, device)
    values = _on_device(self, common, device)
    out_dtype = dtypes.int32 if out_int32 else dtypes.int64
    out = empty(values._shape, out_dtype, device)
    order = contiguous(sorter) if sorter is not None else None
    count, sorter_count = values.numel(), order.numel() if order is not None else 0
    if max(count, sorter_count) == 0:
        return out
    rank = max(values.ndim, 1)
    sizes, value_strides = (values._shape, values._strides) if values.ndim else ((1,), (0,))
    flat = seq.ndim == 1
    seq_strides = (0,) * rank if flat else seq._strides[:-1] + (0,)
    sorter_strides = (0,) * rank if flat else S.contiguous_strides(seq._shape)[:-1] + (0,)
    args = [data_ptr(out), data_ptr(seq), data_ptr(values)]
    if order is not None:
        args += [data_ptr(order), sorter_count]
    args += [count, seq._shape[-1], seq._strides[-1], int(from_right)]
    for d in range(rank):
        args += [sizes[d], value_strides[d], seq_strides[d], *((sorter_strides[d],) if order is not None else ())]
    if order is not None:
        site = note_site("searchsorted(): sorter", (seq.ndim - 1,), seq._shape, False, in_self=False)
        args += [record_pointer(ensure_context(device.index)), site]
    fn = load_rendered(render_searchsorted, common, out_dtype, rank, order is not None, device=device.index)
    launch(fn, ceil_div(max(count, sorter_count), BLOCK), BLOCK, args, stream_handle(device.index))
    return out


# ---------------------------------------------------------------------------------------------- step 2, shared

def render_scan_tiles() -> tuple[str, str]:
    """(name, CUDA source) of step 2: ``tiles[0:count]`` becomes exclusive offsets; ``total[0]`` their sum."""
    name = "tw_scan_tile_totals"
    lines = ["__shared__ long long warp_sums[32];",
             "const long long per = (count + blockDim.x - 1) / blockDim.x;",
             "const long long lo = threadIdx.x * per, hi = lo + per < count ? lo + per : count;",
             "long long sum = 0;",
             "for (long long k = lo; k < hi; ++k) sum += tiles[k];",
             "long long all;",
             "long long run = tw_block_exclusive_scan(sum, warp_sums, &all);",
             "for (long long k = lo; k < hi; ++k) {",
             "    const long long t = tiles[k];",
             "    tiles[k] = run;",
             "    run += t;",
             "}",
             "if (threadIdx.x == 0) total[0] = all;"]
    params = ["long long* __restrict__ tiles", "long long count", "long long* __restrict__ total"]
    return name, BLOCK_SCAN_C + "\n" + _kernel_text(name, SCAN_THREADS, params, lines) + "\n"


def _tile_offsets(tiles: Tensor, results: Tensor) -> None:
    """Step 2 over the tile totals ``tiles``; the grand total goes to ``results[0]``."""
    fn = load_rendered(render_scan_tiles, device=tiles._device.index)
    launch(fn, 1, SCAN_THREADS, [data_ptr(tiles), tiles.numel(), data_ptr(results)], stream_handle(tiles._device.index))


# ---------------------------------------------------------------------------------------------- nonzero

def _is_nonzero(dtype: DType, element: str) -> str:
    return f"({load_code(CUDA, dtype, element)} != 0)"


def render_nonzero_count(dtype: DType) -> tuple[str, str]:
    """(name, CUDA source) of nonzero's step 1: ``tiles[b]`` = the non-zero elements of tile b of ``x``."""
    source = Source(CUDA)
    source.need_storage(dtype)
    name = f"tw_nonzero_count_{SUFFIX[dtype.name]}"
    lines = [f"const long long base = (long long)blockIdx.x * {TILE};",
             "int count = 0;",
             f"for (int k = 0; k < {ROUNDS}; ++k) {{",
             f"    const long long e = base + k * {BLOCK} + threadIdx.x;",
             f"    count += __syncthreads_count(e < n && {_is_nonzero(dtype, 'x[e]')});",
             "}",
             "if (threadIdx.x == 0) tiles[blockIdx.x] = count;"]
    params = [f"const {CUDA.ctype(dtype)}* __restrict__ x", "long long n", "long long* __restrict__ tiles"]
    return name, source.text(_kernel_text(name, BLOCK, params, lines))


def render_nonzero_write(dtype: DType, rank: int) -> tuple[str, str]:
    """(name, CUDA source) of nonzero's step 3: each non-zero element of contiguous ``x`` (of ``rank`` dims with
    sizes ``size0..``) writes its coordinates as row ``rank`` of ``out`` (rows, rank)."""
    source = Source(CUDA)
    source.need_storage(dtype)
    name = f"tw_nonzero_write_{SUFFIX[dtype.name]}_r{rank}"
    warps = BLOCK // 32
    lines = [f"__shared__ int warp_counts[{warps}];",
             f"const long long base = (long long)blockIdx.x * {TILE};",
             "const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;",
             "long long at = offsets[blockIdx.x];",
             f"for (int k = 0; k < {ROUNDS}; ++k) {{",
             f"    const long long e = base + k * {BLOCK} + threadIdx.x;",
             f"    const bool flag = e < n && {_is_nonzero(dtype, 'x[e]')};",
             "    const unsigned ballot = __ballot_sync(0xffffffffu, flag);",
             "    if (lane == 0) warp_counts[warp] = __popc(ballot);",
             "    __syncthreads();",
             "    int before = __popc(ballot & ((1u << lane) - 1u)), round = 0;",
             f"    for (int w = 0; w < {warps}; ++w) {{",
             "        const int c = warp_counts[w];",
             "        before += w < warp ? c : 0;",
             "        round += c;",
             "    }",
             "    if (flag) {",
             f"        long long* const row = out + (at + before) * {rank};",
             *("        " + ln for ln in _coordinates(rank, "e", "size")),
             *(f"        row[{d}] = c{d};" for d in range(rank)),
             "    }",
             "    at += round;",
             "    __syncthreads();",
             "}"]
    params = ["long long* __restrict__ out", f"const {CUDA.ctype(dtype)}* __restrict__ x", "long long n",
              "const long long* __restrict__ offsets", *(f"long long size{d}" for d in range(rank))]
    return name, source.text(_kernel_text(name, BLOCK, params, lines))


def _column_major(rows: Tensor) -> Tensor:
    """nonzero's (count, ndim) positions laid out column-major, strides (1, count), as torch returns them."""
    count, ndim = rows._shape
    storage = empty((ndim, count), dtypes.int64, rows._device)._storage
    out = Tensor._make(storage, rows._shape, (1, count), 0, dtypes.int64, rows._device)
    return copy_into(out, rows) if count and ndim else out


@kernel("nonzero")
def nonzero(device: Device, self: Tensor) -> Tensor:
    x = contiguous(self)
    n = x.numel()
    if n == 0:
        return _column_major(empty((0, self.ndim), dtypes.int64, device))
    tiles = empty((ceil_div(n, TILE),), dtypes.int64, device)
    results = empty((1,), dtypes.int64, device)
    stream = stream_handle(device.index)
    launch(load_rendered(render_nonzero_count, x._dtype, device=device.index), tiles.numel(), BLOCK,
           [data_ptr(x), n, data_ptr(tiles)], stream)
    _tile_offsets(tiles, results)
    (total,) = read_back(results)
    out = empty((total, self.ndim), dtypes.int64, device)
    if total and self.ndim:
        fn = load_rendered(render_nonzero_write, x._dtype, self.ndim, device=device.index)
        launch(fn, tiles.numel(), BLOCK, [data_ptr(out), data_ptr(x), n, data_ptr(tiles), *self._shape], stream)
    return _column_major(out)


# ---------------------------------------------------------------------------------------------- repeat_interleave

def render_repeats_total(dtype: DType) -> tuple[str, str]:
    """(name, CUDA source) of repeat_interleave's step 1: ``tiles[b]`` = the sum of tile b of ``repeats`` (read
    with ``stride``), and ``least[0]`` lowered to any negative repeat."""
    name = f"tw_repeats_total_{SUFFIX[dtype.name]}"
    lines = ["__shared__ long long warp_sums[32];",
             f"const long long base = (long long)blockIdx.x * {TILE};",
             "long long sum = 0, low = 0;",
             f"for (int k = 0; k < {ROUNDS}; ++k) {{",
             f"    const long long e = base + k * {BLOCK} + threadIdx.x;",
             "    if (e < n) {",
             "        const long long r = (long long)repeats[e * stride];",
             "        sum += r;",
             "        low = r < low ? r : low;",
             "    }",
             "}",
             "long long all;",
             "tw_block_exclusive_scan(sum, warp_sums, &all);",
             "if (threadIdx.x == 0) tiles[blockIdx.x] = all;",
             "if (low < 0) atomicMin(least, low);"]
    params = [f"const {CUDA.ctype(dtype)}* __restrict__ repeats", "long long n", "long long stride",
              "long long* __restrict__ tiles", "long long* __restrict__ least"]
    return name, BLOCK_SCAN_C + "\n" + _kernel_text(name, BLOCK, params, lines) + "\n"


def render_repeats_ends(dtype: DType) -> tuple[str, str]:
    """(name, CUDA source) of repeat_interleave's step 3: ``ends[e]`` = repeats[0] + ... + repeats[e]."""
    name = f"tw_repeats_ends_{SUFFIX[dtype.name]}"
    lines = ["__shared__ long long warp_sums[32];",
             f"const long long base = (long long)blockIdx.x * {TILE};",
             "long long at = offsets[blockIdx.x];",
             f"for (int k = 0; k < {ROUNDS}; ++k) {{",
             f"    const long long e = base + k * {BLOCK} + threadIdx.x;",
             "    const long long r = e < n ? (long long)repeats[e * stride] : 0;",
             "    long long round;",
             "    const long long before = tw_block_exclusive_scan(r, warp_sums, &round);",
             "    if (e < n) ends[e] = at + before + r;",
             "    at += round;",
             "}"]
    params = ["long long* __restrict__ ends", f"const {CUDA.ctype(dtype)}* __restrict__ repeats", "long long n",
              "long long stride", "const long long* __restrict__ offsets"]
    return name, BLOCK_SCAN_C + "\n" + _kernel_text(name, BLOCK, params, lines) + "\n"


def render_repeat_positions(out_dtype: DType) -> tuple[str, str]:
    """(name, CUDA source) of the last kernel: ``out[j]`` = the first element whose end lies after ``j``."""
    name = f"tw_repeat_positions_{SUFFIX[out_dtype.name]}"
    lines = ["const long long j = (long long)blockIdx.x * blockDim.x + threadIdx.x;",
             "if (j >= total) return;",
             "long long lo = 0, hi = n;",
             "while (lo < hi) {",
             "    const long long mid = lo + ((hi - lo) >> 1);",
             "    if (ends[mid] > j) hi = mid;",
             "    else lo = mid + 1;",
             "}",
             f"out[j] = ({CUDA.ctype(out_dtype)})lo;"]
    params = [f"{CUDA.ctype(out_dtype)}* __restrict__ out", "const long long* __restrict__ ends", "long long n",
              "long long total"]
    return name, _kernel_text(name, BLOCK, params, lines) + "\n"


@kernel("repeat_interleave.Tensor")
def repeat_interleave_positions(device: Device, repeats: Tensor, output_size=None) -> Tensor:
    from tilewise.ops.movement import check_repeats, check_repeats_total

    out_dtype = check_repeats(repeats)
    n = repeats.numel()
    if n == 0:
        check_repeats_total(0, 0, output_size)
        return empty((0,), out_dtype, device)
    stride = repeats._strides[0] if repeats.ndim else 0
    tiles = empty((ceil_div(n, TILE),), dtypes.int64, device)
    ends = empty((n,), dtypes.int64, device)
    results = fill(empty((2,), dtypes.int64, device), 0)  # the total, and the least repeat if negative
    stream = stream_handle(device.index)
    launch(load_rendered(render_repeats_total, repeats._dtype, device=device.index), tiles.numel(), BLOCK,
           [data_ptr(repeats), n, stride, data_ptr(tiles), data_ptr(results) + 8], stream)
    _tile_offsets(tiles, results)
    launch(load_rendered(render_repeats_ends, repeats._dtype, device=device.index), tiles.numel(), BLOCK,
           [data_ptr(ends), data_ptr(repeats), n, stride, data_ptr(tiles)], stream)
    total, least = read_back(results)
    check_repeats_total(total, least, output_size)
    out = empty((total,), out_dtype, device)
    if total:
        launch(load_rendered(render_repeat_positions, out_dtype, device=device.index), ceil_div(total, BLOCK), BLOCK,
               [data_ptr(out), data_ptr(ends), n, total], stream)
    return out

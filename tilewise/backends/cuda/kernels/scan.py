"""Inclusive scans on CUDA: cumsum and cumprod, and the running extrema cummax and cummin, along one dim.

One warp scans one row: 32 elements at a time with a shuffle-up (Hillis-Steele) scan, carrying the running
total from chunk to chunk, so any row length works and the other dims are run-time sizes and strides.
Integers accumulate in int64. Floating totals are carried in float64: torch's CPU kernel carries a float32
cumsum in double and rounds each output once, and a float32 running total would stop growing at 2**24 when
adding ones; the tree-shaped warp scan adds in another order than the CPU's left-to-right loop, but in
float64 the difference is far below a float32 (or half) rounding step, so the outputs are torch's CPU outputs.
Shuffling doubles costs two shuffles instead of one; the scan is bound by memory, not by those. An input of
another dtype than the result (``dtype=``) is converted to the result dtype first, as torch does.

cummax/cummin scan (value, index) pairs with one rule: a later element takes over from an earlier running
extreme when it is at least as large (cummax) or small (cummin), and a NaN always takes over, so ties report
the latest position and a NaN stays from where it appears, as in torch. The rule picks the later side of
any two adjacent segments unless the earlier is strictly better, which is associative, so a tree-shaped
warp scan gives the same answer as the left-to-right loop. The value written is the element at the
reported index, loaded exactly (half types widen to float32 losslessly), so even the sign of a zero matches.

[Note: segmented running extremes]
A warp per row leaves the device idle when rows are few (one row of 4M elements is one warp walking 131072
chunks in turn), so fewer than ``SEGMENTED_ROWS`` rows longer than a segment are scanned by many blocks in
three launches, a chunked scan: each block scans its segment of ``SEGMENT`` elements (a warp scans its 256
in registers, eight warp scans in a row carrying the running extreme, and the warps' extremes meet in
shared memory) and writes the segment's extreme; one block per row scans those extremes in place (its 32
warps scan a piece each, then take in the extremes of the pieces before theirs); each block scans its
segment again, starting from the extreme of the segments before it, and writes the outputs. The rule is
associative, so this is the same answer. Positions past the row's end take part in the scans but only ever
follow real positions, so they change nothing that is written or carried.
"""

from __future__ import annotations

from tilewise import dtypes
from tilewise import strides as S
from tilewise.backends.cuda.device_memory import data_ptr, empty, stream_handle
from tilewise.backends.cuda.kernels import ceil_div, kernel, launch, load_rendered
from tilewise.codegen.render import CUDA
from tilewise.codegen.render.cstyle import SUFFIX, Source, literal, load_code, store_code
from tilewise.device import Device
from tilewise.dtypes import DType, compute_dtype
from tilewise.tensor import Tensor

WARPS = 4
SEGMENT_WARPS = 8
SEGMENT_ITEMS = 8  # elements a lane holds in registers
SEGMENT = 32 * SEGMENT_WARPS * SEGMENT_ITEMS  # elements one block scans in the segmented path
SEGMENTED_ROWS = 4096  # with fewer rows a warp per row leaves most of the device idle
CARRY_WARPS = 32  # the warps of the block that scans one row's segment extremes



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


def _kernel_text(name: str, params: list[str], lines: list[str], threads: int = 32 * WARPS) -> str:
    body = "\n".join("    " + ln for ln in lines)
    return (f'extern "C" __global__ void __launch_bounds__({threads}) {name}({", ".join(params)}) '
            f"{{\n{body}\n}}")


def running_total_type(compute: DType) -> DType:
    """The dtype a scan carries its running total in (see the note above)."""
    return dtypes.float64 if compute.is_floating_point else compute


def _scan_operand(input_dtype: DType, output: DType) -> str:
    """The row's element ``j`` as the result dtype computes it (converted to the result dtype first)."""
    loaded = load_code(CUDA, input_dtype, "in[in_base + j * in_stride]")
    if input_dtype is output:
        return loaded
    return load_code(CUDA, output, store_code(CUDA, output, loaded, compute_dtype(input_dtype)))


def render_scan(name: str, combiner: str, input_dtype: DType, compute: DType, output: DType, rank: int) -> str:
    source = Source(CUDA)
    source.need_storage(input_dtype)
    source.need_storage(output)
    acc = running_total_type(compute)
    c_acc = CUDA.ctype(acc)
    ident = literal(0 if combiner == "add" else 1, acc, CUDA)
    op = "+" if combiner == "add" else "*"
    params = [f"{CUDA.ctype(output)}* __restrict__ out", f"const {CUDA.ctype(input_dtype)}* __restrict__ in",
              *row_params(rank)]
    loaded = _scan_operand(input_dtype, output)
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


FULL = "0xffffffffu"


def _lane_scan(combiner: str, carrier: DType, v: str, i: str) -> list[str]:
    """Lines making each lane's (``v``, ``i``) the running extreme of lanes 0..lane (a shuffle-up warp scan)."""
    return ["for (int s = 1; s < 32; s <<= 1) {",
            f"    const {CUDA.ctype(carrier)} ov = __shfl_up_sync({FULL}, {v}, s);",
            f"    const long long oi = __shfl_up_sync({FULL}, {i}, s);",
            f"    if (lane >= s && !{_takes_over(combiner, carrier, v, 'ov')}) {{ {v} = ov; {i} = oi; }}",
            "}"]


def _continue(combiner: str, carrier: DType, v: str, i: str, before_v: str, before_i: str) -> str:
    """A line making (``v``, ``i``) the running extreme from (``before_v``, ``before_i``), the extreme of the
    elements before them (none when ``before_i`` < 0)."""
    return (f"if ({before_i} >= 0 && !{_takes_over(combiner, carrier, v, before_v)}) "
            f"{{ {v} = {before_v}; {i} = {before_i}; }}")


def _extreme_params(dtype: DType, rank: int) -> list[str]:
    return [f"{CUDA.ctype(dtype)}* __restrict__ values", "long long* __restrict__ indices",
            f"const {CUDA.ctype(dtype)}* __restrict__ in", *row_params(rank)]


def render_running_extreme(name: str, combiner: str, dtype: DType, rank: int) -> str:
    """cummax (``combiner`` "max") or cummin ("min"): values and int64 indices, one warp per row."""
    source = Source(CUDA)
    source.need_storage(dtype)
    carrier = extreme_carrier(dtype)
    c = CUDA.ctype(carrier)
    loaded = load_code(CUDA, dtype, "in[in_base + j * in_stride]")
    lines = [*_warp_per_row(), *row_offsets(rank),
             f"{c} carry_v = 0;",
             "long long carry_i = -1;  // no running extreme before the first chunk",
             "for (long long start = 0; start < n; start += 32) {",
             "    const long long j = start + lane;",
             f"    {c} v = j < n ? ({c})({loaded}) : ({c})0;",
             "    long long i = j;",
             *("    " + ln for ln in _lane_scan(combiner, carrier, "v", "i")),
             "    " + _continue(combiner, carrier, "v", "i", "carry_v", "carry_i"),
             "    if (j < n) {",
             f"        values[out_base + j * out_stride] = {store_code(CUDA, dtype, 'v', carrier)};",
             "        indices[out_base + j * out_stride] = i;",
             "    }",
             f"    carry_v = __shfl_sync({FULL}, v, 31);",
             f"    carry_i = __shfl_sync({FULL}, i, 31);",
             "}"]
    return source.text(_kernel_text(name, _extreme_params(dtype, rank), lines))


REDUCE, FINISH = "reduce", "finish"  # the two passes of a segment (see [Note: segmented running extremes])


def render_extreme_segment(name: str, combiner: str, dtype: DType, rank: int, mode: str) -> str:
    """One block scans one segment of a row: block b, segment ``b % segs`` of row ``b / segs``.

    ``REDUCE`` writes the segment's extreme to ``seg_v``/``seg_i`` at b; ``FINISH`` starts from the extreme
    of the segments before (``seg_v``/``seg_i`` at b - 1, scanned by then) and writes the outputs."""
    source = Source(CUDA)
    source.need_storage(dtype)
    carrier = extreme_carrier(dtype)
    c = CUDA.ctype(carrier)
    params = [*_extreme_params(dtype, rank)[:3], f"{c}* __restrict__ seg_v", "long long* __restrict__ seg_i",
              "long long segs", *row_params(rank)]
    loaded = load_code(CUDA, dtype, "in[in_base + j * in_stride]")
    lines = ["const long long row = blockIdx.x / segs, seg = blockIdx.x - row * segs;",
             "const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;",
             *row_offsets(rank),
             f"const long long start = seg * {SEGMENT} + warp * {32 * SEGMENT_ITEMS} + lane;",
             f"{c} v[{SEGMENT_ITEMS}];",
             f"long long i[{SEGMENT_ITEMS}];",
             "#pragma unroll",
             f"for (int m = 0; m < {SEGMENT_ITEMS}; ++m) {{",
             "    const long long j = start + 32 * m;",
             f"    v[m] = j < n ? ({c})({loaded}) : ({c})0;",
             "    i[m] = j;",
             "}",
             f"{c} run_v = 0;",
             "long long run_i = -1;  // the running extreme of the warp's elements so far",
             "#pragma unroll",
             f"for (int m = 0; m < {SEGMENT_ITEMS}; ++m) {{",
             *("    " + ln for ln in _lane_scan(combiner, carrier, "v[m]", "i[m]")),
             "    " + _continue(combiner, carrier, "v[m]", "i[m]", "run_v", "run_i"),
             f"    run_v = __shfl_sync({FULL}, v[m], 31);",
             f"    run_i = __shfl_sync({FULL}, i[m], 31);",
             "}",
             f"__shared__ {c} warp_v[{SEGMENT_WARPS}];",
             f"__shared__ long long warp_i[{SEGMENT_WARPS}];",
             "if (lane == 0) {",
             "    warp_v[warp] = run_v;",
             "    warp_i[warp] = run_i;",
             "}",
             "__syncthreads();",
             f"{c} before_v = 0;",
             "long long before_i = -1;"]
    if mode == FINISH:
        lines += ["if (seg > 0) {",
                  "    before_v = seg_v[blockIdx.x - 1];",
                  "    before_i = seg_i[blockIdx.x - 1];",
                  "}",
                  "for (int w = 0; w < warp; ++w) {",
                  f"    {c} wv = warp_v[w];",
                  "    long long wi = warp_i[w];",
                  "    " + _continue(combiner, carrier, "wv", "wi", "before_v", "before_i"),
                  "    before_v = wv;",
                  "    before_i = wi;",
                  "}",
                  "#pragma unroll",
                  f"for (int m = 0; m < {SEGMENT_ITEMS}; ++m) {{",
                  "    const long long j = start + 32 * m;",
                  "    " + _continue(combiner, carrier, "v[m]", "i[m]", "before_v", "before_i"),
                  "    if (j < n) {",
                  f"        values[out_base + j * out_stride] = {store_code(CUDA, dtype, 'v[m]', carrier)};",
                  "        indices[out_base + j * out_stride] = i[m];",
                  "    }",
                  "}"]
    else:
        lines += ["if (threadIdx.x == 0) {",
                  f"    for (int w = 0; w < {SEGMENT_WARPS}; ++w) {{",
                  f"        {c} wv = warp_v[w];",
                  "        long long wi = warp_i[w];",
                  "        " + _continue(combiner, carrier, "wv", "wi", "before_v", "before_i"),
                  "        before_v = wv;",
                  "        before_i = wi;",
                  "    }",
                  "    seg_v[blockIdx.x] = before_v;",
                  "    seg_i[blockIdx.x] = before_i;",
                  "}"]
    return source.text(_kernel_text(name, params, lines, 32 * SEGMENT_WARPS))


def render_extreme_carries(name: str, combiner: str, carrier: DType) -> str:
    """One block per row scans the row's ``segs`` segment extremes (``seg_v``/``seg_i``) in place: warp w
    scans piece w of the row, then takes in the extreme of the pieces before it."""
    c = CUDA.ctype(carrier)
    params = [f"{c}* __restrict__ seg_v", "long long* __restrict__ seg_i", "long long segs"]
    lines = ["const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;",
             f"const long long piece = (segs + {CARRY_WARPS - 1}) / {CARRY_WARPS};",
             "const long long begin = blockIdx.x * segs + min(warp * piece, segs);",
             "const long long end = blockIdx.x * segs + min((warp + 1) * piece, segs);",
             f"{c} carry_v = 0;",
             "long long carry_i = -1;",
             "for (long long start = begin; start < end; start += 32) {",
             "    const long long j = start + lane;",
             f"    {c} v = j < end ? seg_v[j] : ({c})0;",
             "    long long i = j < end ? seg_i[j] : 0;",
             *("    " + ln for ln in _lane_scan(combiner, carrier, "v", "i")),
             "    " + _continue(combiner, carrier, "v", "i", "carry_v", "carry_i"),
             "    if (j < end) {",
             "        seg_v[j] = v;",
             "        seg_i[j] = i;",
             "    }",
             "    const int last = end - start < 32 ? (int)(end - start) - 1 : 31;  // the piece's last lane",
             f"    carry_v = __shfl_sync({FULL}, v, last);",
             f"    carry_i = __shfl_sync({FULL}, i, last);",
             "}",
             f"__shared__ {c} warp_v[{CARRY_WARPS}];",
             f"__shared__ long long warp_i[{CARRY_WARPS}];",
             "if (lane == 0) {",
             "    warp_v[warp] = carry_v;",
             "    warp_i[warp] = carry_i;",
             "}",
             "__syncthreads();",
             f"{c} before_v = 0;",
             "long long before_i = -1;",
             "for (int w = 0; w < warp; ++w) {",
             f"    {c} wv = warp_v[w];",
             "    long long wi = warp_i[w];",
             "    if (wi < 0) continue;  // an empty piece",
             "    " + _continue(combiner, carrier, "wv", "wi", "before_v", "before_i"),
             "    before_v = wv;",
             "    before_i = wi;",
             "}",
             "if (before_i < 0) return;",
             "for (long long j = begin + lane; j < end; j += 32) {",
             f"    {c} v = seg_v[j];",
             "    long long i = seg_i[j];",
             "    " + _continue(combiner, carrier, "v", "i", "before_v", "before_i"),
             "    seg_v[j] = v;",
             "    seg_i[j] = i;",
             "}"]
    return _kernel_text(name, params, lines, 32 * CARRY_WARPS) + "\n"


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
    fn = load_rendered(render_scan, combiner, x._dtype, compute, out_dtype, rank, device=x._device.index, name=name)
    launch(fn, ceil_div(rows, WARPS), 32 * WARPS, [data_ptr(out), data_ptr(x), rows, n, in_stride, out_stride,
                                                    *geometry], stream_handle(x._device.index))
    return out


def running_extreme(name: str, combiner: str, x: Tensor, dim: int) -> tuple[Tensor, Tensor]:
    d = S.normalize_dim(dim, max(x.ndim, 1), name)
    values, indices = empty(x._shape, x._dtype, x._device), empty(x._shape, dtypes.int64, x._device)
    rows, n, in_stride, out_stride, rank, geometry = row_geometry(x, d, x._shape)
    if rows == 0 or n == 0:
        return values, indices
    device, stream = x._device.index, stream_handle(x._device.index)
    pointers, row_args = [data_ptr(values), data_ptr(indices), data_ptr(x)], [rows, n, in_stride, out_stride, *geometry]
    if n > SEGMENT and rows < SEGMENTED_ROWS:
        _segmented_extreme(name, combiner, x, rank, pointers, row_args)
        return values, indices
    kernel_name = f"tw_{name}_{SUFFIX[x._dtype.name]}_r{rank}"
    fn = load_rendered(render_running_extreme, combiner, x._dtype, rank, device=device, name=kernel_name)
    launch(fn, ceil_div(rows, WARPS), 32 * WARPS, [*pointers, *row_args], stream)
    return values, indices


def _segmented_extreme(name: str, combiner: str, x: Tensor, rank: int, pointers: list[int],
                       row_args: list[int]) -> None:
    """The three launches of [Note: segmented running extremes]."""
    device, stream = x._device.index, stream_handle(x._device.index)
    rows, n = row_args[0], row_args[1]
    segs = ceil_div(n, SEGMENT)
    carrier = extreme_carrier(x._dtype)
    seg_v, seg_i = empty((rows * segs,), carrier, x._device), empty((rows * segs,), dtypes.int64, x._device)
    segment_args = [*pointers, data_ptr(seg_v), data_ptr(seg_i), segs, *row_args]

    def segment_pass(mode: str) -> None:
        kernel_name = f"tw_{name}_{mode}_{SUFFIX[x._dtype.name]}_r{rank}"
        fn = load_rendered(render_extreme_segment, combiner, x._dtype, rank, mode, device=device, name=kernel_name)
        launch(fn, rows * segs, 32 * SEGMENT_WARPS, segment_args, stream)

    segment_pass(REDUCE)
    carries_name = f"tw_{name}_carries_{SUFFIX[carrier.name]}"
    carries = load_rendered(render_extreme_carries, combiner, carrier, device=device, name=carries_name)
    launch(carries, rows, 32 * CARRY_WARPS, [data_ptr(seg_v), data_ptr(seg_i), segs], stream)
    segment_pass(FINISH)


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

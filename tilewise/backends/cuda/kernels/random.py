"""Random operators on CUDA, bit-identical to the CPU generator (see [Note: Philox stream layout]).

Thread ``t`` of a draw computes Philox block ``offset + t`` and turns its four words into the values the
numpy implementation assigns to those words: four float32 uniforms or normals, two float64 ones, four
32-bit or two 64-bit integers. The generator is the same object on both devices, so the same seed gives
the same tensor on CPU and GPU.

randperm and multinomial are built from the same draws as their CPU kernels, so they match them too.
randperm is the stable argsort of n 32-bit words: the words become int32 keys (sign bit flipped, so the
signed order of the keys is the unsigned order of the words) and go through the device sort, whose (key,
index) order is exactly numpy's stable argsort. multinomial follows [Note: multinomial draws]: a block of
``MULTINOMIAL_TILES`` threads per row, thread t summing tile t left to right and thread 0 the tiles' totals,
so every float64 cumulative weight is the one numpy computes. Without replacement (or for one sample) the
block draws the row's samples one after another, recounting the cumulative weights at most x after each;
with replacement one kernel writes each row's cumulative weights and another finds each sample by binary
search, a thread per sample. The probabilities are checked first (one small read back, as torch does), so an
invalid row raises the CPU's error before anything is drawn.
"""

from __future__ import annotations

import string

import numpy as np

from tilewise import _philox, dtypes
from tilewise import strides as S
from tilewise.backends.cuda.device_memory import data_ptr, empty, stream_handle
from tilewise.backends.cuda.kernels import ceil_div, kernel, launch, load, load_rendered
from tilewise.backends.cuda.kernels.copy import cast, contiguous
from tilewise.backends.cuda.kernels.creation import fill
from tilewise.backends.cuda.runtime.capturing import refuse_under_capture
from tilewise.codegen.render import CUDA
from tilewise.codegen.render.cstyle import SUFFIX, Source, compute_of, load_code, store_code
from tilewise.device import Device
from tilewise.dtypes import DType
from tilewise.tensor import Tensor

_BLOCK = 256

# values per Philox block, and the C statements producing value k of this thread into ``v[k]``
_VALUES = {
    "uniform_f32": (4, "float v[4] = {tw_uniform_float(w.x), tw_uniform_float(w.y), tw_uniform_float(w.z), "
                       "tw_uniform_float(w.w)};\n"
                       "    for (int k = 0; k < 4; ++k) v[k] = __fadd_rn(__fmul_rn(v[k], scale), shift);"),
    "uniform_f64": (2, "double v[2] = {tw_uniform_double(w.x, w.y), tw_uniform_double(w.z, w.w)};\n"
                       "    for (int k = 0; k < 2; ++k) v[k] = __dadd_rn(__dmul_rn(v[k], scale), shift);"),
    "normal_f32": (4, "float v[4];\n    tw_normal_float2(w.x, w.y, &v[0], &v[1]);\n"
                      "    tw_normal_float2(w.z, w.w, &v[2], &v[3]);"),
    "normal_f64": (2, "double v[2];\n    tw_normal_double2(w.x, w.y, w.z, w.w, &v[0], &v[1]);"),
    "randint_32": (4, "long long v[4];\n    const tw_u32 words[4] = {w.x, w.y, w.z, w.w};\n"
                      "    for (int k = 0; k < 4; ++k) v[k] = (long long)((span ? (tw_u64)words[k] % span : "
                      "(tw_u64)words[k]) + low);"),
    "randint_64": (2, "long long v[2];\n"
                      "    const tw_u64 words[2] = {((tw_u64)w.x << 32) | w.y, ((tw_u64)w.z << 32) | w.w};\n"
                      "    for (int k = 0; k < 2; ++k) v[k] = (long long)((span ? words[k] % span : words[k]) + low);"),
    # randperm's sort keys: a word with its sign bit flipped, so int32 order is the words' unsigned order
    "sortable_32": (4, "int v[4];\n    const tw_u32 words[4] = {w.x, w.y, w.z, w.w};\n"
                       "    for (int k = 0; k < 4; ++k) v[k] = (int)(words[k] ^ 0x80000000u);"),
}
_PARAMS = {"uniform": ", {T} scale, {T} shift", "normal": "", "randint": ", tw_u64 span, tw_u64 low", "sortable": ""}
_VALUE_TYPE = {"uniform_f32": dtypes.float32, "uniform_f64": dtypes.float64, "normal_f32": dtypes.float32,
               "normal_f64": dtypes.float64, "randint_32": dtypes.int64, "randint_64": dtypes.int64,
               "sortable_32": dtypes.int32}


def render_draw(kind: str, dtype: DType) -> tuple[str, str]:
    """(name, CUDA source) of a draw: out[i] for the values of Philox blocks offset + t, t = this thread."""
    per_block, body = _VALUES[kind]
    value_type = _VALUE_TYPE[kind]
    source = Source(CUDA)
    source.need_storage(dtype)
    name = f"tw_{kind}_{SUFFIX[dtype.name]}"
    params = _PARAMS[kind.split("_")[0]].format(T=CUDA.ctype(value_type))
    store = store_code(CUDA, dtype, "v[k]", value_type)
    text = (f'extern "C" __global__ void {name}({CUDA.ctype(dtype)}* __restrict__ out, long long n, '
            f"tw_u64 seed, tw_u64 offset{params}) {{\n"
            f"    const long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;\n"
            f"    if (t * {per_block} >= n) return;\n"
            f"    const tw_u32x4 w = tw_philox_block(seed, offset + (tw_u64)t);\n    {body}\n"
            f"    for (int k = 0; k < {per_block}; ++k)\n"
            f"        if (t * {per_block} + k < n) out[t * {per_block} + k] = {store};\n}}")
    return name, source.text(_philox.PHILOX_CUDA_SOURCE + "\n" + text)


def _claim(generator, counters: int) -> tuple[int, int]:
    """The (seed, offset) of a draw of ``counters`` Philox blocks, advancing the generator. Not while a CUDA graph
    is captured: the graph would bake them in and every replay would repeat the same numbers."""
    from tilewise.ops.creation import generator_or_default

    refuse_under_capture("drawing random numbers")
    return generator_or_default(generator).claim(counters)


def _draw_kernel(kind: str, dtype: DType, device: int):
    name, text = render_draw(kind, dtype)
    return load(text, name, device), _VALUES[kind][0]


def _generate(kind: str, size, dtype: DType, device: Device, generator, work, extra: tuple) -> Tensor:
    out = empty(tuple(size), dtype, device)
    n = out.numel()
    seed, offset = _claim(generator, _philox.counters_needed(n, work))
    if n:
        fn, per_block = _draw_kernel(kind, dtype, device.index)
        threads = ceil_div(n, per_block)
        launch(fn, ceil_div(threads, _BLOCK), _BLOCK, [data_ptr(out), n, seed, offset, *extra],
               stream_handle(device.index))
    return out


def _wide(dtype: DType) -> bool:
    return dtype.itemsize == 8


@kernel("uniform")
def uniform(device: Device, size, low=0.0, high=1.0, dtype=None, target=None, generator=None) -> Tensor:
    wide = _wide(dtype)
    work = np.float64 if wide else np.float32
    scale, shift = (float(high - low), float(low)) if (low != 0.0 or high != 1.0) else (1.0, 0.0)
    return _generate("uniform_f64" if wide else "uniform_f32", size, dtype, device, generator, work, (scale, shift))


@kernel("normal_sample")
def normal_sample(device: Device, size, dtype=None, target=None, generator=None) -> Tensor:
    wide = _wide(dtype)
    return _generate("normal_f64" if wide else "normal_f32", size, dtype, device, generator,
                     np.float64 if wide else np.float32, ())


@kernel("randint")
def randint(device: Device, low, high, size, dtype=None, target=None, generator=None) -> Tensor:
    draw = _philox.randint_draw_dtype(low, high)
    span = (high - low) % (1 << 64)
    kind = "randint_32" if draw == np.uint32 else "randint_64"
    return _generate(kind, size, dtype, device, generator, draw, (span, low % (1 << 64)))


@kernel("bernoulli")
def bernoulli(device: Device, self: Tensor, generator=None) -> Tensor:
    p = contiguous(self)
    out = empty(p._shape, p._dtype, device)
    n = out.numel()
    seed, offset = _claim(generator, _philox.counters_needed(n, np.float32))
    if n:
        compare = compute_of(p._dtype)
        source = Source(CUDA)
        source.need_storage(p._dtype)
        c, cc = CUDA.ctype(p._dtype), CUDA.ctype(compare)
        name = f"tw_bernoulli_{SUFFIX[p._dtype.name]}"
        prob = load_code(CUDA, p._dtype, "p[i]")
        one, zero = store_code(CUDA, p._dtype, "1", compare), store_code(CUDA, p._dtype, "0", compare)
        text = (f'extern "C" __global__ void {name}({c}* __restrict__ out, const {c}* __restrict__ p, long long n, '
                f"tw_u64 seed, tw_u64 offset) {{\n"
                f"    const long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;\n"
                f"    if (t * 4 >= n) return;\n"
                f"    const tw_u32x4 w = tw_philox_block(seed, offset + (tw_u64)t);\n"
                f"    const tw_u32 words[4] = {{w.x, w.y, w.z, w.w}};\n"
                f"    for (int k = 0; k < 4; ++k) {{\n        const long long i = t * 4 + k;\n"
                f"        if (i >= n) return;\n"
                f"        out[i] = ({cc})tw_uniform_float(words[k]) < ({cc})({prob}) ? {one} : {zero};\n    }}\n}}")
        fn = load(source.text(_philox.PHILOX_CUDA_SOURCE + "\n" + text), name, device.index)
        launch(fn, ceil_div(ceil_div(n, 4), _BLOCK), _BLOCK, [data_ptr(out), data_ptr(p), n, seed, offset],
               stream_handle(device.index))
    return out


# ---------------------------------------------------------------------------------------------- randperm

@kernel("randperm")
def randperm(device: Device, n: int, dtype=None, target=None, generator=None) -> Tensor:
    from tilewise.backends.cuda.kernels.sort import sorted_prefix

    keys = _generate("sortable_32", (n,), dtypes.int32, device, generator, np.uint32, ())
    if n == 0:
        return empty((0,), dtype, device)
    order = sorted_prefix("randperm", keys, 0, n, False)[1]
    return order if dtype is dtypes.int64 else cast(order, dtype)


# ---------------------------------------------------------------------------------------------- multinomial

_TILE_SUMS_C = string.Template("""\
#ifndef TW_MULTINOMIAL_TILES
#define TW_MULTINOMIAL_TILES ${TILES}
// A category's weight in the sums: a drawn one (negative) and a weightless one add nothing.
static __device__ __forceinline__ double tw_weight(double w) { return w > 0.0 ? w : 0.0; }

// The float64 uniform draw number k of the stream at (seed, offset): two words per value, as on the CPU.
static __device__ __forceinline__ double tw_uniform_double_at(tw_u64 seed, tw_u64 offset, long long k) {
    const tw_u32x4 b = tw_philox_block(seed, offset + (tw_u64)(k >> 1));
    return (k & 1) ? tw_uniform_double(b.z, b.w) : tw_uniform_double(b.x, b.y);
}

// This thread's tile of a row of n categories, [*lo, *hi) (empty past the end of the row).
static __device__ __forceinline__ void tw_tile(long long n, long long* lo, long long* hi) {
    const long long length = (n + TW_MULTINOMIAL_TILES - 1) / TW_MULTINOMIAL_TILES;
    *lo = (long long)threadIdx.x * length;
    *hi = *lo + length < n ? *lo + length : n;
}

static __device__ __forceinline__ double tw_tile_total(const double* row, long long lo, long long hi) {
    double s = 0.0;
    for (long long i = lo; i < hi; ++i) s = __dadd_rn(s, tw_weight(row[i]));
    return s;
}

// By one thread, once every tile's total is in totals: before[k] = totals[0] + ... + totals[k - 1], added
// left to right; returns the row's total.
static __device__ __forceinline__ double tw_tiles_before(const double* totals, double* before) {
    double sum = 0.0;
    for (int k = 0; k < TW_MULTINOMIAL_TILES; ++k) {
        before[k] = sum;
        sum = __dadd_rn(sum, totals[k]);
    }
    return sum;
}
#endif
""")


def _multinomial_source(name: str, params: list[str], lines: list[str]) -> tuple[str, str]:
    from tilewise.ops.creation import MULTINOMIAL_TILES

    body = "\n".join("    " + ln for ln in lines)
    text = (f'extern "C" __global__ void __launch_bounds__({MULTINOMIAL_TILES}) {name}({", ".join(params)}) '
            f"{{\n{body}\n}}\n")
    return name, _philox.PHILOX_CUDA_SOURCE + _TILE_SUMS_C.substitute(TILES=MULTINOMIAL_TILES) + text


def render_multinomial_check() -> tuple[str, str]:
    """A block per row of the float64 probabilities ``w`` (rows, n): bit 1 of ``status`` for a negative,
    infinite or NaN element, bit 2 for a row with no positive one."""
    lines = ["const double* const row = w + (long long)blockIdx.x * n;",
             "bool invalid = false, weighty = false;",
             "for (long long i = threadIdx.x; i < n; i += blockDim.x) {",
             "    const double v = row[i];",
             "    invalid = invalid || !(v >= 0.0) || isinf(v);",
             "    weighty = weighty || v > 0.0;",
             "}",
             "invalid = __syncthreads_or(invalid);",
             "weighty = __syncthreads_or(weighty);",
             "if (threadIdx.x == 0 && (invalid || !weighty)) atomicOr(status, (invalid ? 1ull : 0ull) | "
             "(weighty ? 0ull : 2ull));"]
    return _multinomial_source("tw_multinomial_check", ["const double* __restrict__ w", "long long n",
                                                        "unsigned long long* __restrict__ status"], lines)


def render_multinomial_one_by_one() -> tuple[str, str]:
    """A block per row draws the row's samples one after another, each from the cumulative weights left by
    the ones before (drawn categories weigh nothing without replacement). ``w`` is a scratch copy."""
    lines = ["__shared__ double totals[TW_MULTINOMIAL_TILES], before[TW_MULTINOMIAL_TILES];",
             "__shared__ double x_shared, total_shared;",
             "__shared__ unsigned long long at_most_x;",
             "const long long r = blockIdx.x;",
             "double* const row = w + r * n;",
             "long long lo, hi;",
             "tw_tile(n, &lo, &hi);",
             "for (long long j = 0; j < samples; ++j) {",
             "    totals[threadIdx.x] = tw_tile_total(row, lo, hi);",
             "    if (threadIdx.x == 0) at_most_x = 0;",
             "    __syncthreads();",
             "    if (threadIdx.x == 0) {",
             "        total_shared = tw_tiles_before(totals, before);",
             "        x_shared = __dmul_rn(tw_uniform_double_at(seed, offset, r * samples + j), total_shared);",
             "    }",
             "    __syncthreads();",
             "    const double x = x_shared, start = before[threadIdx.x];",
             "    double inside = 0.0;",
             "    unsigned long long mine = 0;",
             "    for (long long i = lo; i < hi; ++i) {",
             "        inside = __dadd_rn(inside, tw_weight(row[i]));",
             "        mine += !(__dadd_rn(start, inside) > x);",
             "    }",
             "    if (mine) atomicAdd(&at_most_x, mine);",
             "    __syncthreads();",
             "    if (threadIdx.x == 0) {",
             "        long long pick = 0;",
             "        if (total_shared > 0.0) {",
             "            pick = at_most_x < (unsigned long long)n ? (long long)at_most_x : n - 1;",
             "            while (pick > 0 && !(row[pick] > 0.0)) --pick;",
             "        } else {  // every category left weighs nothing: the lowest one not drawn yet",
             "            while (row[pick] < 0.0) ++pick;",
             "        }",
             "        out[r * samples + j] = pick;",
             "        if (!replacement) row[pick] = -1.0;",
             "    }",
             "    __syncthreads();",
             "}"]
    params = ["long long* __restrict__ out", "double* __restrict__ w", "long long n", "long long samples",
              "int replacement", "tw_u64 seed", "tw_u64 offset"]
    return _multinomial_source("tw_multinomial_one_by_one", params, lines)


def render_multinomial_cdf() -> tuple[str, str]:
    """A block per row writes the row's cumulative weights and its total."""
    lines = ["__shared__ double totals[TW_MULTINOMIAL_TILES], before[TW_MULTINOMIAL_TILES];",
             "const long long r = blockIdx.x;",
             "const double* const row = w + r * n;",
             "long long lo, hi;",
             "tw_tile(n, &lo, &hi);",
             "totals[threadIdx.x] = tw_tile_total(row, lo, hi);",
             "__syncthreads();",
             "if (threadIdx.x == 0) row_totals[r] = tw_tiles_before(totals, before);",
             "__syncthreads();",
             "const double start = before[threadIdx.x];",
             "double inside = 0.0;",
             "for (long long i = lo; i < hi; ++i) {",
             "    inside = __dadd_rn(inside, tw_weight(row[i]));",
             "    cdf[r * n + i] = __dadd_rn(start, inside);",
             "}"]
    params = ["double* __restrict__ cdf", "double* __restrict__ row_totals", "const double* __restrict__ w",
              "long long n"]
    return _multinomial_source("tw_multinomial_cdf", params, lines)


def render_multinomial_search() -> tuple[str, str]:
    """A thread per sample (with replacement): the first category whose cumulative weight exceeds x, which
    is the count of those at most x (the sums never decrease)."""
    lines = ["const long long k = (long long)blockIdx.x * blockDim.x + threadIdx.x;",
             "if (k >= draws) return;",
             "const long long r = k / samples;",
             "const double x = __dmul_rn(tw_uniform_double_at(seed, offset, k), row_totals[r]);",
             "const double* const sums = cdf + r * n;",
             "long long lo = 0, hi = n;",
             "while (lo < hi) {",
             "    const long long mid = lo + ((hi - lo) >> 1);",
             "    if (sums[mid] > x) hi = mid;",
             "    else lo = mid + 1;",
             "}",
             "long long pick = lo < n ? lo : n - 1;",
             "const double* const row = w + r * n;",
             "while (pick > 0 && !(row[pick] > 0.0)) --pick;",
             "out[k] = pick;"]
    params = ["long long* __restrict__ out", "const double* __restrict__ cdf", "const double* __restrict__ row_totals",
              "const double* __restrict__ w", "long long draws", "long long n", "long long samples", "tw_u64 seed",
              "tw_u64 offset"]
    return _multinomial_source("tw_multinomial_search", params, lines)


@kernel("multinomial")
def multinomial(device: Device, self: Tensor, num_samples: int, replacement: bool = False,
                generator=None) -> Tensor:
    from tilewise.backends.cuda.kernels.search import read_back
    from tilewise.ops.creation import MULTINOMIAL_TILES, check_multinomial, check_probabilities

    check_multinomial(self, num_samples, replacement)
    n, rows = self._shape[-1], S.numel(self._shape[:-1])
    out = empty(self._shape[:-1] + (num_samples,), dtypes.int64, device)
    w = cast(self, dtypes.float64)  # contiguous (rows, n), and a scratch copy the draws may write
    stream = stream_handle(device.index)
    if rows:
        status = fill(empty((1,), dtypes.int64, device), 0)
        launch(load_rendered(render_multinomial_check, device=device.index), rows, MULTINOMIAL_TILES,
               [data_ptr(w), n, data_ptr(status)], stream)
        (flags,) = read_back(status)
        check_probabilities(bool(flags & 1), bool(flags & 2))
    seed, offset = _claim(generator, _philox.counters_needed(rows * num_samples, np.float64))
    if not rows:
        return out
    if replacement and num_samples > 1:
        cdf, totals = empty((rows, n), dtypes.float64, device), empty((rows,), dtypes.float64, device)
        launch(load_rendered(render_multinomial_cdf, device=device.index), rows, MULTINOMIAL_TILES,
               [data_ptr(cdf), data_ptr(totals), data_ptr(w), n], stream)
        draws = rows * num_samples
        launch(load_rendered(render_multinomial_search, device=device.index), ceil_div(draws, _BLOCK), _BLOCK,
               [data_ptr(out), data_ptr(cdf), data_ptr(totals), data_ptr(w), draws, n, num_samples, seed, offset],
               stream)
    else:
        launch(load_rendered(render_multinomial_one_by_one, device=device.index), rows, MULTINOMIAL_TILES,
               [data_ptr(out), data_ptr(w), n, num_samples, int(replacement), seed, offset], stream)
    return out

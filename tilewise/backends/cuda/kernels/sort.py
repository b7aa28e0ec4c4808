"""Sorting on CUDA: sort (values and int64 indices, any dim, either direction), and topk.

[Note: CUDA sort]
Every element becomes an unsigned *key* whose integer order is the wanted order: a float's bits with the sign
bit set for positives and every bit flipped for negatives, after -0.0 is made +0.0 (they are equal, so the
index decides) and every NaN is made the largest key (NaN sorts above +inf); integers flip their sign bit;
``descending`` flips every bit of the key, which puts NaN first, as torch does. Pairs (key, original index)
are then sorted by a bitonic network comparing key first and index second: all pairs differ, so the result
is the one order in which equal elements keep their input order, i.e. the stable sort, in both directions,
which is what the CPU backend computes. The values written are the input elements at the sorted indices,
so NaN payloads and signed zeros come out bit for bit.

The network is Batcher's bitonic sort for ``P``, n rounded up to a power of two, in the form that sorts
every block ascending: stage k merges sorted runs of k / 2 into sorted runs of k, its first step comparing
mirrored positions (i with k - 1 - i, counted from the start of the two runs) and its later steps of span
j = k / 4, ..., 1 comparing i with i + j. The P - n positions past the row's end would hold keys larger
than every element, which such a network never moves, so they are left out: a compare reaching past n is
skipped, and chunks past n are never launched.

A block sorts a chunk of ``C = min(P, 4096)`` positions in shared memory (at most 48 KiB with 8-byte keys):
a row of up to 4096 elements is one block and one launch. A step of span at most 32 only exchanges pairs
among the 64 positions one warp handles, so between two such steps the warp synchronises alone; a longer
span, or the end of a stage, synchronises the block. A longer row runs the network in stages: a block
sorts each C-chunk (the network's first log2(C) stages); then for each following stage k, its steps of
span j >= C run in global memory, up to three to a launch (a thread loads the eight positions three
consecutive steps exchange among themselves, runs the steps in registers and stores them once), and one
block per chunk finishes the steps of span < C in shared memory, the last one writing the outputs. That is
O(n log^2 n) work and about log2(P/C)^2 / 6 + 3 log2(P/C) / 2 launches, for any length.

[Note: CUDA topk]
topk is the first k of the sort above (descending for ``largest``), so equal elements come out lowest index
first, and it is written sorted whatever ``sorted`` asks. When ``R``, k rounded up to a power of two, is at
most 1024 and shorter than the padded row, it is found without sorting the row (bitonic top-k): a block
takes a chunk of up to 4096 pairs (padded with the largest key), sorts its runs of R (the network's first
log2(R) stages), then halves the chunk until one run is left: comparing a run's pair i with the next run's
pair R - 1 - i, as a stage's first step would, leaves the smaller of each where the first run was, and
these are the two runs' R smallest pairs, in a bitonic sequence that log2(R) merge steps sort again.
The surviving runs stay where their first halves were, so round ``r`` keeps run ``i`` at position
``i * R * 2^r`` and no pair moves between rounds. A chunk's R smallest pairs are candidates: each row's
candidates form a shorter row, selected the same way until one chunk holds them all, and that last block
writes the first k. Each pass cuts a row by C / R >= 4, and the work per element is about log2(R)^2 / 4
compare-exchanges instead of the full sort's log2(P)^2 / 4. Pairs are unique, so the chunks' candidates
contain the row's k smallest and the answer is exactly the sort's prefix.
"""

from __future__ import annotations

from tilewise import _strides as S
from tilewise import dtypes
from tilewise.backends.cuda import data_ptr, empty, stream_handle
from tilewise.backends.cuda.kernels import ceil_div, kernel, launch, load_rendered
from tilewise.backends.cuda.kernels.scan import row_geometry, row_offsets, row_params
from tilewise.compiler.render import CUDA
from tilewise.compiler.render.cstyle import SUFFIX, Source, load_code
from tilewise.device import Device
from tilewise.dtypes import DType
from tilewise.tensor import Tensor

CHUNK = 4096  # pairs a block sorts in shared memory: 4096 * (8-byte key + 4-byte index) = 48 KiB
MAX_THREADS = 512
STEP_THREADS = 256
STEP_LEVELS = 3  # network steps one launch runs in global memory (eight elements per thread)
SELECT_RUN = 1024  # the longest run topk selects with; a larger k sorts the whole row
MAX_ROW = 1 << 30  # indices travel as int32 inside the sort, and padded positions must fit too

# block kernel variants: (reads the input, writes the outputs); otherwise it reads/writes the scratch pairs
ROWS, FIRST, MERGE, LAST = "rows", "first", "merge", "last"
MODES = {ROWS: (True, True), FIRST: (True, False), MERGE: (False, False), LAST: (False, True)}


def key_bits(dtype: DType) -> int:
    return 64 if dtype.itemsize == 8 else 32


def _key_type(bits: int) -> str:
    return "unsigned long long" if bits == 64 else "unsigned int"


def _key_helper(dtype: DType) -> tuple[str, str]:
    """(name, definition) of the device function turning a stored element into its ascending key."""
    bits = key_bits(dtype)
    k = _key_type(bits)
    name = f"tw_sort_key_{SUFFIX[dtype.name]}"
    value = load_code(CUDA, dtype, "x")
    if dtype.is_floating_point:
        wide, as_bits, sign = (("double", "__double_as_longlong", "0x8000000000000000ULL") if bits == 64 else
                               ("float", "__float_as_uint", "0x80000000u"))
        body = (f"    const {wide} v = {value};\n"
                f"    if (v != v) return ~({k})0;  // every NaN is the largest key\n"
                f"    {k} u = ({k}){as_bits}(v);\n"
                f"    if (u == {sign}) u = 0;  // -0.0 equals +0.0: the index decides\n"
                f"    return (u & {sign}) ? ~u : (u | {sign});")
    elif dtype in (dtypes.bool_, dtypes.uint8):
        body = f"    return ({k})x;"
    else:
        sign = "0x8000000000000000ULL" if bits == 64 else "0x80000000u"
        wide = "long long" if bits == 64 else "int"
        body = f"    return ({k})({wide})x ^ {sign};"
    text = f"static __device__ __forceinline__ {k} {name}({CUDA.ctype(dtype)} x) {{\n{body}\n}}"
    guard = f"TW_HELPER_{name.upper()}"
    return name, f"#ifndef {guard}\n#define {guard}\n{text}\n#endif"


def _compare_exchange(keys: str, idx: str, lo: str, hi: str, k: str) -> list[str]:
    """Order the pair at ``lo`` < ``hi`` ascending by (key, index)."""
    return [f"const {k} a = {keys}[{lo}], b = {keys}[{hi}];",
            f"const int ia = {idx}[{lo}], ib = {idx}[{hi}];",
            "if (a > b || (a == b && ia > ib)) {",
            f"    {keys}[{lo}] = b; {keys}[{hi}] = a; {idx}[{lo}] = ib; {idx}[{hi}] = ia;",
            "}"]


def _shared_steps(span: str, pairs: str, stage: str, k: str, position: str = "{}", within: str = "") -> list[str]:
    """Steps of span ``span``, ``span / 2``, ..., 1 of the stage ``stage`` on the pairs in shared memory (``sk``,
    ``si``); the step of span ``stage / 2`` compares mirrored positions (see [Note: CUDA sort]).

    Thread t handles compares t, t + blockDim, ... of ``pairs``; compare t orders the logical positions ``lo``
    and ``hi``, stored at ``position`` (a format string of a logical position), when ``within`` holds (a
    condition on ``hi``). Spans up to 32 stay inside the 64 positions of one warp's 32 compares."""
    return [f"for (int j = {span}; j > 0; j >>= 1) {{",
            f"    const bool mirror = 2 * j == {stage};",
            f"    for (int t = threadIdx.x; t < {pairs}; t += blockDim.x) {{",
            "        const int lo = ((t & ~(j - 1)) << 1) | (t & (j - 1));",
            "        const int hi = mirror ? lo ^ (2 * j - 1) : lo + j;",
            *([f"        if (!({within})) continue;"] if within else []),
            f"        const int p = {position.format('lo')}, q = {position.format('hi')};",
            *("        " + ln for ln in _compare_exchange("sk", "si", "p", "q", k)),
            "    }",
            "    if (j > 32 || j == 1) __syncthreads(); else __syncwarp();",
            "}"]


def _smem_pairs(k: str) -> list[str]:
    return ["extern __shared__ __align__(16) unsigned char tw_sort_smem[];",
            f"{k}* const sk = ({k}*)tw_sort_smem;",
            "int* const si = (int*)(sk + chunk);"]


def _params(dtype: DType, rank: int) -> list[str]:
    t, k = CUDA.ctype(dtype), _key_type(key_bits(dtype))
    return [f"{t}* __restrict__ values", "long long* __restrict__ indices", f"{k}* __restrict__ keys",
            "int* __restrict__ idx", f"const {t}* __restrict__ in", "long long limit", "int chunk",
            "long long chunks", "long long k_first", "long long k_last", *row_params(rank)]


def _block_source(name: str, dtype: DType, params: list[str], lines: list[str]) -> str:
    source = Source(CUDA)
    source.need_storage(dtype)
    key_fn, helper = _key_helper(dtype)
    source.helpers[key_fn] = helper
    body = "\n".join("    " + ln for ln in lines)
    return source.text(f'extern "C" __global__ void __launch_bounds__({MAX_THREADS}) {name}('
                       f'{", ".join(["int descending", *params])}) {{\n{body}\n}}')


def _load_key(dtype: DType, g: str) -> str:
    """The key of the row's element ``g``, flipped when ``descending``."""
    k = _key_type(key_bits(dtype))
    return f"({_key_helper(dtype)[0]}(in[in_base + ({g}) * in_stride]) ^ (descending ? ~({k})0 : ({k})0))"


def render_sort_block(name: str, dtype: DType, rank: int, mode: str) -> str:
    """One block sorts one chunk of ``chunk`` positions in shared memory, running the network's stages
    ``k_first..k_last`` (steps of span < chunk only).

    Parameters: descending, values/indices (the outputs; only the first ``limit`` sorted positions of each
    row are written), keys/idx (the scratch pairs, ``chunks * chunk`` per row), in, limit, chunk, chunks (per
    row), k_first, k_last, then the row geometry (``row_params``). Block b handles chunk ``b % chunks`` of
    row ``b / chunks``. ``mode`` says where the pairs come from and go (see ``MODES``).
    """
    load_input, store_output = MODES[mode]
    k = _key_type(key_bits(dtype))
    lines = [*_smem_pairs(k),
             "const long long row = blockIdx.x / chunks;",
             "const long long first = (blockIdx.x - row * chunks) * chunk;  // row position of sk[0]",
             "const long long pairs = (long long)blockIdx.x * chunk;  // scratch offset of sk[0]",
             *row_offsets(rank),
             "const int count = n - first < chunk ? (int)(n - first) : chunk;  // the chunk's elements",
             "for (int t = threadIdx.x; t < count; t += blockDim.x) {"]
    if load_input:
        lines += [f"    sk[t] = {_load_key(dtype, 'first + t')};", "    si[t] = (int)(first + t);"]
    else:
        lines += ["    sk[t] = keys[pairs + t];", "    si[t] = idx[pairs + t];"]
    lines += ["}",
              "__syncthreads();",
              "for (long long k = k_first; k <= k_last; k <<= 1) {",
              *("    " + ln for ln in _shared_steps("(int)(k / 2 < chunk / 2 ? k / 2 : chunk / 2)", "chunk / 2", "k",
                                                     k, within="hi < count")),
              "}",
              "for (int t = threadIdx.x; t < count; t += blockDim.x) {"]
    if store_output:
        lines += ["    const long long g = first + t;",
                  "    if (g < limit) {",
                  "        const long long src = si[t];",
                  "        values[out_base + g * out_stride] = in[in_base + src * in_stride];",
                  "        indices[out_base + g * out_stride] = src;",
                  "    }"]
    else:
        lines += ["    keys[pairs + t] = sk[t];", "    idx[pairs + t] = si[t];"]
    lines.append("}")
    return _block_source(name, dtype, _params(dtype, rank), lines)


def render_sort_step(name: str, bits: int, levels: int, mirror: bool) -> str:
    """``levels`` consecutive steps of one stage in global memory, of spans ``j = unit << (levels - 1)`` down
    to ``unit`` (all >= chunk), the first the stage's mirrored one when ``mirror``: each thread orders in
    registers the ``2**levels`` positions those steps exchange among themselves, ``unit`` apart (with
    ``mirror``, half of them and their mirrors), in increasing order, so the ones before ``n`` come first.

    Parameters: keys/idx (the scratch pairs, ``stride`` per row), total (threads), n, stride, padded (the
    row's network length), unit."""
    k = _key_type(bits)
    width = 1 << levels
    half = width // 2
    if mirror:  # register e < half: base + e * unit; its mirror, register width - 1 - e: top - e * unit
        places = [f"base + {e} * unit" for e in range(half)] + [f"top - {e} * unit" for e in reversed(range(half))]
    else:
        places = [f"base + {e} * unit" for e in range(width)]
    lines = ["const long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;",
             "if (t >= total) return;",
             f"const long long row = t / (padded >> {levels}), i = t - row * (padded >> {levels});",
             f"const long long base = ((i & ~(unit - 1)) << {levels}) | (i & (unit - 1));  // {levels} 0 bits at unit",
             *([f"const long long top = base ^ ({width} * unit - 1);  // the mirror of base"] if mirror else []),
             f"long long pos[{width}];  // row positions, increasing",
             *(f"pos[{e}] = {place};" for e, place in enumerate(places)),
             "int count = 0;  // the positions before n",
             "#pragma unroll",
             f"for (int e = 0; e < {width}; ++e) count += pos[e] < n;",
             "if (count < 2) return;",
             "const long long at = row * stride;",
             f"{k} v[{width}];",
             f"int x[{width}];",
             "#pragma unroll",
             f"for (int e = 0; e < {width}; ++e) {{",
             "    if (e < count) { v[e] = keys[at + pos[e]]; x[e] = idx[at + pos[e]]; }",
             "}"]
    pairs = [[(e, width - 1 - e) for e in range(half)]] if mirror else []
    span = half // 2 if mirror else half
    while span:
        pairs.append([(e, e + span) for e in range(width) if not e & span])
        span //= 2
    for level in pairs:
        for lo, hi in level:
            lines += [f"if ({hi} < count) {{",
                      *("    " + ln for ln in _compare_exchange("v", "x", str(lo), str(hi), k)), "}"]
    lines += ["#pragma unroll",
              f"for (int e = 0; e < {width}; ++e) {{",
              "    if (e < count) { keys[at + pos[e]] = v[e]; idx[at + pos[e]] = x[e]; }",
              "}"]
    body = "\n".join("    " + ln for ln in lines)
    return (f'extern "C" __global__ void __launch_bounds__({STEP_THREADS}) {name}({k}* __restrict__ keys, '
            f"int* __restrict__ idx, long long total, long long n, long long stride, long long padded, "
            f"long long unit) {{\n{body}\n}}\n")


def _select_params(dtype: DType, rank: int) -> list[str]:
    t, k = CUDA.ctype(dtype), _key_type(key_bits(dtype))
    return [f"{t}* __restrict__ values", "long long* __restrict__ indices", f"{k}* __restrict__ keys_out",
            "int* __restrict__ idx_out", f"const {k}* __restrict__ keys_in", "const int* __restrict__ idx_in",
            f"const {t}* __restrict__ in", "long long limit", "long long length", "int chunk", "long long chunks",
            "int run", *row_params(rank)]


def render_select_block(name: str, dtype: DType, rank: int, mode: str) -> str:
    """One block keeps the ``run`` smallest pairs of one chunk of ``chunk`` pairs (see [Note: CUDA topk]).

    Parameters: descending, values/indices (the outputs, the first ``limit`` of each row), keys_out/idx_out
    (this pass's candidates, ``run`` per chunk), keys_in/idx_in (the previous pass's, ``length`` per row), in,
    limit, length (the pairs of a row in this pass: n when reading the input), chunk, chunks (per row), run,
    then the row geometry. Block b handles chunk ``b % chunks`` of row ``b / chunks``; ``mode`` says where the
    pairs come from and go (see ``MODES``).
    """
    load_input, store_output = MODES[mode]
    k = _key_type(key_bits(dtype))
    key, index = (_load_key(dtype, "g"), "(int)g") if load_input else ("keys_in[row * length + g]",
                                                                       "idx_in[row * length + g]")
    lines = [*_smem_pairs(k),
             "const long long row = blockIdx.x / chunks, part = blockIdx.x - row * chunks;",
             *row_offsets(rank),
             "for (int t = threadIdx.x; t < chunk; t += blockDim.x) {",
             "    const long long g = part * chunk + t;  // the pass's row position",
             f"    sk[t] = g < length ? {key} : ~({k})0;",
             f"    si[t] = g < length ? {index} : 0x7fffffff;  // padding sorts after every element",
             "}",
             "__syncthreads();",
             "for (int k = 2; k <= run; k <<= 1) {",
             *("    " + ln for ln in _shared_steps("k / 2", "chunk / 2", "k", k)),
             "}",
             "const int log_run = __ffs(run) - 1;",
             "for (int shift = 1; (chunk >> shift) >= run; ++shift) {  // a round keeps chunk >> shift pairs",
             "    for (int t = threadIdx.x; t < chunk >> shift; t += blockDim.x) {",
             "        const int i = t & (run - 1), p = ((t >> log_run) << (log_run + shift)) | i;",
             "        const int q = p - i + (run << (shift - 1)) + run - 1 - i;  // the mirrored place in the next run",
             "        if (sk[q] < sk[p] || (sk[q] == sk[p] && si[q] < si[p])) {",
             "            sk[p] = sk[q];",
             "            si[p] = si[q];",
             "        }",
             "    }",
             "    __syncthreads();",
             *("    " + ln for ln in _shared_steps("run / 2", "(chunk >> shift) / 2", "2 * run", k,
                                                     "(({0} >> log_run) << (log_run + shift)) | ({0} & (run - 1))")),
             "}",
             "for (int t = threadIdx.x; t < run; t += blockDim.x) {  // the smallest run, ascending, at sk[0]"]
    if store_output:
        lines += ["    if (t < limit) {",
                  "        const long long src = si[t];",
                  "        values[out_base + t * out_stride] = in[in_base + src * in_stride];",
                  "        indices[out_base + t * out_stride] = src;",
                  "    }"]
    else:
        lines += ["    keys_out[(row * chunks + part) * run + t] = sk[t];",
                  "    idx_out[(row * chunks + part) * run + t] = si[t];"]
    lines.append("}")
    return _block_source(name, dtype, _select_params(dtype, rank), lines)


def padded_length(n: int) -> int:
    return max(2, 1 << (n - 1).bit_length())


def _block_threads(chunk: int) -> int:
    """Threads of a shared-memory block: whole warps (see [Note: CUDA sort]), a thread per compare up to 512."""
    return max(32, min(chunk // 2, MAX_THREADS))


def sorted_prefix(name: str, x: Tensor, d: int, limit: int, descending: bool) -> tuple[Tensor, Tensor]:
    """The first ``limit`` elements of the stable sort of ``x`` along dim ``d``, and their indices."""
    out_shape = x._shape[:d] + (limit,) + x._shape[d + 1:] if x.ndim else ()
    values, indices = empty(out_shape, x._dtype, x._device), empty(out_shape, dtypes.int64, x._device)
    rows, n, in_stride, out_stride, rank, geometry = row_geometry(x, d, out_shape)
    if rows == 0 or limit == 0:
        return values, indices
    if n > MAX_ROW:
        raise RuntimeError(f"{name}(): rows longer than {MAX_ROW} elements are not supported on CUDA (dim {d} of "
                           f"shape {list(x._shape)} has {n})")
    plan = _Launches(x, rank, descending, limit, [rows, n, in_stride, out_stride, *geometry])
    outputs = [data_ptr(values), data_ptr(indices)]
    run = 1 << (limit - 1).bit_length()
    if run < plan.padded and run <= SELECT_RUN:
        _select(plan, outputs, run)
    elif plan.padded <= CHUNK:
        plan.sort_block(ROWS, [*outputs, 0, 0, data_ptr(x)], 2, plan.padded)
    else:
        _staged_sort(plan, outputs)
    return values, indices


class _Launches:
    """What every launch of one sort or selection shares: the input, the kernels' specialisation, the
    direction, the row geometry, the padded row and the chunks of it that hold elements."""

    def __init__(self, x: Tensor, rank: int, descending: bool, limit: int, row_args: list[int]) -> None:
        self.x, self.rank, self.descending, self.limit, self.row_args = x, rank, int(descending), limit, row_args
        self.rows, self.n = row_args[0], row_args[1]
        self.device, self.stream = x._device.index, stream_handle(x._device.index)
        self.bits = key_bits(x._dtype)
        self.padded = padded_length(self.n)
        self.chunk = min(self.padded, CHUNK)
        self.chunks = ceil_div(self.n, self.chunk)

    def pairs(self, count: int) -> tuple[Tensor, Tensor]:
        """Scratch for ``count`` (key, index) pairs."""
        keys = empty((count,), dtypes.int64 if self.bits == 64 else dtypes.int32, self.x._device)
        return keys, empty((count,), dtypes.int32, self.x._device)

    def _block(self, kind: str, render, mode: str, blocks: int, chunk: int, args: list[int]) -> None:
        name = f"tw_{kind}_{mode}_{SUFFIX[self.x._dtype.name]}_r{self.rank}"
        fn = load_rendered(render, self.x._dtype, self.rank, mode, device=self.device, name=name)
        launch(fn, blocks, _block_threads(chunk), [self.descending, *args, *self.row_args], self.stream,
               chunk * (self.bits // 8 + 4))

    def sort_block(self, mode: str, pointers: list[int], k_first: int, k_last: int) -> None:
        self._block("sort", render_sort_block, mode, self.rows * self.chunks, self.chunk,
                    [*pointers, self.limit, self.chunk, self.chunks, k_first, k_last])

    def select_block(self, mode: str, pointers: list[int], length: int, chunk: int, chunks: int, run: int) -> None:
        self._block("select", render_select_block, mode, self.rows * chunks, chunk,
                    [*pointers, self.limit, length, chunk, chunks, run])

    def global_step(self, levels: int, mirror: bool, unit: int, keys: Tensor, idx: Tensor) -> None:
        name = f"tw_sort_{'mirror' if mirror else 'step'}{levels}_k{self.bits}"
        fn = load_rendered(render_sort_step, self.bits, levels, mirror, device=self.device, name=name)
        total = self.rows * self.padded >> levels
        launch(fn, ceil_div(total, STEP_THREADS), STEP_THREADS,
               [data_ptr(keys), data_ptr(idx), total, self.n, self.chunks * self.chunk, self.padded, unit],
               self.stream)


def _staged_sort(plan: _Launches, outputs: list[int]) -> None:
    """Rows longer than a chunk (see [Note: CUDA sort]): chunks first, then each later stage's global steps
    and its in-chunk finish, the last finish writing the outputs."""
    keys, idx = plan.pairs(plan.rows * plan.chunks * plan.chunk)
    pointers = [*outputs, data_ptr(keys), data_ptr(idx), data_ptr(plan.x)]
    plan.sort_block(FIRST, pointers, 2, plan.chunk)
    k = 2 * plan.chunk
    while k <= plan.padded:
        j = k // 2
        while j >= plan.chunk:
            levels = min(STEP_LEVELS, (j // plan.chunk).bit_length())  # the steps left before span < chunk
            unit = j >> (levels - 1)
            plan.global_step(levels, j == k // 2, unit, keys, idx)
            j = unit // 2
        plan.sort_block(LAST if k == plan.padded else MERGE, pointers, k, k)
        k *= 2


def _select(plan: _Launches, outputs: list[int], run: int) -> None:
    """topk by bitonic selection (see [Note: CUDA topk]): passes over ever shorter rows of candidates until
    one chunk holds a row's candidates."""
    length, source = plan.n, None
    while True:
        chunk = min(padded_length(length), CHUNK)
        chunks = ceil_div(length, chunk)
        reads_input, last = source is None, chunks == 1
        mode = {(True, True): ROWS, (True, False): FIRST, (False, False): MERGE, (False, True): LAST}[
            reads_input, last]
        inputs = [0, 0] if reads_input else [data_ptr(source[0]), data_ptr(source[1])]
        target = None if last else plan.pairs(plan.rows * chunks * run)
        written = [0, 0] if last else [data_ptr(target[0]), data_ptr(target[1])]
        plan.select_block(mode, [*outputs, *written, *inputs, data_ptr(plan.x)], length, chunk, chunks, run)
        if last:
            return
        length, source = chunks * run, target


@kernel("sort")
def sort(device: Device, self: Tensor, dim: int = -1, descending: bool = False, stable=False):
    d = S.normalize_dim(dim, max(self.ndim, 1), "sort")
    return sorted_prefix("sort", self, d, self._shape[d] if self.ndim else 1, descending)


@kernel("topk")
def topk(device: Device, self: Tensor, k: int, dim: int = -1, largest: bool = True, sorted: bool = True):
    from tilewise.ops.scans import check_topk

    d = check_topk(self, k, dim)
    if self.ndim == 0:
        return sorted_prefix("topk", self, d, 1, largest)  # torch: a 0-dim input is its own top-k, k = 0 too
    return sorted_prefix("topk", self, d, k, largest)

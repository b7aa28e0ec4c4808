"""Sorting on CUDA: sort (values and int64 indices, any dim, either direction), and topk on top of it.

[Note: CUDA sort]
Every element becomes an unsigned *key* whose integer order is the wanted order: a float's bits with the sign
bit set for positives and every bit flipped for negatives, after -0.0 is made +0.0 (they are equal, so the
index decides) and every NaN is made the largest key (NaN sorts above +inf); integers flip their sign bit;
``descending`` flips every bit of the key, which puts NaN first, as torch does. Pairs (key, original index)
are then sorted by a bitonic network comparing key first and index second: all pairs differ, so the result
is the one order in which equal elements keep their input order, i.e. the stable sort, in both directions,
which is what the CPU backend computes. The values written are the input elements at the sorted indices,
so NaN payloads and signed zeros come out bit for bit.

A row is padded to a power of two ``P`` with the largest key and indices ``n, n+1, ...``, which sort after
every real element, so the first ``n`` sorted positions are the answer. A block sorts ``C = min(P, 4096)``
pairs in shared memory (at most 48 KiB with 8-byte keys): a row of up to 4096 elements is one block and one
launch. A longer row runs the same network in stages (Batcher's bitonic sort): a block sorts each C-chunk
as the network's first log2(C) stages would (the direction of each compare comes from the element's
position in the row, so the chunks form the bitonic sequences the next stage merges); then for each
following stage k, one launch per step of span j >= C compares pairs across chunks in global memory, and
one block per chunk finishes the steps of span < C in shared memory, the last one writing the outputs.
That is O(P log^2 P) work and about log2(P/C)^2 / 2 launches, correct for any length.

topk is the first k of this sort (descending for ``largest``): equal elements come out lowest index first,
and the kernels write only those k positions. A selection pass that skips sorting the rest would be faster
for small k on long rows.
"""

from __future__ import annotations

from tilewise import _strides as S
from tilewise import dtypes
from tilewise.backends.cuda import data_ptr, empty, stream_handle
from tilewise.backends.cuda.kernels import ceil_div, kernel, launch, load
from tilewise.backends.cuda.kernels.scan import row_geometry, row_offsets, row_params
from tilewise.compiler.render import CUDA
from tilewise.compiler.render.cstyle import SUFFIX, Source, load_code
from tilewise.device import Device
from tilewise.dtypes import DType
from tilewise.tensor import Tensor

CHUNK = 4096  # pairs a block sorts in shared memory: 4096 * (8-byte key + 4-byte index) = 48 KiB
MAX_THREADS = 512
STEP_THREADS = 256
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


def _compare_exchange(keys: str, idx: str, lo: str, hi: str, up: str, k: str) -> list[str]:
    """Order the pair at ``lo`` < ``hi``: ascending by (key, index) when ``up``, else descending."""
    return [f"const {k} a = {keys}[{lo}], b = {keys}[{hi}];",
            f"const int ia = {idx}[{lo}], ib = {idx}[{hi}];",
            "if ((a > b || (a == b && ia > ib)) == up) {",
            f"    {keys}[{lo}] = b; {keys}[{hi}] = a; {idx}[{lo}] = ib; {idx}[{hi}] = ia;",
            "}"]


def _params(dtype: DType, rank: int) -> list[str]:
    t, k = CUDA.ctype(dtype), _key_type(key_bits(dtype))
    return [f"{t}* __restrict__ values", "long long* __restrict__ indices", f"{k}* __restrict__ keys",
            "int* __restrict__ idx", f"const {t}* __restrict__ in", "long long limit", "long long padded",
            "int chunk", "long long k_first", "long long k_last", "int descending", *row_params(rank)]


def render_sort_block(name: str, dtype: DType, rank: int, mode: str) -> str:
    """One block sorts one chunk of ``chunk`` pairs in shared memory, running the network's stages
    ``k_first..k_last`` (steps of span < chunk only).

    Parameters: values/indices (the outputs; only the first ``limit`` sorted positions of each row are
    written), keys/idx (the scratch pairs, ``padded`` per row), in, limit, padded, chunk, k_first, k_last,
    descending, then the row geometry (``row_params``). Block b handles chunk ``b % (padded / chunk)`` of row
    ``b / (padded / chunk)``. ``mode`` says where the pairs come from and go (see ``MODES``).
    """
    load_input, store_output = MODES[mode]
    source = Source(CUDA)
    source.need_storage(dtype)
    k = _key_type(key_bits(dtype))
    key_fn, helper = _key_helper(dtype)
    source.helpers[key_fn] = helper
    lines = ["extern __shared__ __align__(16) unsigned char tw_sort_smem[];",
             f"{k}* const sk = ({k}*)tw_sort_smem;",
             "int* const si = (int*)(sk + chunk);",
             "const long long chunks = padded / chunk;",
             "const long long row = blockIdx.x / chunks;",
             "const long long first = (blockIdx.x - row * chunks) * chunk;  // row position of sk[0]",
             "const long long pairs = row * padded + first;  // scratch offset of sk[0]",
             *row_offsets(rank),
             "for (int t = threadIdx.x; t < chunk; t += blockDim.x) {",
             "    const long long g = first + t;"]
    if load_input:
        lines += [f"    const {k} flip = descending ? ~({k})0 : 0;",
                  f"    sk[t] = g < n ? ({key_fn}(in[in_base + g * in_stride]) ^ flip) : ~({k})0;",
                  "    si[t] = (int)g;  // padding: the largest key at indices >= n sorts after every element"]
    else:
        lines += ["    sk[t] = keys[pairs + t];", "    si[t] = idx[pairs + t];"]
    lines += ["}",
              "__syncthreads();",
              "for (long long k = k_first; k <= k_last; k <<= 1) {",
              "    for (int j = (int)(k / 2 < chunk / 2 ? k / 2 : chunk / 2); j > 0; j >>= 1) {",
              "        for (int t = threadIdx.x; t < chunk / 2; t += blockDim.x) {",
              "            const int lo = ((t & ~(j - 1)) << 1) | (t & (j - 1)), hi = lo + j;",
              "            const bool up = ((first + lo) & k) == 0;",
              *("            " + ln for ln in _compare_exchange("sk", "si", "lo", "hi", "up", k)),
              "        }",
              "        __syncthreads();",
              "    }",
              "}",
              "for (int t = threadIdx.x; t < chunk; t += blockDim.x) {",
              "    const long long g = first + t;"]
    if store_output:
        lines += ["    if (g < limit) {",
                  "        const long long src = si[t];",
                  "        values[out_base + g * out_stride] = in[in_base + src * in_stride];",
                  "        indices[out_base + g * out_stride] = src;",
                  "    }"]
    else:
        lines += ["    keys[pairs + t] = sk[t];", "    idx[pairs + t] = si[t];"]
    lines.append("}")
    body = "\n".join("    " + ln for ln in lines)
    return source.text(f'extern "C" __global__ void __launch_bounds__({MAX_THREADS}) {name}('
                       f'{", ".join(_params(dtype, rank))}) {{\n{body}\n}}')


def render_sort_step(name: str, bits: int) -> str:
    """One step of the network in global memory: every pair (lo, lo + j) of every padded row, for j >= chunk."""
    k = _key_type(bits)
    lines = ["const long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;",
             "if (t >= total) return;",
             "const long long half = padded / 2;",
             "const long long row = t / half, i = t - row * half;",
             "const long long lo = ((i & ~(j - 1)) << 1) | (i & (j - 1));  // i with a 0 bit inserted at j",
             "const bool up = (lo & k) == 0;",
             "const long long p = row * padded + lo, q = p + j;",
             *_compare_exchange("keys", "idx", "p", "q", "up", k)]
    body = "\n".join("    " + ln for ln in lines)
    return (f'extern "C" __global__ void __launch_bounds__({STEP_THREADS}) {name}({k}* __restrict__ keys, '
            f"int* __restrict__ idx, long long total, long long padded, long long k, long long j) {{\n{body}\n}}\n")


def padded_length(n: int) -> int:
    return max(2, 1 << (n - 1).bit_length())


def _block_kernel(dtype: DType, rank: int, mode: str, device: int):
    name = f"tw_sort_{mode}_{SUFFIX[dtype.name]}_r{rank}"
    return load(render_sort_block(name, dtype, rank, mode), name, device)


def _step_kernel(bits: int, device: int):
    name = f"tw_sort_step_k{bits}"
    return load(render_sort_step(name, bits), name, device)


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
    plan = _Launches(x, rank, padded_length(n), limit, [int(descending), rows, n, in_stride, out_stride, *geometry])
    outputs = [data_ptr(values), data_ptr(indices)]
    if plan.padded == plan.chunk:
        plan.block(ROWS, [*outputs, 0, 0, data_ptr(x)], 2, plan.padded)
    else:
        _staged_sort(plan, outputs, rows)
    return values, indices


class _Launches:
    """What every launch of one sort shares: the kernels' specialisation, the padded row length, the chunk a
    block sorts, and the row geometry."""

    def __init__(self, x: Tensor, rank: int, padded: int, limit: int, row_args: list[int]) -> None:
        self.x, self.rank, self.padded, self.limit, self.row_args = x, rank, padded, limit, row_args
        self.device, self.stream = x._device.index, stream_handle(x._device.index)
        self.chunk = min(padded, CHUNK)
        self.bits = key_bits(x._dtype)
        self.blocks = row_args[1] * (padded // self.chunk)

    def block(self, mode: str, pointers: list[int], k_first: int, k_last: int) -> None:
        fn = _block_kernel(self.x._dtype, self.rank, mode, self.device)
        args = [*pointers, self.limit, self.padded, self.chunk, k_first, k_last, *self.row_args]
        launch(fn, self.blocks, min(self.chunk // 2, MAX_THREADS), args, self.stream,
               self.chunk * (self.bits // 8 + 4))


def _staged_sort(plan: _Launches, outputs: list[int], rows: int) -> None:
    """Rows longer than a chunk (see [Note: CUDA sort]): chunks first, then each later stage's global steps
    and its in-chunk finish, the last finish writing the outputs."""
    keys = empty((rows * plan.padded,), dtypes.int64 if plan.bits == 64 else dtypes.int32, plan.x._device)
    idx = empty((rows * plan.padded,), dtypes.int32, plan.x._device)
    pointers = [*outputs, data_ptr(keys), data_ptr(idx), data_ptr(plan.x)]
    plan.block(FIRST, pointers, 2, plan.chunk)
    step = _step_kernel(plan.bits, plan.device)
    total = rows * plan.padded // 2
    k = 2 * plan.chunk
    while k <= plan.padded:
        j = k // 2
        while j >= plan.chunk:
            launch(step, ceil_div(total, STEP_THREADS), STEP_THREADS,
                   [data_ptr(keys), data_ptr(idx), total, plan.padded, k, j], plan.stream)
            j //= 2
        plan.block(LAST if k == plan.padded else MERGE, pointers, k, k)
        k *= 2


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

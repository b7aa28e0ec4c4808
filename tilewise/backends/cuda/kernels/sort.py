"""Sorting on CUDA: sort (values and int64 indices, any dim, either direction), and topk.

[Note: CUDA sort]
Every element becomes an unsigned *key* whose integer order is the wanted order: a float's bits with the sign
bit set for positives and every bit flipped for negatives, after -0.0 is made +0.0 (they are equal, so the
index decides) and every NaN is made the largest key (NaN sorts above +inf); integers flip their sign bit;
``descending`` flips every bit of the key, which puts NaN first, as torch does. Equal keys keep their input
order: the result is the stable sort, in both directions, which is what the CPU backend computes.

A row of up to 4096 elements is sorted by one block in shared memory (32-bit keys, 64-bit for 8-byte
dtypes, at most 48 KiB with the indices): pairs (key, original index) go through Batcher's bitonic network
comparing key first and index second, so all pairs differ and the one order they reach is the stable one.
The network is for ``P``, n rounded up to a power of two, in the form that sorts every block ascending:
stage k merges sorted runs of k / 2 into sorted runs of k, its first step comparing mirrored positions (i
with k - 1 - i, counted from the start of the two runs) and its later steps of span j = k / 4, ..., 1
comparing i with i + j. The P - n positions past the row's end would hold keys larger than every element,
which such a network never moves, so a compare reaching past n is skipped. A step of span at most 32 only
exchanges pairs among the 64 positions one warp handles, so between two such steps the warp synchronises
alone. The values written are the input elements at the sorted indices.

A longer row is radix sorted with keys of the element's own width: a pass per key byte, least significant
first, each a stable counting sort by that byte (the *digit*), so together they sort stably from the index
order the first pass reads. One kernel counts every pass's digits in each row (the row histograms do not
depend on the order the passes leave); then each pass is one kernel over tiles of 4096 keys (2048 for 8-byte
keys), a block per tile. A warp ranks its keys among its keys of the same digit, in tile order, finding the
lanes that share a digit with a ballot per digit bit; the warps' counts give each key its place among the
tile's keys of its digit, and that digit's row position is the row's count of smaller digits plus the
digit's count in the row's earlier tiles. Those come by decoupled look-back (Merrill and Garland's
single-pass scan): a tile publishes its count of each digit, then walks back over the earlier tiles of its
row adding their published counts until it meets one that published the total of every tile before it,
then publishes its own such total. Blocks take tiles from a counter in the order they start, so a tile only
ever waits on tiles whose blocks are already running, whatever order the hardware launches blocks in. A
published word carries its pass, so the words are cleared once per sort. The tile's keys then pass
through shared memory in their sorted order so that each digit's keys are written together. When every
key of a row has the same digit in a pass, the pass writes the row where it is. The passes hand (key,
int32 index) pairs over in scratch; the last writes each key turned back into its element, except where the
key stands for several (a float's zero and NaN keys): those are read from the input at their index, so
NaN payloads and signed zeros come out bit for bit.

[Note: CUDA topk]
topk is the first k of the sort above (descending for ``largest``), so equal elements come out lowest index
first, and it is written sorted whatever ``sorted`` asks. Mostly it is found without sorting the row.

In a row of up to 4096 elements when ``R``, k rounded up to a power of two, is at most 256 and shorter than
the padded row, and for k < 8 in any row: bitonic top-k. A block takes a chunk of up to 4096 pairs (padded
with the largest key), sorts its runs of R (the network's first log2(R) stages), then halves the chunk until
one run is left: comparing a run's pair i with the next run's pair R - 1 - i, as a stage's first step
would, leaves the smaller of each where the first run was, and these are the two runs' R smallest pairs, in
a bitonic sequence that log2(R) merge steps sort again. The surviving runs stay where their first halves
were, so round ``r`` keeps run ``i`` at position ``i * R * 2^r`` and no pair moves between rounds. A chunk's
R smallest pairs are candidates: each row's candidates form a shorter row, selected the same way until one
chunk holds them all, and that last block writes the first k. Pairs are unique, so the chunks' candidates
contain the row's k smallest and the answer is exactly the sort's prefix.

In a longer row, for 8 <= k <= 4096: radix select. The pairs (key, index) read as one number (the key's
bytes, then the index's) all differ, and the k smallest are those up to the k-th. A counting pass per
8-bit digit, most significant first, counts the digits of the pairs whose leading digits are those of the
k-th pair found so far; from its counts the next pass finds one more of them. Once the pairs sharing the
digits found are all among the k smallest (always by the last digit, usually once the key is known), the
remaining passes stop at once. A last pass gathers the pairs whose leading digits are at most those found,
exactly the k smallest, and one block sorts them (the network above). That block's work grows as
k log2(k)^2, the radix sort's as n times the key's bytes: when k is large beside n (see
``_radix_select_pays``), and for any k > 4096, topk takes the first k of the radix sort.

The key rules live in ``sort_keys.py`` and the radix kernels in ``radix.py``; this module renders the bitonic
kernels, plans and launches every path, and registers sort and topk.
"""

from __future__ import annotations

from tilewise import dtypes
from tilewise import strides as S
from tilewise.backends.cuda.device_memory import data_ptr, empty, stream_handle
from tilewise.backends.cuda.kernels import ceil_div, kernel, launch, load_rendered
from tilewise.backends.cuda.kernels.radix import (
    DIGITS,
    RADIX_THREADS,
    SELECT_LIMIT,
    radix_tile,
    render_radix_histogram,
    render_radix_scatter,
    render_radix_select_count,
    render_radix_select_take,
    render_radix_zero,
)
from tilewise.backends.cuda.kernels.scan import row_geometry, row_offsets, row_params
from tilewise.backends.cuda.kernels.sort_keys import (
    CHUNK,
    FIRST,
    LAST,
    MERGE,
    MODES,
    ROWS,
    _key_helper,
    _key_type,
    _load_key,
    key_bits,
)
from tilewise.codegen.render import CUDA
from tilewise.codegen.render.cstyle import SUFFIX, Source
from tilewise.device import Device
from tilewise.dtypes import DType
from tilewise.tensor import Tensor

MAX_THREADS = 512
SELECT_RUN = 256  # the longest run topk selects with in a row of up to CHUNK; a larger k sorts the row
RADIX_SELECT_FROM = 8  # in a longer row, a k below this is selected with runs, from it on by radix select
MAX_ROW = 1 << 30  # indices travel as int32 inside the sort



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


def _block_source(name: str, dtype: DType, params: list[str], lines: list[str]) -> str:
    source = Source(CUDA)
    source.need_storage(dtype)
    key_fn, helper = _key_helper(dtype)
    source.helpers[key_fn] = helper
    body = "\n".join("    " + ln for ln in lines)
    return source.text(f'extern "C" __global__ void __launch_bounds__({MAX_THREADS}) {name}('
                       f'{", ".join(["int descending", *params])}) {{\n{body}\n}}')


def render_sort_block(name: str, dtype: DType, rank: int) -> str:
    """Block b sorts row b, of up to ``CHUNK`` elements, in shared memory (see [Note: CUDA sort]).

    Parameters: descending, values/indices (the outputs; only the first ``limit`` sorted positions are
    written), in, limit, chunk (the row's network length), then the row geometry (``row_params``)."""
    t, k = CUDA.ctype(dtype), _key_type(key_bits(dtype))
    params = [f"{t}* __restrict__ values", "long long* __restrict__ indices", f"const {t}* __restrict__ in",
              "long long limit", "int chunk", *row_params(rank)]
    lines = [*_smem_pairs(k),
             "const long long row = blockIdx.x;",
             *row_offsets(rank),
             "for (int t = threadIdx.x; t < n; t += blockDim.x) {",
             f"    sk[t] = {_load_key(dtype, 't')};",
             "    si[t] = t;",
             "}",
             "__syncthreads();",
             "for (int k = 2; k <= chunk; k <<= 1) {",
             *("    " + ln for ln in _shared_steps("k / 2", "chunk / 2", "k", k, within="hi < n")),
             "}",
             "for (int t = threadIdx.x; t < limit; t += blockDim.x) {",
             "    const long long src = si[t];",
             "    values[out_base + t * out_stride] = in[in_base + src * in_stride];",
             "    indices[out_base + t * out_stride] = src;",
             "}"]
    return _block_source(name, dtype, params, lines)


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
    short = plan.padded <= CHUNK
    if run < plan.padded and run <= SELECT_RUN and (short or limit < RADIX_SELECT_FROM):
        _select(plan, outputs, run)
    elif short:
        plan.sort_block([*outputs, data_ptr(x)])
    elif _radix_select_pays(limit, plan.n, x._dtype.itemsize):
        _radix_select(plan, outputs)
    else:
        _radix_sort(plan, outputs)
    return values, indices


class _Launches:
    """What every launch of one sort or selection shares: the input, the kernels' specialisation, the
    direction, the row geometry and the padded row."""

    def __init__(self, x: Tensor, rank: int, descending: bool, limit: int, row_args: list[int]) -> None:
        self.x, self.rank, self.descending, self.limit, self.row_args = x, rank, int(descending), limit, row_args
        self.rows, self.n = row_args[0], row_args[1]
        self.device, self.stream = x._device.index, stream_handle(x._device.index)
        self.bits = key_bits(x._dtype)
        self.padded = padded_length(self.n)

    def pairs(self, count: int) -> tuple[Tensor, Tensor]:
        """Scratch for ``count`` (key, index) pairs."""
        keys = empty((count,), dtypes.int64 if self.bits == 64 else dtypes.int32, self.x._device)
        return keys, empty((count,), dtypes.int32, self.x._device)

    def _block(self, fn, blocks: int, chunk: int, args: list[int]) -> None:
        launch(fn, blocks, _block_threads(chunk), [self.descending, *args, *self.row_args], self.stream,
               chunk * (self.bits // 8 + 4))

    def sort_block(self, pointers: list[int]) -> None:
        name = f"tw_sort_{SUFFIX[self.x._dtype.name]}_r{self.rank}"
        fn = load_rendered(render_sort_block, self.x._dtype, self.rank, device=self.device, name=name)
        self._block(fn, self.rows, self.padded, [*pointers, self.limit, self.padded])

    def select_block(self, mode: str, pointers: list[int], length: int, chunk: int, chunks: int, run: int) -> None:
        name = f"tw_select_{mode}_{SUFFIX[self.x._dtype.name]}_r{self.rank}"
        fn = load_rendered(render_select_block, self.x._dtype, self.rank, mode, device=self.device, name=name)
        self._block(fn, self.rows * chunks, chunk, [*pointers, self.limit, length, chunk, chunks, run])


def _radix_sort(plan: _Launches, outputs: list[int]) -> None:
    """Rows longer than a chunk (see [Note: CUDA sort]): the row histograms of every pass, then a pass per key
    byte, least significant first; the first reads the input, the last writes the outputs."""
    x, rows, n = plan.x, plan.rows, plan.n
    size = x._dtype.itemsize
    tiles = ceil_div(n, radix_tile(size))
    blocks = rows * tiles
    # one buffer: zeroed, the look-back words (a tile's per digit), the row histograms of every pass and the
    # passes' tile counters; then the scratch pairs of two passes: keys, keys, indices, indices
    zeroed = blocks * DIGITS + ceil_div(rows * size * DIGITS + size, 2)
    pairs = rows * n if size > 1 else 0
    scratch = empty((zeroed + ceil_div(pairs * 2 * (size + 4), 8),), dtypes.int64, x._device)
    status = data_ptr(scratch)
    hist = status + 8 * blocks * DIGITS
    counters = hist + 4 * rows * size * DIGITS
    keys = [status + 8 * zeroed, status + 8 * zeroed + pairs * size]
    idx = [keys[1] + pairs * size, keys[1] + pairs * (size + 4)]
    zero = load_rendered(render_radix_zero, device=plan.device, name="tw_radix_zero")
    launch(zero, min(ceil_div(zeroed, RADIX_THREADS), 4096), RADIX_THREADS, [status, zeroed], plan.stream)
    kernels = f"{SUFFIX[x._dtype.name]}_r{plan.rank}"
    histogram = load_rendered(render_radix_histogram, x._dtype, plan.rank, device=plan.device,
                              name=f"tw_radix_histogram_{kernels}")
    launch(histogram, blocks, RADIX_THREADS, [plan.descending, data_ptr(x), hist, tiles, *plan.row_args],
           plan.stream)
    for p in range(size):
        reads_input, writes_output = p == 0, p == size - 1
        mode = {(True, True): ROWS, (True, False): FIRST, (False, False): MERGE, (False, True): LAST}[
            reads_input, writes_output]
        scatter = load_rendered(render_radix_scatter, x._dtype, plan.rank, mode, device=plan.device,
                                name=f"tw_radix_scatter_{mode}_{kernels}")
        pairs_out = [0, 0] if writes_output else [keys[p % 2], idx[p % 2]]
        pairs_in = [0, 0] if reads_input else [keys[(p - 1) % 2], idx[(p - 1) % 2]]
        launch(scatter, blocks, RADIX_THREADS,
               [plan.descending, *outputs, *pairs_out, *pairs_in, data_ptr(x), hist, status, counters + 4 * p,
                plan.limit, p, tiles, *plan.row_args], plan.stream)


def _radix_select_pays(k: int, n: int, key_bytes: int) -> bool:
    """Whether radix select beats the radix sort for the first k of a row of n: its last step, a block
    sorting k pairs, grows as k log2(k)^2 where the sort grows with n and the key's bytes (measured on an
    H200; up to 256 it always paid)."""
    return k <= SELECT_LIMIT and (k <= SELECT_RUN or k * (k - 1).bit_length() ** 2 <= n * key_bytes // 2)


def _radix_select(plan: _Launches, outputs: list[int]) -> None:
    """topk by radix select (see [Note: CUDA topk]): a counting pass per digit of the (key, index) pairs, most
    significant first, then the selected pairs are gathered and one block per row sorts them."""
    x, rows, n, limit = plan.x, plan.rows, plan.n, plan.limit
    size = x._dtype.itemsize
    index_bytes = max(1, ceil_div((n - 1).bit_length(), 8))
    passes = size + index_bytes
    tiles = ceil_div(n, radix_tile(4))
    counted = empty((ceil_div(rows * (passes * DIGITS + 1), 2),), dtypes.int64, x._device)  # hist, then taken
    hist = data_ptr(counted)
    zero = load_rendered(render_radix_zero, device=plan.device, name="tw_radix_zero")
    launch(zero, min(ceil_div(counted.numel(), RADIX_THREADS), 4096), RADIX_THREADS, [hist, counted.numel()],
           plan.stream)
    kernels = f"{SUFFIX[x._dtype.name]}_r{plan.rank}"
    shape = [passes, index_bytes, tiles, *plan.row_args]
    count = load_rendered(render_radix_select_count, x._dtype, plan.rank, device=plan.device,
                          name=f"tw_radix_select_count_{kernels}")
    for level in range(passes):
        launch(count, rows * tiles, RADIX_THREADS, [plan.descending, data_ptr(x), hist, limit, level, *shape],
               plan.stream)
    keys, idx = plan.pairs(rows * limit)
    take = load_rendered(render_radix_select_take, x._dtype, plan.rank, device=plan.device,
                         name=f"tw_radix_select_take_{kernels}")
    launch(take, rows * tiles, RADIX_THREADS, [plan.descending, data_ptr(keys), data_ptr(idx),
                                               hist + 4 * rows * passes * DIGITS, data_ptr(x), hist, limit, *shape],
           plan.stream)
    chunk = padded_length(limit)
    plan.select_block(LAST, [*outputs, 0, 0, data_ptr(keys), data_ptr(idx), data_ptr(x)], limit, chunk, 1, chunk)


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
    """Sorted in ``self``'s memory order, as torch lays out sort's results (``strides.preserved_strides``): the rows
    are sorted through the permutation that makes ``self`` row-major, and the results seen back through it."""
    d = S.normalize_dim(dim, max(self.ndim, 1), "sort")
    order = S.memory_order(self._shape, self._strides)
    if order == tuple(range(self.ndim)):
        return sorted_prefix("sort", self, d, self._shape[d] if self.ndim else 1, descending)
    seen = Tensor._make(self._storage, S.permuted(self._shape, order), S.permuted(self._strides, order), self._offset,
                        self._dtype, self._device)
    values, indices = sorted_prefix("sort", seen, order.index(d), self._shape[d], descending)
    strides = S.preserved_strides(self._shape, self._strides)  # the same memory: only size-1 dims' strides differ
    return tuple(Tensor._make(t._storage, self._shape, strides, 0, t._dtype, t._device) for t in (values, indices))


@kernel("topk")
def topk(device: Device, self: Tensor, k: int, dim: int = -1, largest: bool = True, sorted: bool = True):
    from tilewise.ops.scans import check_topk

    d = check_topk(self, k, dim)
    if self.ndim == 0:
        return sorted_prefix("topk", self, d, 1, largest)  # torch: a 0-dim input is its own top-k, k = 0 too
    return sorted_prefix("topk", self, d, k, largest)

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
SELECT_RUN = 256  # the longest run topk selects with in a row of up to CHUNK; a larger k sorts the row
RADIX_SELECT_FROM = 8  # in a longer row, a k below this is selected with runs, from it on by radix select
MAX_ROW = 1 << 30  # indices travel as int32 inside the sort

# kernel variants of a pass: (reads the input, writes the outputs); otherwise it reads/writes scratch pairs
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


# ---------------------------------------------------------------------------------------------- radix sort

RADIX_THREADS = 256  # eight warps; thread d also owns digit d
RADIX_WARPS = RADIX_THREADS // 32
DIGITS = 256  # 8-bit digits

_UNSIGNED = {1: "unsigned char", 2: "unsigned short", 4: "unsigned int", 8: "unsigned long long"}
_NAN_ABOVE = {"float16": 0x7C00, "bfloat16": 0x7F80, "float32": 0x7F800000, "float64": 0x7FF0000000000000,
              "float8_e4m3fn": 0x7E, "float8_e5m2": 0x7C}  # the magnitude bits of +inf (e4m3fn: of its largest)
AGGREGATE, PREFIX = 1, 2  # a tile's published count of one digit: its own, or with every earlier tile of its row


def radix_tile(key_bytes: int) -> int:
    """Keys a scatter block ranks: 16 a thread, 8 for 8-byte keys, so that its keys and indices fit 48 KiB of
    shared memory beside the counts."""
    return RADIX_THREADS * (8 if key_bytes == 8 else 16)


def _bits_literal(value: int, key_bytes: int) -> str:
    return f"0x{value:X}ULL" if key_bytes == 8 else f"(({_UNSIGNED[key_bytes]})0x{value:X}u)"


def _radix_codec(dtype: DType) -> str:
    """Device functions between an element's stored bits and its ascending key: ``tw_radix_key_S(bits)``,
    ``tw_radix_bits_S(key)`` (the inverse), and ``tw_radix_exact_S(key)``, false for the keys that stand for
    several elements (a float's zero and NaN keys), which are read back from the input instead (see [Note:
    CUDA sort])."""
    size, s = dtype.itemsize, SUFFIX[dtype.name]
    k = _UNSIGNED[size]
    sign = _bits_literal(1 << (8 * size - 1), size)
    if dtype.is_floating_point:
        key = (f"    const {k} magnitude = ({k})(u & ({k})~{sign});\n"
               f"    if (magnitude > {_bits_literal(_NAN_ABOVE[dtype.name], size)}) return ({k})~({k})0;  // NaN\n"
               f"    if (magnitude == 0) return {sign};  // -0.0 is +0.0\n"
               f"    return (u & {sign}) ? ({k})~u : ({k})(u | {sign});")
        bits = f"    return (key & {sign}) ? ({k})(key ^ {sign}) : ({k})~key;"
        exact = f"    return key != ({k})~({k})0 && key != {sign};"
    elif dtype in (dtypes.bool_, dtypes.uint8):
        key, bits, exact = "    return u;", "    return key;", "    return true;"
    else:
        key, bits, exact = f"    return ({k})(u ^ {sign});", f"    return ({k})(key ^ {sign});", "    return true;"
    return "\n".join([
        f"#ifndef TW_RADIX_CODEC_{s.upper()}",
        f"#define TW_RADIX_CODEC_{s.upper()}",
        f"static __device__ __forceinline__ {k} tw_radix_key_{s}({k} u) {{\n{key}\n}}",
        f"static __device__ __forceinline__ {k} tw_radix_bits_{s}({k} key) {{\n{bits}\n}}",
        f"static __device__ __forceinline__ bool tw_radix_exact_{s}({k} key) {{\n{exact}\n}}",
        "#endif"])


_BLOCK_SCAN = f"""#ifndef TW_RADIX_BLOCK_SCAN
#define TW_RADIX_BLOCK_SCAN
// The exclusive prefix sum of v over the block's {RADIX_THREADS} threads; sums: {RADIX_WARPS} words of shared memory.
static __device__ __forceinline__ unsigned tw_radix_block_scan(unsigned v, unsigned* sums) {{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    unsigned s = v;
    for (int o = 1; o < 32; o <<= 1) {{
        const unsigned y = __shfl_up_sync(0xffffffffu, s, o);
        if (lane >= o) s += y;
    }}
    if (lane == 31) sums[warp] = s;
    __syncthreads();
    unsigned before = 0;
    for (int w = 0; w < warp; ++w) before += sums[w];
    __syncthreads();
    return before + s - v;
}}
#endif"""


def _radix_kernel(name: str, params: list[str], lines: list[str], helpers: list[str], min_blocks: int = 1) -> str:
    body = "\n".join("    " + ln for ln in lines)
    return "\n".join([*helpers, f'extern "C" __global__ void __launch_bounds__({RADIX_THREADS}, {min_blocks}) '
                                f'{name}({", ".join(params)}) {{\n{body}\n}}\n'])


def _radix_key(dtype: DType, reads_input: bool, g: str) -> str:
    """The (flipped when descending) key of the row's element ``g``, from the input or the scratch keys."""
    if not reads_input:
        return f"keys_in[row * n + {g}]"
    k = _UNSIGNED[dtype.itemsize]
    return f"({k})(tw_radix_key_{SUFFIX[dtype.name]}(in[in_base + ({g}) * in_stride]) ^ flip)"


def render_radix_zero(name: str) -> str:
    """Zero ``count`` 8-byte words: the row histograms, the look-back words and the tile counters."""
    lines = ["for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < count;",
             "     i += (long long)gridDim.x * blockDim.x)",
             "    words[i] = 0;"]
    return _radix_kernel(name, ["unsigned long long* __restrict__ words", "long long count"], lines, [])


def render_radix_histogram(name: str, dtype: DType, rank: int) -> str:
    """Block b counts every pass's digits of tile ``b % tiles`` of row ``b / tiles`` into the row's histograms,
    ``hist[(row * passes + pass) * 256 + digit]`` (zeroed before).

    Parameters: descending, in, hist, tiles (per row), then the row geometry."""
    size, k = dtype.itemsize, _UNSIGNED[dtype.itemsize]
    tile = radix_tile(size)
    params = ["int descending", f"const {k}* __restrict__ in", "unsigned* __restrict__ hist", "long long tiles",
              *row_params(rank)]
    lines = [f"__shared__ unsigned counts[{size * DIGITS}];",
             f"for (int t = threadIdx.x; t < {size * DIGITS}; t += {RADIX_THREADS}) counts[t] = 0;",
             "const long long row = blockIdx.x / tiles;",
             f"const long long first = (blockIdx.x - row * tiles) * {tile}, end = min(n, first + {tile});",
             *row_offsets(rank),
             f"const {k} flip = descending ? ({k})~({k})0 : ({k})0;",
             "__syncthreads();",
             f"for (long long g = first + threadIdx.x; g < end; g += {RADIX_THREADS}) {{",
             f"    const {k} key = {_radix_key(dtype, True, 'g')};",
             "    #pragma unroll",
             f"    for (int p = 0; p < {size}; ++p) {{",
             f"        atomicAdd(&counts[p * {DIGITS} + ((unsigned)(key >> (8 * p)) & 255u)], 1u);",
             "    }",
             "}",
             "__syncthreads();",
             f"for (int t = threadIdx.x; t < {size * DIGITS}; t += {RADIX_THREADS}) {{",
             f"    if (counts[t]) atomicAdd(&hist[row * {size * DIGITS} + t], counts[t]);",
             "}"]
    return _radix_kernel(name, params, lines, [_radix_codec(dtype)])


def _rank_lines(items: int) -> list[str]:
    """Each warp ranks its keys among its own keys of the same digit, in tile order (``rank``), counting them
    per digit in its shared histogram (``mine``): the lanes holding one digit find each other with a ballot per
    digit bit, and the lowest of them adds them to the count."""
    return ["#pragma unroll",
            f"for (int i = 0; i < {items}; ++i) {{",
            f"    const bool valid = warp * {32 * items} + i * 32 + lane < count;",
            "    const unsigned digit = (unsigned)(key[i] >> shift) & 255u;",
            "    unsigned peers = __ballot_sync(0xffffffffu, valid);  // then: the valid lanes holding this digit",
            "    #pragma unroll",
            "    for (int b = 0; b < 8; ++b) {",
            "        const unsigned set = __ballot_sync(0xffffffffu, (digit >> b) & 1u);",
            "        peers &= (digit >> b) & 1u ? set : ~set;",
            "    }",
            "    const int leader = valid ? __ffs(peers) - 1 : lane;",
            "    unsigned before = 0;",
            "    if (valid && lane == leader) {",
            "        before = mine[digit];",
            "        mine[digit] = before + __popc(peers);",
            "    }",
            "    rank[i] = __shfl_sync(0xffffffffu, before, leader) + __popc(peers & ((1u << lane) - 1u));",
            "    __syncwarp();",
            "}"]


def _look_back_lines() -> list[str]:
    """Thread d publishes the tile's count of digit d (``total``), then adds up the earlier tiles' counts of the
    row into ``before``: a tile's word holds the pass (so that words of earlier passes read as unpublished),
    a flag (AGGREGATE: this tile alone; PREFIX: with every earlier tile) and the count. No tile waits on a
    later one, and tiles go out in launch order, so the tiles waited on are running already. The row's last
    tile publishes nothing, as no tile asks for it."""
    return [f"unsigned long long* const word = status + tile * {DIGITS} + d;",
            "const unsigned long long epoch = (unsigned long long)(pass + 1) << 34;",
            "const bool last = part == tiles - 1;",
            f"if (!last) *(volatile unsigned long long*)word = epoch | ((unsigned long long)"
            f"(part == 0 ? {PREFIX} : {AGGREGATE}) << 32) | total;",
            "unsigned before = 0;",
            "for (long long j = 1; j <= part;) {",
            f"    const unsigned long long w = *(volatile const unsigned long long*)(word - j * {DIGITS});",
            "    if ((w & ~0x3ffffffffULL) != epoch) continue;  // not published yet in this pass",
            "    before += (unsigned)w;",
            f"    if ((w >> 32 & 3) == {PREFIX}) break;",
            "    ++j;",
            "}",
            "if (part > 0 && !last) {",
            f"    *(volatile unsigned long long*)word = epoch | ({PREFIX}ULL << 32) | (before + total);",
            "}"]


def _store_lines(dtype: DType, writes_output: bool, g: str, key: str, index: str) -> list[str]:
    """Write the row's sorted position ``g``: the key and index to the scratch pairs, or the element (the key
    turned back into it, or read from the input where the key stands for several) and index to the outputs."""
    if not writes_output:
        return [f"keys_out[row * n + {g}] = {key};", f"idx_out[row * n + {g}] = {index};"]
    s, k = SUFFIX[dtype.name], _UNSIGNED[dtype.itemsize]
    return [f"if ({g} < limit) {{",
            f"    const int src = {index};",
            f"    const {k} ascending = ({k})({key} ^ flip);",
            f"    values[out_base + ({g}) * out_stride] = tw_radix_exact_{s}(ascending) ? tw_radix_bits_{s}(ascending)"
            " : in[in_base + (long long)src * in_stride];",
            f"    indices[out_base + ({g}) * out_stride] = src;",
            "}"]


def render_radix_scatter(name: str, dtype: DType, rank: int, mode: str) -> str:
    """One radix pass, by the digit of bits ``8 * pass`` to ``8 * pass + 7``: each block takes the next tile
    (``counter``), ranks its keys stably, finds where each digit's keys go from the row's histogram and the
    earlier tiles' counts (decoupled look-back), and writes them there through shared memory, so that a
    digit's keys are written together. In a row whose keys all share the digit the pass moves nothing, and
    each key is written where it is.

    Parameters: descending, values/indices (the outputs; only the first ``limit`` sorted positions of each row
    are written), keys_out/idx_out, keys_in/idx_in (scratch pairs, n per row), in, hist, status (a word per
    tile and digit), counter, limit, pass, tiles (per row), then the row geometry. ``mode`` says where the
    pairs come from and go (see ``MODES``)."""
    reads_input, writes_output = MODES[mode]
    size, k = dtype.itemsize, _UNSIGNED[dtype.itemsize]
    tile = radix_tile(size)
    items = tile // RADIX_THREADS
    params = ["int descending", f"{k}* __restrict__ values", "long long* __restrict__ indices",
              f"{k}* __restrict__ keys_out", "int* __restrict__ idx_out", f"const {k}* __restrict__ keys_in",
              "const int* __restrict__ idx_in", f"const {k}* __restrict__ in", "const unsigned* __restrict__ hist",
              "unsigned long long* __restrict__ status", "unsigned* __restrict__ counter", "long long limit",
              "int pass", "long long tiles", *row_params(rank)]
    element = f"warp * {32 * items} + i * 32 + lane"  # the tile position of a thread's key i
    lines = [f"__shared__ unsigned hist_w[{RADIX_WARPS * DIGITS}];  // per warp: its digit counts, then offsets",
             f"__shared__ int dest[{DIGITS}];  // tile slot t of digit d goes to row position dest[d] + t",
             f"__shared__ unsigned sums[{RADIX_WARPS}];",
             "__shared__ long long taken;",
             f"__shared__ {k} sk[{tile}];",
             f"__shared__ int si[{tile}];",
             "const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, d = threadIdx.x;",
             f"for (int t = threadIdx.x; t < {RADIX_WARPS * DIGITS}; t += {RADIX_THREADS}) hist_w[t] = 0;",
             "if (threadIdx.x == 0) taken = atomicAdd(counter, 1u);  // tiles go out in launch order",
             "__syncthreads();",
             "const long long tile = taken, row = tile / tiles, part = tile - row * tiles;",
             f"const long long first = part * {tile};",
             f"const int count = (int)min((long long){tile}, n - first);",
             *row_offsets(rank),
             f"const {k} flip = descending ? ({k})~({k})0 : ({k})0;",
             "const int shift = 8 * pass;",
             f"{k} key[{items}];",
             f"int id[{items}];",
             f"unsigned rank[{items}];",
             "#pragma unroll",
             f"for (int i = 0; i < {items}; ++i) {{",
             f"    const int e = {element};",
             "    key[i] = 0;",
             "    id[i] = 0;",
             "    if (e < count) {",
             f"        key[i] = {_radix_key(dtype, reads_input, 'first + e')};",
             "        id[i] = " + ("(int)(first + e)" if reads_input else "idx_in[row * n + first + e]") + ";",
             "    }",
             "}",
             f"const unsigned in_row = hist[(row * {size} + pass) * {DIGITS} + d];  // the row's keys of digit d",
             "if (__syncthreads_or(in_row == n)) {  // one digit: the pass keeps the order",
             "    #pragma unroll",
             f"    for (int i = 0; i < {items}; ++i) {{",
             f"        const int e = {element};",
             "        if (e < count) {",
             *("            " + ln for ln in _store_lines(dtype, writes_output, "(first + e)", "key[i]", "id[i]")),
             "        }",
             "    }",
             "    return;",
             "}",
             f"unsigned* const mine = hist_w + warp * {DIGITS};",
             *_rank_lines(items),
             "__syncthreads();",
             "unsigned total = 0;  // the tile's keys of digit d; each warp's run of them starts at the running sum",
             f"for (int w = 0; w < {RADIX_WARPS}; ++w) {{",
             f"    const unsigned c = hist_w[w * {DIGITS} + d];",
             f"    hist_w[w * {DIGITS} + d] = total;",
             "    total += c;",
             "}",
             *_look_back_lines(),
             "const unsigned start = tw_radix_block_scan(total, sums);  // the digit's first tile slot",
             "const unsigned row_start = tw_radix_block_scan(in_row, sums);  // and its first row position",
             f"for (int w = 0; w < {RADIX_WARPS}; ++w) hist_w[w * {DIGITS} + d] += start;",
             "dest[d] = (int)(row_start + before) - (int)start;",
             "__syncthreads();",
             "#pragma unroll",
             f"for (int i = 0; i < {items}; ++i) {{",
             f"    if ({element} < count) {{",
             "        const unsigned slot = mine[(unsigned)(key[i] >> shift) & 255u] + rank[i];",
             "        sk[slot] = key[i];",
             "        si[slot] = id[i];",
             "    }",
             "}",
             "__syncthreads();",
             f"for (int t = threadIdx.x; t < count; t += {RADIX_THREADS}) {{",
             "    const long long g = dest[(unsigned)(sk[t] >> shift) & 255u] + t;",
             *("    " + ln for ln in _store_lines(dtype, writes_output, "g", "sk[t]", "si[t]")),
             "}",
             "(void)flip;"]
    min_blocks = 4 if size == 8 else 3  # caps the registers: three blocks of 16 keys a thread, four of 8
    return _radix_kernel(name, params, lines, [_radix_codec(dtype), _BLOCK_SCAN], min_blocks)


# ---------------------------------------------------------------------------------------------- radix select

SELECT_LIMIT = CHUNK  # the largest k topk finds by radix select: one block sorts what it selects


def _pair_digit_helper(key_bytes: int) -> str:
    """``tw_pair_digit_N(key, idx, j, index_bytes)``: digit j, most significant first, of the (key, index) pair
    as one number: the key's bytes, then the index's low ``index_bytes`` bytes."""
    k = _UNSIGNED[key_bytes]
    return "\n".join([
        f"#ifndef TW_PAIR_DIGIT_{key_bytes}",
        f"#define TW_PAIR_DIGIT_{key_bytes}",
        f"static __device__ __forceinline__ unsigned tw_pair_digit_{key_bytes}({k} key, int idx, int j, "
        "int index_bytes) {",
        f"    return j < {key_bytes} ? (unsigned)(key >> (8 * ({key_bytes} - 1 - j))) & 255u",
        f"                          : ((unsigned)idx >> (8 * (index_bytes - 1 - (j - {key_bytes})))) & 255u;",
        "}",
        "#endif"])


def _select_prefix_lines(levels: str, most: int) -> list[str]:
    """Lines finding, from the histograms of digit levels ``0..levels - 1`` (at most ``most``), the leading
    digits of the row's ``limit``-th smallest pair (``pre[0..known - 1]``), and ``whole``: that the pairs
    sharing those digits are all among the ``limit`` smallest, so that no later digit needs counting. The
    counts are read at once, so that a block waits for memory once."""
    return ["__shared__ unsigned found[3];  // the digit holding the limit-th pair, the pairs before it, its pairs",
            "__shared__ unsigned pre[16];",
            f"unsigned level_counts[{most}];",
            "#pragma unroll",
            f"for (int at = 0; at < {most}; ++at) {{",
            f"    level_counts[at] = at < {levels} ? hist[(row * passes + at) * {DIGITS} + d] : 0;",
            "}",
            "unsigned left = (unsigned)limit;  // pairs still to take from the pairs matching pre[0..known - 1]",
            "int known = 0;",
            "bool whole = false;",
            "#pragma unroll",
            f"for (int at = 0; at < {most}; ++at) {{",
            f"    if (whole || at >= {levels}) break;",
            "    const unsigned c = level_counts[at];",
            "    const unsigned before = tw_radix_block_scan(c, sums);",
            "    if (before < left && left <= before + c) {",
            "        found[0] = d;",
            "        found[1] = before;",
            "        found[2] = c;",
            "    }",
            "    __syncthreads();",
            "    pre[at] = found[0];",
            "    left -= found[1];",
            "    known = at + 1;",
            "    whole = left == found[2];",
            "}"]


def _prefix_order(key_bytes: int, key: str, index: str) -> list[str]:
    """Lines setting ``order``: how the pair's leading ``known`` digits compare with ``pre`` (-1, 0, 1)."""
    return ["int order = 0;",
            "for (int j = 0; j < known && order == 0; ++j) {",
            f"    const unsigned digit = tw_pair_digit_{key_bytes}({key}, {index}, j, index_bytes);",
            "    order = digit < pre[j] ? -1 : digit > pre[j] ? 1 : 0;",
            "}"]


def render_radix_select_count(name: str, dtype: DType, rank: int) -> str:
    """One level of radix select (see [Note: CUDA topk]): block b counts, in tile ``b % tiles`` of row
    ``b / tiles``, the digit ``level`` of the pairs whose leading digits are those of the row's ``limit``-th
    smallest pair, into ``hist[(row * passes + level) * 256 + digit]``; nothing once the row is decided.

    Parameters: descending, in, hist, limit, level, passes (digit levels), index_bytes, tiles, then the row
    geometry."""
    size, k = dtype.itemsize, _UNSIGNED[dtype.itemsize]
    tile = radix_tile(4)
    params = ["int descending", f"const {k}* __restrict__ in", "unsigned* __restrict__ hist", "long long limit",
              "int level", "int passes", "int index_bytes", "long long tiles", *row_params(rank)]
    lines = [f"__shared__ unsigned counts[{DIGITS}];",
             f"__shared__ unsigned sums[{RADIX_WARPS}];",
             "const int d = threadIdx.x;",
             "counts[d] = 0;",
             "const long long row = blockIdx.x / tiles;",
             f"const long long first = (blockIdx.x - row * tiles) * {tile}, end = min(n, first + {tile});",
             *row_offsets(rank),
             f"const {k} flip = descending ? ({k})~({k})0 : ({k})0;",
             *_select_prefix_lines("level", size + 4),
             "if (whole) return;",
             "__syncthreads();",
             f"for (long long g = first + threadIdx.x; g < end; g += {RADIX_THREADS}) {{",
             f"    const {k} key = {_radix_key(dtype, True, 'g')};",
             *("    " + ln for ln in _prefix_order(size, "key", "(int)g")),
             f"    if (order == 0) atomicAdd(&counts[tw_pair_digit_{size}(key, (int)g, level, index_bytes)], 1u);",
             "}",
             "__syncthreads();",
             f"if (counts[d]) atomicAdd(&hist[(row * passes + level) * {DIGITS} + d], counts[d]);"]
    return _radix_kernel(name, params, lines, [_radix_codec(dtype), _BLOCK_SCAN, _pair_digit_helper(size)])


def render_radix_select_take(name: str, dtype: DType, rank: int) -> str:
    """The last step of radix select: block b writes the pairs of tile ``b % tiles`` of row ``b / tiles`` that
    are among the row's ``limit`` smallest, as the keys and indices the sorting blocks take, at places
    counted by ``taken[row]``, ``limit`` per row.

    Parameters: descending, keys_out/idx_out, taken, in, hist, limit, passes, index_bytes, tiles, then the
    row geometry."""
    size, k = dtype.itemsize, _UNSIGNED[dtype.itemsize]
    tile = radix_tile(4)
    t, sort_key = CUDA.ctype(dtype), _key_type(key_bits(dtype))
    params = ["int descending", f"{sort_key}* __restrict__ keys_out", "int* __restrict__ idx_out",
              "unsigned* __restrict__ taken", f"const {t}* __restrict__ in", "const unsigned* __restrict__ hist",
              "long long limit", "int passes", "int index_bytes", "long long tiles", *row_params(rank)]
    lines = [f"__shared__ unsigned sums[{RADIX_WARPS}];",
             "const int d = threadIdx.x;",
             "const long long row = blockIdx.x / tiles;",
             f"const long long first = (blockIdx.x - row * tiles) * {tile}, end = min(n, first + {tile});",
             *row_offsets(rank),
             f"const {k} flip = descending ? ({k})~({k})0 : ({k})0;",
             *_select_prefix_lines("passes", size + 4),
             "__syncthreads();",
             f"for (long long g = first + threadIdx.x; g < end; g += {RADIX_THREADS}) {{",
             f"    const {k} bits = (({k}*)in)[in_base + g * in_stride];",
             f"    const {k} key = ({k})(tw_radix_key_{SUFFIX[dtype.name]}(bits) ^ flip);",
             *("    " + ln for ln in _prefix_order(size, "key", "(int)g")),
             "    if (order <= 0) {",
             "        const long long at = row * limit + atomicAdd(&taken[row], 1u);",
             f"        keys_out[at] = {_load_key(dtype, 'g')};",
             "        idx_out[at] = (int)g;",
             "    }",
             "}"]
    source = Source(CUDA)
    source.need_storage(dtype)
    key_fn, helper = _key_helper(dtype)
    source.helpers[key_fn] = helper
    for text in (_radix_codec(dtype), _BLOCK_SCAN, _pair_digit_helper(size)):
        source.helpers[text.split("\n")[0]] = text
    return source.text(_radix_kernel(name, params, lines, []))


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
    d = S.normalize_dim(dim, max(self.ndim, 1), "sort")
    return sorted_prefix("sort", self, d, self._shape[d] if self.ndim else 1, descending)


@kernel("topk")
def topk(device: Device, self: Tensor, k: int, dim: int = -1, largest: bool = True, sorted: bool = True):
    from tilewise.ops.scans import check_topk

    d = check_topk(self, k, dim)
    if self.ndim == 0:
        return sorted_prefix("topk", self, d, 1, largest)  # torch: a 0-dim input is its own top-k, k = 0 too
    return sorted_prefix("topk", self, d, k, largest)

"""Radix sort and radix select on CUDA: the kernels of sort's and topk's long-row paths (see [Note: CUDA sort]
and [Note: CUDA topk] in ``sort.py``, which plans and launches them)."""

from __future__ import annotations

from tilewise import dtypes
from tilewise.backends.cuda.kernels.scan import row_offsets, row_params
from tilewise.backends.cuda.kernels.sort_keys import CHUNK, MODES, _key_helper, _key_type, _load_key, key_bits
from tilewise.codegen.render import CUDA
from tilewise.codegen.render.cstyle import SUFFIX, Source
from tilewise.dtypes import DType

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

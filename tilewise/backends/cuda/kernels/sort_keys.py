"""Sort keys on CUDA: every element as an unsigned integer whose order is the sort's (see [Note: CUDA sort] in
``sort.py``), shared by the bitonic kernels there and the radix kernels of ``radix.py``."""

from __future__ import annotations

from tilewise import dtypes
from tilewise.codegen.render import CUDA
from tilewise.codegen.render.cstyle import SUFFIX, load_code
from tilewise.dtypes import DType

CHUNK = 4096  # pairs a block sorts in shared memory: 4096 * (8-byte key + 4-byte index) = 48 KiB

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


def _load_key(dtype: DType, g: str) -> str:
    """The key of the row's element ``g``, flipped when ``descending``."""
    k = _key_type(key_bits(dtype))
    return f"({_key_helper(dtype)[0]}(in[in_base + ({g}) * in_stride]) ^ (descending ? ~({k})0 : ({k})0))"

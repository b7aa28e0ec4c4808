"""The CUDA C target: the data that makes ``cstyle`` emit CUDA, and what every reduction shares.

Only the tables below differ from the C target. The kernels themselves (the eager backend's pointwise and
reduction kernels as much as the compiler's) are kernel IR, scheduled by ``codegen.schedule`` and rendered
by ``kernel_cuda``; ``identity`` and ``accumulator`` are the reductions' conventions.
"""

from __future__ import annotations

from tilewise import dtypes
from tilewise.codegen.kernel_ir import ARG_COMBINERS
from tilewise.codegen.render.cstyle import (
    Language,
    compute_of,
)
from tilewise.dtypes import DType

# [Note: float8 conversions] cuda_fp8.h converts a float with the hardware's instruction (sm_89 and later) only
# when asked to saturate; the non-saturating conversion, which e5m2 needs for torch's casts (an overflow is an
# infinity), is dozens of integer operations per element: the FP8 training step's gradient casts ran at a tenth
# of memory speed. Below 61440 in magnitude (halfway from e5m2's largest finite value, 57344, to 2^16, from where
# round-to-nearest-even gives infinity) both conversions give the same code, so the instruction does those; NaN,
# infinities and overflows take the library's non-saturating path. A NaN keeps its sign, as torch's conversion
# keeps it (0x7F or 0xFF), where the library's gives 0x7F whatever the sign.
_FP8_HEADER = """#include <cuda_fp8.h>
#ifndef TW_FP8_E5M2_DEFINED
#define TW_FP8_E5M2_DEFINED
static __device__ __forceinline__ __nv_fp8_storage_t tw_float_to_e5m2(float x, __nv_saturation_t saturate) {
    if (x != x) return (__nv_fp8_storage_t)(signbit(x) ? 0xFF : 0x7F);
    if (saturate == __NV_SATFINITE || fabsf(x) < 61440.0f) return __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E5M2);
    return __nv_cvt_float_to_fp8(x, __NV_NOSAT, __NV_E5M2);
}
static __device__ __forceinline__ __nv_fp8_storage_t tw_float_to_e4m3(float x) {
    if (x != x) return (__nv_fp8_storage_t)(signbit(x) ? 0xFF : 0x7F);
    return __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3);
}
#endif"""

# maximum/minimum propagate NaN, as torch's do. From sm_80 a float has an instruction for exactly that
# (``max.NaN.f32``: one FMNMX where the portable form takes two NaN tests, a compare and selects), which is
# what keeps a half-width row max at memory speed; doubles, and older GPUs, take the portable form.
_MINMAX_NAN = """{{FN}} {{T}} tw_{name}_{{S}}({{T}} a, {{T}} b) {{{{
#if __CUDA_ARCH__ >= 800
    if (sizeof({{T}}) == 4) {{{{
        float r;
        asm("{ptx}.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"((float)a), "f"((float)b));
        return r;
    }}}}
#endif
    return a != a ? a : (b != b ? b : (a {cmp} b ? a : b));
}}}}"""

_E8M0_STORE = ("(unsigned char)((({b} >> 23) & 0xFFu) + ((({b} >> 23) & 0xFFu) != 0xFFu && ({b} & 0x400000u) "
               "&& (({b} & 0x3FFFFFu) || (({b} >> 23) & 0xFFu))))")

CUDA = Language(
    name="cuda",
    kernel_prefix='extern "C" __global__ void __launch_bounds__({block})',
    helper_prefix="static __device__ __forceinline__",
    restrict="__restrict__",
    type_names={
        "bool": "bool", "uint8": "unsigned char", "int8": "signed char", "int16": "short", "int32": "int",
        "int64": "long long", "float16": "__half", "bfloat16": "__nv_bfloat16", "float32": "float",
        "float64": "double", "float8_e4m3fn": "__nv_fp8_storage_t", "float8_e5m2": "__nv_fp8_storage_t",
        "float8_e8m0fnu": "unsigned char", "float4_e2m1fn_x2": "unsigned char",  # bytes; fp4 is never converted
    },
    headers={"float16": "#include <cuda_fp16.h>", "bfloat16": "#include <cuda_bf16.h>",
             "float8_e4m3fn": _FP8_HEADER, "float8_e5m2": _FP8_HEADER},
    loads={
        "float16": "__half2float({0})",
        "bfloat16": "__bfloat162float({0})",
        "float8_e4m3fn": "__half2float(__half(__nv_cvt_fp8_to_halfraw({0}, __NV_E4M3)))",
        "float8_e5m2": "__half2float(__half(__nv_cvt_fp8_to_halfraw({0}, __NV_E5M2)))",
        # e8m0 code c is 2^(c - 127): code 0 is 2^-127 (a float32 subnormal), 0xFF is NaN
        "float8_e8m0fnu": "(({0}) == 0 ? __int_as_float(0x00400000) : ({0}) == 0xFF ? __int_as_float(0x7fffffff) "
                          ": __int_as_float((unsigned int)({0}) << 23))",
    },
    stores={
        ("float16", "float"): "__float2half_rn({0})", ("float16", "double"): "__double2half({0})",
        ("bfloat16", "float"): "__float2bfloat16_rn({0})", ("bfloat16", "double"): "__double2bfloat16({0})",
        # e4m3fn has no infinity: torch saturates out-of-range values (and infinities) to +-448
        ("float8_e4m3fn", "float"): "tw_float_to_e4m3({0})",
        ("float8_e4m3fn", "double"): "__nv_cvt_double_to_fp8({0}, __NV_SATFINITE, __NV_E4M3)",
        ("float8_e5m2", "float"): "tw_float_to_e5m2({0}, {sat})",  # [Note: float8 conversions]
        ("float8_e5m2", "double"): "__nv_cvt_double_to_fp8({0}, {sat}, __NV_E5M2)",
        # torch's rounding (see dtypes.round_to_e8m0): the float32 exponent, up by one when the guard bit is set
        # and the rest or the implicit bit is; NaN and infinity give 0xFF
        ("float8_e8m0fnu", "float"): _E8M0_STORE.replace("{b}", "__float_as_uint({0})"),
        ("float8_e8m0fnu", "double"): _E8M0_STORE.replace("{b}", "__float_as_uint((float)({0}))"),
    },
    math={"rsqrt": "rsqrt{f}({0})", "erfinv": "erfinv{f}({0})", "isinf": "(isinf({0}) != 0)"},
    helpers={"maximum:float": _MINMAX_NAN.format(name="maximum", ptx="max", cmp=">"),
             "minimum:float": _MINMAX_NAN.format(name="minimum", ptx="min", cmp="<")},
    constants={("inf", "float"): "__int_as_float(0x7f800000)", ("nan", "float"): "__int_as_float(0x7fc00000)",
               ("inf", "double"): "__longlong_as_double(0x7ff0000000000000LL)",
               ("nan", "double"): "__longlong_as_double(0x7ff8000000000000LL)"},
    prelude="""#ifndef TW_VEC_DEFINED
#define TW_VEC_DEFINED
template <typename T, int N> struct __align__(sizeof(T) * N) tw_vec { T v[N]; };
#endif""",
)


def identity(combiner: str, acc: DType) -> object:
    """The value a reduction of nothing gives."""
    if combiner in ("add", "or"):
        return 0
    if combiner in ("mul", "and"):
        return 1
    positive = combiner in ("min", "argmin")
    if acc.is_floating_point:
        return float("inf") if positive else float("-inf")
    if acc is dtypes.bool_:
        return 1 if positive else 0
    info = dtypes.iinfo(acc)
    return info.max if positive else info.min


def accumulator(combiner: str, input_dtype: DType, compute: DType) -> DType:
    """The dtype a reduction accumulates in: the op's compute dtype (bool for any/all)."""
    if combiner in ("or", "and"):
        return dtypes.bool_
    if combiner in ARG_COMBINERS:
        return compute_of(input_dtype)
    return compute

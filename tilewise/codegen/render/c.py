"""The C target: the data that makes ``cstyle`` emit host C (C99 with ``_Float16``; GCC or Clang on x86-64).

A kernel is a plain function whose loop runs over every element; the C compiler vectorises it. bfloat16 is
stored as its 16 raw bits and converted by the helpers in the prelude (round to nearest even); float8 types are
their raw byte, converted as torch converts (round to nearest even; e4m3fn saturates to +-448, e5m2 overflows
to inf unless the store saturates; NaN has every mantissa bit set); a double is rounded to float first.
Compile with ``-ffp-contract=off`` for results that match numpy bit for bit.

[Note: the C target's expf] A float32 ``exp`` is ``tw_exp_f32``, not libm's ``expf``. In a vectorised loop
``expf`` becomes glibc's vector variant (libmvec), which computes lanes whose argument lies outside about
[-87.3, 88.7] by calling the scalar ``expf`` for them; a causal attention's masked scores (-inf), and any
softmax whose row spans more than 87, hit that path on most vectors: 196,608 exponentials of -inf took 600 us
against 68 us for normal ones. ``tw_exp_f32`` takes one branch-free path for every lane: the argument clamped
to [-104, 89] (beyond which the float result is 0 or infinity; NaN passes the clamp), x = q ln 2 + s with a
two-part ln 2, e^s by its Taylor polynomial of degree 7 in fused multiply-adds (written out: they stay fused
under ``-ffp-contract=off``), times 2^q built from its bits in two factors (a subnormal result is rounded
once). 71 us and 95 us for the two cases above. Checked on every float32 against ``exp`` in double rounded to
float: 1.8% of results differ, each by one ulp (libmvec promises 4 ulp; torch's vectorised ``exp``, SLEEF's,
1 ulp).
"""

from __future__ import annotations

from tilewise.codegen.render.cstyle import Language

_PRELUDE = """#include <math.h>
#include <stdbool.h>
#include <string.h>
#ifndef TW_C_PRELUDE
#define TW_C_PRELUDE
static inline float tw_bf16_to_float(unsigned short b) {
    unsigned int u = (unsigned int)b << 16; float f; memcpy(&f, &u, 4); return f;
}
static inline unsigned short tw_float_to_bf16(float f) {
    unsigned int u; memcpy(&u, &f, 4);
    if (f != f) return (unsigned short)((u >> 16) | 0x40);
    return (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
static inline float tw_e4m3_to_float(unsigned char b) {
    unsigned int e = (b >> 3) & 0xfu, m = b & 7u, u; float f;
    if (e == 0xfu && m == 7u) f = NAN;
    else if (e == 0) f = (float)m * 0.001953125f;
    else { u = ((e + 120u) << 23) | (m << 20); memcpy(&f, &u, 4); }
    return (b & 0x80u) ? -f : f;
}
static inline float tw_e5m2_to_float(unsigned char b) {
    unsigned short h = (unsigned short)(b << 8); _Float16 f; memcpy(&f, &h, 2); return (float)f;
}
static inline unsigned char tw_float_to_e4m3(float f) {
    unsigned int u, a; float x; memcpy(&u, &f, 4);
    unsigned char sign = (unsigned char)((u >> 24) & 0x80u);
    a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return sign | 0x7fu;
    if (a >= 0x43e00000u) return sign | 0x7eu;  /* |f| >= 448, and infinity */
    if (a < 0x3c800000u) { memcpy(&x, &a, 4); return sign | (unsigned char)nearbyintf(x * 512.0f); }  /* < 2^-6 */
    return sign | (unsigned char)(((a + 0x7ffffu + ((a >> 20) & 1u)) >> 20) - 960u);
}
static inline unsigned char tw_float_to_e5m2(float f, int saturate) {
    unsigned int u, a, r; float x; memcpy(&u, &f, 4);
    unsigned char sign = (unsigned char)((u >> 24) & 0x80u), top = saturate ? 0x7bu : 0x7cu;
    a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return sign | 0x7fu;
    if (a >= 0x47800000u) return sign | top;  /* |f| >= 2^16, and infinity */
    if (a < 0x38800000u) { memcpy(&x, &a, 4); return sign | (unsigned char)nearbyintf(x * 65536.0f); }  /* < 2^-14 */
    r = ((a + 0xfffffu + ((a >> 21) & 1u)) >> 21) - 448u;
    return sign | (unsigned char)(r >= 0x7cu ? top : r);
}
#endif"""

_ERFINV = """{FN} {T} tw_erfinv_{S}({T} y) {{
    if (y <= -1 || y >= 1) return y == 1 ? ({T})INFINITY : (y == -1 ? -({T})INFINITY : ({T})NAN);
    double w = -log((1.0 - y) * (1.0 + y)), p, x;
    if (w < 5.0) {{
        w -= 2.5;
        p = 2.81022636e-08; p = 3.43273939e-07 + p * w; p = -3.5233877e-06 + p * w; p = -4.39150654e-06 + p * w;
        p = 0.00021858087 + p * w; p = -0.00125372503 + p * w; p = -0.00417768164 + p * w;
        p = 0.246640727 + p * w; p = 1.50140941 + p * w;
    }} else {{
        w = sqrt(w) - 3.0;
        p = -0.000200214257; p = 0.000100950558 + p * w; p = 0.00134934322 + p * w; p = -0.00367342844 + p * w;
        p = 0.00573950773 + p * w; p = -0.0076224613 + p * w; p = 0.00943887047 + p * w;
        p = 1.00167406 + p * w; p = 2.83297682 + p * w;
    }}
    x = p * y;
    for (int k = 0; k < 2; ++k) x -= (erf(x) - y) / (1.1283791670955126 * exp(-x * x));
    return ({T})x;
}}"""


_EXPF = """{FN} float tw_pow2i_{S}(int k) {{
    unsigned int b = (unsigned int)(k + 127) << 23; float f; memcpy(&f, &b, 4); return f;
}}
{FN} {T} tw_exp_{S}({T} x) {{
    /* below ln 2^-150 the result rounds to 0: computed, its subnormal steps cost a microcode assist per vector on
       some x86 cores (a causal mask's -inf lanes ran 5x slower); such lanes compute e^0 and take 0 */
    const int under = x < -103.972077083991796f;
    const float c = under ? 0.0f : (x > 89.0f ? 89.0f : x);
    const float q = rintf(c * 1.44269502162933349609375f);  /* x = q ln 2 + s, |s| <= ln 2 / 2 */
    float s = fmaf(q, -0.693145751953125f, c);
    s = fmaf(q, -1.428606765330187045e-06f, s);
    float u = 1.9841270e-4f;  /* e^s = 1 + s + s^2 (1/2! + s/3! + ... + s^5/7!) */
    u = fmaf(u, s, 1.3888889e-3f);
    u = fmaf(u, s, 8.3333333e-3f);
    u = fmaf(u, s, 4.1666667e-2f);
    u = fmaf(u, s, 1.6666667e-1f);
    u = fmaf(u, s, 0.5f);
    u = fmaf(s * s, u, s + 1.0f);
    const int k = (int)q, half = k >> 1;  /* 2^k in two factors: k reaches -150 (a subnormal result) */
    const float r = u * tw_pow2i_{S}(half) * tw_pow2i_{S}(k - half);
    return under ? 0.0f : r;
}}"""

C = Language(
    name="c",
    kernel_prefix="void",
    helper_prefix="static inline",
    restrict="restrict",
    type_names={
        "bool": "bool", "uint8": "unsigned char", "int8": "signed char", "int16": "short", "int32": "int",
        "int64": "long long", "float16": "_Float16", "bfloat16": "unsigned short", "float32": "float",
        "float64": "double", "float8_e4m3fn": "unsigned char", "float8_e5m2": "unsigned char",
    },
    headers={},
    loads={"float16": "(float)({0})", "bfloat16": "tw_bf16_to_float({0})", "float8_e4m3fn": "tw_e4m3_to_float({0})",
           "float8_e5m2": "tw_e5m2_to_float({0})"},
    stores={("float16", "float"): "(_Float16)({0})", ("float16", "double"): "(_Float16)({0})",
            ("bfloat16", "float"): "tw_float_to_bf16({0})", ("bfloat16", "double"): "tw_float_to_bf16((float)({0}))",
            ("float8_e4m3fn", "float"): "tw_float_to_e4m3({0})",
            ("float8_e4m3fn", "double"): "tw_float_to_e4m3((float)({0}))",
            ("float8_e5m2", "float"): "tw_float_to_e5m2({0}, {sat})",
            ("float8_e5m2", "double"): "tw_float_to_e5m2((float)({0}), {sat})"},
    math={"exp:float32": "tw_exp_{S}({0})"},  # see [Note: the C target's expf]
    constants={("inf", "float"): "INFINITY", ("nan", "float"): "NAN", ("inf", "double"): "((double)INFINITY)",
               ("nan", "double"): "((double)NAN)"},
    prelude=_PRELUDE,
    helpers={"erfinv:float": _ERFINV, "exp:float": _EXPF},
    on_zero_division="__atomic_store_n(&tw_zero_division, 1, __ATOMIC_RELAXED); ",
    zero_division_flag="int tw_zero_division;",
    saturation=("0", "1"),
)

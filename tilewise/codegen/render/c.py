"""The C target: the data that makes ``cstyle`` emit host C (C99 with ``_Float16``; GCC or Clang on x86-64).

A kernel is a plain function whose loop runs over every element; the C compiler vectorises it. bfloat16 is
stored as its 16 raw bits and converted by the helpers in the prelude (round to nearest even); float8 types
have no C spelling here. Compile with ``-ffp-contract=off`` for results that match numpy bit for bit.
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

C = Language(
    name="c",
    kernel_prefix="void",
    helper_prefix="static inline",
    restrict="restrict",
    type_names={
        "bool": "bool", "uint8": "unsigned char", "int8": "signed char", "int16": "short", "int32": "int",
        "int64": "long long", "float16": "_Float16", "bfloat16": "unsigned short", "float32": "float",
        "float64": "double",
    },
    headers={},
    loads={"float16": "(float)({0})", "bfloat16": "tw_bf16_to_float({0})"},
    stores={("float16", "float"): "(_Float16)({0})", ("float16", "double"): "(_Float16)({0})",
            ("bfloat16", "float"): "tw_float_to_bf16({0})", ("bfloat16", "double"): "tw_float_to_bf16((float)({0}))"},
    math={},
    constants={("inf", "float"): "INFINITY", ("nan", "float"): "NAN", ("inf", "double"): "((double)INFINITY)",
               ("nan", "double"): "((double)NAN)"},
    prelude=_PRELUDE,
    helpers={"erfinv:float": _ERFINV},
    on_zero_division="__atomic_store_n(&tw_zero_division, 1, __ATOMIC_RELAXED); ",
    zero_division_flag="int tw_zero_division;",
)

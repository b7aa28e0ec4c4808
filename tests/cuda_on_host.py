"""The compiler's CUDA kernels run on the host: their CUDA C compiled as C++ beside a small shim of CUDA's names.

A kernel whose threads never wait for each other (no ``__syncthreads``, no shared memory: the element-wise and
tiled nests) computes the same thing when its blocks and threads run one after another, so compiling its text
with g++ checks, without a GPU, what the renderer decides: indexing, vector loads and stores, the packing of
transposed vectors, hoisting. The shim converts bfloat16 and float8 (e4m3fn, e5m2) exactly, rounding to nearest
even and saturating as the hardware's ``cvt`` does (the same conversions on the GPU are checked by the
``cuda``-marked tests); float16 storage is not shimmed.
"""

from __future__ import annotations

import ctypes
import hashlib
import shutil
import subprocess
from pathlib import Path

import numpy as np

import tilewise as tw
from tilewise.codegen.render.cuda import CUDA
from tilewise.compiler.capture import trace
from tilewise.compiler.passes import run_pipeline
from tilewise.compiler.program import lower_program
from tilewise.compiler.targets import CUDA_TARGET

COMPILER = shutil.which("g++")

SHIM = r"""
#include <cstdint>
#include <cstring>
#include <cmath>
using std::signbit;
struct tw_dim3 { unsigned x, y, z; };
static tw_dim3 blockIdx, threadIdx;
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(n)
#define __restrict__
#define __align__(n) alignas(n)
static inline float tw_bits_float(uint32_t b) { float f; memcpy(&f, &b, 4); return f; }
static inline uint32_t tw_float_bits(float f) { uint32_t b; memcpy(&b, &f, 4); return b; }
static inline float __int_as_float(int b) { return tw_bits_float((uint32_t)b); }
static inline unsigned __float_as_uint(float f) { return tw_float_bits(f); }
struct __nv_bfloat16 { uint16_t x; };
static inline float __bfloat162float(__nv_bfloat16 h) { return tw_bits_float((uint32_t)h.x << 16); }
static inline __nv_bfloat16 __float2bfloat16_rn(float f) {
    if (f != f) return __nv_bfloat16{(uint16_t)0x7FFF};
    uint32_t b = tw_float_bits(f);
    b += 0x7FFF + ((b >> 16) & 1);
    return __nv_bfloat16{(uint16_t)(b >> 16)};
}
typedef uint8_t __nv_fp8_storage_t;
enum __nv_saturation_t { __NV_NOSAT, __NV_SATFINITE };
enum __nv_fp8_interpretation_t { __NV_E4M3, __NV_E5M2 };
struct __half_raw { float f; };  // only what a float8 widens to, which a float holds exactly
struct __half { float f; __half(__half_raw r) : f(r.f) {} };
static inline float __half2float(__half h) { return h.f; }
static inline float tw_fp8_magnitude(int c, __nv_fp8_interpretation_t k) {  // c in 0..127
    int mbits = k == __NV_E4M3 ? 3 : 2, bias = k == __NV_E4M3 ? 7 : 15;
    int e = c >> mbits, m = c & ((1 << mbits) - 1);
    if (k == __NV_E4M3 && c == 0x7F) return NAN;
    if (k == __NV_E5M2 && e == 31) return m ? NAN : INFINITY;
    if (e == 0) return std::ldexp((float)m, 1 - bias - mbits);
    return std::ldexp((float)((1 << mbits) + m), e - bias - mbits);
}
static inline __half_raw __nv_cvt_fp8_to_halfraw(__nv_fp8_storage_t c, __nv_fp8_interpretation_t k) {
    float v = tw_fp8_magnitude(c & 0x7F, k);
    return __half_raw{(c & 0x80) ? -v : v};
}
static inline __nv_fp8_storage_t __nv_cvt_float_to_fp8(float x, __nv_saturation_t sat, __nv_fp8_interpretation_t k) {
    if (x != x) return 0x7F;
    int sign = signbit(x) ? 0x80 : 0, top = k == __NV_E4M3 ? 0x7E : 0x7B, code;
    float a = fabsf(x), largest = tw_fp8_magnitude(top, k);
    if (a >= largest) {
        float overflow = largest + (largest - tw_fp8_magnitude(top - 1, k)) / 2;
        code = sat == __NV_SATFINITE || a < overflow ? top : (k == __NV_E4M3 ? 0x7F : 0x7C);
    } else {
        int lo = 0;
        while (tw_fp8_magnitude(lo + 1, k) <= a) ++lo;
        float below = a - tw_fp8_magnitude(lo, k), above = tw_fp8_magnitude(lo + 1, k) - a;
        code = below < above ? lo : above < below ? lo + 1 : (lo & 1 ? lo + 1 : lo);
    }
    return (__nv_fp8_storage_t)(sign | code);
}
"""


def _library(source: str, kernel, workdir: Path) -> ctypes.CDLL:
    body = "\n".join(line for line in source.splitlines() if not line.startswith("#include <cuda"))
    casts = ", ".join(f"({'' if p.written else 'const '}{CUDA.ctype(p.dtype)}*)args[{k}]"
                      for k, p in enumerate(kernel.params))
    driver = f"""
extern "C" void tw_run(void** args, unsigned grid, unsigned block) {{
    for (unsigned b = 0; b < grid; ++b)
        for (unsigned t = 0; t < block; ++t) {{
            blockIdx.x = b;
            threadIdx.x = t;
            {kernel.name}({casts});
        }}
}}"""
    text = SHIM + body + driver
    key = hashlib.sha256(text.encode()).hexdigest()[:20]
    cpp, lib = workdir / f"{key}.cpp", workdir / f"{key}.so"
    if not lib.exists():
        cpp.write_text(text)
        subprocess.run([COMPILER, "-O1", "-std=c++17", "-shared", "-fPIC", "-w", str(cpp), "-o", str(lib)],
                       check=True, capture_output=True)
    return ctypes.CDLL(str(lib))


def run_on_host(fn, workdir: Path, **inputs: tw.Tensor):
    """The outputs of ``fn(**inputs)`` (CPU tensors) as the CUDA target's one kernel for it computes them, as
    numpy arrays, and that kernel's schedule."""
    graph = run_pipeline(trace(fn, tuple(inputs.values()), {}).graph)
    low = lower_program(graph, CUDA_TARGET)
    (sched,) = low.schedules
    kernel, plan = sched.kernel, low.plan
    assert not kernel.arguments and not sched.scratch_bytes, "only kernels of buffers alone run on the host"
    assert "__syncthreads" not in low.sources[kernel.name], "threads that wait for each other cannot run in turn"
    outputs, arrays = {}, []
    for value in kernel.values:
        buffer = plan.buffers[plan.of[value]]
        if buffer.kind == "input":
            array = np.ascontiguousarray(inputs[value.tag].numpy())
        else:
            array = np.zeros(buffer.ty.shape, tw.empty(0, dtype=buffer.ty.dtype).numpy().dtype)
            outputs[buffer.slot] = array
        arrays.append(array)
    pointers = (ctypes.c_void_p * len(arrays))(*(a.ctypes.data for a in arrays))
    _library(low.sources[kernel.name], kernel, workdir).tw_run(pointers, sched.grid, sched.block)
    return [outputs[k] for k in sorted(outputs)], sched

"""Block-scaled quantization on CUDA: MXFP8 and NVFP4 quantize and dequantize kernels.

[Note: block-scaled kernels]
The formats and their rounding are defined in ``quant/reference.py`` (see [Note: block-scaled formats]);
these kernels repeat the reference's float32 steps in the same order, so CPU and GPU give the same bits.
The work is pure bandwidth (a few flops per byte), so the kernels are shaped for memory: each thread owns 8
consecutive elements of one block (one 16-byte load of bf16/fp16, two of fp32), the lanes sharing a block are
adjacent in the warp (4 lanes for a 32-element MXFP8 block, 2 for a 16-element NVFP4 block), so a warp reads
one contiguous run of 256 elements and a block's amax takes one or two ``__shfl_xor_sync`` steps, with no
shared memory and no barrier. Each lane writes its 8 elements in one store (8 e4m3 bytes, or 4 bytes of
packed e2m1); the block's first lane writes its scale. NVFP4's per-tensor scale needs the tensor's amax
first: one grid-stride kernel reduces it per warp and merges with ``atomicMax`` on the float's bits (finite,
non-negative floats order as their unsigned bits), and the quantize kernel reads it from device memory, so
nothing returns to the host. Inputs are made contiguous first; sizes are run-time arguments, so one compile
per (kernel, dtype) serves every shape.
"""

from __future__ import annotations

from tilewise import dtypes
from tilewise.backends.cuda.device_memory import data_ptr, empty, stream_handle
from tilewise.backends.cuda.kernels import ceil_div, launch, load
from tilewise.dtypes import DType
from tilewise.tensor import Tensor

THREADS = 256
PER_THREAD = 8  # elements each thread loads and stores
INPUT_TYPES = {"float32": "float", "bfloat16": "__nv_bfloat16", "float16": "__half"}

_COMMON = r"""
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>

typedef IN_T in_t;
typedef OUT_T out_t;

__device__ __forceinline__ void load8(const float* p, float v[8]) {
    const float4 a = reinterpret_cast<const float4*>(p)[0];
    const float4 b = reinterpret_cast<const float4*>(p)[1];
    v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w; v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
}
__device__ __forceinline__ void load8(const __nv_bfloat16* p, float v[8]) {
    const uint4 raw = *reinterpret_cast<const uint4*>(p);
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
    #pragma unroll
    for (int i = 0; i < 4; ++i) { const float2 f = __bfloat1622float2(h[i]); v[2 * i] = f.x; v[2 * i + 1] = f.y; }
}
__device__ __forceinline__ void load8(const __half* p, float v[8]) {
    const uint4 raw = *reinterpret_cast<const uint4*>(p);
    const __half2* h = reinterpret_cast<const __half2*>(&raw);
    #pragma unroll
    for (int i = 0; i < 4; ++i) { const float2 f = __half22float2(h[i]); v[2 * i] = f.x; v[2 * i + 1] = f.y; }
}

__device__ __forceinline__ void store8(float* p, const float v[8]) {
    reinterpret_cast<float4*>(p)[0] = make_float4(v[0], v[1], v[2], v[3]);
    reinterpret_cast<float4*>(p)[1] = make_float4(v[4], v[5], v[6], v[7]);
}
__device__ __forceinline__ void store8(__nv_bfloat16* p, const float v[8]) {
    uint4 raw;
    __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&raw);
    #pragma unroll
    for (int i = 0; i < 4; ++i) h[i] = __floats2bfloat162_rn(v[2 * i], v[2 * i + 1]);
    *reinterpret_cast<uint4*>(p) = raw;
}
__device__ __forceinline__ void store8(__half* p, const float v[8]) {
    uint4 raw;
    __half2* h = reinterpret_cast<__half2*>(&raw);
    #pragma unroll
    for (int i = 0; i < 4; ++i) h[i] = __floats2half2_rn(v[2 * i], v[2 * i + 1]);
    *reinterpret_cast<uint4*>(p) = raw;
}

// the largest |finite| value of the lane's 8 elements, and whether any is NaN or infinite
__device__ __forceinline__ float lane_amax(const float v[8], bool* bad) {
    float m = 0.0f;
    #pragma unroll
    for (int i = 0; i < 8; ++i) {
        const float a = fabsf(v[i]);
        if (isfinite(a)) m = fmaxf(m, a); else *bad = true;
    }
    return m;
}

__device__ __forceinline__ unsigned char to_e4m3(float x) {
    return (unsigned char)__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3);
}
__device__ __forceinline__ float e4m3_value(unsigned char c) {
    return __half2float(__half(__nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)c, __NV_E4M3)));
}

// e2m1 round to nearest even, saturating at 6: the midpoints after an even code round down, the others up
__device__ __forceinline__ unsigned int to_e2m1(float x) {
    const float a = fabsf(x);
    unsigned int code = (a > 0.25f) + (a >= 0.75f) + (a > 1.25f) + (a >= 1.75f) + (a > 2.5f) + (a >= 3.5f) + (a > 5.0f);
    return code | (signbit(x) ? 8u : 0u);
}
__device__ __forceinline__ float e2m1_value(unsigned int c) {
    const float magnitude[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    const float m = magnitude[c & 7u];
    return (c & 8u) ? -m : m;
}
"""

_MXFP8_QUANTIZE = r"""
// 4 adjacent lanes own one 32-element block; n8 = numel / 8
extern "C" __global__ void __launch_bounds__(256) tw_mxfp8_quantize(
        const in_t* __restrict__ x, unsigned char* __restrict__ q, unsigned char* __restrict__ scales, long long n8) {
    const long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const bool active = t < n8;
    float v[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    if (active) load8(x + t * 8, v);
    bool bad = false;
    float amax = lane_amax(v, &bad);
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
    bad = ((__ballot_sync(0xffffffffu, bad) >> ((threadIdx.x & 31u) & ~3u)) & 0xFu) != 0;
    if (!active) return;
    int shared = amax > 0.0f ? ilogbf(amax) - 8 : -127;
    shared = max(-127, min(127, shared));
    const float inverse = ldexpf(1.0f, -shared);
    unsigned long long out = 0;
    #pragma unroll
    for (int i = 0; i < 8; ++i) {
        const unsigned long long c = bad ? 0x7Fu : to_e4m3(v[i] * inverse);
        out |= c << (8 * i);
    }
    *reinterpret_cast<unsigned long long*>(q + t * 8) = out;
    if ((t & 3) == 0) scales[t >> 2] = bad ? 0xFF : (unsigned char)(shared + 127);
}
"""

_MXFP8_DEQUANTIZE = r"""
extern "C" __global__ void __launch_bounds__(256) tw_mxfp8_dequantize(
        const unsigned char* __restrict__ q, const unsigned char* __restrict__ scales, out_t* __restrict__ y,
        long long n8) {
    const long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= n8) return;
    const unsigned int code = scales[t >> 2];
    const float scale = code == 0xFFu ? __int_as_float(0x7fffffff) : ldexpf(1.0f, (int)code - 127);
    const unsigned long long raw = *reinterpret_cast<const unsigned long long*>(q + t * 8);
    float v[8];
    #pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = e4m3_value((unsigned char)(raw >> (8 * i))) * scale;
    store8(y + t * 8, v);
}
"""

_AMAX = r"""
// the largest |finite| value of x, merged into *amax (zeroed by the caller) through its unsigned bits
extern "C" __global__ void __launch_bounds__(256) tw_finite_amax(
        const in_t* __restrict__ x, unsigned int* __restrict__ amax, long long n8) {
    float m = 0.0f;
    bool bad = false;
    for (long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x; t < n8;
         t += (long long)gridDim.x * blockDim.x) {
        float v[8];
        load8(x + t * 8, v);
        m = fmaxf(m, lane_amax(v, &bad));
    }
    #pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, offset));
    if ((threadIdx.x & 31u) == 0) atomicMax(amax, __float_as_uint(m));
}
"""

_NVFP4_QUANTIZE = r"""
// 2 adjacent lanes own one 16-element block; the per-tensor scale is amax / (448 * 6), or 1 where that is 0
extern "C" __global__ void __launch_bounds__(256) tw_nvfp4_quantize(
        const in_t* __restrict__ x, const unsigned int* __restrict__ amax_bits, unsigned char* __restrict__ q,
        unsigned char* __restrict__ scales, float* __restrict__ tensor_scale, long long n8) {
    const long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const bool active = t < n8;
    float s = __uint_as_float(*amax_bits) / 2688.0f;
    if (s == 0.0f) s = 1.0f;
    if (t == 0) *tensor_scale = s;
    float v[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    if (active) load8(x + t * 8, v);
    bool bad = false;
    float amax = lane_amax(v, &bad);
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
    bad = ((__ballot_sync(0xffffffffu, bad) >> ((threadIdx.x & 31u) & ~1u)) & 0x3u) != 0;
    if (!active) return;
    const unsigned char scale_code = bad ? 0x7F : to_e4m3((amax / 6.0f) / s);
    const float denominator = e4m3_value(scale_code) * s;
    const bool usable = !bad && denominator != 0.0f;
    unsigned int out = 0;
    #pragma unroll
    for (int i = 0; i < 8; ++i) {
        const unsigned int c = usable ? to_e2m1(v[i] / denominator) : 0u;
        out |= c << (4 * i);
    }
    *reinterpret_cast<unsigned int*>(q + t * 4) = out;
    if ((t & 1) == 0) scales[t >> 1] = scale_code;
}
"""

_NVFP4_DEQUANTIZE = r"""
extern "C" __global__ void __launch_bounds__(256) tw_nvfp4_dequantize(
        const unsigned char* __restrict__ q, const unsigned char* __restrict__ scales,
        const float* __restrict__ tensor_scale, out_t* __restrict__ y, long long n8) {
    const long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= n8) return;
    const float scale = e4m3_value(scales[t >> 1]) * *tensor_scale;
    const unsigned int raw = *reinterpret_cast<const unsigned int*>(q + t * 4);
    float v[8];
    #pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = e2m1_value((raw >> (4 * i)) & 0xFu) * scale;
    store8(y + t * 8, v);
}
"""

_BODIES = {"tw_mxfp8_quantize": _MXFP8_QUANTIZE, "tw_mxfp8_dequantize": _MXFP8_DEQUANTIZE,
           "tw_finite_amax": _AMAX, "tw_nvfp4_quantize": _NVFP4_QUANTIZE, "tw_nvfp4_dequantize": _NVFP4_DEQUANTIZE}
KERNEL_NAMES = tuple(_BODIES)


def source(name: str, dtype: DType) -> str:
    """The CUDA C of kernel ``name`` reading (quantize, amax) or writing (dequantize) ``dtype`` values."""
    if dtype.name not in INPUT_TYPES:
        raise TypeError(f"{name}: block-scaled kernels read and write float32, bfloat16 or float16, got {dtype.name}")
    c_type = INPUT_TYPES[dtype.name]
    return f"#define IN_T {c_type}\n#define OUT_T {c_type}\n" + _COMMON + _BODIES[name]


def _kernel(name: str, dtype: DType, device: int):
    return load(source(name, dtype), name, device)


def _launch(name: str, dtype: DType, device: int, n8: int, args: list) -> None:
    if n8:
        launch(_kernel(name, dtype, device), ceil_div(n8, THREADS), THREADS, args + [n8], stream_handle(device))


def mxfp8_quantize(x: Tensor) -> tuple[Tensor, Tensor]:
    """(float8_e4m3fn elements of x's shape, float8_e8m0fnu scales [..., K/32]) of a contiguous CUDA tensor."""
    device = x.device
    q = empty(x.shape, dtypes.float8_e4m3fn, device)
    scales = empty(x.shape[:-1] + (x.shape[-1] // 32,), dtypes.float8_e8m0fnu, device)
    _launch("tw_mxfp8_quantize", x.dtype, device.index, x.numel() // PER_THREAD,
            [data_ptr(x), data_ptr(q), data_ptr(scales)])
    return q, scales


def mxfp8_dequantize(q: Tensor, scales: Tensor, dtype: DType) -> Tensor:
    y = empty(q.shape, dtype, q.device)
    _launch("tw_mxfp8_dequantize", dtype, q.device.index, q.numel() // PER_THREAD,
            [data_ptr(q), data_ptr(scales), data_ptr(y)])
    return y


def finite_amax_bits(x: Tensor) -> Tensor:
    """A one-element uint32-sized buffer (int32 tensor) holding the bits of max |finite x|."""
    device = x.device
    out = empty((1,), dtypes.int32, device)
    out.zero_()
    n8 = x.numel() // PER_THREAD
    if n8:
        grid = min(ceil_div(n8, THREADS), 1024)
        launch(_kernel("tw_finite_amax", x.dtype, device.index), grid, THREADS, [data_ptr(x), data_ptr(out), n8],
               stream_handle(device.index))
    return out


def nvfp4_quantize(x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(float4_e2m1fn_x2 [..., K/2], float8_e4m3fn scales [..., K/16], float32 per-tensor scale (0-dim))."""
    device = x.device
    amax = finite_amax_bits(x)
    q = empty(x.shape[:-1] + (x.shape[-1] // 2,), dtypes.float4_e2m1fn_x2, device)
    scales = empty(x.shape[:-1] + (x.shape[-1] // 16,), dtypes.float8_e4m3fn, device)
    tensor_scale = empty((), dtypes.float32, device)
    if x.numel() == 0:
        tensor_scale.fill_(1.0)
    _launch("tw_nvfp4_quantize", x.dtype, device.index, x.numel() // PER_THREAD,
            [data_ptr(x), data_ptr(amax), data_ptr(q), data_ptr(scales), data_ptr(tensor_scale)])
    return q, scales, tensor_scale


def nvfp4_dequantize(q: Tensor, scales: Tensor, tensor_scale: Tensor, dtype: DType) -> Tensor:
    shape = q.shape[:-1] + (q.shape[-1] * 2,)
    y = empty(shape, dtype, q.device)
    _launch("tw_nvfp4_dequantize", dtype, q.device.index, y.numel() // PER_THREAD,
            [data_ptr(q), data_ptr(scales), data_ptr(tensor_scale), data_ptr(y)])
    return y

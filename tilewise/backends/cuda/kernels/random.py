"""Random operators on CUDA, bit-identical to the CPU generator (see [Note: Philox stream layout]).

Thread ``t`` of a draw computes Philox block ``offset + t`` and turns its four words into the values the
numpy implementation assigns to those words: four float32 uniforms or normals, two float64 ones, four
32-bit or two 64-bit integers. The generator is the same object on both devices, so the same seed gives
the same tensor on CPU and GPU. ``randperm`` and ``multinomial`` have no CUDA kernel yet and run on the
host (see the backend's fallback).
"""

from __future__ import annotations

import numpy as np

from tilewise import _philox, dtypes
from tilewise.backends.cuda import data_ptr, empty, stream_handle
from tilewise.backends.cuda.kernels import ceil_div, kernel, launch, load
from tilewise.backends.cuda.kernels.copy import contiguous
from tilewise.compiler.render import CUDA
from tilewise.compiler.render.cstyle import SUFFIX, Source, compute_of, load_code, store_code
from tilewise.device import Device
from tilewise.dtypes import DType
from tilewise.tensor import Tensor

_BLOCK = 256

# values per Philox block, and the C statements producing value k of this thread into ``v[k]``
_VALUES = {
    "uniform_f32": (4, "float v[4] = {tw_uniform_float(w.x), tw_uniform_float(w.y), tw_uniform_float(w.z), "
                       "tw_uniform_float(w.w)};\n"
                       "    for (int k = 0; k < 4; ++k) v[k] = __fadd_rn(__fmul_rn(v[k], scale), shift);"),
    "uniform_f64": (2, "double v[2] = {tw_uniform_double(w.x, w.y), tw_uniform_double(w.z, w.w)};\n"
                       "    for (int k = 0; k < 2; ++k) v[k] = __dadd_rn(__dmul_rn(v[k], scale), shift);"),
    "normal_f32": (4, "float v[4];\n    tw_normal_float2(w.x, w.y, &v[0], &v[1]);\n"
                      "    tw_normal_float2(w.z, w.w, &v[2], &v[3]);"),
    "normal_f64": (2, "double v[2];\n    tw_normal_double2(w.x, w.y, w.z, w.w, &v[0], &v[1]);"),
    "randint_32": (4, "long long v[4];\n    const tw_u32 words[4] = {w.x, w.y, w.z, w.w};\n"
                      "    for (int k = 0; k < 4; ++k) v[k] = (long long)((span ? (tw_u64)words[k] % span : "
                      "(tw_u64)words[k]) + low);"),
    "randint_64": (2, "long long v[2];\n"
                      "    const tw_u64 words[2] = {((tw_u64)w.x << 32) | w.y, ((tw_u64)w.z << 32) | w.w};\n"
                      "    for (int k = 0; k < 2; ++k) v[k] = (long long)((span ? words[k] % span : words[k]) + low);"),
}
_PARAMS = {"uniform": ", {T} scale, {T} shift", "normal": "", "randint": ", tw_u64 span, tw_u64 low"}
_VALUE_TYPE = {"uniform_f32": dtypes.float32, "uniform_f64": dtypes.float64, "normal_f32": dtypes.float32,
               "normal_f64": dtypes.float64, "randint_32": dtypes.int64, "randint_64": dtypes.int64}


def _draw_kernel(kind: str, dtype: DType, device: int):
    """out[i] for the values of Philox blocks offset + t, t = this thread."""
    per_block, body = _VALUES[kind]
    value_type = _VALUE_TYPE[kind]
    source = Source(CUDA)
    source.need_storage(dtype)
    name = f"tw_{kind}_{SUFFIX[dtype.name]}"
    params = _PARAMS[kind.split("_")[0]].format(T=CUDA.ctype(value_type))
    store = store_code(CUDA, dtype, "v[k]", value_type)
    text = (f'extern "C" __global__ void {name}({CUDA.ctype(dtype)}* __restrict__ out, long long n, '
            f"tw_u64 seed, tw_u64 offset{params}) {{\n"
            f"    const long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;\n"
            f"    if (t * {per_block} >= n) return;\n"
            f"    const tw_u32x4 w = tw_philox_block(seed, offset + (tw_u64)t);\n    {body}\n"
            f"    for (int k = 0; k < {per_block}; ++k)\n"
            f"        if (t * {per_block} + k < n) out[t * {per_block} + k] = {store};\n}}")
    return load(source.text(_philox.PHILOX_CUDA_SOURCE + "\n" + text), name, device), per_block


def _generate(kind: str, size, dtype: DType, device: Device, generator, work, extra: tuple) -> Tensor:
    from tilewise.ops.creation import generator_or_default

    out = empty(tuple(size), dtype, device)
    n = out.numel()
    seed, offset = generator_or_default(generator).claim(_philox.counters_needed(n, work))
    if n:
        fn, per_block = _draw_kernel(kind, dtype, device.index)
        threads = ceil_div(n, per_block)
        launch(fn, ceil_div(threads, _BLOCK), _BLOCK, [data_ptr(out), n, seed, offset, *extra],
               stream_handle(device.index))
    return out


def _wide(dtype: DType) -> bool:
    return dtype.itemsize == 8


@kernel("uniform")
def uniform(device: Device, size, low=0.0, high=1.0, dtype=None, target=None, generator=None) -> Tensor:
    wide = _wide(dtype)
    work = np.float64 if wide else np.float32
    scale, shift = (float(high - low), float(low)) if (low != 0.0 or high != 1.0) else (1.0, 0.0)
    return _generate("uniform_f64" if wide else "uniform_f32", size, dtype, device, generator, work, (scale, shift))


@kernel("normal_sample")
def normal_sample(device: Device, size, dtype=None, target=None, generator=None) -> Tensor:
    wide = _wide(dtype)
    return _generate("normal_f64" if wide else "normal_f32", size, dtype, device, generator,
                     np.float64 if wide else np.float32, ())


@kernel("randint")
def randint(device: Device, low, high, size, dtype=None, target=None, generator=None) -> Tensor:
    draw = _philox.randint_draw_dtype(low, high)
    span = (high - low) % (1 << 64)
    kind = "randint_32" if draw == np.uint32 else "randint_64"
    return _generate(kind, size, dtype, device, generator, draw, (span, low % (1 << 64)))


@kernel("bernoulli")
def bernoulli(device: Device, self: Tensor, generator=None) -> Tensor:
    from tilewise.ops.creation import generator_or_default

    p = contiguous(self)
    out = empty(p._shape, p._dtype, device)
    n = out.numel()
    seed, offset = generator_or_default(generator).claim(_philox.counters_needed(n, np.float32))
    if n:
        compare = compute_of(p._dtype)
        source = Source(CUDA)
        source.need_storage(p._dtype)
        c, cc = CUDA.ctype(p._dtype), CUDA.ctype(compare)
        name = f"tw_bernoulli_{SUFFIX[p._dtype.name]}"
        prob = load_code(CUDA, p._dtype, "p[i]")
        one, zero = store_code(CUDA, p._dtype, "1", compare), store_code(CUDA, p._dtype, "0", compare)
        text = (f'extern "C" __global__ void {name}({c}* __restrict__ out, const {c}* __restrict__ p, long long n, '
                f"tw_u64 seed, tw_u64 offset) {{\n"
                f"    const long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;\n"
                f"    if (t * 4 >= n) return;\n"
                f"    const tw_u32x4 w = tw_philox_block(seed, offset + (tw_u64)t);\n"
                f"    const tw_u32 words[4] = {{w.x, w.y, w.z, w.w}};\n"
                f"    for (int k = 0; k < 4; ++k) {{\n        const long long i = t * 4 + k;\n"
                f"        if (i >= n) return;\n"
                f"        out[i] = ({cc})tw_uniform_float(words[k]) < ({cc})({prob}) ? {one} : {zero};\n    }}\n}}")
        fn = load(source.text(_philox.PHILOX_CUDA_SOURCE + "\n" + text), name, device.index)
        launch(fn, ceil_div(ceil_div(n, 4), _BLOCK), _BLOCK, [data_ptr(out), data_ptr(p), n, seed, offset],
               stream_handle(device.index))
    return out

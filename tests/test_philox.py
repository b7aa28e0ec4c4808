"""Philox4x32-10: known answers, the stream layout, distributions, and CPU/C/CUDA bit-identity."""

import ctypes
import doctest
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest

from tilewise import _philox
from tilewise._philox import (
    PHILOX_CUDA_SOURCE,
    counters_needed,
    normal,
    philox4x32,
    randint,
    randint_draw_dtype,
    random_bits,
    uniform,
)

# (counter, key, expected) from Random123's examples/kat_vectors ("philox4x32 10" lines); the first three
# are the distribution's own examples, the last two from its generated table.
KNOWN_ANSWERS = [
    ((0x00000000, 0x00000000, 0x00000000, 0x00000000), (0x00000000, 0x00000000),
     (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF), (0xFFFFFFFF, 0xFFFFFFFF),
     (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
    ((0x00000001, 0x00000000, 0x00000000, 0x00000000), (0x00000001, 0x00000000),
     (0xAC08141B, 0xDFC5CCBE, 0x79C07A47, 0xA7F66093)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0x00000000, 0xFFFFFFFF),
     (0x08F7720C, 0x845EE9E0, 0x502CCD3D, 0xA9A00E27)),
]  # fmt: skip

SEED = 0x0123456789ABCDEF  # both key words nonzero
OFFSET = (1 << 32) - 5  # the counter's low word carries into its high word inside the draw


@pytest.mark.parametrize(("counter", "key", "expected"), KNOWN_ANSWERS)
def test_known_answers(counter, key, expected):
    out = philox4x32(np.array([counter], np.uint32), np.array(key, np.uint32))
    assert out.tolist() == [list(expected)]


def test_known_answers_with_a_key_per_row():
    counters, keys, expected = (np.array(col, np.uint32) for col in zip(*KNOWN_ANSWERS, strict=True))
    np.testing.assert_array_equal(philox4x32(counters, keys), expected)


def test_stream_layout_is_philox_of_offset_plus_block_index():
    blocks = 8
    c = np.arange(OFFSET, OFFSET + blocks, dtype=np.uint64)
    counters = np.stack([c & 0xFFFFFFFF, c >> 32, 0 * c, 0 * c], axis=1).astype(np.uint32)
    key = np.array([SEED & 0xFFFFFFFF, SEED >> 32], np.uint32)
    np.testing.assert_array_equal(random_bits(SEED, OFFSET, 4 * blocks), philox4x32(counters, key).reshape(-1))


@dataclass(frozen=True)
class Draw:
    name: str
    fn: Callable[[int, int, int], np.ndarray]
    dtype: np.dtype  # what counters_needed is asked about


DRAWS = [
    Draw("bits", random_bits, np.dtype(np.uint32)),
    Draw("uniform32", lambda s, o, n: uniform(s, o, n, np.float32), np.dtype(np.float32)),
    Draw("uniform64", lambda s, o, n: uniform(s, o, n, np.float64), np.dtype(np.float64)),
    Draw("normal32", lambda s, o, n: normal(s, o, n, np.float32), np.dtype(np.float32)),
    Draw("normal64", lambda s, o, n: normal(s, o, n, np.float64), np.dtype(np.float64)),
    Draw("randint32", lambda s, o, n: randint(s, o, n, -3, 1000), randint_draw_dtype(-3, 1000)),
    Draw("randint64", lambda s, o, n: randint(s, o, n, 0, 1 << 40), randint_draw_dtype(0, 1 << 40)),
]


@pytest.mark.parametrize("draw", DRAWS, ids=lambda d: d.name)
def test_next_draw_at_advanced_offset_continues_the_stream(draw):
    first = draw.fn(SEED, OFFSET, 10)
    advanced = OFFSET + counters_needed(10, draw.dtype)
    second = draw.fn(SEED, advanced, 7)
    values_per_counter = 4 // _philox._words_per_value(draw.dtype)
    skipped = counters_needed(10, draw.dtype) * values_per_counter
    longer = draw.fn(SEED, OFFSET, skipped + 7)
    np.testing.assert_array_equal(first, longer[:10])
    np.testing.assert_array_equal(second, longer[skipped:])


@pytest.mark.parametrize("draw", DRAWS, ids=lambda d: d.name)
def test_draws_are_deterministic_prefixes_and_depend_on_seed(draw):
    np.testing.assert_array_equal(draw.fn(SEED, 3, 9), draw.fn(SEED, 3, 9))
    np.testing.assert_array_equal(draw.fn(SEED, 3, 9), draw.fn(SEED, 3, 33)[:9])
    assert not np.array_equal(draw.fn(SEED, 3, 33), draw.fn(SEED + 1, 3, 33))
    assert draw.fn(SEED, 3, 0).shape == (0,)


def test_counters_needed():
    assert [counters_needed(n, np.float32) for n in (0, 1, 4, 5, 10)] == [0, 1, 1, 2, 3]
    assert [counters_needed(n, np.float64) for n in (0, 1, 2, 3, 10)] == [0, 1, 1, 2, 5]
    assert randint_draw_dtype(-(1 << 31), 1 << 31) == np.uint32
    assert randint_draw_dtype(0, (1 << 32) + 1) == np.uint64


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_uniform_statistics(dtype):
    u = uniform(SEED, 0, 1_000_000, dtype)
    assert u.dtype == dtype and u.min() >= 0 and u.max() < 1
    assert abs(u.mean() - 0.5) < 2e-3
    assert abs(u.var() - 1 / 12) < 1e-3
    grid_bits = {np.float32: 24, np.float64: 53}[dtype]
    assert np.all(uniform(SEED, 0, 1000, dtype) * 2.0**grid_bits % 1 == 0)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_normal_statistics(dtype):
    z = normal(SEED, 0, 1_000_000, dtype).astype(np.float64)
    assert abs(z.mean()) < 5e-3
    assert abs(z.var() - 1) < 1e-2
    assert abs(np.mean(z**3)) < 2e-2
    assert abs(np.mean(z**4) - 3) < 5e-2
    assert abs(np.mean(np.abs(z) > 2) - 0.0455) < 2e-3


@pytest.mark.parametrize(("dtype", "tolerance"), [(np.float32, 1e-6), (np.float64, 1e-14)])
def test_normal_matches_box_muller_in_float64_math(dtype, tolerance):
    z = normal(SEED, 0, 100_000, dtype)
    u = uniform(SEED, 0, 100_000, dtype).astype(np.float64).reshape(-1, 2)
    r = np.sqrt(-2 * np.log1p(-u[:, 0]))
    reference = np.stack([r * np.cos(2 * np.pi * u[:, 1]), r * np.sin(2 * np.pi * u[:, 1])], axis=1).reshape(-1)
    assert np.max(np.abs(z - reference) / (1 + np.abs(reference))) < tolerance


def test_float32_log_and_sincos_are_accurate_over_the_whole_grid():
    p = _philox._FLOAT32
    k = np.arange(0, 1 << 24, 3, dtype=np.int64)
    sin, cos = _philox._sincos_turn(k, p)
    angle = 2 * np.pi * k / 2**24
    assert np.max(np.abs(sin - np.sin(angle))) < 2 * 2.0**-24
    assert np.max(np.abs(cos - np.cos(angle))) < 2 * 2.0**-24
    u = np.arange(1, (1 << 24) + 1).astype(np.float32) * np.float32(2**-24)
    reference = np.log(u.astype(np.float64))
    ulp = np.spacing(np.abs(reference).astype(np.float32)).astype(np.float64)
    assert np.max(np.abs(_philox._log_unit(u, p) - reference) / ulp) < 3


@pytest.mark.parametrize(
    ("low", "high", "dtype"),
    [(0, 2, np.int64), (-5, 5, np.int32), (0, 256, np.uint8), (-(1 << 63), 1 << 63, np.int64), (0, 1 << 64, np.uint64)],
)
def test_randint_covers_its_range(low, high, dtype):
    r = randint(SEED, 0, 20_000, low, high, dtype)
    assert r.dtype == dtype
    assert int(r.min()) >= low and int(r.max()) < high
    if high - low <= 256:
        assert set(r.tolist()) == set(range(low, high))


def test_randint_is_low_plus_bits_modulo_span():
    np.testing.assert_array_equal(randint(SEED, 5, 99, -7, 1000), -7 + random_bits(SEED, 5, 99).astype(np.int64) % 1007)
    words = random_bits(SEED, 5, 2 * 99).reshape(-1, 2).astype(object)
    expected = [(-(1 << 40) + ((hi << 32 | lo) % (3 << 40))) for hi, lo in words]
    assert randint(SEED, 5, 99, -(1 << 40), 2 << 40).tolist() == expected


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: philox4x32(np.zeros((2, 4), np.int64), np.zeros(2, np.uint32)), "counter must be uint32"),
        (lambda: philox4x32(np.zeros((2, 4), np.uint32), np.zeros((3, 2), np.uint32)), r"key must be uint32"),
        (lambda: random_bits(-1, 0, 4), "seed must lie in"),
        (lambda: random_bits(0, (1 << 64) - 1, 5), "64-bit range"),
        (lambda: random_bits(0, 0, -1), "n must be >= 0"),
        (lambda: uniform(0, 0, 4, np.float16), "float32 or float64, got float16"),
        (lambda: randint(0, 0, 4, 5, 5), "low < high"),
        (lambda: randint(0, 0, 4, -1, 10, np.uint8), "low < high"),
    ],
)
def test_errors_say_what_was_wrong(call, message):
    with pytest.raises((ValueError, TypeError), match=message):
        call()


def test_docstring_examples():
    assert doctest.testmod(_philox).failed == 0


# --- the CUDA C source: NVRTC, the host C compiler, and (where there is one) the GPU -------------------

# Per-thread bodies shared by the host-C loop and the CUDA kernels: thread t owns block offset + t.
THREAD_BODIES = r"""
__device__ __forceinline__ void body_bits(tw_u64 seed, tw_u64 offset, tw_u64 t, tw_u32* out) {
    tw_u32x4 b = tw_philox_block(seed, offset + t);
    out[4 * t] = b.x; out[4 * t + 1] = b.y; out[4 * t + 2] = b.z; out[4 * t + 3] = b.w;
}
__device__ __forceinline__ void body_uniform32(tw_u64 seed, tw_u64 offset, tw_u64 t, float* out) {
    tw_u32x4 b = tw_philox_block(seed, offset + t);
    out[4 * t] = tw_uniform_float(b.x); out[4 * t + 1] = tw_uniform_float(b.y);
    out[4 * t + 2] = tw_uniform_float(b.z); out[4 * t + 3] = tw_uniform_float(b.w);
}
__device__ __forceinline__ void body_uniform64(tw_u64 seed, tw_u64 offset, tw_u64 t, double* out) {
    tw_u32x4 b = tw_philox_block(seed, offset + t);
    out[2 * t] = tw_uniform_double(b.x, b.y); out[2 * t + 1] = tw_uniform_double(b.z, b.w);
}
__device__ __forceinline__ void body_normal32(tw_u64 seed, tw_u64 offset, tw_u64 t, float* out) {
    tw_u32x4 b = tw_philox_block(seed, offset + t);
    tw_normal_float2(b.x, b.y, &out[4 * t], &out[4 * t + 1]);
    tw_normal_float2(b.z, b.w, &out[4 * t + 2], &out[4 * t + 3]);
}
__device__ __forceinline__ void body_normal64(tw_u64 seed, tw_u64 offset, tw_u64 t, double* out) {
    tw_u32x4 b = tw_philox_block(seed, offset + t);
    tw_normal_double2(b.x, b.y, b.z, b.w, &out[2 * t], &out[2 * t + 1]);
}
"""

# name -> (C element type, numpy dtype, values per block, the numpy draw it must equal)
KERNELS = {
    "bits": ("tw_u32", np.uint32, 4, random_bits),
    "uniform32": ("float", np.float32, 4, lambda s, o, n: uniform(s, o, n, np.float32)),
    "uniform64": ("double", np.float64, 2, lambda s, o, n: uniform(s, o, n, np.float64)),
    "normal32": ("float", np.float32, 4, lambda s, o, n: normal(s, o, n, np.float32)),
    "normal64": ("double", np.float64, 2, lambda s, o, n: normal(s, o, n, np.float64)),
}

HOST_LOOP = """
void host_{name}(tw_u64 seed, tw_u64 offset, tw_u64 blocks, {ctype}* out) {{
    for (tw_u64 t = 0; t < blocks; ++t) body_{name}(seed, offset, t, out);
}}
"""

CUDA_KERNEL = """
extern "C" __global__ void kernel_{name}(tw_u64 seed, tw_u64 offset, tw_u64 blocks, {ctype}* out) {{
    tw_u64 t = (tw_u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (t < blocks) body_{name}(seed, offset, t, out);
}}
"""

BLOCKS = 1500  # 6000 float32 values, 3000 float64 values per kind


def _render(template: str) -> str:
    loops = "".join(template.format(name=name, ctype=ctype) for name, (ctype, *_) in KERNELS.items())
    return PHILOX_CUDA_SOURCE + THREAD_BODIES + loops


def _assert_matches_numpy(run: Callable[[str, np.dtype, int], np.ndarray]) -> None:
    for name, (_, dtype, per_block, numpy_draw) in KERNELS.items():
        got = run(name, np.dtype(dtype), BLOCKS * per_block)
        expected = numpy_draw(SEED, OFFSET, BLOCKS * per_block)
        bits = np.uint32 if np.dtype(dtype).itemsize == 4 else np.uint64
        np.testing.assert_array_equal(got.view(bits), expected.view(bits), err_msg=name)


def _nvrtc_check(result, call: str):
    from cuda.bindings import nvrtc

    status, *values = result
    if status != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise RuntimeError(f"{call} failed: {status}")
    return values[0] if len(values) == 1 else values


def _nvrtc_compile(source: str, arch: str) -> tuple[str, bytes]:
    """(PTX, cubin) of source for arch, raising with NVRTC's log on a compile error."""
    from cuda.bindings import nvrtc

    prog = _nvrtc_check(nvrtc.nvrtcCreateProgram(source.encode(), b"philox.cu", 0, [], []), "nvrtcCreateProgram")
    try:
        options = [f"-arch={arch}".encode(), b"-std=c++17"]
        (status,) = nvrtc.nvrtcCompileProgram(prog, len(options), options)
        if status != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            log = b" " * _nvrtc_check(nvrtc.nvrtcGetProgramLogSize(prog), "nvrtcGetProgramLogSize")
            _nvrtc_check(nvrtc.nvrtcGetProgramLog(prog, log), "nvrtcGetProgramLog")
            raise RuntimeError(f"nvrtcCompileProgram failed: {status}\n{log.decode()}")
        ptx = b" " * _nvrtc_check(nvrtc.nvrtcGetPTXSize(prog), "nvrtcGetPTXSize")
        _nvrtc_check(nvrtc.nvrtcGetPTX(prog, ptx), "nvrtcGetPTX")
        cubin = b" " * _nvrtc_check(nvrtc.nvrtcGetCUBINSize(prog), "nvrtcGetCUBINSize")
        _nvrtc_check(nvrtc.nvrtcGetCUBIN(prog, cubin), "nvrtcGetCUBIN")
        return ptx.decode().rstrip("\0 "), cubin
    finally:
        _nvrtc_check(nvrtc.nvrtcDestroyProgram(prog), "nvrtcDestroyProgram")


def test_cuda_source_compiles_with_nvrtc_and_has_no_contracted_fma():
    pytest.importorskip("cuda.bindings.nvrtc", reason="cuda-bindings with NVRTC is not installed")
    ptx, cubin = _nvrtc_compile(_render(CUDA_KERNEL), "sm_90")
    assert ".entry kernel_normal32" in ptx and len(cubin) > 0
    # An FMA would round once where numpy rounds twice and break CPU/GPU bit-identity.
    assert "fma.rn" not in ptx


@pytest.fixture(scope="module")
def host_library(tmp_path_factory):
    cc = shutil.which("cc")
    if cc is None:
        pytest.skip("no host C compiler (cc)")
    folder = tmp_path_factory.mktemp("philox_c")
    source, library = folder / "philox.c", folder / "libphilox.so"
    source.write_text(_render(HOST_LOOP))
    command = [cc, "-std=c99", "-O2", "-Wall", "-Werror", "-ffp-contract=off", "-shared", "-fPIC"]
    subprocess.run([*command, str(source), "-o", str(library), "-lm"], check=True, capture_output=True, text=True)
    return ctypes.CDLL(str(library))


def test_cuda_source_compiled_as_host_c_matches_numpy_bit_for_bit(host_library):
    def run(name: str, dtype: np.dtype, n: int) -> np.ndarray:
        out = np.empty(n, dtype)
        fn = getattr(host_library, f"host_{name}")
        fn.argtypes = [ctypes.c_uint64, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_void_p]
        fn(SEED, OFFSET, BLOCKS, out.ctypes.data)
        return out

    _assert_matches_numpy(run)


def _cu_check(result, call: str):
    from cuda.bindings import driver as cu

    status, *values = result
    if status != cu.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"{call} failed: {cu.cuGetErrorString(status)[1]}")
    return values[0] if len(values) == 1 else values


@pytest.mark.cuda
def test_gpu_matches_numpy_bit_for_bit():
    cu = pytest.importorskip("cuda.bindings.driver", reason="cuda-bindings is not installed")
    try:
        has_gpu = cu.cuInit(0)[0] == cu.CUresult.CUDA_SUCCESS and cu.cuDeviceGetCount()[1] > 0
    except RuntimeError:  # cuda-pathfinder finds no driver library (libcuda)
        has_gpu = False
    if not has_gpu:
        pytest.skip("no CUDA GPU")
    device = _cu_check(cu.cuDeviceGet(0), "cuDeviceGet")
    attribute = cu.CUdevice_attribute
    major = _cu_check(cu.cuDeviceGetAttribute(attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device), "major")
    minor = _cu_check(cu.cuDeviceGetAttribute(attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device), "minor")
    _, cubin = _nvrtc_compile(_render(CUDA_KERNEL), f"sm_{major}{minor}")
    context = _cu_check(cu.cuDevicePrimaryCtxRetain(device), "cuDevicePrimaryCtxRetain")
    try:
        _cu_check(cu.cuCtxSetCurrent(context), "cuCtxSetCurrent")
        module = _cu_check(cu.cuModuleLoadData(cubin), "cuModuleLoadData")

        def run(name: str, dtype: np.dtype, n: int) -> np.ndarray:
            kernel = _cu_check(cu.cuModuleGetFunction(module, f"kernel_{name}".encode()), "cuModuleGetFunction")
            out = np.empty(n, dtype)
            buffer = _cu_check(cu.cuMemAlloc(out.nbytes), "cuMemAlloc")
            args = ((SEED, OFFSET, BLOCKS, int(buffer)), (ctypes.c_uint64,) * 3 + (ctypes.c_void_p,))
            threads = 128
            grid = -(-BLOCKS // threads)
            _cu_check(cu.cuLaunchKernel(kernel, grid, 1, 1, threads, 1, 1, 0, 0, args, 0), "cuLaunchKernel")
            _cu_check(cu.cuMemcpyDtoH(out.ctypes.data, buffer, out.nbytes), "cuMemcpyDtoH")
            _cu_check(cu.cuMemFree(buffer), "cuMemFree")
            return out

        _assert_matches_numpy(run)
        _cu_check(cu.cuModuleUnload(module), "cuModuleUnload")
    finally:
        _cu_check(cu.cuDevicePrimaryCtxRelease(device), "cuDevicePrimaryCtxRelease")

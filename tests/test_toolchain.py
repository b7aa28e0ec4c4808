"""Tests of the kernel toolchain: NVRTC compiles and errors, the kernel cache, SASS and resource usage
(all without a GPU), argument packing, and (marked ``cuda``) loading and launching a kernel."""

from __future__ import annotations

import ctypes
import time

import numpy as np
import pytest

from tilewise._cuda_api import is_available
from tilewise.backends.cuda.runtime.module import Function, pack_arguments
from tilewise.codegen.toolchain import cache as cache_module
from tilewise.codegen.toolchain import sass as sass_module
from tilewise.codegen.toolchain.cache import (
    KernelCache,
    cache_key,
    decode_entry,
    default_cache_dir,
    encode_entry,
)
from tilewise.codegen.toolchain.disk import seal, unseal
from tilewise.codegen.toolchain.nvrtc import (
    KernelCompileError,
    compile_cuda,
    nvrtc_version,
    source_excerpt,
)
from tilewise.codegen.toolchain.sass import (
    disassemble,
    disassemble_all,
    elf_resource_usage,
    find_binary_utility,
    parse_res_usage,
    resource_usage,
)

FILL = """
extern "C" __global__ void fill(float* out, float value, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = value + (float)i;
}
"""

SHARED_AND_SPILL = """
extern "C" __global__ void staged(float* out, int n) {
    __shared__ float tile[4096];
    tile[threadIdx.x] = out[threadIdx.x];
    __syncthreads();
    out[threadIdx.x] = tile[(threadIdx.x + 1) % n];
}
extern "C" __global__ void spilly(float* out, int n) {
    float a[64];
    for (int j = 0; j < 64; ++j) a[j] = out[j * n];
    float s = 0.f;
    for (int j = 0; j < 64; ++j) s += a[(j * 7 + n) & 63] * a[j];
    out[0] = s;
}
"""

BROKEN = """extern "C" __global__ void broken(float* out) {
    int fine = 1;
    out[0] = undefined_thing;
    out[1] = fine;
}
"""


@pytest.fixture(scope="module")
def fill_kernel():
    return compile_cuda(FILL, "fill", "sm_90")


# ---- NVRTC --------------------------------------------------------------------------------------------


def test_compile_gives_ptx_and_sm90_cubin(fill_kernel):
    assert fill_kernel.names == ("fill",) and fill_kernel.name == "fill"
    assert ".entry fill" in fill_kernel.ptx and ".target sm_90" in fill_kernel.ptx
    assert fill_kernel.cubin[:4] == b"\x7fELF"
    assert fill_kernel.arch == "sm_90" and fill_kernel.options[0] == "-arch=sm_90"
    assert fill_kernel.compile_seconds > 0 and not fill_kernel.from_cache


def test_virtual_target_gives_ptx_only():
    kernel = compile_cuda(FILL, "fill", "compute_90")
    assert kernel.cubin is None and ".entry fill" in kernel.ptx


def test_compile_error_names_the_kernel_and_shows_log_and_source():
    with pytest.raises(KernelCompileError) as caught:
        compile_cuda(BROKEN, "broken", "sm_90")
    message = str(caught.value)
    assert "'broken'" in message and "sm_90" in message
    assert 'identifier "undefined_thing" is undefined' in message  # the compiler log
    assert "> 3 |     out[0] = undefined_thing;" in message  # the excerpt, reported line marked
    assert "  2 |     int fine = 1;" in message and "kernel.cu:3" in message
    assert caught.value.names == ("broken",) and "undefined_thing" in caught.value.log


def test_unknown_option_is_a_compile_error():
    with pytest.raises(KernelCompileError, match="-O3"):
        compile_cuda(FILL, "fill", "sm_90", ["-O3"])


def test_unknown_arch_is_rejected():
    with pytest.raises(ValueError, match="unknown CUDA target"):
        compile_cuda(FILL, "fill", "hopper")


def test_source_excerpt_numbers_and_marks_reported_lines():
    source = "\n".join(f"line {i}" for i in range(1, 21))
    log = "k.cu(10): error: bad\nk.cu(10): error: also bad\nother.h(3): error: not ours\nk.cu(20): warning: w"
    excerpt = source_excerpt(source, log, "k.cu")
    assert "k.cu:10\n   8 | line 8\n   9 | line 9\n> 10 | line 10\n  11 | line 11\n  12 | line 12" in excerpt
    assert excerpt.count("k.cu:10") == 1 and "k.cu:20" in excerpt and "other.h" not in excerpt


def test_name_expressions_give_lowered_names():
    source = "template <typename T> __global__ void scale(T* x, T a) { x[threadIdx.x] *= a; }"
    kernel = compile_cuda(source, "scale<float>", "sm_90", name_expressions=["scale<float>"])
    lowered = kernel.lowered_names["scale<float>"]
    assert lowered.startswith("_Z") and f".entry {lowered}" in kernel.ptx


# ---- the kernel cache ---------------------------------------------------------------------------------


def test_disk_cache_hits_on_second_compile(tmp_path):
    first = KernelCache(tmp_path)
    t0 = time.perf_counter()
    compiled = first.compile(FILL, "fill", "sm_90")
    t1 = time.perf_counter()
    assert first.last_source == "nvrtc" and first.stats.compiles == 1
    again = first.compile(FILL, "fill", "sm_90")
    assert first.last_source == "memory" and first.stats.memory_hits == 1 and again.from_cache

    second = KernelCache(tmp_path)  # a new process, as far as the cache can tell
    t2 = time.perf_counter()
    loaded = second.compile(FILL, "fill", "sm_90")
    t3 = time.perf_counter()
    assert second.last_source == "disk" and second.stats.disk_hits == 1 and second.stats.compiles == 0
    assert (loaded.ptx, loaded.cubin, loaded.names, loaded.options) == (
        compiled.ptx,
        compiled.cubin,
        compiled.names,
        compiled.options,
    )
    assert loaded.from_cache
    print(f"compile {1e3 * (t1 - t0):.1f} ms, disk hit {1e3 * (t3 - t2):.2f} ms")
    assert not list(tmp_path.rglob("*.tmp")), "atomic writes leave no temporary files"


def test_a_disk_hit_does_not_load_nvrtc_when_the_installation_is_unchanged(tmp_path, monkeypatch):
    """The NVRTC version and header directories a key needs come from the toolchain record while the stamp matches."""
    first = KernelCache(tmp_path)
    first.compile(FILL, "fill", "sm_90")
    assert (tmp_path / cache_module.TOOLCHAIN_RECORD).exists()

    def no_lookup():
        raise AssertionError("looked the toolchain up again")

    monkeypatch.setattr(cache_module, "nvrtc_version", no_lookup)
    monkeypatch.setattr(cache_module, "cuda_include_dirs", no_lookup)
    second = KernelCache(tmp_path)
    second.compile(FILL, "fill", "sm_90")
    assert second.last_source == "disk"
    monkeypatch.undo()

    # another installation (here: another CUDA_HOME) looks it up again and remembers what it found
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "elsewhere"))
    third = KernelCache(tmp_path)
    third.compile(FILL, "fill", "sm_90")
    assert third.last_source == "disk"
    assert str(tmp_path / "elsewhere") in (tmp_path / cache_module.TOOLCHAIN_RECORD).read_text()


def test_a_wrongly_remembered_toolchain_is_refreshed_before_compiling(tmp_path):
    cache = KernelCache(tmp_path)
    version, dirs = cache.toolchain()
    record = tmp_path / cache_module.TOOLCHAIN_RECORD  # a valid entry that remembers another version
    record.write_bytes(seal(unseal(record.read_bytes()).replace(f"[{version[0]}, {version[1]}]".encode(), b"[1, 0]")))
    stale = KernelCache(tmp_path)
    assert stale.toolchain()[0] == (1, 0)
    stale.compile(FILL, "fill", "sm_90")  # a miss under the stale key: looked up again, keyed by what is here
    assert stale.last_source == "nvrtc" and stale.toolchain()[0] == version
    assert KernelCache(tmp_path).toolchain()[0] == version


def test_cache_key_covers_everything_that_changes_the_output(monkeypatch):
    args = (FILL, ("fill",), "sm_90", ("-arch=sm_90",), (13, 5))
    base = cache_key(*args)
    assert cache_key(*args) == base
    assert cache_key(FILL + " ", *args[1:]) != base
    assert cache_key(FILL, ("other",), *args[2:]) != base
    assert cache_key(FILL, ("fill",), "sm_100a", *args[3:]) != base
    assert cache_key(FILL, ("fill",), "sm_90", ("-arch=sm_90", "-lineinfo"), (13, 5)) != base
    assert cache_key(*args[:4], (13, 6)) != base
    monkeypatch.setattr(cache_module, "TOOLCHAIN_FORMAT_VERSION", cache_module.TOOLCHAIN_FORMAT_VERSION + 1)
    assert cache_key(*args) != base


def test_different_options_compile_separately(tmp_path):
    cache = KernelCache(tmp_path)
    cache.compile(FILL, "fill", "sm_90")
    cache.compile(FILL, "fill", "sm_90", ["-lineinfo"])
    cache.compile(FILL, "fill", "sm_80")
    assert cache.stats.compiles == 3 and len(list(tmp_path.rglob("*.kernel"))) == 3


@pytest.mark.parametrize("damage", ["garbage", "truncated", "flipped_byte", "empty"])
def test_corrupted_cache_entry_is_recompiled(tmp_path, damage):
    KernelCache(tmp_path).compile(FILL, "fill", "sm_90")
    (entry,) = tmp_path.rglob("*.kernel")
    data = entry.read_bytes()
    damaged = {
        "garbage": b"not a kernel at all",
        "truncated": data[: len(data) // 2],
        "flipped_byte": data[:-10] + bytes([data[-10] ^ 0xFF]) + data[-9:],
        "empty": b"",
    }[damage]
    entry.write_bytes(damaged)
    cache = KernelCache(tmp_path)
    kernel = cache.compile(FILL, "fill", "sm_90")
    assert cache.last_source == "nvrtc" and cache.stats.compiles == 1
    assert cache.stats.corrupt_entries == 1
    assert kernel.cubin[:4] == b"\x7fELF"
    fresh = KernelCache(tmp_path)
    fresh.compile(FILL, "fill", "sm_90")
    assert fresh.last_source == "disk", "the corrupted entry is overwritten by the recompile"


def test_entry_round_trip_and_key_mismatch(fill_kernel):
    data = encode_entry("k1", fill_kernel)
    decoded = decode_entry(data, "k1")
    assert decoded.ptx == fill_kernel.ptx and decoded.cubin == fill_kernel.cubin
    assert decode_entry(data, "k2") is None


def test_cache_dir_comes_from_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("TILEWISE_CACHE_DIR", str(tmp_path / "kernels"))
    assert default_cache_dir() == tmp_path / "kernels"
    assert KernelCache().directory == tmp_path / "kernels"
    monkeypatch.delenv("TILEWISE_CACHE_DIR")
    assert str(default_cache_dir()).endswith(".cache/tilewise/kernels")


def test_memory_only_cache_writes_nothing(tmp_path):
    cache = KernelCache(tmp_path, use_disk=False)
    cache.compile(FILL, "fill", "sm_90")
    cache.compile(FILL, "fill", "sm_90")
    assert cache.last_source == "memory" and not list(tmp_path.iterdir())


def test_nvrtc_version():
    major, minor = nvrtc_version()
    assert major >= 12 and minor >= 0


# ---- SASS and resource usage --------------------------------------------------------------------------


@pytest.mark.skipif(find_binary_utility("nvdisasm") is None, reason="nvdisasm not installed")
def test_nvdisasm_gives_sass_with_the_kernel_name(fill_kernel):
    sass = disassemble(fill_kernel.cubin)
    assert ".text.fill" in sass and "fill:" in sass
    assert "STG" in sass and "EXIT" in sass


@pytest.mark.skipif(find_binary_utility("nvdisasm") is None, reason="nvdisasm not installed")
def test_sass_is_remembered_per_cubin_in_memory_and_on_disk(fill_kernel, tmp_path, monkeypatch):
    """The disassembler runs once per cubin: later calls, in this process or a later one, read the text."""
    monkeypatch.setenv("TILEWISE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(sass_module, "_remembered", {})
    runs = []
    real = sass_module._run_on_cubin
    monkeypatch.setattr(sass_module, "_run_on_cubin", lambda *a: runs.append(a[0]) or real(*a))
    other = compile_cuda(FILL.replace("value + (float)i", "value * (float)i"), "fill", "sm_90")
    first = disassemble(fill_kernel.cubin)
    assert disassemble(fill_kernel.cubin) == first and len(runs) == 1
    assert [p.suffix for p in (tmp_path / "sass-v1").iterdir()] == [".sass"]
    monkeypatch.setattr(sass_module, "_remembered", {})  # as a new process: the disk copy answers
    assert disassemble(fill_kernel.cubin) == first and len(runs) == 1
    assert "FMUL" in disassemble(other.cubin) and len(runs) == 2  # another cubin is another entry


@pytest.mark.skipif(find_binary_utility("nvdisasm") is None, reason="nvdisasm not installed")
def test_disassemble_all_keeps_the_order_of_its_cubins(fill_kernel, tmp_path, monkeypatch):
    monkeypatch.setenv("TILEWISE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(sass_module, "_remembered", {})
    kernels = [compile_cuda(FILL.replace("out[i] = value", f"out[i] = {k}.f * value"), "fill", "sm_90")
               for k in (2, 3, 5)]
    texts = disassemble_all([k.cubin for k in [*kernels, fill_kernel]])
    monkeypatch.setattr(sass_module, "_remembered", {})
    assert texts == [disassemble(k.cubin) for k in [*kernels, fill_kernel]]
    assert len(set(texts)) == 4


def test_elf_resource_usage_reads_registers_shared_and_local():
    kernel = compile_cuda(SHARED_AND_SPILL, ["staged", "spilly"], "sm_90", ["--maxrregcount=32"])
    usage = elf_resource_usage(kernel.cubin)
    assert set(usage) == {"staged", "spilly"}
    staged, spilly = usage["staged"], usage["spilly"]
    assert 0 < staged.registers <= 32 and 0 < spilly.registers <= 32
    assert staged.shared_bytes >= 4096 * 4 and spilly.shared_bytes == 0
    assert staged.local_bytes == 0 and spilly.local_bytes > 0  # 64 floats cannot live in 32 registers
    assert staged.source == "elf"
    assert resource_usage(kernel.cubin) is not None


def test_resource_usage_of_something_that_is_not_a_cubin():
    if find_binary_utility("cuobjdump") is None:
        assert resource_usage(b"nonsense") is None


def test_parse_cuobjdump_res_usage():
    text = """
Resource usage:
 Common:
  GLOBAL:0
 Function spilly:
  REG:32 STACK:880 SHARED:0 LOCAL:0 CONSTANT[0]:540 TEXTURE:0 SURFACE:0 SAMPLER:0
 Function staged:
  REG:12 STACK:0 SHARED:17408 LOCAL:0 CONSTANT[0]:540 TEXTURE:0 SURFACE:0 SAMPLER:0
"""
    usage = parse_res_usage(text)
    assert (usage["spilly"].registers, usage["spilly"].local_bytes) == (32, 880)
    assert (usage["staged"].registers, usage["staged"].shared_bytes) == (12, 17408)
    assert usage["staged"].source == "cuobjdump"


# ---- argument packing (no GPU: the parameter layout is given) -----------------------------------------


def _function_with_layout(offsets, sizes):
    function = Function(module=None, name="k", handle=0)
    function._layout = (tuple(offsets), tuple(sizes), max(o + s for o, s in zip(offsets, sizes)))
    return function


def test_pack_arguments_lays_out_values_like_the_device():
    function = _function_with_layout([0, 8, 12, 16, 24], [8, 4, 4, 8, 2])
    _, addresses = pack_arguments(function, [0xDEADBEEF00, 2.5, -3, np.float64(1.25), np.float16(0.5)])
    assert addresses.dtype == np.uint64 and len(addresses) == 5
    read = [ctypes.string_at(int(a), s) for a, s in zip(addresses, [8, 4, 4, 8, 2])]
    assert int.from_bytes(read[0], "little") == 0xDEADBEEF00
    assert np.frombuffer(read[1], np.float32)[0] == 2.5
    assert int.from_bytes(read[2], "little", signed=True) == -3
    assert np.frombuffer(read[3], np.float64)[0] == 1.25
    assert np.frombuffer(read[4], np.float16)[0] == 0.5
    assert int(addresses[1]) - int(addresses[0]) == 8


def test_pack_arguments_takes_unsigned_values_above_the_signed_range():
    function = _function_with_layout([0], [4])
    for _ in range(2):  # the second call finds the cached fast-path format, which must fall back again
        _, addresses = pack_arguments(function, [3_000_000_000])
        assert int.from_bytes(ctypes.string_at(int(addresses[0]), 4), "little") == 3_000_000_000
    _, addresses = pack_arguments(function, [np.uint32(4_000_000_000)])
    assert int.from_bytes(ctypes.string_at(int(addresses[0]), 4), "little") == 4_000_000_000


def test_pack_arguments_reports_wrong_count_and_sizes():
    function = _function_with_layout([0, 8], [8, 4])
    with pytest.raises(TypeError, match="takes 2 arguments, got 1"):
        pack_arguments(function, [1])
    with pytest.raises(TypeError, match="argument 1 .* is 8 bytes .* parameter is 4 bytes"):
        pack_arguments(function, [1, np.int64(3)])
    with pytest.raises(TypeError, match="has type str"):
        pack_arguments(function, [1, "x"])
    with pytest.raises(TypeError, match="does not fit"):
        pack_arguments(function, [1, 1 << 40])


# ---- on a GPU -----------------------------------------------------------------------------------------


@pytest.mark.cuda
@pytest.mark.skipif(not is_available(), reason="needs a CUDA GPU and driver")
def test_launch_writes_known_values(tmp_path):
    from tilewise.backends.cuda.runtime import (
        Stream,
        copy_dtoh,
        get_allocator,
        get_device_properties,
        pinned_empty,
    )
    from tilewise.backends.cuda.runtime.module import load_module

    arch = get_device_properties(0).arch
    kernel = KernelCache(tmp_path).compile(FILL, "fill", arch)
    function = load_module(kernel.cubin).get_function("fill")
    n = 1000
    allocator = get_allocator(0)
    out = allocator.malloc(n * 4)
    stream = Stream()
    function((n + 255) // 256, 256, out, np.float32(7.0), n, stream=stream)
    host = pinned_empty((n,), np.float32)
    copy_dtoh(host.ctypes.data, out, n * 4, stream)
    stream.synchronize()
    np.testing.assert_array_equal(host, 7.0 + np.arange(n, dtype=np.float32))
    allocator.free(out)

    attributes = function.attributes()
    assert attributes.num_regs > 0 and attributes.max_threads_per_block >= 256
    assert function.parameter_layout[1] == (8, 4, 4)
    assert resource_usage(kernel.cubin)["fill"].registers == attributes.num_regs


@pytest.mark.cuda
@pytest.mark.skipif(not is_available(), reason="needs a CUDA GPU and driver")
def test_resource_usage_agrees_with_the_driver(tmp_path):
    from tilewise.backends.cuda.runtime import get_device_properties
    from tilewise.backends.cuda.runtime.module import load_module

    arch = get_device_properties(0).arch
    kernel = compile_cuda(SHARED_AND_SPILL, ["staged", "spilly"], arch, ["--maxrregcount=32"])
    module = load_module(kernel.cubin)
    elf = elf_resource_usage(kernel.cubin)
    tool = resource_usage(kernel.cubin)
    for name in ("staged", "spilly"):
        attributes = module.get_function(name).attributes()
        print(name, attributes, elf[name], tool[name])
        assert elf[name].registers == tool[name].registers == attributes.num_regs
        assert elf[name].local_bytes == tool[name].local_bytes == attributes.local_size_bytes
        assert elf[name].shared_bytes == tool[name].shared_bytes
        assert attributes.shared_size_bytes <= elf[name].shared_bytes <= attributes.shared_size_bytes + 1024


def test_compiling_leaves_python_constants_alone():
    """NVRTC writes its (here empty) log into the buffer it is given: never a shared immutable object."""
    compile_cuda('extern "C" __global__ void tw_constants(float* o) { o[0] = 1.0f; }', "tw_constants")
    assert b" " == bytes([32]) and " " == chr(32) and "a b" == "a" + chr(32) + "b"

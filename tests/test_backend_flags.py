"""torch's global settings on tilewise: defaults, setters, checks and the links between them, compared with torch
(the same sequence of settings applied to both, every observable read back after each), and their effect where
tilewise has the choice (TF32 in cuBLASLt GEMMs, deterministic mode against atomic-add kernels, on CUDA)."""

import os
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch
from childenv import python_path

import tilewise as tw
from tilewise.backends import flags

PRISTINE = dict(flags._fp32)  # tilewise's precision table at import, before any test changed it


def _reset(lib) -> None:
    """Both libraries back to their defaults (the settings are process-wide)."""
    lib.use_deterministic_algorithms(False, warn_only=False)
    lib.set_float32_matmul_precision("highest")
    lib.backends.cudnn.allow_tf32 = True
    if lib is torch:
        for backend, op in [("generic", "all"), ("cuda", "all"), ("mkldnn", "all"), ("cuda", "matmul"),
                            ("mkldnn", "matmul"), ("mkldnn", "conv"), ("mkldnn", "rnn")]:
            torch._C._set_fp32_precision_setter(backend, op, "none")
        for op in ("conv", "rnn"):
            torch._C._set_fp32_precision_setter("cuda", op, "tf32")
    else:
        flags._fp32.update(PRISTINE)
        flags._changed()
    matmul = lib.backends.cuda.matmul
    matmul.allow_fp16_reduced_precision_reduction = True
    matmul.allow_bf16_reduced_precision_reduction = True
    for name in ("enabled",):
        setattr(lib.backends.cudnn, name, True)
    lib.backends.cudnn.benchmark = lib.backends.cudnn.deterministic = False
    for kind in ("flash", "mem_efficient", "math", "cudnn"):
        getattr(lib.backends.cuda, f"enable_{kind}_sdp")(True)


@pytest.fixture(autouse=True)
def _defaults_around_each_test():
    _reset(tw)
    _reset(torch)
    yield
    _reset(tw)
    _reset(torch)


def _read(fn):
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 — a getter's refusal is part of what is compared
        return type(e).__name__


def _observe(lib) -> dict:
    b = lib.backends
    return {
        "allow_tf32": _read(lambda: b.cuda.matmul.allow_tf32),
        "matmul_precision": _read(lib.get_float32_matmul_precision),
        "cuda.matmul.fp32": b.cuda.matmul.fp32_precision,
        "cudnn.fp32": b.cudnn.fp32_precision,
        "cudnn.conv.fp32": b.cudnn.conv.fp32_precision,
        "cudnn.rnn.fp32": b.cudnn.rnn.fp32_precision,
        "mkldnn.matmul.fp32": b.mkldnn.matmul.fp32_precision,
        "mkldnn.fp32": b.mkldnn.fp32_precision,
        "fp16_reduction": (b.cuda.matmul.allow_fp16_reduced_precision_reduction,
                           b.cuda.matmul.allow_fp16_reduced_precision_reduction_split_k),
        "bf16_reduction": (b.cuda.matmul.allow_bf16_reduced_precision_reduction,
                           b.cuda.matmul.allow_bf16_reduced_precision_reduction_split_k),
        "fp16_accumulation": b.cuda.matmul.allow_fp16_accumulation,
        "cudnn": (b.cudnn.enabled, b.cudnn.benchmark, b.cudnn.deterministic, _read(lambda: b.cudnn.allow_tf32)),
        "sdp": (b.cuda.flash_sdp_enabled(), b.cuda.mem_efficient_sdp_enabled(), b.cuda.math_sdp_enabled(),
                b.cuda.cudnn_sdp_enabled()),
        "deterministic": (lib.are_deterministic_algorithms_enabled(),
                          lib.is_deterministic_algorithms_warn_only_enabled(), lib.get_deterministic_debug_mode()),
        "mps": (b.mps.is_available(), b.mps.is_built()),
        "mkldnn.enabled": b.mkldnn.enabled,
    }


def test_defaults_equal_torchs():
    ours = _observe(tw)
    assert ours == _observe(torch)
    assert ours["allow_tf32"] is False and ours["matmul_precision"] == "highest"


SEQUENCES = {
    "precision high": ["lib.set_float32_matmul_precision('high')"],
    "precision medium then highest": ["lib.set_float32_matmul_precision('medium')",
                                      "lib.set_float32_matmul_precision('highest')"],
    "allow_tf32 on and off": ["lib.backends.cuda.matmul.allow_tf32 = True",
                              "lib.backends.cuda.matmul.allow_tf32 = False"],
    "medium then allow_tf32 off (mixed)": ["lib.set_float32_matmul_precision('medium')",
                                           "lib.backends.cuda.matmul.allow_tf32 = False",
                                           "lib.backends.cuda.matmul.allow_tf32 = True"],
    "new API tf32 (mixed with legacy)": ["lib.backends.cuda.matmul.fp32_precision = 'tf32'",
                                         "lib.backends.cuda.matmul.fp32_precision = 'ieee'",
                                         "lib.backends.cuda.matmul.fp32_precision = 'none'"],
    "op-level new API": ["lib.backends.cudnn.conv.fp32_precision = 'ieee'",
                         "lib.backends.cuda.matmul.fp32_precision = 'tf32'",
                         "lib.backends.cuda.matmul.fp32_precision = 'none'",
                         "lib.backends.cudnn.rnn.fp32_precision = 'ieee'"],
    "mkldnn bf16": ["lib.backends.mkldnn.matmul.fp32_precision = 'bf16'",
                    "lib.set_float32_matmul_precision('medium')", "lib.backends.mkldnn.matmul.fp32_precision = 'ieee'"],
    "bad precisions": ["lib.backends.cuda.matmul.fp32_precision = 'bf16'",
                       "lib.backends.cudnn.conv.fp32_precision = 'x'", "lib.set_float32_matmul_precision(1)",
                       "lib.backends.cuda.matmul.allow_tf32 = 1"],
    "cudnn flags": ["lib.backends.cudnn.allow_tf32 = False", "lib.backends.cudnn.benchmark = True",
                    "lib.backends.cudnn.deterministic = True", "lib.backends.cudnn.enabled = False",
                    "lib.backends.cudnn.enabled = 1", "lib.backends.cudnn.benchmark = 'yes'",
                    "lib.backends.cudnn.conv.fp32_precision = 'ieee'", "lib.backends.cudnn.allow_tf32 = True"],
    "cudnn flags context": ["ctx = lib.backends.cudnn.flags(enabled=False, deterministic=True); ctx.__enter__()",
                            "ctx.__exit__(None, None, None)"],
    "reductions": ["lib.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False",
                   "lib.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = (False, False)",
                   "lib.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = [True]",
                   "lib.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = 1",
                   "lib.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = ()",
                   "lib.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = (True, True, True)",
                   "lib.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = (True, 1)"],
    "sdp": ["lib.backends.cuda.enable_flash_sdp(False)", "lib.backends.cuda.enable_cudnn_sdp(False)",
            "lib.backends.cuda.enable_math_sdp(1)", "lib.backends.cuda.enable_mem_efficient_sdp(False)"],
    "sdpa_kernel": ["ctx = lib.nn.attention.sdpa_kernel(lib.nn.attention.SDPBackend.FLASH_ATTENTION); "
                    "ctx.__enter__()",
                    "inner = lib.nn.attention.sdpa_kernel([lib.nn.attention.SDPBackend.MATH, "
                    "lib.nn.attention.SDPBackend.CUDNN_ATTENTION, lib.nn.attention.SDPBackend.MATH]); "
                    "inner.__enter__()",
                    "inner.__exit__(None, None, None)", "ctx.__exit__(None, None, None)",
                    "lib.nn.attention.sdpa_kernel((lib.nn.attention.SDPBackend.MATH,)).__enter__()",
                    "lib.nn.attention.sdpa_kernel('math').__enter__()",
                    "ctx = lib.nn.attention.sdpa_kernel([lib.nn.attention.SDPBackend.EFFICIENT_ATTENTION], "
                    "set_priority=True); ctx.__enter__()", "ctx.__exit__(None, None, None)",
                    "assert [int(getattr(lib.nn.attention.SDPBackend, name)) for name in ('ERROR', 'MATH', "
                    "'FLASH_ATTENTION', 'EFFICIENT_ATTENTION', 'CUDNN_ATTENTION', 'OVERRIDEABLE')] "
                    "== [-1, 0, 1, 2, 3, 4]"],
    "deterministic": ["lib.use_deterministic_algorithms(True)",
                      "lib.use_deterministic_algorithms(True, warn_only=True)",
                      "lib.use_deterministic_algorithms(False, warn_only=True)", "lib.use_deterministic_algorithms(1)",
                      "lib.use_deterministic_algorithms(True, warn_only=1)",
                      "lib.set_deterministic_debug_mode('error')",
                      "lib.set_deterministic_debug_mode(1)", "lib.set_deterministic_debug_mode('x')",
                      "lib.set_deterministic_debug_mode(0)"],
}


def _apply(lib, statements: list[str]) -> list:
    """The state after each statement, or the type of error it raised and the state after it."""
    seen = []
    scope = {"lib": lib}
    for statement in statements:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                exec(statement, scope)
                outcome = None
            except Exception as e:  # noqa: BLE001 — the refusal is compared
                outcome = type(e).__name__
        seen.append((statement, outcome, [w.category.__name__ for w in caught], _observe(lib)))
    return seen


@pytest.mark.parametrize("name", SEQUENCES)
def test_settings_follow_torch(name):
    ours, theirs = _apply(tw, SEQUENCES[name]), _apply(torch, SEQUENCES[name])
    for a, b in zip(ours, theirs):
        assert a == b, a[0]


def test_invalid_matmul_precision_warns_and_changes_nothing():
    for lib in (tw, torch):
        with pytest.warns(UserWarning, match="is not one of 'highest', 'high', or 'medium'"):
            lib.set_float32_matmul_precision("fast")
        assert lib.get_float32_matmul_precision() == "highest"


def test_gemm_numerics_follow_the_flags():
    """What a cuBLASLt GEMM's cache key and compute type are made from (read at every call)."""
    assert flags.gemm_numerics() == (False, (True, True), (True, True), False)
    tw.set_float32_matmul_precision("high")
    assert flags.gemm_numerics()[0] is True
    tw.backends.cuda.matmul.allow_tf32 = False
    tw.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = (False, True)
    tw.use_deterministic_algorithms(True)
    assert flags.gemm_numerics() == (False, (True, True), (False, True), True)


def test_cublaslt_reduction_schemes():
    from tilewise.backends.cuda.matmul import _reduction_schemes

    default = (False, (True, True), (True, True), False)
    assert _reduction_schemes(tw.float16, default) == 7  # every scheme
    assert _reduction_schemes(tw.float16, (False, (False, True), (True, True), False)) == 2  # in float32 only
    assert _reduction_schemes(tw.bfloat16, (False, (True, True), (False, False), False)) == 0  # no split-K
    assert _reduction_schemes(tw.bfloat16, (False, (False, True), (True, True), False)) == 7  # fp16's switch
    assert _reduction_schemes(tw.float32, (False, (True, True), (True, True), True)) == 6  # never in place


def test_alert_not_deterministic():
    flags.alert_not_deterministic("op")  # off: nothing
    tw.use_deterministic_algorithms(True)
    with pytest.raises(RuntimeError, match=r"op does not have a deterministic implementation, but you set "
                                           r"'tilewise.use_deterministic_algorithms\(True\)'"):
        flags.alert_not_deterministic("op")
    tw.use_deterministic_algorithms(True, warn_only=True)
    with pytest.warns(UserWarning, match=r"warn_only=True\)'"):
        flags.alert_not_deterministic("op")


def test_threads_follow_torch_and_reach_blas():
    from tilewise.backends.cpu.threads import blas_thread_counts

    before = tw.get_num_threads()
    try:
        tw.set_num_threads(1)
        assert tw.get_num_threads() == 1
        assert all(n == 1 for n in blas_thread_counts())  # the BLAS library itself now runs one thread
        for bad in (0, -1, 2.0, True):
            with pytest.raises(RuntimeError) as ours:
                tw.set_num_threads(bad)
            with pytest.raises(RuntimeError) as theirs:
                torch.set_num_threads(bad)
            assert str(ours.value) == str(theirs.value)
    finally:
        tw.set_num_threads(before)


def test_interop_threads_can_be_set_once():
    script = ("import tilewise as tw\n"
              "print(tw.get_num_interop_threads() == tw.get_num_threads())\n"
              "tw.set_num_interop_threads(3); print(tw.get_num_interop_threads())\n"
              "try:\n    tw.set_num_interop_threads(3)\nexcept RuntimeError as e:\n    print('refused')\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": python_path()}).stdout.split()
    assert out == ["True", "3", "refused"]


def test_device_modules_without_a_gpu_match_torch():
    if tw.cuda.is_available():
        pytest.skip("a GPU is present")
    assert tw.accelerator.current_accelerator() is torch.accelerator.current_accelerator() is None
    assert tw.accelerator.current_accelerator(check_available=True) is None
    assert tw.accelerator.is_available() is torch.accelerator.is_available() is False
    assert tw.accelerator.device_count() == torch.accelerator.device_count() == 0
    for name in ("current_device_index", "synchronize", "empty_cache", "memory_allocated"):
        with pytest.raises(RuntimeError, match="Cannot access accelerator device when none is available."):
            getattr(tw.accelerator, name)()
        with pytest.raises(RuntimeError, match="Cannot access accelerator device when none is available."):
            getattr(torch.accelerator, name)()
    assert tw.cuda.is_bf16_supported() is torch.cuda.is_bf16_supported() is False
    assert (tw.cpu.is_available(), tw.cpu.device_count(), tw.cpu.current_device(), tw.cpu.synchronize()) == \
        (torch.cpu.is_available(), torch.cpu.device_count(), torch.cpu.current_device(), torch.cpu.synchronize())
    assert tw.backends.cudnn.version() is None or isinstance(tw.backends.cudnn.version(), int)
    assert tw.backends.cpu.get_cpu_capability() in ("AVX512", "AVX2", "SVE256", "NO AVX", "DEFAULT")


def test_flag_modules_import_without_gpu_packages():
    """``tilewise.backends.cuda.matmul.allow_tf32`` and the other spellings work where cuda-bindings, nvmath and
    cuDNN cannot be imported."""
    script = ("import sys\n"
              "for name in ('cuda', 'nvmath', 'cudnn'):\n    sys.modules[name] = None\n"
              "import tilewise as tw\n"
              "import tilewise.backends.cuda.matmul\n"
              "tw.backends.cuda.matmul.allow_tf32 = True\n"
              "print(tw.get_float32_matmul_precision(), tw.backends.cudnn.is_available(), tw.backends.cudnn.version(),"
              " tw.backends.cuda.is_built(), tw.cuda.is_available(), tw.accelerator.is_available())\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": python_path()}).stdout.split()
    assert out == ["high", "False", "None", "False", "False", "False"]


# ---------------------------------------------------------------------------------------------- on a GPU

@pytest.mark.cuda
def test_tf32_flag_decides_float32_gemm_precision():
    """Off (torch's default), a float32 GEMM matches float64 to float32 accuracy; on, it runs with TF32 inputs
    (10-bit mantissas), which on Ampere or newer moves the result measurably."""
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((512, 1024)), rng.standard_normal((1024, 256))
    exact = a @ b
    ta, tb = tw.tensor(a.astype(np.float32)).cuda(), tw.tensor(b.astype(np.float32)).cuda()
    full = (ta @ tb).cpu().numpy()
    full_error = np.abs(full - exact).max() / np.abs(exact).max()
    assert full_error < 1e-5
    tw.backends.cuda.matmul.allow_tf32 = True
    tf32 = (ta @ tb).cpu().numpy()
    tf32_error = np.abs(tf32 - exact).max() / np.abs(exact).max()
    assert tf32_error < 1e-2
    if tw.cuda.get_device_capability()[0] >= 8:
        assert tf32_error > 10 * full_error
    tw.set_float32_matmul_precision("highest")
    np.testing.assert_array_equal((ta @ tb).cpu().numpy(), full)


@pytest.mark.cuda
def test_deterministic_mode_refuses_floating_atomic_adds_on_cuda():
    x = tw.zeros(4, device="cuda")
    index = tw.tensor([0, 1, 1, 3], device="cuda")
    src = tw.ones(4, device="cuda")
    tw.use_deterministic_algorithms(True)
    with pytest.raises(RuntimeError, match="scatter_add on CUDA .* does not have a deterministic implementation"):
        x.scatter_add(0, index, src)
    with pytest.raises(RuntimeError, match="does not have a deterministic implementation"):
        x.index_put((index,), src, accumulate=True)
    counts = tw.zeros(4, dtype=tw.int64, device="cuda").scatter_add(0, index, tw.ones(4, dtype=tw.int64, device="cuda"))
    assert counts.tolist() == [1, 2, 0, 1]  # integer atomics are exact in any order
    tw.use_deterministic_algorithms(True, warn_only=True)
    with pytest.warns(UserWarning, match="does not have a deterministic implementation"):
        out = x.scatter_add(0, index, src)
    assert out.tolist() == [1.0, 2.0, 0.0, 1.0]


@pytest.mark.cuda
def test_deterministic_gemms_repeat_bit_for_bit():
    tw.use_deterministic_algorithms(True)
    a = tw.randn(256, 4096, device="cuda")
    b = tw.randn(4096, 128, device="cuda")
    first = (a @ b).cpu().numpy()
    for _ in range(3):
        np.testing.assert_array_equal((a @ b).cpu().numpy(), first)


@pytest.mark.cuda
def test_cudnn_sdp_switch_routes_attention_to_the_decomposition():
    from tilewise.backends.cuda.attention import unsupported

    shape = (2, 4, 64, 64)
    reason = unsupported(tw.float16, shape, shape, shape, False, tw.device("cuda:0"))
    tw.backends.cuda.enable_cudnn_sdp(False)
    assert "enable_cudnn_sdp(False)" in unsupported(tw.float16, shape, shape, shape, False, tw.device("cuda:0"))
    tw.backends.cuda.enable_cudnn_sdp(True)
    assert unsupported(tw.float16, shape, shape, shape, False, tw.device("cuda:0")) == reason
    q = tw.randn(*shape, device="cuda", dtype=tw.float16)
    fused = tw.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
    tw.backends.cuda.enable_cudnn_sdp(False)
    decomposed = tw.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
    np.testing.assert_allclose(fused.float().cpu().numpy(), decomposed.float().cpu().numpy(), atol=2e-3)


@pytest.mark.cuda
def test_cuda_queries():
    free, total = tw.cuda.mem_get_info()
    assert 0 < free <= total
    assert tw.cuda.is_bf16_supported() is True
    assert tw.accelerator.current_accelerator() == tw.device("cuda")
    assert tw.accelerator.device_count() == tw.cuda.device_count() >= 1
    assert tw.accelerator.current_device_index() == 0
    tw.accelerator.synchronize()
    with tw.accelerator.device_index(0):
        assert tw.accelerator.current_device_index() == 0
    assert tw.accelerator.get_memory_info()[1] == total
    assert isinstance(tw.cuda.get_device_name(), str) and len(tw.cuda.get_device_capability()) == 2


def test_a_compiled_function_recompiles_when_a_gemm_flag_changes():
    """Like torch.compile's global-state guard: a program planned its library calls under the flags it was traced
    with, so changing TF32 or deterministic mode compiles again."""
    f = tw.compile(lambda x: (x @ x).sum())
    x = tw.ones(3, 3)
    f(x)
    f(x)
    assert len(f.variants) == 1
    tw.backends.cuda.matmul.allow_tf32 = True
    f(x)
    assert len(f.variants) == 2
    tw.use_deterministic_algorithms(True)
    f(x)
    f(x)
    assert len(f.variants) == 3
    tw.use_deterministic_algorithms(False)
    tw.backends.cuda.matmul.allow_tf32 = False
    f(x)
    assert len(f.variants) == 3  # the first variant applies again


@pytest.mark.parametrize("chosen", [("MATH",), ("FLASH_ATTENTION",), ("EFFICIENT_ATTENTION",), ("CUDNN_ATTENTION",),
                                    ("EFFICIENT_ATTENTION", "CUDNN_ATTENTION"), ("MATH", "CUDNN_ATTENTION")])
def test_sdpa_kernel_on_the_cpu_runs_or_refuses_as_torch(chosen):
    def outcome(lib):
        q = lib.ones(1, 2, 4, 8)
        backends = [getattr(lib.nn.attention.SDPBackend, name) for name in chosen]
        try:
            with lib.nn.attention.sdpa_kernel(backends):
                return lib.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True).tolist()
        except RuntimeError as error:
            return str(error)

    assert outcome(tw) == outcome(torch)

"""MXFP8 and NVFP4 quantization: the NumPy reference against the specs, the API, QuantizedLinear, and the CUDA
kernels (compiled here for sm_90 and sm_100; bit-exact against the reference where a GPU is present)."""

import ml_dtypes
import numpy as np
import pytest

import tilewise as tw
import tilewise.quant  # noqa: F401 — tw.quant
from tilewise.quant import reference as R

E4M3_CODES = np.arange(256, dtype=np.uint8)
E4M3_VALUES = E4M3_CODES.view(ml_dtypes.float8_e4m3fn).astype(np.float64)


def _nearest_e4m3(value: float) -> int:
    """The e4m3fn code nearest ``value`` by brute force over all codes (ties: even code), saturating at 448."""
    value = min(max(value, -448.0), 448.0)
    finite = np.isfinite(E4M3_VALUES)
    distance = np.where(finite, np.abs(E4M3_VALUES - value), np.inf)
    best = np.flatnonzero(distance == distance.min())
    same_sign = [c for c in best if (c >> 7) == (1 if np.signbit(value) else 0)] or list(best)
    return int(min(same_sign, key=lambda c: (c & 1, c)))


def _mx_by_the_spec(block: np.ndarray) -> tuple[int, list]:
    """OCP MX v1.0, 6.3, for one 32-element block, written out element by element."""
    amax = max(abs(float(v)) for v in block)
    shared = int(np.floor(np.log2(amax))) - 8 if amax > 0 else -127
    shared = min(max(shared, -127), 127)
    return shared + 127, [_nearest_e4m3(float(v) / 2.0**shared) for v in block]


def test_mxfp8_matches_the_spec_written_element_by_element():
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((3, 96)) * np.exp(rng.uniform(-20, 20, (3, 96)))).astype(np.float32)
    x[0, :32] *= 1e-30  # tiny blocks, near e8m0's bottom
    x[1, 32:64] = rng.choice([0.5, 1.0, 448.0, 500.0, -511.0, 1e-3], 32)  # saturation within the block
    elements, scales = R.mxfp8_quantize(x)
    for row in range(3):
        for b in range(3):
            scale, codes = _mx_by_the_spec(x[row, 32 * b:32 * (b + 1)])
            assert scales[row, b] == scale
            assert elements[row, 32 * b:32 * (b + 1)].tolist() == codes


def test_mxfp8_special_blocks():
    x = np.ones((5, 32), np.float32)
    x[0] = 0
    x[1, 7] = np.nan
    x[2, 3] = -np.inf
    x[3] = 1.0  # amax 1 -> shared exponent -8, elements 256
    x[4, :] = 2.0**-130  # below e8m0's range: the scale clamps at 2^-127, elements 2^-3
    elements, scales = R.mxfp8_quantize(x)
    assert scales[:, 0].tolist() == [0, 255, 255, 119, 0]
    assert (elements[0] == 0).all() and (elements[1] == 0x7F).all() and (elements[2] == 0x7F).all()
    assert (R.e4m3_value(elements[3]) == 256).all()
    back = R.mxfp8_dequantize(elements, scales)
    assert (back[0] == 0).all() and np.isnan(back[1]).all() and np.isnan(back[2]).all() and (back[3] == 1).all()
    np.testing.assert_array_equal(back[4], np.float32(2.0**-130))


def test_mxfp8_round_trip_error_is_bounded_by_e4m3():
    x = np.random.default_rng(2).standard_normal((64, 256)).astype(np.float32)
    back = R.mxfp8_dequantize(*R.mxfp8_quantize(x))
    amax = np.abs(x.reshape(64, 8, 32)).max(-1, keepdims=True)
    relative_to_block = np.abs(back - x).reshape(64, 8, 32) / amax
    # the spec's scale puts amax / X in [256, 512): values past 448 X saturate, up to 1/8 of the block's amax
    assert relative_to_block.max() <= 1 / 8
    below = np.abs(x).reshape(64, 8, 32) < 224 / 256 * amax  # no saturation, binades under the top one
    assert relative_to_block[below].max() <= 2.0**-4  # half an e4m3 step of the top binade, 2^4 X of >= 2^8 X


def test_nvfp4_by_the_recipe():
    x = np.array([[0.0, 0.5, -1.0, 1.5, 2.0, -3.0, 4.0, 6.0, 0.25, 0.75, 1.25, -1.75, 2.5, 3.5, 5.0, -6.0]] * 2,
                 np.float32)
    x[1] *= 2688.0 / 6  # the tensor amax: 6 * 2688/6 = 2688, so s = 1 and this block's scale is 448
    packed, scales, s = R.nvfp4_quantize(x)
    assert s == np.float32(1.0)
    assert R.e4m3_value(scales).tolist() == [[1.0], [448.0]]
    codes = R.unpack_e2m1(packed)
    # ties to even: 0.25 -> 0, 0.75 -> 1, 1.25 -> 1, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4
    assert tw.dtypes.decode_e2m1(codes[0]).tolist() == [0, .5, -1, 1.5, 2, -3, 4, 6, 0, 1, 1, -2, 2, 4, 4, -6]
    assert packed[0, 0] == (codes[0, 0] | codes[0, 1] << 4)  # the first value in the low nibble, as torch
    back = R.nvfp4_dequantize(packed, scales, s)
    np.testing.assert_array_equal(back[1], tw.dtypes.decode_e2m1(codes[1]) * np.float32(448.0))


def test_nvfp4_special_blocks_and_tensor_scale():
    x = np.random.default_rng(3).standard_normal((4, 32)).astype(np.float32)
    x[0, :16] = 0
    x[1, 16] = np.nan
    x[2, 3] = np.inf
    packed, scales, s = R.nvfp4_quantize(x)
    finite = x[np.isfinite(x)]
    assert s == np.float32(np.abs(finite).max()) / np.float32(2688)
    assert scales[0, 0] == 0 and (R.unpack_e2m1(packed)[0, :16] == 0).all()
    assert scales[1, 1] == 0x7F and scales[2, 0] == 0x7F
    back = R.nvfp4_dequantize(packed, scales, s)
    assert (back[0, :16] == 0).all() and np.isnan(back[1, 16:]).all() and np.isnan(back[2, :16]).all()
    assert np.isfinite(back[3]).all()
    assert R.nvfp4_quantize(np.zeros((1, 16), np.float32))[2] == 1.0


@pytest.mark.parametrize("fmt,block", [("mxfp8", 32), ("nvfp4", 16)])
def test_quantize_api_shapes_bytes_and_errors(fmt, block):
    x = tw.randn(2, 3, 4 * block)
    q = tw.quantize(x, fmt)
    assert q.shape == (2, 3, 4 * block) and q.dtype is tw.float32 and q.block_size == block
    assert list(q.scales.shape) == [2, 3, 4]
    if fmt == "nvfp4":
        assert q.data.dtype is tw.float4_e2m1fn_x2 and list(q.data.shape) == [2, 3, 2 * block]
        assert q.nbytes == 2 * 3 * 2 * block + 2 * 3 * 4 + 4
    else:
        assert q.data.dtype is tw.float8_e4m3fn and q.scales.dtype is tw.float8_e8m0fnu and q.tensor_scale is None
    y = tw.dequantize(q)
    assert y.dtype is tw.float32 and y.shape == x.shape
    assert tw.dequantize(q, tw.bfloat16).dtype is tw.bfloat16
    same = tw.quantize(x.bfloat16(), fmt)  # bf16 input: the same bits as its float32 values
    again = tw.quantize(x.bfloat16().float(), fmt)
    assert same.data.view(tw.uint8).tolist() == again.data.view(tw.uint8).tolist()
    with pytest.raises(ValueError, match=f"multiple of {block}.*\\[3, {block + 4}\\]"):
        tw.quantize(tw.randn(3, block + 4), fmt)
    with pytest.raises(TypeError, match="float32, bfloat16 or float16.*int64"):
        tw.quantize(tw.ones(2, block, dtype=tw.int64), fmt)
    with pytest.raises(ValueError, match="valid formats: mxfp8, nvfp4"):
        tw.quantize(x, "fp4")


def test_nvfp4_weights_take_under_a_third_of_bf16():
    w = tw.randn(768, 3072)
    assert tw.quantize(w, "nvfp4").nbytes <= 0.3 * w.numel() * 2
    assert tw.quantize(w, "mxfp8").nbytes <= 0.52 * w.numel() * 2


@pytest.mark.parametrize("fmt", ["mxfp8", "nvfp4"])
def test_quantized_linear_is_linear_of_the_dequantized_weight(fmt):
    tw.manual_seed(0)
    layer = tw.nn.Linear(64, 24)
    q = tw.quant.QuantizedLinear.from_float(layer, fmt)
    x = tw.randn(5, 64)
    expected = tw.nn.functional.linear(x, tw.dequantize(tw.quantize(layer.weight.detach(), fmt)), layer.bias)
    np.testing.assert_array_equal(q(x).detach().numpy(), expected.detach().numpy())
    exact = layer(x).detach().numpy()
    relative_rms = np.sqrt(((q(x).detach().numpy() - exact) ** 2).mean() / (exact**2).mean())
    assert relative_rms < {"mxfp8": 0.05, "nvfp4": 0.2}[fmt]
    with pytest.raises(RuntimeError, match="in_features=64"):
        q(tw.randn(5, 60))
    with pytest.raises(TypeError, match="int64"):
        q(tw.ones(5, 64, dtype=tw.int64))
    with pytest.raises(ValueError, match="in_features must be a multiple"):
        tw.quant.QuantizedLinear.from_float(tw.nn.Linear(40, 8), fmt)


def test_quantize_replaces_linears_in_place_keeping_order():
    model = tw.nn.Sequential(tw.nn.Linear(32, 32), tw.nn.ReLU(), tw.nn.Linear(32, 32), tw.nn.Linear(32, 16))
    tw.quant.quantize_(model, "mxfp8", filter_fn=lambda module, name: name != "3")
    assert [type(m).__name__ for m in model] == ["QuantizedLinear", "ReLU", "QuantizedLinear", "Linear"]
    assert "0.weight_data" in model.state_dict()


def test_native_gemm_plan_names_exist_and_hopper_is_refused():
    plan = tw.quant.native_gemm_plan("nvfp4", (10, 0))
    assert plan["scale_mode"] == "VEC16_UE4M3" and plan["data_type"] == "CUDA_R_4F_E2M1"
    with pytest.raises(RuntimeError, match="compute capability 10.0.*sm_90"):
        tw.quant.native_gemm_plan("mxfp8", (9, 0))
    runtime = pytest.importorskip("cuda.bindings.runtime")
    for fmt in ("mxfp8", "nvfp4"):
        plan = tw.quant.native_gemm_plan(fmt, (10, 0))
        assert hasattr(runtime.cudaDataType, plan["data_type"]) and hasattr(runtime.cudaDataType, plan["scale_type"])
    lt = pytest.importorskip("nvmath.bindings.cublasLt")
    for fmt in ("mxfp8", "nvfp4"):
        plan = tw.quant.native_gemm_plan(fmt, (10, 0))
        assert hasattr(lt.MatmulMatrixScale, plan["scale_mode"])
        assert all(hasattr(lt.MatmulDescAttribute, a) for a in plan["attributes"])


@pytest.mark.parametrize("arch", ["sm_90", "sm_100"])
def test_block_scaled_kernels_compile(arch):
    from tilewise.backends.cuda.kernels import blockscale
    from tilewise.codegen.toolchain import compile_cached
    from tilewise.codegen.toolchain.nvrtc import nvrtc_available

    if not nvrtc_available():
        pytest.skip("NVRTC is not installed")
    for name in blockscale.KERNEL_NAMES:
        for dtype in (tw.bfloat16, tw.float32, tw.float16):
            compiled = compile_cached(blockscale.source(name, dtype), name, arch)
            assert compiled.cubin and name in compiled.ptx
    quantize_ptx = compile_cached(blockscale.source("tw_mxfp8_quantize", tw.bfloat16), "tw_mxfp8_quantize", arch).ptx
    assert "ld.global.nc.v4" in quantize_ptx or "ld.global.v4" in quantize_ptx  # one 16-byte load per lane
    nvfp4_ptx = compile_cached(blockscale.source("tw_nvfp4_quantize", tw.float32), "tw_nvfp4_quantize", arch).ptx
    assert "div.rn.f32" in nvfp4_ptx and "div.approx" not in nvfp4_ptx  # IEEE divisions, as the reference's


def _special_input(rows: int, cols: int) -> tw.Tensor:
    x = np.random.default_rng(4).standard_normal((rows, cols)).astype(np.float32) * 3
    x[0, :32] = 0
    x[1, 5] = np.nan
    x[2, 40] = -np.inf
    x[3, :16] *= 1e-38
    x[4, :] *= 1e4
    return tw.tensor(x)


@pytest.mark.cuda
@pytest.mark.parametrize("fmt", ["mxfp8", "nvfp4"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_cuda_kernels_are_bit_exact_against_the_reference(fmt, dtype):
    x = _special_input(64, 1024).to(getattr(tw, dtype))
    if dtype == "float16":
        x = x.float().clamp(-6e4, 6e4).half()
    cpu, gpu = tw.quantize(x, fmt), tw.quantize(x.cuda(), fmt)
    for part in ("data", "scales", "tensor_scale"):
        a, b = getattr(cpu, part), getattr(gpu, part)
        if a is None:
            assert b is None
            continue
        np.testing.assert_array_equal(a.view(tw.uint8).numpy() if a.element_size() == 1 else a.numpy(),
                                      (b.view(tw.uint8) if b.element_size() == 1 else b).cpu().numpy(), err_msg=part)
    for out in ("float32", "bfloat16"):
        expected = tw.dequantize(cpu, getattr(tw, out)).float().numpy()
        got = tw.dequantize(gpu, getattr(tw, out)).float().cpu().numpy()
        np.testing.assert_array_equal(got, expected)


@pytest.mark.cuda
@pytest.mark.parametrize("fmt", ["mxfp8", "nvfp4"])
def test_cuda_quantized_linear_matches_cpu(fmt):
    tw.manual_seed(0)
    layer = tw.nn.Linear(256, 128)
    q = tw.quant.QuantizedLinear.from_float(layer, fmt)
    x = tw.randn(8, 256)
    expected = q(x).detach().numpy()
    got = q.cuda()(x.cuda().bfloat16()).float().cpu().detach().numpy()
    np.testing.assert_allclose(got, expected, rtol=2e-2, atol=2e-2)


def _benchmark():
    import importlib.util
    from pathlib import Path

    torch = pytest.importorskip("torch")  # noqa: F841 — the benchmark's peer
    path = Path(__file__).resolve().parent.parent / "benchmarks" / "lowprec_quant.py"
    spec = importlib.util.spec_from_file_location("lowprec_quant", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_benchmark_error_section_reports_nvfp4_under_a_third_of_bf16():
    shapes = {"c_fc rows": (64, 768), "c_proj rows": (32, 3072)}  # GPT-2's in_features, fewer rows
    lines = _benchmark().error_section(weights=shapes)
    nvfp4 = [line for line in lines if "| nvfp4 |" in line]
    assert len(nvfp4) == 2
    assert all(float(line.split("|")[-2].strip().rstrip("x")) <= 0.3 for line in nvfp4)


@pytest.mark.slow
def test_benchmark_perplexity_section_runs():
    lines = _benchmark().perplexity_section(steps=5)
    assert sum(line.startswith(("| mxfp8", "| nvfp4", "| float32")) for line in lines) == 3

"""_scaled_mm against torch._scaled_mm: values, dtypes and errors on the CPU; the cuBLASLt FP8 GEMM on CUDA."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tilewise as tw

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


def _tw(x: torch.Tensor, device: str = "cpu") -> tw.Tensor:
    """The same values and layout as ``x`` (float8 and bfloat16 travel as float32, which holds them exactly); a
    transposed matrix stays a transposed view."""
    dtype = getattr(tw, str(x.dtype).split(".")[1])
    dense = torch.empty(x.shape).stride()
    if x.ndim == 2 and x.stride() != dense and x.t().stride() == torch.empty(x.t().shape).stride():
        return _tw(x.t(), device).t()
    return tw.tensor(x.contiguous().float().numpy()).to(dtype).to(device)


def _operands(m=32, k=64, n=48, a_dtype=E4M3, b_dtype=E4M3, seed=0):
    g = torch.Generator().manual_seed(seed)
    a = (torch.randn(m, k, generator=g) * 3).to(a_dtype)
    b = (torch.randn(n, k, generator=g) * 2).to(b_dtype).t()  # column-major, as cuBLASLt wants it
    return a, b


def _call(lib, a, b, sa, sb, **kw):
    if lib is torch:
        return torch._scaled_mm(a, b, sa, sb, **kw)
    conv = {k: (_tw(v) if isinstance(v, torch.Tensor) else getattr(tw, str(v).split(".")[1]) if
                isinstance(v, torch.dtype) else v) for k, v in kw.items()}
    return tw._scaled_mm(_tw(a), _tw(b), _tw(sa), _tw(sb), **conv)


def _same(ours: tw.Tensor, theirs: torch.Tensor) -> None:
    assert str(ours.dtype).split(".")[1] == str(theirs.dtype).split(".")[1]
    assert tuple(ours.shape) == tuple(theirs.shape)
    np.testing.assert_array_equal(ours.float().numpy(), theirs.float().numpy())


ROWWISE = (lambda: torch.rand(32, 1) + 0.5, lambda: torch.rand(1, 48) + 0.5)
TENSORWISE = (lambda: torch.tensor(0.37), lambda: torch.tensor(1.9))


@pytest.mark.parametrize("scales", [TENSORWISE, ROWWISE], ids=["tensorwise", "rowwise"])
@pytest.mark.parametrize("out_dtype", [None, torch.float32, torch.bfloat16, torch.float16, E4M3, E5M2])
@pytest.mark.parametrize("b_dtype", [E4M3, E5M2])
def test_matches_torch_cpu(scales, out_dtype, b_dtype):
    a, b = _operands(b_dtype=b_dtype)
    sa, sb = scales[0](), scales[1]()
    kw = {} if out_dtype is None else {"out_dtype": out_dtype}
    if out_dtype in (E4M3, E5M2):
        kw["scale_result"] = torch.tensor(0.3)
    _same(_call(tw, a, b, sa, sb, **kw), _call(torch, a, b, sa, sb, **kw))


@pytest.mark.parametrize("bias_dtype", [torch.bfloat16, torch.float32])
def test_bias_matches_torch_cpu(bias_dtype):
    a, b = _operands()
    kw = {"bias": torch.randn(48).to(bias_dtype), "out_dtype": torch.bfloat16}
    _same(_call(tw, a, b, torch.tensor(0.5), torch.tensor(2.0), **kw),
          _call(torch, a, b, torch.tensor(0.5), torch.tensor(2.0), **kw))


def test_row_major_b_and_odd_sizes_run_on_the_cpu_as_in_torch():
    a, b = _operands(m=30, k=40, n=20)
    b = b.contiguous()
    one = torch.tensor(1.0)
    _same(_call(tw, a, b, one, one, out_dtype=torch.float32), _call(torch, a, b, one, one, out_dtype=torch.float32))


def _error(lib, fn):
    with pytest.raises(Exception) as info:
        fn(lib)
    return type(info.value), str(info.value)


ERROR_CASES = {
    "a not float8": lambda lib, a, b, one: _call(lib, a.to(torch.bfloat16), b, one, one),
    "scale float64": lambda lib, a, b, one: _call(lib, a, b, one.double(), one),
    "two-element scale": lambda lib, a, b, one: _call(lib, a, b, torch.ones(2), one),
    "rowwise 1-D": lambda lib, a, b, one: _call(lib, a, b, torch.ones(32), torch.ones(48)),
    "rowwise swapped": lambda lib, a, b, one: _call(lib, a, b, torch.ones(1, 32), torch.ones(48, 1)),
    "rowwise not contiguous": lambda lib, a, b, one: _call(lib, a, b, torch.ones(1, 32).t(), torch.ones(48, 1).t()),
    "3-D a": lambda lib, a, b, one: _call(lib, a[None], b, one, one),
    "shapes": lambda lib, a, b, one: _call(lib, a, b[:32], one, one),
    "scale_result": lambda lib, a, b, one: _call(lib, a, b, one, one, scale_result=torch.ones(2), out_dtype=E4M3),
    "bias size": lambda lib, a, b, one: _call(lib, a, b, one, one, bias=torch.ones(47), out_dtype=torch.bfloat16),
}


@pytest.mark.parametrize("case", list(ERROR_CASES))
def test_errors_match_torch_cpu(case):
    a, b = _operands()
    one = torch.tensor(1.0)
    fn = ERROR_CASES[case]
    ours, theirs = _error(tw, lambda lib: fn(lib, a, b, one)), _error(torch, lambda lib: fn(lib, a, b, one))
    assert ours == theirs


def test_not_differentiable():
    a, b = _operands()
    scale = tw.tensor(1.0, requires_grad=True)
    out = tw._scaled_mm(_tw(a), _tw(b), scale, tw.tensor(1.0), out_dtype=tw.float32)
    assert not out.requires_grad


def test_a_plans_pointer_attributes_are_set_only_when_they_change(monkeypatch):
    """Every attribute set is a call into cuBLASLt; a small FP8 GEMM called again with the same scales sets none."""
    from types import SimpleNamespace

    from tilewise.backends.cuda import scaled_mm as module

    calls = []
    fake = SimpleNamespace(matmul_desc_set_attribute=lambda desc, attr, ptr, size: calls.append(attr),
                           get_matmul_desc_attribute_dtype=lambda attr: np.int64,
                           MatmulDescAttribute=SimpleNamespace(A_SCALE_POINTER=1, B_SCALE_POINTER=2, BIAS_POINTER=3))
    monkeypatch.setattr(module, "_lt", lambda: fake)
    held = {"A_SCALE_POINTER": 100, "B_SCALE_POINTER": 200}
    module._set_pointers(7, [("A_SCALE_POINTER", 100), ("B_SCALE_POINTER", 200)], held)
    assert calls == []
    module._set_pointers(7, [("A_SCALE_POINTER", 100), ("B_SCALE_POINTER", 300), ("BIAS_POINTER", 400)], held)
    assert calls == [2, 3] and held == {"A_SCALE_POINTER": 100, "B_SCALE_POINTER": 300, "BIAS_POINTER": 400}
    module._set_pointers(7, [("A_SCALE_POINTER", 100)])  # no record of what is held: always set
    assert calls == [2, 3, 1]


def test_compiled_matches_eager():
    a, b = _operands()
    ta, tb = _tw(a), _tw(b)

    def f(x, w, s):
        return tw._scaled_mm(x, w, s, s, out_dtype=tw.float32) * 2

    s = tw.tensor(0.5)
    np.testing.assert_array_equal(tw.compile(f)(ta, tb, s).numpy(), f(ta, tb, s).numpy())


# ---------------------------------------------------------------------------------------------- CUDA

def _cuda_operands(m, k, n, a_dtype=E4M3, b_dtype=E4M3):
    a, b = _operands(m, k, n, a_dtype, b_dtype)
    return a, b, _tw(a, "cuda"), _tw(b, "cuda")


@pytest.mark.cuda
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16, torch.float16, E4M3])
@pytest.mark.parametrize("b_dtype", [E4M3, E5M2])
def test_cuda_tensorwise_against_the_cpu_reference(out_dtype, b_dtype):
    a, b, ca, cb = _cuda_operands(64, 128, 96, b_dtype=b_dtype)
    sa, sb = torch.tensor(0.37), torch.tensor(1.9)
    kw = {"out_dtype": getattr(tw, str(out_dtype).split(".")[1])}
    ref = _call(torch, a, b, sa, sb, out_dtype=torch.float32).numpy()
    if out_dtype is E4M3:
        kw["scale_result"] = tw.tensor(0.25, device="cuda")  # CUDA multiplies by it (cuBLASLt's D scale)
        ref = ref * 0.25
    out = tw._scaled_mm(ca, cb, _tw(sa, "cuda"), _tw(sb, "cuda"), **kw).float().cpu().numpy()
    # float32: Hopper's FP8 tensor cores keep partial sums with about 14 significant bits before cuBLASLt
    # promotes them to float32, so a float32 result is not the float32 sum of the exact products (the CPU's)
    tol = {torch.float32: 3e-4, torch.bfloat16: 8e-3, torch.float16: 1e-3}.get(out_dtype, 7e-2)
    np.testing.assert_allclose(out, ref, rtol=tol, atol=tol * np.abs(ref).max())


@pytest.mark.cuda
def test_cuda_rowwise_and_bias():
    a, b, ca, cb = _cuda_operands(64, 128, 96)
    sa, sb = torch.rand(64, 1) + 0.5, torch.rand(1, 96) + 0.5
    bias = torch.randn(96).to(torch.bfloat16)
    # torch's CPU _scaled_mm takes tensor-wise scales only: the reference is its definition, in float32
    ref = ((a.float() @ b.float()) * sa * sb + bias.float()).numpy()
    out = tw._scaled_mm(ca, cb, _tw(sa, "cuda"), _tw(sb, "cuda"), bias=_tw(bias, "cuda"),
                        out_dtype=tw.bfloat16).float().cpu().numpy()
    np.testing.assert_allclose(out, ref, rtol=8e-3, atol=8e-3 * np.abs(ref).max())


@pytest.mark.cuda
def test_cuda_amax_of_the_result():
    from tilewise.backends.cuda.scaled_mm import scaled_gemm

    a, b, ca, cb = _cuda_operands(64, 128, 96)
    one = tw.tensor(1.0, device="cuda")
    amax = tw.zeros(1, device="cuda")
    scaled_gemm(ca, cb, one, one, out_dtype=tw.float8_e4m3fn, amax=amax)
    ref = np.abs(_call(torch, a, b, torch.tensor(1.0), torch.tensor(1.0), out_dtype=torch.float32).numpy()).max()
    assert abs(amax.item() - ref) <= 1e-4 * ref


@pytest.mark.cuda
@pytest.mark.parametrize("case, message", [
    ("k", "Expected trailing dimension of mat1 to be divisible by 16"),
    ("n", "must be divisible by 16"),
    ("e5m2", "Multiplication of two Float8_e5m2 matrices is not supported"),
    ("row-major b", "Only multiplication of row-major and column-major matrices"),
    ("bias fp32 out", "Bias is not supported when out_dtype is set to Float32"),
])
def test_cuda_errors_name_the_requirement(case, message):
    one = tw.tensor(1.0, device="cuda")
    shapes = {"k": (32, 40, 48), "n": (32, 64, 40)}.get(case, (32, 64, 48))
    a, b, ca, cb = _cuda_operands(*shapes, a_dtype=E5M2 if case == "e5m2" else E4M3,
                                  b_dtype=E5M2 if case == "e5m2" else E4M3)
    kw = {"out_dtype": tw.float32}
    if case == "row-major b":
        cb = cb.contiguous()
    if case == "bias fp32 out":
        kw["bias"] = tw.ones(48, device="cuda", dtype=tw.bfloat16)
    with pytest.raises((RuntimeError, ValueError), match=message):
        tw._scaled_mm(ca, cb, one, one, **kw)

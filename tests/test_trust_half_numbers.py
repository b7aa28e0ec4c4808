"""Python numbers beside float16/bfloat16 tensors, bit for bit as torch computes them on the CPU.

torch's CPU kernels round a number to the half before computing for most operators, but read it at float32 for
some (``mul``, ``div``, ``lerp``'s weight), and round some Scalar arguments (``add``'s alpha, ``hardtanh``'s bounds)
while reading others at float32 (see [Note: half operands] in tilewise/ops/dtype_rules.py). Each call of the table
runs over tensors holding the number rounded to the half and its neighbours, where the two readings part, and
over many Python numbers whose rounding matters.
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest
import torch

import tilewise as tw

F = {tw: tw.nn.functional, torch: torch.nn.functional}
HALVES = ("float16", "bfloat16")
NUMBERS = (0.1, 1 / 3, 1e-4, 2**-25, 7.77, 65519.0, 65520.0, 1e5, 3.0, -2.5, 1e-8, 3e38, 1e-30, 0.7, -0.3, 2, 5,
           -7, 2049, 1 / 7)

CALLS = {
    "add": lambda m, x, s: x + s, "radd": lambda m, x, s: s + x, "sub": lambda m, x, s: x - s,
    "rsub": lambda m, x, s: s - x, "torch.rsub": lambda m, x, s: m.rsub(x, s),
    "mul": lambda m, x, s: x * s, "rmul": lambda m, x, s: s * x, "torch.mul": lambda m, x, s: m.mul(x, s),
    "div": lambda m, x, s: x / s, "rdiv": lambda m, x, s: s / x, "true_divide": lambda m, x, s: m.true_divide(x, s),
    "div(floor)": lambda m, x, s: m.div(x, s, rounding_mode="floor"),
    "div(trunc)": lambda m, x, s: m.div(x, s, rounding_mode="trunc"),
    "floor_divide": lambda m, x, s: m.floor_divide(x, s), "remainder": lambda m, x, s: m.remainder(x, s),
    "rmod": lambda m, x, s: s % x, "fmod": lambda m, x, s: m.fmod(x, s), "pow": lambda m, x, s: x ** s,
    "rpow": lambda m, x, s: s ** x,
    "clamp": lambda m, x, s: m.clamp(x, -abs(s), abs(s)), "clamp_min": lambda m, x, s: m.clamp_min(x, s),
    "clamp_max": lambda m, x, s: m.clamp_max(x, s), "clip(max=)": lambda m, x, s: x.clip(max=s),
    "maximum(0-d)": lambda m, x, s: m.maximum(x, m.tensor(s)),
    "minimum(0-d)": lambda m, x, s: m.minimum(x, m.tensor(s)),
    "add(0-d)": lambda m, x, s: x + m.tensor(s), "mul(0-d)": lambda m, x, s: x * m.tensor(s),
    "div(0-d)": lambda m, x, s: x / m.tensor(s), "mul(0-d float64)": lambda m, x, s: x * m.tensor(s, dtype=m.float64),
    "0-d * x": lambda m, x, s: m.tensor(s) * x,
    "where(x, s)": lambda m, x, s: m.where(x > 0, x, s), "where(s, x)": lambda m, x, s: m.where(x > 0, s, x),
    "lerp(weight=s)": lambda m, x, s: m.lerp(x, x * 2 + 1, s),
    "lerp(weight=s, far end)": lambda m, x, s: m.lerp(x, x * -3 + 0.7, s),
    "addcmul(value=s)": lambda m, x, s: m.addcmul(x, x, x + 1, value=s),
    "addcmul(value=s, scaled)": lambda m, x, s: m.addcmul(x, x * 0.3, x - 1, value=s),
    "addcdiv(value=s)": lambda m, x, s: m.addcdiv(x, x, x + 3, value=s),
    "add(alpha=s)": lambda m, x, s: m.add(x, x + 1, alpha=s), "sub(alpha=s)": lambda m, x, s: m.sub(x, x + 1, alpha=s),
    "add(s, alpha=2)": lambda m, x, s: m.add(x, s, alpha=2), "sub(s, alpha=3)": lambda m, x, s: m.sub(x, s, alpha=3),
    "mul_": lambda m, x, s: x.clone().mul_(s), "div_": lambda m, x, s: x.clone().div_(s),
    "add_": lambda m, x, s: x.clone().add_(s), "sub_": lambda m, x, s: x.clone().sub_(s),
    "add_(alpha=s)": lambda m, x, s: x.clone().add_(x, alpha=s), "x *= s": lambda m, x, s: _imul(x.clone(), s),
    "eq": lambda m, x, s: x == s, "ne": lambda m, x, s: x != s, "lt": lambda m, x, s: x < s,
    "le": lambda m, x, s: x <= s, "gt": lambda m, x, s: x > s, "ge": lambda m, x, s: x >= s,
    "hardtanh": lambda m, x, s: F[m].hardtanh(x, -abs(s), abs(s)), "leaky_relu": lambda m, x, s: F[m].leaky_relu(x, s),
    "threshold": lambda m, x, s: F[m].threshold(x, s, -s), "elu(alpha=s)": lambda m, x, s: F[m].elu(x, s),
    "celu(alpha=s)": lambda m, x, s: F[m].celu(x, s), "softplus(beta=s)": lambda m, x, s: F[m].softplus(x, s),
    "softplus(threshold=s)": lambda m, x, s: F[m].softplus(x, 1.0, s),
    "hardtanh(min > max)": lambda m, x, s: F[m].hardtanh(x, abs(s), -abs(s)),
    "hardshrink": lambda m, x, s: F[m].hardshrink(x, abs(s)), "softshrink": lambda m, x, s: F[m].softshrink(x, abs(s)),
    "xlogy(x, s)": lambda m, x, s: m.xlogy(x, s), "xlogy(s, x)": lambda m, x, s: m.xlogy(s, x),
    "masked_fill": lambda m, x, s: x.masked_fill(x > 0, s), "fill_": lambda m, x, s: x.clone().fill_(s),
    "full_like": lambda m, x, s: m.full_like(x, s), "copysign": lambda m, x, s: m.copysign(x, s),
}
# differences that are not the reading of the number, left for their own fixes: torch's division-free floor algorithm
# for number // tensor (lerp, addcmul and add/sub with an alpha round once, as torch's fused multiply-adds do: see
# tests/test_fma.py)
ZERO_SIGN_IGNORED: set[str] = set()
# and: its bfloat16 remainder of 3e38, and its add/sub of 3e38 with an alpha (tilewise's overflows to inf)
LEFT = {("rmod", "bfloat16", 3e38), ("add(s, alpha=2)", "bfloat16", 3e38), ("sub(s, alpha=3)", "bfloat16", 3e38)}


def _imul(x, s):
    x *= s
    return x


def inputs(dtype: str, s) -> np.ndarray:
    """float32 values exact in ``dtype``: random ones, and ``s`` rounded to the half with its neighbours."""
    rng = np.random.default_rng(zlib.crc32(repr((dtype, s)).encode()))  # the same inputs in every process
    half = torch.tensor([s, -s], dtype=torch.float32).to(getattr(torch, dtype))
    up = torch.nextafter(half, torch.full_like(half, float("inf")))
    down = torch.nextafter(half, torch.full_like(half, -float("inf")))
    near = torch.cat([half, up, down]).float().numpy()
    spread = np.concatenate([rng.standard_normal(48) * 3, rng.standard_normal(12) * 1e-3,
                             [0.0, -0.0, 1.0, -1.0, 0.5, 100.0, 60000.0, 1e-7]]).astype(np.float32)
    values = np.concatenate([near[np.isfinite(near)], spread])
    # 128 elements: torch's vectorised loop covers them all (its scalar tail of add with alpha rounds alpha * other
    # to the half before adding, unlike the vector body)
    values = np.resize(values, 128)
    return torch.tensor(values).to(getattr(torch, dtype)).float().numpy()


def outcome(call, m, x, s):
    try:
        out = call(m, x, s)
    except Exception as e:  # noqa: BLE001 — torch's refusals are part of what is compared
        return type(e)
    return (out.float() if out.dtype in (m.float16, m.bfloat16) else out).cpu().numpy(), str(out.dtype).split(".")[-1]


def difference(ours, theirs, zero_sign: bool = True) -> str:
    if isinstance(ours, type) or isinstance(theirs, type):
        if isinstance(ours, type) and isinstance(theirs, type):
            return ""
        described = [o.__name__ if isinstance(o, type) else "a result" for o in (ours, theirs)]
        return f"tilewise gives {described[0]}, torch {described[1]}"
    (a, da), (b, db) = ours, theirs
    if a.shape != b.shape or da != db:
        return f"{a.shape} {da} against {b.shape} {db}"
    nan = np.isnan(a) & np.isnan(b) if a.dtype.kind == "f" else np.zeros(a.shape, bool)
    same = (a == b) & (np.signbit(a) == np.signbit(b) if zero_sign and a.dtype.kind == "f" else True)
    bad = np.flatnonzero(~(same | nan))
    if not len(bad):
        return ""
    i = bad[0]
    return f"{len(bad)} elements, first at {i}: tilewise {a.flat[i]!r}, torch {b.flat[i]!r}"


def mismatches(label: str, run_ours, device: str = "cpu", numbers=NUMBERS, left=LEFT) -> list[str]:
    call = CALLS[label]
    found = []
    for dtype in HALVES:
        for s in numbers:
            if (label, dtype, s) in left:
                continue
            values = inputs(dtype, s)
            x_tw = tw.tensor(values).to(getattr(tw, dtype)).to(device)
            x_torch = torch.tensor(values).to(getattr(torch, dtype)).to(device)
            theirs = outcome(call, torch, x_torch, s)
            if isinstance(theirs, type):  # torch refuses this number (clamp's 65519 for float16): so must we
                pass
            ours = run_ours(call, x_tw, s)
            d = difference(ours, theirs, label not in ZERO_SIGN_IGNORED)
            if d:
                found.append(f"{label} {dtype} {s!r}: {d}")
    return found


@pytest.mark.parametrize("label", CALLS)
def test_python_numbers_beside_halves_match_torch_bit_for_bit(label):
    found = mismatches(label, lambda call, x, s: outcome(call, tw, x, s))
    assert not found, "\n".join(found)


# compiled hardshrink, masked_fill and copysign with a number still differ from torch (left for their own fixes)
COMPILED = [k for k in CALLS if not k.endswith("_")
            and k not in ("x *= s", "full_like", "fill_", "hardshrink", "masked_fill", "copysign")]


def _compiled(call, x, s):
    """``call`` compiled by tilewise on ``x``, as ``outcome`` reports it (a refusal while compiling included)."""
    try:
        return outcome(lambda m, t, n: tw.compile(lambda v: call(tw, v, n))(t), tw, x, s)
    except Exception as e:  # noqa: BLE001
        return type(e)


@pytest.mark.parametrize("label", COMPILED)
def test_compiled_python_numbers_beside_halves_match_torch_eager(label):
    found = mismatches(label, _compiled)
    assert not found, "\n".join(found)


# ------------------------------------------------------------------ the same table on CUDA, against torch's CUDA
# torch's CUDA kernels read numbers their own way (see [Note: half operands]): tilewise's CUDA kernels, eager and
# compiled, must match them, not the CPU's (addcmul and addcdiv take their value last there: value * (t1 * t2), where
# the CPU's value * t1 * t2 overflows for 3e38 beside bfloat16). Left: division by a number, where torch's CUDA
# kernel multiplies by the number's float32 reciprocal and tilewise divides (a last bit: see _div in
# ops/pointwise.py); and xlogy with a number, a last bit on an H200 not yet explained.
CUDA_LEFT = {
    (label, dtype, s)
    for label in ("div", "div_", "true_divide", "div(trunc)", "div(0-d)", "xlogy(x, s)", "xlogy(s, x)")
    for dtype in HALVES for s in NUMBERS}
CUDA_COMPILED_NUMBERS = (0.1, 1 / 3, 7.77, 65519.0, -2.5)
needs_torch_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="torch built without CUDA")


@pytest.mark.cuda
@needs_torch_cuda
@pytest.mark.parametrize("label", CALLS)
def test_python_numbers_beside_cuda_halves_match_torch_cuda(label):
    found = mismatches(label, lambda call, x, s: outcome(call, tw, x, s), "cuda", left=CUDA_LEFT)
    assert not found, "\n".join(found)


@pytest.mark.cuda
@needs_torch_cuda
@pytest.mark.parametrize("label", COMPILED)
def test_compiled_python_numbers_beside_cuda_halves_match_torch_cuda(label):
    found = mismatches(label, _compiled, "cuda", CUDA_COMPILED_NUMBERS, CUDA_LEFT)
    assert not found, "\n".join(found)


# ------------------------------------------------------------------ signed zeros at ties, every floating dtype
# +0 against -0 is a tie: which operand torch's vectorised CPU loop returns decides the sign (256 elements: no scalar
# tail). Zeros of both signs against bounds of both signs, in every floating dtype the same kernels serve.
def _zeros(m, dtype):
    x = m.zeros(256, dtype=getattr(m, dtype))
    x[::2] = -0.0
    x[1::4] = float("nan")
    return x


TIES = {
    "clamp(-0, 0)": lambda m, x: m.clamp(x, -0.0, 0.0), "clamp(0, -0)": lambda m, x: m.clamp(x, 0.0, -0.0),
    "clamp_min(0)": lambda m, x: m.clamp_min(x, 0.0), "clamp_max(-0)": lambda m, x: m.clamp_max(x, -0.0),
    "clamp(0-d, 0-d)": lambda m, x: m.clamp(x, m.tensor(0.0, dtype=x.dtype), m.tensor(-0.0, dtype=x.dtype)),
    "clamp(0-d)": lambda m, x: m.clamp(x, m.tensor(0.0, dtype=x.dtype)),
    "clamp(number, 0-d)": lambda m, x: m.clamp(x, 0.0, m.tensor(-0.0, dtype=x.dtype)),
    "clamp(tensor, tensor)": lambda m, x: m.clamp(x, m.zeros_like(x), -m.zeros_like(x)),
    "clamp_min(tensor)": lambda m, x: m.clamp_min(x, m.zeros_like(x)),
    "clamp(0-d, tensor)": lambda m, x: m.clamp(x, m.tensor(0.0, dtype=x.dtype), m.zeros_like(x)),
    "clamp_(-0, 0)": lambda m, x: x.clone().clamp_(-0.0, 0.0),
    "maximum(x, 0)": lambda m, x: m.maximum(x, m.zeros_like(x)), "minimum(-0, x)": lambda m, x: m.minimum(-x * 0, x),
    "relu": lambda m, x: m.relu(x), "relu6": lambda m, x: F[m].relu6(x),
    "hardtanh(-0, 0)": lambda m, x: F[m].hardtanh(x, -0.0, 0.0),
    "hardtanh(0, 0)": lambda m, x: F[m].hardtanh(x, 0.0, 0.0),
    "elu": lambda m, x: F[m].elu(x), "elu(alpha=-2.5)": lambda m, x: F[m].elu(x, -2.5),
    "celu(alpha=-2)": lambda m, x: F[m].celu(x, -2.0), "selu": lambda m, x: F[m].selu(x),
    "softshrink": lambda m, x: F[m].softshrink(x), "softshrink(0)": lambda m, x: F[m].softshrink(x, 0.0),
    "hardshrink": lambda m, x: F[m].hardshrink(x),
}


@pytest.mark.parametrize("dtype", ("float32", "float64", *HALVES))
@pytest.mark.parametrize("label", TIES)
def test_signed_zeros_at_ties_match_torch(label, dtype):
    call = TIES[label]
    theirs = outcome(lambda m, x, s: call(m, x), torch, _zeros(torch, dtype), None)
    ours = outcome(lambda m, x, s: call(m, x), tw, _zeros(tw, dtype), None)
    assert not difference(ours, theirs), difference(ours, theirs)
    compiled = outcome(lambda m, x, s: tw.compile(lambda v: call(tw, v))(x), tw, _zeros(tw, dtype), None)
    assert not difference(compiled, theirs), f"compiled: {difference(compiled, theirs)}"


# tensor ** number: torch's CPU kernel multiplies for 2, 3 and -2 (bfloat16 rounding each product) and divides for -1
@pytest.mark.parametrize("dtype", ("float32", "float64", *HALVES))
@pytest.mark.parametrize("exponent", (2, 3, 3.0, -2, -1))
def test_power_by_small_integer_matches_torch(exponent, dtype):
    values = np.random.default_rng(7).standard_normal(4096).astype(np.float32) * 3
    theirs = outcome(lambda m, x, s: x ** s, torch, torch.tensor(values).to(getattr(torch, dtype)), exponent)
    ours = outcome(lambda m, x, s: x ** s, tw, tw.tensor(values).to(getattr(tw, dtype)), exponent)
    assert not difference(ours, theirs), difference(ours, theirs)
    compiled = outcome(lambda m, x, s: tw.compile(lambda v: v ** s)(x), tw, tw.tensor(values).to(getattr(tw, dtype)),
                       exponent)
    assert not difference(compiled, theirs), f"compiled: {difference(compiled, theirs)}"


def test_kernels_told_apart_by_the_sign_of_a_zero_argument():
    """-0.0 == 0.0: a kernel made for one must not serve the other."""
    for m in (tw, torch):
        x = m.tensor([float("nan")] * 4)
        assert not m.nan_to_num(x, nan=0.0).signbit().any()
        assert m.nan_to_num(x, nan=-0.0).signbit().all()


# ------------------------------------------------------------------ what the CUDA kernels are built from, on the CPU
# The rules and expressions the CUDA kernels (eager and compiled) are made from, read for a CUDA operand without a
# GPU: the compiler's stand-in for a tensor carries the device.
def _cuda_stand(dtype):
    from tilewise.compiler.ir import TensorType
    from tilewise.compiler.meta import Stand

    return Stand(TensorType((4,), dtype, tw.device("cuda")))


# torch's CUDA kernels (aten/src/ATen/native/cuda): the parameters they cast to the half (gpu_kernel_with_scalars
# over scalar_t, Scalar.to<scalar_t>()); add, mul, div and clamp read theirs at float32
CUDA_ROUNDED = {"eq": {"self", "other"}, "lt": {"self", "other"}, "remainder": {"self", "other"},
                "fmod": {"self", "other"}, "pow": {"exponent"}, "rpow": {"self", "other"},
                "threshold": {"self", "threshold", "value"}, "hardshrink": {"self", "lambd"},
                "_softshrink": {"self", "lambd"}, "add": set(), "mul": set(), "div": set(), "clamp": set()}


@pytest.mark.parametrize("name", CUDA_ROUNDED)
def test_cuda_declarations_follow_torchs_cuda_kernels(name):
    from tilewise.ops import dtype_rules as R
    from tilewise.ops.registry import OPS

    assert set(R.half_rounded(OPS[name], "cuda")) == CUDA_ROUNDED[name]


def test_cuda_clamp_reads_a_bound_past_the_half_without_refusing_it():
    from tilewise.compiler.ir import TensorType
    from tilewise.compiler.meta import Stand
    from tilewise.ops import dtype_rules as R
    from tilewise.ops.registry import OPS

    op = OPS["clamp"]
    assert R.clamp_rule(op, (_cuda_stand(tw.float16), -65519.0, 65519.0))[0] is tw.float16
    with pytest.raises(RuntimeError, match="overflow"):
        R.clamp_rule(op, (Stand(TensorType((4,), tw.float16, tw.device("cpu"))), -65519.0, 65519.0))
    with pytest.raises(RuntimeError, match="overflow"):  # torch's CUDA kernel refuses an int8 bound past int8
        R.clamp_rule(op, (_cuda_stand(tw.int8), 0, 1000))


@pytest.mark.parametrize("dtype", HALVES)
def test_cuda_pow_takes_products_for_exponents_that_round_to_them(dtype):
    from tilewise.ops.registry import OPS

    chooser = OPS["pow"].attrs["expr_variant"]
    x = _cuda_stand(getattr(tw, dtype))
    assert chooser((x, 3.0)) == 3 and chooser((x, -2)) == -2 and chooser((x, 0.5)) == 0.5
    assert chooser((x, 2.0004)) == 2  # 2.0004 is 2 in either half
    assert chooser((x, 2.5)) is None
    assert chooser((tw.ones(4, dtype=tw.float16), 3.0)) is None  # torch's CPU kernel: float16 takes pow

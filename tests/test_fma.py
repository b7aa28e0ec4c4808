"""The fused multiply-add primitive, and the operators torch computes with one: bit for bit against torch.

torch's CPU kernels round ``a * b + c`` once in add/sub with an alpha, lerp and addcmul (see [Note: fused
multiply-add] in tilewise/backends/cpu/fma.py), in their vector body and their scalar tail (the last elements short
of two vectors: 17 elements run in the tail alone, 256 in the body alone, 255 in both); addcdiv divides and adds.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import shutil

import numpy as np
import pytest
import torch

import tilewise as tw
from tilewise.backends.cpu import fma as fma_module
from tilewise.backends.cpu.fma import emulated_fma, fma, native_fma
from tilewise.config import settings
from tilewise.ops.registry import OPS

_libm = ctypes.CDLL(ctypes.util.find_library("m"))
_libm.fmaf.restype, _libm.fmaf.argtypes = ctypes.c_float, [ctypes.c_float] * 3
_libm.fma.restype, _libm.fma.argtypes = ctypes.c_double, [ctypes.c_double] * 3
BITS = {np.dtype(np.float32): np.int32, np.dtype(np.float64): np.int64}


def c_fma(a, b, c):
    """The C library's fma, element by element: the reference."""
    dtype = np.result_type(a, b, c)
    f = _libm.fmaf if dtype == np.float32 else _libm.fma
    a, b, c = (np.broadcast_to(np.asarray(x, dtype), np.broadcast_shapes(*(np.shape(y) for y in (a, b, c))))
               for x in (a, b, c))
    return np.array([f(x, y, z) for x, y, z in zip(a.ravel().tolist(), b.ravel().tolist(), c.ravel().tolist())],
                    dtype).reshape(a.shape)


def same_bits(x, y) -> np.ndarray:
    x, y = np.asarray(x), np.asarray(y)
    return (x.view(BITS[x.dtype]) == y.view(BITS[y.dtype])) | (np.isnan(x) & np.isnan(y))


FMA_PATHS = {"fma": fma, "emulated_fma": emulated_fma}


def operands(dtype, n: int = 4000, seed: int = 0):
    """Normal values, values of every exponent, specials, near-cancellations and exact midpoints plus a tiny
    addend (where rounding the float64 sum to float32 rounds twice)."""
    rng = np.random.default_rng(seed)
    info = np.finfo(dtype)
    bits = info.nmant + 1
    low, high = int(info.minexp) - bits, int(info.maxexp)
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, info.max, -info.max, info.tiny, -info.tiny,
                        info.smallest_subnormal, 1.0, -1.0, 1 + info.eps, 3.0], dtype)
    normal = [rng.standard_normal(n).astype(dtype) for _ in range(3)]
    spread = [(rng.standard_normal(n) * 2.0 ** rng.integers(low // 2, high // 2, n)).astype(dtype) for _ in range(3)]
    specials = [rng.choice(special, n) for _ in range(3)]
    a, b = normal[0], normal[1]
    cancel = [a, b, (-(a.astype(np.float64) * b) * (1 + rng.standard_normal(n) * 1e-9)).astype(dtype)]
    # (1 + eps) * 1.5 = 1.5 + eps + eps / 2: a midpoint of ``dtype``, which a tiny c moves off
    tiny = (rng.choice([-1.0, 1.0], n) * 2.0 ** rng.integers(-3 * bits, -bits - 2, n)).astype(dtype)
    ties = [np.full(n, 1 + info.eps, dtype), rng.choice(np.array([1.5, -1.5, 3.0, 0.75], dtype), n), tiny]
    return [np.concatenate(parts) for parts in zip(normal, spread, specials, cancel, ties)]


@pytest.mark.parametrize("path", ["fma", "emulated_fma"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_numpy_fma_rounds_once_as_the_c_library_does(dtype, path):
    a, b, c = operands(dtype)
    with np.errstate(all="ignore"):
        ours, reference = FMA_PATHS[path](a, b, c), c_fma(a, b, c)
        wide = (a.astype(np.float64) * b + c).astype(dtype) if dtype is np.float32 else a * b + c
        unfused = a * b + c
    bad = np.flatnonzero(~same_bits(ours, reference))
    assert not len(bad), [(a[i], b[i], c[i], ours[i], reference[i]) for i in bad[:5]]
    # the inputs hold cases where two roundings differ from one: the check could fail
    assert (~same_bits(wide, reference)).sum() > 10 and (~same_bits(unfused, reference)).sum() > 100


# ------------------------------------------------------------------ the C path against the numpy emulation
needs_cc = pytest.mark.skipif(shutil.which(settings.cc) is None, reason="no host C compiler")


def assert_native_is_emulated(a, b, c):
    """The C path's result, bit for bit that of the emulation (the reference), and in the same shape."""
    native = native_fma(a, b, c)
    assert native is not None, "the C path did not run"
    with np.errstate(all="ignore"):
        emulated = np.asarray(emulated_fma(a, b, c))
    assert native.shape == emulated.shape and native.dtype == emulated.dtype == a.dtype
    bad = np.flatnonzero(~same_bits(native, emulated))
    assert not len(bad), [(native.ravel()[i], emulated.ravel()[i]) for i in bad[:5]]
    assert native.flags.c_contiguous


@needs_cc
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_c_fma_matches_the_emulation_on_random_and_hard_cases(dtype):
    """Ties (a midpoint a tiny addend moves off), subnormals, overflow, infinities, NaN and -0.0 (``operands``),
    and random values of every exponent, with every pairing of special values."""
    for seed in range(3):
        a, b, c = operands(dtype, 3000, seed)
        assert_native_is_emulated(a, b, c)
        with np.errstate(all="ignore"):
            unfused = a * b + c
        assert (~same_bits(unfused, native_fma(a, b, c))).sum() > 100  # a separate multiply and add would differ
    info = np.finfo(dtype)
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, info.max, -info.max, info.tiny, -info.tiny,
                        info.smallest_subnormal, -info.smallest_subnormal, 1.0, -1.0, 0.5, 2.0], dtype)
    a, b, c = np.meshgrid(special, special, special, indexing="ij")
    assert_native_is_emulated(a.ravel(), b.ravel(), c.ravel())
    # exact zeros: the sign of the sum of a (signed) zero product and a signed zero
    zero, neg = np.array(0.0, dtype), np.array(-0.0, dtype)
    for x, y, z in [(zero, neg, neg), (neg, neg, neg), (zero, zero, neg), (neg, zero, neg), (zero, neg, zero)]:
        assert_native_is_emulated(np.full(8, x), y, z)


LAYOUTS = {
    "0-d": lambda x, y, z: (np.asarray(x[0, 0]), np.asarray(y[0, 0]), np.asarray(z[0, 0])),
    "0-d and arrays": lambda x, y, z: (x, np.asarray(y[0, 0]), z),
    "empty": lambda x, y, z: (x[:0], y[:0], z[:0]),
    "empty broadcast": lambda x, y, z: (x[:0], y[:1], np.asarray(z[0, 0])),
    "scalar multiplier": lambda x, y, z: (x, np.asarray(y[0, 0]), z),
    "row and column": lambda x, y, z: (x[:, :1], y[:1, :], z),
    "outer": lambda x, y, z: (x[:, :1], y[:1, :], z[:1, :1]),
    "3-d broadcast": lambda x, y, z: (x[:6, :1, None], y[None, :5, :7], z[:1, :7]),
    "transposed": lambda x, y, z: (x.T, y.T, z.T),
    "mixed order": lambda x, y, z: (x, y.T.copy().T, z),
    "stepped": lambda x, y, z: (x[::2, :60:3], y[1::2, 1:61:3], z[::2, 2:62:3]),
    "reversed": lambda x, y, z: (x[::-1, ::-1], y, z[:, ::-1]),
    "column of a matrix": lambda x, y, z: (x[:, 3], y[:, 4], z[:, 5]),
    "unaligned": lambda x, y, z: (unaligned(x), y, unaligned(z.T).T),
}


def unaligned(x: np.ndarray) -> np.ndarray:
    """A copy of ``x`` whose elements start one byte past an aligned address."""
    raw = np.empty(x.nbytes + 1, np.uint8)
    out = raw[1:].view(x.dtype).reshape(x.shape)
    out[...] = x
    return out


@needs_cc
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_c_fma_walks_every_layout_as_the_emulation(layout, dtype):
    base = [x[:2048].reshape(32, 64) for x in operands(dtype, 1000, seed=3)]
    a, b, c = LAYOUTS[layout](*base)
    assert_native_is_emulated(a, b, c)
    assert_native_is_emulated(c, a, b)


@needs_cc
def test_fma_takes_the_c_path_from_its_threshold(monkeypatch):
    calls = []

    def counted(*args):
        calls.append(args[0].dtype)
        return native_fma(*args)

    monkeypatch.setattr(fma_module, "native_fma", counted)
    small, large = fma_module.NATIVE_FLOAT32_MIN_ELEMENTS - 1, fma_module.NATIVE_FLOAT32_MIN_ELEMENTS
    rng = np.random.default_rng(0)
    for n, dtype, taken in [(small, np.float32, 0), (large, np.float32, 1), (1, np.float64, 1),
                            (large, np.float16, 1), (large, np.int32, 0)]:
        calls.clear()
        a, b, c = ((rng.standard_normal(n) * 100).astype(dtype) for _ in range(3))
        out = fma(a, b, np.asarray(c[0]))
        assert len(calls) == taken and out.dtype == dtype and out.shape == (n,)
        assert all(d in (np.float32, np.float64) for d in calls)  # float16 computes in float32
        with np.errstate(all="ignore"):
            assert same_bits(np.asarray(out, np.float64), np.asarray(emulated_fma(a, b, c[0]), np.float64)).all()


def test_c_fma_refuses_operands_of_other_or_mixed_dtypes():
    x32, x64 = np.ones(4, np.float32), np.ones(4, np.float64)
    with pytest.raises(TypeError, match=r"native_fma: .*float32, float64 and float32"):
        native_fma(x32, x64, x32)
    with pytest.raises(TypeError, match=r"native_fma: .*float16"):
        native_fma(*(x.astype(np.float16) for x in (x32, x32, x32)))


def test_fma_without_a_c_compiler_is_the_emulation(monkeypatch, tmp_path):
    monkeypatch.setattr(settings, "cc", str(tmp_path / "no-such-cc"))
    a, b, c = operands(np.float64, 500, seed=4)
    assert native_fma(a, b, c) is None
    with np.errstate(all="ignore"):
        assert same_bits(fma(a, b, c), c_fma(a, b, c)).all()
        assert same_bits(fma(a, b, c), emulated_fma(a, b, c)).all()


def test_numpy_fma_of_other_dtypes_multiplies_and_adds():
    assert fma(np.arange(4, dtype=np.int8), np.int8(3), np.int8(1)).tolist() == [1, 4, 7, 10]
    assert fma(np.array([True, False]), True, np.array([False, False])).tolist() == [True, False]
    z = np.array([1 + 2j]), np.array([3 - 1j]), np.array([0.5j])
    assert fma(*z) == z[0] * z[1] + z[2]
    assert fma(np.ones(3, np.float32), 0.1, np.ones(3, np.float32)).dtype == np.float32


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_fma_operator_eager_and_compiled(dtype):
    a, b, c = (x[:2000] for x in operands(getattr(np, dtype), 400, seed=1))
    reference = c_fma(a, b, c)
    args = [tw.tensor(x) for x in (a, b, c)]
    op = OPS["fma"]
    assert same_bits(op(*args).numpy(), reference).all()
    assert same_bits(tw.compile(lambda x, y, z: op(x, y, z))(*args).numpy(), reference).all()


def test_fma_operator_gradients():
    a, b, c = (tw.randn(5, requires_grad=True) for _ in range(3))
    OPS["fma"](a, b, c).sum().backward()
    assert np.array_equal(a.grad.numpy(), b.detach().numpy()) and np.array_equal(b.grad.numpy(), a.detach().numpy())
    assert np.array_equal(c.grad.numpy(), np.ones(5, np.float32))


def test_compiled_c_calls_fma():
    from tilewise.codegen.render.c import C
    from tilewise.codegen.render.cstyle import ExprRenderer, Source
    from tilewise.ops.expr import Expr
    from tilewise.ops.expr import fma as fma_expr

    for dtype, spelled in ((tw.float32, "fmaf("), (tw.float64, "fma("), (tw.int32, " * ")):
        leaves = {("input", k): (f"x{k}", dtype) for k in range(3)}
        renderer = ExprRenderer(Source(C), leaves)
        renderer.render(fma_expr(*(Expr("input", (), k) for k in range(3))))
        assert spelled in renderer.lines[-1], renderer.lines


# ------------------------------------------------------------------ the operators, bit for bit against torch
CALLS = {
    "add(alpha=0.1)": lambda m, a, b, c, w: m.add(a, b, alpha=0.1),
    "add(alpha=-3.7)": lambda m, a, b, c, w: m.add(a, b, alpha=-3.7),
    "sub(alpha=0.3)": lambda m, a, b, c, w: m.sub(a, b, alpha=0.3),
    "rsub(alpha=0.3)": lambda m, a, b, c, w: m.rsub(a, b, alpha=0.3),
    "add_(alpha=0.1)": lambda m, a, b, c, w: a.clone().add_(b, alpha=0.1),
    "sub(number, alpha=3)": lambda m, a, b, c, w: m.sub(a, 1 / 3, alpha=3),
    "lerp(tensor weight)": lambda m, a, b, c, w: m.lerp(a, b, w),
    "lerp(weight=0.3)": lambda m, a, b, c, w: m.lerp(a, b, 0.3),
    "lerp(weight=0.7)": lambda m, a, b, c, w: m.lerp(a, b, 0.7),
    "lerp(weight=-0.2)": lambda m, a, b, c, w: m.lerp(a, b, -0.2),
    "lerp_(weight=0.9)": lambda m, a, b, c, w: a.clone().lerp_(b, 0.9),
    "addcmul(value=0.1)": lambda m, a, b, c, w: m.addcmul(a, b, c, value=0.1),
    "addcmul": lambda m, a, b, c, w: m.addcmul(a, b, c),
    "addcmul_(value=-0.3)": lambda m, a, b, c, w: a.clone().addcmul_(b, c, value=-0.3),
    "addcdiv(value=0.1)": lambda m, a, b, c, w: m.addcdiv(a, b, c, value=0.1),
}
SIZES = (17, 256, 255)
# a number's alpha * other is the same for every element: torch's scalar tail computes it once, rounded, before the
# loop, where its vector body fuses it (the body's result is matched: 256 elements)
BODY_ONLY = {"sub(number, alpha=3)"}


def _inputs(m, dtype: str, n: int):
    rng = np.random.default_rng(n)
    values = [rng.standard_normal(n) * 3 for _ in range(3)] + [rng.uniform(-0.3, 1.3, n)]  # float64: every bit used
    exact = [torch.tensor(v).to(getattr(torch, dtype)).double().numpy() for v in values]  # what dtype holds
    return [m.tensor(v).to(getattr(m, dtype)) for v in exact]


def _differences(label: str, dtype: str, run, device: str = "cpu") -> list[str]:
    call = CALLS[label]
    found = []
    for n in (256,) if label in BODY_ONLY else SIZES:
        theirs = call(torch, *(t.to(device) for t in _inputs(torch, dtype, n))).cpu().double().numpy()
        ours = run(call, [t.to(device) for t in _inputs(tw, dtype, n)]).cpu().double().numpy()
        bad = np.flatnonzero(~same_bits(ours, theirs))
        if len(bad):
            found.append(f"{n} elements: {len(bad)} differ, first at {bad[0]}: {ours[bad[0]]!r} against "
                         f"{theirs[bad[0]]!r}")
    return found


def _eager(call, args):
    return call(tw, *args)


def _compiled(call, args):
    return tw.compile(lambda *xs: call(tw, *xs))(*args)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("label", CALLS)
def test_fused_operators_match_torch_bit_for_bit(label, dtype):
    assert not _differences(label, dtype, _eager)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("label", CALLS)
def test_compiled_fused_operators_match_torch_bit_for_bit(label, dtype):
    assert not _differences(label, dtype, _compiled)


# halves compute in float32 and round the float32 result; torch's scalar tail of add and sub with an alpha
# rounds alpha * other to the half first (so only the vector body, 256 elements, is compared for those)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("label", [k for k in CALLS if "lerp" in k or "addc" in k])
def test_fused_operators_on_halves_match_torch(label, dtype):
    assert not _differences(label, dtype, _eager)
    assert not _differences(label, dtype, _compiled)


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16"])
def test_lerp_to_a_negative_zero_at_weight_one_keeps_its_sign(dtype):
    """torch's vector body: fma(weight - 1, end - self, end) = fma(0, -1, -0) = -0 (64 elements: no scalar tail)."""
    for m in (torch, tw):
        x = m.ones(64, dtype=getattr(m, dtype))
        end = m.full((64,), -0.0, dtype=getattr(m, dtype))
        assert m.lerp(x, end, 1.0).signbit().all() and m.lerp(x, end, m.ones_like(x)).signbit().all()
    assert tw.compile(lambda a, b: tw.lerp(a, b, 1.0))(x, end).signbit().all()


# ------------------------------------------------------------------ CUDA, against torch's CUDA kernels
needs_torch_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="torch built without CUDA")


@pytest.mark.cuda
@needs_torch_cuda
@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16"])
@pytest.mark.parametrize("label", CALLS)
def test_fused_operators_on_cuda_match_torch_cuda(label, dtype):
    assert not _differences(label, dtype, _eager, "cuda")
    assert not _differences(label, dtype, _compiled, "cuda")


@pytest.mark.cuda
@needs_torch_cuda
def test_cuda_lerp_to_a_negative_zero_at_weight_one_as_torch_cuda():
    """torch's CUDA kernel: end - (end - self) * (1 - weight), contracted: -0 - (-1 * 0) = +0."""
    x, end = torch.ones(64, device="cuda"), torch.full((64,), -0.0, device="cuda")
    theirs = torch.lerp(x, end, 1.0).signbit()
    ours = tw.lerp(tw.ones(64, device="cuda"), tw.full((64,), -0.0, device="cuda"), 1.0).signbit()
    assert ours.cpu().numpy().tolist() == theirs.cpu().numpy().tolist()

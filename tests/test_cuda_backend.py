"""The CUDA backend on a GPU: the operator table against torch on CUDA, transfers, casts, Philox bit-identity,
large reductions, GEMM, autograd/nn/optim on the device, logging, and recovery from out-of-memory.

Everything here is marked ``cuda`` and skipped where no GPU is found (tests/conftest.py).
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from opinfo import T, check_op
from test_ops import OPINFOS

import tilewise as tw

pytestmark = pytest.mark.cuda

CASES = [(info, dtype) for info in OPINFOS for dtype in info.dtypes]


@pytest.fixture(autouse=True)
def _torch_cuda():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("the torch oracle has no CUDA here")
    yield


# torch's CUDA convolutions default to TF32 (cuDNN's allow_tf32); tilewise's fp32 GEMMs do not: compare fp32 to fp32
torch.backends.cudnn.allow_tf32 = False
torch.backends.cuda.matmul.allow_tf32 = False
TORCH_2_13 = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2]) >= (2, 13)
# lp_pool's p=inf branch (older torch computes inf ** (1/inf)); aminmax's kept dims without a dim (older: 0-d)
NEEDS_TORCH_2_13 = {"lp_pool1d", "lp_pool2d", "lp_pool3d", "aminmax"}


# ---------------------------------------------------------------------------------------------- op table

# operators whose complex samples tilewise refuses on CUDA by name (NotImplementedError: "complex inputs are not
# supported yet on CUDA"), where torch's cuSOLVER path takes them; their real samples are compared
CUDA_REFUSES_COMPLEX = {"geqrf", "ormqr", "linalg.ldl_solve"}  # ldl_solve's samples are factored on the device
# torch.embedding_bag's auxiliary outputs: torch's CUDA kernel fills offset2bag and bag_size in every mode, its CPU
# kernel (which tilewise follows on every device) leaves them empty in sum mode; the bags themselves are compared
CUDA_FIRST_OUTPUT_ONLY = {"embedding_bag"}


def _has_complex(sample) -> bool:
    return any((isinstance(a, T) and a.kind == "complex") or (isinstance(a, np.ndarray) and np.iscomplexobj(a))
               for a in sample.args)


@pytest.mark.parametrize("info,dtype", CASES, ids=[f"{i.name}-{d}" for i, d in CASES])
def test_op_matches_torch_on_cuda(info, dtype):
    if info.name in NEEDS_TORCH_2_13 and not TORCH_2_13:
        pytest.skip(f"torch {torch.__version__} predates the behaviour tilewise follows (torch 2.13's)")
    if info.name in CUDA_FIRST_OUTPUT_ONLY and info.output_index is None:
        info = dataclasses.replace(info, output_index=0)
    for sample in info.samples():
        if info.name in CUDA_REFUSES_COMPLEX and _has_complex(sample):
            continue
        for seed in (0, 1):
            check_op(info, sample, dtype, seed, noncontiguous=False, device="cuda")
        if info.noncontiguous:
            check_op(info, sample, dtype, 2, noncontiguous=True, device="cuda")


def _rand(shape, dtype="float32", seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


@pytest.mark.parametrize("name", ["add", "mul", "exp", "maximum", "where"])
def test_pointwise_on_device_strided_views(name):
    a, b = _rand((64, 48)), _rand((48, 64), seed=1)
    x, y = tw.from_numpy(a).cuda(), tw.from_numpy(b).cuda()
    xt, yt = x[::2, 1:], y.t()[::2, 1:]  # strided views, made on the device
    an, bn = a[::2, 1:], b.T[::2, 1:]
    fns = {"add": (lambda p, q: p + q, np.add), "mul": (lambda p, q: p * q, np.multiply),
           "exp": (lambda p, q: p.exp(), lambda p, q: np.exp(p)), "maximum": (tw.maximum, np.maximum),
           "where": (lambda p, q: tw.where(p > 0, p, q), lambda p, q: np.where(p > 0, p, q))}
    ours, ref = fns[name]
    np.testing.assert_allclose(ours(xt, yt).cpu().numpy(), ref(an, bn), rtol=1e-6, atol=1e-6)


# ---------------------------------------------------------------------------------------------- transfers and casts

@pytest.mark.parametrize("dtype", [d.name for d in tw.dtypes.ALL])
def test_round_trip_every_dtype(dtype):
    base = _rand((3, 5, 7)) * 4
    if dtype == "float4_e2m1fn_x2":  # packed FP4 converts to nothing (as in torch): its bytes, viewed
        host = tw.from_numpy(np.arange(105, dtype=np.uint8).reshape(3, 5, 7)).view(tw.float4_e2m1fn_x2)
    else:
        host = tw.from_numpy(base).to(tw.dtypes.from_name(dtype))
    back = host.cuda().cpu()
    assert back.dtype is host.dtype
    np.testing.assert_array_equal(back.numpy().view(np.uint8), host.numpy().view(np.uint8))


@pytest.mark.parametrize("src", ["float32", "float64", "float16", "bfloat16", "int64", "int32", "uint8", "bool",
                                 "float8_e4m3fn", "float8_e5m2"])
@pytest.mark.parametrize("dst", ["float32", "float64", "float16", "bfloat16", "int64", "int8", "bool",
                                 "float8_e4m3fn", "float8_e5m2"])
def test_casts_match_the_cpu(src, dst):
    values = (_rand((257,)) * 30).clip(-100, 100)
    host = tw.from_numpy(values).to(tw.dtypes.from_name(src))
    if src in ("uint8",) or dst in ("int8",):
        host = host.abs()
    expected = host.to(tw.dtypes.from_name(dst)).numpy()
    got = host.cuda().to(tw.dtypes.from_name(dst)).cpu().numpy()
    np.testing.assert_array_equal(got.view(np.uint8), expected.view(np.uint8))


def test_fp8_saturating_cast():
    from tilewise.backends.cuda.kernels.copy import cast

    x = tw.tensor([1000.0, -1000.0, 1.0, 500.0, float("inf")], device="cuda")
    e4m3 = x.to(tw.float8_e4m3fn).float().cpu().numpy()
    np.testing.assert_array_equal(e4m3, x.cpu().to(tw.float8_e4m3fn).float().numpy())  # as torch: saturates
    np.testing.assert_array_equal(e4m3, [448.0, -448.0, 1.0, 448.0, 448.0])
    assert np.isinf(x.to(tw.float8_e5m2).float().cpu().numpy()[4])
    big = tw.tensor([1e6, -1e6], device="cuda")
    np.testing.assert_array_equal(cast(big, tw.float8_e5m2, saturate=True).float().cpu().numpy(), [57344.0, -57344.0])


def _e5m2_edges() -> np.ndarray:
    """Every float16 value (e5m2's values and every midpoint between two of them among them), the floats just
    beside each midpoint, and the overflow edge: where the conversion instruction and the library's
    non-saturating path part ([Note: float8 conversions])."""
    halves = np.arange(65536, dtype=np.uint16).view(np.float16).astype(np.float32)
    edges = np.array([57344, 59392, 61440, 65504, 1e6, 3e38], dtype=np.float32)
    with np.errstate(invalid="ignore"):
        near = np.concatenate([np.nextafter(halves, np.float32(np.inf)), np.nextafter(halves, np.float32(-np.inf)),
                               np.nextafter(edges, np.float32(-np.inf)), edges, -edges])
    return np.concatenate([halves, near]).astype(np.float32)


@pytest.mark.parametrize("dtype, saturate", [("float8_e5m2", False), ("float8_e5m2", True), ("float8_e4m3fn", False)])
def test_fp8_casts_match_the_cpu_at_every_rounding_edge(dtype, saturate):
    """Bit for bit the CPU's casts, which are torch's (``test_dtypes.py`` checks them against the pinned torch:
    older torch builds, 2.11 among them, turn e4m3fn values from 464 up into NaN)."""
    from tilewise.backends.cuda.kernels.copy import cast

    dtype = tw.dtypes.from_name(dtype)
    values = _e5m2_edges()
    host = tw.from_numpy(values)
    expected = (host.clamp(-57344, 57344) if saturate else host).to(dtype)
    got = cast(host.cuda(), dtype, saturate=True) if saturate else host.cuda().to(dtype)
    results = {"cuda": got}
    if not saturate:  # a pure cast (arithmetic on the GPU would make every NaN the canonical, positive one)
        results["compiled"] = tw.compile(lambda x: x.to(dtype))(host.cuda())
    want = expected.view(tw.uint8).numpy()
    for which, result in results.items():
        bits = result.cpu().view(tw.uint8).numpy()
        bad = np.flatnonzero(bits != want)[:8]
        assert not bad.size, (which, values.view(np.uint32)[bad], bits[bad], want[bad])


def test_non_contiguous_copies_stay_on_the_device():
    a = _rand((32, 16, 8))
    x = tw.from_numpy(a).cuda()
    y = x.permute(2, 0, 1).contiguous()
    assert y.is_cuda and y.is_contiguous()
    np.testing.assert_array_equal(y.cpu().numpy(), a.transpose(2, 0, 1))
    z = tw.zeros(16, 32, device="cuda")
    z[:, ::2] = x[:, :, 0].t()[:, :16]
    np.testing.assert_array_equal(z.cpu().numpy()[:, ::2], a[:, :, 0].T[:, :16])


def test_non_blocking_from_pinned_memory():
    from tilewise.backends.cuda import pin_memory

    a = _rand((1024, 256))
    pinned = pin_memory(tw.from_numpy(a))
    x = pinned.to("cuda", non_blocking=True)
    back = x.to("cpu", non_blocking=True)
    tw.cuda.synchronize()
    np.testing.assert_array_equal(back.numpy(), a)


def test_clone_keeps_dense_layout():
    x = tw.from_numpy(_rand((4, 6))).cuda().t()
    y = x.clone()
    assert y.stride() == x.stride()
    np.testing.assert_array_equal(y.cpu().numpy(), x.cpu().numpy())


# ---------------------------------------------------------------------------------------------- random

@pytest.mark.parametrize("draw", ["rand32", "rand64", "randn32", "randn64", "randn16", "randint", "randint64",
                                  "uniform", "bernoulli"])
def test_philox_bit_identical_to_cpu(draw):
    def make(device):
        tw.manual_seed(1234)
        if draw == "rand32":
            return tw.rand(1001, device=device)
        if draw == "rand64":
            return tw.rand(1001, dtype=tw.float64, device=device)
        if draw == "randn32":
            return tw.randn(3, 333, device=device)
        if draw == "randn64":
            return tw.randn(1001, dtype=tw.float64, device=device)
        if draw == "randn16":
            return tw.randn(1001, dtype=tw.bfloat16, device=device)
        if draw == "randint":
            return tw.randint(-7, 90, (1001,), device=device)
        if draw == "randint64":
            return tw.randint(-(2**40), 2**41, (1001,), device=device)
        if draw == "uniform":
            from tilewise.ops.registry import OPS

            return OPS["uniform"]((999,), -3.0, 5.0, dtype=tw.float32, device=tw.device(device))
        return tw.bernoulli(tw.full((1001,), 0.3, device=device))

    on_cpu, on_gpu = make("cpu"), make("cuda")
    np.testing.assert_array_equal(on_gpu.cpu().numpy().view(np.uint8), on_cpu.numpy().view(np.uint8))


# ---------------------------------------------------------------------------------------------- reductions

@pytest.mark.parametrize("shape,dim", [((1 << 22,), None), ((4096, 3000), 1), ((3000, 4096), 0), ((64, 50000), 1),
                                       ((50000, 3), 1), ((16, 32, 64), (0, 2)), ((8, 1 << 16), 0),
                                       (((1 << 22) + 3,), None), ((100, 1001), 1)])
def test_large_reductions(shape, dim):
    a = _rand(shape)
    x = tw.from_numpy(a).cuda()
    np.testing.assert_allclose(x.sum(dim).cpu().numpy(), a.astype(np.float64).sum(axis=dim), rtol=1e-4, atol=1e-2)
    np.testing.assert_array_equal(x.amax(dim).cpu().numpy(), a.max(axis=dim))
    if dim is None or isinstance(dim, int):
        np.testing.assert_array_equal(x.argmax(dim).cpu().numpy(), a.argmax(axis=dim))


@pytest.mark.parametrize("shape,dim", [((5000,), 0), ((7, 300), 1), ((300, 7), 0), ((3, 4, 100), 2)])
def test_scans_match_numpy(shape, dim):
    a = _rand(shape)
    x = tw.from_numpy(a).cuda()
    np.testing.assert_allclose(x.cumsum(dim).cpu().numpy(), np.cumsum(a.astype(np.float64), axis=dim), rtol=1e-4,
                               atol=1e-3)
    b = (a > 0).astype(np.int32)
    np.testing.assert_array_equal(tw.from_numpy(b).cuda().cumsum(dim).cpu().numpy(), np.cumsum(b, axis=dim))
    c = np.abs(a[..., :20] if dim == len(shape) - 1 else a).clip(0.5, 1.5)
    np.testing.assert_allclose(tw.from_numpy(c).cuda().cumprod(dim).cpu().numpy(), np.cumprod(c, axis=dim),
                               rtol=1e-4)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_row_reductions(dtype):
    a = _rand((512, 4096))
    x = tw.from_numpy(a).cuda().to(tw.dtypes.from_name(dtype))
    ref = x.float().cpu().numpy()
    np.testing.assert_allclose(x.sum(1).float().cpu().numpy(), ref.astype(np.float64).sum(1), rtol=2e-2, atol=0.5)
    np.testing.assert_array_equal(x.amax(1).float().cpu().numpy(), ref.max(1))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16", "float64"])
def test_max_and_min_propagate_nan(dtype):
    """NaN wins in maximum/minimum and in amax/amin, on every path: pointwise, rows read with 16-byte loads
    (one NaN per row at every position of a load), strided rows, columns, and a whole tensor."""
    rows = np.zeros((16, 256), np.float32)
    rows[np.arange(16), np.arange(16) * 17 % 256] = np.nan
    rows[0] = -np.inf
    rows[1, :] = np.nan
    a = np.concatenate([_rand((48, 256)), rows + _rand((16, 256), seed=1)])
    b = _rand((64, 256), seed=2)
    b[::5, ::7] = np.nan
    x = tw.from_numpy(a).cuda().to(tw.dtypes.from_name(dtype))
    y = tw.from_numpy(b).cuda().to(tw.dtypes.from_name(dtype))
    xa, ya = x.double().cpu().numpy(), y.double().cpu().numpy()
    cases = [(tw.maximum(x, y), np.maximum(xa, ya)), (tw.minimum(x, y), np.minimum(xa, ya)),
             (x.amax(1), xa.max(1)), (x.amin(1), xa.min(1)), (x[:, ::2].amax(1), xa[:, ::2].max(1)),
             (x.amax(0), xa.max(0)), (x.amin(0), xa.min(0)), (x.amax(), xa.max()), (y.amin(), ya.min())]
    for got, want in cases:
        np.testing.assert_array_equal(got.double().cpu().numpy(), want)


def test_bf16_sum_accumulates_in_float():
    x = tw.ones(1 << 20, dtype=tw.bfloat16, device="cuda")
    assert float(x.sum(dtype=tw.float32).item()) == float(1 << 20)


# ---------------------------------------------------------------------------------------------- GEMM

@pytest.mark.parametrize("dtype,tol", [("float32", 1e-4), ("float16", 1e-2), ("bfloat16", 2e-2), ("float64", 1e-10)])
@pytest.mark.parametrize("shape", [(64, 48, 80), (1, 128, 7), (257, 129, 65)])
@pytest.mark.parametrize("layout", ["nn", "nt", "tn", "tt"])
def test_mm_layouts_match_torch(dtype, tol, shape, layout):
    import torch

    m, k, n = shape
    a = _rand((m, k) if layout[0] == "n" else (k, m))
    b = _rand((k, n) if layout[1] == "n" else (n, k), seed=1)
    ta, tb = torch.from_numpy(a).cuda().to(getattr(torch, dtype)), torch.from_numpy(b).cuda().to(getattr(torch, dtype))
    ours = tw.dtypes.from_name(dtype)
    xa, xb = tw.from_numpy(a).cuda().to(ours), tw.from_numpy(b).cuda().to(ours)
    if layout[0] == "t":
        ta, xa = ta.t(), xa.t()
    if layout[1] == "t":
        tb, xb = tb.t(), xb.t()
    expected = (ta.double() @ tb.double()).cpu().numpy()
    got = (xa @ xb).double().cpu().numpy()
    assert np.linalg.norm(got - expected) / max(np.linalg.norm(expected), 1e-30) < tol


def test_bmm_strided_and_broadcast_batches():
    a, b = _rand((4, 33, 17)), _rand((17, 29), seed=1)
    x, y = tw.from_numpy(a).cuda(), tw.from_numpy(b).cuda()
    np.testing.assert_allclose((x @ y).cpu().numpy(), a @ b, rtol=1e-4, atol=1e-4)
    w = tw.from_numpy(_rand((4, 29, 17), seed=2)).cuda()
    np.testing.assert_allclose(x.bmm(w.transpose(1, 2)).cpu().numpy(), a @ w.cpu().numpy().transpose(0, 2, 1),
                               rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("activation", ["none", "relu", "gelu"])
def test_linear_epilogues(activation):
    from tilewise.backends.cuda.matmul import linear_activation

    x, w, bias = _rand((96, 64)), _rand((48, 64), seed=1), _rand((48,), seed=2)
    got = linear_activation(tw.from_numpy(x).cuda(), tw.from_numpy(w).cuda(), tw.from_numpy(bias).cuda(), activation)
    ref = x @ w.T + bias
    if activation == "relu":
        ref = np.maximum(ref, 0)
    elif activation == "gelu":
        ref = 0.5 * ref * (1 + np.tanh(np.sqrt(2 / np.pi) * (ref + 0.044715 * ref**3)))
    np.testing.assert_allclose(got.cpu().numpy(), ref, rtol=1e-3, atol=1e-3)


# ---------------------------------------------------------------------------------------------- autograd, nn, optim

def _train_small_mlp(device, make_optimizer, steps: int, clip: float | None = None):
    """Losses, final parameters and optimizer of a few classification steps of a small MLP on ``device``."""
    tw.manual_seed(0)
    model = tw.nn.Sequential(tw.nn.Linear(16, 32), tw.nn.GELU(), tw.nn.Linear(32, 4)).to(device)
    opt, sched = make_optimizer(model.parameters())
    x = tw.from_numpy(_rand((8, 16))).to(device)
    target = tw.from_numpy(np.arange(8) % 4).to(device)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = tw.nn.functional.cross_entropy(model(x), target)
        loss.backward()
        if clip is not None:
            tw.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        if sched is not None:
            sched.step()
        losses.append(float(loss.item()))
    return losses, [p.detach().cpu().numpy() for p in model.parameters()], opt


def _assert_same_training(ours, reference):
    np.testing.assert_allclose(ours[0], reference[0], rtol=1e-4)
    for p, q in zip(ours[1], reference[1]):
        np.testing.assert_allclose(p, q, rtol=1e-4, atol=1e-5)


def test_training_step_matches_cpu():
    def sgd(params):
        return tw.optim.SGD(params, lr=0.1, momentum=0.9), None

    _assert_same_training(_train_small_mlp("cuda", sgd, 3), _train_small_mlp("cpu", sgd, 3))


def test_adamw_and_clipping_on_cuda_run_compiled_and_match_the_cpu_loop():
    """On CUDA the default (foreach=None) updates each group and clips all gradients by compiled programs."""
    def adamw(params):
        opt = tw.optim.AdamW(params, lr=0.01)
        return opt, tw.optim.lr_scheduler.CosineAnnealingLR(opt, 4)

    cpu = _train_small_mlp("cpu", adamw, 4, clip=0.5)
    gpu = _train_small_mlp("cuda", adamw, 4, clip=0.5)
    assert not getattr(cpu[2], "_programs", None)
    (program,) = gpu[2]._programs.values()
    assert len(program.variants) == 1 and program.eager_reason is None
    _assert_same_training(gpu, cpu)


def test_gradient_of_device_transfer_lands_on_the_leaf_device():
    x = tw.from_numpy(_rand((3, 4))).requires_grad_(True)
    (x.cuda() * 2).sum().backward()
    assert x.grad.device == tw.device("cpu")
    np.testing.assert_array_equal(x.grad.numpy(), np.full((3, 4), 2, np.float32))


# ---------------------------------------------------------------------------------------------- runtime surface

def test_memory_statistics_follow_tensors():
    tw.cuda.synchronize()
    before = tw.cuda.memory_allocated()
    x = tw.empty(1 << 20, device="cuda")
    assert tw.cuda.memory_allocated() - before >= 4 << 20
    assert tw.cuda.max_memory_allocated() >= tw.cuda.memory_allocated()
    del x
    assert tw.cuda.memory_allocated() == before
    assert tw.cuda.memory_reserved() >= tw.cuda.memory_allocated()
    assert "allocated_bytes.current" in tw.cuda.memory_stats()


def test_in_place_ops_write_into_their_target():
    """With nothing to record, a pointwise in-place op writes its target directly: no temporary of its size."""
    x = tw.ones(1 << 24, device="cuda")  # 64 MiB
    tw.cuda.synchronize()
    before = tw.cuda.memory_allocated()
    tw.cuda.reset_peak_memory_stats()
    x.mul_(3).add_(x, alpha=0.5).clamp_(max=4.0)
    tw.cuda.synchronize()
    assert tw.cuda.max_memory_allocated() - before < 1 << 20
    assert float(x[123].item()) == 4.0 and x._version == 3


def test_recorded_in_place_activations_write_into_their_target():
    """An in-place activation that autograd records (a ResNet's ``ReLU(inplace=True)``) writes its target directly
    too: no temporary of its size, and the gradient through the written target is right."""
    w = tw.full((1 << 24,), -1.0, device="cuda").requires_grad_()
    y = w * 2  # 64 MiB
    tw.cuda.synchronize()
    before = tw.cuda.memory_allocated()
    tw.cuda.reset_peak_memory_stats()
    storage = y._storage
    y.relu_()
    tw.cuda.synchronize()
    assert tw.cuda.max_memory_allocated() - before < 1 << 20
    assert y._storage is storage and y._version == 1 and y.grad_fn is not None
    (y + w).sum().backward()
    assert float(w.grad[7].item()) == 1.0  # relu's gradient is 0 at -2: only the sum's path remains


@pytest.mark.parametrize("case", ["self", "transpose", "overlap", "offset", "broadcast", "cast", "expanded",
                                  "requires_grad", "alpha"])
def test_in_place_ops_match_their_out_of_place_form(case):
    a = _rand((33, 33))
    b = _rand((33,), seed=1)
    x = tw.from_numpy(a.copy()).cuda()
    if case == "self":
        x.add_(x)
        ref = a + a
    elif case == "transpose":
        x.sub_(x.t())
        ref = a - a.T
    elif case == "overlap":  # reads what the same call writes, one row down: computed as out of place
        x[1:].add_(x[:-1])
        ref = a.copy()
        ref[1:] = a[1:] + a[:-1]
    elif case == "offset":  # a target not 16-byte aligned
        flat = x.view(-1)[1:]
        flat.mul_(2.0)
        ref = a.reshape(-1).copy()
        ref[1:] *= 2
        ref = ref.reshape(33, 33)
    elif case == "broadcast":
        x.mul_(tw.from_numpy(b).cuda())
        ref = a * b
    elif case == "cast":  # a float32 0-dim tensor does not promote a bfloat16 target
        x = x.to(tw.bfloat16)
        x.mul_(tw.tensor(0.5, device="cuda"))
        ref = (a.astype(np.float32) * 0.5)
        np.testing.assert_allclose(x.float().cpu().numpy(), ref, rtol=1e-2, atol=1e-2)
        assert x.dtype == tw.bfloat16
        return
    elif case == "expanded":  # a target whose rows share memory: refused, as torch refuses it
        e = tw.from_numpy(b).cuda().expand(33, 33)
        with pytest.raises(RuntimeError, match="more than one element of the written-to tensor"):
            e.add_(1.0)
        return
    elif case == "requires_grad":  # recorded: the node is the new history, gradients flow
        leaf = tw.from_numpy(a.copy()).cuda().requires_grad_()
        y = leaf * 1.0
        y.mul_(leaf)
        y.sum().backward()
        np.testing.assert_allclose(leaf.grad.cpu().numpy(), 2 * a, rtol=1e-5, atol=1e-6)
        return
    else:
        x.add_(tw.from_numpy(b).cuda(), alpha=-2.0)
        ref = a - 2.0 * b
    np.testing.assert_allclose(x.cpu().numpy(), ref, rtol=1e-6, atol=1e-6)


def test_out_of_memory_is_recoverable():
    total = tw.cuda.get_device_properties().total_memory
    with pytest.raises(tw.cuda.OutOfMemoryError) as caught:
        tw.empty(total // 2, dtype=tw.float64, device="cuda")  # 4x the device
    err = caught.value
    assert err.requested >= total and "reserved" in str(err) and "fragmented" in str(err)
    held = []
    with pytest.raises(tw.cuda.OutOfMemoryError):
        for _ in range(4096):
            held.append(tw.empty(1 << 30, dtype=tw.uint8, device="cuda"))
    assert len(held) > 4
    held.clear()
    tw.cuda.empty_cache()
    y = tw.ones(1 << 28, dtype=tw.uint8, device="cuda")
    assert int(y.sum().item()) == 1 << 28


def test_streams_order_work():
    s = tw.cuda.Stream()
    x = tw.ones(1 << 20, device="cuda")
    s.wait_stream(tw.cuda.current_stream())  # s does not order with the default stream by itself
    with tw.cuda.stream(s):
        y = x * 3
    s.synchronize()
    assert float(y.sum().item()) == 3.0 * (1 << 20)


def test_kernel_log_shows_source_and_launch():
    code = "import tilewise as tw; x = tw.ones(7, device='cuda'); (x * 3 + 1).cpu()"
    env = {**os.environ, "TILEWISE_LOG": "kernels"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "[tilewise:kernels]" in out.stderr and "grid=" in out.stderr and "__global__" in out.stderr


def test_numpy_conversion_of_a_device_tensor_is_refused_as_torch_refuses_it():
    t = tw.ones(2, device="cuda")
    with pytest.raises(TypeError, match="can't convert cuda:0 tensor to numpy"):
        np.asarray(t)
    np.testing.assert_array_equal(np.asarray(t.cpu()), [1.0, 1.0])
    scalars = [tw.tensor(1.5, device="cuda"), tw.tensor(2.0, device="cuda")]
    assert tw.tensor(scalars).tolist() == [1.5, 2.0]  # numbers read from each, as torch reads them


@pytest.mark.parametrize("make", [
    lambda d: tw.ones(3, 2, dtype=tw.complex64, device=d),
    lambda d: tw.zeros(3, dtype=tw.complex128, device=d),
    lambda d: tw.full((2, 3), 2 + 1j, device=d),
    lambda d: tw.full((4,), -1.5, dtype=tw.complex64, device=d),
    lambda d: tw.ones_like(tw.zeros(3, 1, dtype=tw.complex64, device=d)),
    lambda d: tw.full_like(tw.zeros(3, dtype=tw.complex64, device=d), 1j),
    lambda d: tw.zeros(3, dtype=tw.complex64, device=d).fill_(3 - 2j),
    lambda d: tw.zeros(2, 3, dtype=tw.complex64, device=d).t().fill_(1 + 1j),
    lambda d: tw.linalg.vander(tw.tensor([1 + 1j, 2 - 1j, 0.5j], device=d), N=4),
], ids=["ones", "zeros", "full-complex-value", "full-real-value", "ones_like", "full_like", "fill_", "fill_-strided",
        "vander"])
def test_complex_factories_and_fills_match_the_cpu(make):
    """A complex factory on CUDA returned its imaginary parts as a real tensor (``fill`` handed back the last part's
    view): dtype and values must be the CPU's."""
    got, want = make("cuda"), make("cpu")
    assert got.dtype == want.dtype and got.shape == want.shape and got.stride() == want.stride()
    np.testing.assert_array_equal(got.cpu().numpy(), want.numpy())

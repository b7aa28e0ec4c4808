"""The CUDA target's channels-last lowering (``compiler/lowering/channels_last.py``) checked on the CPU: the C
target is given the same stages (convolutions kept whole, then the lowering), and a convolution + batch norm +
ReLU training step must give eager's gradients. The sizes include a channel count equal to the image side,
where a value in (N, H, W, C) order beside a nest over (N, C, H, W) once took H for C."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import tilewise as tw
import tilewise.nn as nn
import tilewise.nn.functional as F
from tilewise.compiler import targets
from tilewise.compiler.lowering.channels_last import CONVOLUTIONS, channels_last
from tilewise.compiler.passes import decompose


@pytest.fixture
def channels_last_c_target(monkeypatch):
    def keep_convolutions(graph):
        return decompose(graph, lambda op, args: op in CONVOLUTIONS)

    keep_convolutions.__name__ = "decompose"
    target = dataclasses.replace(
        targets.C_TARGET, passes=tuple(keep_convolutions if p.__name__ == "decompose" else p
                                       for p in targets.C_TARGET.passes),
        lowering=(("channels_last", channels_last),))
    monkeypatch.setitem(targets.TARGETS, "c", target)
    return target


@pytest.mark.parametrize("channels,side", [(8, 8), (4, 8), (6, 10)])
def test_channels_last_lowering_keeps_a_conv_bn_relu_step_exact(channels_last_c_target, channels, side):
    tw.manual_seed(0)
    conv, bn = nn.Conv2d(channels, channels, 3, padding=1, bias=False), nn.BatchNorm2d(channels)
    conv2 = nn.Conv2d(channels, channels, 1, bias=False)
    params = [conv.weight, bn.weight, bn.bias, conv2.weight]
    start = [p.detach().clone() for p in params]
    x = tw.randn(2, channels, side, side)

    def step(x):
        h = F.relu(bn(conv(x)))
        loss = (conv2(h) + h).square().mean()
        loss.backward()
        return loss.detach()

    def grads(fn):
        with tw.no_grad():
            for p, s in zip(params, start):
                p.copy_(s)
        for p in params:
            p.grad = None
        loss = fn(x)
        return float(loss.item()), [p.grad.numpy().copy() for p in params]

    loss, expected = grads(step)
    compiled = tw.compile(step)
    got_loss, got = grads(compiled)
    assert not compiled.eager_reason, compiled.eager_reason
    assert got_loss == pytest.approx(loss, rel=1e-5)
    for g, e in zip(got, expected):
        np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-5 * float(np.abs(e).max()))
    (program,) = [p for p in compiled.programs() if any("_channels_last" in s.describe() for s in p.steps)][:1]
    assert program is not None


def test_a_value_beside_a_transposed_convolution_is_read_in_its_own_order(channels_last_c_target):
    """``convT(h) * arange(...).sin()`` with C == H == W: the product is rebuilt channels-last and the sine
    (made in (N, C, H, W) order) was made again inside the product's nest by position. Group norm's reshape
    copies its input, which rebuilt every value after it: the lowering's marks must follow them."""
    tw.manual_seed(0)
    conv, gn = nn.Conv2d(8, 16, 3, padding=1, bias=False), nn.GroupNorm(8, 16)
    up = nn.ConvTranspose2d(16, 8, 2, stride=2)
    x = tw.randn(2, 8, 4, 4)

    def f(x):
        with tw.no_grad():
            out = up(gn(conv(x)))
            return out * tw.arange(out.numel()).reshape(out.shape).float().sin()

    compiled = tw.compile(f)
    got = compiled(x)
    assert not compiled.eager_reason, compiled.eager_reason
    np.testing.assert_allclose(got.numpy(), f(x).numpy(), rtol=1e-5, atol=1e-6)


def test_a_unet_step_under_bfloat16_autocast_keeps_eagers_gradients(channels_last_c_target):
    """A small UNet (group norm, SiLU, max pooling, transposed convolutions, skip concatenations) trained under
    bfloat16 autocast: casts around the convolutions are rebuilt channels-last too. Its gradients were off by
    their own size where a level's channel count equals its image side (8 channels at 8x8 here)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    try:
        import vision_models
    finally:
        sys.path.pop(0)
    tw.manual_seed(0)
    model = vision_models.UNet(3, num_classes=5, base=8, depth=2)
    rng = np.random.default_rng(0)
    x = tw.from_numpy(rng.standard_normal((2, 3, 8, 8), dtype=np.float32))
    y = tw.from_numpy(rng.integers(0, 5, (2, 8, 8)))
    start = {k: v.clone() for k, v in model.state_dict().items()}

    def step(x, y):
        with tw.autocast("cpu", dtype=tw.bfloat16):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        return loss.detach()

    def grads(fn):
        model.load_state_dict(start)
        for p in model.parameters():
            p.grad = None
        return float(fn(x, y).item()), {k: p.grad.numpy().copy() for k, p in model.named_parameters()}

    loss, expected = grads(step)
    compiled = tw.compile(step)
    got_loss, got = grads(compiled)
    assert not compiled.eager_reason, compiled.eager_reason
    assert got_loss == pytest.approx(loss, rel=1e-3)
    for name, e in expected.items():
        # bfloat16 rounds differently where a kernel fuses differently: a few parts in a hundred, not wrong values
        error = float(np.abs(got[name] - e).max() / (np.abs(e).max() + 1e-12))
        assert error < 0.05, (name, error)


def test_a_value_of_several_results_beside_a_convolution(channels_last_c_target):
    """An operator of two results (a tuple-typed node, as attention with its statistics in a ViT step) read from a
    convolution's output: the lowering passes it by (it once asked the tuple for its shape)."""
    tw.manual_seed(0)
    conv = nn.Conv2d(3, 8, 3, padding=1)
    x = tw.randn(2, 3, 6, 6)

    def f(x):
        with tw.no_grad():
            values, indices = conv(x).max(dim=1)
            return values * 2, indices

    compiled = tw.compile(f)
    got, want = compiled(x), f(x)
    assert not compiled.eager_reason, compiled.eager_reason
    np.testing.assert_allclose(got[0].numpy(), want[0].numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(got[1].numpy(), want[1].numpy())


def test_statistics_down_a_channels_last_tensors_channels_are_split_from_their_normalisation():
    """A batch norm's backward over channels-last arguments (a compiled backward's saved activations) reduces down
    the channels, which lie innermost in memory though not in the (N, C, H, W) shape: fused with its normalisation
    in phases it could not be split across blocks (2 blocks of a GPU for [64, 2048, 7, 7]), so the statistics are a
    kernel of their own and the normalisation an element-wise one; in (N, C, H, W) order the rows keep their
    phases together (split, ResNet-50's batch norms took up to twice as long on an H200)."""
    import torch

    def bn_backward_like(x, g):
        n = x.shape[0] * x.shape[2] * x.shape[3]
        s1 = g.sum((0, 2, 3), keepdim=True)
        s2 = (g * x).sum((0, 2, 3), keepdim=True)
        return g - s1 / n - x * s2 / n

    rng = np.random.default_rng(0)
    x, g = (rng.standard_normal((32, 64, 7, 7)).astype(np.float32) for _ in range(2))
    want = bn_backward_like(torch.from_numpy(x), torch.from_numpy(g)).numpy()
    for fmt, kernels in ((tw.contiguous_format, 1), (tw.channels_last, 2)):
        f = tw.compile(bn_backward_like)
        got = f(tw.from_numpy(x).to(memory_format=fmt), tw.from_numpy(g).to(memory_format=fmt))
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-4, atol=1e-5)
        program, = f.programs()
        assert program.kernel_count == kernels, (fmt, program.describe())


def test_a_compiled_function_returns_tensors_in_the_memory_format_eager_gives_them():
    """Element-wise operators, convolutions, normalisations, pooling, interpolation and cat keep a channels-last
    input's format in eager (as in torch); a softmax does not. A compiled function returns its results laid out the
    same way (where they need no gradient), with the same values, not as views."""
    import torch

    def f(lib, x, w, w2):
        fn = lib.nn.functional
        y = fn.conv2d(x, w, padding=1)
        y = fn.batch_norm(y, None, None, training=True).relu()
        z = fn.max_pool2d(y, 2) + 1
        u = fn.interpolate(z, scale_factor=2)
        g = fn.group_norm(u, 2)
        c = lib.cat([u, g], 1)
        return (y, z, u, g, c, fn.conv_transpose2d(c, w2), fn.avg_pool2d(y, 2), y.double(),
                lib.where(y > 0, y, 0.0), y.softmax(1), y.contiguous(), y * lib.ones(4, 8, 8))

    rng = np.random.default_rng(0)
    xs, ws, w2s = (rng.standard_normal(s).astype(np.float32) for s in ((2, 4, 8, 8), (4, 4, 3, 3), (8, 2, 2, 2)))

    def channels_last(t, lib):
        return t.dim() == 4 and t.is_contiguous(memory_format=lib.channels_last) and not t.is_contiguous()

    tx = torch.from_numpy(xs).contiguous(memory_format=torch.channels_last)
    tw_ = torch.from_numpy(ws).contiguous(memory_format=torch.channels_last)
    want = [channels_last(t, torch) for t in f(torch, tx, tw_, torch.from_numpy(w2s))]
    x = tw.from_numpy(xs).to(memory_format=tw.channels_last)
    w = tw.from_numpy(ws).to(memory_format=tw.channels_last)
    w2 = tw.from_numpy(w2s)
    eager = f(tw, x, w, w2)
    assert [channels_last(t, tw) for t in eager] == want
    compiled = tw.compile(lambda x, w, w2: f(tw, x, w, w2))
    for _ in range(2):  # the first call and the variant's replay
        got = compiled(x, w, w2)
        assert [channels_last(t, tw) for t in got] == want
        for g, e in zip(got, eager):
            assert g._base is None and tuple(g.shape) == tuple(e.shape)
            np.testing.assert_allclose(g.numpy(), e.numpy(), rtol=1e-5, atol=1e-5)
    # a result that needs a gradient too, with eager's values and gradients, whatever layout its gradient comes in
    g = rng.standard_normal((2, 4, 8, 8)).astype(np.float32)
    compiled = tw.compile(lambda x, w: tw.nn.functional.conv2d(x, w, padding=1).relu() * 2)
    for layout in (tw.channels_last, tw.contiguous_format, tw.channels_last):
        xg = x.clone().requires_grad_()
        out = compiled(xg, w)
        ref_x = x.clone().requires_grad_()
        ref = tw.nn.functional.conv2d(ref_x, w, padding=1).relu() * 2
        assert channels_last(out, tw) and channels_last(ref, tw)
        np.testing.assert_allclose(out.detach().numpy(), ref.detach().numpy(), rtol=1e-5, atol=1e-5)
        out.backward(tw.from_numpy(g).to(memory_format=layout))
        ref.backward(tw.from_numpy(g))
        np.testing.assert_allclose(xg.grad.numpy(), ref_x.grad.numpy(), rtol=1e-5, atol=1e-5)


def _results_in_other_orders(lib, x, y):
    t = x.transpose(1, 2)
    return (x.t() + 1 if x.dim() == 2 else t * 2, y.permute(2, 0, 1).exp(), y.transpose(0, 2).sin() + y.transpose(0, 2),
            y.permute(1, 2, 0)[:, :1] * 3, lib.where(t > 0, t, 0.0), t.clone(), t.contiguous(), (t * 2)[:, 1:])


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
@pytest.mark.parametrize("shape", [(3, 4), (2, 3, 4), (3, 1)])
def test_a_compiled_function_returns_results_in_the_dense_order_eager_gives_them(shape, device):
    """An element-wise result of a transposed or permuted operand is laid out in that operand's order in eager (as in
    torch): a transposed matrix's is column-major. A compiled function returns it with the same strides (a slice of an
    intermediate, which has no dense layout, as eager's view of that intermediate's memory), and gradients as
    eager's."""
    import torch

    rng = np.random.default_rng(0)
    xs = rng.standard_normal(shape).astype(np.float32)
    xs3 = xs if len(shape) == 3 else xs.reshape(1, *shape)
    ys = rng.standard_normal((2, 3, 5)).astype(np.float32)
    want = [(t.stride(), t.storage_offset())
            for t in _results_in_other_orders(torch, torch.from_numpy(xs3), torch.from_numpy(ys))]
    x, y = tw.from_numpy(xs3).to(device), tw.from_numpy(ys).to(device)
    eager = _results_in_other_orders(tw, x, y)
    assert [(t.stride(), t.storage_offset()) for t in eager] == want
    compiled = tw.compile(lambda x, y: _results_in_other_orders(tw, x, y))
    for _ in range(2):  # the first call and the variant's replay
        got = compiled(x, y)
        assert [(t.stride(), t.storage_offset()) for t in got] == want
        for g, e in zip(got, eager):
            np.testing.assert_allclose(g.cpu().numpy(), e.cpu().numpy(), rtol=1e-6, atol=1e-6)
    g = rng.standard_normal(shape[::-1]).astype(np.float32)
    f = tw.compile(lambda x: (x.transpose(0, -1) * 2).sin())
    for _ in range(2):
        xg, ref_x = (tw.from_numpy(xs).to(device).requires_grad_() for _ in range(2))
        out, ref = f(xg), (ref_x.transpose(0, -1) * 2).sin()
        assert out.stride() == ref.stride() == torch.from_numpy(xs).transpose(0, -1).sin().stride()
        out.backward(tw.from_numpy(g).to(device))
        ref.backward(tw.from_numpy(g).to(device))
        np.testing.assert_allclose(xg.grad.cpu().numpy(), ref_x.grad.cpu().numpy(), rtol=1e-6, atol=1e-6)


def _layouts(lib, x, w, z):
    """What ``stride()``, ``storage_offset()`` and ``is_contiguous()`` say of intermediate results: transposes and
    element-wise operators on them, a channels-last convolution, batch norm and ReLU, and views of those."""
    fn = lib.nn.functional
    seen = {}

    def note(name, t):
        seen[name] = (tuple(t.stride()), t.storage_offset(), t.is_contiguous(), t.stride(-1))

    t = x.transpose(1, 2)
    note("transpose", t)
    note("transpose * 2", t * 2)
    note("transpose + transpose", t + t)
    note("transpose.exp()", t.exp())
    note("transpose.clone()", t.clone())
    note("transpose.contiguous()", t.contiguous())
    note("gelu(transpose)", fn.gelu(t))
    c = fn.conv2d(x.contiguous(memory_format=lib.channels_last), w)
    note("conv", c)
    b = fn.batch_norm(c, None, None, training=True)
    note("batch_norm", b)
    r = fn.relu(b)
    note("relu", r)
    note("permute", r.permute(0, 2, 3, 1))
    note("slice", r[:, :, 1:])
    note("slice * 2", r[:, :, 1:] * 2)
    note("select", r[1])
    note("transpose of relu", r.transpose(2, 3))
    note("flatten", r.flatten(2))
    note("reshape", r.reshape(2, -1))
    note("cat", lib.cat([r, r], 1))
    note("softmax", fn.softmax(r, 1))
    note("sum", r.sum(1))
    note("as_strided of its own geometry", r.as_strided(r.shape, r.stride()))
    note("matmul of a transpose", z.t() @ z)
    note("transpose + 1", z.t() + 1)
    note("expand * 2", z[:1].expand(4, 3) * 2)
    note("zeros_like", lib.zeros_like(r))
    note("empty_like of a transpose", lib.empty_like(z.t() + 1))
    return seen


def test_strides_of_traced_values_are_eagers():
    """Inside a compiled function, ``stride()`` (and ``storage_offset()``, ``is_contiguous()``) of a traced value
    answer what eager answers for the same computation (and torch): a channels-last result's strides, an element-wise
    result in its operand's order, a view's own geometry over them."""
    import torch

    rng = np.random.default_rng(0)
    xs, ws, zs = (rng.standard_normal(s).astype(np.float32) for s in ((2, 3, 5, 4), (6, 3, 3, 3), (4, 3)))
    want = _layouts(torch, *(torch.from_numpy(a) for a in (xs, ws, zs)))
    args = [tw.from_numpy(a) for a in (xs, ws, zs)]
    assert _layouts(tw, *args) == want
    compiled = tw.compile(lambda x, w, z: _layouts(tw, x, w, z))
    for _ in range(2):
        got = compiled(*args)
        assert {k: v for k, v in got.items() if v != want[k]} == {}


def test_views_and_as_strided_of_a_channels_last_intermediate_read_eagers_values():
    """A traced channels-last value answers with channels-last strides, so ``as_strided`` over its memory and ``view``
    read what eager reads (a flat walk over memory, a view eager refuses)."""
    rng = np.random.default_rng(1)
    x = tw.from_numpy(rng.standard_normal((2, 3, 4, 4)).astype(np.float32)).to(memory_format=tw.channels_last)

    def walk(x):
        y = x * 2  # channels-last, as x
        flat = y.as_strided((y.numel(),), (1,))  # memory order: (N, H, W, C)
        return flat + 0, y.permute(0, 2, 3, 1).reshape(2, -1) + 0

    eager = walk(x)
    got = tw.compile(walk)(x)
    for g, e in zip(got, eager):
        np.testing.assert_array_equal(g.numpy(), e.numpy())
    with pytest.raises(RuntimeError, match="view size is not compatible"):
        (x * 2).view(2, -1)
    with pytest.raises(RuntimeError, match="view size is not compatible"):
        tw.compile(lambda x: (x * 2).view(2, -1) + 0)(x)


def test_random_values_like_a_channels_last_intermediate_are_eagers():
    """``rand_like`` of a channels-last value draws in its memory order: the compiled function reads the same values
    (it read them in the logical order before)."""
    x = tw.randn(2, 3, 4, 5).contiguous(memory_format=tw.channels_last)

    def draw(x):
        tw.manual_seed(3)
        return tw.rand_like(x * 2) + 0, tw.randn_like(x + 1).stride()

    eager, compiled = draw(x), tw.compile(draw)(x)
    np.testing.assert_array_equal(compiled[0].numpy(), eager[0].numpy())
    assert compiled[1] == eager[1] == (60, 1, 15, 3)


def test_a_broadcast_operand_does_not_decide_a_channels_last_reductions_order():
    """A compiled backward's batch norm over channels-last saved activations, whose incoming gradient is a scalar's
    expanded over the batch (a loss's ``sum()``): the broadcast operand, read "whole" at stride 0, once decided the
    memory order alone (N, C, H, W), so fusion kept the statistics and the normalisation in phases, which the
    scheduler, reading the activations down their channels, ran as columns on 2 blocks (a ResNet-50 stem's: 41 ms
    on an H200). The bytes of the operands laid out in memory decide: the statistics split across the GPU."""
    import re

    def bn_backward_like(x, r, s):
        g = s.expand(x.shape) * 2 * (r > 0)
        n = x.shape[0] * x.shape[2] * x.shape[3]
        s1 = g.sum((0, 2, 3), keepdim=True)
        s2 = (g * x).sum((0, 2, 3), keepdim=True)
        return g - s1 / n - x * s2 / n

    x, r = (tw.randn(16, 64, 56, 56).to(tw.bfloat16).to(memory_format=tw.channels_last) for _ in range(2))
    s = tw.tensor(0.5, dtype=tw.bfloat16)
    _, programs, _ = tw.compile(bn_backward_like).lowered(targets.get_target("cuda"), x, r, s)
    schedules = [sched.describe() for low in programs for sched in low.schedules]
    blocks = [int(re.search(r"launch: (\d+) block", text).group(1)) for text in schedules]
    assert schedules and min(blocks) >= 64, schedules
    assert all("1 element(s) per access" not in text for text in schedules), schedules


def test_operands_in_two_layouts_do_not_leave_a_reduction_with_a_later_phase_on_a_few_blocks():
    """A compiled backward's batch norm over channels-last saved activations whose incoming gradient came row-major
    (max pooling's backward wrote it so before): fusion, the two operands' bytes equal, took the group for rows and
    kept the statistics and the normalisation in phases, while the scheduler, weighing the result's store too, ran
    it down the channels as columns on 2 blocks (a ResNet-50 stem's: 31.6 ms of a 47 ms backward on an H200). Either
    way the operands could be walked is judged: the statistics split across the GPU."""
    import re

    def bn_backward_like(g, x, mean, scale):
        n = x.shape[0] * x.shape[2] * x.shape[3]
        gf, xf = g.float(), x.float()
        s1 = gf.sum((0, 2, 3), keepdim=True)
        s2 = (gf * (xf - mean)).sum((0, 2, 3), keepdim=True)
        out = (gf - s1 / n - (xf - mean) * s2 * scale / n) * scale
        return out.to(tw.bfloat16).contiguous(memory_format=tw.channels_last)

    g = tw.randn(8, 64, 112, 112).to(tw.bfloat16)  # row-major
    x = tw.randn(8, 64, 112, 112).to(tw.bfloat16).to(memory_format=tw.channels_last)
    mean, scale = tw.randn(1, 64, 1, 1), tw.rand(1, 64, 1, 1)
    _, programs, _ = tw.compile(bn_backward_like).lowered(targets.get_target("cuda"), g, x, mean, scale)
    schedules = [sched.describe() for low in programs for sched in low.schedules]
    blocks = [int(re.search(r"launch: (\d+) block", text).group(1)) for text in schedules]
    assert schedules and min(blocks) >= 64, schedules

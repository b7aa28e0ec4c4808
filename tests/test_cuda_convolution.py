"""Convolution on a GPU: cuDNN's convolutions against torch's (which also call cuDNN), forward and both
gradients, every dtype, both memory formats, eager and compiled, and the flags that steer the plans.

Inputs are drawn in torch and copied into tilewise tensors, so both sides see the same values. Float32 runs
with TF32 off on both sides unless a test says otherwise, so that the comparison is tight.
"""

from __future__ import annotations

import numpy as np
import pytest

import tilewise as tw
import tilewise.nn.functional as F
from tilewise.backends.cuda import convolution as cudnn_conv

pytestmark = pytest.mark.cuda

torch = pytest.importorskip("torch")

TOL = {"bfloat16": 2e-2, "float16": 3e-3, "float32": 1e-5, "float64": 1e-10}


@pytest.fixture(autouse=True)
def _exact_float32():
    torch.backends.cudnn.allow_tf32, tw.backends.cudnn.allow_tf32 = False, False
    yield
    torch.backends.cudnn.allow_tf32, tw.backends.cudnn.allow_tf32 = True, True


def _tw(t: torch.Tensor, requires_grad: bool = False) -> tw.Tensor:
    """``t``'s values in tilewise on the GPU, with ``t``'s strides (channels-last stays channels-last)."""
    order = sorted(range(t.ndim), key=lambda d: -t.stride(d)) if t.ndim else []
    dense = t.permute(*order).contiguous()
    x = tw.from_numpy(dense.detach().double().cpu().numpy()).to(getattr(tw, str(t.dtype).split(".")[1])).cuda()
    back = [order.index(d) for d in range(t.ndim)]
    return x.permute(*back).requires_grad_(requires_grad)


def _close(ours: tw.Tensor, theirs: torch.Tensor, dtype: str, what: str) -> None:
    a = ours.detach().double().cpu().numpy()
    b = theirs.detach().double().cpu().numpy()
    scale = max(float(np.abs(b).max()), 1e-3)
    np.testing.assert_allclose(a, b, rtol=TOL[dtype], atol=TOL[dtype] * scale, err_msg=what)


def _channels_last(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous(memory_format=torch.channels_last if t.ndim == 4 else torch.channels_last_3d)


# (input shape, weight shape, stride, padding, dilation, groups)
CONFIGS = {
    "resnet-stem-7x7s2": ((2, 3, 32, 32), (16, 3, 7, 7), 2, 3, 1, 1),
    "3x3": ((2, 16, 14, 14), (32, 16, 3, 3), 1, 1, 1, 1),
    "1x1-s2": ((2, 32, 14, 14), (64, 32, 1, 1), 2, 0, 1, 1),
    "grouped": ((2, 16, 9, 9), (32, 4, 3, 3), 1, 1, 1, 4),
    "depthwise": ((2, 16, 10, 10), (16, 1, 3, 3), 1, 1, 1, 16),
    "dilated-asym": ((1, 8, 11, 13), (8, 8, 3, 2), (2, 1), (2, 0), (2, 3), 1),
    "same": ((2, 8, 10, 10), (8, 8, 4, 4), 1, "same", 1, 1),
}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "nhwc"])
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_conv2d_forward_and_gradients_match_torch(name, channels_last, dtype):
    x_shape, w_shape, stride, padding, dilation, groups = CONFIGS[name]
    g = torch.Generator().manual_seed(0)
    dt = getattr(torch, dtype)
    x = torch.randn(x_shape, generator=g).to(dt).cuda()
    w = (torch.randn(w_shape, generator=g) / np.sqrt(np.prod(w_shape[1:]))).to(dt).cuda()
    b = torch.randn(w_shape[0], generator=g).to(dt).cuda()
    if channels_last:
        x, w = _channels_last(x), _channels_last(w)
    tx, tw_, tb = (t.clone().requires_grad_(True) for t in (x, w, b))
    expected = torch.nn.functional.conv2d(tx, tw_, tb, stride, padding, dilation, groups)
    grad = torch.randn(expected.shape, generator=g).to(dt).cuda()
    expected.backward(grad)
    ox, ow, ob = _tw(x, True), _tw(w, True), _tw(b, True)
    cudnn_conv.reset()
    out = F.conv2d(ox, ow, ob, stride, padding, dilation, groups)
    assert tuple(out.shape) == tuple(expected.shape)
    assert out.stride() == expected.stride(), "the result's memory format is torch's"
    _close(out, expected, dtype, "output")
    out.backward(_tw(grad))
    _close(ox.grad, tx.grad, dtype, "input gradient")
    _close(ow.grad, tw_.grad, dtype, "weight gradient")
    _close(ob.grad, tb.grad, dtype, "bias gradient")
    built = {key[0] for key, graph in cudnn_conv._graphs.items() if graph is not None}
    assert built == {"fprop", "dgrad", "wgrad"}, f"cuDNN ran only {built} for {name}"


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_conv1d_and_conv3d_match_torch(dtype):
    g = torch.Generator().manual_seed(1)
    dt = getattr(torch, dtype)
    for fn, x_shape, w_shape, kwargs in (
            ("conv1d", (2, 8, 30), (16, 8, 5), dict(stride=2, padding=2)),
            ("conv3d", (2, 4, 6, 7, 8), (8, 4, 3, 3, 3), dict(padding=1)),
            ("conv3d", (1, 4, 5, 6, 7), (4, 1, 3, 3, 3), dict(padding=(0, 1, 1), groups=4))):
        x = torch.randn(x_shape, generator=g).to(dt).cuda()
        w = (torch.randn(w_shape, generator=g) * 0.2).to(dt).cuda()
        tx, tw_ = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
        expected = getattr(torch.nn.functional, fn)(tx, tw_, **kwargs)
        expected.sum().backward()
        ox, ow = _tw(x, True), _tw(w, True)
        out = getattr(F, fn)(ox, ow, **kwargs)
        _close(out, expected, dtype, f"{fn} output")
        out.sum().backward()
        _close(ox.grad, tx.grad, dtype, f"{fn} input gradient")
        _close(ow.grad, tw_.grad, dtype, f"{fn} weight gradient")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("spatial", [1, 2, 3])
def test_transposed_convolution_matches_torch(spatial, dtype):
    g = torch.Generator().manual_seed(2)
    dt = getattr(torch, dtype)
    x = torch.randn((2, 8, *(5,) * spatial), generator=g).to(dt).cuda()
    w = (torch.randn((8, 3, *(3,) * spatial), generator=g) * 0.2).to(dt).cuda()
    b = torch.randn(6, generator=g).to(dt).cuda()
    kwargs = dict(stride=2, padding=1, output_padding=1, groups=2)
    fn = f"conv_transpose{spatial}d"
    tx, tw_, tb = (t.clone().requires_grad_(True) for t in (x, w, b))
    expected = getattr(torch.nn.functional, fn)(tx, tw_, tb, **kwargs)
    grad = torch.randn(expected.shape, generator=g).to(dt).cuda()
    expected.backward(grad)
    ox, ow, ob = _tw(x, True), _tw(w, True), _tw(b, True)
    out = getattr(F, fn)(ox, ow, ob, **kwargs)
    _close(out, expected, dtype, "output")
    out.backward(_tw(grad))
    _close(ox.grad, tx.grad, dtype, "input gradient")
    _close(ow.grad, tw_.grad, dtype, "weight gradient")


def test_float64_runs_and_matches_torch():
    g = torch.Generator().manual_seed(3)
    x = torch.randn((2, 4, 9, 9), generator=g, dtype=torch.float64).cuda()
    w = torch.randn((6, 4, 3, 3), generator=g, dtype=torch.float64).cuda()
    _close(F.conv2d(_tw(x), _tw(w), padding=1), torch.nn.functional.conv2d(x, w, padding=1), "float64", "output")


def test_data_input_computes_no_input_gradient():
    """The first layer's input is data: only the weight gradient is computed (torch's output_mask)."""
    cudnn_conv.reset()
    x = tw.randn(2, 3, 16, 16, device="cuda")
    w = tw.randn(8, 3, 3, 3, device="cuda", requires_grad=True)
    F.conv2d(x, w, padding=1).sum().backward()
    kinds = {key[0] for key, graph in cudnn_conv._graphs.items() if graph is not None}
    assert kinds == {"fprop", "wgrad"}
    assert w.grad is not None and tuple(w.grad.shape) == (8, 3, 3, 3)


def test_tf32_flag_changes_float32_precision():
    """With TF32 allowed, a float32 convolution may round its inputs to TF32; without, it matches float64."""
    g = torch.Generator().manual_seed(4)
    x = torch.randn((4, 64, 16, 16), generator=g).cuda()
    w = torch.randn((64, 64, 3, 3), generator=g).cuda()
    reference = torch.nn.functional.conv2d(x.double(), w.double(), padding=1)
    exact = F.conv2d(_tw(x), _tw(w), padding=1)
    _close(exact, reference, "float32", "TF32 off")
    tw.backends.cudnn.allow_tf32 = True
    fast = F.conv2d(_tw(x), _tw(w), padding=1)
    err = float(np.abs(fast.double().cpu().numpy() - reference.cpu().numpy()).max())
    assert err < 0.5, "TF32 rounding stays within TF32's precision"


def test_deterministic_weight_gradient_is_reproducible():
    tw.backends.cudnn.deterministic = True
    try:
        x = tw.randn(8, 32, 28, 28, device="cuda")
        w = tw.randn(32, 32, 3, 3, device="cuda", requires_grad=True)
        grads = []
        for _ in range(2):
            w.grad = None
            F.conv2d(x, w, padding=1).sum().backward()
            grads.append(w.grad.cpu().numpy())
        assert np.array_equal(grads[0], grads[1])
    finally:
        tw.backends.cudnn.deterministic = False


def test_benchmark_times_candidates_and_remembers_the_choice(tmp_path, monkeypatch):
    monkeypatch.setenv("TILEWISE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(cudnn_conv, "_disk", [])
    cudnn_conv.reset()
    tw.backends.cudnn.benchmark = True
    try:
        g = torch.Generator().manual_seed(5)
        x = torch.randn((4, 32, 20, 20), generator=g).cuda()
        w = torch.randn((48, 32, 3, 3), generator=g).cuda()
        out = F.conv2d(_tw(x), _tw(w), padding=1)
        _close(out, torch.nn.functional.conv2d(x, w, padding=1), "float32", "timed plan")
    finally:
        tw.backends.cudnn.benchmark = False
    assert list((tmp_path / "cudnn").glob("*.json")), "the timed choice is remembered on disk"
    cudnn_conv.reset()  # a new process: the remembered plan is built without timing
    out = F.conv2d(_tw(x), _tw(w), padding=1)
    _close(out, torch.nn.functional.conv2d(x, w, padding=1), "float32", "remembered plan")


def test_cudnn_disabled_runs_the_decomposition():
    tw.backends.cudnn.enabled = False
    try:
        cudnn_conv.reset()
        g = torch.Generator().manual_seed(6)
        x, w = torch.randn((2, 4, 8, 8), generator=g).cuda(), torch.randn((4, 4, 3, 3), generator=g).cuda()
        _close(F.conv2d(_tw(x), _tw(w)), torch.nn.functional.conv2d(x, w), "float32", "decomposition")
        assert not cudnn_conv._graphs
    finally:
        tw.backends.cudnn.enabled = True


def test_empty_batch_matches_torch():
    x, w = torch.randn((0, 4, 8, 8)).cuda(), torch.randn((6, 4, 3, 3)).cuda()
    out = F.conv2d(_tw(x), _tw(w), padding=1)
    assert tuple(out.shape) == tuple(torch.nn.functional.conv2d(x, w, padding=1).shape)


def test_compiled_conv_block_matches_eager_and_calls_cudnn():
    """conv + batch norm + ReLU + residual add, forward and backward, compiled against eager."""
    tw.manual_seed(0)
    conv1 = tw.nn.Conv2d(16, 16, 3, padding=1, bias=False).cuda()
    bn = tw.nn.BatchNorm2d(16).cuda()
    conv2 = tw.nn.Conv2d(16, 16, 3, padding=1, bias=False).cuda()

    def block(x):
        y = F.relu(bn(conv1(x)))
        return F.relu(conv2(y) + x)

    def step(x):
        loss = block(x).square().mean()
        loss.backward()
        return loss

    x = tw.randn(4, 16, 12, 12, device="cuda")
    params = [conv1.weight, bn.weight, bn.bias, conv2.weight]
    eager = step(x)
    expected = [p.grad.clone() for p in params]
    for p in params:
        p.grad = None
    compiled = tw.compile(step)
    cudnn_conv.reset()
    for _ in range(3):  # the second call on replays a CUDA graph
        for p in params:
            p.grad = None
        loss = compiled(x)
        np.testing.assert_allclose(loss.item(), eager.item(), rtol=1e-4)
        for p, e in zip(params, expected):
            np.testing.assert_allclose(p.grad.cpu().numpy(), e.cpu().numpy(), rtol=1e-3, atol=1e-4)
    kinds = {key[0] for key, graph in cudnn_conv._graphs.items() if graph is not None}
    assert kinds == {"fprop", "dgrad", "wgrad"}, "the compiled program calls cuDNN for every convolution"

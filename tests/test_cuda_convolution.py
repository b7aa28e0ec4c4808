"""Convolution on a GPU: cuDNN's convolutions against torch's (which also call cuDNN), forward and both
gradients, every dtype, both memory formats, eager and compiled, and the flags that steer the plans.

Inputs are drawn in torch and copied into tilewise tensors, so both sides see the same values. Float32 runs
with TF32 off on both sides (``conftest``) unless a test says otherwise, so that the comparison is tight.
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


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "nhwc"])
def test_batch_norm_training_and_eval_match_torch(channels_last, dtype):
    """Batch norm on the GPU (one fused program per signature in eager): output, gradients and the running
    statistics, in training and in evaluation."""
    g = torch.Generator().manual_seed(8)
    dt = getattr(torch, dtype)
    x = (torch.randn((4, 16, 10, 10), generator=g) * 3 + 2).to(dt).cuda()
    if channels_last:
        x = _channels_last(x)
    ref = torch.nn.BatchNorm2d(16).cuda()
    ours = tw.nn.BatchNorm2d(16).cuda()
    with torch.no_grad():
        ref.weight.uniform_(0.5, 1.5)
        ref.bias.uniform_(-0.5, 0.5)
    ours.load_state_dict({k: tw.from_numpy(v.cpu().numpy()).cuda() for k, v in ref.state_dict().items()})
    tx, ox = x.clone().requires_grad_(True), _tw(x, True)
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=dtype == "bfloat16"):
        expected = ref(tx)
    with tw.autocast("cuda", dtype=tw.bfloat16, enabled=dtype == "bfloat16"):
        out = ours(ox)
    _close(out, expected, dtype, "training output")
    grad = torch.randn(expected.shape, generator=g).to(expected.dtype).cuda()
    expected.backward(grad)
    out.backward(_tw(grad))
    _close(ox.grad, tx.grad, dtype, "input gradient")
    _close(ours.weight.grad, ref.weight.grad, "float32" if dtype == "float32" else dtype, "weight gradient")
    _close(ours.bias.grad, ref.bias.grad, "float32" if dtype == "float32" else dtype, "bias gradient")
    _close(ours.running_mean, ref.running_mean, "float32", "running mean")
    _close(ours.running_var, ref.running_var, "float32", "running variance")
    ref.eval(), ours.eval()
    _close(ours(_tw(x)), ref(x), dtype, "evaluation output")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_max_pool_with_nan_and_padding_matches_torch(dtype):
    g = torch.Generator().manual_seed(9)
    dt = getattr(torch, dtype)
    a = torch.randint(-3, 3, (2, 4, 13, 14), generator=g).float()
    a[torch.rand(a.shape, generator=g) < 0.05] = float("nan")
    a = a.to(dt).cuda()
    for kwargs in (dict(kernel_size=3, stride=2, padding=1), dict(kernel_size=2), dict(kernel_size=3, stride=2,
                                                                                       ceil_mode=True)):
        tx, ox = a.clone().requires_grad_(True), _tw(a, True)
        tv, ti = torch.nn.functional.max_pool2d(tx, return_indices=True, **kwargs)
        ov, oi = tw.nn.functional.max_pool2d(ox, return_indices=True, **kwargs)
        assert np.array_equal(oi.cpu().numpy(), ti.cpu().numpy()), kwargs
        np.testing.assert_array_equal(ov.detach().float().cpu().numpy(), tv.detach().float().cpu().numpy())
        grad = torch.randn(tv.shape, generator=g).to(dt).cuda()
        tv.backward(grad)
        ov.backward(_tw(grad))
        _close(ox.grad, tx.grad, dtype, f"max_pool2d gradient {kwargs}")

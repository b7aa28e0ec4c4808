"""Convolutional layers against torch.nn, module by module: each layer gets torch's parameters and buffers, runs
forward and backward for a few steps (in training and in eval), and must match torch's outputs, gradients and
state (running statistics included) at every step. Then a small CNN of these layers is saved by torch.save and
loaded by tilewise.load: its state-dict keys are torch's and its outputs match torch's.

The operator table (tests/opinfos) covers the functionals' options one by one; this file covers what the modules
add on top: padding modes, ``output_size``, running statistics with momentum None, unbatched inputs of norms.
"""

from __future__ import annotations

import io
import warnings

import numpy as np
import pytest
import torch

import tilewise as tw


def _values(shape, seed, kind="float", dtype="float32"):
    rng = np.random.default_rng(seed)
    if kind == "distinct":  # no ties: max pooling's indices are then unambiguous
        n = int(np.prod(shape))
        return (rng.permutation(n).reshape(shape) / n * 4 - 2).astype(dtype)
    return rng.uniform(-2, 2, size=shape).astype(dtype)


def _close(ours, theirs, what, rtol=1e-4, atol=1e-5):
    np.testing.assert_allclose(np.asarray(ours.detach().numpy(), dtype=np.float64),
                               theirs.detach().numpy().astype(np.float64), rtol=rtol, atol=atol, err_msg=what)


def _load_torch_state(layer, ref) -> None:
    layer.load_state_dict({k: tw.tensor(v.detach().numpy()) for k, v in ref.state_dict().items()})


def _step(layer, ref, shapes, seed, kind, dtype, call):
    arrays = [_values(s, seed + k, kind, dtype) for k, s in enumerate(shapes)]
    ours_in = [tw.tensor(a, requires_grad=True) for a in arrays]
    theirs_in = [torch.tensor(a, requires_grad=True) for a in arrays]
    out, expected = call(layer, *ours_in), call(ref, *theirs_in)
    if isinstance(expected, tuple):  # (values, indices)
        np.testing.assert_array_equal(out[1].numpy(), expected[1].numpy())
        out, expected = out[0], expected[0]
    assert tuple(out.shape) == tuple(expected.shape)
    assert out.dtype.name == str(expected.dtype).removeprefix("torch.")
    _close(out, expected, "output")
    grad = _values(tuple(expected.shape), 99 + seed, dtype=dtype)
    out.backward(tw.tensor(grad))
    expected.backward(torch.tensor(grad))
    for k, (a, b) in enumerate(zip(ours_in, theirs_in)):
        _close(a.grad, b.grad, f"gradient of input {k}", rtol=1e-3, atol=1e-4)
    ours = dict(layer.named_parameters())
    for name, p in ref.named_parameters():
        _close(ours[name].grad, p.grad, f"gradient of {name}", rtol=1e-3, atol=1e-4)
        ours[name].grad, p.grad = None, None
    state = layer.state_dict()
    assert list(state) == list(ref.state_dict())
    for name, value in ref.state_dict().items():
        _close(state[name], value, f"state {name}", rtol=1e-5, atol=1e-6)


def _forward(module, *xs):
    return module(*xs)


def _case(make, shapes, kind="float", call=_forward, train=True, steps=1, dtype="float32"):
    return make, shapes, kind, call, train, steps, dtype


def _padding_modes():
    cases = {}
    for mode in ("zeros", "reflect", "replicate", "circular"):
        cases |= {
            f"Conv1d-{mode}": _case(lambda nn, m=mode: nn.Conv1d(4, 6, 3, stride=2, padding=2, groups=2,
                                                                 padding_mode=m), [(2, 4, 9)]),
            f"Conv2d-depthwise-{mode}": _case(lambda nn, m=mode: nn.Conv2d(4, 4, (3, 2), stride=(1, 2), padding=(1, 2),
                                                                           dilation=(2, 1), groups=4, padding_mode=m),
                                              [(2, 4, 7, 6)]),
            f"Conv3d-{mode}": _case(lambda nn, m=mode: nn.Conv3d(2, 4, 3, padding=(1, 0, 2), padding_mode=m),
                                    [(1, 2, 4, 5, 4)]),
            f"Conv2d-same-{mode}": _case(lambda nn, m=mode: nn.Conv2d(3, 4, (4, 3), padding="same", dilation=(1, 2),
                                                                      padding_mode=m), [(2, 3, 6, 7)]),
            f"Conv1d-same-even-unbatched-{mode}": _case(lambda nn, m=mode: nn.Conv1d(3, 4, 4, padding="same",
                                                                                     padding_mode=m), [(3, 6)]),
            f"Conv2d-valid-unbatched-{mode}": _case(lambda nn, m=mode: nn.Conv2d(3, 4, 3, padding="valid",
                                                                                 padding_mode=m), [(3, 6, 7)]),
        }
    return cases


def _output_size(size):
    return lambda module, x: module(x, output_size=size)


def _norms():
    cases = {}
    for d, batch_shape, instance_shape in ((1, (4, 3, 5), (2, 3, 6)), (2, (3, 3, 4, 2), (2, 3, 6, 4)),
                                           (3, (2, 3, 3, 2, 2), (2, 3, 4, 3, 2))):
        bn, inn = f"BatchNorm{d}d", f"InstanceNorm{d}d"
        cases |= {
            f"{bn}-train": _case(lambda nn, n=bn: getattr(nn, n)(3), [batch_shape], steps=3),
            f"{bn}-momentum-none": _case(lambda nn, n=bn: getattr(nn, n)(3, momentum=None), [batch_shape], steps=3),
            f"{bn}-eval": _case(lambda nn, n=bn: getattr(nn, n)(3), [batch_shape], train=False),
            f"{bn}-no-affine-no-stats": _case(lambda nn, n=bn: getattr(nn, n)(3, affine=False,
                                                                             track_running_stats=False),
                                              [batch_shape], steps=2),
            f"{bn}-no-stats-eval": _case(lambda nn, n=bn: getattr(nn, n)(3, track_running_stats=False),
                                         [batch_shape], train=False),
            f"{inn}": _case(lambda nn, n=inn: getattr(nn, n)(3), [instance_shape]),
            f"{inn}-affine": _case(lambda nn, n=inn: getattr(nn, n)(3, affine=True), [instance_shape]),
            f"{inn}-running-stats": _case(lambda nn, n=inn: getattr(nn, n)(3, track_running_stats=True, momentum=0.2),
                                          [instance_shape], steps=2),
            f"{inn}-running-stats-eval": _case(lambda nn, n=inn: getattr(nn, n)(3, affine=True,
                                                                                track_running_stats=True),
                                               [instance_shape], train=False),
            f"{inn}-unbatched": _case(lambda nn, n=inn: getattr(nn, n)(3, affine=True, track_running_stats=True),
                                      [instance_shape[1:]], steps=2),
            f"{inn}-unbatched-eval": _case(lambda nn, n=inn: getattr(nn, n)(3, affine=True, track_running_stats=True),
                                           [instance_shape[1:]], train=False),
            f"{inn}-momentum-none": _case(lambda nn, n=inn: getattr(nn, n)(3, track_running_stats=True, momentum=None),
                                          [instance_shape], steps=2),
        }
    cases["BatchNorm2d-float64"] = _case(lambda nn: nn.BatchNorm2d(3, momentum=0.3).double(), [(3, 3, 2, 2)], steps=2,
                                         dtype="float64")
    cases["GroupNorm-2d-input"] = _case(lambda nn: nn.GroupNorm(3, 6), [(4, 6)])
    cases["GroupNorm-5d-input"] = _case(lambda nn: nn.GroupNorm(1, 4, eps=1e-3), [(2, 4, 2, 3, 2)])
    cases["GroupNorm-no-affine"] = _case(lambda nn: nn.GroupNorm(3, 6, affine=False), [(2, 6, 5)])
    return cases


def _pools():
    cases = {}
    for d in (1, 2, 3):
        shape = (2, 3) + (7, 6, 5)[:d]
        cases |= {
            f"MaxPool{d}d-indices-ceil-dilation": _case(lambda nn, d=d: getattr(nn, f"MaxPool{d}d")(
                3, 2, 1, dilation=2, return_indices=True, ceil_mode=True), [shape], "distinct"),
            f"MaxPool{d}d-unbatched": _case(lambda nn, d=d: getattr(nn, f"MaxPool{d}d")(2, 1, 1, return_indices=True),
                                            [shape[1:]], "distinct"),
            f"AvgPool{d}d-exclude-pad-ceil": _case(lambda nn, d=d: getattr(nn, f"AvgPool{d}d")(
                3, 2, 1, ceil_mode=True, count_include_pad=False), [shape]),
            f"AvgPool{d}d-unbatched": _case(lambda nn, d=d: getattr(nn, f"AvgPool{d}d")(2), [shape[1:]]),
            f"AdaptiveMaxPool{d}d-indices": _case(lambda nn, d=d: getattr(nn, f"AdaptiveMaxPool{d}d")(
                (3, None, 2)[:d] if d > 1 else 3, return_indices=True), [shape], "distinct"),
            f"AdaptiveAvgPool{d}d-none": _case(lambda nn, d=d: getattr(nn, f"AdaptiveAvgPool{d}d")(
                (None, 4, 3)[:d] if d > 1 else 4), [shape]),
            f"AdaptiveAvgPool{d}d-unbatched": _case(lambda nn, d=d: getattr(nn, f"AdaptiveAvgPool{d}d")(3),
                                                    [shape[1:]]),
        }
        if d > 1:
            cases[f"AvgPool{d}d-divisor"] = _case(lambda nn, d=d: getattr(nn, f"AvgPool{d}d")(
                3, 2, 1, ceil_mode=True, divisor_override=2), [shape])
    return cases


LAYERS = {
    **_padding_modes(),
    "Conv2d-depthwise-multiplier": _case(lambda nn: nn.Conv2d(3, 6, 3, groups=3, bias=False), [(2, 3, 5, 5)]),
    "ConvTranspose1d-stride-padding-groups-dilation": _case(lambda nn: nn.ConvTranspose1d(
        4, 6, 3, stride=3, padding=2, output_padding=1, groups=2, dilation=2), [(2, 4, 5)]),
    # output padding below the dilation, not the stride: the output's last rows read no input
    "ConvTranspose2d-output-padding-by-dilation": _case(lambda nn: nn.ConvTranspose2d(
        4, 4, 3, padding=1, output_padding=1, groups=4, dilation=2), [(2, 4, 5, 4)]),
    "ConvTranspose3d-everything": _case(lambda nn: nn.ConvTranspose3d(
        4, 2, (2, 3, 2), stride=(2, 1, 3), padding=(1, 1, 0), output_padding=(1, 0, 2), groups=2, dilation=(1, 2, 1)),
        [(1, 4, 3, 3, 2)]),
    "ConvTranspose1d-unbatched": _case(lambda nn: nn.ConvTranspose1d(3, 2, 3, stride=2), [(3, 4)]),
    "ConvTranspose2d-output-size": _case(lambda nn: nn.ConvTranspose2d(3, 2, 3, stride=(2, 3), padding=1),
                                         [(1, 3, 4, 4)], call=_output_size((8, 11))),
    "ConvTranspose1d-output-size-with-batch-dims": _case(lambda nn: nn.ConvTranspose1d(3, 2, 3, stride=3),
                                                         [(1, 3, 4)], call=_output_size([1, 2, 13])),
    "ConvTranspose3d-output-size-unbatched": _case(lambda nn: nn.ConvTranspose3d(3, 2, 2, stride=2),
                                                   [(3, 2, 2, 3)], call=_output_size((5, 4, 7))),
    **_norms(),
    **_pools(),
    "Unfold": _case(lambda nn: nn.Unfold((2, 3), dilation=(2, 1), padding=(1, 0), stride=(1, 2)), [(2, 3, 6, 7)]),
    "Fold": _case(lambda nn: nn.Fold((6, 5), (2, 2), dilation=(1, 2), padding=1, stride=(2, 1)), [(2, 12, 20)]),
    "Fold-unbatched": _case(lambda nn: nn.Fold((4, 5), 2), [(8, 12)]),
    "PixelShuffle-5d": _case(lambda nn: nn.PixelShuffle(3), [(2, 1, 18, 2, 3)]),
    "PixelUnshuffle-unbatched": _case(lambda nn: nn.PixelUnshuffle(2), [(3, 4, 6)]),
    "UpsamplingNearest2d-scale": _case(lambda nn: nn.UpsamplingNearest2d(scale_factor=(2, 3)), [(2, 3, 4, 5)]),
    "UpsamplingBilinear2d-size": _case(lambda nn: nn.UpsamplingBilinear2d(size=(7, 3)), [(2, 3, 4, 5)]),
    "Upsample-nearest-1d": _case(lambda nn: nn.Upsample(scale_factor=1.7), [(2, 3, 5)]),
    "Upsample-nearest-exact-3d": _case(lambda nn: nn.Upsample(scale_factor=0.6, mode="nearest-exact",
                                                              recompute_scale_factor=True), [(1, 2, 3, 4, 5)]),
    "Upsample-bicubic-align": _case(lambda nn: nn.Upsample(size=(7, 3), mode="bicubic", align_corners=True),
                                    [(2, 3, 4, 5)]),
    "Upsample-area-2d": _case(lambda nn: nn.Upsample(scale_factor=0.5, mode="area"), [(2, 3, 7, 6)]),
}


@pytest.mark.parametrize("name", LAYERS)
def test_layer_matches_torch_over_steps(name):
    make, shapes, kind, call, train, steps, dtype = LAYERS[name]
    torch.manual_seed(0)
    ref, layer = make(torch.nn), make(tw.nn)
    if dtype == "float64":
        layer = layer.double()
    _load_torch_state(layer, ref)
    ref.train(train)
    layer.train(train)
    for step in range(steps):
        _step(layer, ref, shapes, 7 * step, kind, dtype, call)


def test_instance_norm_warns_like_torch_when_channels_differ_without_affine():
    x = _values((2, 4, 5), 0)
    with pytest.warns(UserWarning, match="does not match num_features"):
        out = tw.nn.InstanceNorm1d(3)(tw.tensor(x))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = torch.nn.InstanceNorm1d(3)(torch.tensor(x))
    _close(out, expected, "output")


def test_conv_forward_is_the_hook_torch_layers_override():
    """Layers that transform the weight (weight standardisation, spectral norm) call _conv_forward with their own."""
    torch.manual_seed(0)
    ref, layer = torch.nn.Conv2d(3, 4, 3, padding=1, padding_mode="reflect"), tw.nn.Conv2d(3, 4, 3, padding=1,
                                                                                          padding_mode="reflect")
    _load_torch_state(layer, ref)
    x = _values((2, 3, 5, 5), 1)
    out = layer._conv_forward(tw.tensor(x), layer.weight * 2, None)
    expected = ref._conv_forward(torch.tensor(x), ref.weight * 2, None)
    _close(out, expected, "output")
    assert layer._reversed_padding_repeated_twice == list(ref._reversed_padding_repeated_twice)
    assert layer.transposed is False and tw.nn.ConvTranspose2d(2, 2, 2).transposed is True


@pytest.mark.parametrize("mode", ["bilinear", "nearest", "bicubic"])
@pytest.mark.parametrize("padding_mode", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align_corners", [False, True])
def test_grid_sample_of_nan_and_infinite_grid_values_matches_torch(mode, padding_mode, align_corners):
    """Border and reflection clip a NaN coordinate (or an infinite one reflected) to 0, as torch does. Forward only:
    torch's own backward crashes on such grids."""
    image = _values((1, 2, 4, 5), 0)
    grid = np.array([[[[np.nan, 0.3], [0.2, np.nan], [np.inf, 0.1], [-np.inf, 0.1], [0.1, np.inf], [0.1, -np.inf],
                       [np.nan, np.nan]]]], dtype=np.float32)
    kwargs = {"mode": mode, "padding_mode": padding_mode, "align_corners": align_corners}
    out = tw.nn.functional.grid_sample(tw.tensor(image), tw.tensor(grid), **kwargs)
    expected = torch.nn.functional.grid_sample(torch.tensor(image), torch.tensor(grid), **kwargs)
    np.testing.assert_allclose(out.numpy(), expected.numpy(), rtol=1e-5, atol=1e-5, equal_nan=True)


# ---------------------------------------------------------------------------- a whole CNN from torch.save

class _Net:
    """One architecture built from either framework's nn: every layer of this file with weights or buffers."""

    @staticmethod
    def make(nn):
        return nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1, padding_mode="reflect"), nn.BatchNorm2d(8), nn.ReLU(),
            nn.Conv2d(8, 8, 3, padding="same", groups=8, bias=False), nn.GroupNorm(2, 8),
            nn.MaxPool2d(2), nn.InstanceNorm2d(8, affine=True, track_running_stats=True),
            nn.ConvTranspose2d(8, 4, 3, stride=2, padding=1, output_padding=1), nn.BatchNorm2d(4, momentum=None),
            nn.Upsample(scale_factor=0.5, mode="bilinear"), nn.Conv2d(4, 2, 1),
            nn.AdaptiveAvgPool2d((3, None)), nn.Flatten(), nn.Linear(2 * 3 * 4, 5))


def test_cnn_state_dict_saved_by_torch_loads_and_matches():
    torch.manual_seed(0)
    ref = _Net.make(torch.nn)
    ref.train()
    ref(torch.randn(4, 3, 8, 8))  # running statistics away from their initial values
    ref.eval()
    buffer = io.BytesIO()
    torch.save(ref.state_dict(), buffer)
    buffer.seek(0)
    state = tw.load(buffer)
    net = _Net.make(tw.nn)
    assert list(state) == list(net.state_dict()) == list(ref.state_dict())
    net.load_state_dict(state)
    net.eval()
    x = _values((2, 3, 8, 8), 5)
    _close(net(tw.tensor(x)), ref(torch.tensor(x)), "eval output")
    net.train()
    ref.train()
    _close(net(tw.tensor(x)), ref(torch.tensor(x)), "train output")
    for name, value in ref.state_dict().items():  # the training step updated the running statistics alike
        _close(net.state_dict()[name], value, f"state {name}", rtol=1e-5, atol=1e-6)


def test_same_padding_of_an_even_kernel_warns_like_torch():
    """torch's words (it warns once per process, so it is not asked here: another test may have had the warning)."""
    x, w = _values((1, 2, 6), 0), _values((3, 2, 4), 1)
    with pytest.warns(UserWarning, match="padding='same' with even kernel lengths"):
        out = tw.nn.functional.conv1d(tw.tensor(x), tw.tensor(w), padding="same")
    _close(out, torch.nn.functional.conv1d(torch.tensor(x), torch.tensor(w), padding="same"), "output")

"""tilewise.nn's structural layers against torch.nn: pooling, padding, convolution (3-D and transposed), resampling,
lazy modules and the encoder-decoder Transformer, each given torch's weights, forward and backward."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tilewise as tw


def _close(ours, theirs, rtol=1e-5, atol=1e-5, what=""):
    np.testing.assert_allclose(np.asarray(ours.detach().numpy(), dtype=np.float64),
                               theirs.detach().numpy().astype(np.float64), rtol=rtol, atol=atol, err_msg=what)


def _float_input(shape, seed=0):
    return np.random.default_rng(seed).uniform(-2.0, 2.0, size=shape).astype(np.float32)


def _copy_weights(layer, ref) -> None:
    layer.load_state_dict({k: v.detach() for k, v in ref.state_dict().items()})


def _run_both(layer, ref, arrays, call=lambda m, *xs: m(*xs)):
    ours_in = [tw.tensor(a, requires_grad=True) for a in arrays]
    theirs_in = [torch.tensor(a, requires_grad=True) for a in arrays]
    return ours_in, theirs_in, call(layer, *ours_in), call(ref, *theirs_in)


def _check_forward_backward(layer, ref, ours_in, theirs_in, out, ref_out):
    if isinstance(ref_out, tuple):  # (values, indices)
        np.testing.assert_array_equal(out[1].numpy(), ref_out[1].numpy())
        out, ref_out = out[0], ref_out[0]
    _close(out, ref_out, what="output")
    grad = _float_input(tuple(ref_out.shape), seed=99)
    out.backward(tw.tensor(grad))
    ref_out.backward(torch.tensor(grad))
    for k, (a, b) in enumerate(zip(ours_in, theirs_in)):
        _close(a.grad, b.grad, rtol=1e-4, atol=1e-5, what=f"grad of input {k}")
    ours = dict(layer.named_parameters())
    assert set(ours) == {name for name, _ in ref.named_parameters()}
    for name, p in ref.named_parameters():
        _close(ours[name].grad, p.grad, rtol=1e-4, atol=1e-4, what=f"grad of {name}")


LAYERS = {
    "MaxPool1d": (lambda nn: nn.MaxPool1d(3, 2, 1, ceil_mode=True), [(2, 3, 9)]),
    "MaxPool3d-indices": (lambda nn: nn.MaxPool3d(2, 1, 1, return_indices=True), [(2, 2, 3, 4, 3)]),
    "AvgPool1d": (lambda nn: nn.AvgPool1d(3, 2, 1, count_include_pad=False), [(2, 3, 9)]),
    "AvgPool3d": (lambda nn: nn.AvgPool3d((2, 3, 2), 2, 1, ceil_mode=True, divisor_override=3), [(1, 2, 5, 6, 4)]),
    "AdaptiveAvgPool1d": (lambda nn: nn.AdaptiveAvgPool1d(4), [(2, 3, 9)]),
    "AdaptiveAvgPool3d": (lambda nn: nn.AdaptiveAvgPool3d((2, None, 3)), [(2, 2, 5, 4, 7)]),
    "AdaptiveMaxPool1d": (lambda nn: nn.AdaptiveMaxPool1d(4, return_indices=True), [(2, 3, 9)]),
    "AdaptiveMaxPool2d": (lambda nn: nn.AdaptiveMaxPool2d((3, 5)), [(2, 3, 7, 8)]),
    "AdaptiveMaxPool3d": (lambda nn: nn.AdaptiveMaxPool3d(2, return_indices=True), [(1, 2, 5, 4, 3)]),
    "LPPool1d": (lambda nn: nn.LPPool1d(2, 3, 2), [(2, 3, 9)]),
    "LPPool2d": (lambda nn: nn.LPPool2d(3, (2, 3), ceil_mode=True), [(2, 3, 7, 8)]),
    "LPPool3d": (lambda nn: nn.LPPool3d(2, 2), [(1, 2, 4, 4, 5)]),
    "ConstantPad1d": (lambda nn: nn.ConstantPad1d((2, -1), 3.5), [(2, 3, 5)]),
    "ConstantPad2d": (lambda nn: nn.ConstantPad2d(1, -2.0), [(2, 3, 4)]),
    "ConstantPad3d": (lambda nn: nn.ConstantPad3d((1, 0, 2, 1, 0, 3), 0.5), [(1, 2, 3, 3, 2)]),
    "ZeroPad1d": (lambda nn: nn.ZeroPad1d(2), [(2, 3, 4)]),
    "ZeroPad3d": (lambda nn: nn.ZeroPad3d((1, 2, 0, 1, 2, 0)), [(2, 2, 2, 3)]),
    "ReflectionPad1d": (lambda nn: nn.ReflectionPad1d((3, 1)), [(2, 3, 5)]),
    "ReflectionPad2d": (lambda nn: nn.ReflectionPad2d((1, 2, 2, 0)), [(2, 3, 4, 5)]),
    "ReflectionPad3d": (lambda nn: nn.ReflectionPad3d(1), [(2, 3, 3, 4)]),
    "ReplicationPad1d": (lambda nn: nn.ReplicationPad1d((1, 4)), [(3, 5)]),
    "ReplicationPad2d": (lambda nn: nn.ReplicationPad2d(2), [(2, 3, 4, 3)]),
    "ReplicationPad3d": (lambda nn: nn.ReplicationPad3d((1, 2, 0, 1, 2, 1)), [(1, 2, 3, 3, 2)]),
    "CircularPad1d": (lambda nn: nn.CircularPad1d((2, 1)), [(2, 3, 4)]),
    "CircularPad2d": (lambda nn: nn.CircularPad2d((1, 2, 2, 0)), [(2, 3, 4, 5)]),
    "CircularPad3d": (lambda nn: nn.CircularPad3d(1), [(1, 2, 3, 3, 4)]),
    "Conv3d": (lambda nn: nn.Conv3d(4, 6, (2, 3, 2), stride=(1, 2, 1), padding=1, dilation=(2, 1, 1), groups=2),
               [(2, 4, 5, 6, 5)]),
    "Conv3d-circular": (lambda nn: nn.Conv3d(2, 3, 3, padding=1, padding_mode="circular"), [(1, 2, 4, 3, 4)]),
    "ConvTranspose1d": (lambda nn: nn.ConvTranspose1d(4, 6, 3, stride=2, padding=1, output_padding=1, groups=2),
                        [(2, 4, 7)]),
    "ConvTranspose2d": (lambda nn: nn.ConvTranspose2d(3, 4, (3, 2), stride=(2, 3), padding=(1, 0), dilation=(1, 2)),
                        [(2, 3, 4, 5)]),
    "ConvTranspose2d-unbatched-nobias": (lambda nn: nn.ConvTranspose2d(3, 2, 2, stride=2, bias=False), [(3, 4, 3)]),
    "ConvTranspose3d": (lambda nn: nn.ConvTranspose3d(2, 4, 2, stride=(1, 2, 2), output_padding=(0, 1, 0)),
                        [(1, 2, 3, 3, 4)]),
    "PixelShuffle": (lambda nn: nn.PixelShuffle(2), [(2, 8, 3, 4)]),
    "PixelUnshuffle": (lambda nn: nn.PixelUnshuffle(3), [(2, 2, 6, 3)]),
    "ChannelShuffle": (lambda nn: nn.ChannelShuffle(3), [(2, 6, 2, 2)]),
    "Fold": (lambda nn: nn.Fold((5, 6), (2, 3), padding=1, stride=(2, 1)), [(2, 12, 18)]),
    "Unfold": (lambda nn: nn.Unfold((2, 3), dilation=(1, 2), padding=1, stride=2), [(2, 3, 6, 7)]),
    "Upsample-bilinear": (lambda nn: nn.Upsample(scale_factor=2, mode="bilinear"), [(2, 3, 4, 5)]),
    "Upsample-trilinear-align": (lambda nn: nn.Upsample(size=(3, 5, 4), mode="trilinear", align_corners=True),
                                 [(1, 2, 2, 3, 4)]),
    "Upsample-bicubic": (lambda nn: nn.Upsample(scale_factor=(1.5, 0.8), mode="bicubic"), [(2, 3, 4, 5)]),
    "UpsamplingNearest2d": (lambda nn: nn.UpsamplingNearest2d(size=(7, 3)), [(2, 3, 4, 5)]),
    "UpsamplingBilinear2d": (lambda nn: nn.UpsamplingBilinear2d(scale_factor=2), [(2, 3, 4, 5)]),
    "LocalResponseNorm": (lambda nn: nn.LocalResponseNorm(3, 1e-2, 0.7, 1.5), [(2, 5, 3, 4)]),
    "TransformerDecoderLayer": (lambda nn: nn.TransformerDecoderLayer(8, 2, 16, dropout=0.0, batch_first=True),
                                [(2, 4, 8), (2, 5, 8)]),
    "TransformerDecoderLayer-norm-first-gelu": (
        lambda nn: nn.TransformerDecoderLayer(8, 2, 16, dropout=0.0, activation="gelu", norm_first=True),
        [(4, 2, 8), (5, 2, 8)]),
}


@pytest.mark.parametrize("name", LAYERS)
def test_layer_matches_torch(name):
    make, shapes = LAYERS[name]
    torch.manual_seed(0)
    ref = make(torch.nn)
    layer = make(tw.nn)
    _copy_weights(layer, ref)
    arrays = [_float_input(s, seed=k) for k, s in enumerate(shapes)]
    _check_forward_backward(layer, ref, *_run_both(layer, ref, arrays))


def test_max_unpool_inverts_max_pool_like_torch():
    x = _float_input((2, 3, 6, 5))
    for module in ("MaxUnpool2d",):
        pool_tw, pool_th = tw.nn.MaxPool2d(2, return_indices=True), torch.nn.MaxPool2d(2, return_indices=True)
        values, indices = pool_th(torch.tensor(x))
        ours, theirs = getattr(tw.nn, module)(2), getattr(torch.nn, module)(2)
        ours_in = tw.tensor(values.numpy(), requires_grad=True)
        theirs_in = values.detach().requires_grad_(True)
        tw_indices = pool_tw(tw.tensor(x))[1]
        np.testing.assert_array_equal(tw_indices.numpy(), indices.numpy())
        out = ours(ours_in, tw_indices, output_size=(6, 5))
        ref = theirs(theirs_in, indices, output_size=(6, 5))
        _close(out, ref)
        grad = _float_input(tuple(ref.shape), seed=3)
        out.backward(tw.tensor(grad))
        ref.backward(torch.tensor(grad))
        _close(ours_in.grad, theirs_in.grad)


@pytest.mark.parametrize("dims", [1, 3])
def test_max_unpool_1d_3d_round_trip(dims):
    shape = (2, 3, 7) if dims == 1 else (1, 2, 4, 5, 4)
    x = _float_input(shape)
    values, indices = getattr(torch.nn.functional, f"max_pool{dims}d")(torch.tensor(x), 2, return_indices=True)
    ours = getattr(tw.nn, f"MaxUnpool{dims}d")(2)(tw.tensor(values.numpy()), tw.tensor(indices.numpy()),
                                                   output_size=shape)
    theirs = getattr(torch.nn, f"MaxUnpool{dims}d")(2)(values, indices, output_size=shape)
    _close(ours, theirs)


def test_fractional_max_pool_module_with_samples_matches_torch():
    samples = np.random.default_rng(1).uniform(0, 1, (2, 3, 2)).astype(np.float32)
    x = _float_input((2, 3, 9, 8))
    ours = tw.nn.FractionalMaxPool2d(2, output_ratio=0.5, return_indices=True,
                                     _random_samples=tw.tensor(samples))
    theirs = torch.nn.FractionalMaxPool2d(2, output_ratio=0.5, return_indices=True,
                                          _random_samples=torch.tensor(samples))
    assert set(dict(ours.named_buffers())) == set(dict(theirs.named_buffers())) == {"_random_samples"}
    _check_forward_backward(ours, theirs, *_run_both(ours, theirs, [x]))


def test_fractional_max_pool_draws_windows_without_samples():
    out, indices = tw.nn.FractionalMaxPool3d(2, output_size=(2, 3, 2), return_indices=True)(tw.randn(2, 3, 5, 6, 4))
    assert tuple(out.shape) == tuple(indices.shape) == (2, 3, 2, 3, 2)
    with pytest.raises(ValueError, match="output_ratio must be between 0 and 1"):
        tw.nn.FractionalMaxPool2d(2, output_ratio=1.5)
    with pytest.raises(ValueError, match="either an output size, or a pooling ratio"):
        tw.nn.FractionalMaxPool2d(2)


def test_conv_transpose_output_size_picks_the_output_padding():
    torch.manual_seed(0)
    ref = torch.nn.ConvTranspose2d(3, 2, 3, stride=(2, 3), padding=1)
    layer = tw.nn.ConvTranspose2d(3, 2, 3, stride=(2, 3), padding=1)
    _copy_weights(layer, ref)
    x = _float_input((1, 3, 4, 4))
    for size in [(8, 11), (7, 10), (1, 2, 8, 12)]:
        _close(layer(tw.tensor(x), output_size=size), ref(torch.tensor(x), output_size=size))
    with pytest.raises(ValueError, match="requested an output size of"):
        layer(tw.tensor(x), output_size=(9, 10))
    with pytest.raises(ValueError, match="requested an output size of"):
        ref(torch.tensor(x), output_size=(9, 10))


def test_reprs_match_torch():
    makers = [lambda nn: nn.MaxPool1d(3), lambda nn: nn.MaxPool3d(2, 1, 1), lambda nn: nn.AvgPool1d(3),
              lambda nn: nn.AvgPool3d(2), lambda nn: nn.AdaptiveAvgPool3d((1, None, 2)),
              lambda nn: nn.AdaptiveMaxPool2d(3, True), lambda nn: nn.LPPool2d(2, 3), lambda nn: nn.MaxUnpool2d(2),
              lambda nn: nn.ConvTranspose2d(2, 3, 3, stride=2, output_padding=1), lambda nn: nn.Conv3d(2, 3, 3),
              lambda nn: nn.ConstantPad2d(1, 3.5), lambda nn: nn.ReflectionPad1d(2),
              lambda nn: nn.ReplicationPad3d((1, 2, 3, 4, 5, 6)), lambda nn: nn.CircularPad2d(1),
              lambda nn: nn.ZeroPad1d(2), lambda nn: nn.Fold((4, 5), 2), lambda nn: nn.Unfold(2),
              lambda nn: nn.PixelShuffle(2), lambda nn: nn.Upsample(scale_factor=2, mode="bilinear"),
              lambda nn: nn.UpsamplingNearest2d(size=3), lambda nn: nn.UpsamplingBilinear2d(scale_factor=2),
              lambda nn: nn.ChannelShuffle(2)]
    for make in makers:
        assert repr(make(tw.nn)) == repr(make(torch.nn))


def test_reprs_of_the_models_published_examples_print_match_torch():
    """DCGAN prints its generator and discriminator, word_language_model its Transformer or RNN model."""
    makers = [lambda nn: nn.Sequential(nn.ConvTranspose2d(8, 8, 4, 1, 0, bias=False), nn.BatchNorm2d(8), nn.ReLU(True),
                                       nn.Tanh(), nn.Conv2d(3, 4, 4, 2, 1, bias=False),
                                       nn.LeakyReLU(0.2, inplace=True), nn.Sigmoid()),
              lambda nn: nn.TransformerEncoder(nn.TransformerEncoderLayer(8, 2, 16, 0.2), 1,
                                               enable_nested_tensor=False),
              lambda nn: nn.Transformer(d_model=8, nhead=2, dim_feedforward=16, num_encoder_layers=1,
                                        num_decoder_layers=1),
              lambda nn: nn.MultiheadAttention(8, 2, batch_first=True),
              lambda nn: nn.LSTM(4, 4, 2, dropout=0.2), lambda nn: nn.Embedding(10, 4), lambda nn: nn.Dropout(p=0.6)]
    for make in makers:
        assert repr(make(tw.nn)) == repr(make(torch.nn))
    layer = tw.nn.MultiheadAttention(8, 2).out_proj
    assert type(layer).__name__ == "NonDynamicallyQuantizableLinear" and isinstance(layer, tw.nn.Linear)


# ---------------------------------------------------------------------------- lazy modules

LAZY = {
    "LazyLinear": (lambda nn: nn.LazyLinear(3), (4, 5), "Linear"),
    "LazyConv1d": (lambda nn: nn.LazyConv1d(4, 3, padding=1), (2, 3, 7), "Conv1d"),
    "LazyConv2d": (lambda nn: nn.LazyConv2d(4, 3, groups=2, bias=False), (2, 6, 5, 5), "Conv2d"),
    "LazyConv3d": (lambda nn: nn.LazyConv3d(2, 2), (3, 4, 3, 4), "Conv3d"),
    "LazyConvTranspose1d": (lambda nn: nn.LazyConvTranspose1d(4, 3, stride=2), (2, 3, 5), "ConvTranspose1d"),
    "LazyConvTranspose2d": (lambda nn: nn.LazyConvTranspose2d(4, 2, groups=2), (2, 4, 3, 3), "ConvTranspose2d"),
    "LazyConvTranspose3d": (lambda nn: nn.LazyConvTranspose3d(2, 2), (1, 3, 2, 3, 2), "ConvTranspose3d"),
    "LazyBatchNorm1d": (lambda nn: nn.LazyBatchNorm1d(), (6, 4), "BatchNorm1d"),
    "LazyBatchNorm2d": (lambda nn: nn.LazyBatchNorm2d(momentum=None), (4, 3, 2, 2), "BatchNorm2d"),
    "LazyBatchNorm3d": (lambda nn: nn.LazyBatchNorm3d(affine=False), (2, 3, 2, 2, 2), "BatchNorm3d"),
    "LazyInstanceNorm1d": (lambda nn: nn.LazyInstanceNorm1d(affine=True), (2, 3, 5), "InstanceNorm1d"),
    "LazyInstanceNorm2d": (lambda nn: nn.LazyInstanceNorm2d(track_running_stats=True), (2, 3, 4, 4),
                           "InstanceNorm2d"),
    "LazyInstanceNorm3d": (lambda nn: nn.LazyInstanceNorm3d(), (2, 3, 2, 3, 2), "InstanceNorm3d"),
}


@pytest.mark.parametrize("name", LAZY)
def test_lazy_module_materialises_like_torch(name):
    make, shape, becomes = LAZY[name]
    ref, layer = make(torch.nn), make(tw.nn)
    assert repr(layer) == repr(ref)
    lazy_names = {n for n, p in ref.named_parameters()}
    assert {n for n, _ in layer.named_parameters()} == lazy_names
    assert all(isinstance(p, tw.nn.UninitializedParameter) for p in layer.parameters())
    before = {n: id(p) for n, p in layer.named_parameters()}
    x = _float_input(shape)
    ref(torch.tensor(x))
    layer(tw.tensor(x))
    assert type(layer).__name__ == type(ref).__name__ == becomes
    assert repr(layer) == repr(ref)
    assert {n: id(p) for n, p in layer.named_parameters()} == before  # materialised in place
    assert not any(isinstance(p, tw.nn.UninitializedParameter) for p in layer.parameters())
    for (n, p), (_, q) in zip(layer.state_dict().items(), ref.state_dict().items()):
        assert tuple(p.shape) == tuple(q.shape), n
    _copy_weights(layer, ref)
    ref.eval(), layer.eval()
    _check_forward_backward(layer, ref, *_run_both(layer, ref, [x]))


def test_lazy_module_loads_a_state_dict_and_trains():
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.Flatten(), torch.nn.Linear(4 * 4 * 4, 2))
    model = tw.nn.Sequential(tw.nn.LazyConv2d(4, 3), tw.nn.Flatten(), tw.nn.LazyLinear(2))
    _copy_weights(model, ref)  # materialises from the checkpoint's shapes
    assert tuple(model[2].weight.shape) == (2, 64)
    x = _float_input((5, 3, 6, 6))
    _close(model(tw.tensor(x)), ref(torch.tensor(x)))
    assert type(model[0]).__name__ == "Conv2d"
    optimizer = tw.optim.SGD(model.parameters(), lr=0.1)
    model(tw.tensor(x)).sum().backward()
    optimizer.step()
    ref(torch.tensor(x)).sum().backward()
    with torch.no_grad():
        for p in ref.parameters():
            p -= 0.1 * p.grad
    for (n, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
        _close(p, q, what=n)


def test_uninitialized_parameter_survives_deepcopy():
    import copy

    layer = tw.nn.LazyLinear(2)
    twin = copy.deepcopy(layer)
    twin(tw.ones(3, 4))
    assert tuple(twin.weight.shape) == (2, 4)
    assert isinstance(layer.weight, tw.nn.UninitializedParameter)
    layer(tw.ones(1, 6))
    assert tuple(layer.weight.shape) == (2, 6)


# ---------------------------------------------------------------------------- Transformer

def _transformer(nn, **kwargs):
    return nn.Transformer(d_model=8, nhead=2, num_encoder_layers=2, num_decoder_layers=2, dim_feedforward=16,
                          dropout=0.0, **kwargs)


@pytest.mark.parametrize("variant", ["default", "batch-first-norm-first-gelu", "masks"])
def test_transformer_matches_torch(variant):
    torch.manual_seed(0)
    kwargs = {"batch_first": True, "norm_first": True, "activation": "gelu"} if variant != "default" else {}
    if variant == "masks":
        kwargs = {"batch_first": True}
    ref, model = _transformer(torch.nn, **kwargs), _transformer(tw.nn, **kwargs)
    assert [n for n, _ in model.named_parameters()] == [n for n, _ in ref.named_parameters()]
    _copy_weights(model, ref)
    batch_first = kwargs.get("batch_first", False)
    src_shape, tgt_shape = ((2, 5, 8), (2, 4, 8)) if batch_first else ((5, 2, 8), (4, 2, 8))
    src, tgt = _float_input(src_shape), _float_input(tgt_shape, seed=1)
    ours_kw, theirs_kw = {}, {}
    if variant == "masks":
        padding = np.array([[False] * 5, [False, False, False, True, True]])
        tgt_padding = np.array([[False] * 4, [False, False, False, True]])
        ours_kw = {"tgt_mask": tw.nn.Transformer.generate_square_subsequent_mask(4),
                   "src_key_padding_mask": tw.tensor(padding), "memory_key_padding_mask": tw.tensor(padding),
                   "tgt_key_padding_mask": tw.tensor(tgt_padding)}
        theirs_kw = {"tgt_mask": torch.nn.Transformer.generate_square_subsequent_mask(4),
                     "src_key_padding_mask": torch.tensor(padding), "memory_key_padding_mask": torch.tensor(padding),
                     "tgt_key_padding_mask": torch.tensor(tgt_padding)}
        _close(ours_kw["tgt_mask"], theirs_kw["tgt_mask"])
    ours_in = [tw.tensor(a, requires_grad=True) for a in (src, tgt)]
    theirs_in = [torch.tensor(a, requires_grad=True) for a in (src, tgt)]
    out, ref_out = model(*ours_in, **ours_kw), ref(*theirs_in, **theirs_kw)
    _check_forward_backward(model, ref, ours_in, theirs_in, out, ref_out)


def test_transformer_decoder_with_causal_mask_hint_and_checks():
    torch.manual_seed(0)
    ref_layer = torch.nn.TransformerDecoderLayer(8, 2, 16, dropout=0.0)
    ref = torch.nn.TransformerDecoder(ref_layer, 2, norm=torch.nn.LayerNorm(8))
    model = tw.nn.TransformerDecoder(tw.nn.TransformerDecoderLayer(8, 2, 16, dropout=0.0), 2, norm=tw.nn.LayerNorm(8))
    _copy_weights(model, ref)
    tgt, memory = _float_input((4, 2, 8)), _float_input((6, 2, 8), seed=1)
    mask = torch.nn.Transformer.generate_square_subsequent_mask(4)
    out = model(tw.tensor(tgt), tw.tensor(memory), tgt_mask=tw.tensor(mask.numpy()), tgt_is_causal=True)
    _close(out, ref(torch.tensor(tgt), torch.tensor(memory), tgt_mask=mask, tgt_is_causal=True))
    with pytest.raises(RuntimeError, match="the feature number of src and tgt must be equal to d_model"):
        _transformer(tw.nn)(tw.ones(5, 2, 8), tw.ones(4, 2, 6))
    with pytest.raises(RuntimeError, match="the batch number of src and tgt must be equal"):
        _transformer(tw.nn)(tw.ones(5, 2, 8), tw.ones(4, 3, 8))


# ---------------------------------------------------------------------------- containers

def _ones(nn_module, *shape):
    return (torch if nn_module is torch.nn else tw).ones(*shape)


def _parameter_dict_methods(nn):
    d = nn.ParameterDict({"a": _ones(nn, 2), "b": _ones(nn, 3)})
    d.update([("c", _ones(nn, 1))])
    seen = [list(d.keys()), d.get("z", 5), tuple(d.pop("a").shape), "a" in d, d.popitem()[0], list(d)]
    return seen + [tuple(d.setdefault("q", _ones(nn, 2)).shape), list(reversed(d))]


CONTAINER_CASES = {
    "ParameterList-slice": lambda nn: len(nn.ParameterList([_ones(nn, 1), _ones(nn, 2), _ones(nn, 3)])[1:]),
    "ParameterList-iadd": lambda nn: len(nn.ParameterList([_ones(nn, 1)]).__iadd__([_ones(nn, 2)])),
    "ParameterList-setitem-wraps": lambda nn: (lambda p: (p.__setitem__(-1, _ones(nn, 4)),
                                                          isinstance(p[0], nn.Parameter), tuple(p[0].shape))[1:])(
        nn.ParameterList([_ones(nn, 1)])),
    "ParameterList-objects": lambda nn: (lambda p: (p[1], [n for n, _ in p.named_parameters()]))(
        nn.ParameterList([_ones(nn, 2), "a", _ones(nn, 1)])),
    "ParameterList-objects-repr": lambda nn: repr(nn.ParameterList([1, "a"])),
    "ParameterList-extend-tensor": lambda nn: nn.ParameterList().extend(_ones(nn, 2)),
    "ParameterDict-sorted": lambda nn: [n for n, _ in nn.ParameterDict({"b": _ones(nn, 1), "a": _ones(nn, 2)})
                                        .named_parameters()],
    "ParameterDict-methods": lambda nn: _parameter_dict_methods(nn),
    "ParameterDict-or-copy-fromkeys": lambda nn: (
        list((nn.ParameterDict({"a": _ones(nn, 1)}) | nn.ParameterDict({"b": _ones(nn, 1)})).keys()),
        list(nn.ParameterDict({"a": _ones(nn, 1)}).copy().keys()), list(nn.ParameterDict().fromkeys(["x", "y"]))),
    "ParameterDict-object-values": lambda nn: nn.ParameterDict({"b": 3})["b"],
    "ParameterDict-bad-key": lambda nn: nn.ParameterDict({1: _ones(nn, 1)}),
    "ParameterDict-bad-pair": lambda nn: nn.ParameterDict([("a", _ones(nn, 1), 3)]),
    "ModuleDict-pairs": lambda nn: (lambda d: (d.update([("z", nn.ReLU())]), list(d.keys()))[1])(
        nn.ModuleDict([("b", nn.ReLU()), ("a", nn.Tanh())])),
    "ModuleDict-bad-key": lambda nn: nn.ModuleDict({1: nn.ReLU()}),
    "ModuleDict-bad-pair": lambda nn: nn.ModuleDict().update([("a", nn.ReLU(), 3)]),
    "ModuleDict-bad-element": lambda nn: nn.ModuleDict().update([3]),
    "Sequential-mul": lambda nn: repr(nn.Sequential(nn.ReLU(), nn.Tanh()) * 2),
    "Sequential-rmul-imul": lambda nn: (len(2 * nn.Sequential(nn.ReLU())),
                                        repr((lambda s: s.__imul__(3))(nn.Sequential(nn.ReLU())))),
    "Sequential-mul-zero": lambda nn: nn.Sequential(nn.ReLU()) * 0,
}


def _outcome(fn, nn):
    try:
        return "ok", fn(nn)
    except Exception as exc:  # noqa: BLE001 — the exception type is what is compared
        return type(exc).__name__, None


@pytest.mark.parametrize("case", CONTAINER_CASES)
def test_container_behaviour_matches_torch(case):
    fn = CONTAINER_CASES[case]
    assert _outcome(fn, tw.nn) == _outcome(fn, torch.nn)


# ---------------------------------------------------------------------------- errors

def _t(lib, *shape, dtype=None):
    if lib is torch:
        return torch.ones(*shape) if dtype is None else torch.ones(*shape, dtype=getattr(torch, dtype))
    return tw.ones(*shape) if dtype is None else tw.ones(*shape, dtype=getattr(tw, dtype))


BAD_CALLS = {
    "max_pool3d-rank": lambda lib, f: f.max_pool3d(_t(lib, 2, 3, 4), 2),
    "max_pool1d-pad": lambda lib, f: f.max_pool1d(_t(lib, 2, 3, 4), 2, padding=2),
    "max_pool3d-too-small": lambda lib, f: f.max_pool3d(_t(lib, 1, 3, 4, 4, 4), 5),
    "avg_pool1d-rank": lambda lib, f: f.avg_pool1d(_t(lib, 3, 4, 4, 4), 5),
    "adaptive_max_pool2d-empty": lambda lib, f: f.adaptive_max_pool2d(_t(lib, 1, 3, 0, 4), 5),
    "adaptive_max_pool2d-int": lambda lib, f: f.adaptive_max_pool2d(_t(lib, 1, 4, 4, dtype="int64"), 2),
    "adaptive_avg_pool3d-rank": lambda lib, f: f.adaptive_avg_pool3d(_t(lib, 1, 3, 4), 5),
    "conv3d-kernel-too-large": lambda lib, f: f.conv3d(_t(lib, 1, 2, 2, 2, 2), _t(lib, 2, 2, 3, 3, 3)),
    "conv_transpose2d-output-padding": lambda lib, f: f.conv_transpose2d(_t(lib, 1, 2, 4, 4), _t(lib, 2, 3, 3, 3),
                                                                         output_padding=1),
    "conv_transpose2d-channels": lambda lib, f: f.conv_transpose2d(_t(lib, 1, 3, 4, 4), _t(lib, 2, 3, 3, 3)),
    "conv_transpose1d-bias": lambda lib, f: f.conv_transpose1d(_t(lib, 1, 2, 4), _t(lib, 2, 3, 3), _t(lib, 2)),
    "max_unpool2d-index": lambda lib, f: f.max_unpool2d(_t(lib, 1, 2, 2, 2), _t(lib, 1, 2, 2, 2, dtype="int64") * 20,
                                                        2),
    "max_unpool2d-output-size": lambda lib, f: f.max_unpool2d(_t(lib, 1, 2, 2, 2), _t(lib, 1, 2, 2, 2, dtype="int64"),
                                                              2, output_size=(7, 7)),
    "fractional-no-size": lambda lib, f: f.fractional_max_pool2d(_t(lib, 1, 2, 5, 5), 3),
    "fractional-pool-too-large": lambda lib, f: f.fractional_max_pool2d(_t(lib, 1, 2, 5, 5), 3, output_size=4),
    "fractional-samples-channels": lambda lib, f: f.fractional_max_pool2d(_t(lib, 1, 2, 5, 5), 2, output_size=3,
                                                                          _random_samples=_t(lib, 1, 3, 2)),
    "fold-channels": lambda lib, f: f.fold(_t(lib, 1, 7, 4), (3, 3), 2),
    "fold-blocks": lambda lib, f: f.fold(_t(lib, 1, 8, 5), (3, 3), 2),
    "interpolate-linear-rank": lambda lib, f: f.interpolate(_t(lib, 1, 2, 4, 4), size=3, mode="linear"),
    "interpolate-bilinear-rank": lambda lib, f: f.interpolate(_t(lib, 1, 2, 4), size=3, mode="bilinear"),
    "interpolate-area-align": lambda lib, f: f.interpolate(_t(lib, 1, 2, 4), size=3, mode="area", align_corners=True),
    "interpolate-mode": lambda lib, f: f.interpolate(_t(lib, 1, 2, 4), size=3, mode="foo"),
    "grid_sample-mode": lambda lib, f: f.grid_sample(_t(lib, 1, 1, 3, 3), _t(lib, 1, 2, 2, 2), mode="foo"),
    "grid_sample-padding": lambda lib, f: f.grid_sample(_t(lib, 1, 1, 3, 3), _t(lib, 1, 2, 2, 2), padding_mode="x"),
    "affine_grid-theta": lambda lib, f: f.affine_grid(_t(lib, 1, 3, 3), (1, 1, 4, 4)),
    "channel_shuffle-groups": lambda lib, f: f.channel_shuffle(_t(lib, 1, 5, 2, 2), 2),
    "ConvTranspose2d-reflect": lambda lib, f: lib.nn.ConvTranspose2d(2, 2, 3, padding_mode="reflect"),
    "CircularPad1d-rank": lambda lib, f: lib.nn.CircularPad1d(1)(_t(lib, 1, 1, 2, 2)),
    "ReflectionPad1d-too-large": lambda lib, f: lib.nn.ReflectionPad1d(4)(_t(lib, 1, 2, 3)),
}


@pytest.mark.parametrize("case", BAD_CALLS)
def test_bad_arguments_raise_what_torch_raises(case):
    call = BAD_CALLS[case]
    with pytest.raises(Exception) as theirs:  # noqa: PT011 — the type torch raises is the expectation
        call(torch, torch.nn.functional)
    with pytest.raises(theirs.type):
        call(tw, tw.nn.functional)


def test_optimizer_made_before_the_first_call_updates_the_materialised_parameters():
    tw.manual_seed(0)
    model = tw.nn.Sequential(tw.nn.LazyLinear(4), tw.nn.ReLU(), tw.nn.LazyLinear(2))
    optimizer = tw.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x = tw.randn(5, 3)
    losses = []
    for _ in range(3):
        optimizer.zero_grad()
        loss = model(x).pow(2).sum()
        loss.backward()
        optimizer.step()
        losses.append(float(loss))
    assert [tuple(p.shape) for p in model.parameters()] == [(4, 3), (4,), (2, 4), (2,)]
    assert losses[-1] < losses[0]


def test_compiled_lazy_module_materialises_at_its_first_call():
    layer = tw.nn.LazyLinear(2)
    compiled = tw.compile(layer)
    x = tw.randn(5, 3)
    out = compiled(x)
    assert type(layer).__name__ == "Linear" and tuple(layer.weight.shape) == (2, 3)
    _close(out, torch.nn.functional.linear(torch.tensor(x.numpy()), torch.tensor(layer.weight.detach().numpy()),
                                           torch.tensor(layer.bias.detach().numpy())))

"""Memory formats (``channels_last``, ``channels_last_3d``): which strides each tensor gets, compared with torch's
``.stride()`` for the same tensor built the same way in both, and the values beside them.

Covered: ``is_contiguous``/``contiguous``/``clone``/``to``/``empty``/``*_like`` with ``memory_format``, the stride
order pointwise results take from their operands (torch's TensorIterator), the operators that keep or drop a
channels-last layout, convolutions and their gradients, ``.grad``'s layout contract, ``Module.to``, checkpoints,
compiled functions, and the errors.
"""

from __future__ import annotations

import itertools
import random
import re

import numpy as np
import pytest
import torch
import torch.nn.functional as torch_F

import tilewise as tw
import tilewise.nn.functional as tw_F
from tilewise import strides as S

FORMATS = ("contiguous_format", "channels_last", "channels_last_3d", "preserve_format")


def fmt(lib, name):
    return getattr(lib, name)


def build(lib, shape, order=None, step=None, device="cpu"):
    """The same tensor in torch or tilewise: values 0..n-1 of ``shape`` in memory order, its dims laid out in
    memory in ``order`` (outermost first; default row-major), then sliced with ``step`` along the last dim."""
    order = tuple(range(len(shape))) if order is None else tuple(order)
    physical = lib.arange(int(np.prod(shape)), dtype=lib.float32).reshape([shape[d] for d in order])
    if device != "cpu":
        physical = physical.to(device)
    t = physical.permute(*sorted(range(len(order)), key=order.__getitem__)) if order else physical
    return t[..., ::step] if step else t


def same_layout(ours, theirs):
    assert tuple(ours.shape) == tuple(theirs.shape)
    assert ours.stride() == theirs.stride(), (ours.stride(), theirs.stride())
    np.testing.assert_allclose(ours.detach().cpu().numpy().astype(np.float64),
                               theirs.detach().cpu().numpy().astype(np.float64), rtol=1e-5, atol=1e-5)


LAYOUTS = [  # (shape, order of dims in memory, slice step of the last dim)
    ((2, 3, 4, 5), None, None), ((2, 3, 4, 5), (0, 2, 3, 1), None), ((2, 3, 4, 5), (3, 2, 1, 0), None),
    ((2, 3, 1, 1), (0, 2, 3, 1), None), ((2, 1, 4, 5), (0, 2, 3, 1), None), ((1, 3, 1, 1), None, None),
    ((2, 1, 1, 1), (0, 2, 3, 1), None), ((1, 1, 4, 5), (0, 2, 3, 1), None), ((0, 3, 4, 5), (0, 2, 3, 1), None),
    ((2, 0, 4, 5), (0, 2, 3, 1), None), ((2, 3, 4, 6), (0, 2, 3, 1), 2), ((2, 3, 4, 6), None, 2),
    ((2, 3, 4, 5, 6), (0, 2, 3, 4, 1), None), ((2, 3, 4, 5, 6), None, None), ((2, 3, 4, 5, 6), (0, 2, 3, 4, 1), 2),
    ((4, 5), (1, 0), None), ((3,), None, None), ((), None, None), ((2, 3, 4), (0, 2, 1), None),
    ((4, 6), (1, 0), 2), ((2, 3, 4, 6), (0, 3, 1, 2), 2),
]
LAYOUT_IDS = [f"{s}-{o}-{k}" for s, o, k in LAYOUTS]


# ---------------------------------------------------------------------------- the enumerations

def test_formats_are_exported_like_torch():
    for name in FORMATS:
        assert repr(fmt(tw, name)) == f"tilewise.{name}"
        assert isinstance(fmt(tw, name), tw.memory_format)
    with pytest.raises(TypeError):
        tw.memory_format()


# ---------------------------------------------------------------------------- is_contiguous

@pytest.mark.parametrize("shape, order, step", LAYOUTS, ids=LAYOUT_IDS)
def test_is_contiguous_in_each_format_like_torch(shape, order, step):
    ours, theirs = build(tw, shape, order, step), build(torch, shape, order, step)
    for name in FORMATS:
        assert ours.is_contiguous(memory_format=fmt(tw, name)) == theirs.is_contiguous(memory_format=fmt(torch, name))


def test_is_contiguous_channels_last_is_not_the_default_answer():
    """The argument was once ignored: a channels-last tensor answered for the contiguous format."""
    x = tw.empty(2, 3, 4, 5)
    assert x.is_contiguous(memory_format=tw.contiguous_format)
    assert not x.is_contiguous(memory_format=tw.channels_last)
    y = x.contiguous(memory_format=tw.channels_last)
    assert y.is_contiguous(memory_format=tw.channels_last) and not y.is_contiguous()


def test_is_contiguous_rejects_what_is_not_a_memory_format():
    with pytest.raises(TypeError, match="memory_format"):
        tw.empty(2).is_contiguous(memory_format="channels_last")


# ---------------------------------------------------------------------------- new tensors in a format

@pytest.mark.parametrize("shape", [(2, 3, 4, 5), (0, 3, 4, 5), (2, 0, 4, 5), (2, 3, 1, 1), (1, 1, 1, 1),
                                   (2, 3, 4, 5, 6), (2, 3, 0, 5, 6)])
@pytest.mark.parametrize("name", ["contiguous_format", "channels_last", "channels_last_3d"])
def test_empty_in_a_format_like_torch(shape, name):
    def make(lib):
        return lib.empty(*shape, memory_format=fmt(lib, name))

    rank = {"channels_last": 4, "channels_last_3d": 5}.get(name)
    if rank is not None and rank != len(shape):
        with pytest.raises(RuntimeError, match=f"required rank {rank} tensor to use {name} format"):
            make(tw)
        with pytest.raises(RuntimeError, match=f"required rank {rank} tensor to use {name} format"):
            make(torch)
        return
    assert make(tw).stride() == make(torch).stride()


def test_empty_refuses_preserve_format_and_strings():
    with pytest.raises(RuntimeError, match="unsupported memory format Preserve"):
        tw.empty(2, 3, memory_format=tw.preserve_format)
    with pytest.raises(TypeError, match="memory_format"):
        tw.empty(2, 3, memory_format="channels_last")


LIKES = [
    ("empty_like", lambda lib, x, **kw: lib.empty_like(x, **kw)),
    ("zeros_like", lambda lib, x, **kw: lib.zeros_like(x, **kw)),
    ("ones_like", lambda lib, x, **kw: lib.ones_like(x, **kw)),
    ("full_like", lambda lib, x, **kw: lib.full_like(x, 7.0, **kw)),
    ("rand_like", lambda lib, x, **kw: lib.rand_like(x, **kw)),
    ("randn_like", lambda lib, x, **kw: lib.randn_like(x, **kw)),
    ("randint_like", lambda lib, x, **kw: lib.randint_like(x, 5, **kw)),
]


@pytest.mark.parametrize("name, like", LIKES, ids=[n for n, _ in LIKES])
@pytest.mark.parametrize("shape, order, step", [LAYOUTS[k] for k in (0, 1, 2, 3, 9, 10, 12, 14, 15)],
                         ids=[LAYOUT_IDS[k] for k in (0, 1, 2, 3, 9, 10, 12, 14, 15)])
def test_like_factories_preserve_or_take_a_format_like_torch(name, like, shape, order, step):
    ours, theirs = build(tw, shape, order, step), build(torch, shape, order, step)
    assert like(tw, ours).stride() == like(torch, theirs).stride()
    for mf in ("contiguous_format", "preserve_format", "channels_last"):
        if mf == "channels_last" and len(shape) != 4:
            with pytest.raises(RuntimeError, match="required rank 4"):
                like(tw, ours, memory_format=tw.channels_last)
            continue
        assert like(tw, ours, memory_format=fmt(tw, mf)).stride() == \
            like(torch, theirs, memory_format=fmt(torch, mf)).stride()


def test_like_factories_fill_every_element():
    x = tw.empty(2, 3, 4, 5, memory_format=tw.channels_last)
    assert tw.full_like(x, 3.0).eq(3.0).all()
    assert tw.ones_like(x, memory_format=tw.contiguous_format).sum().item() == x.numel()
    r = tw.rand_like(x, requires_grad=True)
    assert r.requires_grad and r.is_leaf and r.stride() == x.stride()


# ---------------------------------------------------------------------------- copies in a format

@pytest.mark.parametrize("shape, order, step", LAYOUTS, ids=LAYOUT_IDS)
def test_clone_and_contiguous_in_each_format_like_torch(shape, order, step):
    ours, theirs = build(tw, shape, order, step), build(torch, shape, order, step)
    same_layout(ours.clone(), theirs.clone())
    for name in FORMATS:
        for method in ("clone", "contiguous"):
            try:
                expected = getattr(theirs, method)(memory_format=fmt(torch, name))
            except RuntimeError as exc:
                with pytest.raises(RuntimeError, match=str(exc)):
                    getattr(ours, method)(memory_format=fmt(tw, name))
                continue
            got = getattr(ours, method)(memory_format=fmt(tw, name))
            same_layout(got, expected)
            assert (got is ours) == (expected is theirs)


@pytest.mark.parametrize("shape, order, step", LAYOUTS, ids=LAYOUT_IDS)
def test_to_keeps_or_changes_the_format_like_torch(shape, order, step):
    ours, theirs = build(tw, shape, order, step), build(torch, shape, order, step)
    same_layout(ours.to(tw.float64), theirs.to(torch.float64))
    same_layout(ours.to(tw.int32), theirs.to(torch.int32))
    for name in FORMATS:
        try:
            expected = theirs.to(memory_format=fmt(torch, name))
        except RuntimeError as exc:
            with pytest.raises(RuntimeError, match=str(exc)):
                ours.to(memory_format=fmt(tw, name))
            continue
        got = ours.to(memory_format=fmt(tw, name))
        same_layout(got, expected)
        assert (got is ours) == (expected is theirs)
        same_layout(ours.to(tw.float16, memory_format=fmt(tw, name)),
                    theirs.to(torch.float16, memory_format=fmt(torch, name)))


def test_to_rejects_what_is_not_a_memory_format():
    with pytest.raises(TypeError, match="memory_format"):
        tw.empty(2, 3, 4, 5).to(memory_format="channels_last")


def test_resize_takes_a_memory_format_like_torch():
    results = []
    for lib in (tw, torch):
        template = lib.zeros(2, 3, 4, 5).contiguous(memory_format=lib.channels_last)
        same = lib.zeros(2, 3, 4, 5).resize_(2, 3, 4, 5, memory_format=lib.channels_last)
        grown = lib.zeros(6).resize_(2, 3, 4, 5, memory_format=lib.channels_last)
        plain = lib.zeros(6).resize_as_(template)
        preserved = lib.zeros(6).resize_as_(template, memory_format=lib.preserve_format)
        results.append([t.stride() for t in (same, grown, plain, preserved)])
        with pytest.raises(RuntimeError, match="Unsupported memory formatPreserve"):
            lib.zeros(6).resize_(2, 3, 4, 5, memory_format=lib.preserve_format)
        with pytest.raises(RuntimeError, match="required rank 4 tensor to use channels_last format"):
            lib.zeros(6).resize_(2, 3, memory_format=lib.channels_last)
    assert results[0] == results[1]


# ---------------------------------------------------------------------------- pointwise results

def _random_operands(rng, shape):
    """1 to 3 operands broadcastable to ``shape``, each in a random dim order, some with dims of size 1 or
    missing, and now and then a 0-dim tensor among them."""
    perms = list(itertools.permutations(range(len(shape))))
    specs = []
    for _ in range(rng.choice([1, 2, 3])):
        own = list(shape)
        if rng.random() < 0.3:
            own = [1 if rng.random() < 0.4 else n for n in own]
        order = rng.choice(perms)
        if rng.random() < 0.15 and len(own) > 1:
            own, order = own[1:], None
        specs.append((tuple(own), order))
    if rng.random() < 0.2 and len(specs) < 3:
        specs.insert(rng.randrange(len(specs) + 1), ((), None))
    return specs


def _pointwise(lib, operands):
    if len(operands) == 1:
        return operands[0].exp()
    if len(operands) == 2:
        return operands[0] + operands[1]
    return lib.addcmul(operands[0], operands[1], operands[2])


def test_pointwise_stride_rule_matches_torch_tensor_iterator():
    """``strides.pointwise_strides`` against torch on random mixes of layouts, broadcasts, size-1 and empty dims
    and 0-dim operands (the order torch's TensorIterator picks is subtle; this is its specification here)."""
    rng = random.Random(0)
    shapes = [(2, 3, 4, 5), (2, 3, 1, 1), (2, 1, 4, 5), (1, 3, 1, 1), (0, 3, 4, 5), (2, 0, 4, 5), (1, 1, 1, 1),
              (4, 5), (3, 1), (2, 3, 4), (2, 1, 2, 1, 3)]
    for shape in shapes:
        for _ in range(60):
            specs = _random_operands(rng, shape)
            operands = [build(torch, s, o) for s, o in specs]
            expected = _pointwise(torch, operands)
            got = S.pointwise_strides(tuple(expected.shape), [(tuple(t.shape), t.stride()) for t in operands])
            assert got == expected.stride(), (specs, got, expected.stride())


POINTWISE_CASES = {
    "cl + contiguous": lambda lib, make: make((2, 3, 4, 5), (0, 2, 3, 1)) + make((2, 3, 4, 5)),
    "contiguous + cl": lambda lib, make: make((2, 3, 4, 5)) + make((2, 3, 4, 5), (0, 2, 3, 1)),
    "cl + bias": lambda lib, make: make((2, 3, 4, 5), (0, 2, 3, 1)) + make((3, 1, 1)),
    "bias + cl": lambda lib, make: make((3, 1, 1)) + make((2, 3, 4, 5), (0, 2, 3, 1)),
    "cl * number": lambda lib, make: make((2, 3, 4, 5), (0, 2, 3, 1)) * 2,
    "cl * 0-dim": lambda lib, make: make((2, 3, 4, 5), (0, 2, 3, 1)) * lib.tensor(2.0),
    "exp of cl": lambda lib, make: make((2, 3, 4, 5), (0, 2, 3, 1)).exp(),
    "exp of cl3d": lambda lib, make: make((2, 3, 4, 5, 6), (0, 2, 3, 4, 1)).exp(),
    "exp of NC11": lambda lib, make: make((2, 3, 1, 1), (0, 2, 3, 1)).exp(),
    "exp of empty cl": lambda lib, make: make((0, 3, 4, 5), (0, 2, 3, 1)).exp(),
    "empty cl + 1": lambda lib, make: make((0, 3, 4, 5), (0, 2, 3, 1)) + 1,
    "transposed + row-major": lambda lib, make: make((4, 5), (1, 0)) + make((4, 5)),
    "not dense": lambda lib, make: make((2, 3, 4, 6), (0, 2, 3, 1), 2).sin(),
    "where cl": lambda lib, make: lib.where(make((2, 3, 4, 5), (0, 2, 3, 1)) > 10, make((2, 3, 4, 5)), 0.0),
    "where contiguous condition": lambda lib, make: lib.where(make((2, 3, 4, 5)) > 10,
                                                        make((2, 3, 4, 5), (0, 2, 3, 1)), 0.0),
    "addcmul": lambda lib, make: lib.addcmul(make((3, 1, 1)), make((2, 3, 4, 5), (0, 2, 3, 1)),
                                       make((2, 3, 4, 5))),
    "lerp": lambda lib, make: lib.lerp(make((2, 3, 4, 5), (0, 2, 3, 1)), make((2, 3, 4, 5)), 0.25),
    "comparison": lambda lib, make: make((2, 3, 4, 5), (0, 2, 3, 1)) > 3,
    "in place keeps self": lambda lib, make: make((2, 3, 4, 5)).add_(make((2, 3, 4, 5), (0, 2, 3, 1))),
    "in place on cl": lambda lib, make: make((2, 3, 4, 5), (0, 2, 3, 1)).mul_(make((2, 3, 4, 5))),
    "cast": lambda lib, make: make((2, 3, 4, 5), (0, 2, 3, 1)).double(),
}


@pytest.mark.parametrize("case", list(POINTWISE_CASES))
def test_pointwise_results_take_torch_strides(case):
    same_layout(POINTWISE_CASES[case](tw, _maker(tw)), POINTWISE_CASES[case](torch, _maker(torch)))


def _maker(lib, device="cpu"):
    def make(shape, order=None, step=None):
        return build(lib, shape, order, step, device)

    return make


# ---------------------------------------------------------------------------- operators that keep or drop it

def varied(lib, shape, order=None, device="cpu"):
    """Values in [-1, 1] without the regularity of ``build``'s ramp, whose normalisations cancel to rounding
    noise."""
    return (build(lib, shape, order, device=device) * 0.37).sin()


def _bn(lib, nnf, x):
    return nnf.batch_norm(x, None, None, x.new_ones(4), x.new_zeros(4), training=True)


OPERATORS = {
    "relu": lambda lib, nnf, x: nnf.relu(x),
    "gelu": lambda lib, nnf, x: nnf.gelu(x),
    "dropout (eval)": lambda lib, nnf, x: nnf.dropout(x, 0.5, training=False),
    "batch_norm": _bn,
    "batch_norm eval": lambda lib, nnf, x: nnf.batch_norm(x, x.new_zeros(4), x.new_ones(4), x.new_ones(4),
                                                          x.new_zeros(4)),
    "group_norm": lambda lib, nnf, x: nnf.group_norm(x, 2, x.new_ones(4), x.new_zeros(4)),
    "layer_norm": lambda lib, nnf, x: nnf.layer_norm(x, (8,)),
    "instance_norm": lambda lib, nnf, x: nnf.instance_norm(x),
    "softmax": lambda lib, nnf, x: nnf.softmax(x, 1),
    "log_softmax": lambda lib, nnf, x: nnf.log_softmax(x, 1),
    "max_pool2d": lambda lib, nnf, x: nnf.max_pool2d(x, 2),
    "max_pool2d overlapping": lambda lib, nnf, x: nnf.max_pool2d(x, 3, 1, 1),
    "avg_pool2d": lambda lib, nnf, x: nnf.avg_pool2d(x, 2),
    "adaptive_avg_pool2d 1x1": lambda lib, nnf, x: nnf.adaptive_avg_pool2d(x, 1),
    "adaptive_avg_pool2d 3x4": lambda lib, nnf, x: nnf.adaptive_avg_pool2d(x, (3, 4)),
    "adaptive_max_pool2d": lambda lib, nnf, x: nnf.adaptive_max_pool2d(x, (3, 4)),
    "interpolate nearest": lambda lib, nnf, x: nnf.interpolate(x, scale_factor=2),
    "interpolate bilinear": lambda lib, nnf, x: nnf.interpolate(x, scale_factor=2, mode="bilinear"),
    "pad": lambda lib, nnf, x: nnf.pad(x, (1, 2, 1, 0)),
    "cat channels": lambda lib, nnf, x: lib.cat([x, x], 1),
    "cat mixed": lambda lib, nnf, x: lib.cat([x, x.contiguous()], 1),
    "sum keepdim": lambda lib, nnf, x: x.sum(1, keepdim=True),
    "mean hw": lambda lib, nnf, x: x.mean((2, 3), keepdim=True),
    "flatten": lambda lib, nnf, x: x.flatten(1),
}


@pytest.mark.parametrize("name", list(OPERATORS))
@pytest.mark.parametrize("order", [(0, 2, 3, 1), None], ids=["channels_last", "contiguous"])
def test_operator_result_and_input_gradient_layouts_like_torch(name, order):
    results = []
    for lib, nnf in ((tw, tw_F), (torch, torch_F)):
        x = varied(lib, (2, 4, 6, 8), order).requires_grad_()
        y = OPERATORS[name](lib, nnf, x)
        y.backward(varied(lib, tuple(y.shape)))
        results.append((y, x.grad))
    same_layout(results[0][0], results[1][0])
    same_layout(results[0][1], results[1][1])


POOLINGS = {  # torch keeps a batched channels-last input's format, but not channels_last_3d in 3-D averages
    "max_pool2d": lambda nnf, x: nnf.max_pool2d(x, 2), "max_pool3d": lambda nnf, x: nnf.max_pool3d(x, 2),
    "avg_pool3d": lambda nnf, x: nnf.avg_pool3d(x, 2), "max_pool1d": lambda nnf, x: nnf.max_pool1d(x, 2),
    "adaptive_avg_pool3d": lambda nnf, x: nnf.adaptive_avg_pool3d(x, 2),
    "adaptive_max_pool3d": lambda nnf, x: nnf.adaptive_max_pool3d(x, 2),
    "adaptive_avg_pool3d 1x1x1": lambda nnf, x: nnf.adaptive_avg_pool3d(x, 1),
}
POOLING_INPUTS = {1: [((3, 6), (1, 0)), ((2, 3, 6), (2, 1, 0))],
                  2: [((2, 3, 6, 6), (0, 2, 3, 1)), ((3, 6, 6), (2, 1, 0))],
                  3: [((2, 3, 6, 6, 6), (0, 2, 3, 4, 1)), ((3, 6, 6, 6), (3, 2, 1, 0))]}


@pytest.mark.parametrize("name", list(POOLINGS))
def test_pooling_layouts_of_batched_and_unbatched_inputs_like_torch(name):
    for shape, order in POOLING_INPUTS[int(name.split("_pool")[1][0])]:
        ours = POOLINGS[name](tw_F, varied(tw, shape, order))
        same_layout(ours, POOLINGS[name](torch_F, varied(torch, shape, order)))


POOLING_GRADIENTS = {  # the gradient an intermediate channels-last activation receives (a leaf's takes its own)
    "max_pool2d": lambda lib, nnf, x: nnf.max_pool2d(x, 3, 2, 1),
    "max_pool3d": lambda lib, nnf, x: nnf.max_pool3d(x, 3, 2, 1),
    "adaptive_max_pool2d": lambda lib, nnf, x: nnf.adaptive_max_pool2d(x, 3),
    "adaptive_max_pool3d": lambda lib, nnf, x: nnf.adaptive_max_pool3d(x, 3),  # row-major in torch
    "fractional_max_pool2d": lambda lib, nnf, x: nnf.fractional_max_pool2d(  # row-major in torch
        x, 2, output_size=3, _random_samples=lib.full((2, 3, 2), 0.3)),
}


@pytest.mark.parametrize("name", list(POOLING_GRADIENTS))
def test_max_pooling_input_gradient_layouts_like_torch(name):
    spatial = int(name.split("_pool")[1][0])
    results = []
    for lib, nnf in ((tw, tw_F), (torch, torch_F)):
        x = varied(lib, (2, 3) + (7,) * spatial, (0, *range(2, spatial + 2), 1)).requires_grad_()
        h = x * 1
        seen = {}
        h.register_hook(lambda g, seen=seen: seen.setdefault("grad", g))
        y = POOLING_GRADIENTS[name](lib, nnf, h)
        y.backward(varied(lib, tuple(y.shape)))
        results.append(seen["grad"])
    same_layout(results[0], results[1])
    np.testing.assert_allclose(results[0].numpy(), results[1].numpy(), rtol=1e-5, atol=1e-6)  # overlapping windows


# ---------------------------------------------------------------------------- convolution

CONVOLUTIONS = [  # (function, input shape, weight shape, groups, input layout, weight layout, bias)
    ("conv2d", (2, 4, 6, 7), (6, 4, 3, 3), 1, None, None, False),
    ("conv2d", (2, 4, 6, 7), (6, 4, 3, 3), 1, (0, 2, 3, 1), None, False),
    ("conv2d", (2, 4, 6, 7), (6, 4, 3, 3), 1, None, (0, 2, 3, 1), False),
    ("conv2d", (2, 4, 6, 7), (6, 4, 3, 3), 1, (0, 2, 3, 1), (0, 2, 3, 1), True),
    ("conv2d", (2, 4, 6, 7), (6, 2, 3, 3), 2, (0, 2, 3, 1), None, True),
    ("conv2d", (2, 4, 3, 3), (6, 4, 3, 3), 1, (0, 2, 3, 1), None, False),
    ("conv2d", (1, 1, 5, 5), (2, 1, 3, 3), 1, (0, 2, 3, 1), None, False),
    ("conv_transpose2d", (2, 4, 6, 7), (4, 3, 3, 3), 1, (0, 2, 3, 1), None, True),
    ("conv_transpose2d", (2, 4, 6, 7), (4, 3, 3, 3), 1, None, (0, 2, 3, 1), False),
    ("conv3d", (2, 4, 5, 6, 7), (6, 4, 3, 3, 3), 1, (0, 2, 3, 4, 1), None, False),
    ("conv3d", (2, 4, 5, 6, 7), (6, 4, 3, 3, 3), 1, None, (0, 2, 3, 4, 1), True),
    ("conv_transpose3d", (2, 4, 5, 6, 7), (4, 3, 3, 3, 3), 1, (0, 2, 3, 4, 1), None, False),
]


def _convolve(lib, nnf, case, device="cpu"):
    name, x_shape, w_shape, groups, x_order, w_order, bias = case
    x = varied(lib, x_shape, x_order, device).requires_grad_()
    w = varied(lib, w_shape, w_order, device).requires_grad_()
    b = lib.arange(w_shape[1] * groups if "transpose" in name else w_shape[0], dtype=lib.float32) / 10
    y = getattr(nnf, name)(x, w, b.to(device) if bias else None, groups=groups)
    y.backward(varied(lib, tuple(y.shape), device=device))
    return y, x.grad, w.grad


@pytest.mark.parametrize("case", CONVOLUTIONS, ids=[f"{c[0]}-{c[4]}-{c[5]}-g{c[3]}" for c in CONVOLUTIONS])
def test_convolution_output_and_gradient_layouts_like_torch(case):
    for ours, theirs in zip(_convolve(tw, tw_F, case), _convolve(torch, torch_F, case)):
        same_layout(ours, theirs)


def test_convolution_private_op_follows_the_rule():
    """The private op is what a backend kernel replaces: it is what must follow torch's rule."""
    x = tw.randn(2, 4, 6, 7).contiguous(memory_format=tw.channels_last)
    w = tw.randn(6, 4, 3, 3)
    out = tw.ops.registry.OPS["_conv2d"](x, w, (1, 1), [0, 0, 0, 0], (1, 1), 1)
    assert out.is_contiguous(memory_format=tw.channels_last)
    out = tw.ops.registry.OPS["_conv2d"](x.contiguous(), w, (1, 1), [0, 0, 0, 0], (1, 1), 1)
    assert out.is_contiguous()


# ---------------------------------------------------------------------------- .grad's layout contract

@pytest.mark.parametrize("order", [(0, 2, 3, 1), (3, 2, 1, 0), None])
def test_grad_takes_the_layout_of_a_dense_leaf(order):
    """torch's AccumulateGrad copies a gradient into its parameter's strides (layer_norm's gradient is
    contiguous, the parameter channels-last)."""
    grads = []
    for lib, nnf in ((tw, tw_F), (torch, torch_F)):
        x = varied(lib, (2, 3, 4, 5), order).requires_grad_()
        nnf.layer_norm(x, (5,)).pow(3).sum().backward()
        grads.append(x.grad)
    same_layout(*grads)


def test_grad_of_a_non_dense_leaf_is_contiguous():
    grads = []
    for lib in (tw, torch):
        base = build(lib, (2, 3, 4, 6), (0, 2, 3, 1)) / 10
        x = base[..., ::2].detach().requires_grad_()
        (x * x).sum().backward()
        grads.append(x.grad)
    same_layout(*grads)


# ---------------------------------------------------------------------------- modules

def test_module_to_channels_last_converts_only_4d_tensors():
    def model(lib):
        layers = [lib.nn.Conv2d(3, 4, 3), lib.nn.BatchNorm2d(4), lib.nn.Linear(4, 2)]
        return lib.nn.Sequential(*layers).to(memory_format=lib.channels_last)

    ours, theirs = model(tw), model(torch)
    for (name, p), (_, q) in zip(ours.named_parameters(), theirs.named_parameters()):
        assert p.stride() == q.stride(), name
        assert p.is_leaf and isinstance(p, tw.nn.Parameter)
    with pytest.raises(RuntimeError, match="required rank 4 tensor to use channels_last format"):
        tw.nn.Conv3d(2, 2, 3).to(memory_format=tw.channels_last)


def test_convert_conv2d_weight_memory_format_like_torch():
    def converted(lib):
        model = lib.nn.Sequential(lib.nn.Conv2d(3, 4, 3), lib.nn.ConvTranspose2d(4, 2, 3), lib.nn.Linear(2, 2))
        model = lib.nn.utils.convert_conv2d_weight_memory_format(model, lib.channels_last)
        return [p.stride() for p in model.parameters()]

    assert converted(tw) == converted(torch)


def test_channels_last_model_trains_to_the_same_values():
    def step(lib, nnf, layout):
        lib.manual_seed(0)
        conv = lib.nn.Conv2d(3, 4, 3, padding=1)
        with lib.no_grad():
            conv.weight.copy_(lib.tensor(np.linspace(-1, 1, 108, dtype=np.float32).reshape(4, 3, 3, 3)))
            conv.bias.zero_()
        conv = conv.to(memory_format=layout(lib))
        x = (build(lib, (2, 3, 5, 5)) / 50).contiguous(memory_format=layout(lib))
        nnf.relu(conv(x)).mean().backward()
        return conv.weight.grad

    for layout in (lambda lib: lib.channels_last, lambda lib: lib.contiguous_format):
        same_layout(step(tw, tw_F, layout), step(torch, torch_F, layout))


# ---------------------------------------------------------------------------- checkpoints

@pytest.mark.parametrize("suffix", [".pt", ".safetensors"])
def test_save_and_load_keep_a_channels_last_tensor_like_torch(tmp_path, suffix):
    def checkpoint(lib):
        return {"cl": build(lib, (2, 3, 4, 5), (0, 2, 3, 1)), "cl3d": build(lib, (2, 3, 4, 5, 6), (0, 2, 3, 4, 1)),
                "empty": lib.empty(0, 3, 4, 5, memory_format=lib.channels_last), "t": build(lib, (4, 5), (1, 0))}

    ours, theirs = checkpoint(tw), checkpoint(torch)
    tw.save(ours, tmp_path / f"ours{suffix}")
    torch.save(theirs, tmp_path / "theirs.pt")
    loaded, expected = tw.load(tmp_path / f"ours{suffix}"), torch.load(tmp_path / "theirs.pt")
    for name in expected:
        same_layout(loaded[name], expected[name])
    if suffix == ".pt":  # torch reads ours, and we read torch's
        for name, t in torch.load(tmp_path / "ours.pt").items():
            same_layout(tw.load(tmp_path / "theirs.pt")[name], t)


def test_safetensors_file_holds_row_major_values(tmp_path):
    """Other readers see each tensor's values as they are: the layout is kept in tilewise's metadata only."""
    safetensors_numpy = pytest.importorskip("safetensors.numpy")
    x = build(tw, (2, 3, 4, 5), (0, 2, 3, 1))
    tw.save({"x": x}, tmp_path / "x.safetensors")
    np.testing.assert_array_equal(safetensors_numpy.load_file(tmp_path / "x.safetensors")["x"], x.numpy())


# ---------------------------------------------------------------------------- compiled functions

def test_compiled_function_on_channels_last_inputs_gives_eager_values():
    def block(x, w, b):
        y = tw_F.conv2d(x, w, b, padding=1)
        return tw_F.relu(y * 2 + 1).sum((2, 3))

    compiled = tw.compile(block)
    x = tw.randn(2, 3, 6, 6).contiguous(memory_format=tw.channels_last)
    w = tw.randn(4, 3, 3, 3).contiguous(memory_format=tw.channels_last)
    b = tw.randn(4)
    np.testing.assert_allclose(compiled(x, w, b).numpy(), block(x, w, b).numpy(), rtol=1e-5, atol=1e-5)


def test_compiled_pointwise_on_mixed_layouts_gives_eager_values():
    def f(a, c):
        return (a * c + a.exp()).tanh()

    compiled = tw.compile(f)
    a = build(tw, (2, 3, 4, 5), (0, 2, 3, 1)) / 60
    c = build(tw, (2, 3, 4, 5)) / 60
    np.testing.assert_allclose(compiled(a, c).numpy(), f(a, c).numpy(), rtol=1e-6)
    np.testing.assert_allclose(compiled(c, a).numpy(), f(c, a).numpy(), rtol=1e-6)


# ---------------------------------------------------------------------------- CUDA

def _kernel_cases():
    cl, row_major = tw.empty(2, 3, 4, 5, memory_format=tw.channels_last), tw.empty(2, 3, 4, 5)
    bias, cl3d = tw.empty(3, 1, 1), tw.empty(2, 3, 4, 5, 6, memory_format=tw.channels_last_3d)
    for dtype in (tw.float32, tw.float16):
        a, b, c, d = cl.to(dtype), row_major.to(dtype), bias.to(dtype), cl3d.to(dtype)
        yield "add", (a, b), a.stride()
        yield "add", (b, a), b.stride()
        yield "mul", (a, c), a.stride()
        yield "mul", (c, a), a.stride()
        yield "exp", (d,), d.stride()
        yield "addcmul", (c, a, b), a.stride()
        yield "where.self", (b > 0, a, b), b.stride()


def test_cuda_kernels_for_channels_last_results_compile():
    """The CUDA backend allocates results in torch's stride order: the kernels it then launches (strided outputs
    beside contiguous inputs) must compile. NVRTC needs no GPU."""
    from tilewise.backends.cuda.kernels.pointwise import PTR, kernel_prefix, kernel_specs, op_geometry
    from tilewise.codegen.render.kernel_cuda import render_source
    from tilewise.codegen.toolchain import compile_cuda, nvrtc_available
    from tilewise.ops.registry import OPS

    if not nvrtc_available():
        pytest.skip("NVRTC is not installed")
    sources = {}
    for name, args, expected in _kernel_cases():
        op = OPS[name]
        bound = op.binder(*args)
        compute, expr, scalars, _, out = op_geometry(op, bound)
        assert out[2] == expected, (name, out[2], expected)
        described = [(PTR, t._dtype, t._shape, t._strides) for t in args]
        specs = kernel_specs(kernel_prefix(op, expr), (expr,), compute, described, scalars, out)
        for spec in (specs.scalar, specs.vector):
            if spec is not None:
                sources[spec.kernel.name] = render_source(spec)
    names = sorted(sources)
    ptx = compile_cuda("\n".join(sources[n] for n in names), names, "sm_90").ptx
    assert all(f".entry {n}(" in ptx for n in names)
    assert any(re.search(r"_f(32|16)s_", n) for n in names), "no kernel writes a strided (channels-last) output"



@pytest.mark.cuda
@pytest.mark.parametrize("case", list(POINTWISE_CASES))
def test_cuda_pointwise_results_take_torch_strides(case):
    got = POINTWISE_CASES[case](tw, _maker(tw, "cuda"))
    assert got.device.type == "cuda"
    same_layout(got, POINTWISE_CASES[case](torch, _maker(torch)))


@pytest.mark.cuda
@pytest.mark.parametrize("shape, order, step", LAYOUTS, ids=LAYOUT_IDS)
def test_cuda_clone_to_and_transfers_keep_formats_like_torch(shape, order, step):
    ours, theirs = build(tw, shape, order, step, "cuda"), build(torch, shape, order, step)
    assert ours.stride() == theirs.stride()
    same_layout(ours.clone(), theirs.clone())
    same_layout(ours.to(tw.float64), theirs.to(torch.float64))
    same_layout(ours.cpu(), theirs.clone())
    same_layout(build(tw, shape, order, step).to("cuda"), theirs.clone())
    for name in ("contiguous_format", "channels_last"):
        if name == "channels_last" and len(shape) != 4:
            continue
        same_layout(ours.clone(memory_format=fmt(tw, name)), theirs.clone(memory_format=fmt(torch, name)))
        same_layout(tw.empty_like(ours, memory_format=fmt(tw, name)).copy_(ours),
                    theirs.clone(memory_format=fmt(torch, name)))


@pytest.mark.cuda
@pytest.mark.parametrize("case", CONVOLUTIONS, ids=[f"{c[0]}-{c[4]}-{c[5]}-g{c[3]}" for c in CONVOLUTIONS])
def test_cuda_convolution_layouts_like_torch(case):
    for ours, theirs in zip(_convolve(tw, tw_F, case, "cuda"), _convolve(torch, torch_F, case)):
        assert ours.device.type == "cuda"
        same_layout(ours, theirs)


@pytest.mark.cuda
@pytest.mark.parametrize("name", [n for n in OPERATORS if n != "group_norm"])
def test_cuda_operator_layouts_like_torch(name):
    """As on the CPU (torch's CUDA group_norm gives a contiguous result, so it is left out)."""
    results = []
    for lib, nnf, device in ((tw, tw_F, "cuda"), (torch, torch_F, "cpu")):
        x = varied(lib, (2, 4, 6, 8), (0, 2, 3, 1), device).requires_grad_()
        y = OPERATORS[name](lib, nnf, x)
        y.backward(varied(lib, tuple(y.shape), device=device))
        results.append((y, x.grad))
    same_layout(results[0][0], results[1][0])
    same_layout(results[0][1], results[1][1])


@pytest.mark.cuda
def test_cuda_group_norm_result_is_contiguous_as_torch_cuda_gives_it():
    """torch's CUDA group_norm reads ``input.contiguous()``, unlike its CPU kernel (channels-last kept)."""
    x = varied(tw, (2, 4, 6, 8), (0, 2, 3, 1), "cuda")
    assert tw_F.group_norm(x, 2).is_contiguous()
    assert tw_F.group_norm(x.cpu(), 2).is_contiguous(memory_format=tw.channels_last)


@pytest.mark.cuda
def test_cuda_compiled_function_on_channels_last_inputs_gives_eager_values():
    def block(x, w, b):
        return tw_F.relu(tw_F.conv2d(x, w, b, padding=1) * 2 + 1).sum((2, 3))

    x = varied(tw, (2, 3, 6, 6), (0, 2, 3, 1), "cuda")
    w = varied(tw, (4, 3, 3, 3), (0, 2, 3, 1), "cuda")
    b = tw.arange(4.0, device="cuda")
    np.testing.assert_allclose(tw.compile(block)(x, w, b).cpu().numpy(), block(x, w, b).cpu().numpy(), rtol=1e-4,
                               atol=1e-5)


CAT_CASES = {
    "channels-last pair": lambda lib: [build(lib, (2, 4, 3, 5), (0, 2, 3, 1))] * 2,
    "channels-last then contiguous": lambda lib: [build(lib, (2, 4, 3, 5), (0, 2, 3, 1)), build(lib, (2, 4, 3, 5))],
    "contiguous then channels-last": lambda lib: [build(lib, (2, 4, 3, 5)), build(lib, (2, 4, 3, 5), (0, 2, 3, 1))],
    "channels-last and a legacy empty": lambda lib: [build(lib, (2, 4, 3, 5), (0, 2, 3, 1)), lib.empty(0)],
    "transposed matrices": lambda lib: [build(lib, (3, 4), (1, 0))] * 2,
    "channels-last 3d": lambda lib: [build(lib, (2, 3, 2, 2, 2), (0, 2, 3, 4, 1))] * 2,
}


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
@pytest.mark.parametrize("case", CAT_CASES)
@pytest.mark.parametrize("dim", [0, 1])
def test_cat_lays_its_result_out_by_torchs_rule(case, dim, device):
    """torch's cat: the format every input suggests, else contiguous (numpy's concatenate follows the inputs'
    order instead: two transposed matrices came back transposed)."""
    ours = tw.cat([t.to(device) for t in CAT_CASES[case](tw)], dim)
    same_layout(ours, torch.cat(CAT_CASES[case](torch), dim))

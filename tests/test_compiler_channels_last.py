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

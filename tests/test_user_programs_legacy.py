"""Scripts written for older torch releases still run there (with a deprecation warning): loss modules built with
``size_average``/``reduce``, positional arguments in torch's order. tilewise takes them the same way."""

from __future__ import annotations

import inspect
import warnings

import numpy as np
import pytest
import torch as real_torch

import tilewise

LOSSES = [name for name in dir(real_torch.nn) if name.endswith("Loss") and name != "LinearCrossEntropyLoss"
          and isinstance(getattr(real_torch.nn, name), type)]


def _parameters(cls):
    return [(p.name, repr(p.default), p.kind) for p in inspect.signature(cls.__init__).parameters.values()]


@pytest.mark.parametrize("name", LOSSES)
def test_loss_modules_take_torch_s_arguments_in_torch_s_order(name):
    assert _parameters(getattr(tilewise.nn, name)) == _parameters(getattr(real_torch.nn, name))


X = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)
LABELS = np.array([0, 2, 1, 2])


@pytest.mark.parametrize("build,call", [
    (lambda nn: nn.MSELoss(False), lambda m, t: m(t.tensor(X), t.tensor(X * 0.5))),
    (lambda nn: nn.L1Loss(reduce=False), lambda m, t: m(t.tensor(X), t.tensor(X * 0.5))),
    (lambda nn: nn.SmoothL1Loss(size_average=True, reduce=True), lambda m, t: m(t.tensor(X), t.tensor(X * 0.5))),
    (lambda nn: nn.NLLLoss(None, False, 1), lambda m, t: m(t.tensor(X).log_softmax(1), t.tensor(LABELS))),
    (lambda nn: nn.CrossEntropyLoss(None, None, 2, False), lambda m, t: m(t.tensor(X), t.tensor(LABELS))),
    (lambda nn: nn.BCELoss(None, False), lambda m, t: m(t.tensor(X).sigmoid(), t.tensor((X > 0).astype(np.float32)))),
    (lambda nn: nn.BCEWithLogitsLoss(None, None, False), lambda m, t: m(t.tensor(X), t.tensor((X > 0) * 1.0))),
    (lambda nn: nn.KLDivLoss(False), lambda m, t: m(t.tensor(X).log_softmax(1), t.tensor(X).softmax(1))),
])
def test_the_deprecated_size_average_and_reduce_pick_torch_s_reduction_and_warn(build, call):
    results = []
    for torch in (real_torch, tilewise):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            module = build(torch.nn)
        assert [str(w.message) for w in caught][:1] == [f"size_average and reduce args will be deprecated, please use "
                                                        f"reduction='{module.reduction}' instead."]
        results.append((module.reduction, call(module, torch).numpy()))
    assert results[0][0] == results[1][0]
    np.testing.assert_allclose(results[1][1], results[0][1], rtol=1e-6, atol=1e-7)

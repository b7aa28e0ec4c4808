"""The warnings a ported script meets say what torch's say, of the same category, at the script's own line (torch's
warnings from C++ and from its functionals name the caller's line; tilewise's reach the user through binders and
the dispatcher, so they name the first frame outside the package)."""

from __future__ import annotations

import warnings

import pytest
import torch as real_torch

import tilewise
from tilewise import _warnings


def caught(call):
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        call()
    return [(w.category, str(w.message).replace("tilewise.Size", "torch.Size"), w.filename) for w in seen]


EVERY_TIME = {
    "tensor-of-a-tensor": lambda t: t.tensor(t.ones(2)),
    "new_tensor-of-a-tensor": lambda t: t.ones(1).new_tensor(t.ones(2)),
    "mse-broadcast-target": lambda t: t.nn.functional.mse_loss(t.ones(2, 1), t.ones(2)),
    "l1-broadcast-target": lambda t: t.nn.functional.l1_loss(t.ones(2, 1), t.ones(2)),
    "softmax-without-dim": lambda t: t.nn.functional.softmax(t.ones(2, 3)),
    "kl_div-mean": lambda t: t.nn.functional.kl_div(t.ones(2, 2).log_softmax(1), t.ones(2, 2) / 2),
    "legacy-reduction": lambda t: t.nn.functional.mse_loss(t.ones(2), t.ones(2), size_average=False),
    "upsample": lambda t: t.nn.functional.upsample(t.ones(1, 1, 2), scale_factor=2),
    "sample_n": lambda t: t.distributions.Normal(0.0, 1.0).sample_n(2),
}


@pytest.mark.parametrize("name", list(EVERY_TIME))
def test_warnings_name_the_caller_s_line_with_torch_s_words(name):
    ours, theirs = (caught(lambda lib=torch: EVERY_TIME[name](lib)) for torch in (tilewise, real_torch))
    assert [(c, m) for c, m, _ in ours] == [(c, m) for c, m, _ in theirs] and ours
    assert all(filename == __file__ for _, _, filename in ours)


@pytest.mark.parametrize("module", ["Softmax", "LogSoftmax", "Softmin"])
def test_softmax_modules_without_a_dim_warn_as_torch(module):
    ours, theirs = (caught(lambda lib=torch: getattr(lib.nn, module)()(lib.ones(2, 3))) for torch in
                    (tilewise, real_torch))
    assert [(c, m) for c, m, _ in ours] == [(c, m) for c, m, _ in theirs] and ours


def test_warnings_from_deep_inside_name_the_caller_s_line():
    def deep(t):
        t.lu(t.eye(2))
        t.chain_matmul(t.ones(2, 2), t.ones(2, 2))
        attention = t.nn.MultiheadAttention(4, 2, batch_first=True)
        attention(t.ones(1, 3, 4), t.ones(1, 3, 4), t.ones(1, 3, 4), key_padding_mask=t.zeros(1, 3, dtype=t.bool),
                  attn_mask=t.zeros(3, 3))

    seen = caught(lambda: deep(tilewise))
    assert len(seen) == 3 and all(filename == __file__ for _, _, filename in seen)


ONCE = [  # torch's TORCH_WARN_ONCE: given the first time in a process only (torch's words copied here: its own
    # once-only warnings may already have been given in this process)
    (lambda t: t.ones(2, 2, 2).T, "The use of `x.T` on tensors of dimension other than 2 to reverse their shape is "
     "deprecated and it will throw an error in a future release. Consider `x.mT` to transpose batches of matrices "
     "or `x.permute(*torch.arange(x.ndim - 1, -1, -1))` to reverse the dimensions of a tensor."),
    (lambda t: t.ones(()).T, "Tensor.T is deprecated on 0-D tensors. This function is the identity in these cases."),
    (lambda t: t.meshgrid(t.ones(2), t.ones(3)), "torch.meshgrid: in an upcoming release, it will be required to "
     "pass the indexing argument."),
]


@pytest.mark.parametrize("call,message", ONCE)
def test_once_only_warnings_are_given_once_at_the_caller_s_line(call, message, monkeypatch):
    monkeypatch.setattr(_warnings, "_GIVEN_ONCE", set())
    assert caught(lambda: call(tilewise)) == [(UserWarning, message, __file__)]
    assert caught(lambda: call(tilewise)) == []
    assert caught(lambda: tilewise.ones(2, 2).T) == []


@pytest.mark.parametrize("fn,shape,mask_dims", [
    ("dropout2d", (6, 40, 5), 2),  # read as (N, C, L): one draw per (n, c), as torch
    ("dropout2d", (6, 40), 2),  # deprecated: elementwise
    ("dropout2d", (2, 20, 3, 2, 2), 2),
    ("dropout3d", (20, 3, 2, 2), 1),  # unbatched (C, D, H, W): one draw per channel
    ("dropout3d", (20, 3), 1),
    ("dropout1d", (20, 7), 1),
])
def test_channel_dropouts_draw_per_torch_s_channels_and_warn_as_torch(fn, shape, mask_dims):
    ours, theirs = (caught(lambda lib=torch: getattr(lib.nn.functional, fn)(lib.ones(shape), 0.5)) for torch in
                    (tilewise, real_torch))
    assert [(c, m) for c, m, _ in ours] == [(c, m) for c, m, _ in theirs]
    assert all(filename == __file__ for _, _, filename in ours)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = getattr(tilewise.nn.functional, fn)(tilewise.ones(shape), 0.5).numpy()
    rows = out.reshape(*shape[:mask_dims], -1)
    assert ((rows == 0).all(-1) | (rows == 2).all(-1)).all() and 0 < (rows == 0).all(-1).mean() < 1


@pytest.mark.parametrize("fn,shape", [("dropout2d", (6,)), ("dropout3d", ()), ("dropout1d", (3,)),
                                      ("dropout1d", (2, 3, 4, 5))])
def test_channel_dropouts_refuse_too_few_dims_as_torch(fn, shape):
    def run(torch):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                getattr(torch.nn.functional, fn)(torch.ones(shape), 0.5)
            except RuntimeError as error:
                return str(error)
        return None

    assert run(tilewise) == run(real_torch) is not None

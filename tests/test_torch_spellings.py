"""The torch-level spellings of nn.functional operators that the operator table cannot compare: in-place forms
(``torch.relu_``, ``torch.dropout_``, ``torch.embedding_renorm_``), the random masks of the dropouts, and the
argument errors of the int-coded modes. Each runs beside torch."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tilewise as tw


def _pair(shape, seed=0):
    values = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    return tw.tensor(values), torch.tensor(values)


@pytest.mark.parametrize("name,args", [("relu_", ()), ("selu_", ()), ("celu_", (0.5,)), ("threshold_", (0.1, 2.0))])
def test_inplace_activations_write_into_their_input(name, args):
    ours, theirs = _pair((3, 4))
    result, expected = getattr(tw, name)(ours, *args), getattr(torch, name)(theirs, *args)
    assert result is ours and expected is theirs
    np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=1e-6)


def test_embedding_renorm_scales_the_rows_read_in_place():
    ours, theirs = _pair((5, 3))
    result = tw.embedding_renorm_(ours, tw.tensor([0, 2, 2]), 0.5, 2.0)
    torch.embedding_renorm_(theirs, torch.tensor([0, 2, 2]), 0.5, 2.0)
    assert result is ours
    np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=1e-5)


@pytest.mark.parametrize("name", ["dropout_", "alpha_dropout_", "feature_dropout_", "feature_alpha_dropout_"])
def test_inplace_dropouts_in_eval_leave_the_input_and_in_training_write_it(name):
    ours, theirs = _pair((2, 3, 4))
    assert getattr(tw, name)(ours, 0.5, False) is ours and getattr(torch, name)(theirs, 0.5, False) is theirs
    np.testing.assert_array_equal(ours.numpy(), theirs.numpy())
    before = ours.clone()
    assert getattr(tw, name)(ours, 0.5, True) is ours
    assert not tw.equal(ours, before)


def test_rrelu_inplace_matches_torch_in_eval():
    ours, theirs = _pair((3, 4))
    assert tw.rrelu_(ours, 0.1, 0.3) is ours
    torch.rrelu_(theirs, 0.1, 0.3)
    np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=1e-6)
    with pytest.raises(NotImplementedError, match="generator"):
        tw.rrelu(ours, generator=tw.Generator())


@pytest.mark.parametrize("name", ["feature_dropout", "feature_alpha_dropout"])
def test_feature_dropouts_drop_whole_channels(name):
    x = tw.ones(8, 16, 5, 5)
    out = getattr(tw, name)(x, 0.5, True)
    per_channel = out.reshape(8, 16, 25)
    assert bool((per_channel == per_channel[..., :1]).all())  # one draw per (sample, channel)
    kept = (per_channel[..., 0] == per_channel[..., 0].max()).float().mean().item()
    assert 0.3 < kept < 0.7
    for fw in (torch, tw):
        with pytest.raises(RuntimeError, match="at least 2 dimensions"):
            getattr(fw, name)(fw.ones(3), 0.5, True)


def test_feature_dropout_keeps_the_expectation():
    tw.manual_seed(0)
    out = tw.feature_dropout(tw.ones(64, 64, 4), 0.25, True)
    assert set(np.unique(out.numpy()).tolist()) <= {0.0, float(np.float32(1 / 0.75))}
    assert abs(out.mean().item() - 1.0) < 0.1


def test_dropout_probability_is_checked():
    for fw in (torch, tw):
        for name in ("alpha_dropout", "feature_dropout", "feature_alpha_dropout"):
            with pytest.raises((ValueError, RuntimeError), match="between 0 and 1"):
                getattr(fw, name)(fw.ones(2, 3), 1.5, True)


def test_int_reduction_must_be_an_int():
    for fw in (torch, tw):
        with pytest.raises(TypeError, match="reduction"):
            fw.kl_div(fw.zeros(2), fw.zeros(2), "mean")
        with pytest.raises(TypeError, match="reduction"):
            fw.kl_div(fw.zeros(2), fw.zeros(2), True)


def test_grid_sampler_checks_dims_and_modes():
    for fw in (torch, tw):
        with pytest.raises(RuntimeError, match="expected 4D input"):
            fw.grid_sampler_2d(fw.zeros(1, 1, 2, 2, 2), fw.zeros(1, 2, 2, 2, 3), 0, 0, False)
    with pytest.raises(ValueError, match="interpolation_mode"):
        tw.grid_sampler(tw.zeros(1, 1, 2, 2), tw.zeros(1, 2, 2, 2), 3, 0, False)
    with pytest.raises(ValueError, match="padding_mode"):
        tw.grid_sampler(tw.zeros(1, 1, 2, 2), tw.zeros(1, 2, 2, 2), 0, 3, False)


def test_convolution_needs_a_weight_with_spatial_dims():
    with pytest.raises(RuntimeError, match="weight"):
        tw.convolution(tw.zeros(1, 2), tw.zeros(3, 2), None, [1], [0], [1], False, [0], 1)


def test_norm_except_dim_checks_the_dim():
    for fw in (torch, tw):
        with pytest.raises(IndexError, match="Dimension out of range"):
            fw.norm_except_dim(fw.zeros(2, 3, 4), 2, 5)


@pytest.mark.parametrize("code", [
    "fw.rnn_tanh_cell(fw.ones(2, 3), fw.ones(2, 4), fw.ones(4, 3), fw.ones(4, 5))",
    "fw.gru_cell(fw.ones(2, 3), fw.ones(2, 4), fw.ones(12, 2), fw.ones(12, 4))",
    "fw.lstm_cell(fw.ones(2, 3), [fw.ones(2, 4), fw.ones(2, 4)], fw.ones(12, 3), fw.ones(16, 4))"])
def test_recurrent_cells_check_weights_like_torch(code):
    with pytest.raises(RuntimeError):
        eval(code, {"fw": torch})
    with pytest.raises(RuntimeError, match="weight_"):
        eval(code, {"fw": tw})

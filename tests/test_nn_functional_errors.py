"""tilewise.nn.functional rejects bad arguments with errors that name the op, the offending shapes or values,
and what would be valid."""

from __future__ import annotations

import pytest

import tilewise as tw
import tilewise.nn.functional as F


def test_layer_norm_normalized_shape_mismatch_names_both_shapes():
    with pytest.raises(RuntimeError, match=r"layer_norm.*normalized_shape=\[5\].*\[\*, 5\].*\[2, 3, 4\]"):
        F.layer_norm(tw.randn(2, 3, 4), (5,))


def test_layer_norm_weight_shape_mismatch():
    with pytest.raises(RuntimeError, match=r"weight of shape \[3\] and normalized_shape = \[4\]"):
        F.layer_norm(tw.randn(2, 4), (4,), tw.ones(3))


def test_cross_entropy_target_out_of_range_names_index_and_classes():
    logits = tw.randn(3, 5)
    with pytest.raises(IndexError, match=r"cross_entropy: target class index 7 .* C=5 classes"):
        F.cross_entropy(logits, tw.tensor([1, 7, 2]))
    with pytest.raises(IndexError, match=r"target class index -3 .* C=5"):
        F.cross_entropy(logits, tw.tensor([1, -3, 2]))


def test_cross_entropy_ignore_index_is_not_out_of_range():
    loss = F.cross_entropy(tw.randn(3, 5), tw.tensor([1, -100, 2]))
    assert loss.shape == ()


def test_nll_loss_target_out_of_range_and_batch_mismatch():
    with pytest.raises(IndexError, match=r"nll_loss: target class index 4 .* C=4"):
        F.nll_loss(tw.randn(2, 4), tw.tensor([0, 4]))
    with pytest.raises(ValueError, match=r"Expected input batch_size \(2\) to match target batch_size \(3\)"):
        F.nll_loss(tw.randn(2, 4), tw.tensor([0, 1, 2]))


def test_cross_entropy_bad_weight_and_target_dtype():
    with pytest.raises(RuntimeError, match=r"all 5 classes .* shape: \[4\]"):
        F.cross_entropy(tw.randn(3, 5), tw.tensor([0, 1, 2]), weight=tw.ones(4))
    with pytest.raises(RuntimeError, match=r"expected target dtype to be Long or Byte, but got Float"):
        F.cross_entropy(tw.randn(3, 5), tw.tensor([0.0, 1.0, 2.0]))
    with pytest.raises(RuntimeError, match=r"ignore_index is not supported for floating point target"):
        F.cross_entropy(tw.randn(3, 5), tw.rand(3, 5), ignore_index=1)


def test_conv2d_channel_mismatch_names_groups_and_weight_in_torch_words():
    with pytest.raises(RuntimeError, match=r"^Given groups=1, weight of size \[8, 4, 3, 3\], expected "
                                           r"input\[2, 3, 5, 5\] to have 4 channels, but got 3 channels instead$"):
        F.conv2d(tw.randn(2, 3, 5, 5), tw.randn(8, 4, 3, 3))
    with pytest.raises(RuntimeError, match=r"groups=2, .* expected input\[1, 6, 5, 5\] to have 4 channels"):
        F.conv2d(tw.randn(1, 6, 5, 5), tw.randn(4, 2, 3, 3), groups=2)


def test_conv_other_argument_errors():
    with pytest.raises(RuntimeError, match=r"divisible by 2 at dimension 0"):
        F.conv2d(tw.randn(1, 4, 5, 5), tw.randn(3, 2, 3, 3), groups=2)
    with pytest.raises(RuntimeError, match=r"padding='same' is not supported for strided convolutions"):
        F.conv2d(tw.randn(1, 3, 5, 5), tw.randn(2, 3, 3, 3), stride=2, padding="same")
    with pytest.raises(RuntimeError, match=r"Invalid padding string: 'full'"):
        F.conv1d(tw.randn(1, 3, 5), tw.randn(2, 3, 3), padding="full")
    with pytest.raises(RuntimeError, match=r"Kernel size can't be greater than actual input size"):
        F.conv2d(tw.randn(1, 3, 2, 2), tw.randn(2, 3, 3, 3))
    with pytest.raises(RuntimeError, match=r"expected bias to be 1-dimensional with 2 elements"):
        F.conv2d(tw.randn(1, 3, 5, 5), tw.randn(2, 3, 3, 3), tw.zeros(3))


def test_sdpa_head_dim_mismatch_names_shapes():
    q, k = tw.randn(2, 4, 8), tw.randn(2, 5, 6)
    with pytest.raises(RuntimeError, match=r"scaled_dot_product_attention: query and key must have the same head "
                                           r"dimension.*\[2, 4, 8\] \(E=8\).*\[2, 5, 6\] \(E=6\)"):
        F.scaled_dot_product_attention(q, k, tw.randn(2, 5, 6))


def test_sdpa_other_argument_errors():
    q = tw.randn(2, 4, 8)
    with pytest.raises(RuntimeError, match=r"same sequence length"):
        F.scaled_dot_product_attention(q, tw.randn(2, 5, 8), tw.randn(2, 6, 8))
    with pytest.raises(RuntimeError, match=r"attn_mask should not be set when is_causal=True"):
        F.scaled_dot_product_attention(q, q, q, attn_mask=tw.ones(4, 4, dtype=tw.bool), is_causal=True)
    with pytest.raises(RuntimeError, match=r"enable_gqa"):
        F.scaled_dot_product_attention(tw.randn(1, 3, 4, 8), tw.randn(1, 2, 4, 8), tw.randn(1, 2, 4, 8),
                                       enable_gqa=True)


@pytest.mark.parametrize(("query", "key", "value"), [
    ((1, 4, 3, 8), (1, 3, 5, 8), (1, 3, 5, 8)), ((1, 4, 3, 8), (1, 8, 5, 8), (1, 8, 5, 8)),
    ((1, 4, 3, 8), (1, 2, 5, 8), (1, 3, 5, 8)), ((6, 3, 8), (4, 5, 8), (4, 5, 8)), ((3, 8), (5, 8), (5, 8)),
    ((4, 3, 8), (5, 8), (5, 8))])
def test_sdpa_enable_gqa_head_counts_fail_as_in_torch(query, key, value):
    """Key and value heads must each divide the query's (they may differ from each other); without a head dim
    torch's dim -3 is out of range. Same exception type and torch's words, with the shapes and head counts."""
    import torch

    def attempt(lib):
        try:
            lib.nn.functional.scaled_dot_product_attention(*(lib.randn(s) for s in (query, key, value)),
                                                           enable_gqa=True)
        except (RuntimeError, IndexError) as e:
            return e
        raise AssertionError("no error")

    ours, theirs = attempt(tw), attempt(torch)
    assert type(ours) is type(theirs)
    assert str(theirs).strip() in str(ours)
    assert "scaled_dot_product_attention" in str(ours) or isinstance(ours, IndexError)  # a dim out of range: torch's
    if isinstance(ours, RuntimeError):
        assert f"query {list(query)} ({query[-3]} heads)" in str(ours) and f"key {list(key)}" in str(ours)


@pytest.mark.parametrize(("query_dtype", "mask_dtype"), [
    ("float32", "float64"), ("float32", "bfloat16"), ("bfloat16", "float16"), ("bfloat16", "float64"),
    ("float32", "int64"), ("bfloat16", "float32"), ("float64", "float32"), ("bfloat16", "bfloat16"),
    ("float32", "bool")])
def test_sdpa_attn_mask_dtype_is_bool_float32_or_the_querys_as_in_torch(query_dtype, mask_dtype):
    import torch

    def attend(lib):
        q = lib.ones(1, 2, 3, 4, dtype=getattr(lib, query_dtype))
        mask = lib.zeros(3, 3, dtype=getattr(lib, mask_dtype))
        return lib.nn.functional.scaled_dot_product_attention(q, q, q, attn_mask=mask)

    try:
        expected = attend(torch)
    except RuntimeError:
        with pytest.raises(RuntimeError, match=rf"scaled_dot_product_attention: Expected attn_mask dtype to be bool "
                                               rf"or float or to match query dtype, but got attn_mask.dtype: "
                                               rf"tilewise.{mask_dtype} and query.dtype: tilewise.{query_dtype}"):
            attend(tw)
    else:
        assert str(attend(tw).dtype) == str(expected.dtype).replace("torch", "tilewise")


def test_normalization_argument_errors():
    with pytest.raises(RuntimeError, match=r"running_mean must be defined in evaluation mode"):
        F.batch_norm(tw.randn(4, 3), None, None, training=False)
    with pytest.raises(ValueError, match=r"Expected more than 1 value per channel when training"):
        F.batch_norm(tw.randn(1, 3), None, None, training=True)
    with pytest.raises(RuntimeError, match=r"divisible by num_groups.*\[2, 5, 4\] and num_groups=2"):
        F.group_norm(tw.randn(2, 5, 4), 2)


def test_dropout_probability_out_of_range():
    with pytest.raises(ValueError, match=r"dropout probability has to be between 0 and 1, but got 1.5"):
        F.dropout(tw.randn(3), 1.5)


def test_pooling_and_resampling_argument_errors():
    with pytest.raises(RuntimeError, match=r"pad should be at most half of effective kernel size, but got pad=2, "
                                           r"kernel_size=3"):
        F.max_pool2d(tw.randn(1, 1, 5, 5), 3, padding=2)
    with pytest.raises(RuntimeError, match=r"Output size is too small"):
        F.avg_pool2d(tw.randn(1, 1, 2, 2), 3)
    with pytest.raises(NotImplementedError, match=r"Got 4D input, but linear mode needs 3D input"):
        F.interpolate(tw.randn(1, 1, 2, 2), scale_factor=2, mode="linear")
    with pytest.raises(ValueError, match=r"either size or scale_factor should be defined"):
        F.interpolate(tw.randn(1, 1, 2, 2))


def test_embedding_and_loss_argument_errors():
    with pytest.raises(RuntimeError, match=r"'indices'.*Long, Int; but got tilewise.float32"):
        F.embedding(tw.randn(3), tw.randn(4, 2))
    with pytest.raises(AssertionError, match=r"^Padding_idx must be within num_embeddings \(.*padding_idx=4; "
                                             r"valid: -4 to 3\)$"):
        F.embedding(tw.tensor([0, 1]), tw.randn(4, 2), padding_idx=4)
    with pytest.raises(RuntimeError, match=r"binary_cross_entropy: all elements of input should be between 0 and 1"):
        F.binary_cross_entropy(tw.tensor([0.5, 1.5]), tw.tensor([0.0, 1.0]))
    with pytest.raises(ValueError, match=r"^avg is not a valid value for reduction"):
        F.mse_loss(tw.randn(3), tw.randn(3), reduction="avg")


@pytest.mark.parametrize("target_dtype", ["float64", "int64", "float16", "bool"])
def test_binary_cross_entropy_refuses_a_target_of_another_dtype_like_torch(target_dtype):
    """An integer label (torch.full((n,), 1) without dtype=) is the usual way to meet this; torch's kernel refuses
    it, and so must we rather than quietly promote."""
    import torch

    names = {"float64": "Double", "int64": "Long", "float16": "Half", "bool": "Bool"}
    for m in (torch, tw):
        target = m.tensor([1, 0]).to(getattr(m, target_dtype))
        with pytest.raises(RuntimeError, match=rf"Found dtype {names[target_dtype]} but expected Float"):
            m.nn.functional.binary_cross_entropy(m.tensor([0.7, 0.2]), target)
        with pytest.raises(RuntimeError, match=rf"Found dtype {names[target_dtype]} but expected Float"):
            m.nn.BCELoss(weight=m.tensor([1.0, 2.0]))(m.tensor([0.7, 0.2]), target)
    with pytest.raises(RuntimeError, match=r"Found dtype Float but expected Double"):
        F.binary_cross_entropy(tw.tensor([0.5], dtype=tw.float64), tw.tensor([1.0]))


def test_binary_cross_entropy_weight_of_another_dtype_keeps_input_dtype_like_torch():
    import torch

    for weight in ([2.0, 1.0], [2, 1]):
        ours = F.binary_cross_entropy(tw.tensor([0.7, 0.2]), tw.tensor([1.0, 0.0]),
                                      weight=tw.tensor(weight, dtype=tw.float64 if weight[1] == 1.0 else tw.int64))
        theirs = torch.nn.functional.binary_cross_entropy(
            torch.tensor([0.7, 0.2]), torch.tensor([1.0, 0.0]),
            weight=torch.tensor(weight, dtype=torch.float64 if weight[1] == 1.0 else torch.int64))
        assert ours.dtype == tw.float32 and theirs.dtype == torch.float32
        assert ours.item() == pytest.approx(theirs.item(), rel=1e-6)


@pytest.mark.parametrize("target_dtype,name", [("int64", "Long"), ("int32", "Int")])
def test_binary_cross_entropy_with_logits_refuses_an_integer_target_like_torch(target_dtype, name):
    import torch

    for m in (torch, tw):
        with pytest.raises(RuntimeError, match=rf"result type Float can't be cast to the desired output type {name}"):
            m.nn.functional.binary_cross_entropy_with_logits(m.tensor([0.5, -1.0]),
                                                             m.tensor([1, 0], dtype=getattr(m, target_dtype)))


@pytest.mark.parametrize("loss", ["mse_loss", "smooth_l1_loss", "huber_loss"])
def test_pointwise_losses_take_a_bool_target_or_input_as_torch_does(loss):
    """torch's mse, smooth_l1 and huber kernels compute in the promoted dtype: a bool counts as 0 and 1."""
    import torch

    for args in (([0.7, 0.2], [True, False]), ([True, False], [0.7, 0.2])):
        if loss == "huber_loss" and args[0][0] is True:  # huber's result takes input's dtype
            for m in (torch, tw):
                with pytest.raises(RuntimeError, match="result type Float can't be cast to the desired output type "
                                                       "Bool"):
                    m.nn.functional.huber_loss(*(m.tensor(a) for a in args))
            continue
        ours = getattr(F, loss)(*(tw.tensor(a) for a in args), reduction="none")
        theirs = getattr(torch.nn.functional, loss)(*(torch.tensor(a) for a in args), reduction="none")
        assert ours.dtype == tw.float32 and ours.tolist() == pytest.approx(theirs.tolist())
    with pytest.raises(RuntimeError, match="Subtraction, the `-` operator, with a bool tensor is not supported"):
        F.l1_loss(tw.tensor([0.7, 0.2]), tw.tensor([True, False]))


def test_huber_loss_result_has_input_dtype_like_torch():
    import torch

    for a, b in ((tw.float32, tw.float64), (tw.float64, tw.float32)):
        ours = F.huber_loss(tw.tensor([0.7, 3.0], dtype=a), tw.tensor([1.0, 0.0], dtype=b), reduction="none")
        theirs = torch.nn.functional.huber_loss(torch.tensor([0.7, 3.0], dtype=getattr(torch, a.name)),
                                                torch.tensor([1.0, 0.0], dtype=getattr(torch, b.name)),
                                                reduction="none")
        assert ours.dtype == a and str(theirs.dtype) == f"torch.{a.name}"
        assert ours.tolist() == pytest.approx(theirs.tolist())


@pytest.mark.parametrize("which", ["input", "target"])
def test_kl_div_refuses_integral_inputs_like_torch(which):
    import torch

    for m in (torch, tw):
        x, i = m.tensor([0.7, 0.2]), m.tensor([1, 0])
        args = (i, x) if which == "input" else (x, i)
        with pytest.raises(RuntimeError, match="kl_div: Integral inputs not supported"):
            m.nn.functional.kl_div(*args, reduction="batchmean")


@pytest.mark.parametrize("loss", ["nll_loss", "cross_entropy"])
@pytest.mark.parametrize("target_dtype,name", [("int32", "Int"), ("int16", "Short"), ("bool", "Bool"),
                                               ("float32", "Float")])
def test_class_index_losses_take_only_int64_or_uint8_targets_like_torch(loss, target_dtype, name):
    import torch

    for m in (torch, tw):
        target = m.tensor([1, 2, 0]).to(getattr(m, target_dtype))
        with pytest.raises(RuntimeError, match=f"expected target dtype to be Long or Byte, but got {name}"):
            getattr(m.nn.functional, loss)(m.zeros(3, 5), target)
    ours = getattr(F, loss)(tw.zeros(3, 5), tw.tensor([1, 2, 0], dtype=tw.uint8))
    theirs = getattr(torch.nn.functional, loss)(torch.zeros(3, 5), torch.tensor([1, 2, 0], dtype=torch.uint8))
    assert ours.item() == pytest.approx(theirs.item())

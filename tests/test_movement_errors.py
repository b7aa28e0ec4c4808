"""Scans, sorting and movement ops: error messages that name the op, the shapes and what is valid; and the
behaviours the op table cannot sample (distinct indices, higher-order gradients, in-place autograd)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tilewise as tw
import tilewise.nn.functional as F


def both(array, requires_grad=False):
    array = np.asarray(array, dtype=np.float64)
    return tw.tensor(array, requires_grad=requires_grad), torch.tensor(array, requires_grad=requires_grad)


def close(a, b):
    np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), rtol=1e-10, atol=1e-12)


# ---------------------------------------------------------------------------- bad dims

@pytest.mark.parametrize("call,valid", [
    (lambda x: x.cumsum(2), "-2, 1"), (lambda x: x.cumprod(-3), "-2, 1"), (lambda x: x.cummax(2), "-2, 1"),
    (lambda x: x.sort(5), "-2, 1"), (lambda x: x.topk(1, 2), "-2, 1"), (lambda x: x.flip(2), "-2, 1"),
    (lambda x: tw.cat([x, x], 2), "-2, 1"), (lambda x: tw.stack([x, x], 3), "-3, 2"),
    (lambda x: x.index_select(2, tw.tensor([0])), "-2, 1"), (lambda x: x.roll(1, 3), "-2, 1"),
    (lambda x: x.tensor_split(2, 2), "-2, 1"), (lambda x: x.diag_embed(0, 0, 3), "-3, 2"),
])
def test_bad_dim_names_the_valid_range(call, valid):
    with pytest.raises(IndexError, match=rf"Dimension out of range \(expected to be in range of \[{valid}\]"):
        call(tw.zeros(3, 4))


def test_flip_repeated_dim():
    with pytest.raises(RuntimeError, match="appears multiple times"):
        tw.zeros(3, 4).flip((0, -2))


# ---------------------------------------------------------------------------- cat and stack

def test_cat_mismatched_shapes_in_torch_words():
    with pytest.raises(RuntimeError, match=r"^Sizes of tensors must match except in dimension 1\. Expected size 2 but "
                                           r"got size 4 for tensor number 1 in the list\.$"):
        tw.cat([tw.zeros(2, 3), tw.zeros(4, 5)], 1)


def test_cat_mismatched_ranks_and_empty_list():
    with pytest.raises(RuntimeError, match=r"^Tensors must have same number of dimensions: got 2 and 3$"):
        tw.cat([tw.zeros(2, 3), tw.zeros(2, 3, 1)])
    with pytest.raises(ValueError, match="non-empty list"):  # torch's type for cat (stack: RuntimeError)
        tw.cat([])
    with pytest.raises(TypeError, match="element 1 is int"):
        tw.cat([tw.zeros(2), 3])


def test_stack_unequal_shapes():
    with pytest.raises(RuntimeError, match=r"equal size, but got \[2, 3\] at entry 0 and \[2, 4\] at entry 1"):
        tw.stack([tw.zeros(2, 3), tw.zeros(2, 4)])


# ---------------------------------------------------------------------------- out-of-range indices

@pytest.mark.parametrize("op,call", [
    ("index_select", lambda x: x.index_select(0, tw.tensor([0, 5]))),
    ("index_add", lambda x: x.index_add(0, tw.tensor([5]), tw.ones(1, 4))),
    ("index_copy", lambda x: x.index_copy(0, tw.tensor([5]), tw.ones(1, 4))),
    ("index_fill", lambda x: x.index_fill(0, tw.tensor([5]), 1.0)),
])
def test_out_of_range_index_names_op_index_and_size(op, call):
    error = RuntimeError if op == "index_add" else IndexError  # torch's index_add of a 2-D tensor: RuntimeError
    with pytest.raises(error, match=rf"^{op}\(\): .*index 5 is out of bounds for dimension 0 with size 3"):
        call(tw.zeros(3, 4))


def test_take_along_dim_wraps_indices_along_a_dim_and_checks_them_flattened():
    """torch takes every index modulo the dim's size when a dim is given; without one it gathers (and checks)."""
    x = tw.arange(12.0).reshape(3, 4)
    assert x.take_along_dim(tw.tensor([[5, -1, 1, 3]]), 0).tolist() == [[8.0, 9.0, 6.0, 3.0]]
    with pytest.raises(RuntimeError, match=r"^take_along_dim\(\): index 12 is out of bounds for dimension 0 with "
                                           r"size 12"):
        x.take_along_dim(tw.tensor([12]))


def test_take_out_of_range_counts_flattened_elements():
    with pytest.raises(IndexError, match=r"take\(\): out of range: tried to access index 12 on a tensor of 12 "
                                         r"elements"):
        tw.zeros(3, 4).take(tw.tensor([12]))


def test_index_must_be_an_integer_vector():
    with pytest.raises(IndexError, match=r"index_select\(\): Index is supposed to be a vector.*\[2, 2\]"):
        tw.zeros(3).index_select(0, tw.zeros(2, 2).long())
    with pytest.raises(RuntimeError, match=r"index_select\(\): Expected dtype int32 or int64 for index \(got "
                                           r"float32"):
        tw.zeros(3).index_select(0, tw.zeros(2))


def test_index_add_source_shape():
    with pytest.raises(RuntimeError, match=r"index_add\(\): source of shape \[2, 5\] does not fit.*\[2, 4\]"):
        tw.zeros(3, 4).index_add(0, tw.tensor([0, 1]), tw.ones(2, 5))


# ---------------------------------------------------------------------------- pad

def test_reflect_padding_must_be_smaller_than_the_input():
    with pytest.raises(RuntimeError, match=r"^Argument #4: Padding size should be less than the corresponding input "
                                           r"dimension, but got: padding \(3, 0\) at dimension 2 of input \[1, 2, 3\]"):
        F.pad(tw.zeros(1, 2, 3), (3, 0), mode="reflect")


def test_pad_errors():
    with pytest.raises(RuntimeError, match="divisible by 2"):
        F.pad(tw.zeros(2, 3), (1, 2, 3))
    with pytest.raises(RuntimeError, match="pads 2 dims, but the input has only 1"):
        F.pad(tw.zeros(3), (1, 1, 1, 1))
    with pytest.raises(NotImplementedError, match="^Unrecognised padding mode mirror"):
        F.pad(tw.zeros(2, 3), (1, 1), mode="mirror")
    with pytest.raises(NotImplementedError, match=r"^Padding size 2 is not supported for 1D input tensor"):
        F.pad(tw.zeros(3), (1, 1), mode="replicate")
    with pytest.raises(RuntimeError, match=r"^Padding value causes wrapping around more than once\."):
        F.pad(tw.zeros(1, 2, 3), (4, 0), mode="circular")
    with pytest.raises(RuntimeError, match="^Padding mode \"reflect\" doesn't take in value argument"):
        F.pad(tw.zeros(1, 2, 3), (1, 0), mode="reflect", value=1.0)
    with pytest.raises(RuntimeError, match=r"input size 3 plus negative padding \(-2, -2\)"):
        F.pad(tw.zeros(2, 3), (-2, -2))


# ---------------------------------------------------------------------------- scans and sorting

def test_topk_and_kthvalue_k_out_of_range():
    with pytest.raises(RuntimeError, match=r"topk\(\): k \(6\) is out of range for dimension 1 of size 5"):
        tw.zeros(2, 5).topk(6)
    with pytest.raises(RuntimeError, match=r"^kthvalue\(\): selected number k out of range for dimension 1 \(k is 0.* "
                                           r"k must be in \[1, 5\]\)$"):
        tw.zeros(2, 5).kthvalue(0)


def test_searchsorted_contradicting_sides():
    with pytest.raises(RuntimeError, match="side and right can't be set to opposites, got side of left while right"):
        tw.searchsorted(tw.tensor([1, 2]), tw.tensor([1]), right=True, side="left")


def test_sort_nan_order_and_stability_match_torch():
    values = [2.0, float("nan"), 1.0, 2.0, float("nan"), 1.0]
    a, b = both(values)
    for descending in (False, True):
        ours, theirs = a.sort(descending=descending, stable=True), b.sort(descending=descending, stable=True)
        np.testing.assert_array_equal(ours[1].numpy(), theirs[1].numpy())
    close(a.cummax(0)[0], b.cummax(0)[0])
    np.testing.assert_array_equal(a.cummax(0)[1].numpy(), b.cummax(0)[1].numpy())
    np.testing.assert_array_equal(a.view(2, 3).median(1)[1].numpy(), b.view(2, 3).median(1)[1].numpy())


def test_cumprod_with_zeros_second_derivative_matches_torch():
    data = [[1.5, 0.0, 2.0, -1.0, 0.0, 3.0], [0.5, 2.0, 0.0, 1.5, 2.5, -2.0], [1.0, 2.0, 3.0, 0.5, 1.5, 2.0]]
    (a, ta), (g, tg) = both(data, True), both(np.linspace(-1, 1, 18).reshape(3, 6))
    (ga,) = tw.autograd.grad(a.cumprod(1), a, g, create_graph=True)
    (tga,) = torch.autograd.grad(ta.cumprod(1), ta, tg, create_graph=True)
    close(ga, tga)
    close(tw.autograd.grad((ga * ga).sum(), a)[0], torch.autograd.grad((tga * tga).sum(), ta)[0])


# ---------------------------------------------------------------------------- updates by index

def test_index_copy_with_distinct_indices():
    (x, tx), (src, tsrc) = both(np.arange(20.0).reshape(5, 4), True), both(-np.arange(15.0).reshape(5, 3), True)
    index = [3, 0, 1]
    out, expected = x.index_copy(1, tw.tensor(index), src), tx.index_copy(1, torch.tensor(index), tsrc)
    close(out, expected)
    out.pow(2).sum().backward()
    expected.pow(2).sum().backward()
    close(x.grad, tx.grad)
    close(src.grad, tsrc.grad)


def test_in_place_updates_record_autograd():
    (x, tx), (src, tsrc) = both(np.ones((3, 4)), True), both(np.arange(8.0).reshape(2, 4), True)
    y, ty = x * 2, tx * 2
    y.index_add_(0, tw.tensor([2, 2]), src, alpha=0.5)
    ty.index_add_(0, torch.tensor([2, 2]), tsrc, alpha=0.5)
    y.masked_scatter_(y > 3, src)
    ty.masked_scatter_(ty > 3, tsrc)
    close(y, ty)
    (y * y).sum().backward()
    (ty * ty).sum().backward()
    close(x.grad, tx.grad)
    close(src.grad, tsrc.grad)


def test_cat_does_not_hold_its_inputs_for_backward():
    a = tw.ones(2, requires_grad=True)
    b = a * 1
    out = tw.cat([b, b * 2])
    b.add_(1)  # cat's backward needs only the input shapes, so this in-place write is harmless
    out.sum().backward()
    np.testing.assert_array_equal(a.grad.numpy(), [3.0, 3.0])


# ---------------------------------------------------------------------------- other validation

def test_repetition_errors():
    with pytest.raises(RuntimeError, match=r"number of repeat dims \(1\) can not be smaller .* \(2\)"):
        tw.zeros(2, 3).repeat(2)
    with pytest.raises(RuntimeError, match="repeats can not be negative, got -1"):
        tw.zeros(3).repeat_interleave(-1)
    with pytest.raises(RuntimeError, match=r"one entry per element along dim 0 \(size 3\).*\[2\]"):
        tw.zeros(3).repeat_interleave(tw.tensor([1, 2]))


def test_one_hot_errors():
    with pytest.raises(RuntimeError, match=r"smaller than num_classes \(3\), got 3"):
        F.one_hot(tw.tensor([0, 3]), 3)
    with pytest.raises(RuntimeError, match="non-negative, got -1"):
        F.one_hot(tw.tensor([-1, 0]))
    with pytest.raises(RuntimeError, match="int64"):
        F.one_hot(tw.tensor([0.0]))


def test_masked_and_triangle_errors():
    with pytest.raises(RuntimeError, match=r"mask selects 3 elements but source has only 2"):
        tw.zeros(3).masked_scatter(tw.tensor([True, True, True]), tw.ones(2))
    with pytest.raises(RuntimeError, match=r"masked_select\(\): expected a bool mask tensor, got tilewise.int64"):
        tw.zeros(3).masked_select(tw.tensor([1, 0, 1]))
    with pytest.raises(RuntimeError, match=r"tril\(\): input tensor must have at least 2 dimensions, got shape \[3\]"):
        tw.zeros(3).tril()
    with pytest.raises(RuntimeError, match=r"meshgrid\(\): .*tensor 1 has shape \[2, 2\]"):
        tw.meshgrid(tw.zeros(2), tw.zeros(2, 2))
    with pytest.raises(RuntimeError, match=r"trace\(\): expected a matrix.*\[2, 2, 2\]"):
        tw.zeros(2, 2, 2).trace()


# ---------------------------------------------------------------------------- einsum

@pytest.mark.parametrize("equation,shapes,message", [
    ("ij,jk->ik", [(2, 3)], "fewer operands were provided than specified in the equation"),
    ("ij->ij", [(2, 3), (3, 4)], "more operands were provided than specified in the equation"),
    ("i1->i", [(2, 3)], "invalid subscript given at index 1 in the equation string, subscripts must be in"),
    ("ijk->i", [(2, 3)], r"the number of subscripts in the equation \(3\) does not match the number of "
                         r"dimensions \(2\) for operand 0 and no ellipsis was given"),
    ("ij->ii", [(2, 3)], "output subscript i appears more than once in the output"),
    ("ij->k", [(2, 3)], "output subscript k does not appear in the equation for any input operand"),
    ("ii->i", [(2, 3)], r"subscript i is repeated for operand 0 but the sizes don't match, 3 != 2"),
    ("ij,jk->ik", [(2, 3), (4, 5)], "subscript j has size 4 for operand 1 which does not broadcast with previously "
                                    "seen size 3"),
    ("i.j->ij", [(2, 3)], "found '.' for operand 0 that is not part of any ellipsis"),
    ("ij->i->j", [(2, 3)], "the equation 'ij->i->j' must contain '->' at most once"),
    ("ijk...->i", [(2, 3)], r"the number of subscripts in the equation \(3\) is more than the number of "
                            r"dimensions \(2\) for operand 0"),
])
def test_einsum_malformed_equations(equation, shapes, message):
    with pytest.raises(RuntimeError, match=f"^einsum\\(\\): {message}"):
        tw.einsum(equation, *[tw.zeros(s) for s in shapes])

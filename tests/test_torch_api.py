"""torch-namespace breadth beyond the operator table: legacy tensor types, numpy keyword spellings, 0-dim
reductions over dim 0/-1, tuples inside index tuples, predicates. Each case runs the same call on torch."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tilewise as tw

TYPE_NAMES = ["FloatTensor", "DoubleTensor", "HalfTensor", "BFloat16Tensor", "LongTensor", "IntTensor",
              "ShortTensor", "CharTensor", "ByteTensor", "BoolTensor"]


def same(actual, expected):
    if isinstance(expected, (tuple, list)):
        assert len(actual) == len(expected)
        for a, e in zip(actual, expected):
            same(a, e)
        return
    if not isinstance(expected, torch.Tensor):
        assert actual == expected
        return
    assert tuple(actual.shape) == tuple(expected.shape)
    assert actual.dtype.name == str(expected.dtype).removeprefix("torch.")
    np.testing.assert_allclose(actual.float().numpy() if actual.dtype.name == "bfloat16" else actual.numpy(),
                               expected.float().numpy() if expected.dtype == torch.bfloat16 else expected.numpy(),
                               rtol=1e-6, equal_nan=True)


@pytest.mark.parametrize("name", TYPE_NAMES)
@pytest.mark.parametrize("args", [((1, 0, 2),), ([[1, 2], [3, 4]],), ([],), (2, 3), ((),)], ids=str)
def test_legacy_constructor_matches_torch(name, args):
    expected = getattr(torch, name)(*args)
    actual = getattr(tw, name)(*args)
    assert tuple(actual.shape) == tuple(expected.shape)
    assert actual.dtype.name == str(expected.dtype).removeprefix("torch.")
    if expected.numel() and len(args) == 1:  # sizes give uninitialised memory
        same(actual, expected)


def test_legacy_constructor_without_arguments_and_from_sizes():
    assert tuple(tw.FloatTensor().shape) == tuple(torch.FloatTensor().shape) == (0,)
    assert tuple(tw.LongTensor(tw.Size([2, 3])).shape) == tuple(torch.LongTensor(torch.Size([2, 3])).shape)


@pytest.mark.parametrize("name", TYPE_NAMES)
def test_isinstance_and_type_string(name):
    dtype = getattr(torch, name).dtype
    t = torch.zeros(2, dtype=dtype)
    x = tw.zeros(2, dtype=getattr(tw, str(dtype).removeprefix("torch.")))
    for other in TYPE_NAMES:
        assert isinstance(x, getattr(tw, other)) == isinstance(t, getattr(torch, other)), other
    assert x.type() == t.type().replace("torch.", "tilewise.")
    assert not isinstance(x, getattr(tw.cuda, name))
    assert not isinstance(np.zeros(2), getattr(tw, name))


def test_type_converts_by_legacy_type_string_or_dtype():
    x = tw.tensor([1.5, -2.5])
    assert x.type(tw.LongTensor).dtype is tw.int64
    assert x.type("torch.IntTensor").dtype is tw.int32
    assert x.type("tilewise.DoubleTensor").dtype is tw.float64
    assert x.type(tw.float16).dtype is tw.float16
    same(x.type(tw.LongTensor), torch.tensor([1.5, -2.5]).type(torch.LongTensor))


def test_legacy_constructor_errors_like_torch():
    with pytest.raises(TypeError):
        torch.FloatTensor(torch.ones(2, dtype=torch.long))
    with pytest.raises(TypeError, match="FloatTensor"):
        tw.FloatTensor(tw.ones(2, dtype=tw.long))
    with pytest.raises(RuntimeError, match="legacy constructor expects device type: cpu"):
        tw.FloatTensor(2, device="cuda")
    with pytest.raises(TypeError):
        tw.LongTensor(2, "a")
    t = tw.tensor([1, 2])
    alias = tw.LongTensor(t)
    assert alias.data_ptr() == t.data_ptr()


NUMPY_KEYWORDS = ["x.sum(axis=0)", "M.mean(x, axis=1)", "x.sum(0, keepdims=True)", "x.amax(axis=1)",
                  "x.max(axis=1)", "x.argmax(axis=1)", "M.cat([x, x], axis=1)", "x.softmax(axis=1)",
                  "x.cumsum(axis=0)", "x.std(axis=0)", "x.var(axis=0, keepdims=True)", "M.sum(input=x)",
                  "x.unsqueeze(axis=0)", "M.stack([x, x], axis=0)", "x.argsort(axis=0)", "x.sort(axis=1)",
                  "x.topk(1, axis=0)", "M.gather(x, axis=0, index=M.zeros(1, 3, dtype=M.long))",
                  "x.logsumexp(axis=1)", "x.prod(axis=0, keepdims=True)", "x.any(axis=0)"]


@pytest.mark.parametrize("code", NUMPY_KEYWORDS)
def test_numpy_keyword_spellings(code):
    data = np.arange(6.0).reshape(2, 3) % 4
    expected = eval(code, {"M": torch, "x": torch.tensor(data)})
    actual = eval(code, {"M": tw, "x": tw.tensor(data)})
    same(actual, expected)


@pytest.mark.parametrize("code", ["x.sum(0, axis=0)", "x.sum(0, keepdim=True, keepdims=True)", "x.cumsum()"])
def test_numpy_keyword_conflicts_raise_type_error(code):
    with pytest.raises(TypeError):
        eval(code, {"x": torch.ones(2, 3)})
    with pytest.raises(TypeError):
        eval(code, {"x": tw.ones(2, 3)})


ZERO_DIM = ["x.sum(0)", "x.sum(-1)", "x.sum((0,))", "x.mean(0, keepdim=True)", "x.mean(-1)", "x.amax(0)",
            "x.amin(-1)", "x.max(0)", "x.argmax(0)", "x.softmax(0)", "x.log_softmax(-1)", "x.logsumexp(0)",
            "x.prod(0)", "x.cumsum(0)", "x.norm(dim=0)", "x.any(0)", "x.std(0, correction=0)",
            "x.var(-1, correction=0)"]


@pytest.mark.parametrize("code", ZERO_DIM)
def test_zero_dim_reductions_over_dim_0(code):
    same(eval(code, {"x": tw.tensor(3.0)}), eval(code, {"x": torch.tensor(3.0)}))


def test_zero_dim_reduction_refuses_dims_past_minus_one_and_zero():
    with pytest.raises(IndexError, match="Dimension out of range"):
        tw.tensor(3.0).mean(1)
    with pytest.raises(RuntimeError, match="multiple times"):
        tw.tensor(3.0).sum((0, -1))


INDEX_TUPLES = ["x[(0,),]", "x[(0, 1),]", "x[((0, 1), (1, 2))]", "x[(0,), 1]", "x[[0, 1], (1, 2)]",
                "x[[0, 1], ...]", "x[(0, 1)]", "x[..., (2, 0)]"]


@pytest.mark.parametrize("code", INDEX_TUPLES)
def test_tuple_inside_index_tuple(code):
    data = np.arange(6.0).reshape(2, 3)
    same(eval(code, {"x": tw.tensor(data)}), eval(code, {"x": torch.tensor(data)}))


def test_tuple_inside_index_tuple_assigns():
    t, x = torch.zeros(2, 3), tw.zeros(2, 3)
    t[(0, 1), (2, 0)] = 5.0
    x[(0, 1), (2, 0)] = 5.0
    same(x, t)


def test_strided_write_backward_reads_a_gradient_slice_at_its_offset():
    """pad writes its input into a filled tensor (view_scatter); cat hands that a slice of its gradient that
    starts past the storage's first element."""
    g = np.arange(6.0).reshape(3, 2)
    grads = []
    for lib, nnf in ((torch, torch.nn.functional), (tw, tw.nn.functional)):
        a, b = lib.ones(2, 2, requires_grad=True), lib.ones(1, 2, requires_grad=True)
        lib.cat([a * 1, nnf.pad(b, [0, 0])], 0).backward(lib.tensor(g, dtype=lib.float32))
        grads.append(b.grad)
    same(grads[1], grads[0])


METHOD_CALLS = ["M.greater(x, 0.5)", "x.less_equal(1.0)", "M.not_equal(x, x)", "x.greater_equal(x)", "M.less(x, 2)",
                "x.is_nonzero() if x.numel() == 1 else x[0, 0].is_nonzero()", "x.is_same_size(x.t())",
                "M.is_same_size(x, x)", "x.is_signed()", "x.long().is_signed()", "x.bool().is_signed()",
                "x.get_device()", "M.broadcast_shapes((2, 1), (3,), 1)", "M.fill(x, 2.5)", "x.polygamma(1)",
                "M.abs_(x - 2)", "M.trunc_(x * 3)", "M.zero_(x.clone())",
                "M.equal(x, x.t())", "M.zeros(3).scatter_reduce(0, M.tensor([0, 1]), M.tensor([5.0, -2.0]), 'max')",
                "M.zeros(3).scatter_reduce(0, M.tensor([0, 1]), M.tensor([5.0, -2.0]), 'min')"]


@pytest.mark.parametrize("code", METHOD_CALLS)
def test_method_and_function_spellings(code):
    data = np.arange(1.0, 7.0).reshape(2, 3) / 4
    same(eval(code, {"M": tw, "x": tw.tensor(data)}), eval(code, {"M": torch, "x": torch.tensor(data)}))


@pytest.mark.parametrize("code", ["x.t_()", "x.transpose_(0, 1)", "x.swapaxes_(1, 0)", "x.unsqueeze_(1)",
                                  "x.unsqueeze_(0).squeeze_()", "x.squeeze_(0)", "x.as_strided_((3,), (2,))"])
def test_inplace_views_change_the_tensor_itself(code):
    data = np.arange(6.0).reshape(2, 3)
    t, x = torch.tensor(data), tw.tensor(data)
    returned_t, returned_x = eval(code, {"x": t}), eval(code, {"x": x})
    assert returned_x is x and returned_t is t
    same(x, t)


def test_inplace_view_refuses_a_tensor_that_requires_grad():
    with pytest.raises(RuntimeError, match="t_"):
        tw.ones(2, 3, requires_grad=True).t_()


def test_is_nonzero_errors_like_torch():
    for data in ([1.0, 2.0], []):
        with pytest.raises(RuntimeError, match="ambiguous"):
            torch.tensor(data).is_nonzero()
        with pytest.raises(RuntimeError, match="ambiguous"):
            tw.tensor(data).is_nonzero()


def test_made_inplace_index_put_addmm_baddbmm():
    for lib in (torch, tw):
        y = lib.zeros(3)
        assert y.index_put_((lib.tensor([0, 2]),), lib.tensor(5.0)) is y
    same(tw.zeros(3).index_put_((tw.tensor([0, 2]),), tw.tensor(5.0), accumulate=True),
         torch.zeros(3).index_put_((torch.tensor([0, 2]),), torch.tensor(5.0), accumulate=True))
    a, b = np.ones((2, 3)), np.arange(12.0).reshape(3, 4)
    same(tw.zeros(2, 4, dtype=tw.float64).addmm_(tw.tensor(a), tw.tensor(b), alpha=2),
         torch.zeros(2, 4, dtype=torch.float64).addmm_(torch.tensor(a), torch.tensor(b), alpha=2))
    for lib in (torch, tw):  # a float32 self with float64 matrices is refused, as torch refuses it
        with pytest.raises(RuntimeError, match="self and mat2 must have the same dtype, but got Float and Double"):
            lib.zeros(2, 4).addmm_(lib.tensor(a), lib.tensor(b), alpha=2)
    same(tw.zeros(2, 2, 4).baddbmm_(tw.ones(2, 2, 3), tw.ones(2, 3, 4)),
         torch.zeros(2, 2, 4).baddbmm_(torch.ones(2, 2, 3), torch.ones(2, 3, 4)))


@pytest.mark.parametrize("code", ["M.unique(M.tensor([1.0, 2.0]), dim=1)", "M.bincount(M.tensor([-1]))",
                                  "M.bincount(M.tensor([1.0]))", "M.histc(M.tensor([1, 2]))",
                                  "M.hypot(M.tensor([3]), M.tensor([4]))", "M.gcd(M.tensor([1.0]), M.tensor([2.0]))",
                                  "M.frexp(M.tensor([8]))", "M.heaviside(M.tensor([1.0]), M.tensor([1]))",
                                  "M.isclose(M.tensor([1]), M.tensor([1.0]))",
                                  "M.isclose(M.tensor([1.0]), M.tensor([1.0]), rtol=-1)",
                                  "M.hsplit(M.ones(4, 5), 3)", "M.vsplit(M.ones(4), 2)",
                                  "M.rot90(M.ones(2, 2), 1, [0, 0])",
                                  "M.positive(M.tensor([True]))", "M.nanmean(M.tensor([1, 2]))",
                                  "M.polygamma(-1, M.tensor([1.0]))",
                                  "M.zeros(3).scatter_reduce(0, M.tensor([0]), M.ones(1), 'maximum')",
                                  "M.mvlgamma(M.tensor([1.0]), 0)"])
def test_errors_match_torch(code):
    with pytest.raises(Exception) as expected:
        eval(code, {"M": torch})
    with pytest.raises(type(expected.value)):
        eval(code, {"M": tw})


GPU_CALLS = ["M.digamma(x.abs() + 0.1)", "M.polygamma(2, x.abs() + 0.5)", "M.i0(x * 10)", "M.lgamma(x.abs() + 0.1)",
             "M.asinh(x)", "M.hypot(x, x.flip(0))", "M.logaddexp(x, x.t().t() * 2)", "M.xlogy(x, x.abs())",
             "M.unique(x.round(), return_counts=True)", "M.bincount((x.abs() * 3).long().reshape(-1))",
             "x.scatter_reduce(1, (x.abs() * 2).long().clamp(max=3), x, 'amax')", "M.logcumsumexp(x, 1)",
             "M.isin(x.round(), x.round()[0])", "M.kron(x, x)", "M.diff(x, dim=0)", "M.nansum(x)"]


@pytest.mark.cuda
@pytest.mark.parametrize("code", GPU_CALLS)
def test_breadth_operators_on_cuda_match_cpu(code):
    data = np.random.default_rng(0).uniform(-2, 2, (4, 4)).astype(np.float32)
    on_cpu = eval(code, {"M": tw, "x": tw.tensor(data)})
    on_gpu = eval(code, {"M": tw, "x": tw.tensor(data, device="cuda")})
    for c, g in zip(on_cpu if isinstance(on_cpu, tuple) else (on_cpu,), on_gpu if isinstance(on_gpu, tuple)
                    else (on_gpu,)):
        np.testing.assert_allclose(g.cpu().numpy(), c.numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape,wrap", [((5, 3), True), ((5, 3), False), ((3, 3, 3), False), ((2, 4), False),
                                        ((7, 2), True)])
def test_fill_diagonal_(shape, wrap):
    t, x = torch.zeros(shape), tw.zeros(shape)
    assert x.fill_diagonal_(2.0, wrap=wrap) is x
    same(x, t.fill_diagonal_(2.0, wrap=wrap))


def test_factories_asarray_empty_strided_detach():
    data = np.arange(3.0)
    x = tw.asarray(data)
    assert x.dtype is tw.float64 and tw.asarray(data, copy=True).data_ptr() != x.data_ptr()
    assert tw.empty_strided((2, 3), (1, 2)).stride() == torch.empty_strided((2, 3), (1, 2)).stride()
    assert not tw.detach(tw.ones(2, requires_grad=True)).requires_grad
    same(tw.nan_to_num_(tw.tensor([float("nan"), 1.0])), torch.nan_to_num_(torch.tensor([float("nan"), 1.0])))

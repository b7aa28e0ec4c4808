"""torch's multi-tensor functions (``_foreach_*``) against torch: values, dtypes, in-place identity, gradients,
and the errors of a whole call (empty lists, lists of different lengths, a scalar tensor that is not 0-dim)."""

import numpy as np
import pytest
import torch

import tilewise as tw

SHAPES = [(2, 3), (4,), ()]


def _lists(seed: int, dtype=np.float32, positive: bool = False):
    rng = np.random.default_rng(seed)
    arrays = [rng.standard_normal(shape).astype(dtype) for shape in SHAPES]
    if positive:
        arrays = [np.abs(a) + np.asarray(0.5, dtype) for a in arrays]
    return [tw.from_numpy(a.copy()) for a in arrays], [torch.from_numpy(a.copy()) for a in arrays]


def _close(ours, theirs):
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs):
        assert str(a.dtype).split(".")[-1] == str(b.dtype).split(".")[-1]
        np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), rtol=1e-6, atol=1e-6)


# (name, function of (framework, self list, other list) giving the call's result)
CASES = [
    ("add_list_alpha", lambda m, a, b: m._foreach_add(a, b, alpha=2.5)),
    ("add_scalar", lambda m, a, b: m._foreach_add(a, 1.5)),
    ("add_scalar_list", lambda m, a, b: m._foreach_add(a, [1, 2.5, -3])),
    ("add_0dim_tensor", lambda m, a, b: m._foreach_add(a, m.tensor(2.0), alpha=3)),
    ("sub_list", lambda m, a, b: m._foreach_sub(a, b)),
    ("mul_scalar", lambda m, a, b: m._foreach_mul(a, 0.5)),
    ("mul_0dim_tensor", lambda m, a, b: m._foreach_mul(a, m.tensor(1 / 3))),
    ("div_list", lambda m, a, b: m._foreach_div(a, b)),
    ("maximum_list", lambda m, a, b: m._foreach_maximum(a, b)),
    ("maximum_scalar", lambda m, a, b: m._foreach_maximum(a, 0.25)),
    ("minimum_scalar_list", lambda m, a, b: m._foreach_minimum(a, [0.0, 0.5, -0.5])),
    ("clamp_min_list", lambda m, a, b: m._foreach_clamp_min(a, b)),
    ("clamp_max_scalar", lambda m, a, b: m._foreach_clamp_max(a, 0.1)),
    ("pow_scalar", lambda m, a, b: m._foreach_pow(a, 2)),
    ("pow_scalar_base", lambda m, a, b: m._foreach_pow(2.0, a)),
    ("lerp_scalar", lambda m, a, b: m._foreach_lerp(a, b, 0.1)),
    ("lerp_scalar_list", lambda m, a, b: m._foreach_lerp(a, b, [0.1, 0.5, 0.9])),
    ("lerp_tensor_list", lambda m, a, b: m._foreach_lerp(a, b, m._foreach_sigmoid(b))),
    ("addcmul_value", lambda m, a, b: m._foreach_addcmul(a, a, b, value=-0.5)),
    ("addcdiv_scalar_list", lambda m, a, b: m._foreach_addcdiv(a, a, m._foreach_add(m._foreach_abs(b), 1), [1, 2, 3])),
    ("addcdiv_scalar_tensor", lambda m, a, b: m._foreach_addcdiv(a, b, m._foreach_exp(a), m.tensor([1.0, -2, 3]))),
    ("norm", lambda m, a, b: m._foreach_norm(a)),
    ("norm_inf_float64", lambda m, a, b: m._foreach_norm(a, float("inf"), dtype=m.float64)),
    ("norm_1", lambda m, a, b: m._foreach_norm(a, 1)),
    ("max", lambda m, a, b: m._foreach_max(a)),
    ("clone", lambda m, a, b: m._foreach_clone(a)),
    *[(f"unary_{name}", lambda m, a, b, name=name: getattr(m, f"_foreach_{name}")(m._foreach_abs(a)))
      for name in ("exp", "log1p", "sqrt", "rsqrt", "sigmoid", "tanh", "neg", "sign", "reciprocal", "erf", "frac",
                   "round", "trunc", "lgamma", "sin", "atan")],
]


@pytest.mark.parametrize("name, fn", CASES, ids=[c[0] for c in CASES])
def test_out_of_place_matches_torch(name, fn):
    (ours_a, theirs_a), (ours_b, theirs_b) = _lists(0), _lists(1)
    ours, theirs = fn(tw, ours_a, ours_b), fn(torch, theirs_a, theirs_b)
    assert type(ours) is tuple and type(theirs) is tuple
    _close(ours, theirs)


INPLACE = [
    ("add_", lambda m, a, b: m._foreach_add_(a, b, alpha=-0.5)),
    ("sub_scalar_list", lambda m, a, b: m._foreach_sub_(a, [1, 2, 3])),
    ("mul_", lambda m, a, b: m._foreach_mul_(a, b)),
    ("div_0dim", lambda m, a, b: m._foreach_div_(a, m.tensor(4.0))),
    ("lerp_", lambda m, a, b: m._foreach_lerp_(a, b, weight=0.0002)),
    ("addcmul_", lambda m, a, b: m._foreach_addcmul_(a, b, b, value=0.01)),
    ("addcdiv_", lambda m, a, b: m._foreach_addcdiv_(a, b, m._foreach_exp(b), [0.1, 0.2, 0.3])),
    ("maximum_", lambda m, a, b: m._foreach_maximum_(a, 0.0)),
    ("clamp_max_", lambda m, a, b: m._foreach_clamp_max_(a, b)),
    ("pow_", lambda m, a, b: m._foreach_pow_(a, [1, 2, 3])),
    ("exp_", lambda m, a, b: m._foreach_exp_(a)),
    ("zero_", lambda m, a, b: m._foreach_zero_(a)),
    ("copy_", lambda m, a, b: m._foreach_copy_(a, b)),
]


@pytest.mark.parametrize("name, fn", INPLACE, ids=[c[0] for c in INPLACE])
def test_in_place_updates_each_tensor_and_returns_the_list(name, fn):
    (ours_a, theirs_a), (ours_b, theirs_b) = _lists(0), _lists(1)
    kept = list(ours_a)
    assert fn(tw, ours_a, ours_b) is ours_a and fn(torch, theirs_a, theirs_b) is theirs_a
    assert all(a is b for a, b in zip(ours_a, kept))
    _close(ours_a, theirs_a)


def test_ema_of_a_state_dict_as_timm_writes_it():
    ours_model, theirs_model = tw.nn.Linear(3, 2), torch.nn.Linear(3, 2)
    ours_model.load_state_dict({k: tw.from_numpy(v.detach().numpy().copy()) for k, v in
                                theirs_model.state_dict().items()})
    ours_ema, theirs_ema = tw.nn.Linear(3, 2), torch.nn.Linear(3, 2)
    ours_ema.load_state_dict({k: tw.from_numpy(v.detach().numpy().copy()) for k, v in theirs_ema.state_dict().items()})
    for m, model, ema in ((tw, ours_model, ours_ema), (torch, theirs_model, theirs_ema)):
        with m.no_grad():
            for _ in range(3):
                m._foreach_mul_(list(model.state_dict().values()), 0.9)
                m._foreach_lerp_(list(ema.state_dict().values()), list(model.state_dict().values()), weight=0.1)
    _close(list(ours_ema.state_dict().values()), list(theirs_ema.state_dict().values()))


def test_out_of_place_forms_are_differentiable():
    (ours_a, theirs_a), (ours_b, theirs_b) = _lists(0), _lists(1)
    for t in ours_a + theirs_a:
        t.requires_grad_()
    for m, a, b in ((tw, ours_a, ours_b), (torch, theirs_a, theirs_b)):
        out = m._foreach_lerp(m._foreach_mul(a, b), b, 0.25)
        sum(o.sum() for o in m._foreach_norm(out)).backward()
    _close([t.grad for t in ours_a], [t.grad for t in theirs_a])


def test_type_promotion_is_the_per_tensor_operators():
    ours = tw._foreach_add([tw.ones(2, dtype=tw.int64)], 1.5)
    theirs = torch._foreach_add([torch.ones(2, dtype=torch.int64)], 1.5)
    _close(ours, theirs)
    _close(tw._foreach_exp([tw.ones(2, dtype=tw.int64)]), torch._foreach_exp([torch.ones(2, dtype=torch.int64)]))
    with pytest.raises(RuntimeError, match="can.t be cast to the desired output type"):
        tw._foreach_add_([tw.ones(2, dtype=tw.int64)], 1.5)


ERRORS = [
    (lambda m: m._foreach_add([], 1), RuntimeError, "Tensor list must have at least one tensor"),
    (lambda m: m._foreach_add([m.ones(2), m.ones(3)], [m.ones(2)]), RuntimeError,
     "Tensor lists must have the same number of tensors, got 2 and 1"),
    (lambda m: m._foreach_mul([m.ones(2), m.ones(3)], [1.0]), RuntimeError,
     "Tensor list must have same number of elements as scalar list"),
    (lambda m: m._foreach_add([m.ones(2)], m.ones(2)), RuntimeError,
     "scalar tensor expected to be 0 dim but it has 1 dimensions and 2 elements"),
    (lambda m: m._foreach_lerp([m.ones(2)], [m.ones(2), m.ones(2)], 0.5), RuntimeError,
     "Tensor lists must have the same number of tensors, got 1 and 2"),
    (lambda m: m._foreach_addcdiv([m.ones(2)], [m.ones(2)], [m.ones(2)], m.tensor([1.0, 2.0])), RuntimeError,
     "Expected length of scalars to match input of length 1 but got 2 instead"),
    (lambda m: m._foreach_add(m.ones(2), 1), TypeError, "_foreach_add"),
    (lambda m: m._foreach_add([m.ones(2)], 1, alpha=2), TypeError, "_foreach_add"),
    (lambda m: m._foreach_add([m.ones(2)], [m.ones(3)]), RuntimeError, "size"),
    (lambda m: m._foreach_norm([m.ones(2, dtype=m.int64)]), RuntimeError,
     "linalg.vector_norm: Expected a floating point or complex tensor as input"),
    (lambda m: m._foreach_add_([m.ones(2, requires_grad=True)], 1), RuntimeError,
     "a leaf Variable that requires grad is being used in an in-place operation"),
]


@pytest.mark.parametrize("call, error, message", ERRORS)
def test_errors_match_torch(call, error, message):
    with pytest.raises(error, match=message):
        call(torch)
    with pytest.raises(error, match=message):
        call(tw)

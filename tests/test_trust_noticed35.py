"""Calls where tilewise and torch were seen to differ, each compared with torch directly: numbers given for operands
torch takes only as tensors, clamping bool tensors, loss targets of small integer dtypes, stable sorts, the
gradient of the 0-norm, and torch's words in common shape and dtype errors.
"""

from __future__ import annotations

import re
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import tilewise as tw
import tilewise.nn.functional as F

pytestmark = pytest.mark.filterwarnings("ignore")


def torch_error(call) -> BaseException:
    """What ``call(torch)`` raises (it must raise)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            call(torch)
        except Exception as exc:  # noqa: BLE001 — whatever torch raises is the expectation
            return exc
    raise AssertionError("torch accepted the call")


def _argument_lines(message: str) -> list[str]:
    """torch's message without the lines that say why each of several signatures did not match (tilewise lists the
    signatures only)."""
    return [line for line in message.splitlines() if not line.startswith("      didn't match")]


def raises_as_torch(call) -> None:
    """``call(tw)`` raises what ``call(torch)`` raises: its type and its words."""
    expected = torch_error(call)
    with pytest.raises(type(expected)) as info:
        call(tw)
    assert _argument_lines(str(info.value)) == _argument_lines(str(expected))


def pair(shape=(3, 4), dtype="float32", seed=0, low=-2.0, high=2.0):
    values = np.random.default_rng(seed).uniform(low, high, shape).astype(dtype)
    return torch.tensor(values), tw.tensor(values)


def lib_tensor(m, values, **kwargs):
    return m.tensor(values, **kwargs)


# ---------------------------------------------------------------------------- numbers for tensor-only operands

ONE_SIGNATURE = ("maximum", "minimum", "fmax", "fmin", "atan2", "arctan2", "hypot", "heaviside", "logaddexp",
                 "logaddexp2", "nextafter", "logical_and", "logical_or", "logical_xor")


def _operands(m):
    return m.tensor([0.5, -1.0, 3.0])


@pytest.mark.parametrize("number", [2.0, 2, True, np.float64(2.0)], ids=["float", "int", "bool", "numpy"])
@pytest.mark.parametrize("name", ONE_SIGNATURE)
def test_a_number_for_a_tensor_only_operand_is_refused_as_torch_refuses_it(name, number):
    raises_as_torch(lambda m: getattr(m, name)(_operands(m), number))
    raises_as_torch(lambda m: getattr(m, name)(number, _operands(m)))
    raises_as_torch(lambda m: getattr(_operands(m), name)(number))


@pytest.mark.parametrize("name", ["atan2", "hypot", "logical_and", "nextafter"])
def test_an_in_place_method_refuses_a_number_as_torch(name):
    raises_as_torch(lambda m: getattr(_operands(m), f"{name}_")(2.0))


@pytest.mark.parametrize("call", [
    lambda m: m.maximum(_operands(m), other=2.0), lambda m: m.maximum(input=2.0, other=_operands(m)),
    lambda m: _operands(m).maximum(other=2.0), lambda m: m.maximum(_operands(m), None),
    lambda m: m.maximum(_operands(m), [1.0, 2.0, 3.0]),
    lambda m: m.addcmul(_operands(m), _operands(m), 2.0), lambda m: m.addcdiv(2.0, _operands(m), _operands(m)),
    lambda m: _operands(m).addcmul(_operands(m), 2.0), lambda m: _operands(m).addcmul_(_operands(m), 2.0),
    lambda m: _operands(m).addcmul(tensor1=2.0, tensor2=_operands(m)),
], ids=["other=", "input=", "method-other=", "None", "list", "addcmul", "addcdiv-input", "addcmul-method",
        "addcmul_", "addcmul-tensor1="])
def test_the_refusal_names_the_argument_and_its_position_as_torch(call):
    raises_as_torch(call)


@pytest.mark.parametrize("call", [
    lambda m: m.max(_operands(m), 2.0), lambda m: m.min(_operands(m), 2.0), lambda m: m.max(_operands(m), True),
    lambda m: m.max(_operands(m), np.float32(1)), lambda m: m.max(2.0, _operands(m)),
    lambda m: m.max(_operands(m), other=2.0), lambda m: _operands(m).max(2.0), lambda m: _operands(m).min(True),
    lambda m: m.eq(2.0, _operands(m)), lambda m: m.greater(2.0, _operands(m)), lambda m: m.fmod(2.0, _operands(m)),
    lambda m: m.fmod(2.0, other=_operands(m)), lambda m: m.copysign(2.0, _operands(m)),
    lambda m: m.eq(input=2.0, other=_operands(m)), lambda m: m.rsub(2.0, _operands(m)),
    lambda m: m.clamp(2.0, _operands(m), _operands(m)), lambda m: m.clip(2.0, 0.0, 1.0),
    lambda m: m.lerp(_operands(m), 2.0, _operands(m)), lambda m: m.lerp(_operands(m), end=2.0, weight=0.5),
    lambda m: _operands(m).lerp(2.0, _operands(m)), lambda m: _operands(m).lerp_(2.0, 0.5),
    lambda m: m.where(True, _operands(m), _operands(m)), lambda m: m.where(1.0),
    lambda m: _operands(m).where(True, _operands(m)),
], ids=["max", "min", "max-bool", "max-numpy", "max-input", "max-other=", "max-method", "min-method", "eq-input",
        "greater-input", "fmod-input", "fmod-other=", "copysign-input", "eq-input=", "rsub-input", "clamp-input",
        "clip-numbers", "lerp-end", "lerp-end=", "lerp-method", "lerp_", "where-condition", "where-alone",
        "where-method"])
def test_a_number_that_no_signature_takes_is_refused_as_torch(call):
    raises_as_torch(call)


@pytest.mark.parametrize("call", [
    lambda m: m.max(_operands(m), 0), lambda m: m.max(_operands(m), np.int64(0)), lambda m: _operands(m).max(0),
    lambda m: m.max(_operands(m), m.tensor(1.0)), lambda m: m.min(_operands(m), dim=0, keepdim=True),
    lambda m: m.eq(_operands(m), 2.0), lambda m: m.fmod(_operands(m), 2), lambda m: m.copysign(_operands(m), -1.0),
    lambda m: _operands(m).copysign(-1.0), lambda m: m.lerp(_operands(m), _operands(m) * 2, 0.25),
    lambda m: m.where(_operands(m) > 0, 2.0, _operands(m)), lambda m: _operands(m).where(_operands(m) > 0, 1.0),
    lambda m: m.clamp(_operands(m), 0.0, 1.0), lambda m: m.rsub(_operands(m), 2.0),
    lambda m: m.maximum(_operands(m), m.tensor(2.0)), lambda m: m.logical_and(_operands(m), m.tensor(True)),
    lambda m: m.add(2.0, _operands(m)), lambda m: m.mul(_operands(m), 2),
], ids=["max-dim", "max-numpy-dim", "max-method-dim", "max-0-dim", "min-dim=", "eq-other", "fmod-other",
        "copysign-other", "copysign-method", "lerp-weight", "where-self", "where-method-other", "clamp",
        "rsub-other", "maximum-0-dim", "logical_and-0-dim", "add-number-first", "mul"])
def test_the_numbers_torch_takes_are_still_taken(call):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected, got = call(torch), call(tw)
    expected = expected.values if hasattr(expected, "values") and not isinstance(expected, torch.Tensor) else expected
    got = got.values if hasattr(got, "values") and not isinstance(got, tw.Tensor) else got
    assert got.dtype.name == str(expected.dtype).removeprefix("torch.") or str(got.dtype) == str(expected.dtype)
    np.testing.assert_allclose(np.asarray(got.tolist(), dtype=float), np.asarray(expected.tolist(), dtype=float))


# ---------------------------------------------------------------------------- hardtanh and relu6 of unusual dtypes

HARDTANH_SPELLINGS = {
    "F.hardtanh": lambda m, f, x: f.hardtanh(x), "F.hardtanh(0,1)": lambda m, f, x: f.hardtanh(x, 0.0, 1.0),
    "F.hardtanh_": lambda m, f, x: f.hardtanh_(x), "F.hardtanh(inplace)": lambda m, f, x: f.hardtanh(x, inplace=True),
    "F.relu6": lambda m, f, x: f.relu6(x), "F.relu6(inplace)": lambda m, f, x: f.relu6(x, inplace=True),
    "nn.Hardtanh": lambda m, f, x: m.nn.Hardtanh()(x), "nn.Hardtanh(inplace)": lambda m, f, x: m.nn.Hardtanh(
        inplace=True)(x), "nn.ReLU6": lambda m, f, x: m.nn.ReLU6()(x),
    "nn.ReLU6(inplace)": lambda m, f, x: m.nn.ReLU6(inplace=True)(x),
}


def _functional(m):
    return TF if m is torch else F


@pytest.mark.parametrize("spelling", HARDTANH_SPELLINGS)
@pytest.mark.parametrize("values", [[True, False, True], [1 + 1j, -2j]], ids=["bool", "complex"])
def test_hardtanh_and_relu6_refuse_what_torch_refuses(spelling, values):
    call = HARDTANH_SPELLINGS[spelling]
    raises_as_torch(lambda m: call(m, _functional(m), m.tensor(values)))


@pytest.mark.parametrize("bounds", [(-1.5, 1.5), (-0.5, 0.5), (0.5, 2.7), (1, 1), (-1, 0)])
@pytest.mark.parametrize("dtype", ["uint8", "int8", "int32", "int64"])
def test_hardtanh_of_integers_bounds_by_the_truncated_bounds_as_torch(dtype, bounds):
    values = [0, 1, 2, 3, 200] if dtype == "uint8" else [-3, -1, 0, 1, 2, 3]
    for call in (lambda m, x: _functional(m).hardtanh(x, *bounds), lambda m, x: _functional(m).hardtanh_(x, *bounds),
                 lambda m, x: m.nn.Hardtanh(*bounds)(x)):
        try:
            expected = call(torch, torch.tensor(values, dtype=getattr(torch, dtype)))
        except (RuntimeError, AssertionError):
            raises_as_torch(lambda m, c=call: c(m, m.tensor(values, dtype=getattr(m, dtype))))
            continue
        got = call(tw, tw.tensor(values, dtype=getattr(tw, dtype)))
        assert got.dtype.name == dtype and got.tolist() == expected.tolist()


# ---------------------------------------------------------------------------- class-index targets of small dtypes

CLASS_LOSSES = {
    "cross_entropy": lambda f, x, t: f.cross_entropy(x, t),
    "cross_entropy-none": lambda f, x, t: f.cross_entropy(x, t, reduction="none"),
    "cross_entropy-sum": lambda f, x, t: f.cross_entropy(x, t, reduction="sum"),
    "cross_entropy-ignore": lambda f, x, t: f.cross_entropy(x, t, ignore_index=1),
    "cross_entropy-smoothing": lambda f, x, t: f.cross_entropy(x, t, label_smoothing=0.2),
    "cross_entropy-weight": lambda f, x, t: f.cross_entropy(x, t, weight=x.new_ones(x.shape[1]) * 0.5),
    "nll_loss": lambda f, x, t: f.nll_loss(x, t),
    "nll_loss-none": lambda f, x, t: f.nll_loss(x, t, reduction="none"),
    "CrossEntropyLoss": lambda f, x, t: (torch if f is TF else tw).nn.CrossEntropyLoss()(x, t),
    "NLLLoss": lambda f, x, t: (torch if f is TF else tw).nn.NLLLoss()(x, t),
}


@pytest.mark.parametrize("shape", [(3,), (4, 3), (2, 3, 4), (2, 3, 2, 2), (2, 3, 1, 2, 2), (0, 3, 4)],
                         ids=["unbatched", "2d", "3d", "4d", "5d", "empty-3d"])
@pytest.mark.parametrize("dtype", ["uint8", "int8", "int16", "int32", "int64", "bool", "float32"])
@pytest.mark.parametrize("loss", CLASS_LOSSES)
def test_class_index_targets_of_every_integer_dtype_as_torch(loss, dtype, shape):
    rng = np.random.default_rng(3)
    logits = rng.standard_normal(shape).astype("float32")
    target = rng.integers(0, 3, (shape[0], *shape[2:]) if len(shape) > 1 else ())
    if dtype == "bool":
        target = target > 0

    def call(m):
        return CLASS_LOSSES[loss](_functional(m), m.tensor(logits), m.tensor(target, dtype=getattr(m, dtype)))

    try:
        expected = call(torch)
    except Exception:  # noqa: BLE001 — torch's refusal is the expectation
        raises_as_torch(call)
        return
    got = call(tw)
    assert tuple(got.shape) == tuple(expected.shape)
    assert str(got.dtype) == str(expected.dtype).replace("torch", "tilewise")
    np.testing.assert_allclose(np.asarray(got.tolist()), np.asarray(expected.tolist()), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("input_shape, target_shape", [
    ((), ()), ((3,), (1,)), ((3,), (2,)), ((4, 3), (5,)), ((2, 3, 4), (2, 5)), ((2, 3, 4), (3, 4)), ((2, 3), (2, 1)),
    ((3,), (1, 1)),
], ids=["0-dim", "1d-target-of-one", "1d-target-of-two", "batch", "3d-target", "3d-batch", "multi-target",
        "unbatched-2d-target"])
@pytest.mark.parametrize("loss", ["cross_entropy", "nll_loss"])
def test_class_index_target_shapes_as_torch(loss, input_shape, target_shape):
    def call(m):
        return getattr(_functional(m), loss)(m.zeros(input_shape), m.zeros(target_shape, dtype=m.int64))

    try:
        expected = call(torch)
    except Exception:  # noqa: BLE001 — torch's refusal is the expectation
        raises_as_torch(call)
        return
    got = call(tw)
    assert tuple(got.shape) == tuple(expected.shape) and got.item() == pytest.approx(expected.item())


def test_class_probability_targets_of_integers_are_refused_in_torch_words():
    raises_as_torch(lambda m: _functional(m).cross_entropy(m.zeros(2, 3), m.zeros(2, 3, dtype=m.int32)))
    raises_as_torch(lambda m: _functional(m).cross_entropy(m.zeros(2, 3), m.zeros(2, 3), ignore_index=1))
    raises_as_torch(lambda m: _functional(m).cross_entropy(m.tensor(1.0), m.tensor(0.0)))
    raises_as_torch(lambda m: _functional(m).cross_entropy(m.zeros(2, 3), m.zeros(2, dtype=m.int64),
                                                           label_smoothing=1.5))


# ---------------------------------------------------------------------------- stable sorts

SORT_FORMS = {
    "sort(x, stable=True)": lambda m, x: m.sort(x, stable=True),
    "sort(x, stable=True, dim=0, descending=True)": lambda m, x: m.sort(x, stable=True, dim=0, descending=True),
    "sort(x, dim=0, stable=True)": lambda m, x: m.sort(x, dim=0, stable=True),
    "sort(input=x, stable=True, descending=True)": lambda m, x: m.sort(input=x, stable=True, descending=True),
    "sort(x, stable=None)": lambda m, x: m.sort(x, stable=None),
    "sort(x, stable=False, descending=True)": lambda m, x: m.sort(x, stable=False, descending=True),
    "sort(x, 0, True)": lambda m, x: m.sort(x, 0, True),
    "x.sort(stable=True)": lambda m, x: x.sort(stable=True),
    "x.sort(stable=True, dim=0)": lambda m, x: x.sort(stable=True, dim=0),
    "x.sort(descending=True, stable=True)": lambda m, x: x.sort(descending=True, stable=True),
    "x.sort(-1, True)": lambda m, x: x.sort(-1, True),
    "argsort(x, stable=True)": lambda m, x: m.argsort(x, stable=True),
    "argsort(x, dim=0, descending=True, stable=True)": lambda m, x: m.argsort(x, dim=0, descending=True, stable=True),
    "argsort(x, 0, True)": lambda m, x: m.argsort(x, 0, True),
    "x.argsort(stable=True)": lambda m, x: x.argsort(stable=True),
    "x.argsort(stable=False, descending=True)": lambda m, x: x.argsort(stable=False, descending=True),
    "sort-out": lambda m, x: m.sort(x, stable=True, dim=0, descending=True,
                                    out=(m.empty(0, dtype=x.dtype), m.empty(0, dtype=m.int64))),
    "argsort-out": lambda m, x: m.argsort(x, stable=True, out=m.empty(0, dtype=m.int64)),
}


def _ties(dtype: str) -> np.ndarray:
    rng = np.random.default_rng(5)
    values = rng.integers(0, 3, (6, 40))
    if dtype == "bool":
        return values > 0
    if dtype.startswith("float"):
        values = values.astype(dtype)
        values[values == 2] = -0.0  # -0.0 ties with 0.0
        values[0, ::7] = np.nan  # NaNs tie with one another
        return values
    return values.astype(dtype)


@pytest.mark.parametrize("dtype", ["float32", "float64", "int64", "int32", "uint8", "bool"])
@pytest.mark.parametrize("form", SORT_FORMS)
def test_every_sort_spelling_torch_takes_gives_its_stable_order(form, dtype):
    """With ``stable=True`` the order of ties is torch's (its stable order); elsewhere torch leaves the order of ties
    unspecified (-0.0 and 0.0 may come out either way), and the values are compared."""
    values = _ties(dtype)
    expected, got = SORT_FORMS[form](torch, torch.tensor(values)), SORT_FORMS[form](tw, tw.tensor(values))
    expected = expected if isinstance(expected, tuple) else (expected,)
    got = got if isinstance(got, tuple) else (got,)
    if "stable=True" not in form and "-out" not in form:
        expected, got = expected[:1], got[:1]
        if form.startswith(("argsort", "x.argsort")):
            return  # positions of ties only
    for e, g in zip(expected, got, strict=True):
        assert str(g.dtype) == str(e.dtype).replace("torch", "tilewise")
        np.testing.assert_array_equal(np.asarray(g.tolist()), np.asarray(e.tolist()))
        if "stable=True" in form or "-out" in form:
            assert np.signbit(np.asarray(g.tolist(), dtype=float)).tolist() == \
                np.signbit(np.asarray(e.tolist(), dtype=float)).tolist()


@pytest.mark.parametrize("call", [
    lambda m, x: m.sort(x, -1, stable=True), lambda m, x: m.sort(x, 0, True, stable=True),
    lambda m, x: m.sort(x, -1, True, True), lambda m, x: m.sort(x, True), lambda m, x: m.sort(x, stable=1),
    lambda m, x: m.sort(x, 0, descending=True, stable=True), lambda m, x: x.sort(-1, True, stable=True),
    lambda m, x: x.sort(-1, True, True), lambda m, x: x.sort(0, stable=True), lambda m, x: x.sort(True),
    lambda m, x: m.argsort(x, -1, True, stable=True), lambda m, x: m.argsort(x, -1, True, True),
    lambda m, x: x.argsort(0, True, stable=True), lambda m, x: m.argsort(x, stable=None),
    lambda m, x: x.argsort(stable=None), lambda m, x: m.argsort(x, stable=1), lambda m, x: m.argsort(x, True),
    lambda m, x: m.argsort(x, out=m.empty(0, dtype=m.int64)),
], ids=["sort-dim-stable", "sort-dim-descending-stable", "sort-4-positional", "sort-bool-dim", "sort-stable-int",
        "sort-dim-descending=-stable", "method-dim-descending-stable", "method-3-positional", "method-dim-stable",
        "method-bool-dim", "argsort-dim-descending-stable", "argsort-4-positional", "argsort-method-positional",
        "argsort-stable-None", "argsort-method-stable-None", "argsort-stable-int", "argsort-bool-dim",
        "argsort-out-without-stable"])
def test_the_sort_spellings_torch_refuses_are_refused_in_its_words(call):
    raises_as_torch(lambda m: call(m, m.tensor([[3.0, 1.0, 1.0], [0.0, 2.0, 0.0]])))


# ---------------------------------------------------------------------------- the 0-norm has no gradient

ZERO_NORMS = {
    "vector_norm": lambda m, x: m.linalg.vector_norm(x, ord=0),
    "vector_norm-dim": lambda m, x: m.linalg.vector_norm(x, ord=0, dim=1),
    "vector_norm-0.0-keepdim": lambda m, x: m.linalg.vector_norm(x, ord=0.0, dim=0, keepdim=True),
    "norm": lambda m, x: m.norm(x, p=0), "norm-dim": lambda m, x: m.norm(x, p=0, dim=1),
    "method": lambda m, x: x.norm(0), "linalg.norm": lambda m, x: m.linalg.norm(x.reshape(-1), ord=0),
}
_ZERO_NORM_INPUT = np.array([[0.5, 0.0, -2.0], [0.0, 0.0, 3.0]], dtype=np.float32)


def _leaf(m):
    return m.tensor(_ZERO_NORM_INPUT, requires_grad=True)


@pytest.mark.parametrize("norm", ZERO_NORMS)
def test_the_zero_norm_leaves_no_gradient_as_torch(norm):
    call = ZERO_NORMS[norm]
    for m in (torch, tw):
        x = _leaf(m)
        y = call(m, x)
        assert y.requires_grad and y.grad_fn is not None
        (y.sum() * 2).backward()
        assert x.grad is None, m.__name__
        x = _leaf(m)
        assert m.autograd.grad(call(m, x).sum(), x, allow_unused=True) == (None,)
        x = _leaf(m)
        zeros = m.autograd.grad(call(m, x).sum(), x, materialize_grads=True)[0]
        assert zeros.tolist() == [[0.0] * 3] * 2
        x = _leaf(m)
        beside = m.autograd.grad((call(m, x).sum() * x).sum() + x.sum(), x)[0]
        assert beside.tolist() == [[4.0] * 3] * 2
    raises_as_torch(lambda m: (lambda x: m.autograd.grad(call(m, x).sum(), x))(_leaf(m)))


@pytest.mark.parametrize("norm", ["vector_norm-dim", "norm", "method"])
def test_the_zero_norm_in_forward_mode_and_functorch_as_torch(norm):
    call = ZERO_NORMS[norm]
    for m in (torch, tw):
        fw = m.autograd.forward_ad
        with fw.dual_level():
            primal, tangent = fw.unpack_dual(call(m, fw.make_dual(m.tensor(_ZERO_NORM_INPUT), m.ones(2, 3))))
        assert tangent is not None and tangent.tolist() == m.zeros_like(primal).tolist()
        assert m.func.grad(lambda t, m=m: call(m, t).sum())(m.tensor(_ZERO_NORM_INPUT)).tolist() == [[0.0] * 3] * 2


# ---------------------------------------------------------------------------- torch's words in common errors

def _z(m, *shape, dtype=None):
    return m.zeros(*shape, dtype=getattr(m, dtype) if dtype else None)


TORCH_WORDS = {
    "Linear": lambda m: m.nn.Linear(4, 3)(_z(m, 2, 5)),
    "Linear-3d": lambda m: m.nn.Linear(4, 3)(_z(m, 2, 6, 5)),
    "Linear-1d": lambda m: m.nn.Linear(4, 3, bias=False)(_z(m, 5)),
    "F.linear-1d-weight": lambda m: m.nn.functional.linear(_z(m, 2, 5), _z(m, 4)),
    "mean-repeated-dim": lambda m: _z(m, 2, 3).mean((0, 0)),
    "sum-repeated-dim": lambda m: _z(m, 2, 3).sum((1, -1)),
    "sum-repeated-dim-3": lambda m: m.sum(_z(m, 2, 3), dim=[1, 0, 1]),
    "amax-repeated-dim": lambda m: _z(m, 2, 3).amax((0, -2)),
    "bilinear-2d-weight": lambda m: m.nn.functional.bilinear(_z(m, 2, 4), _z(m, 2, 5), _z(m, 4, 5)),
    "bilinear-2d-weight-read": lambda m: m.nn.functional.bilinear(_z(m, 2, 4), _z(m, 2, 5), _z(m, 3, 4)),
    "bilinear-4d-weight": lambda m: m.nn.functional.bilinear(_z(m, 2, 4), _z(m, 2, 5), _z(m, 3, 4, 5, 1)),
    "bilinear-in2": lambda m: m.nn.functional.bilinear(_z(m, 2, 4), _z(m, 2, 5), _z(m, 3, 4, 6)),
    "bilinear-bias": lambda m: m.nn.functional.bilinear(_z(m, 2, 4), _z(m, 2, 5), _z(m, 3, 4, 5), _z(m, 1, 3)),
    "Bilinear": lambda m: m.nn.Bilinear(4, 5, 3)(_z(m, 2, 4), _z(m, 2, 6)),
    "tensordot-int": lambda m: m.tensordot(_z(m, 2, 3), _z(m, 4, 5), dims=1),
    "tensordot-int-2": lambda m: m.tensordot(_z(m, 2, 3, 4), _z(m, 3, 5, 6), dims=2),
    "tensordot-lists": lambda m: m.tensordot(_z(m, 2, 3), _z(m, 4, 5), dims=([-1], [0])),
    "tensordot-lengths": lambda m: m.tensordot(_z(m, 2, 3), _z(m, 3, 5), dims=([1, 0], [0])),
    "tensordot-dtypes": lambda m: m.tensordot(_z(m, 2, 3), _z(m, 3, 5, dtype="float64"), dims=1),
    "addmm-bias-dtype": lambda m: m.addmm(_z(m, 2, 3, dtype="float64"), _z(m, 2, 4), _z(m, 4, 3)),
    "addmm-1d-bias-dtype": lambda m: m.addmm(_z(m, 3, dtype="int64"), _z(m, 2, 4), _z(m, 4, 3)),
    "addmm-mat1-dtype": lambda m: m.addmm(_z(m, 2, 3), _z(m, 2, 4, dtype="float64"), _z(m, 4, 3)),
    "addmm-mat2-dtype": lambda m: m.addmm(_z(m, 2, 3), _z(m, 2, 4), _z(m, 4, 3, dtype="float64")),
    "addmm-shapes": lambda m: m.addmm(_z(m, 2, 3), _z(m, 2, 4), _z(m, 5, 3)),
    "addmm-bias-shape": lambda m: m.addmm(_z(m, 5, 3), _z(m, 2, 4), _z(m, 4, 3)),
    "addmm-bias-rank": lambda m: m.addmm(_z(m, 2, 3, 1), _z(m, 2, 4), _z(m, 4, 3)),
    "addmm-3d-mat1": lambda m: m.addmm(_z(m, 2, 3), _z(m, 2, 4, 1), _z(m, 4, 3)),
    "matmul": lambda m: m.matmul(_z(m, 2, 3), _z(m, 4, 5)),
    "matmul-0d": lambda m: m.matmul(m.zeros(()), _z(m, 3)),
    "matmul-batch": lambda m: m.matmul(_z(m, 2, 2, 3), _z(m, 3, 3, 5)),
    "matmul-batch-inner": lambda m: m.matmul(_z(m, 2, 2, 3), _z(m, 3, 4, 5)),
    "matmul-dtype": lambda m: m.matmul(_z(m, 2, 3), _z(m, 3, 4, dtype="float64")),
    "mm-3d": lambda m: m.mm(_z(m, 2, 3, 1), _z(m, 4, 5)),
    "mm": lambda m: m.mm(_z(m, 2, 3), _z(m, 4, 5)),
    "bmm": lambda m: m.bmm(_z(m, 2, 2, 3), _z(m, 2, 4, 5)),
    "bmm-2d": lambda m: m.bmm(_z(m, 2, 3), _z(m, 3, 5)),
    "bmm-dtype": lambda m: m.bmm(_z(m, 2, 2, 3), _z(m, 2, 3, 5, dtype="float64")),
    "mv": lambda m: m.mv(_z(m, 2, 3), _z(m, 4)),
    "dot": lambda m: m.dot(_z(m, 3), _z(m, 4)),
    "dot-2d": lambda m: m.dot(_z(m, 3, 1), _z(m, 3)),
    "dot-dtype": lambda m: m.dot(_z(m, 3), _z(m, 3, dtype="float64")),
    "cat-sizes": lambda m: m.cat([_z(m, 2, 3), _z(m, 2, 4)]),
    "cat-ranks": lambda m: m.cat([_z(m, 2, 3), _z(m, 2)]),
    "cat-dim": lambda m: m.cat([_z(m, 2, 3), _z(m, 2, 3)], dim=2),
    "stack-dim": lambda m: m.stack([_z(m, 2, 3), _z(m, 2, 3)], dim=4),
    "view": lambda m: _z(m, 2, 3).view(4, 2),
    "view-two-inferred": lambda m: _z(m, 2, 3).view(-1, -1),
    "view-strides": lambda m: _z(m, 2, 3).t().view(6),
    "view-inferred": lambda m: _z(m, 2, 3).view(-1, 4),
    "reshape": lambda m: _z(m, 2, 3).reshape(4, 2),
    "reshape-negative": lambda m: _z(m, 2, 3).reshape(-2, 3),
    "expand": lambda m: _z(m, 2, 3).expand(4, 3),
    "expand-leading-minus-one": lambda m: _z(m, 2, 3).expand(-1, 2, 3),
    "expand-minus-two": lambda m: _z(m, 2, 3).expand(2, -2),
    "broadcast_to": lambda m: m.broadcast_to(_z(m, 2, 3), (4, 3)),
    "squeeze-dim": lambda m: _z(m, 2, 3).squeeze(3),
    "transpose-dim": lambda m: _z(m, 2, 3).transpose(0, 2),
    "softmax-dim": lambda m: _z(m, 2, 3).softmax(2),
    "index": lambda m: _z(m, 2, 3)[m.tensor([0, 5])],
    "gather-ranks": lambda m: m.gather(_z(m, 2, 3), 1, _z(m, 2, dtype="int64")),
    "gather-bounds": lambda m: m.gather(_z(m, 2, 3), 1, m.full((2, 3), 5, dtype=m.int64)),
    "gather-sizes": lambda m: m.gather(_z(m, 2, 3), 1, _z(m, 3, 3, dtype="int64")),
    "scatter-bounds": lambda m: _z(m, 2, 3).scatter(1, m.full((2, 3), 5, dtype=m.int64), m.ones(2, 3)),
    "scatter-ranks": lambda m: _z(m, 2, 3).scatter(1, _z(m, 2, dtype="int64"), m.ones(2, 3)),
    "scatter-sizes": lambda m: _z(m, 2, 3).scatter(1, _z(m, 3, 3, dtype="int64"), m.ones(2, 3)),
    "scatter_add-ranks": lambda m: _z(m, 2, 3).scatter_add(1, _z(m, 2, dtype="int64"), m.ones(2, 3)),
    "conv2d-channels": lambda m: m.nn.functional.conv2d(_z(m, 1, 3, 5, 5), _z(m, 2, 4, 3, 3)),
    "Conv2d-channels": lambda m: m.nn.Conv2d(3, 2, 3)(_z(m, 1, 4, 5, 5)),
    "conv1d-channels": lambda m: m.nn.functional.conv1d(_z(m, 1, 3, 5), _z(m, 2, 4, 3)),
    "conv2d-kernel": lambda m: m.nn.functional.conv2d(_z(m, 1, 3, 2, 2), _z(m, 2, 3, 3, 3)),
    "conv2d-bias": lambda m: m.nn.functional.conv2d(_z(m, 1, 3, 5, 5), _z(m, 2, 3, 3, 3), _z(m, 3)),
    "conv2d-groups": lambda m: m.nn.functional.conv2d(_z(m, 1, 4, 5, 5), _z(m, 2, 2, 3, 3), groups=3),
    "conv2d-groups-divisible": lambda m: m.nn.functional.conv2d(_z(m, 1, 4, 5, 5), _z(m, 4, 2, 3, 3), groups=3),
}


@pytest.mark.parametrize("case", TORCH_WORDS)
def test_common_errors_are_torch_words_exactly(case):
    call = TORCH_WORDS[case]
    expected = torch_error(call)
    with pytest.raises(type(expected)) as info:
        call(tw)
    assert str(info.value) == str(expected).replace("torch.", "tilewise.")


def test_expand_of_too_few_sizes_names_the_legacy_type_as_torch():
    with pytest.raises(RuntimeError, match=re.escape("expand(tilewise.FloatTensor{[2, 3]}, size=[3]): the number of "
                                                     "sizes provided (1) must be greater or equal to the number of "
                                                     "dimensions in the tensor (2)")):
        tw.zeros(2, 3).expand(3)

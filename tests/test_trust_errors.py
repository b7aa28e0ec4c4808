"""Bad input a new user writes: each raises torch's exception type, with a message that names the operator, the
offending values, shapes or dtypes, and what would be valid — never a wrapped value, a numpy message, a crash or
an error from the wrong place. Values that torch accepts (a negative uint8 fill wraps) are compared with torch.
"""

from __future__ import annotations

import re
import warnings

import numpy as np
import pytest
import torch

import tilewise as tw

LEAKS = ("ndarray", "Python int", "C long", "array element", "inhomogeneous", "Unable to allocate",
         "out of bounds for int")


def raises_like_torch(call, *fragments: str):
    """Run ``call(torch)`` for the oracle's exception type, then ``call(tw)``: same type, every fragment in the
    message (literal text), and nothing of numpy's or Python's internals."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            call(torch)
        except Exception as exc:  # noqa: BLE001 — whatever torch raises is the expectation
            expected = type(exc)
        else:
            raise AssertionError("torch accepted the call")
    pattern = "(?s)" + "".join(f"(?=.*{re.escape(f)})" for f in fragments)
    with pytest.raises(expected, match=pattern) as info:
        call(tw)
    assert not any(leak in str(info.value) for leak in LEAKS), str(info.value)


def setitem(lib_tensor, index, value):
    lib_tensor[index] = value
    return lib_tensor


# ---------------------------------------------------------------------------- values that do not fit their dtype

OVERFLOWS = {
    "tensor-int64-2**63": (lambda m: m.tensor([2 ** 63]), ("tensor()", "Overflow when unpacking long long",
                                                             "9223372036854775808")),
    "tensor-scalar-2**63": (lambda m: m.tensor(2 ** 63), ("tensor()", "Overflow when unpacking long long")),
    "tensor-2**64": (lambda m: m.tensor([2 ** 64]), ("tensor()", "Overflow when unpacking long long")),
    "tensor-below-int64": (lambda m: m.tensor([-2 ** 63 - 1]), ("tensor()", "Overflow when unpacking long long")),
    "tensor-mixed-signs-past-int64": (lambda m: m.tensor([2 ** 63, -1]), ("tensor()", "Overflow")),
    "tensor-int8-300": (lambda m: m.tensor([300], dtype=m.int8),
                        ("tensor()", "cannot be converted to type int8 without overflow", "300", "-128 to 127")),
    "tensor-int8-scalar": (lambda m: m.tensor(300, dtype=m.int8), ("tensor()", "int8", "300")),
    "tensor-uint8-256": (lambda m: m.tensor([256], dtype=m.uint8), ("tensor()", "uint8", "256", "0 to 255")),
    "tensor-uint8-minus-256": (lambda m: m.tensor([-256], dtype=m.uint8), ("tensor()", "uint8", "-256")),
    "tensor-int8-float": (lambda m: m.tensor([300.0], dtype=m.int8), ("tensor()", "int8", "300.0")),
    "tensor-int64-nan": (lambda m: m.tensor([float("nan")], dtype=m.int64), ("tensor()", "int64", "nan")),
    "tensor-int32-inf": (lambda m: m.tensor([float("inf")], dtype=m.int32), ("tensor()", "int32", "inf")),
    "tensor-int64-1e20": (lambda m: m.tensor([1e20], dtype=m.int64), ("tensor()", "int64", "1e+20")),
    "tensor-numpy-scalar": (lambda m: m.tensor([np.int64(300)], dtype=m.int8), ("tensor()", "int8", "300")),
    "as_tensor": (lambda m: m.as_tensor([300], dtype=m.int8), ("int8", "300")),
    "full": (lambda m: m.full((2,), 300, dtype=m.int8), ("full", "int8", "300", "-128 to 127")),
    "full-2**63": (lambda m: m.full((2,), 2 ** 63), ("full", "int64", "9223372036854775808")),
    "full-nan-int": (lambda m: m.full((2,), float("nan"), dtype=m.int32), ("full", "int32", "nan")),
    "full-float32-1e300": (lambda m: m.full((2,), 1e300, dtype=m.float32), ("full", "float32", "1e+300")),
    "full-float16-70000": (lambda m: m.full((2,), 70000.0, dtype=m.float16), ("full", "float16", "65504")),
    "fill_-bfloat16": (lambda m: m.zeros(2, dtype=m.bfloat16).fill_(1e39), ("fill_", "bfloat16")),
    "full_like": (lambda m: m.full_like(m.zeros(2, dtype=m.int8), -129), ("full_like", "int8", "-129")),
    "fill_": (lambda m: m.zeros(2, dtype=m.int8).fill_(300), ("fill_", "int8", "300")),
    "fill_-int64": (lambda m: m.zeros(2, dtype=m.int64).fill_(2 ** 63), ("fill_", "int64")),
    "new_full": (lambda m: m.zeros(2, dtype=m.int8).new_full((2,), 300), ("new_full", "int8", "300")),
    "setitem": (lambda m: setitem(m.zeros(2, dtype=m.int8), 0, 300), ("setitem", "int8", "300")),
    "setitem-slice": (lambda m: setitem(m.zeros(2, dtype=m.int8), slice(None), -129), ("setitem", "-129")),
    "setitem-nan": (lambda m: setitem(m.zeros(2, dtype=m.int32), 0, float("nan")), ("setitem", "int32", "nan")),
    "setitem-mask": (lambda m: setitem(m.zeros(2, dtype=m.int8), m.tensor([True, False]), 300), ("setitem", "300")),
    "masked_fill": (lambda m: m.zeros(2, dtype=m.int8).masked_fill(m.tensor([True, False]), 300),
                    ("masked_fill", "int8", "300")),
    "where": (lambda m: m.where(m.tensor([True, False]), m.zeros(2, dtype=m.int8), 300), ("where", "int8", "300")),
    "clamp": (lambda m: m.zeros(2, dtype=m.int8).clamp(max=300), ("clamp", "int8", "300")),
    "clamp-min": (lambda m: m.zeros(2, dtype=m.int8).clamp(-300, 3), ("clamp", "-300")),
    "add-alpha": (lambda m: m.zeros(2, dtype=m.int8).add(m.ones(2, dtype=m.int8), alpha=300), ("add", "int8", "300")),
    "add-float-alpha": (lambda m: m.zeros(2, dtype=m.int8).add(m.ones(2, dtype=m.int8), alpha=1.5),
                        ("add", "alpha must not be a floating point number")),
    "add-bool-alpha": (lambda m: m.zeros(2, dtype=m.int8).add(m.ones(2, dtype=m.int8), alpha=True),
                       ("add", "Boolean alpha only supported for Boolean results")),
    "addcmul-value": (lambda m: m.zeros(2, dtype=m.int8).addcmul(m.ones(2, dtype=m.int8), m.ones(2, dtype=m.int8),
                                                                 value=300), ("addcmul", "300")),
    "pad-value": (lambda m: m.nn.functional.pad(m.zeros(2, dtype=m.int8), (1, 1), value=300), ("pad", "300")),
    "index_fill": (lambda m: m.zeros(2, dtype=m.int8).index_fill(0, m.tensor([0]), 300), ("index_fill", "300")),
    "arange-past-int64": (lambda m: m.arange(2 ** 63 - 2, 2 ** 63), ("arange", "int64", "9223372036854775808")),
    "mul-2**64": (lambda m: m.tensor([1]) * 2 ** 64, ("mul", "int too big to convert")),
}


@pytest.mark.parametrize("case", OVERFLOWS)
def test_value_that_does_not_fit_raises_like_torch(case):
    call, fragments = OVERFLOWS[case]
    raises_like_torch(call, *fragments)


ACCEPTED = {  # what torch accepts (wrapping where its rule allows), compared value for value
    "tensor-uint8-minus-one": lambda m: m.tensor([-1, -255], dtype=m.uint8),
    "tensor-int8-truncates": lambda m: m.tensor([1.7, -1.7, 127.0], dtype=m.int8),
    "tensor-mixed-bool-int": lambda m: m.tensor([True, 2, 3]),
    "tensor-mixed-bool-int-float": lambda m: m.tensor([True, 2, 3.5]),
    "tensor-big-int-beside-float": lambda m: m.tensor([2 ** 70, 1.5]),
    "tensor-2**63-as-float": lambda m: m.tensor([2 ** 63], dtype=m.float32),
    "tensor-float32-overflows-to-inf": lambda m: m.tensor([1e300], dtype=m.float32),
    "tensor-int64-max": lambda m: m.tensor([2 ** 63 - 1, -2 ** 63]),
    "tensor-bool-from-ints": lambda m: m.tensor([300, 0], dtype=m.bool),
    "numpy-array-wraps": lambda m: m.tensor(np.array([300, -1]), dtype=m.int8),
    "as_tensor-numpy-wraps": lambda m: m.as_tensor(np.array([300]), dtype=m.int8),
    "full-uint8-minus-one": lambda m: m.full((2,), -1, dtype=m.uint8),
    "full-float16-infinity": lambda m: m.full((2,), float("inf"), dtype=m.float16),
    "full-int-truncates": lambda m: m.full((2,), 1.5, dtype=m.int32),
    "full-tensor-value": lambda m: m.full((2,), m.tensor(3.0)),
    "fill_-uint8-minus-255": lambda m: m.zeros(2, dtype=m.uint8).fill_(-255),
    "setitem-uint8-minus-one": lambda m: setitem(m.zeros(2, dtype=m.uint8), 0, -1),
    "add_-wraps": lambda m: m.zeros(2, dtype=m.int8).add_(300),
    "int8-plus-300-wraps": lambda m: m.tensor([1, 100], dtype=m.int8) + 300,
    "int8-times-300-wraps": lambda m: m.tensor([1, 100], dtype=m.int8) * 300,
    "uint8-minus-one-wraps": lambda m: m.tensor([0, 5], dtype=m.uint8) - 1,
    "uint8-plus-minus-one": lambda m: m.tensor([0, 5], dtype=m.uint8) + -1,
    "int64-plus-2**63-wraps": lambda m: m.tensor([1]) + 2 ** 63,
    "int8-compared-with-300": lambda m: m.tensor([44], dtype=m.int8) == 300,
    "int8-plus-float": lambda m: m.tensor([44], dtype=m.int8) + 1.5,
    "masked_fill-truncates": lambda m: m.zeros(2, dtype=m.int8).masked_fill(m.tensor([True, False]), 1.5),
    "where-uint8-minus-one": lambda m: m.where(m.tensor([True, False]), m.zeros(2, dtype=m.uint8), -1),
    "where-float-scalar-promotes": lambda m: m.where(m.tensor([True, False]), m.zeros(2, dtype=m.int8), 3.5),
    "clamp-float-bound-promotes": lambda m: m.zeros(2, dtype=m.int8).clamp(min=1.5),
    "add-uint8-alpha-minus-one": lambda m: m.zeros(2, dtype=m.uint8).add(m.ones(2, dtype=m.uint8), alpha=-1),
    "arange-int8-wraps": lambda m: m.arange(0, 300, 100, dtype=m.int8),
    "arange-uint8-wraps": lambda m: m.arange(250, 260, dtype=m.uint8),
    "arange-infinite-step": lambda m: m.arange(0, 10, float("inf")),
    "int64-to-int8-wraps": lambda m: m.tensor([300, -129]).to(m.int8),
    "float-nan-to-bool": lambda m: m.tensor([float("nan"), 0.0]).bool(),
}


@pytest.mark.parametrize("case", ACCEPTED)
def test_values_torch_accepts_match_torch(case):
    expected, got = ACCEPTED[case](torch), ACCEPTED[case](tw)
    assert got.dtype.name == str(expected.dtype).removeprefix("torch.")
    np.testing.assert_array_equal(got.numpy(), expected.numpy())


@pytest.mark.parametrize("dtype", ["uint8", "int8", "int16", "int32", "int64"])
def test_float_to_integer_cast_of_nan_and_inf_neither_raises_nor_warns(dtype):
    """The values are implementation-defined (torch gives whatever the CPU's conversion gives)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = tw.tensor([float("nan"), float("inf"), -float("inf"), 1e20, 300.0, -1.0]).to(getattr(tw, dtype))
    assert out.dtype.name == dtype and out.shape == (6,)
    if dtype in ("int32", "int64"):
        expected = torch.tensor([float("nan"), float("inf"), -float("inf"), 1e20, 300.0, -1.0])
        assert out.tolist() == expected.to(getattr(torch, dtype)).tolist()


# ---------------------------------------------------------------------------- data that is not numbers

@pytest.mark.parametrize("call,fragments", [
    (lambda m: m.tensor("abc"), ("tensor()", "invalid data type 'str'", "numbers")),
    (lambda m: m.tensor([1, "a"]), ("tensor()", "invalid data type 'str'")),
    (lambda m: m.tensor(b"abc"), ("tensor()", "invalid data type 'bytes'")),
    (lambda m: m.tensor(None), ("tensor()", "Could not infer dtype of NoneType")),
    (lambda m: m.tensor([1, None]), ("tensor()", "NoneType")),
    (lambda m: m.tensor({1, 2}), ("tensor()", "Could not infer dtype of set")),
    (lambda m: m.tensor([[1], [2, 3]]),
     ("tensor()", "not rectangular", "expected sequence of length 1 at dim 1 (got 2)")),
    (lambda m: m.tensor([[1, 2], [3]]), ("tensor()", "expected sequence of length 2 at dim 1 (got 1)")),
    (lambda m: m.tensor(np.array(["a"])), ("tensor()", "<U1", "supported dtypes")),
    (lambda m: m.from_numpy(np.array([1, "a"], dtype=object)), ("from_numpy()", "object", "supported dtypes")),
    (lambda m: m.full((2,), None), ("full()", "fill_value", "NoneType")),
    (lambda m: m.arange("a"), ("arange()", "end", "str")),
])
def test_data_that_is_not_numbers_raises_like_torch(call, fragments):
    raises_like_torch(call, *fragments)


# ---------------------------------------------------------------------------- sizes and memory

@pytest.mark.parametrize("call,fragments", [
    (lambda m: m.empty(10 ** 15), ("empty()", "DefaultCPUAllocator", "not enough memory", "4000000000000000 bytes",
                                   "[1000000000000000]", "float32")),
    (lambda m: m.zeros(10 ** 7, 10 ** 7), ("zeros()", "DefaultCPUAllocator", "400000000000000 bytes",
                                           "[10000000, 10000000]")),
    (lambda m: m.full((10 ** 15,), 1.0, dtype=m.float64), ("full()", "8000000000000000 bytes", "float64")),
    (lambda m: m.randn(10 ** 15), ("randn()", "DefaultCPUAllocator", "[1000000000000000]")),
    (lambda m: m.empty(2 ** 62, 4), ("empty()", "Storage size calculation overflowed", "[4611686018427387904, 4]")),
    (lambda m: m.arange(0, 1e30), ("arange()", "invalid size, possible overflow")),
    (lambda m: m.arange(0, float("inf")), ("arange()", "unsupported range", "inf")),
    (lambda m: m.arange(0, float("nan")), ("arange()", "unsupported range", "nan")),
    (lambda m: m.arange(10, 0), ("arange()", "upper bound and lower bound inconsistent with step sign")),
    (lambda m: m.arange(0, 10, 0), ("arange()", "step must be nonzero")),
    (lambda m: m.eye(-1), ("eye()", "n must be greater or equal to 0", "-1")),
    (lambda m: m.eye(2, -3), ("eye()", "m must be greater or equal to 0", "-3")),
    (lambda m: m.zeros(2).new_zeros(-1), ("new_zeros()", "negative dimension -1")),
    (lambda m: m.ones(2, 1).expand(2, -2), ("expand", "-2", "[2, 1]")),
    (lambda m: m.ones(2, 1).expand(-1, 2, 3), ("expand", "leading, non-existing dimension 0")),
])
def test_bad_sizes_raise_like_torch(call, fragments):
    raises_like_torch(call, *fragments)


# ---------------------------------------------------------------------------- indices, shapes, dims, arguments

@pytest.mark.parametrize("call,fragments", [
    (lambda m: m.gather(m.ones(3, 4), 1, m.zeros(5, 2, dtype=m.int64)),
     ("index [5, 2]", "self [3, 4]", "apart from dimension 1")),
    (lambda m: m.zeros(3, 4).scatter(1, m.zeros(2, 2, dtype=m.int64), m.ones(1, 3)),
     ("index [2, 2]", "src [1, 3]")),
    (lambda m: m.zeros(3, 4).scatter_add(1, m.zeros(5, 2, dtype=m.int64), m.ones(5, 2)),
     ("index [5, 2]", "self [3, 4]")),
    (lambda m: m.ones(3).index_put_((m.tensor([0.0]),), m.tensor(1.0)),
     ("index_put", "tensors used as indices must be long, int, byte or bool tensors", "float32")),
    (lambda m: m.ones(3, 3)[m.tensor([0, 1]), m.tensor([0, 1, 2])],
     ("shape mismatch", "indexing tensors could not be broadcast together", "[2], [3]")),
    (lambda m: m.where(m.ones(2), m.ones(2), m.zeros(2)), ("where", "boolean tensor", "float32")),
    (lambda m: m.ones(3).clamp(), ("clamp", "At least one of 'min' or 'max' must not be None")),
    (lambda m: m.outer(m.ones(2, 2), m.ones(2)), ("outer", "1-D", "2-D", "[2, 2]")),
    (lambda m: int(m.ones(2)), ("only one element tensors can be converted to Python scalars", "[2]")),
    (lambda m: float(m.ones(2, 2)), ("only one element tensors", "[2, 2]")),
    (lambda m: m.cat([]), ("cat()", "non-empty list of Tensors")),
    (lambda m: m.nn.functional.interpolate(m.ones(1, 1, 4), scale_factor=-1),
     ("interpolate", "greater than 0", "W: 4", "W: -4", "scale_factor=-1")),
    (lambda m: m.nn.functional.interpolate(m.ones(1, 1, 4, 4), size=(0, 3)),
     ("interpolate", "greater than 0", "H: 0")),
    (lambda m: m.nn.functional.interpolate(m.ones(1, 1, 4), scale_factor=0.1), ("interpolate", "W: 0")),
    (lambda m: m.ones(2, 3) @ 5, ("matmul", "must be a Tensor", "int")),
    (lambda m: m.zeros(3).normal_(0, -1), ("normal", "std >= 0.0", "-1")),
    (lambda m: m.normal(m.zeros(2), -1.0), ("normal", "std >= 0.0")),
    (lambda m: m.zeros(3).exponential_(-1), ("exponential_", "lambda > 0.0", "-1")),
    (lambda m: m.zeros(3).uniform_(1, 0), ("uniform_", "from=1 > to=0")),
    (lambda m: m.rand(2, dtype=m.int64), ("rand()", "int64", "floating dtype")),
    (lambda m: m.randn(2, dtype=m.int64), ("randn()", "int64")),
    (lambda m: m.zeros(2, dtype=m.int64).uniform_(), ("uniform_()", "int64")),
])
def test_bad_indices_shapes_and_arguments_raise_like_torch(call, fragments):
    raises_like_torch(call, *fragments)


MIXED_BOUNDS = {  # a tensor bound beside a number: torch's argument parser matches neither of clamp's signatures
    "function-keywords": lambda m, x, t: m.clamp(x, min=t, max=1),
    "function-keywords-reversed": lambda m, x, t: m.clamp(x, max=1, min=t),
    "function-positional": lambda m, x, t: m.clamp(x, t, 1.5),
    "function-number-first": lambda m, x, t: m.clamp(x, 0, t),
    "function-mixed": lambda m, x, t: m.clamp(x, t, max=True),
    "function-input-keyword": lambda m, x, t: m.clamp(input=x, min=t, max=1),
    "function-out": lambda m, x, t: m.clamp(x, t, 1, out=m.empty(3)),
    "function-out-keywords": lambda m, x, t: m.clamp(x, min=t, max=1, out=None),
    "function-numpy-number": lambda m, x, t: m.clamp(x, t, np.float32(1)),
    "clip": lambda m, x, t: m.clip(x, t, 1),
    "method": lambda m, x, t: x.clamp(t, 1),
    "method-number-first": lambda m, x, t: x.clamp(0, t),
    "method-keywords": lambda m, x, t: x.clamp(min=t, max=1),
    "method-mixed": lambda m, x, t: x.clamp(t, max=1),
    "method-clip": lambda m, x, t: x.clip(t, 1),
    "inplace": lambda m, x, t: x.clone().clamp_(t, 1),
    "inplace-keywords": lambda m, x, t: x.clone().clamp_(min=0, max=t),
    "inplace-mixed": lambda m, x, t: x.clone().clamp_(0, max=t),
    "inplace-clip": lambda m, x, t: x.clone().clip_(min=t, max=1),
    "inplace-function": lambda m, x, t: m.clamp_(x.clone(), t, 1),
    "inplace-function-clip": lambda m, x, t: m.clip_(x.clone(), min=t, max=1),
    "zero-dim-bound-requiring-grad": lambda m, x, t: m.clamp(x, t[0].clone().requires_grad_(), 1),
}


@pytest.mark.parametrize("name", MIXED_BOUNDS)
def test_clamp_with_a_tensor_and_a_number_bound_is_refused_as_torch_refuses_it(name):
    call = MIXED_BOUNDS[name]
    with pytest.raises(TypeError) as theirs:
        call(torch, torch.linspace(-2, 2, 3), torch.zeros(3))
    with pytest.raises(TypeError) as ours:
        call(tw, tw.linspace(-2, 2, 3), tw.zeros(3))
    assert str(ours.value) == str(theirs.value)


@pytest.mark.parametrize("call", [
    lambda m, x, t: m.clamp(x, t[0], 1),  # a 0-dim tensor that needs no grad is a number to the parser
    lambda m, x, t: x.clamp(0, t[1]),
    lambda m, x, t: x.clamp(t, None),
    lambda m, x, t: x.clamp(None, 1),
    lambda m, x, t: m.clamp(x, min=t, max=t + 1),
    lambda m, x, t: x.clone().clamp_(max=t),
], ids=["zero-dim-min", "zero-dim-max", "tensor-and-none", "none-and-number", "two-tensors", "one-tensor"])
def test_clamp_bounds_torch_accepts_are_accepted(call):
    theirs = call(torch, torch.linspace(-2, 2, 3), torch.zeros(3))
    ours = call(tw, tw.linspace(-2, 2, 3), tw.zeros(3))
    assert ours.tolist() == theirs.tolist() and ours.dtype.name == str(theirs.dtype).removeprefix("torch.")


def test_new_factories_follow_self_dtype_and_device_like_torch():
    calls = (("new_zeros", (2, 3)), ("new_ones", ((2,),)), ("new_full", ((2,), 5)), ("new_tensor", ([1, 2],)))
    for name, args in calls:
        got = getattr(tw.ones(2, dtype=tw.int8), name)(*args)
        expected = getattr(torch.ones(2, dtype=torch.int8), name)(*args)
        assert got.dtype.name == "int8" and got.tolist() == expected.tolist()
    assert tw.ones(2, dtype=tw.int8).new_empty(3, dtype=tw.float32).dtype is tw.float32


# ---------------------------------------------------------------------------- read-only numpy memory

@pytest.mark.parametrize("make", ["from_numpy", "as_tensor"])
def test_read_only_numpy_array_warns_like_torch_and_refuses_writes(make):
    array = np.ones(3)
    array.setflags(write=False)
    with warnings.catch_warnings(record=True):  # torch warns once per process, then stays silent
        getattr(torch, make)(array)
    with pytest.warns(UserWarning, match=f"{make}\\(\\).*not writable.*copy"):
        t = getattr(tw, make)(array)
    assert (t + 1).tolist() == [2.0, 2.0, 2.0]  # reading is fine
    for write, name in ((lambda: t.add_(1), "add_"), (lambda: t.zero_(), "(zero_|fill_)"), (lambda: t.exp_(), "exp_"),
                        (lambda: setitem(t, 0, 5.0), "setitem"),
                        (lambda: t.index_put_((tw.tensor([0]),), tw.tensor(2.0, dtype=t.dtype)), "index_put_")):
        with pytest.raises(RuntimeError, match=f"{name}: cannot write .* read-only numpy array .* copy it first"):
            write()
    assert array.tolist() == [1.0, 1.0, 1.0]


# ---------------------------------------------------------------------------- hooks

def _hook_result(lib, hook, leaf: bool):
    x = lib.ones(3, requires_grad=True)
    y = x if leaf else x * 2
    y.register_hook(hook)
    (y * 3).sum().backward()
    return x.grad


@pytest.mark.parametrize("leaf", [False, True])
@pytest.mark.parametrize("returns,fragments", [
    (lambda m: m.ones(5), ("hook '<lambda>' has changed the size of value", "[3]", "[5]")),
    (lambda m: m.ones(3, dtype=m.int64), ("hook '<lambda>' has changed the type of value", "float32", "int64")),
    (lambda m: 5, ("expected Variable, but hook returned 'int'", "hook '<lambda>'", "None or a tensor", "[3]")),
])
def test_tensor_hook_returning_a_different_gradient_raises_like_torch(returns, fragments, leaf):
    raises_like_torch(lambda m: _hook_result(m, lambda g: returns(m), leaf), *fragments)


def test_tensor_hook_returning_a_gradient_like_its_own_is_used():
    for lib in (torch, tw):
        assert _hook_result(lib, lambda g: g * 10, leaf=False).tolist() == [60.0, 60.0, 60.0]


def _linear_backward(lib, register, hook, x_requires_grad=True):
    lib.manual_seed(0)
    module = lib.nn.Linear(3, 2)
    with lib.no_grad():
        module.weight.copy_(lib.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]))
        module.bias.copy_(lib.tensor([0.5, -0.5]))
    getattr(module, register)(hook)
    x = lib.tensor([[1.0, -1.0, 2.0]], requires_grad=x_requires_grad)
    (module(x) * lib.tensor([[1.0, 3.0]])).sum().backward()
    return (x.grad.tolist() if x_requires_grad else None), module.weight.grad.tolist()


@pytest.mark.parametrize("register,returns,fragments", [
    ("register_full_backward_hook", lambda m, gin: (m.ones(5, 5),), ("Backward hook", "Linear", "size",
                                                                     "grad_input[0]", "[1, 3]", "[5, 5]")),
    ("register_full_backward_hook", lambda m, gin: (gin[0], gin[0]), ("Backward hook", "invalid number of grad_input",
                                                                      "got 2, but expected 1")),
    ("register_full_backward_pre_hook", lambda m, gout: (m.ones(4, 4),), ("Backward pre hook", "grad_output[0]",
                                                                          "[1, 2]", "[4, 4]")),
])
def test_module_backward_hook_returning_wrong_gradients_raises_like_torch(register, returns, fragments):
    if register == "register_full_backward_hook":
        def make(m):
            return lambda module, gin, gout: returns(m, gin)
    else:
        def make(m):
            return lambda module, gout: returns(m, gout)
    raises_like_torch(lambda m: _linear_backward(m, register, make(m)), *fragments)


@pytest.mark.parametrize("x_requires_grad", [True, False])
def test_module_backward_hooks_see_and_replace_gradients_like_torch(x_requires_grad):
    for register, hook in (("register_full_backward_hook", lambda mod, gin, gout: tuple(
                               None if g is None else g * 10 for g in gin)),
                           ("register_full_backward_pre_hook", lambda mod, gout: tuple(g * 2 for g in gout))):
        seen = {}
        for lib in (torch, tw):
            record = []

            def observing(*args, _hook=hook, _record=record):
                _record.append([None if g is None else g.tolist() for g in args[1]])
                return _hook(*args)

            seen[lib] = (_linear_backward(lib, register, observing, x_requires_grad), record)
        assert seen[tw] == seen[torch]

"""tilewise.testing against torch.testing.

Each ``assert_close`` case builds its inputs once in each library (``lib`` is torch or tilewise) and requires
the same outcome: both pass, or both raise the same exception type with the same message, where the only
difference allowed is the library's name in the printed types (``torch.float32`` / ``tilewise.float32``,
``<class 'torch.Tensor'>`` / ``<class 'tilewise.tensor.Tensor'>``). ``make_tensor`` draws random values, so
its cases check ranges, dtypes, shapes, strides and flags, and that its errors are torch's.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
import torch.testing

import tilewise as tw
import tilewise.testing

NAN, INF = float("nan"), float("inf")


def normalised(text: str) -> str:
    return text.replace("tilewise.tensor.Tensor", "torch.Tensor").replace("tilewise.", "torch.")


def outcome(library, call):
    """``None`` where ``call`` passes, else the exception's type and normalised message."""
    try:
        call(library)
    except Exception as error:  # noqa: BLE001 — the exception is the result being compared
        return type(error), normalised(str(error))
    return None


def assert_same_outcome(call, *, same_text: bool = True):
    expected = outcome(torch, call)
    actual = outcome(tw, call)
    if not same_text and expected and actual:  # the type is torch's; the message is ours (torch's is internal)
        expected, actual = expected[0], actual[0]
    assert actual == expected


def t(lib, data, dtype=None, **kwargs):
    return lib.tensor(data, dtype=getattr(lib, dtype) if dtype else None, **kwargs)


# (id, function of the library giving (actual, expected, keyword arguments))
CASES = [
    # ------------------------------------------------ passes
    ("equal_float32", lambda lib: (t(lib, [1.0, 2.0]), t(lib, [1.0, 2.0]), {})),
    ("within_float32_tolerance", lambda lib: (t(lib, [1.0, 2.0]), t(lib, [1.0, 2.0 + 2e-6]), {})),
    ("within_float16_tolerance", lambda lib: (t(lib, [1000.0], "float16"), t(lib, [1001.0], "float16"), {})),
    ("within_bfloat16_tolerance", lambda lib: (t(lib, [100.0], "bfloat16"), t(lib, [101.0], "bfloat16"), {})),
    ("within_float64_tolerance", lambda lib: (t(lib, [1.0], "float64"), t(lib, [1.0 + 5e-8], "float64"), {})),
    ("within_complex64_tolerance", lambda lib: (t(lib, [1 + 1j]), t(lib, [1 + 1j + 1e-6]), {})),
    ("equal_int64", lambda lib: (t(lib, [[1, 2], [3, 4]]), t(lib, [[1, 2], [3, 4]]), {})),
    ("equal_bool", lambda lib: (t(lib, [True, False]), t(lib, [True, False]), {})),
    ("equal_nan_true", lambda lib: (t(lib, [NAN, 1.0]), t(lib, [NAN, 1.0]), {"equal_nan": True})),
    ("complex_nan_equal_nan", lambda lib: (t(lib, [complex(NAN, 1)]), t(lib, [complex(1, NAN)]),
                                           {"equal_nan": True})),
    ("infinities", lambda lib: (t(lib, [INF, -INF]), t(lib, [INF, -INF]), {})),
    ("negative_zero", lambda lib: (t(lib, [-0.0]), t(lib, [0.0]), {})),
    ("empty", lambda lib: (lib.zeros(0, 3), lib.ones(0, 3), {})),
    ("zero_dim", lambda lib: (t(lib, 3.5), t(lib, 3.5), {})),
    ("requires_grad", lambda lib: (t(lib, [1.0, 2.0], requires_grad=True), t(lib, [1.0, 2.0]), {})),
    ("int_with_atol", lambda lib: (t(lib, [1, 2, 3]), t(lib, [1, 2, 4]), {"rtol": 0, "atol": 1})),
    ("int64_compared_in_float32", lambda lib: (t(lib, [2**40]), t(lib, [2**40 + 1]), {"rtol": 0, "atol": 0.5})),
    ("bool_with_atol", lambda lib: (t(lib, [True]), t(lib, [False]), {"rtol": 0, "atol": 1})),
    ("dtypes_free_float16_float32", lambda lib: (t(lib, [1.0, 2.0], "float16"), t(lib, [1.0, 2.001]),
                                                 {"check_dtype": False})),
    ("dtypes_free_int_float", lambda lib: (t(lib, [1, 2]), t(lib, [1.0, 2.0]), {"check_dtype": False})),
    ("strides_unchecked", lambda lib: (lib.ones(2, 3).t(), lib.ones(3, 2), {})),
    ("parameter_and_tensor", lambda lib: (lib.nn.Parameter(lib.ones(2)), lib.ones(2), {})),
    ("nested_containers", lambda lib: ({"a": [lib.ones(2), (1, 2.0)], "b": None},
                                       {"b": None, "a": (lib.ones(2), [1, 2.0])}, {})),
    ("python_int", lambda lib: (3, 3, {})),
    ("python_float_within", lambda lib: (1.0, 1.0 + 1e-8, {})),
    ("python_complex", lambda lib: (1 + 2j, 1 + 2j, {})),
    ("python_nan_equal_nan", lambda lib: (NAN, NAN, {"equal_nan": True})),
    ("int_and_float_dtypes_free", lambda lib: (1, 1.0, {"check_dtype": False})),
    ("numpy_numbers", lambda lib: (np.float32(0.5), np.float32(0.5), {})),
    ("numpy_bools", lambda lib: (np.bool_(True), True, {})),
    ("numpy_arrays", lambda lib: (np.arange(6.0).reshape(2, 3), np.arange(6.0).reshape(2, 3), {})),
    ("none", lambda lib: (None, None, {})),
    ("float8_equal", lambda lib: (t(lib, [1.0, 2.0]).to(lib.float8_e4m3fn), t(lib, [1.0, 2.0]).to(lib.float8_e4m3fn),
                                  {})),
    # ------------------------------------------------ value mismatches
    ("float32_mismatch", lambda lib: (t(lib, [1.0, 2.0, 3.0]), t(lib, [1.0, 2.5, 3.1]), {})),
    ("float32_mismatch_2d", lambda lib: (lib.arange(12.0).reshape(3, 4) * 0.1, lib.arange(12.0).reshape(3, 4) * 0.1
                                         + t(lib, [0.0, 0.0, 0.0, 1e-3]), {})),
    ("first_greatest_index", lambda lib: (t(lib, [0.0, 1.0, 0.0, 1.0]), t(lib, [0.0, 0.0, 0.0, 0.0]), {})),
    ("float16_mismatch", lambda lib: (t(lib, [0.1, 0.2, 1000.0], "float16"), t(lib, [0.1, 0.3, 1002.0], "float16"),
                                      {})),
    ("bfloat16_mismatch", lambda lib: (t(lib, [0.1, 5.0], "bfloat16"), t(lib, [0.2, 5.0], "bfloat16"), {})),
    ("float64_mismatch", lambda lib: (t(lib, [0.1, 0.2], "float64"), t(lib, [0.1, 0.3], "float64"), {})),
    ("complex64_mismatch", lambda lib: (t(lib, [1 + 1j, 2 - 1j]), t(lib, [1 + 1j, 2 + 1j]), {})),
    ("complex128_mismatch", lambda lib: (t(lib, [1 + 1j], "complex128"), t(lib, [1.5 + 1j], "complex128"), {})),
    ("int64_mismatch", lambda lib: (t(lib, [1, 2, 3]), t(lib, [1, 2, 5]), {})),
    ("int_mismatch_with_atol", lambda lib: (t(lib, [1, 2, 3]), t(lib, [1, 2, 5]), {"rtol": 0, "atol": 1.5})),
    ("uint8_mismatch", lambda lib: (t(lib, [0, 7], "uint8"), t(lib, [255, 7], "uint8"), {})),
    ("int8_extremes", lambda lib: (t(lib, [-128, 0], "int8"), t(lib, [127, 0], "int8"), {})),
    ("bool_mismatch", lambda lib: (t(lib, [True, False]), t(lib, [True, True]), {})),
    ("expected_zero", lambda lib: (t(lib, [1.0, 0.5]), t(lib, [1.0, 0.0]), {})),
    ("nan_not_equal", lambda lib: (t(lib, [NAN, 1.0]), t(lib, [NAN, 1.0]), {})),
    ("nan_against_number", lambda lib: (t(lib, [1.0, NAN, 3.0]), t(lib, [1.5, 2.0, 3.0]), {})),
    ("opposite_infinities", lambda lib: (t(lib, [INF]), t(lib, [-INF]), {})),
    ("infinity_against_number", lambda lib: (t(lib, [1.0, INF]), t(lib, [1.0, 1.0]), {})),
    ("zero_dim_mismatch", lambda lib: (t(lib, 0.1), t(lib, 0.2), {})),
    ("zero_dim_float16_mismatch", lambda lib: (t(lib, 0.1, "float16"), t(lib, 0.2, "float16"), {})),
    ("zero_dim_int_mismatch", lambda lib: (t(lib, 3), t(lib, 0), {})),
    ("zero_dim_bool_mismatch", lambda lib: (t(lib, True), t(lib, False), {})),
    ("zero_dim_complex_mismatch", lambda lib: (t(lib, 1 + 2j), t(lib, 1 + 3j), {})),
    ("requires_grad_mismatch", lambda lib: (t(lib, [1.0, 2.0], requires_grad=True), t(lib, [1.0, 2.5]), {})),
    ("explicit_tolerances", lambda lib: (t(lib, [1.0, 2.0]), t(lib, [1.1, 2.0]), {"rtol": 0.01, "atol": 0.05})),
    ("zero_tolerances", lambda lib: (t(lib, [1.0, 2.0]), t(lib, [1.0, 2.0 + 1e-6]), {"rtol": 0.0, "atol": 0.0})),
    ("dtypes_free_mismatch", lambda lib: (t(lib, [1.0, 2.0], "float16"), t(lib, [1.0, 2.01]),
                                          {"check_dtype": False})),
    ("dtypes_free_int_float_mismatch", lambda lib: (t(lib, [1, 2]), t(lib, [1.0, 2.5]), {"check_dtype": False})),
    ("float8_mismatch", lambda lib: (t(lib, [1.0, 2.0, 4.0]).to(lib.float8_e4m3fn),
                                     t(lib, [1.0, 3.0, 5.0]).to(lib.float8_e4m3fn), {})),
    ("float8_tolerances_refused", lambda lib: (t(lib, [1.0]).to(lib.float8_e5m2), t(lib, [1.0]).to(lib.float8_e5m2),
                                               {"rtol": 0.1, "atol": 0.1})),
    ("float8_zero_dim_mismatch", lambda lib: (t(lib, 2.0).to(lib.float8_e4m3fn), t(lib, 3.0).to(lib.float8_e4m3fn),
                                              {})),
    ("float8_e8m0fnu_mismatch", lambda lib: (t(lib, [1.0, 2.0, 4.0]).to(lib.float8_e8m0fnu),
                                             t(lib, [1.0, 4.0, 4.0]).to(lib.float8_e8m0fnu), {})),
    ("float8_e8m0fnu_equal", lambda lib: (t(lib, [0.5, 8.0]).to(lib.float8_e8m0fnu),
                                          t(lib, [0.5, 8.0]).to(lib.float8_e8m0fnu), {})),
    ("numpy_zero_dim_mismatch", lambda lib: (np.array(1.5), np.array(2.5), {})),
    ("size_and_tuple", lambda lib: (lib.Size([2, 3]), (2, 4), {})),
    ("int_keys_first_failure", lambda lib: ({2: t(lib, [1.0]), 1: t(lib, [3.0])}, {1: t(lib, [2.0]), 2: t(lib, [2.0])},
                                            {})),
    ("numpy_array_mismatch", lambda lib: (np.array([1.0, 2.0]), np.array([1.0, 2.5]), {})),
    # ------------------------------------------------ attributes
    ("shape_mismatch", lambda lib: (t(lib, [1.0, 2.0]), t(lib, [[1.0, 2.0]]), {})),
    ("empty_shape_mismatch", lambda lib: (lib.zeros(0, 3), lib.zeros(3, 0), {})),
    ("dtype_mismatch", lambda lib: (t(lib, [1.0]), t(lib, [1.0], "float64"), {})),
    ("int_float_dtype_mismatch", lambda lib: (t(lib, [1]), t(lib, [1.0]), {})),
    ("stride_mismatch", lambda lib: (lib.ones(2, 3).t(), lib.ones(3, 2), {"check_stride": True})),
    # ------------------------------------------------ containers, numbers, messages
    ("sequence_length", lambda lib: ([lib.ones(1), lib.ones(1)], [lib.ones(1)], {})),
    ("mapping_keys", lambda lib: ({"a": 1, "b": 2}, {"a": 1, "c": 2, "d": 3}, {})),
    ("nested_failure_item", lambda lib: ({"w": [lib.ones(2), lib.ones(2)]}, {"w": [lib.ones(2), lib.zeros(2)]}, {})),
    ("msg_string", lambda lib: ([t(lib, [1.0])], [t(lib, [2.0])], {"msg": "custom message"})),
    ("msg_callable", lambda lib: ([t(lib, [1.0])], [t(lib, [2.0])], {"msg": lambda m: f"Header\n\n{m}\n\nFooter"})),
    ("msg_not_used_for_lengths", lambda lib: ([1, 2], [1], {"msg": "custom message"})),
    ("rtol_without_atol", lambda lib: (t(lib, [1.0]), t(lib, [1.0]), {"rtol": 1e-3})),
    ("atol_without_rtol", lambda lib: (1.0, 1.0, {"atol": 1e-3})),
    ("python_float_mismatch", lambda lib: (0.1, 0.2, {})),
    ("python_int_mismatch", lambda lib: (1, 3, {})),
    ("python_complex_mismatch", lambda lib: (1 + 1j, 1 + 2j, {})),
    ("python_nan", lambda lib: (NAN, NAN, {})),
    ("python_number_types", lambda lib: (1, 1.0, {})),
    ("numpy_number_mismatch", lambda lib: (np.float32(0.5), np.float32(0.25), {})),
    ("bool_mismatch_python", lambda lib: (True, False, {})),
    ("none_mismatch", lambda lib: (None, 1, {})),
    ("tensor_and_list", lambda lib: (t(lib, [1.0, 2.0]), [1.0, 2.0], {})),
    ("tensor_and_number", lambda lib: (t(lib, 1.0), 1.0, {})),
    ("tensor_and_numpy", lambda lib: (t(lib, [1.0]), np.array([1.0], dtype=np.float32), {})),
    ("strings", lambda lib: ("a", "a", {})),
    ("subclasses_refused", lambda lib: (np.ma.masked_array([1.0]), np.array([1.0]), {"allow_subclasses": False})),
    ("subclasses_allowed", lambda lib: (np.ma.masked_array([1.0]), np.array([1.0]), {})),
]


@pytest.mark.parametrize("build", [pytest.param(build, id=name) for name, build in CASES])
def test_assert_close_matches_torch(build):
    def call(library):
        actual, expected, kwargs = build(library)
        library.testing.assert_close(actual, expected, **kwargs)

    assert_same_outcome(call)


# torch raises from inside its own machinery here ("please file an issue"); the type is the same, our text says
# what went wrong
INTERNAL_ERROR_CASES = [
    ("bool_and_int", lambda lib: (True, 1, {})),
    ("negative_rtol", lambda lib: (t(lib, [1.0]), t(lib, [1.0]), {"rtol": -1.0, "atol": 0.0})),
]


@pytest.mark.parametrize("build", [pytest.param(build, id=name) for name, build in INTERNAL_ERROR_CASES])
def test_assert_close_internal_errors_match_torch_type(build):
    def call(library):
        actual, expected, kwargs = build(library)
        library.testing.assert_close(actual, expected, **kwargs)

    assert outcome(torch, call) is not None
    assert_same_outcome(call, same_text=False)


def test_float16_tolerance_is_computed_in_float16():
    # 1000 vs 1001 in float16: the allowed error 1e-5 + 0.001 * 1001 rounds to 1.0 in float16, so it passes; in
    # float32 the allowed error (1.001) would let 1002 pass too, which torch refuses
    def call(library):
        library.testing.assert_close(t(library, [1000.0], "float16"), t(library, [1002.0], "float16"))

    assert outcome(torch, call) is not None
    assert_same_outcome(call)


def test_random_tensors_match_torch():
    rng = np.random.default_rng(0)
    for dtype in ("float32", "float16", "bfloat16", "float64", "int32"):
        for scale in (1e-6, 1e-4, 1e-2):
            base = rng.standard_normal((4, 5)) * 10
            noisy = base + rng.standard_normal((4, 5)) * scale * np.abs(base)

            def call(library, base=base, noisy=noisy, dtype=dtype):
                library.testing.assert_close(t(library, noisy.tolist(), dtype), t(library, base.tolist(), dtype))

            assert_same_outcome(call)


def test_default_float64_changes_integer_comparison():
    def call(library):
        library.set_default_dtype(library.float64)
        try:
            library.testing.assert_close(t(library, [2**40]), t(library, [2**40 + 1]), rtol=0, atol=0.5)
        finally:
            library.set_default_dtype(library.float32)

    assert outcome(torch, call) is not None
    assert_same_outcome(call)


def test_testing_is_an_attribute_of_the_package():
    assert tw.testing.assert_close is tilewise.testing.assert_close
    assert {"assert_close", "make_tensor", "assert_allclose"} <= set(dir(tw.testing))


@pytest.mark.parametrize("case", [
    lambda lib: ([1.0, 2.0], t(lib, [1.0, 2.0 + 1e-5]), {}),
    lambda lib: (t(lib, [NAN, 1.0]), t(lib, [NAN, 1.0]), {}),
    lambda lib: (t(lib, [1.0, 2.0]), [1.0, 2.1], {}),
    lambda lib: (t(lib, [1.0, 2.0], "float64"), t(lib, [1.0, 2.0001]), {}),
    lambda lib: (t(lib, [1.0]), t(lib, [1.5]), {"msg": "values differ"}),
    lambda lib: (t(lib, [1.0]), t(lib, [1.5]), {"rtol": 0.5, "atol": 0.0}),
], ids=["list_and_tensor", "nan_equal_by_default", "mismatch", "dtypes_free", "msg", "explicit"])
def test_assert_allclose_matches_torch(case):
    def call(library):
        actual, expected, kwargs = case(library)
        with pytest.warns(FutureWarning, match="assert_allclose"):
            library.testing.assert_allclose(actual, expected, **kwargs)

    assert_same_outcome(call)


# ---------------------------------------------------------------- make_tensor
DEFAULT_RANGES = {"bool": (0, 1), "uint8": (0, 9), "int8": (-9, 9), "int16": (-9, 9), "int32": (-9, 9),
                  "int64": (-9, 9), "float16": (-9, 9), "bfloat16": (-9, 9), "float32": (-9, 9), "float64": (-9, 9),
                  "complex64": (-9, 9), "complex128": (-9, 9), "float8_e4m3fn": (-9, 9), "float8_e5m2": (-9, 9)}


def host(x) -> np.ndarray:
    values = x.detach().to(tw.float64 if not x.dtype.is_complex else x.dtype).numpy()
    return np.concatenate([values.real.ravel(), values.imag.ravel()]) if x.dtype.is_complex else values.ravel()


@pytest.mark.parametrize("dtype", sorted(DEFAULT_RANGES))
def test_make_tensor_default_range(dtype):
    x = tw.testing.make_tensor(2000, dtype=getattr(tw, dtype), device="cpu")
    assert x.dtype is getattr(tw, dtype) and x.shape == (2000,) and x.device == tw.device("cpu")
    assert not x.requires_grad and x.is_contiguous()
    values = host(x)
    low, high = DEFAULT_RANGES[dtype]
    assert values.min() >= low and values.max() <= high
    if dtype in ("bool", "uint8", "int8", "int16", "int32", "int64"):  # randint's high is exclusive
        assert set(np.unique(values).tolist()) == set(range(low, high + 1))
    elif dtype.startswith("float8"):  # rounded to float8: ends within the format's spacing near 9
        spacing = 1 if dtype == "float8_e4m3fn" else 2
        assert values.min() <= low + spacing and values.max() >= high - spacing
    else:  # uniform over [-9, 9): both ends are reached within a unit
        assert values.min() < low + 1 and values.max() > high - 1


@pytest.mark.parametrize("dtype,low,high", [
    ("int8", -1000, 1000), ("uint8", -5, 3), ("int64", 0, 2**70), ("float16", -1e6, 1e6), ("float32", -1e39, 1e39),
    ("float64", 0.25, 0.5), ("int32", 2.5, 5.5), ("bool", 1, 2),
])
def test_make_tensor_clamps_to_the_dtype(dtype, low, high):
    x = tw.testing.make_tensor(500, dtype=getattr(tw, dtype), device="cpu", low=low, high=high)
    tdtype = getattr(torch, dtype)
    info = torch.iinfo(tdtype) if not tdtype.is_floating_point and tdtype is not torch.bool else None
    lo = math.ceil(max(low, info.min)) if info else max(low, torch.finfo(tdtype).min if tdtype.is_floating_point
                                                           else 0)
    values = host(x)
    assert np.isfinite(values).all() and values.min() >= lo
    if info:
        assert values.max() < math.ceil(min(high, info.max + (tdtype is not torch.int64)))
    elif dtype != "bool":
        assert values.max() <= min(high, torch.finfo(tdtype).max)
    reference = torch.testing.make_tensor(500, dtype=tdtype, device="cpu", low=low, high=high)
    assert reference.dtype == tdtype


@pytest.mark.parametrize("shape", [(), (0,), (3,), (2, 3), [2, 3], (1, 1)])
def test_make_tensor_shapes_and_noncontiguous(shape):
    for as_sequence in (True, False):
        args = (shape,) if as_sequence else tuple(shape)
        x = tw.testing.make_tensor(*args, dtype=tw.float32, device="cpu", noncontiguous=True)
        reference = torch.testing.make_tensor(*args, dtype=torch.float32, device="cpu", noncontiguous=True)
        assert tuple(x.shape) == tuple(reference.shape)
        assert x.stride() == reference.stride() and x.is_contiguous() == reference.is_contiguous()
        assert x.storage_offset() == reference.storage_offset()


def test_make_tensor_shape_as_size_and_device_object():
    x = tw.testing.make_tensor(tw.Size([2, 2]), dtype=tw.int16, device=tw.device("cpu"))
    assert x.shape == (2, 2) and x.dtype is tw.int16


def test_make_tensor_memory_format():
    x = tw.testing.make_tensor(2, 3, 4, 5, dtype=tw.float32, device="cpu", memory_format=tw.channels_last)
    reference = torch.testing.make_tensor(2, 3, 4, 5, dtype=torch.float32, device="cpu",
                                          memory_format=torch.channels_last)
    assert x.stride() == reference.stride()


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float64", "complex64", "complex128"])
def test_make_tensor_requires_grad(dtype):
    x = tw.testing.make_tensor(3, dtype=getattr(tw, dtype), device="cpu", requires_grad=True, noncontiguous=True)
    assert x.requires_grad and x.is_leaf
    (x.abs() if x.is_complex() else x).sum().backward()
    assert x.grad is not None


def test_make_tensor_ignores_requires_grad_for_float8_as_torch():
    reference = torch.testing.make_tensor(3, dtype=torch.float8_e4m3fn, device="cpu", requires_grad=True)
    x = tw.testing.make_tensor(3, dtype=tw.float8_e4m3fn, device="cpu", requires_grad=True)
    assert x.requires_grad == reference.requires_grad is False


@pytest.mark.parametrize("dtype,replacement", [
    ("bool", 1), ("uint8", 1), ("int64", 1), ("float32", torch.finfo(torch.float32).tiny),
    ("float16", torch.finfo(torch.float16).tiny), ("complex64", torch.finfo(torch.float32).tiny),
])
def test_make_tensor_exclude_zero(dtype, replacement):
    # [0, 1) holds only zeros for bool and integers; for floats, low=high=0 warns and fills with zeros
    kwargs = {"low": 0, "high": 1} if dtype in ("bool", "uint8", "int64") else {"low": 0, "high": 0}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        x = tw.testing.make_tensor(4, 3, dtype=getattr(tw, dtype), device="cpu", exclude_zero=True,
                                   noncontiguous=True, **kwargs)
        reference = torch.testing.make_tensor(4, 3, dtype=getattr(torch, dtype), device="cpu", exclude_zero=True,
                                              noncontiguous=True, **kwargs)
    tilewise.testing.assert_close(x, tw.full((4, 3), replacement, dtype=getattr(tw, dtype)))
    torch.testing.assert_close(reference, torch.full((4, 3), replacement, dtype=getattr(torch, dtype)))


def test_make_tensor_low_equal_high_warns_as_torch():
    with pytest.warns(FutureWarning, match="low==high"):
        x = tw.testing.make_tensor(3, dtype=tw.float32, device="cpu", low=2.5, high=2.5)
    assert (x == 2.5).all()


@pytest.mark.parametrize("kwargs", [
    {"dtype": "int64", "requires_grad": True},
    {"dtype": "bool", "requires_grad": True},
    {"dtype": "float32", "low": 2, "high": 1},
    {"dtype": "int32", "low": 3, "high": 3},
    {"dtype": "float32", "low": NAN},
    {"dtype": "float32", "high": NAN, "low": 0.0},
    {"dtype": "int8", "low": 1000, "high": 2000},
    {"dtype": "uint8", "low": -20, "high": -10},
    {"dtype": "float16", "low": 1e6, "high": 2e6},
    {"dtype": "float32", "noncontiguous": True, "memory_format": "channels_last"},
], ids=lambda kwargs: "-".join(f"{k}={v}" for k, v in kwargs.items()))
def test_make_tensor_errors_match_torch(kwargs):
    def call(library):
        options = dict(kwargs, dtype=getattr(library, kwargs["dtype"]))
        if "memory_format" in options:
            options["memory_format"] = getattr(library, options["memory_format"])
        library.testing.make_tensor(2, 3, device="cpu", **options)

    assert outcome(torch, call) is not None
    assert_same_outcome(call)


def test_make_tensor_unsupported_dtype():
    with pytest.raises(TypeError) as ours:
        tw.testing.make_tensor(2, dtype=tw.float8_e8m0fnu, device="cpu")
    with pytest.raises(TypeError) as theirs:
        torch.testing.make_tensor(2, dtype=torch.float8_e8m0fnu, device="cpu")
    first_sentence = "The requested dtype 'torch.float8_e8m0fnu' is not supported by torch.testing.make_tensor()."
    assert str(theirs.value).startswith(first_sentence)
    assert normalised(str(ours.value)).startswith(first_sentence)
    assert "float8_e4m3fn" in str(ours.value)  # what would be valid


@pytest.mark.cuda
def test_assert_close_cuda_tensors():
    x = tw.tensor([1.0, 2.0])
    on_gpu = x.cuda()
    tw.testing.assert_close(on_gpu, on_gpu.clone())
    with pytest.raises(AssertionError, match=r"^The values for attribute 'device' do not match: cuda:0 != cpu\.$"):
        tw.testing.assert_close(on_gpu, x)
    tw.testing.assert_close(on_gpu, x, check_device=False)
    with pytest.raises(AssertionError, match="Greatest absolute difference: 0.5 at index"):
        tw.testing.assert_close(on_gpu, tw.tensor([1.0, 2.5]), check_device=False)
    y = tw.testing.make_tensor(3, 4, dtype=tw.float16, device="cuda", noncontiguous=True, requires_grad=True)
    assert y.device.type == "cuda" and not y.is_contiguous() and y.requires_grad


@pytest.mark.parametrize("module", ["tilewise.testing", "tilewise.testing._comparison", "tilewise.testing._creation"])
def test_docstring_examples_run(module):
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(module))
    assert result.attempted > 0 and result.failed == 0

"""dtypes against torch: the promotion lattice, result_type over tensors / 0-dim tensors / Python scalars,
result dtypes of real operator calls, finfo/iinfo, conversions, and low-precision round trips."""

from __future__ import annotations

import itertools

import ml_dtypes
import numpy as np
import pytest
import torch

import tilewise as tw

NAMES = ["bool", "uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16", "float32", "float64",
         "float8_e4m3fn", "float8_e5m2"]
ARITH = NAMES[:-2]  # float8 formats are storage types: torch promotes them with nothing
SCALARS = [True, 3, -2, 2.5]


def torch_name(dtype) -> str:
    return str(dtype).removeprefix("torch.").removeprefix("tilewise.")


def outcome(fn, *args):
    """The dtype name ``fn(*args)`` produces, or 'error' when it raises (promotion refusals are part of the table)."""
    try:
        return torch_name(fn(*args))
    except (RuntimeError, TypeError):
        return "error"


def operand(lib, name, kind):
    """A tensor with dimensions ('t'), a 0-dim tensor ('0'), or a Python scalar (kind is the value)."""
    if kind == "t":
        return lib.zeros(2, dtype=getattr(lib, name))
    if kind == "0":
        return lib.zeros((), dtype=getattr(lib, name))
    return kind


@pytest.mark.parametrize("a,b", list(itertools.product(NAMES, NAMES)))
def test_promote_types_matches_torch(a, b):
    expected = outcome(torch.promote_types, getattr(torch, a), getattr(torch, b))
    actual = outcome(tw.promote_types, getattr(tw, a), getattr(tw, b))
    assert actual == expected


def test_promote_types_float8_message():
    with pytest.raises(TypeError, match="Promotion for Float8 Types is not supported.*float8_e4m3fn.*float32"):
        tw.promote_types(tw.float8_e4m3fn, tw.float32)


@pytest.mark.parametrize("a", NAMES)
def test_result_type_matches_torch(a):
    """Every tensor/0-dim kind against every dtype and kind, and against each kind of Python scalar."""
    kinds = ["t", "0"]
    for b, ka, kb in itertools.product(NAMES, kinds, kinds):
        expected = outcome(torch.result_type, operand(torch, a, ka), operand(torch, b, kb))
        actual = outcome(tw.result_type, operand(tw, a, ka), operand(tw, b, kb))
        assert actual == expected, f"result_type({a} {ka}, {b} {kb})"
    for ka, scalar in itertools.product(kinds, SCALARS):
        expected = outcome(torch.result_type, operand(torch, a, ka), scalar)
        actual = outcome(tw.result_type, operand(tw, a, ka), scalar)
        assert actual == expected, f"result_type({a} {ka}, {scalar!r})"


def test_result_type_follows_default_dtype():
    previous = tw.get_default_dtype()
    try:
        tw.set_default_dtype(tw.float64)
        torch.set_default_dtype(torch.float64)
        for name in ["bool", "int32", "float16", "float32"]:
            for kind in ["t", "0"]:
                expected = torch_name(torch.result_type(operand(torch, name, kind), 2.5))
                assert tw.result_type(operand(tw, name, kind), 2.5).name == expected
        assert tw.tensor([1.0]).dtype is tw.float64 and tw.arange(3.0).dtype is tw.float64
    finally:
        tw.set_default_dtype(previous)
        torch.set_default_dtype(torch.float32)


def test_set_default_dtype_rejects_non_float():
    with pytest.raises(TypeError, match="only float16/bfloat16/float32/float64 are valid defaults, got tilewise.int64"):
        tw.set_default_dtype(tw.int64)


BINARY_OPS = ["add", "mul", "div", "eq", "lt", "ge", "atan2", "pow", "floor_divide", "remainder"]


@pytest.mark.parametrize("op", BINARY_OPS)
def test_operator_result_dtypes_match_torch(op):
    """The dtype a real call returns, for every pair of arithmetic dtypes and tensor-scalar mixes (where torch
    accepts the call: true division of integers gives the default float, comparisons give bool)."""
    for a, b in itertools.product(ARITH, ARITH + SCALARS):
        try:
            expected = torch_name(_call(torch, op, a, b).dtype)
        except (RuntimeError, TypeError):
            continue  # e.g. floor_divide on bool, atan2 with a bool scalar: torch refuses
        assert _call(tw, op, a, b).dtype.name == expected, f"{op}({a}, {b!r})"


def _call(lib, op, a, b):
    x = (lib.ones(3, dtype=getattr(lib, a)) + 1).to(getattr(lib, a))
    y = b if not isinstance(b, str) else lib.ones(3, dtype=getattr(lib, b)) + 1
    return getattr(lib, op)(x, y)


def test_zero_dim_and_scalar_do_not_widen():
    x = tw.ones(3, dtype=tw.float16)
    assert (x + tw.tensor(1.0, dtype=tw.float64)).dtype is tw.float16  # 0-dim of same category: no widening
    assert (x + 1e10).dtype is tw.float16
    i = tw.ones(3, dtype=tw.int8)
    assert (i + tw.tensor(1000)).dtype is tw.int8
    assert (i + tw.tensor(1.5)).dtype is tw.float32  # a higher category raises it to the default float
    assert (i / i).dtype is tw.float32
    assert (i // i).dtype is tw.int8
    assert (i == 1).dtype is tw.bool


# ---------------------------------------------------------------------------- finfo / iinfo

@pytest.mark.parametrize("name", ["float16", "bfloat16", "float32", "float64", "float8_e4m3fn", "float8_e5m2"])
def test_finfo_matches_torch(name):
    ours, theirs = tw.finfo(getattr(tw, name)), torch.finfo(getattr(torch, name))
    for field in ("bits", "eps", "max", "min", "tiny", "smallest_normal", "resolution"):
        assert getattr(ours, field) == getattr(theirs, field), field
    assert ours.dtype is getattr(tw, name)


def test_finfo_default_and_errors():
    assert tw.finfo().dtype is tw.get_default_dtype()
    with pytest.raises(TypeError, match="tilewise.int32 is not a floating point dtype; use iinfo"):
        tw.finfo(tw.int32)


@pytest.mark.parametrize("name", ["uint8", "int8", "int16", "int32", "int64"])
def test_iinfo_matches_torch(name):
    ours, theirs = tw.iinfo(getattr(tw, name)), torch.iinfo(getattr(torch, name))
    assert (ours.bits, ours.min, ours.max) == (theirs.bits, theirs.min, theirs.max)


def test_iinfo_rejects_non_integers():
    for dtype in (tw.bool, tw.float32):
        with pytest.raises(TypeError, match="is not an integer dtype; use finfo"):
            tw.iinfo(dtype)


# ---------------------------------------------------------------------------- conversions

DATA = [1.7, -2.7, 300.0, 0.0, -0.5]
CONVERSIONS = ["float", "double", "half", "bfloat16", "long", "int", "short", "char", "byte", "bool"]


@pytest.mark.parametrize("method", CONVERSIONS)
def test_conversion_methods_match_torch(method):
    ours = getattr(tw.tensor(DATA), method)()
    theirs = getattr(torch.tensor(DATA), method)()
    assert ours.dtype.name == torch_name(theirs.dtype)
    assert ours.tolist() == theirs.tolist()  # truncation toward zero, modular wrap for int8/uint8


def test_to_forms():
    x = tw.tensor(DATA)
    assert x.to(tw.float32) is x and x.to("cpu") is x  # no-op conversions return self, like torch
    assert x.to(tw.float32, copy=True) is not x
    assert x.to(tw.float64).dtype is tw.float64
    assert x.to(dtype=tw.int32).dtype is tw.int32
    assert x.to("cpu", tw.float16).dtype is tw.float16
    assert x.to(tw.tensor([1], dtype=tw.int8)).dtype is tw.int8
    assert x.to(torch.float64).dtype is tw.float64  # torch dtype objects are understood
    assert x.type(tw.int16).dtype is tw.int16 and x.type() == "tilewise.FloatTensor"
    assert x.type_as(tw.ones(1, dtype=tw.bfloat16)).dtype is tw.bfloat16
    with pytest.raises(TypeError, match="to\\(\\): expected a device, dtype or tensor, got 3.5"):
        x.to(3.5)


def test_conversion_keeps_autograd():
    x = tw.tensor([1.5, 2.5], requires_grad=True)
    y = x.double()
    assert y.requires_grad and y.grad_fn is not None
    (y * y).sum().backward()
    assert x.grad.dtype is tw.float32
    np.testing.assert_allclose(x.grad.numpy(), [3.0, 5.0])


def test_as_dtype_accepts_python_types_and_names():
    from tilewise.dtypes import as_dtype

    assert as_dtype(float) is tw.get_default_dtype() and as_dtype(int) is tw.int64 and as_dtype(bool) is tw.bool
    assert as_dtype("float16") is tw.float16 and as_dtype("torch.bfloat16") is tw.bfloat16
    assert as_dtype(np.dtype("int16")) is tw.int16
    assert as_dtype("complex64") is tw.complex64 and as_dtype("cdouble") is tw.complex128
    assert as_dtype(np.dtype("complex64")) is tw.cfloat and as_dtype(complex) is tw.complex128
    with pytest.raises(TypeError, match="unknown dtype 'complex32'; valid dtypes: bool, uint8"):
        as_dtype("complex32")


# ---------------------------------------------------------------------------- low-precision round trips

IN_RANGE = np.array([0.0, -0.0, 1.0, -1.5, 3.14159, 1e-3, 0.1, 2.5, 3.5, -7.25, 240.0, 448.0, 1e-8, np.nan],
                    dtype=np.float32)
LOW_PRECISION = [("bfloat16", ml_dtypes.bfloat16), ("float16", np.float16),
                 ("float8_e4m3fn", ml_dtypes.float8_e4m3fn), ("float8_e5m2", ml_dtypes.float8_e5m2)]


@pytest.mark.parametrize("name,np_type", LOW_PRECISION, ids=[n for n, _ in LOW_PRECISION])
def test_low_precision_round_trip(name, np_type):
    """float32 → low precision → float32 rounds to nearest even exactly as ml_dtypes and torch do. float8 bits
    are torch's, NaN included (torch's float8_e5m2 NaN sets every mantissa bit, ml_dtypes' does not)."""
    ours = tw.from_numpy(IN_RANGE).to(getattr(tw, name))
    assert ours.dtype.name == name and ours.element_size() == np.dtype(np_type).itemsize
    back = ours.float().numpy()
    np.testing.assert_array_equal(back, IN_RANGE.astype(np_type).astype(np.float32))
    theirs = torch.from_numpy(IN_RANGE).to(getattr(torch, name))
    np.testing.assert_array_equal(back, theirs.float().numpy())
    if ours.element_size() == 1:
        np.testing.assert_array_equal(ours.numpy().view(np.uint8), theirs.view(torch.uint8).numpy())
    else:
        np.testing.assert_array_equal(ours.numpy().view(np.uint16), IN_RANGE.astype(np_type).view(np.uint16))


def test_bfloat16_tensor_round_trips_through_numpy():
    x = tw.tensor([1.0, 2.5, -3.0], dtype=tw.bfloat16)
    assert x.numpy().dtype == ml_dtypes.bfloat16
    assert tw.from_numpy(x.numpy()).dtype is tw.bfloat16
    assert x.tolist() == [1.0, 2.5, -3.0]


def test_half_arithmetic_rounds_once_like_torch():
    a = np.array([1.0009765625, 2049.0, 0.1], dtype=np.float32)
    for name in ("float16", "bfloat16"):
        ours = (tw.from_numpy(a).to(getattr(tw, name)) * 3 + 1).float().numpy()
        theirs = (torch.from_numpy(a).to(getattr(torch, name)) * 3 + 1).float().numpy()
        np.testing.assert_array_equal(ours, theirs)


OUT_OF_RANGE = [0.0, -0.0, 232.0, 448.0, 449.0, 464.0, 465.0, 1000.0, -1000.0, 57344.0, 60000.0, 61440.0, 1e6, -1e30,
                np.inf, -np.inf, np.nan]


@pytest.mark.parametrize("target", ["float8_e4m3fn", "float8_e5m2"])
@pytest.mark.parametrize("source", ["float32", "float64", "float16", "bfloat16", "int64"])
def test_float8_casts_of_out_of_range_values_match_torch(source, target):
    """torch saturates e4m3fn (no infinity: beyond ±448, infinities included, become ±448) and rounds e5m2 to
    infinity; NaN stays NaN. Compared bit for bit."""
    values = [v for v in OUT_OF_RANGE if abs(v) < 2**62] if source == "int64" else OUT_OF_RANGE
    theirs = torch.tensor(values, dtype=torch.float64).to(getattr(torch, source)).to(getattr(torch, target))
    ours = tw.tensor(values, dtype=tw.float64).to(getattr(tw, source)).to(getattr(tw, target))
    np.testing.assert_array_equal(ours.numpy().view(np.uint8), theirs.view(torch.uint8).numpy())


@pytest.mark.parametrize("target", ["float8_e4m3fn", "float8_e5m2"])
def test_float8_casts_at_every_rounding_edge_match_torch(target):
    """Every float16 value (each float8 value and each midpoint between two among them, NaNs of both signs) and
    the float32 values beside each: the reference the CUDA casts are checked against."""
    halves = np.arange(65536, dtype=np.uint16).view(np.float16).astype(np.float32)
    with np.errstate(invalid="ignore"):
        values = np.concatenate([halves, np.nextafter(halves, np.float32(np.inf)),
                                 np.nextafter(halves, np.float32(-np.inf))]).astype(np.float32)
    theirs = torch.from_numpy(values).to(getattr(torch, target)).view(torch.uint8).numpy()
    ours = tw.from_numpy(values).to(getattr(tw, target)).view(tw.uint8).numpy()
    bad = np.flatnonzero(ours != theirs)[:8]
    assert not bad.size, (values.view(np.uint32)[bad], ours[bad], theirs[bad])


@pytest.mark.parametrize("target", ["float8_e4m3fn", "float8_e5m2"])
def test_float8_from_data_and_fill_saturate_like_torch(target):
    theirs = torch.tensor([1000.0, -np.inf, np.nan], dtype=getattr(torch, target)).view(torch.uint8).numpy()
    ours = tw.tensor([1000.0, -np.inf, np.nan], dtype=getattr(tw, target)).numpy().view(np.uint8)
    np.testing.assert_array_equal(ours, theirs)
    assert tw.full((), 1000.0, dtype=getattr(tw, target)).float().item() == \
        torch.full((), 1000.0, dtype=getattr(torch, target)).float().item()


def test_c10_names_are_those_torchs_messages_print():
    """The one table of torch's scalar-type names: read off torch's own index_put message for every dtype."""
    from tilewise.dtypes import ALL, c10_name

    for d in ALL:
        kind = getattr(torch, d.name)
        dest = torch.float64 if d.name == "float32" else torch.float32
        with pytest.raises(RuntimeError) as error:
            torch.empty(2, dtype=dest).index_put_((torch.tensor([0]),), torch.empty(1, dtype=kind))
        assert f"and {c10_name(d)} for the source" in str(error.value), (d.name, str(error.value))

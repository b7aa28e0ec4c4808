"""``assert_close`` and ``assert_allclose``: comparison of tensors, numbers and containers of them, as torch.testing.

[Note: host comparison] Values are compared on the host, in numpy, not with tilewise's own operators: these
functions are what tests check those operators with, so a wrong ``isclose`` or ``max`` must not be able to
hide its own error. The arithmetic follows torch's CPU kernels so that verdicts and the printed differences
are torch's to the last digit: 16- and 8-bit floats are widened to float32 and each result is rounded back
to the dtype (torch's "opmath" type), tolerances take the compute dtype as Python-number operands do,
integers and booleans are compared in the default float dtype as ``torch.isclose`` compares them, and the
relative difference of integers is a float of the default dtype (integer true division).

[Note: comparison pairs] As in torch, the inputs are first unfolded into pairs (sequences and mappings
recursively; each leaf keeps the path of indices and keys that led to it, which a failure prints), then the
pairs are checked in order and the first failure is raised. Errors found while unfolding (lengths, keys,
tolerances given by half, types nothing can compare) ignore the caller's ``msg``; mismatches found while
comparing use it.
"""

from __future__ import annotations

import cmath
import collections.abc
import contextlib
import functools
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from tilewise import dtypes
from tilewise.dtypes import DType
from tilewise.tensor import Tensor, as_tensor, tensor

# {dtype: (rtol, atol)}; every other dtype (integers, bool, float8) is compared exactly by default
DEFAULT_TOLERANCES: dict[DType, tuple[float, float]] = {
    dtypes.float16: (0.001, 1e-5),
    dtypes.bfloat16: (0.016, 1e-5),
    dtypes.float32: (1.3e-6, 1e-5),
    dtypes.float64: (1e-7, 1e-7),
    dtypes.complex64: (1.3e-6, 1e-5),
    dtypes.complex128: (1e-7, 1e-7),
}
# the dtypes whose tolerances stand for Python numbers
_NUMBER_DTYPES = {int: dtypes.int64, float: dtypes.float64, complex: dtypes.complex128}
_ALLCLOSE_TOLERANCES = {dtypes.float16: (1e-3, 1e-3), dtypes.float32: (1e-4, 1e-5), dtypes.float64: (1e-5, 1e-8)}


class _ComparisonError(Exception):
    """A failed check: the exception type to raise, its message, and the path of the item that failed."""

    def __init__(self, kind: type[Exception], message: str, item: tuple = ()) -> None:
        super().__init__(message)
        self.kind, self.message, self.item = kind, message, item

    def to_error(self, msg: str | Callable[[str], str] | None = None) -> Exception:
        if isinstance(msg, str):
            return self.kind(msg)
        text = self.message
        if self.item:
            text += f"\n\nThe failure occurred for item {''.join(str([key]) for key in self.item)}"
        return self.kind(msg(text) if callable(msg) else text)


@dataclass(frozen=True)
class _Options:
    allow_subclasses: bool
    rtol: float | None
    atol: float | None
    equal_nan: bool
    check_device: bool
    check_dtype: bool
    check_layout: bool
    check_stride: bool


def assert_close(actual: Any, expected: Any, *, allow_subclasses: bool = True, rtol: float | None = None,
                 atol: float | None = None, equal_nan: bool = False, check_device: bool = True,
                 check_dtype: bool = True, check_layout: bool = True, check_stride: bool = False,
                 msg: str | Callable[[str], str] | None = None) -> None:
    """Raise unless ``actual`` and ``expected`` are close, as ``torch.testing.assert_close``.

    Tensors (and numpy arrays, compared as tensors) must have the same shape, and by default the same dtype,
    device and layout; their values are close where ``|actual - expected| <= atol + rtol * |expected|``, NaNs
    equal only with ``equal_nan=True``. Without ``rtol`` and ``atol`` the tolerances are those of the dtype
    (float32: 1.3e-6 and 1e-5; integers and bool: exact). Sequences and mappings are compared item by item.

    >>> import tilewise as tw
    >>> assert_close(tw.tensor([1.0, 2.0]), tw.tensor([1.0, 2.0 + 1e-6]))
    >>> assert_close(tw.tensor([1.0, 2.0]), tw.tensor([1.0, 2.5]))
    Traceback (most recent call last):
    AssertionError: Tensor-likes are not close!
    <BLANKLINE>
    Mismatched elements: 1 / 2 (50.0%)
    Greatest absolute difference: 0.5 at index (1,) (up to 1e-05 allowed)
    Greatest relative difference: 0.20000000298023224 at index (1,) (up to 1.3e-06 allowed)
    """
    __tracebackhide__ = True
    options = _Options(allow_subclasses, rtol, atol, equal_nan, check_device, check_dtype, check_layout,
                       check_stride)
    try:
        checks = _pairs(actual, expected, (), options)
    except _ComparisonError as failure:
        raise failure.to_error() from None
    for check in checks:
        try:
            check()
        except _ComparisonError as failure:
            raise failure.to_error(msg) from None


def assert_allclose(actual: Any, expected: Any, rtol: float | None = None, atol: float | None = None,
                    equal_nan: bool = True, msg: str = "") -> None:
    """Deprecated, as in torch: ``assert_close`` with looser default tolerances, NaNs equal and dtypes free."""
    warnings.warn("`tilewise.testing.assert_allclose()` is deprecated (as `torch.testing.assert_allclose()` is since "
                  "torch 1.12) and will be removed in a future release. Please use `tilewise.testing.assert_close()` "
                  "instead. You can find detailed upgrade instructions in "
                  "https://github.com/pytorch/pytorch/issues/61844.", FutureWarning, stacklevel=2)
    if not isinstance(actual, Tensor):
        actual = tensor(actual)
    if not isinstance(expected, Tensor):
        expected = tensor(expected, dtype=actual.dtype)
    if rtol is None and atol is None:
        rtol, atol = _loosest(actual.dtype, expected.dtype, table=_ALLCLOSE_TOLERANCES)
    assert_close(actual, expected, rtol=rtol, atol=atol, equal_nan=equal_nan, check_device=True, check_dtype=False,
                 check_stride=False, msg=msg or None)


# ---------------------------------------------------------------- unfolding the inputs into pairs
def _is_sequence(value: Any) -> bool:
    return isinstance(value, collections.abc.Sequence) and not isinstance(value, str)


def _pairs(actual: Any, expected: Any, item: tuple, options: _Options) -> list[Callable[[], None]]:
    if _is_sequence(actual) and _is_sequence(expected):
        if len(actual) != len(expected):
            raise _ComparisonError(AssertionError, "The length of the sequences mismatch: "
                                                   f"{len(actual)} != {len(expected)}", item)
        return [check for i in range(len(actual)) for check in _pairs(actual[i], expected[i], (*item, i), options)]
    if isinstance(actual, collections.abc.Mapping) and isinstance(expected, collections.abc.Mapping):
        return _mapping_pairs(actual, expected, item, options)
    for make_pair in (_none_pair, _boolean_pair, _number_pair, _tensor_pair):
        check = make_pair(actual, expected, item, options)
        if check is not None:
            return [check]
    raise _ComparisonError(TypeError, f"No comparison pair was able to handle inputs of type {type(actual)} and "
                                      f"{type(expected)}.", item)


def _mapping_pairs(actual, expected, item: tuple, options: _Options) -> list[Callable[[], None]]:
    actual_keys, expected_keys = set(actual.keys()), set(expected.keys())
    if actual_keys != expected_keys:
        missing, additional = sorted(expected_keys - actual_keys), sorted(actual_keys - expected_keys)
        raise _ComparisonError(AssertionError, "The keys of the mappings do not match:\n"
                                               f"Missing keys in the actual mapping: {missing}\n"
                                               f"Additional keys in the actual mapping: {additional}", item)
    keys: collections.abc.Collection = actual_keys
    with contextlib.suppress(Exception):  # a fixed order where the keys have one: the first failure is reported
        keys = sorted(keys)
    return [check for key in keys for check in _pairs(actual[key], expected[key], (*item, key), options)]


def _loosest(*kinds: DType, table: dict[DType, tuple[float, float]] = DEFAULT_TOLERANCES) -> tuple[float, float]:
    rtols, atols = zip(*[table.get(kind, (0.0, 0.0)) for kind in kinds], strict=True)
    return max(rtols), max(atols)


def _tolerances(*kinds: DType, options: _Options, item: tuple) -> tuple[float, float]:
    rtol, atol = options.rtol, options.atol
    if (rtol is None) != (atol is None):
        raise _ComparisonError(ValueError, "Both 'rtol' and 'atol' must be either specified or omitted, but got no "
                                           f"{'rtol' if rtol is None else 'atol'}.", item)
    if rtol is not None:
        return rtol, atol
    return _loosest(*kinds)


def _none_pair(actual, expected, item: tuple, options: _Options):
    if actual is not None and expected is not None:
        return None

    def check() -> None:
        if not (actual is None and expected is None):
            raise _ComparisonError(AssertionError, f"None mismatch: {actual} is not {expected}", item)

    return check


def _boolean_pair(actual, expected, item: tuple, options: _Options):
    if not (isinstance(actual, (bool, np.bool_)) and isinstance(expected, (bool, np.bool_))):
        return None
    actual, expected = bool(actual), bool(expected)

    def check() -> None:
        if actual is not expected:
            raise _ComparisonError(AssertionError, f"Booleans mismatch: {actual} is not {expected}", item)

    return check


def _number_pair(actual, expected, item: tuple, options: _Options):
    numbers = (int, float, complex, np.number)
    if not (isinstance(actual, numbers) and isinstance(expected, numbers)):
        return None
    actual, expected = (value.item() if isinstance(value, np.number) else value for value in (actual, expected))
    kinds = [_NUMBER_DTYPES.get(type(value)) for value in (actual, expected)]
    if None in kinds:  # a bool (or another subclass of int) beside a number
        where = f" at item {''.join(str([key]) for key in item)}" if item else ""
        raise RuntimeError(f"assert_close cannot compare {actual!r} ({type(actual).__name__}) with {expected!r} "
                           f"({type(expected).__name__}){where}: numbers compare only as int, float or complex, "
                           "and a bool only with another bool")
    rtol, atol = _tolerances(*kinds, options=options, item=item)
    return functools.partial(_compare_numbers, actual, expected, rtol, atol, options, item)


def _compare_numbers(actual, expected, rtol: float, atol: float, options: _Options, item: tuple) -> None:
    if options.check_dtype and type(actual) is not type(expected):
        raise _ComparisonError(AssertionError, f"The (d)types do not match: {type(actual)} != {type(expected)}.",
                               item)
    if actual == expected:
        return
    if options.equal_nan and cmath.isnan(actual) and cmath.isnan(expected):
        return
    difference = abs(actual - expected)
    if cmath.isfinite(difference) and difference <= atol + rtol * abs(expected):
        return
    raise _ComparisonError(AssertionError, _scalar_mismatch_message(actual, expected, rtol, atol), item)


def _tensor_pair(actual, expected, item: tuple, options: _Options):
    if not (isinstance(actual, type(expected)) or isinstance(expected, type(actual))):
        return None
    if not options.allow_subclasses and type(actual) is not type(expected):
        return None
    try:
        actual, expected = (value if isinstance(value, Tensor) else as_tensor(value) for value in (actual, expected))
    except Exception:  # noqa: BLE001 — whatever as_tensor refuses is not tensor-like
        return None
    rtol, atol = _tolerances(actual.dtype, expected.dtype, options=options, item=item)
    return functools.partial(_compare_tensors, actual, expected, rtol, atol, options, item)


# ---------------------------------------------------------------- tensors
def _compare_tensors(actual: Tensor, expected: Tensor, rtol: float, atol: float, options: _Options,
                     item: tuple) -> None:
    _compare_attributes(actual, expected, options, item)
    dtype = actual.dtype if actual.dtype is expected.dtype else dtypes.promote_types(actual.dtype, expected.dtype)
    if dtype.is_floating_point and dtype.itemsize == 1 and (rtol != 0 or atol != 0):
        raise _ComparisonError(AssertionError, f"Rtol={rtol} and atol={atol} are not supported for bitwise comparison "
                                               "of low dimensional floats. Please use rtol=0.0 and atol=0.0.")
    a, b = (_host_values(t, dtype) for t in (actual, expected))
    matches = _isclose(a, b, dtype, rtol, atol, options.equal_nan)
    if matches.all():
        return
    if a.ndim == 0:
        message = _scalar_mismatch_message(_python_number(a, dtype), _python_number(b, dtype), rtol, atol)
    else:
        message = _tensor_mismatch_message(a, b, matches, dtype, rtol, atol)
    raise _ComparisonError(AssertionError, message, item)


def _compare_attributes(actual: Tensor, expected: Tensor, options: _Options, item: tuple) -> None:
    def differ(name: str, actual_value, expected_value):
        raise _ComparisonError(AssertionError, f"The values for attribute '{name}' do not match: {actual_value} != "
                                               f"{expected_value}.", item)

    if actual.shape != expected.shape:
        differ("shape", actual.shape, expected.shape)
    if actual.layout != expected.layout:
        if options.check_layout:
            differ("layout", actual.layout, expected.layout)
    elif options.check_stride and actual.stride() != expected.stride():
        differ("stride()", actual.stride(), expected.stride())
    if options.check_device and actual.device != expected.device:
        differ("device", actual.device, expected.device)
    if options.check_dtype and actual.dtype is not expected.dtype:
        differ("dtype", actual.dtype, expected.dtype)


def _host_values(t: Tensor, dtype: DType) -> np.ndarray:
    """The values of ``t`` as ``dtype`` in a host array, 16- and 8-bit floats widened (exactly) to float32."""
    t = t.detach().cpu()
    if t.dtype is not dtype:
        t = t.to(dtype)
    values = t.numpy()
    if dtype.name == "float4_e2m1fn_x2":  # two codes per byte, compared bit for bit
        return values.view(np.uint8)
    return values.astype(np.float32) if dtype.is_floating_point and dtype.itemsize < 4 else values


def _rounder(dtype: DType) -> Callable[[np.ndarray], np.ndarray]:
    """Rounds a float32 result to ``dtype`` where ``dtype`` is computed in float32 (its opmath type)."""
    if dtype.is_floating_point and 1 < dtype.itemsize < 4:
        return lambda x: x.astype(dtype.np).astype(np.float32)
    return lambda x: x


def _isclose(a: np.ndarray, b: np.ndarray, dtype: DType, rtol: float, atol: float, equal_nan: bool) -> np.ndarray:
    """``torch.isclose(a, b, rtol, atol, equal_nan)`` for host arrays of ``dtype``."""
    if rtol < 0:
        raise RuntimeError(f"rtol must be greater than or equal to zero, but got {rtol}")
    if atol < 0:
        raise RuntimeError(f"atol must be greater than or equal to zero, but got {atol}")
    with np.errstate(all="ignore"):
        close = a == b
        inexact = dtype.is_floating_point or dtype.is_complex
        if equal_nan and inexact and dtype.name != "float4_e2m1fn_x2":
            close |= np.isnan(a) & np.isnan(b)
        if rtol == 0 and atol == 0:
            return close
        if not inexact:  # integers and bool: in the default float dtype
            dtype = dtypes.get_default_dtype()
            a, b = (_host_array(x, dtype) for x in (a, b))
        rounded = _rounder(dtype)
        error = _abs(rounded(a - b))
        allowed = rounded(_abs(rounded(b * float(rtol))) + float(atol))
        return close | (np.isfinite(error) & (error <= allowed))


def _abs(values: np.ndarray) -> np.ndarray:
    """``|values|``; of complex numbers with C's ``hypot`` (correctly rounded), as torch's CPU kernel, where numpy's
    own complex absolute value is off by an ulp now and then."""
    return np.hypot(values.real, values.imag) if np.iscomplexobj(values) else np.abs(values)


def _host_array(values: np.ndarray, dtype: DType) -> np.ndarray:
    converted = values.astype(dtype.np)
    return converted.astype(np.float32) if dtype.itemsize < 4 else converted


def _python_number(value: np.ndarray, dtype: DType):
    if dtype is dtypes.bool_:
        return bool(value)
    if dtype.is_complex:
        return complex(value)
    return float(value) if dtype.is_floating_point else int(value)


def _tensor_mismatch_message(a: np.ndarray, b: np.ndarray, matches: np.ndarray, dtype: DType, rtol: float,
                             atol: float) -> str:
    total = matches.size
    mismatched = total - int(matches.sum())
    counts = f"Mismatched elements: {mismatched} / {total} ({mismatched / total:.1%})"
    if dtype.is_floating_point and dtype.itemsize == 1:
        first = tuple(int(i) for i in np.argwhere(~matches)[0])
        return f"Tensor-likes are not 'equal'!\n\n{counts}\nThe first mismatched element is at index {first}."
    shape = matches.shape
    a, b, matches = a.ravel(), b.ravel(), matches.ravel()
    if not (dtype.is_floating_point or dtype.is_complex):
        a, b = a.astype(np.int64), b.astype(np.int64)
    rounded = _rounder(dtype)
    with np.errstate(all="ignore"):
        abs_diff = _abs(rounded(a - b))
        abs_diff[matches] = 0
        if dtype.is_floating_point or dtype.is_complex:
            rel_diff = rounded(abs_diff / _abs(b))
        else:  # integer true division gives the default float dtype
            wide = dtypes.get_default_dtype()
            rel_diff = _rounder(wide)(_host_array(abs_diff, wide) / _host_array(np.abs(b), wide))
        rel_diff[matches] = 0
    abs_at, rel_at = int(np.argmax(abs_diff)), int(np.argmax(rel_diff))  # the first greatest; NaN counts greatest
    return _mismatch_message("Tensor-likes", counts, abs_diff=abs_diff[abs_at].item(),
                             abs_index=_unravel(abs_at, shape), atol=atol, rel_diff=rel_diff[rel_at].item(),
                             rel_index=_unravel(rel_at, shape), rtol=rtol)


def _unravel(flat: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(int(i) for i in np.unravel_index(flat, shape))


def _scalar_mismatch_message(actual, expected, rtol: float, atol: float) -> str:
    abs_diff = abs(actual - expected)
    rel_diff = float("inf") if expected == 0 else abs_diff / abs(expected)
    return _mismatch_message("Scalars", f"Expected {expected} but got {actual}.", abs_diff=abs_diff, abs_index=None,
                             atol=atol, rel_diff=rel_diff, rel_index=None, rtol=rtol)


def _mismatch_message(identifier: str, extra: str, *, abs_diff, abs_index, atol, rel_diff, rel_index, rtol) -> str:
    equality = rtol == 0 and atol == 0

    def line(kind: str, diff, index, tolerance) -> str:
        text = f"{kind.title()} difference: {diff}" if index is None else \
            f"Greatest {kind} difference: {diff} at index {index}"
        return text + ("" if equality else f" (up to {tolerance} allowed)") + "\n"

    message = f"{identifier} are not {'equal' if equality else 'close'}!\n\n{extra.strip()}\n"
    message += line("absolute", abs_diff, abs_index, atol) + line("relative", rel_diff, rel_index, rtol)
    return message.strip()

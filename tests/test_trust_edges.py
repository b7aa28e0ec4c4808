"""Operators on edge-case inputs, against torch, bit for bit: a table of calls run on every edge input of every
dtype in every layout (tests/edge_inputs.py), in tilewise and torch; results must have torch's dtypes, shapes
and values (NaN in the same places, -0.0 where torch gives -0.0), and a call torch refuses must raise the same
exception type. Calls whose float result torch itself computes in an unspecified order allow a few units in the
last place. Each family's test lists every mismatch at once.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import pytest
import torch
from edge_inputs import FLOATS, INTS, LAYOUTS, differences, edge_arrays, outcome, pair

import tilewise as tw

pytestmark = pytest.mark.filterwarnings("ignore")


def _dims(name: str, method_args=(), **kwargs):
    """A reduction called on the whole tensor, along dim 0 and -1, with and without keepdim."""
    def call(*dim_args, **dim_kwargs):
        return lambda m, x: getattr(x, name)(*method_args, *dim_args, **kwargs, **dim_kwargs)
    return {f"{name}": call(), f"{name}(0)": call(0), f"{name}(-1,keepdim)": call(-1, keepdim=True)}


def _along(name: str, *args, **kwargs):
    """A call that needs a dim: along 0 and -1 (as scans and sorts)."""
    return {f"{name}(0)": lambda m, x: getattr(x, name)(0, *args, **kwargs),
            f"{name}(-1)": lambda m, x: getattr(x, name)(-1, *args, **kwargs)}


class Case(NamedTuple):
    call: Callable
    dtypes: list
    ulps: int = 0  # units in the last place allowed, where torch's order of float operations is its own
    zero_sign: bool = True  # False where torch picks one of -0.0 and 0.0 (equal) by an undocumented order
    nan: bool = True  # False where torch's answer with a NaN depends on std::sort's order of incomparable values


def _add(table: dict, calls: dict, dtypes, ulps: int = 0, zero_sign: bool = True, nan: bool = True) -> None:
    for label, call in calls.items():
        table[label] = Case(call, dtypes, ulps, zero_sign, nan)


def _selection(name: str, *args, dim=None, keepdim=False):
    """A values-and-indices call whose index among equal values torch leaves open: its values, and the input's
    elements at its indices (which must equal the values)."""
    def call(m, x):
        values, indices = getattr(x, name)(*args, **({} if dim is None else {"dim": dim, "keepdim": keepdim}))
        if x.ndim == 0:
            return values, indices
        d = -1 if dim is None else dim
        picked = x.gather(d, indices if keepdim else indices.unsqueeze(d))
        return values, picked if keepdim else picked.squeeze(d)
    return call


REDUCTIONS: dict[str, Case] = {}
ALL = [*FLOATS, *INTS, "bool"]
NUMBERS = [*FLOATS, *INTS]
_add(REDUCTIONS, _dims("sum"), ALL, 1)
_add(REDUCTIONS, _dims("prod"), ALL, 1)
_add(REDUCTIONS, _dims("mean"), FLOATS, 1)
_add(REDUCTIONS, _dims("nansum"), NUMBERS, 1)
_add(REDUCTIONS, _dims("nanmean"), FLOATS, 1)
_add(REDUCTIONS, _dims("amax"), ALL, zero_sign=False)
_add(REDUCTIONS, _dims("amin"), ALL, zero_sign=False)
_add(REDUCTIONS, _dims("argmax"), ALL)
_add(REDUCTIONS, _dims("argmin"), ALL)
_add(REDUCTIONS, {"max": lambda m, x: x.max(), "min": lambda m, x: x.min()}, ALL, zero_sign=False)
_add(REDUCTIONS, _along("max"), ALL, zero_sign=False)
_add(REDUCTIONS, _along("min"), ALL, zero_sign=False)
_add(REDUCTIONS, {"aminmax": lambda m, x: m.aminmax(x), "aminmax(0)": lambda m, x: m.aminmax(x, dim=0)}, ALL,
     zero_sign=False)
for correction in (0, 1, 2):
    _add(REDUCTIONS, _dims("var", correction=correction), FLOATS, 2)
    _add(REDUCTIONS, _dims("std", correction=correction), FLOATS, 2)
_add(REDUCTIONS, {"logsumexp(0)": lambda m, x: x.logsumexp(0),
                  "logsumexp(-1,keepdim)": lambda m, x: x.logsumexp(-1, keepdim=True)}, NUMBERS, 2)
_add(REDUCTIONS, _dims("norm"), FLOATS, 2)
_add(REDUCTIONS, {"norm(inf)": lambda m, x: x.norm(float("inf")), "norm(1,0)": lambda m, x: x.norm(1, 0),
                  "norm(0)": lambda m, x: x.norm(0), "norm(-inf,-1)": lambda m, x: x.norm(float("-inf"), -1)},
     FLOATS, 2)
_add(REDUCTIONS, _along("cumsum"), ALL, 1)
_add(REDUCTIONS, _along("cumprod"), ALL, 1)
_add(REDUCTIONS, _along("cummax"), ALL)
_add(REDUCTIONS, _along("cummin"), ALL)
_add(REDUCTIONS, _along("logcumsumexp"), FLOATS, 2)
_add(REDUCTIONS, {"median": lambda m, x: x.median(), "nanmedian": lambda m, x: x.nanmedian(),
                  "median(0)": _selection("median", dim=0),
                  "median(-1,keepdim)": _selection("median", dim=-1, keepdim=True),
                  "nanmedian(0)": _selection("nanmedian", dim=0), "nanmedian(-1)": _selection("nanmedian", dim=-1),
                  "kthvalue(1)": _selection("kthvalue", 1), "kthvalue(2)": _selection("kthvalue", 2),
                  "kthvalue(2,0,keepdim)": _selection("kthvalue", 2, dim=0, keepdim=True),
                  "kthvalue(4,-1)": _selection("kthvalue", 4, dim=-1)}, NUMBERS, zero_sign=False)
_add(REDUCTIONS, {"mode": _selection("mode"), "mode(0)": _selection("mode", dim=0),
                  "mode(-1,keepdim)": _selection("mode", dim=-1, keepdim=True)}, ALL, zero_sign=False, nan=False)
_add(REDUCTIONS, {"quantile(0.3)": lambda m, x: x.quantile(0.3),
                  "quantile(0.5,-1)": lambda m, x: x.quantile(0.5, dim=-1),
                  "quantile([0,1],0,keepdim)": lambda m, x: x.quantile(m.tensor([0.0, 1.0], dtype=x.dtype), dim=0,
                                                                       keepdim=True),
                  "quantile(0.7,lower)": lambda m, x: x.quantile(0.7, dim=-1, interpolation="lower"),
                  "nanquantile(0.3)": lambda m, x: x.nanquantile(0.3),
                  "nanquantile(0.5,-1)": lambda m, x: x.nanquantile(0.5, dim=-1)}, ["float32", "float64"], 4)


def _unique_rebuilt(m, x):
    """unique's values and counts, and the input rebuilt from its inverse (which of several NaNs, each unique,
    an element maps to is torch's sort order's choice)."""
    values, inverse, counts = m.unique(x, return_inverse=True, return_counts=True)
    return values, values[inverse], counts


SORTING: dict[str, Case] = {}
_add(SORTING, {"sort": lambda m, x: x.sort(), "sort(0,desc)": lambda m, x: x.sort(0, descending=True),
               "sort(stable)": lambda m, x: x.sort(stable=True),
               "sort(stable,desc)": lambda m, x: x.sort(dim=0, descending=True, stable=True),
               "argsort(stable)": lambda m, x: x.argsort(stable=True),
               "argsort(desc,stable)": lambda m, x: x.argsort(dim=-1, descending=True, stable=True),
               "msort": lambda m, x: m.msort(x)}, ALL)
_add(SORTING, {"topk(1)": lambda m, x: x.topk(1)[0],
               "topk(2,0,smallest)": lambda m, x: x.topk(2, 0, largest=False)[0], "topk(0)": lambda m, x: x.topk(0)},
     NUMBERS, zero_sign=False)
_add(SORTING, {"unique": lambda m, x: m.unique(x), "unique(inverse,counts)": _unique_rebuilt,
    "unique_consecutive": lambda m, x: m.unique_consecutive(x, return_inverse=True, return_counts=True),
    "unique(unsorted)": lambda m, x: m.unique(x, sorted=False).sort()[0]}, ALL, zero_sign=False)
_add(SORTING, {"unique(0)": lambda m, x: m.unique(x, dim=0, return_inverse=True, return_counts=True)}, ALL,
     zero_sign=False, nan=False)
_add(SORTING, {"searchsorted": lambda m, x: m.searchsorted(x.flatten().sort()[0], x),
               "searchsorted(right)": lambda m, x: m.searchsorted(x.flatten().sort()[0], x, right=True),
               "bucketize": lambda m, x: m.bucketize(x, x.flatten().sort()[0]),
               "bucketize(right,int32)": lambda m, x: m.bucketize(x, x.flatten().sort()[0], right=True,
                                                                   out_int32=True)}, NUMBERS)


def _other(x):
    """A second operand for binary calls: the input reversed along its last dim."""
    return x.flip(-1) if x.ndim else x


INTEGER_ARITHMETIC: dict[str, Case] = {}
_add(INTEGER_ARITHMETIC, {
    "floor_divide": lambda m, x: m.floor_divide(x, _other(x)), "remainder": lambda m, x: m.remainder(x, _other(x)),
    "fmod": lambda m, x: m.fmod(x, _other(x)), "div": lambda m, x: m.div(x, _other(x)),
    "div(trunc)": lambda m, x: m.div(x, _other(x), rounding_mode="trunc"),
    "div(floor)": lambda m, x: m.div(x, _other(x), rounding_mode="floor"),
    "floor_divide(-1)": lambda m, x: m.floor_divide(x, -1), "remainder(-1)": lambda m, x: m.remainder(x, -1),
    "fmod(-3)": lambda m, x: m.fmod(x, -3), "remainder(3)": lambda m, x: m.remainder(x, 3),
    "div(7,floor)": lambda m, x: m.div(x, 7, rounding_mode="floor"),
    "div(-7,trunc)": lambda m, x: m.div(x, -7, rounding_mode="trunc"),
    "add": lambda m, x: x + _other(x), "sub": lambda m, x: x - _other(x), "mul": lambda m, x: x * _other(x),
    "mul(scalar)": lambda m, x: x * 3, "add(alpha)": lambda m, x: m.add(x, _other(x), alpha=2),
    "pow(2)": lambda m, x: x.pow(2), "pow(-1)": lambda m, x: x.pow(-1), "pow(-2)": lambda m, x: x.pow(-2),
    "pow(tensor)": lambda m, x: x.pow(_other(x)), "pow(0)": lambda m, x: x.pow(0),
    "rpow": lambda m, x: 2 ** x,
    "abs": lambda m, x: x.abs(), "neg": lambda m, x: -x, "sign": lambda m, x: x.sign(),
    "sgn": lambda m, x: x.sgn(), "square": lambda m, x: x.square(),
}, NUMBERS)
# a libm power: torch's vectorised one is not always correctly rounded
_add(INTEGER_ARITHMETIC, {"pow(-1.5)": lambda m, x: x.pow(-1.5)}, NUMBERS, 1)
_add(INTEGER_ARITHMETIC, {
    "lshift(1)": lambda m, x: x << 1, "rshift(1)": lambda m, x: x >> 1, "lshift(width)": lambda m, x: x << 64,
    "rshift(width)": lambda m, x: x >> 64, "lshift(8)": lambda m, x: x << 8, "rshift(8)": lambda m, x: x >> 8,
    "rshift(31)": lambda m, x: x >> 31, "lshift(33)": lambda m, x: x << 33, "lshift(-1)": lambda m, x: x << -1,
    "rshift(-1)": lambda m, x: x >> -1, "bitwise_not": lambda m, x: ~x,
    "bitwise_and": lambda m, x: x & _other(x), "bitwise_xor": lambda m, x: x ^ _other(x),
    "bitwise_left_shift": lambda m, x: m.bitwise_left_shift(x, 70),
}, [*INTS, "bool"])
_add(INTEGER_ARITHMETIC, {"lshift(tensor)": lambda m, x: x << _other(x).abs(),
                          "rshift(tensor)": lambda m, x: x >> _other(x).abs()}, INTS)
_add(INTEGER_ARITHMETIC, {
    "clamp(nan)": lambda m, x: x.clamp(min=float("nan")), "clamp(max=nan)": lambda m, x: x.clamp(max=float("nan")),
    "clamp(inverted)": lambda m, x: x.clamp(1, -1), "clamp(tensor inverted)": lambda m, x: m.clamp(
        x, m.ones_like(x), m.zeros_like(x)), "clamp(0,2)": lambda m, x: x.clamp(0, 2),
    "clamp(-inf,inf)": lambda m, x: x.clamp(float("-inf"), float("inf")),
    "clamp_min(tensor)": lambda m, x: x.clamp_min(_other(x)), "clamp(1.5)": lambda m, x: x.clamp(min=1.5),
}, NUMBERS, zero_sign=False)

COMPARISONS: dict[str, Case] = {}
_add(COMPARISONS, {
    "eq": lambda m, x: x == _other(x), "ne": lambda m, x: x != _other(x), "lt": lambda m, x: x < _other(x),
    "ge": lambda m, x: x >= _other(x), "eq(nan)": lambda m, x: x == float("nan"),
    "lt(inf)": lambda m, x: x < float("inf"),
    "eq(0.5)": lambda m, x: x == 0.5, "le(-1)": lambda m, x: x <= -1,

    "isclose": lambda m, x: m.isclose(x, _other(x)), "isclose(equal_nan)": lambda m, x: m.isclose(
        x, _other(x), equal_nan=True), "isclose(self,equal_nan)": lambda m, x: m.isclose(x, x, equal_nan=True),
    "isclose(self)": lambda m, x: m.isclose(x, x), "isclose(tol0)": lambda m, x: m.isclose(x, x, rtol=0, atol=0),
    "allclose(self)": lambda m, x: m.tensor(m.allclose(x, x)),
    "allclose(self,equal_nan)": lambda m, x: m.tensor(m.allclose(x, x, equal_nan=True)),
    "equal": lambda m, x: m.tensor(m.equal(x, x)), "isnan": lambda m, x: x.isnan(), "isinf": lambda m, x: x.isinf(),
    "isfinite": lambda m, x: x.isfinite(), "isposinf": lambda m, x: x.isposinf(), "signbit": lambda m, x: x.signbit(),
    "nan_to_num": lambda m, x: x.nan_to_num(), "nan_to_num(args)": lambda m, x: x.nan_to_num(1.0, 2.0, -3.0),
    "where": lambda m, x: m.where(x > 0, x, _other(x)), "copysign": lambda m, x: m.copysign(x, _other(x)),
}, ALL)
# torch refuses a bool tensor beside an integer past int64 (as uint64, which it does not promote)
_add(COMPARISONS, {"gt(2**63)": lambda m, x: x > 2**63}, NUMBERS)
_add(COMPARISONS, {"maximum": lambda m, x: m.maximum(x, _other(x)), "minimum": lambda m, x: m.minimum(x, _other(x)),
                   "fmax": lambda m, x: m.fmax(x, _other(x)), "fmin": lambda m, x: m.fmin(x, _other(x))}, ALL,
     zero_sign=False)

PROMOTION: dict[str, Case] = {}
_add(PROMOTION, {
    "add(0.1)": lambda m, x: x + 0.1, "sub(1/3)": lambda m, x: x - 1 / 3, "rsub(0.1)": lambda m, x: 0.1 - x,
    "mul(True)": lambda m, x: x * True, "add(70000)": lambda m, x: x + 70000, "mul(-3)": lambda m, x: x * -3,
    "div(3)": lambda m, x: x / 3, "div(0.1)": lambda m, x: x / 0.1, "add(2**40)": lambda m, x: x + 2**40,
    "eq(0.1)": lambda m, x: x == 0.1, "lt(1/3)": lambda m, x: x < 1 / 3, "ge(70000)": lambda m, x: x >= 70000,
    "ne(1e-8)": lambda m, x: x != 1e-8, "eq(0-d 0.1)": lambda m, x: x == m.tensor(0.1),
    "lt(0-d f64)": lambda m, x: x < m.tensor(1 / 3, dtype=m.float64),
    "add(0-d f64)": lambda m, x: x + m.tensor(1 / 3, dtype=m.float64),
    "mul(0-d i64)": lambda m, x: x * m.tensor(3), "add(0-d bool)": lambda m, x: x + m.tensor(True),
    "add(int32)": lambda m, x: x + _other(x).to(m.int32), "mul(float16)": lambda m, x: x * _other(x).to(m.float16),
    "sub(bfloat16)": lambda m, x: x.to(m.float16) - _other(x).to(m.bfloat16),
    "add(uint8,int8)": lambda m, x: x.to(m.uint8) + _other(x).to(m.int8),
    "where(0.1)": lambda m, x: m.where(x > 0, x, 0.1), "where(2)": lambda m, x: m.where(x > 0, 2, x),
    "maximum(0-d f64)": lambda m, x: m.maximum(x, m.tensor(0.1, dtype=m.float64)),
    "clamp(0.1,1/3)": lambda m, x: x.clamp(0.1, 1 / 3), "floor_divide(2.5)": lambda m, x: m.floor_divide(x, 2.5),
    "remainder(0.7)": lambda m, x: m.remainder(x, 0.7),
    "true_divide(int)": lambda m, x: m.true_divide(x, 2), "bool&int": lambda m, x: (x > 0) & m.tensor(3),
    "bool+bool": lambda m, x: (x > 0) + (x < 0), "add(alpha=2)": lambda m, x: m.add(x, 0.1, alpha=2),
}, ALL, 1)
# torch computes x ** 0.5 as sqrt(x) (nan at -inf, -0.0 at -0.0) for every dtype but float16, which takes C's pow
# (inf, 0.0); tilewise takes sqrt's answers throughout
_add(PROMOTION, {"pow(0.5)": lambda m, x: x.pow(0.5)}, [d for d in ALL if d != "float16"], 1)

CASTS: dict[str, Case] = {}
for _target in [*INTS, "bool", *FLOATS]:
    _add(CASTS, {f"to({_target})": lambda m, x, t=_target: x.to(getattr(m, t))}, ALL)
_add(CASTS, {"float()": lambda m, x: x.float(), "long()": lambda m, x: x.long(), "byte()": lambda m, x: x.byte(),
             "bool()": lambda m, x: x.bool(), "int()": lambda m, x: x.int(), "half()": lambda m, x: x.half(),
             "item": lambda m, x: m.tensor(x.flatten()[0].item()) if x.numel() else x}, ALL)


def mismatches(table: dict, layouts=tuple(LAYOUTS)) -> list[str]:
    """Every (call, dtype, input, layout) of ``table`` whose tilewise outcome differs from torch's."""
    found = []
    for label, case in table.items():
        for dtype in case.dtypes:
            for name, array in edge_arrays(dtype).items():
                if not case.nan and array.dtype.kind == "f" and np.isnan(array).any():
                    continue
                for layout in layouts:
                    ours, theirs = pair(array, dtype, layout)
                    expected = outcome(case.call, torch, theirs)
                    difference = differences(outcome(case.call, tw, ours), expected, case.ulps, case.zero_sign)
                    if difference:
                        found.append(f"{label} {dtype} {name} {layout}: {difference}")
    return found


FAMILIES = {"reductions": REDUCTIONS, "sorting": SORTING, "integers": INTEGER_ARITHMETIC,
            "comparisons": COMPARISONS, "promotion": PROMOTION, "casts": CASTS}


@pytest.mark.parametrize("family", FAMILIES)
def test_edge_inputs_match_torch(family):
    found = mismatches(FAMILIES[family])
    assert not found, f"{len(found)} mismatches:\n" + "\n".join(found[:200])


# calls whose C/CUDA helpers or lowering changed with the eager fixes: compiled (the C target here) as eager, on
# the rows of every edge pattern at once
COMPILED = {"sign": INTEGER_ARITHMETIC, "sgn": INTEGER_ARITHMETIC, "remainder": INTEGER_ARITHMETIC,
            "remainder(-1)": INTEGER_ARITHMETIC, "pow(tensor)": INTEGER_ARITHMETIC, "nan_to_num": COMPARISONS,
            "eq(0.1)": PROMOTION, "add(0.1)": PROMOTION, "add(70000)": PROMOTION, "clamp(0.1,1/3)": PROMOTION}


@pytest.mark.parametrize("label", COMPILED)
def test_compiled_pointwise_on_edge_inputs_matches_torch(label):
    case = COMPILED[label][label]
    compiled = tw.compile(lambda x: case.call(tw, x))
    found = []
    for dtype in sorted(set(case.dtypes) & {"float16", "float32", "float64", "uint8", "int8", "int16", "int64"}):
        ours, theirs = pair(edge_arrays(dtype)["matrix"], dtype)
        difference = differences(outcome(lambda m, x: compiled(x), tw, ours), outcome(case.call, torch, theirs),
                                 case.ulps, case.zero_sign)
        if difference:
            found.append(f"compiled {label} {dtype}: {difference}")
    assert not found, "\n".join(found)


def test_a_compiled_half_beside_a_number_past_its_range_is_inf_without_a_warning():
    x = tw.ones(3, dtype=tw.float16)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = tw.compile(lambda a: a + 70000)(x)
    assert out.tolist() == (torch.ones(3, dtype=torch.float16) + 70000).tolist() == [float("inf")] * 3


@pytest.mark.parametrize("dtype", ["uint8", "int8", "int16", "int32", "int64"])
def test_compiled_integer_arithmetic_wraps_python_numbers_past_the_range_as_torch(dtype):
    """A Python int beyond an integer tensor's range is wrapped into it (int8 + 70000 adds 112), as torch's eager
    and tilewise's eager do; the compiled kernels rendered it as a float that C saturated."""
    values = [1, 2, 255, 0] if dtype == "uint8" else [1, -2, 127, 0]
    calls = {"add 70000": lambda t: t + 70000, "mul 300": lambda t: t * 300, "sub 1000": lambda t: t - 1000,
             "add -200": lambda t: t + -200, "mul -3": lambda t: t * -3, "add 2**40": lambda t: t + 2**40,
             "remainder 300": lambda t: t % 300, "and 0x1ff": lambda t: t & 0x1FF, "eq 70000": lambda t: t == 70000}
    for name, call in calls.items():
        ours = tw.compile(call)(tw.tensor(values, dtype=getattr(tw, dtype)))
        theirs = call(torch.tensor(values, dtype=getattr(torch, dtype)))
        assert (str(ours.dtype).split(".")[-1], ours.tolist()) == (str(theirs.dtype).split(".")[-1],
                                                                    theirs.tolist()), name


if __name__ == "__main__":
    import sys

    for family in sys.argv[1:] or FAMILIES:
        for line in mismatches(FAMILIES[family]):
            print(line)

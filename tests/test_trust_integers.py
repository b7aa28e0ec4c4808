"""Integer semantics as torch's: division by zero raises on the CPU (eager and compiled), INT_MIN // -1 never
traps, and creating a tensor from a value its dtype cannot hold raises instead of wrapping.

Compiled integer division runs in a child process: a kernel that traps (SIGFPE) would otherwise end the
whole test run instead of failing one test.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from childenv import python_path

import tilewise as tw

INTS = ["uint8", "int8", "int16", "int32", "int64"]
SIGNED = ["int8", "int16", "int32", "int64"]
DIVISIONS = {
    "floor_divide": lambda m, a, b: m.floor_divide(a, b),
    "remainder": lambda m, a, b: m.remainder(a, b),
    "fmod": lambda m, a, b: m.fmod(a, b),
    "div_trunc": lambda m, a, b: m.div(a, b, rounding_mode="trunc"),
    "div_floor": lambda m, a, b: m.div(a, b, rounding_mode="floor"),
}
OPERATOR_NAME = {"floor_divide": "floor_divide", "remainder": "remainder", "fmod": "fmod", "div_trunc": "div",
                 "div_floor": "div"}


def both(dtype: str, values):
    return tw.tensor(values, dtype=getattr(tw, dtype)), torch.tensor(values, dtype=getattr(torch, dtype))


def wrapped(value: int, dtype: str) -> int:
    """``value`` in the two's complement range of ``dtype``."""
    info = np.iinfo(dtype)
    return (value - int(info.min)) % (1 << info.bits) + int(info.min)


def trunc_divided(a_values, b_values, dtype: str) -> list[int]:
    """Quotients rounded toward zero, wrapped to ``dtype``: torch's CPU trunc division traps on INT_MIN / -1
    for int32 and int64, so it cannot be the oracle there."""
    return [wrapped((abs(a) // abs(b)) * (1 if (a < 0) == (b < 0) else -1), dtype) for a, b in zip(a_values, b_values)]


def torch_error(fn):
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 — the oracle's exception, whatever it is
        return exc
    raise AssertionError("torch raised nothing")


# ---------------------------------------------------------------------------- eager division by zero

@pytest.mark.parametrize("dtype", INTS)
@pytest.mark.parametrize("op", DIVISIONS)
@pytest.mark.parametrize("divisor", ["tensor", "scalar", "0-dim"])
def test_integer_division_by_zero_raises_like_torch(op, dtype, divisor):
    a, ta = both(dtype, [5, 7, 0])
    if divisor == "tensor":
        b, tb = both(dtype, [1, 0, 2])
    elif divisor == "0-dim":
        b, tb = both(dtype, 0)
    else:
        b = tb = 0
    expected = torch_error(lambda: DIVISIONS[op](torch, ta, tb))
    assert type(expected) is RuntimeError and "ZeroDivisionError" in str(expected)
    with pytest.raises(RuntimeError, match=f"ZeroDivisionError: {OPERATOR_NAME[op]}: .*{dtype}"):
        DIVISIONS[op](tw, a, b)


@pytest.mark.parametrize("dtype", INTS)
@pytest.mark.parametrize("method", ["floor_divide_", "remainder_", "fmod_", "__ifloordiv__", "__imod__"])
def test_in_place_integer_division_by_zero_raises_like_torch(dtype, method):
    a, ta = both(dtype, [5, 7])
    b, tb = both(dtype, [0, 1])
    expected = torch_error(lambda: getattr(ta, method)(tb))
    assert "ZeroDivisionError" in str(expected)
    with pytest.raises(type(expected), match="ZeroDivisionError"):
        getattr(a, method)(b)


@pytest.mark.parametrize("dtype", INTS + ["bool"])
@pytest.mark.parametrize("op", ["__rfloordiv__", "__rmod__"])
def test_scalar_divided_by_integer_tensor_of_zeros_raises_like_torch(dtype, op):
    a, ta = both(dtype, [0, 1] if dtype != "bool" else [False, True])
    expected = torch_error(lambda: getattr(ta, op)(5))
    with pytest.raises(type(expected), match="ZeroDivisionError"):
        getattr(a, op)(5)


def test_remainder_of_bool_by_zero_raises_like_torch():
    a, ta = both("bool", [True, False])
    expected = torch_error(lambda: ta % 0)
    with pytest.raises(type(expected), match="ZeroDivisionError: remainder"):
        a % 0


@pytest.mark.parametrize("op", DIVISIONS)
def test_floating_division_by_zero_gives_inf_and_nan_like_torch(op):
    a, ta = both("float32", [5.0, -7.0, 0.0])
    b, tb = both("float32", [0.0, 0.0, 0.0])
    np.testing.assert_array_equal(DIVISIONS[op](tw, a, b).numpy(), DIVISIONS[op](torch, ta, tb).numpy())


def test_empty_integer_tensor_divided_by_zero_is_empty_like_torch():
    a, ta = both("int64", [])
    assert (a // 0).tolist() == (ta // 0).tolist() == []


# ---------------------------------------------------------------------------- eager values

@pytest.mark.parametrize("dtype", INTS)
@pytest.mark.parametrize("op", DIVISIONS)
def test_integer_division_values_match_torch(op, dtype):
    if dtype == "uint8":
        a_values, b_values = [0, 1, 7, 200, 255, 9], [1, 3, 2, 7, 255, 10]
    else:
        a_values, b_values = [-7, 7, -7, 7, 0, -1, 100, -100, 9, -9], [2, 2, -2, -2, 3, 5, -7, 7, 9, 9]
    a, ta = both(dtype, a_values)
    b, tb = both(dtype, b_values)
    assert DIVISIONS[op](tw, a, b).tolist() == DIVISIONS[op](torch, ta, tb).tolist()
    assert DIVISIONS[op](tw, a, -3 if dtype != "uint8" else 3).tolist() == \
        DIVISIONS[op](torch, ta, -3 if dtype != "uint8" else 3).tolist()
    assert DIVISIONS[op](tw, a, b).dtype.name == dtype


@pytest.mark.parametrize("dtype", SIGNED)
@pytest.mark.parametrize("op", DIVISIONS)
@pytest.mark.parametrize("divisor", ["tensor", "scalar"])
def test_int_min_divided_by_minus_one_wraps(op, dtype, divisor):
    """torch gives INT_MIN (quotients) and 0 (remainders) on the CPU and on CUDA."""
    lowest = torch.iinfo(getattr(torch, dtype)).min
    a, ta = both(dtype, [lowest, lowest + 1, 5])
    b, tb = both(dtype, [-1, -1, -1]) if divisor == "tensor" else (-1, -1)
    if op == "div_trunc":
        expected = trunc_divided([lowest, lowest + 1, 5], [-1] * 3, dtype)
    else:
        expected = DIVISIONS[op](torch, ta, tb).tolist()
    assert DIVISIONS[op](tw, a, b).tolist() == expected


def test_scalar_floor_divided_and_modulo_by_a_tensor_match_torch():
    a, ta = both("int64", [2, -3, 4])
    assert (7 // a).tolist() == (7 // ta).tolist()
    assert (7 % a).tolist() == (7 % ta).tolist()
    assert (-7.5 // a).tolist() == (-7.5 // ta).tolist()
    assert (7.5 % a).tolist() == (7.5 % ta).tolist()


# ---------------------------------------------------------------------------- compiled (in a child process)

COMPILED_SCRIPT = r"""
import json, sys
import tilewise as tw

DTYPES = ["uint8", "int8", "int16", "int32", "int64"]

def all_divisions(a, b):
    return (a // b, a % b, tw.fmod(a, b), tw.div(a, b, rounding_mode="trunc"), tw.div(a, b, rounding_mode="floor"))

def by_scalar(a):
    return (a // -1, a % -1, tw.fmod(a, -1), tw.div(a, -1, rounding_mode="trunc"), a // 3, a % 3)

results = {}
compiled, compiled_scalar = tw.compile(all_divisions), tw.compile(by_scalar)
for name in DTYPES:
    dtype = getattr(tw, name)
    lowest = tw.iinfo(dtype).min
    a = tw.tensor([lowest, lowest + 1, 7, 0, 9] if name != "uint8" else [0, 1, 7, 200, 255], dtype=dtype)
    b = tw.tensor([-1, -1, -2, 3, 4] if name != "uint8" else [1, 3, 2, 7, 255], dtype=dtype)
    results[name] = [t.tolist() for t in compiled(a, b)]
    if name != "uint8":
        results[name + "/scalar"] = [t.tolist() for t in compiled_scalar(a)]
    try:
        compiled(a, tw.zeros_like(b))
        results[name + "/zero"] = "no error"
    except RuntimeError as exc:
        results[name + "/zero"] = str(exc)
    results[name + "/after"] = [t.tolist() for t in compiled(a, b)]  # the flag was cleared

for op in ("floor_divide", "remainder", "fmod"):
    fn = tw.compile(lambda a, b, _op=op: getattr(tw, _op)(a, b) + 1)
    a = tw.arange(1, 100001, dtype=tw.int32)
    b = tw.ones(100000, dtype=tw.int32)
    b[54321] = 0
    try:
        fn(a, b)
        results["raises/" + op] = "no error"
    except RuntimeError as exc:
        results["raises/" + op] = str(exc)
print(json.dumps(results))
"""


@pytest.fixture(scope="module")
def compiled_results(tmp_path_factory):
    env = {**os.environ, "PYTHONPATH": python_path()}
    done = subprocess.run([sys.executable, "-c", COMPILED_SCRIPT], capture_output=True, text=True, env=env,
                          timeout=600)
    assert done.returncode == 0, f"compiled integer division ended the process (code {done.returncode}):\n" \
                                 f"{done.stderr[-3000:]}"
    return json.loads(done.stdout.splitlines()[-1])


def expected_divisions(dtype: str, a_values, b_values) -> list[list[int]]:
    ta, tb = torch.tensor(a_values, dtype=getattr(torch, dtype)), torch.tensor(b_values, dtype=getattr(torch, dtype))
    out = [DIVISIONS[op](torch, ta, tb).tolist() for op in ("floor_divide", "remainder", "fmod")]
    return out + [trunc_divided(a_values, b_values, dtype), DIVISIONS["div_floor"](torch, ta, tb).tolist()]


@pytest.mark.parametrize("dtype", INTS)
def test_compiled_integer_division_matches_torch_and_never_traps(compiled_results, dtype):
    lowest = torch.iinfo(getattr(torch, dtype)).min
    a = [lowest, lowest + 1, 7, 0, 9] if dtype != "uint8" else [0, 1, 7, 200, 255]
    b = [-1, -1, -2, 3, 4] if dtype != "uint8" else [1, 3, 2, 7, 255]
    expected = expected_divisions(dtype, a, b)
    assert compiled_results[dtype] == expected
    assert compiled_results[dtype + "/after"] == expected


@pytest.mark.parametrize("dtype", SIGNED)
def test_compiled_division_by_a_scalar_matches_torch(compiled_results, dtype):
    lowest = torch.iinfo(getattr(torch, dtype)).min
    ta = torch.tensor([lowest, lowest + 1, 7, 0, 9], dtype=getattr(torch, dtype))
    expected = [(ta // -1).tolist(), (ta % -1).tolist(), torch.fmod(ta, -1).tolist(), (ta // -1).tolist(),
                (ta // 3).tolist(), (ta % 3).tolist()]
    assert compiled_results[dtype + "/scalar"] == expected


@pytest.mark.parametrize("dtype", INTS)
def test_compiled_integer_division_by_zero_raises_like_eager(compiled_results, dtype):
    message = compiled_results[dtype + "/zero"]
    assert message.startswith("ZeroDivisionError: ") and dtype in message
    assert "floor_divide" in message  # every division of the kernel is named


@pytest.mark.parametrize("op", ["floor_divide", "remainder", "fmod"])
def test_compiled_division_by_one_zero_among_many_raises(compiled_results, op):
    assert compiled_results["raises/" + op].startswith(f"ZeroDivisionError: {op}: integer division by zero")


# ---------------------------------------------------------------------------- CUDA: torch's values, no trap

@pytest.mark.parametrize("dtype", ["int32", "int64"])
def test_cuda_integer_division_kernels_guard_their_divisors_and_compile(dtype):
    """The fused CUDA kernel's helpers test the divisor for 0 and -1 and set no flag (torch raises nothing on
    CUDA); NVRTC compiles them without a GPU."""
    from tilewise.codegen.toolchain import compile_cached, nvrtc_available
    from tilewise.compiler.capture import trace
    from tilewise.compiler.passes import run_pipeline
    from tilewise.compiler.program import lower_program
    from tilewise.compiler.targets import CUDA_TARGET

    def divisions(a, b):
        return a // b, a % b, tw.fmod(a, b), tw.div(a, b, rounding_mode="trunc")

    args = (tw.ones(64, dtype=getattr(tw, dtype)), tw.ones(64, dtype=getattr(tw, dtype)))
    low = lower_program(run_pipeline(trace(divisions, args, {}).graph), CUDA_TARGET)
    for helper in ("floordiv", "mod", "fmod", "truncdiv"):
        assert f"tw_{helper}_i{dtype[3:]}" in low.source
    assert low.source.count("if (b == 0)") == 4 and "b == -1" in low.source
    assert "tw_zero_division" not in low.source
    if not nvrtc_available():
        pytest.skip("NVRTC is not installed")
    for name, source in low.sources.items():
        compile_cached(source, name, "sm_90")


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", INTS)
@pytest.mark.parametrize("op", DIVISIONS)
def test_cuda_integer_division_matches_torch_and_never_traps(op, dtype):
    if dtype == "uint8":
        a_values, b_values = [0, 1, 7, 200, 255, 9], [1, 3, 2, 7, 255, 10]
    else:
        lowest = torch.iinfo(getattr(torch, dtype)).min
        a_values, b_values = [-7, 7, -7, 7, 0, lowest, lowest, 9], [2, 2, -2, -2, 3, -1, 7, 9]
    a, ta = both(dtype, a_values)
    b, tb = both(dtype, b_values)
    if op == "div_trunc":
        expected = trunc_divided(a_values, b_values, dtype)
    else:
        expected = DIVISIONS[op](torch, ta, tb).tolist()
    assert DIVISIONS[op](tw, a.cuda(), b.cuda()).cpu().tolist() == expected


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", INTS)
@pytest.mark.parametrize("op", DIVISIONS)
def test_cuda_integer_division_by_zero_returns_without_error(op, dtype):
    """torch raises nothing on CUDA (the quotient is unspecified there); the other elements stay right."""
    a, ta = both(dtype, [5, 7, 9])
    b, tb = both(dtype, [0, 2, 4])
    got = DIVISIONS[op](tw, a.cuda(), b.cuda()).cpu().tolist()
    assert got[1:] == DIVISIONS[op](torch, ta[1:], tb[1:]).tolist()


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", SIGNED)
def test_cuda_compiled_integer_division_never_traps(dtype):
    lowest = tw.iinfo(getattr(tw, dtype)).min
    a = tw.tensor([lowest, 7, 9, 5], dtype=getattr(tw, dtype), device="cuda")
    b = tw.tensor([-1, -2, 4, 0], dtype=getattr(tw, dtype), device="cuda")
    fn = tw.compile(lambda x, y: (x // y, x % y, tw.fmod(x, y), tw.div(x, y, rounding_mode="trunc")))
    floor, mod, fmod, trunc = (t.cpu().tolist()[:3] for t in fn(a, b))
    assert floor == [lowest, -4, 2] and mod == [0, -1, 1] and fmod == [0, 1, 1] and trunc == [lowest, -3, 2]

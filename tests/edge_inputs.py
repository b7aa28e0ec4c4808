"""Edge-case inputs and the bit-for-bit comparison of one call in tilewise and in torch.

``edge_arrays(dtype)`` gives named numpy arrays for a dtype: NaN and +-inf first, last and everywhere, -0.0,
subnormals, empty tensors (0 in any dim), 0-d tensors, integer minima and maxima, bool. ``LAYOUTS`` turn a
contiguous tensor into a transposed, a strided or an expanded (stride 0) view in either library. ``outcome``
runs a call and gives its results as numpy arrays, or the exception it raised; ``differences`` compares two
outcomes: the same exception type, or the same shapes, dtypes and values (NaN equal to NaN, -0.0 told from 0.0),
bit for bit unless the case allows some units in the last place.
"""

from __future__ import annotations

import numpy as np
import torch

import tilewise as tw

FLOATS = ["float16", "bfloat16", "float32", "float64"]
INTS = ["uint8", "int8", "int16", "int32", "int64"]
NAN, INF = float("nan"), float("inf")


def _float_rows(dtype: str) -> dict[str, list[float]]:
    tiny = float(torch.finfo(getattr(torch, dtype)).tiny)
    return {
        "nan_first": [NAN, 1.0, -2.0, 3.0],
        "nan_last": [1.0, -2.0, 3.0, NAN],
        "all_nan": [NAN, NAN, NAN, NAN],
        "inf_first": [INF, 1.0, -2.0, 0.0],
        "ninf_last": [1.0, -2.0, 0.0, -INF],
        "both_infs": [INF, -INF, 1.0, -INF],
        "signed_zeros": [-0.0, 0.0, -0.0, 0.0],
        "subnormals": [tiny / 2, -tiny / 4, tiny / 8, -0.0],
        "ties": [2.0, -1.0, 2.0, -1.0],
        "mixed": [NAN, -INF, -0.0, INF],
    }


def _int_rows(dtype: str) -> dict[str, list[int]]:
    info = np.iinfo(dtype)
    low, high = int(info.min), int(info.max)
    return {
        "extremes": [low, high, low, high],
        "near_extremes": [low + 1, high - 1, 0, 1] if low < 0 else [1, high - 1, 0, high],
        "minus_ones": [-1, low, -1, 0] if low < 0 else [0, 0, 2, 1],
        "ties": [3, 1, 3, 1],
    }


def edge_arrays(dtype: str) -> dict[str, np.ndarray]:
    """Named inputs of ``dtype`` (as float64 / int64 / bool numpy arrays, cast by ``pair``)."""
    if dtype == "bool":
        rows = {"mixed": [True, False, False, True], "all_true": [True] * 4, "all_false": [False] * 4}
        kind = np.bool_
    elif dtype in INTS:
        rows, kind = _int_rows(dtype), np.int64
    else:
        rows, kind = _float_rows(dtype), np.float64
    arrays = {name: np.asarray(row, dtype=kind) for name, row in rows.items()}
    arrays["matrix"] = np.stack([np.asarray(row, dtype=kind) for row in rows.values()])  # one row per pattern
    arrays["scalar"] = np.asarray(rows[next(iter(rows))][0], dtype=kind)
    arrays["scalar_last"] = np.asarray(rows[next(iter(rows))][-1], dtype=kind)
    for shape in [(0,), (0, 3), (3, 0), (2, 0, 3)]:
        arrays["empty" + "x".join(map(str, shape))] = np.zeros(shape, dtype=kind)
    return arrays


def transposed(t):
    return t.t() if t.ndim == 2 else t


def strided(t):
    return t[..., ::2] if t.ndim >= 1 else t


def expanded(t):
    return t.unsqueeze(0).expand(2, *t.shape) if t.ndim <= 2 else t


LAYOUTS = {"contiguous": lambda t: t, "transposed": transposed, "strided": strided, "expanded": expanded}


def pair(array: np.ndarray, dtype: str, layout: str = "contiguous"):
    """The same values as a tilewise tensor of ``dtype`` viewed in ``layout`` and a contiguous torch tensor (torch's
    answer does not depend on the layout, but some of its kernels read stride-0 inputs wrongly: median along an
    expanded dim gives values that are not in the input)."""
    view = LAYOUTS[layout]
    theirs = view(torch.tensor(array).to(getattr(torch, dtype))).contiguous()
    if theirs.is_floating_point():  # torch's float32 -> bfloat16 cast gives a NaN its sign bit: take it off
        theirs = torch.where(theirs.isnan(), theirs.abs(), theirs)
    ours = tw.tensor(array).to(getattr(tw, dtype))
    return view(ours), theirs


def _as_numpy(value):
    if isinstance(value, torch.Tensor):
        value = value.detach()
        if value.dtype == torch.bfloat16:
            return value.float().numpy(), "bfloat16"
        return value.numpy(), str(value.dtype).removeprefix("torch.")
    if isinstance(value, tw.Tensor):
        value = value.detach()
        name = value.dtype.name
        return (value.float() if name == "bfloat16" else value).numpy(), name
    return value, type(value).__name__


def _flatten(result) -> list:
    if isinstance(result, (tuple, list)):
        return [leaf for item in result for leaf in _flatten(item)]
    return [result]


def outcome(fn, lib, *args):
    """``fn(lib, *args)`` as a list of (numpy value, dtype name), or the exception it raised."""
    try:
        return [_as_numpy(v) for v in _flatten(fn(lib, *args))]
    except Exception as exc:  # noqa: BLE001 — any error is an outcome to compare
        return exc


def _ulp_close(a: np.ndarray, e: np.ndarray, ulps: int, dtype: str) -> bool:
    if ulps == 0 or a.dtype.kind not in "fc":
        return False
    eps = {"float16": 2.0**-10, "bfloat16": 2.0**-7, "float32": 2.0**-23, "float64": 2.0**-52}[dtype]
    a64, e64 = a.astype(np.float64), e.astype(np.float64)
    finite = np.isfinite(e64)
    if not np.array_equal(a64[~finite], e64[~finite], equal_nan=True) or not np.all(np.isfinite(a64[finite])):
        return False
    return bool(np.all(np.abs(a64[finite] - e64[finite]) <= ulps * eps * np.abs(e64[finite]) + 1e-300))


def differences(ours, theirs, ulps: int = 0, zero_sign: bool = True) -> str | None:
    """How ``ours`` differs from ``theirs`` (outcomes), or None. ``zero_sign=False`` takes -0.0 for 0.0 (where
    torch picks one of two equal values by an order it does not document)."""
    if isinstance(theirs, Exception):
        if not isinstance(ours, Exception):
            return f"torch raised {type(theirs).__name__}({str(theirs)[:120]!r}), tilewise did not"
        if not isinstance(ours, type(theirs)):
            return f"torch raised {type(theirs).__name__}, tilewise {type(ours).__name__}({str(ours)[:160]!r})"
        return None
    if isinstance(ours, Exception):
        return f"tilewise raised {type(ours).__name__}({str(ours)[:200]!r}), torch did not"
    if len(ours) != len(theirs):
        return f"{len(ours)} results, torch {len(theirs)}"
    for k, ((a, a_dtype), (e, e_dtype)) in enumerate(zip(ours, theirs)):
        a, e = np.asarray(a), np.asarray(e)
        if a_dtype != e_dtype:
            return f"result {k}: dtype {a_dtype}, torch {e_dtype}"
        if a.shape != e.shape:
            return f"result {k}: shape {a.shape}, torch {e.shape}"
        same = np.array_equal(a, e, equal_nan=a.dtype.kind in "fc")
        if same and a.dtype.kind == "f" and zero_sign:
            same = np.array_equal(np.signbit(a), np.signbit(e) & ~np.isnan(e) | np.signbit(a) & np.isnan(a))
        if not same and not _ulp_close(a, e, ulps, e_dtype):
            return f"result {k}: {a.tolist()} vs torch {e.tolist()}"
    return None

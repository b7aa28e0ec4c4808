"""NaN rules hold per row and per window, against torch: a NaN in one slice changes no other slice.

torch's rules: argmax/argmin and max.dim/min.dim pick each slice's first NaN, else its first extremum; amax/amin
and max()/min() are NaN where a NaN is; max pooling picks a window's *last* NaN, else its first maximum;
cummax/cummin take over at every NaN; sorting puts NaN above every number. Gradients follow torch's formulas at
NaN and at ties. Each rule is checked on random placements of NaN, +-inf and ties over several shapes, dims and
dtypes, in eager mode and through ``tilewise.compile``, on the CPU and (marked ``cuda``) on a GPU, where the
answers are compared with torch's CPU answers.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tilewise as tw
import tilewise.nn.functional as F

DTYPES = ["float16", "bfloat16", "float32", "float64"]
SHAPES = [(7,), (4, 6), (3, 4, 5), (2, 1, 6)]
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]


def specials(seed: int, shape: tuple, nan: float = 0.2, inf: float = 0.1) -> np.ndarray:
    """Small whole numbers (so ties are common) with NaN and +-inf at random places, as float64."""
    rng = np.random.default_rng(seed)
    values = rng.integers(-3, 4, size=shape).astype(np.float64)
    draw = rng.random(shape)
    values[draw < nan] = np.nan
    values[(draw >= nan) & (draw < nan + inf)] = np.inf
    values[(draw >= nan + inf / 2) & (draw < nan + inf)] = -np.inf
    return values


def one_nan_per_row(seed: int, shape: tuple) -> np.ndarray:
    """Distinct values; about half the innermost slices hold one NaN (for ops that leave tie order open)."""
    rng = np.random.default_rng(seed)
    rows = rng.permutation(int(np.prod(shape))).astype(np.float64).reshape(-1, shape[-1])
    chosen = np.flatnonzero(rng.random(rows.shape[0]) < 0.5)
    rows[chosen, rng.integers(0, shape[-1], chosen.size)] = np.nan
    return rows.reshape(shape)


def pair(a: np.ndarray, dtype: str, device: str = "cpu", requires_grad: bool = False):
    """The same values as a tilewise tensor (on ``device``) and a torch CPU tensor of ``dtype``."""
    ours = tw.tensor(a).to(getattr(tw, dtype))
    theirs = torch.tensor(a).to(getattr(torch, dtype))
    if requires_grad:
        ours, theirs = ours.detach().requires_grad_(), theirs.detach().requires_grad_()
    return (ours.to(device) if device != "cpu" else ours), theirs


def as_numpy(t) -> np.ndarray:
    if isinstance(t, torch.Tensor):
        t = t.detach()
        return (t.float() if t.dtype in (torch.bfloat16, torch.float16) else t).numpy()
    t = t.detach().cpu()
    return (t.float() if t.dtype in (tw.bfloat16, tw.float16) else t).numpy()


def assert_same(ours, theirs, what: str = "") -> None:
    """Equal shapes, dtypes and values (NaN equal to NaN), output by output."""
    ours = ours if isinstance(ours, (tuple, list)) else (ours,)
    theirs = theirs if isinstance(theirs, (tuple, list)) else (theirs,)
    assert len(ours) == len(theirs), what
    for a, e in zip(ours, theirs):
        assert tuple(a.shape) == tuple(e.shape), f"{what}: shape {tuple(a.shape)} != torch {tuple(e.shape)}"
        assert a.dtype.name == str(e.dtype).removeprefix("torch."), f"{what}: dtype {a.dtype} != torch {e.dtype}"
        np.testing.assert_array_equal(as_numpy(a), as_numpy(e), err_msg=what)


def dims_of(shape: tuple) -> list:
    return [None, *range(len(shape)), -1]


# ============================================================================ the reported cases

def test_a_nan_in_one_row_leaves_the_other_rows_argmax_alone():
    nan = float("nan")
    assert tw.tensor([[1., nan], [3., 4.]]).argmax(1).tolist() == torch.tensor([[1., nan], [3., 4.]]).argmax(1).tolist()
    assert tw.tensor([[1., nan], [3., 4.]]).argmax(1).tolist() == [1, 1]
    assert tw.tensor([[nan, 1.], [4., 3.]]).argmin(1).tolist() == [0, 1]


def test_a_nan_in_one_window_leaves_the_other_windows_alone():
    x = [[[[float("nan"), 1, 5, 8]]]]
    ours = F.max_pool2d(tw.tensor(x), (1, 2), return_indices=True)
    theirs = torch.nn.functional.max_pool2d(torch.tensor(x), (1, 2), return_indices=True)
    assert_same(ours, theirs)
    assert ours[0].tolist()[0][0][0][1] == 8.0


# ============================================================================ arg-reductions and max/min

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_arg_reductions_follow_the_nan_rule_per_slice(shape, dtype, device):
    for seed in range(3):
        ours, theirs = pair(specials(seed, shape), dtype, device)
        for op in ("argmax", "argmin"):
            for dim in dims_of(shape):
                for keepdim in (False, True):
                    assert_same(getattr(ours, op)(dim, keepdim), getattr(theirs, op)(dim, keepdim),
                                f"{op}(dim={dim}, keepdim={keepdim}) seed={seed}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_max_and_min_along_a_dim_follow_the_nan_rule_per_slice(shape, dtype, device):
    for seed in range(3):
        ours, theirs = pair(specials(seed, shape), dtype, device)
        for op in ("max", "min"):
            for dim in dims_of(shape)[1:]:
                for keepdim in (False, True):
                    assert_same(tuple(getattr(ours, op)(dim, keepdim)), tuple(getattr(theirs, op)(dim, keepdim)),
                                f"{op}(dim={dim}, keepdim={keepdim}) seed={seed}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_amax_amin_and_whole_tensor_extrema_propagate_nan_per_slice(shape, dtype, device):
    for seed in range(3):
        ours, theirs = pair(specials(seed, shape), dtype, device)
        for op in ("amax", "amin"):
            dims = [*dims_of(shape)[1:], tuple(range(len(shape))), *([(0, -1)] if len(shape) > 1 else [])]
            for dim in dims:
                for keepdim in (False, True):
                    assert_same(getattr(ours, op)(dim, keepdim), getattr(theirs, op)(dim, keepdim),
                                f"{op}(dim={dim}, keepdim={keepdim}) seed={seed}")
        for op in ("max", "min", "amax", "amin"):
            assert_same(getattr(ours, op)(), getattr(theirs, op)(), f"{op}() seed={seed}")


def _extrema(x):
    """Every NaN-sensitive reduction along the last dim and over everything, as a flat tuple."""
    values, indices = x.max(-1)
    low, low_at = x.min(0, keepdim=True)
    return (x.argmax(-1), x.argmin(0), x.argmax(), values, indices, low, low_at, x.amax(-1), x.amin((0, -1)),
            x.max(), x.min())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
@pytest.mark.parametrize("shape", [(4, 6), (3, 4, 5)], ids=str)
def test_compiled_extrema_follow_the_nan_rule_per_slice(shape, dtype, device):
    compiled = tw.compile(_extrema)
    for seed in range(3):
        ours, theirs = pair(specials(seed, shape), dtype, device)
        assert_same(compiled(ours), _extrema(theirs), f"compiled, seed={seed}")


# ============================================================================ gradients

def _grads(fn, *arrays, dtype="float64", device="cpu"):
    """The input gradients of ``fn(functional, *inputs)`` for both frameworks (``functional``: their
    ``nn.functional``), backpropagating the same whole-number output gradient (so sums round alike)."""
    ours, theirs = zip(*(pair(a, dtype, device, requires_grad=True) for a in arrays))
    out_tw, out_torch = fn(F, *ours), fn(torch.nn.functional, *theirs)
    g = np.random.default_rng(5).integers(-4, 5, tuple(out_torch.shape)).astype(np.float64)
    g_tw, g_torch = pair(g, dtype, device)
    return (tw.autograd.grad(out_tw, list(ours), g_tw), torch.autograd.grad(out_torch, list(theirs), g_torch))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", ["max", "min", "median"])
def test_whole_tensor_extremum_gradient_goes_to_the_nans_or_is_shared_by_ties(op, device):
    nan = float("nan")
    for a in ([[1., nan, 3., nan], [2., 5., 5., 1.]], [[1., 5., 3., 5.], [1., 1., 0., 1.]], [nan, 1.], [2., 2.],
              specials(0, (3, 5)), specials(1, (6,), nan=0.0)):
        ours, theirs = _grads(lambda _, x: getattr(x, op)(), np.asarray(a), device=device)
        assert_same(ours, theirs, f"{op}() of {a}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", ["amax", "amin"])
def test_amax_amin_gradient_is_nan_in_a_nan_slice_and_shared_by_ties_elsewhere(op, device):
    for seed in range(4):
        a = specials(seed, (4, 5), inf=0.0)
        for dim in (None, 1, (0, 1)):
            ours, theirs = _grads(lambda _, x, dim=dim: getattr(x, op)(dim), a, device=device)
            assert_same(ours, theirs, f"{op}(dim={dim}) seed={seed}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", ["max", "min"])
def test_max_min_along_a_dim_route_the_gradient_to_the_reported_index(op, device):
    for seed in range(4):
        a = specials(seed, (4, 5))
        for dim in (0, 1):
            ours, theirs = _grads(lambda _, x, dim=dim: getattr(x, op)(dim)[0], a, device=device)
            assert_same(ours, theirs, f"{op}(dim={dim}) seed={seed}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", ["maximum", "minimum"])
def test_maximum_minimum_give_the_whole_gradient_to_both_at_nan_and_half_at_a_tie(op, device):
    nan = float("nan")
    a, b = np.array([nan, 1., 2., nan, 3., 1.]), np.array([1., nan, 2., nan, 1., 3.])
    ours, theirs = _grads(lambda _, x, y: getattr(x, op)(y), a, b, device=device)
    assert_same(ours, theirs, f"{op}")
    for seed in range(3):
        a, b = specials(seed, (4, 5)), specials(seed + 10, (5,))
        ours, theirs = _grads(lambda _, x, y: getattr(x, op)(y), a, b, device=device)
        assert_same(ours, theirs, f"{op} broadcast seed={seed}")


def test_compiled_gradients_at_nan_match_torch():
    def loss(x):
        return x.max() + x.amax(1).sum() + x.max(0)[0].sum() + x.maximum(x.flip(1)).sum()

    compiled = tw.compile(lambda x: tw.autograd.grad(loss(x), x)[0])
    for seed in range(3):
        ours, theirs = pair(specials(seed, (4, 5), inf=0.0), "float32", requires_grad=True)
        assert_same(compiled(ours), torch.autograd.grad(loss(theirs), theirs)[0], f"seed={seed}")


# ============================================================================ max pooling

def _pool_cases(seed: int, count: int):
    """Random (shape, kernel, stride, padding, dilation, ceil_mode), every window reaching into the input."""
    rng = np.random.default_rng(seed)
    cases = []
    while len(cases) < count:
        size = tuple(int(v) for v in rng.integers(1, 8, 2))
        kernel = tuple(int(v) for v in rng.integers(1, 4, 2))
        dilation = tuple(int(v) for v in rng.integers(1, 3, 2))
        stride = tuple(int(v) for v in rng.integers(1, 3, 2))
        padding = tuple(int(rng.integers(0, (d * (k - 1) + 1) // 2 + 1)) for k, d in zip(kernel, dilation))
        ceil_mode = bool(rng.integers(0, 2))
        try:
            out = torch.nn.functional.max_pool2d(torch.zeros(1, 1, *size), kernel, stride, padding, dilation,
                                                 ceil_mode)
        except RuntimeError:
            continue
        if all(_every_window_reaches_in(n, o, k, s, p, d)
               for n, o, k, s, p, d in zip(size, out.shape[-2:], kernel, stride, padding, dilation)):
            cases.append((size, kernel, stride, padding, dilation, ceil_mode))
    return cases


def _every_window_reaches_in(size, out, kernel, stride, pad, dilation) -> bool:
    """torch reports a window with no element inside the input at a position outside its row (and its backward
    then writes out of bounds), so such windows are left out."""
    return all(any(0 <= o * stride - pad + j * dilation < size for j in range(kernel)) for o in range(out))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_max_pool2d_follows_the_nan_rule_per_window(dtype, device):
    for k, (size, kernel, stride, padding, dilation, ceil_mode) in enumerate(_pool_cases(0, 25)):
        a = specials(k, (2, 3, *size))
        ours, theirs = pair(a, dtype, device)
        args = (kernel, stride, padding, dilation, ceil_mode, True)
        assert_same(F.max_pool2d(ours, *args), torch.nn.functional.max_pool2d(theirs, *args), f"case {args}")


@pytest.mark.parametrize("device", DEVICES)
def test_max_pool2d_gradient_goes_where_the_index_points(device):
    for k, (size, kernel, stride, padding, dilation, ceil_mode) in enumerate(_pool_cases(1, 25)):
        args = (kernel, stride, padding, dilation, ceil_mode)
        ours, theirs = _grads(lambda functional, x, args=args: functional.max_pool2d(x, *args),
                              specials(k, (2, 2, *size)), device=device)
        assert_same(ours, theirs, f"case {args}")


def test_max_pool2d_picks_the_last_nan_and_the_first_inside_element_of_a_lowest_window():
    nan, inf = float("nan"), float("inf")
    for x, args in (([[[[nan, 1, nan, 8]]]], ((1, 4),)), ([[[[-inf, -inf, -inf], [-inf, -inf, -inf]]]], (2, 1, 1)),
                    ([[[[-inf, -inf, -inf], [-inf, -inf, -inf]]]], (2, 2, 1, 1, True)),
                    ([[[[-5, -3], [-4, -7]]]], (2, 1, 1))):
        ours = F.max_pool2d(tw.tensor(x), *args, return_indices=True)
        assert_same(ours, torch.nn.functional.max_pool2d(torch.tensor(x), *args, return_indices=True), f"{x} {args}")


@pytest.mark.parametrize("device", DEVICES)
def test_compiled_max_pool2d_follows_the_nan_rule(device):
    compiled = tw.compile(lambda x: F.max_pool2d(x, 3, 2, 1, return_indices=True))
    for seed in range(3):
        ours, theirs = pair(specials(seed, (2, 3, 7, 6)), "float32", device)
        expected = torch.nn.functional.max_pool2d(theirs, 3, 2, 1, return_indices=True)
        assert_same(compiled(ours), expected, f"seed={seed}")


# ============================================================================ running extrema

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_cummax_cummin_take_over_at_every_nan(shape, dtype, device):
    for seed in range(3):
        ours, theirs = pair(specials(seed, shape), dtype, device)
        for op in ("cummax", "cummin"):
            for dim in range(-1, len(shape)):
                assert_same(tuple(getattr(ours, op)(dim)), tuple(getattr(theirs, op)(dim)), f"{op}({dim}) {seed}")


@pytest.mark.parametrize("device", DEVICES)
def test_cummax_cummin_gradients_and_compiled_match_torch(device):
    def scans(x):
        return (*x.cummax(1), *x.cummin(0))

    compiled = tw.compile(scans)
    for seed in range(3):
        a = specials(seed, (4, 6))
        for op, dim in (("cummax", 1), ("cummin", 0)):
            ours, theirs = _grads(lambda _, x, op=op, dim=dim: getattr(x, op)(dim)[0], a, device=device)
            assert_same(ours, theirs, f"{op} gradient seed={seed}")
        ours, theirs = pair(a, "float32", device)
        assert_same(compiled(ours), scans(theirs), f"compiled seed={seed}")


# ============================================================================ sorting and what is built on it

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_sort_puts_nan_above_every_number(shape, dtype, device):
    for seed in range(3):
        ours, theirs = pair(specials(seed, shape), dtype, device)
        for dim in range(-1, len(shape)):
            for descending in (False, True):
                expected = theirs.sort(dim=dim, descending=descending, stable=True)
                assert_same(tuple(ours.sort(dim=dim, descending=descending, stable=True)), tuple(expected),
                            f"sort({dim}, {descending}) seed={seed}")
                assert_same(ours.argsort(dim=dim, descending=descending, stable=True),
                            theirs.argsort(dim=dim, descending=descending, stable=True), f"argsort seed={seed}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_topk_and_kthvalue_rank_nan_highest(dtype, device):
    """One NaN at most per slice: torch leaves the order among equal elements open for these two."""
    for seed in range(4):
        ours, theirs = pair(one_nan_per_row(seed, (5, 6)), dtype, device)
        for k in (1, 3, 6):
            for largest in (True, False):
                assert_same(tuple(ours.topk(k, -1, largest)), tuple(theirs.topk(k, -1, largest)),
                            f"topk({k}, largest={largest}) seed={seed}")
            assert_same(tuple(ours.kthvalue(k, 1)), tuple(theirs.kthvalue(k, 1)), f"kthvalue({k}) seed={seed}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_median_is_nan_at_the_first_nan_of_a_slice(shape, dtype, device):
    for seed in range(3):
        ours, theirs = pair(specials(seed, shape, inf=0.0), dtype, device)
        assert_same(ours.median(), theirs.median(), f"median() seed={seed}")
        for dim in range(-1, len(shape)):
            for keepdim in (False, True):
                got, expected = ours.median(dim, keepdim), theirs.median(dim, keepdim)
                assert_same(got[0], expected[0], f"median({dim}, {keepdim}) values seed={seed}")
                # a NaN median is found at the first NaN; among equal numbers torch leaves the index open,
                # so there it must only point at the median
                nan = np.isnan(as_numpy(expected[0]))
                np.testing.assert_array_equal(as_numpy(got[1])[nan], as_numpy(expected[1])[nan])
                values, indices = ours.median(dim, keepdim=True)
                assert_same(ours.gather(dim, indices), theirs.median(dim, keepdim=True)[0])


@pytest.mark.parametrize("device", DEVICES)
def test_sort_like_gradients_at_nan_match_torch(device):
    for seed in range(3):
        a = specials(seed, (4, 5), inf=0.0)
        b = one_nan_per_row(seed, (4, 5))
        for name, fn, x in (("sort", lambda t: t.sort(dim=1, stable=True)[0], a),
                            ("median.dim", lambda t: t.median(1)[0], a),
                            ("topk", lambda t: t.topk(2, 1)[0], b), ("kthvalue", lambda t: t.kthvalue(3, 1)[0], b)):
            if name == "median.dim":
                x = np.where(np.isnan(x).any(1, keepdims=True), x, one_nan_per_row(seed, (4, 5)))
            ours, theirs = _grads(lambda _, t, fn=fn: fn(t), x, device=device)
            assert_same(ours, theirs, f"{name} seed={seed}")


# Masked gradients: torch selects (``self <= threshold ? 0 : grad``), it does not multiply by a mask, so an infinite
# or NaN gradient where the mask is off gives 0, not NaN, and a NaN input passes the gradient where the comparison
# that would stop it is false. Boundary values (the thresholds themselves) are in every input.
_BOUNDARIES = np.array([np.nan, -np.inf, -7.0, -5.0, -3.0, -1.0, -0.5, 0.0, 0.5, 1.0, 2.0, 3.0, 6.0, 7.0, np.inf])
_MASKED = {
    "relu": lambda lib, x: lib.nn.functional.relu(x),
    "relu_inplace": lambda lib, x: lib.nn.functional.relu(x * 1, inplace=True),
    "relu6": lambda lib, x: lib.nn.functional.relu6(x),
    "hardtanh": lambda lib, x: lib.nn.functional.hardtanh(x),
    "hardtanh_wide": lambda lib, x: lib.nn.functional.hardtanh(x, -3.0, 6.0),
    "threshold": lambda lib, x: lib.nn.functional.threshold(x, 0.5, -2.0),
    "hardsigmoid": lambda lib, x: lib.nn.functional.hardsigmoid(x),
    "hardswish": lambda lib, x: lib.nn.functional.hardswish(x),
    "clamp": lambda lib, x: x.clamp(-1.0, 3.0),
    "clamp_min": lambda lib, x: x.clamp(min=0.0),
    "clamp_max": lambda lib, x: x.clamp(max=0.5),
    "leaky_relu": lambda lib, x: lib.nn.functional.leaky_relu(x, 0.1),
}


def _masked_gradient(lib, name: str, x, g):
    y = _MASKED[name](lib, x)
    return lib.autograd.grad(y, x, g)[0]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("grads", ["finite", "inf", "nan"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("name", sorted(_MASKED))
def test_masked_activation_gradients_select_as_torch_does(name, dtype, grads, device):
    rng = np.random.default_rng(len(name))
    g = {"finite": rng.integers(1, 5, size=_BOUNDARIES.shape).astype(np.float64),
         "inf": np.full(_BOUNDARIES.shape, np.inf), "nan": np.full(_BOUNDARIES.shape, np.nan)}[grads]
    ours, theirs = pair(_BOUNDARIES, dtype, device, requires_grad=True)
    g_ours, g_theirs = pair(g, dtype, device)
    expected = _masked_gradient(torch, name, theirs, g_theirs)
    assert_same(_masked_gradient(tw, name, ours, g_ours), expected, f"{name} eager")
    compiled = tw.compile(lambda x, g: _masked_gradient(tw, name, x, g))
    assert_same(compiled(ours, g_ours), expected, f"{name} compiled")


@pytest.mark.parametrize("device", DEVICES)
def test_clamp_by_tensors_and_fmax_fmin_gradients_select_as_torch_does(device):
    b = np.array([1.0, np.nan, 0, 0, 0, 0, np.nan, 0, 0, -1, 3, 5, 0, 0, 0])
    for grads in (np.full(_BOUNDARIES.shape, np.inf), np.arange(1.0, 16.0)):
        for fn in (lambda lib, a, b: lib.fmax(a, b), lambda lib, a, b: lib.fmin(a, b),
                   lambda lib, a, b: a.clamp(b - 2, b + 2), lambda lib, a, b: a.clamp(min=b),
                   lambda lib, a, b: a.clamp(max=b)):
            a_ours, a_theirs = pair(_BOUNDARIES, "float32", device, requires_grad=True)
            b_ours, b_theirs = pair(b, "float32", device, requires_grad=True)
            g_ours, g_theirs = pair(grads, "float32", device)
            expected = torch.autograd.grad(fn(torch, a_theirs, b_theirs), (a_theirs, b_theirs), g_theirs)
            got = tw.autograd.grad(fn(tw, a_ours, b_ours), (a_ours, b_ours), g_ours)
            for e, o in zip(expected, got):
                assert_same(o, e, "tensor bounds")

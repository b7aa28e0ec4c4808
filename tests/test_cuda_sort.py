"""sort, argsort, topk, cummax and cummin on a GPU, against torch's CPU results.

Inputs are made in torch (ties, NaN, infinities and signed zeros included), copied into tilewise tensors on
the device, and the results copied back. sort and argsort must equal torch's *stable* sort exactly (values
and indices); topk's values must equal torch's, and its indices are the first k of the stable sort (torch
leaves the order of ties to the implementation); cummax/cummin must equal torch exactly, indices included.
Lengths cross the kernels' boundaries: one block per row up to 4096 elements, the radix sort beyond (tiles of
4096 keys, 2048 for 8-byte keys; a pass per key byte; rows whose keys share a pass's digit); topk's selection
passes (runs of up to 256, chunks of 4096, candidates selected again), radix select (8 <= k <= 4096 in rows
over 4096) and the full sort beyond; cummax/cummin's warp per row and their segmented scan (segments of 2048,
few rows, many segments per row).
"""

from __future__ import annotations

import numpy as np
import pytest

import tilewise as tw

pytestmark = pytest.mark.cuda

torch = pytest.importorskip("torch")

LENGTHS = (1, 7, 32, 1000, 4096, 5000, 70000)
FLOATS = ("float32", "float64", "float16", "bfloat16")
INTS = ("int64", "int32", "int16", "int8", "uint8")
DTYPES = (*FLOATS, *INTS, "bool")


def _input(shape, dtype: str, seed: int = 0, special: bool = True) -> torch.Tensor:
    """A CPU torch tensor with many ties; floats also hold NaN, +-inf and -0.0 when ``special``."""
    rng = np.random.default_rng(seed)
    n = int(np.prod(shape))
    if dtype == "bool":
        return torch.from_numpy(rng.integers(0, 2, n).astype(bool)).reshape(shape)
    if dtype in INTS:
        info = np.iinfo(dtype)
        values = rng.integers(-20, 21, n)
        values[rng.random(n) < 0.05] = info.min  # the extremes of the range sort like any other value
        values[rng.random(n) < 0.05] = info.max
        return torch.from_numpy(np.clip(values, info.min, info.max).astype(dtype)).reshape(shape)
    values = np.round(rng.standard_normal(n) * 4, 1)  # one decimal: plenty of ties, exact in every float type
    values += 0.0  # rounding made some -0.0: only ``special`` inputs have them, where their order is defined
    if special:
        for value, share in ((np.nan, 0.03), (np.inf, 0.02), (-np.inf, 0.02), (-0.0, 0.03), (0.0, 0.03)):
            values[rng.random(n) < share] = value
    return torch.from_numpy(values).reshape(shape).to(getattr(torch, dtype))


def _device(t: torch.Tensor) -> tw.Tensor:
    """The same values in a tilewise CUDA tensor (bfloat16 through float32, which holds it exactly)."""
    if t.dtype == torch.bfloat16:
        return tw.from_numpy(t.float().numpy()).to(tw.bfloat16).cuda()
    return tw.from_numpy(t.numpy().copy()).cuda()


def _host(x: tw.Tensor) -> torch.Tensor:
    if x.dtype == tw.bfloat16:
        return torch.from_numpy(x.float().cpu().numpy()).bfloat16()
    return torch.from_numpy(x.cpu().numpy().copy())  # a copy: numpy views may have negative strides


def _same(ours: tw.Tensor, expected: torch.Tensor, signs: bool = True) -> None:
    got = _host(ours)
    assert tuple(got.shape) == tuple(expected.shape)
    assert got.dtype == expected.dtype
    torch.testing.assert_close(got, expected, rtol=0, atol=0, equal_nan=True)
    if signs and expected.is_floating_point():  # the elements themselves come out: zeros keep their sign
        numbers = ~expected.isnan()
        assert torch.equal(torch.signbit(got[numbers]), torch.signbit(expected[numbers]))


def _check_sort(t: torch.Tensor, dim: int, descending: bool, x: tw.Tensor | None = None) -> None:
    x = _device(t) if x is None else x
    values, indices = x.sort(dim=dim, descending=descending, stable=True)
    ref = t.sort(dim=dim, descending=descending, stable=True)
    _same(values, ref.values)
    _same(indices, ref.indices)


# ---------------------------------------------------------------------------------------------- sort

@pytest.mark.parametrize("descending", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", LENGTHS)
def test_sort_matches_torch_stable_sort(n, dtype, descending):
    rows = 3 if n >= 4096 else 5
    _check_sort(_input((rows, n), dtype, seed=n), -1, descending)


@pytest.mark.parametrize("n", [2, 3, 4095, 4097, 8192, 8193, 16385, 131072, 140000])
def test_sort_lengths_around_the_chunk_boundaries(n):
    for descending in (False, True):
        _check_sort(_input((2, n), "float32", seed=n), 1, descending)


def test_sort_long_rows_in_eight_byte_keys():
    _check_sort(_input((2, 70000), "float64", seed=3), 1, True)
    _check_sort(_input((2, 70000), "int64", seed=4), 1, False)


def test_sort_one_long_row_of_distinct_values():
    t = torch.from_numpy(np.random.default_rng(5).permutation(300000).astype(np.float32))
    _check_sort(t, 0, False)
    _check_sort(t, 0, True)


def test_sort_many_short_rows():
    _check_sort(_input((20000, 13), "float32", seed=6), 1, False)


# ---------------------------------------------------------------------------------------------- radix sort

@pytest.mark.parametrize("dtype", DTYPES)
def test_radix_sort_many_rows_of_several_tiles(dtype):
    """Every dtype's key width (one pass per byte), both directions, rows of many tiles with a short last one."""
    t = _input((64, 9000), dtype, seed=40)
    x = _device(t)
    for descending in (False, True):
        _check_sort(t, 1, descending, x)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int64", "int8"])
def test_radix_sort_one_long_row(dtype):
    """One row of many tiles: each tile adds up the counts of every earlier tile of the row (look-back)."""
    t = _input((1, 1 << 21), dtype, seed=41)
    x = _device(t)
    for descending in (False, True):
        _check_sort(t, 1, descending, x)


def test_radix_sort_several_long_rows():
    t = _input((8, 1 << 18), "float32", seed=42)
    _check_sort(t, 1, False)
    _check_sort(t.to(torch.float16), 1, True)


def test_radix_sort_rows_whose_keys_share_digits():
    """Passes in which every key of a row has the same digit keep the row's order; other rows of the same sort
    still move."""
    rng = np.random.default_rng(43)
    small = torch.from_numpy(rng.integers(0, 1000, (3, 20000)))  # int64: the six high bytes never differ
    small[1] = 7  # one value: no pass moves anything
    small[2, ::3] = -(1 << 40)  # this row's high bytes differ
    for descending in (False, True):
        _check_sort(small, 1, descending)
        _check_sort(small.int(), 1, descending)
    zeros = torch.zeros(2, 9000)
    zeros[0, ::2] = -0.0  # equal keys: the order of the input, signs kept
    _check_sort(zeros, 1, False)
    nans = torch.full((2, 9000), float("nan"))
    nans[1, 100:200] = 1.0
    _check_sort(nans, 1, True)


def test_radix_sort_distinct_values_and_lengths_around_tiles():
    for n in (4097, 6143, 6144, 6145, 8191, 8192, 8193, 12289):
        t = torch.from_numpy(np.random.default_rng(n).permutation(3 * n).astype(np.float64).reshape(3, n))
        _check_sort(t, 1, n % 2 == 1)  # 8-byte keys: tiles of 2048
        _check_sort(t.float(), 1, n % 2 == 0)  # tiles of 4096


def test_radix_sort_any_dim_and_noncontiguous():
    t = _input((5, 9000, 3), "float32", seed=44)
    x = _device(t)
    _check_sort(t, 1, False, x)  # rows of stride 3, in a 2-dim geometry
    _check_sort(t.transpose(0, 2), 1, True, x.transpose(0, 2))
    _check_sort(t[::2, ::2, 1], 1, False, x[::2, ::2, 1])
    wide = _input((9000, 6), "int16", seed=45)
    _check_sort(wide, 0, True)


@pytest.mark.parametrize("n", [1000, 9000])
@pytest.mark.parametrize("dtype", ["float8_e4m3fn", "float8_e5m2"])
def test_sort_float8(dtype, n):
    """One-byte float keys (one radix pass), checked on the float32 values the float8 elements hold."""
    t = _input((3, n), "float32", seed=46)
    x = _device(t).to(getattr(tw, dtype))
    held = _host(x.float())
    for descending in (False, True):
        values, indices = x.sort(dim=1, descending=descending, stable=True)
        ref = held.sort(dim=1, descending=descending, stable=True)
        _same(values.float(), ref.values)
        _same(indices, ref.indices)


def test_radix_sort_values_ties_keep_their_bits():
    """Zeros and NaNs are read back from the input (their keys stand for several bit patterns): -0.0 and 0.0
    come out with their signs, in index order."""
    t = torch.zeros(4, 12000, dtype=torch.float32)
    t[:, ::3] = -0.0
    t[:, 1::7] = float("nan")
    t[:, 2::11] = -float("inf")
    for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
        for descending in (False, True):
            _check_sort(t.to(dtype), 1, descending)


@pytest.mark.parametrize("dim", [0, 1, 2, -1, -3])
def test_sort_any_dim(dim):
    for descending in (False, True):
        _check_sort(_input((6, 33, 10), "float32", seed=dim + 7), dim, descending)


def test_sort_noncontiguous_inputs():
    t = _input((40, 50, 6), "float32", seed=8)
    x = _device(t)
    views = [lambda a: a.transpose(0, 2), lambda a: a[::2, 1::3], lambda a: a.permute(1, 2, 0)[:, :, 3:]]
    for view in views:
        for dim in (0, 1, 2):
            _check_sort(view(t), dim, dim == 1, view(x))
    long_t = _input((70000, 3), "float16", seed=9)
    long_x = _device(long_t)
    _check_sort(long_t[:, 1], 0, False, long_x[:, 1])  # one long strided row


def test_sort_0_dim_and_empty():
    for shape, dim in (((), 0), ((), -1), ((0, 5), 0), ((0, 5), 1), ((3, 0), 1), ((3, 0), 0)):
        t = _input(shape, "float32", seed=10) if shape else torch.tensor(2.5)
        _check_sort(t, dim, False)
        _check_sort(t, dim, True)


def test_argsort_kthvalue_median_over_the_device_sort():
    t = _input((4, 5000), "float32", seed=11, special=False)
    x = _device(t)
    _same(x.argsort(-1, descending=True, stable=True), t.argsort(dim=-1, descending=True, stable=True))
    for k in (1, 17, 5000):
        ours, ref = x.kthvalue(k, 1), t.kthvalue(k, 1)
        _same(ours[0], ref.values)
        torch.testing.assert_close(t.gather(1, _host(ours[1]).unsqueeze(1)).squeeze(1), ref.values, rtol=0, atol=0)
    _same(x.median(1)[0], t.median(1).values)
    _same(x.median(), t.median())


# ---------------------------------------------------------------------------------------------- topk

@pytest.mark.parametrize("largest", [True, False])
@pytest.mark.parametrize("dtype", [*FLOATS, "int64", "int32", "int8", "uint8"])
@pytest.mark.parametrize("n", [1, 7, 1000, 5000, 70000])
def test_topk_matches_torch(n, dtype, largest):
    t = _input((3, n), dtype, seed=n + 1)
    x = _device(t)
    for k in sorted({1, min(5, n), n // 2, n}):
        values, indices = x.topk(k, -1, largest=largest)
        _same(values, t.topk(k, -1, largest=largest).values, signs=False)  # which of -0.0 and 0.0: either
        first_k = t.sort(dim=-1, descending=largest, stable=True)
        _same(values, first_k.values[:, :k])
        _same(indices, first_k.indices[:, :k])  # ties: the lowest index first


def test_topk_any_dim_noncontiguous_and_edge_cases():
    t = _input((30, 8, 41), "float32", seed=12)
    x = _device(t)
    for dim in (0, 1, 2):
        for view_t, view_x in ((t, x), (t.transpose(0, 2), x.transpose(0, 2)), (t[::3, 1:], x[::3, 1:])):
            k = min(4, view_t.shape[dim])
            values, indices = view_x.topk(k, dim)
            _same(values, view_t.topk(k, dim).values, signs=False)
            _same(indices, view_t.sort(dim=dim, descending=True, stable=True).indices.narrow(dim, 0, k))
    scalar = _device(torch.tensor(1.5))
    for k in (0, 1):
        values, indices = scalar.topk(k)
        _same(values, torch.tensor(1.5).topk(k).values)
        _same(indices, torch.tensor(1.5).topk(k).indices)
    values, indices = x.topk(0, 1)
    assert tuple(values.shape) == (30, 0, 41) and tuple(indices.shape) == (30, 0, 41)
    with pytest.raises(RuntimeError, match="out of range"):
        x.topk(9, 1)


def _check_topk(t: torch.Tensor, k: int, dim: int, largest: bool, x: tw.Tensor | None = None) -> None:
    """topk equals the first k of the stable sort, values and indices (so torch's values too)."""
    x = _device(t) if x is None else x
    values, indices = x.topk(k, dim, largest=largest)
    first_k = t.sort(dim=dim, descending=largest, stable=True)
    _same(values, first_k.values.narrow(dim, 0, k))
    _same(indices, first_k.indices.narrow(dim, 0, k))


@pytest.mark.parametrize("n", [4095, 4096, 4097, 8192, 8193, 70000])
def test_topk_selection_around_runs_and_chunks(n):
    """k around the run lengths (powers of two up to 1024, the full sort beyond) on rows around the chunk."""
    t = _input((3, n), "float32", seed=n + 20)
    x = _device(t)
    for k in (1, 2, 31, 32, 33, 255, 256, 257, 1023, 1024, 1025, 2048):
        for largest in (True, False):
            _check_topk(t, k, 1, largest, x)


@pytest.mark.parametrize("dtype", [*FLOATS, "int64", "int32", "int8", "uint8"])
def test_topk_selection_dtypes_and_multiple_passes(dtype):
    """Long rows: the bitonic selection's candidates take two passes (k < 8), and radix select (up to 4096)."""
    t = _input((2, 300000), dtype, seed=21)
    x = _device(t)
    for k in (1, 5, 8, 16, 200, 600, 4096):
        _check_topk(t, k, 1, True, x)
        _check_topk(t, k, 1, False, x)


def test_topk_selection_ties_nan_and_distinct_values():
    ties = torch.from_numpy(np.random.default_rng(22).integers(0, 3, (4, 50000)).astype(np.float32))
    ties[1, 7000::9000] = float("nan")
    ties[2] = 1.0  # one value: the lowest indices win
    for k in (1, 100, 1000):
        for largest in (True, False):
            _check_topk(ties, k, 1, largest)
    distinct = torch.from_numpy(np.random.default_rng(23).permutation(1 << 20).astype(np.float32).reshape(8, -1))
    for k in (1, 16, 256):
        _check_topk(distinct, k, 1, True)


@pytest.mark.parametrize("dtype", ["bool", "int8", "int16", "float64", "bfloat16"])
def test_topk_radix_select_ties_decided_by_the_index(dtype):
    """Many equal keys: the digits of the index decide which of them are taken (the lowest indices)."""
    t = _input((3, 70000), dtype, seed=26, special=False)
    x = _device(t)
    for k in (8, 100, 3000, 4096, 4097):
        for largest in (True, False):
            _check_topk(t, k, 1, largest, x)
    same = _device(torch.zeros(2, 9000, dtype=getattr(torch, dtype)))
    _check_topk(torch.zeros(2, 9000, dtype=getattr(torch, dtype)), 300, 1, True, same)


def test_topk_selection_any_dim_noncontiguous_and_unsorted():
    t = _input((9000, 3, 4), "float32", seed=24)
    x = _device(t)
    for k in (1, 40, 500):
        _check_topk(t, k, 0, True, x)
        _check_topk(t.transpose(0, 2), k, 2, False, x.transpose(0, 2))
        _check_topk(t[::2, 1], k, 0, True, x[::2, 1])
    long_t = _input((2, 9000, 3), "bfloat16", seed=25)
    _check_topk(long_t, 77, 1, True, _device(long_t))
    values, indices = x.topk(40, 0, sorted=False)  # torch leaves the order open: the same set of elements
    first_k = t.sort(dim=0, descending=True, stable=True).indices[:40]
    torch.testing.assert_close(_host(indices).sort(dim=0).values, first_k.sort(dim=0).values, rtol=0, atol=0)
    torch.testing.assert_close(_host(values), t.gather(0, _host(indices)), rtol=0, atol=0, equal_nan=True)


# ---------------------------------------------------------------------------------------------- cummax, cummin

def _same_running(op: str, x, t: torch.Tensor, dim: int) -> None:
    """``op`` (cummax or cummin) along ``dim`` of our ``x`` gives torch's values and indices on ``t``."""
    values, indices = getattr(x, op)(dim)
    ref = getattr(t, op)(dim)
    _same(values, ref.values)
    _same(indices, ref.indices)


@pytest.mark.parametrize("op", ["cummax", "cummin"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1, 7, 32, 33, 1000, 5000, 70000])
def test_running_extremes_match_torch(n, dtype, op):
    t = _input((3, n), dtype, seed=n + 2)
    _same_running(op, _device(t), t, 1)


@pytest.mark.parametrize("op", ["cummax", "cummin"])
def test_running_extremes_any_dim_noncontiguous_0_dim_empty(op):
    t = _input((9, 40, 7), "float32", seed=13)
    x = _device(t)
    for view_t, view_x in ((t, x), (t.permute(2, 0, 1), x.permute(2, 0, 1)), (t[::2, ::3], x[::2, ::3])):
        for dim in (0, 1, 2, -1):
            _same_running(op, view_x, view_t, dim)
    for t in (torch.tensor(-2.0), torch.zeros(0, 4), torch.zeros(4, 0)):
        _same_running(op, _device(t), t, 0)


def _long_row(n: int, dtype: str, seed: int) -> torch.Tensor:
    """One row of ``n`` with ties and signed zeros, and a single NaN late enough that most prefixes have none."""
    t = _input((1, n), dtype, seed=seed, special=False)
    if t.is_floating_point():
        t[0, n // 3::5] = -0.0
        t[0, n // 3 + 1::7] = 0.0
        t[0, n - n // 10] = float("nan")
    return t


@pytest.mark.parametrize("op", ["cummax", "cummin"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float64", "int64", "int8", "bool"])
def test_running_extremes_one_long_row(op, dtype):
    """The segmented scan on one row: 2.5M elements are over 1024 segments of 2048, so each warp scanning the
    segments' extremes takes several chunks of them; 70001 are 35 segments, the last one short."""
    t = _long_row(2_500_000 if dtype in ("float32", "int8") else 70001, dtype, seed=30)
    _same_running(op, _device(t), t, 1)


@pytest.mark.parametrize("op", ["cummax", "cummin"])
def test_running_extremes_segmented_dims_views_and_row_counts(op):
    t = _input((2, 9000, 3), "float32", seed=31)
    x = _device(t)
    views = ((t, x, 1), (t.transpose(1, 2), x.transpose(1, 2), 2), (t[1, ::2, 2], x[1, ::2, 2], 0),
             (t.permute(1, 0, 2), x.permute(1, 0, 2), 0))
    for view_t, view_x, dim in views:
        _same_running(op, view_x, view_t, dim)
    for rows in (4095, 4096):  # the segmented scan below 4096 rows, a warp per row from there
        many = _input((rows, 2049), "float16", seed=rows, special=False)
        _same_running(op, _device(many), many, 1)


# ---------------------------------------------------------------------------------------------- autograd, dispatch

def _grad_pair(make_output, shape, seed):
    """(tilewise's gradient, torch's) of ``sum(weights * make_output(x))`` for distinct float32 inputs."""
    rng = np.random.default_rng(seed)
    a = rng.permutation(int(np.prod(shape))).astype(np.float32).reshape(shape)
    weights = rng.standard_normal(a.shape).astype(np.float32)
    x = tw.from_numpy(a).cuda().requires_grad_()
    t = torch.from_numpy(a).requires_grad_()
    out, ref = make_output(x), make_output(t)
    (out * tw.from_numpy(weights[tuple(slice(0, s) for s in out.shape)]).cuda()).sum().backward()
    (ref * torch.from_numpy(weights[tuple(slice(0, s) for s in ref.shape)])).sum().backward()
    return _host(x.grad), t.grad


@pytest.mark.parametrize("name,fn", [
    ("sort", lambda v: v.sort(1, descending=True)[0]),
    ("sort-long", lambda v: v.sort(0)[0]),
    ("topk", lambda v: v.topk(3, 1)[0]),
    ("topk-smallest", lambda v: v.topk(2, 0, largest=False)[0]),
    ("cummax", lambda v: v.cummax(1)[0]),
    ("cummin", lambda v: v.cummin(0)[0]),
])
def test_backward_on_the_device(name, fn):
    shape = (6000, 4) if name == "sort-long" else (5, 9)
    ours, ref = _grad_pair(fn, shape, seed=len(name))
    torch.testing.assert_close(ours, ref, rtol=1e-6, atol=1e-6)


def test_sorting_ops_run_on_the_device(monkeypatch):
    """None of these operators reaches the host fallback."""
    import tilewise.backends.cuda as backend

    x = _device(_input((4, 5000), "float32", seed=14))
    x.sort()  # binds the backend's entry points before they are replaced

    def no_host(op, args, device):
        raise AssertionError(f"{op.full_name} ran on the host")

    monkeypatch.setattr(backend, "_host", no_host)
    x.sort(0, descending=True)
    x.argsort(1)
    x.topk(3)
    x.kthvalue(2, 1)
    x.median(1)
    x.cummax(1)
    x.cummin(0)
    tw.cuda.synchronize()

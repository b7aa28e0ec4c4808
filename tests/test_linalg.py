"""tilewise.linalg beyond the op table: errors as torch raises them, info codes, lstsq's drivers, empty and singular
matrices, and (on a GPU) cuSOLVER against LAPACK."""

# ruff: noqa: N803, N806 — matrices are named as in torch's linalg and the literature (A, B, L, U, S, Vh)

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

import tilewise as tw


def _pair(array):
    return tw.from_numpy(np.array(array)), torch.from_numpy(np.array(array))


def _raises_like(fn_tw, fn_torch):
    with pytest.raises(Exception) as theirs:
        fn_torch()
    with pytest.raises(Exception) as ours:
        fn_tw()
    return ours.value, theirs.value


SINGULAR = [[1.0, 2.0, 3.0], [2.0, 4.0, 6.0], [1.0, 1.0, 1.0]]


def test_linalg_error_is_a_runtime_error():
    assert issubclass(tw.linalg.LinAlgError, RuntimeError)


@pytest.mark.parametrize("case", ["inv", "inv-batch", "zero", "solve", "solve-batch", "cholesky", "cholesky-batch"])
def test_singular_and_indefinite_matrices_raise_linalg_error_with_torchs_message(case):
    eye = np.eye(3)
    calls = {
        "inv": (lambda m: m.linalg.inv, [SINGULAR]),
        "inv-batch": (lambda m: m.linalg.inv, [[eye, SINGULAR]]),
        "zero": (lambda m: m.linalg.inv, [np.zeros((3, 3))]),
        "solve": (lambda m: (lambda A: m.linalg.solve(A, m.ones(3, dtype=A.dtype))), [SINGULAR]),
        "solve-batch": (lambda m: (lambda A: m.linalg.solve(A, m.ones(3, dtype=A.dtype))), [[eye, SINGULAR]]),
        "cholesky": (lambda m: m.linalg.cholesky, [SINGULAR]),
        "cholesky-batch": (lambda m: m.linalg.cholesky, [[eye, -eye]]),
    }
    make, args = calls[case]
    a_tw, a_torch = _pair(args[0])
    ours, theirs = _raises_like(lambda: make(tw)(a_tw), lambda: make(torch)(a_torch))
    assert isinstance(theirs, torch.linalg.LinAlgError)
    assert isinstance(ours, tw.linalg.LinAlgError)
    assert str(ours) == str(theirs)


@pytest.mark.parametrize("case", ["int-inv", "half-inv", "1d-det", "nonsquare-inv", "nonsquare-cholesky",
                                  "int-svd", "solve-shapes", "solve-right-shapes", "solve-dtypes", "uplo", "qr-mode",
                                  "lstsq-driver", "lstsq-rows", "triangular-shapes", "matrix-power-nonsquare",
                                  "int-vector-norm", "int-matrix-norm"])
def test_bad_arguments_raise_as_torch(case):
    def args(m):
        f32 = m.float32
        return {
            "int-inv": lambda: m.linalg.inv(m.ones(3, 3, dtype=m.int64)),
            "half-inv": lambda: m.linalg.inv(m.ones(3, 3, dtype=m.float16)),
            "1d-det": lambda: m.linalg.det(m.ones(3)),
            "nonsquare-inv": lambda: m.linalg.inv(m.ones(2, 3)),
            "nonsquare-cholesky": lambda: m.linalg.cholesky(m.ones(2, 3)),
            "int-svd": lambda: m.linalg.svd(m.ones(2, 3, dtype=m.int64)),
            "solve-shapes": lambda: m.linalg.solve(m.eye(3), m.ones(4)),
            "solve-right-shapes": lambda: m.linalg.solve(m.eye(3), m.ones(4), left=False),
            "solve-dtypes": lambda: m.linalg.solve(m.eye(3, dtype=m.float64), m.ones(3, dtype=f32)),
            "uplo": lambda: m.linalg.eigh(m.eye(3), UPLO="X"),
            "qr-mode": lambda: m.linalg.qr(m.eye(3), mode="x"),
            "lstsq-driver": lambda: m.linalg.lstsq(m.ones(5, 3), m.ones(5, 2), driver="foo"),
            "lstsq-rows": lambda: m.linalg.lstsq(m.ones(4, 3), m.ones(3, 2)),
            "triangular-shapes": lambda: m.linalg.solve_triangular(m.eye(3), m.ones(4, 2), upper=True),
            "matrix-power-nonsquare": lambda: m.linalg.matrix_power(m.ones(2, 3), 2),
            "int-vector-norm": lambda: m.linalg.vector_norm(m.ones(3, dtype=m.int64)),
            "int-matrix-norm": lambda: m.linalg.matrix_norm(m.ones(3, 3, dtype=m.int64)),
        }[case]

    ours, theirs = _raises_like(args(tw), args(torch))
    assert isinstance(ours, type(theirs))
    assert str(ours) == str(theirs)


def test_ex_forms_report_info_per_matrix_as_torch():
    batch = np.stack([np.eye(3), np.array(SINGULAR), np.zeros((3, 3))])
    a_tw, a_torch = _pair(batch)
    assert tw.linalg.inv_ex(a_tw).info.tolist() == torch.linalg.inv_ex(a_torch).info.tolist()
    spd = np.stack([np.eye(3), -np.eye(3), np.diag([1.0, 1.0, -1.0])])
    a_tw, a_torch = _pair(spd)
    assert tw.linalg.cholesky_ex(a_tw).info.tolist() == torch.linalg.cholesky_ex(a_torch).info.tolist()
    assert tw.linalg.solve_ex(a_tw, tw.ones(3, 3, dtype=tw.float64)).info.tolist() == [0, 0, 0]


@pytest.mark.parametrize("driver", [None, "gelsy", "gelsd", "gelss", "gels"])
@pytest.mark.parametrize("shape", [(5, 3), (2, 5, 3), (5, 3, 0)])
def test_lstsq_fills_the_outputs_each_driver_fills(driver, shape):
    rng = np.random.default_rng(0)
    vector = shape[-1] == 0  # (5, 3, 0): A [5, 3] with a vector B [5]
    shape = shape[:2] if vector else shape
    A = rng.standard_normal(shape)
    B = rng.standard_normal(shape[:-1] if vector else shape[:-1] + (2,))
    ours = tw.linalg.lstsq(tw.from_numpy(A), tw.from_numpy(B), driver=driver)
    theirs = torch.linalg.lstsq(torch.from_numpy(A), torch.from_numpy(B), driver=driver)
    assert type(ours).__name__ == "linalg_lstsq"
    for name in ("solution", "residuals", "rank", "singular_values"):
        a, e = getattr(ours, name), getattr(theirs, name)
        assert tuple(a.shape) == tuple(e.shape), name
        assert a.dtype.name == str(e.dtype).removeprefix("torch."), name
        np.testing.assert_allclose(a.numpy(), e.numpy(), rtol=1e-7, atol=1e-9, err_msg=name)


def test_rank_deficient_lstsq_reports_the_rank():
    A = np.array([[1.0, 2.0], [2.0, 4.0], [3.0, 6.0]])
    B = np.ones((3, 1))
    ours = tw.linalg.lstsq(tw.from_numpy(A), tw.from_numpy(B))
    theirs = torch.linalg.lstsq(torch.from_numpy(A), torch.from_numpy(B))
    assert ours.rank.item() == theirs.rank.item() == 1


def test_determinant_gradient_of_a_singular_matrix_is_zero_as_in_torch():
    # Matrices whose LU gives an exact zero pivot in every LAPACK: a rank-deficient matrix with distinct rows
    # (SINGULAR) may come out at -3e-16 in one LAPACK and 0 in another, and its gradient then jumps from the
    # cofactors to zero, in torch as here.
    zero_row = np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [0.0, 0.0, 0.0]])
    batch = np.stack([zero_row, np.diag([1.0, 2.0, 0.0]), np.eye(3) * 2])
    a_tw, a_torch = _pair(batch)
    a_tw.requires_grad_(True)
    a_torch.requires_grad_(True)
    tw.linalg.det(a_tw).sum().backward()
    torch.linalg.det(a_torch).sum().backward()
    np.testing.assert_allclose(a_tw.grad.numpy(), a_torch.grad.numpy(), rtol=1e-7, atol=1e-9)


def test_singular_triangular_solve_gives_inf_and_nan_as_torch():
    A = np.triu(np.array(SINGULAR))
    A[1, 1] = 0.0
    ours = tw.linalg.solve_triangular(tw.from_numpy(A), tw.ones(3, 1, dtype=tw.float64), upper=True)
    theirs = torch.linalg.solve_triangular(torch.from_numpy(A), torch.ones(3, 1, dtype=torch.float64), upper=True)
    np.testing.assert_array_equal(ours.numpy(), theirs.numpy())


@pytest.mark.parametrize("name", ["inv", "det", "slogdet", "svd", "svdvals", "qr", "eigh", "cholesky", "matrix_exp",
                                  "pinv", "matrix_rank"])
@pytest.mark.parametrize("shape", [(0, 0), (2, 0, 0)])
def test_empty_matrices_as_torch(name, shape):
    ours = getattr(tw.linalg, name)(tw.zeros(*shape, dtype=tw.float64))
    theirs = getattr(torch.linalg, name)(torch.zeros(*shape, dtype=torch.float64))
    ours = ours if isinstance(ours, tuple) else (ours,)
    theirs = theirs if isinstance(theirs, tuple) else (theirs,)
    for a, e in zip(ours, theirs):
        assert tuple(a.shape) == tuple(e.shape)
        np.testing.assert_allclose(a.numpy(), e.numpy())


@pytest.mark.parametrize("name", ["slogdet", "det", "inv", "cholesky", "svd", "svdvals", "matrix_exp", "eigh"])
def test_nan_inputs_as_torch(name):
    a = np.eye(3)
    a[1, 1] = np.nan
    fn_tw, fn_torch = getattr(tw.linalg, name), getattr(torch.linalg, name)
    try:
        theirs = fn_torch(torch.from_numpy(a))
    except torch.linalg.LinAlgError as exc:
        with pytest.raises(tw.linalg.LinAlgError) as ours:
            fn_tw(tw.from_numpy(a))
        assert str(ours.value) == str(exc)
        return
    ours = fn_tw(tw.from_numpy(a))
    for o, t in zip(ours if isinstance(ours, tuple) else (ours,), theirs if isinstance(theirs, tuple) else (theirs,)):
        np.testing.assert_array_equal(np.isnan(o.numpy()), np.isnan(t.numpy()))


def test_lstsq_of_non_finite_input_raises_rather_than_hangs():
    a = np.eye(3)
    a[1, 1] = np.nan
    with pytest.raises(RuntimeError, match="lstsq"):
        tw.linalg.lstsq(tw.from_numpy(a), tw.from_numpy(a))


def test_svd_of_rectangular_matrices_has_torchs_shapes():
    for shape in [(4, 3), (3, 5), (2, 4, 3)]:
        for full in (True, False):
            ours = tw.linalg.svd(tw.zeros(*shape) + 1, full_matrices=full)
            theirs = torch.linalg.svd(torch.zeros(*shape) + 1, full_matrices=full)
            assert [tuple(t.shape) for t in ours] == [tuple(t.shape) for t in theirs]


def test_return_types_carry_torchs_names():
    A = tw.eye(3)
    assert type(tw.linalg.svd(A)).__name__ == "linalg_svd"
    assert type(tw.svd(A)).__name__ == "svd"
    assert type(tw.linalg.qr(A)).__name__ == "linalg_qr"
    assert type(tw.linalg.eigh(A)).__name__ == "linalg_eigh"
    assert type(tw.slogdet(A)).__name__ == "slogdet"
    assert tw.linalg.eigh(A).eigenvectors.shape == (3, 3)


@pytest.mark.parametrize("kwargs", [{"p": "nuc"}, {"p": "nuc", "dim": (0, 2)},
                                    {"p": "nuc", "dim": (2, 1), "keepdim": True}, {"p": "fro", "dim": (0, 1)}])
def test_old_norm_takes_matrix_orders(kwargs):
    a = np.random.default_rng(0).standard_normal((2, 3, 4) if "dim" in kwargs else (3, 4))
    x_tw, x_torch = tw.from_numpy(a.copy()).requires_grad_(True), torch.from_numpy(a.copy()).requires_grad_(True)
    ours, theirs = tw.norm(x_tw, **kwargs), torch.norm(x_torch, **kwargs)
    np.testing.assert_allclose(ours.detach().numpy(), theirs.detach().numpy(), rtol=1e-10)
    ours.sum().backward()
    theirs.sum().backward()
    np.testing.assert_allclose(x_tw.grad.numpy(), x_torch.grad.numpy(), rtol=1e-9, atol=1e-12)


def test_qr_backward_refuses_mode_r_as_torch():
    ours, theirs = _raises_like(lambda: tw.linalg.qr(tw.ones(3, 3, requires_grad=True), mode="r").R.sum().backward(),
                                lambda: torch.linalg.qr(torch.ones(3, 3, requires_grad=True), mode="r").R.sum()
                                .backward())
    assert "mode='r'" in str(ours) and "mode='r'" in str(theirs)


# ---------------------------------------------------------------------------------------------- CUDA

def _cuda():
    if not tw.cuda.is_available():
        pytest.skip("no GPU")


def _well_conditioned(shape, seed=0, dtype="float64"):
    rng = np.random.default_rng(seed)
    return (rng.uniform(-1, 1, shape) + 3 * np.eye(shape[-1])).astype(dtype)


CUDA_CASES = {
    "solve": lambda m, A: m.linalg.solve(A, A[..., :2]),
    "solve-right": lambda m, A: m.linalg.solve(A, A[..., :2, :], left=False),
    "inv": lambda m, A: m.linalg.inv(A),
    "det": lambda m, A: m.linalg.det(A),
    "slogdet": lambda m, A: m.linalg.slogdet(A),
    "cholesky": lambda m, A: m.linalg.cholesky(A @ A.mT),
    "cholesky-upper": lambda m, A: m.linalg.cholesky(A @ A.mT, upper=True),
    "qr": lambda m, A: m.linalg.qr(A),
    "qr-tall": lambda m, A: m.linalg.qr(A[..., :, :2]),
    "qr-wide-complete": lambda m, A: m.linalg.qr(A[..., :2, :], mode="complete"),
    "qr-tall-complete": lambda m, A: m.linalg.qr(A[..., :, :2], mode="complete"),
    "qr-r": lambda m, A: m.linalg.qr(A, mode="r").R,
    "svdvals": lambda m, A: m.linalg.svdvals(A),
    "svd-tall": lambda m, A: _svd_product(m.linalg.svd(A[..., :, :2], full_matrices=False)),
    "svd-wide": lambda m, A: _svd_product(m.linalg.svd(A[..., :2, :], full_matrices=False)),
    "svd-full": lambda m, A: m.linalg.svd(A[..., :, :2]).U.abs()[..., :2],
    "eigh": lambda m, A: _eigh_product(m.linalg.eigh(A + A.mT)),
    "eigh-upper": lambda m, A: m.linalg.eigvalsh(A + A.mT, UPLO="U"),
    "solve_triangular": lambda m, A: m.linalg.solve_triangular(A, A[..., :2], upper=True),
    "solve_triangular-right": lambda m, A: m.linalg.solve_triangular(A, A[..., :2, :], upper=False, left=False),
    "solve_triangular-unit": lambda m, A: m.linalg.solve_triangular(A, A[..., :2], upper=False, unitriangular=True),
    "lstsq": lambda m, A: m.linalg.lstsq(A[..., :, :2], A[..., :1]).solution,
    "matrix_exp": lambda m, A: m.linalg.matrix_exp(A * 0.3),
    "pinv": lambda m, A: m.linalg.pinv(A),
}


def _svd_product(out):
    U, S, Vh = out
    return (U * S.unsqueeze(-2)) @ Vh, S


def _eigh_product(out):
    L, V = out
    return (V * L.unsqueeze(-2)) @ V.mT, L


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("shape", [(4, 4), (3, 4, 4)])
@pytest.mark.parametrize("case", list(CUDA_CASES))
def test_cuda_matches_cpu(case, shape, dtype):
    _cuda()
    A = _well_conditioned(shape, dtype=dtype)
    on_cpu = CUDA_CASES[case](tw, tw.from_numpy(A))
    on_gpu = CUDA_CASES[case](tw, tw.from_numpy(A).to("cuda"))
    on_cpu = on_cpu if isinstance(on_cpu, tuple) else (on_cpu,)
    on_gpu = on_gpu if isinstance(on_gpu, tuple) else (on_gpu,)
    tol = 1e-4 if dtype == "float32" else 1e-10
    for c, g in zip(on_cpu, on_gpu):
        assert g.device.type == "cuda" and tuple(g.shape) == tuple(c.shape)
        np.testing.assert_allclose(g.cpu().numpy(), c.numpy(), rtol=tol, atol=tol)


@pytest.mark.cuda
def test_cuda_gradients_match_cpu():
    _cuda()
    A = _well_conditioned((2, 4, 4))

    def grads(device):
        x = tw.from_numpy(A).to(device).requires_grad_(True)
        U, S, Vh = tw.linalg.svd(x[..., :3])
        L, V = tw.linalg.eigh(x + x.mT)
        loss = (tw.linalg.inv(x).sum() + tw.linalg.det(x).sum() + tw.linalg.cholesky(x @ x.mT).sum()
                + tw.linalg.qr(x).R.sum() + S.sum() + (U[..., :3] * U[..., :3]).sum() + L.sum()
                + (V * V).sum() + tw.linalg.solve(x, x[..., :1]).sum())
        loss.backward()
        return x.grad.cpu().numpy()

    np.testing.assert_allclose(grads("cuda"), grads("cpu"), rtol=1e-8, atol=1e-9)


@pytest.mark.cuda
def test_cuda_singular_matrices_raise_linalg_error():
    _cuda()
    A = tw.tensor(SINGULAR, device="cuda")
    with pytest.raises(tw.linalg.LinAlgError, match="The diagonal element 3 is zero"):
        tw.linalg.inv(A)
    with pytest.raises(tw.linalg.LinAlgError, match="leading minor of order 1"):
        tw.linalg.cholesky(-tw.eye(3, device="cuda"))
    assert tw.linalg.inv_ex(A).info.item() == 3


@pytest.mark.parametrize("case", ["dot", "dot-int", "cross", "linalg.cross", "dot-shape"])
def test_dot_and_cross_refuse_two_dtypes_as_torch(case):
    def outcome(lib):
        calls = {
            "dot": lambda: lib.dot(lib.ones(3), lib.ones(3, dtype=lib.float64)),
            "dot-int": lambda: lib.dot(lib.ones(3, dtype=lib.int64), lib.ones(3)),
            "cross": lambda: lib.cross(lib.ones(2, 3), lib.ones(2, 3, dtype=lib.float64), dim=1),
            "linalg.cross": lambda: lib.linalg.cross(lib.ones(3, dtype=lib.bfloat16), lib.ones(3)),
            "dot-shape": lambda: lib.dot(lib.ones(2, 2), lib.ones(3, dtype=lib.float64)),
        }
        try:
            return calls[case]().dtype
        except RuntimeError as error:
            return str(error).removeprefix("dot: ").split(";")[0].split(" (cross")[0]

    assert outcome(tw) == outcome(torch)


_VECTOR_SOLUTION = pytest.mark.xfail(strict=True, reason=(
    "torch's solver writes a batch of vectors' solution in its final layout, the tensor its backward saves; "
    "tilewise's solves columns and lays the result out anew, so a write into it escapes the version check"))
SOLVE_LAYOUTS = {  # (A's shape, B's shape, left)
    "batch of vectors": pytest.param((2, 3, 3), (2, 3), True, marks=_VECTOR_SOLUTION),
    "one vector": ((3, 3), (3,), True),
    "one vector, batched A": pytest.param((2, 3, 3), (3,), True, marks=_VECTOR_SOLUTION),
    "batch of columns": ((2, 3, 3), (2, 3, 1), True),
    "batch of rows, right": ((2, 3, 3), (2, 1, 3), False),
    "matrix, right": ((3, 3), (2, 3), False),
}


@pytest.mark.parametrize("a_shape,b_shape,left", list(SOLVE_LAYOUTS.values()), ids=list(SOLVE_LAYOUTS))
def test_solve_result_is_laid_out_and_guarded_as_torchs(a_shape, b_shape, left):
    """torch's solution is in the layout its LAPACK call leaves (a batch of vectors: column-major, as one matrix)
    and is the tensor its backward saved: an in-place write into it is allowed, and refused at backward."""
    A0 = (np.eye(3) * 4 + np.arange(np.prod(a_shape)).reshape(a_shape) % 5 * 0.25).astype(np.float64)
    B0 = np.arange(np.prod(b_shape), dtype=np.float64).reshape(b_shape) - 1

    def run(lib):
        A = lib.tensor(A0, requires_grad=True)
        B = lib.tensor(B0, requires_grad=True)
        for solve in (lambda: lib.linalg.solve(A, B, left=left), lambda: lib.linalg.solve_ex(A, B, left=left)[0]):
            X = solve()
            seen = X.stride(), X.is_contiguous(), X.storage_offset()
            X.add_(1)
            try:
                (X * X).sum().backward()
                outcome = np.round(A.grad.numpy(), 8).tolist(), np.round(B.grad.numpy(), 8).tolist()
            except RuntimeError as exc:
                outcome = "modified by an inplace operation" in str(exc)
            yield seen, np.round(X.detach().numpy(), 10).tolist(), outcome
            A.grad = B.grad = None

    assert list(run(tw)) == list(run(torch))


@pytest.mark.parametrize("a_shape,b_shape", [((2, 3, 3), (2, 3)), ((3, 3), (3,)), ((2, 3, 3), (3,))])
def test_solve_refuses_a_vector_right_hand_side_with_left_false_as_torch(a_shape, b_shape):
    for lib in (tw, torch):
        with pytest.raises(RuntimeError, match=re.escape("linalg.solve: Incompatible shapes of A and B for the "
                                                         "equation XA = B (3x3 and 3x1)")):
            lib.linalg.solve(lib.eye(3).expand(a_shape) * 2, lib.ones(b_shape), left=False)


# ---------------------------------------------------------------------------------------------- LU factorisations

def _lu_refusals(lib):
    A = lib.tensor([[1.0, 2.0], [3.0, 4.0]])
    LU, pivots = lib.linalg.lu_factor(A)
    B = lib.ones(2, 1)
    singular = lib.tensor([[1.0, 2.0], [2.0, 4.0]])
    return {
        "a vector": lambda: lib.linalg.lu_factor(lib.ones(3)),
        "integers": lambda: lib.linalg.lu_factor(lib.ones(3, 3, dtype=lib.long)),
        "half": lambda: lib.linalg.lu_factor(lib.ones(3, 3, dtype=lib.half)),
        "singular": lambda: lib.linalg.lu_factor(singular),
        "singular, checked": lambda: lib.linalg.lu_factor_ex(singular, check_errors=True),
        "no pivoting on the CPU": lambda: lib.linalg.lu_factor(A, pivot=False),
        "solve, B of another size": lambda: lib.linalg.lu_solve(LU, pivots, lib.ones(3, 1)),
        "solve, int64 pivots": lambda: lib.linalg.lu_solve(LU, pivots.long(), B),
        "solve, B of another dtype": lambda: lib.linalg.lu_solve(LU, pivots, B.double()),
        "solve, LU not square": lambda: lib.linalg.lu_solve(lib.ones(2, 3), pivots, B),
        "solve, too few pivots": lambda: lib.linalg.lu_solve(LU, pivots[:1], B),
        "solve, a vector B": lambda: lib.linalg.lu_solve(LU, pivots, lib.ones(2)),
        "unpack, int64 pivots": lambda: lib.lu_unpack(LU, pivots.long()),
    }


@pytest.mark.parametrize("case", list(_lu_refusals(torch)))
def test_lu_factorisations_refuse_as_torch(case):
    found = []
    for lib in (torch, tw):
        with pytest.raises(Exception) as raised:  # noqa: PT011 — the type is compared with torch's below
            _lu_refusals(lib)[case]()
        found.append(raised.value)
    theirs, ours = found
    assert type(ours) is type(theirs), (ours, theirs)
    assert str(ours).startswith(str(theirs)), (str(ours), str(theirs))


def test_lu_factor_ex_reports_a_zero_pivot_and_unpacking_rebuilds_the_matrix_as_torch():
    singular = [[1.0, 2.0], [2.0, 4.0]]
    ours, theirs = tw.linalg.lu_factor_ex(tw.tensor(singular)), torch.linalg.lu_factor_ex(torch.tensor(singular))
    for a, b in zip(ours, theirs):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    A = tw.tensor(np.random.default_rng(0).standard_normal((2, 3, 5)))
    P, L, U = tw.lu_unpack(*tw.linalg.lu_factor(A))
    np.testing.assert_allclose((P @ L @ U).numpy(), A.numpy(), atol=1e-12)
    assert [tuple(t.shape) for t in tw.lu_unpack(*tw.linalg.lu_factor(A), unpack_data=False)] == [(2, 3, 3), (0,), (0,)]
    assert [tuple(t.shape) for t in tw.linalg.lu(tw.ones(2, 0, 3))] == [(2, 0, 0), (2, 0, 0), (2, 0, 3)]


def test_the_old_lu_api_warns_as_torch_and_gives_linalg_s_results():
    A = tw.tensor([[1.0, 2.0], [3.0, 4.0]])
    with pytest.warns(UserWarning, match="torch.lu is deprecated in favor of torch.linalg.lu_factor"):
        LU, pivots, info = tw.lu(A, get_infos=True)
    with pytest.warns(UserWarning, match="torch.lu_solve is deprecated in favor of torch.linalg.lu_solve"):
        X = tw.ones(2, 1).lu_solve(LU, pivots)
    np.testing.assert_allclose((A @ X).numpy(), np.ones((2, 1)), atol=1e-6)
    assert info.item() == 0 and pivots.dtype == tw.int32


@pytest.mark.parametrize("dtype", ["bool", "float16", "bfloat16"])
def test_vander_refuses_bool_and_half_types_as_torch(dtype):
    found = []
    for lib in (torch, tw):
        with pytest.raises(RuntimeError) as raised:
            lib.linalg.vander(lib.ones(3).to(getattr(lib, dtype)))
        found.append(str(raised.value))
    assert found[1] == found[0]


# ---------------------------------------------------------------------------------------------- eig

def _eig_pair(a, loss):
    found = []
    for lib in (torch, tw):
        A = lib.tensor(a, requires_grad=True)
        L, V = lib.linalg.eig(A)
        try:
            loss(lib, L, V).backward()
            grad = A.grad.resolve_conj().numpy() if lib is torch else A.grad.numpy()
        except RuntimeError as exc:
            grad = str(exc)
        values = L.detach().resolve_conj().numpy() if lib is torch else L.detach().numpy()
        vectors = V.detach().resolve_conj().numpy() if lib is torch else V.detach().numpy()
        found.append((values, vectors, grad, V.stride(), L.dtype))
    return found


@pytest.mark.parametrize("complex_", [False, True], ids=["real", "complex"])
@pytest.mark.parametrize("shape", [(3, 3), (2, 4, 4)])
def test_eig_matches_torch_up_to_each_eigenvectors_phase(shape, complex_):
    """Eigenvalues as torch's; eigenvectors of unit norm, equal to torch's up to a unit factor each (LAPACK builds
    differ in the sign they give a complex pair's vectors); the gradient of a loss that does not depend on those
    phases as torch's, and a loss that does refused in torch's words."""
    rng = np.random.default_rng(7)
    a = rng.standard_normal(shape) + (1j * rng.standard_normal(shape) if complex_ else 0)

    def invariant(lib, L, V):
        return (V.abs() ** 2 * lib.arange(V.shape[-1])).sum() + (L.real * 2 + L.imag).sum()

    (tv, tV, tg, ts, tdt), (ov, oV, og, os_, odt) = _eig_pair(a, invariant)
    assert str(odt).split(".")[-1] == str(tdt).split(".")[-1] and os_ == ts
    np.testing.assert_allclose(ov, tv, atol=1e-10)
    top = np.abs(tV).argmax(axis=-2)[..., None, :]
    phase = np.take_along_axis(oV, top, -2) / np.take_along_axis(tV, top, -2)
    np.testing.assert_allclose(np.abs(phase), 1, atol=1e-10)
    np.testing.assert_allclose(oV, tV * phase, atol=1e-10)
    np.testing.assert_allclose(og, tg, atol=1e-8)
    (_, _, theirs, _, _), (_, _, ours, _, _) = _eig_pair(a, lambda lib, L, V: (V * (1 + 0.5j)).real.sum())
    assert isinstance(ours, str) and ours == theirs


def test_eig_refuses_as_torch():
    for make in (lambda lib: lib.ones(3), lambda lib: lib.ones(2, 3)):
        messages = []
        for lib in (torch, tw):
            with pytest.raises(RuntimeError) as raised:
                lib.linalg.eig(make(lib))
            messages.append(str(raised.value))
        assert messages[1].startswith(messages[0])
    with pytest.raises(NotImplementedError, match='"linalg_eig_out_cpu" not implemented for \'Half\''):
        tw.linalg.eig(tw.ones(2, 2).half())


def test_vander_of_a_zero_dim_tensor_is_one_row_as_torch():
    ours, theirs = tw.linalg.vander(tw.tensor(2.0), N=3), torch.linalg.vander(torch.tensor(2.0), N=3)
    assert tuple(ours.shape) == tuple(theirs.shape) == (1, 3)
    np.testing.assert_array_equal(ours.numpy(), theirs.numpy())


def test_eig_of_a_matrix_with_nan_is_refused_by_name():
    """torch's CPU kernel ends the process (its LAPACK rejects the argument); tilewise says what is wrong."""
    with pytest.raises(tw.linalg.LinAlgError, match="linalg.eig: the input has NaN or infinite entries"):
        tw.linalg.eig(tw.tensor([[float("nan"), 1.0], [1.0, 2.0]]))

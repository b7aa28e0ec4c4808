"""LDL (ldl_factor, ldl_solve), geqrf and ormqr beyond the operator table, and the Python-level solvers
svd_lowrank, pca_lowrank and lobpcg, against torch: errors in torch's words, LAPACK's pivots, the randomized
functions with torch's random matrices (tilewise's generator draws other numbers than torch's for a seed).
"""

# ruff: noqa: N803, N806 — matrices are named as in torch's linalg and the literature (A, B, LD, U, S, V)

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

import tilewise as tw
import tilewise._lowrank as lowrank


def _raises_as_torch(case):
    try:
        case(torch)
    except Exception as error:  # noqa: BLE001 — whatever torch raises is what tilewise must raise
        expected = error
    else:
        raise AssertionError("torch does not raise")
    with pytest.raises(type(expected)) as caught:
        case(tw)
    return expected, caught.value


def _same_message(expected, actual) -> None:
    assert str(actual).startswith(str(expected)), f"tilewise: {actual}\ntorch: {expected}"


# ---------------------------------------------------------------- LDL

LDL_ERRORS = {
    "not square": lambda m: m.linalg.ldl_factor(m.randn(3, 4)),
    "a vector": lambda m: m.linalg.ldl_factor_ex(m.randn(3)),
    "integers": lambda m: m.linalg.ldl_factor(m.ones(3, 3, dtype=m.int64)),
    "half": lambda m: m.linalg.ldl_factor(m.ones(3, 3, dtype=m.half)),
    "bfloat16": lambda m: m.linalg.ldl_factor_ex(m.ones(3, 3, dtype=m.bfloat16)),
    "solve: pivots of floats": lambda m: m.linalg.ldl_solve(m.eye(3), m.ones(3), m.ones(3, 2)),
    "solve: pivots of bools": lambda m: m.linalg.ldl_solve(m.eye(3), m.ones(3, dtype=m.bool), m.ones(3, 2)),
    "solve: pivots' shape": lambda m: m.linalg.ldl_solve(m.eye(3), m.ones(2, dtype=m.int32), m.ones(3, 2)),
    "solve: dtypes": lambda m: m.linalg.ldl_solve(m.eye(3), m.arange(1, 4, dtype=m.int32), m.ones(3, 2).double()),
    "solve: rows": lambda m: m.linalg.ldl_solve(m.eye(3), m.arange(1, 4, dtype=m.int32), m.ones(4, 2)),
    "solve: not square": lambda m: m.linalg.ldl_solve(m.ones(2, 3), m.ones(2, dtype=m.int32), m.ones(2, 2)),
    "solve: integers": lambda m: m.linalg.ldl_solve(m.ones(3, 3, dtype=m.int32), m.ones(3, dtype=m.int32),
                                                    m.ones(3, 2, dtype=m.int32)),
    "solve: a vector LD": lambda m: m.linalg.ldl_solve(m.ones(3), m.ones(3, dtype=m.int32), m.ones(3, 2)),
    "solve: half": lambda m: m.linalg.ldl_solve(m.eye(3).half(), m.arange(1, 4, dtype=m.int32), m.ones(3, 2).half()),
    "solve: a vector B": lambda m: m.linalg.ldl_solve(m.eye(3), m.arange(1, 4, dtype=m.int32), m.ones(3)),
}


@pytest.mark.parametrize("case", LDL_ERRORS.values(), ids=LDL_ERRORS.keys())
def test_ldl_refuses_as_torch(case):
    expected, actual = _raises_as_torch(case)
    _same_message(expected, actual)


@pytest.mark.parametrize("checked", [False, True])
def test_a_singular_matrix_is_reported_with_torch_s_code(checked):
    """torch's error checker has no words for sytrf's info: an internal assertion names the code, which tilewise
    names too, with what it means."""
    call = (lambda m: m.linalg.ldl_factor_ex(m.zeros(2, 3, 3), check_errors=True)) if checked else \
        (lambda m: m.linalg.ldl_factor(m.zeros(3, 3)))
    expected, actual = _raises_as_torch(call)
    assert "Unknown error code: 1." in str(expected) and "Unknown error code: 1." in str(actual)
    name = "torch.linalg.ldl_factor_ex" if checked else "torch.linalg.ldl_factor"
    assert str(actual).startswith(name)
    ours, theirs = tw.linalg.ldl_factor_ex(tw.zeros(2, 3, 3)), torch.linalg.ldl_factor_ex(torch.zeros(2, 3, 3))
    assert ours.info.tolist() == theirs.info.tolist() == [1, 1]
    assert ours.pivots.tolist() == theirs.pivots.tolist()


def _random(rng, shape, complex_: bool, dtype=np.float64):
    values = rng.standard_normal(shape)
    if complex_:
        values = values + 1j * rng.standard_normal(shape)
    return values.astype(np.result_type(dtype, values.dtype) if not complex_ else
                         (np.complex64 if dtype == np.float32 else np.complex128))


@pytest.mark.parametrize("n", [1, 2, 5, 8, 70])
@pytest.mark.parametrize("kind", ["real", "complex-symmetric", "hermitian", "real-hermitian"])
def test_ldl_factor_gives_lapack_s_pivots_and_factors(n, kind):
    """Bunch-Kaufman's pivots (1x1 and 2x2, with their row interchanges) as LAPACK chooses them, on dense and on
    sparse matrices (zero pivots, many 2x2 blocks), a batch at once; n = 70 is factored in blocks by LAPACK."""
    rng = np.random.default_rng(n)
    hermitian = kind in ("hermitian", "real-hermitian")
    for sparse in (False, True):
        a = _random(rng, (3, n, n), kind in ("complex-symmetric", "hermitian"))
        if sparse:
            a = a * (rng.random(a.shape) < 0.4)
        ours = tw.linalg.ldl_factor_ex(tw.from_numpy(a.copy()), hermitian=hermitian)
        theirs = torch.linalg.ldl_factor_ex(torch.from_numpy(a.copy()), hermitian=hermitian)
        assert ours.pivots.tolist() == theirs.pivots.tolist()
        np.testing.assert_allclose(ours.LD.numpy(), theirs.LD.numpy(), rtol=1e-9, atol=1e-9)
        assert ours.LD.stride() == theirs.LD.stride() and ours.pivots.dtype is tw.int32
        if not sparse:  # (an exactly singular block may leave a zero or a rounding residue, either side)
            assert ours.info.tolist() == theirs.info.tolist()


@pytest.mark.parametrize("hermitian", [False, True])
def test_ldl_solve_solves_and_broadcasts_as_torch(hermitian):
    rng = np.random.default_rng(3)
    for complex_ in (False, True):
        a = _random(rng, (2, 6, 6), complex_)
        a = a + (a.conj() if hermitian else a).swapaxes(-1, -2)  # the matrix the lower triangle stands for
        b = _random(rng, (3, 1, 6, 2), complex_)
        LD, pivots = tw.linalg.ldl_factor(tw.from_numpy(a), hermitian=hermitian)
        x = tw.linalg.ldl_solve(LD, pivots, tw.from_numpy(b), hermitian=hermitian)
        tLD, tpivots = torch.linalg.ldl_factor(torch.from_numpy(a), hermitian=hermitian)
        # torch's kernel steps through LD's batch as if it were B's (a broadcast LD is read out of bounds): it is
        # given the broadcast factors here
        tLD, tpivots = tLD.expand(3, 2, 6, 6).mT.contiguous().mT, tpivots.expand(3, 2, 6).contiguous()
        expected = torch.linalg.ldl_solve(tLD, tpivots, torch.from_numpy(b).expand(3, 2, 6, 2), hermitian=hermitian)
        assert tuple(x.shape) == (3, 2, 6, 2) and x.stride() == expected.stride()
        np.testing.assert_allclose(x.numpy(), expected.numpy(), rtol=1e-9, atol=1e-10)
        np.testing.assert_allclose(a @ x.numpy(), np.broadcast_to(b, x.shape), atol=1e-9)
        long_pivots = tw.linalg.ldl_solve(LD, pivots.long(), tw.from_numpy(b), hermitian=hermitian)
        np.testing.assert_array_equal(long_pivots.numpy(), x.numpy())


def test_ldl_has_torch_s_missing_derivatives():
    def backward_of_factor(m):
        A = m.eye(3, requires_grad=True)
        LD, pivots = m.linalg.ldl_factor(A)
        assert LD.requires_grad and not pivots.requires_grad
        LD.sum().backward()

    def backward_of_solve(m):
        LD, pivots = m.linalg.ldl_factor(m.eye(3))
        m.linalg.ldl_solve(LD, pivots, m.ones(3, 2, requires_grad=True)).sum().backward()

    for case in (backward_of_factor, backward_of_solve):
        expected, actual = _raises_as_torch(case)
        assert str(actual) == str(expected)


def test_ldl_refuses_tangents_as_torch():
    import tilewise.autograd.forward_ad as fwad

    with fwad.dual_level(), torch.autograd.forward_ad.dual_level():
        for lib, ad in ((tw, fwad), (torch, torch.autograd.forward_ad)):
            A = ad.make_dual(lib.eye(3), lib.ones(3, 3))
            with pytest.raises(NotImplementedError, match=re.escape(
                    "Trying to use forward AD with aten::linalg_ldl_factor_ex that does not support it.")):
                lib.linalg.ldl_factor(A)


def test_empty_ldl_as_torch():
    for shape in ((2, 0, 0), (0, 3, 3)):
        ours, theirs = tw.linalg.ldl_factor_ex(tw.zeros(shape)), torch.linalg.ldl_factor_ex(torch.zeros(shape))
        for o, t in zip(ours, theirs):
            assert tuple(o.shape) == tuple(t.shape) and o.stride() == t.stride()


# ---------------------------------------------------------------- geqrf, ormqr

QR_ERRORS = {
    "geqrf: a vector": lambda m: m.geqrf(m.ones(3)),
    "geqrf: integers": lambda m: m.geqrf(m.ones(3, 3, dtype=m.long)),
    "geqrf: half": lambda m: m.geqrf(m.ones(3, 3, dtype=m.half)),
    "ormqr: a vector": lambda m: m.ormqr(m.ones(3), m.ones(3), m.ones(3, 3)),
    "ormqr: other a vector": lambda m: m.ormqr(m.ones(3, 3), m.ones(3), m.ones(3)),
    "ormqr: right, rows": lambda m: m.ormqr(m.ones(4, 3), m.ones(3), m.ones(4, 2), False),
    "ormqr: tau's length": lambda m: m.ormqr(m.ones(4, 3), m.ones(2), m.ones(4, 2)),
    "ormqr: tau 0-dim": lambda m: m.ormqr(m.ones(4, 3), m.ones(()), m.ones(4, 2)),
    "ormqr: other's rows": lambda m: m.ormqr(m.ones(4, 3), m.ones(3), m.ones(3, 2)),
    "ormqr: other's dims": lambda m: m.ormqr(m.ones(4, 3), m.ones(3), m.ones(2, 4, 2)),
    "ormqr: tau's dims": lambda m: m.ormqr(m.ones(2, 4, 3), m.ones(3), m.ones(2, 4, 2)),
    "ormqr: tau's batch": lambda m: m.ormqr(m.ones(2, 4, 3), m.ones(3, 3), m.ones(2, 4, 2)),
    "ormqr: other's batch": lambda m: m.ormqr(m.ones(2, 4, 3), m.ones(2, 3), m.ones(3, 4, 2)),
    "ormqr: tau's dtype": lambda m: m.ormqr(m.ones(4, 3), m.ones(3, dtype=m.float64), m.ones(4, 2)),
    "ormqr: other's dtype": lambda m: m.ormqr(m.ones(4, 3), m.ones(3), m.ones(4, 2, dtype=m.float64)),
    "ormqr: integers": lambda m: m.ormqr(m.ones(4, 3, dtype=m.long), m.ones(3, dtype=m.long),
                                         m.ones(4, 2, dtype=m.long)),
    "geqrf: no derivative": lambda m: m.geqrf(m.ones(3, 3, requires_grad=True))[1].sum().backward(),
}


@pytest.mark.parametrize("case", QR_ERRORS.values(), ids=QR_ERRORS.keys())
def test_geqrf_and_ormqr_refuse_as_torch(case):
    expected, actual = _raises_as_torch(case)
    assert str(actual) == str(expected)


@pytest.mark.parametrize("left", [True, False])
@pytest.mark.parametrize("transpose", [False, True])
@pytest.mark.parametrize("dtype", [np.float64, np.complex128])
def test_ormqr_applies_geqrf_s_q_and_differentiates_as_torch(left, transpose, dtype):
    """With geqrf's own reflectors, ormqr is a product with the Q of linalg.qr (the table draws arbitrary ones)."""
    rng = np.random.default_rng(7)
    a = _random(rng, (2, 5, 3), dtype == np.complex128)
    c = _random(rng, (2, 5, 4) if left else (2, 4, 5), dtype == np.complex128)
    reflectors, tau = tw.geqrf(tw.from_numpy(a))
    Q = np.linalg.qr(a, mode="complete")[0]
    op = Q.conj().swapaxes(-1, -2) if transpose else Q
    product = tw.ormqr(reflectors, tau, tw.from_numpy(c), left, transpose)
    np.testing.assert_allclose(product.numpy(), op @ c if left else c @ op, atol=1e-12)
    t_reflectors, t_tau = torch.geqrf(torch.from_numpy(a))
    inputs = [t_reflectors.detach().requires_grad_(), t_tau.detach().requires_grad_(),
              torch.from_numpy(c).requires_grad_()]
    expected = torch.ormqr(*inputs, left, transpose)
    grad = _random(rng, tuple(expected.shape), dtype == np.complex128)
    expected_grads = torch.autograd.grad(expected, inputs, torch.from_numpy(grad))
    ours = [tw.from_numpy(t.detach().numpy().copy()).requires_grad_() for t in inputs]
    grads = tw.autograd.grad(tw.ormqr(*ours, left, transpose), ours, tw.from_numpy(grad))
    for g, e in zip(grads, expected_grads):
        np.testing.assert_allclose(g.numpy(), e.numpy(), rtol=1e-10, atol=1e-12)


# ---------------------------------------------------------------- svd_lowrank, pca_lowrank

def _assert_same_triplets(ours, theirs) -> None:
    """(U, S, V) equal, each singular pair up to the sign that LAPACK builds choose differently."""
    U, S, V = (t.numpy() for t in ours)
    tU, tS, tV = (t.numpy() for t in theirs)
    signs = np.sign((U * tU).sum(-2, keepdims=True))
    np.testing.assert_allclose(S, tS, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(U * signs, tU, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(V * signs, tV, rtol=1e-8, atol=1e-10)


def _with_torch_projection(monkeypatch, seed: int) -> None:
    """tilewise's range finder given the random matrix torch draws after ``torch.manual_seed(seed)``."""
    def projection(n, q, dtype, device):
        torch.manual_seed(seed)
        return tw.from_numpy(torch.randn(n, q, dtype=getattr(torch, dtype.name)).numpy()).to(device)

    monkeypatch.setattr(lowrank, "_random_projection", projection)


@pytest.mark.parametrize("shape", [(2, 9, 7), (7, 9)])
@pytest.mark.parametrize("with_mean", [False, True])
def test_svd_lowrank_follows_torch_s_algorithm(monkeypatch, shape, with_mean):
    """Given torch's random matrix, every output is torch's, singular vectors included (the same QRs and SVD; the
    SVD's LAPACK may sign a pair the other way)."""
    rng = np.random.default_rng(11)
    a = rng.standard_normal(shape)
    m = rng.standard_normal(shape[-1:]) if with_mean else None
    _with_torch_projection(monkeypatch, 5)
    ours = tw.svd_lowrank(tw.from_numpy(a), q=4, niter=3, M=None if m is None else tw.from_numpy(m))
    torch.manual_seed(5)
    theirs = torch.svd_lowrank(torch.from_numpy(a), q=4, niter=3, M=None if m is None else torch.from_numpy(m))
    _assert_same_triplets(ours, theirs)


def test_svd_lowrank_recovers_a_low_rank_matrix_whatever_the_draw():
    """With tilewise's own random numbers: the singular values of a rank-3 matrix are torch's (and exact), and
    U diag(S) V^H rebuilds it."""
    rng = np.random.default_rng(2)
    a = rng.standard_normal((2, 12, 3)) @ rng.standard_normal((2, 3, 8))
    U, S, V = tw.svd_lowrank(tw.from_numpy(a), q=5)
    _, tS, _ = torch.svd_lowrank(torch.from_numpy(a), q=5)
    np.testing.assert_allclose(S.numpy()[..., :3], tS.numpy()[..., :3], rtol=1e-10)
    np.testing.assert_allclose((U * S.unsqueeze(-2)).matmul(V.mT).numpy(), a, atol=1e-10)
    assert [tuple(t.shape) for t in (U, S, V)] == [(2, 12, 5), (2, 5), (2, 8, 5)]


def test_svd_lowrank_is_differentiable():
    rng = np.random.default_rng(4)
    a = rng.standard_normal((6, 2)) @ rng.standard_normal((2, 5))
    A = tw.from_numpy(a).requires_grad_()
    tw.svd_lowrank(A, q=2)[1].sum().backward()  # the nuclear norm of a rank-2 matrix: grad U V^T
    U, _, Vh = np.linalg.svd(a)
    np.testing.assert_allclose(A.grad.numpy(), U[:, :2] @ Vh[:2], atol=1e-8)


def test_pca_lowrank_as_torch(monkeypatch):
    rng = np.random.default_rng(9)
    a = rng.standard_normal((20, 5))
    _with_torch_projection(monkeypatch, 1)
    for center in (True, False):
        ours = tw.pca_lowrank(tw.from_numpy(a), q=3, center=center)
        torch.manual_seed(1)
        theirs = torch.pca_lowrank(torch.from_numpy(a), q=3, center=center)
        _assert_same_triplets(ours, theirs)
    assert [tuple(t.shape) for t in tw.pca_lowrank(tw.from_numpy(a))] == [(20, 5), (5,), (5, 5)]
    for kwargs in ({"q": 6}, {"q": -1}, {"niter": -1}):
        expected, actual = _raises_as_torch(lambda m, kwargs=kwargs: m.pca_lowrank(m.ones(20, 5), **kwargs))
        assert str(actual) == str(expected)


# ---------------------------------------------------------------- lobpcg

def _spectrum(m: int, rng) -> np.ndarray:
    Q, _ = np.linalg.qr(rng.standard_normal((m, m)))
    values = np.linspace(1, 10, m)
    values[-2:], values[0] = (15, 20), 0.1
    return (Q * values) @ Q.T


@pytest.mark.parametrize("method", ["ortho", "basic"])
@pytest.mark.parametrize("largest", [True, False])
def test_lobpcg_takes_torch_s_steps(method, largest):
    """From the same start, the same iterates: each step's converged count and residuals, and the eigenpairs."""
    rng = np.random.default_rng(0)
    a, x = _spectrum(30, rng), rng.standard_normal((30, 3))
    steps = {}

    def tracker(name):
        return lambda worker: steps.setdefault(name, []).append(
            (worker.ivars["istep"], worker.ivars["converged_count"], worker.tvars["rerr"].tolist()))

    E, X = tw.lobpcg(tw.from_numpy(a), k=2, X=tw.from_numpy(x.copy()), method=method, largest=largest,
                     tracker=tracker("tw"))
    tE, tX = torch.lobpcg(torch.from_numpy(a), k=2, X=torch.from_numpy(x.copy()), method=method, largest=largest,
                          tracker=tracker("torch"))
    assert [s[:2] for s in steps["tw"]] == [s[:2] for s in steps["torch"]]
    np.testing.assert_allclose([s[2] for s in steps["tw"]], [s[2] for s in steps["torch"]], rtol=1e-4, atol=1e-12)
    np.testing.assert_allclose(E.numpy(), tE.numpy(), rtol=1e-10)
    signs = np.sign((X.numpy() * tX.numpy()).sum(0))
    np.testing.assert_allclose(X.numpy() * signs, tX.numpy(), atol=1e-8)


def test_lobpcg_batches_and_generalized_problems():
    rng = np.random.default_rng(1)
    a = np.stack([_spectrum(24, rng), 2 * _spectrum(24, rng)])
    b = np.stack([np.diag(rng.uniform(1, 2, 24))] * 2)
    x = rng.standard_normal((2, 24, 2))
    E, X = tw.lobpcg(tw.from_numpy(a), k=2, B=tw.from_numpy(b), X=tw.from_numpy(x))
    tE, _ = torch.lobpcg(torch.from_numpy(a), k=2, B=torch.from_numpy(b), X=torch.from_numpy(x))
    np.testing.assert_allclose(E.numpy(), tE.numpy(), rtol=1e-8)
    np.testing.assert_allclose(a @ X.numpy(), b @ X.numpy() * E.numpy()[:, None, :], atol=1e-5)
    E, X = tw.lobpcg(tw.from_numpy(a[0]), k=1)  # a random start from tilewise's generator: the same eigenpair
    assert abs(E.item() - 20) < 1e-6 and tuple(X.shape) == (24, 1)


def test_lobpcg_gradient_as_torch():
    """The derivative of the computed eigenpairs of (A + A^T) / 2 (torch reaches it through a characteristic
    polynomial, tilewise by a solve on the complement of the eigenvectors: they agree to rounding)."""
    rng = np.random.default_rng(2)
    a, x, weights = _spectrum(30, rng), rng.standard_normal((30, 2)), rng.standard_normal((30, 30))
    grads = []
    for lib in (tw, torch):
        A = lib.from_numpy(a.copy()).requires_grad_()
        E, X = lib.lobpcg(A, k=2, X=lib.from_numpy(x.copy()))
        loss = (E * lib.from_numpy(np.array([1.0, -2.0]))).sum() + (X.matmul(X.mT) * lib.from_numpy(weights)).sum()
        loss.backward()
        grads.append(A.grad.numpy())
    np.testing.assert_allclose(grads[0], grads[1], atol=1e-8)


LOBPCG_ERRORS = {
    "too many pairs": lambda m: m.lobpcg(m.eye(5, dtype=m.float64), k=2),
    "not square": lambda m: m.lobpcg(m.ones(6, 5, dtype=m.float64), k=1),
    "B's shape": lambda m: m.lobpcg(m.eye(6, dtype=m.float64), k=1, B=m.eye(5, dtype=m.float64)),
    "a start of another shape": lambda m: m.lobpcg(m.eye(9, dtype=m.float64), k=1, X=m.ones(8, 1, dtype=m.float64)),
    "backward with B": lambda m: m.lobpcg(m.diag(m.arange(1.0, 10.0, dtype=m.float64)).requires_grad_(), k=1,
                                          B=m.eye(9, dtype=m.float64), X=m.ones(9, 1, dtype=m.float64))[0].backward(),
}


@pytest.mark.parametrize("case", LOBPCG_ERRORS.values(), ids=LOBPCG_ERRORS.keys())
def test_lobpcg_refuses_as_torch(case):
    expected, actual = _raises_as_torch(case)
    assert str(actual) == str(expected).replace("torch.", "tilewise.")


# ---------------------------------------------------------------- CUDA (cuSOLVER sytrf, geqrf, ormqr)

@pytest.mark.cuda
def test_ldl_geqrf_and_ormqr_on_cuda_agree_with_the_cpu():
    rng = np.random.default_rng(5)
    a = rng.standard_normal((2, 6, 6))
    host = tw.linalg.ldl_factor_ex(tw.from_numpy(a))
    device = tw.linalg.ldl_factor_ex(tw.from_numpy(a).cuda())
    assert device.LD.device.type == "cuda" and device.LD.stride() == host.LD.stride()
    assert device.pivots.cpu().tolist() == host.pivots.tolist() and device.info.cpu().tolist() == [0, 0]
    np.testing.assert_allclose(device.LD.cpu().numpy(), host.LD.numpy(), atol=1e-10)
    b = rng.standard_normal((2, 6, 3))
    x = tw.linalg.ldl_solve(device.LD, device.pivots, tw.from_numpy(b).cuda())
    np.testing.assert_allclose(x.cpu().numpy(), tw.linalg.ldl_solve(host.LD, host.pivots, tw.from_numpy(b)).numpy(),
                               atol=1e-10)
    r = rng.standard_normal((2, 5, 3))
    reflectors, tau = tw.geqrf(tw.from_numpy(r).cuda())
    h_reflectors, h_tau = tw.geqrf(tw.from_numpy(r))
    np.testing.assert_allclose(reflectors.cpu().numpy(), h_reflectors.numpy(), atol=1e-10)
    np.testing.assert_allclose(tau.cpu().numpy(), h_tau.numpy(), atol=1e-10)
    c = rng.standard_normal((2, 4, 5))
    for left, transpose in ((False, False), (False, True)):
        ours = tw.ormqr(reflectors, tau, tw.from_numpy(c).cuda(), left, transpose)
        np.testing.assert_allclose(ours.cpu().numpy(),
                                   tw.ormqr(h_reflectors, h_tau, tw.from_numpy(c), left, transpose).numpy(), atol=1e-10)
    left_product = tw.ormqr(reflectors, tau, tw.from_numpy(c.swapaxes(-1, -2)).cuda(), True, True)
    np.testing.assert_allclose(left_product.cpu().numpy(),
                               tw.ormqr(h_reflectors, h_tau, tw.from_numpy(c.swapaxes(-1, -2)), True, True).numpy(),
                               atol=1e-10)


@pytest.mark.parametrize("shape", [(5, 3), (3, 5), (4, 4)])
def test_orthogonal_householder_without_trivialization_starts_from_geqrf_as_torch(shape):
    weights = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    results = []
    for lib in (tw, torch):
        layer = lib.nn.Linear(shape[1], shape[0], bias=False)
        layer.weight.data = lib.from_numpy(weights.copy())
        lib.nn.utils.parametrizations.orthogonal(layer, orthogonal_map="householder", use_trivialization=False)
        results.append(layer.weight.detach().numpy())
    np.testing.assert_allclose(results[0], results[1], atol=1e-6)

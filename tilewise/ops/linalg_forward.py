"""Tangents of the matrix decompositions and solvers, as torch writes them (FunctionsManual.cpp's ``*_jvp``).

[Note: linalg tangents] The companions of ``linalg_grads``: each is torch's forward rule in tilewise operators,
so that a tangent agrees with torch's elementwise where the rule is a convention (Cholesky's and eigh's read the
whole tangent, not only the triangle the factorization reads). Complex inputs reach the solvers' helpers (solve,
inv, det, slogdet), as there.
Each returns one tangent per output of its operator (None for outputs without one: info codes, ranks).
"""

# ruff: noqa: N803, N806 — matrices are named as in torch's linalg and the literature (A, B, L, U, S, Vh)

from __future__ import annotations

from tilewise.ops.formulas import HELPERS
from tilewise.ops.linalg_grads import _diag_embed, _solve, _solve_triangular, check_qr_differentiable


def _op(name: str):
    from tilewise.ops.registry import OPS

    return OPS[name]


def _trace(X):
    return X.diagonal(0, -2, -1).sum(-1)


def linalg_solve_jvp(A, A_t, B_t, X):
    """X = A^-1 B: dX = A^-1 (dB - dA X)."""
    return _solve(A, B_t - A_t.matmul(X)), None


def linalg_inv_jvp(A_t, inverse):
    return -inverse.matmul(A_t.matmul(inverse)), None


def linalg_det_jvp(A, A_t, det):
    """d det = det tr(A^-1 dA); zero where the determinant is exactly zero, as the backward's gradient is."""
    singular = (det == 0).unsqueeze(-1).unsqueeze(-1)
    eye = _eye(A).expand(A.shape)
    return det * _trace(_solve(A.where(~singular, eye), A_t))


def slogdet_jvp(A, A_t, sign):
    """d log|det| = Re tr(A^-1 dA); the sign of a real determinant is locally constant, a complex one turns by
    i Im tr(A^-1 dA)."""
    trace = _trace(_solve(A, A_t))
    if A.dtype.is_complex:
        return sign * (trace.imag * 1j), trace.real
    return None, trace


def _eye(A):
    from tilewise.ops.creation import eye

    return eye(A.shape[-1], dtype=A.dtype, device=A.device)


def cholesky_jvp(A_t, L, upper: bool):
    """torch's: dL = L Phi(L^-1 dA L^-H), Phi the lower triangle with half the diagonal."""
    L_ = L.mT if upper else L
    dL = _solve_triangular(L_, A_t, upper=False, left=True)
    dL = _solve_triangular(L_.mT, dL, upper=True, left=False)
    dL = dL.tril() - 0.5 * _diag_embed(dL.diagonal(0, -2, -1))
    dL = L_.matmul(dL)
    return (dL.mT if upper else dL), None


def eigh_jvp(A, A_t, UPLO, L, V):
    """dL = diag(V^H dA V), dV = V ((V^H dA V) / E) with E_ij = L_j - L_i and a zero diagonal (torch's
    linalg_eig_jvp, hermitian)."""
    if V.numel() == 0 and A.numel():  # the eigenvalues alone: the vectors they are differentiated with
        V = _op("_linalg_eigh")(A, UPLO, True)[1]
    dP = V.mT.matmul(A_t).matmul(V)
    dL = dP.diagonal(0, -2, -1)
    E = L.unsqueeze(-2) - L.unsqueeze(-1)
    E = E + _diag_embed(L * 0 + 1)
    dV = V.matmul(_off_diagonal(dP / E))
    return dL, dV


def _off_diagonal(X):
    return X - _diag_embed(X.diagonal(0, -2, -1))


def linalg_qr_jvp(A_t, Q, R, mode: str):
    """torch's linalg_qr_jvp. m >= n: with dX = dA R^-1, dR R^-1 = syminv(sym(Q^H dX)) (the upper triangle with
    half the diagonal of Q^H dX + dX^H Q) and dQ = dX - Q dR R^-1. m < n: the square QR of A's first m columns,
    and dR = Q^H (dA - dQ R)."""
    m, n = check_qr_differentiable(Q, R, mode)
    if m >= n:
        return _qr_jvp_tall(A_t, Q, R)
    dQ, _ = _qr_jvp_tall(A_t.narrow(-1, 0, m), Q, R.narrow(-1, 0, m))
    return dQ, Q.mT.matmul(A_t - dQ.matmul(R))


def _qr_jvp_tall(A_t, Q, R):
    dX = _solve_triangular(R, A_t, upper=True, left=False)
    QhdX = Q.mT.matmul(dX)
    sym = QhdX + QhdX.mT
    dRRinv = sym.triu() - 0.5 * _diag_embed(sym.diagonal(0, -2, -1))
    return dX - Q.matmul(dRRinv), dRRinv.matmul(R)


def svd_jvp(A, A_t, U_, S, Vh_, full_matrices: bool, compute_uv: bool):
    """torch's linalg_svd_jvp (real): dP = U^H dA V, dS = diag(dP), dU = U (sym(dP S) / E) plus the part of dA V S^-1
    outside U's span, dVh = -(sym(S dP) / E) Vh plus its counterpart; E_ij = S_j^2 - S_i^2."""
    if not compute_uv:  # the singular values alone: differentiated with the vectors
        U_, _, Vh_ = _op("_linalg_svd")(A, False, True)
    m, n, k = A.shape[-2], A.shape[-1], S.shape[-1]
    U = U_.narrow(-1, 0, k) if full_matrices else U_
    Vh = Vh_.narrow(-2, 0, k) if full_matrices else Vh_
    V = Vh.mT
    dP = U.mT.matmul(A_t.matmul(V))
    dS = dP.diagonal(0, -2, -1)
    if not compute_uv:
        return None, dS, None
    dP = dP - _diag_embed(dS)
    S2 = S * S
    E = S2.unsqueeze(-2) - S2.unsqueeze(-1)
    E = E + _diag_embed(S2 * 0 + 1)
    scaled = dP * S.unsqueeze(-2)
    dU = U.matmul((scaled + scaled.mT) / E)
    if m > k:
        dAVSinv = A_t.matmul(V / S.unsqueeze(-2))
        dU = dU + dAVSinv - U.matmul(U.mT.matmul(dAVSinv))
        if full_matrices:
            dU = _op("cat")([dU, dU.new_zeros((*dU.shape[:-1], m - k))], -1)
    scaled = dP * (-S).unsqueeze(-1)
    dVh = ((scaled + scaled.mT) / E).matmul(Vh)
    if n > k:
        SinvUhdA = (U.mT / S.unsqueeze(-1)).matmul(A_t)
        dVh = dVh + SinvUhdA - SinvUhdA.matmul(V).matmul(Vh)
        if full_matrices:
            dVh = _op("cat")([dVh, dVh.new_zeros((*dVh.shape[:-2], n - k, n))], -2)
    return dU, dS, dVh


def solve_triangular_jvp(A_t, B_t, A, X, upper: bool, left: bool, unitriangular: bool):
    """torch's: the tangent of A restricted to the triangle the solve reads; dX = op^-1 (dB - dA X) (left) or
    (dB - X dA) op^-1 (right)."""
    read = A_t.triu(int(unitriangular)) if upper else A_t.tril(-int(unitriangular))
    rhs = B_t - read.matmul(X) if left else B_t - X.matmul(read)
    return _solve_triangular(A, rhs, upper=upper, left=left, unitriangular=unitriangular)


def pinv_jvp(A, A_t, pinvA):
    """d A^+ = -A^+ dA A^+ + A^+ A^+^H dA^H (I - A A^+) + (I - A^+ A) dA^H A^+^H A^+ (a constant rank)."""
    dAh, pinvAh = A_t.mT, pinvA.mT
    first = -pinvA.matmul(A_t).matmul(pinvA)
    left = pinvA.matmul(pinvAh)
    second = left.matmul(dAh) - left.matmul(dAh).matmul(A).matmul(pinvA)
    right = pinvAh.matmul(pinvA)
    third = dAh.matmul(right) - pinvA.matmul(A).matmul(dAh).matmul(right)
    return first + second + third


def lstsq_jvp(A, B, A_t, B_t, X, residuals):
    """torch's: dX = d(A^+) B + A^+ dB; the residuals |A X - B|^2 per column, at a least-squares solution, move by
    2 <A X - B, dA X - dB> (A^H (A X - B) = 0 takes the dX term away)."""
    pinvA = _op("linalg_pinv")(A)
    dX = pinv_jvp(A, A_t, pinvA).matmul(B) + pinvA.matmul(B_t)
    dres = None
    if residuals.numel():
        dres = 2 * ((A.matmul(X) - B) * (A_t.matmul(X) - B_t)).sum(-2)
    return dX, dres, None, None


def matrix_exp_jvp(A, A_t):
    """The Frechet derivative: exp([[A, dA], [0, A]]) top right block."""
    cat = _op("cat")
    n = A.shape[-1]
    top = cat([A, A_t], -1)
    bottom = cat([A * 0, A], -1)
    big = _op("_linalg_matrix_exp")(cat([top, bottom], -2))
    return big.narrow(-2, 0, n).narrow(-1, n, n)


def cholesky_solve_jvp(X, L, L_t, B_t, upper: bool):
    """torch's: dA = dK + dK^H with dK = dU^H U (upper) or dL L^H, then dX = (L L^H)^-1 (dB - dA X)."""
    dK = L_t.mT.matmul(L) if upper else L_t.matmul(L.mT)
    dA = dK + dK.mT
    return _op("cholesky_solve")(B_t - dA.matmul(X), L, upper)


def lu_factor_ex_jvp(A_t, LU, pivots, pivot: bool):
    """torch's: with dK = L^{-1} P^T dA U^{-1}, dL = L (dK)_strictly-lower and dU = (dK)_upper U, packed as the
    factors are; the part of a wide U (of a tall L) beyond the square block follows from its own rows (columns)."""
    from tilewise.ops.linalg_grads import lu_unpacked

    P, L, U = lu_unpacked(LU, pivots)
    m, n = LU.shape[-2], LU.shape[-1]
    k = min(m, n)
    PdA = P.mT.matmul(A_t) if pivot else A_t
    if m == n:
        dK = _solve_triangular(U, _solve_triangular(L, PdA, upper=False, unitriangular=True), upper=True, left=False)
        return L.matmul(dK.tril(-1)) + dK.triu().matmul(U), None, None
    if m < n:
        U1, U2 = U[..., :k], U[..., k:]
        dK = _solve_triangular(U1, _solve_triangular(L, PdA[..., :k], upper=False, unitriangular=True), upper=True,
                               left=False)
        dU2 = _solve_triangular(L, PdA[..., k:], upper=False, unitriangular=True) - dK.tril(-1).matmul(U2)
        return _op("cat")([L.matmul(dK.tril(-1)) + dK.triu().matmul(U1), dU2], -1), None, None
    L1, L2 = L[..., :k, :], L[..., k:, :]
    dK = _solve_triangular(U, _solve_triangular(L1, PdA[..., :k, :], upper=False, unitriangular=True), upper=True,
                           left=False)
    dL2 = _solve_triangular(U, PdA[..., k:, :], upper=True, left=False) - L2.matmul(dK.triu())
    return _op("cat")([L1.matmul(dK.tril(-1)) + dK.triu().matmul(U), dL2], -2), None, None


def linalg_eig_jvp(A_t, L, V):
    """torch's: with dK = V^{-1} dA V, dL = diag(dK) and dV = V (dK / E off the diagonal), less V times the real
    part of the diagonal of V^H dV, which keeps each eigenvector of unit norm."""
    dA = A_t.to(V.dtype)
    dK = _solve(V, dA.matmul(V))
    dL = dK.diagonal(0, -2, -1)
    E = L.unsqueeze(-2) - L.unsqueeze(-1)
    eye = _op("eye")(L.shape[-1], dtype=V.dtype, device=V.device).expand(E.shape)
    dV = V.matmul(dK / (E + eye) * (1 - eye))
    dV = dV - V * V.mH.matmul(dV).diagonal(0, -2, -1).real.unsqueeze(-2)
    return dL, dV


HELPERS.update({name: obj for name, obj in globals().items() if name.endswith("_jvp") and callable(obj)})

"""Derivatives of the matrix decompositions and solvers, as torch defines them (FunctionsManual.cpp).

[Note: linalg derivatives] Each helper is written in tilewise operators, so a backward is itself
differentiable and runs on any device. The formulas are torch's: where a derivative is a convention rather
than the only answer (Cholesky's gradient is symmetrised, eigh's is not; a triangular solve's gradient keeps
the triangle the solver read), torch's convention is the one followed, so gradients match torch elementwise,
not only up to the part that affects a loss. Complex matrices reach the solvers' helpers (solve, inv, det,
slogdet, on the CPU), which conjugate-transpose (``mH``) as torch's do; the decompositions take real inputs
only, so torch's checks that a complex loss does not depend on the phase of singular vectors have nothing to
check here.
"""

# ruff: noqa: N803, N806 — matrices are named as in torch's linalg and the literature (A, B, L, U, S, Vh)

from __future__ import annotations

from tilewise.ops.formulas import HELPERS


def _op(name: str):
    from tilewise.ops.registry import OPS

    return OPS[name]


def _eye_like(A):
    from tilewise.ops.creation import eye

    return eye(A.shape[-1], dtype=A.dtype, device=A.device)


def _diag_embed(v):
    return v.diag_embed()


def _solve_triangular(A, B, upper: bool, left: bool = True, unitriangular: bool = False):
    return _op("_linalg_solve_triangular")(A, B, upper=upper, left=left, unitriangular=unitriangular)


def _solve(A, B):
    """A X = B for square A and B of A's batch shape (no broadcasting, no error check)."""
    return _op("_linalg_solve")(A, B)[0]


def linalg_solve_backward(grad, A, X):
    """X = A^{-1} B: gB = A^{-H} g, gA = -gB X^H."""
    gB = _solve(A.mH, grad)
    return -gB.matmul(X.mH), gB


def linalg_inv_backward(grad, inverse):
    inv_h = inverse.mH
    return -inv_h.matmul(grad.matmul(inv_h))


def linalg_det_backward(grad, det, A):
    """d det / dA = det A^{-H}. A matrix whose determinant is exactly zero gets a zero gradient, as in torch: it is
    solved against the identity in its place, and its right-hand side (grad * det) is zero anyway."""
    singular = (det == 0).unsqueeze(-1).unsqueeze(-1)
    eye = _eye_like(A).expand(A.shape)
    safe = A.where(~singular, eye)
    scaled = (grad * det.conj()).unsqueeze(-1).unsqueeze(-1)
    return _solve(safe.mH, scaled * eye)


def slogdet_backward(output_grads, A, sign):
    """A^H G = g I with g the logarithm's gradient; for a complex matrix the sign's gradient adds
    -i Im(conj(g_sign) sign) to g (the determinant is holomorphic), as torch's. torch saves the sign too, so
    changing it in place is an error here too."""
    grad_sign, grad_logabsdet = output_grads
    if A.dtype.is_complex:
        g = grad_logabsdet.to(A.dtype) if grad_logabsdet is not None else None
        if grad_sign is not None:
            turn = (grad_sign.conj() * sign).imag * -1j
            g = turn if g is None else g + turn
    else:
        g = grad_logabsdet
    if g is None:
        return None
    scaled = g.unsqueeze(-1).unsqueeze(-1) * _eye_like(A).expand(A.shape)
    return _solve(A.mH, scaled)


def cholesky_backward(grad, upper: bool, L):
    """Murray (2016): gA = L^{-H} Phi(L^H gL) L^{-1}, Phi = lower triangle with half the diagonal; symmetrised."""
    if upper:
        L, grad = L.mT, grad.mT
    phi = L.mT.matmul(grad).tril()
    phi = phi - 0.5 * _diag_embed(phi.diagonal(0, -2, -1))
    gA = _solve_triangular(L.mT, phi, upper=True, left=True)
    gA = _solve_triangular(L, gA, upper=False, left=False)
    return (gA + gA.mT) * 0.5


def _sym_inv_adj(X):
    """X + X^H with the diagonal halved once (torch's syminvadj)."""
    ret = X + X.mT
    return ret - 0.5 * _diag_embed(ret.diagonal(0, -2, -1))


def _copyltu(X):
    """The lower triangle mirrored onto the upper (torch's trilImInvAdjSkew for real matrices): tril(X) - tril(X)^H."""
    lower = X.tril(-1)
    return lower - lower.mT


def check_qr_differentiable(Q, R, mode: str) -> tuple[int, int]:
    """(m, n) of a QR whose derivative exists (either direction), else torch's error."""
    if mode == "r":
        raise RuntimeError("The derivative of linalg.qr depends on Q, which is not computed when mode='r'. Please use "
                           "linalg.qr(A, mode='reduced') if you are going to differentiate through linalg.qr.")
    m, n = Q.shape[-2], R.shape[-1]
    if mode == "complete" and m > n:
        raise RuntimeError("The QR decomposition is not differentiable when mode='complete' and nrows > ncols.")
    return m, n


def linalg_qr_backward(output_grads, Q, R, mode: str):
    gQ, gR = output_grads
    m, n = check_qr_differentiable(Q, R, mode)
    if m >= n:
        return _qr_backward_tall(gQ, gR, Q, R)
    # A = Q [X | Y] with X = Q R1 square: Y's gradient goes through Q only
    R1, R2 = R.narrow(-1, 0, m), R.narrow(-1, m, n - m)
    Y = Q.matmul(R2)
    gY = Q.matmul(gR.narrow(-1, m, n - m)) if gR is not None else None
    gQ_x = gQ
    if gR is not None:
        extra = Y.matmul(gR.narrow(-1, m, n - m).mT)
        gQ_x = extra if gQ_x is None else gQ_x + extra
    gR1 = gR.narrow(-1, 0, m) if gR is not None else None
    gX = _qr_backward_tall(gQ_x, gR1, Q, R1)
    if gY is None:
        gY = Y * 0
    return _cat_last(gX, gY)


def _cat_last(a, b):
    from tilewise.ops.registry import OPS

    return OPS["cat"]([a, b], -1)


def _qr_backward_tall(gQ, gR, Q, R):
    """m >= n: gA = [gQ + Q syminvadj(triu(gR R^H - Q^H gQ))] R^{-H}."""
    if gQ is not None and gR is not None:
        M = gR.matmul(R.mT) - Q.mT.matmul(gQ)
    elif gQ is not None:
        M = -Q.mT.matmul(gQ)
    else:
        M = gR.matmul(R.mT)
    gA = Q.matmul(_sym_inv_adj(M.triu()))
    if gQ is not None:
        gA = gA + gQ
    return _solve_triangular(R.mT, gA, upper=False, left=False)


def svd_backward(output_grads, U, S, Vh, full_matrices: bool):
    gU, gS, gVh = output_grads
    k = S.shape[-1]
    if full_matrices:
        U, Vh = U.narrow(-1, 0, k), Vh.narrow(-2, 0, k)
        gU = gU.narrow(-1, 0, k) if gU is not None else None
        gVh = gVh.narrow(-2, 0, k) if gVh is not None else None
    if gU is None and gVh is None:
        return U.matmul(gS.unsqueeze(-1) * Vh) if gS is not None else None
    m, n = U.shape[-2], Vh.shape[-1]
    V = Vh.mT
    gV = gVh.mT if gVh is not None else None
    UhgU = _skew(U.mT.matmul(gU)) if gU is not None else None
    VhgV = _skew(Vh.matmul(gV)) if gV is not None else None
    S2 = S * S
    E = S2.unsqueeze(-2) - S2.unsqueeze(-1)
    E = E + _diag_embed(S2 * 0 + 1)  # E's diagonal is 0; the entries divided there are 0 too
    if gU is not None and gV is not None:
        gA = (UhgU * S.unsqueeze(-2) + S.unsqueeze(-1) * VhgV) / E
    elif gU is not None:
        gA = (UhgU / E) * S.unsqueeze(-2)
    else:
        gA = S.unsqueeze(-1) * (VhgV / E)
    if gS is not None:
        gA = gA + _diag_embed(gS)
    if m > n and gU is not None:
        gA = U.matmul(gA)
        gUSinv = gU / S.unsqueeze(-2)
        gA = gA + gUSinv - U.matmul(U.mT.matmul(gUSinv))
        return gA.matmul(Vh)
    if m < n and gV is not None:
        gA = gA.matmul(Vh)
        SinvgVh = gV.mT / S.unsqueeze(-1)
        gA = gA + SinvgVh - SinvgVh.matmul(V).matmul(Vh)
        return U.matmul(gA)
    return U.matmul(gA).matmul(Vh) if m < n else U.matmul(gA.matmul(Vh))


def _skew(X):
    return X - X.mT


def eigh_backward(output_grads, L, V):
    """gA = V (skew(V^H gV) / E + diag(gL)) V^H with E_ij = L_j - L_i (torch's linalg_eig_backward, hermitian)."""
    gL, gV = output_grads
    if gV is None:
        return V.matmul(gL.unsqueeze(-1) * V.mT) if gL is not None else None
    VhgV = V.mT.matmul(gV)
    VhgV = 0.5 * (VhgV - VhgV.mT)
    E = L.unsqueeze(-2) - L.unsqueeze(-1)
    E = E + _diag_embed(L * 0 + 1)
    ret = VhgV / E
    if gL is not None:
        ret = ret - _diag_embed(ret.diagonal(0, -2, -1)) + _diag_embed(gL)
    return V.matmul(ret.matmul(V.mT))


def solve_triangular_backward(grad, A, X, upper: bool, left: bool, unitriangular: bool):
    gB = _solve_triangular(A.mT, grad, upper=not upper, left=left, unitriangular=unitriangular)
    gA = -gB.matmul(X.mT) if left else -X.mT.matmul(gB)
    gA = gA.triu(int(unitriangular)) if upper else gA.tril(-int(unitriangular))
    return gA, gB


def triangular_solve_backward(output_grads, b, A, X, upper: bool, transpose: bool, unitriangular: bool):
    """torch.triangular_solve: the solution's gradient as linalg.solve_triangular's on op(A), plus the cloned
    coefficient's, which is the identity."""
    gX, gA_clone = output_grads
    gA = gb = None
    if gX is not None:
        coefficient = A.mT if transpose else A
        gA, gb = solve_triangular_backward(gX, coefficient, X, upper != transpose, True, unitriangular)
        gA = gA.mT if transpose else gA
    if gA_clone is not None:
        gA = gA_clone if gA is None else gA + gA_clone
    return gb, gA


def pinv_backward(grad, pinvA, A):
    m, n = A.shape[-2], A.shape[-1]
    pinvAh, gradh = pinvA.mT, grad.mT
    if m <= n:
        K = gradh.matmul(pinvA)
        KpinvAh = K.matmul(pinvAh)
        return (-(pinvA.matmul(K)).mT + KpinvAh - A.matmul(pinvA).matmul(KpinvAh)
                + pinvAh.matmul(pinvA).matmul(gradh - K.matmul(A)))
    K = pinvA.matmul(gradh)
    pinvAhK = pinvAh.matmul(K)
    return (-(K.matmul(pinvA)).mT + (gradh - A.matmul(K)).matmul(pinvA).matmul(pinvAh) + pinvAhK
            - pinvAhK.matmul(pinvA).matmul(A))


def lstsq_backward(output_grads, A, B, X):
    """The solution's gradient through pinv(A) (torch's rule), plus the residuals' (which at a least-squares
    solution does not depend on X: A^H (A X - B) = 0)."""
    gX, gRes = output_grads[0], output_grads[1]
    pinvA = _op("linalg_pinv")(A)
    gA = gB = None
    if gX is not None:
        gA = pinv_backward(gX.matmul(B.mT), pinvA, A)
        gB = pinvA.mT.matmul(gX)
    if gRes is not None and gRes.numel():
        r = (A.matmul(X) - B) * gRes.unsqueeze(-2) * 2
        gA = r.matmul(X.mT) if gA is None else gA + r.matmul(X.mT)
        gB = -r if gB is None else gB - r
    return gA, gB


def matrix_exp_backward(A, grad):
    """The Frechet derivative in the direction of grad, adjoint: exp([[A^H, G], [0, A^H]]) top right block."""
    from tilewise.ops.registry import OPS

    n = A.shape[-1]
    Ah = A.mT
    top = OPS["cat"]([Ah, grad], -1)
    bottom = OPS["cat"]([Ah * 0, Ah], -1)
    big = OPS["_linalg_matrix_exp"](OPS["cat"]([top, bottom], -2))
    return big.narrow(-2, 0, n).narrow(-1, n, n)


def cholesky_solve_backward(grad, B, L, X, upper: bool):
    gB = _op("cholesky_solve")(grad, L, upper)
    common = gB.matmul(X.mT)
    common = common + common.mT
    gL = -L.matmul(common) if upper else -common.matmul(L)
    return gB, gL


def cholesky_inverse_backward(grad, L, upper: bool, inverse):
    common = grad + grad.mT
    common = inverse.matmul(common.matmul(inverse))
    return -L.matmul(common) if upper else -common.matmul(L)


def cholesky_inverse_jvp(L, L_t, upper: bool, inverse):
    """d (A^-1) = -A^-1 dA A^-1 with A = L L^H (U^H U when upper); the factor's other triangle is never read, so
    neither it nor its tangent there counts (torch 2.13's rule, -X dL X L^H + h.c., disagrees with finite
    differences)."""
    L, L_t = (L.triu(), L_t.triu()) if upper else (L.tril(), L_t.tril())
    dA = L_t.mH.matmul(L) + L.mH.matmul(L_t) if upper else L_t.matmul(L.mH) + L.matmul(L_t.mH)
    return -inverse.matmul(dA.matmul(inverse))


def triangular_solve_jvp(b_t, A, A_t, X, upper: bool, transpose: bool, unitriangular: bool):
    """op(A) X = b: d X = op(A)^-1 (d b - op(d A) X), with d A restricted to the triangle the solve reads; the
    cloned coefficient's tangent is A's."""
    from tilewise.ops.registry import OPS

    read = A_t.triu(int(unitriangular)) if upper else A_t.tril(-int(unitriangular))
    rhs = b_t - (read.mT if transpose else read).matmul(X)
    return OPS["triangular_solve"](rhs, A, upper, transpose, unitriangular)[0], A_t


_EIG_PHASE = ("linalg_eig_backward: The eigenvectors in the complex case are specified up to multiplication by "
              "e^{i phi}. The specified loss function depends on this quantity, so it is ill-defined.")


def linalg_eig_backward(output_grads, A, L, V):
    """torch's: gA = V^{-H} (diag(gL) + (V^H gV - V^H V diag(Re(V^H gV))) / conj(E)) V^H with E_ij = L_j - L_i off the
    diagonal; a loss that depends on the eigenvectors' phases is refused, as torch refuses it; a real A takes the real
    part."""
    from tilewise.dispatch import values_readable

    gL, gV = output_grads
    if gL is None and gV is None:
        return None
    if gV is not None:
        VhgV = V.mH.matmul(gV)
        diagonal = VhgV.diagonal(0, -2, -1)
        if values_readable(diagonal) and not bool((diagonal.imag.abs() <= 1e-2).all()):  # torch's allclose to 0
            raise RuntimeError(_EIG_PHASE)
        gA = VhgV - V.mH.matmul(V * diagonal.real.unsqueeze(-2))
        Lc = L.conj()
        E = Lc.unsqueeze(-2) - Lc.unsqueeze(-1)
        eye = _eye_like(E).to(E.dtype).expand(E.shape)
        gA = gA / (E + eye) * (1 - eye)
        if gL is not None:
            gA = gA + gL.diag_embed()
    else:
        gA = gL.diag_embed()
    gA = _solve(V.mH, gA.matmul(V.mH))
    return gA if A.dtype.is_complex else gA.real


def lu_unpacked(LU, pivots):
    """(P, L, U) of a factorization (``lu_unpack``'s), for the derivative below."""
    return _op("lu_unpack")(LU, pivots)


def linalg_lu_backward(L_grad, U_grad, P, L, U, pivot: bool):
    """A = P L U, with L (m x k) unit lower and U (k x n) upper: torch's formula in its three shapes. Square:
    A_grad = P L^{-H} [L^H L_grad o 1_L + U_grad U^H o 1_U] U^{-H}; wide and tall add the part of U (of L)
    beyond the square block, which L (U) maps directly."""
    m, n = L.shape[-2], U.shape[-1]
    k = min(m, n)
    if m == n:
        A_grad = L.mH.matmul(L_grad).tril(-1) + U_grad.matmul(U.mH).triu()
        A_grad = _solve_triangular(U.mH, A_grad, upper=False, left=False)
        A_grad = _solve_triangular(L.mH, A_grad, upper=True, unitriangular=True)
    elif m < n:  # wide: U = [U1 U2]
        U1, U1_grad, U2_grad = U[..., :k], U_grad[..., :k], U_grad[..., k:]
        A_grad = L.mH.matmul(L_grad) - U_grad.triu().matmul(U.mH)
        A_grad = _solve_triangular(U1.mH, A_grad.tril(-1), upper=False, left=False)
        A_grad = _op("cat")([A_grad + U1_grad.triu(), U2_grad], -1)
        A_grad = _solve_triangular(L.mH, A_grad, upper=True, unitriangular=True)
    else:  # tall: L = [L1; L2]
        L1, L1_grad, L2_grad = L[..., :k, :], L_grad[..., :k, :], L_grad[..., k:, :]
        A_grad = U_grad.matmul(U.mH) - L.mH.matmul(L_grad.tril(-1))
        A_grad = _solve_triangular(L1.mH, A_grad.triu(), upper=True, unitriangular=True)
        A_grad = _op("cat")([A_grad + L1_grad.tril(-1), L2_grad], -2)
        A_grad = _solve_triangular(U.mH, A_grad, upper=False, left=False)
    return P.matmul(A_grad) if pivot else A_grad


def lu_factor_ex_backward(grad, LU, pivots, pivot: bool):
    """The gradient reaching the packed factors: its strictly lower part is L's, its upper part U's."""
    P, L, U = lu_unpacked(LU, pivots)
    k = min(LU.shape[-2], LU.shape[-1])
    return linalg_lu_backward(grad[..., :k].tril(-1), grad[..., :k, :].triu(), P, L, U, pivot)


HELPERS.update(cholesky_inverse_jvp=cholesky_inverse_jvp, triangular_solve_jvp=triangular_solve_jvp,
               lu_factor_ex_backward=lu_factor_ex_backward, linalg_eig_backward=linalg_eig_backward)
HELPERS.update(linalg_solve_backward=linalg_solve_backward, linalg_inv_backward=linalg_inv_backward,
               linalg_det_backward=linalg_det_backward, slogdet_backward=slogdet_backward,
               cholesky_backward=cholesky_backward, linalg_qr_backward=linalg_qr_backward, svd_backward=svd_backward,
               eigh_backward=eigh_backward, solve_triangular_backward=solve_triangular_backward,
               pinv_backward=pinv_backward, triangular_solve_backward=triangular_solve_backward,
               lstsq_backward=lstsq_backward, matrix_exp_backward=matrix_exp_backward,
               cholesky_solve_backward=cholesky_solve_backward, cholesky_inverse_backward=cholesky_inverse_backward)

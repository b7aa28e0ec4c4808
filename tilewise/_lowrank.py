"""Randomized low-rank SVD and PCA (``tilewise.svd_lowrank``, ``tilewise.pca_lowrank``), torch's Python functions.

[Note: randomized range finder] Halko, Martinsson and Tropp (2009): multiply A by a random n x q Gaussian matrix,
orthonormalize the product (QR), and refine it by ``niter`` rounds of power iteration, each orthonormalizing
A^H Q and then A Q again (Algorithm 4.4); the SVD of the small q x n matrix Q^H A then gives A's leading singular
triplets (Algorithm 5.1). A wide matrix is factored through its adjoint, so the projection always has
min(m, n) rows. ``M``, a matrix to subtract from A, is never subtracted: each product with A has its product with
M taken away. The random matrix is drawn with ``tilewise.randn`` from the default generator, as torch draws it
from its own; the two generators differ (torch's CPU generator is a Mersenne twister, tilewise's is Philox), so
the same seed gives other projections, and the results agree with torch's where the algorithm's output does not
depend on them: the singular values and the product U diag(S) V^H of a matrix of rank at most q, and with
rounding-level differences whenever the same random matrix is used (``tests/test_linalg_ldl_qr_lowrank.py``).

>>> import tilewise as tw
>>> A = tw.randn(8, 2) @ tw.randn(2, 6)
>>> U, S, V = tw.svd_lowrank(A, q=4)
>>> bool(((U * S) @ V.mT - A).abs().max() < 1e-4)
True
"""

# ruff: noqa: N803, N806 — matrices are named as in torch's linalg and the literature (A, M, Q, U, S, V)

from __future__ import annotations

from tilewise import linalg
from tilewise.dtypes import float16, float32, float64
from tilewise.ops.creation import randn
from tilewise.tensor import Tensor

__all__ = ["svd_lowrank", "pca_lowrank"]


def _projection_dtype(A: Tensor):
    """torch's choice: a complex matrix keeps its dtype, a real floating one too, anything else is float32."""
    if A.dtype.is_complex or A.dtype in (float16, float32, float64):
        return A.dtype
    return float32


def _random_projection(n: int, q: int, dtype, device) -> Tensor:
    return randn(n, q, dtype=dtype, device=device)


def _orthonormal_columns(X: Tensor) -> Tensor:
    return linalg.qr(X).Q


def _times(A: Tensor, M: Tensor | None, X: Tensor) -> Tensor:
    """(A - M) X, without forming A - M."""
    product = A.matmul(X)
    return product if M is None else product - M.matmul(X)


def _approximate_basis(A: Tensor, q: int, niter: int | None, M: Tensor | None) -> Tensor:
    """Q with q orthonormal columns whose span nearly holds the range of A - M (Algorithm 4.4)."""
    niter = 2 if niter is None else niter
    R = _random_projection(A.shape[-1], q, _projection_dtype(A), A.device)
    Q = _orthonormal_columns(_times(A, M, R))
    adjoint_M = None if M is None else M.mH
    for _ in range(niter):
        Q = _orthonormal_columns(_times(A.mH, adjoint_M, Q))
        Q = _orthonormal_columns(_times(A, M, Q))
    return Q


def svd_lowrank(A: Tensor, q: int | None = 6, niter: int | None = 2,
                M: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """Approximate leading singular triplets (U, S, V) of A [..., m, n] (of A - M where M is given, broadcast to
    A's shape): A ~ U diag(S) V^H, with q columns in U and V. Differentiable through its QRs and SVD.

    >>> import tilewise as tw
    >>> U, S, V = tw.svd_lowrank(tw.randn(5, 3), q=3)
    >>> tuple(U.shape), tuple(S.shape), tuple(V.shape)
    ((5, 3), (3,), (3, 3))
    """
    q = 6 if q is None else q
    m, n = A.shape[-2], A.shape[-1]
    if M is not None:
        M = M.broadcast_to(A.shape)
    wide = m < n
    if wide:  # factor A^H = V S U^H: the range finder then projects onto min(m, n) dims
        A = A.mH
        M = None if M is None else M.mH
    Q = _approximate_basis(A, q, niter, M)
    B = Q.mH.matmul(A)
    if M is not None:
        B = B - Q.mH.matmul(M)
    U, S, Vh = linalg.svd(B, full_matrices=False)
    U, V = Q.matmul(U), Vh.mH
    return (V, S, U) if wide else (U, S, V)


def pca_lowrank(A: Tensor, q: int | None = None, center: bool = True,
                niter: int = 2) -> tuple[Tensor, Tensor, Tensor]:
    """Principal components of the rows of A [..., m, n] (samples by features): the low-rank SVD (U, S, V) of A with
    its column means taken away (unless ``center=False``); V's columns are the principal directions and
    S**2 / (m - 1) the variances along them. q defaults to min(6, m, n).

    >>> import tilewise as tw
    >>> U, S, V = tw.pca_lowrank(tw.randn(10, 4), q=2)
    >>> tuple(V.shape)
    (4, 2)
    """
    m, n = A.shape[-2], A.shape[-1]
    if q is None:
        q = min(6, m, n)
    elif not (q >= 0 and q <= min(m, n)):
        raise ValueError(f"q(={q}) must be non-negative integer and not greater than min(m, n)={min(m, n)}")
    if not (niter >= 0):
        raise ValueError(f"niter(={niter}) must be non-negative integer")
    if not center:
        return svd_lowrank(A, q, niter=niter, M=None)
    return svd_lowrank(A - A.mean(dim=(-2,), keepdim=True), q, niter=niter, M=None)

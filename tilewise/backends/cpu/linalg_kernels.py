"""numpy (LAPACK) kernels for the linalg primitives (see [Note: linalg primitives] in ``ops/linalg_solvers.py``).

numpy's batched LAPACK wrappers raise on the first singular or indefinite matrix of a batch and do not say
which pivot failed; torch reports the failing pivot and fills ``info`` per matrix. So the kernels try numpy's
fast path first and, only when it fails, find each matrix's ``info`` with a small batched elimination here
(``_lu_info``, ``_cholesky_info``), then solve the matrices that can be solved one by one.
"""

# ruff: noqa: N803, N806 — matrices are named as in torch's linalg and the literature (A, B, L, U, S, Vh)

from __future__ import annotations

import numpy as np

from tilewise import dtypes
from tilewise import strides as S
from tilewise.backends.cpu.registry import kernel
from tilewise.device import cpu
from tilewise.ops.linalg_solvers import LinAlgError
from tilewise.tensor import Tensor, from_array, strided_copy


def _out(array, dtype) -> object:
    return from_array(np.array(array, dtype=dtype.np, order="C"), dtype)  # a copy: never a view of an input


def _matrices(array, dtype) -> object:
    """A result torch returns as LAPACK writes it, each matrix column-major (``strides.column_major_strides``): a
    copy so laid out."""
    a = np.asarray(array, dtype=dtype.np)
    return _out(a, dtype) if a.ndim < 2 else strided_copy(a, S.column_major_strides(a.shape), dtype)


def _rows_of_right_hand_side(x: np.ndarray, m: int, dtype) -> object:
    """lstsq's solution as torch returns it: the first n rows of the column-major copy of B, padded to max(m, n)
    rows, that LAPACK solves in place."""
    *batch, n, k = x.shape
    padded = np.zeros((*batch, max(m, n), k), dtype.np)
    padded[..., :n, :] = x
    buffer = _matrices(padded, dtype)
    return Tensor._make(buffer._storage, tuple(x.shape), buffer._strides, 0, dtype, cpu)


def _info(array) -> object:
    return from_array(np.array(array, dtype=np.int32, order="C"), dtypes.int32)


def _batch(a: np.ndarray) -> tuple:
    return a.shape[:-2]


def _lu_info(a: np.ndarray) -> np.ndarray:
    """LAPACK getrf's info per matrix: 1 + the first column whose pivot (partial pivoting) is exactly zero."""
    return _getrf(a)[2]


def _getrf(a: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """LAPACK getrf of each matrix [..., m, n] by partial pivoting: (the packed factors, 1-based row swaps, info)."""
    *batch, m, n = a.shape
    k = min(m, n)
    work = a.reshape(int(np.prod(batch, dtype=np.int64)), m, n).copy()
    rows = np.arange(work.shape[0])
    pivots = np.zeros((work.shape[0], k), np.int32)
    info = np.zeros(work.shape[0], np.int32)
    for j in range(k):
        p = np.argmax(np.abs(work[:, j:, j]), axis=1) + j
        pivots[:, j] = p + 1
        top = work[rows, j].copy()
        work[rows, j] = work[rows, p]
        work[rows, p] = top
        pivot = work[:, j, j]
        zero = pivot == 0
        info = np.where(zero & (info == 0), j + 1, info)
        with np.errstate(invalid="ignore"):
            scaled = work[:, j + 1:, j] / np.where(zero, 1, pivot)[:, None]
            factors = np.where(zero[:, None], work[:, j + 1:, j], scaled)
        work[:, j + 1:, j] = factors
        work[:, j + 1:, j + 1:] -= factors[:, :, None] * work[:, None, j, j + 1:]
    return work.reshape(a.shape), pivots.reshape(*batch, k), info.reshape(batch)


@kernel("_linalg_eig")
def eig(A):
    a = A._np()
    out = A.dtype if A.dtype.is_complex else A.dtype.to_complex()
    if a.size == 0:
        return _out(np.zeros(a.shape[:-1]), out), _matrices(np.zeros(a.shape), out)
    if not np.isfinite(a).all():  # LAPACK's geev takes finite matrices (torch's CPU kernel crashes the process)
        raise LinAlgError("linalg.eig: the input has NaN or infinite entries; geev decomposes finite matrices only")
    values, vectors = np.linalg.eig(a)
    return _out(values, out), _matrices(vectors, out)


@kernel("_linalg_lu_factor_ex")
def lu_factor_ex(A, pivot=True):
    if not pivot:
        raise RuntimeError("linalg.lu_factor: LU without pivoting is not implemented on the CPU")
    lu, pivots, info = _getrf(A._np())
    return _matrices(lu, A.dtype), _out(pivots, dtypes.int32), _info(info)


def _cholesky_info(a: np.ndarray) -> np.ndarray:
    """LAPACK potrf's info per matrix: the order of the first leading minor that is not positive-definite."""
    n = a.shape[-1]
    work = a.reshape(-1, n, n).astype(np.float64)
    L = np.zeros_like(work)
    info = np.zeros(work.shape[0], np.int32)
    for k in range(n):
        d = work[:, k, k] - np.einsum("bj,bj->b", L[:, k, :k], L[:, k, :k])
        bad = ~(d > 0)
        info = np.where(bad & (info == 0), k + 1, info)
        root = np.sqrt(np.where(bad, 1.0, d))
        L[:, k, k] = root
        L[:, k + 1:, k] = (work[:, k + 1:, k] - np.einsum("bij,bj->bi", L[:, k + 1:, :k], L[:, k, :k])) / root[:, None]
    return info.reshape(_batch(a))


def _each_matrix(fn, a: np.ndarray, info: np.ndarray, out: np.ndarray, *others) -> np.ndarray:
    """``out[i] = fn(a[i], *others[i])`` for every matrix whose info is 0; NaN for the others."""
    flat_out = out.reshape(-1, *out.shape[len(_batch(a)):])
    flat_a = a.reshape(-1, *a.shape[-2:])
    flat_others = [o.reshape(-1, *o.shape[len(_batch(a)):]) for o in others]
    for k, code in enumerate(info.reshape(-1)):
        flat_out[k] = fn(flat_a[k], *(o[k] for o in flat_others)) if code == 0 else np.nan
    return flat_out.reshape(out.shape)


@kernel("_linalg_solve")
def solve(A, B):
    a, b = A._np(), B._np()
    info = np.zeros(_batch(a), np.int32)
    if a.size == 0 or b.size == 0:
        return _matrices(np.zeros(b.shape), B.dtype), _info(info)
    try:
        x = np.linalg.solve(a, b)
    except np.linalg.LinAlgError:
        info = _lu_info(a)
        x = _each_matrix(np.linalg.solve, a, info, np.empty(b.shape, b.dtype), b)
    return _matrices(_nan_where_nan(a, x), B.dtype), _info(info)


@kernel("_linalg_inv_ex")
def inv_ex(A):
    a = A._np()
    info = np.zeros(_batch(a), np.int32)
    if a.size == 0:
        return _matrices(np.zeros(a.shape), A.dtype), _info(info)
    try:
        x = np.linalg.inv(a)
    except np.linalg.LinAlgError:
        info = _lu_info(a)
        x = _each_matrix(np.linalg.inv, a, info, np.empty(a.shape, a.dtype))
    return _matrices(_nan_where_nan(a, x), A.dtype), _info(info)


def _nan_where_nan(a: np.ndarray, x: np.ndarray) -> np.ndarray:
    """A NaN anywhere in a matrix reaches every entry of its LU solve in LAPACK's blocked order (torch's result);
    numpy's path can keep some entries finite."""
    bad = np.isnan(a).any(axis=(-2, -1))
    return np.where(bad[..., None, None], np.nan, x) if bad.any() else x


@kernel("_linalg_det")
def det(A):
    a = A._np()
    if a.shape[-1] == 0:
        return _out(np.ones(_batch(a)), A.dtype)
    with np.errstate(invalid="ignore"):
        return _out(np.linalg.det(a), A.dtype)


@kernel("_linalg_slogdet")
def slogdet(A):
    a = A._np()
    if a.shape[-1] == 0:
        return _out(np.ones(_batch(a)), A.dtype), _out(np.zeros(_batch(a)), A.dtype.to_real())
    with np.errstate(invalid="ignore"):
        sign, logabs = np.linalg.slogdet(a)
    sign = np.where(np.isnan(logabs), 0.0, sign)  # torch multiplies the pivots' signs: sign(NaN) is 0
    return _out(sign, A.dtype), _out(logabs, A.dtype.to_real())  # (a complex matrix: a complex sign)


def _partial_cholesky(a: np.ndarray, info: int) -> np.ndarray:
    """What LAPACK's (left-looking) potrf leaves in the lower triangle of a matrix whose leading minor of order
    ``info`` is not positive-definite, and torch returns: the columns before it factored, the failing pivot's
    reduced value on the diagonal, the rest of the lower triangle as it was; the upper triangle zero."""
    j = info - 1
    out = np.tril(a)
    if j > 0:
        head = np.linalg.cholesky(a[:j, :j])
        below = np.linalg.solve(head, a[j:, :j].T).T
        out[:j, :j], out[j:, :j] = head, below
        out[j, j] = a[j, j] - below[0] @ below[0]
    return out


def _with_partial_factors(a: np.ndarray, info: np.ndarray, L: np.ndarray) -> np.ndarray:
    flat_a, flat_l = a.reshape(-1, *a.shape[-2:]), np.array(L).reshape(-1, *a.shape[-2:])
    for k, code in enumerate(info.reshape(-1)):
        if code:
            flat_l[k] = _partial_cholesky(flat_a[k], int(code))
    return flat_l.reshape(a.shape)


@kernel("_linalg_cholesky_ex")
def cholesky_ex(A, upper=False):
    a = A._np()
    if upper:  # potrf with uplo="U" reads the upper triangle: the lower one of the transpose
        a = np.swapaxes(a, -1, -2)
    info = np.zeros(_batch(a), np.int32)
    if a.size == 0:
        return _matrices(np.zeros(a.shape), A.dtype), _info(info)
    try:
        with np.errstate(invalid="ignore"):
            L = np.linalg.cholesky(a)
        if not np.isfinite(L).all():  # LAPACK stops at a NaN pivot; numpy carries on
            info = _cholesky_info(a)
    except np.linalg.LinAlgError:
        info = _cholesky_info(a)
        L = _each_matrix(np.linalg.cholesky, a, info, np.empty(a.shape, a.dtype))
    if info.any():
        L = _with_partial_factors(a, info, L)
    return _matrices(np.swapaxes(L, -1, -2) if upper else L, A.dtype), _info(info)


@kernel("_linalg_qr")
def qr(A, mode="reduced"):
    a = A._np()
    m, n = a.shape[-2:]
    k = min(m, n)
    if a.size == 0:
        q_cols = m if mode == "complete" else k
        q = np.zeros((0,)) if mode == "r" else np.broadcast_to(np.eye(m, q_cols), (*_batch(a), m, q_cols))
        r_rows = m if mode == "complete" else k
        return _matrices(q, A.dtype), _matrices(np.zeros((*_batch(a), r_rows, n)), A.dtype)
    if mode == "r":
        return _out(np.zeros((0,)), A.dtype), _matrices(np.linalg.qr(a, mode="r"), A.dtype)
    q, r = np.linalg.qr(a, mode=mode)
    return _matrices(q, A.dtype), _matrices(r, A.dtype)


@kernel("_linalg_svd")
def svd(A, full_matrices=False, compute_uv=True):
    a = A._np()
    m, n = a.shape[-2:]
    k = min(m, n)
    batch = _batch(a)
    if a.size == 0:
        s = np.zeros((*batch, k))
        if not compute_uv:
            return _out(np.zeros((0,)), A.dtype), _out(s, A.dtype), _out(np.zeros((0,)), A.dtype)
        u_cols, v_rows = (m, n) if full_matrices else (k, k)
        u = np.broadcast_to(np.eye(m, u_cols), (*batch, m, u_cols))
        vh = np.broadcast_to(np.eye(v_rows, n), (*batch, v_rows, n))
        return _matrices(u, A.dtype), _out(s, A.dtype), _matrices(vh, A.dtype)
    _require_finite("linalg.svd", a)
    try:
        if not compute_uv:
            return (_out(np.zeros((0,)), A.dtype), _out(np.linalg.svd(a, compute_uv=False), A.dtype),
                    _out(np.zeros((0,)), A.dtype))
        u, s, vh = np.linalg.svd(a, full_matrices=full_matrices)
    except np.linalg.LinAlgError:
        raise LinAlgError("linalg.svd: The algorithm failed to converge because the input matrix is ill-conditioned "
                          "or has too many repeated singular values") from None
    return _matrices(u, A.dtype), _out(s, A.dtype), _matrices(vh, A.dtype)


def _require_finite(op: str, a: np.ndarray) -> None:
    if not np.isfinite(a).all():
        raise LinAlgError(f"{op}: The algorithm failed to converge because the input matrix contained non-finite "
                          "values.")


@kernel("_linalg_eigh")
def eigh(A, UPLO="L", compute_v=True):  # noqa: N803 — torch's argument name
    a = A._np()
    if a.size == 0:
        vectors = np.zeros(a.shape) if compute_v else np.zeros((0,))
        return _out(np.zeros(a.shape[:-1]), A.dtype), _matrices(vectors, A.dtype)
    try:
        if not compute_v:
            return _out(np.linalg.eigvalsh(a, UPLO=UPLO), A.dtype), _out(np.zeros((0,)), A.dtype)
        w, v = np.linalg.eigh(a, UPLO=UPLO)
    except np.linalg.LinAlgError:
        raise LinAlgError("linalg.eigh: The algorithm failed to converge because the input matrix is ill-conditioned "
                          "or has too many repeated eigenvalues.") from None
    return _out(w, A.dtype), _matrices(v, A.dtype)


@kernel("_linalg_solve_triangular")
def solve_triangular(A, B, upper, left=True, unitriangular=False):
    """Substitution, a row (left) or column (right) at a time over the whole batch: unlike LAPACK's trtrs
    through a general solver, a zero on the diagonal gives inf/NaN rather than an error, as in torch."""
    a, b = A._np(), B._np()
    if not left:  # X A = B  <=>  A^T X^T = B^T
        a, b, upper = np.swapaxes(a, -1, -2), np.swapaxes(b, -1, -2), not upper
    n = a.shape[-1]
    x = np.zeros(np.broadcast_shapes(a.shape[:-2], b.shape[:-2]) + b.shape[-2:],
                 np.float64 if b.dtype == np.float64 else np.float32)
    order = range(n - 1, -1, -1) if upper else range(n)
    with np.errstate(divide="ignore", invalid="ignore"):
        for i in order:
            done = slice(i + 1, n) if upper else slice(0, i)
            rhs = b[..., i, :] - np.einsum("...j,...jk->...k", a[..., i, done], x[..., done, :])
            x[..., i, :] = rhs if unitriangular else rhs / a[..., i, i, None]
    if not left:
        x = np.swapaxes(x, -1, -2)
    return _matrices(x, B.dtype)


@kernel("_linalg_lstsq")
def lstsq(A, B, rcond=None, driver="gelsy"):
    """numpy's gelsd for every driver (the solutions agree for full-rank problems); the outputs are filled as
    torch's driver fills them: residuals for gels/gelsd/gelss when m > n and the matrix has full rank, rank for
    all but gels, singular values for gelsd/gelss."""
    a, b = A._np(), B._np()
    if not (np.isfinite(a).all() and np.isfinite(b).all()):  # LAPACK's gelsd would never return
        raise RuntimeError("torch.linalg.lstsq: the input contains non-finite values (LAPACK refuses them)")
    m, n = a.shape[-2:]
    batch = _batch(a)
    flat_a, flat_b = a.reshape(-1, m, n), b.reshape(-1, m, b.shape[-1])
    count = flat_a.shape[0]
    x = np.zeros((count, n, b.shape[-1]))
    ranks = np.zeros(count, np.int64)
    svals = np.zeros((count, min(m, n)))
    cond = -1 if rcond is None else rcond
    if rcond is None:
        cond = np.finfo(a.dtype).eps * max(m, n)
    for k in range(count):
        if flat_a[k].size == 0:
            continue
        x[k], _, ranks[k], svals[k] = np.linalg.lstsq(flat_a[k], flat_b[k], rcond=cond)
    solution = x.reshape(*batch, n, b.shape[-1])
    full_rank = bool(np.all(ranks == min(m, n)))
    if driver != "gelsy" and m > n and full_rank and count:
        r = np.einsum("bij,bjk->bik", flat_a.astype(np.float64), x) - flat_b
        residuals = (r * r).sum(-2).reshape(*batch, b.shape[-1])
    else:
        residuals = np.zeros((0,))
    rank = ranks.reshape(batch) if driver != "gels" else np.zeros((0,), np.int64)
    singular = svals.reshape(*batch, min(m, n)) if driver in ("gelsd", "gelss") else np.zeros((0,))
    return (_rows_of_right_hand_side(solution, m, A.dtype), _out(residuals, A.dtype),
            from_array(np.array(rank, order="C"), dtypes.int64),
            _out(singular, A.dtype))


# Pade approximant of degree 13 with scaling and squaring (Higham 2005), in float64
_PADE13 = (64764752532480000.0, 32382376266240000.0, 7771770303897600.0, 1187353796428800.0, 129060195264000.0,
           10559470521600.0, 670442572800.0, 33522128640.0, 1323241920.0, 40840800.0, 960960.0, 16380.0, 182.0, 1.0)
_THETA13 = 5.371920351148152


@kernel("_linalg_matrix_exp")
def matrix_exp(A):
    a = A._np().astype(np.float64)
    n = a.shape[-1]
    if a.size == 0:
        return _out(a, A.dtype)
    norm1 = np.abs(a).sum(-2).max(-1)
    finite = np.isfinite(norm1)
    a = np.where(finite[..., None, None], a, 0.0)  # non-finite matrices give NaN, as torch's
    with np.errstate(divide="ignore"):
        scale = np.log2(np.where(finite & (norm1 > 0), norm1, 1) / _THETA13)
    squarings = np.maximum(0, np.ceil(scale)).astype(np.int64)
    a = a / (2.0 ** squarings)[..., None, None]
    b = _PADE13
    eye = np.eye(n)
    a2 = a @ a
    a4 = a2 @ a2
    a6 = a2 @ a4
    u = a @ (a6 @ (b[13] * a6 + b[11] * a4 + b[9] * a2) + b[7] * a6 + b[5] * a4 + b[3] * a2 + b[1] * eye)
    v = a6 @ (b[12] * a6 + b[10] * a4 + b[8] * a2) + b[6] * a6 + b[4] * a4 + b[2] * a2 + b[0] * eye
    r = np.linalg.solve(v - u, v + u)
    for step in range(int(squarings.max(initial=0))):
        r = np.where((squarings > step)[..., None, None], r @ r, r)
    return _out(np.where(finite[..., None, None], r, np.nan), A.dtype)

"""numpy kernels for the factorizations torch returns in LAPACK's packed forms: Bunch-Kaufman LDL (sytrf/hetrf,
sytrs/hetrs), Householder QR (geqrf) and the product with its reflectors (ormqr/unmqr).

[Note: LAPACK's packed factors] These operators hand users LAPACK's own storage, so the values, not only the
products they stand for, must be LAPACK's. geqrf's is numpy's (``numpy.linalg.qr(mode="raw")`` calls geqrf
itself). numpy has no sytrf, so ``_sytf2`` follows LAPACK's unblocked lower-triangle routine step by step: the
Bunch-Kaufman choice between a 1x1 and a 2x2 pivot (alpha = (1 + sqrt(17)) / 8), the symmetric interchange of
the trailing block, the rank-1 or rank-2 update, in the order of the reference routine's arithmetic. LAPACK's
blocked form (used by MKL and OpenBLAS for n > 64 or so) takes the same pivots, so the factors agree with
torch's to rounding; a near tie between two pivot candidates may be decided either way by that rounding. The
factor is left in product form, as LAPACK leaves it: the interchange of step k moves only the rows of the
trailing block, so ``_sytrs`` applies interchanges and columns of L in turn, exactly as sytrs does.
"""

# ruff: noqa: N803, N806 — matrices are named as in torch's linalg and the literature (A, B, L, D, LD)

from __future__ import annotations

import numpy as np

from tilewise import dtypes
from tilewise import strides as S
from tilewise.backends.cpu.registry import kernel
from tilewise.tensor import from_array, strided_copy

_BUNCH_KAUFMAN_ALPHA = (1.0 + 17.0 ** 0.5) / 8.0


def _column_major(a: np.ndarray, dtype) -> object:
    return strided_copy(np.asarray(a, dtype.np), S.column_major_strides(a.shape), dtype)


def _contiguous(a: np.ndarray, dtype) -> object:
    return from_array(np.array(a, dtype=dtype.np, order="C"), dtype)


def _flat_matrices(a: np.ndarray) -> np.ndarray:
    return a.reshape(-1, *a.shape[-2:])


# ---------------------------------------------------------------- LDL: sytrf / hetrf (lower), sytrs / hetrs

def _size(x):
    """LAPACK's measure of an entry in its pivot search (i?amax): |x| for reals, |Re x| + |Im x| for complex."""
    return np.abs(x.real) + np.abs(x.imag) if np.iscomplexobj(x) else np.abs(x)


def _swap_rows_and_columns(a: np.ndarray, kk: int, kp: int, hermitian: bool) -> None:
    """The symmetric interchange of rows and columns kk < kp, on the lower triangle of the trailing block."""
    conj = np.conj if hermitian else (lambda x: x)
    a[kp + 1:, kk], a[kp + 1:, kp] = a[kp + 1:, kp].copy(), a[kp + 1:, kk].copy()
    between = a[kk + 1:kp, kk].copy()
    a[kk + 1:kp, kk] = conj(a[kp, kk + 1:kp])
    a[kp, kk + 1:kp] = conj(between)
    if hermitian:
        a[kp, kk] = np.conj(a[kp, kk])
        a[kk, kk], a[kp, kp] = a[kp, kp].real, a[kk, kk].real
    else:
        a[kk, kk], a[kp, kp] = a[kp, kp], a[kk, kk]


def _choose_pivot(a: np.ndarray, k: int, hermitian: bool) -> tuple[int, int] | None:
    """Bunch-Kaufman's choice at step k: (kp, kstep), the row to bring to k (or k + 1 for a 2x2 pivot) and the
    pivot's order; None where column k is zero below the diagonal and the diagonal is zero (or NaN)."""
    n = a.shape[0]
    diagonal_size = (lambda x: abs(x.real)) if hermitian else _size
    absakk = diagonal_size(a[k, k])
    imax, colmax = k, 0.0
    if k < n - 1:
        column = _size(a[k + 1:, k])
        imax = k + 1 + int(np.argmax(column))
        colmax = column[imax - k - 1]
    if max(absakk, colmax) == 0 or np.isnan(absakk):
        return None
    if absakk >= _BUNCH_KAUFMAN_ALPHA * colmax:
        return k, 1
    rowmax = _size(a[imax, k:imax]).max()  # row imax, left of the diagonal ...
    if imax < n - 1:  # ... and column imax below it: the rest of row imax of the symmetric matrix
        rowmax = max(rowmax, _size(a[imax + 1:, imax]).max())
    if absakk >= _BUNCH_KAUFMAN_ALPHA * colmax * (colmax / rowmax):
        return k, 1
    if diagonal_size(a[imax, imax]) >= _BUNCH_KAUFMAN_ALPHA * rowmax:
        return imax, 1
    return imax, 2


def _eliminate_one(a: np.ndarray, k: int, hermitian: bool) -> None:
    """A 1x1 pivot: A[k+1:, k+1:] -= x d^-1 x^H (x^T), then x *= d^-1 (syr/her, then scal)."""
    x = a[k + 1:, k]
    if hermitian:
        r = 1.0 / a[k, k].real
        a[k + 1:, k + 1:] -= np.outer(x, r * np.conj(x))
        rest = a[k + 1:, k + 1:]
        rest[np.diag_indices_from(rest)] = rest.diagonal().real
    else:
        r = 1.0 / a[k, k]
        a[k + 1:, k + 1:] -= np.outer(x, r * x)
    a[k + 1:, k] = x * r


def _eliminate_two(a: np.ndarray, k: int, hermitian: bool) -> None:
    """A 2x2 pivot D = [[a_kk, .], [a_k1k, a_k1k1]]: A[k+2:, k+2:] -= [x y] D^-1 [x y]^H, and columns k, k + 1 of
    L are [x y] D^-1, in the reference routine's formulas (scaled by the off-diagonal entry)."""
    x, y = a[k + 2:, k], a[k + 2:, k + 1]
    if hermitian:
        d = abs(a[k + 1, k])
        d11, d22 = a[k + 1, k + 1].real / d, a[k, k].real / d
        d21 = a[k + 1, k] / d
        scale = (1.0 / (d11 * d22 - 1.0)) / d
        wk = scale * (d11 * x - d21 * y)
        wkp1 = scale * (d22 * y - np.conj(d21) * x)
        a[k + 2:, k + 2:] -= np.outer(x, np.conj(wk))
        a[k + 2:, k + 2:] -= np.outer(y, np.conj(wkp1))
        rest = a[k + 2:, k + 2:]
        rest[np.diag_indices_from(rest)] = rest.diagonal().real
    else:
        d21 = a[k + 1, k]
        d11, d22 = a[k + 1, k + 1] / d21, a[k, k] / d21
        d21 = (1.0 / (d11 * d22 - 1.0)) / d21
        wk = d21 * (d11 * x - y)
        wkp1 = d21 * (d22 * y - x)
        a[k + 2:, k + 2:] -= np.outer(x, wk)
        a[k + 2:, k + 2:] -= np.outer(y, wkp1)
    a[k + 2:, k], a[k + 2:, k + 1] = wk, wkp1


def _sytf2(a: np.ndarray, hermitian: bool) -> tuple[np.ndarray, np.ndarray, int]:
    """LAPACK's ?sytf2 / ?hetf2 with uplo='L' on a copy of one matrix: (the lower triangle of L and D, 1-based
    pivots, negative for both rows of a 2x2 block, info: 1 + the first zero pivot, or 0)."""
    a = np.tril(a)
    n = a.shape[0]
    pivots = np.zeros(n, np.int32)
    info = 0
    k = 0
    while k < n:
        choice = _choose_pivot(a, k, hermitian)
        if choice is None:  # a zero column: D[k, k] = 0, nothing to eliminate
            info = info or k + 1
            if hermitian:
                a[k, k] = a[k, k].real
            pivots[k] = k + 1
            k += 1
            continue
        kp, kstep = choice
        kk = k + kstep - 1
        if kp != kk:
            _swap_rows_and_columns(a, kk, kp, hermitian)
            if kstep == 2:
                if hermitian:
                    a[k, k] = a[k, k].real
                a[k + 1, k], a[kp, k] = a[kp, k], a[k + 1, k]
        elif hermitian:
            a[k, k] = a[k, k].real
            if kstep == 2:
                a[k + 1, k + 1] = a[k + 1, k + 1].real
        if kstep == 1:
            _eliminate_one(a, k, hermitian)
            pivots[k] = kp + 1
        else:
            _eliminate_two(a, k, hermitian)
            pivots[k] = pivots[k + 1] = -(kp + 1)
        k += kstep
    return np.tril(a), pivots, info


def _solve_lower_and_diagonal(ld: np.ndarray, pivots: np.ndarray, b: np.ndarray, hermitian: bool) -> None:
    """sytrs's first half, in place: b <- D^-1 L^-1 P^T b, one pivot block at a time."""
    n = ld.shape[0]
    k = 0
    while k < n:
        if pivots[k] > 0:
            kp = pivots[k] - 1
            b[[k, kp]] = b[[kp, k]]
            b[k + 1:] -= np.outer(ld[k + 1:, k], b[k])
            b[k] *= 1.0 / (ld[k, k].real if hermitian else ld[k, k])
            k += 1
            continue
        kp = -pivots[k] - 1
        b[[k + 1, kp]] = b[[kp, k + 1]]
        b[k + 2:] -= np.outer(ld[k + 2:, k], b[k])
        b[k + 2:] -= np.outer(ld[k + 2:, k + 1], b[k + 1])
        akm1k = ld[k + 1, k]
        akm1 = ld[k, k] / (np.conj(akm1k) if hermitian else akm1k)
        ak = ld[k + 1, k + 1] / akm1k
        denominator = akm1 * ak - 1.0
        bkm1 = b[k] / (np.conj(akm1k) if hermitian else akm1k)
        bk = b[k + 1] / akm1k
        b[k] = (ak * bkm1 - bk) / denominator
        b[k + 1] = (akm1 * bk - bkm1) / denominator
        k += 2


def _solve_upper(ld: np.ndarray, pivots: np.ndarray, b: np.ndarray, hermitian: bool) -> None:
    """sytrs's second half, in place: b <- P L^-T b (L^-H for hetrs), from the last pivot block back."""
    adjoint = np.conj if hermitian else (lambda x: x)
    n = ld.shape[0]
    k = n - 1
    while k >= 0:
        if pivots[k] > 0:
            b[k] -= adjoint(ld[k + 1:, k]) @ b[k + 1:]
            kp = pivots[k] - 1
            b[[k, kp]] = b[[kp, k]]
            k -= 1
            continue
        b[k] -= adjoint(ld[k + 1:, k]) @ b[k + 1:]
        b[k - 1] -= adjoint(ld[k + 1:, k - 1]) @ b[k + 1:]
        kp = -pivots[k] - 1
        b[[k, kp]] = b[[kp, k]]
        k -= 2


@kernel("_linalg_ldl_factor_ex")
def ldl_factor_ex(A, hermitian=False):
    a = A._np()
    batch, n = a.shape[:-2], a.shape[-1]
    ld = np.zeros(a.shape, a.dtype)
    pivots = np.zeros((*batch, n), np.int32)
    info = np.zeros(batch, np.int32)
    hermitian = hermitian and np.iscomplexobj(a)  # a real matrix is its own adjoint's transpose: sytrf either way
    if a.size:
        flat_ld, flat_pivots, flat_info = _flat_matrices(ld), pivots.reshape(-1, n), info.reshape(-1)
        for k, matrix in enumerate(_flat_matrices(a)):
            flat_ld[k], flat_pivots[k], flat_info[k] = _sytf2(matrix, hermitian)
    return _column_major(ld, A.dtype), _contiguous(pivots, dtypes.int32), _contiguous(info, dtypes.int32)


@kernel("_linalg_ldl_solve")
def ldl_solve(LD, pivots, B, hermitian=False):
    ld, piv, b = LD._np(), pivots._np().astype(np.int64), B._np()
    x = np.array(b, order="C")  # C order: the matrices below are views of it, solved in place
    hermitian = hermitian and np.iscomplexobj(ld)
    if x.size and ld.shape[-1]:
        flat_x = _flat_matrices(x)
        for k, (matrix, swaps) in enumerate(zip(_flat_matrices(ld), piv.reshape(-1, ld.shape[-1]))):
            _solve_lower_and_diagonal(matrix, swaps, flat_x[k], hermitian)
            _solve_upper(matrix, swaps, flat_x[k], hermitian)
    return _column_major(x, B.dtype)


# ---------------------------------------------------------------- Householder QR: geqrf, ormqr

@kernel("geqrf")
def geqrf(A):
    a = A._np()
    if a.size == 0:
        k = min(a.shape[-2:])
        return _column_major(np.zeros(a.shape, a.dtype), A.dtype), _contiguous(np.zeros((*a.shape[:-2], k)), A.dtype)
    h, tau = np.linalg.qr(a, mode="raw")  # geqrf's output, each matrix as Fortran lays it out (h is its transpose)
    return _column_major(np.swapaxes(h, -1, -2), A.dtype), _contiguous(tau, A.dtype)


def _reflectors(a: np.ndarray, count: int) -> np.ndarray:
    """The Householder vectors v_i of geqrf's output, as columns: a's strict lower part under a unit diagonal."""
    v = np.tril(a[..., :count], -1)
    v[..., np.arange(count), np.arange(count)] = 1
    return v


@kernel("ormqr")
def ormqr(input, input2, input3, left=True, transpose=False):  # noqa: A002 — torch's argument names
    """op(Q) C (left) or C op(Q), Q = H_1 ... H_k, H_i = I - tau_i v_i v_i^H, op(Q) = Q^H with ``transpose``: the
    reflectors applied one at a time (LAPACK's unblocked orm2r/unm2r), across the whole batch at once."""
    a, tau, c = input._np(), input2._np(), input3._np()
    k = tau.shape[-1]
    v = _reflectors(a, k)
    out = np.array(c)
    # left: op(Q) C applies H_k first unless transposed (Q^H C = H_k^H ... H_1^H C); right: C Q applies H_1 first
    order = range(k) if left == transpose else reversed(range(k))
    for i in order:
        vi = v[..., i:i + 1]  # [..., m, 1]
        t = tau[..., i, None, None]
        t = np.conj(t) if transpose else t
        if left:  # H C = C - t v (v^H C)
            out -= t * (vi @ (np.conj(vi).swapaxes(-1, -2) @ out))
        else:  # C H = C - t (C v) v^H
            out -= t * ((out @ vi) @ np.conj(vi).swapaxes(-1, -2))
    return _column_major(out, input3.dtype)

"""The linalg primitives on CUDA: cuSOLVER (LU, Cholesky, QR, SVD, symmetric eigensolver) and cuBLAS (triangular
solves), through nvmath-python's raw bindings, imported at first use (the GPU extra).

[Note: cuSOLVER layouts] cuSOLVER is column-major; a contiguous row-major matrix A is, to it, A^T. LU factors A
itself (from a transposed copy), because the pivots decide which diagonal element ``info`` names, as LAPACK's do
on the CPU (torch's CUDA path factors A too): getrs with TRANS=N then solves A X = B, and against the identity
gives inv(A), both in column-major order. A symmetric matrix is its own transpose, so potrf and syevd read it as
it is with the triangle flag swapped ("L" row-major is "U" column-major), and the column-major upper factor read
row-major is the lower one. gesvd needs rows >= columns, so a wide A is factored as A^T = U' S V'^T (then U = V',
Vh = U'^T, both row-major in cuSOLVER's buffers) and a tall one from a transposed copy. Every routine writes in
place, so inputs are copied first. torch returns these matrices column-major (``strides.column_major_strides``),
as the routines write them: a result cuSOLVER left column-major is handed back as it lies (``_as_columns``), one
it did not (the triangular factors after masking, a wide SVD's, the triangular solves') is copied into that
layout.
Batches loop over matrices on the current stream (one handle per device, bound to the stream at each call);
``info`` stays on the device and is read only where the caller checks errors.
``geqrf`` and ``ormqr`` hand out and take geqrf's column-major reflectors as they are; ``_linalg_ldl_factor_ex``
is sytrf on a column-major copy of A's lower triangle (uplo "L": the factorization torch returns, not the
U D U^T one the row-major buffer would give).
``_linalg_lstsq``, ``_linalg_matrix_exp`` and ``_linalg_ldl_solve`` have no kernel here: they run on the host
(LAPACK, and ldl_solve's pivot loop) and copy back, logged under ``TILEWISE_LOG=fallback`` (see
``kernels/fallback.py``); all are rare in training code.
"""

# ruff: noqa: N803, N806 — matrices are named as in torch's linalg and the literature (A, B, L, U, S, Vh)

from __future__ import annotations

import math

import numpy as np

from tilewise import dtypes
from tilewise.backends.cuda.device_memory import data_ptr, empty, stream_handle
from tilewise.backends.cuda.kernels import kernel
from tilewise.device import Device
from tilewise.strides import column_major_strides
from tilewise.tensor import Tensor

_PREFIX = {"float32": "s", "float64": "d"}
_FILL_LOWER, _FILL_UPPER = 0, 1  # cublasFillMode_t
_OP_N, _OP_T = 0, 1  # cublasOperation_t
_SIDE_LEFT, _SIDE_RIGHT = 0, 1  # cublasSideMode_t
_DIAG_NON_UNIT, _DIAG_UNIT = 0, 1  # cublasDiagType_t
_EIG_NOVECTOR, _EIG_VECTOR = 0, 1  # cusolverEigMode_t

_modules: dict[str, object] = {}
_handles: dict[tuple[str, int], int] = {}


def _library(name: str):
    found = _modules.get(name)
    if found is None:
        from tilewise.backends.cuda.nvmath_bindings import binding

        found = _modules[name] = binding(name)
    return found


def _handle(name: str, device: Device) -> int:
    """The device's cuSOLVER or cuBLAS handle, bound to the thread's current stream."""
    from tilewise.backends.cuda.runtime import ensure_context

    index = ensure_context(device.index)
    lib = _library(name)
    handle = _handles.get((name, index))
    if handle is None:
        handle = _handles[(name, index)] = lib.create()
    lib.set_stream(handle, stream_handle(index))
    return handle


def _routine(name: str, dtype):
    """``cusolverDn<S|D><name>`` for the dtype (float32 or float64; the operators refuse the others)."""
    return getattr(_library("cusolverDn"), _PREFIX[dtype.name] + name)


def _fresh(x: Tensor) -> Tensor:
    """A contiguous copy that a routine may overwrite."""
    from tilewise.backends.cuda.kernels.copy import cast

    return cast(x, x._dtype)


def _as_columns(buffer: Tensor) -> Tensor:
    """The matrices of a contiguous batch read column-major, as cuSOLVER wrote them: the buffer's transpose, as a
    tensor of its own (torch's layout for these results, ``strides.column_major_strides``)."""
    shape = (*buffer._shape[:-2], buffer._shape[-1], buffer._shape[-2])
    strides = (*buffer._strides[:-2], buffer._strides[-1], buffer._strides[-2])
    return Tensor._make(buffer._storage, shape, strides, buffer._offset, buffer._dtype, buffer._device)


def _column_major(x: Tensor) -> Tensor:
    """A copy of ``x`` with each matrix column-major, as torch returns the results of its solvers."""
    from tilewise.backends.cuda.kernels.copy import copy_into

    return copy_into(empty(x._shape, x._dtype, x._device, column_major_strides(x._shape)), x)


def _contiguous(x: Tensor) -> Tensor:
    from tilewise.backends.cuda.kernels.copy import contiguous

    return contiguous(x)


def _count(shape: tuple) -> int:
    return math.prod(shape)


def _pointers(t: Tensor, count: int):
    """The address of each matrix of a contiguous batch."""
    step = (t.numel() // max(count, 1)) * t._dtype.itemsize
    base = data_ptr(t)
    return [base + k * step for k in range(count)]


def _work(elements: int, dtype, device: Device) -> Tensor:
    return empty((max(int(elements), 1),), dtype, device)


def _zeros(shape: tuple, dtype, device: Device) -> Tensor:
    from tilewise.ops.creation import zeros

    return zeros(shape, dtype=dtype, device=device)


# ---------------------------------------------------------------- LU: solve, inv, det, slogdet

def _lu(A: Tensor, device: Device):
    """getrf of each matrix [..., m, n], copied to column-major order: (LU as the buffer of its transpose, 1-based
    pivots [..., min(m, n)], info)."""
    batch, m, n = tuple(A._shape[:-2]), A._shape[-2], A._shape[-1]
    count = _count(batch)
    lu = _fresh(A.mT)
    pivots = empty(batch + (min(m, n),), dtypes.int32, device)
    info = _zeros(batch, dtypes.int32, device)
    if count == 0 or m == 0 or n == 0:
        return lu, pivots, info
    handle = _handle("cusolverDn", device)
    matrices = _pointers(lu, count)
    lwork = _routine("getrf_buffer_size", A._dtype)(handle, m, n, matrices[0], m)
    work = _work(lwork, A._dtype, device)
    for a, p, i in zip(matrices, _pointers(pivots, count), _pointers(info, count)):
        _routine("getrf", A._dtype)(handle, m, n, a, m, data_ptr(work), p, i)
    return lu, pivots, info


@kernel("_linalg_lu_factor_ex")
def lu_factor_ex(device: Device, A: Tensor, pivot: bool = True):
    if not pivot:
        raise RuntimeError("linalg.lu_factor: LU without pivoting is not implemented on CUDA in tilewise; factor "
                           "with pivot=True (the default)")
    lu, pivots, info = _lu(A, device)
    return _as_columns(lu), pivots, info


def _getrs(lu: Tensor, pivots: Tensor, rhs: Tensor, trans: int, device: Device) -> None:
    """Solve in place into ``rhs``, a contiguous batch whose column-major matrices are n x nrhs."""
    batch, n = tuple(lu._shape[:-2]), lu._shape[-1]
    count = _count(batch)
    if count == 0 or n == 0 or rhs.numel() == 0:
        return
    nrhs = rhs.numel() // (count * n)
    handle = _handle("cusolverDn", device)
    status = _zeros((1,), dtypes.int32, device)
    for a, p, b in zip(_pointers(lu, count), _pointers(pivots, count), _pointers(rhs, count)):
        _routine("getrs", lu._dtype)(handle, trans, n, nrhs, a, n, p, b, n, data_ptr(status))


@kernel("_linalg_solve")
def solve(device: Device, A: Tensor, B: Tensor):
    lu, pivots, info = _lu(A, device)
    rhs = _fresh(B.mT)  # row-major [k, n]: column-major n x k, as getrs wants B
    _getrs(lu, pivots, rhs, _OP_N, device)
    return _as_columns(rhs), info


@kernel("_linalg_inv_ex")
def inv_ex(device: Device, A: Tensor):
    from tilewise.ops.creation import eye

    lu, pivots, info = _lu(A, device)
    n = A._shape[-1]
    inverse = _fresh(eye(n, dtype=A._dtype, device=device).expand(A._shape))
    _getrs(lu, pivots, inverse, _OP_N, device)  # inv(A), column-major
    return _as_columns(inverse), info


def _permutation_sign(pivots: Tensor, dtype) -> Tensor:
    from tilewise.ops.creation import arange

    n = pivots._shape[-1]
    swaps = (pivots != arange(1, n + 1, dtype=dtypes.int32, device=pivots.device)).sum(-1)
    return 1 - 2 * (swaps % 2).to(dtype)


@kernel("_linalg_det")
def det(device: Device, A: Tensor):
    lu, pivots, _ = _lu(A, device)
    return lu.diagonal(0, -2, -1).prod(-1) * _permutation_sign(pivots, A._dtype)


@kernel("_linalg_slogdet")
def slogdet(device: Device, A: Tensor):
    lu, pivots, _ = _lu(A, device)
    diagonal = lu.diagonal(0, -2, -1)
    sign = diagonal.sign().prod(-1) * _permutation_sign(pivots, A._dtype)
    return sign, diagonal.abs().log().sum(-1)


# ---------------------------------------------------------------- Cholesky, QR

@kernel("_linalg_cholesky_ex")
def cholesky_ex(device: Device, A: Tensor, upper: bool = False):
    batch, n = tuple(A._shape[:-2]), A._shape[-1]
    count = _count(batch)
    factor = _fresh(A)
    info = _zeros(batch, dtypes.int32, device)
    if count and n:
        handle = _handle("cusolverDn", device)
        fill = _FILL_LOWER if upper else _FILL_UPPER  # the column-major upper factor is the row-major lower one
        matrices = _pointers(factor, count)
        lwork = _routine("potrf_buffer_size", A._dtype)(handle, fill, n, matrices[0], n)
        work = _work(lwork, A._dtype, device)
        for a, i in zip(matrices, _pointers(info, count)):
            _routine("potrf", A._dtype)(handle, fill, n, a, n, data_ptr(work), max(lwork, 1), i)
    return _column_major(factor.triu() if upper else factor.tril()), info


@kernel("_linalg_qr")
def qr(device: Device, A: Tensor, mode: str = "reduced"):
    from tilewise.ops.registry import OPS

    batch, (m, n) = tuple(A._shape[:-2]), tuple(A._shape[-2:])
    k, count = min(m, n), _count(batch)
    q_cols = m if mode == "complete" else k
    if count == 0 or k == 0:
        from tilewise.ops.creation import eye

        r = _column_major(_zeros(batch + ((m if mode == "complete" else k), n), A._dtype, device))
        q = _zeros((0,), A._dtype, device) if mode == "r" else \
            _column_major(eye(m, q_cols, dtype=A._dtype, device=device).expand(batch + (m, q_cols)))
        return q, r
    handle = _handle("cusolverDn", device)
    factored = _fresh(A.mT)  # row-major [n, m]: column-major A (m x n, lda m)
    tau = empty(batch + (k,), A._dtype, device)
    info = _zeros((1,), dtypes.int32, device)
    matrices = _pointers(factored, count)
    lwork = _routine("geqrf_buffer_size", A._dtype)(handle, m, n, matrices[0], m)
    work = _work(lwork, A._dtype, device)
    for a, t in zip(matrices, _pointers(tau, count)):
        _routine("geqrf", A._dtype)(handle, m, n, a, m, t, data_ptr(work), max(lwork, 1), data_ptr(info))
    M = factored.mT  # the column-major result, as the row-major m x n matrix it is
    R = _column_major((M if mode == "complete" else M.narrow(-2, 0, k)).triu())
    if mode == "r":
        return _zeros((0,), A._dtype, device), R
    if q_cols > n:  # complete with m > n: orgqr needs m columns, the first n holding the reflectors
        reflectors = OPS["cat"]([factored, _zeros(batch + (m - n, m), A._dtype, device)], -2)
    else:
        reflectors = _fresh(factored.narrow(-2, 0, q_cols))
    matrices = _pointers(reflectors, count)
    lwork = _routine("orgqr_buffer_size", A._dtype)(handle, m, q_cols, k, matrices[0], m, data_ptr(tau))
    work = _work(lwork, A._dtype, device)
    for a, t in zip(matrices, _pointers(tau, count)):
        _routine("orgqr", A._dtype)(handle, m, q_cols, k, a, m, t, data_ptr(work), max(lwork, 1), data_ptr(info))
    return _as_columns(reflectors), R


@kernel("geqrf")
def geqrf(device: Device, A: Tensor):
    batch, (m, n) = tuple(A._shape[:-2]), tuple(A._shape[-2:])
    k, count = min(m, n), _count(batch)
    factored = _fresh(A.mT)  # row-major [n, m]: column-major A (m x n, lda m), overwritten with R and reflectors
    tau = empty(batch + (k,), A._dtype, device)
    if count and k:
        handle = _handle("cusolverDn", device)
        info = _zeros((1,), dtypes.int32, device)
        matrices = _pointers(factored, count)
        lwork = _routine("geqrf_buffer_size", A._dtype)(handle, m, n, matrices[0], m)
        work = _work(lwork, A._dtype, device)
        for a, t in zip(matrices, _pointers(tau, count)):
            _routine("geqrf", A._dtype)(handle, m, n, a, m, t, data_ptr(work), max(lwork, 1), data_ptr(info))
    return _as_columns(factored), tau


@kernel("ormqr")
def ormqr(device: Device, input: Tensor, input2: Tensor, input3: Tensor, left: bool = True,  # noqa: A002
          transpose: bool = False):
    """op(Q) C or C op(Q) in place in a column-major copy of C (m x n); the reflectors are input's columns (lda:
    its rows, which are C's m on the left and n on the right)."""
    batch = tuple(input3._shape[:-2])
    m, n = input3._shape[-2], input3._shape[-1]
    k, count = input2._shape[-1], _count(batch)
    product = _fresh(input3.mT)  # row-major [n, m]: column-major C, ldc m
    if count == 0 or m == 0 or n == 0 or k == 0:
        return _as_columns(product)
    reflectors = _fresh(input.mT)  # column-major, lda = input's rows
    lda = input._shape[-2]
    tau = _contiguous(input2)
    side = _SIDE_LEFT if left else _SIDE_RIGHT
    trans = _OP_T if transpose else _OP_N
    handle = _handle("cusolverDn", device)
    info = _zeros((1,), dtypes.int32, device)
    a_ptrs, t_ptrs, c_ptrs = _pointers(reflectors, count), _pointers(tau, count), _pointers(product, count)
    lwork = _routine("ormqr_buffer_size", input._dtype)(handle, side, trans, m, n, k, a_ptrs[0], lda, t_ptrs[0],
                                                        c_ptrs[0], m)
    work = _work(lwork, input._dtype, device)
    for a, t, c in zip(a_ptrs, t_ptrs, c_ptrs):
        _routine("ormqr", input._dtype)(handle, side, trans, m, n, k, a, lda, t, c, m, data_ptr(work), max(lwork, 1),
                                        data_ptr(info))
    return _as_columns(product)


@kernel("_linalg_ldl_factor_ex")
def ldl_factor_ex(device: Device, A: Tensor, hermitian: bool = False):
    """sytrf (Bunch-Kaufman, LAPACK's pivots) of the lower triangle; real matrices only reach here, for which
    ``hermitian`` changes nothing."""
    batch, n = tuple(A._shape[:-2]), A._shape[-1]
    count = _count(batch)
    factored = _fresh(A.tril().mT)  # column-major lower triangle; the upper one stays zero, as torch's tril_ leaves it
    pivots = _zeros(batch + (n,), dtypes.int32, device)
    info = _zeros(batch, dtypes.int32, device)
    if count and n:
        handle = _handle("cusolverDn", device)
        matrices = _pointers(factored, count)
        lwork = _routine("sytrf_buffer_size", A._dtype)(handle, n, matrices[0], n)
        work = _work(lwork, A._dtype, device)
        for a, p, i in zip(matrices, _pointers(pivots, count), _pointers(info, count)):
            _routine("sytrf", A._dtype)(handle, _FILL_LOWER, n, a, n, p, data_ptr(work), max(lwork, 1), i)
    return _as_columns(factored), pivots, info


# ---------------------------------------------------------------- SVD, symmetric eigensolver

@kernel("_linalg_svd")
def svd(device: Device, A: Tensor, full_matrices: bool = False, compute_uv: bool = True):
    batch, (m, n) = tuple(A._shape[:-2]), tuple(A._shape[-2:])
    k, count = min(m, n), _count(batch)
    nothing = _zeros((0,), A._dtype, device)
    if count == 0 or k == 0:
        from tilewise.ops.creation import eye

        S = _zeros(batch + (k,), A._dtype, device)
        if not compute_uv:
            return nothing, S, nothing
        u_cols, v_rows = (m, n) if full_matrices else (k, k)
        return (_column_major(eye(m, u_cols, dtype=A._dtype, device=device).expand(batch + (m, u_cols))), S,
                _column_major(eye(v_rows, n, dtype=A._dtype, device=device).expand(batch + (v_rows, n))))
    wide = m <= n
    rows, cols = (n, m) if wide else (m, n)  # the column-major matrix factored: A^T if wide, else A
    factored = _fresh(A) if wide else _fresh(A.mT)
    u_cols = rows if full_matrices else cols  # cuSOLVER's U: rows x u_cols; its VT: cols x cols
    S = empty(batch + (k,), A._dtype, device)
    U = empty(batch + (u_cols, rows), A._dtype, device) if compute_uv else None
    VT = empty(batch + (cols, cols), A._dtype, device) if compute_uv else None
    jobu = ord("A" if full_matrices else "S") if compute_uv else ord("N")
    jobvt = ord("A") if compute_uv else ord("N")
    handle = _handle("cusolverDn", device)
    lwork = _routine("gesvd_buffer_size", A._dtype)(handle, rows, cols)
    work = _work(lwork, A._dtype, device)
    rwork = _work(k, A._dtype, device)
    info = _zeros((1,), dtypes.int32, device)
    u_ptrs = _pointers(U, count) if compute_uv else [0] * count
    vt_ptrs = _pointers(VT, count) if compute_uv else [0] * count
    for a, s, u, vt in zip(_pointers(factored, count), _pointers(S, count), u_ptrs, vt_ptrs):
        _routine("gesvd", A._dtype)(handle, jobu, jobvt, rows, cols, a, rows, s, u, rows, vt, cols, data_ptr(work),
                                    max(lwork, 1), data_ptr(rwork), data_ptr(info))
    if not compute_uv:
        return nothing, S, nothing
    if wide:  # A = V' S U'^T: U = V' (VT's buffer read row-major), Vh = U'^T (U's buffer read row-major)
        return _column_major(VT), S, _column_major(U)
    return _as_columns(U), S, _as_columns(VT)


@kernel("_linalg_eigh")
def eigh(device: Device, A: Tensor, UPLO: str = "L", compute_v: bool = True):  # noqa: N803 — torch's name
    batch, n = tuple(A._shape[:-2]), A._shape[-1]
    count = _count(batch)
    vectors = _fresh(A)
    values = empty(batch + (n,), A._dtype, device)
    if count and n:
        handle = _handle("cusolverDn", device)
        fill = _FILL_UPPER if UPLO == "L" else _FILL_LOWER
        job = _EIG_VECTOR if compute_v else _EIG_NOVECTOR
        matrices = _pointers(vectors, count)
        lwork = _routine("syevd_buffer_size", A._dtype)(handle, job, fill, n, matrices[0], n, data_ptr(values))
        work = _work(lwork, A._dtype, device)
        info = _zeros((1,), dtypes.int32, device)
        for a, w in zip(matrices, _pointers(values, count)):
            _routine("syevd", A._dtype)(handle, job, fill, n, a, n, w, data_ptr(work), max(lwork, 1),
                                        data_ptr(info))
    if not compute_v:
        return values, _zeros((0,), A._dtype, device)
    return values, _as_columns(vectors)  # eigenvectors are cuSOLVER's columns


# ---------------------------------------------------------------- triangular solves (cuBLAS trsm)

@kernel("_linalg_solve_triangular")
def solve_triangular(device: Device, A: Tensor, B: Tensor, upper: bool, left: bool = True,
                     unitriangular: bool = False):
    """Row-major A X = B is column-major X^T A^T = B^T (trsm from the right) and X A = B is A^T X^T = B^T (from
    the left); A^T's triangle is the other one."""
    batch, n = tuple(A._shape[:-2]), A._shape[-1]
    count = _count(batch)
    coefficients = _contiguous(A)
    X = _fresh(B)
    if count == 0 or X.numel() == 0:
        return _column_major(X)
    rows, cols = B._shape[-2], B._shape[-1]
    side = _SIDE_RIGHT if left else _SIDE_LEFT
    m_cm, n_cm = cols, rows  # X^T, column-major, in both cases
    fill = _FILL_LOWER if upper else _FILL_UPPER
    diag = _DIAG_UNIT if unitriangular else _DIAG_NON_UNIT
    alpha = np.ones(1, A._dtype.np)
    blas = _library("cublas")
    trsm = getattr(blas, _PREFIX[A._dtype.name] + "trsm")
    handle = _handle("cublas", device)
    for a, b in zip(_pointers(coefficients, count), _pointers(X, count)):
        trsm(handle, side, fill, _OP_N, diag, m_cm, n_cm, alpha.ctypes.data, a, n, b, m_cm)
    return _column_major(X)

"""Matrix decompositions and solvers: the primitives behind ``tilewise.linalg``.

[Note: linalg primitives] A handful of primitives carry the numerical work, each a LAPACK routine on the CPU
(through numpy) and a cuSOLVER/cuBLAS routine on CUDA: ``_linalg_solve`` (getrf+getrs), ``_linalg_inv_ex``,
``_linalg_det`` and ``_linalg_slogdet`` (getrf), ``_linalg_cholesky_ex`` (potrf), ``_linalg_qr`` (geqrf+orgqr),
``_linalg_svd`` (gesvd), ``_linalg_eigh`` (syevd), ``_linalg_solve_triangular`` (trsm), ``_linalg_lstsq``,
``_linalg_matrix_exp``, ``_linalg_lu_factor_ex`` (getrf) and ``_linalg_eig`` (geev, on the CPU). They take
batches of matrices already checked and broadcast, and report failures as LAPACK does, through an ``info``
output, so that one kernel serves the checking and the ``_ex`` forms alike.
Everything users call (``linalg.solve``, ``linalg.norm``, ``torch.svd``'s old API, ...) is a composite in
``linalg_functions.py`` that checks its arguments with torch's messages, broadcasts, calls these and raises
:class:`LinAlgError` from ``info``. Derivatives are torch's formulas (``linalg_grads.py``).
"""

# ruff: noqa: N803, N806 — matrices are named as in torch's linalg and the literature (A, B, L, U, S, Vh)

from __future__ import annotations

from tilewise import strides as S
from tilewise.dtypes import c10_name
from tilewise.layouts import contiguous_format
from tilewise.ops import linalg_grads  # noqa: F401 — registers the derivative helpers the formulas below name
from tilewise.ops.batching import apply_batched
from tilewise.ops.registry import OPS, declare


class LinAlgError(RuntimeError):
    """A matrix that a decomposition cannot handle (singular, not positive-definite): torch.linalg.LinAlgError."""


LinAlgError.__module__ = "tilewise.linalg"

type_name = c10_name  # torch's names of scalar types, as its linalg messages print them


def check_floating(op: str, A, low_precision: bool = False, complex_on_cpu: bool = False) -> None:
    """LAPACK and cuSOLVER work in float32 and float64: integers are refused, as are half types (torch refuses
    them too, with one message or another). Complex matrices are taken where ``complex_on_cpu`` says the operator
    handles them, on the CPU (LAPACK's complex routines through numpy)."""
    dtype = A.dtype
    if not dtype.is_floating_point and not dtype.is_complex:
        raise RuntimeError(f"{op}: Expected a floating point or complex tensor as input. Got {type_name(dtype)}")
    if dtype.is_complex:
        if complex_on_cpu and A.device.type == "cpu":
            return
        where = " on CUDA (the CPU takes them)" if complex_on_cpu else ""
        raise NotImplementedError(f"{op}: complex inputs are not supported yet{where} (got {dtype.name})")
    if dtype.name not in ("float32", "float64") and not low_precision:
        raise RuntimeError(f"{op}: Low precision dtypes not supported. Got {type_name(dtype)}")


def check_matrix(op: str, A, name: str = "A") -> None:
    if A.ndim < 2:
        raise RuntimeError(f"{op}: The input tensor {name} must have at least 2 dimensions.")


def check_square(op: str, A, name: str = "A") -> None:
    check_matrix(op, A, name)
    if A.shape[-1] != A.shape[-2]:
        raise RuntimeError(f"{op}: {name} must be batches of square matrices, but they are {A.shape[-2]} by "
                           f"{A.shape[-1]} matrices")


def check_same_dtype(op: str, A, B) -> None:
    if A.dtype is not B.dtype:
        raise RuntimeError(f"{op}: Expected A and B to have the same dtype, but found A of type {type_name(A.dtype)} "
                           f"and B of type {type_name(B.dtype)} instead")


def column_major(t):
    """``t`` laid out as torch lays out the results of its LAPACK and cuSOLVER routines: each matrix of the last
    two dims column-major, the batch dims row-major around them (``strides.column_major_strides``); ``t`` itself
    when it already is, as the primitives' kernels return those results (so the tensor autograd saved is the one
    returned). The public composites (``linalg_functions.py``) call it on each such result; it copies only what a
    composite reshaped (a batch of vectors, which torch lays out as one matrix). A 1-D ``t`` is left as it is."""
    if t.ndim < 2 or t.stride() == S.column_major_strides(tuple(t.shape)):
        return t
    return t.mT.clone(memory_format=contiguous_format).mT


def raise_from_info(op: str, info, message, error: type = LinAlgError) -> None:
    """Raise ``error(message(code))`` (``LinAlgError`` unless torch raises another) for the first failed matrix of a
    batch, as torch's ``_linalg_check_errors`` does (``info`` of the batch shape; 0 means success). Not while
    tracing, where values cannot be read."""
    from tilewise.dispatch import values_readable

    if info.numel() == 0 or not values_readable(info):
        return
    codes = info.reshape(-1).cpu().tolist()
    for k, code in enumerate(codes):
        if code > 0:
            batch = f"(Batch element {k}): " if info.ndim > 0 else ""
            raise error(f"{op}: {batch}{message(code)}")


# ---------------------------------------------------------------- primitives (a kernel per backend)

declare("_linalg_solve(Tensor A, Tensor B) -> (Tensor result, Tensor info)", "other",
        grad={"A, B": "linalg_solve_backward(grad, A, result[0])"}, nondiff_outputs=(1,), public=False,
        doc="A X = B for A [..., n, n] and B [..., n, k] of one batch shape; info > 0 where A is singular.",
        batch=apply_batched,
        fwd="linalg_solve_jvp(A, A_t, B_t, result[0])")
declare("_linalg_inv_ex(Tensor A) -> (Tensor inverse, Tensor info)", "other",
        grad={"A": "linalg_inv_backward(grad, result[0])"}, nondiff_outputs=(1,), public=False,
        batch=apply_batched,
        fwd="linalg_inv_jvp(A_t, result[0])")
declare("_linalg_det(Tensor A) -> Tensor", "other", grad={"A": "linalg_det_backward(grad, result, A)"}, public=False,
        batch=apply_batched,
        fwd="linalg_det_jvp(A, A_t, result)")
declare("_linalg_slogdet(Tensor A) -> (Tensor sign, Tensor logabsdet)", "other",
        grad={"A": "slogdet_backward(output_grads, A, result[0])"}, public=False,
        batch=apply_batched,
        fwd="slogdet_jvp(A, A_t, result[0])")
declare("_linalg_cholesky_ex(Tensor A, bool upper=False) -> (Tensor L, Tensor info)", "other",
        grad={"A": "cholesky_backward(grad, upper, result[0])"}, nondiff_outputs=(1,), public=False,
        batch=apply_batched,
        fwd="cholesky_jvp(A_t, result[0], upper)")
declare("_linalg_qr(Tensor A, str mode='reduced') -> (Tensor Q, Tensor R)", "other",
        grad={"A": "linalg_qr_backward(output_grads, result[0], result[1], mode)"}, public=False, batch=apply_batched,
        fwd="linalg_qr_jvp(A_t, result[0], result[1], mode)")
declare("_linalg_svd(Tensor A, bool full_matrices=False, bool compute_uv=True) -> (Tensor U, Tensor S, Tensor Vh)",
        "other", grad={"A": "svd_backward(output_grads, result[0], result[1], result[2], full_matrices)"},
        public=False, batch=apply_batched,
        fwd="svd_jvp(A, A_t, result[0], result[1], result[2], full_matrices, compute_uv)")
declare("_linalg_eigh(Tensor A, str UPLO='L', bool compute_v=True) -> (Tensor eigenvalues, Tensor eigenvectors)",
        "other", grad={"A": "eigh_backward(output_grads, result[0], result[1])"}, public=False, batch=apply_batched,
        fwd="eigh_jvp(A, A_t, UPLO, result[0], result[1])")
declare("_linalg_solve_triangular(Tensor A, Tensor B, *, bool upper, bool left=True, bool unitriangular=False) "
        "-> Tensor", "other", grad={"A, B": "solve_triangular_backward(grad, A, result, upper, left, unitriangular)"},
        public=False,
        batch=apply_batched,
        fwd="solve_triangular_jvp(A_t, B_t, A, result, upper, left, unitriangular)")
declare("_linalg_lstsq(Tensor A, Tensor B, float? rcond=None, str driver='gelsy') -> (Tensor solution, "
        "Tensor residuals, Tensor rank, Tensor singular_values)", "other",
        grad={"A, B": "lstsq_backward(output_grads, A, B, result[0])"}, nondiff_outputs=(2, 3), public=False,
        batch=apply_batched,
        fwd="lstsq_jvp(A, B, A_t, B_t, result[0], result[1])")
declare("_linalg_matrix_exp(Tensor A) -> Tensor", "other", grad={"A": "matrix_exp_backward(A, grad)"}, public=False,
        batch=apply_batched,
        fwd="matrix_exp_jvp(A, A_t)")
declare("_linalg_eig(Tensor A) -> (Tensor eigenvalues, Tensor eigenvectors)", "other",
        grad={"A": "linalg_eig_backward(output_grads, A, result[0], result[1])"}, public=False,
        doc="geev of A [..., n, n] on the CPU: complex eigenvalues and unit-norm eigenvectors (columns).",
        batch=apply_batched, fwd="linalg_eig_jvp(A_t, result[0], result[1])")
declare("_linalg_lu_factor_ex(Tensor A, bool pivot=True) -> (Tensor LU, Tensor pivots, Tensor info)", "other",
        grad={"A": "lu_factor_ex_backward(grad, result[0], result[1], pivot)"}, nondiff_outputs=(1, 2), public=False,
        doc="getrf of A [..., m, n]: the packed factors (L's strict lower part, U), 1-based int32 row swaps, info.",
        batch=apply_batched, fwd="lu_factor_ex_jvp(A_t, result[0], result[1], pivot)")

# The solvers read their info codes on the host (LinAlgError) and call LAPACK/cuSOLVER: a function that uses them
# runs eagerly under tilewise.compile (with a warning), where the codes are read and the errors raised.
for _name in ("_linalg_solve", "_linalg_inv_ex", "_linalg_det", "_linalg_slogdet", "_linalg_cholesky_ex", "_linalg_qr",
              "_linalg_svd", "_linalg_eigh", "_linalg_solve_triangular", "_linalg_lstsq", "_linalg_matrix_exp",
              "_linalg_lu_factor_ex", "_linalg_eig"):
    OPS[_name].attrs["compiled"] = False

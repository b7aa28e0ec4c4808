"""``tilewise.linalg`` and torch's older top-level forms (``torch.svd``, ``torch.qr``, ``torch.det``, ...).

Each is a composite over the primitives of ``linalg_solvers.py``: it checks its arguments with torch's
messages, broadcasts batches, calls a primitive and turns a failed ``info`` into :class:`LinAlgError`.
Composites that torch differentiates with their own formula (``pinv``, ``cholesky_solve``,
``cholesky_inverse``) declare it; the others are differentiated through the primitives they call. The
``linalg_*`` operators are not top-level functions: ``tilewise/linalg.py`` gives them their torch names.
"""

# ruff: noqa: N803, N806 — matrices are named as in torch's linalg and the literature (A, B, L, U, S, Vh)

from __future__ import annotations

import math
import warnings

from tilewise import strides as S
from tilewise._warnings import warn_at_caller
from tilewise.layouts import contiguous_format
from tilewise.ops.linalg import chain_autocast_on_cpu
from tilewise.ops.linalg_solvers import (
    LinAlgError,
    check_floating,
    check_matrix,
    check_same_dtype,
    check_square,
    column_major,
    raise_from_info,
    type_name,
)
from tilewise.ops.registry import OPS, declare
from tilewise.tensor import Tensor

# torch's CPU autocast runs these in float32 (LAPACK has no half precision): low-precision inputs are cast up
# under autocast rather than refused; tilewise does the same under CUDA autocast
_AUTOCAST_FP32 = frozenset({
    "linalg_solve", "linalg_inv", "linalg_inv_ex", "inverse", "linalg_cholesky",
    "linalg_cholesky_ex", "cholesky", "cholesky_solve", "cholesky_inverse", "linalg_qr", "qr", "linalg_svd", "svd",
    "linalg_svdvals", "linalg_eigh", "linalg_eigvalsh", "linalg_lstsq", "pinverse", "linalg_matrix_rank",
    "linalg_tensorinv", "linalg_tensorsolve", "triangular_solve", "linalg_householder_product", "orgqr"})


def _matrix_power_on_cpu(op, args) -> str | None:
    """torch's matrix_power under CPU autocast: its matmuls run in the low dtype (n >= 2), its inverse in float32
    (n < 0); n = 0 and 1 call neither."""
    n = args[1]
    return "lower" if n >= 2 else "fp32" if n < 0 else None


_AUTOCAST_OTHER = {
    "linalg_solve_ex": {"cuda": "fp32"},  # torch's CPU list has linalg_solve, not its _ex form
    "linalg_vecdot": "lower",
    "linalg_multi_dot": {"cpu": chain_autocast_on_cpu, "cuda": "lower"},
    # torch's CUDA list: float32 unless a dtype= is given ("fp32_set_opt_dtype"); its CPU list has neither
    "linalg_vector_norm": {"cuda": "fp32"},
    "linalg_matrix_norm": {"cuda": "fp32"},
    "linalg_matrix_power": {"cpu": _matrix_power_on_cpu},
    "matrix_power": {"cpu": _matrix_power_on_cpu},
    "lu_solve": {"cpu": "fp32"},  # torch's CPU list has the deprecated form, not linalg's
    "linalg_eig": {"cpu": "fp32"},
    "linalg_eigvals": {"cpu": "fp32"},
}


def _autocast_policy(schema: str):
    name = schema.split("(", 1)[0]
    return "fp32" if name in _AUTOCAST_FP32 else _AUTOCAST_OTHER.get(name)


def linalg(schema: str, decomposition, grad: dict | None = None, **attrs):
    """A ``tilewise.linalg`` function: no top-level name or method of its own."""
    return declare(schema, "composite", decomposition=decomposition, grad=grad, function=False, method=False,
                   autocast=_autocast_policy(schema), **attrs)


def torch_form(schema: str, decomposition, grad: dict | None = None, **attrs):
    """A torch top-level function (and Tensor method) that is a form of a linalg one."""
    return declare(schema, "composite", decomposition=decomposition, grad=grad, autocast=_autocast_policy(schema),
                   **attrs)


def _grad_wanted(A) -> bool:
    """Whether a backward or a tangent will need the singular vectors or eigenvectors (torch computes them then,
    too)."""
    from tilewise.dispatch import STATE, dual_levels

    return (A.requires_grad and STATE.grad_enabled) or bool(dual_levels and A.__dict__.get("_tangents"))


def bool_dtype():
    from tilewise import dtypes

    return dtypes.bool_


def _eye(n, like):
    from tilewise.ops.creation import eye

    return eye(n, dtype=like.dtype, device=like.device)


# ---------------------------------------------------------------- solve, inv, det

def _is_vector_rhs(A, B) -> bool:
    """torch's rule: B is a batch of vectors when it is 1-D, or has one dim less than A and A's leading shape."""
    return B.ndim == 1 or (B.ndim == A.ndim - 1 and tuple(B.shape) == tuple(A.shape[:-1]))


def _broadcast_solve_operands(op: str, A, B, left: bool):
    """A [..., n, n] and B as matrices of one batch shape, and whether B was a vector."""
    vector = _is_vector_rhs(A, B)
    Bm = B.unsqueeze(-1) if vector else B  # a column either side, as torch's: X A = b refuses a vector of n > 1
    n = A.shape[-1]
    k = -2 if left else -1
    if Bm.shape[k] != n:
        equation = "AX = B" if left else "XA = B"
        b = f"{B.shape[-1]}x1" if vector else f"{Bm.shape[-2]}x{Bm.shape[-1]}"  # torch prints a vector as a column
        raise RuntimeError(f"{op}: Incompatible shapes of A and B for the equation {equation} ({n}x{n} and {b})")
    batch = S.broadcast_shapes(tuple(A.shape[:-2]), tuple(Bm.shape[:-2]))
    return A.expand(batch + tuple(A.shape[-2:])), Bm.expand(batch + tuple(Bm.shape[-2:])), vector


def _solve_ex(A, B, left=True, check_errors=False):
    op = "linalg.solve"
    check_floating(op, A, complex_on_cpu=True)
    check_square(op, A)
    check_same_dtype(op, A, B)
    A_, B_, vector = _broadcast_solve_operands(op, A, B, left)
    if left:
        X, info = OPS["_linalg_solve"](A_, B_)
    else:
        X, info = OPS["_linalg_solve"](A_.mT, B_.mT)
        X = X.mT
    if check_errors:
        raise_from_info("torch.linalg.solve", info,
                        lambda code: "The solver failed because the input matrix is singular.")
    if vector:
        X = X.squeeze(-1) if left else X.squeeze(-2)
    # torch's result: column-major for A X = B (a batch of vectors counted as one matrix), row-major for X A = B
    return column_major(X) if left else X.contiguous(), info


linalg("linalg_solve_ex(Tensor A, Tensor B, *, bool left=True, bool check_errors=False) -> "
       "(Tensor result, Tensor info)", _solve_ex)
linalg("linalg_solve(Tensor A, Tensor B, *, bool left=True) -> Tensor",
       lambda A, B, left=True: _solve_ex(A, B, left, True)[0],
       doc="The solution X of A X = B (or X A = B with ``left=False``); B may be a (batch of) vector(s).\n\n"
           ">>> tw.linalg.solve(tw.eye(2) * 2, tw.ones(2))\ntensor([0.5000, 0.5000])")


def _singular_inverse(code: int) -> str:
    return (f"The diagonal element {code} is zero, the inversion could not be completed because the input matrix "
            "is singular.")


def _inv_ex(A, check_errors=False):
    check_matrix("linalg.inv", A)
    check_floating("linalg.inv", A, complex_on_cpu=True)
    check_square("linalg.inv", A)
    inverse, info = OPS["_linalg_inv_ex"](A)
    if check_errors:
        raise_from_info("linalg.inv", info, _singular_inverse)
    return column_major(inverse), info


linalg("linalg_inv_ex(Tensor A, *, bool check_errors=False) -> (Tensor inverse, Tensor info)", _inv_ex)
linalg("linalg_inv(Tensor A) -> Tensor", lambda A: _inv_ex(A, True)[0])
torch_form("inverse(Tensor self) -> Tensor", lambda A: _inv_ex(A, True)[0])


def _det(A):
    check_matrix("linalg.det", A)
    check_floating("linalg.det", A, complex_on_cpu=True)
    check_square("linalg.det", A)
    return OPS["_linalg_det"](A)


def _slogdet(A):
    check_matrix("linalg.slogdet", A)
    check_floating("linalg.slogdet", A, complex_on_cpu=True)
    check_square("linalg.slogdet", A)
    return OPS["_linalg_slogdet"](A)


def _logdet(A):
    sign, logabs = _slogdet(A)
    if sign.dtype.is_complex:  # the determinant's complex logarithm: log|det| + i arg(det)
        return logabs.to(sign.dtype) + sign.log()
    return logabs + (sign * 0).masked_fill(sign < 0, float("nan"))


linalg("linalg_det(Tensor A) -> Tensor", _det)
torch_form("det(Tensor self) -> Tensor", _det, out=False)
linalg("linalg_slogdet(Tensor A) -> (Tensor sign, Tensor logabsdet)", _slogdet)
torch_form("slogdet(Tensor self) -> (Tensor sign, Tensor logabsdet)", _slogdet)
torch_form("logdet(Tensor self) -> Tensor", _logdet, out=False)


# ---------------------------------------------------------------- cholesky

def _not_positive_definite(code: int) -> str:
    return (f"The factorization could not be completed because the input is not positive-definite (the leading "
            f"minor of order {code} is not positive-definite).")


def _cholesky_ex(A, upper=False, check_errors=False, op="linalg.cholesky_ex"):
    check_matrix("linalg.cholesky", A)
    check_floating("linalg.cholesky", A)
    check_square("linalg.cholesky", A)
    L, info = OPS["_linalg_cholesky_ex"](A, upper)
    if check_errors:
        raise_from_info(op, info, _not_positive_definite)
    return column_major(L), info


def _cholesky_old(A, upper=False):
    warnings.warn("torch.cholesky is deprecated in favor of torch.linalg.cholesky and will be removed in a future "
                  "PyTorch release.", UserWarning, stacklevel=3)
    return _cholesky_ex(A, upper, True, "cholesky")[0]


linalg("linalg_cholesky_ex(Tensor A, *, bool upper=False, bool check_errors=False) -> (Tensor L, Tensor info)",
       _cholesky_ex)
linalg("linalg_cholesky(Tensor A, *, bool upper=False) -> Tensor",
       lambda A, upper=False: _cholesky_ex(A, upper, True, "linalg.cholesky")[0])
torch_form("cholesky(Tensor self, bool upper=False) -> Tensor", _cholesky_old)


# ---------------------------------------------------------------- eig (general, non-symmetric)

def _eig(A):
    check_matrix("linalg.eig", A)
    if A.dtype.name in ("float16", "bfloat16"):
        raise NotImplementedError(f'"linalg_eig_out_{A.device.type}" not implemented for \'{type_name(A.dtype)}\' '
                                  "(linalg.eig: float32, float64, complex64 and complex128 matrices are decomposed)")
    if not (A.dtype.is_floating_point or A.dtype.is_complex):
        raise RuntimeError(f"linalg.eig: Expected a floating point or complex tensor as input. Got "
                           f"{type_name(A.dtype)}")
    check_square("linalg.eig", A)
    if A.device.type == "cpu":
        return OPS["_linalg_eig"](A)
    # the device's results come from the host's geev, as torch's CUDA eig runs on the host too (MAGMA's geev)
    values, vectors = OPS["_linalg_eig"](A.cpu())
    return values.to(A.device), column_major(vectors.to(A.device))


linalg("linalg_eig(Tensor A) -> (Tensor eigenvalues, Tensor eigenvectors)", _eig)
linalg("linalg_eigvals(Tensor A) -> Tensor", lambda A: _eig(A)[0])


# ---------------------------------------------------------------- LU: factor, unpack, solve

def _zero_pivot(code: int) -> str:
    return (f"U[{code},{code}] is zero and using it on lu_solve would result in a division by zero. If you still "
            "want to perform the factorization, consider calling linalg.lu(A, pivot) or linalg.lu_factor_ex(A, pivot)")


def _check_lu_input(op: str, A) -> None:
    if A.ndim < 2:
        raise RuntimeError(f"torch.lu_factor: Expected tensor with 2 or more dimensions. Got size: {list(A.shape)} "
                           f"instead ({op})")
    if not (A.dtype.is_floating_point or A.dtype.is_complex) or A.dtype.name not in ("float32", "float64"):
        raise NotImplementedError(f'"lu_{A.device.type}" not implemented for \'{type_name(A.dtype)}\' ({op}: '
                                  "float32 and float64 matrices are factored)")


def _lu_factor_ex(A, pivot=True, check_errors=False):
    _check_lu_input("linalg.lu_factor_ex", A)
    LU, pivots, info = OPS["_linalg_lu_factor_ex"](A, pivot)
    if check_errors:
        raise_from_info("torch.linalg.lu_factor_ex", info, _zero_pivot, RuntimeError)  # (torch's: no LinAlgError)
    return LU, pivots, info


def _lu_factor(A, pivot=True):
    _check_lu_input("linalg.lu_factor", A)
    LU, pivots, info = OPS["_linalg_lu_factor_ex"](A, pivot)
    raise_from_info("torch.linalg.lu_factor", info, _zero_pivot, RuntimeError)
    return LU, pivots


def _permutation(pivots, m: int, dtype, device):
    """The permutation matrices [..., m, m] of LAPACK's row swaps (1-based, applied in order): A = P L U. The swaps
    are read on the host (a device's pivots are copied there once)."""
    import numpy as np

    from tilewise.dispatch import values_readable
    from tilewise.tensor import tensor

    if not values_readable(pivots) or pivots._storage is None:
        raise RuntimeError("lu_unpack: the row swaps (pivots) are read on the host to build the permutation, which "
                           "vmap and traced functions cannot do; unpack the factors outside vmap (linalg.lu_factor "
                           "itself batches)")
    count = math.prod(pivots.shape[:-1])
    swaps = np.asarray(pivots.detach().cpu().numpy(), dtype=np.int64).reshape(count, pivots.shape[-1]) - 1
    order = np.tile(np.arange(m), (count, 1))
    rows = np.arange(swaps.shape[0])
    for j in range(swaps.shape[1]):
        p = swaps[:, j]
        top = order[rows, j].copy()
        order[rows, j] = order[rows, p]
        order[rows, p] = top
    P = np.zeros((swaps.shape[0], m, m), dtype=dtype.np)
    P[rows[:, None], order, np.arange(m)[None, :]] = 1
    return tensor(P.reshape(*pivots.shape[:-1], m, m), dtype=dtype, device=device)


def _lu_unpack(LU_data, LU_pivots, unpack_data=True, unpack_pivots=True):
    if LU_pivots.dtype.name != "int32":
        raise RuntimeError("torch.lu_unpack: LU_pivots is expected to be a contiguous tensor of torch.int32 dtype.\n"
                           "Note: this function is intended to be used with the output produced by "
                           f"torch.linalg.lu_factor (got {LU_pivots.dtype.name})")
    m, n = LU_data.shape[-2], LU_data.shape[-1]
    k = min(m, n)
    empty = LU_data.new_empty((0,))
    if unpack_data:
        from tilewise.ops.creation import eye

        L = LU_data[..., :k].tril(-1) + eye(m, k, dtype=LU_data.dtype, device=LU_data.device)
        U = LU_data[..., :k, :].triu()
    else:
        L = U = empty
    P = _permutation(LU_pivots, m, LU_data.dtype, LU_data.device) if unpack_pivots else empty
    return P, L, U


def _lu(A, pivot=True):
    _check_lu_input("linalg.lu", A)
    LU, pivots, _ = OPS["_linalg_lu_factor_ex"](A, pivot)
    return _lu_unpack(LU, pivots, True, pivot)


def _lu_solve(LU, pivots, B, left=True, adjoint=False):
    op = "linalg.lu_solve"
    check_floating(op, LU)
    if LU.ndim < 2:
        raise RuntimeError(f"{op}: The input tensor A must have at least 2 dimensions.")
    if B.ndim < 2:
        raise RuntimeError(f"{op}: The input tensor B must have at least 2 dimensions.")
    if LU.shape[-1] != LU.shape[-2]:
        raise RuntimeError(f"torch.{op}: A must be batches of square matrices, but they are {LU.shape[-2]} by "
                           f"{LU.shape[-1]} matrices")
    n = LU.shape[-1]
    if (B.shape[-2] if left else B.shape[-1]) != n:
        b = f"{B.shape[-2]}x{B.shape[-1]}"
        raise RuntimeError(f"{op}: Incompatible shapes of A and B for the equation {'AX = B' if left else 'XA = B'} "
                           f"({n}x{n} and {b})")
    if LU.dtype is not B.dtype:
        raise RuntimeError(f"{op}: Expected LU and B to have the same dtype, but found LU of type "
                           f"{type_name(LU.dtype)} and B of type {type_name(B.dtype)} instead")
    if pivots.dtype.name != "int32":
        raise RuntimeError(f"{op}: pivots should be a Tensor of scalar type torch.int32 (got {pivots.dtype.name})")
    if pivots.shape[-1] != n:
        raise RuntimeError(f"{op}: Number of pivots per batch should be same as the dimension of the matrix")
    batch = S.broadcast_shapes(tuple(LU.shape[:-2]), tuple(B.shape[:-2]), tuple(pivots.shape[:-1]))
    LU = LU.expand(batch + (n, n))
    B = B.expand(batch + tuple(B.shape[-2:]))
    P, L, U = _lu_unpack(LU, pivots.expand(batch + (n,)))
    solve = OPS["_linalg_solve_triangular"]
    if left and not adjoint:  # P L U X = B
        X = solve(U, solve(L, P.mT.matmul(B), upper=False, unitriangular=True), upper=True)
    elif left:  # U^H L^H P^H X = B
        X = P.matmul(solve(L.mH, solve(U.mH, B, upper=False), upper=True, unitriangular=True))
    elif not adjoint:  # X P L U = B
        X = solve(L, solve(U, B, upper=True, left=False), upper=False, left=False, unitriangular=True).matmul(P.mT)
    else:  # X U^H L^H P^H = B
        X = solve(U.mH, solve(L.mH, B.matmul(P), upper=True, left=False, unitriangular=True), upper=False, left=False)
    return column_major(X) if left else column_major(X.mT).mT


def _lu_old(A, pivot=True, get_infos=False):
    warn_at_caller(_LU_DEPRECATED)
    LU, pivots, info = _lu_factor_ex(A, pivot, not get_infos)
    return (LU, pivots, info) if get_infos else (LU, pivots)


def _lu_solve_old(b, LU_data, LU_pivots):
    warnings.warn("torch.lu_solve is deprecated in favor of torch.linalg.lu_solveand will be removed in a future "
                  "PyTorch release.\nNote that torch.linalg.lu_solve has its arguments reversed.\nX = "
                  "torch.lu_solve(B, LU, pivots)\nshould be replaced with\nX = torch.linalg.lu_solve(LU, pivots, B)",
                  UserWarning, stacklevel=3)
    return _lu_solve(LU_data, LU_pivots, b)


_LU_DEPRECATED = ("torch.lu is deprecated in favor of torch.linalg.lu_factor / torch.linalg.lu_factor_ex and will be "
                  "removed in a future PyTorch release.\nLU, pivots = torch.lu(A, compute_pivots)\nshould be replaced "
                  "with\nLU, pivots = torch.linalg.lu_factor(A, compute_pivots)\nand\nLU, pivots, info = torch.lu(A, "
                  "compute_pivots, get_infos=True)\nshould be replaced with\nLU, pivots, info = "
                  "torch.linalg.lu_factor_ex(A, compute_pivots)")

linalg("linalg_lu_factor_ex(Tensor A, *, bool pivot=True, bool check_errors=False) -> (Tensor LU, Tensor pivots, "
       "Tensor info)", _lu_factor_ex)
linalg("linalg_lu_factor(Tensor A, *, bool pivot=True) -> (Tensor LU, Tensor pivots)", _lu_factor)
linalg("linalg_lu(Tensor A, *, bool pivot=True) -> (Tensor P, Tensor L, Tensor U)", _lu)
linalg("linalg_lu_solve(Tensor LU, Tensor pivots, Tensor B, *, bool left=True, bool adjoint=False) -> Tensor",
       _lu_solve)
torch_form("lu_unpack(Tensor LU_data, Tensor LU_pivots, bool unpack_data=True, bool unpack_pivots=True) -> "
           "(Tensor P, Tensor L, Tensor U)", _lu_unpack)
torch_form("lu_solve(Tensor self, Tensor LU_data, Tensor LU_pivots) -> Tensor", _lu_solve_old)
torch_form("lu(Tensor self, bool pivot=True, bool get_infos=False) -> Tensor[]", _lu_old)


def _cholesky_solve(B, L, upper=False):
    check_floating("cholesky_solve", L)
    if B.dtype is not L.dtype:
        raise RuntimeError(f"Expected b and A to have the same dtype, but found b of type {type_name(B.dtype)} and A "
                           f"of type {type_name(L.dtype)} instead.")
    check_square("cholesky_solve", L)
    if B.ndim < 2:
        raise RuntimeError(f"cholesky_solve: b should have at least 2 dimensions, but has {B.ndim} dimensions instead")
    L_, B_, _ = _broadcast_solve_operands("cholesky_solve", L, B, True)
    if upper:  # A = U^H U
        Y = OPS["_linalg_solve_triangular"](L_.mT, B_, upper=False)
        return column_major(OPS["_linalg_solve_triangular"](L_, Y, upper=True))
    Y = OPS["_linalg_solve_triangular"](L_, B_, upper=False)
    return column_major(OPS["_linalg_solve_triangular"](L_.mT, Y, upper=True))


torch_form("cholesky_solve(Tensor self, Tensor input2, bool upper=False) -> Tensor", _cholesky_solve,
           {"self, input2": "cholesky_solve_backward(grad, self, input2, result, upper)"},
           fwd="cholesky_solve_jvp(result, input2, input2_t, self_t, upper)")


def _cholesky_inverse(L, upper=False):
    check_floating("cholesky_inverse", L)
    check_square("cholesky_inverse", L, "input")
    eye = _eye(L.shape[-1], L).expand(L.shape)
    return _cholesky_solve(eye, L, upper)


torch_form("cholesky_inverse(Tensor self, bool upper=False) -> Tensor", _cholesky_inverse,
           {"self": "cholesky_inverse_backward(grad, self, upper, result)"},
           fwd="cholesky_inverse_jvp(self, self_t, upper, result)")


# ---------------------------------------------------------------- triangular solves

def _solve_triangular(A, B, upper, left=True, unitriangular=False):
    op = "linalg.solve_triangular"
    check_floating(op, A)
    check_square(op, A)
    check_same_dtype(op, A, B)
    check_matrix(op, B, "B")
    n = A.shape[-1]
    k = -2 if left else -1
    if B.shape[k] != n:
        equation = "AX = B" if left else "XA = B"
        raise RuntimeError(f"{op}: Incompatible shapes of A and B for the equation {equation} ({n}x{n} and "
                           f"{B.shape[-2]}x{B.shape[-1]})")
    batch = S.broadcast_shapes(tuple(A.shape[:-2]), tuple(B.shape[:-2]))
    A_ = A.expand(batch + tuple(A.shape[-2:]))
    B_ = B.expand(batch + tuple(B.shape[-2:]))
    return column_major(OPS["_linalg_solve_triangular"](A_, B_, upper=upper, left=left, unitriangular=unitriangular))


linalg("linalg_solve_triangular(Tensor A, Tensor B, *, bool upper, bool left=True, bool unitriangular=False) "
       "-> Tensor", _solve_triangular)


def _triangular_solve(b, A, upper=True, transpose=False, unitriangular=False):
    warnings.warn("torch.triangular_solve is deprecated in favor of torch.linalg.solve_triangular and will be "
                  "removed in a future PyTorch release.", UserWarning, stacklevel=3)
    coefficient = A.mT if transpose else A
    solution = _solve_triangular(coefficient, b, upper=upper != transpose, unitriangular=unitriangular)
    return solution, column_major(A.clone())


# its own node, as in torch: it saves b, A and the solution (changing b in place before backward is an error)
torch_form("triangular_solve(Tensor self, Tensor A, bool upper=True, bool transpose=False, bool unitriangular=False) "
           "-> (Tensor solution, Tensor cloned_coefficient)", _triangular_solve,
           {"self, A": "triangular_solve_backward(output_grads, self, A, result[0], upper, transpose, unitriangular)"},
           fwd="triangular_solve_jvp(self_t, A, A_t, result[0], upper, transpose, unitriangular)")


# ---------------------------------------------------------------- qr, svd, eigh

def _qr(A, mode="reduced"):
    if mode not in ("reduced", "complete", "r"):
        raise RuntimeError(f"qr received unrecognized mode '{mode}' but expected one of 'reduced' (default), 'r', or "
                           "'complete'")
    check_matrix("linalg.qr", A)
    check_floating("linalg.qr", A)
    Q, R = OPS["_linalg_qr"](A, mode)
    return column_major(Q), column_major(R)


def _qr_old(A, some=True):
    warnings.warn("torch.qr is deprecated in favor of torch.linalg.qr and will be removed in a future PyTorch "
                  "release.", UserWarning, stacklevel=3)
    return _qr(A, "reduced" if some else "complete")


linalg("linalg_qr(Tensor A, str mode='reduced') -> (Tensor Q, Tensor R)", _qr)
torch_form("qr(Tensor self, bool some=True) -> (Tensor Q, Tensor R)", _qr_old)


def _householder_product(A, tau):
    """The first n columns of H_1 H_2 ... H_k, H_i = I - tau_i v_i v_i^H, v_i column i of A below the diagonal
    under a unit diagonal (LAPACK's orgqr: the Q of geqrf's output). Applied right to left to the identity's
    first n columns, one reflector at a time, each a differentiable product."""
    op = "torch.linalg.householder_product"
    if A.ndim < 2:
        raise RuntimeError(f"{op}: input must have at least 2 dimensions.")
    if A.shape[-2] < A.shape[-1]:
        raise RuntimeError(f"{op}: input.shape[-2] must be greater than or equal to input.shape[-1]")
    if A.shape[-1] < tau.shape[-1]:
        raise RuntimeError(f"{op}: input.shape[-1] must be greater than or equal to tau.shape[-1]")
    if tau.ndim != A.ndim - 1:
        raise RuntimeError(f"{op}: Expected tau to have one dimension less than input, but got tau.ndim equal to "
                           f"{tau.ndim} and input.ndim is equal to {A.ndim}")
    if tuple(tau.shape[:-1]) != tuple(A.shape[:-2]):
        raise RuntimeError(f"{op}: Expected batch dimensions of tau to be equal to input.shape[:-2], but got "
                           f"{list(tau.shape[:-1])}")
    if tau.dtype != A.dtype:
        raise RuntimeError(f"{op}: tau dtype {type_name(tau.dtype)} does not match input dtype "
                           f"{type_name(A.dtype)}")
    if not A.dtype.is_floating_point and not A.dtype.is_complex:
        raise NotImplementedError(f'"orgqr_{A.device.type}" not implemented for \'{type_name(A.dtype)}\'')
    m, n = A.shape[-2], A.shape[-1]
    from tilewise.ops.creation import eye

    unit = eye(m, n, dtype=A.dtype, device=A.device)
    V = A.tril(-1) + unit
    if tau.shape[-1] == 0:  # as torch, the identity stays in A's graph (with a zero gradient)
        from tilewise.ops.creation import ones

        return column_major(A.masked_fill(ones(A.shape, dtype=bool_dtype(), device=A.device), 0) + unit)
    Q = unit.expand(*A.shape[:-2], m, n)
    for i in reversed(range(tau.shape[-1])):
        v = V[..., :, i:i + 1]
        Q = Q - tau[..., i:i + 1].unsqueeze(-1) * (v @ (v.mH @ Q))
    return column_major(Q)


linalg("linalg_householder_product(Tensor input, Tensor tau) -> Tensor", _householder_product)
torch_form("orgqr(Tensor self, Tensor input2) -> Tensor", _householder_product)


def _svd(A, full_matrices=True):
    check_matrix("linalg.svd", A)
    check_floating("linalg.svd", A)
    U, S_, Vh = OPS["_linalg_svd"](A, full_matrices, True)
    return column_major(U), S_, column_major(Vh)


def _svdvals(A):
    check_matrix("linalg.svd", A)
    check_floating("linalg.svd", A)
    return OPS["_linalg_svd"](A, False, _grad_wanted(A))[1]


def _svd_old(A, some=True, compute_uv=True):
    """torch.svd: V rather than Vh; without compute_uv, zero-filled U and V of full size."""
    if compute_uv:
        U, S_, Vh = _svd(A, not some)
        return U, S_, Vh.mT
    from tilewise.ops.creation import zeros

    S_ = _svdvals(A)
    batch, m, n = tuple(A.shape[:-2]), A.shape[-2], A.shape[-1]
    return (zeros(batch + (m, m), dtype=A.dtype, device=A.device), S_,
            zeros(batch + (n, n), dtype=A.dtype, device=A.device).mT)  # torch's V is a zero Vh's adjoint


linalg("linalg_svd(Tensor A, bool full_matrices=True) -> (Tensor U, Tensor S, Tensor Vh)", _svd)
linalg("linalg_svdvals(Tensor A) -> Tensor", _svdvals)
torch_form("svd(Tensor self, bool some=True, bool compute_uv=True) -> (Tensor U, Tensor S, Tensor V)", _svd_old)


def _check_uplo(UPLO):  # noqa: N803 — torch's argument name
    if UPLO not in ("L", "U", "l", "u"):
        raise RuntimeError(f"Expected UPLO argument to be 'L' or 'U', but got {UPLO}")
    return UPLO.upper()


def _eigh(A, UPLO="L"):  # noqa: N803
    UPLO = _check_uplo(UPLO)  # noqa: N806
    check_matrix("linalg.eigh", A)
    check_floating("linalg.eigh", A)
    check_square("linalg.eigh", A)
    eigenvalues, eigenvectors = OPS["_linalg_eigh"](A, UPLO, True)
    return eigenvalues, column_major(eigenvectors)


def _eigvalsh(A, UPLO="L"):  # noqa: N803
    UPLO = _check_uplo(UPLO)  # noqa: N806
    check_matrix("linalg.eigvalsh", A)
    check_floating("linalg.eigvalsh", A)
    check_square("linalg.eigvalsh", A)
    return OPS["_linalg_eigh"](A, UPLO, _grad_wanted(A))[0]


linalg("linalg_eigh(Tensor A, str UPLO='L') -> (Tensor eigenvalues, Tensor eigenvectors)", _eigh)
linalg("linalg_eigvalsh(Tensor A, str UPLO='L') -> Tensor", _eigvalsh)


# ---------------------------------------------------------------- least squares, pseudo-inverse, rank

_LSTSQ_DRIVERS = ("gels", "gelsy", "gelsd", "gelss")


def _lstsq(A, B, rcond=None, driver=None):
    op = "torch.linalg.lstsq"
    check_floating("linalg.lstsq", A)
    check_same_dtype("linalg.lstsq", A, B)
    check_matrix("linalg.lstsq", A)
    if driver is not None and driver not in _LSTSQ_DRIVERS:
        raise RuntimeError(f"{op}: parameter `driver` should be one of (gels, gelsy, gelsd, gelss)")
    if driver is None:  # torch's defaults: gelsy on the CPU, gels (the only one) on CUDA
        driver = "gelsy" if A.device.type == "cpu" else "gels"
    if A.device.type == "cuda" and driver != "gels":
        raise RuntimeError(f"{op}: `driver` other than `gels` is not supported on CUDA")
    vector = B.ndim == A.ndim - 1
    Bm = B.unsqueeze(-1) if vector else B
    if Bm.shape[-2] != A.shape[-2]:
        raise RuntimeError(f"{op}: input.size(-2) should match other.size(-2)")
    batch = S.broadcast_shapes(tuple(A.shape[:-2]), tuple(Bm.shape[:-2]))
    A_ = A.expand(batch + tuple(A.shape[-2:]))
    B_ = Bm.expand(batch + tuple(Bm.shape[-2:]))
    solution, residuals, rank, singular_values = OPS["_linalg_lstsq"](A_, B_, rcond, driver)
    solution = _in_right_hand_side(solution, A.shape[-2])
    if vector:  # the residuals keep their column (torch's shape [..., 1])
        solution = solution.squeeze(-1)
    return solution, residuals, rank, singular_values


def _in_right_hand_side(X, m: int):
    """torch's lstsq solves in place in a column-major copy of B padded to max(m, n) rows, and returns the first n
    rows of it: the solution has the strides of that buffer (as the kernels return it; else laid out so here)."""
    *batch, n, k = X.shape
    if m <= n:
        return column_major(X)
    if X.stride() == S.column_major_strides((*batch, m, k)):
        return X
    padded = OPS["cat"]([X, X.new_zeros((*batch, m - n, k))], -2)
    return column_major(padded).narrow(-2, 0, n)


linalg("linalg_lstsq(Tensor A, Tensor B, float? rcond=None, *, str? driver=None) -> (Tensor solution, "
       "Tensor residuals, Tensor rank, Tensor singular_values)", _lstsq)


def _tolerance(S_max, atol, rtol, m, n, like):
    """max(atol, rtol * largest singular value), with torch's default rtol of eps * max(m, n) when neither is given
    (and 0 when only atol is)."""
    from tilewise.dtypes import finfo

    if rtol is None:
        rtol = 0.0 if atol is not None and not (isinstance(atol, (int, float)) and atol <= 0) else \
            finfo(like.dtype).eps * max(m, n)
    tol = S_max * rtol
    if atol is not None:
        tol = tol.clamp(min=atol) if not isinstance(atol, Tensor) else OPS["maximum"](tol, atol)
    return tol


def _pinv(A, atol=None, rtol=None, hermitian=False):
    from tilewise.ops.creation import zeros_like

    if A.ndim < 2 or A.dtype.name not in ("float32", "float64"):
        raise RuntimeError(f"linalg.pinv({type_name(A.dtype)}{{{list(A.shape)}}}): expected a tensor with 2 or more "
                           "dimensions of float, double, cfloat or cdouble types")
    m, n = A.shape[-2], A.shape[-1]
    if A.numel() == 0:
        return zeros_like(A.mT)
    if hermitian:
        L, V = OPS["_linalg_eigh"](A, "L", True)
        mags = L.abs()
        tol = _tolerance(mags.amax(-1, keepdim=True), atol, rtol, m, n, A)
        inv = (1.0 / L).masked_fill(mags <= tol, 0.0)
        return (V * inv.unsqueeze(-2)).matmul(V.mT)
    U, S_, Vh = OPS["_linalg_svd"](A, False, True)
    tol = _tolerance(S_.amax(-1, keepdim=True), atol, rtol, m, n, A)
    inv = (1.0 / S_).masked_fill(S_ <= tol, 0.0)
    return (Vh.mT * inv.unsqueeze(-2)).matmul(U.mT)


def _as_tol(value):
    return value.unsqueeze(-1) if isinstance(value, Tensor) and value.ndim else value


def _pinv_public(A, rcond=None, hermitian=False, atol=None, rtol=None):
    if rcond is not None:
        rtol = rcond
    return _pinv(A, _as_tol(atol), _as_tol(rtol), hermitian)


linalg("linalg_pinv(Tensor A, float? rcond=None, bool hermitian=False, *, float? atol=None, float? rtol=None) "
       "-> Tensor", _pinv_public, {"A": "pinv_backward(grad, result, A)"},
       fwd="pinv_jvp(A, A_t, result)")
torch_form("pinverse(Tensor self, float rcond=1e-15) -> Tensor", lambda A, rcond=1e-15: OPS["linalg_pinv"](A, rcond),
           out=False)


def _matrix_rank(A, tol=None, hermitian=False, atol=None, rtol=None):
    from tilewise import dtypes

    check_floating("linalg.matrix_rank", A)
    check_matrix("linalg.matrix_rank", A)
    if tol is not None:
        atol, rtol = tol, 0.0
    m, n = A.shape[-2], A.shape[-1]
    values = OPS["_linalg_eigh"](A, "L", False)[0].abs() if hermitian else OPS["_linalg_svd"](A, False, False)[1]
    if values.shape[-1] == 0:
        return (values.sum(-1) * 0).to(dtypes.int64)
    tol_ = _tolerance(values.amax(-1, keepdim=True), _as_tol(atol), _as_tol(rtol), m, n, A)
    return (values > tol_).sum(-1)


linalg("linalg_matrix_rank(Tensor A, float? tol=None, bool hermitian=False, *, float? atol=None, float? rtol=None) "
       "-> Tensor", _matrix_rank, differentiable=False)


# ---------------------------------------------------------------- matrix functions

def _matrix_power(A, n):
    check_matrix("linalg.matrix_power", A)
    check_square("linalg.matrix_power", A)
    if n == 0:  # as torch: A overwritten, so the result stays in A's graph (with a zero gradient)
        from tilewise.ops.creation import ones

        everywhere = ones(A.shape, dtype=bool_dtype(), device=A.device)
        return A.masked_fill(everywhere, 0) + _eye(A.shape[-1], A)
    if n < 0:
        check_floating("linalg.inv", A, complex_on_cpu=True)
        A = _inv_ex(A, True)[0]
        if n == -1:
            return A  # torch's: the inverse as linalg.inv lays it out
        n = -n
    result, base = None, A
    while n:
        if n & 1:
            result = base if result is None else result.matmul(base)
        n >>= 1
        if n:
            base = base.matmul(base)
    return result if result is not A else A.clone(memory_format=contiguous_format)  # torch's: a row-major copy


linalg("linalg_matrix_power(Tensor A, int n) -> Tensor", _matrix_power)
torch_form("matrix_power(Tensor self, int n) -> Tensor", _matrix_power)


def _matrix_exp(A):
    check_matrix("linalg.matrix_exp", A)
    check_floating("linalg.matrix_exp", A, low_precision=True)  # computed in float64 on the host, rounded once
    check_square("linalg.matrix_exp", A)
    return OPS["_linalg_matrix_exp"](A)


linalg("linalg_matrix_exp(Tensor A) -> Tensor", _matrix_exp, out=False)
torch_form("matrix_exp(Tensor self) -> Tensor", _matrix_exp, out=False)


# ---------------------------------------------------------------- norms

def _check_norm_dtype(op: str, x, dtype) -> None:
    if not (x.dtype.is_floating_point or x.dtype.is_complex):
        raise RuntimeError(f"{op}: Expected a floating point or complex tensor as input. Got {type_name(x.dtype)}")
    if dtype is not None and not dtype.is_floating_point:
        raise RuntimeError(f"{op}: dtype should be floating point or complex. Got {type_name(dtype)}")
    if dtype is not None and dtype.itemsize < x.dtype.itemsize:
        raise RuntimeError(f"{op}: the dtype of the input ({type_name(x.dtype)}) should be convertible without "
                           f"narrowing to the specified dtype ({type_name(dtype)})")


def _vector_norm(x, ord=2, dim=None, keepdim=False, dtype=None):  # noqa: A002 — torch's argument name
    _check_norm_dtype("linalg.vector_norm", x, dtype)
    if isinstance(ord, bool) or not isinstance(ord, (int, float)):
        raise TypeError(f"linalg.vector_norm: ord must be a number, got {type(ord).__name__} {ord!r}")
    if dim is not None and not isinstance(dim, (list, tuple)):
        dim = [dim]
    return OPS["norm"](x, ord, dim, keepdim, dtype=dtype)


linalg("linalg_vector_norm(Tensor x, Scalar ord=2, int[1]? dim=None, bool keepdim=False, *, ScalarType? dtype=None) "
       "-> Tensor", _vector_norm)

_MATRIX_ORDS = ("fro", "nuc", 1, -1, 2, -2, math.inf, -math.inf)


def _matrix_norm(A, ord="fro", dim=(-2, -1), keepdim=False, dtype=None):  # noqa: A002
    op = "linalg.matrix_norm"
    _check_norm_dtype(op, A, dtype)
    check_matrix(op, A)
    if ord not in _MATRIX_ORDS or isinstance(ord, bool):
        raise RuntimeError(f"{op}: Order {ord} not supported.")
    dims = tuple(S.normalize_dim(d, A.ndim, op) for d in dim)
    if len(dims) != 2 or dims[0] == dims[1]:
        raise RuntimeError(f"{op}: dims must be different. Got ({dim[0]}, {dim[-1]})")
    if dtype is not None:
        A = A.to(dtype)
    if ord == "fro":
        return OPS["norm"](A, 2, list(dims), keepdim)
    if ord == "nuc" or abs(ord) == 2:
        rest = [d for d in range(A.ndim) if d not in dims]
        moved = A.permute(rest + list(dims))
        sv = _svdvals(moved)
        out = sv.sum(-1) if ord == "nuc" else (sv.amax(-1) if ord == 2 else sv.amin(-1))
        if keepdim:
            for d in sorted(dims):
                out = out.unsqueeze(d)
        return out
    d0, d1 = dims if abs(ord) == 1 else dims[::-1]  # 1: the largest column sum; inf: the largest row sum
    summed = A.abs().sum(d0, keepdim=True)
    out = summed.amax(d1, keepdim=True) if ord > 0 else summed.amin(d1, keepdim=True)
    return out if keepdim else out.squeeze(max(dims)).squeeze(min(dims))


linalg("linalg_matrix_norm(Tensor A, Any ord='fro', int[] dim=[-2, -1], bool keepdim=False, *, "
       "ScalarType? dtype=None) -> Tensor", _matrix_norm)


def _norm(A, ord=None, dim=None, keepdim=False, dtype=None):  # noqa: A002
    if dim is not None and not isinstance(dim, (list, tuple)):
        dim = [dim]
    if dim is not None and len(dim) == 2 or (dim is None and ord is not None and A.ndim == 2):
        return _matrix_norm(A, "fro" if ord is None else ord, dim if dim is not None else (-2, -1), keepdim, dtype)
    if ord is not None and dim is None and A.ndim != 1:
        raise RuntimeError(f"linalg.norm: If dim is not specified but ord is, the input must be 1D or 2D. Got "
                           f"{A.ndim}D.")
    if isinstance(ord, str):
        raise RuntimeError(f"linalg.matrix_norm: dim must be a 2-tuple. Got {' '.join(map(str, dim or ()))}")
    return _vector_norm(A, 2 if ord is None else ord, dim, keepdim, dtype)


linalg("linalg_norm(Tensor A, Any? ord=None, int[1]? dim=None, bool keepdim=False, *, ScalarType? dtype=None) "
       "-> Tensor", _norm)


# ---------------------------------------------------------------- products and shapes

def _linalg_cross(a, b, dim=-1):
    shape = S.broadcast_shapes(tuple(a.shape), tuple(b.shape), op="linalg.cross")
    S.normalize_dim_of_dims(dim, len(shape))  # 0-dim inputs: torch's words for any dim
    d = S.normalize_dim(dim, len(shape), "linalg.cross")
    sizes = (_size_at(a, d, shape), _size_at(b, d, shape))
    if sizes != (3, 3):
        raise RuntimeError(f"linalg.cross: inputs dimension {dim} must have length 3. Got {sizes[0]} and {sizes[1]}")
    return OPS["cross"](a, b, dim)


def _size_at(x, d, shape):
    k = d - (len(shape) - x.ndim)
    return x.shape[k] if 0 <= k < x.ndim else 1


linalg("linalg_cross(Tensor self, Tensor other, *, int dim=-1) -> Tensor", _linalg_cross)


def _multi_dot(tensors):
    tensors = list(tensors)
    if len(tensors) < 2:
        raise RuntimeError(f"multi_dot(): expected at least 2 tensors but got {len(tensors)}")
    first_vector, last_vector = tensors[0].ndim == 1, tensors[-1].ndim == 1
    if tensors[0].ndim not in (1, 2):
        raise RuntimeError(f"multi_dot(): the first tensor must be 1D or 2D but got {tensors[0].ndim}D")
    if tensors[-1].ndim not in (1, 2):
        raise RuntimeError(f"multi_dot(): the last tensor must be 1D or 2D but got {tensors[-1].ndim}D")
    for k, t in enumerate(tensors[1:-1], 1):
        if t.ndim != 2:
            raise RuntimeError(f"multi_dot(): tensor {k} must be 2D but got {t.ndim}D")
    if first_vector:
        tensors[0] = tensors[0].unsqueeze(0)
    if last_vector:
        tensors[-1] = tensors[-1].unsqueeze(-1)
    for k in range(len(tensors) - 1):
        if tensors[k].shape[-1] != tensors[k + 1].shape[0]:
            a, b = tensors[k].shape, tensors[k + 1].shape
            raise RuntimeError(f"multi_dot(): tensors {k} and {k + 1} with shapes [{a[0]}, {a[1]}] and [{b[0]}, "
                               f"{b[1]}] cannot be multiplied")
    out = tensors[0]
    for t in tensors[1:]:
        out = out.mm(t)
    if first_vector:
        out = out.squeeze(0)
    if last_vector:
        out = out.squeeze(-1)
    return out


linalg("linalg_multi_dot(Tensor[] tensors) -> Tensor", _multi_dot)


def _vecdot(x, y, dim=-1):
    if x.dtype is not y.dtype:
        raise RuntimeError(f"linalg.vecdot: Expected x and y to have the same dtype, but found x of type "
                           f"{type_name(x.dtype)} and y of type {type_name(y.dtype)} instead")
    return (x * y).sum(dim)


linalg("linalg_vecdot(Tensor x, Tensor y, *, int dim=-1) -> Tensor", _vecdot)


def _vander(x, N=None):
    """The Vandermonde matrix of ``x`` along its last dim: the powers ``x**0 ... x**(N-1)``, as torch's (a cumulative
    product of ``x`` after a column of ones, so integers stay integers and the gradient is the product's)."""
    if x.dtype.name in ("bool", "float16", "bfloat16"):
        raise RuntimeError("linalg.vander supports floating point, complex, and integer tensors, but got "
                           f"{type_name(x.dtype)}")
    if x.ndim == 0:  # one point, as torch reads it: a row of powers
        x = x.unsqueeze(0)
    N = x.shape[-1] if N is None else N
    if N <= 1:
        raise RuntimeError(f"N must be greater than 1. (linalg.vander: got N={N} for x of shape {list(x.shape)})")
    powers = x.unsqueeze(-1).expand(*x.shape, N - 1)
    from tilewise.ops.creation import ones_like

    return OPS["cat"]([ones_like(x.unsqueeze(-1)), powers], -1).cumprod(-1)


linalg("linalg_vander(Tensor x, *, int? N=None) -> Tensor", _vander, out=False)
linalg("linalg_diagonal(Tensor A, *, int offset=0, int dim1=-2, int dim2=-1) -> Tensor",
       lambda A, offset=0, dim1=-2, dim2=-1: A.diagonal(offset, dim1, dim2), out=False)


def _tensorinv(A, ind=2):
    if ind <= 0:
        raise RuntimeError(f"Expected a strictly positive integer for 'ind', but got {ind}")
    rows, cols = math.prod(A.shape[:ind]), math.prod(A.shape[ind:])
    if rows != cols:
        raise RuntimeError(f"Expected self to satisfy the requirement prod(self.shape[ind:]) == "
                           f"prod(self.shape[:ind]), but got {cols} != {rows}")
    inverse = _inv_ex(A.reshape(rows, cols), True)[0]
    return inverse.reshape(tuple(A.shape[ind:]) + tuple(A.shape[:ind]))


linalg("linalg_tensorinv(Tensor A, int ind=2) -> Tensor", _tensorinv)


def _tensorsolve(A, B, dims=None):
    if dims is not None:
        dims = [S.normalize_dim(d, A.ndim, "linalg.tensorsolve") for d in dims]
        A = A.permute([d for d in range(A.ndim) if d not in dims] + dims)
    result_shape = tuple(A.shape[B.ndim:])
    rows, cols = B.numel(), math.prod(result_shape)
    if rows != cols or math.prod(A.shape[:B.ndim]) != rows:
        raise RuntimeError(f"Expected self to satisfy the requirement prod(self.shape[other.ndim:]) == "
                           f"prod(self.shape[:other.ndim]), but got {cols} != {rows}")
    return _solve_ex(A.reshape(rows, cols), B.reshape(rows), True, True)[0].reshape(result_shape)


linalg("linalg_tensorsolve(Tensor A, Tensor B, int[]? dims=None) -> Tensor", _tensorsolve)

__all__ = ["LinAlgError"]

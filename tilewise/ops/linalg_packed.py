"""The factorizations torch hands out in LAPACK's packed storage: LDL (``linalg.ldl_factor``, ``linalg.ldl_solve``)
and Householder QR (``geqrf``, and ``ormqr``, the product with its reflectors).

Four primitives carry the work (see [Note: LAPACK's packed factors] in ``backends/cpu/linalg_householder_kernels.py``):
``_linalg_ldl_factor_ex`` (sytrf / hetrf), ``_linalg_ldl_solve`` (sytrs / hetrs), ``geqrf`` and ``ormqr``. torch
differentiates ``ormqr`` only (backward; tilewise gives it a tangent too); the others raise torch's errors when a
backward or a tangent reaches them, not when they run (their results require grad as torch's do).
``householder_product`` (orgqr), the third of the QR routines, is a composite in ``linalg_functions.py``.
"""

# ruff: noqa: N803, N806 — matrices are named as in torch's linalg and the literature (A, B, LD)

from __future__ import annotations

from tilewise import strides as S
from tilewise.ops.batching import apply_batched
from tilewise.ops.formulas import HELPERS
from tilewise.ops.linalg_functions import linalg
from tilewise.ops.linalg_solvers import check_floating, column_major, raise_from_info, type_name
from tilewise.ops.registry import OPS, declare


def geqrf_backward():
    raise NotImplementedError("the derivative for 'geqrf' is not implemented.")


def geqrf_jvp():
    raise NotImplementedError("Trying to use forward AD with geqrf that does not support it because it has not been "
                              "implemented yet.")


def _reflector_columns(input, count: int):
    """v_i (i < count) as the columns of a matrix: input's strict lower part under a unit diagonal."""
    from tilewise.ops.creation import eye

    m = input.shape[-2]
    return input[..., :count].tril(-1) + eye(m, count, dtype=input.dtype, device=input.device)


def ormqr_backward(grad, input, tau, other, left: bool, transpose: bool):
    """Gradients of op(Q) C through each reflector H_i = I - tau_i v_i v_i^H in turn. A product from the right is
    the adjoint of one from the left (C op(Q) = (op(Q)^H C^H)^H), so both run as a left product: the states Y
    before each reflector are recomputed forward, then the gradient walks back through them. For Y' = Y - t v
    (v^H Y): gY = gY' - conj(t) v (v^H gY'), gt = -v^H gY' Y^H v, gv = -(conj(t) gY' Y^H + t Y gY'^H) v."""
    k = tau.shape[-1]
    V = _reflector_columns(input, k)
    C, G = (other, grad) if left else (other.mH, grad.mH)
    adjoint = transpose if left else not transpose  # the left product's op: Q^H where this is set
    order = list(range(k)) if adjoint else list(reversed(range(k)))  # reflectors in the order they are applied
    taus = [tau[..., i:i + 1].unsqueeze(-1) for i in range(k)]
    applied = [t.conj() for t in taus] if adjoint else taus
    states = []
    Y = C
    for i in order:
        v = V[..., i:i + 1]
        states.append(Y)
        Y = Y - applied[i] * (v @ (v.mH @ Y))
    tau_grads, v_grads = [None] * k, [None] * k
    for i, Y in zip(reversed(order), reversed(states)):
        v, t = V[..., i:i + 1], applied[i]
        vh_g = v.mH @ G
        Yh_v = Y.mH @ v
        t_grad = -(vh_g @ Yh_v)
        tau_grads[i] = t_grad.conj() if adjoint else t_grad
        v_grads[i] = -(t.conj() * (G @ Yh_v) + t * (Y @ (G.mH @ v)))
        G = G - t.conj() * (v @ vh_g)
    other_grad = G if left else G.mH
    tau_grad = OPS["cat"]([g.squeeze(-1) for g in tau_grads], -1) if k else tau.new_zeros(tau.shape)
    input_grad = input.new_zeros(input.shape)
    if k:
        columns = OPS["cat"](v_grads, -1).tril(-1)
        input_grad = OPS["cat"]([columns, input_grad[..., k:]], -1)
    return input_grad, tau_grad.reshape(tau.shape), other_grad


def ormqr_jvp(input, tau, other, input_t, tau_t, other_t, left: bool, transpose: bool):
    """The tangent of op(Q) C (torch has no forward rule for ormqr): the product rule through each reflector,
    Y' = Y - t v w with w = v^H Y, for the left product that a right one is the adjoint of (see
    ``ormqr_backward``)."""
    k = tau.shape[-1]
    V, V_t = _reflector_columns(input, k), input_t[..., :k].tril(-1)
    Y, Y_t = (other, other_t) if left else (other.mH, other_t.mH)
    adjoint = transpose if left else not transpose
    for i in (range(k) if adjoint else reversed(range(k))):
        v, v_t = V[..., i:i + 1], V_t[..., i:i + 1]
        t, t_t = tau[..., i:i + 1].unsqueeze(-1), tau_t[..., i:i + 1].unsqueeze(-1)
        if adjoint:
            t, t_t = t.conj(), t_t.conj()
        w = v.mH @ Y
        w_t = v_t.mH @ Y + v.mH @ Y_t
        Y_t = Y_t - t_t * (v @ w) - t * (v_t @ w) - t * (v @ w_t)
        Y = Y - t * (v @ w)
    return Y_t if left else Y_t.mH


HELPERS.update(geqrf_backward=geqrf_backward, geqrf_jvp=geqrf_jvp, ormqr_jvp=ormqr_jvp, ormqr_backward=ormqr_backward)


# ---------------------------------------------------------------- LDL: Bunch-Kaufman factorization and solve

declare("_linalg_ldl_factor_ex(Tensor A, bool hermitian=False) -> (Tensor LD, Tensor pivots, Tensor info)", "other",
        grad={"A": "aten_derivative_not_implemented('linalg_ldl_factor_ex')"}, nondiff_outputs=(1, 2),
        fwd="forward_not_implemented('aten::linalg_ldl_factor_ex')", public=False, batch=apply_batched,
        doc="sytrf (hetrf where hermitian) of the lower triangle of A [..., n, n]: L and D packed in one lower "
            "triangle, LAPACK's 1-based pivots (negative for the two rows of a 2x2 block of D), info.")
declare("_linalg_ldl_solve(Tensor LD, Tensor pivots, Tensor B, bool hermitian=False) -> Tensor", "other",
        grad={"LD": "aten_derivative_not_implemented('linalg_ldl_solve')", "pivots": None,
              "B": "aten_derivative_not_implemented('linalg_ldl_solve')"},
        fwd="forward_not_implemented('aten::linalg_ldl_solve')", public=False, batch=apply_batched,
        doc="sytrs (hetrs) with the factors of _linalg_ldl_factor_ex, LD, pivots and B of one batch shape.")


def _ldl_zero_pivot(code: int) -> str:
    # torch's error checker has no words for sytrf's info (an internal assertion names the code); these add them
    return (f"Unknown error code: {code}. (D[{code - 1}, {code - 1}] is exactly zero: the matrix is singular, and "
            "ldl_solve would divide by zero)")


def _check_ldl_input(op: str, A) -> None:
    if A.ndim < 2:
        raise RuntimeError(f"{op}: The input tensor A must have at least 2 dimensions.")
    if A.shape[-1] != A.shape[-2]:
        raise RuntimeError(f"{op}: A must be batches of square matrices, but they are {A.shape[-2]} by "
                           f"{A.shape[-1]} matrices")
    if not (A.dtype.is_floating_point or A.dtype.is_complex):
        raise RuntimeError(f"{op}: Expected a floating point or complex tensor as input. Got {type_name(A.dtype)}")
    if A.dtype.name not in ("float32", "float64", "complex64", "complex128"):
        raise NotImplementedError(f'"ldl_factor_kernel_{A.device.type}" not implemented for '
                                  f"'{type_name(A.dtype)}'")
    check_floating(op, A, complex_on_cpu=True)


def _ldl_factor_ex(A, hermitian=False, check_errors=False):
    _check_ldl_input("torch.linalg.ldl_factor_ex", A)
    LD, pivots, info = OPS["_linalg_ldl_factor_ex"](A, hermitian)
    if check_errors:
        raise_from_info("torch.linalg.ldl_factor_ex", info, _ldl_zero_pivot, RuntimeError)
    return LD, pivots, info


def _ldl_factor(A, hermitian=False):
    _check_ldl_input("torch.linalg.ldl_factor_ex", A)  # torch's ldl_factor checks through its _ex form
    LD, pivots, info = OPS["_linalg_ldl_factor_ex"](A, hermitian)
    raise_from_info("torch.linalg.ldl_factor", info, _ldl_zero_pivot, RuntimeError)
    return LD, pivots


def _ldl_solve(LD, pivots, B, hermitian=False):
    op = "torch.linalg.ldl_solve"
    if LD.ndim < 2:
        raise RuntimeError(f"{op}: The input tensor A must have at least 2 dimensions.")
    if LD.shape[-1] != LD.shape[-2]:
        raise RuntimeError(f"{op}: A must be batches of square matrices, but they are {LD.shape[-2]} by "
                           f"{LD.shape[-1]} matrices")
    if not (LD.dtype.is_floating_point or LD.dtype.is_complex):
        raise RuntimeError(f"{op}: Expected a floating point or complex tensor as input. Got {type_name(LD.dtype)}")
    if B.dtype is not LD.dtype:
        raise RuntimeError(f"Expected b and A to have the same dtype, but found b of type {type_name(B.dtype)} and A "
                           f"of type {type_name(LD.dtype)} instead.")
    if B.ndim < 2:
        raise IndexError(f"Dimension out of range (expected to be in range of [-1, 0], but got -2) ({op}: B must be a "
                         "matrix or a batch of matrices)")
    n = LD.shape[-1]
    if B.shape[-2] != n:
        raise RuntimeError(f"Incompatible matrix sizes for {op}: each A matrix is {n} by {n} but each b matrix is "
                           f"{B.shape[-2]} by {B.shape[-1]}")
    if tuple(pivots.shape) != tuple(LD.shape[:-1]):
        raise RuntimeError(f"{op}: Expected LD.shape[:-1] and pivots.shape to be the same, but got pivots with shape "
                           f"{list(pivots.shape)} instead")
    if pivots.dtype.is_floating_point or pivots.dtype.is_complex or pivots.dtype.name == "bool":
        raise RuntimeError(f"{op}: Expected pivots to be integers. Got {type_name(pivots.dtype)}")
    if LD.dtype.name not in ("float32", "float64", "complex64", "complex128"):
        raise NotImplementedError(f'"ldl_solve_kernel_{LD.device.type}" not implemented for '
                                  f"'{type_name(LD.dtype)}'")
    if hermitian and LD.dtype.is_complex and LD.device.type == "cuda":  # torch's refusal, before any other
        raise RuntimeError(f"{op}: complex tensors with hermitian=True flag are not supported on CUDA.")
    check_floating(op, LD, complex_on_cpu=True)
    batch = S.broadcast_shapes(tuple(LD.shape[:-2]), tuple(B.shape[:-2]))
    LD_ = LD.expand(batch + (n, n))
    pivots_ = pivots.expand(batch + (n,))
    B_ = B.expand(batch + tuple(B.shape[-2:]))
    return column_major(OPS["_linalg_ldl_solve"](LD_, pivots_, B_, hermitian))


linalg("linalg_ldl_factor_ex(Tensor self, *, bool hermitian=False, bool check_errors=False) -> (Tensor LD, "
       "Tensor pivots, Tensor info)", _ldl_factor_ex)
linalg("linalg_ldl_factor(Tensor self, *, bool hermitian=False) -> (Tensor LD, Tensor pivots)", _ldl_factor)
linalg("linalg_ldl_solve(Tensor LD, Tensor pivots, Tensor B, *, bool hermitian=False) -> Tensor", _ldl_solve)


# ---------------------------------------------------------------- Householder QR: geqrf, ormqr

def _check_geqrf(op, args) -> None:
    A = args[0]
    if A.ndim < 2:
        raise RuntimeError("torch.geqrf: input must have at least 2 dimensions.")
    if A.dtype.name not in ("float32", "float64", "complex64", "complex128"):
        raise NotImplementedError(f'"geqrf_{A.device.type}" not implemented for \'{type_name(A.dtype)}\'')
    check_floating("torch.geqrf", A, complex_on_cpu=True)


def _check_ormqr(op, args) -> None:
    input, tau, other, left = args[0], args[1], args[2], args[3]
    name = "torch.ormqr"
    if input.ndim < 2:
        raise RuntimeError(f"{name}: input must have at least 2 dimensions.")
    if other.ndim < 2:
        raise RuntimeError(f"{name}: other must have at least 2 dimensions.")
    side = -2 if left else -1
    if other.shape[side] != input.shape[-2]:
        raise RuntimeError(f"{name}: other.shape[{side}] must be equal to input.shape[-2]")
    if tau.ndim == 0:
        raise IndexError("Dimension specified as -1 but tensor has no dimensions")
    if tau.shape[-1] != min(other.shape[side], input.shape[-1]):
        raise RuntimeError(f"{name}: tau.shape[-1] must be equal to min(other.shape[{side}], input.shape[-1])")
    if input.ndim - tau.ndim != 1:
        raise RuntimeError(f"{name}: Expected tau to have one dimension less than input, but got tau.ndim equal to "
                           f"{tau.ndim} and input.ndim is equal to {input.ndim}")
    if input.ndim != other.ndim:
        raise RuntimeError(f"{name}: Expected other to have the same number of dimensions as input, but got "
                           f"other.ndim equal to {other.ndim} and input.ndim is equal to {input.ndim}")
    batch = tuple(input.shape[:-2])
    if tuple(tau.shape[:-1]) != batch:
        raise RuntimeError(f"{name}: Expected batch dimensions of tau to be equal to input.shape[:-2], but got "
                           f"{list(tau.shape[:-1])}")
    if tuple(other.shape[:-2]) != batch:
        raise RuntimeError(f"{name}: Expected batch dimensions of other to be equal to input.shape[:-2], but got "
                           f"{list(other.shape[:-2])}")
    if tau.dtype is not input.dtype:
        raise RuntimeError(f"{name}: Expected input and tau to have the same dtype, but input has "
                           f"dtype{type_name(input.dtype)} and tau has dtype {type_name(tau.dtype)}")
    if other.dtype is not input.dtype:
        raise RuntimeError(f"{name}: Expected input and other to have the same dtype, but input has "
                           f"dtype{type_name(input.dtype)} and other has dtype {type_name(other.dtype)}")
    if input.dtype.name not in ("float32", "float64", "complex64", "complex128"):
        raise NotImplementedError(f'"ormqr_{input.device.type}" not implemented for \'{type_name(input.dtype)}\'')
    check_floating(name, input, complex_on_cpu=True)


declare("geqrf(Tensor self) -> (Tensor a, Tensor tau)", "other", grad={"self": "geqrf_backward()"}, fwd="geqrf_jvp()",
        batch=apply_batched, check=_check_geqrf, autocast={"cpu": "fp32", "cuda": "fp32"},
        doc="LAPACK's geqrf of self [..., m, n]: R on and above the diagonal, the Householder vectors below it "
            "(each under an implicit unit diagonal), and their scalars tau [..., min(m, n)].")
declare("ormqr(Tensor self, Tensor input2, Tensor input3, bool left=True, bool transpose=False) -> Tensor", "other",
        grad={"self, input2, input3": "ormqr_backward(grad, self, input2, input3, left, transpose)"},
        fwd="ormqr_jvp(self, input2, input3, self_t, input2_t, input3_t, left, transpose)", batch=apply_batched,
        check=_check_ormqr, autocast={"cpu": "fp32", "cuda": "fp32"},
        doc="op(Q) input3 (left) or input3 op(Q), with Q = H_1 ... H_k the product of geqrf's reflectors in self and "
            "input2 (tau) and op(Q) = Q^H where transpose is set (LAPACK's ormqr / unmqr).")

# LAPACK on the host (and host-read pivots in ldl_solve's loop): under tilewise.compile these run eagerly
for _name in ("_linalg_ldl_factor_ex", "_linalg_ldl_solve", "geqrf", "ormqr"):
    OPS[_name].attrs["compiled"] = False

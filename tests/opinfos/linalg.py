"""Samples for tilewise.linalg and torch's top-level linear algebra forms.

Random matrices are conditioned by a wrapper that both frameworks run (``OpInfo.wrap``): ``+ 3 I`` keeps a
3x3 or 4x4 matrix with entries in [-2, 2] far from singular, ``A A^T + I`` makes it positive-definite, and
``A + A^T`` symmetric. Singular vectors and eigenvectors are defined up to sign; the wrapper fixes the sign of
each from its first entry, so both frameworks are compared on the same (differentiable) function.
"""

# ruff: noqa: N803, N806 — matrices are named as in torch's linalg and the literature (A, B, L, U, S, Vh)

from __future__ import annotations

import math

from opinfo import OpInfo, Sample, T


def _map_arg(fn, module, transform, arg=0):
    def call(*args, **kwargs):
        args = list(args)
        args[arg] = transform(args[arg], module)
        return fn(*args, **kwargs)

    return call


def _shifted(A, module):
    return A + 3 * module.eye(A.shape[-1], dtype=A.dtype, device=A.device)


def _spd(A, module):
    return A.matmul(A.mT) + module.eye(A.shape[-1], dtype=A.dtype, device=A.device)


def _symmetric(A, module):
    return A + A.mT


def _shifted_rectangular(A, module):
    return A + 3 * module.eye(A.shape[-2], A.shape[-1], dtype=A.dtype, device=A.device)


def full_rank(arg=0):
    """Singular values kept away from zero (pinv's and lstsq's derivatives blow up near rank loss)."""
    return lambda fn, module: _map_arg(fn, module, _shifted_rectangular, arg)


def well_conditioned(arg=0):
    return lambda fn, module: _map_arg(fn, module, _shifted, arg)


def positive_definite(arg=0):
    return lambda fn, module: _map_arg(fn, module, _spd, arg)


def symmetric_then(fix=None):
    def wrap(fn, module):
        inner = _map_arg(fn, module, _symmetric)
        return inner if fix is None else (lambda *a, **k: fix(inner(*a, **k)))

    return wrap


def fixed_svd_signs(out):
    """The first min(m, n) singular vectors, signed by their first entry (with full_matrices, the other columns
    are any orthonormal basis of the complement: not comparable)."""
    U, S, Vh = out
    k = S.shape[-1]
    U, Vh = U[..., :k], Vh[..., :k, :]
    sign = U[..., :1, :].sign()
    return U * sign, S, Vh * sign.mT


def fixed_old_svd_signs(out):
    U, S, V = out
    sign = U[..., :1, :].sign()
    return U * sign, S, V * sign


def fixed_eigh_signs(out):
    L, V = out
    return L, V * V[..., :1, :].sign()


def svd_wrapper(fix):
    return lambda fn, module: (lambda *a, **k: fix(fn(*a, **k)))


def cholesky_factor(arg):
    """The argument replaced by the Cholesky factor of a positive-definite matrix made from it."""
    return lambda fn, module: _map_arg(fn, module, lambda A, m: m.linalg.cholesky(_spd(A, m)), arg)


SQUARE = [Sample((T((3, 3)),), name="3x3"), Sample((T((2, 4, 4)),), name="batch"),
          Sample((T((1, 1)),), name="1x1")]
RECTANGULAR = [Sample((T((4, 3)),), name="tall"), Sample((T((3, 4)),), name="wide"),
               Sample((T((2, 3, 3)),), name="batch-square")]

def factored(arg=0):
    """``linalg.lu_factor`` of a shifted (well-conditioned) matrix in place of argument ``arg``: the LU and pivots
    that ``lu_unpack`` and ``lu_solve`` take, differentiated through the factorization."""
    def wrap(fn, module):
        def call(*args, **kwargs):
            args = list(args)
            LU, pivots = module.linalg.lu_factor(_shifted_rectangular(args[arg], module))
            return fn(*args[:arg], LU, pivots, *args[arg + 1:], **kwargs)

        return call

    return wrap


def ldl_factored(arg=0, hermitian=False):
    """``linalg.ldl_factor`` of argument ``arg`` in its place: the LD and pivots that ``ldl_solve`` takes."""
    def wrap(fn, module):
        def call(*args, **kwargs):
            args = list(args)
            LD, pivots = module.linalg.ldl_factor(args[arg], hermitian=hermitian)
            return fn(*args[:arg], LD, pivots, *args[arg + 1:], **kwargs)

        return call

    return wrap


# LDL: torch has no derivative (tests/test_linalg_ldl_qr_lowrank.py checks its error); complex matrices, symmetric
# and Hermitian, on the CPU
LDL_SAMPLES = [*SQUARE, Sample((T((5, 5)),), {"hermitian": True}, name="hermitian-real"),
               Sample((T((2, 4, 4), "complex"),), name="complex-symmetric"),
               Sample((T((4, 4), "complex"),), {"hermitian": True}, name="hermitian")]

OPINFOS = [
    OpInfo("linalg.ldl_factor", lambda: LDL_SAMPLES, grad=False, covers=("_linalg_ldl_factor_ex",)),
    OpInfo("linalg.ldl_factor_ex", lambda: LDL_SAMPLES, grad=False),
    OpInfo("linalg.ldl_solve", lambda: [
        Sample((T((3, 3)), T((3, 2))), name="3x3"),
        Sample((T((2, 4, 4)), T((2, 4, 3))), name="batch"),
        Sample((T((4, 4)), T((2, 4, 1))), name="broadcast-B"),
        Sample((T((4, 4), "complex"), T((4, 2), "complex")), name="complex"),
    ], wrap=ldl_factored(), grad=False, covers=("_linalg_ldl_solve",)),
    OpInfo("linalg.ldl_solve", lambda: [Sample((T((4, 4), "complex"), T((4, 2), "complex")), {"hermitian": True})],
           wrap=ldl_factored(hermitian=True), grad=False),
    OpInfo("geqrf", lambda: SQUARE + RECTANGULAR + [Sample((T((3, 4), "complex"),), name="complex")], grad=False),
    OpInfo("geqrf", lambda: [Sample((T((2, 4, 3)),))], call="method", grad=False),
    # any columns below the diagonal are Householder vectors and any tau their scalars: ormqr takes them as drawn
    OpInfo("ormqr", lambda: [
        Sample((T((4, 3)), T((3,)), T((4, 2))), name="left"),
        Sample((T((4, 3)), T((3,)), T((4, 2))), {"transpose": True}, name="left-transpose"),
        Sample((T((4, 3)), T((3,)), T((2, 4)), False), name="right"),
        Sample((T((4, 3)), T((3,)), T((2, 4)), False, True), name="right-transpose"),
        Sample((T((3, 5)), T((3,)), T((3, 2))), name="wide"),
        Sample((T((2, 4, 4)), T((2, 4)), T((2, 2, 4))), {"left": False}, name="batch-right"),
        Sample((T((4, 3), "complex"), T((3,), "complex"), T((4, 2), "complex")), {"transpose": True},
               name="complex"),
    ]),
    OpInfo("ormqr", lambda: [Sample((T((4, 3)), T((3,)), T((4, 2))))], call="method"),
    OpInfo("linalg.solve", lambda: [
        Sample((T((3, 3)), T((3, 2))), name="matrix"),
        Sample((T((3, 3)), T((3,))), name="vector"),
        Sample((T((2, 3, 3)), T((3, 1))), name="broadcast-B"),
        Sample((T((3, 3)), T((2, 3, 2))), name="broadcast-A"),
        Sample((T((2, 3, 3)), T((2, 3))), name="batched-vector"),
        Sample((T((3, 3)), T((2, 3))), {"left": False}, name="right"),
    ], wrap=well_conditioned(), covers=("linalg_solve", "linalg_solve_ex", "_linalg_solve")),
    OpInfo("linalg.solve_ex", lambda: [Sample((T((2, 3, 3)), T((2, 3, 2))))], wrap=well_conditioned()),
    OpInfo("linalg.inv", lambda: SQUARE, wrap=well_conditioned(), covers=("_linalg_inv_ex",)),
    OpInfo("linalg.inv_ex", lambda: SQUARE, wrap=well_conditioned()),
    OpInfo("inverse", lambda: SQUARE, wrap=well_conditioned()),
    OpInfo("linalg.det", lambda: SQUARE, wrap=well_conditioned(), covers=("_linalg_det",)),
    OpInfo("det", lambda: SQUARE + [Sample((T((3, 3)),), name="unconditioned")]),
    OpInfo("linalg.slogdet", lambda: SQUARE, wrap=well_conditioned(), covers=("_linalg_slogdet",)),
    OpInfo("slogdet", lambda: SQUARE, wrap=well_conditioned()),
    OpInfo("logdet", lambda: SQUARE, wrap=positive_definite()),
    OpInfo("linalg.cholesky", lambda: SQUARE + [Sample((T((3, 3)),), {"upper": True}, name="upper")],
           wrap=positive_definite(), covers=("_linalg_cholesky_ex",)),
    OpInfo("linalg.cholesky_ex", lambda: SQUARE, wrap=positive_definite()),
    OpInfo("linalg.eigvals", lambda: SQUARE, covers=("_linalg_eig",)),
    # the eigenvalues: LAPACK builds may give a complex pair's eigenvectors opposite signs (tests/test_linalg.py)
    OpInfo("linalg.eig", lambda: SQUARE, output_index=0),
    OpInfo("linalg.lu_factor", lambda: SQUARE + RECTANGULAR, wrap=full_rank(), covers=("_linalg_lu_factor_ex",)),
    OpInfo("linalg.lu_factor_ex", lambda: SQUARE + RECTANGULAR, wrap=full_rank()),
    OpInfo("linalg.lu", lambda: SQUARE + RECTANGULAR, wrap=full_rank()),
    OpInfo("lu", lambda: [Sample((T((3, 3)),)), Sample((T((2, 3, 4)),), {"get_infos": True}, name="infos")],
           wrap=full_rank()),
    OpInfo("lu_unpack", lambda: SQUARE + RECTANGULAR, wrap=factored()),
    OpInfo("linalg.lu_solve", lambda: [
        Sample((T((3, 3)), T((3, 2))), name="left"),
        Sample((T((3, 3)), T((3, 2))), {"adjoint": True}, name="left-adjoint"),
        Sample((T((3, 3)), T((2, 3))), {"left": False}, name="right"),
        Sample((T((3, 3)), T((2, 3))), {"left": False, "adjoint": True}, name="right-adjoint"),
        Sample((T((2, 3, 3)), T((3, 1))), name="broadcast-B"),
    ], wrap=factored()),
    OpInfo("lu_solve", lambda: [Sample((T((3, 2)), T((3, 3))))], wrap=factored(1)),
    OpInfo("cholesky", lambda: [Sample((T((3, 3)),)), Sample((T((3, 3)),), {"upper": True}, name="upper")],
           wrap=positive_definite()),
    OpInfo("cholesky_solve", lambda: [
        Sample((T((3, 2)), T((3, 3))), name="lower"),
        Sample((T((2, 3, 2)), T((3, 3))), {"upper": True}, name="upper-broadcast"),
    ], wrap=cholesky_factor(1)),
    OpInfo("cholesky_inverse", lambda: [Sample((T((3, 3)),)), Sample((T((3, 3)),), {"upper": True}, name="upper")],
           wrap=cholesky_factor(0)),
    OpInfo("linalg.qr", lambda: RECTANGULAR + [Sample((T((3, 3)),), {"mode": "complete"}, name="complete"),
                                               Sample((T((3, 5)),), {"mode": "complete"}, name="complete-wide")],
           covers=("_linalg_qr",)),
    OpInfo("linalg.qr", lambda: [Sample((T((4, 3)),), {"mode": "r"}), Sample((T((4, 3)),), {"mode": "complete"})],
           grad=False),
    OpInfo("qr", lambda: [Sample((T((4, 3)),)), Sample((T((3, 3)),), {"some": False}, name="full")]),
    OpInfo("linalg.svd", lambda: [Sample((T((4, 3)),), {"full_matrices": False}, name="tall"),
                                  Sample((T((3, 4)),), {"full_matrices": False}, name="wide"),
                                  Sample((T((2, 3, 3)),), name="batch-square")],
           wrap=svd_wrapper(fixed_svd_signs), covers=("_linalg_svd",)),
    OpInfo("linalg.svd", lambda: [Sample((T((4, 3)),)), Sample((T((3, 5)),))], wrap=svd_wrapper(fixed_svd_signs),
           grad=False),
    OpInfo("svd", lambda: [Sample((T((4, 3)),)), Sample((T((3, 4)),), name="wide")],
           wrap=svd_wrapper(fixed_old_svd_signs)),
    OpInfo("svd", lambda: [Sample((T((4, 3)),), {"compute_uv": False}, name="no-uv")], grad=False),
    OpInfo("linalg.svdvals", lambda: RECTANGULAR),
    OpInfo("linalg.eigh", lambda: [Sample((T((3, 3)),)), Sample((T((2, 4, 4)),), name="batch"),
                                   Sample((T((3, 3)),), {"UPLO": "U"}, name="upper")],
           wrap=symmetric_then(fixed_eigh_signs), covers=("_linalg_eigh",)),
    OpInfo("linalg.eigvalsh", lambda: [Sample((T((3, 3)),)), Sample((T((3, 3)),), {"UPLO": "U"}, name="upper")],
           wrap=symmetric_then()),
    OpInfo("linalg.solve_triangular", lambda: [
        Sample((T((3, 3)), T((3, 2))), {"upper": True}, name="upper"),
        Sample((T((3, 3)), T((3, 2))), {"upper": False}, name="lower"),
        Sample((T((3, 3)), T((2, 3))), {"upper": True, "left": False}, name="right"),
        Sample((T((2, 3, 3)), T((3, 1))), {"upper": False, "unitriangular": True}, name="unit-broadcast"),
    ], wrap=well_conditioned(), covers=("_linalg_solve_triangular",)),
    OpInfo("triangular_solve", lambda: [
        Sample((T((3, 2)), T((3, 3)))),
        Sample((T((3, 2)), T((3, 3))), {"upper": False, "transpose": True}, name="transpose"),
    ], wrap=well_conditioned(1)),
    OpInfo("linalg.lstsq", lambda: [
        Sample((T((5, 3)), T((5, 2))), name="tall"),
        Sample((T((2, 5, 3)), T((2, 5, 2))), name="batch"),
        Sample((T((5, 3)), T((5,))), name="vector"),
        Sample((T((5, 3)), T((5, 2))), {"driver": "gels"}, name="gels"),
    ], wrap=full_rank(), covers=("_linalg_lstsq",)),
    OpInfo("linalg.pinv", lambda: [Sample((T((4, 3)),), name="tall"), Sample((T((3, 4)),), name="wide"),
                                   Sample((T((2, 3, 3)),), name="batch")], wrap=full_rank()),
    OpInfo("linalg.pinv", lambda: [Sample((T((4, 3)),), {"rtol": 0.5}, name="rtol"),
                                   Sample((T((4, 3)),), {"atol": 1.0}, name="atol")], grad=False),
    OpInfo("linalg.pinv", lambda: [Sample((T((3, 3)),), {"hermitian": True})], wrap=symmetric_then()),
    OpInfo("pinverse", lambda: [Sample((T((4, 3)),))], wrap=full_rank()),
    OpInfo("linalg.matrix_rank", lambda: [Sample((T((4, 3)),)), Sample((T((2, 3, 3)),), {"atol": 1.0}, name="atol"),
                                          Sample((T((3, 3)),), {"hermitian": True}, name="hermitian")], grad=False),
    OpInfo("linalg.matrix_power", lambda: [Sample((T((3, 3)), 3)), Sample((T((2, 3, 3)), 0), name="zero"),
                                           Sample((T((3, 3)), 1), name="one"), Sample((T((3, 3)), -2), name="neg")],
           wrap=well_conditioned()),
    OpInfo("matrix_power", lambda: [Sample((T((3, 3)), 2))]),
    OpInfo("linalg.matrix_exp", lambda: [Sample((T((3, 3), low=-1, high=1),)), Sample((T((2, 4, 4)),), name="batch"),
                                         Sample((T((3, 3), low=-4, high=4),), name="squaring")],
           covers=("_linalg_matrix_exp",)),
    OpInfo("matrix_exp", lambda: [Sample((T((3, 3), low=-1, high=1),))]),
    OpInfo("linalg.householder_product", lambda: [Sample((T((4, 3)), T((2,)))), Sample((T((2, 4, 4)), T((2, 4))),
                                                                                        name="batch"),
                                                  Sample((T((3, 3)), T((0,))), name="no_reflectors")]),
    OpInfo("orgqr", lambda: [Sample((T((4, 2)), T((2,))))]),
    OpInfo("linalg.vector_norm", lambda: [
        Sample((T((3, 4)),)), Sample((T((3, 4)), 1), name="l1"), Sample((T((3, 4)), math.inf), name="inf"),
        Sample((T((3, 4)), -math.inf, 1), name="-inf-dim"), Sample((T((3, 4)), 3, (0, 1), True), name="p3-keepdim"),
        Sample((T((2, 3, 4)), 0.5, -1), name="p0.5"), Sample((T((3, 4)),), {"dim": 0}, name="dim"),
    ]),
    OpInfo("linalg.matrix_norm", lambda: [
        Sample((T((3, 4)),), name="fro"), Sample((T((3, 4)), "nuc"), name="nuc"),
        Sample((T((3, 4)), 2), name="2"), Sample((T((3, 4)), -2), name="-2"),
        Sample((T((3, 4)), 1), name="1"), Sample((T((3, 4)), -1), name="-1"),
        Sample((T((3, 4)), math.inf), name="inf"), Sample((T((3, 4)), -math.inf), name="-inf"),
        Sample((T((2, 3, 4)), 1, (0, 2), True), name="dims-keepdim"),
        Sample((T((2, 3, 4)), "nuc", (2, 0)), name="nuc-dims"),
    ]),
    OpInfo("linalg.norm", lambda: [Sample((T((3, 4)),)), Sample((T((2, 3, 4)),), name="3d"),
                                   Sample((T((3, 4)), "fro"), name="fro"), Sample((T((3, 4)), 2), name="2d-ord"),
                                   Sample((T((4,)), 3), name="vector"), Sample((T((2, 3, 4)), None, 1), name="dim")]),
    # torch.norm(p='nuc') (tests/test_linalg.py) is left out: torch saves the SVD's factors, tilewise the norm
    OpInfo("norm", lambda: [Sample((T((3, 4)), "fro"), name="fro"), Sample((T((2, 3, 4)), "fro", (0, 1)),
                                                                             name="fro-dims")]),
    OpInfo("linalg.cross", lambda: [Sample((T((4, 3)), T((4, 3)))), Sample((T((3, 2)), T((3, 1))), {"dim": 0},
                                                                             name="dim0-broadcast")]),
    OpInfo("linalg.multi_dot", lambda: [Sample(([T((3,)), T((3, 4)), T((4, 2)), T((2,))],), name="vectors"),
                                        Sample(([T((2, 3)), T((3, 4))],), name="two")]),
    OpInfo("linalg.vecdot", lambda: [Sample((T((3, 4)), T((3, 4)))), Sample((T((4, 3)), T((3,))), name="broadcast"),
                                     Sample((T((3, 4)), T((3, 4))), {"dim": 0}, name="dim")]),
    OpInfo("linalg.diagonal", lambda: [Sample((T((3, 4)),)), Sample((T((2, 3, 4)),), {"offset": 1, "dim1": 0},
                                                                     name="offset")]),
    OpInfo("linalg.vander", lambda: [Sample((T((4,)),)), Sample((T((2, 3)),), {"N": 5}, name="batch-wider")]),
    OpInfo("linalg.vander", lambda: [Sample((T((3,), "int", 0, 4),), {"N": 4}, name="int")], grad=False),
    OpInfo("linalg.tensorinv", lambda: [Sample((T((4, 2, 2)),), {"ind": 1})], wrap=lambda fn, module: _map_arg(
        fn, module, lambda A, m: A + 3 * m.eye(4, dtype=A.dtype, device=A.device).reshape(4, 2, 2))),
    OpInfo("linalg.tensorsolve", lambda: [Sample((T((2, 3, 6)), T((2, 3))))], wrap=lambda fn, module: _map_arg(
        fn, module, lambda A, m: A + 3 * m.eye(6, dtype=A.dtype, device=A.device).reshape(2, 3, 6))),
]

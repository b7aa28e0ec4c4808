"""``tilewise.linalg``: torch.linalg's functions, under torch's names.

The operators are declared in ``ops/linalg_functions.py`` as ``linalg_<name>`` (their return types carry those
names, as torch's ``torch.return_types.linalg_svd`` do); this module only names them.

>>> import tilewise as tw
>>> tw.linalg.det(tw.tensor([[2.0, 0.0], [0.0, 3.0]]))
tensor(6.)
"""

from __future__ import annotations

from tilewise.ops.linalg_solvers import LinAlgError
from tilewise.ops.registry import public_function

_NAMES = ("solve", "solve_ex", "inv", "inv_ex", "det", "slogdet", "cholesky", "cholesky_ex", "qr", "svd", "svdvals",
          "eigh", "eigvalsh", "solve_triangular", "lstsq", "pinv", "matrix_rank", "matrix_power", "matrix_exp",
          "vector_norm", "matrix_norm", "norm", "cross", "multi_dot", "vecdot", "diagonal", "tensorinv", "tensorsolve",
          "householder_product", "vander", "lu_factor", "lu_factor_ex", "lu", "lu_solve",
          "eig", "eigvals", "ldl_factor", "ldl_factor_ex", "ldl_solve")


def _named(name: str):
    fn = public_function(f"linalg_{name}")
    fn.__module__ = __name__
    return fn


globals().update({name: _named(name) for name in _NAMES})
matmul = public_function("matmul")  # torch.linalg.matmul is torch.matmul

__all__ = ["LinAlgError", "matmul", *_NAMES]

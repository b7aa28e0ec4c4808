"""Functions torch removed in 1.9 and keeps only to raise an error that names their replacement: ``torch.eig``,
``torch.lstsq``, ``torch.solve``, ``torch.symeig``, ``torch.matrix_rank`` and the Tensor methods of the first
four. tilewise raises the same errors, naming its ``tilewise.linalg`` replacements, so code ported from old
torch fails as it fails there, with the same advice.
"""

from __future__ import annotations

from tilewise.tensor import Tensor

_REMOVED = "This function was deprecated since version 1.9 and is now removed. "
_ADVICE = {
    "eig": "`tilewise.linalg.eig` returns complex tensors of dtype `cfloat` or `cdouble` rather than real tensors "
           "mimicking complex tensors.\n\nL, _ = tilewise.eig(A) should be replaced with:\nL_complex = "
           "tilewise.linalg.eigvals(A)\n\nand\n\nL, V = tilewise.eig(A, eigenvectors=True) should be replaced with:\n"
           "L_complex, V_complex = tilewise.linalg.eig(A)",
    "lstsq": "`tilewise.lstsq` is deprecated in favor of `tilewise.linalg.lstsq`.\n`tilewise.linalg.lstsq` has "
             "reversed arguments and does not return the QR decomposition in the returned tuple.\n\nX, _ = "
             "tilewise.lstsq(B, A).solution[:A.size(1)]\nshould be replaced with:\nX = tilewise.linalg.lstsq(A, "
             "B).solution",
    "solve": "`tilewise.solve` is deprecated in favor of `tilewise.linalg.solve`. `tilewise.linalg.solve` has its "
             "arguments reversed and does not return the LU factorization.\n\nX = tilewise.solve(B, A).solution "
             "should be replaced with:\nX = tilewise.linalg.solve(A, B)",
    "symeig": "The default behavior has changed from using the upper triangular portion of the matrix by default to "
              "using the lower triangular portion.\n\nL, _ = tilewise.symeig(A, upper=upper) should be replaced "
              "with:\nL = tilewise.linalg.eigvalsh(A, UPLO='U' if upper else 'L')\n\nand\n\nL, V = "
              "tilewise.symeig(A, eigenvectors=True) should be replaced with:\nL, V = tilewise.linalg.eigh(A, "
              "UPLO='U' if upper else 'L')",
    "matrix_rank": "Please use the `tilewise.linalg.matrix_rank` function instead. The parameter 'symmetric' was "
                   "renamed in `tilewise.linalg.matrix_rank()` to 'hermitian'.",
}
TENSOR_METHODS = ("eig", "lstsq", "solve", "symeig")


def _removed(name: str):
    def function(*args, **kwargs):
        raise RuntimeError(_REMOVED + _ADVICE[name])

    function.__name__ = function.__qualname__ = name
    function.__doc__ = f"Removed in torch 1.9: raises, naming the replacement. {_ADVICE[name].splitlines()[0]}"
    return function


def attach() -> dict:
    """Give Tensor the removed methods; return the removed torch functions, by name."""
    functions = {name: _removed(name) for name in _ADVICE}
    for name in TENSOR_METHODS:
        setattr(Tensor, name, functions[name])
    return functions

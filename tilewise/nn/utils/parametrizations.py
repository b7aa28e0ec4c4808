"""``nn.utils.parametrizations``: weight normalisation, spectral normalisation and orthogonal matrices as
parametrizations (see [Note: parametrizations] in ``parametrize.py``), torch's successors of the hook-based
``nn.utils.weight_norm`` and ``nn.utils.spectral_norm``.

They keep torch's state-dict layout: ``parametrizations.weight.original0`` / ``original1`` (magnitude and
direction) for weight norm, ``parametrizations.weight.original`` and the power-iteration vectors
``parametrizations.weight.0._u`` / ``_v`` for spectral norm, and the orthogonal map's ``base`` for
``orthogonal``. Their random starting points (spectral norm's vectors, the completion of a non-square orthogonal
base) come from tilewise's generator, so only a state dict makes two frameworks start alike.
"""

# ruff: noqa: N803, N806 — matrices are named as in torch (X, Q, A)

from __future__ import annotations

from enum import Enum, auto

from tilewise.autograd import no_grad
from tilewise.dtypes import finfo
from tilewise.linalg import householder_product, qr, solve
from tilewise.nn import functional as F  # noqa: N812 — torch's spelling
from tilewise.nn.modules.conv import ConvTranspose1d, ConvTranspose2d, ConvTranspose3d
from tilewise.nn.modules.module import Module
from tilewise.nn.utils import parametrize
from tilewise.nn.utils.reparametrize import _weight_norm as weight_norm_of
from tilewise.nn.utils.reparametrize import norm_except_dim
from tilewise.ops.creation import eye, randn, zeros_like
from tilewise.ops.functions import cat, geqrf
from tilewise.ops.registry import public_function
from tilewise.tensor import Tensor

add, allclose, matrix_exp, mv, vdot = (public_function(op) for op in ("add", "allclose", "matrix_exp", "mv", "vdot"))

__all__ = ["orthogonal", "spectral_norm", "weight_norm"]


def _is_orthogonal(Q) -> bool:
    n, k = Q.size(-2), Q.size(-1)
    identity = eye(k, dtype=Q.dtype, device=Q.device)
    eps = 10.0 * n * finfo(Q.dtype).eps
    return allclose(Q.mH @ Q, identity, atol=eps)


def _make_orthogonal(A):
    """The Q of A's QR decomposition, with R's diagonal made positive (torch: geqrf, then householder_product)."""
    Q, R = qr(A)
    return Q * R.diagonal(dim1=-2, dim2=-1).sgn().unsqueeze(-2)


class _OrthMaps(Enum):
    matrix_exp = auto()
    cayley = auto()
    householder = auto()


class _Orthogonal(Module):
    def __init__(self, weight, orthogonal_map: _OrthMaps, *, use_trivialization: bool = True) -> None:
        super().__init__()
        if weight.is_complex() and orthogonal_map == _OrthMaps.householder:
            raise ValueError("The householder parametrization does not support complex tensors.")
        self.shape = weight.shape
        self.orthogonal_map = orthogonal_map
        if use_trivialization:
            self.register_buffer("base", None)

    def forward(self, X: Tensor) -> Tensor:
        n, k = X.size(-2), X.size(-1)
        transposed = n < k
        if transposed:
            X = X.mT
            n, k = k, n
        if self.orthogonal_map in (_OrthMaps.matrix_exp, _OrthMaps.cayley):
            X = X.tril()
            if n != k:
                X = cat([X, X.new_zeros(n, n - k).expand(*X.shape[:-2], -1, -1)], dim=-1)
            A = X - X.mH
            if self.orthogonal_map == _OrthMaps.matrix_exp:
                Q = matrix_exp(A)
            else:
                identity = eye(n, dtype=A.dtype, device=A.device)
                Q = solve(add(identity, A, alpha=-0.5), add(identity, A, alpha=0.5))
            if n != k:
                Q = Q[..., :k]
        else:
            A = X.tril(diagonal=-1)
            tau = 2.0 / (1.0 + (A * A).sum(dim=-2))
            Q = householder_product(A, tau)
            Q = Q * X.diagonal(dim1=-2, dim2=-1).int().unsqueeze(-2)
        if hasattr(self, "base"):
            Q = self.base @ Q
        if transposed:
            Q = Q.mT
        return Q

    def right_inverse(self, Q: Tensor) -> Tensor:
        with no_grad():
            return self._right_inverse(Q)

    def _right_inverse(self, Q: Tensor) -> Tensor:
        if Q.shape != self.shape:
            raise ValueError(f"Expected a matrix or batch of matrices of shape {self.shape}. "
                             f"Got a tensor of shape {Q.shape}.")
        Q_init = Q
        n, k = Q.size(-2), Q.size(-1)
        transpose = n < k
        if transpose:
            Q = Q.mT
            n, k = k, n
        if not hasattr(self, "base"):
            if self.orthogonal_map in (_OrthMaps.cayley, _OrthMaps.matrix_exp):
                raise NotImplementedError("It is not possible to assign to the matrix exponential or the Cayley "
                                          "parametrizations when use_trivialization=False.")
            # the householder map: geqrf's reflectors of Q, with R's diagonal (stored on A's) made positive; a
            # reflector LAPACK skipped (tau exactly zero) flips that sign back
            A, tau = geqrf(Q)
            A.diagonal(dim1=-2, dim2=-1).sign_()
            A.diagonal(dim1=-2, dim2=-1)[tau == 0.0] *= -1
            return A.mT if transpose else A
        if n == k:
            Q = _make_orthogonal(Q) if not _is_orthogonal(Q) else Q.clone()
        else:  # complete Q to a square orthogonal base with random columns, as torch
            N = randn(*(Q.size()[:-2] + (n, n - k)), dtype=Q.dtype, device=Q.device)
            Q = _make_orthogonal(cat([Q, N], dim=-1))
        self.base = Q
        neg_identity = zeros_like(Q_init)
        neg_identity.diagonal(dim1=-2, dim2=-1).fill_(-1.0)
        return neg_identity


def orthogonal(module: Module, name: str = "weight", orthogonal_map: str | None = None, *,
               use_trivialization: bool = True) -> Module:
    """Keep ``module.<name>`` orthogonal (or unitary): a map from a free matrix onto the orthogonal ones.

    >>> import tilewise as tw
    >>> layer = orthogonal(tw.nn.Linear(4, 4))
    >>> bool(tw.allclose(layer.weight @ layer.weight.T, tw.eye(4), atol=1e-5))
    True
    """
    weight = getattr(module, name, None)
    if not isinstance(weight, Tensor):
        raise ValueError(f"Module '{module}' has no parameter or buffer with name '{name}'")
    if weight.ndim < 2:
        raise ValueError(f"Expected a matrix or batch of matrices. Got a tensor of {weight.ndim} dimensions.")
    if orthogonal_map is None:
        square = weight.size(-2) == weight.size(-1)
        orthogonal_map = "matrix_exp" if square or weight.is_complex() else "householder"
    orth_enum = getattr(_OrthMaps, orthogonal_map, None)
    if orth_enum is None:
        raise ValueError('orthogonal_map has to be one of "matrix_exp", "cayley", "householder". '
                         f"Got: {orthogonal_map}")
    orth = _Orthogonal(weight, orth_enum, use_trivialization=use_trivialization)
    parametrize.register_parametrization(module, name, orth, unsafe=True)
    return module


class _WeightNorm(Module):
    def __init__(self, dim: int | None = 0) -> None:
        super().__init__()
        self.dim = -1 if dim is None else dim

    def forward(self, weight_g, weight_v):
        return weight_norm_of(weight_v, weight_g, self.dim)

    def right_inverse(self, weight):
        return norm_except_dim(weight, 2, self.dim), weight


def weight_norm(module: Module, name: str = "weight", dim: int = 0) -> Module:
    """Reparametrise ``module.<name>`` as ``g * v / ||v||``, the norm over every dimension but ``dim`` (all of them
    for ``dim=None``); a state dict of the older ``nn.utils.weight_norm`` (``<name>_g``, ``<name>_v``) loads too.

    >>> import tilewise as tw
    >>> layer = weight_norm(tw.nn.Linear(3, 2))
    >>> sorted(layer.state_dict())
    ['bias', 'parametrizations.weight.original0', 'parametrizations.weight.original1']
    """
    parametrize.register_parametrization(module, name, _WeightNorm(dim), unsafe=True)

    def _weight_norm_compat_hook(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                 error_msgs) -> None:
        g_key, v_key = f"{prefix}{name}_g", f"{prefix}{name}_v"
        if g_key in state_dict and v_key in state_dict:
            state_dict[f"{prefix}parametrizations.{name}.original0"] = state_dict.pop(g_key)
            state_dict[f"{prefix}parametrizations.{name}.original1"] = state_dict.pop(v_key)

    module._register_load_state_dict_pre_hook(_weight_norm_compat_hook)
    return module


class _SpectralNorm(Module):
    def __init__(self, weight: Tensor, n_power_iterations: int = 1, dim: int = 0, eps: float = 1e-12) -> None:
        super().__init__()
        ndim = weight.ndim
        if dim >= ndim or dim < -ndim:
            raise IndexError(f"Dimension out of range (expected to be in range of [-{ndim}, {ndim - 1}] but got "
                             f"{dim})")
        if n_power_iterations <= 0:
            raise ValueError("Expected n_power_iterations to be positive, but got "
                             f"n_power_iterations={n_power_iterations}")
        self.dim = dim if dim >= 0 else dim + ndim
        self.eps = eps
        if ndim > 1:
            self.n_power_iterations = n_power_iterations
            weight_mat = self._reshape_weight_to_matrix(weight)
            h, w = weight_mat.size()
            with no_grad():
                u = weight_mat.new_empty(h).normal_(0, 1)
                v = weight_mat.new_empty(w).normal_(0, 1)
                self.register_buffer("_u", F.normalize(u, dim=0, eps=self.eps))
                self.register_buffer("_v", F.normalize(v, dim=0, eps=self.eps))
            self._power_method(weight_mat, 15)

    def _reshape_weight_to_matrix(self, weight: Tensor) -> Tensor:
        if self.dim != 0:
            weight = weight.permute(self.dim, *(d for d in range(weight.dim()) if d != self.dim))
        return weight.flatten(1)

    def _power_method(self, weight_mat: Tensor, n_power_iterations: int) -> None:
        """Updates the buffers in place, so copies of the module that share them see the update (as torch's
        ``out=`` does)."""
        with no_grad():
            for _ in range(n_power_iterations):
                self._u.copy_(F.normalize(mv(weight_mat, self._v), dim=0, eps=self.eps))
                self._v.copy_(F.normalize(mv(weight_mat.H, self._u), dim=0, eps=self.eps))

    def forward(self, weight: Tensor) -> Tensor:
        if weight.ndim == 1:
            return F.normalize(weight, dim=0, eps=self.eps)
        weight_mat = self._reshape_weight_to_matrix(weight)
        if self.training:
            self._power_method(weight_mat, self.n_power_iterations)
        u, v = self._u.clone(), self._v.clone()
        sigma = vdot(u, mv(weight_mat, v))
        return weight / sigma

    def right_inverse(self, value: Tensor) -> Tensor:
        return value


def spectral_norm(module: Module, name: str = "weight", n_power_iterations: int = 1, eps: float = 1e-12,
                  dim: int | None = None) -> Module:
    """Divide ``module.<name>`` by its largest singular value, estimated by power iteration (one step per forward
    in training mode).

    >>> import tilewise as tw
    >>> layer = spectral_norm(tw.nn.Linear(4, 3))
    >>> sorted(layer.state_dict())
    ['bias', 'parametrizations.weight.0._u', 'parametrizations.weight.0._v', 'parametrizations.weight.original']
    """
    weight = getattr(module, name, None)
    if not isinstance(weight, Tensor):
        raise ValueError(f"Module '{module}' has no parameter or buffer with name '{name}'")
    if dim is None:
        dim = 1 if isinstance(module, (ConvTranspose1d, ConvTranspose2d, ConvTranspose3d)) else 0
    parametrize.register_parametrization(module, name, _SpectralNorm(weight, n_power_iterations, dim, eps))
    return module

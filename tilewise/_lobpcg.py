"""LOBPCG (``tilewise.lobpcg``): a few extreme eigenpairs of a large symmetric (generalized) eigenproblem.

[Note: LOBPCG] Knyazev's locally optimal block preconditioned conjugate gradient finds the k largest (or
smallest) eigenpairs of A x = lambda B x by Rayleigh-Ritz steps over a search basis S = [X, P, W]: the current
Ritz vectors X, the previous step's directions P and the (preconditioned, ``iK``) residuals W. Two variants, as
torch's: ``method="basic"`` B-orthonormalizes S at every step through a Cholesky factor of S^T B S (cheap,
fragile when S loses rank), and ``method="ortho"`` (the default) keeps S B-orthonormal by construction, the
residuals orthogonalized against [X, P] by repeated SVQB steps (Duersch, Shao, Yang and Gu, 2018), with the
tolerances and repetition limits of ``ortho_iparams``/``ortho_fparams``/``ortho_bparams``. Converged leading
pairs are locked: they leave the search basis and keep their values. The loop runs on the host's control flow
(a step reads norms to decide), one matrix at a time for a batch, and calls ``tracker(worker)`` after each
step, the worker holding torch's state names (``ivars``, ``fvars``, ``tvars``, ``X``, ``E``, ...).
Gradients (A requiring grad, B None) are those of the computed eigenpairs of (A + A^T) / 2: the pairs' mutual
terms, and for the rest of the spectrum, which LOBPCG never computes, one solve with (lambda_i I - A) restricted
to the complement of the computed eigenvectors per pair (torch reaches the same derivative through the
characteristic polynomial of the computed eigenvalues).

>>> import tilewise as tw
>>> A = tw.diag(tw.arange(1.0, 13.0, dtype=tw.float64))
>>> E, X = tw.lobpcg(A, k=2, X=tw.eye(12, 2, dtype=tw.float64) + 0.1)
>>> [round(e, 6) for e in E.tolist()]
[12.0, 11.0]
"""

# ruff: noqa: N803, N806 — matrices are named as in torch's lobpcg and the literature (A, B, X, E, R, S, P, W)

from __future__ import annotations

import math

from tilewise import linalg
from tilewise.autograd.function import Function
from tilewise.dtypes import bool_, float32, float64
from tilewise.ops.creation import eye, randn, zeros
from tilewise.tensor import Tensor

__all__ = ["lobpcg"]

_MACHINE_EPSILON = {float32: 1.2e-07, float64: 2.23e-16}  # torch's figures, whose square roots are the default tol


def _times(M: Tensor | None, X: Tensor) -> Tensor:
    """M X, with None standing for the identity (B and iK default to it)."""
    return X if M is None else M.matmul(X)


def _gram(S: Tensor, M: Tensor | None) -> Tensor:
    """S^T M S."""
    return S.mT.matmul(_times(M, S))


def _eigenpairs(M: Tensor, largest: bool | None = False) -> tuple[Tensor, Tensor]:
    """The eigenpairs of the symmetric M (its upper triangle read), ascending, or descending where ``largest``."""
    E, Z = linalg.eigh(M, UPLO="U")
    return (E.flip(-1), Z.flip(-1)) if largest else (E, Z)


def _norm(X: Tensor) -> float:
    return float(X.norm())


class LOBPCG:
    """The state of one LOBPCG run on one matrix, under torch's names (what a ``tracker`` reads)."""

    def __init__(self, A: Tensor | None, B: Tensor | None, X: Tensor, iK: Tensor | None, iparams: dict,
                 fparams: dict, bparams: dict, method: str, tracker) -> None:
        self.A, self.B, self.iK = A, B, iK
        self.iparams, self.fparams, self.bparams = iparams, fparams, bparams
        self.method, self.tracker = method, tracker
        m, n = iparams["m"], iparams["n"]
        self.X = X
        self.E = zeros((n,), dtype=X.dtype, device=X.device)
        self.R = zeros((m, n), dtype=X.dtype, device=X.device)
        self.S = zeros((m, 3 * n), dtype=X.dtype, device=X.device)
        self.tvars: dict[str, Tensor] = {}
        self.ivars: dict[str, int] = {"istep": 0}
        self.fvars: dict[str, float] = {"_": 0.0}
        self.bvars: dict[str, bool] = {"_": False}

    def __str__(self) -> str:
        names = ("iparams", "fparams", "bparams", "ivars", "fvars", "bvars", "tvars", "A", "B", "iK", "X", "E")
        return "LOBPCG:\n" + "".join(f"  {name}={getattr(self, name)}\n" for name in names)

    # ------------------------------------------------------------ the iteration

    def run(self) -> None:
        self.update()
        self.call_tracker()
        while not self.stop_iteration():
            self.update()
            self.call_tracker()

    def call_tracker(self) -> None:
        if self.tracker is not None:
            self.tracker(self)

    def stop_iteration(self) -> bool:
        return (self.bvars.get("force_stop", False) or self.ivars["iterations_left"] == 0
                or self.ivars["converged_count"] >= self.iparams["k"])

    def update(self) -> None:
        """One step; the first also measures A and B on the initial X (the scale of the convergence test)."""
        if self.ivars["istep"] == 0:
            x_norm = _norm(self.X)
            self.fvars["X_norm"] = x_norm
            self.fvars["A_norm"] = _norm(_times(self.A, self.X)) / x_norm
            self.fvars["B_norm"] = _norm(_times(self.B, self.X)) / x_norm
            self.ivars["iterations_left"] = self.iparams["niter"]
            self.ivars["converged_count"] = 0
            self.ivars["converged_end"] = 0
        if self.method == "ortho":
            self._update_ortho()
        else:
            self._update_basic()
        self.ivars["iterations_left"] -= 1
        self.ivars["istep"] += 1

    def update_residual(self) -> None:
        self.R = _times(self.A, self.X) - _times(self.B, self.X) * self.E

    def update_converged_count(self) -> int:
        """The number of leading pairs whose relative residual is below ``tol`` (locked pairs stay converged)."""
        previous = self.ivars["converged_count"]
        scale = self.X.norm(2, (0,)) * (self.fvars["A_norm"] + self.E[:self.X.shape[-1]].abs() * self.fvars["B_norm"])
        rerr = self.R.norm(2, (0,)) / scale
        count = 0
        for converged in (rerr < self.fparams["tol"]).tolist():
            if not converged:
                break
            count += 1
        if count < previous:
            raise AssertionError(f"the number of converged eigenpairs (was {previous}, got {count}) cannot decrease")
        self.ivars["converged_count"] = count
        self.tvars["rerr"] = rerr
        return count

    def _store_ritz_vectors(self, directions: Tensor | None) -> int:
        """S[:, :n] = X and S[:, n:n + p] = P (the new directions); returns where they end."""
        n = self.iparams["n"]
        self.S[:, :n] = self.X
        if directions is None:
            return n
        self.S[:, n:n + directions.shape[-1]] = directions
        return n + directions.shape[-1]

    def _store_residuals(self, start: int, residuals: Tensor) -> None:
        """S's last block W, and the end of S's columns in use."""
        end = start + residuals.shape[-1]
        self.S[:, start:end] = residuals
        self.ivars["converged_end"] = end

    def _update_basic(self) -> None:
        """Rayleigh-Ritz on the B-orthonormalized basis (a Cholesky factor of S^T B S)."""
        n, largest = self.iparams["n"], self.bparams["largest"]
        if self.ivars["istep"] == 0:
            Ri = self._get_rayleigh_ritz_transform(self.X)
            E, Z = _eigenpairs(_gram(Ri, _gram(self.X, self.A)), largest)
            self.X[:] = self.X.matmul(Ri.matmul(Z))
            self.E[:] = E
            self.update_residual()
            self.update_converged_count()
            self._store_residuals(self._store_ritz_vectors(None), _times(self.iK, self.R))
            return
        nc, ns = self.ivars["converged_count"], self.ivars["converged_end"]
        basis = self.S[:, nc:ns]
        Ri = self._get_rayleigh_ritz_transform(basis)
        E, Z = _eigenpairs(_gram(Ri, _gram(basis, self.A)), largest)
        self.X[:, nc:] = basis.matmul(Ri.matmul(Z[:, :n - nc]))
        self.E[nc:] = E[:n - nc]
        directions = basis.matmul(Ri.matmul(Z[:, n:2 * n - nc]))
        self.update_residual()
        nc = self.update_converged_count()
        self._store_residuals(self._store_ritz_vectors(directions), _times(self.iK, self.R[:, nc:]))

    def _update_ortho(self) -> None:
        """Rayleigh-Ritz on a basis kept B-orthonormal: the new directions are orthonormalized within the Ritz
        coefficients, the residuals against [X, P] (``_get_ortho``). As torch's, the first step leaves E at zero,
        so its residuals are A X."""
        n, largest = self.iparams["n"], self.bparams["largest"]
        if self.ivars["istep"] == 0:
            Ri = self._get_rayleigh_ritz_transform(self.X)
            _, Z = _eigenpairs(_gram(Ri, _gram(self.X, self.A)), largest)
            self.X = self.X.matmul(Ri.matmul(Z))
            self.update_residual()
            self.update_converged_count()
            end = self._store_ritz_vectors(None)
            self._store_residuals(end, self._get_ortho(self.R, self.X))
            return
        nc, ns = self.ivars["converged_count"], self.ivars["converged_end"]
        basis = self.S[:, nc:ns]
        E, Z = _eigenpairs(_gram(basis, self.A), largest)
        self.X[:, nc:] = basis.matmul(Z[:, :n - nc])
        self.E[nc:] = E[:n - nc]
        mixing = linalg.qr(Z[:n - nc, n - nc:].mT).Q
        directions = basis.matmul(Z[:, n - nc:].matmul(mixing))
        self.update_residual()
        nc = self.update_converged_count()
        end = self._store_ritz_vectors(directions)
        self._store_residuals(end, self._get_ortho(self.R[:, nc:], self.S[:, :end]))

    # ------------------------------------------------------------ orthonormalization

    def _get_rayleigh_ritz_transform(self, S: Tensor) -> Tensor:
        """Ri with Ri^T S^T B S Ri = I: diag(d) U^-1, U the upper Cholesky factor of the unit-diagonal scaling of
        S^T B S (d its inverse square-rooted diagonal)."""
        SBS = _gram(S, self.B)
        d = SBS.diagonal(0, -2, -1) ** -0.5
        U = linalg.cholesky((SBS * d) * d.reshape(-1, 1), upper=True)
        return linalg.solve_triangular(U, d.diag_embed(), upper=True, left=False)

    def _get_svqb(self, U: Tensor, drop: bool, tau: float) -> Tensor:
        """U's columns made B-orthonormal through the eigenpairs of the unit-diagonal scaling of U^T B U
        (Stathopoulos and Wu's SVQB): zero columns are dropped first; eigenvalues below tau * max |E| are dropped
        (``drop``) or raised to it."""
        if U.numel() == 0:
            return U
        UBU = _gram(U, self.B)
        d = UBU.diagonal(0, -2, -1)
        nonzero = (d.abs() != 0).nonzero().reshape(-1)
        if nonzero.numel() < d.numel():
            U = U[:, nonzero]
            if U.numel() == 0:
                return U
            UBU = _gram(U, self.B)
            d = UBU.diagonal(0, -2, -1)
        scale = (d ** -0.5).reshape(-1, 1)
        E, Z = _eigenpairs((UBU * scale) * scale.mT)
        threshold = tau * float(E.abs().max())
        if drop:
            keep = (E > threshold).nonzero().reshape(-1)
            E, Z, scale = E[keep], Z[:, keep], scale[keep]
        else:
            E = E.clamp(min=threshold)
        return (U * scale.mT).matmul(Z * E ** -0.5)

    def _get_ortho(self, U: Tensor, V: Tensor) -> Tensor:
        """U's columns made B-orthonormal and B-orthogonal to V's: project V out and SVQB, up to ``ortho_i_max``
        times, each SVQB repeated up to ``ortho_j_max`` times until U^T B U is the identity within ``ortho_tol``."""
        tau_ortho = self.fparams["ortho_tol"]
        tau_drop, tau_replace = self.fparams["ortho_tol_drop"], self.fparams["ortho_tol_replace"]
        i_max, j_max = self.iparams["ortho_i_max"], self.iparams["ortho_j_max"]
        use_drop = self.bparams["ortho_use_drop"]
        for key in [key for key in self.fvars if key.startswith("ortho_") and key.endswith("_rerr")]:
            del self.fvars[key]
        self.ivars.pop("ortho_i", 0)
        self.ivars.pop("ortho_j", 0)
        bv_norm = _norm(_times(self.B, V))
        BU = _times(self.B, U)
        VBU = V.mT.matmul(BU)
        i = j = 0
        for i in range(i_max):
            U = U - V.matmul(VBU)
            drop, tau_svqb = False, tau_drop
            for j in range(j_max):
                if use_drop:
                    U = self._get_svqb(U, drop, tau_svqb)
                    drop, tau_svqb = True, tau_replace
                else:
                    U = self._get_svqb(U, False, tau_replace)
                if U.numel() == 0:
                    self.ivars["ortho_i"], self.ivars["ortho_j"] = i, j
                    return U
                BU = _times(self.B, U)
                UBU = U.mT.matmul(BU)
                identity = eye(UBU.shape[-1], dtype=UBU.dtype, device=UBU.device)
                rerr = _norm(UBU - identity) / (_norm(BU) * _norm(U))
                self.fvars[f"ortho_UBUmI_rerr[{i}, {j}]"] = rerr
                if rerr < tau_ortho:
                    break
            VBU = V.mT.matmul(BU)
            rerr = _norm(VBU) / (bv_norm * _norm(U))
            self.fvars[f"ortho_VBU_rerr[{i}]"] = rerr
            if rerr < tau_ortho:
                break
            if self.iparams["m"] < U.shape[-1] + V.shape[-1]:
                if self.B is None:
                    raise AssertionError("B must not be None")
                raise ValueError(f"Overdetermined shape of U: #B-cols(={self.B.shape[-1]}) >= #U-cols(={U.shape[-1]}) "
                                 f"+ #V-cols(={V.shape[-1]}) must hold")
        self.ivars["ortho_i"], self.ivars["ortho_j"] = i, j
        return U


# ---------------------------------------------------------------- the driver

def _parameters(m: int, n: int, k: int, niter, tol, largest, method, ortho_iparams, ortho_fparams, ortho_bparams):
    iparams = {"m": m, "n": n, "k": k, "niter": 1000 if niter is None else niter}
    fparams = {"tol": tol}
    bparams = {"largest": True if largest is None else largest}
    if method == "ortho":
        iparams.update(ortho_iparams or {})
        fparams.update(ortho_fparams or {})
        bparams.update(ortho_bparams or {})
        iparams.setdefault("ortho_i_max", 3)
        iparams.setdefault("ortho_j_max", 3)
        for name in ("ortho_tol", "ortho_tol_drop", "ortho_tol_replace"):
            fparams.setdefault(name, tol)
        bparams.setdefault("ortho_use_drop", False)
    return iparams, fparams, bparams


def _run(A, B, X, iK, k, n, m, parameters, method, tracker, dtype, device):
    """(E[:k], X[:, :k]) of one matrix, from X or from a random start."""
    start = randn((m, n), dtype=dtype, device=device) if X is None else X
    if not (start.ndim == 2 and tuple(start.shape) == (m, n)):
        raise AssertionError(f"X shape mismatch: got {start.shape}, expected {(m, n)}")
    worker = LOBPCG(A, B, start, iK, *parameters, method, tracker)
    worker.run()
    return worker.E[:k], worker.X[:, :k]


def _lobpcg(A, k=None, B=None, X=None, n=None, iK=None, niter=None, tol=None, largest=None, method=None, tracker=None,
            ortho_iparams=None, ortho_fparams=None, ortho_bparams=None):
    if A.shape[-2] != A.shape[-1]:
        raise AssertionError(f"A must be square, got shape {A.shape}")
    if B is not None and A.shape != B.shape:
        raise AssertionError(f"A and B must have same shape, got {A.shape} vs {B.shape}")
    dtype = A.dtype if A.dtype in (float32, float64) or A.dtype.name == "float16" else float32
    if tol is None:
        tol = _MACHINE_EPSILON[dtype] ** 0.5
    m = A.shape[-1]
    k = (1 if X is None else X.shape[-1]) if k is None else k
    n = (k if n is None else n) if X is None else X.shape[-1]
    if m < 3 * n:
        raise ValueError(f"LOBPCG algorithm is not applicable when the number of A rows (={m}) is smaller than 3 x "
                         f"the number of requested eigenpairs (={n})")
    method = "ortho" if method is None else method
    parameters = _parameters(m, n, k, niter, tol, largest, method, ortho_iparams, ortho_fparams, ortho_bparams)
    if A.ndim == 2:
        return _run(A, B, X, iK, k, n, m, parameters, method, tracker, dtype, A.device)
    count = math.prod(A.shape[:-2])
    flat_A = A.reshape((count, m, m))
    flat_B = None if B is None else B.reshape((count, m, m))
    flat_X = None if X is None else X.reshape((count, *X.shape[-2:]))
    values = zeros((count, k), dtype=dtype, device=A.device)
    vectors = zeros((count, m, k), dtype=dtype, device=A.device)
    for i in range(count):
        parameters[0]["batch_index"] = i
        values[i], vectors[i] = _run(flat_A[i], None if flat_B is None else flat_B[i],
                                     None if flat_X is None else flat_X[i], iK, k, n, m, parameters, method, tracker,
                                     dtype, A.device)
    return values.reshape((*A.shape[:-2], k)), vectors.reshape((*A.shape[:-2], m, k))


def _eigenpairs_backward(D_grad: Tensor, U_grad: Tensor, A: Tensor, D: Tensor, U: Tensor) -> Tensor:
    """dL/dA for the eigenpairs (D, U) of the symmetric A, U of k <= m orthonormal columns (see [Note: LOBPCG]):
    U (diag(D_grad) + (U^T U_grad) / (D_j - D_i)) U^T, plus, for k < m, y_i u_i^T with y_i the solution in the
    complement of U of (D_i I - A) y_i = (I - U U^T) U_grad_i."""
    differences = D.unsqueeze(-2) - D.unsqueeze(-1)  # [i, j]: D_j - D_i
    identity_k = eye(D.shape[-1], dtype=bool_, device=D.device)
    inverse = (1 / differences.masked_fill(identity_k, 1)).masked_fill(identity_k, 0)
    grad = U.matmul((D_grad.diag_embed() + U.mT.matmul(U_grad) * inverse).matmul(U.mT))
    m, k = U.shape[-2], U.shape[-1]
    if k == m:
        return grad
    identity = eye(m, dtype=A.dtype, device=A.device)
    projector = identity - U.matmul(U.mT)
    shifted = D.reshape(k, 1, 1) * identity - A  # [k, m, m]: D_i I - A
    restricted = projector.matmul(shifted).matmul(projector) + U.matmul(U.mT)
    rhs = projector.matmul(U_grad).mT.unsqueeze(-1)  # [k, m, 1]
    y = projector.matmul(linalg.solve(restricted, rhs).squeeze(-1).mT)  # [m, k]
    return grad + y.matmul(U.mT)


class _LOBPCGFunction(Function):
    """lobpcg of (A + A^T) / 2 with a derivative for A (B None, real matrices), as torch's autograd function."""

    @staticmethod
    def forward(ctx, A, k=None, B=None, X=None, n=None, iK=None, niter=None, tol=None, largest=None, method=None,
                tracker=None, ortho_iparams=None, ortho_fparams=None, ortho_bparams=None):
        A = A.contiguous()
        B = None if B is None else B.contiguous()
        D, U = _lobpcg(A, k, B, X, n, iK, niter, tol, largest, method, tracker, ortho_iparams, ortho_fparams,
                       ortho_bparams)
        ctx.save_for_backward(A, B, D, U)
        return D, U

    @staticmethod
    def backward(ctx, D_grad, U_grad):
        A, B, D, U = ctx.saved_tensors
        if A.dtype.is_complex or (B is not None and B.dtype.is_complex):
            raise ValueError("lobpcg.backward does not support complex input yet. Note that lobpcg.forward does "
                             "though.")
        if B is not None:
            raise ValueError("lobpcg.backward does not support backward with B != I yet.")
        return (_eigenpairs_backward(D_grad, U_grad, A, D, U), *([None] * 13))


def lobpcg(A: Tensor, k: int | None = None, B: Tensor | None = None, X: Tensor | None = None, n: int | None = None,
           iK: Tensor | None = None, niter: int | None = None, tol: float | None = None, largest: bool | None = None,
           method: str | None = None, tracker=None, ortho_iparams: dict | None = None,
           ortho_fparams: dict | None = None, ortho_bparams: dict | None = None) -> tuple[Tensor, Tensor]:
    """The k largest (``largest=False``: smallest) eigenpairs (E, X) of the symmetric positive-definite generalized
    problem A x = lambda B x (B None: the identity), by LOBPCG (see [Note: LOBPCG]). A [..., m, m] must have
    m >= 3 n, n (default k) the block size; X [..., m, n] is the starting block (random normal by default), iK a
    preconditioner, niter the step limit (default 1000; -1: until converged), tol the relative residual at which
    a pair counts as converged (default sqrt of machine epsilon). Differentiable in A (symmetrized) where B is
    None.

    >>> import tilewise as tw
    >>> A = tw.diag(tw.arange(1.0, 10.0, dtype=tw.float64))
    >>> E, X = tw.lobpcg(A, k=1, largest=False, X=tw.ones(9, 1, dtype=tw.float64))
    >>> round(E.item(), 6)
    1.0
    """
    if A.requires_grad or (B is not None and B.requires_grad):
        A_sym = (A + A.mT) / 2
        B_sym = None if B is None else (B + B.mT) / 2
        return _LOBPCGFunction.apply(A_sym, k, B_sym, X, n, iK, niter, tol, largest, method, tracker, ortho_iparams,
                                     ortho_fparams, ortho_bparams)
    return _lobpcg(A, k, B, X, n, iK, niter, tol, largest, method, tracker, ortho_iparams, ortho_fparams,
                   ortho_bparams)

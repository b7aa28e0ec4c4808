"""``tilewise.special``: torch.special's names for the special functions the operator library has.

Each is the operator of the same meaning under its top-level name (``expit`` is ``sigmoid``, ``gammaln`` is
``lgamma``, ``psi`` is ``digamma``, ``multigammaln`` is ``mvlgamma``, ``gammainc`` and ``gammaincc`` are ``igamma``
and ``igammac``), with torch.special's arguments; those torch has only here are its ``special_`` operators (``ndtr``
is ``special_ndtr``, see ``ops/special.py``).

>>> import tilewise as tw
>>> tw.special.expit(tw.tensor([0.0]))
tensor([0.5000])
"""

from __future__ import annotations

from tilewise.ops.registry import public_function

__all__ = ["digamma", "entr", "erf", "erfc", "erfcx", "erfinv", "exp2", "expit", "expm1", "gammainc", "gammaincc",
           "gammaln", "i0", "i0e", "i1", "i1e", "log1p", "log_ndtr", "log_softmax", "logit", "logsumexp",
           "multigammaln", "ndtr", "ndtri", "polygamma", "psi", "round", "sinc", "softmax", "xlog1py", "xlogy"]


def _unary(name: str, public: str | None = None):
    def special(input, *, out=None):  # noqa: A002 — torch's argument name
        return public_function(public or name)(input, out=out)

    special.__name__ = special.__qualname__ = name
    special.__doc__ = f"torch.special.{name}: ``tilewise.{public or name}``."
    return special


digamma, erf, erfc, erfinv, exp2, expm1, i0, log1p, sinc = (
    _unary(n) for n in ("digamma", "erf", "erfc", "erfinv", "exp2", "expm1", "i0", "log1p", "sinc"))
expit, gammaln, psi = _unary("expit", "sigmoid"), _unary("gammaln", "lgamma"), _unary("psi", "digamma")
entr, erfcx, i0e, i1, i1e, log_ndtr, ndtr, ndtri = (
    _unary(n, f"special_{n}") for n in ("entr", "erfcx", "i0e", "i1", "i1e", "log_ndtr", "ndtr", "ndtri"))


def logit(input, eps=None, *, out=None):  # noqa: A002
    return public_function("logit")(input, eps, out=out)


def multigammaln(input, p, *, out=None):  # noqa: A002
    return public_function("mvlgamma")(input, p, out=out)


def polygamma(n, input, *, out=None):  # noqa: A002
    return public_function("polygamma")(n, input, out=out)


def round(input, *, decimals=0, out=None):  # noqa: A001, A002 — torch's names
    return public_function("round")(input, decimals=decimals, out=out)


def gammainc(input, other, *, out=None):  # noqa: A002
    """torch.special.gammainc: ``tilewise.igamma``, the regularized lower incomplete gamma function."""
    return public_function("igamma")(input, other, out=out)


def gammaincc(input, other, *, out=None):  # noqa: A002
    """torch.special.gammaincc: ``tilewise.igammac``, the regularized upper incomplete gamma function."""
    return public_function("igammac")(input, other, out=out)


def xlogy(input, other, *, out=None):  # noqa: A002
    return public_function("xlogy")(input, other, out=out)


def xlog1py(input, other, *, out=None):  # noqa: A002
    return public_function("special_xlog1py")(input, other, out=out)


def softmax(input, dim, *, dtype=None):  # noqa: A002
    return public_function("softmax")(input, dim, dtype=dtype)


def log_softmax(input, dim, *, dtype=None):  # noqa: A002
    return public_function("log_softmax")(input, dim, dtype=dtype)


def logsumexp(input, dim, keepdim=False, *, out=None):  # noqa: A002
    return public_function("logsumexp")(input, dim, keepdim, out=out)

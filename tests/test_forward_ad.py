"""Forward-mode AD over the whole operator table: every operator's tangent agrees with its own backward
(``<u, J v> == <J^T u, v>`` in float64) and with torch.func.jvp; plus the forward_ad API against torch's."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.autograd.forward_ad as torch_fwad
from opinfo import T, _build, _materialise
from test_ops import OPINFOS

import tilewise as tw
import tilewise.autograd.forward_ad as fwAD
import tilewise.nn.functional as F

DIFFERENTIABLE = [info for info in OPINFOS if info.grad and "float64" in info.dtypes]

# Where torch 2.13's forward rule is not the derivative, tilewise's tangent is checked against central finite
# differences instead of against torch's.
TORCH_FORWARD_INEXACT = {
    "cholesky_inverse": "torch's jvp, -X dL X L^H + h.c., is not d(L L^H)^-1 (finite differences disagree)",
    "logcumsumexp": "torch's jvp divides by cumsum(exp) + 1e-13: ~0 where exp(x) underflows against the slice max",
    "triangular_solve": "torch's jvp reads the tangent's other triangle, which the solve itself never reads",
}


# Samples where torch's backward is by design not the derivative, and torch has no forward rule to follow instead.
NOT_ADJOINT = dict.fromkeys([("embedding_bag", "freq"), ("embedding_bag", "mode1-freq")],
                            "scale_grad_by_freq scales the gradient, not the derivative")


def _random_values(rng, shape, is_complex: bool) -> np.ndarray:
    values = np.asarray(rng.standard_normal(tuple(shape)))
    return np.asarray(values + 1j * rng.standard_normal(tuple(shape))) if is_complex else values


def _inputs(info, sample, seed: int):
    """Arguments for both libraries (float64), the indices of the differentiable tensors, and a tangent for each."""
    rng = np.random.default_rng(seed)
    made: list = []
    args = _materialise(sample.args, rng, "float64", made)
    kwargs = {k: _materialise(v, rng, "float64", made) for k, v in sample.kwargs.items()}
    arrays = [m[0] for m in made]
    wanted = [k for k, (arr, spec) in enumerate(made) if spec.grad and arr.dtype.kind in "fc"]
    tangents = {k: _random_values(rng, arrays[k].shape, arrays[k].dtype.kind == "c") for k in wanted}
    return args, kwargs, arrays, wanted, tangents


def _call(info, lib, functional, args, kwargs, arrays, make):
    made: dict = {}
    built = _build(args, arrays, lambda k: made.setdefault(k, make(k)), lib)
    built_kwargs = {k: _build(v, arrays, lambda i: made.setdefault(i, make(i)), lib) for k, v in kwargs.items()}
    return info.resolve(lib, functional)(*built, **built_kwargs), made


def _outputs(out, info):
    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    if info.output_index is not None:
        outs = [outs[info.output_index]]
    return outs


def _differentiable(t) -> bool:
    return isinstance(t, tw.Tensor) and (t.dtype.is_floating_point or t.dtype.is_complex)


def _tilewise_jvp(info, args, kwargs, arrays, tangents):
    with fwAD.dual_level():
        def make(k):
            t = tw.from_numpy(arrays[k].copy())
            return fwAD.make_dual(t, tw.from_numpy(tangents[k].copy())) if k in tangents else t

        out, made = _call(info, tw, F, args, kwargs, arrays, make)
        outs = _outputs(out, info)
        return [(o, fwAD.unpack_dual(o).tangent) if _differentiable(o) else (o, None) for o in outs], made


def _torch_is_self_adjoint(info, args, kwargs, arrays, wanted, tangents, rng) -> bool:
    """Whether torch's own jvp and vjp agree on this sample: at NaNs, ties and scale_grad_by_freq torch's forward
    rules are not its backward's adjoint, and tilewise follows torch's forward rules there."""
    import torch.nn.functional as TF

    def leaf(k):
        t = torch.from_numpy(arrays[k].copy())
        return t.requires_grad_() if k in wanted else t

    try:
        out, made = _call(info, torch, TF, args, kwargs, arrays, leaf)
        # the outputs reverse mode differentiates (a permutation matrix of lu, a float, requires no grad), and the
        # same outputs' tangents below, so that each cotangent meets its own output's tangent
        keep = [k for k, o in enumerate(_outputs(out, info)) if isinstance(o, torch.Tensor) and o.requires_grad]
        outs = [_outputs(out, info)[k] for k in keep]
        cotangents = [torch.from_numpy(_random_values(rng, o.shape, o.is_complex())) for o in outs]
        inputs = [made[k] for k in wanted if k in made]
        grads = torch.autograd.grad(outs, inputs, cotangents, allow_unused=True)
        with torch_fwad.dual_level():
            def dual(k):
                t = torch.from_numpy(arrays[k].copy())
                return torch_fwad.make_dual(t, torch.from_numpy(tangents[k].copy())) if k in tangents else t

            out_t, _ = _call(info, torch, TF, args, kwargs, arrays, dual)
            jvps = [torch_fwad.unpack_dual(_outputs(out_t, info)[k]).tangent for k in keep]
    except (RuntimeError, NotImplementedError):
        return True
    forward = sum(_pairing(u.numpy(), t.detach().resolve_conj().numpy()) for u, t in zip(cotangents, jvps)
                  if t is not None and not t._is_zerotensor())
    reverse = sum(_pairing(g.numpy(), tangents[k]) for k, g in zip([k for k in wanted if k in made], grads)
                  if g is not None)
    return abs(forward - reverse) <= 1e-8 * (1 + abs(forward) + abs(reverse))


def _tilewise_vjp(info, args, kwargs, arrays, wanted, rng):
    def make(k):
        t = tw.from_numpy(arrays[k].copy())
        return t.requires_grad_() if k in wanted else t

    out, made = _call(info, tw, F, args, kwargs, arrays, make)
    keep = [k for k, o in enumerate(_outputs(out, info)) if _differentiable(o) and o.requires_grad]
    outs = [_outputs(out, info)[k] for k in keep]
    inputs = [made[k] for k in wanted if k in made]
    if not outs or not inputs:
        return [], {}
    cotangents = [tw.from_numpy(_random_values(rng, o.shape, o.dtype.is_complex)) for o in outs]
    grads = tw.autograd.grad(outs, inputs, cotangents, allow_unused=True)
    return list(zip(keep, cotangents)), dict(zip([k for k in wanted if k in made], grads))


def _pairing(a, b) -> float:
    """Re <a, b> = Re sum(conj(a) * b), the real inner product forward and reverse mode agree on."""
    return float(np.real(np.vdot(np.asarray(a).ravel(), np.asarray(b).ravel())))


@pytest.mark.parametrize("info", DIFFERENTIABLE, ids=[i.name for i in DIFFERENTIABLE])
def test_jvp_agrees_with_vjp(info):
    for n, sample in enumerate(info.samples()):
        args, kwargs, arrays, wanted, tangents = _inputs(info, sample, seed=n)
        if not wanted:
            continue
        rng = np.random.default_rng(1000 + n)
        pairs, grads = _tilewise_vjp(info, args, kwargs, arrays, wanted, rng)
        if not pairs:
            continue
        jvp_outs, _ = _tilewise_jvp(info, args, kwargs, arrays, tangents)
        forward = 0.0
        for k, u in pairs:  # each cotangent with its own output's tangent (outputs requiring no grad have none)
            t = jvp_outs[k][1]
            if t is not None:
                forward += _pairing(u.numpy(), t.detach().numpy())
        reverse = sum(_pairing(g.detach().numpy(), tangents[k]) for k, g in grads.items() if g is not None)
        if not (np.isfinite(forward) and np.isfinite(reverse)):
            continue  # a sample about NaN or inf (the comparison with torch checks where they appear)
        scale = 1.0 + abs(forward) + abs(reverse)
        exact = all(arrays[k].dtype in (np.float64, np.complex128) for k in wanted)  # else float32 rounding
        if (info.name, sample.name) in NOT_ADJOINT:
            continue
        if abs(forward - reverse) > (1e-10 if exact else 1e-5) * scale and \
                not _torch_is_self_adjoint(info, args, kwargs, arrays, wanted, tangents, np.random.default_rng(n)):
            continue
        assert abs(forward - reverse) <= (1e-10 if exact else 1e-5) * scale, \
            f"{info.name}[{sample.name or n}]: <u, J v> = {forward!r} but <J^T u, v> = {reverse!r}"


@pytest.mark.parametrize("info", DIFFERENTIABLE, ids=[i.name for i in DIFFERENTIABLE])
def test_jvp_matches_torch_func(info):
    """Each entry's first sample; the slow test below runs every sample."""
    _check_against_torch(info, info.samples()[:1])


@pytest.mark.slow
@pytest.mark.parametrize("info", DIFFERENTIABLE, ids=[i.name for i in DIFFERENTIABLE])
def test_jvp_matches_torch_func_on_every_sample(info):
    _check_against_torch(info, info.samples())


def _check_against_torch(info, samples: list):
    if info.name in TORCH_FORWARD_INEXACT:
        return _check_against_finite_differences(info)
    for n, sample in enumerate(samples):
        args, kwargs, arrays, wanted, tangents = _inputs(info, sample, seed=n)
        if not wanted:
            continue
        ours, made = _tilewise_jvp(info, args, kwargs, arrays, tangents)
        try:
            theirs = _torch_jvp(info, args, kwargs, arrays, tangents)
        except (NotImplementedError, RuntimeError):
            continue  # torch has no forward rule for it (or fails inside one): the vjp test still checks ours
        for k, ((o, t), e) in enumerate(zip(ours, theirs)):
            if e is None or not _differentiable(o):
                continue
            where = f"{info.name}[{sample.name or n}] output {k}"
            expected = e.detach().resolve_conj()
            if expected._is_zerotensor():
                expected = torch.zeros(expected.shape, dtype=expected.dtype)
            if t is None:  # no tangent is a zero tangent
                assert not expected.numpy().any(), f"{where}: no tangent, torch's is {e}"
                continue
            np.testing.assert_allclose(t.detach().numpy(), expected.numpy(), rtol=1e-7, atol=1e-9, equal_nan=True,
                                       err_msg=where)


def _torch_jvp(info, args, kwargs, arrays, tangents) -> list:
    import torch.nn.functional as TF

    with torch_fwad.dual_level():
        def make(k):
            t = torch.from_numpy(arrays[k].copy())
            return torch_fwad.make_dual(t, torch.from_numpy(tangents[k].copy())) if k in tangents else t

        out, _ = _call(info, torch, TF, args, kwargs, arrays, make)
        return [torch_fwad.unpack_dual(o).tangent if isinstance(o, torch.Tensor) else None for o in _outputs(out, info)]


def _shifted_outputs(info, args, kwargs, arrays, tangents, step: float) -> list:
    shifted = [arrays[k] + step * tangents[k] if k in tangents else arrays[k] for k in range(len(arrays))]
    out, _ = _call(info, tw, F, args, kwargs, arrays, lambda k: tw.from_numpy(np.array(shifted[k])))
    return _outputs(out, info)


def _check_against_finite_differences(info):
    step = 1e-6
    for n, sample in enumerate(info.samples()):
        args, kwargs, arrays, wanted, tangents = _inputs(info, sample, seed=n)
        ours, _ = _tilewise_jvp(info, args, kwargs, arrays, tangents)
        above = _shifted_outputs(info, args, kwargs, arrays, tangents, step)
        below = _shifted_outputs(info, args, kwargs, arrays, tangents, -step)
        for (o, t), plus, minus in zip(ours, above, below):
            if _differentiable(o) and t is not None:
                difference = (plus.numpy() - minus.numpy()) / (2 * step)
                np.testing.assert_allclose(t.detach().numpy(), difference, rtol=1e-5, atol=1e-6,
                                           err_msg=f"{info.name}[{n}]: {TORCH_FORWARD_INEXACT[info.name]}")


def test_every_operator_with_a_derivative_has_a_forward_rule():
    from tilewise.ops.registry import OPS

    missing = [op.full_name for op in OPS.values() if any(f is not None for f in op.derivatives.values())
               and fwAD.forward_rule_kind(op) is None]
    assert not missing, missing


# ---------------------------------------------------------------------------- the forward_ad API

def test_dual_level_api_matches_torch():
    p, t = np.random.default_rng(0).standard_normal((2, 3))
    with fwAD.dual_level(), torch_fwad.dual_level():
        x, tx = fwAD.make_dual(tw.tensor(p), tw.tensor(t)), torch_fwad.make_dual(torch.tensor(p), torch.tensor(t))
        y, ty = fwAD.unpack_dual((x * x).exp().sum()), torch_fwad.unpack_dual((tx * tx).exp().sum())
        assert type(y).__name__ == "UnpackedDualTensor" and y._fields == ("primal", "tangent")
        np.testing.assert_allclose(y.tangent.numpy(), ty.tangent.numpy(), rtol=1e-12)
        assert fwAD.unpack_dual(x.argmax()).tangent is None
        assert fwAD.unpack_dual(x.detach()).tangent is None
        with tw.no_grad():  # forward AD ignores grad mode, as torch's
            np.testing.assert_allclose(fwAD.unpack_dual(x * 2).tangent.numpy(), 2 * t)
        z = tw.zeros(3, dtype=tw.float64)
        z.copy_(x)
        np.testing.assert_allclose(fwAD.unpack_dual(z).tangent.numpy(), t)
        z.mul_(x)  # d(x * x) = 2 x t
        np.testing.assert_allclose(fwAD.unpack_dual(z).tangent.numpy(), 2 * p * t, rtol=1e-12)
    assert fwAD.unpack_dual(x).tangent is None  # leaving the level drops every tangent at it


@pytest.mark.parametrize("case", ["nested", "no_level", "shape", "integer"])
def test_dual_level_errors_match_torch(case):
    def run(lib, ad):
        p = lib.zeros(3, dtype=lib.float64)
        if case == "no_level":
            return ad.make_dual(p, p)
        with ad.dual_level():
            if case == "nested":
                with ad.dual_level():
                    pass
            elif case == "shape":
                ad.make_dual(p, lib.zeros(4, dtype=lib.float64))
            else:
                ad.make_dual(lib.arange(3), lib.arange(3))

    with pytest.raises(Exception) as expected:
        run(torch, torch_fwad)
    with pytest.raises(type(expected.value), match=str(expected.value)[:40].replace("[", r"\[")):
        run(tw, fwAD)


def test_forward_over_reverse_reads_saved_outputs():
    """Backward formulas that read the op's result (exp, tanh, softmax) must see the result's tangent: an HVP."""
    p, v = np.random.default_rng(1).standard_normal((2, 4))
    with fwAD.dual_level():
        x = fwAD.make_dual(tw.tensor(p).requires_grad_(), tw.tensor(v))
        (g,) = tw.autograd.grad((x.exp().tanh() * tw.softmax(x, 0)).sum(), x, create_graph=True)
        ours = fwAD.unpack_dual(g).tangent.detach().numpy()
    hvp = torch.autograd.functional.hvp(lambda y: (y.exp().tanh() * torch.softmax(y, 0)).sum(), torch.tensor(p),
                                        torch.tensor(v))[1]
    np.testing.assert_allclose(ours, hvp.numpy(), rtol=1e-10)


def test_table_has_samples_with_tangents():
    """The sweep above is not vacuous: most of the table's differentiable entries take a tangent."""
    with_tangents = [info for info in DIFFERENTIABLE if any(isinstance(a, T) for a in info.samples()[0].args)]
    assert len(with_tangents) > 300

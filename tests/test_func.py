"""tilewise.func against torch.func: each transform on small functions and an MLP, compositions, has_aux, argnums
tuples, functional_call, and torch's errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.func as TF

import tilewise as tw
import tilewise.func as F


def _pair(*shape, seed=0):
    a = np.random.default_rng(seed).standard_normal(shape)
    return tw.tensor(a), torch.tensor(a)


def _close(ours, theirs, rtol=1e-10, atol=1e-12):
    if isinstance(theirs, (tuple, list)):
        assert isinstance(ours, (tuple, list)) and len(ours) == len(theirs)
        for o, t in zip(ours, theirs):
            _close(o, t, rtol, atol)
        return
    if isinstance(theirs, dict):
        assert set(ours) == set(theirs)
        for k in theirs:
            _close(ours[k], theirs[k], rtol, atol)
        return
    assert tuple(ours.shape) == tuple(theirs.shape), (ours.shape, theirs.shape)
    np.testing.assert_allclose(ours.detach().numpy(), theirs.detach().numpy(), rtol=rtol, atol=atol)


def f_scalar(lib):
    return lambda x: (x.sin() * x.exp()).sum() + (x * x).prod()


def f_vector(lib):
    return lambda x: lib.tanh(x.unsqueeze(0) * x.unsqueeze(1)).sum(0) + x.exp()


def f_two(lib):
    return lambda x, y: (x.unsqueeze(1) * y).sin().sum(0)


def f_scalar_two(lib):
    return lambda x, y: ((x.unsqueeze(1) * y).sin() ** 2).sum()


# ---------------------------------------------------------------------------- single transforms

def test_grad_and_value_match_torch():
    x, xt = _pair(5)
    _close(F.grad(f_scalar(tw))(x), TF.grad(f_scalar(torch))(xt))
    _close(F.grad_and_value(f_scalar(tw))(x), TF.grad_and_value(f_scalar(torch))(xt))


@pytest.mark.parametrize("argnums", [0, 1, (0, 1), (1, 0), -1])
def test_grad_argnums(argnums):
    (x, xt), (y, yt) = _pair(3), _pair(4, seed=1)
    _close(F.grad(f_scalar_two(tw), argnums)(x, y), TF.grad(f_scalar_two(torch), argnums)(xt, yt))


def test_grad_with_respect_to_a_dict_and_aux():
    params = {"w": _pair(3, 2), "b": _pair(2, seed=1)}
    ours = {k: v[0] for k, v in params.items()}
    theirs = {k: v[1] for k, v in params.items()}
    x, xt = _pair(4, 3, seed=2)

    def loss(lib):
        def fn(p, x):
            h = (x @ p["w"] + p["b"]).tanh()
            return (h * h).mean(), {"h": h}

        return fn

    g, aux = F.grad(loss(tw), has_aux=True)(ours, x)
    gt, auxt = TF.grad(loss(torch), has_aux=True)(theirs, xt)
    _close(g, gt)
    _close(aux, auxt)
    assert not aux["h"].requires_grad and not g["w"].requires_grad


def test_vjp_matches_torch():
    (x, xt), (y, yt) = _pair(3), _pair(4, seed=1)
    out, pull = F.vjp(f_two(tw), x, y)
    outt, pullt = TF.vjp(f_two(torch), xt, yt)
    _close(out, outt)
    u, ut = _pair(4, seed=3)
    _close(pull(u), pullt(ut))
    _close(pull(u * 2), pullt(ut * 2))  # the pullback can be called again
    assert not out.requires_grad


def test_vjp_has_aux():
    x, xt = _pair(3)
    out, pull, aux = F.vjp(lambda x: (x.sin(), x.cos()), x, has_aux=True)
    outt, pullt, auxt = TF.vjp(lambda x: (x.sin(), x.cos()), xt, has_aux=True)
    _close((out, aux), (outt, auxt))
    _close(pull(tw.ones(3, dtype=tw.float64)), pullt(torch.ones(3, dtype=torch.float64)))


def test_jvp_matches_torch():
    (x, xt), (v, vt) = _pair(4), _pair(4, seed=1)
    _close(F.jvp(f_vector(tw), (x,), (v,)), TF.jvp(f_vector(torch), (xt,), (vt,)))
    (y, yt), (w, wt) = _pair(5, seed=2), _pair(5, seed=3)
    _close(F.jvp(f_two(tw), (x, y), (v, w)), TF.jvp(f_two(torch), (xt, yt), (vt, wt)))


def test_jvp_has_aux_and_leaves_no_tangent():
    (x, xt), (v, vt) = _pair(4), _pair(4, seed=1)
    out, tangent, aux = F.jvp(lambda x: (x.exp(), x * 2), (x,), (v,), has_aux=True)
    outt, tangentt, auxt = TF.jvp(lambda x: (x.exp(), x * 2), (xt,), (vt,), has_aux=True)
    _close((out, tangent, aux), (outt, tangentt, auxt))
    assert tw.autograd.forward_ad.unpack_dual(out).tangent is None


@pytest.mark.parametrize("transform", ["jacrev", "jacfwd"])
def test_jacobians_match_torch(transform):
    (x, xt), (y, yt) = _pair(3), _pair(4, seed=1)
    ours, theirs = getattr(F, transform), getattr(TF, transform)
    _close(ours(f_vector(tw))(x), theirs(f_vector(torch))(xt))
    _close(ours(f_two(tw), argnums=(0, 1))(x, y), theirs(f_two(torch), argnums=(0, 1))(xt, yt))
    _close(ours(f_two(tw), argnums=1)(x, y), theirs(f_two(torch), argnums=1)(xt, yt))
    two_outputs = (lambda lib: lambda x: (x.sin(), {"sq": x.unsqueeze(0) * x.unsqueeze(1)}))
    _close(ours(two_outputs(tw))(x), theirs(two_outputs(torch))(xt))


@pytest.mark.parametrize("transform", ["jacrev", "jacfwd"])
def test_jacobian_has_aux(transform):
    x, xt = _pair(3)
    jac, aux = getattr(F, transform)(lambda x: (x.sin(), x.cos()), has_aux=True)(x)
    jact, auxt = getattr(TF, transform)(lambda x: (x.sin(), x.cos()), has_aux=True)(xt)
    _close((jac, aux), (jact, auxt))


def test_hessian_matches_torch():
    x, xt = _pair(4)
    _close(F.hessian(f_scalar(tw))(x), TF.hessian(f_scalar(torch))(xt), rtol=1e-9)
    (y, yt) = _pair(2, seed=1)
    _close(F.hessian(f_scalar_two(tw), argnums=(0, 1))(x, y), TF.hessian(f_scalar_two(torch), argnums=(0, 1))(xt, yt),
           rtol=1e-9)


# ---------------------------------------------------------------------------- compositions

@pytest.mark.parametrize("outer,inner", [("jacfwd", "jacrev"), ("jacrev", "jacfwd"), ("jacrev", "jacrev"),
                                         ("jacfwd", "jacfwd")])
def test_second_derivatives_compose(outer, inner):
    x, xt = _pair(4)
    ours = getattr(F, outer)(getattr(F, inner)(f_scalar(tw)))(x)
    theirs = getattr(TF, outer)(getattr(TF, inner)(f_scalar(torch)))(xt)
    _close(ours, theirs, rtol=1e-9)
    assert not ours.requires_grad


def test_grad_of_grad_and_perturbation_confusion():
    x, xt = _pair(1)
    x, xt = x[0], xt[0]
    _close(F.grad(F.grad(lambda x: x.sin() * x.exp()))(x), TF.grad(TF.grad(lambda x: x.sin() * x.exp()))(xt))

    def confused(lib, fg):  # d/dx [x * d/dy (x * y)] = d/dx [x * x] = 2x: the inner grad must not see the outer x
        return fg(lambda x: x * fg(lambda y: x * y)(x))

    _close(confused(tw, F.grad)(x), confused(torch, TF.grad)(xt))
    _close(confused(tw, F.grad)(x), 2 * xt)


def test_nested_jvp_levels_are_separate():
    (x, xt), (v, vt) = _pair(3), _pair(3, seed=1)

    def second(lib, fj, vv):
        return lambda x: fj(lambda x: fj(lambda y: (y * y * x).sin(), (x,), (vv,))[1], (x,), (vv,))[1]

    _close(second(tw, F.jvp, v)(x), second(torch, TF.jvp, vt)(xt))


def test_hvp_by_jvp_of_grad():
    (x, xt), (v, vt) = _pair(5), _pair(5, seed=1)
    _close(F.jvp(F.grad(f_scalar(tw)), (x,), (v,)), TF.jvp(TF.grad(f_scalar(torch)), (xt,), (vt,)))


def test_grad_of_a_jvp():
    (x, xt), (v, vt) = _pair(4), _pair(4, seed=1)
    ours = F.grad(lambda x: F.jvp(lambda y: y.exp().sum() * y.sin().sum(), (x,), (v,))[1])(x)
    theirs = TF.grad(lambda x: TF.jvp(lambda y: y.exp().sum() * y.sin().sum(), (x,), (vt,))[1])(xt)
    _close(ours, theirs)


def test_transforms_keep_the_callers_graph():
    """An input that requires grad stays differentiable through the transform's result, as with torch.func."""
    x, xt = _pair(3)
    x.requires_grad_()
    xt.requires_grad_()
    g, gt = F.grad(f_scalar(tw))(x), TF.grad(f_scalar(torch))(xt)
    assert g.requires_grad and gt.requires_grad
    _close(tw.autograd.grad(g.sum(), x)[0], torch.autograd.grad(gt.sum(), xt)[0])


# ---------------------------------------------------------------------------- an MLP through functional_call

def _mlps():
    torch.manual_seed(0)
    theirs = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2)).double()
    ours = tw.nn.Sequential(tw.nn.Linear(3, 8), tw.nn.Tanh(), tw.nn.Linear(8, 2)).double()
    ours.load_state_dict({k: tw.tensor(v.detach().numpy()) for k, v in theirs.state_dict().items()})
    return ours, theirs


def test_mlp_parameter_gradients_per_sample_and_jacobian():
    ours, theirs = _mlps()
    params = {k: v.detach() for k, v in ours.named_parameters()}
    params_t = {k: v.detach() for k, v in theirs.named_parameters()}
    x, xt = _pair(5, 3, seed=4)
    y, yt = _pair(5, 2, seed=5)

    def loss(lib, fc, model):
        return lambda p, x, y: ((fc(model, p, (x,)) - y) ** 2).mean()

    _close(F.grad(loss(tw, F.functional_call, ours))(params, x, y),
           TF.grad(loss(torch, TF.functional_call, theirs))(params_t, xt, yt))
    _close(F.jacrev(lambda x: F.functional_call(ours, params, (x,)))(x[0]),
           TF.jacrev(lambda x: TF.functional_call(theirs, params_t, (x,)))(xt[0]))
    _close(F.jacfwd(lambda p: F.functional_call(ours, p, (x[0],)))(params),
           TF.jacfwd(lambda p: TF.functional_call(theirs, p, (xt[0],)))(params_t))
    for p in ours.parameters():  # the module's own parameters are back in place and untouched
        assert p.grad is None and isinstance(p, tw.nn.Parameter)


class _Tied:
    @staticmethod
    def make(lib):
        class M(lib.nn.Module):
            def __init__(self):
                super().__init__()
                self.l = lib.nn.Linear(2, 2)
                self.register_buffer("b", lib.ones(2))
                self.tied = self.l

            def forward(self, x):
                return self.l(x) + self.b

        return M()


@pytest.mark.parametrize("case", ["tied", "untied", "strict_missing", "strict_unexpected", "ambiguous", "tied_twice"])
def test_functional_call_matches_torch(case):
    def run(lib, fc):
        m = _Tied.make(lib)
        z = lib.zeros(2, 2)
        x = lib.ones(2)
        if case == "tied":
            return fc(m, {"tied.weight": z}, (x,)) - m.l.bias
        if case == "untied":
            return fc(m, {"tied.weight": z}, x, tie_weights=False) - m.l.bias
        if case == "strict_missing":
            return fc(m, {"l.weight": z}, (x,), strict=True)
        if case == "strict_unexpected":
            return fc(m, {"l.weight": z, "zz": z}, (x,), strict=True)
        if case == "ambiguous":
            return fc(m, ({"l.weight": z}, {"l.weight": z}), (x,))
        return fc(m, {"l.weight": z, "tied.weight": lib.ones(2, 2)}, (x,))

    try:
        expected = run(torch, TF.functional_call)
    except Exception as exc:  # noqa: BLE001 — the error is the expected result
        with pytest.raises(type(exc)) as ours:
            run(tw, F.functional_call)
        assert str(ours.value) == str(exc)
        return
    np.testing.assert_allclose(run(tw, F.functional_call).detach().numpy(), expected.detach().numpy())


# ---------------------------------------------------------------------------- errors, in torch's words

X = np.arange(3.0)


def _error_cases(lib, transforms):
    x = lib.tensor(X)
    return {
        "not_scalar": lambda: transforms.grad(lambda x: x * 2)(x),
        "aux_not_tuple": lambda: transforms.grad(lambda x: x.sum(), has_aux=True)(x),
        "aux_wrong_length": lambda: transforms.grad(lambda x: (x.sum(), 1, 2), has_aux=True)(x),
        "argnum_range": lambda: transforms.grad(lambda x, y: x.sum(), argnums=2)(x, x),
        "argnum_negative": lambda: transforms.grad(lambda x, y: x.sum(), argnums=-3)(x, x),
        "argnums_empty": lambda: transforms.grad(lambda x, y: x.sum(), argnums=())(x, x),
        "argnums_type": lambda: transforms.grad(lambda x, y: x.sum(), argnums=1.0)(x, x),
        "argnums_repeat": lambda: transforms.grad(lambda x, y: x.sum(), argnums=(0, 0))(x, x),
        "not_tensor_input": lambda: transforms.grad(lambda x: x.sum())(3.0),
        "not_tensor_output": lambda: transforms.grad(lambda x: 3.0)(x),
        "no_inputs": lambda: transforms.grad(lambda: x.sum())(),
        "jvp_primals_tuple": lambda: transforms.jvp(lambda x: x, x, x),
        "jvp_structure": lambda: transforms.jvp(lambda x: x, (x,), (x, x)),
        "jvp_tangent_shape": lambda: transforms.jvp(lambda x: x, (x,), (lib.tensor(np.arange(4.0)),)),
        "jvp_output": lambda: transforms.jvp(lambda x: 3, (x,), (x,)),
        "jvp_aux": lambda: transforms.jvp(lambda x: x, (x,), (x,), has_aux=True),
        "jvp_integer": lambda: transforms.jvp(lambda x: x, (lib.arange(3),), (lib.arange(3),)),
        "vjp_output": lambda: transforms.vjp(lambda x: 3, x),
        "vjp_aux": lambda: transforms.vjp(lambda x: x, x, has_aux=True),
        "jacrev_argnums": lambda: transforms.jacrev(lambda x: x, argnums=3)(x),
        "jacfwd_argnums": lambda: transforms.jacfwd(lambda x: x, argnums=3)(x),
        "jacrev_output": lambda: transforms.jacrev(lambda x: 3)(x),
        "jacfwd_aux": lambda: transforms.jacfwd(lambda x: x, has_aux=True)(x),
        "grad_integer": lambda: transforms.grad(lambda x: x.sum())(lib.arange(3)),
    }


@pytest.mark.parametrize("case", list(_error_cases(torch, TF)))
def test_errors_match_torch(case):
    with pytest.raises(Exception) as expected:
        _error_cases(torch, TF)[case]()
    with pytest.raises(type(expected.value)) as ours:
        _error_cases(tw, F)[case]()
    def words(exc):  # torch wraps a long tree spec over lines
        return " ".join(str(exc.value).replace("tilewise", "torch").split())

    assert words(ours) == words(expected)


def test_vjp_cotangent_shape_error():
    x, xt = _pair(3)
    with pytest.raises(RuntimeError, match=r"Mismatch in shape: grad_output\[0\] has a shape of"):
        F.vjp(lambda x: x, x)[1](tw.zeros(4, dtype=tw.float64))
    with pytest.raises(RuntimeError, match=r"Mismatch in shape: grad_output\[0\] has a shape of"):
        TF.vjp(lambda x: x, xt)[1](torch.zeros(4, dtype=torch.float64))


def test_vmap_is_exported_lazily():
    try:
        import tilewise.func._vmap  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError):
            F.vmap  # noqa: B018
    else:
        assert callable(F.vmap)
    with pytest.raises(AttributeError):
        F.not_a_transform  # noqa: B018


@pytest.mark.parametrize("transform", ["grad", "jvp", "hessian", "jacrev"])
def test_compile_of_a_transformed_function_is_one_program(transform):
    """The capture records the transform's forward and backward (or tangent) operators into one graph: no graph
    break (fullgraph), one program, and the replayed call agrees with torch.func too."""
    (x, xt), (v, vt) = _pair(4), _pair(4, seed=1)
    ours, theirs = {
        "grad": (F.grad(f_scalar(tw)), TF.grad(f_scalar(torch))),
        "jvp": (lambda x, v: F.jvp(f_vector(tw), (x,), (v,)), lambda x, v: TF.jvp(f_vector(torch), (x,), (v,))),
        "hessian": (F.hessian(f_scalar(tw)), TF.hessian(f_scalar(torch))),
        "jacrev": (F.jacrev(f_vector(tw)), TF.jacrev(f_vector(torch))),
    }[transform]
    args, targs = ((x, v), (xt, vt)) if transform == "jvp" else ((x,), (xt,))
    compiled = tw.compile(ours, fullgraph=True)
    expected = theirs(*targs)
    _close(compiled(*args), expected, rtol=1e-9)
    _close(compiled(*args), expected, rtol=1e-9)  # replayed
    assert len(compiled.programs()) == 1


# ---------------------------------------------------------------------------- tilewise.autograd.functional

@pytest.mark.parametrize("api", ["vjp", "jvp", "jacobian", "jacobian_forward", "hessian", "hvp", "vhp"])
def test_autograd_functional_matches_torch(api):
    (x, xt), (y, yt) = _pair(3), _pair(3, seed=1)
    (u, ut), (w, wt) = _pair(3, seed=2), _pair(3, seed=3)

    def two(lib):
        return lambda a, b: ((a * b).sin(), (a.exp() * b).sum())

    def scalar(lib):
        return lambda a, b: (a.sin() * b.exp()).sum() + (a * a * b).sum()

    def call(lib, ns, a, b, c, d):
        if api == "vjp":
            return ns.vjp(two(lib), (a, b), (c, d.sum()))
        if api == "jvp":
            return ns.jvp(two(lib), (a, b), (c, d))
        if api == "jacobian":
            return ns.jacobian(two(lib), (a, b))
        if api == "jacobian_forward":
            return ns.jacobian(two(lib), (a, b), vectorize=True, strategy="forward-mode")
        if api == "hessian":
            return ns.hessian(scalar(lib), (a, b))
        return getattr(ns, api)(scalar(lib), (a, b), (c, d))

    ours = call(tw, tw.autograd.functional, x, y, u, w)
    theirs = call(torch, torch.autograd.functional, xt, yt, ut, wt)
    _close(ours, theirs, rtol=1e-9)


def test_autograd_functional_forward_mode_needs_vectorize_as_in_torch():
    for lib in (torch, tw):
        with pytest.raises(NotImplementedError, match="only implemented for `vectorize=True`"):
            lib.autograd.functional.jacobian(lambda a: a.sin(), lib.ones(2), strategy="forward-mode")


@pytest.mark.cuda
def test_transforms_on_cuda_match_the_cpu():
    x, _ = _pair(5)
    v, _ = _pair(5, seed=1)
    xc, vc = x.to("cuda"), v.to("cuda")
    _close(F.jvp(F.grad(f_scalar(tw)), (xc,), (vc,))[1].cpu(), F.jvp(F.grad(f_scalar(tw)), (x,), (v,))[1])
    _close(F.jacfwd(f_vector(tw))(xc).cpu(), F.jacrev(f_vector(tw))(x))
    _close(F.hessian(f_scalar(tw))(xc).cpu(), F.hessian(f_scalar(tw))(x), rtol=1e-9)


def test_per_example_gradients_compile_into_one_program():
    """vmap(grad(loss)) under tilewise.compile with fullgraph=True: one program, eager's per-example gradients."""
    import tilewise.nn.functional as nnf
    from tilewise.func import grad, vmap

    rng = np.random.default_rng(0)
    params = [tw.tensor(rng.standard_normal(s).astype(np.float32) * 0.1) for s in [(16, 8), (16,), (3, 16), (3,)]]

    def loss(p, x, y):
        h = nnf.relu(nnf.linear(x.unsqueeze(0), p[0], p[1]))
        return nnf.cross_entropy(nnf.linear(h, p[2], p[3]), y.unsqueeze(0))

    xs = tw.tensor(rng.standard_normal((12, 8)).astype(np.float32))
    ys = tw.tensor(rng.integers(0, 3, 12))
    per_example = vmap(grad(loss), in_dims=(None, 0, 0))
    compiled = tw.compile(per_example, fullgraph=True)
    for _ in range(2):  # the first call compiles, the second replays the program
        got = compiled(params, xs, ys)
    for a, b in zip(got, per_example(params, xs, ys)):
        assert a.shape == b.shape and a.shape[0] == 12
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-6)

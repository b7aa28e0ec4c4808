"""Every option of every tilewise optimizer against torch.optim over 15 steps of a model with four kinds of
parameter group (one trained, one whose gradients are always zero, one whose gradients are None at some steps, one
frozen), comparing the parameters and every state entry (names, dtypes, shapes, values); the state dicts of the two
libraries entry by entry; tilewise's state dict loaded into a fresh optimizer; ``add_param_group`` mid-training;
``zero_grad(set_to_none=False)``; checkpoints of older torch versions; float64 to the last bits, ``fused`` on the CPU,
hypergradients of a tensor ``lr``, LBFGS and Muon; torch's errors for invalid options. The LR schedulers with their
non-default options are at the end (rates, momenta, state dicts and param groups after every step, resume, warnings).
What test_optim_breadth.py and test_optim_schedulers.py cover is not repeated here.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import tilewise as tw

STEPS = 15
SHAPES = [[(4, 3), (4,)], [(3,)], [(2, 2)], [(5,)]]  # trained, zero gradients, gradients None at times, frozen
ZERO, SOMETIMES, FROZEN = 1, 2, 3


def _data(steps: int = STEPS, dtype: str = "float32"):
    rng = np.random.default_rng(35)
    init = [[rng.standard_normal(s).astype(dtype) for s in group] for group in SHAPES]
    target = [[rng.standard_normal(s).astype(dtype) for s in group] for group in SHAPES]
    noise = [[[rng.standard_normal(s).astype(dtype) * 0.3 for s in group] for group in SHAPES] for _ in range(steps)]
    return init, target, noise


def _value(lib, v):
    """Option values that are tensors in both libraries: ``("tensor", x)`` becomes a 0-dim tensor of each."""
    if isinstance(v, tuple) and v and v[0] == "tensor":
        return lib.tensor(v[1])
    if isinstance(v, tuple):
        return tuple(_value(lib, x) for x in v)
    return v


def _kwargs(lib, kwargs):
    return {k: _value(lib, v) for k, v in kwargs.items()}


def _make(lib, name, kwargs, group_options=None, dtype="float32", steps=STEPS):
    init, target, noise = _data(steps, dtype)
    params = [[lib.nn.Parameter(lib.tensor(a.copy())) for a in group] for group in init]
    if kwargs.get("differentiable"):  # a differentiable step updates tensors inside a graph, not leaves
        params = [[p.clone() for p in group] for group in params]
    for k, p in enumerate(params[FROZEN]):
        params[FROZEN][k] = p.detach().requires_grad_(False)
    group_options = group_options or [{}, {"lr": 0.03}, {}, {}]
    groups = [{"params": ps, **_kwargs(lib, o)} for ps, o in zip(params, group_options)]
    opt = getattr(lib.optim, name)(groups, **_kwargs(lib, kwargs))
    return params, opt, target, noise


def _set_grads(lib, params, target, noise, t):
    for g, group in enumerate(params):
        for k, p in enumerate(group):
            if g == FROZEN:
                continue
            if g == ZERO:
                p.grad = lib.zeros_like(p)
            elif g == SOMETIMES and t % 3 == 1:
                p.grad = None
            else:
                p.grad = ((p.detach() - lib.tensor(target[g][k])) * 2 + lib.tensor(noise[t][g][k])).to(p.dtype)


def _run(lib, name, kwargs, group_options=None, dtype="float32", steps=STEPS, start=0, made=None):
    params, opt, target, noise = made or _make(lib, name, kwargs, group_options, dtype, max(steps, STEPS))
    for t in range(start, steps):
        _set_grads(lib, params, target, noise, t)
        opt.step()
    return params, opt


def _np(x):
    return x.detach().numpy() if hasattr(x, "detach") else np.asarray(x)


def _assert_state_equal(ours: dict, theirs: dict, rtol=2e-6, atol=1e-7):
    """``state`` of two state dicts: the same parameters, entry names in the same order, and each entry's type,
    dtype, shape and value."""
    assert sorted(ours) == sorted(theirs)
    for index in theirs:
        a, b = ours[index], theirs[index]
        assert list(a) == list(b), f"state {index}: entries {list(a)} != torch's {list(b)}"
        for key in b:
            x, y = a[key], b[key]
            if isinstance(y, list):  # LBFGS's histories
                assert isinstance(x, list) and len(x) == len(y), f"state {index}[{key}]: {x!r} != {y!r}"
                _assert_state_equal({0: dict(enumerate(x))}, {0: dict(enumerate(y))}, rtol, atol)
            elif isinstance(y, torch.Tensor):
                assert isinstance(x, tw.Tensor), f"state {index}[{key}] is {type(x).__name__}, torch's a tensor"
                assert _dtype(x) == _dtype(y), f"state {index}[{key}]: {x.dtype} != {y.dtype}"
                assert tuple(x.shape) == tuple(y.shape), f"state {index}[{key}]: {tuple(x.shape)} != {y.shape}"
                np.testing.assert_allclose(_np(x), _np(y), rtol=rtol, atol=atol, err_msg=f"state {index}[{key}]")
            else:
                assert type(x) is type(y), f"state {index}[{key}]: {type(x).__name__} != {type(y).__name__}"
                if y is not None:
                    np.testing.assert_allclose(x, y, rtol=rtol, atol=atol, err_msg=f"state {index}[{key}]")


def _dtype(t) -> str:
    return str(t.dtype).rsplit(".", 1)[-1]


def _plain(v):
    """A param_groups entry as comparable data: tensors as ("tensor", dtype, shape, value)."""
    if isinstance(v, (tw.Tensor, torch.Tensor)):
        return ("tensor", _dtype(v), tuple(v.shape), float(_np(v).reshape(-1)[0]) if v.numel() else None)
    if isinstance(v, (list, tuple)):
        return type(v).__name__, [_plain(x) for x in v]
    return v


def _assert_groups_equal(ours: list, theirs: list):
    assert len(ours) == len(theirs)
    for k, (a, b) in enumerate(zip(ours, theirs)):
        assert list(a) == list(b), f"group {k}: keys {list(a)} != torch's {list(b)}"
        for key in b:
            assert _plain(a[key]) == _plain(b[key]), f"group {k}[{key!r}]: {a[key]!r} != torch's {b[key]!r}"


def _assert_params_close(ours, theirs, rtol=2e-6, atol=1e-7):
    for g, (ga, gb) in enumerate(zip(ours, theirs)):
        for k, (a, b) in enumerate(zip(ga, gb)):
            np.testing.assert_allclose(_np(a), _np(b), rtol=rtol, atol=atol, err_msg=f"group {g} param {k}")


# name -> option sets, each run with foreach=False and foreach=True (compiled) unless it says otherwise
OPTIONS = {
    "SGD": [dict(lr=0.05), dict(lr=0.05, momentum=0.9, dampening=0.5, weight_decay=0.05, maximize=True),
            dict(lr=0.05, momentum=0.8, nesterov=True, weight_decay=0.1), dict(lr=("tensor", 0.05), momentum=0.9),
            dict(lr=0.05, momentum=0.9, differentiable=True),
            dict(lr=0.05, momentum=0.5, weight_decay=("tensor", 0.1), dampening=0.3)],
    "Adam": [dict(lr=0.05, amsgrad=True, weight_decay=0.1), dict(lr=("tensor", 0.05), amsgrad=True, maximize=True),
             dict(lr=0.05, betas=(("tensor", 0.8), ("tensor", 0.95)), eps=1e-3),
             dict(lr=0.05, capturable=True, weight_decay=0.1, decoupled_weight_decay=True, amsgrad=True),
             dict(lr=0.05, differentiable=True, amsgrad=True, weight_decay=0.1),
             dict(lr=0.05, differentiable=True, betas=(("tensor", 0.8), ("tensor", 0.95)), maximize=True)],
    "AdamW": [dict(lr=0.05, amsgrad=True, maximize=True), dict(lr=("tensor", 0.05), weight_decay=0.3, eps=1e-4),
              dict(lr=0.05, capturable=True, betas=(0.5, 0.7)), dict(lr=0.05, differentiable=True, weight_decay=0.3)],
    "Adamax": [dict(lr=0.05, weight_decay=0.1, eps=1e-3), dict(lr=("tensor", 0.05), maximize=True),
               dict(lr=0.05, capturable=True, betas=(0.6, 0.7)), dict(lr=0.05, differentiable=True)],
    "Adagrad": [dict(lr=0.1, lr_decay=0.05, eps=1e-3), dict(lr=("tensor", 0.1), initial_accumulator_value=0.5),
                dict(lr=0.1, weight_decay=0.2, maximize=True, differentiable=True),
                dict(lr=("tensor", 0.1), lr_decay=0.3, weight_decay=0.1)],
    "Adadelta": [dict(lr=0.5, rho=0.5, weight_decay=0.1), dict(lr=("tensor", 0.5), maximize=True, eps=1e-3),
                 dict(lr=0.5, capturable=True), dict(lr=0.5, differentiable=True, weight_decay=0.1)],
    "RMSprop": [dict(lr=0.01, centered=True, momentum=0.5, weight_decay=0.1),
                dict(lr=("tensor", 0.01), centered=True, maximize=True, alpha=0.5),
                dict(lr=0.01, capturable=True, momentum=0.3), dict(lr=0.01, differentiable=True, centered=True),
                dict(lr=0.01, eps=0.1, momentum=0.9)],
    "Rprop": [dict(lr=0.05, etas=(0.4, 1.5), step_sizes=(1e-4, 1.0)), dict(lr=("tensor", 0.05), maximize=True),
              dict(lr=0.05, capturable=True), dict(lr=0.05, differentiable=True)],
    "NAdam": [dict(lr=0.05, momentum_decay=0.1, weight_decay=0.1), dict(lr=("tensor", 0.05), maximize=True),
              dict(lr=0.05, decoupled_weight_decay=True, weight_decay=0.2, capturable=True),
              dict(lr=0.05, differentiable=True, weight_decay=0.1), dict(lr=0.05, eps=1e-2, betas=(0.5, 0.6))],
    "RAdam": [dict(lr=0.05, weight_decay=0.1, betas=(0.5, 0.6)), dict(lr=("tensor", 0.05), maximize=True),
              dict(lr=0.05, decoupled_weight_decay=True, weight_decay=0.2, capturable=True),
              dict(lr=0.05, differentiable=True, eps=1e-3)],
    "ASGD": [dict(lr=0.05, t0=3, lambd=0.01, alpha=0.6, weight_decay=0.1), dict(lr=("tensor", 0.05), maximize=True),
             dict(lr=0.05, capturable=True, t0=5), dict(lr=0.05, differentiable=True, t0=2)],
    "Adafactor": [dict(lr=0.05), dict(lr=("tensor", 0.05), maximize=True, weight_decay=0.1),
                  dict(lr=0.05, eps=(1e-4, 1e-2), beta2_decay=-0.5, d=2.0)],
}
CASES = [(name, kwargs) for name, options in OPTIONS.items() for kwargs in options]
CASE_IDS = [f"{name}-{k}" for name, options in OPTIONS.items() for k in range(len(options))]


def _torch_equivalent(kwargs: dict) -> tuple[dict, dict]:
    """(torch's options for the same run, the param_groups entries that then differ from tilewise's). tilewise
    accepts ``capturable=True`` on the CPU (its step counts and step-dependent factors are device tensors anyway,
    see [Note: optimizers]) where torch refuses a CPU parameter; and a tensor ``lr`` or ``betas`` with
    ``foreach=True`` (the compiled update reads them as run-time values) where torch refuses them without
    ``capturable``: torch runs those as its loop, which computes the same values."""
    theirs, differ = dict(kwargs), {}
    if kwargs.get("capturable"):
        theirs["capturable"], differ["capturable"] = False, True
    tensor_options = any(isinstance(v, tuple) and "tensor" in str(v) for v in kwargs.values())
    if kwargs.get("foreach") and tensor_options:
        theirs["foreach"], differ["foreach"] = False, True
    return theirs, differ


def _assert_same_run(ours: list, opt, theirs: list, topt, differ: dict, rtol=2e-6, atol=1e-7):
    _assert_params_close(ours, theirs, rtol, atol)
    _assert_state_equal(opt.state_dict()["state"], topt.state_dict()["state"], rtol, atol)
    their_groups = [{**g, **{k: v for k, v in differ.items() if k in g}} for g in topt.state_dict()["param_groups"]]
    _assert_groups_equal(opt.state_dict()["param_groups"], their_groups)


@pytest.mark.parametrize("foreach", [False, True], ids=["loop", "foreach"])
@pytest.mark.parametrize("name,kwargs", CASES, ids=CASE_IDS)
def test_parameters_and_every_state_entry_match_torch(name, kwargs, foreach):
    if foreach and kwargs.get("differentiable"):
        pytest.skip("foreach with differentiable is refused (test_optim_breadth.py)")
    kwargs = {**kwargs, "foreach": foreach}
    their_kwargs, differ = _torch_equivalent(kwargs)
    ours, opt = _run(tw, name, kwargs)
    theirs, topt = _run(torch, name, their_kwargs)
    _assert_same_run(ours, opt, theirs, topt, differ)


@pytest.mark.parametrize("name,kwargs", CASES, ids=CASE_IDS)
def test_in_float64_parameters_and_state_match_torch_to_the_last_bits(name, kwargs):
    their_kwargs, differ = _torch_equivalent(kwargs)
    ours, opt = _run(tw, name, kwargs, dtype="float64")
    theirs, topt = _run(torch, name, their_kwargs, dtype="float64")
    _assert_same_run(ours, opt, theirs, topt, differ, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("name,kwargs", [("SGD", dict()), ("SGD", dict(weight_decay=0.1, maximize=True)),
                                         ("Adam", dict(amsgrad=True)), ("Adam", dict(weight_decay=0.1)),
                                         ("AdamW", dict()), ("RAdam", dict()), ("RAdam", dict(betas=(0.5, 0.5)))])
def test_a_learning_rate_that_requires_grad_gets_torchs_hypergradient(name, kwargs):
    """``differentiable=True`` with a tensor ``lr`` that requires grad: the gradient of a loss of the updated
    parameters with respect to the learning rate (for the optimizers whose update torch can differentiate with
    respect to it)."""
    grads = []
    for lib in (tw, torch):
        lr = lib.tensor(0.05, dtype=lib.float64, requires_grad=True)
        start = lib.tensor([0.5, -1.0, 2.0], dtype=lib.float64, requires_grad=True)
        p = start.clone()
        opt = getattr(lib.optim, name)([p], lr=lr, differentiable=True, **kwargs)
        for t in range(3):
            p.grad = ((p * 0.5).exp() * (t + 1) - 1.0).detach()
            opt.step()
        (p * p).sum().backward()
        grads.append((float(lr.grad), start.grad.numpy()))
    assert grads[0][0] == pytest.approx(grads[1][0], rel=1e-12)
    np.testing.assert_allclose(grads[0][1], grads[1][1], rtol=1e-12)


FUSED = [("SGD", dict(lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.1, maximize=True)),
         ("SGD", dict(lr=("tensor", 0.05))),
         ("Adam", dict(lr=0.05, amsgrad=True, maximize=True, weight_decay=0.1)),
         ("Adam", dict(lr=("tensor", 0.05), weight_decay=0.1, decoupled_weight_decay=True)),
         ("Adam", dict(lr=0.05, betas=(("tensor", 0.8), ("tensor", 0.9)), amsgrad=True)),
         ("AdamW", dict(lr=0.05, amsgrad=True, capturable=True)),
         ("Adagrad", dict(lr=0.1, lr_decay=0.05, weight_decay=0.1, initial_accumulator_value=0.2, maximize=True)),
         ("Adagrad", dict(lr=("tensor", 0.1), lr_decay=0.3))]


FUSED_TOLERANCES = {"float16": dict(rtol=2e-3, atol=2e-3), "float32": dict(rtol=1e-5, atol=1e-6),
                    "float64": dict(rtol=1e-12, atol=1e-14)}


@pytest.mark.parametrize("dtype", FUSED_TOLERANCES)
@pytest.mark.parametrize("name,kwargs", FUSED, ids=[f"{n}-{k}" for k, (n, _) in enumerate(FUSED)])
def test_fused_on_the_cpu_matches_torchs_fused(name, kwargs, dtype):
    """In float16 torch's fused kernels compute each update in float32 and round once; the loop rounds at every
    operation, so 15 steps of it drift by several half-precision units where the fused ones agree."""
    kwargs = {**kwargs, "fused": True}
    their_kwargs, differ = _torch_equivalent(kwargs)
    ours, opt = _run(tw, name, kwargs, dtype=dtype)
    theirs, topt = _run(torch, name, their_kwargs, dtype=dtype)
    _assert_same_run(ours, opt, theirs, topt, differ, **FUSED_TOLERANCES[dtype])
    if dtype == "float16":
        mismatched = sum(int((_np(p) != _np(q)).sum()) for g, h in zip(ours, theirs) for p, q in zip(g, h))
        assert mismatched <= 1, f"{mismatched} float16 parameter elements differ from torch's fused update"


@pytest.mark.parametrize("name,kwargs", CASES, ids=CASE_IDS)
def test_a_state_dict_loaded_into_a_new_optimizer_continues_as_torch(name, kwargs):
    """8 steps, the state dict into a fresh optimizer over copies of the parameters, 7 more steps: the same as
    torch's 15 uninterrupted steps."""
    ours, opt = _run(tw, name, kwargs, steps=8)
    saved = opt.state_dict()
    made = _make(tw, name, kwargs)
    for group, trained in zip(made[0], ours):
        for p, q in zip(group, trained):
            with tw.no_grad():
                p.copy_(q)
    made[1].load_state_dict(saved)
    resumed, opt2 = _run(tw, name, kwargs, start=8, made=made)
    their_kwargs, differ = _torch_equivalent(kwargs)
    theirs, topt = _run(torch, name, their_kwargs)
    _assert_same_run(resumed, opt2, theirs, topt, differ)


DEFAULTS = ["SGD", "Adam", "AdamW", "Adamax", "Adagrad", "Adadelta", "RMSprop", "Rprop", "NAdam", "RAdam", "ASGD",
            "Adafactor", "LBFGS", "SparseAdam", "Muon"]


@pytest.mark.parametrize("name", DEFAULTS)
def test_param_groups_and_defaults_hold_torchs_entries(name):
    """A new optimizer's ``defaults`` and state dict: the same keys, in the same order, with the same values
    (``foreach: None``, ``differentiable: False``, ``fused: None`` and the rest)."""
    shape = (3, 3) if name == "Muon" else (3,)
    ours = getattr(tw.optim, name)([tw.nn.Parameter(tw.zeros(shape))])
    theirs = getattr(torch.optim, name)([torch.nn.Parameter(torch.zeros(shape))])
    _assert_groups_equal([ours.defaults], [theirs.defaults])
    _assert_groups_equal(ours.state_dict()["param_groups"], theirs.state_dict()["param_groups"])


@pytest.mark.parametrize("name,kwargs", [("SGD", dict(lr=0.05, momentum=0.9)), ("Adam", dict(lr=0.05, amsgrad=True)),
                                         ("RMSprop", dict(lr=0.01, centered=True)), ("Rprop", dict(lr=0.05)),
                                         ("ASGD", dict(lr=0.05, t0=2)), ("Adafactor", dict(lr=0.05))])
def test_add_param_group_and_zero_grad_keeping_zeros_mid_training(name, kwargs):
    def train(lib):
        params, opt, target, noise = _make(lib, name, kwargs)
        late = lib.nn.Parameter(lib.tensor(np.linspace(-1, 1, 6, dtype="float32").reshape(2, 3)))
        for t in range(STEPS):
            if t == 6:
                opt.add_param_group({"params": [late], "lr": 0.02})
            _set_grads(lib, params, target, noise, t)
            if t >= 6:
                late.grad = late.detach() * 0.5 + 0.1 * t
            opt.step()
            opt.zero_grad(set_to_none=False)
        return params + [[late]], opt

    ours, opt = train(tw)
    theirs, topt = train(torch)
    _assert_params_close(ours, theirs)
    _assert_state_equal(opt.state_dict()["state"], topt.state_dict()["state"])
    _assert_groups_equal(opt.state_dict()["param_groups"], topt.state_dict()["param_groups"])
    for group, tgroup in zip(ours, theirs):
        for p, q in zip(group, tgroup):
            assert (p.grad is None) == (q.grad is None)
            if q.grad is not None:
                assert not _np(p.grad).any()


_NEWER = ("foreach", "maximize", "differentiable")
OLDER_KEYS = {  # the options each torch optimizer's __setstate__ fills in when a checkpoint lacks them
    "SGD": _NEWER + ("nesterov", "fused"),
    "Adam": _NEWER + ("amsgrad", "capturable", "decoupled_weight_decay", "fused"),
    "AdamW": _NEWER + ("amsgrad", "capturable", "decoupled_weight_decay", "fused"), "Adamax": _NEWER + ("capturable",),
    "Adagrad": _NEWER + ("fused",), "Adadelta": _NEWER + ("capturable",),
    "RMSprop": _NEWER + ("capturable", "momentum", "centered"), "Rprop": _NEWER + ("capturable",),
    "NAdam": _NEWER + ("capturable", "decoupled_weight_decay"),
    "RAdam": _NEWER + ("capturable", "decoupled_weight_decay"),
    "ASGD": _NEWER + ("capturable",), "Adafactor": ("foreach",),
}


@pytest.mark.parametrize("name,kwargs", [c for c in CASES if not c[1].get("differentiable")],
                         ids=[i for i, c in zip(CASE_IDS, CASES) if not c[1].get("differentiable")])
def test_a_checkpoint_of_an_older_torch_loads_as_in_torch(name, kwargs):
    """A state dict written before the newer options existed (no ``foreach``, ``maximize``, ``differentiable``,
    ``decoupled_weight_decay`` ...; step counts and NAdam's and ASGD's scalars as Python numbers): each optimizer
    fills in what torch's ``__setstate__`` fills in, in the same order, and continues as torch's does."""
    kwargs = {k: v for k, v in kwargs.items() if k not in OLDER_KEYS[name] and "tensor" not in str(v)}
    _, topt = _run(torch, name, kwargs, steps=8)
    old = topt.state_dict()
    old = {"state": {i: {k: (v.item() if isinstance(v, torch.Tensor) and v.dim() == 0 else v) for k, v in s.items()}
                     for i, s in old["state"].items()},
           "param_groups": [{k: v for k, v in g.items() if k not in OLDER_KEYS[name]} for g in old["param_groups"]]}
    runs = []
    for lib in (tw, torch):
        made = _make(lib, name, kwargs)
        made[1].load_state_dict(old)
        assert all("foreach" in g for g in made[1].param_groups)
        runs.append(_run(lib, name, kwargs, start=8, made=made))
    (ours, opt), (theirs, topt) = runs
    _assert_same_run(ours, opt, theirs, topt, {})


LBFGS_OPTIONS = [dict(lr=0.5, line_search_fn="strong_wolfe", history_size=3, tolerance_change=1e-4),
                 dict(lr=0.2, max_iter=5, max_eval=7, history_size=2, tolerance_grad=1e-3),
                 dict(lr=("tensor", 0.3), max_iter=4), dict(line_search_fn="strong_wolfe", max_iter=3)]


@pytest.mark.parametrize("kwargs", LBFGS_OPTIONS, ids=[str(k) for k in range(len(LBFGS_OPTIONS))])
def test_lbfgs_with_a_frozen_and_a_gradientless_parameter_matches_torch(kwargs):
    """Four steps of up to 20 iterations each, in float64 (in float32 the two libraries' dot products round
    differently, and 80 iterations carry that to the third digit of a small loss)."""

    def train(lib, steps=4, start=None):
        init, target, _ = _data(dtype="float64")
        if start is not None and lib is torch:  # torch's optimizer goes on as it is
            (*trained, unused, frozen), opt = start
        else:
            trained = [lib.nn.Parameter(lib.tensor(a)) for a in init[0]]
            unused = lib.nn.Parameter(lib.tensor(init[ZERO][0]))  # no gradient ever: LBFGS reads zeros
            frozen = lib.nn.Parameter(lib.tensor(init[FROZEN][0]), requires_grad=False)
            if start is not None:
                with lib.no_grad():
                    for p, q in zip(trained + [unused, frozen], start[0]):
                        p.copy_(q)
            opt = lib.optim.LBFGS(trained + [unused, frozen], **_kwargs(lib, kwargs))
            if start is not None:
                opt.load_state_dict(start[1])
        x = lib.tensor(np.linspace(-1, 1, 3))

        def closure():
            opt.zero_grad()
            out = trained[0] @ x + trained[1]
            loss = ((out - lib.tensor(target[0][1])) ** 2).sum() + (trained[0] ** 4).sum() * 0.1
            loss.backward()
            return loss

        losses = [float(opt.step(closure).detach()) for _ in range(steps)]
        return trained + [unused, frozen], opt, losses

    ours, opt, losses = train(tw)
    theirs, topt, tlosses = train(torch)
    np.testing.assert_allclose(losses, tlosses, rtol=1e-9)
    _assert_params_close([ours], [theirs], rtol=1e-9, atol=1e-12)
    _assert_state_equal(opt.state_dict()["state"], topt.state_dict()["state"], rtol=1e-7, atol=1e-10)
    _assert_groups_equal(opt.state_dict()["param_groups"], topt.state_dict()["param_groups"])

    # two more steps of a new optimizer loaded from the state dict, and of torch's own
    resumed, ropt, rlosses = train(tw, steps=2, start=(ours, opt.state_dict()))
    theirs, topt, tlosses = train(torch, steps=2, start=(theirs, topt))
    np.testing.assert_allclose(rlosses, tlosses, rtol=1e-9)
    _assert_params_close([resumed], [theirs], rtol=1e-9, atol=1e-12)
    _assert_state_equal(ropt.state_dict()["state"], topt.state_dict()["state"], rtol=1e-7, atol=1e-10)


MUON = [dict(), dict(adjust_lr_fn="match_rms_adamw", lr=0.02),
        dict(nesterov=False, ns_steps=3, weight_decay=0.0, momentum=0.8),
        dict(adjust_lr_fn="original", eps=1e-3, lr=("tensor", 0.05))]


@pytest.mark.parametrize("kwargs", MUON, ids=[str(k) for k in range(len(MUON))])
def test_muon_with_groups_and_missing_gradients_matches_torch(kwargs):
    """Muon takes matrices only: two groups of them, one whose gradient is None at every third step."""
    rng = np.random.default_rng(3)
    init = [rng.standard_normal(s).astype("float32") for s in [(4, 3), (3, 5), (2, 2)]]

    def train(lib):
        params = [lib.nn.Parameter(lib.tensor(a.copy())) for a in init]
        opt = lib.optim.Muon([{"params": params[:2]}, {"params": params[2:], "lr": 0.01}], **_kwargs(lib, kwargs))
        for t in range(STEPS):
            for k, p in enumerate(params):
                p.grad = None if k == 2 and t % 3 == 1 else p.detach() * 2 + 0.1 * t
            opt.step()
        return params, opt

    (ours, opt), (theirs, topt) = train(tw), train(torch)
    _assert_same_run([ours], opt, [theirs], topt, {})


# ---------------------------------------------------------------------------------------------- errors
def _raises_like_torch(make):
    """``make(lib)`` raises in tilewise what it raises in torch: the same type and message."""
    with pytest.raises(Exception) as expected:
        make(torch)
    with pytest.raises(type(expected.value)) as got:
        make(tw)
    assert str(got.value) == str(expected.value).replace("torch.", "tilewise.")


def _p(lib, shape=(3,)):
    return lib.nn.Parameter(lib.zeros(shape))


ERRORS = {
    "SGD-negative-lr": lambda lib: lib.optim.SGD([_p(lib)], lr=-0.1),
    "SGD-negative-momentum": lambda lib: lib.optim.SGD([_p(lib)], momentum=-0.5),
    "SGD-negative-weight-decay": lambda lib: lib.optim.SGD([_p(lib)], weight_decay=-1.0),
    "SGD-nesterov-without-momentum": lambda lib: lib.optim.SGD([_p(lib)], nesterov=True),
    "SGD-nesterov-with-dampening": lambda lib: lib.optim.SGD([_p(lib)], momentum=0.9, dampening=0.1, nesterov=True),
    "SGD-tensor-lr-of-two": lambda lib: lib.optim.SGD([_p(lib)], lr=lib.tensor([0.1, 0.2])),
    "Adam-beta1": lambda lib: lib.optim.Adam([_p(lib)], betas=(1.0, 0.9)),
    "Adam-beta2": lambda lib: lib.optim.Adam([_p(lib)], betas=(0.9, -0.1)),
    "Adam-eps": lambda lib: lib.optim.Adam([_p(lib)], eps=-1e-8),
    "Adam-negative-lr-tensor": lambda lib: lib.optim.Adam([_p(lib)], lr=lib.tensor(-0.1)),
    "Adam-fused-foreach": lambda lib: lib.optim.Adam([_p(lib)], fused=True, foreach=True),
    "Adam-fused-differentiable": lambda lib: lib.optim.Adam([_p(lib)], fused=True, differentiable=True),
    "AdamW-weight-decay": lambda lib: lib.optim.AdamW([_p(lib)], weight_decay=-0.1),
    "Adamax-beta": lambda lib: lib.optim.Adamax([_p(lib)], betas=(0.9, 1.0)),
    "Adagrad-lr-decay": lambda lib: lib.optim.Adagrad([_p(lib)], lr_decay=-1.0),
    "Adagrad-accumulator": lambda lib: lib.optim.Adagrad([_p(lib)], initial_accumulator_value=-1.0),
    "Adadelta-rho": lambda lib: lib.optim.Adadelta([_p(lib)], rho=1.5),
    "RMSprop-alpha": lambda lib: lib.optim.RMSprop([_p(lib)], alpha=-0.1),
    "RMSprop-momentum": lambda lib: lib.optim.RMSprop([_p(lib)], momentum=-0.1),
    "Rprop-etas": lambda lib: lib.optim.Rprop([_p(lib)], etas=(1.5, 1.2)),
    "NAdam-momentum-decay": lambda lib: lib.optim.NAdam([_p(lib)], momentum_decay=-0.1),
    "RAdam-beta": lambda lib: lib.optim.RAdam([_p(lib)], betas=(0.9, 1.5)),
    "ASGD-weight-decay": lambda lib: lib.optim.ASGD([_p(lib)], weight_decay=-0.1),
    "Adafactor-beta2-decay": lambda lib: lib.optim.Adafactor([_p(lib)], beta2_decay=0.5),
    "Adafactor-d": lambda lib: lib.optim.Adafactor([_p(lib)], d=-1.0),
    "LBFGS-two-groups": lambda lib: lib.optim.LBFGS([{"params": [_p(lib)]}, {"params": [_p(lib)]}]),
    "LBFGS-max-iter": lambda lib: lib.optim.LBFGS([_p(lib)], lr=-1.0),
    "SparseAdam-lr": lambda lib: lib.optim.SparseAdam([_p(lib)], lr=0.0),
    "SparseAdam-eps": lambda lib: lib.optim.SparseAdam([_p(lib)], eps=0.0),
    "empty": lambda lib: lib.optim.Adam([]),
    "a-tensor-not-a-list": lambda lib: lib.optim.Adam(_p(lib)),
    "a-set-in-a-group": lambda lib: lib.optim.Adam([{"params": {_p(lib)}}]),
    "param-in-two-groups": lambda lib: (lambda p: lib.optim.Adam([{"params": [p]}, {"params": [p]}]))(_p(lib)),
}


FUSED_REFUSALS = [("SGD", {}), ("SGD", {"momentum": 0.9}), ("Adam", {}), ("AdamW", {"amsgrad": True}),
                  ("Adagrad", {})]


@pytest.mark.parametrize("name,kwargs", FUSED_REFUSALS, ids=[f"{n}-{k}" for k, (n, _) in enumerate(FUSED_REFUSALS)])
def test_fused_refuses_a_complex_parameter_at_the_first_step_as_torch(name, kwargs):
    messages = []
    for lib in (torch, tw):
        p = lib.nn.Parameter(lib.zeros(3, dtype=lib.complex64))
        p.grad = lib.ones(3, dtype=lib.complex64)
        opt = getattr(lib.optim, name)([p], lr=0.1, fused=True, **kwargs)
        with pytest.raises(RuntimeError) as info:
            opt.step()
        messages.append(str(info.value))
        assert not _np(p).any()
    head = "`fused=True` requires all the params to be floating point Tensors of supported devices: "
    assert messages[0].startswith(head) and messages[1].startswith(head)
    assert messages[1].endswith(messages[0].split("]")[-1].replace("torch.", "tilewise."))


@pytest.mark.parametrize("case", ERRORS)
def test_invalid_options_raise_torchs_error(case):
    _raises_like_torch(ERRORS[case])


def test_duplicate_parameters_warn_as_torch():
    for lib in (torch, tw):
        p = _p(lib)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            lib.optim.SGD([p, p], lr=0.1)
        messages = [str(w.message) for w in caught]
        if lib is torch:
            expected = messages
        else:
            assert messages == expected


# ---------------------------------------------------------------------------------------------- LR schedulers
class Halving:
    """A callable object: LambdaLR and MultiplicativeLR keep its attributes in their state dicts."""

    def __init__(self, rate: float) -> None:
        self.rate = rate

    def __call__(self, epoch: int) -> float:
        return self.rate ** (epoch // 3)


SCHEDULERS = {
    "LambdaLR-objects": ("SGD", lambda o, s: s.LambdaLR(o, [Halving(0.5), lambda e: 1.0 / (e + 1)], last_epoch=-1)),
    "MultiplicativeLR-object": ("Adam", lambda o, s: s.MultiplicativeLR(o, Halving(0.9))),
    "StepLR-gamma-above-one": ("SGD", lambda o, s: s.StepLR(o, step_size=1, gamma=1.05)),
    "MultiStepLR-unsorted": ("Adam", lambda o, s: s.MultiStepLR(o, milestones=[9, 2, 5, 5], gamma=0.3)),
    "ConstantLR-zero-iters": ("SGD", lambda o, s: s.ConstantLR(o, factor=0.5, total_iters=0)),
    "ConstantLR-factor-one": ("SGD", lambda o, s: s.ConstantLR(o, factor=1.0, total_iters=4)),
    "LinearLR-decay": ("Adam", lambda o, s: s.LinearLR(o, start_factor=1.0, end_factor=0.05, total_iters=7)),
    "ExponentialLR": ("RMSprop", lambda o, s: s.ExponentialLR(o, gamma=0.8)),
    "PolynomialLR-power": ("SGD", lambda o, s: s.PolynomialLR(o, total_iters=9, power=0.5)),
    "CosineAnnealingLR-short": ("SGD", lambda o, s: s.CosineAnnealingLR(o, T_max=3, eta_min=0.02)),
    "CosineAnnealingWarmRestarts-T_mult": ("Adam", lambda o, s: s.CosineAnnealingWarmRestarts(o, 2, T_mult=3,
                                                                                              eta_min=1e-3)),
    "ChainedScheduler-with-optimizer": ("SGD", lambda o, s: s.ChainedScheduler(
        [s.LinearLR(o, 0.2, total_iters=4), s.CosineAnnealingLR(o, 6), s.StepLR(o, 5, 0.5)], optimizer=o)),
    "SequentialLR-warmup-cosine": ("AdamW", lambda o, s: s.SequentialLR(
        o, [s.LinearLR(o, 0.01, 1.0, 5), s.CosineAnnealingWarmRestarts(o, 4, 2)], milestones=[5])),
    "CyclicLR-triangular-Adam": ("Adam", lambda o, s: s.CyclicLR(o, [0.001, 0.002], [0.01, 0.03], step_size_up=3,
                                                                  base_momentum=[0.7, 0.75], max_momentum=0.95)),
    "CyclicLR-triangular2-SGD": ("SGD", lambda o, s: s.CyclicLR(o, 0.01, 0.1, 2, 5, mode="triangular2",
                                                                base_momentum=0.5, max_momentum=0.9)),
    "CyclicLR-exp_range-RMSprop": ("RMSprop", lambda o, s: s.CyclicLR(o, 0.01, 0.1, 4, mode="exp_range", gamma=0.9,
                                                                      base_momentum=0.6, max_momentum=0.8)),
    "CyclicLR-scale_fn-cycle": ("SGD", lambda o, s: s.CyclicLR(o, 0.01, 0.1, 3, scale_fn=Halving(0.7),
                                                               scale_mode="cycle", cycle_momentum=False)),
    "OneCycleLR-three-phase-linear": ("SGD", lambda o, s: s.OneCycleLR(
        o, [0.5, 1.0], total_steps=30, pct_start=0.25, anneal_strategy="linear", three_phase=True,
        base_momentum=[0.8, 0.7], max_momentum=0.9, div_factor=10, final_div_factor=100)),
    "OneCycleLR-Adam-cos": ("Adam", lambda o, s: s.OneCycleLR(o, 0.1, epochs=3, steps_per_epoch=10, pct_start=0.5,
                                                              three_phase=True)),
    "OneCycleLR-no-momentum": ("AdamW", lambda o, s: s.OneCycleLR(o, 0.1, total_steps=31, cycle_momentum=False,
                                                                  anneal_strategy="linear")),
}
SCHEDULERS.update({
    "StepLR-tensor-lr": ("Adam-tensor-lr", lambda o, s: s.StepLR(o, 3, 0.5)),
    "OneCycleLR-tensor-lr": ("SGD-tensor-lr", lambda o, s: s.OneCycleLR(o, 0.1, total_steps=31)),
    "CyclicLR-tensor-lr": ("Adam-tensor-lr", lambda o, s: s.CyclicLR(o, 0.01, 0.1, 3)),
    "SequentialLR-tensor-lr": ("SGD-tensor-lr", lambda o, s: s.SequentialLR(
        o, [s.ConstantLR(o, 0.5, 3), s.ExponentialLR(o, 0.9)], milestones=[4])),
})
SCHEDULER_STEPS = 30


def _scheduler_optimizer(lib, name):
    params = [lib.nn.Parameter(lib.zeros(2)) for _ in range(2)]
    tensor_lr = name.endswith("-tensor-lr")
    name = name.removesuffix("-tensor-lr")
    groups = [{"params": [params[0]], "lr": lib.tensor(0.05) if tensor_lr else 0.05},
              {"params": [params[1]], "lr": lib.tensor(0.1) if tensor_lr else 0.1}]
    options = {"SGD": {"momentum": 0.9}, "RMSprop": {"momentum": 0.5}}.get(name, {})
    return getattr(lib.optim, name)(groups, **options)


def _scheduler_record(opt, sched):
    """What a scheduler shows after a step: its last rates, the groups' rates and momenta, its state dict."""
    momenta = tuple(g["betas"][0] if "betas" in g else g.get("momentum") for g in opt.param_groups)
    groups = [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups]
    return (tuple(_plain_state(lr) for lr in sched.get_last_lr()), tuple(_plain_state(g["lr"]) for g in groups),
            momenta, _plain_state(sched.state_dict()), _plain_state(groups))


def _plain_state(value):
    """A scheduler's state dict as comparable data: functions as a marker (torch keeps them out), scheduler
    objects by class name, numbers as they are."""
    if isinstance(value, dict):
        return {k: _plain_state(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value).__name__, [_plain_state(v) for v in value]
    if callable(value):
        return "callable"
    if isinstance(value, (tw.Tensor, torch.Tensor)):
        return "tensor", float(_np(value))
    return value


def _scheduled(lib, name, steps=SCHEDULER_STEPS, resume_at=None):
    optimizer, make = SCHEDULERS[name]
    opt = _scheduler_optimizer(lib, optimizer)
    sched = make(opt, lib.optim.lr_scheduler)
    out = [_scheduler_record(opt, sched)]
    for t in range(steps):
        if t == resume_at:  # a fresh optimizer and scheduler from the two state dicts
            saved = opt.state_dict(), sched.state_dict()
            opt = _scheduler_optimizer(lib, optimizer)
            sched = make(opt, lib.optim.lr_scheduler)
            opt.load_state_dict(saved[0])
            sched.load_state_dict(saved[1])
        opt.step()
        sched.step()
        out.append(_scheduler_record(opt, sched))
    return out


def _assert_records_equal(ours, theirs):
    for t, (a, b) in enumerate(zip(ours, theirs)):
        assert a[0] == _approx(b[0]), f"get_last_lr() after {t} steps"
        assert a[1] == _approx(b[1]), f"group lrs after {t} steps"
        assert a[2] == pytest.approx(b[2], rel=1e-13), f"momenta after {t} steps"
        assert list(a[3]) == list(b[3]), f"state dict keys after {t} steps"
        assert a[3] == _approx(b[3]), f"state dict after {t} steps"
        assert [list(g) for g in a[4][1]] == [list(g) for g in b[4][1]], f"param_groups keys after {t} steps"
        assert a[4] == _approx(b[4]), f"param_groups after {t} steps"
    assert len(ours) == len(theirs)


def _approx(value):
    if isinstance(value, dict):
        return {k: _approx(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_approx(v) for v in value)
    if isinstance(value, float):
        return pytest.approx(value, rel=1e-13)
    return value


@pytest.mark.parametrize("name", SCHEDULERS)
def test_scheduler_rates_momenta_and_state_dict_at_every_step_match_torch(name):
    _assert_records_equal(_scheduled(tw, name), _scheduled(torch, name))


@pytest.mark.parametrize("name", SCHEDULERS)
def test_scheduler_state_dict_loaded_into_a_new_scheduler_continues_as_torch(name):
    _assert_records_equal(_scheduled(tw, name, resume_at=11), _scheduled(torch, name))


def _plateau_run(lib, kwargs, metrics, optimizer="SGD"):
    opt = _scheduler_optimizer(lib, optimizer)
    sched = lib.optim.lr_scheduler.ReduceLROnPlateau(opt, **kwargs)
    out = []
    for m in metrics:
        opt.step()
        sched.step(m)
        state = {k: v for k, v in sched.state_dict().items() if k != "optimizer"}
        out.append((tuple(sched.get_last_lr()), tuple(g["lr"] for g in opt.param_groups), state))
    return out


PLATEAU = [dict(mode="max", threshold_mode="rel", threshold=0.1, cooldown=2, patience=1, min_lr=[0.01, 0.02]),
           dict(mode="min", threshold_mode="abs", threshold=0.05, cooldown=1, patience=0, factor=0.5,
                min_lr=[0.0, 0.03], eps=1e-3),
           dict(mode="max", threshold_mode="abs", threshold=0.0, patience=2, factor=0.2)]


@pytest.mark.parametrize("kwargs", PLATEAU, ids=["max-rel-cooldown", "min-abs-min_lr-list", "max-abs"])
@pytest.mark.parametrize("optimizer", ["SGD", "Adam"])
def test_reduce_on_plateau_options_match_torch(kwargs, optimizer):
    metrics = [1.0, 1.0, 0.98, 1.2, 1.21, 1.19, 1.3, 0.4, 0.4, 0.41, 0.39, 2.0, 2.0, 2.0, 2.0, 0.1, 0.1, 0.1]
    assert _plateau_run(tw, kwargs, metrics, optimizer) == _plateau_run(torch, kwargs, metrics, optimizer)


def _fractional(lib, t_mult, iters, epochs):
    opt = _scheduler_optimizer(lib, "SGD")
    sched = lib.optim.lr_scheduler.CosineAnnealingWarmRestarts(opt, T_0=2, T_mult=t_mult, eta_min=0.001)
    out = []
    for epoch in range(epochs):
        for i in range(iters):
            opt.step()
            sched.step(epoch + i / iters)
            out.append((tuple(sched.get_last_lr()), sched.T_cur, sched.T_i, sched.last_epoch))
    opt.step()
    sched.step()  # without an epoch, after fractional ones
    out.append((tuple(sched.get_last_lr()), sched.T_cur, sched.T_i, sched.last_epoch))
    return out


@pytest.mark.parametrize("t_mult,iters", [(2, 5), (1, 3), (4, 4)])
def test_cosine_warm_restarts_per_batch_then_without_epoch_matches_torch(t_mult, iters):
    ours, theirs = _fractional(tw, t_mult, iters, 9), _fractional(torch, t_mult, iters, 9)
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs):
        assert a[0] == pytest.approx(b[0], rel=1e-13)
        assert a[1:] == pytest.approx(b[1:], rel=1e-13)


def _caught(lib, actions):
    """The warnings ``actions`` emit, and the error that ends them, if any."""
    opt = _scheduler_optimizer(lib, "SGD")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            actions(lib, opt)
        except Exception as error:  # noqa: BLE001 - compared with torch's below
            caught.append(warnings.WarningMessage(str(error), type(error), "", 0))
    return [(w.category.__name__, str(w.message)) for w in caught]


def _without_torch_references(message: str) -> str:
    """torch's message less its sentences about PyTorch itself (its version history, its issue tracker, its
    documentation), which tilewise's leaves out or puts in its own words."""
    sentences = [s for s in message.split(". ") if "pytorch" not in s.lower()]
    return ". ".join(sentences).rstrip(".")


WARNING_CASES = {
    "scheduler-before-optimizer": lambda lib, o: (lambda s: (s.step(), o.step(), s.step()))(
        lib.optim.lr_scheduler.ExponentialLR(o, 0.9)),
    "epoch-argument": lambda lib, o: (lambda s: (o.step(), s.step(2)))(lib.optim.lr_scheduler.StepLR(o, 2)),
    "plateau-epoch-argument": lambda lib, o: (lambda s: (o.step(), s.step(1.0, 3)))(
        lib.optim.lr_scheduler.ReduceLROnPlateau(o)),
    "sequential-epoch-refused": lambda lib, o: (lambda s: (o.step(), s.step(1)))(
        lib.optim.lr_scheduler.SequentialLR(o, [lib.optim.lr_scheduler.ConstantLR(o),
                                                lib.optim.lr_scheduler.StepLR(o, 2)], [3])),
    "cosine-restarts-epoch-before-step": lambda lib, o: lib.optim.lr_scheduler.CosineAnnealingWarmRestarts(
        o, 3).step(0.5),
    "one-cycle-no-warning": lambda lib, o: (lambda s: (o.step(), s.step()))(
        lib.optim.lr_scheduler.OneCycleLR(o, 0.1, total_steps=5)),
}


@pytest.mark.parametrize("case", WARNING_CASES)
def test_scheduler_warnings_are_torchs_word_for_word(case):
    ours = _caught(tw, WARNING_CASES[case])
    theirs = _caught(torch, WARNING_CASES[case])
    assert [c for c, _ in ours] == [c for c, _ in theirs]
    for (_, mine), (_, torchs) in zip(ours, theirs):
        assert mine.startswith(_without_torch_references(torchs).replace("torch.", "tilewise."))


def test_last_epoch_resume_needs_initial_lr_and_continues_as_torch():
    def run(lib):
        opt = _scheduler_optimizer(lib, "Adam")
        s = lib.optim.lr_scheduler
        first = s.OneCycleLR(opt, 0.1, total_steps=20)
        for _ in range(6):
            opt.step()
            first.step()
        # a new scheduler resuming at the epoch the first reached, on the optimizer it left (initial_lr in place)
        resumed = s.CosineAnnealingLR(opt, T_max=10, eta_min=0.001, last_epoch=first.last_epoch)
        out = [tuple(resumed.get_last_lr()), resumed.last_epoch]
        for _ in range(5):
            opt.step()
            resumed.step()
            out.append((tuple(resumed.get_last_lr()), resumed.last_epoch))
        return out

    assert run(tw) == run(torch)


@pytest.mark.parametrize("kwargs", PLATEAU, ids=["max-rel-cooldown", "min-abs-min_lr-list", "max-abs"])
def test_reduce_on_plateau_with_negative_metrics_matches_torch(kwargs):
    """The relative threshold of a negative best: torch scales by ``best * (1 +- threshold)`` whatever its sign."""
    metrics = [-1.0, -1.05, -0.98, -1.2, -1.21, -1.19, -1.3, -0.4, -0.4, -0.41, -0.39, -2.0, -2.0, -2.0, -0.1]
    assert _plateau_run(tw, kwargs, metrics) == _plateau_run(torch, kwargs, metrics)


RESUMED = {
    "OneCycleLR": lambda o, s, e: s.OneCycleLR(o, [0.5, 1.0], total_steps=20, three_phase=True, last_epoch=e),
    "CyclicLR": lambda o, s, e: s.CyclicLR(o, 0.01, 0.1, 3, mode="triangular2", last_epoch=e),
    "CosineAnnealingWarmRestarts": lambda o, s, e: s.CosineAnnealingWarmRestarts(o, 3, 2, last_epoch=e),
    "PolynomialLR": lambda o, s, e: s.PolynomialLR(o, 9, 2.0, last_epoch=e),
    "LinearLR": lambda o, s, e: s.LinearLR(o, 0.2, 0.9, 8, last_epoch=e),
    "MultiStepLR": lambda o, s, e: s.MultiStepLR(o, [2, 6, 9], 0.5, last_epoch=e),
}


@pytest.mark.parametrize("name", RESUMED)
def test_a_scheduler_made_with_last_epoch_resumes_as_torch(name):
    """Six steps of a scheduler, then a new one of the same kind made with ``last_epoch`` on the same optimizer (its
    ``initial_lr`` and any ``max_lr``/``min_lr``/momenta entries in place): torch's rates and state after each step."""
    def run(lib):
        opt = _scheduler_optimizer(lib, "SGD")
        s = lib.optim.lr_scheduler
        first = RESUMED[name](opt, s, -1)
        for _ in range(6):
            opt.step()
            first.step()
        resumed = RESUMED[name](opt, s, first.last_epoch)
        out = [_scheduler_record(opt, resumed)]
        for _ in range(8):
            opt.step()
            resumed.step()
            out.append(_scheduler_record(opt, resumed))
        return out

    _assert_records_equal(run(tw), run(torch))


def _momentum_sgd(lib):
    return lib.optim.SGD([lib.nn.Parameter(lib.zeros(1))], lr=0.1, momentum=0.9)


def _adagrad(lib):
    return lib.optim.Adagrad([lib.nn.Parameter(lib.zeros(1))])


SCHEDULER_ERRORS = {
    "sequential-of-another-optimizer": lambda s, o, lib: s.SequentialLR(
        o, [s.StepLR(o, 2), s.StepLR(_momentum_sgd(lib), 2)], [3]),
    "sequential-milestones": lambda s, o, lib: s.SequentialLR(o, [s.StepLR(o, 2), s.StepLR(o, 2)], [3, 4]),
    "chained-of-two-optimizers": lambda s, o, lib: s.ChainedScheduler([s.StepLR(o, 2),
                                                                      s.StepLR(_momentum_sgd(lib), 2)]),
    "chained-optimizer-argument": lambda s, o, lib: s.ChainedScheduler([s.StepLR(o, 2)], optimizer=_momentum_sgd(lib)),
    "cyclic-base-lr-list": lambda s, o, lib: s.CyclicLR(o, [0.1, 0.2], 1.0),
    "cyclic-without-momentum": lambda s, o, lib: s.CyclicLR(_adagrad(lib), 0.1, 1.0),
    "one-cycle-anneal-strategy": lambda s, o, lib: s.OneCycleLR(o, 1.0, total_steps=10, anneal_strategy="exp"),
    "one-cycle-total-steps": lambda s, o, lib: s.OneCycleLR(o, 1.0, total_steps=-1),
    "one-cycle-epochs": lambda s, o, lib: s.OneCycleLR(o, 1.0, epochs=0, steps_per_epoch=3),
    "one-cycle-max-lr-list": lambda s, o, lib: s.OneCycleLR(o, [1.0, 2.0], total_steps=10),
    "one-cycle-without-momentum": lambda s, o, lib: s.OneCycleLR(_adagrad(lib), 0.1, total_steps=5),
    "linear-end-factor": lambda s, o, lib: s.LinearLR(o, end_factor=1.5),
    "multiplicative-list": lambda s, o, lib: s.MultiplicativeLR(o, [lambda e: 1.0, lambda e: 1.0]),
    "constant-factor": lambda s, o, lib: s.ConstantLR(o, factor=-0.1),
    "warm-restarts-T_mult": lambda s, o, lib: s.CosineAnnealingWarmRestarts(o, 2, T_mult=1.5),
    "warm-restarts-T_0": lambda s, o, lib: s.CosineAnnealingWarmRestarts(o, 2.0),
    "warm-restarts-eta_min": lambda s, o, lib: s.CosineAnnealingWarmRestarts(o, 2, eta_min="a"),
    "warm-restarts-negative-epoch": lambda s, o, lib: s.CosineAnnealingWarmRestarts(o, 2).step(-1),
    "not-an-optimizer": lambda s, o, lib: s.ExponentialLR(None, 0.9),
}


@pytest.mark.parametrize("case", SCHEDULER_ERRORS)
def test_scheduler_errors_are_torchs(case):
    _raises_like_torch(lambda lib: SCHEDULER_ERRORS[case](lib.optim.lr_scheduler, _momentum_sgd(lib), lib))

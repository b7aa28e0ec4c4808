"""The breadth of tilewise.optim against torch.optim: every optimizer over many steps for the options that change
its arithmetic (single-tensor loop and compiled foreach, float32 and float64, several param groups, parameters
without gradients), LBFGS with and without line search, state dicts both ways, hooks, the implementation flags,
differentiable steps and whole compiled training steps (the LR schedulers are in test_optim_schedulers.py).
"""

from __future__ import annotations

import io
import warnings

import numpy as np
import pytest
import torch

import tilewise as tw

SHAPES = [(5, 3), (7,), (2, 3, 4), (4,)]
NO_GRAD = 3  # the parameter that never gets a gradient: it and its state must stay untouched


def _problem(dtype: str, steps: int):
    rng = np.random.default_rng(0)
    init = [rng.standard_normal(s).astype(dtype) for s in SHAPES]
    target = [rng.standard_normal(s).astype(dtype) for s in SHAPES]
    noise = [[rng.standard_normal(s).astype(dtype) * 0.1 for s in SHAPES] for _ in range(steps)]
    return init, target, noise


def _groups(params, group_options):
    if group_options is None:
        return params
    return [{"params": params[:2], **group_options[0]}, {"params": params[2:], **group_options[1]}]


def _trajectory(lib, name, kwargs, group_options=None, dtype="float32", steps=25):
    """Parameters after ``steps`` steps of ``name`` on a noisy quadratic, gradients ``2 (p - target) + noise``
    computed in each library from its own parameters, so that any difference compounds over the steps."""
    init, target, noise = _problem(dtype, steps)
    params = [lib.nn.Parameter(lib.tensor(a.copy())) for a in init]
    opt = getattr(lib.optim, name)(_groups(params, group_options), **kwargs)
    for t in range(steps):
        for k, p in enumerate(params):
            if k != NO_GRAD:
                p.grad = (p.detach() - lib.tensor(target[k])) * 2 + lib.tensor(noise[t][k])
        opt.step()
    return params, opt


def _assert_close_params(ours, theirs, rtol=1e-5, atol=1e-6):
    for k, (a, b) in enumerate(zip(ours, theirs)):
        np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), rtol=rtol, atol=atol, err_msg=f"param {k}")


OPTIONS = {
    "SGD": [dict(lr=0.05), dict(lr=0.05, momentum=0.9, dampening=0.2, weight_decay=0.1),
            dict(lr=0.05, momentum=0.9, nesterov=True, maximize=True)],
    "Adam": [dict(lr=0.02, amsgrad=True, maximize=True), dict(lr=0.02, weight_decay=0.1, decoupled_weight_decay=True)],
    "AdamW": [dict(lr=0.02, weight_decay=0.2, amsgrad=True)],
    "RMSprop": [dict(lr=0.01, alpha=0.9, weight_decay=0.1, maximize=True),
                dict(lr=0.01, momentum=0.5, centered=True)],
    "Adagrad": [dict(lr=0.1, lr_decay=0.01, weight_decay=0.1, initial_accumulator_value=0.2, maximize=True)],
    "Adadelta": [dict(), dict(lr=0.5, rho=0.8, eps=1e-5, weight_decay=0.1, maximize=True)],
    "Adamax": [dict(), dict(lr=0.01, betas=(0.8, 0.9), eps=1e-6, weight_decay=0.1, maximize=True)],
    "NAdam": [dict(), dict(lr=0.01, betas=(0.8, 0.9), weight_decay=0.1, momentum_decay=0.01),
              dict(lr=0.01, weight_decay=0.1, decoupled_weight_decay=True, maximize=True)],
    "RAdam": [dict(), dict(lr=0.01, weight_decay=0.1), dict(lr=0.01, betas=(0.8, 0.9), weight_decay=0.1,
                                                            decoupled_weight_decay=True, maximize=True)],
    "ASGD": [dict(), dict(lr=0.05, lambd=0.01, alpha=0.5, t0=5, weight_decay=0.1, maximize=True)],
    "Rprop": [dict(), dict(lr=0.05, etas=(0.3, 1.7), step_sizes=(1e-3, 0.2), maximize=True)],
    "Adafactor": [dict(), dict(lr=0.05, beta2_decay=-0.5, eps=(1e-20, 1e-2), d=1.5, weight_decay=0.1, maximize=True)],
}
CASES = [(name, kwargs) for name, options in OPTIONS.items() for kwargs in options]
CASE_IDS = [f"{name}-{k}" for name, options in OPTIONS.items() for k in range(len(options))]


@pytest.mark.parametrize("foreach", [False, True], ids=["loop", "foreach"])
@pytest.mark.parametrize("name,kwargs", CASES, ids=CASE_IDS)
def test_optimizer_trajectory_matches_torch(name, kwargs, foreach):
    ours, opt = _trajectory(tw, name, {**kwargs, "foreach": foreach})
    theirs, _ = _trajectory(torch, name, {**kwargs, "foreach": foreach})
    _assert_close_params(ours, theirs)
    assert opt.state.get(ours[NO_GRAD], {}) == {} or name == "Adagrad"  # Adagrad makes its state up front
    if foreach:  # the group was updated by one compiled program (SGD's first step makes its buffers by the loop)
        assert len(opt._programs) == 1


@pytest.mark.parametrize("name,kwargs", [c for c in CASES if c[0] != "SGD" or "momentum" in c[1]],
                         ids=[i for i, c in zip(CASE_IDS, CASES) if c[0] != "SGD" or "momentum" in c[1]])
def test_optimizer_trajectory_in_float64_matches_torch(name, kwargs):
    ours, _ = _trajectory(tw, name, kwargs, dtype="float64")
    theirs, _ = _trajectory(torch, name, kwargs, dtype="float64")
    _assert_close_params(ours, theirs, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("name", ["Adam", "Adagrad", "NAdam", "RAdam", "Adamax"])
def test_foreach_in_float64_matches_torch(name):
    """The compiled update in float64: the step-dependent factors meet float64 parameters unrounded."""
    ours, opt = _trajectory(tw, name, {"foreach": True}, dtype="float64")
    theirs, _ = _trajectory(torch, name, {"foreach": True}, dtype="float64")
    _assert_close_params(ours, theirs, rtol=1e-11, atol=1e-12)
    assert len(opt._programs) == 1


GROUP_OPTIONS = {
    "SGD": [dict(momentum=0.9, nesterov=True), dict(lr=0.01, weight_decay=0.2, dampening=0.3, momentum=0.5)],
    "Adam": [dict(amsgrad=True), dict(lr=0.05, betas=(0.5, 0.6), weight_decay=0.1)],
    "RMSprop": [dict(centered=True), dict(momentum=0.3, alpha=0.5)],
    "Adagrad": [dict(lr_decay=0.1), dict(eps=1e-3, maximize=True)],
    "Adadelta": [dict(rho=0.5), dict(lr=0.1, weight_decay=0.1)],
    "Adamax": [dict(betas=(0.5, 0.5)), dict(lr=0.05)],
    "NAdam": [dict(momentum_decay=0.1), dict(decoupled_weight_decay=True, weight_decay=0.3)],
    "RAdam": [dict(betas=(0.7, 0.8)), dict(decoupled_weight_decay=True, weight_decay=0.3)],
}


@pytest.mark.parametrize("foreach", [False, True], ids=["loop", "foreach"])
@pytest.mark.parametrize("name", GROUP_OPTIONS)
def test_param_groups_with_their_own_options_match_torch(name, foreach):
    kwargs = {"lr": 0.02, "foreach": foreach}
    ours, _ = _trajectory(tw, name, kwargs, GROUP_OPTIONS[name])
    theirs, _ = _trajectory(torch, name, kwargs, GROUP_OPTIONS[name])
    _assert_close_params(ours, theirs)


@pytest.mark.parametrize("name", ["SGD", "Adam", "AdamW", "Adagrad"])
def test_fused_runs_the_compiled_update_and_matches_torch_fused(name):
    kwargs = {"lr": 0.02, "momentum": 0.9} if name == "SGD" else {"lr": 0.02}
    ours, opt = _trajectory(tw, name, {**kwargs, "fused": True})
    theirs, _ = _trajectory(torch, name, {**kwargs, "fused": True})
    _assert_close_params(ours, theirs)
    assert len(opt._programs) == 1


@pytest.mark.parametrize("name", ["SGD", "RMSprop", "Adagrad", "NAdam"])
def test_a_tensor_learning_rate_under_a_scheduler_matches_torch(name):
    """``lr`` as a 0-dim tensor: the scheduler fills it in place, the compiled update reads it at run time (no
    recompile when it changes)."""
    results = []
    for lib in (tw, torch):
        init, target, _ = _problem("float32", 1)
        params = [lib.nn.Parameter(lib.tensor(a.copy())) for a in init]
        opt = getattr(lib.optim, name)(params, lr=lib.tensor(0.05), foreach=lib is tw)
        sched = lib.optim.lr_scheduler.ExponentialLR(opt, 0.8)
        for _ in range(6):
            for p, t in zip(params, target):
                p.grad = (p.detach() - lib.tensor(t)) * 2
            opt.step()
            sched.step()
        results.append((params, opt))
    _assert_close_params(results[0][0], results[1][0])
    (program,) = results[0][1]._programs.values()
    assert len(program.variants) == 1
    assert float(results[0][1].param_groups[0]["lr"]) == pytest.approx(0.05 * 0.8**6)


# ---------------------------------------------------------------------------- LBFGS

def _rosenbrock(x):
    return ((1 - x[:-1]) ** 2).sum() + 100 * ((x[1:] - x[:-1] ** 2) ** 2).sum()


def _lbfgs_run(lib, kwargs, dtype, steps, problem):
    """Parameters, losses, closure calls and the optimizer's counters after ``steps`` LBFGS steps."""
    rng = np.random.default_rng(1)
    a = lib.tensor(rng.standard_normal((64, 40)).astype(dtype))
    b = lib.tensor(rng.standard_normal(64).astype(dtype))
    start = rng.standard_normal(40 if problem == "least-squares" else 6).astype(dtype)
    x, y = lib.nn.Parameter(lib.tensor(start[:-2])), lib.nn.Parameter(lib.tensor(start[-2:]))
    unused = lib.nn.Parameter(lib.ones(2, dtype=getattr(lib, dtype)))  # never gets a gradient: a zero block
    opt = lib.optim.LBFGS([x, unused, y], **kwargs)
    calls = [0]

    def closure():
        calls[0] += 1
        opt.zero_grad()
        if problem == "rosenbrock":
            loss = _rosenbrock(lib.cat([x, y]))
        else:
            loss = ((a[:, :-2] @ x + a[:, -2:] @ y - b) ** 2).mean() + 0.1 * (lib.tanh(x) ** 2).sum()
        loss.backward()
        return loss

    losses = [float(opt.step(closure).detach()) for _ in range(steps)]
    state = opt.state[x]
    return [x, y, unused], losses, (calls[0], state["n_iter"], state["func_evals"])


LBFGS_OPTIONS = [dict(), dict(line_search_fn="strong_wolfe"), dict(history_size=3, max_iter=7, lr=0.5),
                 dict(line_search_fn="strong_wolfe", history_size=2, max_eval=9, tolerance_change=1e-5)]


@pytest.mark.parametrize("kwargs", LBFGS_OPTIONS, ids=["plain", "strong_wolfe", "short-history", "bounded-evals"])
def test_lbfgs_on_rosenbrock_in_float64_matches_torch(kwargs):
    ours = _lbfgs_run(tw, kwargs, "float64", 5, "rosenbrock")
    theirs = _lbfgs_run(torch, kwargs, "float64", 5, "rosenbrock")
    assert ours[2] == theirs[2]  # the same closure calls and iterations: every decision taken the same way
    np.testing.assert_allclose(ours[1], theirs[1], rtol=1e-6, atol=1e-12)  # dot products may round differently
    _assert_close_params(ours[0], theirs[0], rtol=1e-7, atol=1e-9)


@pytest.mark.parametrize("kwargs", LBFGS_OPTIONS, ids=["plain", "strong_wolfe", "short-history", "bounded-evals"])
def test_lbfgs_in_float32_matches_torch(kwargs):
    """One step of up to 20 iterations on a 40-dimensional problem: near the optimum float32 noise decides the
    stopping tests, so the comparison stops before it."""
    ours = _lbfgs_run(tw, kwargs, "float32", 1, "least-squares")
    theirs = _lbfgs_run(torch, kwargs, "float32", 1, "least-squares")
    assert ours[2] == theirs[2]
    np.testing.assert_allclose(ours[1], theirs[1], rtol=1e-5)
    _assert_close_params(ours[0], theirs[0], atol=1e-5)  # 20 iterations from losses that differ in the last bit


def test_lbfgs_stops_at_once_when_the_gradient_is_below_tolerance_grad():
    x = tw.nn.Parameter(tw.tensor([1.0, 1.0]))
    opt = tw.optim.LBFGS([x], tolerance_grad=1e-3)
    calls = []

    def closure():
        calls.append(1)
        opt.zero_grad()
        loss = ((x - 1.0) ** 2).sum()
        loss.backward()
        return loss

    assert opt.step(closure).item() == 0.0
    assert len(calls) == 1 and x.tolist() == [1.0, 1.0]


def test_lbfgs_refuses_param_groups_and_other_line_searches():
    p = tw.nn.Parameter(tw.zeros(2))
    with pytest.raises(ValueError, match="doesn't support per-parameter options"):
        tw.optim.LBFGS([{"params": [p]}, {"params": [tw.nn.Parameter(tw.zeros(1))]}])
    opt = tw.optim.LBFGS([p], line_search_fn="backtracking")

    def closure():
        opt.zero_grad()
        loss = ((p - 1) ** 2).sum()
        loss.backward()
        return loss

    with pytest.raises(RuntimeError, match="only 'strong_wolfe' is supported"):
        opt.step(closure)


def _lbfgs_least_squares(compile_closure: bool):
    # float64: the line search turns last-bit differences between the compiled reduction and BLAS's into
    # differences of the iterates far larger than float32 rounding
    rng = np.random.default_rng(1)
    a = tw.tensor(rng.standard_normal((32, 6)))
    b = tw.tensor(rng.standard_normal(32))
    x = tw.nn.Parameter(tw.tensor(rng.standard_normal(6)))
    opt = tw.optim.LBFGS([x], line_search_fn="strong_wolfe", max_iter=4)

    def closure():
        if x.grad is not None:  # not opt.zero_grad(): a function that reaches LBFGS is guarded on its counters
            x.grad.zero_()
        loss = ((a @ x - b) ** 2).mean()
        loss.backward()
        return loss.detach()

    return x, opt, tw.compile(closure) if compile_closure else closure


def test_lbfgs_with_a_compiled_closure_matches_eager():
    (x_eager, eager, closure), (x_compiled, opt, compiled_closure) = (_lbfgs_least_squares(False),
                                                                     _lbfgs_least_squares(True))
    for _ in range(3):
        np.testing.assert_allclose(opt.step(compiled_closure).item(), eager.step(closure).item(), rtol=1e-10)
    np.testing.assert_allclose(x_compiled.detach().numpy(), x_eager.detach().numpy(), rtol=1e-8, atol=1e-10)
    assert len(compiled_closure.variants) == 2  # the first call starts without a gradient


def test_a_compiled_lbfgs_step_matches_eager():
    """Every read of a loss or a norm is a graph break: the step's Python runs on every call, its tensor
    arithmetic in compiled segments, and the parameters follow eager's exactly as far as rounding allows."""
    (x_eager, eager, closure), (x_compiled, opt, closure_2) = _lbfgs_least_squares(False), _lbfgs_least_squares(False)
    step = tw.compile(lambda: opt.step(closure_2))
    with warnings.catch_warnings():  # the line search's step sizes are new constants: segments reach the limit
        warnings.simplefilter("ignore", RuntimeWarning)
        for _ in range(3):
            np.testing.assert_allclose(step().item(), eager.step(closure).item(), rtol=1e-5)
    np.testing.assert_allclose(x_compiled.detach().numpy(), x_eager.detach().numpy(), rtol=1e-4, atol=1e-5)


def test_a_compiled_lbfgs_step_with_fullgraph_names_the_first_read():
    x, opt, closure = _lbfgs_least_squares(False)
    with pytest.raises(tw.compiler.DataDependentError, match="test_optim_breadth.py"):
        tw.compile(lambda: opt.step(closure), fullgraph=True)()


# ---------------------------------------------------------------------------- state dicts

ALL_OPTIMIZERS = [("SGD", dict(lr=0.05, momentum=0.9)), ("Adam", dict(lr=0.02, amsgrad=True)),
                  ("AdamW", dict(lr=0.02)), ("RMSprop", dict(lr=0.01, momentum=0.5, centered=True)),
                  ("Adagrad", dict(lr=0.1)), ("Adadelta", dict()), ("Adamax", dict()), ("NAdam", dict()),
                  ("RAdam", dict()), ("LBFGS", dict(max_iter=3)), ("ASGD", dict(t0=2)), ("Rprop", dict()),
                  ("Adafactor", dict())]


def _steps(lib, opt, params, target, start, stop):
    def closure():
        opt.zero_grad()
        loss = sum(((p - lib.tensor(t)) ** 2).sum() for p, t in zip(params[:NO_GRAD], target))
        loss.backward()
        return loss

    for t in range(start, stop):
        opt.zero_grad()
        for k, p in enumerate(params[:NO_GRAD]):
            p.grad = (p.detach() - lib.tensor(target[k])) * (2 + t % 3)
        opt.step(closure)


@pytest.mark.parametrize("name,kwargs", ALL_OPTIMIZERS, ids=[n for n, _ in ALL_OPTIMIZERS])
def test_state_dict_round_trip_through_a_checkpoint_continues_the_same_trajectory(name, kwargs):
    init, target, _ = _problem("float32", 1)

    def fresh():
        params = [tw.nn.Parameter(tw.tensor(a.copy())) for a in init]
        return params, getattr(tw.optim, name)(params, **kwargs)

    straight, opt = fresh()
    _steps(tw, opt, straight, target, 0, 8)

    first, opt = fresh()
    _steps(tw, opt, first, target, 0, 4)
    buffer = io.BytesIO()
    tw.save({"params": [p.detach() for p in first], "optimizer": opt.state_dict()}, buffer)
    buffer.seek(0)
    saved = tw.load(buffer)
    resumed, opt = fresh()
    for p, value in zip(resumed, saved["params"]):
        p.data.copy_(value)
    opt.load_state_dict(saved["optimizer"])
    _steps(tw, opt, resumed, target, 4, 8)
    for a, b in zip(resumed, straight):
        np.testing.assert_array_equal(a.detach().numpy(), b.detach().numpy())


@pytest.mark.parametrize("name,kwargs", ALL_OPTIMIZERS, ids=[n for n, _ in ALL_OPTIMIZERS])
def test_a_torch_optimizer_state_dict_resumes_here(name, kwargs):
    """torch's state dict (param ids, ``state``, ``param_groups``; its tensors through DLPack) loads into the
    same tilewise optimizer, which then continues as torch does."""
    init, target, _ = _problem("float32", 1)
    theirs = [torch.nn.Parameter(torch.tensor(a.copy())) for a in init]
    torch_opt = getattr(torch.optim, name)(theirs, **kwargs)
    _steps(torch, torch_opt, theirs, target, 0, 4)
    ours = [tw.nn.Parameter(tw.tensor(p.detach().numpy().copy())) for p in theirs]
    opt = getattr(tw.optim, name)(ours, **kwargs)
    opt.load_state_dict(torch_opt.state_dict())
    assert opt.state_dict()["param_groups"] == torch_opt.state_dict()["param_groups"]
    _steps(tw, opt, ours, target, 4, 8)
    _steps(torch, torch_opt, theirs, target, 4, 8)
    _assert_close_params(ours, theirs)


def test_state_dict_layout_matches_torch_for_every_optimizer():
    for name, kwargs in ALL_OPTIMIZERS:
        dicts = []
        for lib in (tw, torch):
            init, target, _ = _problem("float32", 1)
            params = [lib.nn.Parameter(lib.tensor(a.copy())) for a in init]
            groups = params if name == "LBFGS" else [{"params": params[:2]}, {"params": params[2:], "lr": 0.5}]
            opt = getattr(lib.optim, name)(groups, **kwargs)
            _steps(lib, opt, params, target, 0, 2)
            dicts.append(opt.state_dict())
        ours, theirs = dicts
        assert ours["param_groups"] == theirs["param_groups"], name
        assert ours["state"].keys() == theirs["state"].keys(), name
        for k in theirs["state"]:
            assert ours["state"][k].keys() == theirs["state"][k].keys(), name


def test_load_state_dict_rejects_a_different_layout():
    opt = tw.optim.Adam([tw.nn.Parameter(tw.zeros(2)), tw.nn.Parameter(tw.zeros(3))])
    with pytest.raises(ValueError, match="different number of parameter groups"):
        opt.load_state_dict({"state": {}, "param_groups": []})
    with pytest.raises(ValueError, match="doesn't match the size of optimizer's group"):
        opt.load_state_dict({"state": {}, "param_groups": [{"params": [0], "lr": 0.1}]})


def test_add_param_group_mid_training_matches_torch():
    runs = []
    for lib in (tw, torch):
        init, target, _ = _problem("float32", 1)
        params = [lib.nn.Parameter(lib.tensor(a.copy())) for a in init]
        opt = lib.optim.Adam(params[:2], lr=0.05)
        _steps(lib, opt, params, target, 0, 3)
        opt.add_param_group({"params": params[2], "lr": 0.1, "amsgrad": True})
        _steps(lib, opt, params, target, 3, 6)
        runs.append((params, opt.state_dict()["param_groups"]))
    _assert_close_params(runs[0][0], runs[1][0])
    assert runs[0][1] == runs[1][1]


def test_named_parameters_keep_their_names_in_the_state_dict():
    model = tw.nn.Linear(3, 2)
    opt = tw.optim.SGD(model.named_parameters(), lr=0.1)
    assert opt.param_groups[0]["param_names"] == ["weight", "bias"]
    assert opt.state_dict()["param_groups"][0]["param_names"] == ["weight", "bias"]
    ref = torch.optim.SGD(torch.nn.Linear(3, 2).named_parameters(), lr=0.1)
    assert opt.state_dict()["param_groups"] == ref.state_dict()["param_groups"]
    with pytest.raises(ValueError, match="with/without names"):
        opt.add_param_group({"params": [tw.nn.Parameter(tw.zeros(1))]})


# ---------------------------------------------------------------------------- hooks, flags, errors

def test_step_hooks_run_in_torch_order_and_a_pre_hook_may_replace_the_arguments():
    p = tw.nn.Parameter(tw.ones(2))
    p.grad = tw.ones(2)
    opt = tw.optim.SGD([p], lr=0.5)
    seen = []
    global_pre = tw.optim.register_optimizer_step_pre_hook(lambda o, args, kwargs: seen.append("global pre"))
    global_post = tw.optim.register_optimizer_step_post_hook(lambda o, args, kwargs: seen.append("global post"))
    try:
        pre = opt.register_step_pre_hook(lambda o, args, kwargs: seen.append("pre") or ((lambda: 7.0,), {}))
        opt.register_step_post_hook(lambda o, args, kwargs: seen.append(("post", args[0]() if args else None)))
        assert opt.step() == 7.0  # the closure the pre-hook put in ran
        assert seen == ["global pre", "pre", ("post", 7.0), "global post"]
        pre.remove()
        global_pre.remove()
        seen.clear()
        opt.step()
    finally:
        global_pre.remove()
        global_post.remove()
    assert seen == [("post", None), "global post"]
    opt.register_step_pre_hook(lambda o, args, kwargs: "wrong")
    with pytest.raises(RuntimeError, match="must return None or a tuple of \\(new_args, new_kwargs\\)"):
        opt.step()


def test_an_optimizer_written_by_a_user_gets_step_hooks_once():
    class Halving(tw.optim.Optimizer):
        def __init__(self, params):
            super().__init__(params, {})

        @tw.no_grad()
        def step(self, closure=None):
            for group in self.param_groups:
                for p in group["params"]:
                    p.mul_(0.5)

    class Quartering(Halving):
        def step(self, closure=None):
            super().step()
            super().step()

    p = tw.nn.Parameter(tw.ones(2))
    opt = Quartering([p])
    calls = []
    opt.register_step_pre_hook(lambda o, args, kwargs: calls.append("pre"))
    opt.register_step_post_hook(lambda o, args, kwargs: calls.append("post"))
    opt.step()
    assert calls == ["pre", "post"] and p.tolist() == [0.25, 0.25]


def test_state_dict_and_load_state_dict_hooks():
    p = tw.nn.Parameter(tw.ones(2))
    opt = tw.optim.SGD([p], lr=0.5)
    order = []
    opt.register_state_dict_pre_hook(lambda o: order.append("pre"))
    opt.register_state_dict_post_hook(lambda o, sd: {**sd, "extra": 1})
    opt.register_state_dict_post_hook(lambda o, sd: order.append("first"), prepend=True)
    state = opt.state_dict()
    assert state["extra"] == 1 and order == ["pre", "first"]

    def halve_lr(o, sd):
        sd = dict(sd)
        sd["param_groups"] = [{**g, "lr": g["lr"] / 2} for g in sd["param_groups"]]
        return sd

    opt.register_load_state_dict_pre_hook(halve_lr)
    opt.register_load_state_dict_post_hook(lambda o: order.append("loaded"))
    opt.load_state_dict(state)
    assert opt.param_groups[0]["lr"] == 0.25 and order[-1] == "loaded"


def test_zero_grad_keeps_or_drops_gradients_as_torch_does():
    p = tw.nn.Parameter(tw.ones(3))
    opt = tw.optim.Adam([p])
    (p * p).sum().backward()
    grad = p.grad
    opt.zero_grad(set_to_none=False)
    assert p.grad is grad and p.grad.tolist() == [0.0] * 3 and not p.grad.requires_grad
    opt.zero_grad()
    assert p.grad is None


@pytest.mark.parametrize("name", ["SGD", "Adam", "AdamW", "Adagrad"])
def test_fused_refusals_match_torch(name):
    for lib in (tw, torch):
        p = lib.nn.Parameter(lib.zeros(2))
        opt_class = getattr(lib.optim, name)
        with pytest.raises(RuntimeError, match="`fused` and `foreach` cannot be `True` together."):
            opt_class([p], fused=True, foreach=True)
        with pytest.raises(RuntimeError, match="`fused` does not support `differentiable`"):
            opt_class([p], fused=True, differentiable=True)
    q = tw.zeros(2, dtype=tw.int64)
    q.grad = tw.zeros(2, dtype=tw.int64)
    with pytest.raises(RuntimeError, match="`fused=True` requires all the params to be floating point"):
        getattr(tw.optim, name)([q], fused=True).step()


@pytest.mark.parametrize("name", ["SGD", "Adam", "AdamW", "RMSprop", "Adagrad", "Adadelta", "Adamax", "NAdam",
                                  "RAdam", "LBFGS", "ASGD", "Rprop", "Adafactor"])
def test_arguments_and_printed_form_are_torchs(name):
    """Each optimizer takes exactly torch's arguments, in torch's order and kinds, with torch's defaults (``0``
    where torch has ``0``): those torch lacks (``fused`` where it has no fused kernel) are a TypeError in both, and
    the optimizer prints as torch's does."""
    import inspect

    def described(lib):
        parameters = inspect.signature(getattr(lib.optim, name)).parameters.values()
        return [(p.name, p.kind, p.default, type(p.default)) for p in parameters]

    assert described(tw) == described(torch)
    assert repr(getattr(tw.optim, name)([tw.nn.Parameter(tw.zeros(1))])) == \
        repr(getattr(torch.optim, name)([torch.nn.Parameter(torch.zeros(1))]))


@pytest.mark.parametrize("name,bad", [
    ("Adadelta", dict(rho=1.5)), ("Adadelta", dict(eps=-1.0)), ("Adadelta", dict(lr=-0.1)),
    ("Adamax", dict(betas=(1.0, 0.9))), ("Adamax", dict(betas=(0.9, -0.1))), ("Adamax", dict(weight_decay=-1.0)),
    ("NAdam", dict(momentum_decay=-1.0)), ("NAdam", dict(eps=-1.0)), ("RAdam", dict(betas=(0.9, 1.0))),
    ("RAdam", dict(weight_decay=-1.0)), ("Adagrad", dict(initial_accumulator_value=-1.0)),
    ("Adagrad", dict(lr_decay=-1.0)), ("RMSprop", dict(alpha=-1.0)), ("SGD", dict(momentum=-1.0)),
    ("Adam", dict(betas=(0.9, 1.0))), ("LBFGS", dict(lr=-1.0)), ("ASGD", dict(weight_decay=-1.0)),
    ("Rprop", dict(etas=(1.0, 1.2))), ("Rprop", dict(lr=-1.0)), ("Adafactor", dict(beta2_decay=0.5)),
    ("Adafactor", dict(eps=(-1.0, 1e-3))), ("Adafactor", dict(eps=(None, -1.0))), ("Adafactor", dict(d=0.5)),
    ("Adafactor", dict(weight_decay=-1.0)), ("Adafactor", dict(lr=-1.0)),
])
def test_invalid_hyperparameters_raise_torchs_error(name, bad):
    messages = []
    for lib in (tw, torch):
        with pytest.raises(ValueError) as info:
            getattr(lib.optim, name)([lib.nn.Parameter(lib.zeros(2))], **bad)
        messages.append(str(info.value))
    assert messages[0] == messages[1]


def test_parameter_collections_are_checked_as_torch_does():
    p = tw.nn.Parameter(tw.zeros(2))
    with pytest.raises(TypeError, match="ordered collections"):
        tw.optim.SGD([{"params": {p}}])
    with pytest.raises(TypeError, match="should be an iterable of Tensors or dicts"):
        tw.optim.SGD(p)
    with pytest.raises(ValueError, match="non-leaf"):
        tw.optim.Adam([p * 2])
    with pytest.warns(UserWarning, match="duplicate parameters"):
        tw.optim.SGD([p, p])
    opt = tw.optim.SGD([p])
    with pytest.raises(ValueError, match="more than one parameter group"):
        opt.add_param_group({"params": [p]})


def test_capturable_is_accepted_and_changes_nothing():
    """tilewise's updates read nothing back to the host already (the step counts live on the parameters'
    device), so a capturable optimizer is the same optimizer."""
    plain, _ = _trajectory(tw, "Adam", dict(lr=0.02))
    capturable, opt = _trajectory(tw, "Adam", dict(lr=0.02, capturable=True))
    for a, b in zip(plain, capturable):
        np.testing.assert_array_equal(a.detach().numpy(), b.detach().numpy())
    assert opt.param_groups[0]["capturable"] is True


# ---------------------------------------------------------------------------- differentiable steps

DIFFERENTIABLE = [("SGD", dict(lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.1), 3),
                  ("Adam", dict(lr=0.1, amsgrad=True), 1), ("AdamW", dict(lr=0.1), 3),
                  ("RMSprop", dict(lr=0.1, centered=True, momentum=0.5), 1), ("RMSprop", dict(lr=0.1), 3),
                  ("Adagrad", dict(lr=0.1), 3), ("Adadelta", dict(lr=0.5), 3), ("Adamax", dict(lr=0.1), 1),
                  ("NAdam", dict(lr=0.1), 3), ("RAdam", dict(lr=0.1), 3), ("RAdam", dict(lr=0.1, betas=(0.5, 0.5)), 3)]


@pytest.mark.parametrize("name,kwargs,steps", DIFFERENTIABLE,
                         ids=[f"{n}-{k}" for k, (n, _, _) in enumerate(DIFFERENTIABLE)])
def test_differentiable_step_is_part_of_the_autograd_graph_as_in_torch(name, kwargs, steps):
    """``differentiable=True``: the updates are recorded, and the gradient of a loss of the updated parameter with
    respect to the initial one is torch's (over several steps where torch's own state updates allow it), to the last
    bits: differentiable Adam and NAdam compute their step sizes as torch's do there (from the float32 step tensor,
    and the float32 momentum product)."""
    grads = []
    for lib in (tw, torch):
        start = lib.tensor([0.5, -1.0, 2.0], dtype=lib.float64, requires_grad=True)
        p = start.clone()
        opt = getattr(lib.optim, name)([p], differentiable=True, **kwargs)
        for t in range(steps):
            p.grad = (p * 0.5).exp() * (t + 1) - 1.0  # depends on p (and saves a copy, not p, for backward)
            opt.step()
        (p * p).sum().backward()
        grads.append(start.grad.numpy())
    np.testing.assert_allclose(grads[0], grads[1], rtol=1e-12)


def test_foreach_with_differentiable_is_refused_except_for_sgd():
    start = tw.tensor([1.0, 2.0], requires_grad=True)
    p = start.clone()
    p.grad = tw.ones(2)
    with pytest.raises(RuntimeError, match="does not support differentiable=True"):
        tw.optim.Adam([p], foreach=True, differentiable=True).step()
    tw.optim.SGD([p], lr=0.1, foreach=True, differentiable=True).step()  # loops, as torch's records autograd
    p.sum().backward()
    assert start.grad.tolist() == [1.0, 1.0]


# ---------------------------------------------------------------------------- compiled training steps

COMPILED = [("SGD", dict(lr=0.05, momentum=0.9), 1), ("SGD-dampened", dict(lr=0.05, momentum=0.9, dampening=0.1), 2),
            ("RMSprop", dict(lr=0.01, centered=True, momentum=0.5), 1),
            ("Adadelta", dict(lr=1.0, weight_decay=0.01), 1), ("Adamax", dict(lr=0.01), 1),
            ("NAdam", dict(lr=0.01, decoupled_weight_decay=True, weight_decay=0.1), 1),
            ("RAdam", dict(lr=0.01), 1), ("Adagrad", dict(lr=0.1, lr_decay=0.01), 1)]


@pytest.mark.parametrize("name,kwargs,variants", COMPILED, ids=[c[0] for c in COMPILED])
def test_a_compiled_training_step_matches_the_eager_step(name, kwargs, variants):
    """The whole step (forward, backward, the optimizer's update with its step-dependent factors) compiles into
    one program on the CPU target and gives the eager step's numbers. SGD with dampening creates its momentum
    buffers at its first step: a second variant (without dampening compile makes zero buffers first)."""
    def make():
        tw.manual_seed(0)
        model = tw.nn.Sequential(tw.nn.Linear(8, 16), tw.nn.Tanh(), tw.nn.Linear(16, 4))
        opt = getattr(tw.optim, name.split("-")[0])(model.parameters(), **kwargs)

        def step(x, y):
            loss = ((model(x) - y) ** 2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            return loss.detach()

        return model, step

    tw.manual_seed(1)
    data = [(tw.randn(16, 8), tw.randn(16, 4)) for _ in range(8)]
    (eager_model, eager), (compiled_model, step) = make(), make()
    compiled = tw.compile(step)
    for x, y in data:
        np.testing.assert_allclose(compiled(x, y).item(), eager(x, y).item(), rtol=1e-5)
    assert len(compiled.variants) == variants and compiled.eager_reason is None
    for a, b in zip(compiled_model.parameters(), eager_model.parameters()):
        np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", ["AdamW", "NAdam", "RAdam", "Adamax", "RMSprop"])
def test_a_compiled_training_step_under_a_scheduler_compiles_once_with_a_tensor_lr(name):
    """A float learning rate is a constant of the compiled step (a scheduler's new value recompiles, as a
    Python number does under torch.compile); a tensor one is filled in place by the scheduler and read by the
    program at run time: one variant for the whole schedule, and the eager numbers."""
    def make():
        tw.manual_seed(0)
        model = tw.nn.Linear(8, 4)
        opt = getattr(tw.optim, name)(model.parameters(), lr=tw.tensor(0.01))
        sched = tw.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.05, total_steps=12, cycle_momentum=False)

        def step(x, y):
            loss = ((model(x) - y) ** 2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            return loss.detach()

        return model, step, sched

    (eager_model, eager, eager_sched), (model, step, sched) = make(), make()
    compiled = tw.compile(step)
    tw.manual_seed(1)
    for _ in range(12):
        x, y = tw.randn(16, 8), tw.randn(16, 4)
        np.testing.assert_allclose(compiled(x, y).item(), eager(x, y).item(), rtol=1e-5)
        sched.step()
        eager_sched.step()
    assert len(compiled.variants) == 1 and compiled.eager_reason is None
    np.testing.assert_allclose(model.weight.detach().numpy(), eager_model.weight.detach().numpy(), rtol=1e-5,
                               atol=1e-6)


@pytest.mark.parametrize("module", ["tilewise.optim.optimizer", "tilewise.optim.adadelta", "tilewise.optim.lbfgs",
                                    "tilewise.optim.lr_scheduler.base", "tilewise.optim.lr_scheduler.schedules",
                                    "tilewise.optim.lr_scheduler.combined", "tilewise.optim.lr_scheduler.plateau",
                                    "tilewise.optim.swa_utils", "tilewise.optim.sparse_adam"])
def test_docstring_examples_run(module):
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(module), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0 and result.attempted > 0


# ---------------------------------------------------------------------------- CUDA

CUDA_CASES = [("SGD", dict(lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.1)),
              ("RMSprop", dict(centered=True, momentum=0.5)), ("Adagrad", dict(lr_decay=0.1)),
              ("Adadelta", dict(weight_decay=0.1)), ("Adamax", dict(maximize=True)),
              ("NAdam", dict(decoupled_weight_decay=True, weight_decay=0.1)), ("RAdam", dict(weight_decay=0.1)),
              ("ASGD", dict(t0=3, weight_decay=0.1)), ("Rprop", dict(maximize=True)),
              ("Adafactor", dict(weight_decay=0.1))]


@pytest.mark.parametrize("name,kwargs", CUDA_CASES, ids=[c[0] for c in CUDA_CASES])
def test_each_group_update_lowers_to_cuda_kernels_that_nvrtc_compiles(name, kwargs):
    """On CUDA a group's update runs compiled by default (foreach=None): its kernels build for sm_90 (checked
    without a GPU)."""
    from tilewise.codegen.toolchain import compile_cached
    from tilewise.compiler.capture import trace
    from tilewise.compiler.passes import run_pipeline
    from tilewise.compiler.program import lower_program
    from tilewise.compiler.targets import CUDA_TARGET

    params = [tw.randn(*shape).requires_grad_() for shape in ((64, 32), (32,))]
    for p in params:
        p.grad = tw.randn(*p.shape)
    opt = getattr(tw.optim, name)(params, **kwargs)
    opt.init_state()
    if name == "SGD":
        opt.step()  # the momentum buffers
    low = lower_program(run_pipeline(trace(lambda: opt.step(), (), {}).graph), CUDA_TARGET)
    assert low.kernels
    for kernel, source in low.sources.items():
        compile_cached(source, kernel, "sm_90")


@pytest.mark.cuda
@pytest.mark.parametrize("name,kwargs", CUDA_CASES, ids=[c[0] for c in CUDA_CASES])
def test_the_default_compiled_update_on_cuda_matches_the_cpu_loop(name, kwargs):
    runs = []
    for device in ("cpu", "cuda"):
        init, target, noise = _problem("float32", 10)
        params = [tw.nn.Parameter(tw.tensor(a.copy()).to(device)) for a in init]
        opt = getattr(tw.optim, name)(params, **kwargs)
        for t in range(10):
            for k, p in enumerate(params[:NO_GRAD]):
                p.grad = (p.detach() - tw.tensor(target[k]).to(device)) * 2 + tw.tensor(noise[t][k]).to(device)
            opt.step()
        runs.append((params, opt))
    (cpu, _), (cuda, opt) = runs
    _assert_close_params([p.cpu() for p in cuda], cpu)
    assert len(opt._programs) == 1

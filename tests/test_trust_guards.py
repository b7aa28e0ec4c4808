"""tilewise.compile tracks the Python state a compiled function read: each change gives eager's (and torch's) result.

Every scenario runs three times — tilewise compiled, tilewise eager, torch eager — through the same code, with the
library passed in; the compiled run must match both at every call, before and after the state changes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import torch

import tilewise as tw
from tilewise.config import settings


def _np(t):
    return t.detach().cpu().numpy() if hasattr(t, "detach") else np.asarray(t)


def check(scenario) -> list:
    """Run ``scenario(lib, compile)`` compiled and eagerly in tilewise and eagerly in torch; compare every value."""
    compiled = scenario(tw, tw.compile)
    eager = scenario(tw, lambda f: f)
    reference = scenario(torch, lambda f: f)
    assert len(compiled) == len(eager) == len(reference)
    for k, (c, e, r) in enumerate(zip(compiled, eager, reference)):
        np.testing.assert_allclose(_np(c), _np(r), rtol=1e-5, atol=1e-6, err_msg=f"call {k}: compiled vs torch")
        np.testing.assert_allclose(_np(e), _np(r), rtol=1e-5, atol=1e-6, err_msg=f"call {k}: eager vs torch")
    return compiled


SCALE = 2.0
OFFSET = None
LIB = None


def _scaled(x):
    return x * SCALE


def test_a_rebound_global_float():
    def scenario(lib, compile_):
        global SCALE
        SCALE = 2.0
        f = compile_(_scaled)
        x = lib.ones(3)
        out = [f(x)]
        SCALE = 3.0
        out.append(f(x))
        SCALE = 3.0
        out.append(f(x))
        return out

    check(scenario)


def _offset(x):
    return x + OFFSET


@pytest.mark.parametrize("shape", [(3,), (1,)], ids=["same shape", "broadcast shape"])
def test_a_rebound_global_tensor(shape):
    def scenario(lib, compile_):
        global OFFSET
        OFFSET = lib.ones(3)
        f = compile_(_offset)
        x = lib.arange(3.0)
        out = [f(x)]
        OFFSET = lib.full(shape, 5.0)
        out.append(f(x))
        return out

    check(scenario)


def test_a_rebound_closure_variable():
    def scenario(lib, compile_):
        k = 1.5

        def f(x):
            return x * k

        cf = compile_(f)
        x = lib.ones(2)
        out = [cf(x)]
        k = -4.0
        out.append(cf(x))
        return out

    check(scenario)


def test_a_list_in_a_closure_changed_between_calls():
    def scenario(lib, compile_):
        weights = [1.0, 2.0]

        def f(x):
            return sum(x * w for w in weights)

        cf = compile_(f)
        x = lib.ones(2)
        out = [cf(x)]
        weights.append(10.0)
        out.append(cf(x))
        weights[0] = -1.0
        out.append(cf(x))
        return out

    check(scenario)


def _linear(lib, weight):
    m = lib.nn.Linear(3, 2, bias=False)
    with lib.no_grad():
        m.weight.copy_(lib.tensor(weight))
    return m


def test_a_replaced_parameter():
    def scenario(lib, compile_):
        m = _linear(lib, [[1.0, 2.0, 3.0], [0.0, 1.0, 0.0]])
        f = compile_(lambda x: m(x))
        x = lib.ones(1, 3)
        out = [f(x)]
        m.weight = lib.nn.Parameter(lib.full((2, 3), 0.5))
        out.append(f(x))
        return out

    check(scenario)


def test_load_state_dict_with_assign():
    def scenario(lib, compile_):
        m = _linear(lib, [[1.0, 2.0, 3.0], [0.0, 1.0, 0.0]])
        f = compile_(m)
        x = lib.ones(1, 3)
        out = [f(x)]
        m.load_state_dict({"weight": lib.full((2, 3), -1.0)}, assign=True)
        out.append(f(x))
        m.load_state_dict({"weight": lib.full((2, 3), 2.0)})  # a copy into the same tensor
        out.append(f(x))
        return out

    check(scenario)


def test_eval_and_train_switch_batch_norm_statistics():
    def scenario(lib, compile_):
        lib.manual_seed(0)
        bn = lib.nn.BatchNorm1d(3)
        f = compile_(bn)
        x = lib.tensor([[1.0, 2.0, 3.0], [3.0, 0.0, -1.0], [2.0, 2.0, 2.0]])
        out = [f(x)]
        bn.eval()
        out.append(f(x))
        bn.train()
        out.append(f(x))
        out.append(bn.running_mean.clone())
        return out

    check(scenario)


def test_the_compiled_module_and_the_original_share_their_state():
    m = _linear(tw, [[1.0, 2.0, 3.0], [0.0, 1.0, 0.0]])
    m.calls = 0

    class Counting(tw.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = m
            self.calls = 0

        def forward(self, x):
            self.calls += 1
            return self.inner(x)

    model = Counting()
    compiled = tw.compile(model)
    for _ in range(3):
        compiled(tw.ones(1, 3))
    assert model.calls == 3 and compiled.calls == 3
    compiled.eval()
    assert not model.training and not model.inner.training
    assert isinstance(compiled, Counting) and list(compiled.state_dict()) == list(model.state_dict())


def test_a_module_attribute_and_a_class_attribute():
    def scenario(lib, compile_):
        class Scaled(lib.nn.Module):
            shift = 1.0

            def __init__(self):
                super().__init__()
                self.scale = 2.0

            def forward(self, x):
                return x * self.scale + self.shift

        m = Scaled()
        f = compile_(m)
        x = lib.ones(2)
        out = [f(x)]
        m.scale = 5.0
        out.append(f(x))
        Scaled.shift = -3.0
        out.append(f(x))
        return out

    check(scenario)


@dataclass
class Config:
    alpha: float = 0.5
    depth: int = 2


CONFIG = Config()


def _configured(x):
    for _ in range(CONFIG.depth):
        x = x * CONFIG.alpha + 1
    return x


def test_a_config_object_changed_in_place():
    def scenario(lib, compile_):
        CONFIG.alpha, CONFIG.depth = 0.5, 2
        f = compile_(_configured)
        x = lib.ones(2)
        out = [f(x)]
        CONFIG.alpha = 2.0
        out.append(f(x))
        CONFIG.depth = 4
        out.append(f(x))
        return out

    check(scenario)


MODEL = None
OPTIMIZER = None


def _make(lib, seed: int):
    global MODEL, OPTIMIZER
    weights = np.random.default_rng(seed).standard_normal((2, 4)).astype(np.float32)
    MODEL = lib.nn.Linear(4, 2)
    with lib.no_grad():
        MODEL.weight.copy_(lib.tensor(weights))
        MODEL.bias.zero_()
    OPTIMIZER = lib.optim.SGD(MODEL.parameters(), lr=0.1)


def _train_step(x, y):
    loss = ((MODEL(x) - y) ** 2).mean()
    loss.backward()
    OPTIMIZER.step()
    OPTIMIZER.zero_grad()
    return loss.detach()


def test_a_rebound_model_and_optimizer():
    def scenario(lib, compile_):
        step = compile_(_train_step)
        x, y = lib.ones(3, 4), lib.zeros(3, 2)
        out = []
        for seed in (0, 1):
            _make(lib, seed)  # `model, opt = make()` again: the old program must not train the old model
            out += [step(x, y) for _ in range(3)]
            out.append(MODEL.weight.detach().clone())
        return out

    check(scenario)


def _make_ones():
    return tw.ones(2) * 2


def test_the_default_dtype_is_guarded():
    f = tw.compile(_make_ones)
    assert f().dtype == tw.float32
    tw.set_default_dtype(tw.float64)
    try:
        assert f().dtype == tw.float64
    finally:
        tw.set_default_dtype(tw.float32)
    assert f().dtype == tw.float32 and len(f.variants) == 2


def test_recompiles_names_the_guard_that_failed(capsys):
    global SCALE
    SCALE = 2.0
    f = tw.compile(_scaled)
    settings.log.add("recompiles")
    try:
        f(tw.ones(2))
        SCALE = 4.0
        f(tw.ones(2))
    finally:
        settings.log.discard("recompiles")
        SCALE = 2.0
    assert "global 'SCALE' is now 4.0" in capsys.readouterr().err


def test_unrelated_module_changes_do_not_recompile():
    m = _linear(tw, [[1.0, 2.0, 3.0], [0.0, 1.0, 0.0]])
    f = tw.compile(m)
    f(tw.ones(1, 3))
    other = tw.nn.Linear(2, 2)
    other.extra = 3  # another module changes: the guards re-check what f read, which did not change
    f(tw.ones(1, 3))
    m.unread = "x"  # an attribute f never read
    f(tw.ones(1, 3))
    assert len(f.forward.variants) == 1


def test_a_global_read_inside_a_helper_function_is_guarded():
    def scenario(lib, compile_):
        global SCALE
        SCALE = 2.0

        def f(x):
            return _scaled(x) + 1  # the global is read by a function the compiled one calls

        cf = compile_(f)
        out = [cf(lib.ones(2))]
        SCALE = -1.0
        out.append(cf(lib.ones(2)))
        return out

    check(scenario)


WEIGHTS = np.array([1.0, 2.0, 3.0], dtype=np.float32)


def _weighted(x):
    return x * WEIGHTS_LIB.tensor(WEIGHTS)


WEIGHTS_LIB = tw


def test_a_numpy_array_changed_in_place():
    def scenario(lib, compile_):
        global WEIGHTS_LIB
        WEIGHTS_LIB = lib
        WEIGHTS[:] = [1.0, 2.0, 3.0]
        f = compile_(_weighted)
        out = [f(lib.ones(3))]
        WEIGHTS[1] = -5.0  # the trace made a tensor of the array: its values are guarded
        out.append(f(lib.ones(3)))
        return out

    check(scenario)


def test_a_step_that_clears_the_gradient_itself_compiles_twice_at_most():
    x = tw.ones(3, requires_grad=True)

    def f():
        x.grad = None  # what .grad held before the call (None, then a tensor) is what the guard compares
        (x * x).sum().backward()
        return x.grad * 1

    compiled = tw.compile(f)
    for _ in range(4):
        assert compiled().tolist() == [2.0, 2.0, 2.0]
    assert len(compiled.variants) == 2


def _linear_with(lib, weights):
    model = lib.nn.Linear(4, 2)
    with lib.no_grad():
        model.weight.copy_(lib.tensor(weights))
        model.bias.fill_(0.5)
    return model


def test_a_backward_through_history_made_before_each_call():
    """REINFORCE's update: log-probabilities taken before the call (a new autograd graph each episode, over new
    states and with new scaling) are summed and backpropagated inside the compiled step. Their graph is no input a
    guard sees, so a replay would differentiate the first call's graph again."""
    weights = np.random.default_rng(3).standard_normal((2, 4)).astype(np.float32)

    def scenario(lib, compile_):
        model = _linear_with(lib, weights)
        opt = lib.optim.Adam(model.parameters(), lr=0.05)

        @compile_
        def finish_episode(saved_log_probs):
            opt.zero_grad()
            loss = lib.cat(saved_log_probs).sum()
            loss.backward()
            opt.step()
            return loss.detach()

        out = []
        for episode in range(4):
            saved = [lib.log_softmax(model(lib.full((1, 4), 0.1 * (episode + t))), -1)[:, 0] * (t + 1.5 * episode)
                     for t in range(3)]
            out += [finish_episode(saved), model.weight.detach().clone()]
        return out

    check(scenario)


def test_a_backward_from_a_loss_made_before_each_call():
    weights = np.random.default_rng(4).standard_normal((2, 4)).astype(np.float32)

    def scenario(lib, compile_):
        model = _linear_with(lib, weights)
        opt = lib.optim.SGD(model.parameters(), lr=0.1)

        @compile_
        def update(loss):
            opt.zero_grad()
            loss.backward()
            opt.step()

        out = []
        for k in range(4):
            update((model(lib.full((3, 4), float(k))) ** 2).mean() * (k + 1))
            out.append(model.weight.detach().clone())
        return out

    check(scenario)


def test_a_detached_argument_is_read_anew_on_every_call():
    """``h.detach()`` (and ``h.data``) make a new tensor object over the argument's memory on every call: a replay
    must read the argument it is given, not the first call's."""
    weights = np.arange(3, dtype=np.float32)

    def scenario(lib, compile_):
        w = lib.tensor(weights, requires_grad=True)
        detached = compile_(lambda h: (h.detach() * w).sum() + h.data.sum())
        return [detached(lib.full((3,), float(k))) for k in range(3)]

    check(scenario)


def test_truncated_backpropagation_through_time_carries_the_hidden_state():
    """word_language_model's step: the hidden state a call returns comes back, detached, in the next call."""
    weights = np.random.default_rng(5).standard_normal((4, 4)).astype(np.float32) * 0.5

    def scenario(lib, compile_):
        rnn = lib.nn.RNN(4, 4, 1)
        with lib.no_grad():
            for p in rnn.parameters():
                p.copy_(lib.tensor(weights[: p.shape[0]].reshape(-1)[: p.numel()].reshape(p.shape)))

        @compile_
        def step(x, hidden):
            rnn.zero_grad()
            out, hidden = rnn(x, hidden.detach())
            loss = out.pow(2).mean()
            loss.backward()
            for p in rnn.parameters():
                p.data.add_(p.grad, alpha=-0.5)
            return loss.detach(), hidden

        out = []
        for _epoch in range(2):
            hidden = lib.zeros(1, 2, 4)
            for k in range(2):
                loss, hidden = step(lib.full((3, 2, 4), 0.3 * (k + 1)), hidden)
                out += [loss, hidden]
        return out

    check(scenario)


@pytest.mark.parametrize("requires_grad", [True, False])
def test_a_held_tensor_read_through_detach_after_its_data_is_replaced(requires_grad):
    def scenario(lib, compile_):
        w = lib.ones(3, requires_grad=requires_grad)
        scaled = compile_(lambda x: x * w.detach())
        out = []
        for k in range(3):
            out.append(scaled(lib.ones(3)))
            w.data = lib.full((3,), float(k + 2))
        return out

    check(scenario)


def test_fullgraph_refuses_a_backward_through_history_made_before_the_call():
    model = tw.nn.Linear(2, 1)

    @tw.compile(fullgraph=True)
    def update(loss):
        loss.backward()
        return loss.detach()

    with pytest.raises(tw.compiler.errors.DataDependentError, match=r"update runs through autograd history made"):
        update(model(tw.ones(1, 2)).sum())
    assert model.weight.grad is None, "the refused call left a gradient behind"


def test_fresh_arguments_each_call_are_checked_for_shared_storage():
    # a training loop passes new tensors at every call: each call's arguments may share storage with each other or
    # with a tensor the function holds, and the variant compiled for separate storages must not serve those calls
    def scenario(lib, compile_):
        held = lib.arange(6.0)

        def f(x, y):
            x.mul_(2)  # read through y after the write when y shares x's storage
            return x + y * held

        fn = compile_(f)
        out = []
        for call in range(9):
            base = lib.arange(6.0) + call
            kind = call % 3 if call < 6 else 0
            if kind == 0:
                x, y = base.clone(), base.clone() + 1  # separate storages
            elif kind == 1:
                x = base.clone()
                y = x  # the same tensor
            else:
                x, y = held, base.clone()  # the held tensor itself
            out.append(fn(x, y).clone())
            out.append(held.clone())
        return out

    check(scenario)


def _same(got, want, rtol=1e-5, atol=1e-6):
    np.testing.assert_allclose(_np(got), _np(want), rtol=rtol, atol=atol)


def test_fresh_arguments_of_the_same_layout_do_not_recompile():
    w = tw.randn(8, 8)
    fn = tw.compile(lambda x, y: (x @ w + y).relu())
    for _ in range(5):
        x, y = tw.randn(4, 8), tw.randn(4, 8)
        _same(fn(x, y), (x @ w + y).relu())
    assert len(fn.variants) == 1
    x = tw.randn(4, 8)
    _same(fn(x, x), (x @ w + x).relu())  # shared: another variant, the right result
    assert len(fn.variants) == 2
    x, y = tw.randn(4, 8), tw.randn(4, 8)
    _same(fn(x, y), (x @ w + y).relu())
    assert len(fn.variants) == 2


# A view without a grad_fn of a tensor that requires grad (made under no_grad or in inference mode, or before its base
# required grad) requires grad through its base: what is computed from it requires grad and has a grad_fn, though no
# gradient reaches the view or its base. A compiled function gives its outputs the same flags, follows the base's
# flag from call to call, and tells such a view from a tensor that requires grad itself.

def _autograd_of(lib, y, *tensors) -> list:
    """What eager autograd makes of ``y``: its flags, and the gradients its backward leaves in ``tensors``."""
    seen = [y.detach().clone(), float(y.requires_grad), float(y.grad_fn is None)]
    if y.requires_grad:
        y.sum().backward()
    return seen + [t.grad.clone() if t.grad is not None else lib.tensor(-1.0) for t in tensors]


@pytest.mark.parametrize("made_under", ["no_grad", "inference_mode"])
def test_a_view_that_requires_grad_through_its_base_as_an_argument(made_under):
    def scenario(lib, compile_):
        f = compile_(lambda a: a * 2 + 1)
        out = []
        for k in range(3):
            x = lib.tensor([1.0, -2.0, 3.0 + k], requires_grad=True)
            with lib.no_grad() if made_under == "no_grad" else lib.inference_mode():
                v = x[:2]
            out += _autograd_of(lib, f(v), x, v)
        return out

    check(scenario)


def test_a_held_view_follows_its_bases_requires_grad_from_call_to_call():
    def scenario(lib, compile_):
        x = lib.tensor([1.0, -2.0, 3.0])
        with lib.no_grad():
            w = x[:2]
        f = compile_(lambda a: a * w)
        out = []
        for flag in (False, False, True, True, False, True):
            x.requires_grad_(flag)
            out += _autograd_of(lib, f(lib.ones(2)), x, w)
        return out

    check(scenario)


def test_an_argument_view_follows_its_bases_requires_grad_from_call_to_call():
    def scenario(lib, compile_):
        f = compile_(lambda a: a.exp())
        x = lib.tensor([1.0, -2.0, 3.0], requires_grad=True)
        with lib.no_grad():
            v = x[1:]
        out = []
        for flag in (True, False, True):
            x.requires_grad_(flag)
            out += _autograd_of(lib, f(v), x, v)
        return out

    check(scenario)


def test_a_view_requiring_grad_through_its_base_or_by_its_own_flag_or_not_at_all():
    def scenario(lib, compile_):
        f = compile_(lambda a: a * 3)
        out = []
        for kind in ("plain", "through its base", "its own flag", "through its base", "plain"):
            x = lib.tensor([1.0, -2.0, 3.0], requires_grad=kind != "plain")
            with lib.no_grad():
                v = x[:2]
            if kind == "its own flag":
                v.requires_grad_(True)
            out += _autograd_of(lib, f(v), x, v)
        return out

    check(scenario)


def test_a_view_made_afresh_from_a_base_written_with_history():
    """The view is taken before its base is written in place (by a value that requires grad): autograd makes it
    afresh from the base's new history, so the gradient reaches what was written."""
    def scenario(lib, compile_):
        f = compile_(lambda a: a * 2)
        out = []
        for k in range(3):
            w = lib.tensor(3.0 + k, requires_grad=True)
            b = lib.tensor([1.0, -2.0, 3.0])
            v = b[:2]
            b.mul_(w)
            out += _autograd_of(lib, f(v), w)
            x = lib.tensor([1.0, -2.0, 3.0], requires_grad=True)
            c = x * 1
            u = c[:2]  # a view with history of its own, written after it was made
            c.add_(k)
            out += _autograd_of(lib, f(u), x)
        return out

    check(scenario)

"""Graph breaks and side effects in tilewise.compile: Python that needs values, prints or changes state runs on
every call, and the operators around it run compiled (see [Note: segmented calls]); with fullgraph=True the
same points raise naming the user's line. torch eager is the oracle for every value.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tilewise as tw
from tilewise.compiler import DataDependentError


def _np(t):
    return t.detach().cpu().numpy() if hasattr(t, "detach") else np.asarray(t)


def assert_same(a, b, what=""):
    np.testing.assert_allclose(_np(a), _np(b), rtol=1e-5, atol=1e-6, err_msg=what)


def test_item_in_the_middle_of_a_function():
    def f(lib, x):
        s = (x * 2).sum()
        k = s.item()  # a break: the sum runs, Python gets its value
        return x * k + 1

    compiled = tw.compile(lambda x: f(tw, x))
    for values in ([1.0, 2.0], [3.0, -1.0], [1.0, 2.0]):
        assert_same(compiled(tw.tensor(values)), f(torch, torch.tensor(values)))
    assert not compiled.variants and compiled.eager_reason is None
    # the sum's segment serves every call; the value read is a constant of the next segment, as a
    # specialised Python number is in torch.compile: one program per distinct value (6 and 4)
    assert len(compiled.segments.programs) == 3


def test_a_data_dependent_branch_takes_each_path():
    def f(lib, x):
        if x.sum() > 0:
            return x.exp()
        return x.abs() * 3

    compiled = tw.compile(lambda x: f(tw, x))
    for values in ([1.0, 2.0], [-3.0, -1.0], [0.5, 0.25]):
        assert_same(compiled(tw.tensor(values)), f(torch, torch.tensor(values)))


def test_print_runs_on_every_call_with_the_values(capsys):
    def f(x):
        y = x * 2
        print("y is", y)
        return y + 1

    compiled = tw.compile(f)
    for k in range(3):
        out = compiled(tw.full((2,), float(k)))
        assert out.tolist() == [2.0 * k + 1] * 2
    printed = capsys.readouterr().out.splitlines()
    assert printed == [f"y is tensor([{2 * k}., {2 * k}.])" for k in range(3)]


LOSSES = []


def _logging_step(x):
    loss = (x * x).sum()
    LOSSES.append(loss)  # a side effect: runs on every call, keeps a real tensor
    return loss * 2


def test_appending_to_a_list_runs_on_every_call_and_keeps_real_tensors():
    LOSSES.clear()
    compiled = tw.compile(_logging_step)
    for k in range(4):
        assert compiled(tw.full((3,), float(k))).item() == 6.0 * k * k
    assert [loss.item() for loss in LOSSES] == [3.0 * k * k for k in range(4)]


def test_a_counter_counts_every_call():
    class Counted(tw.nn.Module):
        def __init__(self):
            super().__init__()
            self.calls = 0
            self.lin = tw.nn.Linear(2, 2)

        def forward(self, x):
            self.calls += 1
            return self.lin(x) * self.calls

    m = Counted()
    compiled = tw.compile(m)
    outs = [compiled(tw.ones(1, 2)) for _ in range(3)]
    assert m.calls == 3
    base = m.lin(tw.ones(1, 2))
    for k, out in enumerate(outs):
        assert_same(out, base * (k + 1))


def test_values_read_through_tolist_and_numpy():
    def f(lib, x):
        n = int(x.max().tolist())
        host = x.detach().cpu().numpy() if lib is torch else x.numpy()
        return x.repeat(n) * float(host.sum())

    compiled = tw.compile(lambda x: f(tw, x))
    for values in ([1.0, 2.0], [3.0, 1.0]):
        assert_same(compiled(tw.tensor(values)), f(torch, torch.tensor(values)))


def test_operators_whose_result_shape_depends_on_values():
    def f(lib, x):
        kept = x[x > 0]
        idx = lib.nonzero(x < 0).flatten()
        return kept.sum() * 2 + idx.sum(), lib.masked_select(x, x.abs() > 1) + 1

    compiled = tw.compile(lambda x: f(tw, x))
    for values in ([1.0, -2.0, 3.5, -0.5], [-1.0, -2.0, 2.0, 2.0]):
        for got, want in zip(compiled(tw.tensor(values)), f(torch, torch.tensor(values))):
            assert_same(got, want)


def _training(lib, compile_, log):
    lib.manual_seed(0)
    weights = np.random.default_rng(1).standard_normal((3, 4)).astype(np.float32)
    model = lib.nn.Linear(4, 3)
    with lib.no_grad():
        model.weight.copy_(lib.tensor(weights))
        model.bias.fill_(0.1)
    opt = lib.optim.AdamW(model.parameters(), lr=0.05)

    def step(x, y):
        loss = lib.nn.functional.cross_entropy(model(x), y)
        log.append(round(loss.item(), 5))  # the idiomatic progress line, in the middle of the step
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss.detach()

    step = compile_(step)
    data = np.random.default_rng(2).standard_normal((5, 6, 4)).astype(np.float32)
    labels = np.random.default_rng(3).integers(0, 3, (5, 6))
    losses = [step(lib.tensor(d), lib.tensor(t)) for d, t in zip(data, labels)]
    return losses, model.weight.detach().clone()


def test_a_training_step_that_reads_its_loss_midway():
    logs = {"compiled": [], "torch": []}
    losses, weight = _training(tw, tw.compile, logs["compiled"])
    torch_losses, torch_weight = _training(torch, lambda f: f, logs["torch"])
    for a, b in zip(losses, torch_losses):
        assert_same(a, b)
    assert_same(weight, torch_weight)
    np.testing.assert_allclose(logs["compiled"], logs["torch"], rtol=1e-4)


def test_backward_after_a_call_with_a_break():
    def f(lib, x, w):
        h = (x @ w).tanh()
        if h.mean() > 0:  # a break between the forward's pieces
            h = h * 2
        return (h * h).sum()

    x = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)
    w = np.random.default_rng(1).standard_normal((3, 5)).astype(np.float32)
    tw_w, torch_w = tw.tensor(w, requires_grad=True), torch.tensor(w, requires_grad=True)
    compiled = tw.compile(lambda x, w: f(tw, x, w))
    out = compiled(tw.tensor(x), tw_w)
    want = f(torch, torch.tensor(x), torch_w)
    assert_same(out, want)
    out.backward()
    want.backward()
    assert_same(tw_w.grad, torch_w.grad)


def test_in_place_updates_and_views_across_a_break():
    def f(lib, x):
        x.mul_(2)
        head = x[:2]
        if head.sum() > 0:
            head.add_(1)  # through a view of the argument, after the break
        x[3] = x.max()
        return head * 1, x.sum()

    compiled = tw.compile(lambda x: f(tw, x))
    for values in ([1.0, 2.0, 3.0, 4.0], [-1.0, -2.0, 3.0, 0.0]):
        a, b = tw.tensor(values), torch.tensor(values)
        got, want = compiled(a), f(torch, b)
        for g, w in zip(got, want):
            assert_same(g, w)
        assert_same(a, b)


def test_random_draws_across_a_break_follow_the_eager_sequence():
    def f(x):
        y = tw.nn.functional.dropout(x, 0.5)
        if y.sum() >= 0:
            y = y + tw.rand(4)
        return y

    compiled = tw.compile(f)
    tw.manual_seed(7)
    got = [compiled(tw.ones(4)) for _ in range(3)]
    tw.manual_seed(7)
    want = [f(tw.ones(4)) for _ in range(3)]
    for g, w in zip(got, want):
        assert_same(g, w)


def _fullgraph_item(x):
    return x * x.sum().item()  # the offending line


def _fullgraph_bool(x):
    return x if x.sum() > 0 else -x  # the offending line


def _fullgraph_print(x):
    print("hello")  # the offending line
    return x


def _fullgraph_nonzero(x):
    return x[x > 0]  # the offending line


def _fullgraph_numpy(x):
    return x * float(x.numpy().sum())  # the offending line


@pytest.mark.parametrize("fn", [_fullgraph_item, _fullgraph_bool, _fullgraph_print, _fullgraph_nonzero,
                                _fullgraph_numpy], ids=lambda f: f.__name__)
def test_fullgraph_raises_at_the_users_line(fn):
    with pytest.raises(DataDependentError) as info:
        tw.compile(fn, fullgraph=True)(tw.ones(3))
    message = str(info.value)
    assert "test_trust_graph_breaks.py" in message and "the offending line" in message


def test_a_function_without_side_effects_stays_one_replayed_variant():
    f = tw.compile(lambda x: (x * 2).relu().sum(0))
    for _ in range(3):
        f(tw.ones(3, 2))
    assert len(f.variants) == 1 and not f.segments.programs


def test_a_cache_filled_on_the_first_call_becomes_a_variant_afterwards():
    class Rotary(tw.nn.Module):
        def __init__(self):
            super().__init__()
            self.cached = None

        def forward(self, x):
            if self.cached is None or self.cached.shape[0] < x.shape[0]:
                self.cached = tw.arange(x.shape[0] * 1.0)  # a side effect on the first call only
            return x * self.cached[: x.shape[0]]

    m = Rotary()
    f = tw.compile(m)
    for _ in range(3):
        assert f(tw.ones(4)).tolist() == [0.0, 1.0, 2.0, 3.0]
    assert len(f.forward.variants) == 1  # calls 2 and 3 have no side effect: replayed


def test_a_segment_the_compiler_cannot_build_runs_operator_by_operator():
    def f(lib, x):
        x.add_(1)
        view = x[1:]
        if view.sum() > 0:
            view.mul_(3)
        return view.exp(), x.sum()

    compiled = tw.compile(lambda x: f(tw, x))

    def refuse(graph):
        raise NotImplementedError("no code generation for this segment")

    compiled.segments.build = refuse
    a, b = tw.tensor([1.0, -2.0, 3.0]), torch.tensor([1.0, -2.0, 3.0])
    with pytest.warns(RuntimeWarning, match="operator by operator"):
        got = compiled(a)
    for g, w in zip(got, f(torch, b)):
        assert_same(g, w)
    assert_same(a, b)


def test_a_break_where_only_views_of_the_arguments_are_alive():
    mask = tw.tensor([[True, False], [False, True]])
    nonzero = tw.compile(lambda m: m.reshape(-1).nonzero())
    assert nonzero(mask).tolist() == [[0], [3]]
    x = tw.tensor([1.0, 2.0, 3.0, 4.0], requires_grad=True)
    select = tw.compile(lambda x, m: x.reshape(2, 2).masked_select(m))
    out = select(x, mask)
    out.sum().backward()
    assert out.tolist() == [1.0, 4.0] and x.grad.tolist() == [1.0, 0.0, 0.0, 1.0]
    assert not select.variants  # the break ended the recording's one-graph form, though nothing had to run


def test_a_line_search_that_restores_its_parameters_after_a_break():
    """LBFGS-style: try a step, read the loss into Python, restore the saved parameters, take half the step."""
    def make(lib):
        a = lib.tensor(np.arange(12, dtype="float32").reshape(4, 3) / 10)
        x = lib.nn.Parameter(lib.ones(3))

        def closure():
            x.grad = None
            with lib.enable_grad():
                loss = (a @ x).square().sum()
                loss.backward()
            return loss

        def step():
            with lib.no_grad():
                closure()
                d = lib.full((3,), -0.01)
                x0 = x.clone()
                x.add_(d)
                float(closure())
                x.copy_(x0)
                x.add_(d, alpha=0.5)
            return x.sum()

        return step

    compiled, reference = tw.compile(make(tw)), make(torch)
    for _ in range(3):
        assert_same(compiled(), reference())


def test_a_function_calling_a_linalg_solver_runs_eagerly_and_still_raises_its_errors():
    """The solvers read LAPACK's info codes on the host: under compile the function runs eagerly (one warning), so
    a singular matrix raises torch's LinAlgError instead of returning garbage."""
    def solve(a, b):
        return tw.linalg.solve(a * 2, b).sum(0)

    compiled = tw.compile(solve)
    a, b = tw.eye(3) + 0.5, tw.ones(3, 2)
    with pytest.warns(RuntimeWarning, match="checks its results on the host"):
        np.testing.assert_allclose(compiled(a, b).numpy(), solve(a, b).numpy(), rtol=1e-6)
    with pytest.raises(tw.linalg.LinAlgError, match="singular"):
        compiled(tw.zeros(3, 3), b)

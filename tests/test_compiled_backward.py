"""Compiled backward ([Note: compiled backward] in tilewise/compiler/backward.py): an eager backward whose graph was
seen before runs as one compiled replay; gradients agree with the engine's and with torch's, and everything the
replay cannot do (hooks, retained gradients, create_graph, autograd.grad, saved-tensor hooks, a saved tensor changed
in place, a freed graph) runs through the engine with its own results and errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch as real_torch

import tilewise as tw
from tilewise.compiler import backward as B
from tilewise.config import settings

F = tw.nn.functional


@pytest.fixture(autouse=True)
def fresh():
    """Each test starts with nothing seen and the switch as it found it."""
    B._seen.clear()
    before = settings.compiled_backward
    yield
    settings.compiled_backward = before
    B._seen.clear()


def counts():
    return dict(B.stats)


def delta(before):
    return {k: B.stats[k] - before[k] for k in before}


def mlp(lib):
    lib.manual_seed(0)
    return lib.nn.Sequential(lib.nn.Linear(12, 24), lib.nn.GELU(), lib.nn.LayerNorm(24), lib.nn.Dropout(0.0),
                             lib.nn.Linear(24, 5))


def grads_of(model):
    return [p.grad.detach().numpy().copy() if p.grad is not None else None for p in model.parameters()]


def loaded(model, weights):
    model.load_state_dict({k: tw.tensor(v) for k, v in weights.items()})
    return model


def torch_weights(model):
    return {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}


def step(model, x, y):
    for p in model.parameters():
        p.grad = None
    F.cross_entropy(model(x), y).backward()
    return grads_of(model)


def test_a_graph_seen_twice_is_compiled_and_its_gradients_are_the_engines():
    rng = np.random.default_rng(0)
    model = mlp(tw)
    batches = [(tw.tensor(rng.standard_normal((6, 12), dtype=np.float32)), tw.tensor(rng.integers(0, 5, 6)))
               for _ in range(3)]
    engine = [step(model, x, y) for x, y in batches]
    before = counts()
    with tw.autograd.compiled_backward():
        replayed = [step(model, x, y) for x, y in batches]
    assert delta(before) == {"compiled": 1, "replayed": 2, "eager": 1}  # the first sighting runs the engine
    for ours, theirs in zip(replayed, engine):
        for a, b in zip(ours, theirs):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_switch_works_as_a_call_a_context_and_an_environment_setting():
    settings.compiled_backward = False
    with tw.autograd.compiled_backward():
        assert settings.compiled_backward
        with tw.autograd.compiled_backward(False):
            assert not settings.compiled_backward
        assert settings.compiled_backward
    assert not settings.compiled_backward
    tw.autograd.compiled_backward()
    assert settings.compiled_backward


def cnn(torch):
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 8, 3, padding=1, bias=False)
            self.bn = torch.nn.BatchNorm2d(8)
            self.conv2 = torch.nn.Conv2d(8, 8, 3, padding=1)
            self.head = torch.nn.Linear(8, 4)

        def forward(self, x):
            h = torch.relu(self.bn(self.conv(x)))
            h = torch.nn.functional.max_pool2d(h + self.conv2(h), 2)  # a residual: a value read twice
            return self.head(h.mean((2, 3)))

    torch.manual_seed(0)
    return Net()


def embedding_lm(torch):
    class LM(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(11, 8)
            self.rnn = torch.nn.GRU(8, 8, batch_first=True)
            self.norm = torch.nn.LayerNorm(8)

        def forward(self, x):
            h, _ = self.rnn(self.emb(x))
            return self.norm(h) @ self.emb.weight.t()  # the embedding tied to the head: a leaf reached twice

    torch.manual_seed(0)
    return LM()


@pytest.mark.parametrize("build,inputs", [
    (cnn, lambda rng: (rng.standard_normal((4, 3, 8, 8), dtype=np.float32), rng.integers(0, 4, 4))),
    (embedding_lm, lambda rng: (rng.integers(0, 11, (3, 5)), rng.integers(0, 11, (3, 5)))),
], ids=["cnn_batchnorm_residual", "gru_tied_embedding"])
def test_training_with_compiled_backward_matches_torch(build, inputs):
    rng = np.random.default_rng(1)
    batches = [inputs(rng) for _ in range(4)]
    records = {}
    before = counts()
    weights = None
    for lib in (real_torch, tw):
        model = build(lib)
        weights = torch_weights(model) if weights is None else weights
        if lib is tw:
            loaded(model, weights)
        opt = lib.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        losses, grads = [], []
        with tw.autograd.compiled_backward(lib is tw):
            for x, y in batches:
                out = model(lib.tensor(x))
                loss = lib.nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), lib.tensor(y).reshape(-1))
                opt.zero_grad()
                loss.backward()
                grads.append([p.grad.detach().numpy().copy() for p in model.parameters()])
                opt.step()
                losses.append(float(loss))
        records[lib.__name__] = (losses, grads)
    assert delta(before) == {"compiled": 1, "replayed": 3, "eager": 1}
    (ours, our_grads), (theirs, their_grads) = records["tilewise"], records["torch"]
    np.testing.assert_allclose(ours, theirs, rtol=2e-5, atol=2e-6)
    for a_step, b_step in zip(our_grads, their_grads):
        for a, b in zip(a_step, b_step):
            np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-5)


def test_gradients_accumulate_into_existing_grad_as_the_engines_do():
    x = tw.tensor(np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4))
    w = tw.ones(4, 2, requires_grad=True)
    with tw.autograd.compiled_backward():
        for _ in range(3):  # no zero_grad: the third is compiled and adds to what the first two left
            (x @ w).tanh().sum().backward()
    expected = 3 * (x.t() @ (1 - (x @ tw.ones(4, 2)).tanh() ** 2))
    np.testing.assert_allclose(w.grad.numpy(), expected.numpy(), rtol=1e-5)


def test_hooks_retained_grads_and_saved_tensor_hooks_run_through_the_engine():
    x = tw.tensor([1.0, 2.0, 3.0], requires_grad=True)
    seen = []
    with tw.autograd.compiled_backward():
        for _ in range(3):
            x.grad = None
            y = x.exp()
            y.register_hook(lambda g: seen.append(g.clone()) or g * 2)
            y.sum().backward()
        np.testing.assert_allclose(x.grad.numpy(), 2 * np.exp([1.0, 2.0, 3.0]), rtol=1e-6)
        assert len(seen) == 3
        for _ in range(3):
            y = x * x
            y.retain_grad()
            y.sum().backward()
            assert y.grad is not None
        with tw.autograd.graph.saved_tensors_hooks(lambda t: t * 1, lambda t: t):
            for _ in range(3):
                x.grad = None
                (x * x).sum().backward()
        np.testing.assert_allclose(x.grad.numpy(), [2.0, 4.0, 6.0])
    assert not [key for key, (sightings, _) in B._seen.items() if sightings > 1]  # none of these was compiled


def test_autograd_grad_and_create_graph_take_the_engine():
    x = tw.tensor([0.5, 1.5], requires_grad=True)
    before = counts()
    with tw.autograd.compiled_backward():
        for _ in range(3):
            (g,) = tw.autograd.grad((x ** 3).sum(), x, create_graph=True)
            (gg,) = tw.autograd.grad(g.sum(), x)
        for _ in range(3):
            x.grad = None
            (x ** 3).sum().backward(create_graph=True)
    np.testing.assert_allclose(gg.numpy(), [3.0, 9.0])
    np.testing.assert_allclose(x.grad.detach().numpy(), [0.75, 6.75])
    assert delta(before)["replayed"] == 0


def test_a_saved_tensor_modified_in_place_raises_torchs_error():
    w = tw.tensor([1.0, 2.0], requires_grad=True)
    with tw.autograd.compiled_backward():
        for _ in range(2):
            (w.sigmoid() * 2).sum().backward()
        a = w.sigmoid()
        b = a * a
        with tw.no_grad():
            a.add_(1)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            b.sum().backward()


def test_retain_graph_and_a_second_backward_through_a_freed_graph():
    w = tw.tensor([1.0, -2.0], requires_grad=True)
    with tw.autograd.compiled_backward():
        for _ in range(2):
            w.grad = None
            loss = (w.tanh() * w).sum()
            loss.backward(retain_graph=True)
            loss.backward()  # the same graph again: its saved tensors were kept for it
        with pytest.raises(RuntimeError, match="backward through the graph a second time"):
            loss.backward()
    t = real_torch.tensor([1.0, -2.0], requires_grad=True)
    tl = (t.tanh() * t).sum()
    tl.backward(retain_graph=True)
    tl.backward()
    np.testing.assert_allclose(w.grad.numpy(), t.grad.numpy(), rtol=1e-6)


def test_a_new_shape_is_a_new_graph():
    w = tw.ones(3, requires_grad=True)
    before = counts()
    with tw.autograd.compiled_backward():
        for n in (2, 2, 4, 4, 2):
            w.grad = None
            (tw.ones(n, 3) * w).pow(2).sum().backward()
            np.testing.assert_allclose(w.grad.numpy(), [2.0 * n] * 3)
    assert delta(before) == {"compiled": 2, "replayed": 3, "eager": 2}


def test_several_roots_and_leaves_reached_by_several_paths():
    a = tw.tensor([1.0, 2.0], requires_grad=True)
    b = tw.tensor([3.0, -1.0], requires_grad=True)
    with tw.autograd.compiled_backward():
        for _ in range(3):
            a.grad = b.grad = None
            u, v = a * b, (a + b).exp()
            tw.autograd.backward([u.sum(), v.sum()], [tw.tensor(2.0), tw.tensor(0.5)])
    ta = real_torch.tensor([1.0, 2.0], requires_grad=True)
    tb = real_torch.tensor([3.0, -1.0], requires_grad=True)
    real_torch.autograd.backward([(ta * tb).sum(), (ta + tb).exp().sum()], [real_torch.tensor(2.0),
                                                                         real_torch.tensor(0.5)])
    np.testing.assert_allclose(a.grad.numpy(), ta.grad.numpy(), rtol=1e-6)
    np.testing.assert_allclose(b.grad.numpy(), tb.grad.numpy(), rtol=1e-6)


def test_autocast_bfloat16_step_matches_the_engine_to_bfloat16_tolerance():
    rng = np.random.default_rng(2)
    model = mlp(tw)
    x, y = tw.tensor(rng.standard_normal((6, 12), dtype=np.float32)), tw.tensor(rng.integers(0, 5, 6))

    def run():
        for p in model.parameters():
            p.grad = None
        with tw.autocast("cpu", dtype=tw.bfloat16):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        return grads_of(model)

    engine = run()
    with tw.autograd.compiled_backward():
        run()
        replayed = run()
    for a, b, p in zip(replayed, engine, model.parameters()):
        assert p.grad.dtype is tw.float32  # the leaf's dtype, as the engine gives it
        np.testing.assert_allclose(a, b, rtol=2e-2, atol=2e-3)


@pytest.mark.cuda
def test_cuda_training_step_with_compiled_backward_matches_the_engine():
    if not tw.cuda.is_available():
        pytest.skip("needs a GPU")
    rng = np.random.default_rng(3)
    model = mlp(tw).to("cuda")
    x = tw.tensor(rng.standard_normal((64, 12), dtype=np.float32), device="cuda")
    y = tw.tensor(rng.integers(0, 5, 64), device="cuda")

    def run():
        for p in model.parameters():
            p.grad = None
        with tw.autocast("cuda", dtype=tw.bfloat16):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        return [p.grad.cpu().numpy() for p in model.parameters()]

    engine = run()
    before = counts()
    with tw.autograd.compiled_backward():
        run()
        replayed = run()
    assert delta(before)["replayed"] == 1
    for a, b in zip(replayed, engine):
        np.testing.assert_allclose(a, b, rtol=2e-2, atol=2e-3)


# ------------------------------------------------------------------ donated saved tensors

def deep_mlp(lib, width=48, depth=5):
    lib.manual_seed(0)
    layers = []
    for _ in range(depth):
        layers += [lib.nn.Linear(width, width), lib.nn.GELU(), lib.nn.LayerNorm(width)]
    return lib.nn.Sequential(*layers, lib.nn.Linear(width, 5))


def replayed_plans():
    """The memory plans of every compiled replay, by its set of donated arguments."""
    return {key[1]: [p.plan for p in entry[1][0].programs()] for key, entry in B._seen.items() if entry[1]}


def donated_buffers(plan):
    return sum(b.kind == "donated" for b in plan.buffers)


def test_saved_activations_only_the_graph_holds_take_the_replays_intermediates():
    rng = np.random.default_rng(1)
    x = tw.tensor(rng.standard_normal((32, 48), dtype=np.float32))
    y = tw.tensor(rng.integers(0, 5, 32))
    model = deep_mlp(tw)
    engine = [step(model, x, y) for _ in range(3)]

    def replay_plan(donate):
        settings.donate_saved = donate
        B._seen.clear()
        with tw.autograd.compiled_backward():
            grads = [step(model, x, y) for _ in range(3)]
        (donated, [plan]), = replayed_plans().items()
        return grads, donated, plan

    before = settings.donate_saved
    try:
        kept_grads, kept_donated, kept = replay_plan(False)
        grads, donated, plan = replay_plan(True)
    finally:
        settings.donate_saved = before
    assert not kept_donated and donated_buffers(kept) == 0
    assert donated and donated_buffers(plan) > 0
    assert plan.arena_bytes < kept.arena_bytes
    for ours, plain, theirs in zip(grads, kept_grads, engine):
        for a, b, c in zip(ours, plain, theirs):
            np.testing.assert_allclose(a, c, rtol=1e-5, atol=1e-6)
            np.testing.assert_array_equal(a, b)  # placement changes where values live, not what they are


def test_tensors_the_user_can_reach_are_never_written_over():
    """Activations held by the user (the tensors themselves, a NumPy view, a DLPack export) keep their values
    through compiled backwards whose other saved tensors are donated."""
    rng = np.random.default_rng(2)
    x = tw.tensor(rng.standard_normal((32, 48), dtype=np.float32))
    y = tw.tensor(rng.integers(0, 5, 32))
    model = deep_mlp(tw)
    held: list = []

    def value(kind, v):
        return v.detach().numpy() if kind in ("tensor", "input") else v

    modules = list(model)
    # the last layers' activations: their memory is what a replay reuses first (read early in backward)
    modules[13].register_forward_hook(lambda m, i, o: held.append(("tensor", o)))
    modules[10].register_forward_hook(lambda m, i, o: held.append(("numpy", o.detach().numpy())))
    modules[7].register_forward_hook(lambda m, i, o: held.append(("dlpack", np.from_dlpack(o.detach()))))
    modules[15].register_forward_hook(lambda m, i, o: held.append(("input", i[0])))
    with tw.autograd.compiled_backward():
        for _ in range(4):
            held.clear()
            for p in model.parameters():
                p.grad = None
            loss = F.cross_entropy(model(x), y)
            copies = [(kind, np.array(value(kind, v), copy=True)) for kind, v in held]
            loss.backward()
            for (kind, v), (_, before) in zip(held, copies):
                np.testing.assert_array_equal(value(kind, v), before, err_msg=kind)
    assert B.stats["replayed"] > 0
    (donated, _), = replayed_plans().items()
    assert donated  # the others were donated


def test_retain_graph_donates_nothing_and_a_second_backward_agrees():
    rng = np.random.default_rng(3)
    x = tw.tensor(rng.standard_normal((16, 48), dtype=np.float32))
    y = tw.tensor(rng.integers(0, 5, 16))
    model = deep_mlp(tw)
    expected = step(model, x, y)
    with tw.autograd.compiled_backward():
        for _ in range(3):
            for p in model.parameters():
                p.grad = None
            loss = F.cross_entropy(model(x), y)
            loss.backward(retain_graph=True)
            first = grads_of(model)
            loss.backward()
            for a, b in zip(grads_of(model), first):
                np.testing.assert_allclose(a, 2 * b, rtol=1e-5, atol=1e-6)
            for a, b in zip(first, expected):
                np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert frozenset() in replayed_plans()  # the retaining backward's replay; the last one may donate


def test_a_replay_that_fails_after_writing_donated_memory_raises(monkeypatch):
    rng = np.random.default_rng(4)
    x = tw.tensor(rng.standard_normal((16, 48), dtype=np.float32))
    y = tw.tensor(rng.integers(0, 5, 16))
    model = deep_mlp(tw)
    with tw.autograd.compiled_backward():
        step(model, x, y)
        step(model, x, y)  # compiled, donating
        (_, [plan]), = replayed_plans().items()
        assert donated_buffers(plan) > 0
        (fn, _), = [entry[1] for entry in B._seen.values() if entry[1]]
        program, = fn.programs()
        last = program.steps[-1]

        def broken(*args, **kwargs):
            raise RuntimeError("device fault")

        monkeypatch.setattr(last, "run", broken)
        with pytest.raises(RuntimeError, match="compiled backward failed while running") as info:
            step(model, x, y)
        assert "device fault" in str(info.value.__cause__)
        monkeypatch.undo()
        step(model, x, y)  # a new graph: the engine runs it (the failed description is given up)


@pytest.mark.cuda
def test_cuda_donated_replay_matches_the_engine_and_keeps_held_tensors():
    if not tw.cuda.is_available():
        pytest.skip("needs a GPU")
    rng = np.random.default_rng(5)
    model = deep_mlp(tw, width=256).to("cuda")
    x = tw.tensor(rng.standard_normal((512, 256), dtype=np.float32), device="cuda")
    y = tw.tensor(rng.integers(0, 5, 512), device="cuda")
    held: list = []
    list(model)[4].register_forward_hook(lambda m, i, o: held.append(o))

    def run():
        held.clear()
        for p in model.parameters():
            p.grad = None
        with tw.autocast("cuda", dtype=tw.bfloat16):
            loss = F.cross_entropy(model(x), y)
        before = held[0].detach().float().cpu().numpy()
        loss.backward()
        np.testing.assert_array_equal(held[0].detach().float().cpu().numpy(), before)
        return [p.grad.cpu().numpy() for p in model.parameters()]

    engine = run()
    with tw.autograd.compiled_backward():
        run()
        replayed = [run() for _ in range(2)]
    (donated, [plan]), = replayed_plans().items()
    assert donated and donated_buffers(plan) > 0
    for grads in replayed:
        for a, b in zip(grads, engine):
            np.testing.assert_allclose(a, b, rtol=2e-2, atol=2e-3)


# ------------------------------------------------------------------ CUDA graphs in place

def replay_runtimes():
    return [p.runtime for key, entry in B._seen.items() if entry[1] for p in entry[1][0].programs()]


@pytest.mark.cuda
def test_cuda_replays_launch_one_graph_where_the_addresses_repeat_and_walk_where_they_move():
    """[Note: graphs in place]: the saved activations are read where they lie, never copied; a step whose memory
    lies where an earlier one's did replays the graph captured there (the batch, a new tensor every step, is copied
    in), and memory that keeps moving is never captured."""
    if not tw.cuda.is_available():
        pytest.skip("needs a GPU")
    rng = np.random.default_rng(7)
    model = deep_mlp(tw, width=256).to("cuda")
    batches = [(tw.tensor(rng.standard_normal((512, 256), dtype=np.float32), device="cuda"),
                tw.tensor(rng.integers(0, 5, 512), device="cuda")) for _ in range(14)]
    kept: list = []

    def run(k, keep=False):
        if keep:  # a user holding every step's gradients: the next step's gradients lie elsewhere
            kept.append([p.grad for p in model.parameters()])
        for p in model.parameters():
            p.grad = None
        x, y = batches[k]
        with tw.autocast("cuda", dtype=tw.bfloat16):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        return [p.grad.cpu().numpy() for p in model.parameters()]

    engine = [run(k) for k in range(14)]
    with tw.autograd.compiled_backward():
        steady = [run(k) for k in range(8)]  # compiled on the second, the batch staged on the third, its
        [runtime] = replay_runtimes()          # addresses seen again on the fourth: captured, then replayed
        assert runtime.replays >= 4 and len(runtime.graphs) == 1, (runtime.replays, len(runtime.graphs))
        staged = sum(b.nbytes for _, b in runtime.staged_in_place.values())
        assert 0 < staged <= 512 * 256 * 4 + 512 * 8, staged  # the batch alone is copied in
        replays = runtime.replays
        moved = [run(k, keep=True) for k in range(8, 14)]
    assert runtime.replays == replays and len(runtime.graphs) <= 1, "addresses never seen twice: no capture"
    for k, grads in enumerate(steady + moved):
        for a, b in zip(grads, engine[k]):
            np.testing.assert_allclose(a, b, rtol=2e-2, atol=2e-3)

"""tilewise.compile on the CPU: kernel counts, schedules, guards and recompiles, effects, modules, caching."""

from __future__ import annotations

import textwrap
import warnings

import numpy as np
import pytest
import torch

import tilewise as tw
import tilewise.nn.functional as F
from tilewise.compiler import DataDependentError
from tilewise.compiler.program_c import KernelStep
from tilewise.config import settings


def kernels(fn) -> int:
    return sum(p.kernel_count for p in fn.programs())


def schedules(fn) -> list[str]:
    return [ns.parallel for p in fn.programs() for s in p.schedules for ns in s.nests]


def close(a, b, rtol=1e-5, atol=1e-6):
    np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), rtol=rtol, atol=atol)


# ---------------------------------------------------------------------------- kernel counts

def test_seed_chain_is_one_kernel():
    f = tw.compile(lambda x: x.relu() * 0.5 + 1)
    x = tw.randn(512, 512)
    close(f(x), x.relu() * 0.5 + 1)
    assert kernels(f) == 1
    assert schedules(f) == ["rows"]


def test_softmax_is_one_kernel():
    f = tw.compile(lambda x: x.softmax(-1))
    x = tw.randn(256, 1000)
    close(f(x), x.softmax(-1))
    assert kernels(f) == 1
    (nest,) = f.programs()[0].schedules[0].nests
    assert len(nest.cached) == 1, "exp(x - max) is computed once and kept for the normalisation"


def test_residual_add_layer_norm_is_one_kernel():
    w, b = tw.randn(384), tw.randn(384)

    def block(x, r):
        return F.layer_norm(x + r, (384,), w, b)

    f = tw.compile(block)
    x, r = tw.randn(64, 384), tw.randn(64, 384)
    close(f(x, r), block(x, r), rtol=1e-4, atol=1e-5)
    assert kernels(f) == 1


def test_adamw_like_update_over_many_parameters_is_a_few_kernels():
    shapes = [(64, 32), (32,), (32, 16), (16,), (128, 64), (64,), (7, 3, 5), (1,), (200,), (10, 10), (3,), (50, 2)]
    params = [tw.randn(*s) for s in shapes]
    grads = [tw.randn(*s) for s in shapes]
    exp_avgs = [tw.zeros(*s) for s in shapes]
    exp_avg_sqs = [tw.zeros(*s) for s in shapes]

    def adamw(params, grads, exp_avgs, exp_avg_sqs, lr=1e-2, beta1=0.9, beta2=0.999, eps=1e-8, wd=0.01, step=3):
        with tw.no_grad():
            for p, g, m, v in zip(params, grads, exp_avgs, exp_avg_sqs):
                p.mul_(1 - lr * wd)
                m.lerp_(g, 1 - beta1)
                v.mul_(beta2).add_(g * g * (1 - beta2))
                denom = (v.sqrt() / (1 - beta2 ** step) ** 0.5).add_(eps)
                p.add_(m * (-lr / (1 - beta1 ** step)) / denom)

    copies = [[t.clone() for t in ts] for ts in (params, grads, exp_avgs, exp_avg_sqs)]
    f = tw.compile(adamw)
    f(params, grads, exp_avgs, exp_avg_sqs)
    adamw(*copies)
    for actual, expected in zip(params + exp_avgs + exp_avg_sqs, copies[0] + copies[2] + copies[3]):
        close(actual, expected)
    assert kernels(f) <= 2, f"{kernels(f)} kernels for {len(shapes)} parameters"
    steps = f.programs()[0].steps
    assert all(isinstance(s, KernelStep) for s in steps), "the update writes straight into the parameters"


def test_whole_tensor_reduction_is_split_across_threads():
    f = tw.compile(lambda x: (x * x).sum())
    x = tw.randn(1 << 20, dtype=tw.float64)
    np.testing.assert_allclose(f(x).item(), float((x.numpy() ** 2).sum()), rtol=1e-12)
    assert schedules(f) == ["split"]


def test_reduction_over_a_leading_dim_and_transposed_reads():
    f = tw.compile(lambda x, y: (x.t() * y).sum(0) + x.amax(1))
    x, y = tw.randn(300, 200), tw.randn(200, 300)
    close(f(x, y), (x.t() * y).sum(0) + x.amax(1), rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------------------- whole steps and modules

def _mlp():
    tw.manual_seed(0)
    return tw.nn.Sequential(tw.nn.Linear(8, 16), tw.nn.ReLU(), tw.nn.Linear(16, 4))


def _training_step(model, opt):
    def step(x, y):
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss.detach()
    return step


def test_training_step_is_one_graph_and_matches_eager_for_20_steps():
    data = [(tw.randn(32, 8), tw.randn(32, 4)) for _ in range(20)]

    eager_model, compiled_model = _mlp(), _mlp()
    eager_step = _training_step(eager_model, tw.optim.SGD(eager_model.parameters(), lr=0.05))
    compiled_step = tw.compile(_training_step(compiled_model, tw.optim.SGD(compiled_model.parameters(), lr=0.05)))
    for x, y in data:
        np.testing.assert_allclose(compiled_step(x, y).item(), eager_step(x, y).item(), rtol=1e-5)
    assert len(compiled_step.variants) == 1
    for a, b in zip(compiled_model.parameters(), eager_model.parameters()):
        close(a, b, rtol=1e-4, atol=1e-5)
        assert a.grad is None


@pytest.mark.parametrize("kwargs,variants", [
    (dict(momentum=0.9), 1),  # compile creates zero momentum buffers (no dampening): one trace
    (dict(momentum=0.9, dampening=0.1), 2),  # the first step creates the buffers, later steps update them
])
def test_training_step_that_creates_optimizer_state(kwargs, variants):
    data = [(tw.randn(16, 8), tw.randn(16, 4)) for _ in range(6)]

    def make_step(model, opt):
        def step(x, y):
            F.mse_loss(model(x), y).backward()
            opt.step()
            opt.zero_grad()
        return step

    eager_model, compiled_model = _mlp(), _mlp()
    eager_opt = tw.optim.SGD(eager_model.parameters(), lr=0.05, **kwargs)
    compiled_opt = tw.optim.SGD(compiled_model.parameters(), lr=0.05, **kwargs)
    eager_step, compiled_step = make_step(eager_model, eager_opt), tw.compile(make_step(compiled_model, compiled_opt))
    for x, y in data:
        eager_step(x, y)
        compiled_step(x, y)
    assert len(compiled_step.variants) == variants
    for a, b in zip(compiled_model.parameters(), eager_model.parameters()):
        close(a, b, rtol=1e-4, atol=1e-5)
        close(compiled_opt.state[a]["momentum_buffer"], eager_opt.state[b]["momentum_buffer"], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name,kwargs,variants", [
    ("AdamW", dict(lr=1e-2), 1),  # compile creates the zero moment estimates a first step would: one trace
    ("Adagrad", dict(lr=0.1, lr_decay=0.01), 1),  # Adagrad creates its state up front
])
def test_training_step_with_a_step_counting_optimizer_compiles_whole_and_matches_eager_for_10_steps(name, kwargs,
                                                                                                    variants):
    """Step-dependent factors (Adam's bias corrections, Adagrad's decayed lr) are tensor expressions of the
    optimizer's step count: no host read blocks the capture."""
    data = [(tw.randn(32, 8), tw.randn(32, 4)) for _ in range(10)]

    eager_model, compiled_model = _mlp(), _mlp()
    eager_opt = getattr(tw.optim, name)(eager_model.parameters(), **kwargs)
    compiled_opt = getattr(tw.optim, name)(compiled_model.parameters(), **kwargs)
    eager_step = _training_step(eager_model, eager_opt)
    compiled_step = tw.compile(_training_step(compiled_model, compiled_opt))
    for x, y in data:
        np.testing.assert_allclose(compiled_step(x, y).item(), eager_step(x, y).item(), rtol=1e-5)
    assert len(compiled_step.variants) == variants
    for a, b in zip(compiled_model.parameters(), eager_model.parameters()):
        close(a, b, rtol=1e-4, atol=1e-5)
        assert compiled_opt.state[a]["step"].item() == 10.0 and a.grad is None


def test_compiled_module_stays_a_module_and_is_differentiable():
    model = _mlp()
    compiled = tw.compile(model)
    assert isinstance(compiled, tw.nn.Module)
    assert [id(p) for p in compiled.parameters()] == [id(p) for p in model.parameters()]
    x = tw.randn(5, 8)
    out = compiled(x)
    assert out.requires_grad and out.grad_fn is not None
    out.square().sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    for p in model.parameters():
        p.grad = None
    model(x).square().sum().backward()
    for g, p in zip(grads, model.parameters()):
        close(g, p.grad, rtol=1e-4, atol=1e-5)


def test_in_place_update_of_an_argument_is_written_back():
    def f(x):
        x.mul_(2).add_(1)
        return x.sum()

    x = tw.arange(6.0).view(2, 3)
    version = x._version
    total = tw.compile(f)(x)
    assert x.tolist() == [[1.0, 3.0, 5.0], [7.0, 9.0, 11.0]]
    assert total.item() == 36.0
    assert x._version > version


def test_write_through_a_view_of_an_argument():
    def f(x):
        x[:, 1] = 0.0
        x[0].add_(10)
        return x * 1

    x, ref = tw.randn(3, 4), None
    ref = x.clone()
    f(ref)
    out = tw.compile(f)(x)
    close(x, ref)
    close(out, ref)


def test_a_returned_argument_is_the_callers_tensor():
    """``out.copy_(x)`` returns ``out`` itself, as eager does: one copy into it, not a second one into a new
    output tensor; an argument returned untouched is the caller's tensor too."""
    copy = tw.compile(lambda x, out: out.copy_(x))
    for _ in range(2):
        x, out = tw.randn(4, 5), tw.zeros(4, 5)
        assert copy(x, out) is out
        close(out, x)
    plan = copy.programs()[0].plan
    assert len(plan.copies) == 1 and plan.outputs == []
    scaled = tw.compile(lambda x, y: (x.mul_(2), y, y + 1))
    x, y = tw.ones(3), tw.ones(3)
    a, b, c = scaled(x, y)
    assert a is x and b is y and x.tolist() == [2.0, 2.0, 2.0] and c.tolist() == [2.0, 2.0, 2.0]


# ---------------------------------------------------------------------------- guards

def test_guard_miss_recompiles_and_says_why(capsys):
    settings.log.add("recompiles")
    try:
        f = tw.compile(lambda x: x.exp() + 1)
        f(tw.randn(4, 4))
        f(tw.randn(4, 4))
        f(tw.randn(4, 5))
        f(tw.randn(4, 4, dtype=tw.float64))
    finally:
        settings.log.discard("recompiles")
    assert len(f.variants) == 3
    err = capsys.readouterr().err
    assert "shape [4, 5]" in err and "compiled for shape [4, 4]" in err
    assert "float64" in err


def test_a_changed_learning_rate_reaches_the_step_and_other_hyperparameters_recompile_it(capsys):
    """The trace reads the learning rate from a tensor the guards refill (see [Note: learning rates in compiled
    steps]): a new rate runs the same program with it; other param-group values (momentum, ...) are numbers the
    program holds, and a change must not run the old program."""
    data = [(tw.randn(16, 8), tw.randn(16, 4)) for _ in range(6)]
    eager_model, compiled_model = _mlp(), _mlp()
    eager_opt = tw.optim.SGD(eager_model.parameters(), lr=0.05, momentum=0.5)
    compiled_opt = tw.optim.SGD(compiled_model.parameters(), lr=0.05, momentum=0.5)
    eager_step = _training_step(eager_model, eager_opt)
    compiled_step = tw.compile(_training_step(compiled_model, compiled_opt))
    settings.log.add("recompiles")
    try:
        for k, (x, y) in enumerate(data):
            for opt in (eager_opt, compiled_opt):
                opt.param_groups[0]["lr"] = 0.05 if k < 2 else 0.01
                opt.param_groups[0]["momentum"] = 0.5 if k < 4 else 0.9
            np.testing.assert_allclose(compiled_step(x, y).item(), eager_step(x, y).item(), rtol=1e-5)
    finally:
        settings.log.discard("recompiles")
    # the steady step (compile made the zero momentum buffers first), and the steady step for the new momentum
    assert len(compiled_step.variants) == 2
    err = capsys.readouterr().err
    assert "SGD.param_groups[0]['momentum'] is 0.9, compiled for 0.5" in err and "'lr'" not in err
    for a, b in zip(compiled_model.parameters(), eager_model.parameters()):
        close(a, b, rtol=1e-4, atol=1e-5)


def test_loading_an_optimizer_state_dict_recompiles_against_the_new_state():
    """load_state_dict replaces the state table: the program must update the buffers the optimizer now holds."""
    data = [(tw.randn(16, 8), tw.randn(16, 4)) for _ in range(6)]
    eager_model, compiled_model = _mlp(), _mlp()
    eager_opt = tw.optim.SGD(eager_model.parameters(), lr=0.05, momentum=0.9)
    compiled_opt = tw.optim.SGD(compiled_model.parameters(), lr=0.05, momentum=0.9)
    eager_step = _training_step(eager_model, eager_opt)
    compiled_step = tw.compile(_training_step(compiled_model, compiled_opt))
    for k, (x, y) in enumerate(data):
        if k == 3:
            for opt in (eager_opt, compiled_opt):
                opt.load_state_dict(opt.state_dict())
        np.testing.assert_allclose(compiled_step(x, y).item(), eager_step(x, y).item(), rtol=1e-5)
    for a, b in zip(compiled_model.parameters(), eager_model.parameters()):
        close(a, b, rtol=1e-4, atol=1e-5)
        close(compiled_opt.state[a]["momentum_buffer"], eager_opt.state[b]["momentum_buffer"], rtol=1e-4, atol=1e-5)


def test_held_tensors_stay_guarded_after_calls_that_passed(capsys):
    """A held tensor (a parameter the function reads) is checked against the last call that passed first:
    a new storage of the same layout still runs the program, a changed layout or sharing still recompiles."""
    w = tw.randn(4)
    v = tw.randn(4)
    f = tw.compile(lambda x: x * w + v)
    x = tw.randn(4)
    for _ in range(3):
        close(f(x), x * w + v)
    w.data = tw.randn(4)  # another storage, same layout: the same program reads it
    close(f(x), x * w + v)
    assert len(f.variants) == 1
    settings.log.add("recompiles")
    try:
        w.data = tw.randn(8)[::2]  # strided now
        close(f(x), x * w + v)
        assert len(f.variants) == 2
        assert "strides [2]" in capsys.readouterr().err
        w.data = tw.randn(4)
        close(f(x), x * w + v)  # the first program again
        v.data = w.data  # the same layout, but v now shares w's storage
        close(f(x), x * w + v)
        assert len(f.variants) == 3
    finally:
        settings.log.discard("recompiles")


def test_requires_grad_and_strides_are_guarded():
    f = tw.compile(lambda x: x * 2)
    x = tw.randn(3, 4)
    f(x)
    f(x.t().contiguous().t())
    f(x.requires_grad_())
    assert len(f.variants) == 3


def test_recompile_limit_falls_back_to_eager():
    limit = settings.recompile_limit
    settings.recompile_limit = 2
    try:
        f = tw.compile(lambda x: x + 1)
        f(tw.ones(1))
        f(tw.ones(2))
        with pytest.warns(RuntimeWarning, match="recompile limit"):
            out = f(tw.ones(3))
    finally:
        settings.recompile_limit = limit
    assert out.tolist() == [2.0, 2.0, 2.0]
    assert len(f.variants) == 2


def test_data_dependent_python_names_the_users_line():
    def f(x):
        if x.sum() > 0:  # the offending line
            return x
        return -x

    with pytest.raises(DataDependentError) as info:
        tw.compile(f, fullgraph=True)(tw.randn(3))
    message = str(info.value)
    assert "test_compiler_kernels.py" in message and "the offending line" in message and "bool()" in message


@pytest.mark.parametrize("convert", [np.asarray, np.array], ids=["asarray", "array"])
def test_numpy_conversion_of_a_traced_tensor_is_data_dependent_like_numpy(convert):
    def f(x):
        host = convert(x)  # the converting line
        return x * float(host.sum())

    with pytest.raises(DataDependentError) as info:
        tw.compile(f, fullgraph=True)(tw.ones(3))
    message = str(info.value)
    assert "__array__" in message and "needs the value of a tensor" in message and "the converting line" in message


def test_fullgraph_false_breaks_the_graph_where_python_needs_a_value():
    def f(x):
        return x * 2 if x.sum() > 0 else -x

    compiled = tw.compile(f)  # fullgraph=False, torch's default
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert compiled(tw.ones(2)).tolist() == [2.0, 2.0]
        assert compiled(-tw.ones(2)).tolist() == [1.0, 1.0]
        assert compiled(tw.ones(2)).tolist() == [2.0, 2.0]
    assert compiled.eager_reason is None and not compiled.variants
    assert len(compiled.segments.programs) == 3  # the sum; x * 2; -x


def test_python_scalars_are_guarded():
    f = tw.compile(lambda x, k: x * k)
    assert f(tw.ones(2), 2.0).tolist() == [2.0, 2.0]
    assert f(tw.ones(2), 3.0).tolist() == [3.0, 3.0]
    assert len(f.variants) == 2


# ---------------------------------------------------------------------------- memory and caching

def test_memory_plan_reuses_buffers():
    w = tw.randn(64, 64)

    def f(x):
        for _ in range(6):
            x = (x @ w).tanh()
        return x

    cf = tw.compile(f)
    close(cf(tw.ones(64, 64)), f(tw.ones(64, 64)), rtol=1e-4, atol=1e-5)
    plan = cf.programs()[0].plan
    assert plan.arena_bytes < plan.unshared_bytes


def test_second_process_loads_compiled_kernels_from_disk(outputs_of_two_processes):
    script = textwrap.dedent("""
        import tilewise as tw
        from tilewise.codegen.toolchain.cc import default_c_cache
        f = tw.compile(lambda x: (x.relu() * 0.5 + 1).softmax(-1))
        print(f(tw.ones(8, 8)).sum().item(), default_c_cache().stats.compiles, default_c_cache().stats.disk_hits)
    """)
    first, second = outputs_of_two_processes(script)
    assert first[0] == second[0] == "8.0"
    assert (first[1], first[2]) == ("1", "0")
    assert (second[1], second[2]) == ("0", "1")


def _gpt():
    from tilewise.models import GPT, GPTConfig

    tw.manual_seed(0)
    return GPT(GPTConfig(vocab_size=20, n_layer=1, n_head=2, n_embd=32, block_size=16, dropout=0.0))


def _batches(n: int):
    rng = np.random.default_rng(0)
    return [(tw.from_numpy(rng.integers(0, 20, (4, 16))), tw.from_numpy(rng.integers(0, 20, (4, 16))))
            for _ in range(n)]


def test_demo_model_compiled_in_an_eager_training_loop_matches_eager_for_20_steps():
    def train(model, forward):
        opt = tw.optim.AdamW(model.parameters(), lr=3e-3)
        losses = []
        for x, y in _batches(20):
            _, loss = forward(x, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses

    eager, compiled = _gpt(), _gpt()
    compiled_forward = tw.compile(compiled)
    np.testing.assert_allclose(train(compiled, compiled_forward), train(eager, eager), rtol=1e-5)
    assert len(compiled_forward.forward.variants) == 1


def test_demo_model_whole_training_step_matches_eager_for_20_steps():
    def make_step(model):
        opt = tw.optim.SGD(model.parameters(), lr=0.1)

        def step(x, y):
            _, loss = model(x, y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            return loss.detach()

        return step

    eager_step, compiled_step = make_step(_gpt()), tw.compile(make_step(_gpt()))
    losses = [(compiled_step(x, y).item(), eager_step(x, y).item()) for x, y in _batches(20)]
    np.testing.assert_allclose(*zip(*losses), rtol=1e-5)
    assert len(compiled_step.variants) == 1


def test_optimizer_reached_through_default_arguments_keeps_its_state_real():
    """A step function holding its optimizer in a default argument: momentum created on the first call is
    stored as a real tensor, and later calls match eager."""
    def make():
        tw.manual_seed(0)
        model = tw.nn.Linear(8, 3)
        return model, tw.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    data = [(tw.randn(4, 8), tw.randint(0, 3, (4,))) for _ in range(4)]
    losses = []
    for compiled in (False, True):
        model, opt = make()

        def step(x, y, model=model, opt=opt):
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            return loss

        run = tw.compile(step) if compiled else step
        losses.append([run(x, y).item() for x, y in data])
        buffer = opt.state[model.weight]["momentum_buffer"]
        assert buffer._trace is None
    np.testing.assert_allclose(losses[1], losses[0], rtol=1e-6)


def test_the_programs_of_a_function_share_one_arena():
    """Variants (and a forward with its backward) run one after another: one arena, as large as the largest."""
    f = tw.compile(lambda x: (x.softmax(-1) * x.sum(0)).amax(0))
    small, large = tw.randn(32, 128), tw.randn(64, 128)
    close(f(small), (small.softmax(-1) * small.sum(0)).amax(0))
    close(f(large), (large.softmax(-1) * large.sum(0)).amax(0))
    close(f(small), (small.softmax(-1) * small.sum(0)).amax(0))  # its views of the grown arena are re-derived
    (arena,) = f.arenas.values()
    assert len(f.variants) == 2 and all(p.arena is arena for p in f.programs())
    assert arena.nbytes == max(p.plan.arena_bytes for p in f.programs())


def test_cat_of_kernel_results_is_laid_out_in_place():
    """The inputs of a cat that kernels write in full get their slab of the result as their buffer: the cat
    copies only what it cannot place (a graph argument; a slab off a 16-byte boundary that is not a single
    element), and the result matches eager."""
    ws = [tw.randn(5, 3) for _ in range(6)]

    def norms(extra):
        scalars = [w.square().sum().sqrt().reshape(1) for w in ws]  # bytes 0-24, one element each
        return tw.cat(scalars + [extra, (ws[0] * 2).reshape(15), (ws[1] * 3).reshape(15)]).exp()  # 24, 32, 92

    cf = tw.compile(norms)
    extra = tw.randn(2)
    close(cf(extra), norms(extra))
    program = cf.programs()[0]
    (cat, copied), = program.plan.cat_copies.items()
    assert [(src.type.shape, byte) for src, byte in copied] == [((2,), 24), ((15,), 92)]
    assert not [s for s in program.steps if getattr(s, "node", None) is cat]
    assert sum(" at byte " in s.describe() for s in program.steps) == 2


def test_a_cat_that_converts_dtypes_is_not_laid_out_in_place():
    w = tw.randn(5, 3)

    def mixed(h):
        return tw.cat([(w * 2).reshape(15), h.half().float() * 0 + h, (w.sum() * 1).reshape(1).half()]).exp()

    cf = tw.compile(mixed)
    h = tw.randn(4)
    close(cf(h), mixed(h), rtol=1e-3, atol=1e-3)
    assert not cf.programs()[0].plan.cat_copies



def test_a_returned_copy_of_an_input_keeps_the_value_before_its_update():
    def f(x):
        y = x.clone()
        x.add_(1)
        return y

    compiled, x, reference = tw.compile(f), tw.ones(3), tw.ones(3)
    for _ in range(3):
        assert compiled(x).tolist() == f(reference).tolist()
        assert x.tolist() == reference.tolist()


def test_sibling_nests_merged_into_one_kernel_keep_a_recomputed_value_before_its_readers():
    """Found by the trust fuzzer (program 19172): the backward of a block, a softmax and the block again merged
    two sibling nests whose members were left out of program order, so a recomputed value was read before it
    was made (KeyError building the program)."""
    from fuzz_programs import World, inputs

    source = textwrap.dedent("""
        def f(x, y):
            v0 = M(L.nan_to_num(y, 0.0, 3.0, -3.0))
            v1 = v0 * v0.argmin(1, keepdim=True).float()
            v2 = L.neg(v1)
            v4 = (v2 + T).softmax(1)
            v6 = L.minimum(v2, y)
            v10 = M(L.nan_to_num(v4, 0.0, 3.0, -3.0))
            return v10, v2, v6
    """)
    worlds = [World(tw, 19172), World(tw, 19172)]
    for world in worlds:
        exec(source, world.namespace)  # noqa: S102
    compiled, eager = tw.compile(worlds[0].namespace["f"]), worlds[1].namespace["f"]
    args = inputs(tw, np.random.default_rng([19172, 0]))
    for got, want in zip(compiled(*args), eager(*args)):
        np.testing.assert_allclose(got.detach().numpy(), want.detach().numpy(), rtol=1e-4, atol=1e-5)


def test_a_fractional_arange_read_by_a_fused_kernel_is_a_buffer_not_an_integer_iota():
    """arange(0, -1.5, -0.5) read inside a kernel: only integer aranges become the position itself (an iota); a
    float one is loaded from its buffer (its step truncated to an integer gave zeros: mvlgamma on CUDA)."""
    import re

    from tilewise.compiler.capture import trace
    from tilewise.compiler.passes import run_pipeline
    from tilewise.compiler.program import lower_program
    from tilewise.compiler.targets import CUDA_TARGET

    def shifted(x):
        return (x.unsqueeze(-1) + tw.arange(0, -1.5, -0.5)[:3]).exp().sum(-1)

    x = tw.rand(3, 4)
    low = lower_program(run_pipeline(trace(shifted, (x,), {}).graph), CUDA_TARGET)
    (source,) = low.sources.values()
    header = re.search(r'extern "C" __global__ void[^{]*', source).group(0)
    assert header.count("const float*") == 2, header  # x and the arange's buffer
    np.testing.assert_allclose(tw.compile(shifted)(x).numpy(), shifted(x).numpy(), rtol=1e-6)


def test_a_column_reduction_on_the_cpu_runs_the_kept_dims_innermost():
    """A sum over the leading dims of a row-major tensor (a bias gradient) reads each row across memory: the C
    schedule runs the reduced dims outside and keeps one accumulator per row, with the same results."""
    x = np.random.default_rng(0).standard_normal((12, 64, 96)).astype(np.float32)

    def f(a):
        g = tw.nn.functional.gelu(a, approximate="tanh")
        return g.sum((0, 1)), g * 2

    compiled = tw.compile(f)
    got = compiled(tw.tensor(x))
    want = f(tw.tensor(x))
    np.testing.assert_allclose(got[0].numpy(), want[0].numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(got[1].numpy(), want[1].numpy())
    explained = tw.explain(f, tw.tensor(x), repeats=1)
    schedules = "\n".join(text for title, text in explained.sections if title.endswith("schedule"))
    assert "reducing [0]: columns" in schedules
    ref = torch.nn.functional.gelu(torch.from_numpy(x).double(), approximate="tanh").sum((0, 1))
    np.testing.assert_allclose(got[0].numpy(), ref.numpy(), rtol=1e-5, atol=1e-4)


# ---------------------------------------------------------------------------- the C target's expf

def _ulps(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Distance in float32 steps between non-NaN values."""
    def ordered(v):
        bits = v.view(np.int32).astype(np.int64)
        return np.where(bits < 0, -(bits & 0x7FFFFFFF), bits)

    return np.abs(ordered(a) - ordered(b))


def test_compiled_float32_exp_is_within_one_ulp_of_torch_over_its_whole_range_and_edges():
    rng = np.random.default_rng(0)
    edges = [-np.inf, np.inf, np.nan, -1e30, -200.0, -104.0, -103.97, -103.9, -100.0, -87.4, -87.3, -20.0, -1e-30,
             -0.0, 0.0, 1e-30, 0.5, 1.0, 20.0, 88.0, 88.72, 88.73, 89.0, 1e30]
    x = np.concatenate([np.array(edges, np.float32), rng.uniform(-110, 92, 200_000).astype(np.float32),
                        rng.standard_normal(50_000).astype(np.float32)])
    got = tw.compile(lambda t: t.exp())(tw.from_numpy(x)).numpy()
    want = torch.exp(torch.from_numpy(x)).numpy()
    assert np.array_equal(np.isnan(got), np.isnan(want))
    finite = ~np.isnan(want)
    assert _ulps(got[finite], want[finite]).max() <= 1


def test_compiled_exp_of_masked_scores_costs_about_what_exp_of_ordinary_ones_does():
    """A causal attention's softmax exponentiates -inf in half its lanes; vector expf computed those lanes one
    scalar call each (6-9x slower), the C target's own expf takes one path for every lane."""
    import time

    from tilewise.backends.cpu.threads import get_num_threads, set_num_threads

    scores = np.random.default_rng(0).standard_normal((48, 64, 64)).astype(np.float32)
    masked = np.where(np.tril(np.ones((64, 64), bool)), scores, -np.inf).astype(np.float32)
    f = tw.compile(lambda t: t.exp() * 2)
    inputs = {"ordinary": tw.from_numpy(scores), "masked": tw.from_numpy(masked)}
    threads = get_num_threads()
    set_num_threads(1)
    try:
        best = dict.fromkeys(inputs, float("inf"))
        for _ in range(15):
            for name, x in inputs.items():
                start = time.perf_counter()
                for _ in range(5):
                    f(x)
                best[name] = min(best[name], time.perf_counter() - start)
    finally:
        set_num_threads(threads)
    close(f(inputs["masked"]), tw.from_numpy(np.exp(masked) * 2))
    assert best["masked"] < 2.5 * best["ordinary"], best


def test_a_program_binds_read_only_and_empty_arrays():
    """Programs take a writable array's address through its buffer; a read-only one, or an empty one, through
    numpy's ctypes view."""
    from tilewise.compiler.program_c import data_pointer

    frozen = np.arange(12, dtype=np.float32)
    frozen.flags.writeable = False
    empty = np.empty(0, np.float32)
    assert data_pointer(frozen) == frozen.ctypes.data and data_pointer(empty) == empty.ctypes.data
    writable = np.ones(3)
    assert data_pointer(writable) == writable.ctypes.data
    f = tw.compile(lambda t: (t * 2).exp().sum(-1))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns that the array is not writable
        x = tw.from_numpy(frozen.reshape(3, 4))
    close(f(x), (x * 2).exp().sum(-1))
    assert f(tw.from_numpy(empty.reshape(0, 4))).shape == (0,)


@pytest.mark.parametrize("reduce", ["amax", "amin", "softmax", "log_softmax", "max"])
def test_row_max_and_min_fold_natively_and_keep_nans_as_torch(reduce):
    """[Note: max and min with a NaN flag]: a serial row's float max/min folds with OpenMP's own reduction and a
    NaN flag; a NaN anywhere in a row (first, middle, last element, or all) still gives NaN, a row of -inf
    stays -inf."""
    x = np.random.default_rng(0).standard_normal((7, 40)).astype(np.float32)
    x[1, 0] = x[2, 17] = x[3, 39] = np.nan
    x[4] = np.nan
    x[5] = -np.inf
    x[6, ::2] = np.inf
    fns = {"amax": lambda t: t.amax(-1), "amin": lambda t: t.amin(-1), "softmax": lambda t: t.softmax(-1),
           "log_softmax": lambda t: t.log_softmax(-1), "max": lambda t: t.max(-1).values}
    f = tw.compile(fns[reduce])
    got = f(tw.from_numpy(x)).numpy()
    with np.errstate(invalid="ignore"):
        want = fns[reduce](torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-6, equal_nan=True)
    if reduce in ("amax", "softmax"):
        assert "reduction(max:acc0)" in "".join(p.source for p in f.programs())

"""Memory planning: a kernel's result takes the arena bytes of an operand it reads last, element by element."""

from __future__ import annotations

import numpy as np
import pytest

import tilewise as tw
import tilewise.nn.functional as F


def close(a, b, rtol=1e-5, atol=1e-6):
    np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=rtol, atol=atol)


def arena_offsets(program, shape) -> list[int]:
    """Arena byte offsets of the program's planned values of ``shape``, in program order."""
    plan = program.plan
    return [plan.buffers[k].slot for v, k in plan.of.items()
            if plan.buffers[k].kind == "arena" and tuple(v.type.shape) == shape]


def test_elementwise_result_takes_its_operands_bytes():
    w = tw.randn(32, 32) * 0.1

    def f(x):
        a = x @ w  # a library call's result, read last by the kernel below
        return (a.exp() * 2) @ w

    cf = tw.compile(f)
    x = tw.randn(32, 32)
    close(cf(x), f(x), rtol=1e-4, atol=1e-4)
    (program,) = cf.programs()
    first, second = arena_offsets(program, (32, 32))
    assert first == second
    assert program.plan.arena_bytes == 32 * 32 * 4


def test_operand_read_elsewhere_keeps_its_bytes():
    w = tw.randn(32, 32) * 0.1

    def transposed(x):
        a = x @ w
        return a.t().exp() @ w  # the kernel reads a[j, i] where it stores b[i, j]

    def read_later(x):
        a = x @ w
        return (a.exp() @ w) + a  # a is still read after the kernel

    for f in (transposed, read_later):
        cf = tw.compile(f)
        x = tw.randn(32, 32)
        close(cf(x), f(x), rtol=1e-4, atol=1e-4)
        offsets = arena_offsets(cf.programs()[0], (32, 32))
        assert len(set(offsets)) == len(offsets), f.__name__


def test_row_reduction_stores_in_place_in_its_last_phase():
    w = tw.randn(16, 48)

    def f(x):
        a = x @ w
        return a.softmax(-1) @ w.t()

    cf = tw.compile(f)
    x = tw.randn(24, 16)
    close(cf(x), f(x), rtol=1e-4, atol=1e-5)
    first, second = arena_offsets(cf.programs()[0], (24, 48))
    assert first == second


def test_cross_entropy_gradient_replaces_the_logits():
    """A training step's loss gradient overwrites the logits: one logits-sized buffer, not two (the loss's
    gather of the target logits is moved before the kernel that writes the gradient)."""
    tw.manual_seed(0)
    head = tw.nn.Linear(32, 500, bias=False)
    opt = tw.optim.SGD(head.parameters(), lr=0.1)

    def step(h, y):
        loss = F.cross_entropy(head(h), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    h, y = tw.randn(64, 32), tw.randint(0, 500, (64,))
    reference = tw.nn.Linear(32, 500, bias=False)
    reference.load_state_dict(head.state_dict())
    ref_opt = tw.optim.SGD(reference.parameters(), lr=0.1)
    ref_loss = F.cross_entropy(reference(h), y)
    ref_loss.backward()
    ref_opt.step()
    cf = tw.compile(step)
    close(cf(h, y), ref_loss.detach(), rtol=1e-5)
    close(head.weight.detach(), reference.weight.detach(), rtol=1e-5, atol=1e-6)
    (program,) = cf.programs()
    offsets = arena_offsets(program, (64, 500))
    assert len(offsets) == 2 and offsets[0] == offsets[1]
    logits = 64 * 500 * 4
    assert program.plan.arena_bytes < 2 * logits
    assert logits <= program.plan.live_bytes <= program.plan.arena_bytes
    assert "largest live set" in program.plan.describe()


def mlp_step(approximate: str, device: str = "cpu"):
    """A training step of four Linear-GELU-Linear blocks under bfloat16 autocast, and its model."""
    tw.manual_seed(0)
    blocks = [[tw.nn.Linear(32, 128), tw.nn.GELU(approximate), tw.nn.Linear(128, 32)] for _ in range(4)]
    mlp = tw.nn.Sequential(*[layer for block in blocks for layer in block]).to(device)
    opt = tw.optim.SGD(mlp.parameters(), lr=0.1)

    def step(x):
        with tw.autocast(device_type=device, dtype=tw.bfloat16):
            loss = mlp(x).float().square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    return mlp, step


@pytest.fixture
def recompute_small(monkeypatch):
    """Recomputation thresholds for tiny tests, and the pass in the C target's lowering too (the CUDA target's
    has it) so that its results can be compared with eager's here."""
    from tilewise.compiler.lowering import recompute
    from tilewise.compiler.targets import C_TARGET

    monkeypatch.setattr(recompute, "MIN_BYTES", 1024 * 128 * 2)  # the GELUs' outputs below, not the weights
    monkeypatch.setattr(recompute, "MIN_DISTANCE", 4)
    lowering = C_TARGET.lowering
    object.__setattr__(C_TARGET, "lowering", (("recompute_activations", recompute.recompute_activations), *lowering))
    yield recompute
    object.__setattr__(C_TARGET, "lowering", lowering)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_activation_read_by_the_backward_is_recomputed_there(recompute_small, monkeypatch, approximate):
    """The GELU's output, read by the next layer's forward and again by its weight gradient, is computed again
    in the backward from the GELU's input (which the GELU's derivative reads there anyway): it lives through the
    forward only, the CUDA program's arena shrinks by the GELUs' outputs, and the step's results are eager's."""
    from tilewise.compiler.targets import get_target

    x = tw.randn(1024, 32)
    arenas, results = [], []
    for distance in (10**9, 4):  # recomputing nothing, then the GELUs
        monkeypatch.setattr(recompute_small, "MIN_DISTANCE", distance)
        _, step = mlp_step(approximate)
        _, programs, _ = tw.compile(step).lowered(get_target("cuda"), x)
        arenas.append(max(low.plan.arena_bytes for low in programs))
        mlp, step = mlp_step(approximate)
        cf = tw.compile(step)
        losses = [cf(x).numpy() for _ in range(2)]
        results.append(losses + [p.detach().numpy() for p in mlp.parameters()])
    eager_mlp, eager_step = mlp_step(approximate)
    eager = [eager_step(x).numpy() for _ in range(2)] + [p.detach().numpy() for p in eager_mlp.parameters()]
    for kept, recomputed, reference in zip(*results, eager):
        np.testing.assert_allclose(recomputed, kept, rtol=1e-5, atol=1e-7)  # (a sum's kernel may fold differently)
        np.testing.assert_allclose(recomputed, reference, rtol=2e-3, atol=1e-5)
    before, after = arenas
    assert after <= before - 3 * 1024 * 128 * 2, arenas  # the bfloat16 GELU outputs of the first three blocks


@pytest.mark.cuda
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_recomputed_activations_on_cuda_match_eager(monkeypatch, approximate):
    """On the GPU (where the tanh GELU joins its GEMM as cuBLASLt's GELU_AUX_BIAS epilogue and is recomputed
    from the epilogue's auxiliary output), the compiled step with its GELUs recomputed follows eager's."""
    from tilewise.compiler.lowering import recompute

    monkeypatch.setattr(recompute, "MIN_BYTES", 1024 * 128 * 2)
    monkeypatch.setattr(recompute, "MIN_DISTANCE", 4)
    x = tw.randn(1024, 32).cuda()
    mlp, step = mlp_step(approximate, "cuda")
    eager_mlp, eager_step = mlp_step(approximate, "cuda")
    cf = tw.compile(step)
    for _ in range(3):
        np.testing.assert_allclose(cf(x).cpu().numpy(), eager_step(x).cpu().numpy(), rtol=2e-3, atol=1e-5)
    for p, q in zip(mlp.parameters(), eager_mlp.parameters()):
        np.testing.assert_allclose(p.detach().cpu().numpy(), q.detach().cpu().numpy(), rtol=2e-3, atol=1e-5)


class _ConvBlock(tw.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = tw.nn.Conv2d(16, 16, 3, padding=1, bias=False)
        self.bn = tw.nn.BatchNorm2d(16)
        self.fc = tw.nn.Linear(32, 32)

    def forward(self, x):
        return self.fc(F.gelu(self.bn(self.conv(x)).relu()))


def _saved_values(compiled, tangents: int = 1) -> list:
    """The types of the values a compiled call's backward program reads from its forward (after the tangents)."""
    _, backward = compiled.programs()
    return [node.type for node in backward.graph.inputs[tangents:]]


def test_the_backward_recomputes_what_is_cheaper_than_saving_it():
    """A bf16 batch norm's normalised input is a float32 value made element-wise from the bf16 convolution
    output: the backward computes it again from what it keeps instead of saving 4 bytes an element (see [Note:
    saving less by recomputing]); the gradients are eager's."""
    tw.manual_seed(0)
    block = _ConvBlock()
    x = tw.randn(8, 16, 32, 32)
    compiled = tw.compile(lambda x: block(x))
    with tw.autocast(device_type="cpu", dtype=tw.bfloat16):
        y = compiled(x)
    y.float().square().sum().backward()
    got = [p.grad.clone() for p in block.parameters()]
    block.zero_grad()
    with tw.autocast(device_type="cpu", dtype=tw.bfloat16):
        expected = block(x)
    expected.float().square().sum().backward()
    close(y.detach().float(), expected.detach().float(), rtol=2e-2, atol=2e-2)
    for g, p in zip(got, block.parameters()):
        close(g, p.grad, rtol=3e-2, atol=3e-2)
    saved = _saved_values(compiled)
    activation = 8 * 16 * 32 * 32
    big = [t for t in saved if t.numel >= activation]
    assert not [t for t in big if t.dtype is tw.float32], f"a float32 activation is saved: {saved}"
    assert sum(t.nbytes for t in big) <= 4 * activation * 2, saved  # the padded input, the conv and GELU inputs


def test_placement_and_live_set_helpers_agree_with_a_walk_over_every_block():
    """The planner's first fit (``_Blocks``), its union of live spans (``_Coverage``) and the kernels' shared
    parameters (``program._overlapping``) give what a plain walk over every block and span gives."""
    import random

    from tilewise.compiler.lowering.memory import _Blocks, _Coverage
    from tilewise.compiler.program import _overlapping

    def first_fit(placed, size, start, end):
        offset = 0
        for o, s, _, _ in sorted(p for p in placed if not (p[3] < start or end < p[2])):
            if offset + size <= o:
                break
            offset = max(offset, o + s)
        return offset

    def union(spans):
        covered, end = 0, 0
        for lo, hi in sorted(spans):
            covered, end = covered + max(0, hi - max(lo, end)), max(end, hi)
        return covered

    rng = random.Random(0)
    for _ in range(100):
        placed, blocks = [], _Blocks()
        for _ in range(rng.randint(0, 100)):
            size, start = rng.choice([0, 64, 128, 1024, rng.randint(0, 5000)]), rng.randint(-1, 40)
            end = start + rng.randint(0, 20)
            offset = blocks.first_fit(size, start, end)
            assert offset == first_fit(placed, size, start, end)
            placed.append((offset, size, start, end))
            blocks.place(offset, size, start, end)
        points = sorted({rng.randint(0, 100) for _ in range(rng.randint(1, 30))})
        coverage, live = _Coverage(points), []
        for _ in range(100):
            if live and rng.random() < 0.4:
                coverage.add(*live.pop(rng.randrange(len(live))), -1)
            else:
                lo = rng.choice(points)
                live.append((lo, rng.choice([p for p in points if p >= lo])))
                coverage.add(*live[-1], 1)
            assert coverage.covered[1] == union(live)
        spans = [(rng.choice("ab"), lo, lo + rng.randint(0, 6)) for lo in (rng.randint(0, 40) for _ in range(30))]
        assert _overlapping(spans) == {k for k, (kind, lo, hi) in enumerate(spans) if any(
            j != k and kind == other and lo < end and first < hi for j, (other, first, end) in enumerate(spans))}

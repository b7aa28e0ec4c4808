"""Custom operators (``tilewise.library``) against torch.library: schemas, kernels, fakes, autograd, dispatcher keys,
``compile`` holding one as a single step, and torch's errors for bad registrations."""

import typing
from collections.abc import Sequence

import numpy as np
import pytest
import torch

import tilewise as tw
from tilewise.library import custom_op, infer_schema

# ---------------------------------------------------------------------------- schema inference


SIGNATURES = [  # (source of a function over T, the Tensor class, and D, the dtype class; mutates_args)
    ("def f(x: T) -> T: ...", ()),
    ("def f(x: T, w: Optional[T], ys: list[T], eps: float = 1e-6, n: int = 3, flag: bool = False, s: str = 'a', "
     "dt: Optional[D] = None) -> tuple[T, T]: ...", ()),
    ("def f(x: T, out: T) -> None: ...", ("out",)),
    ("def f(x: T, *, alpha: float = 2.0) -> list[T]: ...", ()),
    ("def f(x: T, dims: Sequence[int], p: Optional[float], ws: Sequence[Optional[T]]) -> tuple[T]: ...", ("x",)),
    ("def f(x: T, y: T) -> T: ...", "unknown"),
]


def _defined(source: str, tensor, dtype):
    scope = {"T": tensor, "D": dtype, "Optional": typing.Optional, "Sequence": Sequence}
    exec(source, scope)
    return scope["f"]


@pytest.mark.parametrize("source, mutates", SIGNATURES)
def test_infer_schema_matches_torch(source, mutates):
    ours = infer_schema(_defined(source, tw.Tensor, tw.dtype), mutates_args=mutates)
    assert ours == torch.library.infer_schema(_defined(source, torch.Tensor, torch.dtype), mutates_args=mutates)


def _errors(fn_tw, fn_torch, mutates=()):
    with pytest.raises(ValueError) as ours:
        infer_schema(fn_tw, mutates_args=mutates)
    with pytest.raises(ValueError) as theirs:
        torch.library.infer_schema(fn_torch, mutates_args=mutates)
    return str(ours.value), str(theirs.value)


@pytest.mark.parametrize("case", ["no annotation", "no return", "unknown mutated", "mutated float", "varargs"])
def test_infer_schema_errors_match_torch(case):
    if case == "no annotation":
        ours, theirs = _errors(lambda x: x, lambda x: x)
        want = "Parameter x must have a type annotation."
    elif case == "no return":
        def a(x: tw.Tensor): ...
        def b(x: torch.Tensor): ...
        ours, theirs = _errors(a, b)
        want = "No return type annotation was provided."
    elif case == "unknown mutated":
        def a(x: tw.Tensor) -> tw.Tensor: ...
        def b(x: torch.Tensor) -> torch.Tensor: ...
        ours, theirs = _errors(a, b, ("zz",))
        want = "{'zz'} in mutates_args were not found in the custom op's signature."
    elif case == "mutated float":
        def a(x: tw.Tensor, y: float) -> tw.Tensor: ...
        def b(x: torch.Tensor, y: float) -> torch.Tensor: ...
        ours, theirs = _errors(a, b, ("y",))
        want = "Parameter y is in mutable_args but only Tensors or collections of Tensors can be mutated"
    else:
        def a(x: tw.Tensor, *rest) -> tw.Tensor: ...
        def b(x: torch.Tensor, *rest) -> torch.Tensor: ...
        ours, theirs = _errors(a, b)
        want = "We do not support positional-only args, varargs, or varkwargs."
    assert want in ours and want in theirs
    assert ours.startswith("infer_schema(func): ") and theirs.startswith("infer_schema(func): ")


def test_mutates_args_is_required_as_in_torch():
    with pytest.raises(TypeError, match="mutates_args"):
        custom_op("twtest::nomut")(lambda x: x)
    with pytest.raises(TypeError, match="mutates_args"):
        torch.library.custom_op("twtest::nomut")(lambda x: x)


def test_name_needs_a_namespace():
    with pytest.raises(ValueError, match="namespace"):
        custom_op("plain", mutates_args=())(lambda x: x)


# ---------------------------------------------------------------------------- one operator, both libraries


def _scale_add(lib, T):  # noqa: N803 — the Tensor class of ``lib``
    """``x * alpha + y`` as a custom operator of ``lib`` (tilewise.library or torch.library), numpy inside."""
    @lib.custom_op("twtest::scale_add", mutates_args=())
    def scale_add(x: T, y: T, alpha: float = 2.0) -> T:
        mod = tw if T is tw.Tensor else torch
        return mod.from_numpy(np.asarray(x.numpy() * alpha + y.numpy()))

    @scale_add.register_fake
    def _(x, y, alpha=2.0):
        return x.new_empty(x.shape)

    def setup_context(ctx, inputs, output):
        ctx.alpha = inputs[2]
        ctx.save_for_backward(inputs[0])

    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * ctx.alpha + 0 * x, grad, None

    scale_add.register_autograd(backward, setup_context=setup_context)
    return scale_add


@pytest.fixture
def scale_add():
    return _scale_add(tw.library, tw.Tensor)


def test_forward_and_backward_match_torch(scale_add):
    theirs = _scale_add(torch.library, torch.Tensor)
    x, y = np.random.default_rng(0).standard_normal((2, 3, 4))
    tx, ty = tw.tensor(x, requires_grad=True), tw.tensor(y, requires_grad=True)
    px, py = torch.tensor(x, requires_grad=True), torch.tensor(y, requires_grad=True)
    out, ref = scale_add(tx, ty, 3.0), theirs(px, py, 3.0)
    np.testing.assert_allclose(out.detach().numpy(), ref.detach().numpy())
    (out * out).sum().backward()
    (ref * ref).sum().backward()
    np.testing.assert_allclose(tx.grad.numpy(), px.grad.numpy())
    np.testing.assert_allclose(ty.grad.numpy(), py.grad.numpy())
    assert out.grad_fn.name() == "GeneratedBackwardFor_twtest_scale_add_defaultBackward"


def test_gradcheck_float64(scale_add):
    """Backward against central differences: <grad, v> == (f(x + eps v) - f(x - eps v)) / 2 eps."""
    rng = np.random.default_rng(1)
    x, y, w, v = rng.standard_normal((4, 5))
    tx = tw.tensor(x, requires_grad=True)
    (scale_add(tx, tw.tensor(y), 1.5) * tw.tensor(w)).sum().backward()

    def f(xs):
        return float((scale_add(tw.tensor(xs), tw.tensor(y), 1.5) * tw.tensor(w)).sum())

    eps = 1e-6
    numeric = (f(x + eps * v) - f(x - eps * v)) / (2 * eps)
    assert abs(float((tx.grad * tw.tensor(v)).sum()) - numeric) < 1e-6


def test_ops_namespace_and_registration_by_name(scale_add):
    assert tw.ops.twtest.scale_add is tw.ops.twtest.scale_add.default
    np.testing.assert_allclose(tw.ops.twtest.scale_add(tw.ones(2), tw.ones(2)).numpy(), [3.0, 3.0])
    with pytest.raises(AttributeError, match="nope"):
        tw.ops.twtest.nope  # noqa: B018
    tw.library.register_kernel("twtest::scale_add", "cpu", lambda x, y, alpha=2.0: x - y)
    np.testing.assert_allclose(scale_add(tw.ones(2), tw.ones(2)).numpy(), [0.0, 0.0])
    with pytest.raises(RuntimeError, match="twtest::missing does not exist"):
        tw.library.register_fake("twtest::missing", lambda x: x)
    with pytest.raises(RuntimeError, match="device type at start of device string: tpu"):
        scale_add.register_kernel("tpu")


def test_binding_errors_name_the_operator(scale_add):
    with pytest.raises(TypeError, match="scale_add"):
        scale_add(tw.ones(2))
    with pytest.raises(TypeError, match="alpha"):
        scale_add(tw.ones(2), tw.ones(2), alpha="no")


def test_backward_without_registration_raises_torchs_error():
    @custom_op("twtest::square", mutates_args=())
    def square(x: tw.Tensor) -> tw.Tensor:
        return x * x

    y = square(tw.ones(3, requires_grad=True))
    assert y.requires_grad
    with pytest.raises(RuntimeError, match="Trying to backward through twtest::square but no autograd formula"):
        y.sum().backward()


def test_wrong_backward_arity_is_torchs_error():
    @custom_op("twtest::twice", mutates_args=())
    def twice(x: tw.Tensor, k: float) -> tw.Tensor:
        return x * k

    twice.register_autograd(lambda ctx, g: g)
    with pytest.raises(RuntimeError, match="function GeneratedBackwardFor_twtest_twice_defaultBackward returned an "
                                           r"incorrect number of gradients \(expected 2, got 1\)"):
        twice(tw.ones(2, requires_grad=True), 2.0).sum().backward()


def test_setup_context_saves_what_it_chooses():
    """As in torch, setup_context runs right after the kernel: an input it did not save may change in place before
    backward, and one it saved may not."""
    calls = []

    @custom_op("twtest::cube", mutates_args=())
    def cube(x: tw.Tensor, y: tw.Tensor) -> tw.Tensor:
        return x * x * x + y

    def setup_context(ctx, inputs, output):
        calls.append("setup")
        ctx.save_for_backward(inputs[0])
        assert ctx.needs_input_grad == (True, True)

    cube.register_autograd(lambda ctx, g: (3 * ctx.saved_tensors[0] ** 2 * g, g), setup_context=setup_context)
    x, y = tw.tensor([1.0, 2.0], requires_grad=True), tw.tensor([0.5, 0.5], requires_grad=True)
    z = y * 1
    out = cube(x, z)
    assert calls == ["setup"]
    z.add_(1.0)  # not saved: no error
    out.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [3.0, 12.0])
    out = cube(x * 1, y)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        saved = out.grad_fn.ctx.saved_tensors[0]
        saved.add_(1.0)
        out.sum().backward()


def test_fake_with_wrong_shape_fails_at_first_call():
    @custom_op("twtest::rows", mutates_args=())
    def rows(x: tw.Tensor) -> tw.Tensor:
        return x.sum(1)

    rows.register_fake(lambda x: x.new_empty(x.shape))
    with pytest.raises(RuntimeError, match=r"twtest::rows: the fake implementation's output 0 \(shape \[2, 3\]"):
        rows(tw.ones(2, 3))
    rows.register_fake(lambda x: x.new_empty(x.shape[:1]))
    np.testing.assert_allclose(rows(tw.ones(2, 3)).numpy(), [3.0, 3.0])


def test_output_aliasing_an_input_is_torchs_error():
    @custom_op("twtest::same", mutates_args=())
    def same(x: tw.Tensor) -> tw.Tensor:
        return x.view(-1)

    with pytest.raises(RuntimeError, match="may not alias any inputs"):
        same(tw.ones(2))


def test_no_kernel_for_the_device():
    @custom_op("twtest::gpu_only", mutates_args=(), device_types="cuda")
    def gpu_only(x: tw.Tensor) -> tw.Tensor:
        return x.clone()

    with pytest.raises(NotImplementedError, match="twtest::gpu_only: no kernel registered for device type 'cpu'"):
        gpu_only(tw.ones(2))


def test_mutating_operator_writes_its_argument():
    @custom_op("twtest::fill_twos", mutates_args=("out",))
    def fill_twos(x: tw.Tensor, out: tw.Tensor) -> None:
        out.copy_(x * 2)

    out = tw.zeros(3)
    version = out._version
    assert fill_twos(tw.ones(3), out) is None
    np.testing.assert_allclose(out.numpy(), [2.0, 2.0, 2.0])
    assert out._version > version
    with pytest.raises(RuntimeError, match="mutate"):
        fill_twos.register_autograd(lambda ctx, g: (g, None))


# ---------------------------------------------------------------------------- dispatcher keys


def test_profiler_names_the_operator(scale_add):
    with tw.profiler.profile() as prof:
        scale_add(tw.ones(2), tw.ones(2))
    assert "twtest::scale_add" in [a.key for a in prof.key_averages()]


def test_autocast_policy():
    seen = []

    @custom_op("twtest::dtype_of", mutates_args=())
    def dtype_of(x: tw.Tensor) -> tw.Tensor:
        seen.append(x.dtype)
        return x.clone()

    with tw.autocast("cpu", dtype=tw.bfloat16):
        dtype_of(tw.ones(2))
    dtype_of.register_autocast("cpu", tw.bfloat16)
    with tw.autocast("cpu", dtype=tw.bfloat16):
        dtype_of(tw.ones(2))
    assert seen == [tw.float32, tw.bfloat16]


# ---------------------------------------------------------------------------- compile


def test_compile_holds_it_as_one_step(scale_add):
    def fn(a, b):
        return (scale_add(a.exp(), b, 0.5) * 2).sum()

    compiled = tw.compile(fn, fullgraph=True)
    a, b = tw.randn(8), tw.randn(8)
    np.testing.assert_allclose(compiled(a, b).numpy(), fn(a, b).numpy(), rtol=1e-6)
    (program,) = compiled.programs()
    calls = [s for s in program.steps if getattr(s, "op", None) is scale_add.op]
    assert len(calls) == 1 and program.kernel_count == 2  # exp before it, mul+sum after: nothing fused across it
    assert "call twtest::scale_add" in program.describe()


def test_compiled_training_step_matches_eager(scale_add):
    def step(w, x, y):
        loss = (scale_add(x * w, y, 1.5) ** 2).mean()
        loss.backward()
        return loss

    x, y = tw.randn(6, dtype=tw.float64), tw.randn(6, dtype=tw.float64)
    w_eager = tw.randn(6, dtype=tw.float64).requires_grad_()
    w_comp = w_eager.detach().clone().requires_grad_()
    loss = step(w_eager, x, y)
    loss_c = tw.compile(step, fullgraph=True)(w_comp, x, y)
    np.testing.assert_allclose(loss_c.numpy(), loss.detach().numpy(), rtol=1e-12)
    np.testing.assert_allclose(w_comp.grad.numpy(), w_eager.grad.numpy(), rtol=1e-12)


def test_compile_without_fake_is_torchs_error():
    @custom_op("twtest::no_fake", mutates_args=())
    def no_fake(x: tw.Tensor) -> tw.Tensor:
        return x + 1

    with pytest.raises(RuntimeError, match="no fake impl registered for <CustomOpDef\\(twtest::no_fake\\)>"):
        tw.compile(lambda x: no_fake(x) * 2, fullgraph=True)(tw.ones(2))


def test_mutating_operator_breaks_the_graph():
    @custom_op("twtest::add_into", mutates_args=("out",))
    def add_into(x: tw.Tensor, out: tw.Tensor) -> None:
        out.add_(x)

    def fn(x, out):
        add_into(x * 2, out)
        return out + 1

    out = tw.zeros(3)
    result = tw.compile(fn)(tw.ones(3), out)
    np.testing.assert_allclose(out.numpy(), [2.0] * 3)
    np.testing.assert_allclose(result.numpy(), [3.0] * 3)
    with pytest.raises(Exception, match="mutates its arguments"):
        tw.compile(fn, fullgraph=True)(tw.ones(3), tw.zeros(3))


def test_explain_names_the_operator(scale_add):
    e = tw.explain(lambda a, b: scale_add(a, b).relu(), tw.randn(4), tw.randn(4), repeats=1)
    assert "twtest::scale_add" in str(e)


# ---------------------------------------------------------------------------- Triton (optional) on a GPU


@pytest.mark.cuda
def test_triton_op_launches_on_tilewise_tensors_and_compiles_as_one_step():
    triton = pytest.importorskip("triton")
    from _triton_kernels import scaled_add_kernel

    @tw.library.triton_op("twtest::triton_scaled_add", mutates_args=())
    def scaled_add(x: tw.Tensor, y: tw.Tensor, alpha: float) -> tw.Tensor:
        out = tw.empty_like(x)
        n = x.numel()
        tw.library.wrap_triton(scaled_add_kernel)[(triton.cdiv(n, 256),)](x, y, out, n, alpha, BLOCK=256)
        return out

    scaled_add.register_fake(lambda x, y, alpha: tw.empty_like(x))
    x, y = tw.randn(1000, device="cuda"), tw.randn(1000, device="cuda")
    np.testing.assert_allclose(scaled_add(x, y, 2.0).cpu().numpy(), (2.0 * x + y).cpu().numpy(), rtol=1e-6)
    fn = tw.compile(lambda x, y: scaled_add(x.exp(), y, 0.5).sum())
    np.testing.assert_allclose(fn(x, y).item(), (0.5 * x.exp() + y).sum().item(), rtol=1e-5)
    (program,) = fn.programs()
    assert sum(getattr(s, "op", None) is scaled_add.op for s in program.steps) == 1


# ---------------------------------------------------------------------------- the example


def test_custom_kernels_example_runs_on_the_cpu():
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    env = dict(os.environ, PYTHONPATH=str(root))
    done = subprocess.run([sys.executable, str(root / "examples" / "custom_kernels.py"), "--steps", "3",
                           "--device", "cpu"], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    agreement = next(line for line in lines if line.startswith("rms_norm vs its decomposition"))
    assert all(float(v.rstrip(",")) < 1e-4 for v in agreement.split()[5::2]), agreement
    training = next(line for line in lines if line.startswith("compiled training step"))
    ours, theirs = training.split("; with the decomposed one: ")
    assert ours.split("loss ")[1] == theirs, training  # same losses, to the printed digits

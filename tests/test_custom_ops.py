"""Custom operators (``tilewise.library``) against torch.library: schemas, kernels, fakes, autograd, dispatcher keys,
``compile`` holding one as a single step, and torch's errors for bad registrations."""

import sys
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


def test_tilewise_gradcheck_of_a_custom_op(scale_add):
    rng = np.random.default_rng(2)
    x = tw.tensor(rng.standard_normal((3, 4)), requires_grad=True)
    y = tw.tensor(rng.standard_normal((3, 4)), requires_grad=True)
    assert tw.autograd.gradcheck(lambda a, b: scale_add(a, b, 1.5), (x, y))


@pytest.mark.cuda
def test_tilewise_gradcheck_of_a_custom_op_with_a_cuda_kernel():
    """A custom operator whose CUDA kernel is a load_inline kernel, in float64, checked by gradcheck."""
    if not tw.cuda.is_available():
        pytest.skip("needs a GPU")
    module = tw.cuda.load_inline("twtest_axpby64", r"""
extern "C" __global__ void axpby(const double* x, const double* y, double* out, double a, long long n) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < n) out[i] = a * x[i] * x[i] + y[i];
}""", ["axpby"])

    @tw.library.custom_op("twtest::square_axpy", mutates_args=(), device_types="cuda")
    def square_axpy(x: tw.Tensor, y: tw.Tensor, a: float) -> tw.Tensor:
        out = tw.empty_like(x)
        n = x.numel()
        module.axpby(x.contiguous(), y.contiguous(), out, a, n, grid=(n + 255) // 256, block=256)
        return out

    @square_axpy.register_fake
    def _(x, y, a):
        return tw.empty_like(x)

    def setup_context(ctx, inputs, output):
        ctx.a = inputs[2]
        ctx.save_for_backward(inputs[0])

    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * 2 * ctx.a * x, grad, None

    square_axpy.register_autograd(backward, setup_context=setup_context)
    rng = np.random.default_rng(3)
    x = tw.tensor(rng.standard_normal((5, 7)), device="cuda", requires_grad=True)
    y = tw.tensor(rng.standard_normal((5, 7)), device="cuda", requires_grad=True)
    assert tw.autograd.gradcheck(lambda a, b: square_axpy(a, b, 0.75), (x, y))


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


def test_autocast_policy_is_registered_for_one_device_type():
    """torch.library.register_autocast registers for the device type it names: a CUDA policy leaves CPU autocast
    alone, and each device type keeps its own."""
    seen = []

    @custom_op("twtest::dtype_seen", mutates_args=())
    def dtype_seen(x: tw.Tensor) -> tw.Tensor:
        seen.append(x.dtype)
        return x.clone()

    dtype_seen.register_autocast("cuda", tw.float16)
    with tw.autocast("cpu", dtype=tw.bfloat16):
        dtype_seen(tw.ones(2))
    dtype_seen.register_autocast("cpu", tw.float32)
    with tw.autocast("cpu", dtype=tw.bfloat16):
        dtype_seen(tw.ones(2, dtype=tw.bfloat16))
    assert seen == [tw.float32, tw.float32]
    assert dtype_seen.op.autocast == {"cuda": "cast_inputs_float16", "cpu": "cast_inputs_float32"}


def test_autocast_casts_to_cast_inputs_whatever_the_region_dtype_as_torch():
    """register_autocast(op, device_type, cast_inputs): floating inputs other than float64 become cast_inputs itself
    (float16 under a bfloat16 region too), integers and float64 stay, and the kernel runs with autocast off."""
    def seen_by(lib, name):
        seen = []

        @lib.library.custom_op(f"{name}::pair", mutates_args=())
        def pair(x: lib.Tensor, y: lib.Tensor) -> lib.Tensor:
            seen.append((str(x.dtype).split(".")[-1], str(y.dtype).split(".")[-1], lib.is_autocast_enabled("cpu")))
            return x + y.to(x.dtype)

        lib.library.register_autocast(f"{name}::pair", "cpu", lib.float16)
        for region in (lib.bfloat16, lib.float16):
            with lib.autocast("cpu", dtype=region):
                for xd, yd in ((lib.float32, lib.float64), (lib.bfloat16, lib.float32), (lib.int64, lib.float32)):
                    out = pair(lib.ones(2, dtype=xd), lib.ones(2, dtype=yd))
                    seen.append(str(out.dtype).split(".")[-1])
        return seen

    assert seen_by(tw, "twtest_cast") == seen_by(torch, "twtest_cast")


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


# ------------------------------------------------------------------------- CUDA graphs: what is captured, and why not


def _cuda_steps(fn, *args) -> dict:
    """The library-call steps a CUDA program of ``fn`` would hold, by operator name (lowered for the CUDA target on
    any machine; the steps are made without launching anything)."""
    from tilewise.compiler.program import step_nodes
    from tilewise.compiler.program_cuda import CudaExternStep
    from tilewise.compiler.targets import get_target

    _, (low,), _ = tw.compile(fn).lowered(get_target("cuda"), *args)
    return {node.op: CudaExternStep(node, low.plan, results, tw.device("cuda"))
            for node, results in step_nodes(low.fused) if node.op != "fused"}


def _doubling(name: str, **kwargs):
    @custom_op(name, mutates_args=(), **kwargs)
    def double(x: tw.Tensor) -> tw.Tensor:
        return x * 2

    double.register_fake(lambda x: tw.empty_like(x))
    return double


def test_custom_operator_steps_are_capturable_and_the_opt_out_tag_names_the_operator():
    plain = _doubling("twtest::graph_plain")
    unsafe = _doubling("twtest::graph_unsafe", tags=(tw.Tag.cudagraph_unsafe,))
    steps = _cuda_steps(lambda x: unsafe(plain(x.exp()).relu()).sum() + x.cumsum(0).sum(), tw.randn(8))
    assert steps["twtest::graph_plain"].capturable
    assert "[custom operator]" in steps["twtest::graph_plain"].describe()
    assert not steps["twtest::graph_unsafe"].capturable
    reason = steps["twtest::graph_unsafe"].capture_blocker()
    assert reason.startswith("call twtest::graph_unsafe [custom operator]")
    assert reason.endswith(": the operator is tagged cudagraph_unsafe")
    # a built-in operator run by the eager backend (it may allocate and read back) keeps the old rule
    assert not steps["cumsum"].capturable and "call cumsum [eager]" in steps["cumsum"].capture_blocker()


def test_tags_are_torchs():
    def twice(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    ours = _doubling("twtest::tagged", tags=tw.Tag.cudagraph_unsafe)
    theirs = torch.library.custom_op("twtest::tagged", mutates_args=(), tags=torch.Tag.cudagraph_unsafe)(twice)
    assert [(t.name, t.value) for t in ours.default.tags] == [(t.name, int(t)) for t in theirs._opoverload.tags]
    assert [t.name for t in tw.Tag] == list(torch.Tag.__members__)
    assert _doubling("twtest::untagged").default.tags == [tw.Tag.pt2_compliant_tag]
    with pytest.raises(TypeError, match="tags must be tilewise.Tag values"):
        _doubling("twtest::badly_tagged", tags=("cudagraph_unsafe",))
    with pytest.raises(TypeError):
        torch.library.custom_op("twtest::badly_tagged", mutates_args=(), tags=("cudagraph_unsafe",))(twice)


def test_host_operations_are_refused_while_capturing():
    from tilewise.backends.cuda.kernels import random as cuda_random
    from tilewise.backends.cuda.runtime import copy_dtoh, copy_htod
    from tilewise.backends.cuda.runtime.capturing import StreamCaptureError, capture_scope, is_current_stream_capturing

    assert not is_current_stream_capturing()
    with capture_scope(0x1234):
        assert is_current_stream_capturing()
        for refused, what in ((lambda: copy_dtoh(0, 0, 4), "reading device memory on the host"),
                              (lambda: copy_htod(0, 0, 4), "copying host memory to the device"),
                              (lambda: tw.cuda.synchronize(0), "synchronizing the device"),
                              (lambda: tw.cuda.Event().synchronize(), "waiting for an event on the host"),
                              (lambda: cuda_random._claim(None, 1), "drawing random numbers")):
            with pytest.raises(StreamCaptureError, match=f"{what} is not permitted while a CUDA graph"):
                refused()
    assert not is_current_stream_capturing()


def test_triton_op_launches_go_to_tilewises_current_stream(monkeypatch):
    """Triton asks its driver for the current stream (torch's): inside a triton_op it gets tilewise's, which is the
    capture stream while a program's graph is captured; everywhere else what it got before."""
    import types

    from tilewise.backends.cuda.runtime.stream import Stream, stream
    from tilewise.library import _triton_on_current_stream

    driver = types.SimpleNamespace(get_current_stream=lambda device: 1000 + device)
    fake = types.SimpleNamespace(runtime=types.SimpleNamespace(driver=types.SimpleNamespace(active=driver)))
    monkeypatch.setitem(sys.modules, "triton", fake)
    ours = Stream.from_handle(0x5EED, 0)
    with stream(ours):
        assert driver.get_current_stream(0) == 1000
        with _triton_on_current_stream():
            assert driver.get_current_stream(0) == 0x5EED
        assert driver.get_current_stream(0) == 1000
        with _triton_on_current_stream():  # hooked once
            assert driver.get_current_stream(0) == 0x5EED


# ---------------------------------------------------------------------------- CUDA graphs on a GPU


def _example():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "examples" / "custom_kernels.py"
    spec = importlib.util.spec_from_file_location("custom_kernels_example", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _train(step_of, make_model, calls: int, compiled: bool):
    """Losses and final parameters of ``calls`` training steps (the same data every call), and the program."""
    tw.manual_seed(0)
    model = make_model()
    optimizer = tw.optim.AdamW(model.parameters(), lr=1e-2)
    x, y = tw.randn(32, 64, device="cuda"), tw.randn(32, 64, device="cuda")
    step = step_of(model, optimizer)
    fn = tw.compile(step) if compiled else step
    losses = [fn(x, y).item() for _ in range(calls)]
    params = [p.detach().cpu().numpy() for p in model.parameters()]
    return losses, params, fn.programs() if compiled else None


def _training_step(model, optimizer):
    def step(x, y):
        loss = tw.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss

    return step


def _captured_like_eager(make_model, calls: int = 6):
    eager_losses, eager_params, _ = _train(_training_step, make_model, calls, compiled=False)
    losses, params, programs = _train(_training_step, make_model, calls, compiled=True)
    program = programs[-1]  # the variant with the optimizer's state made (the first call makes it)
    runtime = program.runtime
    assert not runtime.why_not and len(runtime.graphs) == 1, runtime.why_not
    assert runtime.calls >= calls - 1 and runtime.replays == runtime.calls - 1  # captured at its second call
    np.testing.assert_allclose(losses, eager_losses, rtol=1e-4)
    for ours, theirs in zip(params, eager_params):
        np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-5)
    return program


@pytest.mark.cuda
def test_compiled_training_step_with_a_load_inline_operator_is_captured_and_matches_eager():
    example = _example()
    module = tw.cuda.load_inline("rms_norm", example.RMS_NORM_CUDA, ["rms_norm_forward", "rms_norm_backward"])
    example.register_cuda_kernels(module)
    norm = lambda x, w: example.rms_norm(x, w, 1e-6)[0]
    program = _captured_like_eager(lambda: example.Block(64, norm).to("cuda"))
    ops = {s.node.op for s in program.steps if getattr(s, "custom", False)}
    assert ops == {"ext::rms_norm", "ext::rms_norm_backward"}


@pytest.mark.cuda
def test_compiled_training_step_with_a_triton_op_is_captured_and_matches_eager():
    triton = pytest.importorskip("triton")
    from _triton_kernels import scaled_add_kernel

    @tw.library.triton_op("twtest::triton_scaled_add_trained", mutates_args=())
    def scaled_add(x: tw.Tensor, y: tw.Tensor, alpha: float) -> tw.Tensor:
        x, y = x.contiguous(), y.contiguous()
        out = tw.empty_like(x)
        n = x.numel()
        tw.library.wrap_triton(scaled_add_kernel)[(triton.cdiv(n, 256),)](x, y, out, n, alpha, BLOCK=256)
        return out

    scaled_add.register_fake(lambda x, y, alpha: tw.empty_like(x))
    scaled_add.register_autograd(lambda ctx, grad: (grad * ctx.alpha, grad, None),
                                 setup_context=lambda ctx, inputs, output: setattr(ctx, "alpha", inputs[2]))

    class Residual(tw.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = tw.nn.Linear(64, 64)

        def forward(self, x):
            return scaled_add(tw.tanh(self.linear(x)), x, 0.5)

    program = _captured_like_eager(lambda: Residual().to("cuda"))
    assert sum(getattr(s, "op", None) is scaled_add.op for s in program.steps) == 1


def _uncapturable(kind: str):
    """A CUDA custom operator that cannot be captured, for each reason the runtime refuses one."""
    @custom_op(f"twtest::uncapturable_{kind}", mutates_args=(), device_types="cuda")
    def op(x: tw.Tensor) -> tw.Tensor:
        if kind == "host_read":
            return x / float(x.abs().max())
        if kind == "upload":
            return x + tw.tensor([1.5], device=x.device)
        if kind == "synchronize":
            tw.cuda.synchronize()
            return x * 3
        return x + tw.rand_like(x)  # random: the draw would be fixed in the graph

    op.register_fake(lambda x: tw.empty_like(x))
    return op


@pytest.mark.cuda
@pytest.mark.parametrize("kind", ["host_read", "upload", "synchronize", "random"])
def test_an_operator_that_cannot_be_captured_falls_back_with_the_reason_logged(kind, capsys):
    from tilewise.config import settings

    op = _uncapturable(kind)
    fn = lambda x: op(x.exp()).relu() + 1
    compiled = tw.compile(fn)
    x = tw.randn(256, device="cuda")
    settings.log.add("graphs")
    try:
        tw.manual_seed(3)
        ours = [compiled(x).cpu().numpy() for _ in range(4)]
    finally:
        settings.log.discard("graphs")
    tw.manual_seed(3)
    eager = [fn(x).cpu().numpy() for _ in range(4)]
    for a, b in zip(ours, eager):
        np.testing.assert_allclose(a, b, rtol=1e-6)
    (program,) = compiled.programs()
    assert program.runtime.replays == 0 and not program.runtime.graphs
    assert f"call twtest::uncapturable_{kind}" in program.runtime.why_not
    assert "StreamCaptureError" in program.runtime.why_not
    assert f"its steps run uncaptured: capturing call twtest::uncapturable_{kind}" in capsys.readouterr().err


@pytest.mark.cuda
def test_an_operator_tagged_cudagraph_unsafe_is_never_captured(capsys):
    from tilewise.config import settings

    launches = []

    @custom_op("twtest::opted_out", mutates_args=(), device_types="cuda", tags=tw.Tag.cudagraph_unsafe)
    def opted_out(x: tw.Tensor) -> tw.Tensor:
        launches.append(1)
        return x * 2

    opted_out.register_fake(lambda x: tw.empty_like(x))
    compiled = tw.compile(lambda x: opted_out(x.exp()).relu())
    x = tw.randn(64, device="cuda")
    settings.log.add("graphs")
    try:
        results = [compiled(x).cpu().numpy() for _ in range(3)]
    finally:
        settings.log.discard("graphs")
    assert len(launches) == 3  # its Python ran on every call: no capture, no replay
    np.testing.assert_allclose(results[-1], (2 * x.exp()).relu().cpu().numpy(), rtol=1e-6)
    (program,) = compiled.programs()
    assert program.runtime.replays == 0
    assert "twtest::opted_out" in capsys.readouterr().err and "tagged cudagraph_unsafe" in program.runtime.why_not


@pytest.mark.cuda
def test_memory_a_captured_operator_allocates_is_never_handed_to_another_tensor():
    from tilewise.backends.cuda.runtime import get_allocator

    @custom_op("twtest::with_temporaries", mutates_args=(), device_types="cuda")
    def with_temporaries(x: tw.Tensor) -> tw.Tensor:
        scratch = x * 2  # a temporary, freed inside the capture
        return scratch + x.exp()

    with_temporaries.register_fake(lambda x: tw.empty_like(x))
    fn = lambda x: with_temporaries(x.relu()) - 1
    compiled = tw.compile(fn)
    x = tw.randn(1000, device="cuda")
    for _ in range(2):  # the second call captures
        compiled(x)
    private = [(s.ptr, s.ptr + s.size) for s in get_allocator().segments() if s.pool_id]
    assert private, "the operator's allocations during the capture come from the graph's pool"
    others = [tw.empty(n, device="cuda") for n in (1000, 1000, 4000, 1 << 20) for _ in range(4)]
    assert not any(lo <= t.data_ptr() < hi for t in others for lo, hi in private)
    for t in others:
        t.fill_(7.0)  # were any of them the graph's temporaries, the replays below would read sevens
    for _ in range(3):
        np.testing.assert_allclose(compiled(x).cpu().numpy(), fn(x).cpu().numpy(), rtol=1e-6)
    assert compiled.programs()[0].runtime.replays == 4


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

"""FP8 training (tilewise.float8): the layer against an FP8 reference written with numpy and against float32,
scaling state, conversion, errors, and a compiled training step."""

from __future__ import annotations

import copy
import math
import re

import ml_dtypes
import numpy as np
import pytest

import tilewise as tw
from tilewise.float8 import (
    CastConfig,
    DelayedScalingConfig,
    Float8Linear,
    Float8LinearConfig,
    ScalingType,
    convert_to_float8_training,
    sync_float8_amax_and_scale_history,
)

E4M3, E5M2 = ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2
MAX = {E4M3: 448.0, E5M2: 57344.0}


def _quantized(x: np.ndarray, dtype) -> tuple[np.ndarray, np.float32]:
    """numpy's FP8 cast with a current scale: the values the FP8 GEMMs see, and the inverse scale."""
    scale = np.float32(MAX[dtype]) / np.maximum(np.abs(x).max().astype(np.float32), np.float32(1e-12))
    q = np.clip(x.astype(np.float32) * scale, -MAX[dtype], MAX[dtype]).astype(dtype).astype(np.float32)
    return q, np.float32(1) / scale


def _reference(x, w, b, g):
    """Forward and gradients of ``x @ w.T + b`` with FP8 operands, in float32 numpy."""
    xq, xi = _quantized(x, E4M3)
    wq, wi = _quantized(w, E4M3)
    gq, gi = _quantized(g, E5M2)
    y = (xq * xi) @ (wq * wi).T + b
    return y, (gq * gi) @ (wq * wi), (gq * gi).T @ (xq * xi), g.sum(0)


def _layer(seed=0, inp=32, out=48, config=None):
    tw.manual_seed(seed)
    return Float8Linear.from_float(tw.nn.Linear(inp, out), config or Float8LinearConfig())


def test_forward_and_gradients_match_the_numpy_fp8_reference():
    layer = _layer()
    rng = np.random.default_rng(0)
    x_np = rng.standard_normal((64, 32)).astype(np.float32)
    g_np = rng.standard_normal((64, 48)).astype(np.float32) * 1e-3
    x = tw.tensor(x_np, requires_grad=True)
    y = layer(x)
    y.backward(tw.tensor(g_np))
    ref = _reference(x_np, layer.weight.detach().numpy(), layer.bias.detach().numpy(), g_np)
    for ours, theirs in zip((y.detach(), x.grad, layer.weight.grad, layer.bias.grad), ref):
        np.testing.assert_allclose(ours.numpy(), theirs, rtol=1e-5, atol=1e-5 * np.abs(theirs).max())


def test_close_to_float32_within_fp8_tolerance():
    tw.manual_seed(1)
    dense = tw.nn.Sequential(tw.nn.Linear(64, 128), tw.nn.GELU(), tw.nn.Linear(128, 32))
    fp8 = convert_to_float8_training(copy.deepcopy(dense))
    x = tw.randn(32, 64)
    for model in (dense, fp8):
        model(x).square().mean().backward()
    out_err = (fp8(x) - dense(x)).norm() / dense(x).norm()
    assert out_err.item() < 0.06  # e4m3: 3 mantissa bits, 2^-4 relative per element at most
    for (name, p), (_, q) in zip(fp8.named_parameters(), dense.named_parameters()):
        rel = ((p.grad - q.grad).norm() / q.grad.norm()).item()
        assert rel < 0.2, f"{name}: relative gradient error {rel}"  # e5m2 gradients: 2 mantissa bits


def test_training_loss_follows_float32():
    def run(convert):
        tw.manual_seed(3)
        model = tw.nn.Sequential(tw.nn.Linear(32, 64), tw.nn.ReLU(), tw.nn.Linear(64, 16))
        if convert:
            convert_to_float8_training(model)
        opt = tw.optim.SGD(model.parameters(), lr=0.1)
        gen = tw.Generator().manual_seed(4)
        x, target = tw.randn(64, 32, generator=gen), tw.randn(64, 16, generator=gen)
        losses = []
        for _ in range(20):
            loss = tw.nn.functional.mse_loss(model(x), target)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses

    dense, fp8 = run(False), run(True)
    assert fp8[-1] < 0.9 * fp8[0]  # it trains
    assert abs(fp8[-1] - dense[-1]) < 0.03 * dense[-1]


def test_master_weights_and_optimizer_state_stay_float32():
    layer = _layer()
    opt = tw.optim.Adam(layer.parameters(), lr=1e-3)
    layer(tw.randn(16, 32)).sum().backward()
    opt.step()
    assert layer.weight.dtype is tw.float32 and layer.weight.grad.dtype is tw.float32
    assert all(v.dtype is tw.float32 for s in opt.state.values() for v in s.values() if isinstance(v, tw.Tensor)
               and v.ndim > 0)


def test_weight_cast_is_made_once_while_the_weight_is_unchanged():
    layer = _layer()
    first = layer._cast_weight(transposed=True)
    assert layer._cast_weight(transposed=True).fp8 is first.fp8  # a second micro-batch reuses it
    assert layer._cast_weight(transposed=False).fp8_t is first.fp8_t  # and its transposed copy
    np.testing.assert_array_equal(first.fp8_t.float().numpy(), first.fp8.float().numpy().T)
    with tw.no_grad():
        layer.weight.mul_(2)
    assert layer._cast_weight(transposed=True).fp8 is not first.fp8  # an optimizer step (a write) recasts


def test_the_forward_gemm_takes_fast_accumulation_as_torchaos_default():
    """``gemm_config_output`` (torchao's default: fast accumulation) and the backward's two GEMMs (float32
    accumulation), as the compiled step passes them to ``_scaled_mm``."""
    from tilewise.compiler.targets import CUDA_TARGET
    from tilewise.float8 import Float8GemmConfig

    def fast_accum_of_each_gemm(config):
        layer = _layer(config=config)

        def step(x):
            y = layer(x)
            y.sum().backward()
            return y

        _, programs, _ = tw.compile(step).lowered(CUDA_TARGET, tw.randn(16, 32, requires_grad=True))
        return [n.bound_args(n.srcs)[-1] for low in programs for n in low.fused.body if n.op == "_scaled_mm"]

    assert fast_accum_of_each_gemm(Float8LinearConfig()) == [True, False, False]
    slow = Float8LinearConfig(gemm_config_output=Float8GemmConfig(), gemm_config_grad_weight=Float8GemmConfig(True))
    assert fast_accum_of_each_gemm(slow) == [False, False, True]


def test_convert_swaps_linears_keeps_order_and_parameters():
    model = tw.nn.Sequential(tw.nn.Linear(32, 32), tw.nn.ReLU(), tw.nn.Linear(32, 8))
    weight = model[0].weight
    convert_to_float8_training(model, module_filter_fn=lambda mod, fqn: fqn != "2")
    assert [type(m).__name__ for m in model] == ["Float8Linear", "ReLU", "Linear"]
    assert model[0].weight is weight


def test_convert_swaps_linear_subclasses_once():
    """torchao swaps every ``isinstance(mod, nn.Linear)`` (an attention's output projection, a user's subclass);
    a layer already converted stays as it is."""
    class Tagged(tw.nn.Linear):
        pass

    model = tw.nn.Sequential(Tagged(32, 32), tw.nn.MultiheadAttention(32, 2))
    x = tw.randn(16, 2, 32)
    before = model[1](x, x, x)[0]
    convert_to_float8_training(model)
    assert type(model[0]) is Float8Linear and type(model[1].out_proj) is Float8Linear
    # attention reads the projection's weight, not its module, as torch's does: its result is unchanged
    assert tw.equal(model[1](x, x, x)[0], before)
    converted = model[0]
    convert_to_float8_training(model)
    assert model[0] is converted


def test_shapes_not_multiple_of_16_name_the_requirement():
    with pytest.raises(ValueError, match="in_features is 30, not a multiple of 16.*module_filter_fn"):
        convert_to_float8_training(tw.nn.Linear(30, 32))
    with pytest.raises(ValueError, match="out_features is 8, not a multiple of 16"):
        Float8Linear(32, 8)
    with pytest.raises(ValueError, match="rows of the input.*is 10, not a multiple of 16"):
        _layer()(tw.randn(2, 5, 32))


def test_config_errors():
    with pytest.raises(ValueError, match="history_len must be at least 1"):
        DelayedScalingConfig(history_len=0)
    with pytest.raises(ValueError, match="unknown recipe 'rowwise_x'"):
        Float8LinearConfig.from_recipe_name("rowwise_x")


def test_delayed_scaling_records_amax_and_syncs_the_history():
    config = Float8LinearConfig.from_recipe_name("delayed")
    config = Float8LinearConfig(config.cast_config_input, config.cast_config_weight, config.cast_config_grad_output,
                                DelayedScalingConfig(history_len=4))
    layer = _layer(config=config)
    amaxes = []
    for step in range(3):
        x = tw.randn(16, 32) * (step + 1)
        layer(x).sum().backward()
        amaxes.append(x.abs().max().item())
        assert layer.fp8_amax_input.item() == pytest.approx(amaxes[-1])
        sync_float8_amax_and_scale_history(layer)
    history = layer.fp8_amax_history_input.tolist()
    assert history == pytest.approx([amaxes[2], amaxes[1], amaxes[0], 0.0])
    assert layer.fp8_scale_input.item() == pytest.approx(448.0 / max(amaxes))
    assert layer.fp8_amax_grad_output.item() == pytest.approx(1.0)  # d(sum)/dy is all ones
    # the next forward casts with the synced (delayed) scale, not this input's amax
    x = tw.randn(16, 32) * 0.01
    y = layer(x)
    xq = np.clip(x.numpy() * (448.0 / max(amaxes)), -448, 448).astype(E4M3).astype(np.float32)
    w = layer.weight.detach().numpy()
    wscale = layer.fp8_scale_weight.item()
    wq = np.clip(w * wscale, -448, 448).astype(E4M3).astype(np.float32)
    ref = (xq / (448.0 / max(amaxes))) @ (wq / wscale).T + layer.bias.detach().numpy()
    np.testing.assert_allclose(y.detach().numpy(), ref, rtol=1e-4, atol=1e-6)


def test_delayed_scaling_before_any_sync_uses_the_current_amax():
    layer = _layer(config=Float8LinearConfig.from_recipe_name("delayed"))
    dynamic = _layer()
    x = tw.randn(16, 32)
    np.testing.assert_array_equal(layer(x).detach().numpy(), dynamic(x).detach().numpy())


def test_mixed_recipe_dynamic_input_delayed_weight():
    config = Float8LinearConfig(cast_config_weight=CastConfig(ScalingType.DELAYED))
    layer = _layer(config=config)
    assert not hasattr(layer, "fp8_amax_history_input") and hasattr(layer, "fp8_amax_history_weight")
    layer(tw.randn(16, 32)).sum().backward()
    assert layer.fp8_amax_weight.item() == pytest.approx(layer.weight.abs().max().item())


def _train_step(model, opt):
    def step(x, target):
        loss = tw.nn.functional.mse_loss(model(x), target)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss

    return step


def test_compiled_training_step_matches_eager():
    def run(compiled):
        tw.manual_seed(5)
        model = convert_to_float8_training(tw.nn.Sequential(tw.nn.Linear(32, 64), tw.nn.ReLU(),
                                                            tw.nn.Linear(64, 16)))
        opt = tw.optim.SGD(model.parameters(), lr=0.1)
        step = _train_step(model, opt)
        step = tw.compile(step) if compiled else step
        gen = tw.Generator().manual_seed(6)
        x, target = tw.randn(32, 32, generator=gen), tw.randn(32, 16, generator=gen)
        return [step(x, target).item() for _ in range(3)]

    eager, compiled = run(False), run(True)
    np.testing.assert_allclose(compiled, eager, rtol=1e-5)


@pytest.mark.cuda
def test_cuda_layer_matches_the_cpu_reference():
    layer = _layer(inp=64, out=128)
    x = tw.randn(256, 64)
    cpu = layer(x).detach().numpy()
    layer.to("cuda")
    layer._weight_cache = None
    out = layer(x.to("cuda")).detach().cpu().numpy()
    np.testing.assert_allclose(out, cpu, rtol=1e-3, atol=1e-3 * np.abs(cpu).max())


@pytest.mark.cuda
def test_cuda_compiled_step_matches_eager_bf16():
    def run(compiled):
        tw.manual_seed(7)
        model = tw.nn.Sequential(tw.nn.Linear(128, 256), tw.nn.GELU(), tw.nn.Linear(256, 128)).to("cuda",
                                                                                                  tw.bfloat16)
        convert_to_float8_training(model)
        opt = tw.optim.AdamW(model.parameters(), lr=1e-3)
        step = _train_step(model, opt)
        step = tw.compile(step) if compiled else step
        gen = tw.Generator().manual_seed(8)
        x = tw.randn(512, 128, generator=gen).to("cuda", tw.bfloat16)
        target = tw.randn(512, 128, generator=gen).to("cuda", tw.bfloat16)
        return [step(x, target).float().item() for _ in range(5)]

    np.testing.assert_allclose(run(True), run(False), rtol=2e-2)


@pytest.mark.parametrize("name", ["float8_e4m3fn", "float8_e5m2"])
def test_compiled_c_casts_match_eager_bit_for_bit(name):
    """The C target's float8 conversions: every code, every midpoint between neighbours and just beside it,
    overflow, specials and random magnitudes."""
    dtype = getattr(tw, name)
    values = np.arange(256, dtype=np.uint8).view(dtype.np).astype(np.float32)
    finite = np.unique(values[np.isfinite(values)])
    mids = ((finite[:-1].astype(np.float64) + finite[1:]) / 2).astype(np.float32)
    rng = np.random.default_rng(0)
    x = np.concatenate([values, mids, np.nextafter(mids, np.float32(np.inf)), np.nextafter(mids, np.float32(-np.inf)),
                        np.array([np.inf, -np.inf, np.nan, 448, 464, 480, 1e6, 57344, 61440, 65536, 1e-10, -0.0],
                                 np.float32),
                        (rng.standard_normal(2000) * np.exp(rng.uniform(-25, 15, 2000))).astype(np.float32)])

    def cast(t):
        return t.to(dtype), t.to(dtype).float()

    (compiled, widened), (eager, eager_widened) = tw.compile(cast)(tw.from_numpy(x)), cast(tw.from_numpy(x))
    np.testing.assert_array_equal(compiled.numpy().view(np.uint8), eager.numpy().view(np.uint8))
    np.testing.assert_array_equal(widened.numpy(), eager_widened.numpy())  # NaN == NaN here, whatever its payload


def _cuda_kernels(fn, *args):
    """(kernel name, blocks, outputs written) of each nest ``fn`` compiles to for the CUDA target (no GPU needed)."""
    from tilewise.compiler.capture import trace
    from tilewise.compiler.passes import run_pipeline
    from tilewise.compiler.program import lower_program
    from tilewise.compiler.targets import CUDA_TARGET

    low = lower_program(run_pipeline(trace(fn, args, {}).graph), CUDA_TARGET)
    return [(s.kernel, ns.cuda) for s in low.schedules for ns in s.nests]


def test_lowering_delayed_scaling_casts_in_the_producing_kernel():
    """With a delayed scale the e4m3 cast is one more output of the kernel that makes the activation (here a
    layer norm's rows); the amax recorded for the next step is a reduction split across the GPU that reads
    the activation again."""
    from tilewise.float8.linear import cast_to_float8, tensor_amax

    w, b = tw.randn(768), tw.randn(768)

    def delayed(x, scale):
        h = tw.nn.functional.layer_norm(x, (768,), w, b).bfloat16()
        return cast_to_float8(h, scale, tw.float8_e4m3fn), tensor_amax(h)

    (norm, norm_plan), (amax, amax_plan) = _cuda_kernels(delayed, tw.randn(8192, 768), tw.tensor(3.0))
    assert any(p.written and p.dtype is tw.float8_e4m3fn for p in norm.params) and norm_plan.blocks == 8192
    assert amax_plan.split > 1


def test_lowering_current_scaling_splits_the_amax_across_the_gpu():
    """With the current amax the cast needs the whole tensor's amax first: an amax split across blocks, then one
    element-wise pass (scale and cast), not one nest on a single block."""
    from tilewise.float8.linear import amax_to_scale, cast_to_float8, tensor_amax

    def current(h):
        scale = amax_to_scale(tensor_amax(h), tw.float8_e4m3fn)
        return cast_to_float8(h, scale, tw.float8_e4m3fn), scale.reciprocal()

    plans = _cuda_kernels(current, tw.randn(8192, 768).bfloat16())
    assert plans[0][1].split > 1
    cast = [plan for kernel, plan in plans if any(p.written and p.dtype is tw.float8_e4m3fn for p in kernel.params)
            and plan.blocks > 1]
    assert cast and cast[0].strategy == "elements"


def _gpt_step(layers: int, width: int, fp8: bool, tokens: tuple[int, int], dtype=tw.bfloat16, device="cpu",
              recipe: str = "tensorwise"):
    """A GPT-2 training step (``tilewise.models.gpt``: layer norms, tanh GELU, biases, tied head) with AdamW, its
    Linear layers but the head in FP8 (``recipe``) when ``fp8``, a delayed recipe's scales synced after the
    backward; returns the step, a batch and the model."""
    from tilewise.models.gpt import GPT, GPTConfig

    tw.manual_seed(0)
    config = GPTConfig(vocab_size=128, block_size=tokens[1], n_layer=layers, n_head=width // 64, n_embd=width)
    model = GPT(config).to(device, dtype)
    if fp8:
        convert_to_float8_training(model, module_filter_fn=lambda mod, fqn: fqn != "head",
                                   config=Float8LinearConfig.from_recipe_name(recipe))
    opt = tw.optim.AdamW(model.parameters(), lr=1e-3)

    def step(x, y):
        _, loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if recipe == "delayed":
            sync_float8_amax_and_scale_history(model)
        opt.step()
        return loss

    x = tw.randint(0, 128, tokens, generator=tw.Generator().manual_seed(1)).to(device)
    return step, (x, x.roll(-1, 1)), model


def _lowered_gpt_step(layers: int, fp8: bool, recipe: str = "tensorwise"):
    """The generated kernels of a compiled GPT-2 step at GPT-2 124M's width (4 x 256 tokens) lowered for the CUDA
    target (neither built nor run), in program order, and the programs. A delayed recipe's step syncs the scales at
    its end, lowered as every step after the first sync runs."""
    from tilewise.compiler.lowering.memory import steps_of
    from tilewise.compiler.targets import CUDA_TARGET

    step, batch, model = _gpt_step(layers, 768, fp8, (4, 256), recipe=recipe)
    if recipe == "delayed":
        sync_float8_amax_and_scale_history(model)
    _, programs, _ = tw.compile(step).lowered(CUDA_TARGET, *batch)
    return [low.kernels[n] for low in programs for n in steps_of(low.fused) if n in low.kernels], programs


def _writes_float8(kernel) -> int:
    return sum(p.written and p.dtype.is_float8 for p in kernel.params)


def test_lowered_fp8_gpt2_step_moves_few_bytes_beyond_the_bf16_step():
    """[Note: FP8 casts in compiled steps], counted on the step lowered for CUDA at GPT-2 124M's width (4 x 256
    tokens): per layer, the FP8 step's generated kernels move at most 114 MB more than the bf16 step's (167 MB
    when each amax read its tensor again and the backward copied x8 to transpose it) in at most 19 more kernels:
    a cast of each operand in each direction that writes both layouts, a reduction of row or column maxima to a
    scale, and the weights' amax and casts. No kernel copies an FP8 tensor (each transposed copy is written by
    its cast), and none reduces a whole activation or gradient: only the weights, which the step reads, are
    reduced whole."""
    from tilewise.profiler.roofline import kernel_bytes

    lowered = {(layers, fp8): _lowered_gpt_step(layers, fp8) for layers in (1, 2) for fp8 in (False, True)}

    def per_layer(fp8, measure):
        return measure(lowered[2, fp8][0]) - measure(lowered[1, fp8][0])

    extra_kernels = per_layer(True, len) - per_layer(False, len)
    extra_bytes = per_layer(True, lambda ks: sum(map(kernel_bytes, ks))) - per_layer(False, lambda ks: sum(map(
        kernel_bytes, ks)))
    assert extra_kernels <= 19 and extra_bytes <= 114e6, (extra_kernels, extra_bytes / 1e6)
    kernels, programs = lowered[2, True]
    casts = sorted(_writes_float8(k) for k in kernels if _writes_float8(k))
    assert casts == [2] * 16 + [16]  # 8 a layer, each writing both layouts; the 8 weights' casts in one kernel
    assert not [k.name for k in kernels if any(p.read and p.dtype.is_float8 for p in k.params)]
    inputs = {v for low in programs for v in low.fused.inputs}
    whole = [k.name for k in kernels for nest in k.nests
             if len(nest.reduce) == len(nest.shape) > 1 and math.prod(nest.shape) >= 1 << 16
             and any(k.values[load.param] not in inputs for load in nest.loads if load.iota is None)]
    assert not whole, whole


def test_lowered_delayed_gpt2_step_casts_in_the_kernels_that_make_each_tensor():
    """[Note: delayed casts]: in a delayed step (scales synced) each layer norm's kernel writes the e4m3 activation
    instead of the bf16 one, each transposed copy is a tiled kernel of its own reading the FP8 tensor (none is
    stored from a reduction's nest), and the step has fewer kernels moving fewer bytes than with current scaling."""
    from tilewise.profiler.roofline import kernel_bytes

    current, _ = _lowered_gpt_step(1, True)
    kernels, _ = _lowered_gpt_step(1, True, "delayed")
    assert len(kernels) < len(current)
    assert sum(map(kernel_bytes, kernels)) < 0.9 * sum(map(kernel_bytes, current))

    def written(k, dtype, shape):
        return [i for i, p in enumerate(k.params) if p.written and p.dtype is dtype
                and tuple(k.values[i].type.shape) == shape]

    act = (4, 256, 768)
    norms = [k for k in kernels if written(k, tw.float8_e4m3fn, act) and any(
        nest.reduce and any(s.param in written(k, tw.float8_e4m3fn, act) for s in nest.stores) for nest in k.nests)]
    assert len(norms) == 2, [k.name for k in norms]  # the block's two layer norms (the final one feeds the bf16 head)
    assert all(len(written(k, tw.bfloat16, act)) <= 1 for k in norms)  # the residual sum only, not the norm's output
    for k in kernels:
        for nest in k.nests:
            if nest.reduce:
                assert not [s for s in nest.stores if k.params[s.param].dtype.is_float8
                            and k.values[s.param].type.shape[-1] != nest.shape[-1]], k.name
    transposed = [i for k in kernels for i in written(k, tw.float8_e4m3fn, (768, 4, 256))]
    assert len(transposed) == 3  # the two norms' outputs and the attention's, each written once
    assert not [k.name for k in kernels if written(k, tw.bfloat16, (4, 256, 3072))]  # no bf16 MLP activation


@pytest.mark.skipif("not __import__('tilewise.codegen.toolchain', fromlist=['x']).nvrtc_available()",
                    reason="NVRTC is not installed")
def test_every_kernel_of_the_lowered_fp8_gpt2_step_compiles():
    from tilewise.codegen.toolchain import compile_cuda

    _, programs = _lowered_gpt_step(1, True)
    for low in programs:
        names = [k.name for k in low.kernels.values()]
        ptx = compile_cuda(low.source, names, "sm_90").ptx
        assert [n for n in names if f".entry {n}(" not in ptx] == []


@pytest.mark.parametrize("dtype", [tw.float32, tw.bfloat16])
def test_compiled_fp8_gpt_step_matches_eager(dtype):
    """The kernels of [Note: FP8 casts in compiled steps] (a layer norm or GELU with its rows' maxima, a bias
    gradient with its columns' maxima, casts of 3-d activations written both ways) on the C target, against
    eager, which casts each tensor by itself: the first step's loss and gradients."""
    def run(compiled):
        step, batch, model = _gpt_step(2, 64, True, (2, 32), dtype)
        loss = (tw.compile(step) if compiled else step)(*batch).float().item()
        return loss, [p.grad.float().numpy() for p in model.parameters()]

    (loss, grads), (eager_loss, eager_grads) = run(True), run(False)
    assert loss == eager_loss
    for got, want in zip(grads, eager_grads):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_compiled_delayed_gpt_step_matches_eager():
    """[Note: delayed casts] on the C target: a GPT-2 step with delayed scaling synced inside it, five steps (the
    first casts with the current amaxes and runs its Python, the next record the step the later ones replay,
    its casts made by the kernels of the layer norms, the GELU and the gradients), against eager: losses, the
    amax histories and the scales."""
    def run(compiled):
        step, batch, model = _gpt_step(2, 64, True, (2, 32), tw.float32, recipe="delayed")
        fn = tw.compile(step) if compiled else step
        losses = [fn(*batch).item() for _ in range(3)]
        variants = len(getattr(fn, "variants", ()))
        losses += [fn(*batch).item() for _ in range(2)]
        assert len(getattr(fn, "variants", ())) == variants  # recorded once the scales were synced, replayed since
        layers = [m for m in model.modules() if isinstance(m, Float8Linear)]
        state = [getattr(m, f"fp8_{kind}_{name}").numpy().copy() for m in layers for name in Float8Linear.OPERANDS
                 for kind in ("amax_history", "scale")]
        return losses, state

    (losses, state), (eager_losses, eager_state) = run(True), run(False)
    np.testing.assert_allclose(losses, eager_losses, rtol=1e-5)
    for got, want in zip(state, eager_state):
        np.testing.assert_allclose(got, want, rtol=1e-5)


def test_a_synced_delayed_layer_casts_with_its_stored_scale_alone():
    layer = _layer(config=Float8LinearConfig.from_recipe_name("delayed"))
    assert not layer.delayed_scales_synced
    layer(tw.randn(16, 32)).sum().backward()
    sync_float8_amax_and_scale_history(layer)
    assert layer.delayed_scales_synced
    scale = layer.fp8_scale_input.item()
    x = tw.randn(16, 32) * 1000  # far beyond the synced amax: saturates at the stored scale
    layer(x)
    assert layer.scale_for("input", x).item() == scale and layer.fp8_amax_input.item() == x.abs().max().item()


@pytest.mark.cuda
def test_cuda_compiled_fp8_gpt_step_matches_eager():
    """The fused FP8 kernels of a GPT-2 step on the GPU (layer norms and GELUs with their rows' maxima, bias
    gradients with their columns', 3-d casts written both ways, cuDNN attention) against eager over five steps."""
    def run(compiled):
        step, batch, _ = _gpt_step(2, 128, True, (4, 64), device="cuda")
        step = tw.compile(step) if compiled else step
        return [step(*batch).float().item() for _ in range(5)]

    np.testing.assert_allclose(run(True), run(False), rtol=2e-2)


def test_compiled_step_with_delayed_scaling_and_its_sync_matches_eager():
    """The amax histories and scales are buffers written inside the compiled step (forward, backward and the
    sync): they end as eager leaves them."""
    def run(compiled):
        tw.manual_seed(5)
        model = convert_to_float8_training(
            tw.nn.Sequential(tw.nn.Linear(32, 64), tw.nn.ReLU(), tw.nn.Linear(64, 16)),
            config=Float8LinearConfig.from_recipe_name("delayed"))
        opt = tw.optim.SGD(model.parameters(), lr=0.1)

        def step(x, target):
            loss = tw.nn.functional.mse_loss(model(x), target)
            opt.zero_grad()
            loss.backward()
            opt.step()
            sync_float8_amax_and_scale_history(model)
            return loss

        step = tw.compile(step) if compiled else step
        gen = tw.Generator().manual_seed(6)
        x, target = tw.randn(32, 32, generator=gen), tw.randn(32, 16, generator=gen)
        losses = [step(x * (k + 1), target).item() for k in range(4)]
        return losses, model[0].fp8_amax_history_input.numpy(), model[2].fp8_scale_grad_output.numpy()

    (eager, history, scale), (compiled, compiled_history, compiled_scale) = run(False), run(True)
    np.testing.assert_allclose(compiled, eager, rtol=1e-5)
    np.testing.assert_allclose(compiled_history, history, rtol=1e-6)
    np.testing.assert_allclose(compiled_scale, scale, rtol=1e-6)
    assert history[:4].tolist() == pytest.approx(sorted(history[:4].tolist(), reverse=True))  # newest first


@pytest.mark.slow
def test_lowprec_benchmark_curve_runs_on_the_cpu(tmp_path):
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    from childenv import python_path

    root = Path(__file__).resolve().parent.parent
    env = dict(os.environ, PYTHONPATH=python_path(), OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, str(root / "benchmarks" / "lowprec.py"), "--only", "curve", "--curve", "4",
                           "--curve-size", "tiny", "--device", "cpu", "--out", str(tmp_path)], capture_output=True,
                          text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    record = json.loads((tmp_path / "lowprec_curve.json").read_text())
    bf16, fp8 = record["losses"]["bf16"], record["losses"]["fp8"]
    assert len(bf16) == len(fp8) == 4 and bf16 != fp8  # two runs, and FP8 is not the bf16 run again
    assert abs(fp8[-1] - bf16[-1]) < 0.02 * bf16[-1]


@pytest.mark.slow
def test_lowprec_benchmark_lowering_runs_without_a_gpu():
    import os
    import subprocess
    import sys
    from pathlib import Path

    from childenv import python_path

    root = Path(__file__).resolve().parent.parent
    env = dict(os.environ, PYTHONPATH=python_path(), OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, str(root / "benchmarks" / "lowprec.py"), "--only", "lowering", "--models",
                           "124M", "--layers", "1", "--batch", "1", "--cudnn-attention"], capture_output=True,
                          text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = dict(re.findall(r"^\| 124M \| (bf16|fp8|fp8 delayed) \| (\d+) \|", done.stdout, flags=re.M))
    assert int(rows["fp8"]) > int(rows["bf16"]) and "kernels that write float8" in done.stdout
    assert int(rows["fp8 delayed"]) < int(rows["fp8"])


@pytest.mark.parametrize("module", ["tilewise.float8", "tilewise.float8.config", "tilewise.float8.linear"])
def test_docstring_examples(module):
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(module), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0 and result.attempted > 0

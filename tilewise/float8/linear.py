"""``Float8Linear``: a Linear layer whose three GEMMs run in FP8 (torchao.float8's recipe).

[Note: FP8 training]
Forward ``y = x W^T``, backward ``dx = dy W`` and ``dW = dy^T x`` each run as ``_scaled_mm``: ``x`` and ``W``
cast to e4m3 (3 mantissa bits, range 448), ``dy`` to e5m2 (2 bits, range 57344: gradients need range more
than precision). A cast multiplies by ``scale = max_fp8 / amax`` and saturates; the GEMM is given
``1 / scale`` to undo it, and accumulates in float32 (the forward's GEMM by default with Hopper's fast FP8
accumulation, as torchao's ``gemm_config_output``; see ``Float8GemmConfig``). The scale of a tensor comes from
the amax of this very tensor (*dynamic*, "current" scaling: one reduction over it before the cast) or from the
amaxes of the last ``history_len`` steps (*delayed*: the cast needs no reduction first, and this step's amax is
recorded for the next; ``sync_float8_amax_and_scale_history(model)`` rolls the histories and recomputes the
scales, once per step, as torchao asks). A delayed scale of 0 (never synced) falls back to the current amax, so
the first step is scaled right. The master weight (and the optimizer's state) stay in their own dtype: the FP8
weight and its transposed copy are cast in the forward, the copy kept for the backward's ``dx`` GEMM, never
recast there; in eager mode both are also reused by later forwards until the weight changes (its version
counter: micro-batches of one step share them). The three GEMMs need every size (rows of ``x``, in and out
features) to be a multiple of 16, which cuBLASLt requires; the error says so on every device, so a model that
trains here trains on the GPU.

[Note: FP8 casts in compiled steps]
cuBLASLt's FP8 GEMMs take both operands K-major, so ``dW = dy^T x`` reads ``x`` and ``dy`` transposed and
``dx = dy W`` reads ``W`` transposed. Each transposed copy is written by the kernel that casts the tensor, as
a second (tiled, see [Note: transposing tiles]) store of the same values: ``x8^T`` in the forward (saved for
the backward instead of ``x8``, which only the forward's GEMM reads), ``W8^T`` beside ``W8``, ``dy8^T`` beside
``dy8``; none is a copy of its own that reads the FP8 tensor back. The casts work on the tensors' own shapes
(``[batch, sequence, features]``), never on the ``[rows, features]`` matrices the GEMMs see: a reshape that
merges dims ends what one kernel can compute, so the cast of a reshaped activation could not make the
activation itself (a GELU's output is made again from the GEMM result by the kernel that casts it, not stored
and read back). Current scaling needs the whole tensor's amax before any element is cast: that is one kernel
that reduces and one that casts, whatever fuses. In a compiled step the amax is taken in two stages, first
over the dims that the kernel making the tensor folds anyway — an activation's rows (a layer norm folds them;
a GELU's kernel can), a gradient's columns (its bias gradient's sum) — then over the few values left. A
maximum is exact, so the value is the one-stage amax's; but the first stage joins that kernel instead of
reading the tensor once more, and the second reads a row or column of maxima. Eager mode takes it in one.
In a GPT-2 step this leaves, per Linear, one reduction of the maxima and one cast kernel (which writes both
layouts) in each direction, and no pass over an activation or gradient beyond the cast's own read, but for the
attention's output: its heads are merged into features by a reshape, so its rows' maxima take a pass of their
own. Lowered for CUDA at GPT-2 124M (8 x 1024 tokens, cuDNN attention), the kernels of the FP8 step move 6.1 GB
more than the bf16 step's (11.1 GB when each amax read its tensor again and the backward copied ``x8`` to
transpose it); ``benchmarks/lowprec.py --only lowering`` lists them.

[Note: delayed casts] With delayed scaling the scale of a cast is known before the tensor is made, so the cast is
one more output of the kernel that makes the tensor: a layer norm's kernel writes the e4m3 activation instead of
the bf16 one (nothing else reads it: the norm's backward takes its input and statistics), a GELU's kernel its e4m3
output from the GEMM's result, a gradient's producer (a layer norm's backward, the GELU's backward) the e5m2
gradient; the amax recorded for the next step joins the same kernel as its first stage. That holds only where the
cast waits for no amax of this tensor: the fallback to the current amax while no scale is synced (``where(scale >
0, scale, current)``) would read the whole tensor's amax first. So ``sync_float8_amax_and_scale_history`` marks a
module ``delayed_scales_synced`` (once: a Python attribute, which a compiled step's guards read), and a synced
module casts with its stored scale alone, in eager mode and compiled alike, as torchao's ``is_amax_initialized``
does; the first step of a compiled function that syncs runs its Python once (setting the flag is a side effect,
see [Note: compiled functions]) and the next call records the step that every later one replays. The transposed
copies stay kernels of their own, reading the FP8 tensor (``x8`` once more, 1 byte an element, instead of the bf16
tensor): a reduction's nest would store them an element a sector apart (see [Note: transposed copies stay out of
reductions] in ``compiler/lowering/fusion.py``). Hopper's FP8 GEMMs take only K-major operands, so the ``dW``
GEMM needs ``x8`` and ``dy8`` with the tokens contiguous: the copies are required, only where they are written is
a choice. A bias gradient's column sum is taken before the backward's GEMMs: it then joins the kernel that makes
the gradient and takes its columns' maxima, and the bf16 gradient of a GELU is not stored (the GEMMs read ``dy8``).
"""

from __future__ import annotations

from dataclasses import dataclass

from tilewise import dtypes
from tilewise import strides as S
from tilewise._grad_mode import is_grad_enabled, no_grad
from tilewise.autograd import Function
from tilewise.dispatch import STATE
from tilewise.float8.config import Float8LinearConfig, ScalingType
from tilewise.nn import Linear
from tilewise.ops.creation import zeros
from tilewise.ops.functions import where
from tilewise.ops.registry import OPS
from tilewise.tensor import Tensor

FP8_MAX = {"float8_e4m3fn": 448.0, "float8_e5m2": 57344.0}
EPS = 1e-12  # the smallest amax a scale is computed from (an all-zero tensor gets a finite scale)
_GRAN = 16


def amax_to_scale(amax: Tensor, dtype) -> Tensor:
    """``max_fp8 / amax`` in float32 (amax clamped away from 0)."""
    return FP8_MAX[dtype.name] / amax.float().clamp(min=EPS)


def tensor_amax(x: Tensor, first_over: tuple[int, ...] | None = None) -> Tensor:
    """``max |x|`` in float32; traced for a compiled program, first over the dims ``first_over``, then over the
    rest (the same value: see [Note: FP8 casts in compiled steps])."""
    magnitude = x.abs()
    if first_over and STATE.captures and magnitude.ndim > 1:
        magnitude = magnitude.amax(first_over)
    return magnitude.amax().float()


def first_amax_dims(name: str, ndim: int) -> tuple[int, ...] | None:
    """The dims the first stage of an operand's amax folds: an activation's rows (its last dim), a gradient's
    columns (every dim but the last, as its bias gradient's sum); a weight, which no kernel of the step makes,
    in one stage."""
    if name == "input":
        return (ndim - 1,)
    if name == "grad_output":
        return tuple(range(ndim - 1))
    return None


def cast_to_float8(x: Tensor, scale: Tensor, dtype) -> Tensor:
    """``x * scale`` saturated to ``dtype``'s finite range and cast (e5m2 would otherwise overflow to inf)."""
    top = FP8_MAX[dtype.name]
    return (x.float() * scale).clamp(-top, top).to(dtype)


def _scaled_mm(a, b, inv_a, inv_b, out_dtype, config: Float8LinearConfig, gemm: str, bias=None):
    """The FP8 GEMM ``gemm`` ("output", "grad_input" or "grad_weight") as ``config`` sets it."""
    if config.emulate and a.device.type != "cpu":  # the CPU reference, on the operands' device
        out = OPS["_scaled_mm"](a.cpu(), b.cpu(), inv_a.cpu(), inv_b.cpu(), bias.cpu() if bias is not None else None,
                                out_dtype=out_dtype)
        return out.to(a.device)
    fast = getattr(config, f"gemm_config_{gemm}").use_fast_accum
    return OPS["_scaled_mm"](a, b, inv_a, inv_b, bias, out_dtype=out_dtype, use_fast_accum=fast)


def _fusable_bias(bias, out_dtype) -> bool:
    """Whether the GEMM adds the bias itself (cuBLASLt's bias epilogue, torch's ``_scaled_mm(bias=)``): a bf16 or
    fp16 bias to a result of its dtype, added in float32 before the one rounding of the result."""
    return bias is not None and bias.dtype is out_dtype and out_dtype in (dtypes.bfloat16, dtypes.float16)


def transposed_matrix(t: Tensor) -> Tensor:
    """``t`` as the matrix [its last dim, the rest] made contiguous: ``t.reshape(-1, k).t().contiguous()`` as
    one permuting copy of ``t`` itself, which a compiled program writes in the kernel that makes ``t`` (see
    [Note: FP8 casts in compiled steps]). Its ``.t()`` is the column-major matrix ``_scaled_mm`` takes second."""
    return t.permute(t.ndim - 1, *range(t.ndim - 1)).contiguous().reshape(t.shape[-1], -1)


def _rows(t: Tensor) -> Tensor:
    """``t`` as the row-major matrix [tokens, features] a GEMM reads first (a view where ``t`` is contiguous)."""
    return t.reshape(-1, t.shape[-1]).contiguous()


@dataclass(frozen=True)
class CastWeight:
    """A weight cast to e4m3: row-major (the forward's GEMM), transposed (the backward's ``dx`` GEMM; made with
    it, in training only) and the inverse scale the GEMMs undo the cast with."""

    fp8: Tensor
    fp8_t: Tensor | None
    inv_scale: Tensor


class _Float8Matmul(Function):
    """``x @ W^T`` with FP8 GEMMs in both directions, ``x`` of any number of leading dims; the weight arrives
    already cast."""

    @staticmethod
    def forward(ctx, x, weight, cast: CastWeight, x_scale, module, training: bool, bias=None):
        x8 = cast_to_float8(x, x_scale, dtypes.float8_e4m3fn)
        x_inv = x_scale.reciprocal()
        x8_t = transposed_matrix(x8) if training and ctx.needs_input_grad[1] else None
        ctx.save_for_backward(x8_t, x_inv)
        ctx.cast, ctx.module, ctx.x_dtype, ctx.w_dtype, ctx.x_shape = cast, module, x.dtype, weight.dtype, x.shape
        ctx.has_bias = bias is not None
        out = _scaled_mm(_rows(x8), cast.fp8.t(), x_inv, cast.inv_scale, x.dtype, module.config, "output", bias)
        return out.reshape(*x.shape[:-1], out.shape[-1])

    @staticmethod
    def backward(ctx, grad):
        x8_t, x_inv = ctx.saved_tensors
        cast, module = ctx.cast, ctx.module
        g_scale = module.scale_for("grad_output", grad)
        g8 = cast_to_float8(grad, g_scale, dtypes.float8_e5m2)
        g_inv = g_scale.reciprocal()
        config = module.config
        grad_x = grad_w = grad_bias = None
        if ctx.has_bias and ctx.needs_input_grad[6]:  # before the GEMMs: it joins the nest of the cast's amax
            grad_bias = grad.sum(tuple(range(grad.ndim - 1)))
        if ctx.needs_input_grad[0]:
            w8_t = cast.fp8_t if cast.fp8_t is not None else transposed_matrix(cast.fp8)
            grad_x = _scaled_mm(_rows(g8), w8_t.t(), g_inv, cast.inv_scale, ctx.x_dtype, config, "grad_input")
            grad_x = grad_x.reshape(ctx.x_shape)
        if ctx.needs_input_grad[1]:
            grad_w = _scaled_mm(transposed_matrix(g8), x8_t.t(), g_inv, x_inv, ctx.w_dtype, config, "grad_weight")
        return grad_x, grad_w, None, None, None, None, grad_bias


def check_float8_shape(what: str, size: int, detail: str) -> None:
    if size % _GRAN:
        raise ValueError(f"Float8Linear: {what} is {size}, not a multiple of 16, which the FP8 GEMMs (cuBLASLt) "
                         f"need for every size; {detail}")


class Float8Linear(Linear):
    """A Linear whose GEMMs run in FP8, made by :func:`convert_to_float8_training` or :meth:`from_float`.

    >>> import tilewise as tw
    >>> from tilewise.float8 import Float8Linear, Float8LinearConfig
    >>> layer = Float8Linear.from_float(tw.nn.Linear(32, 16), Float8LinearConfig())
    >>> layer(tw.ones(16, 32)).shape
    tilewise.Size([16, 16])
    """

    OPERANDS = ("input", "weight", "grad_output")

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None, dtype=None,
                 config: Float8LinearConfig | None = None) -> None:
        super().__init__(in_features, out_features, bias, device=device, dtype=dtype)
        self.config = config or Float8LinearConfig()
        check_float8_shape("in_features", in_features, "leave this layer out with module_filter_fn")
        check_float8_shape("out_features", out_features, "leave this layer out with module_filter_fn")
        self._weight_cache: tuple | None = None
        self.delayed_scales_synced = False  # set by ``sync_float8_amax_and_scale_history``
        if self.config.uses_delayed_scaling:
            self._make_delayed_buffers(self.weight.device)

    def _make_delayed_buffers(self, device) -> None:
        length = self.config.delayed_scaling_config.history_len
        for name in self.OPERANDS:
            if self.cast_config(name).scaling_type is ScalingType.DELAYED:
                self.register_buffer(f"fp8_amax_{name}", zeros(1, device=device))
                self.register_buffer(f"fp8_amax_history_{name}", zeros(length, device=device))
                self.register_buffer(f"fp8_scale_{name}", zeros(1, device=device))  # 0: not synced yet

    @classmethod
    def from_float(cls, mod: Linear, config: Float8LinearConfig | None = None) -> Float8Linear:
        """A Float8Linear sharing ``mod``'s parameters (the master weight and bias, and so their optimizer
        state)."""
        new = cls.__new__(cls)
        Linear.__init__(new, 16, 16, bias=False)  # module state; the parameters are replaced below
        new.in_features, new.out_features = mod.in_features, mod.out_features
        new.weight, new.bias = mod.weight, mod.bias
        new.config = config or Float8LinearConfig()
        check_float8_shape("in_features", mod.in_features, "leave this layer out with module_filter_fn")
        check_float8_shape("out_features", mod.out_features, "leave this layer out with module_filter_fn")
        new._weight_cache = None
        new.delayed_scales_synced = False
        if new.config.uses_delayed_scaling:
            new._make_delayed_buffers(mod.weight.device)
        new.train(mod.training)
        return new

    def cast_config(self, name: str):
        return getattr(self.config, f"cast_config_{name}")

    def scale_for(self, name: str, x: Tensor) -> Tensor:
        """The scale of ``x``, one of the operands: from its own amax (dynamic), or the delayed scale, recording this
        amax for the next sync: once the module is synced the stored scale alone, before that the stored one where
        it is positive (loaded with a state dict), else the current amax's."""
        dtype = dtypes.float8_e5m2 if name == "grad_output" else dtypes.float8_e4m3fn
        amax = tensor_amax(x, first_amax_dims(name, x.ndim))
        current = amax_to_scale(amax, dtype)
        if self.cast_config(name).scaling_type is ScalingType.DYNAMIC:
            return current
        stored = getattr(self, f"fp8_scale_{name}")
        with no_grad():
            getattr(self, f"fp8_amax_{name}").copy_(amax.reshape(1))
        if self.delayed_scales_synced:  # the cast waits for no amax of its own: [Note: delayed casts]
            return stored.reshape(())
        return where(stored > 0, stored, current).reshape(())

    def _cast_weight(self, transposed: bool) -> CastWeight:
        """The e4m3 weight (and, with ``transposed``, its transposed copy) and its inverse scale, reused while the
        weight is unchanged (eager only: a compiled step recomputes it inside its graph, where it fuses with the
        weight's amax)."""
        weight = self.weight
        delayed = self.cast_config("weight").scaling_type is ScalingType.DELAYED
        key = (weight._write_count(), id(weight))  # an inference weight has no public _version
        cached = self._weight_cache
        if (not STATE.captures and not delayed and cached is not None and cached[0] == key
                and (cached[1].fp8_t is not None or not transposed)):
            return cached[1]
        with no_grad():
            scale = self.scale_for("weight", weight.detach())
            fp8 = cast_to_float8(weight.detach(), scale, dtypes.float8_e4m3fn)
            cast = CastWeight(fp8, transposed_matrix(fp8) if transposed else None, scale.reciprocal())
        if not STATE.captures and not delayed:
            self._weight_cache = (key, cast)
        return cast

    def forward(self, input: Tensor) -> Tensor:
        rows = S.numel(input.shape[:-1])
        check_float8_shape("the number of rows of the input (its leading dims multiplied)", rows,
                           f"input shape {list(input.shape)}; pad the batch or sequence")
        training = is_grad_enabled()
        cast = self._cast_weight(transposed=training and input.requires_grad)
        x_scale = self.scale_for("input", input.detach())
        if _fusable_bias(self.bias, input.dtype):
            return _Float8Matmul.apply(input, self.weight, cast, x_scale, self, training, self.bias)
        out = _Float8Matmul.apply(input, self.weight, cast, x_scale, self, training)
        return out + self.bias if self.bias is not None else out

    def extra_repr(self) -> str:
        kinds = (self.cast_config(n).scaling_type.value[:3] for n in self.OPERANDS)
        return f"{super().extra_repr()}, cast_configs=" + ",".join(f"{k}:{v}" for k, v in zip(("i", "w", "go"), kinds))

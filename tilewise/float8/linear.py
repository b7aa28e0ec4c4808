"""``Float8Linear``: a Linear layer whose three GEMMs run in FP8 (torchao.float8's recipe).

[Note: FP8 training]
Forward ``y = x W^T``, backward ``dx = dy W`` and ``dW = dy^T x`` each run as ``_scaled_mm``: ``x`` and ``W``
cast to e4m3 (3 mantissa bits, range 448), ``dy`` to e5m2 (2 bits, range 57344: gradients need range more
than precision). A cast multiplies by ``scale = max_fp8 / amax`` and saturates; the GEMM is given
``1 / scale`` to undo it, and accumulates in float32. The scale of a tensor comes from the amax of this very
tensor (*dynamic*, "current" scaling: one reduction over it before the cast) or from the amaxes of the last
``history_len`` steps (*delayed*: the cast needs no reduction first, and this step's amax is recorded for the
next; ``sync_float8_amax_and_scale_history(model)`` rolls the histories and recomputes the scales, once per
step, as torchao asks). A delayed scale of 0 (never synced) falls back to the current amax, so the first step
is scaled right. The master weight (and the optimizer's state) stay in their own dtype: the FP8 weight is a
cast made in the forward and kept for the backward's ``dx`` GEMM, never recast there; in eager mode it is also
reused by later forwards until the weight changes (its version counter: micro-batches of one step share it).
The three GEMMs need every size (rows of ``x``, in and out features) to be a multiple of 16, which cuBLASLt
requires; the error says so on every device, so a model that trains here trains on the GPU.
"""

from __future__ import annotations

from tilewise import dtypes
from tilewise._grad_mode import no_grad
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


def tensor_amax(x: Tensor) -> Tensor:
    return x.abs().amax().float()


def cast_to_float8(x: Tensor, scale: Tensor, dtype) -> Tensor:
    """``x * scale`` saturated to ``dtype``'s finite range and cast (e5m2 would otherwise overflow to inf)."""
    top = FP8_MAX[dtype.name]
    return (x.float() * scale).clamp(-top, top).to(dtype)


def _scaled_mm(a, b, inv_a, inv_b, out_dtype, emulate: bool, bias=None):
    if emulate and a.device.type != "cpu":  # the CPU reference, on the operands' device
        out = OPS["_scaled_mm"](a.cpu(), b.cpu(), inv_a.cpu(), inv_b.cpu(), bias.cpu() if bias is not None else None,
                                out_dtype=out_dtype)
        return out.to(a.device)
    return OPS["_scaled_mm"](a, b, inv_a, inv_b, bias, out_dtype=out_dtype)


def _fusable_bias(bias, out_dtype) -> bool:
    """Whether the GEMM adds the bias itself (cuBLASLt's bias epilogue, torch's ``_scaled_mm(bias=)``): a bf16 or
    fp16 bias to a result of its dtype, added in float32 before the one rounding of the result."""
    return bias is not None and bias.dtype is out_dtype and out_dtype in (dtypes.bfloat16, dtypes.float16)


def _column_major(t: Tensor) -> Tensor:
    """The same matrix laid out column-major (what ``_scaled_mm``'s second operand must be)."""
    return t.t().contiguous().t()


class _Float8Matmul(Function):
    """``x @ W^T`` with FP8 GEMMs in both directions; the weight arrives already cast (``w8``, ``w_inv``)."""

    @staticmethod
    def forward(ctx, x, weight, w8, w_inv, x_scale, module, bias=None):
        x8 = cast_to_float8(x, x_scale, dtypes.float8_e4m3fn)
        x_inv = x_scale.reciprocal()
        ctx.save_for_backward(x8, x_inv, w8, w_inv)
        ctx.module, ctx.x_dtype, ctx.w_dtype = module, x.dtype, weight.dtype
        ctx.has_bias = bias is not None
        return _scaled_mm(x8, w8.t(), x_inv, w_inv, x.dtype, module.config.emulate, bias)

    @staticmethod
    def backward(ctx, grad):
        x8, x_inv, w8, w_inv = ctx.saved_tensors
        module = ctx.module
        g_scale = module.scale_for("grad_output", grad)
        g8 = cast_to_float8(grad, g_scale, dtypes.float8_e5m2)
        g_inv = g_scale.reciprocal()
        emulate = module.config.emulate
        grad_x = _scaled_mm(g8, _column_major(w8), g_inv, w_inv, ctx.x_dtype, emulate)
        grad_w = _scaled_mm(g8.t().contiguous(), _column_major(x8), g_inv, x_inv, ctx.w_dtype, emulate)
        grad_bias = grad.sum(0) if ctx.has_bias and ctx.needs_input_grad[6] else None
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
        if new.config.uses_delayed_scaling:
            new._make_delayed_buffers(mod.weight.device)
        new.train(mod.training)
        return new

    def cast_config(self, name: str):
        return getattr(self.config, f"cast_config_{name}")

    def scale_for(self, name: str, x: Tensor) -> Tensor:
        """The scale of ``x``, one of the operands: from its own amax (dynamic), or the synced delayed scale (the
        current amax while none is synced), recording this amax for the next sync."""
        dtype = dtypes.float8_e5m2 if name == "grad_output" else dtypes.float8_e4m3fn
        amax = tensor_amax(x)
        current = amax_to_scale(amax, dtype)
        if self.cast_config(name).scaling_type is ScalingType.DYNAMIC:
            return current
        stored = getattr(self, f"fp8_scale_{name}")
        with no_grad():
            getattr(self, f"fp8_amax_{name}").copy_(amax.reshape(1))
        return where(stored > 0, stored, current).reshape(())

    def _cast_weight(self) -> tuple[Tensor, Tensor]:
        """The e4m3 weight and its inverse scale, reused while the weight is unchanged (eager only: a compiled
        step recomputes it inside its graph, where it fuses with the weight's amax)."""
        weight = self.weight
        delayed = self.cast_config("weight").scaling_type is ScalingType.DELAYED
        key = (weight._write_count(), id(weight))  # an inference weight has no public _version
        if not STATE.captures and not delayed and self._weight_cache is not None and self._weight_cache[0] == key:
            return self._weight_cache[1]
        with no_grad():
            scale = self.scale_for("weight", weight.detach())
            cast = (cast_to_float8(weight.detach(), scale, dtypes.float8_e4m3fn), scale.reciprocal())
        if not STATE.captures and not delayed:
            self._weight_cache = (key, cast)
        return cast

    def forward(self, input: Tensor) -> Tensor:
        rows = input.reshape(-1, input.shape[-1])
        check_float8_shape("the number of rows of the input (its leading dims multiplied)", rows.shape[0],
                           f"input shape {list(input.shape)}; pad the batch or sequence")
        w8, w_inv = self._cast_weight()
        x_scale = self.scale_for("input", rows.detach())
        if _fusable_bias(self.bias, input.dtype):
            out = _Float8Matmul.apply(rows, self.weight, w8, w_inv, x_scale, self, self.bias)
        else:
            out = _Float8Matmul.apply(rows, self.weight, w8, w_inv, x_scale, self)
            if self.bias is not None:
                out = out + self.bias
        return out.reshape(*input.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        kinds = (self.cast_config(n).scaling_type.value[:3] for n in self.OPERANDS)
        return f"{super().extra_repr()}, cast_configs=" + ",".join(f"{k}:{v}" for k, v in zip(("i", "w", "go"), kinds))

"""``tilewise.amp.GradScaler``: dynamic loss scaling for float16 training, with torch.amp.GradScaler's interface,
state machine and arithmetic.

[Note: gradient scaling] float16 gradients underflow where float32 ones would not, so the loss is multiplied by a
large scale before ``backward`` and the gradients are divided by it before the optimizer step. The scale adapts:
a step whose gradients hold an inf or NaN is skipped and the scale multiplied by ``backoff_factor``;
``growth_interval`` clean steps in a row multiply it by ``growth_factor``. Everything stays on the device as
tensor operations, as torch's ``_amp_foreach_non_finite_check_and_unscale_`` and ``_amp_update_scale_`` keep it:
the scale (a 0-dim float32 tensor), the growth tracker (0-dim int32) and a ``found_inf`` flag per device (0-dim
float32, 1.0 once a non-finite gradient is seen). Unscaling multiplies each gradient by the reciprocal of the
scale (computed in float64, rounded to float32, as torch does), in float32 for half-precision gradients and
rounded back once; the growth and backoff products are likewise taken in float64 and rounded to float32. On
CUDA the check-and-unscale of a device's gradients of one dtype is one compiled program over the whole list
(see [Note: foreach updates] in ``optim/_foreach.py``), so it costs a few kernel launches per step, not a few per
parameter. The host reads the device once per step: ``step`` reads ``found_inf`` to decide whether to call
``optimizer.step()`` — torch's one synchronisation — and that call is whatever the optimizer's ``step`` is
(eager, ``foreach``/``fused`` programs, or a ``tilewise.compile``d replacement), run on the unscaled
gradients.
"""

from __future__ import annotations

import inspect
import warnings
from collections import defaultdict
from enum import Enum
from typing import Any

from tilewise import dtypes
from tilewise.autograd.grad_mode import no_grad
from tilewise.device import Device
from tilewise.ops.creation import full
from tilewise.tensor import Tensor

__all__ = ["GradScaler", "OptState"]


class OptState(Enum):
    READY = 0
    UNSCALED = 1
    STEPPED = 2


def _refresh_per_optimizer_state() -> dict[str, Any]:
    return {"stage": OptState.READY, "found_inf_per_device": {}}


class _PerDevice:
    """Copies of one tensor on the devices that ask for it, made once per device."""

    def __init__(self, master: Tensor) -> None:
        self.master = master
        self.copies: dict[Device, Tensor] = {}

    def get(self, device: Device) -> Tensor:
        found = self.copies.get(device)
        if found is None:
            found = self.copies[device] = self.master.to(device=device, copy=True)
        return found


def check_and_unscale_(grads: list[Tensor], found_inf: Tensor, inv_scale: Tensor) -> None:
    """torch's ``_amp_foreach_non_finite_check_and_unscale_``: ``found_inf`` (0-dim float32) becomes 1.0 if any
    element of ``grads`` is inf or NaN, and every gradient is multiplied in place by ``inv_scale`` (0-dim float32),
    in float32 at least (half-precision gradients round once)."""
    for g in grads:
        found_inf.copy_(found_inf.maximum(g.isfinite().all().logical_not().to(found_inf.dtype)))
        g.mul_(inv_scale)  # a half-precision g computes in float32 and rounds once, as torch's kernel


def update_scale_(scale: Tensor, growth_tracker: Tensor, found_inf: Tensor, growth_factor: float,
                  backoff_factor: float, growth_interval: int) -> None:
    """torch's ``_amp_update_scale_``, as tensor operations (no value reaches the host): after a skipped step
    the scale backs off and the tracker restarts; after ``growth_interval`` clean steps in a row the scale grows,
    unless that would overflow float32."""
    found = found_inf != 0
    successful = growth_tracker + 1
    grows = found.logical_not().logical_and(successful == growth_interval)
    wide = scale.double()
    grown = (wide * growth_factor).float()
    grown = grown.where(grown.isfinite(), scale)
    new_scale = (wide * backoff_factor).float().where(found, grown.where(grows, scale))
    new_tracker = successful.where(found.logical_or(grows).logical_not(), successful.new_zeros(()))
    scale.copy_(new_scale)
    growth_tracker.copy_(new_tracker)


class GradScaler:
    """Scale the loss, unscale and check the gradients, skip steps with inf/NaN gradients and adapt the scale
    (torch.amp.GradScaler; ``device`` "cuda" or "cpu").

    >>> import tilewise as tw
    >>> model = tw.nn.Linear(4, 2)
    >>> opt = tw.optim.SGD(model.parameters(), lr=0.1)
    >>> scaler = tw.amp.GradScaler("cpu", init_scale=2.0**10)
    >>> loss = model(tw.ones(3, 4)).sum()
    >>> scaler.scale(loss).backward()
    >>> scaler.step(opt)
    >>> scaler.update()
    >>> scaler.get_scale()
    1024.0
    """

    def __init__(self, device: str = "cuda", init_scale: float = 2.0**16, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000, enabled: bool = True) -> None:
        self._device = device
        self._enabled = enabled
        if self._device == "cuda" and enabled and not _cuda_available():
            warnings.warn("tilewise.cuda.amp.GradScaler is enabled, but CUDA is not available.  Disabling.",
                          stacklevel=2)
            self._enabled = False
        if self._enabled:
            if growth_factor <= 1.0:
                raise AssertionError("The growth factor must be > 1.0.")
            if backoff_factor >= 1.0:
                raise AssertionError("The backoff factor must be < 1.0.")
            self._init_scale = init_scale
            self._scale: Tensor | None = None  # made by the first scale(), on the loss's device
            self._growth_factor = growth_factor
            self._backoff_factor = backoff_factor
            self._growth_interval = growth_interval
            self._init_growth_tracker = 0
            self._growth_tracker: Tensor | None = None
            self._per_optimizer_states: defaultdict[int, dict[str, Any]] = defaultdict(_refresh_per_optimizer_state)

    # ------------------------------------------------------------------ scale and growth tracker
    def _check_scale_growth_tracker(self, funcname: str) -> tuple[Tensor, Tensor]:
        fix = "This may indicate your script did not use scaler.scale(loss or outputs) earlier in the iteration."
        if self._scale is None:
            raise AssertionError(f"Attempted {funcname} but _scale is None.  " + fix)
        if self._growth_tracker is None:
            raise AssertionError(f"Attempted {funcname} but _growth_tracker is None.  " + fix)
        return self._scale, self._growth_tracker

    def _lazy_init_scale_growth_tracker(self, device: Device) -> None:
        if self._growth_tracker is not None:
            raise AssertionError("_growth_tracker initialized before _scale")
        self._scale = full((), self._init_scale, dtype=dtypes.float32, device=device)
        self._growth_tracker = full((), self._init_growth_tracker, dtype=dtypes.int32, device=device)

    def scale(self, outputs):
        """``outputs`` (a tensor, or an iterable of them, nested) multiplied by the current scale; unchanged when
        scaling is disabled."""
        if not self._enabled:
            return outputs
        if isinstance(outputs, Tensor):
            if self._scale is None:
                self._lazy_init_scale_growth_tracker(outputs.device)
            return outputs * self._scale.to(device=outputs.device)
        stash: list[_PerDevice] = []

        def apply_scale(value):
            if isinstance(value, Tensor):
                if not stash:
                    if self._scale is None:
                        self._lazy_init_scale_growth_tracker(value.device)
                    stash.append(_PerDevice(self._scale))
                return value * stash[0].get(value.device)
            if isinstance(value, (list, tuple)):
                return type(value)(map(apply_scale, value))
            if hasattr(value, "__iter__"):
                return map(apply_scale, value)
            raise ValueError("outputs must be a Tensor or an iterable of Tensors")

        return apply_scale(outputs)

    # ------------------------------------------------------------------ unscaling
    def _unscale_grads_(self, optimizer, inv_scale: Tensor, found_inf: Tensor, allow_fp16: bool) -> dict:
        per_device_inv_scale = _PerDevice(inv_scale)
        per_device_found_inf = _PerDevice(found_inf)
        grouped: defaultdict[Device, defaultdict[Any, list[Tensor]]] = defaultdict(lambda: defaultdict(list))
        with no_grad():
            for group in optimizer.param_groups:
                for param in group["params"]:
                    if not isinstance(param, Tensor):
                        raise AssertionError(f"expected param to be tilewise.Tensor, got {type(param).__name__}")
                    if param.grad is None:
                        continue
                    if not allow_fp16 and param.grad.dtype is dtypes.float16:
                        raise ValueError("Attempting to unscale FP16 gradients.")
                    grouped[param.grad.device][param.grad.dtype].append(param.grad)
            for device, per_dtype in grouped.items():
                for dtype, grads in per_dtype.items():
                    self._check_and_unscale(device, dtype, grads, per_device_found_inf.get(device),
                                            per_device_inv_scale.get(device))
        return per_device_found_inf.copies

    def _check_and_unscale(self, device: Device, dtype, grads: list[Tensor], found_inf: Tensor,
                           inv_scale: Tensor) -> None:
        """:func:`check_and_unscale_` over one device's gradients of one dtype: compiled over the list where a
        multi-tensor update would be (CUDA, outside a function being compiled), else op by op."""
        from tilewise.optim._foreach import compiled, use_compiled

        if use_compiled(None, grads):
            compiled(self.__dict__.setdefault("_programs", {}), (device, dtype), check_and_unscale_)(
                grads, found_inf, inv_scale)
        else:
            check_and_unscale_(grads, found_inf, inv_scale)

    def unscale_(self, optimizer) -> None:
        """Divide the gradients of ``optimizer``'s parameters by the scale, in place, and note whether any is inf
        or NaN; at most once per optimizer between ``update()`` calls (``step`` does it if it was not done)."""
        if not self._enabled:
            return
        self._check_scale_growth_tracker("unscale_")
        optimizer_state = self._per_optimizer_states[id(optimizer)]
        if optimizer_state["stage"] is OptState.UNSCALED:
            raise RuntimeError("unscale_() has already been called on this optimizer since the last update().")
        if optimizer_state["stage"] is OptState.STEPPED:
            raise RuntimeError("unscale_() is being called after step().")
        inv_scale = self._scale.double().reciprocal().float()  # float32 division can round differently
        found_inf = full((), 0.0, dtype=dtypes.float32, device=self._scale.device)
        optimizer_state["found_inf_per_device"] = self._unscale_grads_(optimizer, inv_scale, found_inf, False)
        optimizer_state["stage"] = OptState.UNSCALED

    # ------------------------------------------------------------------ stepping
    def _maybe_opt_step(self, optimizer, optimizer_state: dict, *args, **kwargs):
        if not sum(v.item() for v in optimizer_state["found_inf_per_device"].values()):
            return optimizer.step(*args, **kwargs)
        return None

    def step(self, optimizer, *args, **kwargs):
        """``unscale_(optimizer)`` unless done already, then ``optimizer.step(*args, **kwargs)`` unless a gradient
        is inf or NaN; returns what ``optimizer.step`` returned (None for a skipped step)."""
        if not self._enabled:
            return optimizer.step(*args, **kwargs)
        if "closure" in kwargs:
            raise RuntimeError("Closure use is not currently supported if GradScaler is enabled.")
        self._check_scale_growth_tracker("step")
        optimizer_state = self._per_optimizer_states[id(optimizer)]
        if optimizer_state["stage"] is OptState.STEPPED:
            raise RuntimeError("step() has already been called since the last update().")
        if getattr(optimizer, "_step_supports_amp_scaling", False):
            return self._step_scaling_optimizer(optimizer, optimizer_state, args, kwargs)
        if optimizer_state["stage"] is OptState.READY:
            self.unscale_(optimizer)
        if len(optimizer_state["found_inf_per_device"]) == 0:
            raise AssertionError("No inf checks were recorded for this optimizer.")
        retval = self._maybe_opt_step(optimizer, optimizer_state, *args, **kwargs)
        optimizer_state["stage"] = OptState.STEPPED
        return retval

    def _step_scaling_optimizer(self, optimizer, optimizer_state: dict, args: tuple, kwargs: dict):
        """torch's contract with an optimizer that unscales and skips by itself (``_step_supports_amp_scaling``):
        it is handed ``grad_scale`` and ``found_inf`` as attributes, or this scaler as a ``grad_scaler`` keyword
        where its ``step`` takes one (deprecated)."""
        has_grad_scaler_kwarg = "grad_scaler" in inspect.signature(optimizer.step).parameters
        if has_grad_scaler_kwarg:
            warnings.warn("GradScaler is going to stop passing itself as a keyword argument to the passed optimizer. "
                          "In the near future GradScaler registers `grad_scale: Tensor` and `found_inf: Tensor` to the "
                          "passed optimizer and let the optimizer use them directly.", FutureWarning, stacklevel=3)
            kwargs.update({"grad_scaler": self})
        else:
            if optimizer_state["stage"] is OptState.READY:
                self._check_inf_per_device(optimizer)
            scale = self._scale
            found_inf = sum(t.to(scale.device) for t in optimizer_state["found_inf_per_device"].values())
            optimizer.grad_scale = (getattr(optimizer, "grad_scale", None)
                                    if optimizer_state["stage"] == OptState.UNSCALED
                                    else scale * getattr(optimizer, "grad_scale", 1))
            optimizer.found_inf = found_inf
        retval = optimizer.step(*args, **kwargs)
        optimizer_state["stage"] = OptState.STEPPED
        if not has_grad_scaler_kwarg:
            del optimizer.grad_scale
            del optimizer.found_inf
        return retval

    def _check_inf_per_device(self, optimizer) -> dict:
        scale, _ = self._check_scale_growth_tracker("_check_inf_per_device")
        dummy_inv_scale = full((), 1.0, dtype=dtypes.float32, device=scale.device)
        found_inf = full((), 0.0, dtype=dtypes.float32, device=scale.device)
        self._per_optimizer_states[id(optimizer)]["found_inf_per_device"] = self._unscale_grads_(
            optimizer, dummy_inv_scale, found_inf, True)
        return self._per_optimizer_states[id(optimizer)]["found_inf_per_device"]

    def _found_inf_per_device(self, optimizer) -> dict:
        return self._per_optimizer_states[id(optimizer)]["found_inf_per_device"]

    # ------------------------------------------------------------------ updating the scale
    def update(self, new_scale: float | Tensor | None = None) -> None:
        """Adapt the scale after this iteration's steps (or set it to ``new_scale``), and start the next
        iteration."""
        if not self._enabled:
            return
        scale, growth_tracker = self._check_scale_growth_tracker("update")
        if new_scale is not None:
            if isinstance(new_scale, float):
                scale.fill_(new_scale)
            else:
                reason = ("new_scale should be a float or a 1-element tilewise.Tensor of dtype float32 on the "
                          "scaler's device with requires_grad=False.")
                if new_scale.device.type != self._device:
                    raise AssertionError(reason)
                if new_scale.numel() != 1:
                    raise AssertionError(reason)
                if new_scale.requires_grad is True:
                    raise AssertionError(reason)
                scale.copy_(new_scale)
        else:
            found_infs = [found_inf.to(device=scale.device) for state in self._per_optimizer_states.values()
                          for found_inf in state["found_inf_per_device"].values()]
            if len(found_infs) == 0:
                raise AssertionError("No inf checks were recorded prior to update.")
            found_inf_combined = found_infs[0]
            for more in found_infs[1:]:
                found_inf_combined += more
            update_scale_(scale, growth_tracker, found_inf_combined, self._growth_factor, self._backoff_factor,
                          self._growth_interval)
        self._per_optimizer_states = defaultdict(_refresh_per_optimizer_state)

    # ------------------------------------------------------------------ accessors
    def _get_scale_async(self) -> Tensor | None:
        return self._scale

    def get_scale(self) -> float:
        """The current scale as a Python float (1.0 when disabled); reads the device."""
        if self._enabled:
            return self._init_scale if self._scale is None else float(self._scale.item())
        return 1.0

    def get_growth_factor(self) -> float:
        return self._growth_factor

    def set_growth_factor(self, new_factor: float) -> None:
        self._growth_factor = new_factor

    def get_backoff_factor(self) -> float:
        return self._backoff_factor

    def set_backoff_factor(self, new_factor: float) -> None:
        self._backoff_factor = new_factor

    def get_growth_interval(self) -> int:
        return self._growth_interval

    def set_growth_interval(self, new_interval: int) -> None:
        self._growth_interval = new_interval

    def _get_growth_tracker(self) -> int:
        if self._enabled:
            return self._init_growth_tracker if self._growth_tracker is None else int(self._growth_tracker.item())
        return 0

    def is_enabled(self) -> bool:
        return self._enabled

    # ------------------------------------------------------------------ state dicts and pickling
    def state_dict(self) -> dict[str, Any]:
        """``scale``, ``growth_factor``, ``backoff_factor``, ``growth_interval`` and ``_growth_tracker`` as Python
        numbers (empty when disabled); take it after ``update()``."""
        if self._enabled:
            return {"scale": self.get_scale(), "growth_factor": self._growth_factor,
                    "backoff_factor": self._backoff_factor, "growth_interval": self._growth_interval,
                    "_growth_tracker": self._get_growth_tracker()}
        return {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if not self._enabled:
            return
        if len(state_dict) == 0:
            raise RuntimeError("The source state dict is empty, possibly because it was saved from a disabled "
                               "instance of GradScaler.")
        self._init_scale = state_dict["scale"]
        if self._scale is not None:
            self._scale.fill_(state_dict["scale"])
        self._growth_factor = state_dict["growth_factor"]
        self._backoff_factor = state_dict["backoff_factor"]
        self._growth_interval = state_dict["growth_interval"]
        self._init_growth_tracker = state_dict["_growth_tracker"]
        if self._growth_tracker is not None:
            self._growth_tracker.fill_(state_dict["_growth_tracker"])

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.pop("_programs", None)
        if self._enabled:
            if len(self._per_optimizer_states) != 0:
                raise AssertionError("A GradScaler instance may only be pickled at the beginning of an iteration, "
                                     "or at the end after scaler.update().")
            state["_init_scale"] = self.get_scale()
            state["_init_growth_tracker"] = self._get_growth_tracker()
            state["_scale"] = None
            state["_growth_tracker"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)


def _cuda_available() -> bool:
    from tilewise import cuda

    return cuda.is_available()

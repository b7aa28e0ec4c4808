"""Cyclical schedules: CyclicLR (triangular, triangular2, exp_range or a custom scale) and the 1cycle policy;
both cycle the momentum (or Adam's beta1) against the learning rate. See [Note: learning-rate schedules]."""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from types import FunctionType
from typing import Any

from tilewise.optim.lr_scheduler.base import LRScheduler, check_optimizer, per_group, set_group_value
from tilewise.optim.optimizer import Optimizer


def _cycle_momentum_setup(scheduler, optimizer: Optimizer, base_momentum, max_momentum, last_epoch: int) -> tuple:
    """Check the optimizer has a momentum to cycle; on a fresh start set it to its maximum. Returns the
    per-group (base, max) momenta."""
    if "momentum" not in optimizer.defaults and "betas" not in optimizer.defaults:
        raise ValueError("optimizer must support momentum or beta1 with `cycle_momentum` option enabled")
    scheduler.use_beta1 = "betas" in optimizer.defaults
    bases = per_group("base_momentum", optimizer, base_momentum)
    tops = per_group("max_momentum", optimizer, max_momentum)
    if last_epoch == -1:
        for top, base, group in zip(tops, bases, optimizer.param_groups, strict=True):
            _set_momentum(scheduler, group, top)
            group["max_momentum"], group["base_momentum"] = top, base
    return bases, tops


def _set_momentum(scheduler, group: dict, value: float) -> None:
    if scheduler.use_beta1:
        group["betas"] = (value, *group["betas"][1:])
    else:
        group["momentum"] = value


class CyclicLR(LRScheduler):
    """Cycle the learning rate between ``base_lr`` and ``max_lr`` (up over ``step_size_up`` steps, down over
    ``step_size_down``), the amplitude scaled per cycle (``triangular2``: halved) or per step (``exp_range``:
    ``gamma**step``) or by ``scale_fn``; stepped once per batch."""

    def __init__(self, optimizer: Optimizer, base_lr: float | list, max_lr: float | list, step_size_up: int = 2000,
                 step_size_down: int | None = None, mode: str = "triangular", gamma: float = 1.0,
                 scale_fn: Callable[[float], float] | None = None, scale_mode: str = "cycle",
                 cycle_momentum: bool = True, base_momentum: float | list = 0.8, max_momentum: float | list = 0.9,
                 last_epoch: int = -1) -> None:
        check_optimizer(optimizer)
        self.optimizer = optimizer
        base_lrs = per_group("base_lr", optimizer, base_lr)
        if last_epoch == -1:
            for lr, group in zip(base_lrs, optimizer.param_groups, strict=True):
                set_group_value(group, "lr", lr)
        self.max_lrs = per_group("max_lr", optimizer, max_lr)
        step_size_up = float(step_size_up)
        step_size_down = float(step_size_down) if step_size_down is not None else step_size_up
        self.total_size = step_size_up + step_size_down
        self.step_ratio = step_size_up / self.total_size
        if mode not in ("triangular", "triangular2", "exp_range") and scale_fn is None:
            raise ValueError("mode is invalid and scale_fn is None")
        self.mode, self.gamma = mode, gamma
        self._scale_fn_custom = scale_fn
        self.scale_mode = scale_mode
        self._init_scale_fn()
        self.cycle_momentum = cycle_momentum
        if cycle_momentum:
            self.base_momentums, self.max_momentums = _cycle_momentum_setup(self, optimizer, base_momentum,
                                                                            max_momentum, last_epoch)
        super().__init__(optimizer, last_epoch)
        self.base_lrs = base_lrs

    def _init_scale_fn(self) -> None:
        if self._scale_fn_custom is not None:
            return
        if self.mode == "triangular":
            self._scale_fn_ref, self.scale_mode = _triangular_scale_fn, "cycle"
        elif self.mode == "triangular2":
            self._scale_fn_ref, self.scale_mode = _triangular2_scale_fn, "cycle"
        elif self.mode == "exp_range":
            self._scale_fn_ref, self.scale_mode = partial(_exp_range_scale_fn, self.gamma), "iterations"

    def scale_fn(self, x) -> float:
        """The amplitude's scale at cycle (or step) ``x``."""
        if self._scale_fn_custom is not None:
            return self._scale_fn_custom(x)
        return self._scale_fn_ref(x)

    def get_lr(self) -> list:
        self._warn_if_outside_step()
        cycle = math.floor(1 + self.last_epoch / self.total_size)
        x = 1.0 + self.last_epoch / self.total_size - cycle
        scale_factor = x / self.step_ratio if x <= self.step_ratio else (x - 1) / (self.step_ratio - 1)
        scale = self.scale_fn(cycle) if self.scale_mode == "cycle" else self.scale_fn(self.last_epoch)
        lrs = [base_lr + (max_lr - base_lr) * scale_factor * scale
               for base_lr, max_lr in zip(self.base_lrs, self.max_lrs, strict=True)]
        if self.cycle_momentum:
            momenta = [max_momentum - (max_momentum - base_momentum) * scale_factor * scale
                       for base_momentum, max_momentum in zip(self.base_momentums, self.max_momentums, strict=True)]
            for group, momentum in zip(self.optimizer.param_groups, momenta, strict=True):
                _set_momentum(self, group, momentum)
        return lrs

    def state_dict(self) -> dict[str, Any]:
        """As the base's, less the scale function (a callable object's attributes are kept)."""
        state = super().state_dict()
        state.pop("_scale_fn_ref", None)
        fn = state.pop("_scale_fn_custom")
        state["_scale_fn_custom"] = None if fn is None or isinstance(fn, FunctionType) else fn.__dict__.copy()
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        state_dict = dict(state_dict)
        fn = state_dict.pop("_scale_fn_custom")
        super().load_state_dict(state_dict)
        if fn is not None:
            self._scale_fn_custom.__dict__.update(fn)
        self._init_scale_fn()


def _triangular_scale_fn(x: float) -> float:
    return 1.0


def _triangular2_scale_fn(x: float) -> float:
    return 1 / (2.0 ** (x - 1))


def _exp_range_scale_fn(gamma: float, x: float) -> float:
    return gamma**x


class OneCycleLR(LRScheduler):
    """The 1cycle policy: warm up from ``max_lr / div_factor`` to ``max_lr`` over ``pct_start`` of
    ``total_steps``, then anneal far below the start (to ``initial_lr / final_div_factor``); with
    ``three_phase`` back to the start first. Momentum (or Adam's beta1) cycles the opposite way."""

    def __init__(self, optimizer: Optimizer, max_lr: float | list, total_steps: int | None = None,
                 epochs: int | None = None, steps_per_epoch: int | None = None, pct_start: float = 0.3,
                 anneal_strategy: str = "cos", cycle_momentum: bool = True, base_momentum: float | list = 0.85,
                 max_momentum: float | list = 0.95, div_factor: float = 25.0, final_div_factor: float = 1e4,
                 three_phase: bool = False, last_epoch: int = -1) -> None:
        check_optimizer(optimizer)
        self.optimizer = optimizer
        self.total_steps = _total_steps(total_steps, epochs, steps_per_epoch)
        self._schedule_phases = _phases(self.total_steps, pct_start, three_phase)
        if pct_start < 0 or pct_start > 1 or not isinstance(pct_start, float):
            raise ValueError(f"Expected float between 0 and 1 pct_start, but got {pct_start}")
        if anneal_strategy not in ("cos", "linear"):
            raise ValueError(f"anneal_strategy must be one of 'cos' or 'linear', instead got {anneal_strategy}")
        self._anneal_func_type = anneal_strategy
        max_lrs = per_group("max_lr", optimizer, max_lr)
        if last_epoch == -1:
            for top, group in zip(max_lrs, optimizer.param_groups, strict=True):
                group["initial_lr"] = top / div_factor
                group["max_lr"] = top
                group["min_lr"] = group["initial_lr"] / final_div_factor
        self.cycle_momentum = cycle_momentum
        if cycle_momentum:
            _cycle_momentum_setup(self, optimizer, base_momentum, max_momentum, last_epoch)
        super().__init__(optimizer, last_epoch)

    def _anneal_func(self, start: float, end: float, pct: float) -> float:
        if self._anneal_func_type == "cos":
            return end + (start - end) / 2.0 * (math.cos(math.pi * pct) + 1)
        return (end - start) * pct + start

    def get_lr(self) -> list:
        self._warn_if_outside_step()
        step = self.last_epoch
        if step > self.total_steps:
            raise ValueError(f"Tried to step {step} times. The specified number of total steps is {self.total_steps}")
        lrs = []
        for group in self.optimizer.param_groups:
            start = 0.0
            for k, phase in enumerate(self._schedule_phases):
                end = phase["end_step"]
                if step <= end or k == len(self._schedule_phases) - 1:
                    pct = (step - start) / (end - start)
                    lrs.append(self._anneal_func(group[phase["start_lr"]], group[phase["end_lr"]], pct))
                    if self.cycle_momentum:
                        _set_momentum(self, group, self._anneal_func(group[phase["start_momentum"]],
                                                                     group[phase["end_momentum"]], pct))
                    break
                start = end
        return lrs


def _total_steps(total_steps: int | None, epochs: int | None, steps_per_epoch: int | None) -> int:
    if total_steps is not None:
        if total_steps <= 0 or not isinstance(total_steps, int):
            raise ValueError(f"Expected positive integer total_steps, but got {total_steps}")
        return total_steps
    if epochs is None or steps_per_epoch is None:
        raise ValueError("You must define either total_steps OR (epochs AND steps_per_epoch)")
    if not isinstance(epochs, int) or epochs <= 0:
        raise ValueError(f"Expected positive integer epochs, but got {epochs}")
    if not isinstance(steps_per_epoch, int) or steps_per_epoch <= 0:
        raise ValueError(f"Expected positive integer steps_per_epoch, but got {steps_per_epoch}")
    return epochs * steps_per_epoch


def _phase(end_step: float, start_lr: str, end_lr: str, start_momentum: str, end_momentum: str) -> dict:
    return {"end_step": end_step, "start_lr": start_lr, "end_lr": end_lr, "start_momentum": start_momentum,
            "end_momentum": end_momentum}


def _phases(total: int, pct_start: float, three_phase: bool) -> list[dict]:
    warm_up = _phase(float(pct_start * total) - 1, "initial_lr", "max_lr", "max_momentum", "base_momentum")
    if three_phase:
        return [warm_up,
                _phase(float(2 * pct_start * total) - 2, "max_lr", "initial_lr", "base_momentum", "max_momentum"),
                _phase(total - 1, "initial_lr", "min_lr", "max_momentum", "max_momentum")]
    return [warm_up, _phase(total - 1, "max_lr", "min_lr", "base_momentum", "max_momentum")]

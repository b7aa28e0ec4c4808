"""ReduceLROnPlateau: cut the learning rate when a metric stops improving."""

from __future__ import annotations

import math
import warnings
from typing import Any

from tilewise.optim.lr_scheduler.base import (
    EPOCH_DEPRECATION_WARNING,
    LRScheduler,
    check_optimizer,
    group_values,
    set_group_value,
)
from tilewise.optim.optimizer import Optimizer


class ReduceLROnPlateau(LRScheduler):
    """Multiply the learning rate by ``factor`` once the metric given to ``step(metric)`` has not improved for
    ``patience`` epochs; "improved" is relative (``threshold_mode="rel"``: better than ``best * (1 ∓
    threshold)``) or absolute (``best ∓ threshold``), in ``mode`` "min" or "max". After a cut, ``cooldown`` epochs
    pass before bad epochs count again; no rate goes below ``min_lr``, and a change smaller than ``eps`` is not
    made.

    >>> import tilewise as tw
    >>> opt = tw.optim.SGD([tw.nn.Parameter(tw.zeros(1))], lr=1.0)
    >>> sched = tw.optim.lr_scheduler.ReduceLROnPlateau(opt, patience=1, factor=0.5)
    >>> for loss in [1.0, 1.0, 1.0, 0.5]:
    ...     sched.step(loss)
    >>> sched.get_last_lr()
    [0.5]
    """

    def __init__(self, optimizer: Optimizer, mode: str = "min", factor: float = 0.1, patience: int = 10,
                 threshold: float = 1e-4, threshold_mode: str = "rel", cooldown: int = 0,
                 min_lr: list[float] | float = 0, eps: float = 1e-8) -> None:
        if factor >= 1.0:
            raise ValueError("Factor should be < 1.0.")
        self.factor = factor
        check_optimizer(optimizer)
        self.optimizer = optimizer
        if isinstance(min_lr, (list, tuple)):
            if len(min_lr) != len(optimizer.param_groups):
                raise ValueError(f"expected {len(optimizer.param_groups)} min_lrs, got {len(min_lr)}")
            self.default_min_lr = None
            self.min_lrs = list(min_lr)
        else:
            self.default_min_lr = min_lr
            self.min_lrs = [min_lr] * len(optimizer.param_groups)
        self.patience, self.cooldown, self.eps = patience, cooldown, eps
        self.last_epoch = 0
        self._last_lr = group_values(optimizer, "lr")
        self._init_is_better(mode=mode, threshold=threshold, threshold_mode=threshold_mode)
        self._reset()

    def _reset(self) -> None:
        self.best = self.mode_worse
        self.cooldown_counter = 0
        self.num_bad_epochs = 0

    def step(self, metrics, epoch: int | None = None) -> None:  # type: ignore[override]
        """Take one epoch's ``metrics`` (a number or a 0-dim tensor)."""
        current = float(metrics)
        if epoch is None:
            epoch = self.last_epoch + 1
        else:
            warnings.warn(EPOCH_DEPRECATION_WARNING, UserWarning, stacklevel=2)
        self.last_epoch = epoch
        if self._is_better(current, self.best):
            self.best = current
            self.num_bad_epochs = 0
        else:
            self.num_bad_epochs += 1
        if self.in_cooldown:
            self.cooldown_counter -= 1
            self.num_bad_epochs = 0  # bad epochs in cooldown do not count
        if self.num_bad_epochs > self.patience:
            self._reduce_lr(epoch)
            self.cooldown_counter = self.cooldown
            self.num_bad_epochs = 0
        self._last_lr = group_values(self.optimizer, "lr")

    def _reduce_lr(self, epoch: int) -> None:
        if len(self.optimizer.param_groups) != len(self.min_lrs):
            if self.default_min_lr is None:
                raise RuntimeError(f"The number of param groups in the `optimizer` ({len(self.optimizer.param_groups)})"
                                   f" differs from when `ReduceLROnPlateau` was initialized ({len(self.min_lrs)}), "
                                   "usually due to a new param group being added to the optimizer. Please modify the "
                                   "`min_lrs` field to match the length of the `optimizer` param groups.")
            self.min_lrs = [self.default_min_lr] * len(self.optimizer.param_groups)
        for k, group in enumerate(self.optimizer.param_groups):
            old_lr = float(group["lr"])
            new_lr = max(old_lr * self.factor, self.min_lrs[k])
            if old_lr - new_lr > self.eps:
                set_group_value(group, "lr", new_lr)

    @property
    def in_cooldown(self) -> bool:
        return self.cooldown_counter > 0

    def _is_better(self, a: float, best: float) -> bool:
        if self.mode == "min" and self.threshold_mode == "rel":
            return a < best * (1.0 - self.threshold)
        if self.mode == "min" and self.threshold_mode == "abs":
            return a < best - self.threshold
        if self.mode == "max" and self.threshold_mode == "rel":
            return a > best * (self.threshold + 1.0)
        return a > best + self.threshold

    def _init_is_better(self, mode: str, threshold: float, threshold_mode: str) -> None:
        if mode not in {"min", "max"}:
            raise ValueError("mode " + mode + " is unknown!")
        if threshold_mode not in {"rel", "abs"}:
            raise ValueError("threshold mode " + threshold_mode + " is unknown!")
        self.mode_worse = math.inf if mode == "min" else -math.inf
        self.mode, self.threshold, self.threshold_mode = mode, threshold, threshold_mode

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.__dict__.update(state_dict)
        self._init_is_better(mode=self.mode, threshold=self.threshold, threshold_mode=self.threshold_mode)

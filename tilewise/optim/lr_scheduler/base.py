"""LRScheduler: the base of every learning-rate schedule, and the helpers they share.

[Note: learning-rate schedules] A scheduler writes ``group["lr"]`` of its optimizer's parameter groups on
``step()`` (filling it in place where the learning rate is a tensor). The update rules are torch's, in torch's
recursive ("chainable") form where torch uses one — each step scales the learning rate the groups hold now —
so the sequence of learning rates matches torch's float for float, also when schedulers are chained
(``ChainedScheduler``) or run one after another (``SequentialLR``); ``step(epoch)`` uses the closed form where
one exists, as torch does. Attributes keep torch's names, so ``state_dict()`` has torch's keys and a torch
scheduler's state dict resumes here. The warnings torch gives are given too: ``scheduler.step()`` before
``optimizer.step()`` (the first learning rate would be skipped), an ``optimizer.step`` replaced after the
scheduler was made, ``get_lr()`` called outside ``step()``, and the deprecated ``step(epoch)``.
"""

from __future__ import annotations

import warnings
from functools import wraps
from typing import Any
from weakref import ref

from tilewise.optim.optimizer import Optimizer
from tilewise.tensor import Tensor

EPOCH_DEPRECATION_WARNING = (
    "The epoch parameter in `scheduler.step()` was not necessary and is being deprecated where possible. Please "
    "use `scheduler.step()` to step the scheduler. During the deprecation, if epoch is different from None, the "
    "closed form is used instead of the new chainable form, where available."
)


class LRScheduler:
    """Base class: subclasses implement ``get_lr()`` (the next learning rates, from the groups' current ones) and,
    where one exists, ``_get_closed_form_lr()`` (the learning rates at ``last_epoch``, from ``base_lrs``).

    >>> import tilewise as tw
    >>> opt = tw.optim.SGD([tw.nn.Parameter(tw.zeros(1))], lr=0.1)
    >>> sched = tw.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    >>> lrs = []
    >>> for _ in range(4):
    ...     opt.step(); sched.step(); lrs.append(sched.get_last_lr()[0])
    >>> lrs
    [0.1, 0.05, 0.05, 0.025]
    """

    _get_lr_called_within_step: bool = False
    _is_initial: bool = False

    def __init__(self, optimizer: Optimizer, last_epoch: int = -1) -> None:
        check_optimizer(optimizer)
        self.optimizer = optimizer
        if last_epoch == -1:
            for group in optimizer.param_groups:
                initial_lr = group["lr"]
                group.setdefault("initial_lr", initial_lr.clone() if isinstance(initial_lr, Tensor) else initial_lr)
        else:
            for k, group in enumerate(optimizer.param_groups):
                if "initial_lr" not in group:
                    raise KeyError(f"param 'initial_lr' is not specified in param_groups[{k}] when resuming scheduler "
                                   "with last_epoch >= 0.\nThis typically happens when:\n1. You're trying to resume "
                                   "training from a checkpoint but haven't properly loaded the optimizer state\n2. "
                                   "You're using last_epoch >= 0 for a fresh training run (not recommended)")
        self.base_lrs: list = group_values(optimizer, "initial_lr")
        self.last_epoch = last_epoch
        _track_optimizer_steps(optimizer)
        self._initial_step()

    def _initial_step(self) -> None:
        """The step a scheduler takes when made: it sets the learning rates of epoch ``last_epoch + 1``."""
        self._step_count = 0
        self._is_initial = True
        try:
            self.step()
        finally:
            self._is_initial = False

    def state_dict(self) -> dict[str, Any]:
        """Every attribute but the optimizer (torch's layout)."""
        return {key: value for key, value in self.__dict__.items() if key != "optimizer"}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.__dict__.update(state_dict)

    def get_last_lr(self) -> list:
        """The learning rates the last ``step()`` set, one per parameter group."""
        return self._last_lr

    def get_lr(self) -> list:
        raise NotImplementedError(f"{type(self).__name__} does not implement get_lr()")

    def step(self, epoch: int | None = None) -> None:
        """Advance one epoch (or jump to ``epoch``, deprecated) and write the new learning rates."""
        if self._step_count == 1:
            _warn_about_step_order(self.optimizer)
        self._step_count += 1
        if epoch is not None:
            warnings.warn(EPOCH_DEPRECATION_WARNING, UserWarning, stacklevel=2)
        self._update_lr(epoch)

    def _update_lr(self, epoch: int | None = None) -> None:
        self._get_lr_called_within_step = True
        try:
            if epoch is None:
                self.last_epoch += 1
                values = self.get_lr()
            else:
                self.last_epoch = epoch
                closed_form = getattr(self, "_get_closed_form_lr", None)
                values = closed_form() if closed_form is not None else self.get_lr()
        finally:
            self._get_lr_called_within_step = False
        for group, lr in zip(self.optimizer.param_groups, values, strict=True):
            set_group_value(group, "lr", lr)
        self._last_lr = group_values(self.optimizer, "lr")

    def _warn_if_outside_step(self) -> None:
        if not self._get_lr_called_within_step:
            warnings.warn("To get the last learning rate computed by the scheduler, please use `get_last_lr()`.",
                          UserWarning, stacklevel=3)


class _LRScheduler(LRScheduler):
    """The former name of LRScheduler, kept for code written against it."""


def check_optimizer(optimizer) -> None:
    if not isinstance(optimizer, Optimizer):
        raise TypeError(f"{type(optimizer).__name__} is not an Optimizer")


def group_values(optimizer: Optimizer, key: str) -> list:
    """``group[key]`` of every parameter group (tensors copied, so that a caller cannot change them)."""
    return [group[key].clone() if isinstance(group[key], Tensor) else group[key] for group in optimizer.param_groups]


def set_group_value(group: dict, key: str, value) -> None:
    """``group[key] = value``; a tensor learning rate is filled in place (a compiled step keeps reading it)."""
    if isinstance(group[key], Tensor):
        group[key].fill_(value.item() if isinstance(value, Tensor) else value)
    else:
        group[key] = value


def per_group(name: str, optimizer: Optimizer, value) -> list:
    """``value`` for each parameter group: a list or tuple of one per group, or one value for all."""
    if isinstance(value, (list, tuple)):
        if len(value) != len(optimizer.param_groups):
            raise ValueError(f"{name} must have the same length as optimizer.param_groups. {name} has {len(value)} "
                             f"values, param_groups has {len(optimizer.param_groups)}.")
    else:
        value = [value] * len(optimizer.param_groups)
    return [v.clone() if isinstance(v, Tensor) else v for v in value]


def _track_optimizer_steps(optimizer: Optimizer) -> None:
    """Wrap ``optimizer.step`` (once) to note that it ran: the first ``scheduler.step()`` warns otherwise."""
    if hasattr(optimizer.step, "_wrapped_by_lr_sched"):
        return
    optimizer_ref = ref(optimizer)
    step = optimizer.step.__func__

    @wraps(step)
    def wrapper(*args, **kwargs):
        opt = optimizer_ref()
        opt.__dict__["_opt_called"] = True  # not an attribute assignment, which a compiled step would replay
        return step.__get__(opt, type(opt))(*args, **kwargs)

    wrapper._wrapped_by_lr_sched = True
    optimizer.step = wrapper


def _warn_about_step_order(optimizer: Optimizer) -> None:
    if not hasattr(optimizer.step, "_wrapped_by_lr_sched"):
        warnings.warn("Seems like `optimizer.step()` has been overridden after learning rate scheduler "
                      "initialization. Please, make sure to call `optimizer.step()` before `lr_scheduler.step()`.",
                      UserWarning, stacklevel=3)
    elif not getattr(optimizer, "_opt_called", False):
        warnings.warn("Detected call of `lr_scheduler.step()` before `optimizer.step()`. Call them in the opposite "
                      "order: `optimizer.step()` before `lr_scheduler.step()`; otherwise the first value of the "
                      "learning rate schedule is skipped.", UserWarning, stacklevel=3)

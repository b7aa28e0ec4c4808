"""Schedulers made of schedulers: SequentialLR (one after another, switching at milestones) and
ChainedScheduler (all of them at every step, their factors multiplied). See [Note: learning-rate schedules]."""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from typing import Any

from tilewise.optim.lr_scheduler.base import LRScheduler, group_values, set_group_value
from tilewise.optim.lr_scheduler.plateau import ReduceLROnPlateau
from tilewise.optim.optimizer import Optimizer


def _check_parts(owner: str, schedulers: Sequence, optimizer: Optimizer) -> None:
    for k, scheduler in enumerate(schedulers):
        if not hasattr(scheduler, "optimizer"):
            raise TypeError(f"{owner} at index {k} should have `optimizer` as its attribute.")
        if isinstance(scheduler, ReduceLROnPlateau):
            raise ValueError(f"{owner} does not support `ReduceLROnPlateau` scheduler as it requires additional "
                             f"kwargs to be specified when calling `step`, but got one at index {k} in the given "
                             "schedulers sequence.")
        if optimizer != scheduler.optimizer:
            raise ValueError(f"{owner} expects all schedulers to belong to the same optimizer, but got scheduler "
                             f"{type(scheduler).__name__} at index {k} has {scheduler.optimizer}, which is different "
                             f"from {type(optimizer).__name__}.")


class _Combined(LRScheduler):
    """What both combinations share: the parts' state dicts nest in the combination's."""

    def state_dict(self) -> dict[str, Any]:
        state = {key: value for key, value in self.__dict__.items() if key not in ("optimizer", "_schedulers")}
        state["_schedulers"] = [scheduler.state_dict() for scheduler in self._schedulers]
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        state_dict = dict(state_dict)
        saved = state_dict.pop("_schedulers")
        self.__dict__.update(state_dict)
        for scheduler, state in zip(self._schedulers, saved):
            scheduler.load_state_dict(state)


class SequentialLR(_Combined):
    """Run ``schedulers`` one after another, switching at each of the ``milestones`` epochs (a scheduler starts
    from epoch 0 when its turn comes).

    >>> import tilewise as tw
    >>> opt = tw.optim.SGD([tw.nn.Parameter(tw.zeros(1))], lr=1.0)
    >>> s = tw.optim.lr_scheduler
    >>> sched = s.SequentialLR(opt, [s.ConstantLR(opt, factor=0.5, total_iters=2), s.ExponentialLR(opt, 0.9)], [2])
    >>> lrs = []
    >>> for _ in range(4):
    ...     lrs.append(sched.get_last_lr()[0]); opt.step(); sched.step()
    >>> [round(lr, 4) for lr in lrs]
    [0.5, 0.5, 1.0, 0.9]
    """

    def __init__(self, optimizer: Optimizer, schedulers: list[LRScheduler], milestones: list[int],
                 last_epoch: int = -1) -> None:
        if len(schedulers) < 1:
            raise ValueError(f"{type(self).__name__} expects at least one scheduler, but got no scheduler.")
        _check_parts(type(self).__name__, schedulers, optimizer)
        if len(milestones) != len(schedulers) - 1:
            raise ValueError("Sequential Schedulers expects number of schedulers provided to be one more than the "
                             f"number of milestone points, but got number of schedulers {len(schedulers)} and the "
                             f"number of milestones to be equal to {len(milestones)}")
        self._schedulers = schedulers
        self._milestones = milestones
        self.last_epoch = last_epoch + 1
        self.optimizer = optimizer
        for group in optimizer.param_groups:  # undo what the schedulers' own initial steps did
            set_group_value(group, "lr", group["initial_lr"])
        self.recursive_undo()
        first = bisect_right(self._milestones, 0)
        self._schedulers[first]._initial_step()
        self._last_lr = schedulers[first].get_last_lr()

    def recursive_undo(self, sched=None) -> None:
        """Take back the epoch each scheduler (and each scheduler inside one) counted at its initial step."""
        scheds = self if sched is None else sched
        if hasattr(scheds, "_schedulers"):
            for s in scheds._schedulers:
                self.recursive_undo(s)
        elif hasattr(scheds, "last_epoch"):
            scheds.last_epoch -= 1

    def step(self) -> None:  # type: ignore[override]
        self.last_epoch += 1
        k = bisect_right(self._milestones, self.last_epoch)
        scheduler = self._schedulers[k]
        if k > 0 and self._milestones[k - 1] == self.last_epoch:
            scheduler._update_lr(0)
        else:
            scheduler.step()
        self._last_lr = scheduler.get_last_lr()


class ChainedScheduler(_Combined):
    """Step every scheduler of ``schedulers`` at each step, in order: their changes to the learning rate
    compound (e.g. a warm-up ConstantLR under an ExponentialLR)."""

    def __init__(self, schedulers: Sequence[LRScheduler], optimizer: Optimizer | None = None) -> None:
        if len(schedulers) < 1:
            raise ValueError(f"{type(self).__name__} expects at least one scheduler to be chained, but got no "
                             "scheduler.")
        optimizer = optimizer or schedulers[0].optimizer
        _check_parts(type(self).__name__, schedulers, optimizer)
        self._schedulers = schedulers
        self.optimizer = optimizer
        self._last_lr = group_values(self._schedulers[-1].optimizer, "lr")

    def step(self) -> None:  # type: ignore[override]
        for scheduler in self._schedulers:
            scheduler.step()
        self._last_lr = group_values(self._schedulers[-1].optimizer, "lr")

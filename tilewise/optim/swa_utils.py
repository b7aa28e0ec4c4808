"""Stochastic weight averaging and exponential moving averages of a model (torch.optim.swa_utils).

``AveragedModel`` keeps a copy of a model whose parameters (and, with ``use_buffers``, buffers) are a running
average of the model's: equal weights by default (SWA), or any ``avg_fn`` / ``multi_avg_fn``, such as the
exponential averages of ``get_ema_avg_fn`` / ``get_ema_multi_avg_fn``. The arithmetic is torch's, path for path:
on the CPU the equal-weight average is ``avg + (new - avg) / (n + 1)``, on CUDA (where torch has multi-tensor
kernels) a ``lerp`` with weight ``1 / (n + 1)``. ``SWALR`` anneals each group's learning rate to ``swa_lr``;
``update_bn`` recomputes batch-norm statistics with one pass over the data.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable
from copy import deepcopy
from typing import Any

from tilewise import dtypes
from tilewise.autograd.grad_mode import no_grad
from tilewise.nn.modules.module import Module
from tilewise.nn.modules.normalization import _BatchNorm, _InstanceNorm
from tilewise.optim.lr_scheduler.base import LRScheduler
from tilewise.optim.optimizer import Optimizer
from tilewise.tensor import Tensor, tensor

__all__ = ["AveragedModel", "update_bn", "SWALR", "get_ema_multi_avg_fn", "get_swa_multi_avg_fn", "get_ema_avg_fn",
           "get_swa_avg_fn"]


def _check_decay(decay: float) -> None:
    if decay < 0.0 or decay > 1.0:
        raise ValueError(f"Invalid decay value {decay} provided. Please provide a value in [0,1] range.")


def get_ema_multi_avg_fn(decay: float = 0.999) -> Callable:
    """An in-place exponential moving average over lists: ``ema = lerp(ema, new, 1 - decay)``."""
    _check_decay(decay)

    def ema_update(ema_param_list, current_param_list, _) -> None:
        with no_grad():
            if ema_param_list[0].is_floating_point():
                for p_ema, p_model in zip(ema_param_list, current_param_list, strict=True):
                    p_ema.lerp_(p_model, 1 - decay)
            else:
                for p_ema, p_model in zip(ema_param_list, current_param_list, strict=True):
                    p_ema.copy_(p_ema * decay + p_model * (1 - decay))

    return ema_update


def get_swa_multi_avg_fn() -> Callable:
    """An in-place equal-weight average over lists: ``avg = lerp(avg, new, 1 / (n + 1))``."""

    def swa_update(averaged_param_list, current_param_list, num_averaged) -> None:
        with no_grad():
            if averaged_param_list[0].is_floating_point():
                weight = 1 / (num_averaged + 1)
                for p_avg, p_model in zip(averaged_param_list, current_param_list, strict=True):
                    p_avg.lerp_(p_model, weight)
            else:
                for p_avg, p_model in zip(averaged_param_list, current_param_list, strict=True):
                    diff = p_model - p_avg
                    if isinstance(num_averaged, Tensor):
                        p_avg.addcdiv_(diff, (num_averaged + 1).expand_as(diff))
                    else:
                        p_avg.add_(diff, alpha=1.0 / (num_averaged + 1))

    return swa_update


def get_ema_avg_fn(decay: float = 0.999) -> Callable:
    """``decay * ema + (1 - decay) * new``, one tensor at a time."""
    _check_decay(decay)

    def ema_update(ema_param: Tensor, current_param: Tensor, num_averaged) -> Tensor:
        with no_grad():
            return decay * ema_param + (1 - decay) * current_param

    return ema_update


def get_swa_avg_fn() -> Callable:
    """``avg + (new - avg) / (n + 1)``, one tensor at a time."""

    def swa_update(averaged_param: Tensor, current_param: Tensor, num_averaged) -> Tensor:
        with no_grad():
            return averaged_param + (current_param - averaged_param) / (num_averaged + 1)

    return swa_update


class AveragedModel(Module):
    """A copy of ``model`` whose parameters are a running average of ``model``'s, updated by
    ``update_parameters(model)`` (the first call copies them).

    >>> import tilewise as tw
    >>> model = tw.nn.Linear(2, 1)
    >>> swa = tw.optim.swa_utils.AveragedModel(model)
    >>> swa.update_parameters(model)
    >>> int(swa.n_averaged)
    1
    """

    def __init__(self, model: Module, device=None, avg_fn: Callable | None = None,
                 multi_avg_fn: Callable | None = None, use_buffers: bool = False) -> None:
        super().__init__()
        if avg_fn is not None and multi_avg_fn is not None:
            raise AssertionError("Only one of avg_fn and multi_avg_fn should be provided")
        self.module = deepcopy(model)
        if device is not None:
            self.module = self.module.to(device)
        self.register_buffer("n_averaged", tensor(0, dtype=dtypes.int64, device=device))
        self.avg_fn = avg_fn
        self.multi_avg_fn = multi_avg_fn
        self.use_buffers = use_buffers

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def _averaged(self, model: Module) -> tuple[Iterable[Tensor], Iterable[Tensor]]:
        if self.use_buffers:
            return (itertools.chain(self.module.parameters(), self.module.buffers()),
                    itertools.chain(model.parameters(), model.buffers()))
        return self.parameters(), model.parameters()

    def update_parameters(self, model: Module) -> None:
        ours, theirs = self._averaged(model)
        averaged, current = [], []
        first = bool(self.n_averaged == 0)
        with no_grad():
            for p_averaged, p_model in zip(ours, theirs):
                p_model_ = p_model.detach().to(p_averaged.device)
                averaged.append(p_averaged.detach())
                current.append(p_model_)
                if first:
                    p_averaged.detach().copy_(p_model_)
            if not first:
                self._average(averaged, current)
            if not self.use_buffers:  # buffers are not averaged: they follow the model
                for b_swa, b_model in zip(self.module.buffers(), model.buffers(), strict=True):
                    b_swa.detach().copy_(b_model.detach().to(b_swa.device))
            self.n_averaged += 1

    def _average(self, averaged: list[Tensor], current: list[Tensor]) -> None:
        if self.avg_fn is not None and self.multi_avg_fn is None:
            for p_averaged, p_model in zip(averaged, current, strict=True):
                p_averaged.copy_(self.avg_fn(p_averaged, p_model, self.n_averaged.to(p_averaged.device)))
            return
        for (device, _), (group_averaged, group_current) in _by_device_and_dtype(averaged, current).items():
            n_averaged = self.n_averaged.to(device)
            if self.multi_avg_fn is not None:
                self.multi_avg_fn(group_averaged, group_current, n_averaged)
            elif device.type == "cuda":
                get_swa_multi_avg_fn()(group_averaged, group_current, n_averaged)
            else:
                average = get_swa_avg_fn()
                for p_averaged, p_model in zip(group_averaged, group_current, strict=True):
                    p_averaged.copy_(average(p_averaged, p_model, n_averaged))


def _by_device_and_dtype(averaged: list[Tensor], current: list[Tensor]) -> dict:
    groups: dict[tuple, tuple[list[Tensor], list[Tensor]]] = {}
    for a, c in zip(averaged, current, strict=True):
        lists = groups.setdefault((a.device, a.dtype), ([], []))
        lists[0].append(a)
        lists[1].append(c)
    return groups


def update_bn(loader: Iterable[Any], model: Module, device=None) -> None:
    """Recompute the running statistics of ``model``'s batch-norm layers with one pass over ``loader``
    (each batch a tensor, or a list or tuple whose first element is the input)."""
    momenta = {}
    for module in model.modules():
        if isinstance(module, _BatchNorm) and not isinstance(module, _InstanceNorm):  # torch's _BatchNorm
            module.reset_running_stats()
            momenta[module] = module.momentum
    if not momenta:
        return
    was_training = model.training
    model.train()
    for module in momenta:
        module.momentum = None  # a cumulative average over the whole pass
    with no_grad():
        for batch in loader:
            if isinstance(batch, (list, tuple)):
                batch = batch[0]
            if device is not None:
                batch = batch.to(device)
            model(batch)
    for module, momentum in momenta.items():
        module.momentum = momentum
    model.train(was_training)


def _format_param(name: str, optimizer: Optimizer, param) -> list:
    """One value per parameter group: ``param`` repeated, or a list that must have one per group."""
    if isinstance(param, (list, tuple)):
        if len(param) != len(optimizer.param_groups):
            raise ValueError(f"{name} must have the same length as optimizer.param_groups. {name} has {len(param)} "
                             f"values, param_groups has {len(optimizer.param_groups)}.")
    else:
        param = [param] * len(optimizer.param_groups)
    return [p.clone() if isinstance(p, Tensor) else p for p in param]


class SWALR(LRScheduler):
    """Anneals each group's learning rate to ``swa_lr`` over ``anneal_epochs`` epochs ("cos" or "linear"), then
    holds it there."""

    def __init__(self, optimizer: Optimizer, swa_lr: float, anneal_epochs: int = 10, anneal_strategy: str = "cos",
                 last_epoch: int = -1) -> None:
        for value, group in zip(_format_param("swa_lr", optimizer, swa_lr), optimizer.param_groups, strict=True):
            group["swa_lr"] = value
        if anneal_strategy not in ["cos", "linear"]:
            raise ValueError(f"anneal_strategy must be one of 'cos' or 'linear', instead got {anneal_strategy}")
        self._set_anneal_func(anneal_strategy)
        if not isinstance(anneal_epochs, int) or anneal_epochs < 0:
            raise ValueError(f"anneal_epochs must be equal or greater than 0, got {anneal_epochs}")
        self.anneal_epochs = anneal_epochs
        super().__init__(optimizer, last_epoch)

    @staticmethod
    def _linear_anneal(t: float) -> float:
        return t

    @staticmethod
    def _cosine_anneal(t: float) -> float:
        return (1 - math.cos(math.pi * t)) / 2

    @staticmethod
    def _get_initial_lr(lr, swa_lr, alpha: float):
        if alpha == 1:
            return swa_lr
        return (lr - alpha * swa_lr) / (1 - alpha)

    def get_lr(self) -> list:
        self._warn_if_outside_step()
        step = self._step_count - 1
        if self.anneal_epochs == 0:
            step = max(1, step)
        prev_t = max(0, min(1, (step - 1) / max(1, self.anneal_epochs)))
        prev_alpha = self.anneal_func(prev_t)
        prev_lrs = [self._get_initial_lr(group["lr"], group["swa_lr"], prev_alpha)
                    for group in self.optimizer.param_groups]
        t = max(0, min(1, step / max(1, self.anneal_epochs)))
        alpha = self.anneal_func(t)
        return [group["swa_lr"] * alpha + lr * (1 - alpha)
                for group, lr in zip(self.optimizer.param_groups, prev_lrs, strict=True)]

    def _set_anneal_func(self, anneal_strategy: str) -> None:
        self._anneal_strategy = anneal_strategy
        self.anneal_func = self._cosine_anneal if anneal_strategy == "cos" else self._linear_anneal

    def state_dict(self) -> dict[str, Any]:
        return {key: value for key, value in self.__dict__.items() if key not in ("optimizer", "anneal_func")}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.__dict__.update(state_dict)
        self._set_anneal_func(self._anneal_strategy)

"""Optimizer: parameter groups, per-parameter state, and torch-compatible state dicts.

[Note: optimizers] An optimizer holds the parameters themselves (plain tensors flagged as parameters)
and updates them in place under ``no_grad``, so modules see new values without any re-binding. Each
algorithm's ``step`` is written as the same sequence of tensor operations as torch's single-tensor
implementation (the one torch uses on CPU), operation for operation, so that float32 rounding — and
therefore the trajectory of a training run — matches torch's. Adam and AdamW run that same sequence
compiled over a whole group on CUDA (see [Note: foreach updates] in ``optim/_foreach.py``). State dicts
follow torch's layout: ``{"state": {index: {...}}, "param_groups": [{..., "params": [index, ...]}]}``, with
parameters numbered in group order, so they round-trip through ``tilewise.save``/``load``.
"""

from __future__ import annotations

import copy
from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Any

from tilewise.autograd.grad_mode import enable_grad
from tilewise.nn.init import zeros_
from tilewise.optim._foreach import ScalarTensors, compiled
from tilewise.tensor import Tensor


class _Required:
    def __repr__(self) -> str:
        return "<required parameter>"


required = _Required()


class Optimizer:
    """Base class: subclasses pass their hyperparameter ``defaults`` and implement ``step``."""

    def __init__(self, params: Iterable[Tensor] | Iterable[dict], defaults: dict[str, Any]) -> None:
        self.defaults = defaults
        self.state: defaultdict[Tensor, dict] = defaultdict(dict)
        self.param_groups: list[dict] = []
        if isinstance(params, Tensor):
            raise TypeError("params argument given to the optimizer should be an iterable of Tensors or dicts, but "
                            "got a Tensor; wrap it in a list")
        groups = list(params)
        if not groups:
            raise ValueError("optimizer got an empty parameter list")
        if not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        for group in groups:
            self.add_param_group(group)

    def add_param_group(self, param_group: dict) -> None:
        if not isinstance(param_group, dict):
            raise TypeError(f"param_group must be a dict, but got {type(param_group).__name__}")
        group = dict(param_group)
        params = group["params"]
        group["params"] = [params] if isinstance(params, Tensor) else list(params)
        for p in group["params"]:
            if not isinstance(p, Tensor):
                raise TypeError(f"optimizer can only optimize Tensors, but one of the params is {type(p).__name__}")
            if p.grad_fn is not None:
                raise ValueError("can't optimize a non-leaf Tensor (it was computed from other tensors); optimize "
                                 "the leaf it came from, or call .detach().requires_grad_() on it")
        for name, default in self.defaults.items():
            if default is required and name not in group:
                raise ValueError(f"parameter group didn't specify a value of required optimization parameter {name}")
            group.setdefault(name, default)
        seen = {id(p) for g in self.param_groups for p in g["params"]}
        if any(id(p) in seen for p in group["params"]):
            raise ValueError("some parameters appear in more than one parameter group")
        if len({id(p) for p in group["params"]}) != len(group["params"]):
            raise ValueError("a parameter group contains the same parameter more than once")
        self.param_groups.append(group)

    def zero_grad(self, set_to_none: bool = True) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if set_to_none:
                    p.grad = None
                else:
                    p.grad.detach_()
                    zeros_(p.grad)

    def step(self, closure: Callable[[], Any] | None = None):
        raise NotImplementedError(f"{type(self).__name__} does not implement step()")

    def init_state(self) -> None:
        """Create now the state that ``step()`` would create at its first call, for every parameter that
        requires grad and has none yet, where that state does not depend on the first gradient (Adam's and
        RMSprop's zeros; SGD's momentum buffer starts as the first gradient, so SGD creates nothing here).

        ``tilewise.compile`` calls it before tracing a function that reaches this optimizer: a training step
        then traces once, with the state it will have from then on, instead of once with empty state and
        again at the second call. A parameter that never receives a gradient keeps zero state that ``step()``
        never touches."""
        for group in self.param_groups:
            for p in group["params"]:
                if p.requires_grad and not self.state.get(p):
                    self._init_param_state(p, group)

    def _init_param_state(self, p: Tensor, group: dict) -> None:
        """The state of ``p`` before its first step, where it is known before the gradient (see init_state)."""

    def _compiled(self, key, fn):
        """``fn`` compiled for this optimizer's ``key`` (a param group): see [Note: foreach updates]."""
        return compiled(self.__dict__.setdefault("_programs", {}), key, fn)

    def _scalar(self, name: str, value: float, device) -> Tensor:
        """``value`` as a 0-dim tensor on ``device`` that a compiled update reads at run time."""
        return self.__dict__.setdefault("_scalars", ScalarTensors()).get(name, value, device)

    def _evaluate(self, closure: Callable[[], Any] | None):
        if closure is None:
            return None
        with enable_grad():
            return closure()

    # ------------------------------------------------------------------ state dicts
    def state_dict(self) -> dict:
        """``{"state": {index: state}, "param_groups": [...]}`` with parameters replaced by their index."""
        index: dict[int, int] = {}
        groups = []
        for group in self.param_groups:
            packed = {k: v for k, v in group.items() if k != "params"}
            for p in group["params"]:
                index.setdefault(id(p), len(index))
            packed["params"] = [index[id(p)] for p in group["params"]]
            groups.append(packed)
        state = {index[id(p)]: s for p, s in self.state.items() if id(p) in index}
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: dict) -> None:
        state_dict = copy.deepcopy(state_dict)
        saved_groups = state_dict["param_groups"]
        if len(saved_groups) != len(self.param_groups):
            raise ValueError(f"loaded state dict has {len(saved_groups)} parameter groups, but the optimizer has "
                             f"{len(self.param_groups)}")
        for k, (group, saved) in enumerate(zip(self.param_groups, saved_groups)):
            if len(group["params"]) != len(saved["params"]):
                raise ValueError(f"loaded state dict contains a parameter group {k} with {len(saved['params'])} "
                                 f"parameters, but the optimizer's group {k} has {len(group['params'])}")
        by_index = {i: p for saved, group in zip(saved_groups, self.param_groups)
                    for i, p in zip(saved["params"], group["params"])}
        self.state = defaultdict(dict)
        for i, value in state_dict["state"].items():
            param = by_index.get(int(i))
            if param is not None:
                self.state[param] = {k: _match(param, k, v) for k, v in value.items()}
        for group, saved in zip(self.param_groups, saved_groups):
            group.update({k: v for k, v in saved.items() if k != "params"})

    def __getstate__(self) -> dict:
        return {"defaults": self.defaults, "state": self.state, "param_groups": self.param_groups}

    def __repr__(self) -> str:
        lines = [f"{type(self).__name__} ("]
        for k, group in enumerate(self.param_groups):
            lines.append(f"Parameter Group {k}")
            lines += [f"    {key}: {group[key]}" for key in sorted(group) if key != "params"]
        lines.append(")")
        return "\n".join(lines)


def _match(param: Tensor, key: str, value):
    """State tensors follow their parameter's device, and its dtype when floating (``step`` stays as saved).
    Tensors of another framework (a torch optimizer's state dict) come in through DLPack."""
    if not isinstance(value, Tensor) and hasattr(value, "__dlpack__"):
        from tilewise._dlpack import from_dlpack

        value = from_dlpack(value.detach() if hasattr(value, "detach") else value).clone()
    if not isinstance(value, Tensor):
        return value
    if key == "step" or not value.is_floating_point():
        return value.to(param.device)
    return value.to(device=param.device, dtype=param.dtype)

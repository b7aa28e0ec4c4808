"""Optimizer: parameter groups, per-parameter state, step hooks and torch-compatible state dicts.

[Note: optimizers] An optimizer holds the parameters themselves (plain tensors flagged as parameters)
and updates them in place under ``no_grad``, so modules see new values without any re-binding. Each
algorithm's update is one function over the lists of a group's parameters, gradients and state, written as
the same sequence of tensor operations as torch's single-tensor implementation (the one torch uses on CPU),
operation for operation, so that float32 rounding — and therefore the trajectory of a training run —
matches torch's. ``foreach``/``fused`` run that same function compiled over the whole group (see
[Note: foreach updates] in ``optim/_foreach.py``). Whatever depends on the step count (bias corrections,
decayed learning rates) is a float64 tensor expression of a step tensor on the parameter's device, computed
as torch computes it from the step's Python value: no value is read back to the host, so ``tilewise.compile``
captures a whole training step, and ``capturable`` needs nothing more. Where torch's arithmetic meets a tensor
instead (a tensor ``lr`` or betas, differentiable Adam's float32 step), it stays in that tensor's dtype, and so does
ours (``in_dtype_of_lr``, ``rounded_power``). State dicts follow torch's layout:
``{"state": {index: {...}}, "param_groups": [{..., "params": [index, ...]}]}``, with parameters numbered in
group order, so they round-trip through ``tilewise.save``/``load`` and a torch optimizer's state dict loads.

[Note: learning rates in compiled steps] A scheduler (or a trainer that sets ``param_group["lr"]`` itself, as
nanoGPT does) gives the optimizer a new learning rate at every step. A compiled training step read it as a number,
baked it into its program and guarded it by value, so it recompiled at every step and ran eagerly past the
recompile limit. Before a trace, ``init_state`` makes each group's rate a 0-dim tensor (the one the compiled
multi-tensor update reads, ``_scalar``); the update traced inside a compiled step reads that tensor, so the
program reads the rate from memory at run time; the compiled function refills the tensors from the param groups
before every call it admits (``refresh_runtime_hyperparameters``) and guards those rates by type only. An
optimizer whose ``step`` reads ``group["lr"]`` itself (one written outside tilewise) keeps the guard by value.
"""

from __future__ import annotations

import functools
import warnings
from collections import OrderedDict, defaultdict
from collections.abc import Callable, Iterable
from itertools import chain
from typing import Any

from tilewise import dtypes
from tilewise.autograd.grad_mode import enable_grad, set_grad_enabled
from tilewise.dispatch import STATE
from tilewise.nn.init import zeros_
from tilewise.ops.creation import zeros_like
from tilewise.ops.registry import OPS
from tilewise.optim._foreach import ScalarTensors, compiled, use_compiled
from tilewise.tensor import Tensor
from tilewise.utils.hooks import RemovableHandle

FUSED_DEVICES = ("cpu", "cuda")  # where ``fused=True`` runs: the compiler's targets

_global_step_pre_hooks: OrderedDict[int, Callable] = OrderedDict()
_global_step_post_hooks: OrderedDict[int, Callable] = OrderedDict()


def register_optimizer_step_pre_hook(hook: Callable) -> RemovableHandle:
    """A hook run before every optimizer's ``step``: ``hook(optimizer, args, kwargs) -> None or (args, kwargs)``."""
    handle = RemovableHandle(_global_step_pre_hooks)
    _global_step_pre_hooks[handle.id] = hook
    return handle


def register_optimizer_step_post_hook(hook: Callable) -> RemovableHandle:
    """A hook run after every optimizer's ``step``: ``hook(optimizer, args, kwargs) -> None``."""
    handle = RemovableHandle(_global_step_post_hooks)
    _global_step_post_hooks[handle.id] = hook
    return handle


class _Required:
    def __repr__(self) -> str:
        return "<required parameter>"


required = _Required()


def _with_step_hooks(step: Callable) -> Callable:
    """``step`` run between the global and the optimizer's own pre- and post-hooks (once, however many
    subclasses' ``step`` methods call each other through ``super()``)."""

    @functools.wraps(step)
    def hooked(self, *args, **kwargs):
        # flags live in __dict__ directly: tilewise.compile takes an attribute assignment on an object the
        # trace reached for a side effect that a replay would miss
        flags = self.__dict__
        if flags.get("_in_step"):
            return step(self, *args, **kwargs)
        for hook in chain(_global_step_pre_hooks.values(), self._optimizer_step_pre_hooks.values()):
            result = hook(self, args, kwargs)
            if result is not None:
                if not (isinstance(result, tuple) and len(result) == 2):
                    raise RuntimeError(f"{step} must return None or a tuple of (new_args, new_kwargs), but got "
                                       f"{result}.")
                args, kwargs = result
        flags["_in_step"] = True
        try:
            out = step(self, *args, **kwargs)
        finally:
            flags["_in_step"] = False
        for hook in chain(self._optimizer_step_post_hooks.values(), _global_step_post_hooks.values()):
            hook(self, args, kwargs)
        return out

    hooked.hooked = True
    return hooked


def grad_mode_of_differentiable(step: Callable) -> Callable:
    """Run ``step`` with autograd recording only where the optimizer was built with ``differentiable=True`` (then
    the update is part of the graph, as in torch), and under ``no_grad`` otherwise."""

    @functools.wraps(step)
    def run(self, *args, **kwargs):
        with set_grad_enabled(bool(self.defaults.get("differentiable", False))):
            return step(self, *args, **kwargs)

    return run


class Optimizer:
    """Base class: subclasses pass their hyperparameter ``defaults`` and implement ``step``.

    >>> import tilewise as tw
    >>> p = tw.nn.Parameter(tw.ones(2)); p.grad = tw.ones(2)
    >>> opt = tw.optim.SGD([p], lr=0.5)
    >>> handle = opt.register_step_post_hook(lambda o, args, kwargs: print("stepped"))
    >>> opt.step()
    stepped
    """

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        step = cls.__dict__.get("step")
        if step is not None and not getattr(step, "hooked", False):
            cls.step = _with_step_hooks(step)

    def __init__(self, params: Iterable[Tensor] | Iterable[dict], defaults: dict[str, Any]) -> None:
        self.defaults = defaults
        self._init_hooks()
        if isinstance(params, Tensor):
            raise TypeError("params argument given to the optimizer should be an iterable of Tensors or dicts, but "
                            f"got {params.type()}")
        self.state: defaultdict[Tensor, dict] = defaultdict(dict)
        self.param_groups: list[dict] = []
        groups = list(params)
        if not groups:
            raise ValueError("optimizer got an empty parameter list")
        if not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        for group in groups:
            self.add_param_group(group)

    def _init_hooks(self) -> None:
        for name in ("_optimizer_step_pre_hooks", "_optimizer_step_post_hooks", "_optimizer_state_dict_pre_hooks",
                     "_optimizer_state_dict_post_hooks", "_optimizer_load_state_dict_pre_hooks",
                     "_optimizer_load_state_dict_post_hooks"):
            if name not in self.__dict__:
                setattr(self, name, OrderedDict())

    # ------------------------------------------------------------------ parameter groups
    def add_param_group(self, param_group: dict) -> None:
        """Add a group of parameters (a dict with ``"params"`` and any hyperparameters that differ from the
        defaults), e.g. layers unfrozen during fine-tuning."""
        if not isinstance(param_group, dict):
            raise TypeError(f"param_group must be a dict, but got {type(param_group).__name__}")
        params = param_group["params"]
        if isinstance(params, Tensor):
            params = [params]
        elif isinstance(params, (set, frozenset)):
            raise TypeError("optimizer parameters need to be organized in ordered collections, but the ordering of "
                            "tensors in sets will change between runs. Please use a list instead.")
        else:
            params = list(params)
        names = [p[0] for p in params if isinstance(p, tuple)]
        param_group["params"] = [p[1] if isinstance(p, tuple) else p for p in params]
        if names:
            if len(names) != len(params):
                raise ValueError("all optimizer params should be with/without names. Some param names are missing")
            param_group["param_names"] = names
        for p in param_group["params"]:
            self._check_param(p)
        for name, default in self.defaults.items():
            if default is required and name not in param_group:
                raise ValueError(f"parameter group didn't specify a value of required optimization parameter {name}")
            param_group.setdefault(name, default)
        if len({id(p) for p in param_group["params"]}) != len(param_group["params"]):
            warnings.warn("optimizer contains a parameter group with duplicate parameters; in future, this will "
                          "cause an error; see github.com/pytorch/pytorch/issues/40967 for more information",
                          stacklevel=3)
        seen: set[int] = set()
        for group in self.param_groups:
            seen.update(id(p) for p in group["params"])
            if ("param_names" in param_group) != ("param_names" in group):
                kind = "with names" if "param_names" in param_group else "without names"
                raise ValueError("all optimizer param groups should be with/without names. cannot add param group "
                                 f"{kind} to the optimizer")
        if any(id(p) in seen for p in param_group["params"]):
            raise ValueError("some parameters appear in more than one parameter group")
        self.param_groups.append(param_group)

    def _check_param(self, p) -> None:
        if not isinstance(p, Tensor):
            raise TypeError(f"optimizer can only optimize Tensors, but one of the params is {type(p).__name__}")
        if not self.defaults.get("differentiable") and not (p.is_leaf or p.retains_grad):
            raise ValueError("can't optimize a non-leaf Tensor (it was computed from other tensors); optimize the "
                             "leaf it came from, call .detach().requires_grad_() on it, or pass differentiable=True "
                             "to update it as part of the autograd graph")

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Drop every parameter's gradient (``set_to_none=True``) or zero it in place."""
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if set_to_none:
                    p.grad = None
                else:
                    if p.grad._grad_fn is not None:
                        p.grad.detach_()
                    else:
                        p.grad.requires_grad_(False)
                    zeros_(p.grad)

    def step(self, closure: Callable[[], Any] | None = None):
        raise NotImplementedError(f"{type(self).__name__} does not implement step()")

    # ------------------------------------------------------------------ state before the first step
    def init_state(self) -> None:
        """Create now the state that ``step()`` would create at its first call, for every parameter that
        requires grad and has none yet, where that state does not depend on the first gradient (Adam's and
        RMSprop's zeros; SGD's momentum buffer starts as the first gradient, so SGD creates nothing here).

        ``tilewise.compile`` calls it before tracing a function that reaches this optimizer: a training step
        then traces once, with the state it will have from then on, instead of once with empty state and
        again at the second call. A parameter that never receives a gradient keeps zero state that ``step()``
        never touches."""
        for k, group in enumerate(self.param_groups):
            for p in group["params"]:
                if p.requires_grad and not self.state.get(p):
                    self._init_param_state(p, group)
            trained = [p for p in group["params"] if p.requires_grad]
            if trained and not isinstance(group["lr"], Tensor):  # see [Note: learning rates in compiled steps]
                self._scalar(f"lr{k}", group["lr"], trained[0].device)

    def _init_param_state(self, p: Tensor, group: dict) -> None:
        """The state of ``p`` before its first step, where it is known before the gradient (see init_state)."""

    @staticmethod
    def _step_tensor(p: Tensor) -> Tensor:
        """A new step count: a 0-dim tensor on ``p``'s device (a compiled step reads no host tensor), float32, or
        float64 when that is the default dtype (torch's scalar dtype)."""
        from tilewise.ops.creation import zeros

        dtype = dtypes.float64 if dtypes.get_default_dtype() is dtypes.float64 else dtypes.float32
        return zeros((), dtype=dtype, device=p.device)

    # ------------------------------------------------------------------ running an update over a group
    # torch's elementwise optimizers update a complex parameter, its gradient and its state as their real views
    # (view_as_real): a pair of real numbers each, so Adam's second moment is |re|^2 and |im|^2, not a complex square
    _complex_as_real = True

    def _update_group(self, k: int, group: dict, update: Callable, tensors: tuple, hyper: tuple) -> None:
        """``update(*tensors, lr, *hyper)`` over the parameters of group ``k`` that have gradients: compiled over
        the whole list where ``foreach``/``fused`` ask for it (see [Note: foreach updates]), else torch's
        per-parameter loop. ``tensors[0]`` is the list of parameters."""
        params = tensors[0]
        if not params:
            return
        if group.get("fused"):
            check_fused(params)
            hyper = tuple(_as_fused_reads_it(group, value) for value in hyper)
            update = as_fused_runs_it(group, update, params, len(tensors))
        if self._complex_as_real and any(p.is_complex() for p in params):
            # the loop, over the real views: a compiled multi-tensor program takes no view of another dtype's storage
            update(*(_as_real(ts) for ts in tensors), self._traced_lr(k, group, params[0].device), *hyper)
            return
        if use_compiled(self._multi_tensor_choice(group), params):
            lr = group["lr"]  # a number becomes a 0-dim tensor the program reads; a tensor is read as it is
            lr = lr if isinstance(lr, Tensor) else self._scalar(f"lr{k}", lr, params[0].device)
            self._compiled((k, update), update)(*tensors, _as_fused_reads_it(group, lr), *hyper)
        else:
            update(*tensors, _as_fused_reads_it(group, self._traced_lr(k, group, params[0].device)), *hyper)

    def _traced_lr(self, k: int, group: dict, device):
        """The learning rate a (looped) update of group ``k`` reads: inside a function being compiled, the group's
        0-dim learning-rate tensor when it was made before the trace (``init_state``), so the program reads the
        rate at run time and a scheduler's new rate does not recompile it (see [Note: learning rates in compiled
        steps]); else the group's value as it is."""
        lr = group["lr"]
        if isinstance(lr, Tensor) or not STATE.trace_depth:
            return lr
        held = self.__dict__.get("_scalars")
        found = held.find(f"lr{k}", lr, device) if held is not None else None
        if found is None:
            return lr
        self.__dict__.setdefault("_runtime_lr", {})[k] = device
        return found

    def refresh_runtime_hyperparameters(self) -> None:
        """Refill the learning-rate tensors compiled steps read at run time from the param groups (a scheduler
        changes the numbers); a compiled function calls it before each call it admits."""
        for k, device in self.__dict__.get("_runtime_lr", {}).items():
            if k < len(self.param_groups):
                lr = self.param_groups[k]["lr"]
                if not isinstance(lr, Tensor):
                    self._scalar(f"lr{k}", lr, device)

    def runtime_hyperparameters(self) -> dict:
        """{group index: the device of its learning-rate tensor} for the groups whose rate compiled steps read at
        run time: the compiler guards these rates by type, not by value."""
        return self.__dict__.get("_runtime_lr", {})

    _loops_when_differentiable = False  # SGD: torch's multi-tensor SGD records autograd, so a loop stands in

    def _multi_tensor_choice(self, group: dict) -> bool | None:
        choice = group["fused"] if group.get("fused") is not None else group.get("foreach")
        if group.get("differentiable") and choice:
            if self._loops_when_differentiable:
                return False
            raise RuntimeError(f"{type(self).__name__}: foreach=True (or fused=True) does not support "
                               "differentiable=True: the multi-tensor update is compiled and autograd does not record "
                               "through it; pass foreach=False")
        return choice

    def _compiled(self, key, fn):
        """``fn`` compiled for this optimizer's ``key`` (a param group): see [Note: foreach updates]."""
        return compiled(self.__dict__.setdefault("_programs", {}), key, fn)

    def _scalar(self, name: str, value: float, device) -> Tensor:
        """``value`` as a 0-dim tensor on ``device`` that a compiled update reads at run time."""
        return self.__dict__.setdefault("_scalars", ScalarTensors()).get(name, value, device)

    # the per-parameter buffers a step-counting optimizer keeps (zeros like the parameter), and the names of the
    # state lists and group hyperparameters its update function takes after the parameters and gradients
    buffers: tuple[str, ...] = ()
    state_args: tuple[str, ...] = ()
    hyper_args: tuple[str, ...] = ()

    def _buffered_state(self, p: Tensor, group: dict) -> dict:
        """The state of ``p`` (in ``group``): a step count and ``buffers``, made on its first step (``_more_state``
        adds any other entry)."""
        state = self.state[p]
        if not state:
            state["step"] = self._step_tensor(p)
            self._more_state(state, p, group)
            for name in self.buffers:
                state[name] = zeros_like(p)
        return state

    def _more_state(self, state: dict, p: Tensor, group: dict) -> None:
        """Entries of a new state besides the step count and ``buffers``."""

    def _step_groups(self, closure, update: Callable):
        """``step`` of an optimizer declared by ``buffers``/``state_args``/``hyper_args``: ``update(params, grads,
        *state lists, lr, *hyperparameters)`` over each group's parameters that have gradients."""
        loss = self._evaluate(closure)
        for k, group in enumerate(self.param_groups):
            params = [p for p in group["params"] if p.grad is not None]
            states = [self._buffered_state(p, group) for p in params]
            # a state list may hold None where a parameter lacks that entry (Adafactor: a vector has no row_var)
            tensors = (params, [p.grad for p in params], *([s.get(name) for s in states] for name in self.state_args))
            self._update_group(k, group, update, tensors, tuple(group[name] for name in self.hyper_args))
        return loss

    def _evaluate(self, closure: Callable[[], Any] | None):
        if closure is None:
            return None
        with enable_grad():
            return closure()

    # ------------------------------------------------------------------ hooks
    def register_step_pre_hook(self, hook: Callable) -> RemovableHandle:
        """``hook(optimizer, args, kwargs) -> None or (args, kwargs)`` runs before each ``step``."""
        return _register(self._optimizer_step_pre_hooks, hook)

    def register_step_post_hook(self, hook: Callable) -> RemovableHandle:
        """``hook(optimizer, args, kwargs) -> None`` runs after each ``step``."""
        return _register(self._optimizer_step_post_hooks, hook)

    def register_state_dict_pre_hook(self, hook: Callable, prepend: bool = False) -> RemovableHandle:
        """``hook(optimizer) -> None`` runs before ``state_dict`` builds its dict."""
        return _register(self._optimizer_state_dict_pre_hooks, hook, prepend)

    def register_state_dict_post_hook(self, hook: Callable, prepend: bool = False) -> RemovableHandle:
        """``hook(optimizer, state_dict) -> state_dict or None`` runs on the dict ``state_dict`` returns."""
        return _register(self._optimizer_state_dict_post_hooks, hook, prepend)

    def register_load_state_dict_pre_hook(self, hook: Callable, prepend: bool = False) -> RemovableHandle:
        """``hook(optimizer, state_dict) -> state_dict or None`` runs on the dict before it is loaded."""
        return _register(self._optimizer_load_state_dict_pre_hooks, hook, prepend)

    def register_load_state_dict_post_hook(self, hook: Callable, prepend: bool = False) -> RemovableHandle:
        """``hook(optimizer) -> None`` runs after ``load_state_dict``."""
        return _register(self._optimizer_load_state_dict_post_hooks, hook, prepend)

    # ------------------------------------------------------------------ state dicts
    def state_dict(self) -> dict:
        """``{"state": {index: state}, "param_groups": [...]}`` with parameters replaced by their index."""
        for hook in self._optimizer_state_dict_pre_hooks.values():
            hook(self)
        index: dict[int, int] = {}
        start = 0
        groups = []
        for group in self.param_groups:
            packed = {k: v for k, v in group.items() if k != "params"}
            for i, p in enumerate(group["params"], start):
                index.setdefault(id(p), i)
            packed["params"] = [index[id(p)] for p in group["params"]]
            start += len(packed["params"])
            groups.append(packed)
        state = {(index[id(p)] if isinstance(p, Tensor) else p): s for p, s in self.state.items()
                 if not isinstance(p, Tensor) or id(p) in index}
        state_dict = {"state": state, "param_groups": groups}
        for hook in self._optimizer_state_dict_post_hooks.values():
            result = hook(self, state_dict)
            if result is not None:
                state_dict = result
        return state_dict

    def load_state_dict(self, state_dict: dict) -> None:
        """Load a dict from ``state_dict`` (this optimizer's, or torch's same optimizer's: its tensors come in
        through DLPack). State tensors move to their parameter's device, and to its dtype when floating."""
        import copy

        state_dict = dict(state_dict)
        for hook in self._optimizer_load_state_dict_pre_hooks.values():
            result = hook(self, state_dict)
            if result is not None:
                state_dict = result
        saved_groups = copy.deepcopy(state_dict["param_groups"])
        if len(saved_groups) != len(self.param_groups):
            raise ValueError(f"loaded state dict has a different number of parameter groups ({len(saved_groups)} "
                             f"saved, {len(self.param_groups)} in the optimizer)")
        for k, (group, saved) in enumerate(zip(self.param_groups, saved_groups)):
            if len(group["params"]) != len(saved["params"]):
                raise ValueError("loaded state dict contains a parameter group that doesn't match the size of "
                                 f"optimizer's group (group {k}: {len(saved['params'])} parameters saved, "
                                 f"{len(group['params'])} in the optimizer)")
        by_index = dict(zip(chain.from_iterable(g["params"] for g in saved_groups),
                            chain.from_iterable(g["params"] for g in self.param_groups)))
        device_step = {p: bool(g.get("capturable") or g.get("fused")) for g in saved_groups for p in g["params"]}
        state: defaultdict = defaultdict(dict)
        for key, value in state_dict["state"].items():
            param = by_index.get(key)
            if param is None:
                state[key] = copy.deepcopy(value)
            else:
                state[param] = {name: _match(param, name, v, device_step.get(key, False))
                                for name, v in value.items()}
        for group, saved in zip(self.param_groups, saved_groups):
            saved["params"] = group["params"]
            if "param_names" in group and "param_names" not in saved:
                saved["param_names"] = group["param_names"]
        self.__setstate__({"state": state, "param_groups": saved_groups})
        for hook in self._optimizer_load_state_dict_post_hooks.values():
            hook(self)

    def __getstate__(self) -> dict:
        return {"defaults": self.defaults, "state": self.state, "param_groups": self.param_groups}

    # what torch's per-optimizer __setstate__ fills in for a checkpoint written before newer options existed: the
    # group entries it lacks (name, value; in torch's order), entries set whatever the checkpoint says (AdamW's
    # decoupled weight decay), and the state entries older versions kept as Python numbers (now 0-dim tensors)
    backfilled_options: tuple[tuple[str, Any], ...] = ()
    forced_options: tuple[tuple[str, Any], ...] = ()
    number_state: tuple[str, ...] = ()

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._init_hooks()
        self.defaults.setdefault("differentiable", False)
        self.__dict__.pop("_programs", None)  # compiled for the tensors held before
        for group in self.param_groups:
            for name, value in self.backfilled_options:
                group.setdefault(name, value)
            group.update(self.forced_options)
            for p in group["params"]:
                self._numbers_to_tensors(self.state.get(p), p)

    def _numbers_to_tensors(self, state: dict | None, p: Tensor) -> None:
        for name in self.number_state if state else ():
            if name in state and not isinstance(state[name], Tensor):
                state[name] = self._step_tensor(p).fill_(float(state[name]))

    def __repr__(self) -> str:
        text = f"{type(self).__name__} ("
        for k, group in enumerate(self.param_groups):  # torch's layout: a blank line between groups
            text += f"\nParameter Group {k}\n"
            text += "".join(f"    {key}: {group[key]}\n" for key in sorted(group) if key != "params")
        return text + ")"


def _as_fused_reads_it(group: dict, value):
    """A learning rate or hyperparameter as the update reads it: torch's fused kernels read a tensor ``lr`` (or
    tensor betas) as a double, so with ``fused=True`` the step sizes made from a float32 one are float64 (its loop
    keeps them in float32). Tuples (betas) are walked."""
    if not group.get("fused"):
        return value
    if isinstance(value, tuple):
        return tuple(_as_fused_reads_it(group, v) for v in value)
    if isinstance(value, Tensor) and value.dtype is not dtypes.float64:
        return value.double()
    return value


_HALF_DTYPES = (dtypes.float16, dtypes.bfloat16)


def as_fused_runs_it(group: dict, update: Callable, params: list[Tensor], lists: int) -> Callable:
    """``update`` (over ``lists`` lists of tensors) as torch runs it for ``group``: with ``fused=True`` over half
    precision parameters, in float32 (see _in_float32); else as it is."""
    if group.get("fused") and any(p.dtype in _HALF_DTYPES for p in params):
        return _in_float32(update, lists)
    return update


@functools.cache
def _in_float32(update: Callable, lists: int) -> Callable:
    """``update`` as torch's fused kernels run it on half-precision tensors: every one of its ``lists`` of tensors
    read as float32, the whole update computed there, and each tensor it wrote rounded back once (the loop rounds
    after every operation). One function per ``update``, so a compiled program made from it is kept."""

    def run(*args):
        narrow = args[:lists]
        wide = [None if ts is None else [_widened(t) for t in ts] for ts in narrow]
        update(*wide, *args[lists:])
        for ts, ws in zip(narrow, wide):
            for i, w in enumerate(ws or ()):
                if ts[i] is None:  # made by the update (SGD's first momentum buffer): in its parameter's dtype
                    ts[i] = None if w is None else w.to(narrow[0][i].dtype)
                elif w is not ts[i]:
                    ts[i].copy_(w)

    return run


def _widened(t):
    return t.float() if t is not None and t.dtype in _HALF_DTYPES else t


def _register(hooks: OrderedDict, hook: Callable, prepend: bool = False) -> RemovableHandle:
    handle = RemovableHandle(hooks)
    hooks[handle.id] = hook
    if prepend:
        hooks.move_to_end(handle.id, last=False)
    return handle


def check_implementation_flags(fused: bool | None, foreach: bool | None, differentiable: bool) -> None:
    """torch's refusals of ``fused`` combined with the other implementation flags."""
    if fused:
        if differentiable:
            raise RuntimeError("`fused` does not support `differentiable`")
        if foreach:
            raise RuntimeError("`fused` and `foreach` cannot be `True` together.")


def check_fused(params: list[Tensor]) -> None:
    """torch's refusal, at the first step, of ``fused=True`` for a parameter that is not floating point."""
    for p in params:
        if p.device.type not in FUSED_DEVICES or not p.is_floating_point():
            raise RuntimeError("`fused=True` requires all the params to be floating point Tensors of supported "
                               f"devices: {list(FUSED_DEVICES)} but {p.dtype} and {p.device.type}")


def check_lr(lr) -> None:
    if isinstance(lr, Tensor) and lr.numel() != 1:
        raise ValueError("Tensor lr must be 1-element")
    if not 0.0 <= lr:
        raise ValueError(f"Invalid learning rate: {lr}")


def check_non_negative(**values: float) -> None:
    """torch's ``Invalid <name> value`` errors, for hyperparameters that must be >= 0."""
    for name, value in values.items():
        if not 0.0 <= value:
            raise ValueError(f"Invalid {name} value: {value}")


def check_betas(betas) -> None:
    for k, beta in enumerate(betas[:2]):
        if not 0.0 <= beta < 1.0:
            raise ValueError(f"Invalid beta parameter at index {k}: {beta}")


def in_dtype_of_lr(lr, value):
    """``value``, a float64 factor that torch computes as a Python number, as torch meets it with a tensor ``lr``:
    rounded to ``lr``'s dtype (a Python number meets a float32 tensor in float32), so that the step size, read
    back as a number by torch, is the float32 one; unchanged with a number ``lr``."""
    return value.to(lr.dtype) if isinstance(lr, Tensor) and isinstance(value, Tensor) else value


def rounded_power(base, exponent: Tensor, dtype=None) -> Tensor:
    """``base ** exponent`` in ``dtype`` (the dtype of a tensor ``base``, else of ``exponent``) as torch's 0-dim pow
    gives it: the base rounded to that dtype, the power taken in float64 and rounded once. (numpy's float32 power
    rounds differently from torch's in about a fifth of cases, enough to move a step size in its last bit.)"""
    dtype = dtype or (base.dtype if isinstance(base, Tensor) else exponent.dtype)
    if not isinstance(base, Tensor):
        base = OPS["full"]((), base, dtype=dtype, device=exponent.device)
    return (base.double() ** exponent.double()).to(dtype)


def add_scaled(p: Tensor, t: Tensor, scale) -> None:
    """``p += scale * t``: torch's ``p.add_(t, alpha=scale)``; a tensor ``scale`` (a learning rate or a step-size
    expression, see [Note: optimizers]) rounds to ``p``'s dtype as the Python number would."""
    if isinstance(scale, Tensor):  # one rounding, as the number's add_ (a fused multiply-add, as torch's kernels)
        p.copy_(OPS["fma"](t, scale, p))
    else:
        p.add_(t, alpha=scale)


def add_scaled_ratio(p: Tensor, num: Tensor, den: Tensor, scale) -> None:
    """``p += scale * num / den``: torch's ``p.addcdiv_(num, den, value=scale)``, ``scale`` a number or a 0-dim
    tensor."""
    if isinstance(scale, Tensor):
        p.add_(num * scale / den)
    else:
        p.addcdiv_(num, den, value=scale)


def _match(param: Tensor, key, value, device_step: bool = False):
    """A loaded state value for ``param``, as torch's ``_process_value_according_to_param_policy``: tensors follow
    their parameter's device, and its dtype when floating, and are the loaded tensors themselves where they already
    do (as torch's, an optimizer loading another's live state shares it); ``step`` stays as loaded, unless its group
    is ``capturable`` or ``fused`` (``device_step``): then a float32 tensor on the parameter's device. Lists, tuples
    and dicts of them are walked. Tensors of another framework (a torch optimizer's state dict) come in through
    DLPack, copied."""
    if isinstance(value, dict):
        return {k: _match(param, k, v, device_step) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_match(param, None, v, device_step) for v in value)
    if not isinstance(value, Tensor) and hasattr(value, "__dlpack__"):
        from tilewise._dlpack import from_dlpack

        # another framework's live state: copied, never shared with it
        return _match(param, key, from_dlpack(value.detach() if hasattr(value, "detach") else value).clone(),
                      device_step)
    if not isinstance(value, Tensor):
        return value
    if key == "step":
        return value.to(dtype=dtypes.float32, device=param.device) if device_step else value
    if not param.is_floating_point():
        return value.to(param.device)
    return value.to(device=param.device, dtype=param.dtype)


def _as_real(tensors):
    """A list of a group's tensors with each complex one as its real view (``view_as_real``); None and lists of
    None (a state a parameter lacks) as they are."""
    if tensors is None:
        return None
    return [OPS["view_as_real"](t) if t is not None and t.is_complex() else t for t in tensors]

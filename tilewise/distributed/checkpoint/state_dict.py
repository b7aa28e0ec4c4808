"""torch.distributed.checkpoint.state_dict's helpers: a model's and an optimizer's state as sharded or full
state dicts, keyed by parameter names, and the way back.

[Note: state dict helpers] An optimizer's own state dict numbers parameters by position, which says nothing
once the model is sharded differently; these helpers key the optimizer's state by the parameters' dotted names
(``{"state": {"blocks.0.fc1.weight": {...}}, "param_groups": [{"params": [names], ...}]}``), as torch's do.
Sharded (the default): tensors stay this rank's shards, marked with their place in the full tensor, ready for
``checkpoint.save``. ``full_state_dict=True``: shards are gathered (a collective: call on every rank) into full
tensors; with ``cpu_offload=True`` only rank 0 keeps them (on the CPU) and the other ranks get ``{}``, which is
what ``tilewise.save`` on rank 0 wants. ``set_*`` take either form and give each rank its rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tilewise.autograd.grad_mode import no_grad
from tilewise.distributed.fsdp.param_group import mark_shard
from tilewise.tensor import Tensor


def _dist():
    import tilewise.distributed as dist  # the package imports this module, so it is read at call time

    return dist


@dataclass
class StateDictOptions:
    """torch's options: ``full_state_dict`` gathers full tensors; ``cpu_offload`` keeps them on rank 0's CPU
    only; ``ignore_frozen_params`` leaves out parameters that do not require grad; ``strict`` is passed to
    ``load_state_dict``; ``broadcast_from_rank0`` (full state on rank 0 only, sent to the others on set)."""

    full_state_dict: bool = False
    cpu_offload: bool = False
    ignore_frozen_params: bool = False
    keep_submodule_prefixes: bool = True
    strict: bool = True
    broadcast_from_rank0: bool = False
    flatten_optimizer_state_dict: bool = False


def _spec(t: Tensor):
    return t.__dict__.get("_fsdp_shard")


def _is_rank0(spec=None) -> bool:
    dist = _dist()
    return not dist.is_initialized() or dist.get_rank(spec.group if spec is not None else None) == 0


def _full(value: Tensor, options: StateDictOptions) -> Tensor:
    """The full tensor a (marked) shard is part of; a plain tensor as it is."""
    spec = _spec(value)
    full = value.full_tensor() if spec is not None else value.detach()
    return full.to("cpu") if options.cpu_offload else full


def _present(state: dict, options: StateDictOptions) -> dict:
    """``state`` as asked: shards as they are, or full tensors (on every rank, or on rank 0 only)."""
    if not options.full_state_dict:
        return state
    full = _map(state, lambda t: _full(t, options))
    return full if not options.cpu_offload or _is_rank0() else {}


def _map(value, fn):
    if isinstance(value, Tensor):
        return fn(value)
    if isinstance(value, dict):
        return {k: _map(v, fn) for k, v in value.items()}
    return value


def get_model_state_dict(model, *, submodules=None, options: StateDictOptions | None = None) -> dict[str, Any]:
    """The model's parameters and buffers by dotted name: this rank's marked shards, or full tensors
    (``options.full_state_dict``; a collective then)."""
    options = options or StateDictOptions()
    if submodules is not None:
        raise NotImplementedError("get_model_state_dict(submodules=...) is not supported; pass the whole model")
    state = model.state_dict()
    if options.ignore_frozen_params:
        frozen = {name for name, p in model.named_parameters() if not p.requires_grad}
        state = {k: v for k, v in state.items() if k not in frozen}
    return _present(dict(state), options)


def _names_of(model) -> dict[int, str]:
    return {id(p): name for name, p in model.named_parameters()}


def _init_optim_state(optim) -> None:
    """Give every parameter its state, as torch does before reading an optimizer that has not stepped: one step
    with zero gradients and a zero learning rate, which changes no parameter."""
    if optim.state:
        return
    params = [p for g in optim.param_groups for p in g["params"] if p.requires_grad]
    grads = [p.grad for p in params]
    lrs = [g["lr"] for g in optim.param_groups]
    from tilewise.ops.creation import zeros_like

    for p in params:
        if p.grad is None:
            p.grad = zeros_like(p)
    for g in optim.param_groups:
        g["lr"] = 0.0
    try:
        optim.step()
    finally:
        for g, lr in zip(optim.param_groups, lrs):
            g["lr"] = lr
        for p, grad in zip(params, grads):
            p.grad = grad


def get_optimizer_state_dict(model, optimizers, *, submodules=None,
                             options: StateDictOptions | None = None) -> dict[str, Any]:
    """The optimizer's state keyed by parameter names; state tensors of a sharded parameter are shards like it
    (marked), or gathered with ``options.full_state_dict``."""
    options = options or StateDictOptions()
    optims = optimizers if isinstance(optimizers, (list, tuple)) else [optimizers]
    names = _names_of(model)
    state: dict[str, dict] = {}
    groups: list[dict] = []
    for optim in optims:
        _init_optim_state(optim)
        for p, s in optim.state.items():
            spec = _spec(p)
            state[names[id(p)]] = {k: _marked_like(v, p, spec) for k, v in s.items()}
        for g in optim.state_dict()["param_groups"]:
            params = [p for group in optim.param_groups for p in group["params"]]
            groups.append({**g, "params": [names[id(params[i])] for i in g["params"]]})
    return _present({"state": state, "param_groups": groups}, options)


def _marked_like(value, param: Tensor, spec):
    """A state tensor shaped like a sharded parameter is a shard of the same rows."""
    if not isinstance(value, Tensor):
        return value
    value = value.detach()
    if spec is not None and value.dim() and tuple(value.shape) == tuple(param.shape):
        mark_shard(value, spec)
    return value


def get_state_dict(model, optimizers, *, submodules=None, options: StateDictOptions | None = None):
    """``(get_model_state_dict(model), get_optimizer_state_dict(model, optimizers))``."""
    return (get_model_state_dict(model, submodules=submodules, options=options),
            get_optimizer_state_dict(model, optimizers, submodules=submodules, options=options))


def _local(value, target: Tensor | None):
    """``value`` cut to what ``target`` holds: its rows if ``target`` is a shard and ``value`` the full tensor."""
    if not isinstance(value, Tensor) or target is None:
        return value
    spec = _spec(target)
    if spec is None or tuple(value.shape) == tuple(target.shape) or tuple(value.shape) != spec.full_shape:
        return value
    return value[spec.start:spec.stop]


def set_model_state_dict(model, model_state_dict: dict, *, options: StateDictOptions | None = None):
    """Load a sharded or full model state dict into a (possibly sharded) model; returns ``load_state_dict``'s
    missing and unexpected keys."""
    options = options or StateDictOptions()
    targets = dict(model.state_dict())
    local = {k: _local(v, targets.get(k)) for k, v in model_state_dict.items()}
    return model.load_state_dict(local, strict=options.strict)


def set_optimizer_state_dict(model, optimizers, optim_state_dict: dict, *,
                             options: StateDictOptions | None = None) -> None:
    """Load a state dict from ``get_optimizer_state_dict`` (sharded or full, of any world size) into the
    optimizer(s) of ``model``."""
    optims = optimizers if isinstance(optimizers, (list, tuple)) else [optimizers]
    names = _names_of(model)
    groups = iter(optim_state_dict["param_groups"])
    for optim in optims:
        params = [p for group in optim.param_groups for p in group["params"]]
        index = {names[id(p)]: i for i, p in enumerate(params)}
        by_name = {names[id(p)]: p for p in params}
        state = {index[name]: {k: _local(v, _shard_target(by_name[name], v)) for k, v in s.items()}
                 for name, s in optim_state_dict["state"].items() if name in index}
        saved_groups = [{**g, "params": [index[n] for n in g["params"]]}
                        for g, _ in zip(groups, optim.param_groups)]
        with no_grad():
            optim.load_state_dict({"state": state, "param_groups": saved_groups})


def _shard_target(param: Tensor, value) -> Tensor | None:
    """The parameter stands for its state tensors' shape when they are (full versions of) its shape."""
    return param if isinstance(value, Tensor) and value.dim() else None


def set_state_dict(model, optimizers, *, model_state_dict: dict, optim_state_dict: dict,
                   options: StateDictOptions | None = None):
    set_optimizer_state_dict(model, optimizers, optim_state_dict, options=options)
    return set_model_state_dict(model, model_state_dict, options=options)

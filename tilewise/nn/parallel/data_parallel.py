"""torch.nn.DataParallel: one process driving several GPUs, each running a replica of the module on a slice of the
batch.

[Note: DataParallel]
Each forward call scatters its tensor arguments along ``dim`` into one chunk per device (``Tensor.chunk``'s
sizes; non-tensor arguments are given to every replica), replicates the module onto those devices, runs the
replicas on threads, one per device, each with that device current and the caller's grad mode and autocast
state, and gathers the outputs onto ``output_device`` by concatenating along ``dim``. Every step of that is an
ordinary differentiable operator: a replica's parameters are ``param.to(device)`` copies of the module's own (so
they are not leaves, and backward sums each replica's gradient into the one parameter), the scattered inputs are
slices copied with ``to``, and the gather is ``cat``. Buffers are copied without autograd, and what a replica
writes to its buffers (batch norm's running statistics) is lost, as in torch, except on the first device, whose
replica shares the module's buffers. With no GPU, DataParallel calls the module as it is; with one device it
calls it on that device. Scripts that save ``model.state_dict()`` of a DataParallel get torch's ``module.``
prefix, and ``model.module`` is the wrapped module.
"""

from __future__ import annotations

import dataclasses
import threading
import warnings
from itertools import chain

from tilewise.autograd.grad_mode import is_grad_enabled, set_grad_enabled
from tilewise.device import Device
from tilewise.nn.modules.module import Module
from tilewise.tensor import Tensor


def _device_index(device, optional: bool = False) -> int:
    if isinstance(device, int):
        return device
    if isinstance(device, str):
        device = Device(device)
    if isinstance(device, Device):
        if device.type != "cuda":
            raise ValueError(f"Expected a cuda device, but got: {device}")
        if device.index is None:
            from tilewise.cuda import current_device

            return current_device()
        return device.index
    raise ValueError(f"Expected a device index, a device or a device string, but got {type(device).__name__}")


def _to_device(index: int) -> Device:
    """The device a replica with this index runs on."""
    return Device("cuda", index)


def _make_current(index: int) -> None:
    """Make GPU ``index`` the current device of the calling thread (a replica's worker)."""
    from tilewise.cuda import set_device

    set_device(index)


def _available_devices() -> list[int]:
    from tilewise.cuda import device_count, is_available

    return list(range(device_count())) if is_available() else []


def _check_balance(device_ids: list[int]) -> None:
    """torch's warning where one GPU has less than 75% of another's memory or multiprocessors."""
    from tilewise.cuda import get_device_properties

    props = [get_device_properties(i) for i in device_ids]
    for field in ("total_memory", "multi_processor_count"):
        values = [getattr(p, field, None) for p in props]
        if None in values:
            continue
        low, high = min(range(len(values)), key=values.__getitem__), max(range(len(values)), key=values.__getitem__)
        if values[low] / values[high] < 0.75:
            warnings.warn(f"There is an imbalance between your GPUs. You may want to exclude GPU {device_ids[low]} "
                          f"which has less than 75% of the memory or cores of GPU {device_ids[high]}. You can do so "
                          "by setting the device_ids argument to DataParallel, or by setting the "
                          "CUDA_VISIBLE_DEVICES environment variable.", stacklevel=3)
            return


# ---------------------------------------------------------------------------- scatter and gather


def scatter(inputs, target_gpus: list[int], dim: int = 0):
    """Slice the tensors in ``inputs`` along ``dim`` into one chunk per GPU (fewer where a tensor has fewer rows),
    copied to that GPU; containers are rebuilt around their chunks, other objects are repeated."""
    def split(obj):
        if isinstance(obj, Tensor):
            return [chunk.to(_to_device(target_gpus[k])) for k, chunk in enumerate(obj.chunk(len(target_gpus), dim))]
        if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # a namedtuple
            return [type(obj)(*parts) for parts in zip(*map(split, obj))]
        if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
            return [type(obj)(**dict(zip([f.name for f in dataclasses.fields(obj)], parts)))
                    for parts in zip(*(split(getattr(obj, f.name)) for f in dataclasses.fields(obj)))]
        if isinstance(obj, tuple) and obj:
            return list(zip(*map(split, obj)))
        if isinstance(obj, list) and obj:
            return [list(parts) for parts in zip(*map(split, obj))]
        if isinstance(obj, dict) and obj:
            return [type(obj)(parts) for parts in zip(*map(split, obj.items()))]
        return [obj for _ in target_gpus]

    return split(inputs)


def scatter_kwargs(inputs: tuple, kwargs: dict | None, target_gpus: list[int], dim: int = 0):
    """``scatter`` of the positional and keyword arguments, padded to the same number of chunks."""
    scattered = scatter(inputs, target_gpus, dim) if inputs else []
    scattered_kwargs = scatter(kwargs, target_gpus, dim) if kwargs else []
    if len(scattered) < len(scattered_kwargs):
        scattered.extend(() for _ in range(len(scattered_kwargs) - len(scattered)))
    elif len(scattered_kwargs) < len(scattered):
        scattered_kwargs.extend({} for _ in range(len(scattered) - len(scattered_kwargs)))
    return tuple(scattered), tuple(scattered_kwargs)


def gather(outputs: list, target_device, dim: int = 0):
    """Concatenate the replicas' outputs along ``dim`` on ``target_device`` (-1: the CPU); containers are rebuilt,
    ``None`` stays ``None``; 0-d tensors are stacked into a vector, with torch's warning."""
    device = Device("cpu") if target_device == -1 else _to_device(_device_index(target_device))

    def join(objs):
        first = objs[0]
        if isinstance(first, Tensor):
            if all(o.dim() == 0 for o in objs):
                warnings.warn("Was asked to gather along dimension 0, but all input tensors were scalars; will "
                              "instead unsqueeze and return a vector.", stacklevel=4)
                objs = [o.reshape(1) for o in objs]
            from tilewise.ops.functions import cat

            return cat([o.to(device) for o in objs], dim)
        if first is None:
            return None
        if isinstance(first, dict):
            if not all(len(first) == len(o) for o in objs):
                raise ValueError("All dicts must have the same number of keys")
            return type(first)((k, join([o[k] for o in objs])) for k in first)
        if dataclasses.is_dataclass(first) and not isinstance(first, type):
            return type(first)(**{f.name: join([getattr(o, f.name) for o in objs])
                                  for f in dataclasses.fields(first)})
        if isinstance(first, tuple) and hasattr(first, "_fields"):
            return type(first)(*map(join, zip(*objs)))
        return type(first)(map(join, zip(*objs)))

    return join(outputs)


# ---------------------------------------------------------------------------- replicas


def replicate(network: Module, devices: list[int], detach: bool = False) -> list[Module]:
    """Copies of ``network`` on ``devices``: each module shallow-copied, its parameters replaced by differentiable
    ``to(device)`` copies (plain attributes, no longer parameters) and its buffers by copies; the first device's
    replica shares the original's buffers when the network is already there."""
    modules = list(network.modules())
    params = list(network.parameters())
    replicas: list[Module] = []
    for device_index in devices:
        device = _to_device(device_index)
        copies = {id(p): (p.detach() if detach else p).to(device) for p in params}
        made: dict[int, Module] = {}
        for module in modules:
            replica = module.__new__(type(module))
            replica.__dict__ = module.__dict__.copy()
            replica.__dict__["_parameters"] = {}
            replica.__dict__["_buffers"] = {}
            replica.__dict__["_modules"] = module._modules.copy()
            replica.__dict__["_is_replica"] = True
            made[id(module)] = replica
        for module in modules:
            replica = made[id(module)]
            for key, child in module._modules.items():
                replica._modules[key] = made[id(child)] if child is not None else None
            for key, param in module._parameters.items():
                replica.__dict__[key] = None if param is None else copies[id(param)]
            for key, buffer in module._buffers.items():
                if buffer is None or buffer.device == device:
                    replica._buffers[key] = buffer
                else:
                    replica._buffers[key] = buffer.detach().to(device)
        replicas.append(made[id(network)])
    return replicas


def parallel_apply(modules: list[Module], inputs: tuple, kwargs_tup: tuple | None = None,
                   devices: list | None = None) -> list:
    """Run ``modules[i](*inputs[i], **kwargs_tup[i])`` on one thread per module, each with its device current and
    the caller's grad mode and autocast state; the first exception raised is raised here, naming its replica."""
    if len(modules) != len(inputs):
        raise AssertionError(f"The number of modules {len(modules)} is not equal to the number of inputs "
                             f"{len(inputs)}")
    kwargs_tup = kwargs_tup if kwargs_tup is not None else ({},) * len(modules)
    devices = devices if devices is not None else [None] * len(modules)
    from tilewise.amp.autocast_mode import autocast, get_autocast_dtype, is_autocast_enabled

    grad_enabled = is_grad_enabled()
    cast_enabled, cast_dtype = is_autocast_enabled("cuda"), get_autocast_dtype("cuda")
    results: dict[int, object] = {}
    lock = threading.Lock()

    def worker(i: int, module: Module, args, kwargs, device) -> None:
        try:
            if device is not None:
                _make_current(_device_index(device))
            with set_grad_enabled(grad_enabled), autocast("cuda", dtype=cast_dtype, enabled=cast_enabled):
                args = args if isinstance(args, (list, tuple)) else (args,)
                output = module(*args, **kwargs)
            with lock:
                results[i] = output
        except BaseException as exc:  # noqa: BLE001 — handed to the caller's thread
            with lock:
                results[i] = _Failure(i, device, exc)

    if len(modules) == 1:
        worker(0, modules[0], inputs[0], kwargs_tup[0], devices[0])
    else:
        threads = [threading.Thread(target=worker, args=(i, m, a, k, d))
                   for i, (m, a, k, d) in enumerate(zip(modules, inputs, kwargs_tup, devices))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    outputs = []
    for i in range(len(inputs)):
        output = results[i]
        if isinstance(output, _Failure):
            raise output.exc from RuntimeError(f"Caught {type(output.exc).__name__} in replica {output.index} on "
                                               f"device {output.device}")
        outputs.append(output)
    return outputs


@dataclasses.dataclass
class _Failure:
    index: int
    device: object
    exc: BaseException


# ---------------------------------------------------------------------------- the module


class DataParallel(Module):
    """torch.nn.DataParallel (see [Note: DataParallel])."""

    def __init__(self, module: Module, device_ids=None, output_device=None, dim: int = 0) -> None:
        super().__init__()
        available = _available_devices()
        if not available:
            self.module = module
            self.device_ids = []
            return
        if device_ids is None:
            device_ids = available
        if output_device is None:
            output_device = device_ids[0]
        self.dim = dim
        self.module = module
        self.device_ids = [_device_index(d, True) for d in device_ids]
        self.output_device = _device_index(output_device, True)
        self.src_device_obj = _to_device(self.device_ids[0])
        _check_balance(self.device_ids)
        if len(self.device_ids) == 1:
            self.module.to(self.src_device_obj)

    def forward(self, *inputs, **kwargs):
        if not self.device_ids:
            return self.module(*inputs, **kwargs)
        for t in chain(self.module.parameters(), self.module.buffers()):
            if t.device != self.src_device_obj:
                raise RuntimeError(f"module must have its parameters and buffers on device {self.src_device_obj} "
                                   f"(device_ids[0]) but found one of them on device: {t.device}")
        inputs, module_kwargs = self.scatter(inputs, kwargs, self.device_ids)
        if not inputs and not module_kwargs:  # no arguments: run once, on the first device
            inputs, module_kwargs = ((),), ({},)
        if len(self.device_ids) == 1:
            return self.module(*inputs[0], **module_kwargs[0])
        replicas = self.replicate(self.module, self.device_ids[:len(inputs)])
        outputs = self.parallel_apply(replicas, inputs, module_kwargs)
        return self.gather(outputs, self.output_device)

    def replicate(self, module: Module, device_ids: list[int]) -> list[Module]:
        return replicate(module, device_ids, not is_grad_enabled())

    def scatter(self, inputs: tuple, kwargs: dict | None, device_ids: list[int]):
        return scatter_kwargs(inputs, kwargs, device_ids, dim=self.dim)

    def parallel_apply(self, replicas: list[Module], inputs: tuple, kwargs: tuple) -> list:
        return parallel_apply(replicas, inputs, kwargs, self.device_ids[:len(replicas)])

    def gather(self, outputs: list, output_device):
        return gather(outputs, output_device, dim=self.dim)


def data_parallel(module: Module, inputs, device_ids=None, output_device=None, dim: int = 0,
                  module_kwargs: dict | None = None):
    """``DataParallel(module, device_ids, output_device, dim)(*inputs, **module_kwargs)`` without keeping the
    wrapper."""
    if not isinstance(inputs, tuple):
        inputs = (inputs,) if inputs is not None else ()
    available = _available_devices()
    if not available:
        return module(*inputs, **(module_kwargs or {}))
    device_ids = [_device_index(d, True) for d in (device_ids if device_ids is not None else available)]
    output_device = _device_index(output_device if output_device is not None else device_ids[0], True)
    src = _to_device(device_ids[0])
    for t in chain(module.parameters(), module.buffers()):
        if t.device != src:
            raise RuntimeError(f"module must have its parameters and buffers on device {src} (device_ids[0]) but "
                               f"found one of them on device: {t.device}")
    inputs, module_kwargs = scatter_kwargs(inputs, module_kwargs, device_ids, dim)
    if not inputs and not module_kwargs:
        inputs, module_kwargs = ((),), ({},)
    if len(device_ids) == 1:
        return module(*inputs[0], **module_kwargs[0])
    used = device_ids[:len(inputs)]
    replicas = replicate(module, used, not is_grad_enabled())
    return gather(parallel_apply(replicas, inputs, module_kwargs, used), output_device, dim)

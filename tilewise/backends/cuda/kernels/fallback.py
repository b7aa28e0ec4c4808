"""Operators without a CUDA kernel yet: run the CPU kernel on host copies and move the results back.

This keeps every operator usable on the GPU (autograd, nn and optim included) while kernels are written;
each use is logged once per operator under ``TILEWISE_LOG=fallback``, so a slow path is never silent to
someone looking. Copies, casts, pointwise, reductions, creation, random draws, indexing and matmul never
come here, except the rejection samplers ``poisson`` and ``binomial``: they draw from the generator shared by CPU
and CUDA, so their samples here are the CPU's for the same seed.
"""

from __future__ import annotations

from tilewise.config import log
from tilewise.device import cpu
from tilewise.tensor import Tensor

_reported: set[str] = set()


def _to(value, device):
    if type(value) is Tensor:
        return value.to(device) if value._device is not device else value
    if isinstance(value, (list, tuple)) and any(type(v) is Tensor for v in value):
        return type(value)(_to(v, device) for v in value)
    return value


def run_on_host(op, args: tuple, device):
    if op.full_name not in _reported:
        _reported.add(op.full_name)
        log("fallback", f"{op.full_name} has no CUDA kernel: running it on the CPU and copying the result back")
    from tilewise.backends.cpu import run as cpu_run

    host_args = tuple(_to(a, cpu) for a in args)
    if op.kind in ("creation", "random"):
        names = op.param_names()
        if "device" in names:
            host_args = tuple(cpu if k == names.index("device") else a for k, a in enumerate(host_args))
    return _to(cpu_run(op, host_args, cpu), device)

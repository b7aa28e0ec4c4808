"""tilewise.random: the default generator's seeding and state, and ``fork_rng``, as ``torch.random`` spells them.

``fork_rng`` saves the generator state on entry and puts it back on exit, so the random numbers drawn inside do
not shift those drawn after it (an evaluation pass that samples, a data-augmentation preview):

>>> import tilewise as tw
>>> _ = tw.manual_seed(0)
>>> with tw.random.fork_rng():
...     _ = tw.rand(5)
>>> after_fork = tw.rand(2)
>>> _ = tw.manual_seed(0)
>>> bool(tw.equal(after_fork, tw.rand(2)))
True
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from tilewise.accelerator import current_accelerator, get_device_module
from tilewise.ops.creation import (
    Generator,
    default_generator,
    get_rng_state,
    initial_seed,
    manual_seed,
    seed,
    set_rng_state,
)

__all__ = ["Generator", "default_generator", "fork_rng", "get_rng_state", "initial_seed", "manual_seed", "seed",
           "set_rng_state"]


@contextlib.contextmanager
def fork_rng(devices=None, enabled: bool = True, _caller: str = "fork_rng", _devices_kw: str = "devices",
             device_type: str | None = None) -> Iterator[None]:
    """Restore the CPU generator's state, and that of ``devices`` of ``device_type`` (by default every device of
    the accelerator, none without one), when the block exits, as torch.random.fork_rng does."""
    if device_type == "meta" or not enabled:
        yield
        return
    accelerator = current_accelerator()
    device_type = device_type or (accelerator.type if accelerator is not None else "cuda")
    device_module = get_device_module(device_type)
    if devices is None:
        devices = range(device_module.device_count()) if device_type != "cpu" else ()
    devices = list(devices)
    cpu_state = get_rng_state()
    device_states = [device_module.get_rng_state(device) for device in devices]
    try:
        yield
    finally:
        set_rng_state(cpu_state)
        for device, state in zip(devices, device_states):
            device_module.set_rng_state(state, device)

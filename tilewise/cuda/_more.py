"""The rest of torch.cuda that training scripts call around their models: device and stream contexts, the random
generator's state and the device's architecture list (the deprecated memory spellings are in ``cuda/__init__``).

[Note: one random stream] tilewise draws CPU and GPU random numbers from one Philox stream (see
``tilewise.cuda.manual_seed``), so the CUDA generator's state is that stream's state: ``get_rng_state`` saves what
``tilewise.get_rng_state`` saves, and restoring either restores both. ``seed``/``seed_all`` change nothing without
a GPU, as torch's (queued until CUDA starts) do in a process that never uses one.
"""

from __future__ import annotations

from typing import Any

from tilewise.backends.cuda import runtime as _rt
from tilewise.device import Device
from tilewise.tensor import Tensor


def _index(device: Any) -> int:
    """A device index from None (the current device), an int, 'cuda', 'cuda:1' or a Device."""
    if device is None:
        return _rt.current_device()
    if isinstance(device, int) and not isinstance(device, bool):
        return device
    dev = Device(str(device)) if not isinstance(device, Device) else device
    if dev.type != "cuda":
        raise ValueError(f"expected a CUDA device, got {dev}")
    return dev.index


class device:  # noqa: N801 — torch's name
    """Within the block, ``device`` is the current CUDA device (a negative index or None: nothing changes)."""

    def __init__(self, device: Any) -> None:
        self.idx = -1 if device is None else (device if isinstance(device, int) else _index(device))
        self.prev_idx = -1

    def __enter__(self):
        if self.idx < 0:
            return self
        self.prev_idx = _rt.current_device()
        _rt.set_device(self.idx)  # validates it: an error without a GPU or for a device that does not exist
        return self

    def __exit__(self, *exc) -> bool:
        if self.idx >= 0 and self.prev_idx != self.idx:
            _rt.set_device(self.prev_idx)
        return False


class device_of(device):  # noqa: N801 — torch's name
    """``device`` of a CUDA tensor's device; for any other object, a block that changes nothing."""

    def __init__(self, obj) -> None:
        on_cuda = isinstance(obj, Tensor) and obj.device.type == "cuda"
        super().__init__(obj.device.index if on_cuda else -1)


class StreamContext:
    """Within the block, ``stream`` is the current stream of its device (None: nothing changes)."""

    def __init__(self, stream) -> None:
        self.stream = stream
        self._context = None

    def __enter__(self):
        self._context = _rt.stream(self.stream)
        return self._context.__enter__()

    def __exit__(self, *exc) -> bool:
        return bool(self._context.__exit__(*exc))


def set_stream(stream) -> None:
    """Make ``stream`` this thread's current stream on its device (None: nothing changes)."""
    if stream is not None:
        from tilewise.backends.cuda.runtime.stream import set_current_stream

        set_current_stream(stream)


def is_initialized() -> bool:
    """Whether this process has initialised the CUDA driver."""
    from tilewise._cuda_api import _init_state

    return bool(_init_state["done"]) and _init_state["error"] is None


def is_current_stream_capturing() -> bool:
    """Whether this thread is capturing a CUDA graph."""
    from tilewise.backends.cuda.runtime.capturing import is_current_stream_capturing as capturing

    return capturing()


# ---------------------------------------------------------------------------- random state (one stream)


def _check_device(index: int) -> None:
    from tilewise.backends.cuda.runtime import device_count, is_available

    if not is_available():
        raise RuntimeError("CUDA is not available: tilewise found no GPU, so there is no CUDA generator")
    if not 0 <= index < device_count():
        raise ValueError(f"CUDA device {index} does not exist: {device_count()} device(s) visible")


def get_rng_state(device: Any = "cuda") -> Tensor:
    """The generator's state as a uint8 tensor (see [Note: one random stream])."""
    from tilewise.ops.creation import get_rng_state as state

    _check_device(_index(device))
    return state()


def set_rng_state(new_state: Tensor, device: Any = "cuda") -> None:
    from tilewise.ops.creation import set_rng_state as restore

    _check_device(_index(device))
    restore(new_state)


def get_rng_state_all() -> list[Tensor]:
    from tilewise.backends.cuda.runtime import device_count, is_available

    return [get_rng_state(i) for i in range(device_count())] if is_available() else []


def set_rng_state_all(new_states) -> None:
    for index, state in enumerate(new_states):
        set_rng_state(state, index)


def seed() -> None:
    """Seed the generator from a non-deterministic source (nothing without a GPU)."""
    from tilewise.backends.cuda.runtime import is_available
    from tilewise.ops.creation import seed as reseed

    if is_available():
        reseed()


seed_all = seed


def initial_seed() -> int:
    from tilewise.ops.creation import initial_seed as first

    _check_device(_rt.current_device())
    return first()


def ipc_collect() -> None:
    """Nothing to collect: tilewise shares no CUDA memory between processes through IPC handles."""


# ---------------------------------------------------------------------------- the device's architectures


def is_tf32_supported() -> bool:
    """Whether the current GPU has TF32 tensor cores (compute capability 8.0 or newer); False without a GPU."""
    from tilewise.backends.cuda.runtime import get_device_properties, is_available

    return is_available() and get_device_properties(_rt.current_device()).major >= 8


def get_arch_list() -> list[str]:
    """The architectures tilewise can build kernels for, as ``sm_XY`` (NVRTC's list); empty without a GPU, as
    torch's on a machine without CUDA."""
    from tilewise.backends.cuda.runtime import is_available

    if not is_available():
        return []
    from tilewise._cuda_api import check, nvrtc_api

    archs = check(nvrtc_api().nvrtcGetSupportedArchs(), "nvrtcGetSupportedArchs")
    return [f"sm_{int(a)}" for a in archs]


def get_gencode_flags() -> str:
    arch_list = get_arch_list()
    if not arch_list:
        return ""
    return " ".join(f"-gencode compute=compute_{a[3:]},code={a}" for a in arch_list)


def can_device_access_peer(device: Any, peer_device: Any) -> bool:
    """Whether ``device`` can read and write ``peer_device``'s memory directly (NVLink or PCIe peer access)."""
    from tilewise._cuda_api import check, driver_api

    a, b = _index(device), _index(peer_device)
    _check_device(a)
    _check_device(b)
    cu = driver_api()
    return bool(check(cu.cuDeviceCanAccessPeer(check(cu.cuDeviceGet(a), "cuDeviceGet"),
                                               check(cu.cuDeviceGet(b), "cuDeviceGet")), "cuDeviceCanAccessPeer"))


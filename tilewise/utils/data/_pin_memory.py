"""Pinning batches: copying every CPU tensor of a batch into page-locked memory, on a thread of its own.

With ``pin_memory=True`` and worker processes, a thread of the main process receives the workers' batches,
pins them and queues them for the loop, so that the copy into page-locked memory overlaps the training step and
``batch.to("cuda", non_blocking=True)`` returns at once. The thread makes the loader's device current first (a
CUDA context is bound per thread). Without a GPU there is nothing to pin into: the loader warns once, as torch
does, and hands out ordinary batches.
"""

from __future__ import annotations

import collections.abc
import copy
import queue
import threading

from tilewise.tensor import Tensor
from tilewise.utils.data._worker import MP_STATUS_CHECK_INTERVAL, ExceptionWrapper


def pin_memory(data, device=None):
    """``data`` with every CPU tensor in it copied to page-locked memory; containers are rebuilt around the
    pinned tensors (as ``default_collate`` rebuilds them) and objects with a ``pin_memory`` method pin themselves."""
    if isinstance(data, Tensor):
        return data.pin_memory() if data.device.type == "cpu" else data
    if hasattr(data, "pin_memory"):
        return data.pin_memory()
    if isinstance(data, (str, bytes)):
        return data
    if isinstance(data, collections.abc.Mapping):
        pinned = {k: pin_memory(sample, device) for k, sample in data.items()}
        try:
            if isinstance(data, collections.abc.MutableMapping):
                clone = copy.copy(data)
                clone.update(pinned)
                return clone
            return type(data)(pinned)
        except TypeError:
            return pinned
    if isinstance(data, tuple):
        if hasattr(data, "_fields"):
            return type(data)(*(pin_memory(sample, device) for sample in data))
        return type(data)(pin_memory(sample, device) for sample in data)
    if isinstance(data, collections.abc.Sequence):
        pinned = [pin_memory(sample, device) for sample in data]
        try:
            if isinstance(data, collections.abc.MutableSequence):
                clone = copy.copy(data)
                for i, item in enumerate(pinned):
                    clone[i] = item
                return clone
            return type(data)(pinned)
        except TypeError:
            return pinned
    return data


def pin_memory_loop(receive, out_queue: queue.Queue, device_id: int, done_event: threading.Event) -> None:
    """Body of the pinning thread: ``receive(timeout)`` gives ``(worker_id, message)`` or raises queue.Empty;
    messages that carry a batch are pinned, everything else (errors, worker exits) is passed on as it is."""
    from tilewise import cuda

    cuda.set_device(device_id)
    while not done_event.is_set():
        try:
            worker_id, message = receive(MP_STATUS_CHECK_INTERVAL)
        except queue.Empty:
            continue
        except Exception:  # the loop must hear of it, or it would wait for ever
            worker_id, message = None, ExceptionWrapper(where=f"in pin memory thread for device {device_id}")
        if isinstance(message, tuple) and not done_event.is_set() and not isinstance(message[1], ExceptionWrapper):
            idx, data = message
            try:
                message = (idx, pin_memory(data))
            except Exception:
                message = (idx, ExceptionWrapper(where=f"in pin memory thread for device {device_id}"))
        out_queue.put((worker_id, message))

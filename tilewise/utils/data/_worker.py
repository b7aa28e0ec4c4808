"""The loop a DataLoader worker process runs (what the process knows about itself is in ``_worker_info``).

[Note: data-loader workers] A worker is started with a copy of the dataset, a queue of tasks and one end of a
Unix socket. A task is ``(task index, sampler indices)``; the worker fetches and collates those samples and sends
``(task index, batch)`` back through the socket (tensors through shared memory, see ``_shared_memory``), or an
``ExceptionWrapper`` carrying the traceback text when the dataset raised. ``None`` tells it to stop, and
``_ResumeIteration`` to start a new epoch (persistent workers). Seeding follows torch exactly: worker ``i`` gets
``seed = base_seed + i`` for tilewise's default generator and Python's ``random``, and numpy's legacy global
generator gets ``_generate_state(base_seed, i)``, torch's SeedSequence-like mix, so two workers never share a
stream. A worker leaves when its manager process is gone (``ManagerWatchdog``) or its socket breaks.
"""

from __future__ import annotations

import os
import queue
import random
import socket
import sys
import traceback
import weakref
from dataclasses import dataclass
from typing import Any

from tilewise.utils.data import _shared_memory
from tilewise.utils.data._worker_info import WorkerInfo, set_worker_info

MP_STATUS_CHECK_INTERVAL = 5.0
"""Seconds between checks that the process at the other end is alive (torch's interval)."""


main_process_sockets: weakref.WeakSet[socket.socket] = weakref.WeakSet()
"""The main process's ends of every live worker socket. A worker started by fork inherits copies of them, which it
closes first: a copy would keep another worker's socket open after the main process has closed or lost its end."""


@dataclass(frozen=True)
class _IterableDatasetStopIteration:
    worker_id: int


@dataclass(frozen=True)
class _ResumeIteration:
    seed: int | None = None


class KeyErrorMessage(str):
    """A message whose repr is itself: KeyError shows ``repr(arg)``, which would print the traceback on one line."""

    __slots__ = ()

    def __repr__(self) -> str:
        return self


class ExceptionWrapper:
    """An exception and its traceback text, carried to another thread or process and raised there again."""

    def __init__(self, exc_info=None, where: str = "in background") -> None:
        exc_info = exc_info or sys.exc_info()
        self.exc_type = exc_info[0]
        self.exc_msg = "".join(traceback.format_exception(*exc_info))
        self.where = where

    def reraise(self):
        """Raise the exception again, its message saying where it was caught and holding the original traceback.
        (No local variable holds the new exception: its traceback would hold this frame, a reference cycle that
        keeps a DataLoader iterator, and its workers, alive until the garbage collector runs.)"""
        msg = f"Caught {self.exc_type.__name__} {self.where}.\nOriginal {self.exc_msg}"
        if self.exc_type is KeyError:
            msg = KeyErrorMessage(msg)
        elif getattr(self.exc_type, "message", None):
            raise self.exc_type(message=msg)
        try:
            exception = self.exc_type(msg)
        except Exception:
            raise RuntimeError(msg) from None
        try:
            raise exception
        finally:
            del exception


class ManagerWatchdog:
    """Tells a worker whether the process that started it is still there (its parent changes when it dies)."""

    def __init__(self) -> None:
        self.manager_pid = os.getppid()
        self.manager_dead = False

    def is_alive(self) -> bool:
        if not self.manager_dead:
            self.manager_dead = os.getppid() != self.manager_pid
        return not self.manager_dead


def _generate_state(base_seed: int, worker_id: int) -> list[int]:
    """numpy's legacy seed for a worker: torch's mix of (worker_id, base_seed) into four 32-bit words, modelled
    on numpy's SeedSequence, so that nearby base seeds and worker ids give unrelated streams."""
    init_a, mult_a, init_b, mult_b = 0x43B0D7E5, 0x931E8875, 0x8B51F9DD, 0x58F38DED
    mix_mult_l, mix_mult_r, xshift, mask32 = 0xCA01F9DD, 0x4973F715, 16, 0xFFFFFFFF
    entropy = [worker_id, base_seed & mask32, base_seed >> 32, 0]
    hash_const_a = init_a

    def hash32(value: int) -> int:
        nonlocal hash_const_a
        value = (value ^ hash_const_a) & mask32
        hash_const_a = (hash_const_a * mult_a) & mask32
        value = (value * hash_const_a) & mask32
        return (value ^ (value >> xshift)) & mask32

    def mix(x: int, y: int) -> int:
        result = ((mix_mult_l * x) - (mix_mult_r * y)) & mask32
        return (result ^ (result >> xshift)) & mask32

    pool = [hash32(e) for e in entropy]
    for i_src in range(4):
        for i_dst in range(4):
            if i_src != i_dst:
                pool[i_dst] = mix(pool[i_dst], hash32(pool[i_src]))
    hash_const_b, state = init_b, []
    for value in pool:
        value = (value ^ hash_const_b) & mask32
        hash_const_b = (hash_const_b * mult_b) & mask32
        value = (value * hash_const_b) & mask32
        state.append((value ^ (value >> xshift)) & mask32)
    return state


def seed_worker(base_seed: int, worker_id: int) -> int:
    """Seed every generator a dataset is likely to use, as torch seeds a worker; return tilewise's seed."""
    import numpy as np

    from tilewise.ops.creation import manual_seed

    seed = base_seed + worker_id
    random.seed(seed)
    manual_seed(seed)
    np.random.seed(_generate_state(base_seed, worker_id))
    return seed


def worker_loop(dataset_kind, dataset, index_queue, channel: socket.socket, done_event, auto_collation, collate_fn,
                drop_last: bool, base_seed: int, init_fn, worker_id: int, num_workers: int,
                persistent_workers: bool) -> None:
    """The body of worker process ``worker_id`` (see [Note: data-loader workers])."""
    from tilewise.utils.data._fetch import create_fetcher

    for inherited in list(main_process_sockets):
        inherited.close()
    try:
        seed = seed_worker(base_seed, worker_id)
        set_worker_info(WorkerInfo(id=worker_id, num_workers=num_workers, seed=seed, dataset=dataset))
        init_exception = None
        try:
            if init_fn is not None:
                init_fn(worker_id)
            fetcher = create_fetcher(dataset_kind, dataset, auto_collation, collate_fn, drop_last)
        except Exception:
            init_exception = ExceptionWrapper(where=f"in DataLoader worker process {worker_id}")
        iteration_end = False
        watchdog = ManagerWatchdog()
        while watchdog.is_alive():
            try:
                r = index_queue.get(timeout=MP_STATUS_CHECK_INTERVAL)
            except queue.Empty:
                continue
            if isinstance(r, _ResumeIteration):
                if not _send(channel, (r, None), worker_id):
                    break
                iteration_end = False
                fetcher = create_fetcher(dataset_kind, dataset, auto_collation, collate_fn, drop_last)
                continue
            if r is None:
                break
            if done_event.is_set() or iteration_end:
                continue
            idx, index = r
            if init_exception is not None:  # every task gets it: a worker that could not start has nothing else
                data = init_exception
            else:
                data, iteration_end = _fetch(fetcher, index, dataset_kind, worker_id)
            if not _send(channel, (idx, data), worker_id):
                break
            del data, idx, index, r  # a batch should not outlive its message
    except KeyboardInterrupt:
        pass  # the main process has its own KeyboardInterrupt and shuts the workers down
    finally:
        channel.close()


def _fetch(fetcher, index, dataset_kind, worker_id: int) -> tuple[Any, bool]:
    from tilewise.utils.data._fetch import DatasetKind

    try:
        return fetcher.fetch(index), False
    except StopIteration:
        if dataset_kind == DatasetKind.Iterable:
            return _IterableDatasetStopIteration(worker_id), True
        return ExceptionWrapper(where=f"in DataLoader worker process {worker_id}"), False
    except Exception:
        return ExceptionWrapper(where=f"in DataLoader worker process {worker_id}"), False


def _send(channel: socket.socket, message, worker_id: int) -> bool:
    """Send ``message``; False when the main process has gone (or closed the socket to stop this worker). A batch
    that cannot be pickled is reported to the main process like an exception raised by the dataset."""
    try:
        _shared_memory.send(channel, message)
        return True
    except (BrokenPipeError, ConnectionResetError):
        return False
    except Exception:
        failure = (message[0], ExceptionWrapper(where=f"in DataLoader worker process {worker_id}"))
    return _send(channel, failure, worker_id)

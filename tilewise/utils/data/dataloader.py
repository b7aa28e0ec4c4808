"""DataLoader: batches from a dataset, read in the calling process or in worker processes.

[Note: data loading] A DataLoader is a sampler (the order of indices), a batch sampler (indices grouped into
batches, ``drop_last`` dropping a short final one) and a collate function (samples into a batch). With
``num_workers=0`` the iterator fetches each batch itself. With ``num_workers=N`` it starts N processes (the
default start method of the platform, or ``multiprocessing_context``) and keeps ``prefetch_factor`` tasks in
flight per worker, handed out round robin; results come back over one Unix socket per worker, tensors through
shared memory (see ``_shared_memory``), and are returned in task order (or as they come, with
``in_order=False``). The protocol is torch's, so its behaviour is too: the same per-worker seeds (the base seed
is the number torch draws from the loader's generator, see [Note: sampler streams]), an
IterableDataset copied whole into every worker (each worker batches its own stream, so ``drop_last`` and short
batches apply per worker), a worker's exception raised again in the main process with its traceback text, a
worker that dies reported with its pid and signal or exit code, ``timeout``, ``persistent_workers`` (the same
processes across epochs) and a pinning thread for ``pin_memory``. Workers end when the iterator is exhausted,
garbage collected or shut down after an exception, when the main process exits (they are daemons), and, if
the main process is killed, when they notice it has gone (``ManagerWatchdog``, or a broken socket).
"""

from __future__ import annotations

import atexit
import itertools
import math
import multiprocessing
import os
import pickle
import queue
import signal
import socket
import threading
import time
import warnings
import weakref
from collections import deque
from collections.abc import Callable, Iterable
from multiprocessing.connection import wait
from typing import Any, Generic, TypeVar

from tilewise.utils.data import _shared_memory, _torch_stream
from tilewise.utils.data._fetch import DatasetKind, create_fetcher
from tilewise.utils.data._pin_memory import pin_memory, pin_memory_loop
from tilewise.utils.data._worker import (
    MP_STATUS_CHECK_INTERVAL,
    ExceptionWrapper,
    _IterableDatasetStopIteration,
    _ResumeIteration,
    main_process_sockets,
    worker_loop,
)
from tilewise.utils.data._worker_info import get_worker_info
from tilewise.utils.data.collate import default_collate, default_convert
from tilewise.utils.data.dataset import Dataset, IterableDataset
from tilewise.utils.data.sampler import BatchSampler, RandomSampler, Sampler, SequentialSampler

T_co = TypeVar("T_co", covariant=True)

__all__ = ["DataLoader", "default_collate", "default_convert", "get_worker_info"]

_python_exiting = False


def _set_python_exiting() -> None:
    """At interpreter exit the workers are left to multiprocessing, which terminates daemon processes itself."""
    global _python_exiting
    _python_exiting = True


atexit.register(_set_python_exiting)


class _InfiniteConstantSampler(Sampler):
    """``None`` for ever: the sampler of an IterableDataset (workers read their stream until it ends)."""

    def __iter__(self):
        while True:
            yield None


class DataLoader(Generic[T_co]):
    """Iterate over ``dataset`` in batches, in this process or in ``num_workers`` worker processes.

    >>> import tilewise as tw
    >>> ds = tw.utils.data.TensorDataset(tw.arange(10.0))
    >>> [b[0].tolist() for b in tw.utils.data.DataLoader(ds, batch_size=4, drop_last=True)]
    [[0.0, 1.0, 2.0, 3.0], [4.0, 5.0, 6.0, 7.0]]
    """

    dataset: Dataset[T_co]
    batch_size: int | None
    num_workers: int
    pin_memory: bool
    drop_last: bool
    timeout: float
    sampler: Sampler | Iterable
    prefetch_factor: int | None
    __initialized = False

    def __init__(self, dataset: Dataset[T_co], batch_size: int | None = 1, shuffle: bool | None = None,
                 sampler: Sampler | Iterable | None = None, batch_sampler: Sampler | Iterable | None = None,
                 num_workers: int = 0, collate_fn: Callable[[list], Any] | None = None, pin_memory: bool = False,
                 drop_last: bool = False, timeout: float = 0, worker_init_fn: Callable[[int], None] | None = None,
                 multiprocessing_context=None, generator=None, *, prefetch_factor: int | None = None,
                 persistent_workers: bool = False, pin_memory_device: str = "", in_order: bool = True) -> None:
        if num_workers < 0:
            raise ValueError("num_workers option should be non-negative; use num_workers=0 to disable "
                             "multiprocessing.")
        if timeout < 0:
            raise ValueError("timeout option should be non-negative")
        if num_workers == 0 and prefetch_factor is not None:
            raise ValueError("prefetch_factor option could only be specified in multiprocessing.let num_workers > 0 "
                             "to enable multiprocessing, otherwise set prefetch_factor to None.")
        if num_workers > 0 and prefetch_factor is None:
            prefetch_factor = 2
        elif prefetch_factor is not None and prefetch_factor < 0:
            raise ValueError("prefetch_factor option should be non-negative")
        if persistent_workers and num_workers == 0:
            raise ValueError("persistent_workers option needs num_workers > 0")

        self.dataset = dataset
        self.num_workers = num_workers
        self.prefetch_factor = prefetch_factor
        self.pin_memory = pin_memory
        self.pin_memory_device = pin_memory_device
        self.timeout = timeout
        self.worker_init_fn = worker_init_fn
        self.multiprocessing_context = multiprocessing_context
        self.in_order = in_order

        if isinstance(dataset, IterableDataset):
            self._dataset_kind = DatasetKind.Iterable
            if shuffle not in {False, None}:
                raise ValueError(f"DataLoader with IterableDataset: expected unspecified shuffle option, but got "
                                 f"shuffle={shuffle}")
            if sampler is not None:
                raise ValueError(f"DataLoader with IterableDataset: expected unspecified sampler option, but got "
                                 f"sampler={sampler}")
            if batch_sampler is not None:
                raise ValueError(f"DataLoader with IterableDataset: expected unspecified batch_sampler option, but "
                                 f"got batch_sampler={batch_sampler}")
        else:
            shuffle = bool(shuffle)
            self._dataset_kind = DatasetKind.Map

        if sampler is not None and shuffle:
            raise ValueError("sampler option is mutually exclusive with shuffle")
        if batch_sampler is not None:
            if batch_size != 1 or shuffle or sampler is not None or drop_last:
                raise ValueError("batch_sampler option is mutually exclusive with batch_size, shuffle, sampler, and "
                                 "drop_last")
            batch_size, drop_last = None, False
        elif batch_size is None and drop_last:
            raise ValueError("batch_size=None option disables auto-batching and is mutually exclusive with drop_last")

        if sampler is None:
            if self._dataset_kind == DatasetKind.Iterable:
                sampler = _InfiniteConstantSampler()
            elif shuffle:
                sampler = RandomSampler(dataset, generator=generator)
            else:
                sampler = SequentialSampler(dataset)
        if batch_size is not None and batch_sampler is None:
            batch_sampler = BatchSampler(sampler, batch_size, drop_last)

        self.batch_size = batch_size
        self.drop_last = drop_last
        self.sampler = sampler
        self.batch_sampler = batch_sampler
        self.generator = generator
        if collate_fn is None:
            collate_fn = default_collate if self._auto_collation else default_convert
        self.collate_fn = collate_fn
        self.persistent_workers = persistent_workers
        self.__initialized = True
        self._IterableDataset_len_called = None  # len(loader) of an IterableDataset, for the warning in __next__
        self._iterator = None
        self.check_worker_number_rationality()

    def _get_iterator(self) -> _BaseDataLoaderIter:
        if self.num_workers == 0:
            return _SingleProcessDataLoaderIter(self)
        self.check_worker_number_rationality()
        return _MultiProcessingDataLoaderIter(self)

    @property
    def multiprocessing_context(self):
        return self.__multiprocessing_context

    @multiprocessing_context.setter
    def multiprocessing_context(self, multiprocessing_context) -> None:
        if multiprocessing_context is not None:
            if self.num_workers <= 0:
                raise ValueError(f"multiprocessing_context can only be used with multi-process loading "
                                 f"(num_workers > 0), but got num_workers={self.num_workers}")
            if isinstance(multiprocessing_context, str):
                valid_start_methods = multiprocessing.get_all_start_methods()
                if multiprocessing_context not in valid_start_methods:
                    raise ValueError(f"multiprocessing_context option should specify a valid start method in "
                                     f"{valid_start_methods!r}, but got "
                                     f"multiprocessing_context={multiprocessing_context!r}")
                multiprocessing_context = multiprocessing.get_context(multiprocessing_context)
            if not isinstance(multiprocessing_context, multiprocessing.context.BaseContext):
                raise TypeError(f"multiprocessing_context option should be a valid context object or a string "
                                f"specifying the start method, but got "
                                f"multiprocessing_context={multiprocessing_context}")
        self.__multiprocessing_context = multiprocessing_context

    def __setattr__(self, attr, val) -> None:
        if self.__initialized and attr in ("batch_size", "batch_sampler", "sampler", "drop_last", "dataset",
                                           "persistent_workers"):
            raise ValueError(f"{attr} attribute should not be set after {type(self).__name__} is initialized")
        super().__setattr__(attr, val)

    def __iter__(self) -> _BaseDataLoaderIter:
        if self.persistent_workers and self.num_workers > 0:
            if self._iterator is None:
                self._iterator = self._get_iterator()
            else:
                self._iterator._reset(self)
            return self._iterator
        return self._get_iterator()

    @property
    def _auto_collation(self) -> bool:
        return self.batch_sampler is not None

    @property
    def _index_sampler(self):
        return self.batch_sampler if self._auto_collation else self.sampler

    def __len__(self) -> int:
        if self._dataset_kind == DatasetKind.Iterable:
            length = self._IterableDataset_len_called = len(self.dataset)
            if self.batch_size is not None:
                length = length // self.batch_size if self.drop_last else math.ceil(length / self.batch_size)
            return length
        return len(self._index_sampler)

    def check_worker_number_rationality(self) -> None:
        """Warn, as torch does, when there are more workers than CPUs this process may run on."""
        if not self.num_workers:
            return
        cpuset_checked = hasattr(os, "sched_getaffinity")
        suggested = len(os.sched_getaffinity(0)) if cpuset_checked else os.cpu_count()
        if suggested is not None and self.num_workers <= suggested:
            return
        if suggested is None:
            detail = "DataLoader is not able to compute a suggested max number of worker in current system."
        else:
            detail = (f"Our suggested max number of worker in current system is {suggested}"
                      f"{'' if cpuset_checked else ' (`cpuset` is not taken into account)'}, which is smaller than "
                      "what this DataLoader is going to create.")
        warnings.warn(f"This DataLoader will create {self.num_workers} worker processes in total. {detail} Please "
                      "be aware that excessive worker creation might get DataLoader running slow or even freeze, "
                      "lower the worker number to avoid potential slowness/freeze if necessary.", stacklevel=2)


def _pinning_available() -> bool:
    from tilewise import cuda

    return cuda.is_available()


class _BaseDataLoaderIter:
    def __init__(self, loader: DataLoader) -> None:
        self._dataset = loader.dataset
        self._dataset_kind = loader._dataset_kind
        self._IterableDataset_len_called = loader._IterableDataset_len_called
        self._auto_collation = loader._auto_collation
        self._drop_last = loader.drop_last
        self._index_sampler = loader._index_sampler
        self._num_workers = loader.num_workers
        if loader.pin_memory and loader.pin_memory_device:
            warnings.warn(f"pin_memory_device is deprecated, the current accelerator will be used as the device,"
                          f"ignore pin_memory_device='{loader.pin_memory_device}'.", stacklevel=5)
        pinning = _pinning_available() if loader.pin_memory else False
        if loader.pin_memory and not pinning:
            warnings.warn("'pin_memory' argument is set as true but no accelerator is found, then device pinned "
                          "memory won't be used.", stacklevel=5)
        self._pin_memory = pinning
        self._timeout = loader.timeout
        self._collate_fn = loader.collate_fn
        self._sampler_iter = iter(self._index_sampler)
        self._base_seed = _torch_stream.random_seed(loader.generator)
        self._persistent_workers = loader.persistent_workers
        self._num_yielded = 0

    def __iter__(self) -> _BaseDataLoaderIter:
        return self

    def _reset(self, loader: DataLoader, first_iter: bool = False) -> None:
        self._sampler_iter = iter(self._index_sampler)
        self._num_yielded = 0
        self._IterableDataset_len_called = loader._IterableDataset_len_called

    def _next_index(self):
        return next(self._sampler_iter)  # StopIteration ends the epoch

    def _next_data(self):
        raise NotImplementedError

    def __next__(self) -> Any:
        data = self._next_data()
        self._num_yielded += 1
        if (self._dataset_kind == DatasetKind.Iterable and self._IterableDataset_len_called is not None
                and self._num_yielded > self._IterableDataset_len_called):
            message = (f"Length of IterableDataset {self._dataset} was reported to be "
                       f"{self._IterableDataset_len_called}(when accessing len(dataloader)), but {self._num_yielded} "
                       "samples have been fetched. ")
            if self._num_workers > 0:
                message += ("For multiprocessing data-loading, this could be caused by not properly configuring the "
                            "IterableDataset replica at each worker. Please see "
                            "https://pytorch.org/docs/stable/data.html#torch.utils.data.IterableDataset for examples.")
            warnings.warn(message, stacklevel=2)
        return data

    def __len__(self) -> int:
        return len(self._index_sampler)

    def __getstate__(self):
        raise NotImplementedError(f"{type(self).__name__} cannot be pickled")


class _SingleProcessDataLoaderIter(_BaseDataLoaderIter):
    def __init__(self, loader: DataLoader) -> None:
        super().__init__(loader)
        if self._timeout != 0:
            raise AssertionError("_SingleProcessDataLoaderIter requires timeout == 0 (timeout limits the wait for "
                                 "worker processes; use num_workers > 0, or timeout=0)")
        self._dataset_fetcher = create_fetcher(self._dataset_kind, self._dataset, self._auto_collation,
                                               self._collate_fn, self._drop_last)

    def _next_data(self):
        index = self._next_index()
        data = self._dataset_fetcher.fetch(index)
        return pin_memory(data) if self._pin_memory else data


_WORKER_EXITED = object()  # what a worker's channel yields once its socket is closed


class _WorkerChannels:
    """The main process's ends of the workers' sockets: ``receive`` waits for the next message from any worker."""

    def __init__(self, sockets: list[socket.socket]) -> None:
        self._sockets = sockets
        self._open = set(range(len(sockets)))
        self._received: deque = deque()
        self._wakeup_read, self._wakeup_write = socket.socketpair()

    def receive(self, timeout: float) -> tuple[int, Any]:
        """``(worker_id, message)``; ``message`` is ``_WORKER_EXITED`` once that worker's socket has closed.
        Raises queue.Empty after ``timeout`` seconds without a message, or when ``interrupt`` is called."""
        if not self._received:
            by_socket = {self._sockets[i]: i for i in self._open}
            ready = wait([*by_socket, self._wakeup_read], timeout)
            if self._wakeup_read in ready:
                self._wakeup_read.recv(4096)
                raise queue.Empty
            if not ready:
                raise queue.Empty
            for sock in ready:
                self._received.append((by_socket[sock], self._receive_from(by_socket[sock])))
        return self._received.popleft()

    def _receive_from(self, worker_id: int):
        try:
            return _shared_memory.recv(self._sockets[worker_id])
        except (EOFError, ConnectionResetError):
            self._open.discard(worker_id)
            return _WORKER_EXITED

    def is_open(self, worker_id: int) -> bool:
        return worker_id in self._open

    def interrupt(self) -> None:
        self._wakeup_write.send(b"\0")

    def close(self) -> None:
        for sock in (*self._sockets, self._wakeup_read, self._wakeup_write):
            sock.close()
        self._open.clear()
        self._received.clear()


_persistent_pinning_iterators: weakref.WeakSet = weakref.WeakSet()
_persistent_pinning_lock = threading.Lock()
_persistent_pinning_registered = False


def _shut_down_persistent_pinning_iterators() -> None:
    """Persistent workers with a pinning thread are stopped before exit, while the thread can still be joined."""
    with _persistent_pinning_lock:
        iterators = tuple(_persistent_pinning_iterators)
    for iterator in iterators:
        iterator._shutdown_workers(at_exit=True)


class _MultiProcessingDataLoaderIter(_BaseDataLoaderIter):
    """One pass over the dataset by worker processes (see [Note: data loading])."""

    def __init__(self, loader: DataLoader) -> None:
        super().__init__(loader)
        self._prefetch_factor = loader.prefetch_factor
        self._in_order = loader.in_order
        if self._prefetch_factor <= 0:
            raise AssertionError("prefetch_factor must be greater than 0 for MultiProcessingDataLoaderIter (each "
                                 "worker needs a task in flight); use prefetch_factor >= 1")
        context = loader.multiprocessing_context or multiprocessing.get_context()
        self._owner_pid = os.getpid()
        self._worker_init_fn = loader.worker_init_fn
        self._shutdown = False
        self._workers_done_event = context.Event()
        self._index_queues, self._workers, main_ends = [], [], []
        try:
            for worker_id in range(self._num_workers):
                self._start_worker(context, worker_id, main_ends)
        except BaseException:
            self._channels = _WorkerChannels(main_ends)
            self._workers_status = [True] * len(self._workers)
            self._shutdown_workers()
            raise
        self._channels = _WorkerChannels(main_ends)
        if self._pin_memory:
            self._start_pinning_thread()
        self._reset(loader, first_iter=True)

    def _start_worker(self, context, worker_id: int, main_ends: list[socket.socket]) -> None:
        index_queue = context.Queue()
        index_queue.cancel_join_thread()  # a queue never blocks the exit of the process that fed it
        main_end, worker_end = socket.socketpair()
        main_ends.append(main_end)
        main_process_sockets.add(main_end)
        w = context.Process(target=worker_loop, args=(
            self._dataset_kind, self._dataset, index_queue, worker_end, self._workers_done_event,
            self._auto_collation, self._collate_fn, self._drop_last, self._base_seed, self._worker_init_fn,
            worker_id, self._num_workers, self._persistent_workers))
        w.daemon = True
        try:
            w.start()
        except (TypeError, AttributeError, pickle.PicklingError):
            warnings.warn("Got pickle error when attempting to start a worker Process. This might be because the "
                          "worker Process arguments are not picklable. Python 3.14+ changed the multiprocessing start "
                          "method in non-Mac POSIX platforms to 'forkserver', which requires the worker Process "
                          "arguments to be picklable. You can also try multiprocessing.set_start_method('fork').",
                          stacklevel=4)
            raise
        finally:
            worker_end.close()
        self._index_queues.append(index_queue)
        self._workers.append(w)

    def _start_pinning_thread(self) -> None:
        from tilewise import cuda

        self._pin_memory_thread_done_event = threading.Event()
        self._data_queue: queue.Queue = queue.Queue()
        thread = threading.Thread(target=pin_memory_loop, daemon=True, name="tilewise-pin-memory", args=(
            self._channels.receive, self._data_queue, cuda.current_device(), self._pin_memory_thread_done_event))
        thread.start()
        self._pin_memory_thread = thread
        if self._persistent_workers:
            global _persistent_pinning_registered
            with _persistent_pinning_lock:
                _persistent_pinning_iterators.add(self)
                if not _persistent_pinning_registered:
                    atexit.register(_shut_down_persistent_pinning_iterators)
                    _persistent_pinning_registered = True

    def _reset(self, loader: DataLoader, first_iter: bool = False) -> None:
        super()._reset(loader, first_iter)
        self._send_idx = 0  # index of the next task to hand out
        self._rcvd_idx = 0  # index of the next task to return
        self._task_info: dict[int, tuple] = {}  # task -> (worker,) while in flight, (worker, data) once early
        self._tasks_outstanding = 0
        self._workers_status = [True] * self._num_workers
        self._workers_num_tasks = [0] * self._num_workers
        self._worker_queue_idx_cycle = itertools.cycle(range(self._num_workers))
        if not first_iter:  # persistent workers: a new epoch, after the results of the last one are drained
            for index_queue in self._index_queues:
                index_queue.put(_ResumeIteration())
            resume_iteration_cnt = self._num_workers
            while resume_iteration_cnt > 0:
                return_idx, _ = self._get_data()
                if isinstance(return_idx, _ResumeIteration):
                    resume_iteration_cnt -= 1
        for _ in range(self._prefetch_factor * self._num_workers):
            self._try_put_index()

    # -------------------------------------------------------------------------------- receiving
    def _receive(self, timeout: float) -> tuple[int | None, Any]:
        if self._pin_memory:
            return self._data_queue.get(timeout=timeout)
        return self._channels.receive(timeout)

    def _try_get_data(self, timeout: float = MP_STATUS_CHECK_INTERVAL) -> tuple[bool, Any]:
        """``(True, (task index, data))``, or ``(False, None)`` after ``timeout`` seconds without a result; raises
        when a worker has died."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                worker_id, message = self._receive(max(deadline - time.monotonic(), 0))
            except queue.Empty:
                self._raise_if_workers_died()
                return False, None
            if isinstance(message, ExceptionWrapper):  # the pinning thread failed
                message.reraise()
            if message is not _WORKER_EXITED:
                return True, message
            if self._workers_status[worker_id]:
                self._raise_if_workers_died([worker_id])
            # else: a worker this iterator stopped has closed its socket

    def _raise_if_workers_died(self, exited: list[int] = ()) -> None:
        failed = [worker_id for worker_id, w in enumerate(self._workers)
                  if self._workers_status[worker_id]
                  and (worker_id in exited or not w.is_alive() or not self._channels.is_open(worker_id))]
        if not failed:
            return
        causes = [_exit_detail(self._workers[worker_id]) for worker_id in failed]
        for worker_id in failed:
            self._mark_worker_as_unavailable(worker_id)
        pids = ", ".join(str(self._workers[worker_id].pid) for worker_id in failed)
        cause = next((c for c in causes if c is not None), None)
        raise RuntimeError(f"DataLoader worker (pid(s) {pids}) exited unexpectedly") from cause

    def _get_data(self):
        if self._timeout > 0:
            success, data = self._try_get_data(self._timeout)
            if success:
                return data
            raise RuntimeError(f"DataLoader timed out after {self._timeout} seconds")
        if self._pin_memory:
            while self._pin_memory_thread.is_alive():
                success, data = self._try_get_data()
                if success:
                    return data
            raise RuntimeError("Pin memory thread exited unexpectedly")
        while True:
            success, data = self._try_get_data()
            if success:
                return data

    # -------------------------------------------------------------------------------- the task protocol
    def _next_data(self):
        while True:
            while self._rcvd_idx < self._send_idx:  # skip tasks of workers that have ended their stream
                info = self._task_info.get(self._rcvd_idx)
                if info:
                    worker_id = info[0]
                    if len(info) == 2 or self._workers_status[worker_id]:
                        break
                    del self._task_info[self._rcvd_idx]
                self._rcvd_idx += 1
            else:
                if not self._persistent_workers:
                    self._shutdown_workers()
                raise StopIteration
            if len(self._task_info[self._rcvd_idx]) == 2:  # it arrived early
                worker_id, data = self._task_info.pop(self._rcvd_idx)
                self._rcvd_idx += 1
                return self._process_data(data, worker_id)
            idx, data = self._get_data()
            self._tasks_outstanding -= 1
            if self._dataset_kind == DatasetKind.Iterable and isinstance(data, _IterableDatasetStopIteration):
                if self._persistent_workers:
                    self._workers_status[data.worker_id] = False
                else:
                    self._mark_worker_as_unavailable(data.worker_id)
                self._try_put_index()
                continue
            if idx != self._rcvd_idx:
                if not self._in_order:
                    worker_id = self._task_info.pop(idx)[0]
                    return self._process_data(data, worker_id)
                self._task_info[idx] += (data,)
            else:
                worker_id = self._task_info.pop(idx)[0]
                self._rcvd_idx += 1
                return self._process_data(data, worker_id)

    def _try_put_index(self) -> None:
        max_tasks = self._prefetch_factor * self._num_workers
        try:
            index = self._next_index()
        except StopIteration:
            return
        for _ in range(self._num_workers):  # the next active worker, if any
            worker_queue_idx = next(self._worker_queue_idx_cycle)
            if self._workers_status[worker_queue_idx]:
                if self._in_order or self._workers_num_tasks[worker_queue_idx] < max_tasks // sum(
                        self._workers_status):
                    break
        else:
            return
        self._index_queues[worker_queue_idx].put((self._send_idx, index))
        self._task_info[self._send_idx] = (worker_queue_idx,)
        self._workers_num_tasks[worker_queue_idx] += 1
        self._tasks_outstanding += 1
        self._send_idx += 1

    def _process_data(self, data, worker_idx: int):
        self._workers_num_tasks[worker_idx] -= 1
        self._try_put_index()
        if isinstance(data, ExceptionWrapper):
            data.reraise()
        return data

    # -------------------------------------------------------------------------------- shutting down
    def _mark_worker_as_unavailable(self, worker_id: int) -> None:
        """Tell worker ``worker_id`` to leave (its stream ended, it died, or the iterator is shutting down)."""
        self._index_queues[worker_id].put(None)
        self._workers_status[worker_id] = False

    def _shutdown_workers(self, at_exit: bool = False) -> None:
        if (_python_exiting and not at_exit) or os.getpid() != self._owner_pid or self._shutdown:
            return
        self._shutdown = True
        try:
            if hasattr(self, "_pin_memory_thread"):
                self._pin_memory_thread_done_event.set()
                self._channels.interrupt()
                self._pin_memory_thread.join()
            self._workers_done_event.set()
            for worker_id in range(len(self._workers)):
                if self._persistent_workers or self._workers_status[worker_id]:
                    self._mark_worker_as_unavailable(worker_id)
            self._channels.close()  # a worker blocked sending a batch gets a broken pipe and leaves
            for w in self._workers:
                w.join(timeout=MP_STATUS_CHECK_INTERVAL)
            for index_queue in self._index_queues:
                index_queue.cancel_join_thread()
                index_queue.close()
        finally:
            for w in self._workers:
                if w.is_alive():
                    w.terminate()
                    w.join(timeout=MP_STATUS_CHECK_INTERVAL)

    def __del__(self) -> None:
        if hasattr(self, "_channels"):
            self._shutdown_workers()



def _exit_detail(w) -> RuntimeError | None:
    """Why worker process ``w`` ended, in torch's words (its exit code or the signal that killed it)."""
    w.join(timeout=MP_STATUS_CHECK_INTERVAL)  # its socket closes a moment before the process is gone
    code = w.exitcode
    if code is None or code == 0:
        return None
    if code > 0:
        return RuntimeError(f"DataLoader worker (pid {w.pid}) exited unexpectedly with exit code {code}. Details are "
                            "lost due to multiprocessing. Rerunning with num_workers=0 may give better error trace.")
    message = f"DataLoader worker (pid {w.pid}) is killed by signal: {signal.strsignal(-code)}. "
    if -code == signal.SIGBUS:
        message += ("It is possible that dataloader's workers are out of shared memory. Please try to raise your "
                    "shared memory limit.")
    return RuntimeError(message)

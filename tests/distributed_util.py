"""Run a function on several processes that form a tilewise.distributed job, with bounded time.

``run_ranks(fn, world_size, *args)`` starts ``world_size`` processes with the "spawn" context (as torch's own
tests do), each with RANK, WORLD_SIZE, MASTER_ADDR and a free MASTER_PORT set, calls ``fn(rank, world_size,
*args)`` in each and returns the list of their return values in rank order. ``fn`` must be a module-level
function (spawn pickles it by name) and return something picklable (numpy arrays, not tensors). A rank that
raises fails the call with its traceback; a job that outlives ``timeout`` seconds is killed and fails the call,
so a test never hangs. A rank that exits with status 0 without returning (``os._exit(0)``) returns None.
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import socket
import time
import traceback


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _entry(fn, rank: int, world_size: int, port: int, args: tuple, results) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    try:
        results.put((rank, True, fn(rank, world_size, *args)))
    except BaseException:  # noqa: BLE001 (reported to the parent)
        results.put((rank, False, traceback.format_exc()))


def run_ranks(fn, world_size: int, *args, timeout: float = 45.0) -> list:
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    port = free_port()
    processes = [context.Process(target=_entry, args=(fn, rank, world_size, port, args, results), daemon=True)
                 for rank in range(world_size)]
    for process in processes:
        process.start()
    outcomes: dict[int, tuple[bool, object]] = {}
    deadline = time.monotonic() + timeout
    try:
        while len(outcomes) < world_size:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"distributed job timed out after {timeout}s; ranks done: {sorted(outcomes)}")
            try:
                rank, ok, value = results.get(timeout=min(left, 0.5))
            except queue.Empty:
                silent = [r for r in range(world_size) if r not in outcomes]
                if all(processes[r].exitcode is not None for r in silent):  # gone without reporting
                    for r in silent:
                        code = processes[r].exitcode
                        outcomes[r] = (code == 0, None if code == 0 else f"exited with code {code}")
                continue
            outcomes[rank] = (ok, value)
    finally:
        for process in processes:
            process.join(timeout=max(deadline - time.monotonic(), 1.0))
            if process.is_alive():
                process.kill()
                process.join(timeout=5)
    failures = [f"rank {rank}:\n{value}" for rank, (ok, value) in sorted(outcomes.items()) if not ok]
    if failures:
        raise AssertionError("\n".join(failures))
    return [outcomes[rank][1] for rank in range(world_size)]

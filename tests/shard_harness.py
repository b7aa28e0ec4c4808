"""Run a function on a few spawned ranks of one gloo process group and collect what each returned.

Each rank is a fresh process (the "spawn" context, as torch's own tests start theirs) that joins a group at
a free local port, runs ``fn(rank, world_size, *args)`` and sends back its result or its traceback. Every wait
is bounded: a rank that does not answer within ``timeout`` seconds is killed and the call fails, so a test
never hangs.
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import socket
import traceback

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(fn, rank: int, world_size: int, port: int, results, args, backend: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank))
    import datetime

    import tilewise.distributed as dist

    try:
        if "nccl" in backend:
            import tilewise

            tilewise.cuda.set_device(rank)
        dist.init_process_group(backend, rank=rank, world_size=world_size,
                                timeout=datetime.timedelta(seconds=30))
        results.put((rank, True, fn(rank, world_size, *args)))
    except BaseException:  # noqa: BLE001 — the parent reports it
        results.put((rank, False, traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_on_ranks(fn, world_size: int = 2, *args, timeout: float = 60, backend: str = "gloo") -> list:
    """What ``fn(rank, world_size, *args)`` returned on each rank, in rank order (results must pickle). With a
    backend that names nccl, rank ``r`` uses GPU ``r`` (the test is skipped where there are fewer GPUs than ranks)."""
    if "nccl" in backend:
        import tilewise

        found = tilewise.cuda.device_count()
        if found < world_size:
            pytest.skip(f"needs {world_size} GPUs for {world_size} NCCL ranks; {found} found")
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_rank_main, args=(fn, rank, world_size, port, results, args, backend), daemon=True)
             for rank in range(world_size)]
    for p in procs:
        p.start()
    answers: dict[int, tuple] = {}
    try:
        while len(answers) < world_size:
            try:
                rank, ok, value = results.get(timeout=timeout)
            except queue.Empty:
                pytest.fail(f"ranks {sorted(set(range(world_size)) - set(answers))} did not answer in {timeout} s")
            answers[rank] = (ok, value)
            if not ok:
                break
    finally:
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
    for rank, (ok, value) in sorted(answers.items()):
        if not ok:
            pytest.fail(f"rank {rank} failed:\n{value}")
    return [answers[rank][1] for rank in range(world_size)]

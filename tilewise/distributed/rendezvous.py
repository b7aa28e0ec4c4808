"""Rendezvous: from ``init_method`` (and the environment) to a store, this process's rank and the world size.

[Note: rendezvous] torch's URL schemes: ``env://`` reads RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT (a rank or
world size given to ``init_process_group`` wins); ``tcp://host:port?rank=R&world_size=N`` names the master
directly; ``file:///path`` shares a FileStore. Rank 0 hosts the TCPStore and waits, within the timeout, for the
others to connect, so a rank that never comes is an error rather than a hang. Missing pieces raise torch's
"Error initializing torch.distributed using <scheme> rendezvous: ..." ValueError.
"""

from __future__ import annotations

import datetime
import os
import urllib.parse

from tilewise.distributed.store import FileStore, Store, TCPStore


def _rendezvous_error(scheme: str, message: str) -> ValueError:
    return ValueError(f"Error initializing torch.distributed using {scheme} rendezvous: {message}")


def _env_int(name: str, given: int, scheme: str) -> int:
    if given is not None and given >= 0:
        return given
    if name not in os.environ:
        raise _rendezvous_error(scheme, f"environment variable {name} expected, but not set")
    return int(os.environ[name])


def rendezvous(init_method: str, rank: int, world_size: int,
                timeout: datetime.timedelta) -> tuple[Store, int, int]:
    url = urllib.parse.urlparse(init_method)
    query = dict(urllib.parse.parse_qsl(url.query))
    rank = int(query.get("rank", rank))
    world_size = int(query.get("world_size", world_size))
    if url.scheme == "env":
        rank = _env_int("RANK", rank, "env://")
        world_size = _env_int("WORLD_SIZE", world_size if world_size > 0 else None, "env://")
        for name in ("MASTER_ADDR", "MASTER_PORT"):
            if name not in os.environ:
                raise _rendezvous_error("env://", f"environment variable {name} expected, but not set")
        host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    elif url.scheme == "tcp":
        if rank < 0:
            raise _rendezvous_error("tcp://", "rank parameter missing")
        if world_size < 0:
            raise _rendezvous_error("tcp://", "world size parameter missing")
        if url.port is None:
            raise _rendezvous_error("tcp://", "port number missing")
        host, port = url.hostname, url.port
    elif url.scheme == "file":
        if rank < 0:
            raise _rendezvous_error("file://", "rank parameter missing")
        if world_size < 0:
            raise _rendezvous_error("file://", "world size parameter missing")
        store = FileStore(url.path, world_size)
        store.set_timeout(timeout)
        return store, rank, world_size
    else:
        raise RuntimeError(f"No rendezvous handler for {url.scheme}://")
    store = TCPStore(host, port, world_size, is_master=(rank == 0), timeout=timeout)
    return store, rank, world_size


def store_based_barrier(store: Store, key: str, rank: int, size: int, timeout: datetime.timedelta) -> None:
    """Every member adds itself; the last one releases the rest (bounded by ``timeout``)."""
    if store.add(key, 1) == size:
        store.set(f"{key}/released", "1")
    try:
        store.wait([f"{key}/released"], timeout)
    except RuntimeError:
        arrived = int(store.get(key))
        raise RuntimeError(f"Timed out initializing process group in store based barrier on rank "
                           f"{rank}, for key: {key} (world_size={size}, "
                           f"num_workers_joined={arrived}, timeout={timeout})") from None

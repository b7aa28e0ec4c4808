"""A stream sharded across DataLoader workers, for tests that start workers with ``spawn``: a spawned worker
imports the module that defines its dataset, and this one imports tilewise alone (not torch), so that the
worker starts in the time tilewise takes to import."""

from __future__ import annotations

import importlib
import random

import numpy as np

import tilewise as tw


class ShardsBase:
    """Rows ``i`` of a stream, each worker reading every ``num_workers``-th from its id, with the draws of the
    worker's Python, numpy and framework generators and the seed it was given."""

    lib_name = "tilewise"

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        lib = importlib.import_module(self.lib_name)
        info = lib.utils.data.get_worker_info()
        first, step = (0, 1) if info is None else (info.id, info.num_workers)
        for i in range(first, self.n, step):
            yield {"i": i, "worker": first, "random": random.random(), "numpy": np.random.random(),
                   "seed": lib.initial_seed(), "noise": np.random.standard_normal(2).astype(np.float32)}


class TilewiseShards(ShardsBase, tw.utils.data.IterableDataset):
    lib_name = "tilewise"

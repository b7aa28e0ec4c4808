"""tilewise.distributed's process groups and the gloo backend on 2-3 processes, against the one-process result
and against torch.distributed (gloo) where semantics are in doubt.

Each job is started once per module (a spawned process imports tilewise in about 2 s on a loaded machine), runs
many collectives and returns numpy results; the tests compare them.
"""

from __future__ import annotations

import datetime

import numpy as np
import pytest
from distributed_util import run_ranks

DTYPES = ["bool", "uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16", "float32", "float64"]


def rank_input(rank: int, n: int, dtype: str) -> np.ndarray:
    """Rank ``rank``'s data: small distinct values that every dtype holds exactly."""
    import ml_dtypes

    values = (np.arange(n) * 3 + rank * 5 + 1) % 7
    if dtype == "bool":
        return (values % 2).astype(bool)
    return values.astype(ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype)


def _tw(array: np.ndarray):
    import tilewise as tw

    return tw.from_numpy(array.copy())


def collectives_job(rank: int, world: int) -> dict:
    import tilewise as tw
    import tilewise.distributed as dist

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=20))
    out = {"rank": dist.get_rank(), "world": dist.get_world_size(), "backend": dist.get_backend()}
    for dtype in DTYPES:
        ops = ["SUM", "MAX", "MIN", "PRODUCT"] + (["BAND", "BOR", "BXOR"] if dtype in ("bool", "int32") else [])
        for op in ops:
            t = _tw(rank_input(rank, 11, dtype))
            dist.all_reduce(t, op=getattr(dist.ReduceOp, op))
            out[f"all_reduce/{dtype}/{op}"] = t.numpy().copy()
    t = _tw(rank_input(rank, 9, "float32"))
    dist.all_reduce(t, op=dist.ReduceOp.AVG)
    out["all_reduce/float32/AVG"] = t.numpy().copy()
    t = _tw(rank_input(rank, 6, "float32")).reshape(2, 3).t()
    dist.all_reduce(t)
    out["all_reduce/strided"] = t.numpy().copy()
    t = _tw(rank_input(rank, 4, "int64"))
    dist.broadcast(t, src=world - 1)
    out["broadcast"] = t.numpy().copy()
    gathered = tw.empty(3 * world, 2, dtype=tw.float32)
    dist.all_gather_into_tensor(gathered, _tw(rank_input(rank, 6, "float32")).reshape(3, 2))
    out["all_gather_into_tensor"] = gathered.numpy().copy()
    scattered = tw.empty(3, dtype=tw.bfloat16)
    dist.reduce_scatter_tensor(scattered, _tw(rank_input(rank, 3 * world, "bfloat16")))
    out["reduce_scatter_tensor"] = scattered.numpy().copy()
    works = [dist.all_reduce(tw.full((5,), float(rank + i)), async_op=True) for i in range(4)]
    out["async"] = [np.asarray(w.result()[0].numpy()).copy() for w in works if w.wait()]
    out["async_completed"] = all(w.is_completed() and w.is_success() for w in works)
    future = dist.all_reduce(tw.ones(2), async_op=True).get_future().then(lambda f: f.value()[0].numpy() * 10)
    out["future_then"] = future.wait()
    dist.barrier()
    dist.destroy_process_group()
    out["initialized_after_destroy"] = dist.is_initialized()
    return out


@pytest.fixture(scope="module")
def two_ranks() -> list[dict]:
    return run_ranks(collectives_job, 2)


def _reduce(inputs: list[np.ndarray], op: str) -> np.ndarray:
    if inputs[0].dtype == bool:
        fn = {"SUM": np.logical_or, "MAX": np.logical_or, "BOR": np.logical_or, "PRODUCT": np.logical_and,
              "MIN": np.logical_and, "BAND": np.logical_and, "BXOR": np.logical_xor}[op]
    else:
        fn = {"SUM": np.add, "MAX": np.maximum, "MIN": np.minimum, "PRODUCT": np.multiply, "BAND": np.bitwise_and,
              "BOR": np.bitwise_or, "BXOR": np.bitwise_xor}[op]
    result = inputs[0]
    for other in inputs[1:]:
        result = fn(result, other)
    return result


def test_group_facts(two_ranks):
    assert [r["rank"] for r in two_ranks] == [0, 1]
    assert all(r["world"] == 2 and r["backend"] == "gloo" for r in two_ranks)
    assert not any(r["initialized_after_destroy"] for r in two_ranks)


@pytest.mark.parametrize("dtype", DTYPES)
def test_all_reduce_every_dtype_and_op(two_ranks, dtype):
    for key in (k for k in two_ranks[0] if k.startswith(f"all_reduce/{dtype}/") and not k.endswith("AVG")):
        op = key.rsplit("/", 1)[1]
        expected = _reduce([rank_input(r, 11, dtype) for r in range(2)], op)
        for result in two_ranks:
            np.testing.assert_array_equal(result[key], expected, err_msg=key)
            assert result[key].dtype == expected.dtype


def test_all_reduce_average_and_strided(two_ranks):
    expected = (rank_input(0, 9, "float32") + rank_input(1, 9, "float32")) / 2
    strided = (rank_input(0, 6, "float32") + rank_input(1, 6, "float32")).reshape(2, 3).T
    for result in two_ranks:
        np.testing.assert_allclose(result["all_reduce/float32/AVG"], expected)
        np.testing.assert_array_equal(result["all_reduce/strided"], strided)


def test_broadcast_gather_scatter_tensor(two_ranks):
    gathered = np.concatenate([rank_input(r, 6, "float32").reshape(3, 2) for r in range(2)])
    total = rank_input(0, 6, "bfloat16") + rank_input(1, 6, "bfloat16")
    for rank, result in enumerate(two_ranks):
        np.testing.assert_array_equal(result["broadcast"], rank_input(1, 4, "int64"))
        np.testing.assert_array_equal(result["all_gather_into_tensor"], gathered)
        np.testing.assert_array_equal(result["reduce_scatter_tensor"], total[3 * rank:3 * rank + 3])


def test_async_work_and_future(two_ranks):
    for result in two_ranks:
        assert result["async_completed"]
        for i, value in enumerate(result["async"]):
            np.testing.assert_array_equal(value, np.full(5, float(2 * i + 1), dtype=np.float32))
        np.testing.assert_array_equal(result["future_then"], np.full(2, 20.0, dtype=np.float32))

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

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
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
    gathered = [tw.empty(2) for _ in range(world)]
    pending = [dist.all_gather(gathered, tw.full((2,), float(rank)), async_op=True),
               dist.broadcast(tw.arange(4.).reshape(2, 2).t(), src=0, async_op=True),
               dist.barrier(async_op=True)]
    strided = tw.zeros(2, 2).t()
    pending.append(dist.broadcast(strided if rank == 1 else tw.arange(4.).reshape(2, 2), src=0, async_op=True))
    out["composed_futures"] = [np.asarray(v.numpy()) for v in pending[0].get_future().wait()]
    for work in pending:
        work.wait()
    out["async_all_gather"] = [g.numpy().copy() for g in gathered]
    out["async_strided_broadcast"] = strided.numpy().copy()
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
    for rank, result in enumerate(two_ranks):
        expected = [np.full(2, float(r), dtype=np.float32) for r in range(2)]
        for got, want in zip(result["composed_futures"], expected):
            np.testing.assert_array_equal(got, want)
        for got, want in zip(result["async_all_gather"], expected):
            np.testing.assert_array_equal(got, want)
        if rank == 1:
            np.testing.assert_array_equal(result["async_strided_broadcast"], np.arange(4.0).reshape(2, 2))
        assert result["async_completed"]
        for i, value in enumerate(result["async"]):
            np.testing.assert_array_equal(value, np.full(5, float(2 * i + 1), dtype=np.float32))
        np.testing.assert_array_equal(result["future_then"], np.full(2, 20.0, dtype=np.float32))


def composed_job(rank: int, world: int) -> dict:
    import tilewise as tw
    import tilewise.distributed as dist

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
    out = {}
    mine = _tw(rank_input(rank, 6, "float32")).reshape(2, 3)
    gathered = [tw.empty(2, 3) for _ in range(world)]
    dist.all_gather(gathered, mine)
    out["all_gather"] = [g.numpy().copy() for g in gathered]
    t = _tw(rank_input(rank, 5, "int64"))
    dist.reduce(t, dst=1, op=dist.ReduceOp.MAX)
    out["reduce"] = t.numpy().copy()
    gather_list = [tw.empty(2, 3) for _ in range(world)] if rank == 2 else None
    dist.gather(mine, gather_list, dst=2)
    out["gather"] = [g.numpy().copy() for g in gather_list] if gather_list else None
    received = tw.empty(4, dtype=tw.int32)
    sources = [_tw(rank_input(r, 4, "int32")) for r in range(world)] if rank == 0 else None
    dist.scatter(received, sources, src=0)
    out["scatter"] = received.numpy().copy()
    reduced = tw.empty(3, dtype=tw.float64)
    dist.reduce_scatter(reduced, [_tw(rank_input(rank + i, 3, "float64")) for i in range(world)])
    out["reduce_scatter"] = reduced.numpy().copy()
    outputs = [tw.empty(rank + 1, dtype=tw.int16) for _ in range(world)]  # every rank sends rank j j+1 values
    dist.all_to_all(outputs, [_tw(rank_input(rank, j + 1, "int16")) for j in range(world)])
    out["all_to_all"] = [o.numpy().copy() for o in outputs]
    splits_in = [(rank + j) % 3 for j in range(world)]
    splits_out = [(j + rank) % 3 for j in range(world)]
    single = tw.empty(sum(splits_out), 2)
    dist.all_to_all_single(single, _tw(rank_input(rank, 2 * sum(splits_in), "float32")).reshape(-1, 2),
                           splits_out, splits_in)
    out["all_to_all_single"] = single.numpy().copy()
    right, left = (rank + 1) % world, (rank - 1) % world
    recv_later, recv_first = tw.empty(3), tw.empty(3)
    works = dist.batch_isend_irecv([dist.P2POp(dist.irecv, recv_later, left, tag=7),
                                    dist.P2POp(dist.irecv, recv_first, left, tag=3),
                                    dist.P2POp(dist.isend, tw.full((3,), float(rank)), right, tag=3),
                                    dist.P2POp(dist.isend, tw.full((3,), 10.0 + rank), right, tag=7)])
    for work in works:
        work.wait()
    out["p2p"] = (recv_first.numpy().copy(), recv_later.numpy().copy())
    if rank == 0:
        senders = sorted(dist.recv(tw.empty(1)) for _ in range(world - 1))  # from any source
        out["recv_any"] = senders
    else:
        dist.send(tw.ones(1), dst=0)
    objects = [None] * world
    dist.all_gather_object(objects, {"rank": rank, "payload": "x" * (rank * 100)})
    out["all_gather_object"] = objects
    listed = [f"from {rank}", rank, None] if rank == 1 else [None, None, None]
    dist.broadcast_object_list(listed, src=1)
    out["broadcast_object_list"] = listed
    collected = [None] * world if rank == 0 else None
    dist.gather_object((rank, "g" * rank), collected, dst=0)
    out["gather_object"] = collected
    scattered = [None]
    dist.scatter_object_list(scattered, [{"to": r} for r in range(world)] if rank == 2 else None, src=2)
    out["scatter_object_list"] = scattered[0]
    pair = dist.new_group([2, 0])
    out["pair_rank"] = dist.get_rank(pair), dist.get_world_size(pair)
    if pair != dist.GroupMember.NON_GROUP_MEMBER:
        t = tw.full((2,), float(rank + 1))
        dist.all_reduce(t, group=pair)
        out["pair_sum"] = t.numpy().copy()
        out["pair_ranks"] = dist.get_process_group_ranks(pair)
        t = tw.zeros(2)
        dist.broadcast(t if rank == 0 else tw.full((2,), 9.0), src=2, group=pair)
        dist.barrier(group=pair)
    else:
        import warnings

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out["non_member_all_reduce"] = dist.all_reduce(tw.ones(2), group=pair)
        out["non_member_warning"] = str(caught[0].message)
        out["non_member_is"] = pair
    dist.monitored_barrier(timeout=datetime.timedelta(seconds=20), wait_all_ranks=True)
    dist.barrier()
    dist.destroy_process_group()
    return out


@pytest.fixture(scope="module")
def three_ranks() -> list[dict]:
    return run_ranks(composed_job, 3)


def test_all_gather_reduce_gather_scatter(three_ranks):
    inputs = [rank_input(r, 6, "float32").reshape(2, 3) for r in range(3)]
    for rank, result in enumerate(three_ranks):
        for got, expected in zip(result["all_gather"], inputs):
            np.testing.assert_array_equal(got, expected)
        expected_reduce = _reduce([rank_input(r, 5, "int64") for r in range(3)], "MAX") if rank == 1 else \
            rank_input(rank, 5, "int64")
        np.testing.assert_array_equal(result["reduce"], expected_reduce)
        np.testing.assert_array_equal(result["scatter"], rank_input(rank, 4, "int32"))
        reduced = sum(rank_input(r + rank, 3, "float64") for r in range(3))
        np.testing.assert_array_equal(result["reduce_scatter"], reduced)
    assert three_ranks[0]["gather"] is None and three_ranks[1]["gather"] is None
    for got, expected in zip(three_ranks[2]["gather"], inputs):
        np.testing.assert_array_equal(got, expected)


def test_all_to_all(three_ranks):
    for rank, result in enumerate(three_ranks):
        for source, got in enumerate(result["all_to_all"]):
            np.testing.assert_array_equal(got, rank_input(source, rank + 1, "int16"))
        pieces = []
        for source in range(3):
            splits = [(source + j) % 3 for j in range(3)]
            rows = rank_input(source, 2 * sum(splits), "float32").reshape(-1, 2)
            pieces.append(rows[sum(splits[:rank]):sum(splits[:rank + 1])])
        np.testing.assert_array_equal(result["all_to_all_single"], np.concatenate(pieces))


def test_point_to_point_matches_tags_and_any_source(three_ranks):
    for rank, result in enumerate(three_ranks):
        left = (rank - 1) % 3
        np.testing.assert_array_equal(result["p2p"][0], np.full(3, float(left), dtype=np.float32))
        np.testing.assert_array_equal(result["p2p"][1], np.full(3, 10.0 + left, dtype=np.float32))
    assert three_ranks[0]["recv_any"] == [1, 2]


def test_object_collectives(three_ranks):
    for rank, result in enumerate(three_ranks):
        assert result["all_gather_object"] == [{"rank": r, "payload": "x" * (r * 100)} for r in range(3)]
        assert result["broadcast_object_list"] == ["from 1", 1, None]
        assert result["scatter_object_list"] == {"to": rank}
    assert three_ranks[0]["gather_object"] == [(r, "g" * r) for r in range(3)]
    assert three_ranks[1]["gather_object"] is None


def test_new_group_subset_and_non_members(three_ranks):
    for rank in (0, 2):
        assert three_ranks[rank]["pair_rank"] == ((0, 2) if rank == 0 else (1, 2))
        np.testing.assert_array_equal(three_ranks[rank]["pair_sum"], np.full(2, 4.0, dtype=np.float32))
        assert three_ranks[rank]["pair_ranks"] == [0, 2]
    outsider = three_ranks[1]
    assert outsider["pair_rank"] == (-1, -1) and outsider["non_member_all_reduce"] is None
    assert outsider["non_member_is"] == -100
    assert "does not belong to the given group" in outsider["non_member_warning"]


def failing_peer_job(rank: int, world: int) -> list[str] | None:
    """Rank 1 stalls past the timeout, then dies; rank 0 sees a timeout, then a closed connection."""
    import os
    import time

    import tilewise as tw
    import tilewise.distributed as dist

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))  # ranks may start seconds apart
    impatient = dist.new_group(timeout=datetime.timedelta(seconds=2))
    dist.all_reduce(tw.ones(1), group=impatient)
    if rank == 1:
        time.sleep(3)
        os._exit(0)  # gone without a word
    messages = []
    for _ in range(2):
        try:
            dist.all_reduce(tw.ones(1000), group=impatient)
            messages.append("no error")
        except RuntimeError as error:
            messages.append(str(error))
    try:
        dist.monitored_barrier(impatient, timeout=datetime.timedelta(milliseconds=300))
    except RuntimeError as error:
        messages.append(str(error))
    return messages


def test_a_hung_or_dead_peer_fails_the_collective_instead_of_hanging():
    timed_out, closed, barrier = run_ranks(failing_peer_job, 2, timeout=40)[0]
    assert "Timed out waiting 2000ms for recv operation to complete" in timed_out
    assert "Connection closed by peer" in closed
    assert barrier == "Rank 1 failed to pass monitoredBarrier in 300 ms"

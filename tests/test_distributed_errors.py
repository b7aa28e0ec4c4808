"""tilewise.distributed's argument errors, stores and timeouts, against torch.distributed (gloo) in this process.

Errors are checked on a one-process group (HashStore), where torch checks the same arguments: the exception
type must be torch's and the message must carry torch's words. Timeouts use small limits so that a peer that
never comes fails in about a second.
"""

from __future__ import annotations

import datetime
import threading

import numpy as np
import pytest
import torch
import torch.distributed as tdist
from distributed_util import free_port

import tilewise as tw
import tilewise.distributed as dist


@pytest.fixture
def one_rank_groups():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    tdist.init_process_group("gloo", store=tdist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()
    tdist.destroy_process_group()


def raised(fn) -> tuple[type, str] | None:
    try:
        fn()
    except Exception as error:  # noqa: BLE001 (the error is the result)
        return type(error), str(error)
    return None


def assert_same_error(ours, theirs, *words: str) -> None:
    got, expected = raised(ours), raised(theirs)
    assert expected is not None, "torch accepted the call"
    assert got is not None, f"tilewise accepted the call; torch raised {expected}"
    assert got[0].__name__ == expected[0].__name__, (got, expected)
    for word in words:
        assert word in got[1] and word in expected[1], (word, got[1], expected[1])


def test_collectives_before_init_raise_torchs_error():
    assert not dist.is_initialized()
    for name in ("all_reduce", "broadcast"):
        assert_same_error(lambda n=name: getattr(dist, n)(tw.ones(2)), lambda n=name: getattr(tdist, n)(torch.ones(2)),
                          "Default process group has not been initialized")
    assert_same_error(dist.get_rank, tdist.get_rank, "init_process_group")
    assert_same_error(dist.barrier, tdist.barrier, "init_process_group")


ERROR_CASES = {
    "twice": (lambda d, t: d.init_process_group("gloo", store=d.HashStore(), rank=0, world_size=1), "twice"),
    "not a tensor": (lambda d, t: d.all_reduce([t.ones(3)]), "Expected parameter `tensor`"),
    "bitwise op on floats": (lambda d, t: d.all_reduce(t.ones(3), op=d.ReduceOp.BAND),
                             "Cannot use ReduceOp.BAND with non-integral dtype"),
    "average of integers": (lambda d, t: d.all_reduce(t.ones(3, dtype=t.int32), op=d.ReduceOp.AVG),
                            "can't be cast to the desired output type Int"),
    "gather list size": (lambda d, t: d.all_gather([t.ones(2)], t.ones(3)),
                         "ProcessGroupGloo::allgather: invalid tensor size at index 0 (expected (3), got (2))"),
    "gather list length": (lambda d, t: d.all_gather([t.ones(3), t.ones(3)], t.ones(3)),
                           "invalid output tensor list at index 0 (expected length 1, got 2)"),
    "gather list dtype": (lambda d, t: d.all_gather([t.ones(3, dtype=t.int32)], t.ones(3)),
                          "Invalid usage of tensors with different dtypes"),
    "into tensor size": (lambda d, t: d.all_gather_into_tensor(t.ones(3), t.ones(2)), "invalid tensor size"),
    "into tensor dtype": (lambda d, t: d.all_gather_into_tensor(t.ones(2, dtype=t.int32), t.ones(2)),
                          "invalid tensor type"),
    "broadcast root": (lambda d, t: d.broadcast(t.ones(2), 1), "ProcessGroupGloo::broadcast: invalid root rank: 1"),
    "reduce root": (lambda d, t: d.reduce(t.ones(2), dst=2), "ProcessGroupGloo::reduce: invalid root rank: 2"),
    "send to self": (lambda d, t: d.send(t.ones(2), 0), "Invalid destination rank: destination rank should not"),
    "gather without list": (lambda d, t: d.gather(t.ones(3), None, dst=0),
                            "Argument ``gather_list`` must be specified on destination rank."),
    "gather list sizes": (lambda d, t: d.gather(t.ones(3), [t.ones(2)], dst=0),
                          "ProcessGroupGloo::gather: invalid tensor size at index 0 (expected (3), got (2))"),
    "scatter without list": (lambda d, t: d.scatter(t.ones(3), None, src=0),
                             "Argument ``scatter_list`` must be specified on source rank."),
    "reduce_scatter list": (lambda d, t: d.reduce_scatter(t.ones(3), [t.ones(3), t.ones(3)]),
                            "invalid input tensor list size, must be world size"),
    "split sizes": (lambda d, t: d.all_to_all_single(t.ones(3), t.ones(3), [2], [3]),
                    "Split sizes doesn't match total dim 0 size"),
    "new group too big": (lambda d, t: d.new_group([0, 1]), "the new group's world size should be less or equal"),
    "unknown group": (lambda d, t: d.all_reduce(t.ones(3), group=5),
                      "Process group 5 is not initialized in the world group map"),
}


@pytest.mark.parametrize("case", list(ERROR_CASES))
def test_argument_errors_match_torch(one_rank_groups, case):
    call, words = ERROR_CASES[case]
    assert_same_error(lambda: call(dist, tw), lambda: call(tdist, torch), words)


def test_one_rank_results_and_strided_outputs_match_torch(one_rank_groups):
    for ours, theirs in ((tw.arange(16.).reshape(4, 4).t(), torch.arange(16.).reshape(4, 4).t()),):
        dist.all_reduce(ours)
        tdist.all_reduce(theirs)
        np.testing.assert_array_equal(ours.numpy(), theirs.numpy())
    out, expected = tw.zeros(4, 4).t(), torch.zeros(4, 4).t()
    dist.all_gather_into_tensor(out, tw.arange(16.).reshape(4, 4))
    tdist.all_gather_into_tensor(expected, torch.arange(16.).reshape(4, 4))
    np.testing.assert_array_equal(out.numpy(), expected.numpy())
    assert dist.get_backend() == tdist.get_backend() == "gloo"
    assert (dist.Backend("GLOO"), dist.Backend.NCCL, dist.Backend("foo")) == ("gloo", "nccl", "foo")
    assert repr(dist.ReduceOp.SUM) == repr(tdist.ReduceOp.SUM)
    assert dist.get_process_group_ranks(dist.group.WORLD) == [0]
    assert dist.GroupMember.NON_GROUP_MEMBER == tdist.GroupMember.NON_GROUP_MEMBER


def test_a_backend_that_serves_no_device_of_the_tensor_is_an_error():
    dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1)
    try:
        with pytest.raises(RuntimeError, match="No backend type associated with device type cpu"):
            dist.all_reduce(tw.ones(2))
    finally:
        dist.destroy_process_group()


# stores


def store_ops(store, other) -> list:
    """The same sequence of operations on ``store``; ``other`` is a second client of the same store."""
    store.set("k", "v")
    results = [other.get("k"), store.add("c", 3), other.add("c", 2), store.get("c"), store.check(["k"]),
               store.check(["k", "zz"]), store.compare_set("k", "v", "w"), store.compare_set("k", "x", "y"),
               store.compare_set("new", "", "z"), store.compare_set("new2", "q", "z"), store.delete_key("k"),
               store.delete_key("k")]
    store.set("bytes", b"\x00\xff")
    results.append(other.get("bytes"))
    threading.Timer(0.05, lambda: store.set("late", "1")).start()
    other.wait(["late"])
    results.append(other.get("late"))
    return results


def test_stores_behave_like_torchs(tmp_path):
    timeout = datetime.timedelta(seconds=5)
    port = free_port()
    theirs = tdist.TCPStore("127.0.0.1", port, 2, True, timeout=timeout, wait_for_workers=False)
    expected = store_ops(theirs, tdist.TCPStore("127.0.0.1", port, 2, False, timeout=timeout))
    ours_master = dist.TCPStore("127.0.0.1", 0, 2, True, timeout=timeout, wait_for_workers=False)
    ours_client = dist.TCPStore("127.0.0.1", ours_master.port, 2, False, timeout=timeout)
    assert store_ops(ours_master, ours_client) == expected
    hash_store = dist.HashStore()
    assert store_ops(hash_store, hash_store) == expected
    file_store = dist.FileStore(str(tmp_path / "store"), 2)
    assert store_ops(file_store, dist.FileStore(str(tmp_path / "store"), 2)) == expected
    prefixed = dist.PrefixStore("job", dist.HashStore())
    assert store_ops(prefixed, prefixed) == expected
    assert prefixed.underlying_store.get("job/c") == b"5"


def test_store_waits_end_with_torchs_timeout_error(tmp_path):
    short = datetime.timedelta(milliseconds=200)
    store = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=short)
    assert_same_error(lambda: store.get("missing"),
                      lambda: tdist.TCPStore("127.0.0.1", 0, 1, True, timeout=short).get("missing"),
                      "wait timeout after 200ms, keys: /missing")
    with pytest.raises(dist.DistStoreError, match="wait timeout after 100ms, keys: /a, /b"):
        store.wait(["a", "b"], datetime.timedelta(milliseconds=100))
    file_store = dist.FileStore(str(tmp_path / "f"))
    file_store.set_timeout(short)
    with pytest.raises(dist.DistStoreError, match="wait timeout"):
        file_store.get("missing")
    assert issubclass(dist.DistStoreError, RuntimeError)


def test_a_peer_that_never_joins_is_a_bounded_error():
    timeout = datetime.timedelta(seconds=1)
    with pytest.raises(RuntimeError, match="clients joined|Timed out"):
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=2,
                                timeout=timeout)
    assert not dist.is_initialized()
    with pytest.raises(RuntimeError, match="timed out after 1000ms while trying to connect"):
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=1, world_size=2,
                                timeout=timeout)


def test_rendezvous_errors_match_torch(monkeypatch):
    for name in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    assert_same_error(lambda: dist.init_process_group("gloo"), lambda: tdist.init_process_group("gloo"),
                      "environment variable RANK expected, but not set")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert_same_error(lambda: dist.init_process_group("gloo"), lambda: tdist.init_process_group("gloo"),
                      "environment variable MASTER_ADDR expected, but not set")


def torch_and_tilewise_job(rank: int, world: int, torch_port: int) -> dict:
    """The same collectives through torch's gloo and ours, where rounding or semantics could differ."""
    import ml_dtypes

    dist.init_process_group(timeout=datetime.timedelta(seconds=30))
    tdist.init_process_group(init_method=f"tcp://127.0.0.1:{torch_port}", rank=rank, world_size=world)
    values = np.array([0.1, 1000.3, 3.3, 65000.0, -7.7, 1e-3], dtype=np.float32) * (rank + 1.7)
    out = {"backend": (dist.get_backend(), tdist.get_backend())}
    for dtype, tw_dtype, torch_dtype in (("bfloat16", tw.bfloat16, torch.bfloat16),
                                         ("float16", tw.float16, torch.float16)):
        for op in ("SUM", "AVG", "PRODUCT"):
            ours = tw.from_numpy(values.copy()).to(tw_dtype)
            theirs = torch.from_numpy(values.copy()).to(torch_dtype)
            dist.all_reduce(ours, op=getattr(dist.ReduceOp, op))
            tdist.all_reduce(theirs, op=getattr(tdist.ReduceOp, op))
            out[f"{dtype}/{op}"] = (ours.float().numpy(), theirs.float().numpy())
    ours, theirs = [None] * world, [None] * world
    dist.all_gather_object(ours, {"rank": rank, "nested": [rank, (rank, "x")]})
    tdist.all_gather_object(theirs, {"rank": rank, "nested": [rank, (rank, "x")]})
    out["all_gather_object"] = (ours, theirs)
    ours, theirs = ([rank, "a", {1: 2}] if rank == 0 else [None] * 3 for _ in range(2))
    dist.broadcast_object_list(ours, src=0)
    tdist.broadcast_object_list(theirs, src=0)
    out["broadcast_object_list"] = (ours, theirs)
    bools = [np.array([True, False, rank == 0, False])] * 2
    ours, theirs = tw.from_numpy(bools[0].copy()), torch.from_numpy(bools[1].copy())
    dist.all_reduce(ours)
    tdist.all_reduce(theirs)
    out["bool"] = (ours.numpy(), theirs.numpy())
    wraps = np.array([100, -100, 127], dtype=np.int8)
    ours, theirs = tw.from_numpy(wraps.copy()), torch.from_numpy(wraps.copy())
    dist.all_reduce(ours)
    tdist.all_reduce(theirs)
    out["int8"] = (ours.numpy(), theirs.numpy())
    del ml_dtypes
    dist.destroy_process_group()
    tdist.destroy_process_group()
    return out


def test_rounding_and_object_collectives_match_torch_gloo_on_two_ranks():
    from distributed_util import run_ranks

    for result in run_ranks(torch_and_tilewise_job, 2, free_port(), timeout=50):
        for key, (ours, theirs) in result.items():
            if isinstance(ours, np.ndarray):
                np.testing.assert_array_equal(ours, theirs, err_msg=key)
            else:
                assert ours == theirs, key


def test_a_process_that_never_destroys_its_group_still_exits():
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    script = ("import tilewise as tw, tilewise.distributed as dist\n"
              f"dist.init_process_group('gloo', init_method='tcp://127.0.0.1:{free_port()}', rank=0, world_size=1)\n"
              "dist.all_reduce(tw.ones(2))\n")
    env = dict(os.environ, PYTHONPATH=root)
    result = subprocess.run([sys.executable, "-c", script], env=env, timeout=40, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr

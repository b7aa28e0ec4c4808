"""tilewise.utils.data with worker processes, against torch's DataLoader where the result is deterministic: the
order of indices and batches, per-worker seeds, collate output structure, len() and warnings, errors raised by
workers, workers that die, shutdown (no process left behind), IterableDataset sharding, the shared-memory
hand-over, and the samplers and datasets scripts use."""

from __future__ import annotations

import itertools
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from collections import namedtuple

import numpy as np
import pytest
import torch
from childenv import python_path

import tilewise as tw
from tilewise.utils import data
from tilewise.utils.data import _shared_memory

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create")

Point = namedtuple("Point", "x y")


# ------------------------------------------------------------------------------------------------ helpers

def plain(x):
    """A framework-free picture of a batch: container types and, for tensors, dtype, shape and values."""
    if isinstance(x, (tw.Tensor, torch.Tensor)):
        return ("tensor", str(x.dtype).split(".")[-1], tuple(x.shape), x.tolist())
    if isinstance(x, tuple) and hasattr(x, "_fields"):
        return (type(x).__name__, *[plain(v) for v in x])
    if isinstance(x, dict):
        return {k: plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return (type(x).__name__, [plain(v) for v in x])
    return x


def children() -> set[int]:
    """The pids of this process's live children, less multiprocessing's own helpers (the resource tracker and
    the fork server, which outlive every loader by design)."""
    return {pid for pid, ppid, _ in _processes() if ppid == os.getpid() and not _is_helper(pid)}


def _is_helper(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read()
    except OSError:
        return False
    return b"resource_tracker" in cmdline or b"forkserver" in cmdline


def _processes():
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[0] != "Z":  # a zombie has exited
                yield int(entry), int(fields[1]), int(fields[3])  # pid, parent, session


def in_session(sid: int) -> list[int]:
    return [pid for pid, _, session in _processes() if session == sid]


def wait_until(condition, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


def loaders(dataset_for, **kwargs):
    """The same loader in both frameworks (``dataset_for(lib)`` builds each framework's dataset)."""
    return data.DataLoader(dataset_for(tw), **kwargs), torch.utils.data.DataLoader(dataset_for(torch), **kwargs)


class Squares(data.Dataset):
    """Map-style, framework-free samples (so both loaders collate the same Python and numpy values)."""

    def __init__(self, n: int = 23) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        return {"i": i, "sq": np.array([i, i * i], dtype=np.int32), "name": f"s{i}", "p": Point(i, float(i) / 2)}


class RangesBase:
    """range(start, stop), sharded across workers when ``shard`` (torch's documented recipe)."""

    def __init__(self, start: int, stop: int, shard: bool = True, length: int | None = None) -> None:
        self.start, self.stop, self.shard, self.length = start, stop, shard, length

    def __iter__(self):
        info = worker_info()
        if info is None or not self.shard:
            return iter(range(self.start, self.stop))
        per_worker = -(-(self.stop - self.start) // info.num_workers)
        begin = self.start + info.id * per_worker
        return iter(range(begin, min(begin + per_worker, self.stop)))

    def __len__(self) -> int:
        return self.length if self.length is not None else self.stop - self.start


class Ranges(RangesBase, data.IterableDataset):
    pass


class TorchRanges(RangesBase, torch.utils.data.IterableDataset):
    pass


def ranges(lib, *args, **kwargs):
    return (Ranges if lib is tw else TorchRanges)(*args, **kwargs)


def worker_info():
    return data.get_worker_info() or torch.utils.data.get_worker_info()


class Seeds(data.Dataset):
    """What a worker's generators give: its info and the next draw of Python's, numpy's and the framework's."""

    def __init__(self, lib) -> None:
        self.lib = lib

    def __len__(self) -> int:
        return 6

    def __getitem__(self, i):
        info = worker_info()
        return [info.id, info.num_workers, info.seed, random.random(), float(np.random.random()),
                self.lib.rand(1, dtype=self.lib.float64).item()]


class Failing(data.Dataset):
    def __init__(self, how: str, at: int = 5) -> None:
        self.how, self.at = how, at

    def __len__(self) -> int:
        return 12

    def __getitem__(self, i):
        if i == self.at:
            if self.how == "raise":
                raise ValueError(f"item {i} is corrupt")
            if self.how == "keyerror":
                raise KeyError(i)
            if self.how == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            if self.how == "exit":
                os._exit(3)
            if self.how == "sleep":
                time.sleep(1)
        return i


# ------------------------------------------------------------------------------------------------ order and structure

@pytest.mark.parametrize("kwargs", [
    dict(batch_size=4, num_workers=2),
    dict(batch_size=4, num_workers=3, drop_last=True),
    dict(batch_size=None, num_workers=2),
    dict(batch_size=5, num_workers=2, sampler=[22, 3, 7, 0, 19, 5, 11, 2, 8, 13, 1]),
    dict(batch_sampler=[[4, 2], [9], [1, 2, 3, 4, 5], [0]], num_workers=3),
    dict(batch_size=3, num_workers=2, prefetch_factor=1),
    dict(batch_size=3, num_workers=4, prefetch_factor=5, persistent_workers=True),
])
def test_batches_match_torch(kwargs):
    ours, theirs = loaders(lambda lib: Squares(), **kwargs)
    assert len(ours) == len(theirs)
    assert [plain(b) for b in ours] == [plain(b) for b in theirs]


def test_default_collate_structures_match_torch():
    samples = [{"t": lib_t, "n": np.float32(k), "b": True, "f": 0.5 * k, "s": b"x", "l": [k, (k, 2.0)],
                "nt": Point(np.zeros(2, np.float64), k), "a0": np.array(k)}
               for k, lib_t in enumerate([np.ones((2, 3), np.float32), np.zeros((2, 3), np.float32)])]
    ours = data.default_collate([{**s, "t": tw.from_numpy(s["t"])} for s in samples])
    theirs = torch.utils.data.default_collate([{**s, "t": torch.from_numpy(s["t"])} for s in samples])
    assert plain(ours) == plain(theirs)
    for batch in ([(1, "a"), (2, "b")], [[1.5], [2.5]], [np.int16(3), np.int16(4)], ["x", "y"]):
        assert plain(data.default_collate(batch)) == plain(torch.utils.data.default_collate(batch))
    for sample in ((np.zeros(2), 1), [np.zeros(2)], {"a": np.ones(1)}, Point(np.array(0), "s"), np.array(["u"]), 3):
        assert plain(data.default_convert(sample)) == plain(torch.utils.data.default_convert(sample))


@pytest.mark.parametrize("batch,error", [([object()], TypeError), ([np.array(["a"])], TypeError),
                                         ([[1, 2], [3]], RuntimeError), ([{"a": 1}, {"b": 2}], KeyError)])
def test_default_collate_errors_match_torch(batch, error):
    with pytest.raises(error) as ours:
        data.default_collate(batch)
    with pytest.raises(error) as theirs:
        torch.utils.data.default_collate(batch)
    assert str(ours.value) == str(theirs.value)


def test_tensor_dataset_with_workers_matches_torch():
    x = np.arange(60, dtype=np.float32).reshape(20, 3)
    ours, theirs = loaders(lambda lib: (tw.utils.data.TensorDataset(tw.from_numpy(x), tw.arange(20))
                                        if lib is tw else torch.utils.data.TensorDataset(torch.from_numpy(x),
                                                                                         torch.arange(20))),
                           batch_size=6, num_workers=2, sampler=list(range(19, -1, -1)))
    assert [plain(b) for b in ours] == [plain(b) for b in theirs]


def test_shuffled_order_is_the_same_with_and_without_workers():
    def order(workers):
        loader = data.DataLoader(Squares(), batch_size=4, shuffle=True, num_workers=workers,
                                 generator=tw.Generator().manual_seed(7))
        return [b["i"].tolist() for b in loader]

    assert order(0) == order(3)
    assert sorted(itertools.chain(*order(2))) == list(range(23))


def test_in_order_false_returns_every_batch_without_waiting_for_a_slow_one():
    class SlowFirst(data.Dataset):
        def __len__(self):
            return 8

        def __getitem__(self, i):
            if i == 0:
                time.sleep(0.5)
            return i

    got = [b.tolist() for b in data.DataLoader(SlowFirst(), batch_size=2, num_workers=2, in_order=False)]
    assert sorted(got) == [[0, 1], [2, 3], [4, 5], [6, 7]] and got[0] != [0, 1]
    ordered = [b.tolist() for b in data.DataLoader(SlowFirst(), batch_size=2, num_workers=2)]
    assert ordered == [[0, 1], [2, 3], [4, 5], [6, 7]]


# ------------------------------------------------------------------------------------------------ IterableDataset

@pytest.mark.parametrize("kwargs", [
    dict(batch_size=2, num_workers=2),
    dict(batch_size=2, num_workers=3, drop_last=True),
    dict(batch_size=None, num_workers=2),
    dict(batch_size=4, num_workers=3, persistent_workers=True),
])
@pytest.mark.parametrize("shard", [True, False])
def test_iterable_dataset_with_workers_matches_torch(kwargs, shard):
    ours, theirs = loaders(lambda lib: ranges(lib, 3, 14, shard=shard), **kwargs)
    expected = [plain(b) for b in theirs]
    assert [plain(b) for b in ours] == expected
    if kwargs.get("persistent_workers"):
        assert [plain(b) for b in ours] == expected  # a second epoch from the same processes


def test_iterable_dataset_length_warning_matches_torch():
    def warnings_of(loader):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert len(loader) == 2
            batches = list(loader)
        return len(batches), [str(w.message).split("(when")[1] for w in caught if "Length of" in str(w.message)]

    ours, theirs = loaders(lambda lib: ranges(lib, 0, 6, shard=False, length=4), batch_size=2, num_workers=2)
    assert warnings_of(ours) == warnings_of(theirs)


# ------------------------------------------------------------------------------------------------ seeds

def test_worker_seeds_follow_torchs_rule():
    """torch seeds worker i with base_seed + i (its own generator and Python's random) and numpy with
    _generate_state(base_seed, i); tilewise does the same with tilewise's generator, and draws the base seed
    torch draws from the loader's generator (see [Note: sampler streams])."""
    from torch.utils.data._utils.worker import _generate_state

    base_seed = torch.empty((), dtype=torch.int64).random_(generator=torch.Generator().manual_seed(3)).item()
    for lib, loader_module, generator in ((tw, data, tw.Generator().manual_seed(3)),
                                          (torch, torch.utils.data, torch.Generator().manual_seed(3))):
        rows = [row for batch in loader_module.DataLoader(Seeds(lib), batch_size=3, num_workers=2,
                                                          generator=generator) for row in zip(*batch)]
        for worker_id, num_workers, seed, py, npy, own in ([v.item() if hasattr(v, "item") else v for v in row]
                                                          for row in rows[::3]):
            assert (num_workers, seed) == (2, base_seed + worker_id)
            assert py == random.Random(seed).random()
            assert npy == np.random.RandomState(_generate_state(base_seed, worker_id)).random()
            assert own == lib.rand(1, dtype=lib.float64, generator=lib.Generator().manual_seed(seed)).item()


class InitialSeeds(data.Dataset):
    """Each sample is the framework's ``initial_seed()`` inside the worker that read it, and that worker's id."""

    def __init__(self, lib) -> None:
        self.lib = lib

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i):
        return self.lib.initial_seed(), worker_info().id


@pytest.mark.parametrize("persistent", [False, True])
def test_initial_seed_in_workers_changes_per_worker_and_per_epoch_like_torch(persistent):
    """Each worker's ``initial_seed()`` is the epoch's base seed plus its id; a new epoch draws a new base seed,
    unless the workers persist (they keep the seed they started with), as in torch."""
    def pattern(lib, loader_module):
        lib.manual_seed(0)
        loader = loader_module.DataLoader(InitialSeeds(lib), batch_size=None, num_workers=2,
                                          persistent_workers=persistent)
        epochs = [[(int(seed), int(worker)) for seed, worker in loader] for _ in range(3)]
        bases = [epoch[0][0] for epoch in epochs]
        assert all(seed == base + worker for epoch, base in zip(epochs, bases) for seed, worker in epoch)
        assert all(0 <= base < 2**63 for base in bases)
        return [worker for epoch in epochs for _, worker in epoch], len(set(bases))

    assert pattern(tw, data) == pattern(torch, torch.utils.data)


def test_numpy_seed_mix_is_torchs():
    from torch.utils.data._utils.worker import _generate_state as theirs

    from tilewise.utils.data._worker import _generate_state as ours

    for base_seed, worker_id in [(0, 0), (1, 3), (2**63 - 1, 7), (123456789123, 31)]:
        assert ours(base_seed, worker_id) == theirs(base_seed, worker_id)


def test_worker_info_and_worker_init_fn():
    def init(worker_id):
        info = data.get_worker_info()
        info.dataset.tag = f"worker{worker_id}/{info.num_workers}"

    class Tagged(data.Dataset):
        tag = "main"

        def __len__(self):
            return 4

        def __getitem__(self, i):
            return self.tag

    dataset = Tagged()
    got = [b for b in data.DataLoader(dataset, batch_size=None, num_workers=2, worker_init_fn=init)]
    assert got == ["worker0/2", "worker1/2", "worker0/2", "worker1/2"] and dataset.tag == "main"
    assert data.get_worker_info() is None
    with pytest.raises(AttributeError):
        data.WorkerInfo(id=0, num_workers=1, seed=0, dataset=None).id = 1


# ------------------------------------------------------------------------------------------------ errors

@pytest.mark.parametrize("how,error", [("raise", ValueError), ("keyerror", KeyError)])
def test_worker_exception_is_raised_again_with_its_traceback(how, error):
    from torch._utils import ExceptionWrapper as TorchExceptionWrapper

    from tilewise.utils.data._worker import ExceptionWrapper

    message = _error_message(data.DataLoader(Failing(how), batch_size=2, num_workers=2), error)
    assert message.startswith(f"Caught {error.__name__} in DataLoader worker process 0.\nOriginal Traceback")
    assert "in __getitem__" in message and message.splitlines()[-1] == f"{error.__name__}: " + (
        "5" if error is KeyError else "item 5 is corrupt")
    try:  # torch's DataLoader raises what its ExceptionWrapper builds (not run end to end here: torch's failed
        Failing(how)[5]  # iterator takes 10 s to be collected)
    except error:
        wrapped = [wrapper(where="in DataLoader worker process 0") for wrapper in (ExceptionWrapper,
                                                                                  TorchExceptionWrapper)]
    raised = [_raised_by(w.reraise) for w in wrapped]
    assert raised[0] == raised[1]


def _error_message(loader, error) -> str:
    try:
        list(loader)
    except error as e:
        return e.args[0]
    raise AssertionError("the loader did not fail")


def _raised_by(reraise) -> tuple[type, str, str]:
    try:
        reraise()
    except Exception as e:
        return type(e), str(e.args[0]), repr(e)


def test_worker_init_fn_exception_is_raised_on_the_first_batch():
    def init(worker_id):
        raise RuntimeError(f"cannot open shard {worker_id}")

    with pytest.raises(RuntimeError, match="Caught RuntimeError in DataLoader worker process 0"):
        list(data.DataLoader(Squares(), num_workers=2, worker_init_fn=init))


def test_a_worker_whose_init_fn_failed_answers_every_task_with_that_error():
    """It used to answer the first task and die on the second (its fetcher was never made), so with two workers
    the main process could see a worker exit before the first batch's error arrived."""
    def init(worker_id):
        raise RuntimeError(f"cannot open shard {worker_id}")

    batches = iter(data.DataLoader(Squares(), num_workers=1, prefetch_factor=2, worker_init_fn=init))
    for _ in range(3):
        with pytest.raises(RuntimeError, match="Caught RuntimeError in DataLoader worker process 0(.|\n)*cannot "
                                               "open shard 0"):
            next(batches)


@pytest.mark.parametrize("how,cause", [
    ("kill", r"DataLoader worker \(pid \d+\) is killed by signal: Killed\. "),
    ("exit", r"DataLoader worker \(pid \d+\) exited unexpectedly with exit code 3\. Details are lost due to "
             r"multiprocessing\. Rerunning with num_workers=0 may give better error trace\."),
])
def test_a_dead_worker_is_reported_as_torch_reports_it(how, cause):
    import re

    before = children()
    start = time.monotonic()
    message, detail = _failure(data.DataLoader(Failing(how), batch_size=2, num_workers=2))
    assert re.fullmatch(r"DataLoader worker \(pid\(s\) \d+\) exited unexpectedly", message)
    assert re.fullmatch(cause, detail)
    assert time.monotonic() - start < 4  # noticed at once, not after torch's 5 s poll
    assert wait_until(lambda: children() <= before, 5)


def _failure(loader) -> tuple[str, str]:
    try:
        list(loader)
    except RuntimeError as e:
        return str(e), str(e.__cause__)
    raise AssertionError("the loader did not fail")


def test_timeout():
    loader = data.DataLoader(Failing("sleep", at=0), batch_size=2, num_workers=1, timeout=0.3)
    with pytest.raises(RuntimeError, match=r"^DataLoader timed out after 0.3 seconds$"):
        next(iter(loader))
    with pytest.raises(AssertionError, match="_SingleProcessDataLoaderIter requires timeout == 0"):
        next(iter(data.DataLoader(range(3), timeout=1)))
    with pytest.raises(AssertionError, match="_SingleProcessDataLoaderIter requires timeout == 0"):
        next(iter(torch.utils.data.DataLoader(range(3), timeout=1)))


def test_unpicklable_batch_is_reported_not_hung():
    got = data.DataLoader(Squares(), batch_size=2, num_workers=1, collate_fn=lambda b: (lambda: b))
    with pytest.raises(Exception, match="Caught .* in DataLoader worker process 0"):
        next(iter(got))


ARGUMENT_ERRORS = [
    dict(num_workers=-1), dict(timeout=-1), dict(prefetch_factor=2), dict(num_workers=1, prefetch_factor=-1),
    dict(persistent_workers=True), dict(multiprocessing_context="spawn"),
    dict(num_workers=1, multiprocessing_context="nope"), dict(num_workers=1, multiprocessing_context=3),
    dict(shuffle=True, sampler=[0]), dict(batch_sampler=[[0]], batch_size=2), dict(batch_size=None, drop_last=True),
]


@pytest.mark.parametrize("kwargs", ARGUMENT_ERRORS, ids=[str(k) for k in ARGUMENT_ERRORS])
def test_argument_errors_match_torch(kwargs):
    with pytest.raises(Exception) as theirs:
        torch.utils.data.DataLoader(Squares(), **kwargs)
    with pytest.raises(type(theirs.value)) as ours:
        data.DataLoader(Squares(), **kwargs)
    assert str(ours.value) == str(theirs.value)


def test_iterable_dataset_argument_errors_and_frozen_attributes_match_torch():
    for kwargs in (dict(shuffle=True), dict(sampler=None, batch_sampler=[[0]])):
        with pytest.raises(ValueError) as theirs:
            torch.utils.data.DataLoader(TorchRanges(0, 3), **kwargs)
        with pytest.raises(ValueError) as ours:
            data.DataLoader(Ranges(0, 3), **kwargs)
        assert str(ours.value).split(", but")[0] == str(theirs.value).split(", but")[0]
    ours, theirs = loaders(lambda lib: Squares(), batch_size=2)
    for attr in ("batch_size", "sampler", "dataset", "drop_last", "persistent_workers", "batch_sampler"):
        with pytest.raises(ValueError) as a:
            setattr(ours, attr, None)
        with pytest.raises(ValueError) as b:
            setattr(theirs, attr, None)
        assert str(a.value) == str(b.value)


def test_worker_count_warning_matches_torch():
    cpus = len(os.sched_getaffinity(0))
    messages = []
    for loader_module in (data, torch.utils.data):
        with pytest.warns(UserWarning, match="This DataLoader will create") as caught:
            loader_module.DataLoader(Squares(), num_workers=cpus + 1)
        messages.append(str(caught[0].message))
    assert messages[0] == messages[1]


def test_unpicklable_worker_arguments_warn_and_start_nothing():
    before = children()
    dataset = data.TensorDataset(tw.arange(4.0))
    with pytest.warns(UserWarning, match="Got pickle error when attempting to start a worker Process"):
        with pytest.raises(Exception, match="Can't pickle"):
            next(iter(data.DataLoader(dataset, num_workers=2, collate_fn=lambda b: b,
                                      multiprocessing_context="spawn")))
    # a helper the spawn context starts (its resource tracker) shows the parent's command line until it execs
    assert wait_until(lambda: children() <= before, 5)


def test_tasks_in_flight_follow_prefetch_factor_like_torch():
    for prefetch_factor in (1, 3):
        ours, theirs = loaders(lambda lib: Squares(), batch_size=2, num_workers=2, prefetch_factor=prefetch_factor)
        ours_iter, theirs_iter = iter(ours), iter(theirs)
        assert ours_iter._send_idx == theirs_iter._send_idx == 2 * prefetch_factor
        next(ours_iter), next(theirs_iter)
        assert ours_iter._send_idx == theirs_iter._send_idx == 2 * prefetch_factor + 1
        del ours_iter, theirs_iter


# ------------------------------------------------------------------------------------------------ shutdown

def test_workers_end_after_the_epoch_a_break_and_garbage_collection():
    before = children()
    loader = data.DataLoader(Squares(), batch_size=2, num_workers=3)
    list(loader)
    assert wait_until(lambda: children() <= before, 5)
    for i, _ in enumerate(loader):
        if i == 1:
            assert len(children() - before) == 3
            break
    assert wait_until(lambda: children() <= before, 5)
    iterator = iter(loader)
    next(iterator)
    workers = {w.pid for w in iterator._workers}
    assert workers <= children()
    del iterator
    assert wait_until(lambda: not (workers & children()), 5)


def test_workers_end_after_a_worker_exception_and_with_persistent_workers():
    before = children()
    with pytest.raises(ValueError):
        list(data.DataLoader(Failing("raise"), batch_size=2, num_workers=2))
    assert wait_until(lambda: children() <= before, 5)
    loader = data.DataLoader(Squares(), batch_size=4, num_workers=2, persistent_workers=True)
    first = [plain(b) for b in loader]
    pids = {w.pid for w in loader._iterator._workers}
    for i, _ in enumerate(loader):
        if i == 2:
            break
    assert [plain(b) for b in loader] == first and {w.pid for w in loader._iterator._workers} == pids
    assert pids <= children()
    del loader
    assert wait_until(lambda: not (pids & children()), 5)


SCRIPT = textwrap.dedent("""
    import os, sys, time
    import tilewise as tw
    from tilewise.utils.data import DataLoader, Dataset

    class Slow(Dataset):
        def __len__(self):
            return 10**6

        def __getitem__(self, i):
            time.sleep(0.01)
            return i

    for i, batch in enumerate(DataLoader(Slow(), batch_size=4, num_workers=2)):
        if i == 1:
            print("ready", flush=True)
""")


def _start_loader_process(tmp_path):
    script = tmp_path / "loader.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": python_path(os.getcwd())}
    process = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               env=env, start_new_session=True, text=True)
    assert process.stdout.readline() == "ready\n"
    assert wait_until(lambda: len(in_session(process.pid)) == 3, 5)
    return process


@pytest.mark.parametrize("whom", ["group", "main"])
def test_ctrl_c_leaves_no_worker_behind(tmp_path, whom):
    process = _start_loader_process(tmp_path)
    if whom == "group":  # Ctrl-C in a terminal: every process of the foreground group gets SIGINT
        os.killpg(process.pid, signal.SIGINT)
    else:
        os.kill(process.pid, signal.SIGINT)
    _, err = process.communicate(timeout=20)
    assert "KeyboardInterrupt" in err and err.count("Traceback") == 1, err
    assert wait_until(lambda: not in_session(process.pid), 5)


@pytest.mark.slow
def test_workers_leave_when_the_main_process_is_killed(tmp_path):
    process = _start_loader_process(tmp_path)
    os.kill(process.pid, signal.SIGKILL)
    process.communicate(timeout=10)
    assert wait_until(lambda: not in_session(process.pid), 12)


@pytest.mark.slow
def test_spawn_start_method():
    ours, theirs = loaders(lambda lib: Squares(9), batch_size=4, num_workers=2, multiprocessing_context="spawn")
    assert [plain(b) for b in ours] == [plain(b) for b in theirs]


def test_forkserver_start_method_with_a_context_object():
    import multiprocessing

    dataset = data.TensorDataset(tw.arange(10.0).view(5, 2), tw.arange(5))  # the workers import no test module
    loader = data.DataLoader(dataset, batch_size=2, num_workers=2,
                             multiprocessing_context=multiprocessing.get_context("forkserver"))
    assert [plain(b) for b in loader] == [plain(b) for b in data.DataLoader(dataset, batch_size=2)]


# ------------------------------------------------------------------------------------------------ shared memory

def test_batches_arrive_in_shared_memory_without_a_copy():
    loader = data.DataLoader(Squares(), batch_size=4, num_workers=1)
    batch = next(iter(loader))
    storage = batch["sq"].untyped_storage()
    base = storage.data.base
    assert isinstance(getattr(base, "obj", base), _shared_memory.SharedMapping)
    assert batch["sq"].tolist() == [[i, i * i] for i in range(4)] and batch["sq"].dtype is tw.int32
    batch["sq"].add_(1)  # a received batch is an ordinary writable tensor
    assert batch["sq"][0].tolist() == [1, 1]


def test_shared_memory_round_trip_keeps_views_dtypes_and_autograd_leaves():
    import socket
    import threading

    a, b = socket.socketpair()
    shared = _shared_memory.shared_empty((3, 4), tw.float32)
    shared.copy_(tw.arange(12.0).view(3, 4))
    private = tw.arange(12.0).view(3, 4)
    many = [tw.full((2,), float(k)) for k in range(300)]  # more files than one message can carry
    sent = {"t": shared.t(), "row": shared[1], "private": private.t(), "bf16": tw.ones(3, dtype=tw.bfloat16),
            "bool": tw.tensor([True, False]), "empty": tw.zeros(0, 5), "leaf": tw.ones(2, requires_grad=True),
            "many": many, "text": "x" * 300_000}  # larger than the socket's buffer
    sender = threading.Thread(target=_shared_memory.send, args=(a, sent))
    sender.start()
    got = _shared_memory.recv(b)
    sender.join()
    assert got["t"].tolist() == shared.t().tolist() and got["t"].stride() == (1, 4)
    assert got["t"].untyped_storage() is got["row"].untyped_storage()  # views of shared memory stay views of it
    assert got["private"].tolist() == private.t().tolist() and got["private"].is_contiguous()  # only the view is sent
    assert got["bf16"].dtype is tw.bfloat16 and got["bool"].tolist() == [True, False]
    assert got["empty"].shape == (0, 5) and got["leaf"].requires_grad and got["leaf"].is_leaf
    assert [t.tolist() for t in got["many"]] == [t.tolist() for t in many] and len(got["text"]) == 300_000
    with pytest.raises(RuntimeError, match="Cowardly refusing to serialize non-leaf tensor"):
        _shared_memory.send(a, tw.ones(2, requires_grad=True) * 2)
    a.close()
    with pytest.raises(EOFError):
        _shared_memory.recv(b)
    b.close()


def test_pinning_thread_pins_every_batch(monkeypatch):
    pinned = []

    def fake_pin(self):
        pinned.append(tuple(self.shape))
        return self

    monkeypatch.setattr(data.dataloader, "_pinning_available", lambda: True)
    monkeypatch.setattr(tw.Tensor, "pin_memory", fake_pin)
    monkeypatch.setattr(tw.cuda, "set_device", lambda device: None)
    monkeypatch.setattr(tw.cuda, "current_device", lambda: 0)
    loader = data.DataLoader(Squares(8), batch_size=4, num_workers=2, pin_memory=True)
    batches = [plain(b) for b in loader]
    assert batches == [plain(b) for b in data.DataLoader(Squares(8), batch_size=4)]
    assert sorted(pinned) == [(4,)] * 6 + [(4, 2)] * 2  # i, p.x, p.y and sq, of two batches


@pytest.mark.cuda
def test_pinned_batches_from_workers_on_a_gpu():
    loader = data.DataLoader(Squares(8), batch_size=4, num_workers=2, pin_memory=True)
    for batch in loader:
        assert batch["sq"].is_pinned() and batch["sq"].to("cuda", non_blocking=True).cpu().tolist()


# ------------------------------------------------------------------------------------------------ samplers

def test_random_sampler_with_replacement_is_lazy_and_reproducible():
    sampler = data.RandomSampler(range(7), replacement=True, num_samples=10**10,
                                 generator=tw.Generator().manual_seed(0))
    start = time.monotonic()
    first = list(itertools.islice(iter(sampler), 100))
    assert time.monotonic() - start < 1 and len(sampler) == 10**10 and set(first) <= set(range(7))
    sampler.generator.manual_seed(0)
    assert list(itertools.islice(iter(sampler), 100)) == first
    more = data.RandomSampler(range(5), num_samples=12, generator=tw.Generator().manual_seed(1))
    drawn = list(more)
    assert len(drawn) == 12 and sorted(drawn[:5]) == sorted(drawn[5:10]) == list(range(5))


@pytest.mark.parametrize("kwargs", [dict(replacement=1), dict(num_samples=0), dict(num_samples=2.5)])
def test_random_sampler_errors_match_torch(kwargs):
    with pytest.raises(Exception) as theirs:
        torch.utils.data.RandomSampler(range(3), **kwargs)
    with pytest.raises(type(theirs.value), match=str(theirs.value).replace("(", r"\(").replace(")", r"\)")):
        data.RandomSampler(range(3), **kwargs)


def test_weighted_subset_and_batch_samplers():
    weighted = data.WeightedRandomSampler([0.0, 3.0, 1.0, 0.0], 400, generator=tw.Generator().manual_seed(0))
    draws = list(weighted)
    assert set(draws) == {1, 2} and 250 < draws.count(1) < 350 and len(weighted) == 400
    weighted.generator.manual_seed(0)
    assert list(weighted) == draws
    once = list(data.WeightedRandomSampler([1, 1, 1, 1], 4, replacement=False))
    assert sorted(once) == [0, 1, 2, 3]
    for kwargs, error in ((dict(weights=[1.0], num_samples=0), ValueError),
                          (dict(weights=[[1.0]], num_samples=1), ValueError),
                          (dict(weights=[1.0], num_samples=1, replacement=0), ValueError)):
        with pytest.raises(error) as theirs:
            torch.utils.data.WeightedRandomSampler(**kwargs)
        with pytest.raises(error) as ours:
            data.WeightedRandomSampler(**kwargs)
        assert str(ours.value) == str(theirs.value)
    subset = data.SubsetRandomSampler([10, 20, 30], generator=tw.Generator().manual_seed(0))
    assert sorted(subset) == [10, 20, 30] and len(subset) == 3
    for drop_last in (False, True):
        ours = data.BatchSampler(data.SequentialSampler(range(10)), 3, drop_last)
        theirs = torch.utils.data.BatchSampler(torch.utils.data.SequentialSampler(range(10)), 3, drop_last)
        assert list(ours) == list(theirs) and len(ours) == len(theirs)
    with pytest.raises(ValueError, match="drop_last should be a boolean value"):
        data.BatchSampler(range(3), 2, 1)


@pytest.mark.parametrize("n,replicas,drop_last", [(10, 3, False), (10, 3, True), (2, 4, False), (12, 4, True),
                                                  (7, 7, False)])
def test_distributed_sampler_matches_torch_without_shuffle(n, replicas, drop_last):
    for rank in range(replicas):
        ours = data.DistributedSampler(range(n), num_replicas=replicas, rank=rank, shuffle=False, drop_last=drop_last)
        theirs = torch.utils.data.DistributedSampler(range(n), num_replicas=replicas, rank=rank, shuffle=False,
                                                     drop_last=drop_last)
        assert list(ours) == list(theirs) and len(ours) == len(theirs)


def test_distributed_sampler_shuffles_by_epoch_and_partitions():
    def shares(epoch):
        samplers = [data.DistributedSampler(range(11), num_replicas=3, rank=r, seed=5) for r in range(3)]
        for s in samplers:
            s.set_epoch(epoch)
        return [list(s) for s in samplers]

    first = shares(0)
    assert sorted(itertools.chain(*first))[:11] != [] and set(itertools.chain(*first)) == set(range(11))
    assert all(len(share) == 4 for share in first) and shares(0) == first and shares(1) != first
    with pytest.raises(ValueError, match=r"Invalid rank 3, rank should be in the interval \[0, 2\]"):
        data.DistributedSampler(range(3), num_replicas=3, rank=3)
    errors = []
    for sampler in (data.DistributedSampler, torch.utils.data.DistributedSampler):
        with pytest.raises(ValueError) as info:  # torch's error: no process group to read the rank from
            sampler(range(3))
        errors.append(str(info.value))
    assert errors[0] == errors[1]


# ------------------------------------------------------------------------------------------------ datasets

def test_random_split_stack_chain_concat_and_subset_match_torch():
    for lengths in ([0.5, 0.3, 0.2], [0.34, 0.33, 0.33], [3, 7], [1.0, 0.0]):
        with warnings.catch_warnings(record=True) as ours_warned:
            warnings.simplefilter("always")
            ours = data.random_split(range(10), lengths, generator=tw.Generator().manual_seed(0))
        with warnings.catch_warnings(record=True) as theirs_warned:
            warnings.simplefilter("always")
            theirs = torch.utils.data.random_split(range(10), lengths, generator=torch.Generator().manual_seed(0))
        assert [len(s) for s in ours] == [len(s) for s in theirs]
        assert sorted(itertools.chain(*(s.indices for s in ours))) == list(range(10))
        assert [str(w.message) for w in ours_warned] == [str(w.message) for w in theirs_warned]
    for bad in ([0.5, 0.6], [-0.5, 1.5], [3, 3]):
        with pytest.raises(ValueError) as theirs:
            torch.utils.data.random_split(range(10), bad)
        with pytest.raises(ValueError) as ours:
            data.random_split(range(10), bad)
        assert str(ours.value) == str(theirs.value)

    def build(module):
        lib = tw if module is data else torch
        stacked = module.StackDataset(a=range(4), b="wxyz")
        return [stacked[2], stacked.__getitems__([0, 3]), module.StackDataset(range(2), [5, 6])[1],
                list(module.ChainDataset([ranges(lib, 0, 2), ranges(lib, 5, 7)])),
                len(module.ChainDataset([ranges(lib, 0, 2)])),
                module.ConcatDataset([range(3), range(10, 12)])[4], module.Subset(range(10), [9, 2]).__getitems__([1]),
                list(module.DataLoader(ranges(lib, 0, 2) + ranges(lib, 4, 5), batch_size=None))]

    assert plain(build(data)) == plain(build(torch.utils.data))
    for make in (lambda m: m.StackDataset(range(2), range(3)), lambda m: m.StackDataset(),
                 lambda m: m.ConcatDataset([]),
                 lambda m: m.ConcatDataset([ranges(tw if m is data else torch, 0, 1)]),
                 lambda m: m.StackDataset(range(2), a=range(2))):
        with pytest.raises(Exception) as theirs:
            make(torch.utils.data)
        with pytest.raises(type(theirs.value)) as ours:
            make(data)
        assert str(ours.value) == str(theirs.value)


def test_module_paths_like_torch():
    import importlib

    for name in ("dataloader", "dataset", "sampler", "distributed"):
        ours = importlib.import_module(f"tilewise.utils.data.{name}")
        theirs = importlib.import_module(f"torch.utils.data.{name}")
        public = [n for n in getattr(theirs, "__all__", []) if not n.startswith("_")]
        assert all(hasattr(ours, n) for n in public), (name, [n for n in public if not hasattr(ours, n)])


@pytest.mark.parametrize("module", ["dataloader", "dataset", "sampler", "distributed", "collate", "_worker_info"])
def test_docstring_examples_run(module):
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(f"tilewise.utils.data.{module}"))
    assert result.failed == 0 and result.attempted > 0

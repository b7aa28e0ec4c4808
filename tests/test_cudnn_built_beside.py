"""cuDNN graphs built on builder threads (see [Note: cuDNN graphs built beside] in backends/cuda/cudnn.py), with a
frontend standing in for cuDNN's: builds run at once, each on its thread's own handle; the graph asked for is the
builder's, deserialized onto the device's handle; what a build raises is raised where the graph is asked for; a
graph that cannot be serialized is built in place; one build per identity, none for a plan already stored."""

from __future__ import annotations

import json
import threading

import pytest

from tilewise.backends.cuda import cudnn
from tilewise.codegen.toolchain.disk import DiskCache
from tilewise.config import settings


class _Operand:
    def __init__(self, uid: int):
        self.uid = uid

    def get_uid(self) -> int:
        return self.uid


class _FrontendGraph:
    def __init__(self, handle=None, **_):
        self.handle, self.data, self.serializable = handle, None, True

    def serialize(self, as_bytes=False):
        if not self.serializable:
            raise RuntimeError("this plan cannot be serialized")
        return b"plan built on " + str(id(self.handle)).encode()

    def deserialize(self, handle, data):
        self.handle, self.data = handle, data

    def get_workspace_size(self):
        return 0


class _Frontend:
    def pygraph(self, **kwargs):
        return _FrontendGraph(**kwargs)


@pytest.fixture
def frontend(monkeypatch, tmp_path):
    """A stand-in frontend whose builder handles are recorded per thread; the device's own handle is ``main``."""
    main = object()
    handles: dict[str, object] = {}

    def builder_handle(device):
        return handles.setdefault(threading.current_thread().name, object())

    monkeypatch.setattr(cudnn, "_module", [_Frontend()])
    monkeypatch.setitem(cudnn._handles, 0, main)
    monkeypatch.setattr(cudnn, "_builder_handle", builder_handle)
    monkeypatch.setattr(cudnn, "_plan_entry", lambda identity, device: repr(identity).encode().hex()[:40] + ".plan")
    monkeypatch.setattr(cudnn, "_plan_disk", [DiskCache(tmp_path / "cudnn-plans", "test plans")])
    monkeypatch.setattr(cudnn, "_beside", {})
    monkeypatch.setattr(settings, "cudnn_plans_on_disk", True)
    return main, handles


def _never_in_place():
    pytest.fail("built in place")


def test_builds_run_at_once_on_their_own_handles_and_are_deserialized_onto_the_devices(frontend):
    main, handles = frontend
    both_started = threading.Barrier(2, timeout=10)  # each build waits for the other: they run at once

    def build(uid, handle):
        both_started.wait()
        return _FrontendGraph(handle), [_Operand(uid), _Operand(uid + 1), 7]

    before = dict(cudnn._plan_stats)
    for identity, uid in (("forward",), 1), (("backward",), 10):
        cudnn.build_beside(identity, 0, lambda handle, uid=uid: build(uid, handle))
    forward = cudnn.cached_graph(("forward",), 0, "attention", _never_in_place)
    backward = cudnn.cached_graph(("backward",), 0, "attention", _never_in_place)
    assert len(handles) == 2 and main not in handles.values(), handles
    for graph, uid in (forward, 1), (backward, 10):
        assert graph.handle is main and graph.graph.handle is main  # runs on the device's handle
        assert graph.uids == [uid, uid + 1, 7]
        assert graph.graph.data.startswith(b"plan built on ")
        assert graph.graph.data != f"plan built on {id(main)}".encode()
    assert not cudnn._beside
    assert cudnn._plan_stats["built"] - before["built"] == 2
    assert cudnn._plan_stats["stored"] - before["stored"] == 2  # a later process loads them
    header, _ = cudnn._plan_store().read(cudnn._plan_entry(("forward",), 0)).split(b"\n", 1)
    assert json.loads(header) == {"uids": [1, 2, 7]}


def test_what_a_build_raises_is_raised_where_its_graph_is_asked_for(frontend):
    def build(handle):
        raise ValueError("no engine for this configuration")

    cudnn.build_beside(("attention", 1), 0, build)
    with pytest.raises(ValueError, match="no engine for this configuration"):
        cudnn.cached_graph(("attention", 1), 0, "attention", _never_in_place)


@pytest.mark.parametrize("on_disk", [True, False])
def test_a_graph_that_cannot_be_serialized_is_built_in_place(frontend, monkeypatch, on_disk):
    monkeypatch.setattr(settings, "cudnn_plans_on_disk", on_disk)

    def build(handle):
        graph = _FrontendGraph(handle)
        graph.serializable = False
        return graph, [_Operand(1)]

    in_place = []
    cudnn.build_beside(("attention", 2), 0, build)
    made = cudnn.cached_graph(("attention", 2), 0, "attention",
                              lambda: in_place.append(1) or cudnn.Graph(_FrontendGraph(frontend[0]), [3], 0))
    assert in_place == [1] and made.uids == [3]


def test_one_build_per_identity_and_none_for_a_stored_plan(frontend):
    started = []

    def build(handle):
        started.append(1)
        return _FrontendGraph(handle), [_Operand(1)]

    for _ in range(3):
        cudnn.build_beside(("attention", 3), 0, build)
    cudnn.cached_graph(("attention", 3), 0, "attention", _never_in_place)
    cudnn.build_beside(("attention", 3), 0, build)  # stored on the disk by the first: loaded, not built
    assert started == [1] and not cudnn._beside
    loaded = cudnn.cached_graph(("attention", 3), 0, "attention", _never_in_place)
    assert loaded.uids == [1]

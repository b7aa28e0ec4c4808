"""What every cuDNN call shares: the frontend module, a handle per device, workspaces, built graphs.

[Note: cuDNN graphs] Attention (``attention.py``) and convolution (``convolution.py``) run as graphs of the cuDNN
frontend (nvidia-cudnn-frontend, in the ``[cuda]`` extra). A graph is built once per operand geometry —
validation, heuristics and the kernel build take milliseconds — and kept; :class:`Graph` then binds raw device
addresses at every run.

Workspaces: graphs share one workspace per device, grown (never shrunk) to the largest a graph has asked for;
every graph runs on the device's current stream, in order, so sharing it is safe, and the memory held is the
largest single request instead of the sum of every graph's. A compiled program's CUDA graph bakes in the address
a run used, so a workspace current when a capture begins (``note_capture``) stays allocated for good; one that
no capture saw goes back to the allocator when a larger one replaces it, or when ``tilewise.cuda.empty_cache`` runs
(``release_workspace``; the next graph run allocates one again).

[Note: cuDNN plans on disk] Building a graph (heuristics, support checks, and for attention the compile of its
fused kernel) takes 0.1-0.4 s, once per operand geometry and process: a ResNet-50 step meets about 150
convolution graphs, a transformer's attention two per geometry. Each graph built is serialized (the frontend's
``serialize``: its selected plan, with the kernels it compiled) into the cache directory, keyed by what the graph
was built for (operation, geometry, dtypes, numerics), the GPU's name and the cuDNN version; a later process
deserializes it instead of building. An entry that fails to load or to run its first call is dropped and the
graph built as before; ``TILEWISE_CUDNN_PLANS=0`` builds every graph afresh.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable

from tilewise.backends.cuda.device_memory import DeviceBuffer, stream_handle
from tilewise.config import settings

_module: list = []  # [module] once imported, [None, reason] when it cannot be
_handles: dict[int, object] = {}
_workspaces: dict[int, list[DeviceBuffer]] = {}  # per device: the current workspace last, before it those captured
_captures = [0]  # CUDA graph captures begun in this process
_current_since: dict[int, int] = {}  # device -> the capture count when its current workspace became current


def library():
    """The cuDNN frontend module, or None where it is not installed (:func:`unavailable` says why)."""
    if not _module:
        try:
            import cudnn

            _module.append(cudnn)
        except Exception as e:  # noqa: BLE001 — a missing or broken install: callers run their decompositions
            _module.extend((None, f"the cuDNN frontend (nvidia-cudnn-frontend) could not be imported: {e}"))
    return _module[0]


def unavailable() -> str | None:
    """Why cuDNN cannot be used in this process, or None when it can."""
    return _module[1] if library() is None else None


def handle(device: int):
    """The device's cuDNN handle, shared by every graph on it."""
    found = _handles.get(device)
    if found is None:
        from tilewise.backends.cuda.runtime import ensure_context

        ensure_context(device)
        found = _handles[device] = library().create_handle()
    return found


def workspace(device: int, nbytes: int) -> int:
    """The address of the device's current workspace, grown to at least ``nbytes`` if it is smaller."""
    if nbytes <= 0:
        return 0
    held = _workspaces.setdefault(device, [])
    if not held or held[-1].nbytes < nbytes:
        size = max(nbytes, held[-1].nbytes * 5 // 4) if held else nbytes
        if held and _current_since[device] == _captures[0]:
            held.pop()  # no CUDA graph holds its address: back to the allocator (in stream order)
        held.append(DeviceBuffer(size, device, stream_handle(device)))
        _current_since[device] = _captures[0]
    return held[-1].ptr


def release_workspace(device: int) -> None:
    """Give the device's current workspace back to the allocator where no CUDA graph captured its address."""
    held = _workspaces.get(device)
    if held and _current_since.get(device) == _captures[0]:
        held.pop()
        _current_since[device] = -1  # what is left was captured: a larger one goes beside it, never in its place


def note_capture() -> None:
    """A CUDA graph capture begins: the workspaces current now stay allocated for good (the graph keeps their
    addresses), see [Note: cuDNN graphs]."""
    _captures[0] += 1


def workspace_bytes(device: int) -> int:
    """Bytes held in cuDNN workspaces on ``device``."""
    return sum(b.nbytes for b in _workspaces.get(device, ()))


# ---------------------------------------------------------------------------------------------- plans on disk

_plan_disk: list = []
_plan_stats = {"loaded": 0, "built": 0, "stored": 0, "rejected": 0}  # what the tests and benchmarks read


def _plan_store():
    if not _plan_disk:
        from tilewise.codegen.toolchain.cache import default_cache_dir
        from tilewise.codegen.toolchain.disk import DiskCache

        _plan_disk.append(DiskCache(default_cache_dir() / "cudnn-plans", "cuDNN plan cache"))
    return _plan_disk[0]


def _plan_entry(identity: tuple, device: int) -> str:
    from tilewise.backends.cuda.runtime import get_device_properties

    frontend = library()
    version = getattr(frontend, "backend_version", lambda: 0)()
    text = repr((identity, get_device_properties(device).name, version, getattr(frontend, "__version__", ""),
                 "plan-v1"))
    return hashlib.sha256(text.encode()).hexdigest()[:40] + ".plan"


def cached_graph(identity: tuple, device: int, name: str, build: Callable[[], Graph]) -> Graph:
    """The graph ``build`` makes for ``identity`` (everything it depends on but the device), loaded from the disk
    when an earlier process stored it (see [Note: cuDNN plans on disk])."""
    if not settings.cudnn_plans_on_disk:
        return build()
    entry = _plan_entry(identity, device)
    payload = _plan_store().read(entry)
    if payload is not None:
        loaded = _deserialized(payload, device, name, entry)
        if loaded is not None:
            _plan_stats["loaded"] += 1
            loaded.rebuild = build
            return loaded
    built = build()
    _plan_stats["built"] += 1
    try:
        data = built.graph.serialize(as_bytes=True)
        header = json.dumps({"uids": built.uids}).encode()
        if _plan_store().write(entry, header + b"\n" + bytes(data)) is not None:
            _plan_stats["stored"] += 1
    except Exception:  # noqa: BLE001, S110 — a plan not stored is built again by the next process
        pass
    return built


def _deserialized(payload: bytes, device: int, name: str, entry: str) -> Graph | None:
    try:
        header, data = payload.split(b"\n", 1)
        uids = [int(u) for u in json.loads(header)["uids"]]
        frontend = library()
        graph = frontend.pygraph(handle=handle(device))
        graph.deserialize(handle(device), data)
        return Graph(graph, uids, device, name, entry=entry)
    except Exception:  # noqa: BLE001 — an entry this cuDNN cannot read: built afresh (and stored over it)
        _plan_stats["rejected"] += 1
        return None


def _reject(graph: Graph) -> None:
    """A loaded plan whose first run failed: forgotten on disk, so that the next process builds it."""
    _plan_stats["rejected"] += 1
    try:
        _plan_store().path_for(graph.entry).unlink(missing_ok=True)
    except OSError:
        pass


class Graph:
    """One built cuDNN graph with its workspace; ``run`` binds raw addresses, in ``operands``' order.

    The frontend's ``execute`` normalises its arguments in Python at every call (about 60 µs, longer than a
    small kernel); the graph it lowered to, which that call ends in, takes a {uid: address} map directly
    (about 12 µs). The first run goes through ``execute``, which also finishes preparing the plan; later runs
    call the lowered graph when the frontend has one serving the plan, else ``execute`` again."""

    def __init__(self, graph, operands: list, device: int, name: str = "", entry: str | None = None):
        """``operands``: the frontend's tensors, or their uids (a graph loaded from the disk, whose ``entry``
        names it there until its first run succeeds)."""
        self.graph, self.operands, self.device, self.name = graph, operands, device, name
        self.handle = handle(device)
        self.uids = [t if isinstance(t, int) else t.get_uid() for t in operands]
        self.workspace_size = graph.get_workspace_size()
        workspace(device, self.workspace_size)
        self.lowered = None
        self.entry = entry
        self.rebuild: Callable[[], Graph] | None = None  # a loaded graph's way to be built instead

    def run(self, pointers: list[int], stream: int) -> None:
        _module[0].set_stream(self.handle, stream)  # the handle is the device's, shared by every graph; the
        # frontend skips the backend call when the stream is the one it has
        ws = workspace(self.device, self.workspace_size)
        if self.lowered is not None:
            self.lowered(dict(zip(self.uids, pointers)), ws, self.handle.backend_handle, None, None, None)
            return
        if self.entry is not None:  # a loaded plan's first run: on failure, dropped from the disk and built
            try:
                self.graph.execute(dict(zip(self.operands, pointers)), ws or None, handle=self.handle)
            except Exception:  # noqa: BLE001 — the graph is built as if nothing had been stored
                _reject(self)
                self.__dict__.update(self.rebuild().__dict__)
                ws = workspace(self.device, self.workspace_size)
                self.graph.execute(dict(zip(self.operands, pointers)), ws or None, handle=self.handle)
            self.entry = self.rebuild = None  # (the builder holds the first call's operands)
        else:
            self.graph.execute(dict(zip(self.operands, pointers)), ws or None, handle=self.handle)
        lowered = getattr(self.graph, "_lowered_graph", None)
        if getattr(self.graph, "selected_engine", None) is None and lowered is not None \
                and hasattr(lowered, "_execute"):
            self.lowered = lowered._execute

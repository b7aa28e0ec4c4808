"""Chrome trace-event JSON of one recording, as Perfetto and chrome://tracing read it.

[Note: chrome trace] Host ranges are complete ("X") events on the process's track, one thread track per native
thread id; since each thread's ranges were opened and closed on a stack, each track nests properly. Device
kernels, copies and memsets are "X" events (categories ``kernel``, ``gpu_memcpy``, ``gpu_memset``, with torch's
args: stream, correlation, grid, block, registers per thread, shared memory) on a pseudo-process per device
("CUDA GPU k") with one track per stream ("stream N"), and a flow ("s" at the launching host range, "f" binding
to the kernel's start, numbered by CUPTI's correlation id where there is one, leaving from the API call that
launched it where CUPTI saw one) links each launch to its kernel, as torch's ``ac2g`` flows do. Memory records
are torch's ``[memory]`` instant events ("i", thread scope, with Bytes / Total Allocated / Device Type / Device
Id / Addr) plus a counter ("C") per device, so the allocated bytes draw as a graph. Times are microseconds on
the profiler's clock; the file is written through ``fileio.atomic_writer``, so a reader never sees half a
trace.
"""

from __future__ import annotations

import gzip
import json
import os

from tilewise.fileio import atomic_writer
from tilewise.profiler.events import DeviceType

DEVICE_PID_BASE = 1 << 23  # above any Linux pid (pid_max is at most 2**22), so device tracks never meet the host's


def _us(value: float) -> float:
    return round(value, 3)


def host_event(event, pid: int) -> dict:
    args = {"External id": event.id, **event.args}
    if event.input_shapes:
        args["Input Dims"] = event.input_shapes
    if event.stack:
        args["Call stack"] = ";".join(event.stack)
    if event.flops:
        args["flops"] = event.flops
    return {"ph": "X", "cat": event.kind, "name": event.trace_name or event.name, "pid": pid, "tid": event.thread,
            "ts": _us(event.start_us), "dur": _us(event.end_us - event.start_us), "args": args}


CATEGORIES = {"kernel": "kernel", "memcpy": "gpu_memcpy", "memset": "gpu_memset"}


def device_event(kernel, external_id: int | None) -> dict:
    args = {"device": kernel.device, "stream": kernel.stream, "correlation": kernel.correlation}
    if external_id is not None:
        args["External id"] = external_id
    if kernel.kind == "kernel" and kernel.grid:
        args.update({"registers per thread": kernel.registers, "shared memory": kernel.shared_memory,
                     "grid": list(kernel.grid), "block": list(kernel.block)})
    elif kernel.kind != "kernel":
        args["bytes"] = kernel.nbytes
    return {"ph": "X", "cat": CATEGORIES.get(kernel.kind, "kernel"), "name": kernel.name,
            "pid": DEVICE_PID_BASE + kernel.device, "tid": kernel.stream, "ts": _us(kernel.start),
            "dur": _us(kernel.duration), "args": args}


class FlowIds:
    """A flow's id: CUPTI's correlation id of the launch where it has one and it is still free (a graph launch
    correlates all its kernels with one call; each flow needs its own id), else the next unused number."""

    def __init__(self):
        self.used: set[int] = set()
        self.next = 1 << 40  # above any correlation id CUPTI hands out in one recording

    def take(self, correlation: int) -> int:
        if correlation and correlation not in self.used:
            self.used.add(correlation)
            return correlation
        self.next += 1
        return self.next


def device_events(event, pid: int, flows: FlowIds) -> list[dict]:
    """The kernels ``event`` launched, each with the flow that ties it to the launch."""
    found = []
    for kernel in event.kernels:
        flow = flows.take(kernel.correlation)
        found.append(device_event(kernel, event.id))
        launched = kernel.launch_us if kernel.launch_us is not None else event.start_us
        found.append({"ph": "s", "id": flow, "cat": "ac2g", "name": "ac2g", "pid": pid, "tid": event.thread,
                      "ts": _us(launched)})
        found.append({"ph": "f", "id": flow, "cat": "ac2g", "name": "ac2g", "bp": "e",
                      "pid": DEVICE_PID_BASE + kernel.device, "tid": kernel.stream, "ts": _us(kernel.start)})
    return found


def memory_events(record, pid: int) -> list[dict]:
    device_type, _, index = record.device.partition(":")
    on_cpu = device_type == "cpu"
    ts = _us(record.ts_ns / 1000)
    return [
        {"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": pid, "tid": record.thread,
         "ts": ts, "args": {"Total Allocated": record.total, "Bytes": record.nbytes,
                            "Device Type": 0 if on_cpu else 1, "Device Id": -1 if on_cpu else int(index or 0),
                            "Addr": record.addr}},
        {"ph": "C", "name": f"Memory allocated ({record.device})", "pid": pid, "ts": ts,
         "args": {"bytes": record.total}},
    ]


def metadata_events(pid: int, threads: set[int], streams: set[tuple[int, int]]) -> list[dict]:
    found = [{"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": "python"}},
             {"ph": "M", "name": "process_labels", "pid": pid, "tid": 0, "args": {"labels": "CPU"}}]
    found += [{"ph": "M", "name": "thread_name", "pid": pid, "tid": t, "args": {"name": f"thread {t} (python)"}}
              for t in sorted(threads)]
    for d in sorted({device for device, _ in streams}):
        found.append({"ph": "M", "name": "process_name", "pid": DEVICE_PID_BASE + d, "tid": 0,
                      "args": {"name": f"CUDA GPU {d}"}})
    found += [{"ph": "M", "name": "thread_name", "pid": DEVICE_PID_BASE + d, "tid": stream,
               "args": {"name": f"stream {stream}"}} for d, stream in sorted(streams)]
    return found


def trace_events(recorder, events) -> list[dict]:
    pid = os.getpid()
    host = [e for e in events if e.device_type is DeviceType.CPU]
    found, flows = [], FlowIds()
    for event in host:
        found.append(host_event(event, pid))
        found += device_events(event, pid, flows)
    unclaimed = getattr(recorder, "unclaimed_kernels", [])
    found += [device_event(kernel, None) for kernel in unclaimed]
    for record in recorder.memory:
        found += memory_events(record, pid)
    threads = {e.thread for e in host} | {r.thread for r in recorder.memory}
    streams = {(k.device, k.stream) for e in host for k in e.kernels} | {(k.device, k.stream) for k in unclaimed}
    return metadata_events(pid, threads, streams) + sorted(found, key=lambda e: e["ts"])


def write_chrome_trace(path: str, recorder, events, metadata: dict) -> None:
    document = {"schemaVersion": 1, **metadata, "displayTimeUnit": "ms", "traceEvents": trace_events(recorder, events),
                "traceName": os.fspath(path)}
    data = json.dumps(document).encode()
    if os.fspath(path).endswith(".gz"):  # as torch's export: a path ending in .gz is written gzip-compressed
        data = gzip.compress(data)
    with atomic_writer(path, durable=False) as file:
        file.write(data)

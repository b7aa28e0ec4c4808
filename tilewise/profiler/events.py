"""The profiler's results: events, their averages by key, and torch's summary table.

[Note: profiler events] A ``FunctionEvent`` is one host range (an operator call, a ``record_function`` block,
a compiled program or one of its steps) with its thread, its interval in microseconds since the profiler's
clock origin, its children and parent, and what it attributes to itself: memory allocated or freed while it
was the innermost open range, and the device kernels it launched. Every figure torch derives (self time,
totals, device time, memory with and without children) is derived here the same way, from the tree:
``self`` is the total less the children's totals. ``EventList.key_averages`` folds events of one key (the
name, and the input shapes or stack when asked) into a ``FunctionEventAvg``, and ``table`` lays them out
exactly as torch's ``_build_table`` does (same columns, widths, units and footer), so a profile of tilewise
reads like one of torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum


class DeviceType(Enum):
    CPU = 0
    CUDA = 1


@dataclass
class Interval:
    start: float = 0.0  # microseconds
    end: float = 0.0

    def elapsed_us(self) -> float:
        return self.end - self.start


@dataclass
class DeviceKernel:
    """A kernel, copy or memset a host event launched, timed on the device: from CUPTI's records (with its
    stream, launch shape and correlation id), or, without CUPTI, a CUDA-event range named after the event."""

    name: str
    device: int
    duration: float  # microseconds
    start: float = 0.0  # microseconds on the profiler's clock, where known
    stream: int = 0
    correlation: int = 0  # CUPTI's id of the launching API call; 0 for a CUDA-event range
    grid: tuple = ()
    block: tuple = ()
    registers: int = 0  # per thread
    shared_memory: int = 0  # bytes per block, static and dynamic
    kind: str = "kernel"  # "kernel", "memcpy" or "memset"
    nbytes: int = 0  # of a copy or memset
    launch_us: float | None = None  # when the API call that launched it began (CUPTI), on the profiler's clock


class _TimeStrings:
    """torch's formatted-time attributes (``cpu_time_str``, ...) of an event or an average of events."""

    cpu_time_str = property(lambda self: format_time(self.cpu_time))
    cpu_time_total_str = property(lambda self: format_time(self.cpu_time_total))
    self_cpu_time_total_str = property(lambda self: format_time(self.self_cpu_time_total))
    device_time_str = property(lambda self: format_time(self.device_time))
    device_time_total_str = property(lambda self: format_time(self.device_time_total))
    self_device_time_total_str = property(lambda self: format_time(self.self_device_time_total))


@dataclass(eq=False)
class FunctionEvent(_TimeStrings):
    id: int
    name: str
    thread: int
    start_us: float
    end_us: float = 0.0
    input_shapes: list = field(default_factory=list)
    stack: list[str] = field(default_factory=list)
    trace_name: str | None = None  # the name in the Chrome trace, where it differs (ProfilerStep#N)
    kind: str = "cpu_op"  # the trace category: cpu_op, user_annotation, compiled_program, program_step
    args: dict = field(default_factory=dict)  # extra trace args (a step's description)
    cpu_parent: FunctionEvent | None = None
    cpu_children: list[FunctionEvent] = field(default_factory=list)
    kernels: list[DeviceKernel] = field(default_factory=list)
    own_cpu_memory: int = 0  # bytes allocated less freed while this was the innermost range, children excluded
    own_device_memory: int = 0
    use_device: str | None = None
    device_type: DeviceType = DeviceType.CPU
    count: int = 1
    overload_name: str = ""
    node_id: int = -1
    flops: int = 0
    scope: int = 0
    is_async: bool = False
    is_legacy: bool = False
    is_remote: bool = False

    @property
    def key(self) -> str:
        return self.name

    @property
    def time_range(self) -> Interval:
        return Interval(self.start_us, self.end_us)

    @property
    def is_user_annotation(self) -> bool:
        return self.kind == "user_annotation"

    @property
    def cpu_time_total(self) -> float:
        return self.end_us - self.start_us

    @property
    def self_cpu_time_total(self) -> float:
        return self.cpu_time_total - sum(c.cpu_time_total for c in self.cpu_children)

    @property
    def cpu_time(self) -> float:
        return self.cpu_time_total / self.count

    @property
    def device_time_total(self) -> float:
        return sum(k.duration for k in self.kernels) + sum(c.device_time_total for c in self.cpu_children)

    @property
    def self_device_time_total(self) -> float:
        return sum(k.duration for k in self.kernels)

    @property
    def device_time(self) -> float:
        return self.device_time_total / self.count

    cuda_time_total = device_time_total
    self_cuda_time_total = self_device_time_total
    cuda_time = device_time

    @property
    def cpu_memory_usage(self) -> int:
        return self.own_cpu_memory + sum(c.cpu_memory_usage for c in self.cpu_children)

    @property
    def self_cpu_memory_usage(self) -> int:
        return self.own_cpu_memory

    @property
    def device_memory_usage(self) -> int:
        return self.own_device_memory + sum(c.device_memory_usage for c in self.cpu_children)

    @property
    def self_device_memory_usage(self) -> int:
        return self.own_device_memory

    cuda_memory_usage = device_memory_usage
    self_cuda_memory_usage = self_device_memory_usage

    def __repr__(self) -> str:
        return (f"<FunctionEvent id={self.id} name={self.name} thread={self.thread} "
                f"cpu_time={self.cpu_time_total_str} start_us={self.start_us:.3f} end_us={self.end_us:.3f} "
                f"cpu_children={[c.id for c in self.cpu_children]} input_shapes={self.input_shapes} "
                f"cpu_memory_usage={self.cpu_memory_usage}>")


class FunctionEventAvg(_TimeStrings):
    """Events of one key, summed (torch's ``FunctionEventAvg``: the same attributes, averages over ``count``)."""

    def __init__(self, key: str, input_shapes=None, stack=None, use_device: str | None = None):
        self.key = key
        self.count = 0
        self.node_id = -1
        self.is_async = False
        self.is_remote = False
        self.is_legacy = False
        self.use_device = use_device
        self.cpu_time_total = 0.0
        self.self_cpu_time_total = 0.0
        self.device_time_total = 0.0
        self.self_device_time_total = 0.0
        self.cpu_memory_usage = 0
        self.self_cpu_memory_usage = 0
        self.device_memory_usage = 0
        self.self_device_memory_usage = 0
        self.input_shapes = input_shapes
        self.stack = stack
        self.overload_name = ""
        self.device_type = DeviceType.CPU
        self.is_user_annotation = False
        self.flops = 0
        self.scope = 0
        self.cpu_parent = None
        self.cpu_children = None

    def add(self, event: FunctionEvent) -> FunctionEventAvg:
        if self.count == 0:
            self.is_user_annotation = event.is_user_annotation
            self.device_type = event.device_type
            self.cpu_parent = event.cpu_parent
            self.cpu_children = event.cpu_children
        self.count += event.count
        self.cpu_time_total += event.cpu_time_total
        self.self_cpu_time_total += event.self_cpu_time_total
        self.device_time_total += event.device_time_total
        self.self_device_time_total += event.self_device_time_total
        self.cpu_memory_usage += event.cpu_memory_usage
        self.self_cpu_memory_usage += event.self_cpu_memory_usage
        self.device_memory_usage += event.device_memory_usage
        self.self_device_memory_usage += event.self_device_memory_usage
        self.flops += event.flops
        return self

    @property
    def cpu_time(self) -> float:
        return 0.0 if self.count == 0 else self.cpu_time_total / self.count

    @property
    def device_time(self) -> float:
        return 0.0 if self.count == 0 else self.device_time_total / self.count

    cuda_time = device_time

    @property
    def self_cuda_time_total(self) -> float:
        return self.self_device_time_total

    @property
    def cuda_time_total(self) -> float:
        return self.device_time_total

    def __repr__(self) -> str:
        return (f"<FunctionEventAvg key={self.key} self_cpu_time={self.self_cpu_time_total_str} "
                f"cpu_time={self.cpu_time_str}  self_cuda_time={self.self_device_time_total_str} "
                f"cuda_time={self.device_time_str} input_shapes={self.input_shapes} "
                f"cpu_memory_usage={self.cpu_memory_usage} cuda_memory_usage={self.device_memory_usage}>")


class EventList(list):
    """A list of events (or of their averages) that prints as torch's table."""

    def __init__(self, events=(), use_device: str | None = None, profile_memory: bool = False,
                 with_flops: bool = False):
        super().__init__(events)
        self._use_device = use_device
        self._profile_memory = profile_memory
        self._with_flops = with_flops

    def key_averages(self, group_by_input_shapes: bool = False, group_by_stack_n: int = 0) -> EventList:
        groups: dict[tuple, FunctionEventAvg] = {}
        for event in self:
            # a device row apart from the host event of the same name (without CUPTI a device range is named
            # after the operator that launched it): folded together, the sum of device time lost its rows
            key = (event.key, event.device_type)
            if group_by_input_shapes:
                key += (str(event.input_shapes),)
            if group_by_stack_n > 0:
                key += tuple(event.stack[:group_by_stack_n])
            average = groups.get(key)
            if average is None:
                average = groups[key] = FunctionEventAvg(
                    event.key, event.input_shapes if group_by_input_shapes else None,
                    event.stack[:group_by_stack_n] if group_by_stack_n > 0 else None, self._use_device)
            average.add(event)
        return EventList(groups.values(), self._use_device, self._profile_memory, self._with_flops)

    @property
    def self_cpu_time_total(self) -> float:
        return sum(e.self_cpu_time_total for e in self)

    def table(self, sort_by: str | None = None, row_limit: int = 100, max_src_column_width: int = 75,
              max_name_column_width: int = 55, max_shapes_column_width: int = 80, header: str | None = None,
              top_level_events_only: bool = False, time_unit: str | None = None) -> str:
        return build_table(self, sort_by, header, row_limit, max_src_column_width, max_name_column_width,
                           max_shapes_column_width, self._with_flops, self._profile_memory, top_level_events_only,
                           time_unit)

    def __str__(self) -> str:
        return self.table()


# ---------------------------------------------------------------------------- formatting, as torch's

def format_time(time_us: float) -> str:
    if time_us >= 1e6:
        return f"{time_us / 1e6:.3f}s"
    if time_us >= 1e3:
        return f"{time_us / 1e3:.3f}ms"
    return f"{time_us:.3f}us"


def format_time_share(time_us: float, total_us: float) -> str:
    if total_us == 0:
        return "NaN"
    return f"{time_us * 100.0 / total_us:.2f}%"


def format_memory(nbytes: int) -> str:
    for scale, unit in ((1 << 30, "GB"), (1 << 20, "MB"), (1 << 10, "KB")):
        if abs(nbytes) >= scale:
            return f"{nbytes * 1.0 / scale:.2f} {unit}"
    return f"{nbytes} B"


def _in_unit(time_us: float, time_unit: str | None) -> str:
    scales = {"s": 1e6, "ms": 1e3, "us": 1.0}
    if time_unit in scales:
        return f"{time_us / scales[time_unit]:.3f}{time_unit}"
    return format_time(time_us)


def _sort_key(sort_by: str):
    """torch's: the attribute named by ``sort_by``, "cuda" read as "device"; an unknown name is an
    AttributeError of the event class."""
    attribute = sort_by.replace("cuda", "device").replace("xpu", "device").replace("privateuse1", "device")
    return lambda event: getattr(event, attribute)


def _trim_path(path: str, width: int) -> str:
    if len(path) > width:
        path = path[len(path) - width:]
        if len(path) > 3:
            path = "..." + path[3:]
    return path


class _Columns:
    """torch's row layout: each column right-aligned (the source column left) and two spaces apart."""

    def __init__(self):
        self.row_format, self.separator, self.width = "", "", -2

    def add(self, width: int, align: str = ">") -> None:
        self.row_format += "{: " + align + str(width) + "}  "
        self.separator += "-" * width + "  "
        self.width += width + 2


def build_table(events, sort_by=None, header=None, row_limit=100, max_src_column_width=75,
                max_name_column_width=55, max_shapes_column_width=80, with_flops=False, profile_memory=False,
                top_level_events_only=False, time_unit=None) -> str:
    """torch's ``_build_table``: same headers, widths, number formats and footer."""
    if len(events) == 0:
        return ""
    use_device = events[0].use_device
    has_device_time = any(e.self_device_time_total > 0 for e in events)
    has_device_mem = any(e.self_device_memory_usage > 0 for e in events)
    has_input_shapes = any(e.input_shapes is not None and len(e.input_shapes) > 0 for e in events)
    if sort_by is not None:
        events = sorted(events, key=_sort_key(sort_by), reverse=True)
    name_width = min(max(len(e.key) for e in events) + 4, max_name_column_width or 10**9)
    shapes_width = min(max(len(str(e.input_shapes)) for e in events) + 4, max_shapes_column_width or 10**9)
    stacks = [e.stack for e in events if e.stack]
    src_width = min(max(len(s) for stack in stacks for s in stack) + 4, max_src_column_width or 10**9) \
        if stacks else None

    device = use_device.upper() if use_device is not None else "None"
    headers = ["Name", "Self CPU %", "Self CPU", "CPU total %", "CPU total", "CPU time avg"]
    if has_device_time:
        headers += [f"Self {device}", f"Self {device} %", f"{device} total", f"{device} time avg"]
    if profile_memory:
        headers += ["CPU Mem", "Self CPU Mem"]
        if use_device and has_device_mem:
            headers += [f"{device} Mem", f"Self {device} Mem"]
    headers.append("# of Calls")
    columns = _Columns()
    columns.add(name_width)
    for _ in headers[1:]:
        columns.add(12)
    if has_input_shapes:
        headers.append("Input Shapes")
        columns.add(shapes_width)
    if stacks:
        headers.append("Source Location")
        columns.add(src_width, "<")
    flops_scale = None
    if with_flops:
        flops = [e.flops for e in events if e.flops > 0]
        if flops:
            units = ["FLOPs", "KFLOPs", "MFLOPs", "GFLOPs", "TFLOPs", "PFLOPs"]
            exponent = int(max(0, min(math.log10(min(flops)) / 3, len(units) - 1)))
            flops_scale = 10.0 ** (-3 * exponent)
            headers.append(f"Total {units[exponent]}")
            columns.add(12)

    sum_self_cpu = sum(e.self_cpu_time_total for e in events)
    # device time is summed over the kernels' own rows (the host events that launched them count it again)
    sum_self_device = sum(e.self_device_time_total for e in events
                          if e.device_type is DeviceType.CUDA and not e.is_user_annotation)
    lines = []
    if header is not None:
        lines += ["=" * columns.width, header]
    if top_level_events_only:
        lines += ["=" * columns.width, "This report only display top-level ops statistics"]
    lines += [columns.separator, columns.row_format.format(*headers), columns.separator]
    shown = 0
    for e in events:
        if shown == row_limit:
            break
        if top_level_events_only and e.cpu_parent is not None:
            continue
        shown += 1
        name = e.key
        if max_name_column_width is not None and len(name) >= max_name_column_width - 3:
            name = name[:max_name_column_width - 3] + "..."
        row = [name, format_time_share(e.self_cpu_time_total, sum_self_cpu), _in_unit(e.self_cpu_time_total, time_unit),
               0 if e.is_async else format_time_share(e.cpu_time_total, sum_self_cpu),
               _in_unit(e.cpu_time_total, time_unit), _in_unit(e.cpu_time, time_unit)]
        if has_device_time:
            row += [_in_unit(e.self_device_time_total, time_unit),
                    format_time_share(e.self_device_time_total, sum_self_device),
                    _in_unit(e.device_time_total, time_unit), _in_unit(e.device_time, time_unit)]
        if profile_memory:
            row += [format_memory(e.cpu_memory_usage), format_memory(e.self_cpu_memory_usage)]
            if use_device and has_device_mem:
                row += [format_memory(e.device_memory_usage), format_memory(e.self_device_memory_usage)]
        row.append(e.count)
        if has_input_shapes:
            row.append(str(e.input_shapes)[:shapes_width])
        if flops_scale is not None:
            row.append("--" if e.flops <= 0 else f"{e.flops * flops_scale:8.3f}")
        if stacks:
            row.append(_trim_path(e.stack[0], src_width) if e.stack else "")
        lines.append(columns.row_format.format(*row))
        if stacks:
            blank = [""] * (len(headers) - 1)
            lines += [columns.row_format.format(*blank, _trim_path(s, src_width)) for s in e.stack[1:]]
            lines.append(columns.row_format.format(*blank, ""))
    lines += [columns.separator, f"Self CPU time total: {_in_unit(sum_self_cpu, time_unit)}"]
    if has_device_time:
        lines.append(f"Self {device} time total: {_in_unit(sum_self_device, time_unit)}")
    return "\n".join(lines) + "\n"

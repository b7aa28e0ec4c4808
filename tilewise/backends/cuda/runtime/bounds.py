"""Device-side index bounds checks: the error record indexing kernels write and the host reads.

[Note: device-side bounds checks]
A kernel cannot raise, and a check that copied a flag back after every indexing op would cost a
synchronisation per op. So each device has one small record in host-mapped pinned memory
(``cuMemHostAlloc`` with ``DEVICEMAP | PORTABLE``; the kernels get its device address from
``cuMemHostGetDevicePointer``). A thread that meets an out-of-range index skips the access and claims the
record with ``atomicCAS`` on its state word (the first thread of any kernel wins; the others only skip),
writes which launch it was, which of the launch's index tensors, the value and the size of the indexed dim,
and publishes the record (state ``DONE``) behind a system-wide fence, so the host never sees half a record.
The host reads the state word where results become visible (``synchronize`` of a device, a stream or an
event, and every download): one load from pinned memory, no copy and no driver call. If it is set, it
raises the launch's error (torch's type on the CPU for that operator: :class:`RuntimeError` for gather and
scatter, :class:`IndexError` for the others) and clears the record, so the process goes on working; like
torch's device-side assert, the error surfaces at the next synchronisation rather than at the op, and the op's result is
undefined. Each launch notes a *site* (the operator, which dim each index tensor indexes, whether
negative indices count from the end, the indexed shape) in a ring of the latest :data:`SITES` launches, so
the message can name the operator and the shapes while the device only writes five integers. Launches
captured into a CUDA graph run again long after they were noted, so sites noted during a capture
(:func:`keeping_sites`) are kept for good instead.
"""

from __future__ import annotations

import ctypes
import itertools
from contextlib import contextmanager

import numpy as np

from tilewise._cuda_api import check, driver_api

STATE, SITE, WHICH, VALUE, SIZE = range(5)  # the record's int64 fields
FREE, WRITING, DONE = 0, 1, 2  # its state word
SITES = 1 << 14  # launches remembered; an error found after more launches than this is reported without its op

REPORT_C = """\
#ifndef TW_INDEX_OUT_OF_BOUNDS
#define TW_INDEX_OUT_OF_BOUNDS
// The first thread to meet a bad index claims the record (FREE -> WRITING), fills it, then publishes it
// (DONE) behind a system-wide fence: the host reads the record over PCIe without synchronising.
__device__ __noinline__ void tw_index_out_of_bounds(long long* record, long long site, int which, long long value,
                                                    long long size) {
    if (atomicCAS((unsigned long long*)record, 0ULL, 1ULL) != 0ULL) return;
    record[1] = site; record[2] = which; record[3] = value; record[4] = size;
    __threadfence_system();
    atomicExch((unsigned long long*)record, 2ULL);
}
#endif"""


class ErrorRecord:
    """One device's record: five int64 in host-mapped pinned memory, seen by the host as a numpy array. It is
    never freed: a kernel queued on any stream may still write it, and it is forty bytes per device. Made with
    the device's context current (``device.synchronize`` reads the records, so this module cannot bind one)."""

    def __init__(self, device: int) -> None:
        cu = driver_api()
        flags = cu.CU_MEMHOSTALLOC_DEVICEMAP | cu.CU_MEMHOSTALLOC_PORTABLE
        self.host_ptr = int(check(cu.cuMemHostAlloc(5 * 8, flags), "cuMemHostAlloc"))
        self.device_ptr = int(check(cu.cuMemHostGetDevicePointer(self.host_ptr, 0), "cuMemHostGetDevicePointer"))
        self.fields = fields_at(self.host_ptr)
        self.fields[:] = 0


def fields_at(address: int) -> np.ndarray:
    """The five fields of the record at host ``address``, as a numpy view."""
    return np.frombuffer((ctypes.c_int64 * 5).from_address(address), dtype=np.int64)


_records: dict[int, ErrorRecord] = {}
_watched: list[ctypes.c_int64] = []  # the state word of every record, polled at each synchronisation point
_sites: list = [None] * SITES
_site_numbers = itertools.count(1)  # 0 is never a site, so a cleared record names none
_kept: dict[int, tuple] = {}  # sites of launches a CUDA graph replays
_keeping = [0]  # depth of keeping_sites()


def record_pointer(device: int) -> int:
    """The device address of ``device``'s error record (allocated at its first indexing kernel), where
    ``device``'s context is current (the caller passes ``ensure_context(index)``)."""
    found = _records.get(device)
    if found is None:
        found = _records[device] = ErrorRecord(device)
        _watched.append(ctypes.c_int64.from_address(found.host_ptr))
    return found.device_ptr


def note_site(op: str, dims: tuple[int, ...], shape: tuple[int, ...], negative_wraps: bool,
              error: type[Exception] = IndexError, in_self: bool = True) -> int:
    """Remember one indexing launch (``op`` as it prefixes its errors, e.g. ``"gather()"``; ``dims[k]``: the
    dim index tensor ``k`` indexes in a tensor of ``shape``; ``error``: the exception a bad index raises;
    ``in_self``: an IndexError that does not wrap negative indices says torch's "index out of range in self", as
    the index family's do); return the number its kernel reports."""
    site = next(_site_numbers)
    _sites[site % SITES] = entry = (site, op, dims, shape, negative_wraps, error, in_self)
    if _keeping[0]:
        _kept[site] = entry
    return site


@contextmanager
def keeping_sites():
    """Sites noted inside are never forgotten: for launches captured into a CUDA graph."""
    _keeping[0] += 1
    try:
        yield
    finally:
        _keeping[0] -= 1


def raise_index_errors() -> None:
    """Raise the index error a kernel recorded since the last call, if any, and clear it. Cheap: one load of a
    ctypes word per device (under 100 ns; a numpy element read costs more)."""
    for state in _watched:
        if state.value == DONE:
            fields = fields_at(ctypes.addressof(state))
            message, error = describe(fields), _error_of(int(fields[SITE]))
            clear(fields)
            raise error(message)


def clear(fields: np.ndarray) -> None:
    fields[SITE:] = 0
    fields[STATE] = FREE  # last: a kernel may claim the record again as soon as it reads FREE


def _site_entry(site: int) -> tuple | None:
    entry = _kept.get(site) or _sites[site % SITES]
    return entry if entry is not None and entry[0] == site else None


def _error_of(site: int) -> type[Exception]:
    entry = _site_entry(site)
    return entry[5] if entry is not None else IndexError


def describe(fields: np.ndarray) -> str:
    """The message for a published record, worded as the CPU backend words the same error."""
    site, which, value, size = (int(fields[k]) for k in (SITE, WHICH, VALUE, SIZE))
    entry = _site_entry(site)
    found = " (a CUDA kernel found it; the index is checked asynchronously, so this error surfaces at the next " \
            "synchronisation)"
    if entry is None:
        return f"an indexing kernel: index {value} is out of bounds for a dimension with size {size}{found}"
    _, op, dims, shape, negative_wraps, error, in_self = entry
    dim = dims[which] if which < len(dims) else which
    torch_words = "index out of range in self: " if in_self and error is IndexError and not negative_wraps else ""
    return (f"{op}: {torch_words}index {value} is out of bounds for dimension {dim} with size {size}; valid indices "
            f"are {valid_range(size, negative_wraps)}; the indexed tensor has shape {list(shape)}{found}")


def valid_range(size: int, negative_wraps: bool) -> str:
    if not size:
        return "none (the dimension is empty)"
    if negative_wraps:
        return f"{-size}..{size - 1}"
    return f"0..{size - 1} (negative indices are not counted from the end)"

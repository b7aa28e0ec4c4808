"""Asynchronous uploads from pinned memory, and device-side index bounds checks.

The first part of each section runs anywhere (rendering and compiling every indexed kernel with NVRTC, the
host side of the error record, the pinned-memory bookkeeping); the tests marked ``cuda`` need a GPU.
"""

from __future__ import annotations

import ctypes
import gc
import time
import weakref

import numpy as np
import pytest

import tilewise as tw
from tilewise import dtypes
from tilewise.backends.cuda.runtime import bounds
from tilewise.codegen.toolchain import nvrtc_available

ASYNC = "a CUDA kernel found it"




# ---------------------------------------------------------------------------------------------- without a GPU

@pytest.mark.skipif(not nvrtc_available(), reason="NVRTC is not installed")
def test_every_indexed_kernel_compiles():
    """Each mode, dtype, index count (0: the view scatter, which reads no index), rank and offset width."""
    from tilewise.backends.cuda.kernels.index import _ATOMIC, ADD, PUT, TAKE, render_indexed
    from tilewise.codegen.toolchain import compile_cuda

    sources = {}
    real = [d for d in dtypes.ALL if not d.is_complex]  # complex tensors are indexed on the CPU
    for dtype in real:
        for mode in (TAKE, PUT, ADD):
            if mode == ADD and dtype.name not in _ATOMIC:
                continue
            for n_index in (0, 1, 2, 3):
                for rank in (1, 3):
                    for idx in ("int", "long long"):
                        name, text = render_indexed(mode, dtype, n_index, rank, idx)
                        assert ("tw_index_out_of_bounds(record" in text) == bool(n_index)
                        sources[name] = text
    assert len(sources) == (2 * len(real) + len(_ATOMIC)) * 4 * 2 * 2
    names = sorted(sources)
    for start in range(0, len(names), 64):
        batch = names[start:start + 64]
        ptx = compile_cuda("\n".join(sources[n] for n in batch), batch, "sm_90").ptx
        missing = [n for n in batch if f".entry {n}(" not in ptx]
        assert not missing, f"kernels missing from the PTX: {missing[:5]}"


@pytest.fixture
def fake_record():
    """A record in ordinary memory, polled like a device's: the tests play the kernel's part."""
    fields = np.zeros(5, dtype=np.int64)
    state = ctypes.c_int64.from_address(fields.ctypes.data)
    bounds._watched.append(state)
    yield fields
    bounds._watched.remove(state)


def _publish(fields: np.ndarray, site: int, which: int, value: int, size: int) -> None:
    fields[bounds.SITE:] = site, which, value, size
    fields[bounds.STATE] = bounds.DONE


def test_error_record_raises_once_and_clears(fake_record):
    bounds.raise_index_errors()  # nothing recorded: nothing raised
    site = bounds.note_site("index", (0, 2), (5, 3, 4), True)
    _publish(fake_record, site, 1, 7, 4)
    with pytest.raises(IndexError) as info:
        bounds.raise_index_errors()
    message = str(info.value)
    assert message.startswith("index: index 7 is out of bounds for dimension 2 with size 4; valid indices are -4..3;")
    assert "the indexed tensor has shape [5, 3, 4]" in message and ASYNC in message
    assert "synchronisation" in message
    assert not fake_record.any()  # cleared: the process goes on
    bounds.raise_index_errors()


def test_error_record_names_a_composite_that_refuses_negative_indices(fake_record):
    site = bounds.note_site("index_select()", (1,), (2, 5), False)
    _publish(fake_record, site, 0, -1, 5)
    with pytest.raises(IndexError, match=r"^index_select\(\): index out of range in self: index -1 is out of bounds "
                                         r"for dimension 1 with size 5; valid indices are 0\.\.4 \(negative indices "
                                         r"are not counted from the end\)"):
        bounds.raise_index_errors()


def test_error_record_raises_the_launch_error_type_as_torch_does_on_the_cpu(fake_record):
    """A gather or scatter launch notes RuntimeError (torch's for gather/scatter), advanced indexing IndexError."""
    site = bounds.note_site("gather()", (0,), (5,), False, RuntimeError)
    _publish(fake_record, site, 0, 9, 5)
    with pytest.raises(RuntimeError, match=r"^gather\(\): index 9 is out of bounds for dimension 0") as info:
        bounds.raise_index_errors()
    assert not isinstance(info.value, IndexError)
    site = bounds.note_site("index_select()", (0,), (5,), False)
    _publish(fake_record, site, 0, 9, 5)
    with pytest.raises(IndexError):
        bounds.raise_index_errors()


def test_error_record_half_written_waits_for_the_next_check(fake_record):
    site = bounds.note_site("gather()", (0,), (5,), False, RuntimeError)
    fake_record[bounds.STATE] = bounds.WRITING  # a kernel on another stream is still writing it
    bounds.raise_index_errors()
    _publish(fake_record, site, 0, 9, 5)
    with pytest.raises(RuntimeError, match=r"^gather\(\): index 9"):
        bounds.raise_index_errors()


def test_error_record_of_a_forgotten_launch_still_reports_value_and_size(fake_record):
    site = bounds.note_site("gather()", (0,), (5,), False)
    for _ in range(bounds.SITES):
        bounds.note_site("index", (0,), (1,), True)
    _publish(fake_record, site, 0, 12, 5)
    with pytest.raises(IndexError, match=r"^an indexing kernel: index 12 is out of bounds for a dimension with size 5"):
        bounds.raise_index_errors()


def test_launch_site_takes_the_composite_name_and_its_negative_rule():
    from tilewise.backends.cuda.kernels.index import _site
    from tilewise.ops.movement import _index_errors_named

    assert _site("index", (0,), (5,), True) == ("index", (0,), (5,), True, IndexError)
    with _index_errors_named("index_select", negative_wraps=False):
        assert _site("index", (0,), (5,), True) == ("index_select()", (0,), (5,), False, IndexError)
        with _index_errors_named("take"):
            assert _site("index", (0,), (5,), True) == ("take()", (0,), (5,), True, IndexError)
        assert _site("index", (0,), (5,), True)[0] == "index_select()"
    with _index_errors_named("take_along_dim"):  # gather never wraps, and keeps its RuntimeError, under any name
        assert _site("gather()", (0,), (5,), False, RuntimeError)[3:] == (False, RuntimeError)
    assert _site("index", (0,), (5,), True) == ("index", (0,), (5,), True, IndexError)


class _FakePinned:
    """A PinnedBuffer over ordinary memory, so the host-side rules can be checked without a driver."""

    def __init__(self, nbytes: int):
        from tilewise.backends.cuda.runtime import PinnedBuffer

        self.memory = (ctypes.c_byte * nbytes)()
        self.buffer = PinnedBuffer.__new__(PinnedBuffer)
        self.buffer.nbytes, self.buffer.device, self.buffer.ptr = nbytes, 0, ctypes.addressof(self.memory)

    def release(self):
        self.buffer.ptr = 0  # never handed to cuMemFreeHost


def test_is_pinned_follows_views_and_pin_memory_keeps_a_pinned_tensor(monkeypatch):
    import tilewise.backends.cuda as cuda_backend
    from tilewise.backends.cuda.transfers import _uploads_from_pinned
    from tilewise.device import BACKENDS
    from tilewise.tensor import from_array

    monkeypatch.setitem(BACKENDS, "cuda", cuda_backend.backend)  # page-locked memory is the CUDA backend's

    fake = _FakePinned(4 * 24)
    try:
        array = fake.buffer.as_array(np.float32, (4, 6))
        array[...] = np.arange(24).reshape(4, 6)
        t = from_array(array)
        assert t.is_pinned() and t[1:3].is_pinned() and t.t().is_pinned() and t.reshape(24)[5:].is_pinned()
        assert t.pin_memory() is t
        assert _uploads_from_pinned(t) and _uploads_from_pinned(t[1:3])  # contiguous: read in place
        assert not _uploads_from_pinned(t.t()) and not _uploads_from_pinned(t[:, ::2])  # staged like pageable
        assert not tw.ones(3).is_pinned() and not tw.ones(3)[1:].is_pinned()
    finally:
        fake.release()


def test_pin_memory_without_a_gpu_says_so():
    if tw.cuda.is_available():
        pytest.skip("a GPU is present")
    with pytest.raises(RuntimeError, match="no backend for device cuda"):
        tw.ones(3).pin_memory()


def test_dataloader_pins_every_tensor_of_a_batch(monkeypatch):
    from tilewise.utils import data

    pinned = []

    def fake_pin(self):
        pinned.append(tuple(self.shape))
        return self

    monkeypatch.setattr(data.dataloader, "_pinning_available", lambda: True)
    monkeypatch.setattr(tw.Tensor, "pin_memory", fake_pin)
    ds = data.TensorDataset(tw.arange(10.0), tw.arange(10))
    batches = list(data.DataLoader(ds, batch_size=4, pin_memory=True))
    assert pinned == [(4,), (4,), (4,), (4,), (2,), (2,)] and len(batches) == 3
    nested = data.pin_memory({"x": tw.ones(2), "rest": [tw.ones(3), 5, "label"]})
    assert pinned[-2:] == [(2,), (3,)] and nested["rest"][1:] == [5, "label"]


def test_dataloader_without_a_gpu_warns_and_loads_pageable_batches():
    if tw.cuda.is_available():
        pytest.skip("a GPU is present")
    ds = tw.utils.data.TensorDataset(tw.arange(6.0))
    with pytest.warns(UserWarning, match="'pin_memory' argument is set as true but no accelerator is found"):
        batches = list(tw.utils.data.DataLoader(ds, batch_size=3, pin_memory=True))
    assert [b[0].tolist() for b in batches] == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]


# ---------------------------------------------------------------------------------------------- uploads, on a GPU

def _values(shape, dtype, seed=0):
    a = np.random.default_rng(seed).standard_normal(shape) * 50
    return tw.from_numpy(np.asarray(a, dtype=np.float64)).to(dtype)


def _bytes(t: tw.Tensor) -> np.ndarray:
    return np.ascontiguousarray(t.cpu().numpy()).reshape(-1).view(np.uint8)


def _same_bytes(got: tw.Tensor, expected: tw.Tensor) -> None:
    assert got.dtype is expected.dtype and tuple(got.shape) == tuple(expected.shape)
    np.testing.assert_array_equal(_bytes(got), _bytes(expected))


UPLOAD_DTYPES = [dtypes.float32, dtypes.float64, dtypes.float16, dtypes.bfloat16, dtypes.int64, dtypes.int32,
                 dtypes.uint8, dtypes.bool_, dtypes.float8_e4m3fn]


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", UPLOAD_DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("shape", [(), (1,), (7,), (3, 5, 7), (1024, 257)], ids=str)
def test_non_blocking_upload_from_pinned_memory_is_exact(dtype, shape):
    host = _values(shape, dtype)
    pinned = host.pin_memory()
    assert pinned.is_pinned() and not host.is_pinned() and pinned.pin_memory() is pinned
    ways = [pinned.to("cuda", non_blocking=True), pinned.cuda(non_blocking=True), pinned.to("cuda"),
            tw.empty(shape, dtype=dtype, device="cuda").copy_(pinned, non_blocking=True)]
    tw.cuda.synchronize()
    for got in ways:
        assert got.is_cuda
        _same_bytes(got, host)


@pytest.mark.cuda
def test_upload_from_views_of_pinned_memory():
    host = _values((64, 48), dtypes.float32)
    pinned = host.pin_memory()
    views = {"rows": (pinned[5:17], host[5:17]), "flat tail": (pinned.reshape(-1)[100:], host.reshape(-1)[100:]),
             "transposed": (pinned.t(), host.t()), "strided": (pinned[:, ::3], host[:, ::3]),
             "one row": (pinned[63], host[63])}
    for name, (view, expected) in views.items():
        assert view.is_pinned(), name
        got = view.to("cuda", non_blocking=True)
        tw.cuda.synchronize()
        _same_bytes(got, expected)


@pytest.mark.cuda
@pytest.mark.parametrize("src,dst", [("float32", "float16"), ("float32", "bfloat16"), ("float64", "float32"),
                                     ("int64", "float32"), ("float32", "int32"), ("float32", "float8_e4m3fn"),
                                     ("uint8", "float32")])
def test_upload_with_a_dtype_change_casts_like_the_cpu(src, dst):
    host = _values((33, 65), dtypes.from_name(src))
    if src == "uint8":
        host = _values((33, 65), dtypes.float32).abs().to(dtypes.uint8)
    target = dtypes.from_name(dst)
    pinned = host.pin_memory()
    for non_blocking in (True, False):
        got = pinned.to("cuda", target, non_blocking=non_blocking)
        tw.cuda.synchronize()
        _same_bytes(got, host.to(target))
    _same_bytes(host.to("cuda", target), host.to(target))  # pageable: cast on the host, as before


@pytest.mark.cuda
def test_upload_of_a_large_pinned_tensor_returns_before_the_copy_finishes():
    nbytes = 256 << 20
    pinned = tw.empty(nbytes // 4, dtype=tw.float32).pin_memory()
    pinned.fill_(1.5)
    warm = pinned.to("cuda", non_blocking=True)  # the device block is cached for the timed call
    tw.cuda.synchronize()
    del warm
    stream = tw.cuda.current_stream()
    start, end = tw.cuda.Event(enable_timing=True), tw.cuda.Event(enable_timing=True)
    timings = []
    for _ in range(3):
        start.record(stream)
        t0 = time.perf_counter()
        y = pinned.to("cuda", non_blocking=True)
        host_ms = (time.perf_counter() - t0) * 1e3
        end.record(stream)
        end.synchronize()
        timings.append((host_ms, start.elapsed_time(end)))
        del y
    host_ms, copy_ms = min(timings)  # the fastest return; a busy host can only make a call slower
    assert copy_ms > 1.0, f"256 MiB copied in {copy_ms:.3f} ms: the copy cannot have been measured"
    assert host_ms < copy_ms / 4, f"the call took {host_ms:.3f} ms of host time for a copy of {copy_ms:.3f} ms"


@pytest.mark.cuda
def test_pageable_upload_still_blocks_and_may_reuse_its_source_at_once():
    host = tw.from_numpy(np.arange(1 << 20, dtype=np.float32))
    y = host.to("cuda", non_blocking=True)
    host.fill_(-1.0)  # pageable: staged before the call returned
    np.testing.assert_array_equal(y.cpu().numpy(), np.arange(1 << 20, dtype=np.float32))


def _owner(t: tw.Tensor):
    base = t._storage.data
    while isinstance(base, np.ndarray) and base.base is not None:
        base = base.base
    return base._owner


@pytest.mark.cuda
def test_pinned_source_may_be_dropped_right_after_a_non_blocking_upload():
    n = (256 << 20) // 8
    pinned = tw.arange(n, dtype=tw.int64).pin_memory()
    buffer = weakref.ref(_owner(pinned))
    y = pinned.to("cuda", non_blocking=True)
    del pinned
    gc.collect()
    assert buffer() is not None  # held until the copy is known to be done
    scribble = tw.full((n,), -7, dtype=tw.int64).pin_memory()  # new pinned memory written while the copy runs
    tw.cuda.synchronize()
    got = y.cpu().numpy()
    assert got[0] == 0 and got[-1] == n - 1
    np.testing.assert_array_equal(got, np.arange(n, dtype=np.int64))
    scribble.to("cuda", non_blocking=True)  # the next pinned upload releases the sources of finished copies
    gc.collect()
    assert buffer() is None


# ---------------------------------------------------------------------------------------------- bounds, on a GPU

def _cuda(values, dtype=None):
    return tw.tensor(values, dtype=dtype, device="cuda")


@pytest.fixture
def x5():
    """A (5, 3) float32 tensor on the device and on the host."""
    host = tw.arange(15.0).reshape(5, 3)
    return host, host.cuda()


@pytest.mark.cuda
def test_in_range_results_are_unchanged(x5):
    host, x = x5
    idx, neg = tw.tensor([4, 0, 2, 2]), tw.tensor([-1, -5, 3])
    col = tw.tensor([[0, 2, 1], [4, 4, 0]])
    np.testing.assert_array_equal(x[idx.cuda()].cpu().numpy(), host[idx].numpy())
    np.testing.assert_array_equal(x[neg.cuda()].cpu().numpy(), host[neg].numpy())  # x[i] wraps negatives
    np.testing.assert_array_equal(x[idx.cuda(), tw.tensor([2, -3, 0, 1]).cuda()].cpu().numpy(),
                                  host[idx, tw.tensor([2, -3, 0, 1])].numpy())
    np.testing.assert_array_equal(x.gather(0, col.cuda()).cpu().numpy(), host.gather(0, col).numpy())
    np.testing.assert_array_equal(x.index_select(0, idx.cuda()).cpu().numpy(), host.index_select(0, idx).numpy())
    np.testing.assert_array_equal(tw.nn.functional.embedding(idx.cuda(), x).cpu().numpy(),
                                  tw.nn.functional.embedding(idx, host).numpy())
    np.testing.assert_array_equal(x.index_put((neg.cuda(),), _cuda(9.0), True).cpu().numpy(),
                                  host.index_put((neg,), tw.tensor(9.0), True).numpy())
    np.testing.assert_array_equal(x.scatter_add(0, col.cuda(), tw.ones(2, 3, device="cuda")).cpu().numpy(),
                                  host.scatter_add(0, col, tw.ones(2, 3)).numpy())
    tw.cuda.synchronize()


BAD = {
    "gather": (lambda x: x.gather(0, _cuda([[0, 1, 2], [7, 0, 0]])),
               r"^gather\(\): index 7 is out of bounds for dimension 0 with size 5; valid indices are 0\.\.4"),
    "gather negative": (lambda x: x.gather(1, _cuda([[0], [-1], [0], [0], [0]])),
                        r"^gather\(\): index -1 is out of bounds for dimension 1 with size 3"),
    "index_select": (lambda x: x.index_select(0, _cuda([1, 5])),
                     r"^index_select\(\): index out of range in self: index 5 is out of bounds for dimension 0 "
                     r"with size 5"),
    "index_select negative": (lambda x: x.index_select(0, _cuda([-1])),
                              r"^index_select\(\): index out of range in self: index -1 is out of bounds .* "
                              r"\(negative indices are not counted"),
    "embedding": (lambda x: tw.nn.functional.embedding(_cuda([[1, 10], [0, 2]]), x),
                  r"^embedding\(\): index out of range in self: index 10 is out of bounds for dimension 0 with "
                  r"size 5"),
    "x[idx]": (lambda x: x[_cuda([0, 7])], r"^index: index 7 is out of bounds for dimension 0 with size 5; "
                                           r"valid indices are -5\.\.4; the indexed tensor has shape \[5, 3\]"),
    "x[idx] negative": (lambda x: x[_cuda([-6])], r"^index: index -6 is out of bounds for dimension 0 with size 5"),
    "x[i, j]": (lambda x: x[_cuda([0, 1]), _cuda([2, 3])],
                r"^index: index 3 is out of bounds for dimension 1 with size 3"),
    "index_put": (lambda x: x.index_put((_cuda([9]),), _cuda(1.0)),
                  r"^index_put: index 9 is out of bounds for dimension 0 with size 5"),
    "index_put accumulate": (lambda x: x.index_put((_cuda([2, 9]),), _cuda([1.0, 2.0]).unsqueeze(1), True),
                             r"^index_put: index 9 is out of bounds for dimension 0 with size 5"),
    "scatter_add": (lambda x: x.scatter_add(0, _cuda([[5, 0, 0]]), tw.ones(1, 3, device="cuda")),
                    r"^scatter_add\(\): index 5 is out of bounds for dimension 0 with size 5"),
    "index_add": (lambda x: x.index_add(0, _cuda([0, 5]), tw.ones(2, 3, device="cuda")),
                  r"^index_add\(\): index out of range in self: index 5 is out of bounds for dimension 0 with "
                  r"size 5"),
}
RUNTIME_ERROR_CASES = {"gather", "gather negative", "scatter_add"}  # torch's gather and scatter raise RuntimeError


def _error_of(case: str) -> type[Exception]:
    return RuntimeError if case in RUNTIME_ERROR_CASES else IndexError


def _check_later_ops_work(host, x):
    np.testing.assert_array_equal((x * 2)[_cuda([4, 0])].cpu().numpy(), (host * 2)[tw.tensor([4, 0])].numpy())
    assert x.sum().item() == host.sum().item()


@pytest.mark.cuda
@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_index_raises_at_the_next_download(case, x5):
    host, x = x5
    op, message = BAD[case]
    out = op(x)  # asynchronous: the kernel has only been queued
    with pytest.raises(_error_of(case), match=message) as info:
        out.cpu()
    assert ASYNC in str(info.value)
    _check_later_ops_work(host, x)


@pytest.mark.cuda
@pytest.mark.parametrize("case", ["gather", "index_select", "embedding", "x[idx]", "index_put", "scatter_add"])
def test_bad_index_raises_at_synchronize(case, x5):
    host, x = x5
    op, message = BAD[case]
    op(x)
    with pytest.raises(_error_of(case), match=message):
        tw.cuda.synchronize()
    tw.cuda.synchronize()  # cleared: raised once
    _check_later_ops_work(host, x)


@pytest.mark.cuda
def test_bad_index_in_place_raises_at_item_and_the_tensor_stays_usable(x5):
    _, x = x5
    x[_cuda([1, 11])] = 3.0  # setitem finds the element positions by indexing first, as on the CPU
    with pytest.raises(IndexError, match=r"^index: index 11 is out of bounds for dimension 0 with size 5"):
        x.sum().item()
    x[_cuda([1])] = 3.0
    assert x.cpu().numpy()[1].tolist() == [3.0, 3.0, 3.0]


@pytest.mark.cuda
def test_bad_index_raises_at_stream_and_event_synchronize_and_tolist(x5):
    _, x = x5
    side = tw.cuda.Stream()
    side.wait_stream(tw.cuda.current_stream())  # x was uploaded on the default stream
    with tw.cuda.stream(side):
        x[_cuda([5])]
        done = side.record_event()
    with pytest.raises(IndexError, match=r"^index: index 5"):
        side.synchronize()
    x.gather(0, _cuda([[6, 0, 0]]))
    event = tw.cuda.current_stream().record_event()
    with pytest.raises(RuntimeError, match=r"^gather\(\): index 6"):
        event.synchronize()
    done.synchronize()
    out = x.index_select(0, _cuda([0, 8]))
    with pytest.raises(IndexError, match=r"^index_select\(\): index out of range in self: index 8"):
        out.tolist()
    assert x.index_select(0, _cuda([0])).tolist() == [[0.0, 1.0, 2.0]]


@pytest.mark.cuda
def test_only_the_first_bad_index_is_reported_until_cleared(x5):
    _, x = x5
    a = x[_cuda([0, 9])]
    b = x.gather(0, _cuda([[8, 0, 0]]))
    with pytest.raises(IndexError, match=r"^index: index 9"):
        a.cpu()
    b.cpu()  # the second kernel found its bad index while the record was taken: it only skipped the access
    c = x.gather(0, _cuda([[8, 0, 0]]))
    with pytest.raises(RuntimeError, match=r"^gather\(\): index 8"):
        c.cpu()


@pytest.mark.cuda
def test_bad_index_in_a_compiled_function(x5):
    host, x = x5
    fn = tw.compile(lambda t, i: t[i] * 2)
    np.testing.assert_array_equal(fn(x, _cuda([4, 1])).cpu().numpy(), (host[tw.tensor([4, 1])] * 2).numpy())
    out = fn(x, _cuda([4, 5]))
    with pytest.raises(IndexError, match=r"index 5 is out of bounds for dimension 0 with size 5"):
        out.cpu()
    np.testing.assert_array_equal(fn(x, _cuda([0, 1])).cpu().numpy(), (host[tw.tensor([0, 1])] * 2).numpy())


@pytest.mark.cuda
def test_bounds_checked_on_the_64_bit_offset_path():
    n = (1 << 31) + 16  # more elements than a 32-bit offset can address: the kernels take long long offsets
    x = tw.zeros(n, dtype=tw.uint8, device="cuda")
    x[_cuda([n - 1])] = 7
    assert x[_cuda([n - 1, -1, 0])].tolist() == [7, 7, 0]
    out = x[_cuda([5, n + 4])]
    with pytest.raises(IndexError, match=f"^index: index {n + 4} is out of bounds for dimension 0 with size {n}"):
        out.cpu()
    del x, out
    tw.cuda.empty_cache()


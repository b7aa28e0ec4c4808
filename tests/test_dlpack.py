"""DLPack interop with numpy and torch, both directions, zero-copy; and the host conversions."""

from __future__ import annotations

import gc

import numpy as np
import pytest
import torch

import tilewise as tw
from tilewise._dlpack import _EXPORTED

DTYPES = [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16, torch.bfloat16,
          torch.float32, torch.float64, torch.float8_e4m3fn, torch.float8_e5m2]


def test_from_numpy_array_shares_memory():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    t = tw.from_dlpack(a)
    a[1, 2] = 42.0
    assert t[1, 2].item() == 42.0
    assert t.shape == (3, 4) and t.stride() == (4, 1) and t.dtype is tw.float32


def test_to_numpy_shares_memory():
    t = tw.arange(6.0).view(2, 3)
    a = np.from_dlpack(t)
    a[0, 1] = -1.0
    assert t.tolist() == [[0.0, -1.0, 2.0], [3.0, 4.0, 5.0]]


def test_from_torch_shares_memory_and_keeps_strides():
    x = torch.randn(4, 6)[:, 1:5:2]
    t = tw.from_dlpack(x)
    assert t.stride() == x.stride() and t.shape == tuple(x.shape)
    x[2, 1] = 7.0
    assert t[2, 1].item() == 7.0
    np.testing.assert_array_equal(t.numpy(), x.numpy())


def test_to_torch_shares_memory_and_keeps_strides():
    t = tw.arange(12.0).view(3, 4).t()
    x = torch.from_dlpack(t)
    assert x.stride() == t.stride() and tuple(x.shape) == t.shape
    assert x.data_ptr() == t.data_ptr()
    x[0, 1] = 100.0
    assert t[0, 1].item() == 100.0


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_every_dtype_round_trips_through_torch_without_copy(dtype):
    x = (torch.arange(10) % 3).to(dtype)
    t = tw.from_dlpack(x)
    assert t.dtype.name == str(dtype).removeprefix("torch.")
    back = torch.from_dlpack(t)
    assert back.data_ptr() == x.data_ptr()
    assert torch.equal(back.view(torch.uint8), x.view(torch.uint8))


def test_zero_dim_and_empty_tensors():
    assert tw.from_dlpack(torch.tensor(3.5)).item() == 3.5
    assert torch.from_dlpack(tw.tensor(2.5)).item() == 2.5
    assert tw.from_dlpack(torch.empty(0, 3)).shape == (0, 3)
    assert tuple(torch.from_dlpack(tw.zeros(2, 0)).shape) == (2, 0)


def test_producer_memory_outlives_the_producer():
    x = torch.arange(5.0)
    t = tw.from_dlpack(x)
    del x
    gc.collect()
    view = t[1:]
    a = t.numpy()
    del t
    gc.collect()
    assert view.tolist() == [1.0, 2.0, 3.0, 4.0]
    assert a.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]


def test_exports_are_released_when_the_consumer_is_done():
    gc.collect()
    before = len(_EXPORTED)
    t = tw.ones(3)
    x = torch.from_dlpack(t)
    assert len(_EXPORTED) == before + 1
    del x
    gc.collect()
    assert len(_EXPORTED) == before
    unconsumed = t.__dlpack__()
    del unconsumed
    gc.collect()
    assert len(_EXPORTED) == before


def test_legacy_and_versioned_capsules():
    t = tw.arange(3.0)
    assert tw.from_dlpack(t.__dlpack__()).tolist() == [0.0, 1.0, 2.0]
    assert tw.from_dlpack(t.__dlpack__(max_version=(1, 0))).tolist() == [0.0, 1.0, 2.0]
    assert t.__dlpack_device__() == (1, 0)


def test_a_capsule_is_consumed_once():
    capsule = tw.ones(2).__dlpack__()
    tw.from_dlpack(capsule)
    with pytest.raises(ValueError, match="consumed only once"):
        tw.from_dlpack(capsule)


def test_export_errors():
    with pytest.raises(RuntimeError, match="require gradient"):
        tw.ones(2, requires_grad=True).__dlpack__()
    with pytest.raises(TypeError, match="__dlpack__"):
        tw.from_dlpack([1, 2, 3])
    with pytest.raises(BufferError, match="DLPack device"):
        tw.ones(2).__dlpack__(dl_device=(2, 0))


def test_copy_true_gives_independent_memory():
    t = tw.zeros(3)
    x = torch.from_dlpack(t.__dlpack__(copy=True))
    x[0] = 1.0
    assert t.tolist() == [0.0, 0.0, 0.0]


def test_host_conversions():
    t = tw.tensor([[1.5, 2.0], [3.0, 4.0]])
    assert t.tolist() == [[1.5, 2.0], [3.0, 4.0]]
    assert t[0, 0].item() == 1.5
    np.testing.assert_array_equal(np.asarray(t), [[1.5, 2.0], [3.0, 4.0]])
    assert np.shares_memory(t.numpy(), np.asarray(t))
    assert torch.equal(torch.as_tensor(np.asarray(t)), torch.tensor([[1.5, 2.0], [3.0, 4.0]]))


# ------------------------------------------------------------ CUDA memory: DLPack, CUDA array interface

def test_cuda_array_interface_is_for_cuda_tensors_only():
    with pytest.raises(AttributeError, match="non-CUDA tensor"):
        tw.ones(2).__cuda_array_interface__  # noqa: B018
    with pytest.raises(AttributeError, match="non-CUDA tensor"):
        torch.ones(2).__cuda_array_interface__  # noqa: B018


def test_cuda_array_interface_with_an_unknown_type_is_refused():
    class Strings:
        __cuda_array_interface__ = {"typestr": "<U4", "shape": (2,), "data": (0, False), "version": 3}

    with pytest.raises(BufferError, match="typestr"):
        tw.from_dlpack(Strings())


class _OnlyCAI:
    """A producer that speaks only the CUDA array interface (as older CuPy and Numba arrays)."""

    def __init__(self, owner):
        self.owner = owner
        self.__cuda_array_interface__ = owner.__cuda_array_interface__


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_cuda_round_trip_through_torch_shares_memory(dtype):
    x = (torch.arange(10, device="cuda") % 3).to(dtype)
    t = tw.from_dlpack(x)
    assert t.device == tw.device("cuda", 0) and t.dtype.name == str(dtype).removeprefix("torch.")
    assert t.data_ptr() == x.data_ptr()
    back = torch.from_dlpack(t)
    assert back.data_ptr() == x.data_ptr() and back.device == x.device
    assert torch.equal(back.view(torch.uint8), x.view(torch.uint8))
    assert t.__dlpack_device__() == (2, 0)


@pytest.mark.cuda
def test_cuda_writes_are_visible_both_ways():
    x = torch.zeros(4, 3, device="cuda")[:, 1]  # a strided view
    t = tw.from_dlpack(x)
    assert t.stride() == x.stride()
    x.add_(2.0)
    assert t.cpu().tolist() == [2.0] * 4
    t.mul_(3.0)
    assert x.tolist() == [6.0] * 4
    y = torch.from_dlpack(t)
    t.add_(1.0)
    assert y.tolist() == [7.0] * 4


@pytest.mark.cuda
def test_cuda_producer_memory_outlives_the_producer():
    x = torch.arange(6.0, device="cuda")
    t = tw.from_dlpack(x)[2:]
    del x
    gc.collect()
    torch.cuda.empty_cache()
    torch.empty(6, device="cuda").fill_(-1.0)  # would reuse the block if it had been freed
    assert t.cpu().tolist() == [2.0, 3.0, 4.0, 5.0]
    t2 = tw.arange(4.0, device="cuda")
    y = torch.from_dlpack(t2)
    del t2
    gc.collect()
    tw.empty(4, device="cuda").fill_(-1.0)
    assert y.tolist() == [0.0, 1.0, 2.0, 3.0]


@pytest.mark.cuda
def test_cuda_capsule_consumed_twice_raises():
    capsule = tw.ones(2, device="cuda").__dlpack__(stream=-1)
    assert torch.from_dlpack(capsule).tolist() == [1.0, 1.0]
    with pytest.raises(ValueError, match="consumed only once"):
        tw.from_dlpack(capsule)


@pytest.mark.cuda
def test_cuda_versioned_capsule_and_stream_arguments():
    t = tw.arange(3.0, device="cuda")
    assert tw.from_dlpack(t.__dlpack__(max_version=(1, 0), stream=1)).cpu().tolist() == [0.0, 1.0, 2.0]
    with pytest.raises(BufferError, match="0 is ambiguous"):
        t.__dlpack__(stream=0)
    with pytest.raises(BufferError, match="DLPack device"):
        t.__dlpack__(dl_device=(1, 0))


@pytest.mark.cuda
def test_consumer_stream_waits_for_the_producers_writes():
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        x = torch.zeros(1 << 20, device="cuda")
        torch.cuda._sleep(50_000_000)  # keeps the side stream busy well past the export
        x.fill_(3.0)
        t = tw.from_dlpack(x)  # torch, the producer, orders its current (side) stream before ours
    assert float(t.sum().item()) == 3.0 * (1 << 20)


@pytest.mark.cuda
def test_cuda_array_interface_both_ways():
    x = torch.arange(8.0, device="cuda").view(2, 4)[:, ::2]
    t = tw.from_dlpack(_OnlyCAI(x))
    assert t.data_ptr() == x.data_ptr() and t.stride() == x.stride() and t.shape == tuple(x.shape)
    x.add_(1.0)
    assert t.cpu().tolist() == [[1.0, 3.0], [5.0, 7.0]]
    u = tw.arange(5, dtype=tw.int32, device="cuda")
    cai = u.__cuda_array_interface__
    assert cai["version"] == 3 and cai["typestr"] == "<i4" and cai["data"] == (u.data_ptr(), False)
    assert cai["strides"] is None and cai["stream"] != 0
    y = torch.as_tensor(_OnlyCAI(u), device="cuda")
    assert y.data_ptr() == u.data_ptr() and y.tolist() == [0, 1, 2, 3, 4]
    with pytest.raises(TypeError, match="bfloat16"):
        tw.ones(2, dtype=tw.bfloat16, device="cuda").__cuda_array_interface__  # noqa: B018

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

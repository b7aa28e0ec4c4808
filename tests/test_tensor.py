"""The tensor model: storage sharing, views and their bases, version counters, contiguity, construction,
host access and devices — checked against torch wherever torch defines the answer."""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest
import torch

import tilewise as tw
from tilewise.device import Device


def pair(shape=(3, 4)):
    data = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    return tw.tensor(data), torch.tensor(data)


def geometry(t):
    return tuple(t.shape), tuple(t.stride()), t.storage_offset(), t.is_contiguous()


# ---------------------------------------------------------------------------- views share storage

BASIC_INDEXES = [
    (1,), (slice(None), 2), (slice(1, None, 2),), (Ellipsis, None, slice(1, 3)), (None, 0, slice(None, None, 3)),
    (-1, -2), (slice(-2, None), Ellipsis), (Ellipsis,), (slice(5, 9),), (True,), (0, None, None),
]


@pytest.mark.parametrize("index", BASIC_INDEXES, ids=[str(i) for i in BASIC_INDEXES])
def test_basic_indexing_is_a_view_like_torch(index):
    ours, theirs = pair()
    v, tv = ours[index], theirs[index]
    assert geometry(v) == geometry(tv)
    np.testing.assert_array_equal(v.numpy(), tv.numpy())
    if v.dim():
        assert v is ours or v._base is ours
        assert v.untyped_storage() is ours.untyped_storage()


def test_advanced_indexing_copies():
    ours, theirs = pair()
    v, tv = ours[tw.tensor([0, 2])], theirs[torch.tensor([0, 2])]
    np.testing.assert_array_equal(v.numpy(), tv.numpy())
    assert v._base is None and tv._base is None
    assert v.untyped_storage() is not ours.untyped_storage()
    m = ours[ours > 5]
    assert m.tolist() == theirs[theirs > 5].tolist() and m._base is None


ADVANCED_INDEXES = {  # name: (base layout, index built with the framework module m)
    "column pick": ("matrix", lambda m: (slice(None), [0, 2])),
    "row pick": ("matrix", lambda m: ([0, 2],)),
    "middle dim": ("3d", lambda m: (slice(None), [0, 2])),
    "last dim": ("3d", lambda m: (Ellipsis, [0, 3])),
    "two adjacent": ("3d", lambda m: (slice(None), m.tensor([0, 2]), m.tensor([1, 3]))),
    "two apart": ("3d", lambda m: (m.tensor([1]), slice(None), m.tensor([0, 2]))),
    "broadcast pair": ("3d", lambda m: (slice(None), m.tensor([[1], [0]]), m.tensor([0, 2]))),
    "transposed index": ("3d", lambda m: (slice(None), m.tensor([[0, 1], [2, 0]]).t())),
    "sliced around": ("3d", lambda m: (slice(1, None), [0, 2], slice(1, None))),
    "stepped": ("3d", lambda m: (slice(None), slice(None, None, 2), [1, 3])),
    "mask": ("3d", lambda m: (slice(None), m.tensor([True, False, True]))),
    "channels-last channel": ("channels_last", lambda m: (slice(None), [0, 1])),
    "channels-last height": ("channels_last", lambda m: (slice(None), slice(None), [0, 2])),
    "channels-last width": ("channels_last", lambda m: (Ellipsis, [1, 2])),
    "0-d True": ("matrix", lambda m: (m.tensor(True),)),
    "0-d False": ("matrix", lambda m: (m.tensor(False),)),
    "0-d True and int": ("matrix", lambda m: (m.tensor(True), 1)),
    "None and 0-d True": ("matrix", lambda m: (None, m.tensor(True))),
    "0-d True twice": ("matrix", lambda m: (m.tensor(True), m.tensor(True))),
    "0-d True, ellipsis, int": ("3d", lambda m: (m.tensor(True), Ellipsis, 0)),
    "0-d True and list": ("matrix", lambda m: (m.tensor(True), [0, 2])),
    "mask and 0-d True": ("matrix", lambda m: (m.tensor([True, False, True]), m.tensor(True))),
}


def _indexed_base(m, layout: str):
    if layout == "channels_last":
        return m.arange(120.0).reshape(2, 4, 5, 3).permute(0, 3, 1, 2)
    return m.arange(12.0).reshape(3, 4) if layout == "matrix" else m.arange(24.0).reshape(2, 3, 4)


@pytest.mark.parametrize("name", ADVANCED_INDEXES)
def test_advanced_indexing_reads_and_writes_like_torch(name):
    """Values, shapes and strides of ``x[index]`` (a result ``.view(-1)`` accepts in torch is one it accepts here),
    and what ``x[index] = -1`` writes; a 0-d bool index adds a dim of size 1 (True) or 0 (False) as ``True`` does."""
    layout, make = ADVANCED_INDEXES[name]
    results = []
    for m in (tw, torch):
        x = _indexed_base(m, layout)
        got = x[make(m)]
        written = x.clone()
        written[make(m)] = -1
        results.append((got, written))
    (got, written), (expected, expected_written) = results
    assert tuple(got.shape) == tuple(expected.shape) and got.stride() == expected.stride()
    np.testing.assert_array_equal(got.numpy(), expected.numpy())
    np.testing.assert_array_equal(written.numpy(), expected_written.numpy())


def test_writes_through_views_reach_the_base():
    x = tw.zeros(3, 4)
    x[1] = 5.0
    x[:, 2] = tw.tensor([1.0, 2.0, 3.0])
    x.t()[0] = -1.0
    expected = torch.zeros(3, 4)
    expected[1] = 5.0
    expected[:, 2] = torch.tensor([1.0, 2.0, 3.0])
    expected.t()[0] = -1.0
    np.testing.assert_array_equal(x.numpy(), expected.numpy())


def test_data_ptr_offsets_in_bytes():
    x = tw.zeros(3, 4, dtype=tw.float64)
    assert x[1, 2].data_ptr() - x.data_ptr() == (1 * 4 + 2) * 8
    assert x[:, 1:].data_ptr() - x.data_ptr() == 8
    assert x[2:2].data_ptr() == 0  # empty tensors point at nothing, like torch


@pytest.mark.parametrize("method,args", [
    ("view", (2, 6)), ("reshape", (4, 3)), ("permute", (1, 0)), ("transpose", (0, 1)), ("t", ()),
    ("unsqueeze", (1,)), ("flatten", ()), ("narrow", (1, 1, 2)), ("select", (0, 2)), ("diagonal", ()),
    ("unfold", (1, 2, 1)), ("expand", (2, 3, 4)), ("movedim", (0, 1)), ("unflatten", (1, (2, 2))),
    ("as_strided", ((2, 2), (1, 2), 1)), ("squeeze", ()), ("view_as", None), ("split", (2, 1)),
    ("chunk", (3, 0)), ("unbind", (1,)),
])
def test_view_operators_share_storage_like_torch(method, args):
    ours, theirs = pair()
    if args is None:
        args_ours, args_theirs = (tw.ones(4, 3),), (torch.ones(4, 3),)
    else:
        args_ours = args_theirs = args
    out, tout = getattr(ours, method)(*args_ours), getattr(theirs, method)(*args_theirs)
    outs = out if isinstance(out, tuple) else (out,)
    touts = tout if isinstance(tout, tuple) else (tout,)
    assert len(outs) == len(touts)
    for o, t in zip(outs, touts):
        assert geometry(o) == geometry(t), method
        assert o._base is ours and o.untyped_storage() is ours.untyped_storage()
        np.testing.assert_array_equal(o.numpy(), t.numpy())


def test_reshape_copies_only_when_strides_forbid_a_view():
    ours, theirs = pair()
    assert ours.t().reshape(12).untyped_storage() is not ours.untyped_storage()
    assert theirs.t().reshape(12).untyped_storage().data_ptr() != theirs.untyped_storage().data_ptr()
    assert ours[:, :2].reshape(6).tolist() == theirs[:, :2].reshape(6).tolist()
    with pytest.raises(RuntimeError, match="view size is not compatible"):
        ours.t().view(12)


def test_contiguous():
    ours, theirs = pair()
    assert ours.contiguous() is ours
    t = ours.t()
    assert not t.is_contiguous() and not theirs.t().is_contiguous()
    c = t.contiguous()
    assert c.is_contiguous() and c.untyped_storage() is not ours.untyped_storage()
    assert geometry(c) == geometry(theirs.t().contiguous())
    assert tw.ones(3, 1).expand(3, 4).contiguous().stride() == (4, 1)
    assert tw.zeros(0, 3).t().is_contiguous() and torch.zeros(0, 3).t().is_contiguous()  # empty is contiguous


def test_base_of_a_view_of_a_view_is_the_root():
    x = tw.zeros(4, 4)
    v = x[1:][:, 2:].t()[0]
    assert v._base is x and x._base is None
    assert v.detach()._base is None and v.detach().untyped_storage() is x.untyped_storage()


# ---------------------------------------------------------------------------- version counters

def test_version_counter_is_shared_by_every_view_of_a_storage():
    x = tw.zeros(4)
    views = [x[1:], x.view(2, 2), x.detach(), x.unsqueeze(0)]
    assert {v._version for v in views} == {0}
    x[0] = 1.0
    assert {v._version for v in [x, *views]} == {1}
    views[1].mul_(2)
    assert {v._version for v in [x, *views]} == {2}
    assert tw.zeros(4)._version == 0  # a fresh storage starts over
    assert x.clone()._version == 0


# ---------------------------------------------------------------------------- numpy interop

def test_from_numpy_and_numpy_share_memory():
    a = np.arange(6.0).reshape(2, 3)
    t = tw.from_numpy(a)
    a[0, 0] = 9.0
    assert t[0, 0].item() == 9.0
    n = t.numpy()
    n[1, 2] = -1.0
    assert a[1, 2] == -1.0
    assert np.shares_memory(t.numpy(), t[1].numpy())
    strided = tw.from_numpy(a[:, ::2])
    assert strided.stride() == (3, 2) and np.shares_memory(strided.numpy(), a)


@pytest.mark.parametrize("array", [np.zeros((0, 3), np.float32), np.zeros((3, 0, 2)), np.zeros((3, 0)).T,
                                   np.zeros((4, 0))[::-1], np.zeros(0, np.int64)],
                         ids=lambda a: f"{a.shape}-{a.strides}")
def test_from_numpy_takes_an_empty_arrays_strides_as_torch(array):
    assert tw.from_numpy(array).stride() == torch.from_numpy(array).stride()


def test_tensor_copies_its_data():
    a = np.arange(3.0)
    t = tw.tensor(a)
    a[0] = 7.0
    assert t[0].item() == 0.0
    u = tw.tensor(t)
    assert u.untyped_storage() is not t.untyped_storage()


@pytest.mark.parametrize("data", [[1, 2], [1.0, 2], [True, False], 3, 2.5, [[1, 2], [3, 4]], [], np.float16(1.5),
                                  np.arange(3, dtype=np.int16), [np.int32(1), np.int32(2)]])
def test_tensor_dtype_and_shape_inference_like_torch(data):
    ours, theirs = tw.tensor(data), torch.tensor(data)
    assert ours.dtype.name == str(theirs.dtype).removeprefix("torch.")
    assert tuple(ours.shape) == tuple(theirs.shape)


TENSORS_IN_LISTS = {  # data built by each framework: a tensor inside a list is one number, of its own dtype
    "one-element": lambda m: [m.tensor([1.5])],
    "two-one-element": lambda m: [m.tensor([1.5]), m.tensor([2.0])],
    "matrix-leaf": lambda m: [m.tensor([[1.5]])],
    "nested": lambda m: [[m.tensor([1.5])], [m.tensor(2.5)]],
    "0-d-and-1-d": lambda m: [m.tensor(1), m.tensor([2])],
    "float64-leaf": lambda m: [m.tensor(1.5, dtype=m.float64), 2.0],
    "float16-and-int": lambda m: [m.tensor(1.0, dtype=m.float16), 3],
    "int-leaf-and-float": lambda m: [m.tensor(1), 2.5],
    "uint8-and-int": lambda m: (m.tensor(1, dtype=m.uint8), 3),
    "bool-leaf-and-int": lambda m: [m.tensor(True), 2],
    "numpy-float64-later": lambda m: [1.0, np.float64(2.0)],
    "numpy-int32-and-float": lambda m: [np.int32(2), 1.5],
    "numpy-float64-array": lambda m: [np.array([1.0, 2.0]), [3.0, 4.0]],
}


@pytest.mark.parametrize("case", TENSORS_IN_LISTS)
def test_tensor_of_a_list_holding_tensors_or_numpy_values_like_torch(case):
    ours, theirs = tw.tensor(TENSORS_IN_LISTS[case](tw)), torch.tensor(TENSORS_IN_LISTS[case](torch))
    assert ours.dtype.name == str(theirs.dtype).removeprefix("torch.")
    assert tuple(ours.shape) == tuple(theirs.shape) and ours.tolist() == theirs.tolist()


@pytest.mark.parametrize("leaf", [[1.0, 2.0], [], [[1.0]] * 2])
def test_tensor_of_a_list_holding_a_tensor_of_other_than_one_element_is_refused_like_torch(leaf):
    with pytest.raises(ValueError, match="only one element tensors can be converted to Python scalars"):
        torch.tensor([torch.tensor(leaf)])
    with pytest.raises(ValueError, match=r"only one element tensors .*tensor\(\): .*shape \[.*tilewise.stack"):
        tw.tensor([tw.tensor(leaf)])


def test_host_access():
    ours, theirs = pair((2, 3))
    assert ours.tolist() == theirs.tolist()
    assert tw.tensor(2.5).item() == 2.5 and isinstance(tw.tensor(3).item(), int)
    assert tw.tensor([True]).item() is True
    assert float(tw.tensor(2.5)) == 2.5 and int(tw.tensor(3)) == 3 and bool(tw.tensor(1))
    assert [10, 11, 12][tw.tensor(1)] == 11
    assert len(ours) == 2 and [r.tolist() for r in ours] == theirs.tolist()
    with pytest.raises(RuntimeError, match="a Tensor with 6 elements cannot be converted to Scalar"):
        ours.item()
    with pytest.raises(RuntimeError, match="Boolean value of Tensor with 6 elements is ambiguous"):
        bool(ours)
    with pytest.raises(TypeError, match="len\\(\\) of a 0-d tensor"):
        len(tw.tensor(1.0))
    assert tw.tensor([1.5], dtype=tw.bfloat16).tolist() == [1.5]


def test_shape_queries():
    x = tw.zeros(2, 3, 4)
    assert x.shape == (2, 3, 4) and repr(x.shape) == "tilewise.Size([2, 3, 4])"
    assert x.size() == x.shape and x.size(-1) == 4 and x.stride(0) == 12
    assert x.dim() == x.ndim == 3 and x.numel() == x.shape.numel() == 24
    assert x.element_size() == 4 and x.nbytes == 96 and x.itemsize == 4
    assert x.is_floating_point() and not tw.zeros(1, dtype=tw.int8).is_floating_point()


def test_tensor_constructor_forms():
    assert tw.Tensor(2, 3).shape == (2, 3) and tw.Tensor(2, 3).dtype is tw.float32
    assert tw.Tensor([1, 2]).dtype is tw.float32  # like torch.Tensor: the default dtype
    assert tw.Tensor().shape == (0,)
    assert tw.is_tensor(tw.zeros(1)) and not tw.is_tensor(np.zeros(1))


def test_pickle_and_deepcopy():
    x = tw.arange(6.0).view(2, 3).requires_grad_()
    y = pickle.loads(pickle.dumps(x))
    assert y.tolist() == x.tolist() and y.requires_grad and y.is_leaf
    z = copy.deepcopy(x)
    assert z.tolist() == x.tolist() and z.untyped_storage() is not x.untyped_storage()


@pytest.mark.parametrize("requires_grad", [True, False])
@pytest.mark.parametrize("how", ["pickle", "deepcopy"])
def test_pickle_and_deepcopy_keep_parameters_like_torch(how, requires_grad):
    copy_of = (lambda t: pickle.loads(pickle.dumps(t))) if how == "pickle" else copy.deepcopy
    ours = copy_of(tw.nn.Parameter(tw.ones(2, 3), requires_grad=requires_grad))
    theirs = copy_of(torch.nn.Parameter(torch.ones(2, 3), requires_grad=requires_grad))
    assert isinstance(theirs, torch.nn.Parameter) and isinstance(ours, tw.nn.Parameter)
    assert ours.requires_grad == theirs.requires_grad == requires_grad and ours.is_leaf
    assert ours.tolist() == theirs.tolist()


def test_pickle_keeps_attributes_set_on_a_tensor_like_torch():
    ours, theirs = tw.ones(2), torch.ones(2)
    ours.note = theirs.note = "kept"
    assert pickle.loads(pickle.dumps(ours)).note == pickle.loads(pickle.dumps(theirs)).note == "kept"
    assert not isinstance(pickle.loads(pickle.dumps(ours)), tw.nn.Parameter)


def test_clone_is_a_fresh_contiguous_copy_with_history():
    x = tw.ones(2, 3, requires_grad=True)
    c = x.t().clone()
    assert c.untyped_storage() is not x.untyped_storage() and c._base is None
    assert c.grad_fn is not None
    c.sum().backward()
    assert x.grad.tolist() == [[1.0] * 3] * 2


# ---------------------------------------------------------------------------- devices

@pytest.mark.parametrize("spec,kind,index", [("cpu", "cpu", None), ("cuda", "cuda", 0), ("cuda:1", "cuda", 1),
                                             (2, "cuda", 2), ("meta", "meta", None)])
def test_device_parsing_like_torch(spec, kind, index):
    d = tw.device(spec)
    assert (d.type, d.index) == (kind, index)
    assert d is tw.device(str(d)) is Device(d)  # interned
    if isinstance(spec, str):
        t = torch.device(spec)
        assert str(d) == str(t) or (kind == "cuda" and index == 0 and str(t) == "cuda")
        assert tw.device(t) is d  # torch devices are understood


def test_device_equality_and_repr():
    assert tw.device("cuda", 1) is tw.device("cuda:1")
    assert tw.device("cpu") == "cpu" and tw.device("cuda:0") != tw.device("cuda:1")
    assert repr(tw.device("cuda:1")) == "device(type='cuda', index=1)"
    assert repr(tw.device("cpu")) == "device(type='cpu')"
    with pytest.raises(ValueError, match="index given twice"):
        tw.device("cuda:1", 2)
    with pytest.raises(AttributeError, match="immutable"):
        tw.device("cpu").type = "cuda"


def test_an_indexless_cuda_device_is_the_threads_current_one(monkeypatch):
    """``"cuda"`` names the current device, as torch resolves it when allocating: after ``set_device(1)`` a
    rank's ``.cuda()`` and ``device="cuda"`` land on cuda:1 (with the index fixed at 0, every rank of a
    one-GPU-per-process job put its tensors on GPU 0)."""
    import threading

    from tilewise.device import BACKENDS, Backend

    class TwoGPUs(Backend):
        current = threading.local()

        def current_index(self) -> int:
            return getattr(self.current, "index", 0)

    fake = TwoGPUs()
    monkeypatch.setitem(BACKENDS, "cuda", fake)
    assert tw.device("cuda") is tw.device("cuda:0")
    fake.current.index = 1
    assert tw.device("cuda") is tw.device("cuda:1") and Device("cuda") == "cuda:1"
    assert tw.device("cuda:0").index == 0 and tw.device("cuda", 0).index == 0  # an explicit index stays
    seen = []
    other = threading.Thread(target=lambda: seen.append(tw.device("cuda")))  # another thread's current device
    other.start()
    other.join()
    assert seen == [tw.device("cuda:0")]


def test_cpu_tensor_device_properties():
    x = tw.zeros(2)
    assert x.device == "cpu" and x.is_cpu and not x.is_cuda
    assert x.to("cpu") is x and x.cpu() is x


def test_numpy_of_a_tensor_that_requires_grad_is_refused_only_while_grad_is_on():
    import torch

    for lib in (tw, torch):
        x = lib.ones(2, requires_grad=True)
        with pytest.raises(RuntimeError, match=r"Can't call numpy\(\) on Tensor that requires grad"):
            x.numpy()
        with lib.no_grad():
            np.testing.assert_array_equal(x.numpy(), [1.0, 1.0])
        np.testing.assert_array_equal(x.detach().numpy(), [1.0, 1.0])


@pytest.mark.parametrize("dtype", ["float32", "int8", "float64", "bfloat16"])
def test_untyped_storage_counts_bytes_as_torchs(dtype):
    """Memory accounting as users write it: ``t.untyped_storage().nbytes()``, ``element_size()`` and
    ``data_ptr()`` of views and of copies."""
    base = torch.arange(24).to(getattr(torch, dtype)).reshape(4, 6)
    ours = tw.from_numpy(base.float().numpy()).to(getattr(tw, dtype))
    for o, t in ((ours, base), (ours[1:, ::2], base[1:, ::2]), (ours.t(), base.t()),
                 (ours[1:].clone(), base[1:].clone()), (ours[:0], base[:0])):
        assert o.untyped_storage().nbytes() == t.untyped_storage().nbytes()
        assert o.untyped_storage().element_size() == t.untyped_storage().element_size() == 1
        same = o.untyped_storage().data_ptr() == ours.untyped_storage().data_ptr()
        assert same == (t.untyped_storage().data_ptr() == base.untyped_storage().data_ptr())

"""torch's storage API: UntypedStorage, TypedStorage, Tensor.set_, from_file, compared against torch."""

import os
import warnings

import numpy as np
import pytest
import torch

import tilewise as tw
from tilewise.ops import storage_api

BOTH = pytest.mark.parametrize("fw", [torch, tw], ids=["torch", "tilewise"])


def _typed(x):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return x.storage()


@BOTH
def test_untyped_storage_queries(fw):
    x = fw.arange(6, dtype=fw.float32)
    s = x.untyped_storage()
    assert isinstance(s, fw.UntypedStorage) and s is x[2:].untyped_storage()
    assert (s.size(), len(s), s.nbytes(), s.element_size()) == (24, 24, 24, 1)
    assert s.device == fw.device("cpu") and s.get_device() is None and not s.is_cuda
    assert s.data_ptr() == x.data_ptr() == x[1:].untyped_storage().data_ptr()
    assert x.view(fw.int32).untyped_storage().data_ptr() == s.data_ptr()
    assert s.tolist() == list(np.arange(6, dtype=np.float32).tobytes())
    assert (s[3], s[-1]) == (0, 64)
    assert not s.is_shared() and not s.is_pinned() and s.resizable()
    assert s.cpu() is s and s.untyped() is s
    assert fw.UntypedStorage(0).data_ptr() == 0


@BOTH
def test_untyped_storage_writes_are_seen_by_tensors(fw):
    y = fw.arange(4, dtype=fw.int32)
    u = y.untyped_storage()
    u[0] = 7
    assert y.tolist() == [7, 1, 2, 3]
    u.fill_(1)
    assert y.tolist() == [16843009] * 4
    u.fill_(300)  # the low byte
    assert u[0] == 44
    u.copy_(fw.arange(4, dtype=fw.int32).untyped_storage())
    assert y.tolist() == [0, 1, 2, 3]
    c = u.clone()
    assert c.data_ptr() != u.data_ptr() and c.tolist() == u.tolist()
    c.fill_(0)
    assert y.tolist() == [0, 1, 2, 3]


@BOTH
def test_untyped_storage_errors(fw):
    u = fw.arange(4, dtype=fw.int32).untyped_storage()
    with pytest.raises(IndexError, match="index 100 out of range for storage of size 16"):
        u[100]
    with pytest.raises(RuntimeError, match="size does not match, self was 16 bytes but src was 8 bytes"):
        u.copy_(fw.UntypedStorage(8))
    with pytest.raises(TypeError, match="must be .*Storage, not Tensor"):
        u.copy_(fw.ones(4))
    with pytest.raises(RuntimeError, match="fill_ expects int, but got float"):
        u.fill_(1.5)
    with pytest.raises(RuntimeError, match="resize_ expects an int, but got float"):
        u.resize_(3.5)
    with pytest.raises(RuntimeError, match="called with negative number"):
        u.resize_(-1)
    with pytest.raises(RuntimeError, match="Trying to resize storage that is not resizable"):
        fw.from_numpy(np.ones(3)).untyped_storage().resize_(0)


@BOTH
def test_untyped_storage_constructors(fw):
    assert fw.UntypedStorage(4).size() == 4 and fw.UntypedStorage().size() == 0
    assert fw.UntypedStorage([1, 2, 300]).tolist() == [1, 2, 44]
    with pytest.raises(RuntimeError, match="argument 'dtype' cannot be None"):
        fw.UntypedStorage.from_buffer(b"\x01\x02\x03\x04")
    little = fw.UntypedStorage.from_buffer(b"\x01\x02\x03\x04", "little", dtype=fw.int16)
    big = fw.UntypedStorage.from_buffer(b"\x01\x02\x03\x04", byte_order="big", dtype=fw.int16)
    assert little.tolist() == [1, 2, 3, 4] and big.tolist() == [2, 1, 4, 3]
    with pytest.raises(RuntimeError, match="missing required argument 'byte_order'"):
        fw.UntypedStorage.from_buffer(b"\x01\x02\x03\x04", dtype=fw.int16)
    with pytest.raises(ValueError, match=r"buffer size \(3\) must be a multiple of element size \(2\)"):
        fw.UntypedStorage.from_buffer(b"\x01\x02\x03", "little", dtype=fw.int16)
    with pytest.raises(ValueError, match="invalid byte_order 'middle'"):
        fw.UntypedStorage.from_buffer(b"\x01\x02", "middle", dtype=fw.int16)
    with pytest.raises(RuntimeError, match="one of the items was of type str instead of int"):
        fw.UntypedStorage("x")
    with pytest.raises(TypeError, match="received an invalid combination of arguments"):
        fw.UntypedStorage(2, 3)


@BOTH
def test_resize_frees_and_restores_memory_in_place(fw):
    """FSDP's pattern: free a parameter's memory with resize_(0), bring it back with resize_(n) and copy_."""
    x = fw.arange(4.0)
    s = x.untyped_storage()
    saved = s.clone()
    assert s.resize_(0) is s and s.nbytes() == 0 and s.data_ptr() == 0
    s.resize_(16)
    s.copy_(saved)
    assert x.tolist() == [0.0, 1.0, 2.0, 3.0]
    s.resize_(8)  # keeps the leading bytes
    assert s.tolist() == saved.tolist()[:8]
    s.resize_(16)
    x.fill_(2.0)
    assert s.tolist()[12:] == [0, 0, 0, 64]


def test_reading_a_tensor_whose_storage_was_freed_is_refused():
    x = tw.arange(4.0)  # torch reads freed memory here (a crash); tilewise refuses
    x.untyped_storage().resize_(0)
    with pytest.raises(RuntimeError, match="needs more memory than its storage's 0 bytes"):
        x.tolist()
    x.untyped_storage().resize_(8)
    with pytest.raises(RuntimeError, match="needs more memory than its storage's 8 bytes"):
        x.sum()


def test_storage_slices_share_memory():
    for fw in (torch, tw):
        x = fw.zeros(2)
        part = x.untyped_storage()[4:8]
        assert part.size() == 4 and part.data_ptr() == x.data_ptr() + 4
        part[3] = 63
        assert x[1].item() > 0


def test_typed_storage_like_torch():
    for fw in (torch, tw):
        x = fw.arange(6.0)
        ts = _typed(x[2:])
        assert isinstance(ts, fw.TypedStorage) and isinstance(ts, fw.FloatStorage)
        assert not isinstance(ts, fw.DoubleStorage)
        assert (ts.size(), len(ts), ts.dtype, ts.nbytes(), ts.element_size()) == (6, 6, fw.float32, 24, 4)
        assert ts.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0] and (ts[1], ts[-1]) == (1.0, 5.0)
        assert ts._untyped_storage is x.untyped_storage() and ts.data_ptr() == x.data_ptr()
        assert x.storage_type() is fw.FloatStorage and fw.Storage is fw.FloatStorage
        assert ts.pickle_storage_type() == "FloatStorage" and ts.type().endswith("FloatStorage")
        assert fw.ones(2, dtype=fw.bfloat16).storage_type() is fw.BFloat16Storage
        assert fw.ones(2, dtype=fw.float8_e4m3fn).storage_type() is None
        ts[0] = 5
        assert x[0].item() == 5.0
        ts.fill_(1)
        assert x.tolist() == [1.0] * 6
        with pytest.raises(IndexError, match="index 10 out of range for storage of size 6"):
            ts[10]
        with pytest.raises(RuntimeError, match="slices are only supported in UntypedStorage.__getitem__"):
            ts[0:2]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            assert fw.FloatStorage([1, 2]).tolist() == [1.0, 2.0]
            assert fw.TypedStorage([1, 2], dtype=fw.int32).tolist() == [1, 2]
            assert fw.TypedStorage(3).size() == 3


def test_typed_storage_warns_once_as_torch():
    storage_api._warned[0] = False
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tw.ones(2).storage()
        tw.ones(2).storage()
    assert [str(w.message) for w in caught] == [storage_api._TYPED_STORAGE_WARNING]
    assert storage_api._TYPED_STORAGE_WARNING.startswith("TypedStorage is deprecated. It will be removed")


def test_set_to_a_storage_shares_memory_like_torch():
    for fw in (torch, tw):
        b = fw.arange(6.0)
        a = fw.empty(0).set_(b.untyped_storage())
        assert a.shape == (6,) and a.untyped_storage() is b.untyped_storage()
        a[0] = 100.0
        assert b[0].item() == 100.0
        v = fw.empty(0).set_(b.untyped_storage(), 2, (2, 2), (1, 2))
        assert v.tolist() == [[2.0, 4.0], [3.0, 5.0]] and v.storage_offset() == 2
        assert fw.empty(0).set_(b.untyped_storage(), 2, (2, 2)).tolist() == [[2.0, 3.0], [4.0, 5.0]]
        assert fw.empty(0).set_(_typed(b), 1, (2,)).tolist() == [1.0, 2.0]
        assert fw.empty(0).set_(source=b.untyped_storage(), storage_offset=1, size=(2,), stride=(2,)).tolist() \
            == [1.0, 3.0]
        assert fw.empty(0).set_(fw.UntypedStorage(7)).shape == (1,)  # whole elements of the storage
        ints = fw.zeros(0, dtype=fw.int32).set_(b.untyped_storage())  # an untyped storage takes any dtype
        assert ints.shape == (6,) and ints[1].item() == 1065353216
        grown = fw.empty(0).set_(b.untyped_storage(), 2, (20,))  # a storage too small grows
        assert grown[:4].tolist() == [2.0, 3.0, 4.0, 5.0] and b.untyped_storage().nbytes() == 88


def test_set_to_a_tensor_and_empty_like_torch():
    for fw in (torch, tw):
        b = fw.arange(6.0)
        a = fw.zeros(2)
        assert a.set_(b) is a and a.is_set_to(b) and b.is_set_to(a) and not a.is_set_to(b[1:])
        assert fw.zeros(2).set_(b[1:]).tolist() == [1.0, 2.0, 3.0, 4.0, 5.0]
        assert fw.zeros(2).set_(b, 1, (2,), (2,)).tolist() == [1.0, 3.0]
        assert a.set_() is a and a.shape == (0,) and a.untyped_storage().nbytes() == 0


def test_set_errors_in_torchs_words():
    for fw in (torch, tw):
        b = fw.arange(6.0)
        with pytest.raises(RuntimeError, match="Could not set tensor of type double to a tensor of type float"):
            fw.zeros(2).set_(fw.ones(2, dtype=fw.float64))
        with pytest.raises(RuntimeError, match="Could not set tensor of type long int to a tensor of type float"):
            fw.zeros(2).set_(fw.ones(2, dtype=fw.int64))
        with pytest.raises(RuntimeError, match="Expected a Storage of type int or an UntypedStorage, but got type "
                                               "Float for argument 1 'storage'"):
            fw.zeros(0, dtype=fw.int32).set_(_typed(b))
        with pytest.raises(RuntimeError, match="Tensor: invalid storage offset -1"):
            fw.zeros(2).set_(b.untyped_storage(), -1, (2,))
        with pytest.raises(TypeError, match="set_.. received an invalid combination of arguments"):
            fw.zeros(2).set_(5)
        with pytest.raises(TypeError, match="set_.. received an invalid combination of arguments"):
            fw.zeros(2).set_(b.untyped_storage(), 0)


def test_set_and_autograd_like_torch():
    for fw in (torch, tw):
        leaf = fw.zeros(2, requires_grad=True)
        with pytest.raises(RuntimeError, match="a leaf Variable that requires grad is being used in an in-place"):
            leaf.set_(fw.ones(3))
        with fw.no_grad():
            leaf.set_(fw.ones(3))
        assert leaf.tolist() == [1.0, 1.0, 1.0] and leaf.requires_grad
        v = fw.zeros(3)
        before = v._version
        v.set_(fw.ones(3))
        assert v._version > before
    # torch lets set_ replace a non-leaf's memory and fails in backward ("derivative for set_ is not
    # implemented"); tilewise refuses at once rather than keep the old grad_fn
    with pytest.raises(RuntimeError, match="derivative for set_ is not implemented"):
        (tw.zeros(2, requires_grad=True) * 1).set_(tw.ones(3))


def test_set_makes_saved_views_stale():
    """set_ is a write every view of the old memory sees, as torch's shared version counter."""
    for fw in (torch, tw):
        x = fw.ones(3)
        w = fw.ones(3, requires_grad=True)
        y = (w * x[:])  # saves x
        with fw.no_grad():
            x.set_(fw.zeros(3))
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            y.sum().backward()


def test_from_file_like_torch(tmp_path):
    data = np.arange(4, dtype=np.float32).tobytes()
    for fw in (torch, tw):
        name = str(tmp_path / f"{fw.__name__}.bin")
        with open(name, "wb") as f:
            f.write(data)
        assert fw.from_file(name, size=4, dtype=fw.float32).tolist() == [0.0, 1.0, 2.0, 3.0]
        assert fw.from_file(name).shape == (0,)
        private = fw.from_file(name, False, 4, dtype=fw.float32)
        private[1] = 9.0
        del private
        assert fw.from_file(name, size=4).tolist() == [0.0, 1.0, 2.0, 3.0]
        shared = fw.from_file(name, True, 4, dtype=fw.float32)
        assert shared.is_shared()
        shared[0] = 9.0
        del shared
        assert fw.from_file(name, size=4).tolist() == [9.0, 1.0, 2.0, 3.0]
        with pytest.raises(RuntimeError, match=r"size <16> is smaller than the required mapping size <32>"):
            fw.from_file(name, size=8)
        created = str(tmp_path / f"{fw.__name__}_new.bin")
        assert fw.from_file(created, True, 3, dtype=fw.int32).tolist() == [0, 0, 0]
        assert os.path.getsize(created) == 12
        with pytest.raises(RuntimeError, match="in read-only mode: No such file or directory"):
            fw.from_file(str(tmp_path / "missing.bin"), False, 3)
        assert fw.from_file(name, True, 4, dtype=fw.float32, requires_grad=True).requires_grad
        assert fw.UntypedStorage.from_file(name, False, 8).tolist() == list(open(name, "rb").read()[:8])


def test_frombuffer_shares_memory():
    buf = bytearray(8)
    for fw in (torch, tw):
        t = fw.frombuffer(buf, dtype=fw.int32)
        t[0] = 5
        assert buf[0] == 5 and t.untyped_storage().nbytes() == 8
        buf[0] = 0


@pytest.mark.cuda
def test_cuda_storage_methods():
    n = 1 << 18
    x = tw.arange(float(n), device="cuda")
    s = x.untyped_storage()
    assert s.device == tw.device("cuda:0") and s.get_device() == 0 and s.is_cuda and s.is_shared()
    assert s.nbytes() == s.size() == 4 * n and s.data_ptr() == x.data_ptr()
    host = s.cpu()
    assert host.device.type == "cpu" and host.tolist()[:8] == list(np.arange(2, dtype=np.float32).tobytes())
    c = s.clone()
    assert c.device == s.device and c.data_ptr() != s.data_ptr()
    before = tw.cuda.memory_allocated()
    s.resize_(0)
    assert s.nbytes() == 0 and s.data_ptr() == 0 and tw.cuda.memory_allocated() < before - 4 * n + 4096
    s.resize_(4 * n)
    s.copy_(c)
    assert x[:3].tolist() == [0.0, 1.0, 2.0] and x[-1].item() == n - 1
    s.fill_(0)
    assert x.sum().item() == 0.0
    assert host.cuda().device.type == "cuda" and s.cuda() is s
    with pytest.raises(NotImplementedError, match="slicing a storage on cuda"):
        s[0:4]
    y = tw.empty(0, device="cuda").set_(c)
    assert y[:2].tolist() == [0.0, 1.0]
    with pytest.raises(RuntimeError, match="the devices must match"):
        tw.empty(0).set_(c)


def _storage_outcome(fn):
    """A call's value, or its exception's type and message with the class names made library-neutral."""
    import re

    try:
        return ("value", fn())
    except Exception as exc:  # noqa: BLE001 — the outcome is what is compared
        text = re.sub(r"<class '[\w.]*TypedStorage'>", "<TypedStorage>", str(exc))
        return (type(exc).__name__, text.replace("torch.UntypedStorage", "UntypedStorage")
                .replace("tilewise.UntypedStorage", "UntypedStorage"))


@pytest.mark.parametrize("typed", [False, True], ids=["untyped", "typed"])
@pytest.mark.parametrize("index", [1, -1, -4, -5, 4, 1.5, True, np.int64(1), slice(1, 3)],
                         ids=["1", "-1", "-4", "-5", "4", "float", "bool", "np.int64", "slice"])
def test_storage_indexing_edges_as_torch(typed, index):
    """Reading and writing one element of a storage with an index out of range, negative, of another type: the
    value or the error torch gives (type, and message but for the class names); a write's error may say more."""
    import torch

    def make(lib):
        if typed:
            return lib.TypedStorage([1.0, 2.0, 3.0, 4.0], dtype=lib.float32)
        s = lib.UntypedStorage(4)
        for k in range(4):
            s[k] = 10 + k
        return s

    theirs, ours = make(torch), make(tw)
    got, want = _storage_outcome(lambda: ours[index]), _storage_outcome(lambda: theirs[index])
    if want[0] == "value" and isinstance(index, slice):
        got, want = ("value", list(got[1])), ("value", list(want[1]))
    assert got == want
    value = 7.0 if typed else 7
    got, want = _storage_outcome(lambda: ours.__setitem__(index, value)), \
        _storage_outcome(lambda: theirs.__setitem__(index, value))
    assert got[0] == want[0], (got, want)
    assert got[0] == "value" or want[1] in got[1], (got, want)
    assert list(ours) == list(theirs)

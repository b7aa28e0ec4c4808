"""torch's global switches and small top-level functions, each run beside torch: anomaly mode, inference mode,
the raw autocast state functions, warn-always and flush-denormal, typename, can_cast, the window functions,
range, empty_permuted, frombuffer, to_dlpack, layouts and get_device_module."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import tilewise as tw


def _dtype(framework, name: str):
    return getattr(framework, name)


def _outcome(fn):
    """The value fn returns or the type of the exception it raises."""
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 — the exception type is the outcome compared
        return type(exc)


@pytest.fixture(autouse=True)
def _restore_global_state():
    yield
    for fw in (torch, tw):
        fw.set_anomaly_enabled(False)
        fw.set_warn_always(False)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fw.set_autocast_enabled("cpu", False)
            fw.set_autocast_enabled("cuda", False)
            fw.set_autocast_dtype("cpu", fw.bfloat16)
            fw.set_autocast_dtype("cuda", fw.float16)
            fw.set_autocast_cache_enabled(True)
        fw.set_default_dtype(fw.float32)


def test_anomaly_flags_follow_torch():
    for args in [(True,), (True, False), (False,), (False, False)]:
        torch.set_anomaly_enabled(*args)
        tw.set_anomaly_enabled(*args)
        assert tw.is_anomaly_enabled() == torch.is_anomaly_enabled()
        assert tw.is_anomaly_check_nan_enabled() == torch.is_anomaly_check_nan_enabled()
    with pytest.raises(TypeError, match="must be bool"):
        tw.set_anomaly_enabled(1)
    with torch.autograd.detect_anomaly(check_nan=False), tw.autograd.detect_anomaly(check_nan=False):
        assert (tw.is_anomaly_enabled(), tw.is_anomaly_check_nan_enabled()) == (True, False)
    assert tw.is_anomaly_enabled() == torch.is_anomaly_enabled() is False


def test_anomaly_mode_raises_where_backward_makes_nan():
    def backward(fw):
        x = fw.tensor([0.0, 1.0], requires_grad=True)
        with fw.autograd.detect_anomaly():
            fw.sqrt(x).sum().backward()  # d sqrt(x) = 0.5 / sqrt(x): inf at 0, then inf * 0 ... no NaN
            y = fw.tensor([0.0], requires_grad=True)
            (y * fw.tensor([float("nan")])).sum().backward()

    with pytest.raises(RuntimeError, match="returned nan values in its 0th output"):
        backward(torch)
    with pytest.raises(RuntimeError, match="returned nan values in its 0th output"):
        backward(tw)
    x = tw.tensor([0.0], requires_grad=True)
    (x * tw.tensor([float("nan")])).sum().backward()  # off outside the region
    assert x.grad.isnan().all()


def test_inference_mode_is_seen():
    for fw in (torch, tw):
        assert not fw.is_inference_mode_enabled()
        with fw.inference_mode():
            assert fw.is_inference_mode_enabled() and not fw.is_grad_enabled()
            with fw.inference_mode(False):
                assert not fw.is_inference_mode_enabled()
        assert fw.inference_mode()(fw.is_inference_mode_enabled)()


def test_raw_autocast_state_functions_follow_torch():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        for fw in (torch, tw):
            assert fw.get_autocast_cpu_dtype() == fw.bfloat16 and fw.get_autocast_gpu_dtype() == fw.float16
            fw.set_autocast_enabled("cpu", True)
            assert fw.is_autocast_enabled("cpu") and fw.is_autocast_cpu_enabled() and not fw.is_autocast_enabled()
            x = fw.ones(2, 2)
            assert (x @ x).dtype == fw.bfloat16
            fw.set_autocast_dtype("cpu", fw.float16)
            assert (x @ x).dtype == fw.float16 and fw.get_autocast_dtype("cpu") == fw.float16
            fw.set_autocast_cpu_enabled(False)
            assert (x @ x).dtype == fw.float32 and not fw.is_autocast_cpu_enabled()
            fw.set_autocast_cpu_dtype(fw.bfloat16)
            fw.set_autocast_gpu_dtype(fw.bfloat16)
            assert fw.get_autocast_dtype("cpu") == fw.get_autocast_dtype("cuda") == fw.bfloat16
            fw.set_autocast_enabled(True)  # the one-argument form is CUDA's
            assert fw.is_autocast_enabled("cuda") and fw.is_autocast_enabled()
            fw.set_autocast_cache_enabled(False)
            assert not fw.is_autocast_cache_enabled()
            with pytest.raises(TypeError):
                fw.set_autocast_enabled("cpu")
    with pytest.warns(DeprecationWarning, match="get_autocast_dtype"):
        tw.get_autocast_cpu_dtype()


def test_warn_always_and_flush_denormal():
    for fw in (torch, tw):
        assert not fw.is_warn_always_enabled()
        fw.set_warn_always(True)
        assert fw.is_warn_always_enabled()
        with pytest.raises(RuntimeError, match="expects a bool"):
            fw.set_warn_always(1)
        with pytest.raises(RuntimeError, match="expects a bool"):
            fw.set_flush_denormal(1)
    assert tw.set_flush_denormal(False) is torch.set_flush_denormal(False) is True
    assert tw.set_flush_denormal(True) is False  # numpy cannot flush: refused as torch refuses on such a CPU
    torch.set_flush_denormal(False)
    assert tw.tensor([1e-40], dtype=tw.float32).item() != 0.0
    assert tw.init_num_threads() is torch.init_num_threads() is None


@pytest.mark.parametrize("dtype", ["float32", "int32", "bool", "bfloat16", "float16", "float64", "uint8", "int64"])
def test_typename_of_tensors_is_their_type_string(dtype):
    expected = torch.typename(torch.zeros(2, dtype=getattr(torch, dtype)))
    assert tw.typename(tw.zeros(2, dtype=getattr(tw, dtype))) == expected.replace("torch.", "tilewise.")


def test_typename_of_other_objects():
    assert tw.typename(3) == torch.typename(3) == "int"
    assert tw.typename(len) == torch.typename(len) == "len"
    assert tw.typename(np.zeros(2)) == torch.typename(np.zeros(2)) == "numpy.ndarray"
    assert tw.typename(tw.nn.Linear(2, 2)).endswith(".Linear")
    assert tw.typename(tw.nn.Linear) == f"{tw.nn.Linear.__module__}.Linear"


DTYPES = ["bool", "uint8", "int8", "int32", "int64", "float16", "bfloat16", "float32", "float64", "complex64"]


def test_can_cast_matches_torch():
    for a in DTYPES:
        for b in DTYPES:
            assert tw.can_cast(getattr(tw, a), getattr(tw, b)) == torch.can_cast(getattr(torch, a), getattr(torch, b))
    assert tw.can_cast(from_=tw.int8, to=tw.uint8)
    with pytest.raises(TypeError, match="must be tilewise.dtype"):
        tw.can_cast(1, tw.float32)


def test_set_default_tensor_type_sets_the_default_dtype():
    with pytest.warns(UserWarning, match="deprecated"):
        tw.set_default_tensor_type(tw.FloatTensor)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns once per process
        for fw, prefix in ((torch, "torch"), (tw, "tilewise")):
            fw.set_default_tensor_type(f"{prefix}.DoubleTensor")
            assert fw.get_default_dtype() == fw.float64 and fw.zeros(1).dtype == fw.float64
            fw.set_default_tensor_type(fw.FloatTensor)
            assert fw.get_default_dtype() == fw.float32
            with pytest.raises(TypeError, match="floating-point"):
                fw.set_default_tensor_type(fw.IntTensor)
            with pytest.raises(TypeError):
                fw.set_default_tensor_type(3)


WINDOWS = ["hann_window", "hamming_window", "blackman_window", "bartlett_window", "kaiser_window"]


@pytest.mark.parametrize("name", WINDOWS)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_windows_match_torch(name, dtype):
    for length in (0, 1, 2, 3, 5, 8, 17):
        for periodic in (True, False):
            expected = getattr(torch, name)(length, periodic, dtype=getattr(torch, dtype))
            actual = getattr(tw, name)(length, periodic, dtype=getattr(tw, dtype))
            assert actual.dtype.name == dtype and tuple(actual.shape) == tuple(expected.shape)
            tol = 1e-6 if dtype == "float32" else 1e-13
            np.testing.assert_allclose(actual.numpy(), expected.numpy(), rtol=tol, atol=tol)


def test_window_options_and_errors():
    np.testing.assert_allclose(tw.hamming_window(7, False, 0.5, 0.3).numpy(),
                               torch.hamming_window(7, False, 0.5, 0.3).numpy(), rtol=1e-6)
    np.testing.assert_allclose(tw.kaiser_window(9, True, 5.0).numpy(), torch.kaiser_window(9, True, 5.0).numpy(),
                               rtol=1e-6)
    assert tw.hann_window(4, requires_grad=True).requires_grad
    for name in WINDOWS:
        for fw in (torch, tw):
            with pytest.raises(RuntimeError, match="expects floating point dtypes"):
                getattr(fw, name)(5, dtype=fw.int64)
            with pytest.raises(RuntimeError, match="non-negative window_length"):
                getattr(fw, name)(-1)
            with pytest.raises(TypeError, match="must be int"):
                getattr(fw, name)(2.5)


@pytest.mark.parametrize("args,kwargs", [((0, 3), {}), ((1, 4, 0.5), {}), ((1, 3), {"dtype": "int64"}),
                                         ((3, 0, -1), {}), ((0.1, 1.0, 0.3), {"dtype": "float64"}),
                                         ((0, 1, 0.1), {}), ((2, 2), {})], ids=str)
def test_range_includes_its_end_like_torch(args, kwargs):
    with pytest.warns(UserWarning, match="deprecated"):
        expected = torch.range(*args, **{k: getattr(torch, v) for k, v in kwargs.items()})
    with pytest.warns(UserWarning, match="deprecated"):
        actual = tw.range(*args, **{k: getattr(tw, v) for k, v in kwargs.items()})
    assert actual.dtype.name == str(expected.dtype).removeprefix("torch.")
    np.testing.assert_array_equal(actual.numpy(), expected.numpy())


def test_range_errors_like_torch():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for args in [(3, 0), (0, 3, 0)]:
            with pytest.raises(RuntimeError):
                torch.range(*args)
            with pytest.raises(RuntimeError):
                tw.range(*args)
        with pytest.raises(TypeError):
            tw.range(3)


@pytest.mark.parametrize("size,order", [((2, 3, 4), (0, 2, 1)), ((2, 3, 4), (2, 0, 1)), ((5,), (0,)), ((), ()),
                                        ((2, 0, 3), (1, 2, 0))], ids=str)
def test_empty_permuted_strides_match_torch(size, order):
    expected = torch.empty_permuted(size, order)
    actual = tw.empty_permuted(size, order, dtype=tw.float64)
    assert tuple(actual.shape) == tuple(expected.shape) and actual.stride() == expected.stride()
    assert actual.dtype == tw.float64


def test_empty_permuted_errors_like_torch():
    for size, order, match in [((2, 3, 4), (0, 1), "does not match the length"), ((2, 3, 4), (0, 1, 1), "Duplicate"),
                               ((2, 3, 4), (0, 1, 3), "Dimension out of range")]:
        for fw in (torch, tw):
            with pytest.raises(RuntimeError, match=match):
                fw.empty_permuted(size, order)
    assert tw.empty_permuted((2, 3), (1, 0), requires_grad=True).requires_grad


def test_frombuffer_shares_memory_like_torch():
    data = bytearray(np.arange(1, 7, dtype=np.int32).tobytes())
    for count, offset in [(-1, 0), (2, 4), (1, 20)]:
        expected = torch.frombuffer(data, dtype=torch.int32, count=count, offset=offset)
        actual = tw.frombuffer(data, dtype=tw.int32, count=count, offset=offset)
        np.testing.assert_array_equal(actual.numpy(), expected.numpy())
    shared = tw.frombuffer(data, dtype=tw.int32)
    data[0] = 9
    assert shared[0].item() == 9
    assert tw.frombuffer(b"abcd", dtype=tw.uint8).tolist() == [97, 98, 99, 100]
    assert tw.frombuffer(data, dtype=tw.float32, requires_grad=True).requires_grad


@pytest.mark.parametrize("kwargs", [{"dtype": "int64"}, {"dtype": "int32", "count": 7},
                                    {"dtype": "int32", "offset": 24}, {"dtype": "int32", "count": 0},
                                    {"dtype": "int32", "offset": -1},
                                    {"dtype": "int32", "offset": 2}], ids=str)
def test_frombuffer_errors_like_torch(kwargs):
    data = bytearray(20)
    args = {k: getattr(torch, v) if k == "dtype" else v for k, v in kwargs.items()}
    with pytest.raises(ValueError) as expected:
        torch.frombuffer(data, **args)
    with pytest.raises(ValueError) as actual:
        tw.frombuffer(data, **{k: getattr(tw, v) if k == "dtype" else v for k, v in kwargs.items()})
    assert str(actual.value) == str(expected.value)


def test_frombuffer_refuses_objects_without_a_buffer():
    with pytest.raises(ValueError, match="buffer protocol"):
        tw.frombuffer([1, 2], dtype=tw.float32)


def test_to_dlpack_round_trips_through_torch():
    x = tw.arange(6.0, requires_grad=True).view(2, 3)
    y = torch.from_dlpack(tw.to_dlpack(x))
    np.testing.assert_array_equal(y.numpy(), x.detach().numpy())
    z = tw.from_dlpack(torch.to_dlpack(torch.arange(4)))
    assert z.tolist() == [0, 1, 2, 3]
    with pytest.raises(TypeError, match="must be Tensor"):
        tw.to_dlpack(3)


def test_layouts_and_storage_predicates():
    assert tw.ones(2).layout is tw.strided and repr(tw.strided) == "tilewise.strided"
    assert torch.ones(2).layout is torch.strided
    assert isinstance(tw.strided, tw.layout) and isinstance(tw.contiguous_format, tw.memory_format)
    for fw in (torch, tw):
        with pytest.raises(TypeError, match="cannot create"):
            fw.layout()
    x = tw.ones(2)
    assert tw.is_storage(x.untyped_storage()) and not tw.is_storage(x)
    assert torch.is_storage(torch.ones(2).untyped_storage()) and not torch.is_storage(torch.ones(2))


def test_get_device_module():
    assert tw.get_device_module("cpu") is tw.cpu and torch.get_device_module("cpu") is torch.cpu
    assert tw.get_device_module(tw.device("cuda:0")) is tw.cuda
    assert tw.get_device_module() is (tw.cuda if tw.cuda.is_available() else tw.cpu)
    for fw in (torch, tw):
        with pytest.raises(RuntimeError, match="Invalid value of device"):
            fw.get_device_module(3)
        with pytest.raises(RuntimeError, match="does not have a corresponding module"):
            fw.get_device_module("meta")


REPR_VALUES = [[0.001, 2.0], [1.5, -22.25, 3.0], [1e9, 1.0], [1.0, 2.0, 3000.0], [0.5, 1e-5], [[1.5, 2.25], [3.0, 4.0]],
               [float("nan"), 1.5, float("inf")], [123456.5, 1.25], [0.0, 0.0], [-0.0, 1.0], 3.5, [],
               np.arange(2000.0), np.arange(3000.0).reshape(10, 300), np.zeros((2, 0)),
               np.random.default_rng(0).standard_normal((4, 30)), np.random.default_rng(1).standard_normal((50, 40))]


def _same_repr(values, dtype="float32"):
    array = np.asarray(values, dtype=dtype)
    expected = repr(torch.tensor(array))
    assert repr(tw.tensor(array)).replace("tilewise", "torch") == expected


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16", "int32", "int64", "uint8"])
@pytest.mark.parametrize("values", REPR_VALUES, ids=range(len(REPR_VALUES)))
def test_tensor_repr_matches_torch(values, dtype):
    array = np.asarray(values, dtype=np.float64)
    if dtype.startswith(("int", "uint")):
        array = np.nan_to_num(np.abs(array), posinf=7.0).astype(dtype) % 100
    expected = repr(torch.tensor(array, dtype=getattr(torch, dtype)))
    assert repr(tw.tensor(array, dtype=getattr(tw, dtype))).replace("tilewise", "torch") == expected


@pytest.mark.parametrize("options", [{"precision": 2}, {"threshold": 5}, {"edgeitems": 1, "threshold": 5},
                                     {"linewidth": 30}, {"profile": "short"}, {"profile": "full"}, {"sci_mode": True},
                                     {"sci_mode": False}, {"edgeitems": 0, "threshold": 5}], ids=str)
def test_set_printoptions_changes_repr_like_torch(options):
    torch.set_printoptions(**options)
    tw.set_printoptions(**options)
    try:
        for values in (np.arange(12.0).reshape(3, 4) / 7, np.array([1e-5, 1.0]), np.arange(1200.0)):
            _same_repr(values)
        _same_repr(np.arange(10), "int64")
    finally:
        torch.set_printoptions(profile="default")
        tw.set_printoptions(profile="default")


def test_repr_of_complex_bool_and_grad_tensors():
    _same_repr([1 + 2j, -0.5 - 1j], "complex64")
    _same_repr([[True, False]], "bool")
    assert repr(tw.ones(2, requires_grad=True) * 2) == repr(torch.ones(2, requires_grad=True) * 2)


def test_a_device_block_is_where_factories_and_modules_put_tensors_on_this_thread():
    """``with torch.device(...)``: the default device inside the block (nested blocks too), restored after, and
    other threads unaffected; meta tensors are refused with a message saying what to do instead."""
    import threading

    import torch

    assert tw.get_default_device() == tw.device("cpu")
    with tw.device("cpu") as inside:
        assert inside == tw.device("cpu") and tw.get_default_device() == tw.device("cpu")
        layer = tw.nn.Linear(3, 2)
        assert layer.weight.device == tw.device("cpu")
        seen = []
        worker = threading.Thread(target=lambda: seen.append(tw.get_default_device()))
        worker.start()
        worker.join()
        assert seen == [tw.device("cpu")]
    with torch.device("meta"):
        assert str(torch.get_default_device()) == "meta"
        with torch.device("cpu"):
            assert str(torch.get_default_device()) == "cpu"
        assert str(torch.get_default_device()) == "meta"
    with tw.device("meta"):
        assert str(tw.get_default_device()) == "meta"
        with tw.device("cpu"):
            assert str(tw.get_default_device()) == "cpu"
            assert tw.zeros(2).device == tw.device("cpu")
        assert str(tw.get_default_device()) == "meta"
        with pytest.raises(RuntimeError, match="tilewise has no meta tensors"):
            tw.nn.Linear(3, 2)
    assert str(tw.get_default_device()) == "cpu" == str(torch.get_default_device())

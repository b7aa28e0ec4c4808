"""tilewise.save / tilewise.load: safetensors for tensors, JSON for structure; interop with torch's safetensors."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

import tilewise as tw


def _round_trip(obj):
    buf = io.BytesIO()
    tw.save(obj, buf)
    buf.seek(0)
    return tw.load(buf)


def test_nested_structure_round_trips():
    w = tw.randn(3, 4)
    obj = {"model": {"fc.weight": w, "fc.bias": tw.zeros(4)}, "epoch": 7, "lr": 1e-3, "name": "run",
           "flags": [True, None], "betas": (0.9, 0.999), "by_index": {0: tw.ones(2), 1: {"step": 3}},
           "dtype": tw.bfloat16, "inf": float("inf"), "__dunder_key": 1}
    out = _round_trip(obj)
    assert out["epoch"] == 7 and out["lr"] == 1e-3 and out["name"] == "run" and out["flags"] == [True, None]
    assert out["betas"] == (0.9, 0.999) and out["dtype"] is tw.bfloat16 and out["inf"] == float("inf")
    assert out["__dunder_key"] == 1 and set(out["by_index"]) == {0, 1} and out["by_index"][1] == {"step": 3}
    np.testing.assert_array_equal(out["model"]["fc.weight"].numpy(), w.numpy())
    assert out["by_index"][0].tolist() == [1.0, 1.0]


@pytest.mark.parametrize("dtype", [tw.bool, tw.uint8, tw.int8, tw.int16, tw.int32, tw.int64, tw.float16, tw.bfloat16,
                                   tw.float32, tw.float64, tw.float8_e4m3fn, tw.float8_e5m2], ids=str)
def test_every_dtype_round_trips(dtype):
    t = (tw.arange(6) % 3).to(dtype).view(2, 3)
    out = _round_trip({"t": t})["t"]
    assert out.dtype is dtype and out.shape == (2, 3)
    np.testing.assert_array_equal(out.numpy().view(np.uint8), t.numpy().view(np.uint8))


def test_zero_dim_tensors_come_back_zero_dim():
    """An optimizer's ``step`` is 0-dim: were it to come back with shape [1], it would widen the dtype of every
    product it meets (a 1-D float64 tensor is not a scalar to type promotion)."""
    out = _round_trip({"step": tw.tensor(3.0), "t": tw.tensor(7, dtype=tw.int64)})
    assert out["step"].shape == () and out["step"].item() == 3.0
    assert out["t"].shape == () and out["t"].item() == 7


def test_shared_tensor_comes_back_as_one_object_and_views_as_views():
    """As torch.load gives them (tests/test_trust_checkpoints.py compares every case with torch)."""
    w = tw.arange(6.0).view(2, 3)
    out = _round_trip({"a": w, "b": w, "t": w.t()})
    assert out["a"] is out["b"]
    assert out["t"].tolist() == w.t().tolist() and out["t"].stride() == (1, 3)
    assert out["t"].untyped_storage() is out["a"].untyped_storage()


def test_requires_grad_is_kept():
    out = _round_trip({"p": tw.ones(2, requires_grad=True), "q": tw.ones(2)})
    assert out["p"].requires_grad and not out["q"].requires_grad


def test_a_file_written_by_torch_safetensors_loads(tmp_path):
    path = tmp_path / "torch.safetensors"
    tensors = {"w": torch.randn(3, 2), "h": torch.ones(4, dtype=torch.bfloat16), "i": torch.arange(3)}
    save_file(tensors, str(path))
    out = tw.load(path)
    assert set(out) == set(tensors)
    for name, t in tensors.items():
        assert torch.equal(torch.from_dlpack(out[name]), t)


def test_a_tilewise_checkpoint_is_a_plain_safetensors_file(tmp_path):
    path = tmp_path / "model.safetensors"
    model = tw.nn.Sequential(tw.nn.Linear(3, 4), tw.nn.ReLU(), tw.nn.Linear(4, 2))
    tw.save(model.state_dict(), path)
    loaded = load_file(str(path))
    assert set(loaded) == {"0.weight", "0.bias", "2.weight", "2.bias"}
    np.testing.assert_array_equal(loaded["0.weight"].numpy(), model[0].weight.detach().numpy())


def test_module_state_dict_round_trip_through_a_file(tmp_path):
    model = tw.nn.Sequential(tw.nn.Linear(3, 4), tw.nn.Tanh(), tw.nn.Linear(4, 2))
    path = tmp_path / "ckpt.safetensors"
    tw.save(model.state_dict(), path)
    other = tw.nn.Sequential(tw.nn.Linear(3, 4), tw.nn.Tanh(), tw.nn.Linear(4, 2))
    other.load_state_dict(tw.load(path))
    x = tw.randn(5, 3)
    np.testing.assert_array_equal(other(x).detach().numpy(), model(x).detach().numpy())


def test_map_location_and_unsupported_values():
    out = tw.load(io.BytesIO(_bytes({"t": tw.ones(1)})), map_location="cpu")
    assert out["t"].device == tw.device("cpu")
    with pytest.raises(TypeError, match="cannot store a set at 'a.b'"):
        tw.save({"a": {"b": {1, 2}}}, io.BytesIO())


def _bytes(obj) -> bytes:
    buf = io.BytesIO()
    tw.save(obj, buf)
    return buf.getvalue()


def test_numpy_values_round_trip_as_torch_save_and_load_give_them():
    """torch.save pickles numpy arrays and scalars; torch.load returns them with weights_only=False and refuses
    them (pickle.UnpicklingError) by default. A safetensors checkpoint does the same: values as tensors, marked
    to come back as numpy had them."""
    import pickle

    grid = np.arange(6, dtype=np.float32).reshape(2, 3)
    values = {"grid": grid, "again": grid, "fortran": np.asfortranarray(np.arange(6.0).reshape(2, 3)),
              "big_endian": np.arange(3, dtype=">i4"), "bools": np.array([True, False]), "zero_dim": np.array(2.5),
              "f32": np.float32(1.5), "i64": np.int64(3), "empty": np.zeros((0, 2), np.int16)}
    buf = io.BytesIO()
    torch.save(values, buf)
    buf.seek(0)
    theirs = torch.load(buf, weights_only=False)
    ours = tw.load(io.BytesIO(_bytes({"t": tw.ones(2), **values})), weights_only=False)
    for key, value in theirs.items():
        got = ours[key]
        assert type(got) is type(value) and got.dtype == value.dtype and np.shape(got) == np.shape(value), key
        assert np.array_equal(got, value) and np.asarray(got).strides == np.asarray(value).strides, key
    assert ours["again"] is ours["grid"] and ours["t"].tolist() == [1.0, 1.0]
    for weights_only in (None, True):
        buf.seek(0)
        with pytest.raises(pickle.UnpicklingError) as reference:
            torch.load(buf, weights_only=weights_only)
        reason = str(reference.value).split("WeightsUnpickler error: ")[1].split(" Please use")[0]
        with pytest.raises(pickle.UnpicklingError) as refused:
            tw.load(io.BytesIO(_bytes(values)), weights_only=weights_only)
        assert reason in str(refused.value)
    with pytest.raises(TypeError, match="numpy ndarray at 'names' has dtype <U1.*format='torch'"):
        tw.save({"names": np.array(["a"])}, io.BytesIO())

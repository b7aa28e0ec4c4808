"""torch's checkpoint format: tilewise.load reads what torch.save writes (zip and legacy), tilewise.save writes what
torch.load(weights_only=True) reads, a malicious pickle is refused without running, map_location and mmap are
torch's, and the extension chooses the format saved while the bytes choose the format loaded."""

from __future__ import annotations

import io
import os
import pickle
import zipfile
from collections import OrderedDict

import numpy as np
import pytest
import torch

import tilewise as tw

DTYPES = ["bool", "uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16", "float32", "float64",
          "float8_e4m3fn", "float8_e5m2"]


def as_torch(t: tw.Tensor) -> torch.Tensor:
    return torch.from_dlpack(t.detach().contiguous())


def same_bytes(ours: tw.Tensor, theirs: torch.Tensor) -> bool:
    a = ours.detach().contiguous().numpy().reshape(-1).view(np.uint8)
    b = theirs.detach().contiguous().reshape(-1).view(torch.uint8).numpy()
    return ours.dtype.name == str(theirs.dtype).removeprefix("torch.") and tuple(ours.shape) == tuple(
        theirs.shape) and np.array_equal(a, b)


def torch_bytes(obj, **kwargs) -> io.BytesIO:
    buf = io.BytesIO()
    torch.save(obj, buf, **kwargs)
    buf.seek(0)
    return buf


def tw_bytes(obj) -> io.BytesIO:
    buf = io.BytesIO()
    tw.save(obj, buf, format="torch")
    buf.seek(0)
    return buf


def _sample(dtype: str, lib):
    t = (lib.arange(12) % 5 - 2).to(getattr(lib, dtype)).reshape(3, 4)
    return t


# ---------------------------------------------------------------------------- torch.save -> tilewise.load

@pytest.mark.parametrize("legacy", [False, True], ids=["zip", "legacy"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_every_dtype_written_by_torch_loads(dtype, legacy):
    theirs = {"t": _sample(dtype, torch), "scalar": torch.tensor(2.5), "empty": torch.zeros(0, 3)}
    out = tw.load(torch_bytes(theirs, _use_new_zipfile_serialization=not legacy))
    for key, value in theirs.items():
        assert same_bytes(out[key], value), key
    assert out["scalar"].shape == ()


@pytest.mark.parametrize("legacy", [False, True], ids=["zip", "legacy"])
def test_structure_and_views_written_by_torch_load_as_torch_gives_them(legacy):
    w = torch.arange(12.0).reshape(3, 4)
    model = torch.nn.Linear(3, 2)
    obj = {"w": w, "again": w, "t": w.t(), "row": w[1], "cols": w[:, 1:3], "state": model.state_dict(),
           "param": model.weight, "size": torch.Size([2, 3]), "dtype": torch.bfloat16, "device": torch.device("cpu"),
           "mixed": [1, 2.5, None, True, "s", b"\x00\xff", (1, (2,)), {3, 4}, 1 + 2j, 2**80],
           "grad": torch.ones(2, requires_grad=True)}
    out = tw.load(torch_bytes(obj, _use_new_zipfile_serialization=not legacy))
    reference = torch.load(torch_bytes(obj, _use_new_zipfile_serialization=not legacy))
    for key in ("w", "t", "row", "cols"):
        assert same_bytes(out[key], reference[key]) and out[key].stride() == reference[key].stride(), key
        assert out[key].storage_offset() == reference[key].storage_offset(), key
        assert out[key].untyped_storage() is out["w"].untyped_storage(), "views share one storage"
    assert out["again"] is out["w"]
    out["w"][0, 1] = 100.0
    assert out["t"][1, 0].item() == 100.0 and out["cols"][0, 0].item() == 100.0
    assert isinstance(out["state"], OrderedDict) and out["state"]._metadata == reference["state"]._metadata
    assert isinstance(out["param"], tw.nn.Parameter) and out["param"].requires_grad
    assert same_bytes(out["param"], model.weight) and out["grad"].requires_grad and out["grad"].is_leaf
    assert out["size"] == tw.Size([2, 3]) and isinstance(out["size"], tw.Size)
    assert out["dtype"] is tw.bfloat16 and out["device"] == tw.device("cpu")
    assert out["mixed"] == reference["mixed"]


def test_pickle_protocols_beyond_2_load():
    obj = {"t": torch.arange(4.0), "x": [b"ab", frozenset({1}), (1, 2)]}
    for protocol in (2, 3, 4, 5):
        out = tw.load(torch_bytes(obj, pickle_protocol=protocol))
        assert same_bytes(out["t"], obj["t"]) and out["x"] == obj["x"], protocol


@pytest.mark.parametrize("dtype", ["uint16", "complex64", "float8_e5m2fnuz"])
def test_a_dtype_tilewise_lacks_is_named(dtype):
    if dtype in {d.name for d in tw.dtypes.ALL}:
        pytest.skip(f"tilewise has {dtype}")
    with pytest.raises(pickle.UnpicklingError, match=f"holds {dtype} tensors, which tilewise does not support"):
        tw.load(torch_bytes({"t": torch.zeros(2, dtype=getattr(torch, dtype))}))


# ---------------------------------------------------------------------------- tilewise.save -> torch.load

@pytest.mark.parametrize("dtype", DTYPES)
def test_every_dtype_written_here_loads_in_torch(dtype):
    ours = {"t": _sample(dtype, tw), "scalar": tw.tensor(2.5), "empty": tw.zeros(0, 3)}
    theirs = torch.load(tw_bytes(ours), weights_only=True)
    for key, value in ours.items():
        assert same_bytes(value, theirs[key]), key


def test_structure_and_shared_storage_written_here_load_in_torch_as_saved():
    w = tw.arange(12.0).reshape(3, 4)
    model = tw.nn.Linear(3, 2)
    obj = {"w": w, "again": w, "t": w.t(), "row": w[1], "cols": w[:, 1:3], "state": model.state_dict(),
           "param": model.weight, "size": tw.Size([2, 3]), "dtype": tw.bfloat16, "device": tw.device("cpu"),
           "mixed": [1, 2.5, None, True, "s", b"\x00\xff", (1, (2,)), {3, 4}, 1 + 2j, 2**80, -2**40],
           "nested": {0: {"step": tw.tensor(3.0)}, "k": OrderedDict(a=1)}}
    theirs = torch.load(tw_bytes(obj), weights_only=True)
    for key in ("w", "t", "row", "cols"):
        assert same_bytes(obj[key], theirs[key]) and theirs[key].stride() == obj[key].stride(), key
        assert theirs[key].storage_offset() == obj[key].storage_offset(), key
        assert theirs[key].untyped_storage().data_ptr() == theirs["w"].untyped_storage().data_ptr()
    assert theirs["again"] is theirs["w"]
    assert isinstance(theirs["param"], torch.nn.Parameter) and same_bytes(model.weight, theirs["param"])
    assert theirs["size"] == torch.Size([2, 3]) and theirs["dtype"] is torch.bfloat16
    assert theirs["device"] == torch.device("cpu") and theirs["mixed"] == obj["mixed"]
    assert theirs["nested"][0]["step"].shape == () and theirs["nested"]["k"] == OrderedDict(a=1)
    assert set(theirs["state"]) == {"weight", "bias"}


def test_a_torch_model_loads_a_state_dict_saved_here(tmp_path):
    tw.manual_seed(0)
    model = tw.nn.Sequential(tw.nn.Linear(3, 4), tw.nn.Tanh(), tw.nn.Linear(4, 2))
    path = tmp_path / "model.pt"
    tw.save(model.state_dict(), path)
    assert zipfile.is_zipfile(path) and zipfile.ZipFile(path).namelist()[0] == "model/data.pkl"
    theirs = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))
    theirs.load_state_dict(torch.load(path, weights_only=True))
    x = np.random.default_rng(0).standard_normal((5, 3)).astype(np.float32)
    np.testing.assert_allclose(theirs(torch.tensor(x)).detach().numpy(), model(tw.tensor(x)).detach().numpy(),
                               rtol=1e-6, atol=1e-6)  # an output near zero differs in its last bits only
    theirs_mapped = torch.load(path, weights_only=True, mmap=True)  # records are aligned as torch's own
    assert torch.equal(theirs_mapped["0.weight"], as_torch(model[0].weight))


def test_records_are_aligned_for_mapping(tmp_path):
    path = tmp_path / "aligned.pt"
    tw.save({"a": tw.ones(3, dtype=tw.int8), "b": tw.ones(5), "c": tw.ones(7, dtype=tw.float64)}, path)
    data = path.read_bytes()
    for info in zipfile.ZipFile(path).infolist():
        name_length, extra_length = np.frombuffer(data[info.header_offset + 26:info.header_offset + 30], "<u2")
        assert (info.header_offset + 30 + name_length + extra_length) % 64 == 0, info.filename


# ---------------------------------------------------------------------------- refusing code

class _RunsCode:
    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


@pytest.mark.parametrize("legacy", [False, True], ids=["zip", "legacy"])
def test_a_pickle_that_would_run_code_is_refused_without_running(tmp_path, legacy):
    marker = tmp_path / "ran"
    buf = torch_bytes({"w": torch.ones(2), "evil": _RunsCode(str(marker))}, _use_new_zipfile_serialization=not legacy)
    with pytest.raises(pickle.UnpicklingError, match=r"GLOBAL (posix|os)\.system is not allowed"):
        tw.load(buf)
    assert not marker.exists()
    buf.seek(0)
    with pytest.raises(pickle.UnpicklingError, match="not allowed"):
        tw.load(buf, weights_only=False)  # never widened: tilewise does not run code from files
    assert not marker.exists()


def test_other_globals_and_opcodes_are_refused():
    buf = torch_bytes({"fn": np.add})
    with pytest.raises(pickle.UnpicklingError, match="numpy.*not allowed"):
        tw.load(buf)
    buf = torch_bytes({"t": torch.ones(2)})
    archive = zipfile.ZipFile(buf)
    evil = io.BytesIO()
    with zipfile.ZipFile(evil, "w") as out:
        for info in archive.infolist():  # an OrderedDict's BUILD may set attributes; a list's may not
            data = archive.read(info)
            if info.filename.endswith("data.pkl"):
                data = b"\x80\x02]q\x00}q\x01X\x01\x00\x00\x00aK\x01sb."
            out.writestr(info.filename, data)
    evil.seek(0)
    with pytest.raises(pickle.UnpicklingError, match="BUILD"):
        tw.load(evil)


# ---------------------------------------------------------------------------- map_location, mmap

def test_map_location_forms():
    buf = torch_bytes({"w": torch.arange(6.0).reshape(2, 3), "t": None})
    for where in ("cpu", tw.device("cpu"), torch.device("cpu"), {"cpu": "cpu"}, lambda storage, loc: storage,
                  lambda storage, loc: None, lambda storage, loc: storage.cpu()):
        buf.seek(0)
        out = tw.load(buf, map_location=where)
        assert out["w"].device == tw.device("cpu") and out["w"].tolist() == [[0, 1, 2], [3, 4, 5]]
    seen = []
    buf.seek(0)
    tw.load(buf, map_location=lambda storage, location: seen.append(location))
    assert seen == ["cpu"]
    buf.seek(0)
    with pytest.raises(TypeError, match="map_location returned a str"):
        tw.load(buf, map_location=lambda storage, location: "cpu")


def test_a_cuda_checkpoint_without_cuda_names_map_location():
    buf = tw_bytes({"w": tw.ones(2)})
    pickled = zipfile.ZipFile(buf).read("archive/data.pkl").replace(b"X\x03\x00\x00\x00cpu", b"X\x06\x00\x00\x00cuda:0")
    moved = io.BytesIO()
    with zipfile.ZipFile(buf) as archive, zipfile.ZipFile(moved, "w") as out:
        for info in archive.infolist():
            out.writestr(info.filename, pickled if info.filename.endswith("data.pkl") else archive.read(info))
    moved.seek(0)
    if tw.cuda.is_available():
        assert tw.load(moved)["w"].device == tw.device("cuda:0")
    else:
        with pytest.raises(RuntimeError, match="map_location='cpu'"):
            tw.load(moved)
    moved.seek(0)
    assert tw.load(moved, map_location="cpu")["w"].device == tw.device("cpu")
    moved.seek(0)
    assert tw.load(moved, map_location={"cuda:0": "cpu"})["w"].tolist() == [1.0, 1.0]


@pytest.mark.cuda
def test_map_location_moves_shared_storages_to_cuda_once():
    w = torch.arange(6.0).reshape(2, 3)
    out = tw.load(torch_bytes({"w": w, "t": w.t()}), map_location="cuda")
    assert out["w"].device.type == "cuda" and out["t"].untyped_storage() is out["w"].untyped_storage()
    assert out["t"].cpu().tolist() == w.t().tolist()
    mapped = tw.load(torch_bytes({"w": w, "t": w.t()}), map_location=lambda storage, loc: storage.cuda(0))
    assert mapped["t"].device == tw.device("cuda:0") and mapped["t"].untyped_storage() is mapped["w"].untyped_storage()
    back = torch.load(tw_bytes(out), map_location="cpu", weights_only=True)
    assert torch.equal(back["t"], w.t())


def test_mmap_maps_records_copy_on_write(tmp_path):
    path = tmp_path / "mapped.pt"
    torch.save({"w": torch.arange(1000.0), "v": torch.arange(10.0)[2:5]}, path)
    before = path.read_bytes()
    out = tw.load(path, mmap=True)
    assert out["w"].tolist() == list(range(1000)) and out["v"].tolist() == [2.0, 3.0, 4.0]
    assert isinstance(out["w"].untyped_storage().data, np.memmap)
    out["w"].add_(1.0)
    assert out["w"][0].item() == 1.0 and path.read_bytes() == before
    with pytest.raises(ValueError, match="file path"):
        tw.load(io.BytesIO(before), mmap=True)
    legacy = tmp_path / "legacy.pt"
    torch.save({"w": torch.ones(2)}, legacy, _use_new_zipfile_serialization=False)
    with pytest.raises(RuntimeError, match="mmap"):
        tw.load(legacy, mmap=True)


# ---------------------------------------------------------------------------- which format

@pytest.mark.parametrize("suffix,kind", [(".pt", "torch"), (".pth", "torch"), (".bin", "torch"), (".ckpt", "torch"),
                                         (".safetensors", "safetensors"), (".tw", "safetensors")])
def test_the_extension_chooses_the_format_saved_and_the_bytes_the_format_loaded(tmp_path, suffix, kind):
    path = tmp_path / f"model{suffix}"
    tw.save({"w": tw.arange(3.0)}, path)
    assert zipfile.is_zipfile(path) == (kind == "torch")
    renamed = tmp_path / ("renamed.safetensors" if kind == "torch" else "renamed.pt")
    path.rename(renamed)
    assert tw.load(renamed)["w"].tolist() == [0.0, 1.0, 2.0]


def test_a_format_the_extension_does_not_promise_is_refused(tmp_path):
    with pytest.raises(ValueError, match="promises a safetensors file"):
        tw.save({"w": tw.ones(1)}, tmp_path / "x.safetensors", format="torch")
    with pytest.raises(ValueError, match="promises a torch file"):
        tw.save({"w": tw.ones(1)}, tmp_path / "x.pt", format="safetensors")
    with pytest.raises(ValueError, match="format must be one of"):
        tw.save({"w": tw.ones(1)}, io.BytesIO(), format="pickle")
    assert list(tmp_path.iterdir()) == []
    tw.save({"w": tw.ones(1)}, tmp_path / "x.other", format="torch")
    assert zipfile.is_zipfile(tmp_path / "x.other")
    with open(tmp_path / "handle.pt", "wb") as handle:  # an open file's name counts as a path's
        tw.save({"w": tw.ones(1)}, handle)
    assert torch.load(tmp_path / "handle.pt")["w"].tolist() == [1.0]


def test_torch_format_save_is_atomic(tmp_path):
    path = tmp_path / "ckpt.pt"
    tw.save({"w": tw.ones(3), "step": 1}, path)

    class Unpicklable:
        pass

    with pytest.raises(TypeError, match="cannot store a Unpicklable at 'bad'"):
        tw.save({"w": tw.zeros(3), "bad": Unpicklable()}, path)
    assert torch.load(path)["step"] == 1 and [p.name for p in tmp_path.iterdir()] == ["ckpt.pt"]


@pytest.mark.parametrize("name", ["model.pt", "model.safetensors"])
def test_saving_a_whole_module_says_to_save_its_state_dict(tmp_path, name):
    model = tw.nn.Linear(2, 2)
    optimizer = tw.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(TypeError, match=r"cannot store a Linear at 'the top level'.*Save its state_dict\(\) and load "
                                        r"that into a new Linear with load_state_dict\(\)"):
        tw.save(model, tmp_path / name)
    with pytest.raises(TypeError, match=r"cannot store a SGD at 'opt'.*Save its state_dict\(\)"):
        tw.save({"opt": optimizer}, tmp_path / name)
    tw.save(model.state_dict(), tmp_path / name)
    other = tw.nn.Linear(2, 2)
    other.load_state_dict(tw.load(tmp_path / name))
    assert tw.equal(other.weight, model.weight) and tw.equal(other.bias, model.bias)


# ---------------------------------------------------------------------------- optimizer state through torch's format

def test_an_optimizer_state_saved_here_resumes_in_torch_and_back(tmp_path):
    rng = np.random.default_rng(0)
    w0, x, y = (rng.standard_normal(s).astype(np.float32) for s in ((4, 3), (8, 3), (8, 4)))

    def loss_of(lib, weight):
        return ((lib.tensor(x) @ weight.t() - lib.tensor(y)) ** 2).mean()

    def run(lib, weight, opt, steps):
        for _ in range(steps):
            opt.zero_grad()
            loss_of(lib, weight).backward()
            opt.step()

    ours = tw.nn.Parameter(tw.tensor(w0))
    opt = tw.optim.AdamW([ours], lr=0.05, weight_decay=0.1)
    run(tw, ours, opt, 3)
    path = tmp_path / "train.pt"
    tw.save({"weight": ours.detach(), "optimizer": opt.state_dict(), "epoch": 3}, path)

    saved = torch.load(path, weights_only=True)
    theirs = torch.nn.Parameter(saved["weight"].clone())
    torch_opt = torch.optim.AdamW([theirs], lr=0.05, weight_decay=0.1)
    torch_opt.load_state_dict(saved["optimizer"])
    run(torch, theirs, torch_opt, 3)
    run(tw, ours, opt, 3)
    np.testing.assert_allclose(ours.detach().numpy(), theirs.detach().numpy(), rtol=1e-5, atol=1e-6)

    torch.save({"weight": theirs.detach(), "optimizer": torch_opt.state_dict()}, path)
    back = tw.load(path)
    resumed = tw.nn.Parameter(back["weight"])
    again = tw.optim.AdamW([resumed], lr=0.05, weight_decay=0.1)
    again.load_state_dict(back["optimizer"])
    run(tw, resumed, again, 2)
    run(torch, theirs, torch_opt, 2)
    np.testing.assert_allclose(resumed.detach().numpy(), theirs.detach().numpy(), rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------- numpy values

def _numpy_values() -> dict:
    grid = np.arange(6, dtype=np.float32).reshape(2, 3)
    return {"grid": grid, "again": grid, "fortran": np.asfortranarray(np.arange(6.0).reshape(2, 3)),
            "ints": np.arange(4), "big_endian": np.arange(3, dtype=">i4"), "empty": np.zeros((0, 2), np.int16),
            "strings": np.array(["a", "bc"]), "objects": np.array([1, "x", None], dtype=object),
            "bools": np.array([True, False]), "zero_dim": np.array(2.5), "f32": np.float32(1.5), "i64": np.int64(3),
            "flag": np.bool_(True), "dtype": np.dtype("float16"), "record": np.zeros(2, [("a", "<i4"), ("b", "<f8")]),
            "in_list": [np.ones(2, np.uint8)]}


def _assert_same_numpy(ours: dict, theirs: dict) -> None:
    assert set(ours) == set(theirs)
    for key, value in theirs.items():
        got = ours[key]
        assert type(got) is type(value), key
        if isinstance(value, np.ndarray):
            assert got.dtype == value.dtype and got.shape == value.shape, key
            assert got.flags.f_contiguous == value.flags.f_contiguous and got.flags.c_contiguous == \
                value.flags.c_contiguous, key
            assert got.tolist() == value.tolist(), key
        elif isinstance(value, list):
            _assert_same_numpy(dict(enumerate(got)), dict(enumerate(value)))
        else:
            assert got == value and getattr(got, "dtype", None) == getattr(value, "dtype", None), key


@pytest.mark.parametrize("legacy", [False, True], ids=["zip", "legacy"])
def test_numpy_values_load_with_weights_only_false_as_torch_gives_them(legacy):
    """torch.save pickles numpy arrays, scalars and dtypes as numpy's own pickle; torch.load(weights_only=False)
    returns them, and so does tilewise.load, from either library's file (without running code from it)."""
    theirs = torch.load(torch_bytes(_numpy_values(), _use_new_zipfile_serialization=not legacy), weights_only=False)
    ours = tw.load(torch_bytes(_numpy_values(), _use_new_zipfile_serialization=not legacy), weights_only=False)
    _assert_same_numpy(ours, theirs)
    assert ours["again"] is ours["grid"]


def test_numpy_values_saved_here_load_as_torch_saved_them():
    saved = {"w": tw.ones(2), **_numpy_values()}
    ours = tw.load(tw_bytes(saved), weights_only=False)
    theirs = torch.load(tw_bytes(saved), weights_only=False)
    reference = torch.load(torch_bytes({"w": torch.ones(2), **_numpy_values()}), weights_only=False)
    for out in (ours, theirs):
        _assert_same_numpy({k: v for k, v in out.items() if k != "w"},
                           {k: v for k, v in reference.items() if k != "w"})
        assert out["again"] is out["grid"]
    assert ours["w"].tolist() == theirs["w"].tolist() == [1.0, 1.0]


@pytest.mark.parametrize("weights_only", [None, True])
@pytest.mark.parametrize("value", [np.arange(3), np.float32(1.5), np.dtype("float16")],
                         ids=["array", "scalar", "dtype"])
def test_numpy_values_are_refused_by_a_weights_only_load_as_torch_refuses_them(value, weights_only):
    with pytest.raises(pickle.UnpicklingError) as theirs:
        torch.load(torch_bytes({"v": value}), weights_only=weights_only)
    reason = str(theirs.value).split("WeightsUnpickler error: ")[1].split(" Please use")[0]
    assert reason.startswith("Unsupported global: GLOBAL numpy")
    for buf in (torch_bytes({"v": value}), tw_bytes({"v": value})):
        with pytest.raises(pickle.UnpicklingError) as ours:
            tw.load(buf, weights_only=weights_only)
        assert reason in str(ours.value) and "weights_only=False" in str(ours.value)


def test_numpy_object_arrays_hold_only_what_a_checkpoint_may_hold(tmp_path):
    marker = tmp_path / "ran"
    buf = torch_bytes({"a": np.array([_RunsCode(str(marker))], dtype=object)})
    with pytest.raises(pickle.UnpicklingError, match=r"GLOBAL (posix|os)\.system is not allowed"):
        tw.load(buf, weights_only=False)
    assert not marker.exists()
    with pytest.raises(TypeError, match="cannot store a _RunsCode at .a"):
        tw.save({"a": np.array([_RunsCode(str(marker))], dtype=object)}, io.BytesIO(), format="torch")

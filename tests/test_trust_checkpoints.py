"""tilewise.save / tilewise.load under stress: every key and tensor round-trips, shared storage comes back as
torch.load gives it, files interoperate with the safetensors library both ways, a save killed midway leaves
the previous checkpoint, and saving streams (its memory peak is measured on a ~200 MB state dict). Module state
dicts load as torch's load them (keys, versions, assign, extra state, hooks), copy.deepcopy copies tensors as
torch's does, and parameters, complex tensors and namedtuples are saved as torch would have them or refused."""

from __future__ import annotations

import collections
import copy
import io
import json
import os
import pickle
import signal
import stat
import subprocess
import sys
import textwrap
import time
import tracemalloc
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest
import torch
from childenv import python_path
from safetensors import safe_open
from safetensors.torch import load_file, save_file

import tilewise as tw
from tilewise import serialization

ROOT = Path(__file__).resolve().parent.parent
DTYPES = [tw.bool, tw.uint8, tw.int8, tw.int16, tw.int32, tw.int64, tw.float16, tw.bfloat16, tw.float32, tw.float64,
          tw.float8_e4m3fn, tw.float8_e5m2]


def round_trip(obj):
    buf = io.BytesIO()
    tw.save(obj, buf)
    buf.seek(0)
    return tw.load(buf)


def torch_round_trip(obj):
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf)


def to_torch(t: tw.Tensor) -> torch.Tensor:
    return torch.from_dlpack(t.detach())


def same(a: tw.Tensor, b: tw.Tensor) -> bool:
    return a.dtype is b.dtype and a.shape == b.shape and np.array_equal(_bytes_of(a), _bytes_of(b))


def _bytes_of(t: tw.Tensor) -> np.ndarray:
    return t.detach().contiguous().numpy().reshape(-1).view(np.uint8)


def shares(a, b) -> bool:
    return a.untyped_storage() is b.untyped_storage() if isinstance(a, tw.Tensor) else (
        a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr())


# ---------------------------------------------------------------------------- every key, every tensor

def test_reserved_and_unusual_names_round_trip():
    tensors = {"__metadata__": tw.arange(3.0), "a.b": tw.ones(2), "a": {"b": tw.zeros(2), "__metadata__": tw.ones(1)},
               "poids/ß/重み 🙂": tw.full((2,), 5.0), "": tw.tensor(1.5), "tensor": tw.ones(3), "__tensor__": 7}
    out = round_trip(tensors)
    assert set(out) == set(tensors) and set(out["a"]) == {"b", "__metadata__"} and out["__tensor__"] == 7
    for path in (("__metadata__",), ("a.b",), ("a", "b"), ("a", "__metadata__"), ("poids/ß/重み 🙂",), ("",)):
        got, want = out, tensors
        for key in path:
            got, want = got[key], want[key]
        assert same(got, want), path


def test_a_tensor_named_metadata_gives_a_file_the_safetensors_library_reads(tmp_path):
    """safetensors' own ``save_file({"__metadata__": t})`` writes a file nothing can read back."""
    path = tmp_path / "m.safetensors"
    tw.save({"__metadata__": tw.arange(4.0), "w": tw.ones(2)}, path)
    loaded = load_file(str(path))
    assert torch.equal(loaded["w"], torch.ones(2)) and torch.equal(loaded["__metadata___"], torch.arange(4.0))
    assert tw.load(path)["__metadata__"].tolist() == [0.0, 1.0, 2.0, 3.0]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(), (0,), (3, 0, 2), (5,), (2, 3, 4)], ids=str)
def test_every_dtype_and_shape_round_trips(dtype, shape):
    t = (tw.arange(max(1, int(np.prod(shape)))) % 5 - 2)[: int(np.prod(shape))].to(dtype).reshape(shape)
    out = round_trip({"t": t, "nested": [t, (t,)]})
    assert same(out["t"], t) and out["nested"][0] is out["t"] and out["nested"][1][0] is out["t"]
    assert out["t"].shape == shape, "0-dim stays 0-dim, empty keeps its shape"


@pytest.mark.parametrize("make", [lambda x: x.t(), lambda x: x[:, ::2], lambda x: x[1:, 1:], lambda x: x[0],
                                  lambda x: x[:1].expand(4, 6), lambda x: x.unsqueeze(0).permute(2, 0, 1)],
                         ids=["transpose", "step", "offset", "row", "expand", "permute"])
def test_a_lone_non_contiguous_view_round_trips_by_value(make):
    """Without its base, a view is stored as its own values (safetensors' rule: stored tensors are dense); a
    view that is dense in another order (a transpose, a permute) keeps that order, as torch.load gives it."""
    base = tw.arange(24.0).reshape(4, 6)
    view = make(base)
    out = round_trip({"v": view})["v"]
    assert same(out, view.contiguous())
    reference = torch_round_trip({"v": make(torch.arange(24.0).reshape(4, 6))})["v"]
    if _dense(reference):
        assert out.stride() == reference.stride() == view.stride()
    else:
        assert out.is_contiguous()


def _dense(t) -> bool:
    """Whether ``t``'s elements fill its span exactly once, in some order of its dims."""
    expected = 1
    for size, stride in sorted(zip(t.shape, t.stride()), key=lambda p: p[1]):
        if size != 1 and stride != expected:
            return False
        expected *= size
    return True


def _sharing(lib) -> dict:
    w = lib.arange(12.0).reshape(3, 4)
    return {"w": w, "again": w, "tied": w.detach(), "t": w.t(), "t2": w.t(), "row": w[1], "cols": w[:, 1:3]}


def test_shared_storage_comes_back_shared_as_torch_load_gives_it():
    obj = _sharing(tw)
    out = round_trip(obj)
    reference = torch_round_trip(_sharing(torch))
    for key, value in obj.items():
        assert same(out[key], value) and out[key].stride() == value.stride() == reference[key].stride(), key
        assert out[key].storage_offset() == reference[key].storage_offset(), key
    for a in obj:
        for b in obj:
            assert shares(out[a], out[b]) == shares(reference[a], reference[b]), (a, b)
            assert (out[a] is out[b]) == (reference[a] is reference[b]), (a, b)
    out["w"][0, 0] = 100.0
    assert out["tied"][0, 0].item() == out["t"][0, 0].item() == 100.0


def test_tied_weights_of_a_model_are_written_once(tmp_path):
    """``state_dict`` detaches each name on its own; the bytes of tied weights are written once."""
    embedding = tw.nn.Embedding(1000, 64)
    head = tw.nn.Linear(64, 1000, bias=False)
    head.weight = embedding.weight
    model = tw.nn.ModuleDict({"wte": embedding, "head": head})
    path = tmp_path / "tied.safetensors"
    tw.save(model.state_dict(), path)
    assert path.stat().st_size < 1000 * 64 * 4 * 1.1
    out = tw.load(path)
    assert shares(out["wte.weight"], out["head.weight"]) and same(out["head.weight"], head.weight)
    other = tw.nn.ModuleDict({"wte": tw.nn.Embedding(1000, 64), "head": tw.nn.Linear(64, 1000, bias=False)})
    other.load_state_dict(out)
    assert same(other["head"].weight, head.weight)
    with safe_open(str(path), framework="np") as f:
        assert set(f.keys()) == {"head.weight"} or set(f.keys()) == {"wte.weight"}


def test_one_view_saved_as_two_objects_without_its_base_comes_back_shared():
    w = tw.arange(12.0).reshape(3, 4)
    out = round_trip({"a": w.t(), "b": w.t()})
    assert same(out["a"], w.t().contiguous()) and same(out["b"], w.t().contiguous())
    assert shares(out["a"], out["b"]) and out["a"] is not out["b"]


def test_views_that_no_stored_tensor_covers_are_stored_by_value():
    x = tw.arange(10.0)
    out = round_trip({"a": x[0:6], "b": x[4:10]})
    assert same(out["a"], x[0:6]) and same(out["b"], x[4:10]) and not shares(out["a"], out["b"])


def test_requires_grad_survives_sharing():
    p = tw.ones(2, 3, requires_grad=True)
    out = round_trip({"p": p, "t": p.detach().t(), "q": p})
    assert out["p"].requires_grad and not out["t"].requires_grad and out["q"] is out["p"]
    assert out["p"].is_leaf and shares(out["p"], out["t"])


# ---------------------------------------------------------------------------- the safetensors library, both ways

def test_every_dtype_written_by_tilewise_reads_in_safetensors_and_back(tmp_path):
    tensors = {f"{d.name}.v": (tw.arange(7) % 4).to(d) for d in DTYPES}
    tensors["empty"], tensors["scalar"] = tw.zeros(0, 3), tw.tensor(2.5, dtype=tw.float64)
    tensors["strided"] = tw.arange(20.0).reshape(4, 5).t()
    path = tmp_path / "all.safetensors"
    tw.save(tensors, path)
    loaded = load_file(str(path))
    assert set(loaded) == set(tensors)
    for name, t in tensors.items():
        theirs = loaded[name].contiguous().reshape(-1).view(torch.uint8).numpy()
        assert loaded[name].shape == t.shape and np.array_equal(theirs, _bytes_of(t)), name
    again = tmp_path / "again.safetensors"
    save_file(loaded, str(again))
    back = tw.load(again)
    assert set(back) == set(tensors) and all(same(back[n], tensors[n].contiguous()) for n in tensors)


def test_load_rejects_damaged_files_with_a_clear_error(tmp_path):
    path = tmp_path / "ok.safetensors"
    tw.save({"w": tw.ones(100), "v": tw.zeros(3)}, path)
    data = path.read_bytes()
    (length,) = np.frombuffer(data[:8], "<u8")
    for damaged in (data[:4], data[: 8 + int(length) // 2], data[:-1], data + b"\0", b"\xff" * 8 + data[8:]):
        (tmp_path / "bad").write_bytes(damaged)
        with pytest.raises(RuntimeError, match="is not a valid checkpoint"):
            tw.load(tmp_path / "bad")


# ---------------------------------------------------------------------------- atomic replacement

def _checkpoint(value: float, numel: int = 1000) -> dict:
    return {"w": tw.full((numel,), value), "step": int(value)}


def test_the_saved_file_is_synced_and_created_as_open_would(tmp_path, monkeypatch):
    synced = []
    real_fsync = os.fsync

    def fsync(fd):
        synced.append(stat.S_ISDIR(os.fstat(fd).st_mode))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    path = tmp_path / "ckpt.safetensors"
    tw.save(_checkpoint(1.0), path)
    assert synced == [False, True], "the file, then its directory"
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt.safetensors"]


def test_a_save_that_fails_midway_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    path = tmp_path / "ckpt.safetensors"
    tw.save(_checkpoint(1.0), path)

    def broken(file, t):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(serialization, "_write_tensor", broken)
    with pytest.raises(OSError, match="No space left"):
        tw.save(_checkpoint(2.0), path)
    assert tw.load(path)["step"] == 1 and [p.name for p in tmp_path.iterdir()] == ["ckpt.safetensors"]


def test_saving_through_a_symlink_replaces_the_file_it_points_to(tmp_path):
    target = tmp_path / "runs" / "ckpt.safetensors"
    target.parent.mkdir()
    tw.save(_checkpoint(1.0), target)
    link = tmp_path / "latest.safetensors"
    link.symlink_to(target)
    tw.save(_checkpoint(2.0), link)
    assert link.is_symlink() and tw.load(target)["step"] == 2


KILLED_SAVE = textwrap.dedent("""
    import os, sys, time
    import tilewise as tw
    from tilewise import serialization

    def pause_after_the_first_tensor(file, t):
        write(file, t)
        file.flush()
        print("paused", flush=True)
        time.sleep(600)

    if os.environ.get("PAUSE"):
        write = serialization._write_tensor
        serialization._write_tensor = pause_after_the_first_tensor
    print("saving", flush=True)
    tw.save({"big": tw.full((int(os.environ["NUMEL"]),), 2.0), "small": tw.ones(10), "step": 2}, sys.argv[1])
    print("saved", flush=True)
""")


def _start_killed_save(path: Path, numel: int, pause: bool) -> subprocess.Popen:
    environment = {**os.environ, "PYTHONPATH": python_path(), "NUMEL": str(numel), "PAUSE": "1" if pause else ""}
    return subprocess.Popen([sys.executable, "-c", KILLED_SAVE, str(path)], stdout=subprocess.PIPE, text=True,
                            env=environment, cwd=ROOT)


def _check_only_the_old_checkpoint(path: Path) -> None:
    old = tw.load(path)
    assert old["step"] == 1 and old["w"].tolist() == [1.0] * 1000, "the previous checkpoint is intact"
    strays = [p for p in path.parent.iterdir() if p != path]
    assert all(p.name.startswith(f".{path.name}.") and p.name.endswith(".tmp") for p in strays), strays
    assert len(strays) <= 1


def test_a_save_killed_midway_leaves_the_previous_checkpoint(tmp_path):
    """Deterministic: the child stops after writing its first tensor into the temporary, and is killed there."""
    path = tmp_path / "ckpt.safetensors"
    tw.save(_checkpoint(1.0), path)
    child = _start_killed_save(path, 1 << 20, pause=True)
    try:
        assert child.stdout.readline().strip() == "saving"
        assert child.stdout.readline().strip() == "paused"
        (temporary,) = [p for p in tmp_path.iterdir() if p != path]
        assert temporary.stat().st_size > 4 << 20, "the first tensor is in the temporary"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    _check_only_the_old_checkpoint(path)


def test_a_save_killed_while_writing_a_large_tensor(tmp_path):
    """The kill lands wherever the child is once it starts writing (a file appears beside the checkpoint, or the
    checkpoint itself changes); whatever that moment, the final name holds the previous checkpoint."""
    path = tmp_path / "ckpt.safetensors"
    tw.save(_checkpoint(1.0), path)

    def identity():
        found = path.stat()
        return found.st_ino, found.st_size, found.st_mtime_ns

    before = identity()

    def untouched() -> bool:
        return identity() == before and not [p for p in tmp_path.iterdir() if p != path]

    child = _start_killed_save(path, 48 << 20, pause=False)  # 192 MB: writing takes a while
    try:
        assert child.stdout.readline().strip() == "saving"
        deadline = time.monotonic() + 60
        while untouched() and time.monotonic() < deadline:
            time.sleep(0.0005)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    assert child.returncode == -signal.SIGKILL
    _check_only_the_old_checkpoint(path)


# ---------------------------------------------------------------------------- memory

STATE_OF_ABOUT_200_MB = textwrap.dedent("""
    big = tw.full((25 << 20,), 1.5)  # 100 MB, the largest
    matrix = tw.arange(2048 * 6144, dtype=tw.float32).reshape(2048, 6144)  # 48 MB
    state = {"big": big, "t": matrix.t(), "half": tw.full((12 << 20,), 2.5, dtype=tw.bfloat16)}
    state.update({f"layer{k}.weight": tw.full((256, 256), float(k)) for k in range(100)})
    largest = big.numel() * 4
""")  # "t", a transpose, is written in pieces


def _state_dict_of_about_200_mb() -> tuple[dict, int]:
    scope = {"tw": tw}
    exec(STATE_OF_ABOUT_200_MB, scope)
    return scope["state"], scope["largest"]


def test_saving_streams_the_tensors(tmp_path):
    """Peak memory allocated while saving, beyond the state dict itself, stays under 1.2x its largest tensor
    (measured by tracemalloc, which sees numpy's buffers; the figure is printed)."""
    state, largest = _state_dict_of_about_200_mb()
    total = sum(t.numel() * t.dtype.itemsize for t in state.values())
    path = tmp_path / "big.safetensors"
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        tw.save(state, path)
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    print(f"\nsaving {total / 2**20:.0f} MB (largest tensor {largest / 2**20:.0f} MB): peak extra "
          f"{peak / 2**20:.1f} MB = {peak / largest:.2f}x the largest tensor")
    assert peak < 1.2 * largest
    out = tw.load(path)
    assert same(out["t"], state["t"].contiguous()) and same(out["big"], state["big"])


def test_saving_streams_the_tensors_by_resident_memory(tmp_path):
    """The same figure seen by the kernel: the resident set's high-water mark during the save, in a fresh process."""
    script = "import json, sys\nimport tilewise as tw\n" + STATE_OF_ABOUT_200_MB + textwrap.dedent("""
        def status(field):
            with open("/proc/self/status") as f:
                return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field))

        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets the high-water mark to the current resident set
        before = status("VmRSS:")
        tw.save(state, sys.argv[1])
        print(json.dumps({"peak": status("VmHWM:") - before, "largest": largest}))
    """)
    if not Path("/proc/self/clear_refs").exists():
        pytest.skip("needs Linux's /proc/self/clear_refs")
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path / "big.safetensors")],
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": python_path()}, cwd=ROOT,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"\nresident set grew by {figures['peak'] / 2**20:.1f} MB while saving "
          f"({figures['peak'] / figures['largest']:.2f}x the largest tensor)")
    assert figures["peak"] < 1.2 * figures["largest"]


# ---------------------------------------------------------------------------- the demo's other file

def test_the_demo_plot_is_replaced_atomically(tmp_path, monkeypatch):
    from matplotlib.figure import Figure

    from tilewise.models.demo import DemoResult, plot_losses

    result = DemoResult(device="cpu", steps=3, train_losses=[3.0, 2.5, 2.0], val_points=[(3, 2.2)],
                        unigram_baseline=3.1)
    path = tmp_path / "loss_curve.png"
    plot_losses(result, path)
    png = path.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"

    def interrupted(self, file, **kwargs):
        file.write(png[:100])
        raise KeyboardInterrupt

    monkeypatch.setattr(Figure, "savefig", interrupted)
    with pytest.raises(KeyboardInterrupt):
        plot_losses(result, path)
    assert path.read_bytes() == png and [p.name for p in tmp_path.iterdir()] == ["loss_curve.png"]


def test_saving_into_a_missing_folder_names_the_file_not_a_temporary(tmp_path):
    # torch.save into a folder that does not exist raises FileNotFoundError; ours names the file asked for
    # and the missing folder, not the hidden temporary written first
    target = tmp_path / "no_such_folder" / "model.pt"
    with pytest.raises(FileNotFoundError) as caught:
        tw.save({"w": tw.ones(2)}, target)
    assert caught.value.filename == str(target)
    assert "no_such_folder" in str(caught.value) and ".tmp" not in str(caught.value)
    assert not target.parent.exists()


# ---------------------------------------------------------------------------- Module.load_state_dict, as torch's

def _both(fn):
    """``fn(lib)`` for tilewise and torch: its result, or the type and text of the error it raised, with the
    library's name taken out so the two compare."""
    out = []
    for lib in (tw, torch):
        try:
            result = repr(fn(lib))
        except Exception as exc:  # noqa: BLE001 — the error is the result compared
            result = f"{type(exc).__name__}: {exc}"
        out.append(result.replace(f"{lib.__name__}.", "LIB."))
    return out


def _net(lib):
    return lib.nn.Sequential(lib.nn.Linear(2, 3), lib.nn.BatchNorm1d(3))


@pytest.mark.parametrize("extra", [{"0.weight.x": 1.0}, {"0": 1.0}, {"1.running_mean.y": 1.0, "x": 1.0}],
                         ids=["inside-a-parameter", "naming-a-submodule", "two"])
@pytest.mark.parametrize("strict", [True, False])
def test_keys_that_name_no_tensor_are_unexpected(extra, strict):
    """A key under a parameter's name (``0.weight.x``), or one naming a submodule itself (``0``), is
    unexpected, as in torch; they loaded silently."""
    def load(lib):
        model = _net(lib)
        state = {**_net(lib).state_dict(), **{k: lib.tensor(v) for k, v in extra.items()}}
        return model.load_state_dict(state, strict=strict)

    ours, theirs = _both(load)
    assert ours == theirs and ("Unexpected" in ours or "unexpected_keys=['" in ours)


@pytest.mark.parametrize("case", ["plain-dict", "version-1", "version-2"])
def test_batch_norm_checkpoints_without_num_batches_tracked_load_as_torch_loads_them(case):
    """Before version 2 (and in a plain dict, which has no versions) BatchNorm's state had no
    ``num_batches_tracked``: the module keeps its own; a version-2 state dict without it is missing a key."""
    def load(lib):
        source = lib.nn.BatchNorm1d(3)
        state = source.state_dict()
        del state["num_batches_tracked"]
        if case == "plain-dict":
            state = dict(state)
        elif case == "version-1":
            state._metadata[""]["version"] = 1
        target = lib.nn.BatchNorm1d(3)
        target.num_batches_tracked.fill_(9)
        return target.load_state_dict(state), target.num_batches_tracked.item()

    ours, theirs = _both(load)
    assert ours == theirs


def test_instance_norm_refuses_running_stats_it_does_not_track_from_a_plain_dict():
    ours, theirs = _both(lambda lib: lib.nn.InstanceNorm1d(2).load_state_dict({"running_mean": lib.zeros(2)}))
    assert ours == theirs and "Unexpected running stats buffer(s)" in ours


def test_state_dict_metadata_records_module_versions_and_survives_saving():
    expected = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.BatchNorm1d(3)).state_dict()._metadata
    state = _net(tw).state_dict()
    assert state._metadata == expected
    for format in ("safetensors", "torch"):
        buf = io.BytesIO()
        tw.save(state, buf, format=format)
        buf.seek(0)
        out = tw.load(buf)
        assert type(out) is OrderedDict and out._metadata == expected and list(out) == list(state), format
    buf = io.BytesIO()
    tw.save(state, buf, format="torch")
    buf.seek(0)
    assert torch.load(buf)._metadata == expected


def test_a_one_element_vector_loads_into_a_0_dim_tensor_and_a_longer_one_does_not():
    """torch before 0.4 saved scalars as shape (1,); torch.load_state_dict still takes them."""
    for value in ([5.0], [5.0, 6.0], [[5.0]]):
        def load(lib, value=value):
            module = lib.nn.Module()
            module.register_buffer("s", lib.tensor(0.0))
            module.load_state_dict({"s": lib.tensor(value)})
            return module.s

        ours, theirs = _both(load)
        assert ours == theirs, value


def test_assign_keeps_the_checkpoint_tensor_its_dtype_and_parameter():
    def load(lib):
        model = lib.nn.Linear(2, 1)
        model.bias.requires_grad_(False)
        weight = lib.nn.Parameter(lib.ones(1, 2, dtype=lib.float64), requires_grad=False)
        bias = lib.ones(1, dtype=lib.float16)
        model.load_state_dict({"weight": weight, "bias": bias}, assign=True)
        return (model.weight is weight, model.weight.dtype, model.weight.requires_grad, model.bias.dtype,
                model.bias.requires_grad, isinstance(model.bias, lib.nn.Parameter), model.bias is bias)

    ours, theirs = _both(load)
    assert ours == theirs


def test_extra_state_is_saved_and_restored():
    def make(lib):
        class Counter(lib.nn.Module):
            def __init__(self):
                super().__init__()
                self.count, self.lin = 0, lib.nn.Linear(1, 1)

            def get_extra_state(self):
                return {"count": self.count}

            def set_extra_state(self, state):
                self.count = state["count"]

        return Counter

    def load(lib):
        counter = make(lib)
        source = counter()
        source.count = 7
        state = source.state_dict()
        target = counter()
        result = target.load_state_dict(state)
        lacking = {k: v for k, v in state.items() if k != "_extra_state"}
        return list(state), target.count, result, counter().load_state_dict(lacking, strict=False)

    ours, theirs = _both(load)
    assert ours == theirs
    ours, theirs = _both(lambda lib: make(lib)().load_state_dict({"lin.weight": lib.ones(1, 1),
                                                                  "lin.bias": lib.ones(1)}))
    assert ours == theirs and 'Missing key(s) in state_dict: "_extra_state"' in ours


def test_post_hooks_run_after_the_submodules_and_may_edit_the_keys():
    def load(lib):
        model, seen = _net(lib), []
        for name, module in model.named_modules():
            module.register_load_state_dict_post_hook(
                lambda module, keys, name=name: seen.append((name, list(keys.missing_keys))))
        model[0].register_load_state_dict_post_hook(lambda module, keys: keys.missing_keys.clear())
        try:
            model.load_state_dict({})
        except RuntimeError as exc:
            seen.append(str(exc).replace(f"{lib.__name__}.", "LIB."))
        return seen

    ours, theirs = _both(load)
    assert ours == theirs
    ours, theirs = _both(lambda lib: (lambda m: (m.register_load_state_dict_post_hook(lambda *a: 1),
                                                 m.load_state_dict(m.state_dict())))(lib.nn.Linear(1, 1)))
    assert ours == theirs and ours.startswith("AssertionError")


@pytest.mark.parametrize("value", [[1.0], "x", None])
def test_a_value_that_is_not_a_tensor_is_named_as_torch_names_it(value):
    ours, theirs = _both(lambda lib: lib.nn.Linear(1, 1).load_state_dict({"weight": value, "bias": lib.ones(1)}))
    assert ours == theirs
    ours, theirs = _both(lambda lib: lib.nn.Linear(1, 1).load_state_dict([("weight", 1)]))
    assert ours == theirs


# ---------------------------------------------------------------------------- copy.deepcopy, as torch's

def test_deepcopy_keeps_views_of_one_storage_views_of_one_copy():
    def copied(lib):
        base = lib.arange(12.0).reshape(3, 4)
        out = copy.deepcopy({"base": base, "t": base.t(), "step": base[:, ::2], "row": base[1]})
        out["base"][1, 2] = 100.0
        return {k: (v.tolist(), v.stride(), v.storage_offset()) for k, v in out.items()}

    ours, theirs = _both(copied)
    assert ours == theirs


def test_deepcopy_of_a_parameter_drops_its_grad_and_of_a_tensor_keeps_it():
    def copied(lib):
        param = lib.nn.Parameter(lib.ones(2))
        param.grad = lib.full((2,), 3.0)
        plain = lib.ones(2, requires_grad=True)
        plain.grad = lib.full((2,), 4.0)
        model = lib.nn.Linear(2, 1)
        model(lib.ones(1, 2)).sum().backward()
        twin_param, twin_plain, twin_model = copy.deepcopy((param, plain, model))
        return (twin_param.grad, isinstance(twin_param, lib.nn.Parameter), twin_param.requires_grad, twin_plain.grad,
                twin_model.weight.grad, twin_model.bias.grad)

    ours, theirs = _both(copied)
    assert ours == theirs


def test_deepcopy_of_a_non_leaf_is_refused_as_in_torch():
    ours, theirs = _both(lambda lib: copy.deepcopy(lib.ones(2, requires_grad=True) * 2))
    assert ours == theirs and ours.startswith("RuntimeError: Only Tensors created explicitly by the user")


# ---------------------------------------------------------------------------- parameters and complex tensors saved

@pytest.mark.parametrize("format", ["safetensors", "torch"])
def test_a_parameter_comes_back_a_parameter_and_its_view_a_tensor(format):
    """torch.load gives a saved Parameter back as one; a safetensors checkpoint gave a plain tensor."""
    def saved(lib):
        param = lib.nn.Parameter(lib.arange(4.0))
        frozen = lib.nn.Parameter(lib.ones(2), requires_grad=False)
        obj = {"p": param, "view": param[1:], "frozen": frozen}
        if lib is torch:
            return torch_round_trip(obj)
        buf = io.BytesIO()
        tw.save(obj, buf, format=format)
        buf.seek(0)
        return tw.load(buf)

    ours, theirs = saved(tw), saved(torch)
    for key in ours:
        assert isinstance(ours[key], tw.nn.Parameter) == isinstance(theirs[key], torch.nn.Parameter), key
        assert ours[key].requires_grad == theirs[key].requires_grad and ours[key].tolist() == theirs[key].tolist(), key
    assert shares(ours["p"], ours["view"])


def test_complex64_round_trips_and_reads_in_the_safetensors_library(tmp_path):
    path = tmp_path / "c.safetensors"
    value = tw.tensor([[1 + 2j, -3.5 - 0.25j]], dtype=tw.complex64)
    tw.save({"c": value, "t": value.t()}, path)
    out = tw.load(path)
    assert same(out["c"], value) and out["t"].tolist() == value.t().tolist()
    assert torch.equal(load_file(str(path))["c"], torch.tensor([[1 + 2j, -3.5 - 0.25j]], dtype=torch.complex64))


def test_a_dtype_safetensors_cannot_hold_is_named_with_the_format_that_can():
    with pytest.raises(TypeError, match=r"complex128 tensor at 'w' has no safetensors dtype.*format='torch'"):
        round_trip({"w": tw.ones(2, dtype=tw.complex128)})
    buf = io.BytesIO()
    tw.save({"w": tw.tensor([1 + 1j], dtype=tw.complex128)}, buf, format="torch")
    buf.seek(0)
    assert torch.load(buf)["w"].tolist() == [1 + 1j]


Point = collections.namedtuple("Point", "x y")


@pytest.mark.parametrize("format", ["safetensors", "torch"])
def test_a_namedtuple_is_refused_by_name_rather_than_loaded_as_a_plain_tuple(format):
    """torch.save keeps a namedtuple's class, which torch.load(weights_only=True) refuses; tilewise.load never
    imports a class, and saving one gave back a plain tuple without a word."""
    with pytest.raises(TypeError, match=r"cannot store a Point \(a namedtuple\) at 'p.0'.*_asdict\(\)"):
        tw.save({"p": [Point(tw.ones(1), 2)]}, io.BytesIO(), format=format)
    with pytest.raises(pickle.UnpicklingError):
        torch.load(io.BytesIO(torch_bytes({"p": Point(1, 2)})))
    buf = io.BytesIO()
    tw.save({"size": tw.ones(2, 3).shape, "plain": (1, 2)}, buf, format=format)
    buf.seek(0)
    assert tw.load(buf) == {"size": (2, 3), "plain": (1, 2)}


def torch_bytes(obj) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()

"""``_lstm_layer``: an LSTM layer's time loop as one operator (ops/nn_recurrent.py), and its CUDA kernels
(backends/cuda/recurrent.py): the cell kernels' arithmetic run on the host through the C target, their CUDA
source through NVRTC, and on a GPU the layer against torch."""

from __future__ import annotations

import ctypes
import shutil
import subprocess

import numpy as np
import pytest
import torch

import tilewise as tw
from tilewise import dtypes
from tilewise.backends.cuda import recurrent
from tilewise.codegen.render import C
from tilewise.codegen.render.kernel_c import render_program as render_c_program
from tilewise.codegen.render.kernel_cuda import render_source
from tilewise.codegen.schedule import schedule_c
from tilewise.ops.registry import OPS

BATCH, HIDDEN = 3, 5


def _build_c(kernel_ir, tmp_path):
    path = tmp_path / f"{kernel_ir.name}.c"
    path.write_text(render_c_program([schedule_c(kernel_ir)], C))
    lib = tmp_path / f"{kernel_ir.name}.so"
    subprocess.run(["cc", "-O1", "-shared", "-fPIC", "-ffp-contract=off", "-o", str(lib), str(path), "-lm"],
                   check=True, capture_output=True)
    return getattr(ctypes.CDLL(str(lib)), kernel_ir.name)


def _pointers(*arrays):
    return [a.ctypes.data_as(ctypes.c_void_p) for a in arrays]


def _random(rng, *shape):
    return rng.uniform(-2, 2, size=shape).astype(np.float32)


@pytest.mark.skipif(shutil.which("cc") is None, reason="no host C compiler")
def test_forward_cell_kernel_computes_lstm_cell(tmp_path):
    rng = np.random.default_rng(0)
    ig, hg, c = _random(rng, BATCH, 4 * HIDDEN), _random(rng, BATCH, 4 * HIDDEN), _random(rng, BATCH, HIDDEN)
    h_out, c_out = np.empty((BATCH, HIDDEN), np.float32), np.empty((BATCH, HIDDEN), np.float32)
    _build_c(recurrent.forward_cell_kernel(dtypes.float32, BATCH, HIDDEN), tmp_path)(
        *_pointers(ig, hg, c, h_out, c_out))
    want_h, want_c = OPS["_lstm_cell"].decomposition(*(tw.from_numpy(a) for a in (ig, hg, c)))
    np.testing.assert_allclose(h_out, want_h.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(c_out, want_c.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.skipif(shutil.which("cc") is None, reason="no host C compiler")
@pytest.mark.parametrize("grad_output", [True, False], ids=["with-output-gradient", "state-gradient-only"])
def test_backward_cell_kernel_computes_lstm_cell_backward(grad_output, tmp_path):
    """The gate gradients into a [B, 4H] slice and the cell state's gradient in place, from dh (plus the output's
    gradient at this step) and dc: ``_lstm_cell_backward``'s values."""
    rng = np.random.default_rng(1)
    ig, hg, c = _random(rng, BATCH, 4 * HIDDEN), _random(rng, BATCH, 4 * HIDDEN), _random(rng, BATCH, HIDDEN)
    go, dh, dc = (_random(rng, BATCH, HIDDEN) for _ in range(3))
    dc_before = dc.copy()
    grad_gates = np.empty((BATCH, 4 * HIDDEN), np.float32)
    fn = _build_c(recurrent.backward_cell_kernel(dtypes.float32, BATCH, HIDDEN, grad_output), tmp_path)
    fn(*_pointers(ig, hg, c, *((go,) if grad_output else ()), dh, dc, grad_gates))
    dh_total = go + dh if grad_output else dh
    packed = OPS["_lstm_cell_backward"].decomposition(
        *(tw.from_numpy(a) for a in (dh_total, dc_before, ig, hg, c))).numpy()
    np.testing.assert_allclose(grad_gates, packed[:, :4].reshape(BATCH, 4 * HIDDEN), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(dc, packed[:, 4], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [dtypes.float32, dtypes.bfloat16, dtypes.float16, dtypes.float64])
@pytest.mark.parametrize("shape", [(64, 1024), (3, 5), (2, 1)], ids=["target", "odd", "one-unit"])
def test_cell_kernels_compile_with_nvrtc(dtype, shape):
    from tilewise.codegen.toolchain import compile_cuda, nvrtc_available

    if not nvrtc_available():
        pytest.skip("NVRTC is not installed")
    kernels = [recurrent.forward_cell_kernel(dtype, *shape),
               *(recurrent.backward_cell_kernel(dtype, *shape, g) for g in (True, False))]
    sources = {}
    for kernel_ir in kernels:
        for vector in (True, False):
            sched = recurrent.cell_schedule(kernel_ir, vector)
            sources[sched.kernel.name] = render_source(sched)
    names = sorted(sources)
    compiled = compile_cuda("\n".join(sources.values()), names, "sm_90")
    assert all(f".entry {n}(" in compiled.ptx for n in names), names


def test_target_cell_kernels_fill_the_gpu_with_wide_accesses():
    """The benchmark's [64, 1024] bfloat16 step: vector accesses, and at least a block per SM of an H200."""
    for kernel_ir in (recurrent.forward_cell_kernel(dtypes.bfloat16, 64, 1024),
                      recurrent.backward_cell_kernel(dtypes.bfloat16, 64, 1024, True)):
        sched = recurrent.cell_schedule(kernel_ir, True)
        assert sched.nests[0].cuda.vector > 1 and sched.grid >= recurrent.MIN_BLOCKS, sched.describe()
        assert recurrent.cell_schedule(kernel_ir, False).nests[0].cuda.vector == 1


def test_lstm_uses_the_layer_operator_only_for_full_length_sequences_without_projection(monkeypatch):
    calls = []
    layer = OPS["_lstm_layer"]
    original = layer.decomposition

    def counted(*args):
        calls.append(tuple(args[0].shape))
        return original(*args)

    monkeypatch.setattr(layer, "decomposition", counted)
    x = tw.randn(4, 2, 3)
    tw.nn.LSTM(3, 5, 2, bidirectional=True)(x)
    assert calls == [(4, 2, 20)] * 4
    calls.clear()
    tw.nn.LSTM(3, 5, proj_size=2)(x)
    packed = tw.nn.utils.rnn.pack_padded_sequence(x, [4, 2], enforce_sorted=False)
    tw.nn.LSTM(3, 5)(packed)
    tw.nn.GRU(3, 5)(x)
    assert calls == []


def test_layer_errors_name_the_operator_and_shapes():
    ig, h, c, w = tw.randn(2, 3, 8), tw.randn(3, 2), tw.randn(3, 2), tw.randn(8, 2)
    with pytest.raises(RuntimeError, match=r"_lstm_layer: .*\[3, 3\]"):
        OPS["_lstm_layer"](ig, h, tw.randn(3, 3), w)
    with pytest.raises(RuntimeError, match="_lstm_layer: .*one dtype"):
        OPS["_lstm_layer"](ig, h, c, w.double())
    with pytest.raises(RuntimeError, match="_lstm_layer: expected at least one time step"):
        OPS["_lstm_layer"](tw.randn(0, 3, 8), h, c, w)
    with pytest.raises(RuntimeError, match=r"_lstm_layer: expected input_gates \[T, B, 4H\]"):
        OPS["_lstm_layer"](tw.randn(3, 8), h, c, w)


def test_lstm_under_bfloat16_autocast_runs_the_layer_in_bfloat16_close_to_torch():
    """torch's CPU LSTM has no bfloat16 autocast (oneDNN refuses it), so the reference is torch in float32: the
    outputs are bfloat16 as under CUDA autocast, the parameters' gradients float32, all within bfloat16's error."""
    (want, want_gx, want_gp), (got, got_gx, got_gp) = _run_both(lambda nn: nn.LSTM(8, 16, 2), (6, 3, 8),
                                                                autocast=True, device="cpu")
    assert all(o.dtype == tw.bfloat16 for o in got)
    assert got_gx.dtype == tw.float32 and all(g.dtype == tw.float32 for g in got_gp.values())
    for a, b in zip(got, want):
        np.testing.assert_allclose(_np(a), _np(b), rtol=5e-2, atol=3e-2)
    np.testing.assert_allclose(_np(got_gx), _np(want_gx), rtol=5e-2, atol=5e-2)
    for name in want_gp:
        scale = np.abs(_np(want_gp[name])).max()
        np.testing.assert_allclose(_np(got_gp[name]), _np(want_gp[name]), atol=5e-2 * scale, err_msg=name)


# ---------------------------------------------------------------------------------------------- the loops, on the host

@pytest.fixture
def loops_on_the_host(monkeypatch, tmp_path):
    """backends/cuda/recurrent.py's loops run on host memory: each launch calls the cell kernel's kernel IR
    rendered by the C target, each GEMM is numpy's on the raw addresses, so the loops' pointer arithmetic and
    order of steps are checked without a GPU."""
    built = {}

    def cell(kind, dtype, batch, hidden, aligned, device):
        if kind == "forward":
            kernel_ir = recurrent.forward_cell_kernel(dtype, batch, hidden)
        else:
            kernel_ir = recurrent.backward_cell_kernel(dtype, batch, hidden, kind == "backward_go")
        if kernel_ir.name not in built:
            built[kernel_ir.name] = _build_c(kernel_ir, tmp_path)
        return recurrent._Cell(built[kernel_ir.name], 1, 1)

    def step_launches(cell, argvs, stream, device):
        return lambda t: cell.fn(*[ctypes.c_void_p(a) for a in argvs[t]])

    def at(ptr, like):
        span = 1 + sum((n - 1) * s for n, s in zip(like.shape, like.stride()))
        flat = np.ctypeslib.as_array((ctypes.c_float * span).from_address(ptr))
        return np.lib.stride_tricks.as_strided(flat, tuple(like.shape), tuple(s * 4 for s in like.stride()))

    def pointer_gemm(a, b, out, alignment):
        out.fill_(float("nan"))  # as choosing the algorithm does: it runs the product into ``out``

        def run(a_ptr, b_ptr, out_ptr, stream):
            at(out_ptr, out)[...] = at(a_ptr, a) @ at(b_ptr, b)

        return run

    def data_ptr(t):
        return t._storage.data.ctypes.data + t._offset * t._dtype.itemsize

    monkeypatch.setattr(recurrent, "_cell", cell)
    monkeypatch.setattr(recurrent, "StepLaunches", step_launches)
    monkeypatch.setattr(recurrent, "pointer_gemm", pointer_gemm)
    monkeypatch.setattr(recurrent, "data_ptr", data_ptr)
    monkeypatch.setattr(recurrent, "stream_handle", lambda device: 0)
    monkeypatch.setattr(recurrent, "empty", lambda shape, dtype, device: tw.empty(shape, dtype=dtype))
    monkeypatch.setattr(recurrent, "fill", lambda t, value: t.fill_(value))
    monkeypatch.setattr(recurrent, "gemm", lambda a, b: a.mm(b))


def test_step_arguments_are_packed_as_a_launch_reads_them():
    """Each step's ``void**``: the address of each parameter's 8 bytes, which hold that step's pointer."""
    argvs = [(0x1000 + t, 0x2000 + 16 * t, 2**63 + t) for t in range(4)]
    values, addresses = recurrent.pack_steps((0, 8, 16), argvs)
    for t, argv in enumerate(argvs):
        row = addresses.ctypes.data + t * 3 * 8
        slots = (ctypes.c_uint64 * 3).from_address(row)
        assert [ctypes.c_uint64.from_address(slot).value for slot in slots] == list(argv)
    assert recurrent.pack_steps((0, 8, 12), argvs) is None  # a parameter that is not an 8-byte slot


@pytest.mark.skipif(shutil.which("cc") is None, reason="no host C compiler")
@pytest.mark.parametrize("given", [(0, 1, 2), (0,), (1, 2)], ids=["all", "output", "final-state"])
def test_layer_loops_match_the_decomposition(given, loops_on_the_host):
    rng = np.random.default_rng(3)
    steps, batch, hidden = 5, 3, 4
    shapes = ((steps, batch, 4 * hidden), (batch, hidden), (batch, hidden), (4 * hidden, hidden))
    args = [tw.from_numpy(rng.uniform(-1, 1, size=s).astype(np.float32)) for s in shapes]
    args[1] = tw.from_numpy(rng.uniform(-1, 1, size=(2, batch, hidden)).astype(np.float32))[1]  # at an offset
    cpu = tw.device("cpu")
    got = recurrent.lstm_layer(cpu, *args)
    want = OPS["_lstm_layer"].decomposition(*args)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-6)
    grads = [tw.from_numpy(rng.uniform(-1, 1, size=tuple(o.shape)).astype(np.float32)) for o in got[:3]]
    outputs = [grads[k] if k in given else None for k in range(3)]
    bwd_args = (*outputs, None, None, *args, want[0], want[3], want[4])
    for a, b in zip(recurrent.lstm_layer_backward(cpu, *bwd_args),
                    OPS["_lstm_layer_backward"].decomposition(*bwd_args)):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------------------------- on a GPU

def _pair(make, seed=0):
    torch.manual_seed(seed)
    ref = make(torch.nn)
    ours = make(tw.nn)
    ours.load_state_dict({k: tw.from_numpy(v.detach().numpy().copy()) for k, v in ref.state_dict().items()})
    return ours, ref


def _run_both(make, shape, autocast: bool, device="cuda"):
    ours, ref = _pair(make)
    ours.to(device)
    x = np.random.default_rng(0).uniform(-1, 1, size=shape).astype(np.float32)
    results = []
    for lib, model in ((torch, ref), (tw, ours)):
        xi = (torch.tensor(x, requires_grad=True) if lib is torch else
              tw.tensor(x, device=device, requires_grad=True))
        if autocast and lib is tw:
            with tw.autocast(device_type=device, dtype=tw.bfloat16):
                out, (h, c) = model(xi)
        else:
            out, (h, c) = model(xi)
        loss = sum((o.float() * (k + 1)).sin().sum() for k, o in enumerate((out, h, c)))
        loss.backward()
        results.append(([out, h, c], xi.grad, {k: p.grad for k, p in model.named_parameters()}))
    return results


def _np(t):
    return t.detach().float().cpu().numpy() if isinstance(t, tw.Tensor) else t.detach().float().numpy()


@pytest.mark.cuda
@pytest.mark.parametrize("make", [lambda nn: nn.LSTM(16, 32, 2), lambda nn: nn.LSTM(16, 24, 1, bidirectional=True,
                                                                                       batch_first=True),
                                  lambda nn: nn.LSTM(5, 7, 1)], ids=["2-layer", "bidirectional", "odd-sizes"])
def test_lstm_on_cuda_matches_torch_in_float32(make):
    (want, want_gx, want_gp), (got, got_gx, got_gp) = _run_both(make, (9, 4, make(tw.nn).input_size), False)
    for a, b in zip(got, want):
        np.testing.assert_allclose(_np(a), _np(b), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(_np(got_gx), _np(want_gx), rtol=1e-4, atol=1e-5)
    for name in want_gp:
        np.testing.assert_allclose(_np(got_gp[name]), _np(want_gp[name]), rtol=1e-4, atol=1e-4, err_msg=name)


@pytest.mark.cuda
def test_lstm_on_cuda_under_bfloat16_autocast_is_close_to_torch():
    (want, want_gx, want_gp), (got, got_gx, got_gp) = _run_both(lambda nn: nn.LSTM(32, 64, 2), (12, 8, 32), True)
    assert all(o.dtype == tw.bfloat16 for o in got)
    for a, b in zip(got, want):
        np.testing.assert_allclose(_np(a), _np(b), rtol=5e-2, atol=5e-2)
    assert got_gx.dtype == tw.float32 and all(g.dtype == tw.float32 for g in got_gp.values())
    np.testing.assert_allclose(_np(got_gx), _np(want_gx), rtol=1e-1, atol=5e-2)
    for name in want_gp:
        scale = np.abs(_np(want_gp[name])).max()
        np.testing.assert_allclose(_np(got_gp[name]), _np(want_gp[name]), atol=5e-2 * scale, err_msg=name)


@pytest.mark.cuda
def test_lstm_layer_kernels_match_the_decomposition_on_cuda():
    """The CUDA loop against the declared decomposition run on the same device, forward and backward, every
    output gradient given or not."""
    rng = np.random.default_rng(2)
    steps, batch, hidden = 6, 4, 8
    arrays = [rng.uniform(-1, 1, size=s).astype(np.float32)
              for s in ((steps, batch, 4 * hidden), (batch, hidden), (batch, hidden), (4 * hidden, hidden))]
    args = [tw.tensor(a, device="cuda") for a in arrays]
    layer, backward = OPS["_lstm_layer"], OPS["_lstm_layer_backward"]
    with tw.no_grad():
        got = layer(*args)
        want = layer.decomposition(*args)
        for a, b in zip(got, want):  # the GEMMs may take other cuBLASLt algorithms: not bit for bit
            np.testing.assert_allclose(_np(a), _np(b), rtol=1e-4, atol=1e-5)
        grads = [tw.tensor(rng.uniform(-1, 1, size=tuple(o.shape)).astype(np.float32), device="cuda")
                 for o in got[:3]]
        for given in ([0, 1, 2], [0], [1, 2]):
            outputs = [grads[k] if k in given else None for k in range(3)]
            bwd_args = (*outputs, None, None, *args, got[0], got[3], got[4])
            for a, b in zip(backward(*bwd_args), backward.decomposition(*bwd_args)):
                np.testing.assert_allclose(_np(a), _np(b), rtol=1e-4, atol=1e-5)

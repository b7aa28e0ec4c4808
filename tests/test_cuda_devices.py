"""Work on several GPUs from one thread: every operator runs in its operands' device's context (library calls and
the legacy default stream follow the thread's current context, not the tensors), finalizers that touch another
device put the thread's context back, and a copy between GPUs is ordered on both devices' streams. Without a GPU
the routing is checked on a stand-in for the driver; marked ``cuda``, on two real GPUs."""

from __future__ import annotations

import numpy as np
import pytest

import tilewise as tw
from tilewise.backends import cuda as backend
from tilewise.backends.cuda.runtime import device as runtime_device


@pytest.fixture
def fake_contexts(monkeypatch):
    """``ensure_context`` over a stand-in driver: the thread's current context is recorded, nothing else."""
    switched: list[int] = []

    class Driver:
        @staticmethod
        def cuCtxSetCurrent(ctx):
            switched.append(ctx)
            return (0,)

    monkeypatch.setattr(runtime_device, "driver_api", lambda: Driver)
    monkeypatch.setattr(runtime_device, "check", lambda result, what: None)
    monkeypatch.setattr(runtime_device, "_validated_index", int)
    monkeypatch.setattr(runtime_device, "_primary_context", lambda index: index)
    monkeypatch.setattr(runtime_device._thread_state, "context_device", 0)
    return switched


def test_an_operator_on_another_gpu_makes_that_gpus_context_current_first(fake_contexts, monkeypatch):
    seen = []
    monkeypatch.setattr(backend, "_pointwise", lambda op, args, device: seen.append(
        runtime_device._thread_state.context_device) or "ran")
    pointwise = type("Op", (), {"kind": "pointwise"})()
    assert backend.run(pointwise, (), tw.device("cuda", 1)) == "ran"
    assert seen == [1] and fake_contexts == [1]
    backend.run(pointwise, (), tw.device("cuda", 1))
    assert fake_contexts == [1]  # already current: no driver call on the hot path


def test_a_finalizer_on_another_gpu_puts_the_threads_context_back(fake_contexts):
    calls = []
    assert runtime_device.call_in_context(3, lambda v: calls.append(
        runtime_device._thread_state.context_device) or v, "done") == "done"
    assert calls == [3] and fake_contexts == [3, 0] and runtime_device._thread_state.context_device == 0


def _gpus(n: int) -> None:
    found = tw.cuda.device_count() if tw.cuda.is_available() else 0
    if found < n:
        pytest.skip(f"needs {n} GPUs; {found} found")


@pytest.mark.cuda
def test_on_two_gpus_library_calls_and_kernels_from_one_thread_use_each_operands_gpu():
    """cuBLASLt, cuDNN and generated kernels on cuda:1 and cuda:0 in turn, from a thread whose current device
    stays 0; a product of cuda:1 tensors once ran on GPU 0's context and stopped the process's CUDA context."""
    _gpus(2)
    tw.manual_seed(0)
    a0 = tw.randn(96, 64, device="cuda:0")
    w0 = tw.randn(4, 3, 3, 3, device="cuda:0", requires_grad=True)
    img0 = tw.randn(2, 3, 16, 16, device="cuda:0")
    a1, w1, img1 = a0.to("cuda:1"), w0.detach().to("cuda:1").requires_grad_(), img0.to("cuda:1")
    for _ in range(2):
        p1, p0 = (a1 @ a1.T).relu(), (a0 @ a0.T).relu()
        c1 = tw.nn.functional.conv2d(img1, w1, padding=1)
        c0 = tw.nn.functional.conv2d(img0, w0, padding=1)
        c1.square().sum().backward()
        c0.square().sum().backward()
        # reductions and softmax of one geometry on both GPUs: a plan cached without the device once ran GPU 1's
        # kernel on GPU 0's memory
        s1, s0 = (a1.sum(0), a1.var(1), a1.softmax(-1)), (a0.sum(0), a0.var(1), a0.softmax(-1))
        for got, want in zip(s1, s0):
            np.testing.assert_allclose(got.cpu().numpy(), want.cpu().numpy(), rtol=1e-5, atol=1e-5)
    assert tw.cuda.current_device() == 0 and p1.device == tw.device("cuda", 1)
    np.testing.assert_allclose(p1.cpu().numpy(), p0.cpu().numpy(), rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(c1.detach().cpu().numpy(), c0.detach().cpu().numpy(), rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(w1.grad.cpu().numpy(), w0.grad.cpu().numpy(), rtol=1e-4, atol=1e-3)


@pytest.mark.cuda
def test_on_two_gpus_a_copy_waits_for_its_source_and_is_waited_for_on_the_target():
    """The source is written behind a long kernel on GPU 0 and the copy read at once by a kernel on GPU 1: each
    device's work must see the other's in order."""
    _gpus(2)
    x = tw.arange(1 << 20, dtype=tw.float32, device="cuda:0")
    for _ in range(3):
        tw.cuda._sleep(20_000_000)  # about 10 ms of GPU 0's clock ahead of the write
        y = x * 2
        z = y.to("cuda:1") + 1
        np.testing.assert_array_equal(z.cpu().numpy(), np.arange(1 << 20, dtype=np.float32) * 2 + 1)
        with tw.cuda.device(1):
            tw.cuda._sleep(20_000_000)
            back = (z - 1).to("cuda:0") / 2
        np.testing.assert_array_equal(back.cpu().numpy(), np.arange(1 << 20, dtype=np.float32))


@pytest.mark.cuda
def test_on_two_gpus_an_asynchronous_upload_to_the_second_is_ordered_on_its_own_stream():
    """From a thread whose current device is 0 and busy, a pinned upload to cuda:1 and a kernel reading it there:
    the copy once went to GPU 0's stream, behind its work, and the kernel on GPU 1 read the memory before it."""
    _gpus(2)
    host = tw.arange(1 << 20, dtype=tw.float32).pin_memory()
    want = np.arange(1 << 20, dtype=np.float32) + 1
    for _ in range(3):
        tw.cuda._sleep(40_000_000)  # GPU 0, the current device, busy for about 20 ms
        on_second = host.to("cuda:1", non_blocking=True) + 1
        np.testing.assert_array_equal(on_second.cpu().numpy(), want)

"""[Note: libraries warmed while compiling]: a compile for CUDA works out from its graphs which kinds of cuDNN
attention its programs will call, and builds small graphs of those kinds on a thread of its own, once per process,
joined before the programs' first run."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest

import tilewise as tw
from tilewise.backends.cuda import attention, cudnn, warmup
from tilewise.compiler.capture import capturing
from tilewise.compiler.function import _flatten_call, program_graphs
from tilewise.compiler.targets import get_target
from tilewise.config import settings
from tilewise.device import Device

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import transformer_matrix as tm  # noqa: E402


def _graphs(step, *args) -> list:
    """The graphs a compile of ``step`` for the CUDA target hands to its lowering (after the target's passes)."""
    compiled = tw.compile(step)
    flat, _ = _flatten_call(args, {})
    cap, _ = compiled._start(args, {})
    try:
        with capturing(cap):
            traced = cap.finish(compiled.fn(*args), flat)
    finally:
        cap.restore()
    graphs, _ = program_graphs(traced, get_target("cuda"))
    return graphs


@pytest.fixture
def cudnn_usable(monkeypatch):
    """What the CUDA target's passes ask, answered as on a GPU host with cuDNN installed."""
    monkeypatch.setattr(attention.cudnn, "unavailable", lambda: None)
    monkeypatch.setattr(cudnn, "unavailable", lambda: None)


@pytest.mark.parametrize("model", ["gpt2", "llama"])
def test_a_transformer_steps_attention_kind_is_warmed(model, cudnn_usable):
    case = tm.Case(model, "tiny", 2, 32, "bf16", "cpu")
    weights, _ = tm.initial_weights(case)
    x, y = tm.on_device(tw, case, tm.sample_batches(case, 1)[0])
    items = warmup.wanted(_graphs(tm.raw_tilewise_step(case, weights), x, y))
    (kind,) = items
    _, dtype, heads, kv_heads, head_dim, causal = kind
    assert (dtype, causal, head_dim) == (tw.bfloat16, True, 16)
    assert heads == 4 and (kv_heads < heads if model == "llama" else kv_heads == heads)


def test_a_convolution_net_warms_nothing(cudnn_usable):
    net = tw.nn.Sequential(tw.nn.Conv2d(3, 8, 3, padding=1), tw.nn.ReLU(), tw.nn.Flatten(), tw.nn.Linear(8 * 8 * 8, 4))

    def step(x):
        with tw.autocast("cpu", dtype=tw.bfloat16):
            loss = net(x).float().square().mean()
        loss.backward()
        return loss.detach()

    assert warmup.wanted(_graphs(step, tw.randn(2, 3, 8, 8))) == []


def test_an_attention_cudnn_does_not_take_is_not_warmed(cudnn_usable):
    def f(q):
        return tw.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)

    assert warmup.wanted(_graphs(f, tw.randn(1, 2, 8, 12, dtype=tw.bfloat16))) == []  # head dim 12: not cuDNN's


def test_each_kind_is_warmed_once_per_process_and_device_on_a_thread(monkeypatch):
    warmed = []
    monkeypatch.setattr(warmup, "_done", set())
    monkeypatch.setattr(warmup, "wanted", lambda graphs: list(graphs))  # (a list of items stands for the graphs)
    monkeypatch.setattr(warmup, "_warm", lambda items, device: warmed.append((threading.current_thread().name,
                                                                               device.index, items)))
    gpu = Device("cuda", 0)
    causal = ("attention", tw.bfloat16, 12, 12, 64, True)
    gqa = ("attention", tw.float16, 12, 4, 64, False)
    warmup.start(gpu, [causal]).join()
    assert warmed == [("tilewise-warm-libraries", 0, [causal])]
    assert warmup.start(gpu, [causal]) is None
    warmup.start(gpu, [causal, gqa]).join()
    assert warmed[-1] == ("tilewise-warm-libraries", 0, [gqa])
    warmup.start(Device("cuda", 1), [causal]).join()
    assert warmed[-1][1:] == (1, [causal])
    assert warmup.start(Device("cpu"), [causal]) is None
    monkeypatch.setattr(settings, "warm_libraries", False)
    assert warmup.start(gpu, [("attention", tw.bfloat16, 8, 8, 128, False)]) is None


def test_a_warm_up_that_fails_is_only_logged(monkeypatch, capsys):
    def broken(*args):
        raise RuntimeError("no engine here")
    monkeypatch.setattr(attention, "warm", broken)
    monkeypatch.setattr(settings, "log", {"compile"})
    monkeypatch.setattr("tilewise.backends.cuda.runtime.ensure_context", lambda index: None)
    warmup._warm([("attention", tw.bfloat16, 12, 12, 64, True)], Device("cuda", 0))  # (the thread's body, here)
    assert "no engine here" in capsys.readouterr().err


@pytest.mark.cuda
def test_a_compiled_step_warms_its_libraries_and_joins_them_before_its_first_run(monkeypatch):
    monkeypatch.setattr(warmup, "_done", set())
    started = []
    original = warmup.start

    def start(device, graphs):
        thread = original(device, graphs)
        started.append(thread)
        return thread
    monkeypatch.setattr(warmup, "start", start)
    model = tw.nn.Linear(64, 64).cuda()

    @tw.compile
    def step(x):
        with tw.autocast("cuda", dtype=tw.bfloat16):
            q = model(x).view(2, 4, 16, 16)
            out = tw.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
        loss = out.float().square().mean()
        loss.backward()
        return loss.detach()

    step(tw.randn(32, 64, device="cuda"))
    (thread,) = started
    assert thread is not None and not thread.is_alive()
    (program,) = step.programs()
    assert program.warming is None
    assert cudnn._handles.get(0) is not None

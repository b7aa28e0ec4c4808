"""NVTX: ``tilewise.cuda.nvtx`` (torch.cuda.nvtx's functions) without the nvtx package (no-ops, one warning)
and through a fake of it, and ``tilewise.autograd.profiler.emit_nvtx`` pushing a range per operator, autograd
node, compiled program step, record_function block and module forward, and nothing once it exits."""

from __future__ import annotations

import sys
import types
import warnings

import pytest
import torch

import tilewise as tw
import tilewise.profiler as twp
from tilewise import dispatch
from tilewise.cuda import nvtx
from tilewise.nn.modules import module as nn_module


class FakeNvtx(types.ModuleType):
    """NVIDIA's nvtx module as far as tilewise uses it: a log of every call."""

    def __init__(self):
        super().__init__("nvtx")
        self.calls: list[tuple] = []
        self.open: list[str] = []

    def push_range(self, message=None, **_):
        self.calls.append(("push", message))
        self.open.append(message)

    def pop_range(self, domain=None):
        self.calls.append(("pop", self.open.pop()))

    def mark(self, message=None, **_):
        self.calls.append(("mark", message))

    def start_range(self, message=None, **_):
        self.calls.append(("start", message))
        return (7, message)

    def end_range(self, range_id):
        self.calls.append(("end", range_id))

    def pushed(self) -> list[str]:
        return [name for call, name in self.calls if call == "push"]


@pytest.fixture
def fake_nvtx(monkeypatch):
    fake = FakeNvtx()
    monkeypatch.setitem(sys.modules, "nvtx", fake)
    monkeypatch.setattr(nvtx, "_nvtx", nvtx._UNLOADED)
    yield fake
    assert fake.open == []  # every range pushed was popped


def test_without_the_package_calls_do_nothing_and_warn_once(monkeypatch):
    monkeypatch.setitem(sys.modules, "nvtx", None)
    monkeypatch.setattr(nvtx, "_nvtx", nvtx._UNLOADED)
    with pytest.warns(UserWarning, match="nvtx package is not installed"):
        assert nvtx.range_push("a") == 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert nvtx.range_push("b") == 1
        assert nvtx.range_pop() == 1 and nvtx.range_pop() == 0 and nvtx.range_pop() == -1
        nvtx.mark("m")
        nvtx.range_end(nvtx.range_start("s"))
        with nvtx.range("layer {}", 1):
            pass
    with pytest.raises(RuntimeError, match="NVTX functions not installed"):  # torch, without CUDA, raises instead
        torch.cuda.nvtx.range_push("a")


def test_calls_reach_the_package(fake_nvtx):
    assert nvtx.range_push("outer") == 0
    with nvtx.range("block {} of {n}", 2, n=3):
        nvtx.mark("here")
    assert nvtx.range_pop() == 0
    handle = nvtx.range_start("async")
    nvtx.range_end(handle)
    nvtx.range_end(handle)  # already ended: nothing

    @nvtx.range("decorated")
    def f():
        return 5

    assert f() == 5
    assert fake_nvtx.calls == [("push", "outer"), ("push", "block 2 of 3"), ("mark", "here"),
                               ("pop", "block 2 of 3"), ("pop", "outer"), ("start", "async"),
                               ("end", (7, "async")), ("push", "decorated"), ("pop", "decorated")]


def test_emit_nvtx_pushes_a_range_per_operator_node_block_and_module(fake_nvtx):
    layer = tw.nn.Linear(3, 2)
    x = tw.ones(4, 3, requires_grad=True)
    with tw.autograd.profiler.emit_nvtx():
        assert dispatch.profiling and nn_module.forward_range is not None
        with twp.record_function("block"):
            y = layer(x).relu().sum()
        y.backward()
    pushed = fake_nvtx.pushed()
    assert pushed[:3] == ["block", "nn.Module: Linear", "aten::linear"]
    assert "aten::relu" in pushed and "aten::sum" in pushed
    assert "autograd::engine::evaluate_function: SumBackward0" in pushed
    assert any(name.endswith("AccumulateGrad") for name in pushed)
    assert not dispatch.profiling and nn_module.forward_range is None  # nothing once it exits
    count = len(fake_nvtx.calls)
    layer(x).sum()
    assert len(fake_nvtx.calls) == count


def test_emit_nvtx_names_shapes_and_compiled_steps(fake_nvtx):
    compiled = tw.compile(lambda a: (a * 2).exp().sum())
    a = tw.ones(2, 3)
    compiled(a)
    with tw.autograd.profiler.emit_nvtx(record_shapes=True):
        a + a
        compiled(a)
    pushed = fake_nvtx.pushed()
    assert pushed[0] == "aten::add, sizes = [[2, 3], [2, 3], []]"  # alpha too, as torch lists it
    program = next(k for k, name in enumerate(pushed) if name.startswith("CompiledProgram"))
    assert len(pushed) > program + 1  # its steps, each a range inside it


def test_emit_nvtx_disabled_or_reentered(fake_nvtx):
    with tw.autograd.profiler.emit_nvtx(enabled=False):
        tw.ones(2) + 1
    assert fake_nvtx.calls == [] and not dispatch.profiling
    emit = tw.autograd.profiler.emit_nvtx()
    with emit:
        with pytest.raises(RuntimeError, match="not reentrant"):
            emit.__enter__()
    assert not dispatch.profiling


def test_emit_nvtx_beside_a_profile_leaves_the_profile_alone(fake_nvtx):
    x = tw.ones(2)
    with twp.profile() as prof:
        with tw.autograd.profiler.emit_nvtx():
            x * 2
        x + 1
    assert [e.name for e in prof.events()] == ["aten::mul", "aten::add"]
    assert fake_nvtx.pushed() == ["aten::mul"]
    assert not dispatch.profiling


@pytest.mark.parametrize("module", ["tilewise.cuda.nvtx", "tilewise.autograd.profiler"])
def test_docstring_examples_run(module):
    import doctest
    import importlib

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the nvtx package is missing here: its one warning
        result = doctest.testmod(importlib.import_module(module), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0 and result.attempted > 0

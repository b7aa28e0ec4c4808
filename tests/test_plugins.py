"""The core's layering: no upward import or cycle among the core layers, every plug-in point filled by the
module ``tilewise/_plugins.py`` names, and the Backend protocol checked where a backend registers."""

from __future__ import annotations

import importlib
import sys
import types
from pathlib import Path

import pytest

import tilewise as tw
from tilewise._plugins import PLUG_INS
from tilewise.device import BACKENDS, Backend, register_backend

sys.path.insert(0, str(Path(__file__).resolve().parent))
import import_graph  # noqa: E402


def test_core_layers_import_nothing_above_them_and_form_no_cycle():
    arrows, cycles = import_graph.core_problems(import_graph.graph())
    assert not arrows, "upward imports in the core layers (register a plug-in instead):\n" + "\n".join(
        f"  {module}:{line} -> {target}" for module, target, line in arrows)
    assert not cycles, "import cycles in the core layers:\n" + "\n".join("  " + " ".join(c) for c in cycles)


def _resolve(slot: str):
    module, _, path = slot.partition(":")
    found = importlib.import_module(module)
    for part in path.split("."):
        found = found[part] if isinstance(found, dict) else getattr(found, part)
    return found


def _origin(value) -> str:
    """The module that made ``value``: a function's (or a context manager's) own, else its class's."""
    if isinstance(value, (types.FunctionType, type)):
        return value.__module__
    if isinstance(value, staticmethod):
        return value.__func__.__module__
    return type(value).__module__


@pytest.mark.parametrize("plug_in", PLUG_INS, ids=lambda p: p.slot)
def test_every_plug_in_point_holds_what_its_layer_put_there(plug_in):
    assert _origin(_resolve(plug_in.slot)) == plug_in.filled_by


def test_plug_in_points_are_never_above_the_modules_that_fill_them():
    """Below, or in the same layer where the plug-in breaks a cycle (Tensor's repr, its legacy type)."""
    for p in PLUG_INS:
        owner = p.slot.partition(":")[0]
        assert import_graph.layer_of(owner) <= import_graph.layer_of(p.filled_by), p


def test_a_backend_missing_a_method_is_refused_by_name():
    class Partial(Backend):  # everything a backend must define but upload
        def run(self, op, args, device): ...
        def empty(self, shape, dtype, device, strides=None): ...
        def download(self, x, non_blocking=False): ...
        def synchronize(self, device): ...

    with pytest.raises(TypeError, match=r"has no method upload\(\) of the Backend protocol") as info:
        register_backend("meta", Partial())
    assert "'meta'" in str(info.value) and "meta" not in BACKENDS


def test_an_object_without_the_protocol_is_refused():
    with pytest.raises(TypeError, match=r"has no method run\(\)"):
        register_backend("meta", types.SimpleNamespace())


def test_registering_an_unknown_device_type_says_which_exist():
    with pytest.raises(ValueError, match="unknown device type 'tpu'"):
        register_backend("tpu", BACKENDS["cpu"])


def test_the_cpu_backend_offers_the_whole_protocol():
    cpu = BACKENDS["cpu"]
    x = tw.arange(6.0).reshape(2, 3)
    assert cpu.upload(x, tw.device("cpu"), dtype=tw.float16).dtype is tw.float16
    assert cpu.download(x).tolist() == x.tolist()
    assert cpu.empty((2, 3), tw.float64, tw.device("cpu")).shape == (2, 3)
    assert cpu.run_into(None, (), tw.device("cpu"), x) is None  # the dispatcher then runs the op as usual
    assert not cpu.is_pinned(x)
    cpu.synchronize(tw.device("cpu"))


def test_an_unfilled_dispatcher_slot_says_which_layer_fills_it():
    from tilewise import dispatch

    missing = dispatch._unfilled("record", "tilewise.autograd")
    with pytest.raises(RuntimeError, match="filled when tilewise.autograd is imported"):
        missing(None, ())

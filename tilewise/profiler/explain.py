"""``tilewise explain``: one call followed through every layer, from the Python expression to SASS.

[Note: explain] The sections are what each layer makes of the call, in the order the layers run: the
operators the expression reaches and their declarations (schema, meaning, derivatives), how eager mode
runs them, the captured graph before and after each compiler pass, the fused graph, each kernel's IR and
schedule, the generated source for the chosen target, and for CUDA the PTX, SASS and register use that
NVRTC and nvdisasm give (no GPU needed for those). Last, the compiled and the eager call are run on the
device and timed. Nothing here is specific to explaining: every section is the text form a layer already
has (``format_graph``, ``format_kernel``, ``KernelSchedule.describe``), shown together.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import numpy as np

import tilewise as tw
from tilewise.compiler.capture import trace
from tilewise.compiler.ir import IR_OPS, format_graph, verify
from tilewise.compiler.program import lower_program
from tilewise.compiler.targets import get_target, target_for_device
from tilewise.ops.expr import render_text

INPUT_NAMES = ("x", "y", "z", "w")


def _function(expr: str, count: int):
    names = ", ".join(INPUT_NAMES[:count])
    scope = {"tw": tw, "F": tw.nn.functional}
    return eval(f"lambda {names}: {expr}", scope)  # noqa: S307 — the user's own expression, as python -c runs it


def explain(expr: str, shapes: list[tuple[int, ...]], dtype: str = "float32", device: str = "cpu",
            target: str | None = None, repeats: int = 20) -> Iterator[tuple[str, str]]:
    """(title, text) per layer for ``expr`` over inputs ``x, y, ...`` of ``shapes``."""
    if not 1 <= len(shapes) <= len(INPUT_NAMES):
        raise ValueError(f"explain: give 1 to {len(INPUT_NAMES)} input shapes, got {len(shapes)}")
    target = get_target(target) if target else target_for_device(tw.device(device))
    fn = _function(expr, len(shapes))
    tw.manual_seed(0)
    inputs = [tw.randn(*s, dtype=getattr(tw, dtype), device=device) for s in shapes]
    described = ", ".join(f"{n}: {t.dtype.name}{list(t.shape)} on {t.device}" for n, t in zip(INPUT_NAMES, inputs))
    yield "the call", f"{expr}\n  with {described}"

    traced = trace(fn, tuple(inputs), {})
    graph = traced.graph
    yield "operators", _operators(graph)
    yield "eager", _eager(graph, device)

    lines = [format_graph(graph, "captured")]
    before = format_graph(graph)
    for p in target.passes:
        graph = verify(p(graph), p.__name__)
        now = format_graph(graph)
        lines.append(format_graph(graph, f"after {p.__name__}") if now != before else f"after {p.__name__}: unchanged")
        before = now
    yield "graph passes", "\n\n".join(lines)

    low = lower_program(graph, target)
    yield "fusion", format_graph(low.fused, "after fuse") + f"\n\n{len(low.kernels)} generated kernel(s)"
    for kernel, sched in zip(low.kernels.values(), low.schedules):
        yield f"kernel {kernel.name}: IR", str(kernel)
        yield f"kernel {kernel.name}: schedule", sched.describe()
    yield f"generated {target.source_name}", low.source or "(no generated kernel)"
    if target.machine_code is not None:
        yield from target.machine_code(low)
    yield "run", _run(fn, inputs, repeats)


def _operators(graph) -> str:
    lines, seen = [], set()
    for node in graph.body:
        op = node.opdef
        if node.op in IR_OPS or op is None or op.full_name in seen:
            continue
        seen.add(op.full_name)
        lines.append(f"{op.schema.text}\n  kind: {op.kind}")
        if op.expr is not None:
            lines.append(f"  meaning: {render_text(op.expr)}")
        if op.decomposition is not None:
            lines.append(f"  decomposition: {op.decomposition.__module__}.{op.decomposition.__qualname__}")
        for name, formula in op.derivatives.items():
            lines.append(f"  d/d{name}: {formula.text if formula is not None else 'not differentiable'}")
    return "\n".join(lines)


def _eager(graph, device: str) -> str:
    calls = [n for n in graph.body if n.op not in IR_OPS and n.kind not in ("view", "unknown")]
    backend = "a generated CUDA kernel (or a library call)" if device.startswith("cuda") else "a numpy kernel"
    return (f"{len(calls)} operator call(s) eagerly, each: binder (schema) -> Autograd (records a node when an "
            f"input requires grad) -> the {device.split(':')[0].upper()} backend -> {backend}; each result is "
            "written to memory and read back by the next call. Views cost no kernel.")


def _run(fn, inputs: list, repeats: int) -> str:
    compiled = tw.compile(fn)
    sync = tw.cuda.synchronize if inputs[0].is_cuda else (lambda: None)

    def timed(f) -> float:
        f(*inputs)
        sync()
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            f(*inputs)
            sync()
            times.append(time.perf_counter() - start)
        return float(np.median(times)) * 1e3

    got, want = compiled(*inputs), fn(*inputs)
    outs = [(got, want)] if isinstance(got, tw.Tensor) else list(zip(got, want))
    diff = max(float((a.double() - b.double()).abs().max()) for a, b in outs)
    ours, eager = timed(compiled), timed(fn)
    kernels = sum(p.kernel_count for p in compiled.programs())
    return (f"on {inputs[0].device}: compiled {ours:.3f} ms per call ({kernels} kernel(s)); eager {eager:.3f} ms; "
            f"{eager / ours:.2f}x; largest difference from eager {diff:.3g} (median of {repeats} calls, "
            "wall clock including the host)")

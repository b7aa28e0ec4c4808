"""Random graphs drawn by hypothesis — pointwise, broadcasting, reductions, views — compiled equal eager.

A drawn program is a list of instructions over a growing list of values, run once eagerly and once
through ``tilewise.compile`` (forward, then the gradients of a random weighting of its outputs through the
compiled function's backward). Programs whose eager results leave a safe numeric range are discarded:
they compare rounding, not the compiler.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

import tilewise as tw
from tilewise import strides as S

UNARY = ("relu", "neg", "tanh", "sigmoid", "abs", "sin", "cos", "exp_tanh")
BINARY = ("add", "sub", "mul", "maximum", "minimum")
REDUCE = ("sum", "amax", "mean")
VIEWS = ("transpose", "unsqueeze", "squeeze", "flatten", "slice", "expand", "permute")
TOLERANCE = {"float32": (2e-4, 1e-4), "float64": (1e-9, 1e-9), "float16": (2e-2, 2e-2)}


@st.composite
def programs(draw):
    dtype = draw(st.sampled_from(("float32", "float64", "float16")))
    rank = draw(st.integers(1, 3))
    base = tuple(draw(st.lists(st.sampled_from((1, 2, 3, 5, 6, 40, 70)), min_size=rank, max_size=rank)))
    shapes = []
    for _ in range(draw(st.integers(1, 3))):
        drop = draw(st.integers(0, rank - 1))
        shapes.append(tuple(s if draw(st.booleans()) else 1 for s in base[drop:]) if draw(st.booleans()) else base)
    values = list(shapes)
    code = []
    for _ in range(draw(st.integers(3, 30))):
        k = draw(st.integers(0, len(values) - 1))
        shape = values[k]
        kind = draw(st.sampled_from(("unary", "binary", "scalar", "reduce", "view", "softmax")))
        if kind == "binary":
            j = draw(st.integers(0, len(values) - 1))
            try:
                out = S.broadcast_shapes(shape, values[j])
            except RuntimeError:
                continue
            code.append(("binary", draw(st.sampled_from(BINARY)), k, j))
        elif kind == "unary":
            code.append(("unary", draw(st.sampled_from(UNARY)), k))
            out = shape
        elif kind == "scalar":
            code.append(("scalar", draw(st.sampled_from(BINARY)), k, draw(st.sampled_from((0.5, -1.5, 2.0)))))
            out = shape
        elif kind in ("reduce", "softmax") and shape:
            dim = draw(st.integers(0, len(shape) - 1))
            if kind == "softmax":
                code.append(("softmax", draw(st.booleans()), k, dim))
                out = shape
            else:
                keep = draw(st.booleans())
                code.append(("reduce", draw(st.sampled_from(REDUCE)), k, dim, keep))
                out = S.reduced_shape(shape, (dim,), keep)
        elif kind == "view" and shape:
            view = draw(st.sampled_from(VIEWS))
            dim = draw(st.integers(0, len(shape) - 1))
            code.append(("view", view, k, dim))
            out = _view_shape(view, shape, dim)
        else:
            continue
        values.append(out)
    assume(code)
    outputs = sorted(set(draw(st.lists(st.integers(len(shapes), len(values) - 1), min_size=1, max_size=3))))
    return dtype, shapes, code, outputs


def _view_shape(view: str, shape: tuple, dim: int) -> tuple:
    probe = tw.empty(*shape)
    return tuple(_apply_view(view, probe, dim).shape)


def _apply_view(view: str, x, dim: int):
    if view == "transpose":
        return x.transpose(dim, -1)
    if view == "unsqueeze":
        return x.unsqueeze(dim)
    if view == "squeeze":
        return x.squeeze(dim)
    if view == "flatten":
        return x.flatten()
    if view == "slice":
        return x.narrow(dim, x.shape[dim] // 2, x.shape[dim] - x.shape[dim] // 2)
    if view == "expand":
        return x.unsqueeze(0).expand(2, *x.shape)
    return x.permute(*reversed(range(x.ndim)))


def run(code: list, outputs: list, *inputs):
    values = list(inputs)
    for ins in code:
        kind, name, k = ins[0], ins[1], ins[2]
        x = values[k]
        if kind == "unary":
            out = x.tanh().exp() if name == "exp_tanh" else getattr(tw, name)(x)
        elif kind == "binary":
            out = getattr(tw, name)(x, values[ins[3]])
        elif kind == "scalar":
            out = getattr(tw, name)(x, tw.full((), ins[3], dtype=x.dtype)) if name in ("maximum", "minimum") \
                else getattr(tw, name)(x, ins[3])
        elif kind == "reduce":
            out = getattr(x, name)(ins[3], keepdim=ins[4])
        elif kind == "softmax":
            out = x.log_softmax(ins[3]) if name else x.softmax(ins[3])
        else:
            out = _apply_view(name, x, ins[3])
        values.append(out)
    return [values[k] for k in outputs]


def _numpy(t) -> np.ndarray:
    return t.detach().float().numpy() if t.dtype.itemsize < 4 else t.detach().numpy()


@pytest.mark.parametrize("segmented", [False, True], ids=["replayed", "segmented"])
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(programs(), st.integers(0, 2**16))
@example(("float32", [(2, 3, 1), (1,)], [("binary", "add", 0, 1), ("reduce", "mean", 2, 0, False)], [3]), 0)
@example(("float32", [(5, 2)], [("softmax", False, 0, 0), ("reduce", "amax", 1, 1, False)], [2]), 0)
@example(("float16", [(4, 4), (4, 4)], [("scalar", "mul", 0, 2.0), ("reduce", "sum", 2, 0, False),
                                        ("scalar", "add", 1, 0.5), ("view", "transpose", 2, 0),
                                        ("binary", "mul", 4, 5)], [3, 6]), 0)
def test_random_program_compiled_equals_eager(segmented, program, seed):
    """``segmented``: the function also appends to a list, so its Python runs on every call and the operators
    run as a compiled segment whose live values (autograd's saved tensors) become real tensors."""
    dtype, shapes, code, outputs = program
    rng = np.random.default_rng(seed)
    differentiable = dtype != "float16"
    inputs = [tw.from_numpy(rng.uniform(-1.5, 1.5, s).astype(dtype)).requires_grad_(differentiable) for s in shapes]
    expected = run(code, outputs, *inputs)
    for e in expected:
        assume(np.all(np.isfinite(_numpy(e))) and np.abs(_numpy(e)).max(initial=0) < 1e4)
    calls = []
    if segmented:
        compiled = tw.compile(lambda *xs: calls.append(1) or run(code, outputs, *xs))
    else:
        compiled = tw.compile(lambda *xs: run(code, outputs, *xs))
    actual = compiled(*inputs)
    # the same program in float64 says how far rounding alone takes eager: compiled code may differ from
    # eager by that much again (it sums in another order), plus the dtype's tolerance
    exact_inputs = [x.detach().double().requires_grad_(differentiable) for x in inputs]
    exact = run(code, outputs, *exact_inputs)
    rtol, atol = TOLERANCE[dtype]
    for a, e, r in zip(actual, expected, exact):
        assert a.shape == e.shape and a.dtype == e.dtype
        _close_to_eager(_numpy(a), _numpy(e), r.detach().numpy(), rtol, atol)
    if not differentiable:
        return
    weights = [tw.from_numpy(rng.standard_normal(tuple(e.shape)).astype(dtype)) for e in expected]
    eager_grads = tw.autograd.grad([(e * w).sum() for e, w in zip(expected, weights)], inputs, allow_unused=True)
    compiled_grads = tw.autograd.grad([(a * w).sum() for a, w in zip(actual, weights)], inputs, allow_unused=True)
    exact_grads = tw.autograd.grad([(r * w.double()).sum() for r, w in zip(exact, weights)], exact_inputs,
                                   allow_unused=True)
    for g, h, r in zip(compiled_grads, eager_grads, exact_grads):
        if h is None:
            assert g is None or np.allclose(_numpy(g), 0)
            continue
        _close_to_eager(_numpy(g), _numpy(h), r.numpy(), rtol * 10, atol * 10)


def _close_to_eager(actual: np.ndarray, eager: np.ndarray, exact: np.ndarray, rtol: float, atol: float) -> None:
    slack = 2 * np.abs(eager.astype(np.float64) - exact)
    np.testing.assert_allclose(actual, eager, rtol=rtol, atol=atol + float(slack.max(initial=0)))

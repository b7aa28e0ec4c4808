"""``out=`` against torch: the values, the object returned, resizing, and torch's refusals."""

import warnings

import numpy as np
import pytest
import torch

import tilewise as tw

A = np.array([[3.0, -1.0, 2.5], [0.5, 4.0, -2.0]], dtype=np.float32)
B = np.array([[1.0, 2.0, -3.0], [2.0, 0.25, 1.0]], dtype=np.float32)

# name: (call(lib, a, b, out), out dtypes ("f" float32, "l" int64); a tuple for several results)
CASES = {
    "add": (lambda m, a, b, o: m.add(a, b, alpha=2, out=o), "f"),
    "mul": (lambda m, a, b, o: m.mul(a, b, out=o), "f"),
    "div_floor": (lambda m, a, b, o: m.div(a, b, rounding_mode="floor", out=o), "f"),
    "matmul": (lambda m, a, b, o: m.matmul(a, b.T, out=o), "f"),
    "mm": (lambda m, a, b, o: m.mm(a.T, b, out=o), "f"),
    "cat": (lambda m, a, b, o: m.cat([a, b], 1, out=o), "f"),
    "stack": (lambda m, a, b, o: m.stack([a, b], out=o), "f"),
    "sum_dim": (lambda m, a, b, o: m.sum(a, 1, out=o), "f"),
    "mean": (lambda m, a, b, o: m.mean(a, 0, keepdim=True, out=o), "f"),
    "exp": (lambda m, a, b, o: m.exp(a, out=o), "f"),
    "clamp": (lambda m, a, b, o: m.clamp(a, -1.0, 1.0, out=o), "f"),
    "where": (lambda m, a, b, o: m.where(a > b, a, b, out=o), "f"),
    "maximum": (lambda m, a, b, o: m.maximum(a, b, out=o), "f"),
    "cumsum": (lambda m, a, b, o: m.cumsum(a, 1, out=o), "f"),
    "softmax": (lambda m, a, b, o: m.softmax(a, 1, out=o), "f"),
    "argmax": (lambda m, a, b, o: m.argmax(a, 1, out=o), "l"),
    "sort": (lambda m, a, b, o: m.sort(a, 1, out=o), ("f", "l")),
    "max_dim": (lambda m, a, b, o: m.max(a, 0, out=o), ("f", "l")),
    "topk": (lambda m, a, b, o: m.topk(a, 2, out=o), ("f", "l")),
    "eq_into_float": (lambda m, a, b, o: m.eq(a, b, out=o), "f"),
    "zeros_int": (lambda m, a, b, o: m.zeros(2, 3, out=o), "l"),
    "full": (lambda m, a, b, o: m.full((2, 2), 1.5, out=o), "f"),
    "arange": (lambda m, a, b, o: m.arange(1, 7, 2, out=o), "f"),
    "linspace": (lambda m, a, b, o: m.linspace(0, 1, 5, out=o), "f"),
    "eye": (lambda m, a, b, o: m.eye(3, 2, out=o), "f"),
}


def _empty(lib, kind, shape=(0,)):
    return lib.empty(*shape, dtype=lib.float32 if kind == "f" else lib.int64)


def _outs(lib, kinds, shape=(0,)):
    return tuple(_empty(lib, k, shape) for k in kinds) if isinstance(kinds, tuple) else _empty(lib, kinds, shape)


def _run(lib, name, shape=(0,)):
    call, kinds = CASES[name]
    out = _outs(lib, kinds, shape)
    got = call(lib, lib.tensor(A), lib.tensor(B), out)
    return out, got


@pytest.mark.parametrize("name", sorted(CASES))
def test_out_gets_torchs_values_and_is_returned(name):
    (t_out, t_got), (m_out, m_got) = _run(torch, name), _run(tw, name)
    t_outs = t_out if isinstance(t_out, tuple) else (t_out,)
    m_outs = m_out if isinstance(m_out, tuple) else (m_out,)
    m_gots = tuple(m_got) if isinstance(m_out, tuple) else (m_got,)
    for o, g in zip(m_outs, m_gots):
        assert g is o
    for t, m in zip(t_outs, m_outs):
        assert tuple(m.shape) == tuple(t.shape)
        assert str(m.dtype).split(".")[-1] == str(t.dtype).split(".")[-1]
        np.testing.assert_allclose(m.numpy(), t.numpy(), rtol=1e-6)
    if isinstance(t_got, tuple):  # torch's named tuple of the out variant (sort_out): the same fields
        assert (m_got.values is m_outs[0], m_got.indices is m_outs[1]) == (True, True)
        np.testing.assert_allclose(m_got.values.numpy(), t_got.values.numpy())


def test_an_out_with_elements_of_another_shape_is_resized_with_torchs_warning():
    for lib in (torch, tw):
        out = lib.zeros(5)
        with pytest.warns(UserWarning, match="An output with one or more elements was resized"):
            lib.add(lib.ones(2, 2), 1, out=out)
        assert tuple(out.shape) == (2, 2) and out.sum().item() == 8
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            lib.mul(lib.ones(3), 2, out=lib.empty(0))  # an empty out is resized silently


def test_an_out_that_is_an_argument_gets_the_values_from_before():
    for lib in (torch, tw):
        a = lib.tensor([1.0, 2.0, 3.0])
        lib.add(a, a.flip(0), out=a)
        assert a.tolist() == [4.0, 4.0, 4.0]


@pytest.mark.parametrize("case", ["autograd", "cast", "tuple"])
def test_out_refusals_as_torchs(case):
    for lib in (torch, tw):
        x = lib.tensor([1.5, 2.5], requires_grad=case == "autograd")
        if case == "autograd":
            with pytest.raises(RuntimeError, match="don't support automatic differentiation"):
                lib.mul(x, 2, out=lib.empty(2))
            with lib.no_grad():
                lib.mul(x, 2, out=lib.empty(2))  # under no_grad it is allowed
        elif case == "cast":
            with pytest.raises(RuntimeError, match="result type Float can't be cast to the desired output type Long"):
                lib.mul(x, 2, out=lib.empty(2, dtype=lib.int64))
            with pytest.raises(RuntimeError, match="does not match dtype of out parameter"):
                lib.zeros(2, dtype=lib.float32, out=lib.empty(0, dtype=lib.int64))
        else:
            with pytest.raises(TypeError):
                lib.sort(x, out=lib.empty(2))


@pytest.mark.cuda
@pytest.mark.parametrize("name", ["add", "matmul", "sum_dim", "sort", "softmax", "zeros_int", "arange"])
def test_out_on_cuda_matches_the_cpu(name):
    call, kinds = CASES[name]
    results = []
    for device in ("cpu", "cuda"):
        out = tuple(tw.empty(0, dtype=tw.float32 if k == "f" else tw.int64, device=device) for k in kinds) \
            if isinstance(kinds, tuple) else tw.empty(0, dtype=tw.float32 if kinds == "f" else tw.int64, device=device)
        got = call(tw, tw.tensor(A, device=device), tw.tensor(B, device=device), out)
        outs = out if isinstance(out, tuple) else (out,)
        assert all(o.device.type == device for o in outs)
        assert (tuple(got) if isinstance(out, tuple) else (got,))[0] is outs[0]
        results.append([o.cpu().numpy() for o in outs])
    for c, g in zip(*results):
        np.testing.assert_allclose(g, c, rtol=1e-5, atol=1e-6)

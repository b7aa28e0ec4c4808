"""Python numbers passed to compiled functions: the first call specialises a number, a second value makes it dynamic
(read at run time: no recompile for later values), as torch.compile does for ints and floats; bools stay
specialised; a number used as a shape, an index or in Python control flow is specialised again. Every value gives
what eager gives, dtype and bits."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import tilewise as tw

FLOATS = [0.5 + 0.37 * k for k in range(20)]
INTS = [k - 7 for k in range(20)]


def _same(compiled, eager) -> None:
    """Equal dtype, shape and bits (NaN equal to NaN)."""
    assert compiled.dtype == eager.dtype and compiled.shape == eager.shape
    a, b = compiled.detach().numpy(), eager.detach().numpy()
    assert a.tobytes() == b.tobytes(), (a, b)


@pytest.mark.parametrize("values", [FLOATS, INTS], ids=["float", "int"])
def test_twenty_values_compile_at_most_twice_and_match_eager(values):
    def f(x, s):
        return x * s + (s * 2 - 1) * (x * x)

    cf = tw.compile(f)
    x = tw.randn(16)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        for s in values:
            _same(cf(x, s), f(x, s))
    assert len(cf.variants) == 2  # the first value specialised, then one variant for every value
    assert list(cf.dynamic.values()) == ["s"] and _reads_a_number(cf.variants[1])


def test_torch_also_compiles_twice_for_a_float_and_an_int():
    """The choice follows torch 2.13: its first call specialises, its second makes the number dynamic."""
    for values in (FLOATS[:6], INTS[:6]):
        torch._dynamo.reset()
        frames: list = []

        def backend(gm, inputs, frames=frames):
            frames.append(gm)
            return gm.forward

        f = torch.compile(lambda x, s: x * s, backend=backend)
        for s in values:
            f(torch.ones(3), s)
        assert len(frames) == 2


_DTYPES = ["float16", "bfloat16", "float32", "float64", "int32", "int64", "uint8", "bool"]
_OPERATIONS = {
    "x*s": lambda x, s: x * s, "s*x": lambda x, s: s * x, "x+s": lambda x, s: x + s, "s+x": lambda x, s: s + x,
    "x-s": lambda x, s: x - s, "s-x": lambda x, s: s - x, "x/s": lambda x, s: x / s, "s/x": lambda x, s: s / x,
    "derived": lambda x, s: x * (s * 3 - 0.25) + (1 - s) / 7,
    "int-derived": lambda x, s: x * (-s + 2) - abs(s) * 2,
}


def _operand(dtype: str):
    values = tw.tensor([0.1, -2.7, 3.3, 1e-3, 65.5, 0.0, 7.0, -0.4])
    if dtype == "bool":
        return values > 0
    if dtype == "uint8":
        return values.abs().to(tw.uint8)
    return values.to(getattr(tw, dtype))


def _torch(x):
    if x.dtype == tw.bfloat16:
        return torch.from_numpy(x.float().numpy()).to(torch.bfloat16)
    return torch.from_numpy(x.numpy())


@pytest.mark.parametrize("kind", ["float", "int"])
@pytest.mark.parametrize("operation", list(_OPERATIONS))
@pytest.mark.parametrize("dtype", _DTYPES)
def test_a_dynamic_number_promotes_as_a_python_number(dtype, operation, kind):
    fn = _OPERATIONS[operation]
    x = _operand(dtype)
    values = [0.1, 1 / 3, 2.5, -1e-5, 70000.5] if kind == "float" else [3, -2, 5, 70001, 1]
    try:
        fn(x, values[0])
    except RuntimeError:  # eager refuses it (bool subtraction): so does the compiled function, for every value
        cf = tw.compile(fn)
        for s in values:
            with pytest.raises(RuntimeError):
                cf(x, s)
        return
    cf = tw.compile(fn)
    for s in values:
        out = cf(x, s)
        _same(out, fn(x, s))
        reference = fn(_torch(x), s)
        assert str(out.dtype).split(".")[-1] == str(reference.dtype).split(".")[-1]
    assert len(cf.variants) == 2 and _reads_a_number(cf.variants[-1])


def _reads_a_number(variant) -> bool:
    """Whether a variant's program reads a number argument at run time (a graph input made from it)."""
    return any(source.kind == "number" for source in variant.entries)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_a_loss_scale_on_a_0_dim_loss_keeps_its_dtype(dtype):
    def f(x, scale):
        return x.max() * scale

    cf = tw.compile(f)
    x = _operand(dtype)
    for scale in [1024.0, 0.125, 3.3, 65504.0 * 2]:
        _same(cf(x, scale), f(x, scale))


@pytest.mark.filterwarnings("ignore:tilewise.compile. f reached the recompile limit")
def test_a_number_used_as_a_shape_index_or_in_control_flow_is_right_for_every_value():
    def f(x, n):
        out = x[n % 8] * tw.ones(n).sum()
        if n > 4:
            out = out * 2
        for k in range(n % 3):
            out = out + k
        return out + x.view(-1, 2)[n % 4].sum() * n

    cf = tw.compile(f)
    x = tw.randn(8)
    for n in range(1, 12):
        _same(cf(x, n), f(x, n))
    assert "n" not in cf.dynamic.values()  # specialised again: each value is guarded by value


def test_a_number_the_function_needs_as_a_value_stays_right():
    def f(x, s):
        return x.clamp(min=s) + tw.full((8,), s) + tw.nn.functional.dropout(x, p=s / 10, training=False) + int(s)

    cf = tw.compile(f)
    x = tw.randn(8)
    for s in [0.5, 1.5, 2.5, 3.5]:
        _same(cf(x, s), f(x, s))


def test_a_derived_number_used_as_a_value_specialises():
    def f(x, s):
        t = s * 2
        return x * t if t > 3 else x - t

    cf = tw.compile(f)
    x = tw.randn(4)
    for s in [1.0, 2.0, 1.25, 2.25, 0.5]:
        _same(cf(x, s), f(x, s))


def test_bools_stay_specialised():
    def f(x, flag):
        return x * 2 if flag else x * flag

    cf = tw.compile(f)
    x = tw.randn(4)
    for flag in [True, False, True, False]:
        _same(cf(x, flag), f(x, flag))
    assert len(cf.variants) == 2 and not cf.dynamic


def test_an_int_that_becomes_a_float_is_dynamic_as_a_float():
    def f(x, s):
        return x * s

    cf = tw.compile(f)
    x = tw.randn(4, dtype=tw.float16)
    for s in [1, 2, 2.5, 3.5, 4]:  # the int after the floats misses the float variant and compiles its own
        _same(cf(x, s), f(x, s))


def test_numbers_in_lists_tuples_and_dicts_are_dynamic_and_the_arguments_stay_as_given():
    def f(x, scales, pair, options):
        return x * scales[0] + pair[1] * x - options["shift"]

    cf = tw.compile(f)
    x = tw.randn(6)
    for k in range(8):
        scales, pair, options = [0.5 + k], (k, 0.25 * k), {"shift": 1.5 * k}
        _same(cf(x, scales, pair, options), f(x, scales, pair, options))
        assert scales == [0.5 + k] and options == {"shift": 1.5 * k}  # the caller's own containers, as given
        assert all(type(v) is float for v in (scales[0], options["shift"]))
    assert len(cf.variants) == 2
    assert sorted(cf.dynamic.values()) == ["options", "pair[0]", "pair[1]", "scales"]


def test_a_dynamic_number_the_function_returns_is_its_value():
    def f(x, s):
        return x * s, s * 2, [s]

    cf = tw.compile(f)
    x = tw.randn(3)
    for s in [1.5, 2.5, 3.5]:
        out, twice, listed = cf(x, s)
        assert twice == s * 2 and type(twice) is float and listed == [s] and type(listed[0]) is float
        _same(out, x * s)


def test_division_by_a_dynamic_zero_raises_as_python_does():
    def f(x, s):
        return x * (1 / s)

    cf = tw.compile(f)
    x = tw.randn(3)
    for s in [2.0, 4.0, 8.0]:
        _same(cf(x, s), f(x, s))
    with pytest.raises(ZeroDivisionError):
        cf(x, 0.0)
    _same(cf(x, 16.0), f(x, 16.0))


def test_backward_through_a_dynamic_float():
    def f(x, w, s):
        return ((x * s + w / s) ** 2).sum()

    cf = tw.compile(f)
    x = tw.randn(5)
    for s in [0.5, 1.5, 2.5, -3.0]:
        grads = []
        for fn in (cf, f):
            w = tw.randn(5, generator=tw.Generator().manual_seed(1)).requires_grad_()
            loss = fn(x, w, s)
            loss.backward()
            grads.append((loss, w.grad))
        np.testing.assert_allclose(grads[0][0].item(), grads[1][0].item(), rtol=1e-6)
        np.testing.assert_allclose(grads[0][1].numpy(), grads[1][1].numpy(), rtol=1e-6)
    assert len(cf.variants) == 2


def _train(compiled: bool, steps: int = 12):
    tw.manual_seed(0)
    x, y = tw.randn(32, 10), tw.randint(0, 3, (32,))
    model = tw.nn.Sequential(tw.nn.Linear(10, 16), tw.nn.ReLU(), tw.nn.Linear(16, 3))
    opt = tw.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    def step(x, y, scale):
        opt.zero_grad()
        loss = tw.nn.functional.cross_entropy(model(x), y)
        (loss * scale).backward()
        for p in model.parameters():
            p.grad.mul_(1 / scale)
        opt.step()
        return loss

    f = tw.compile(step) if compiled else step
    losses = [float(f(x, y, 2.0 ** (k % 5) * 0.75)) for k in range(steps)]
    return np.array(losses), [p.detach().numpy().copy() for p in model.parameters()], f


def test_a_training_step_with_a_changing_loss_scale_compiles_a_few_times_and_trains_as_eager():
    eager_losses, eager_params, _ = _train(False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        losses, params, f = _train(True)
    assert len(f.variants) <= 3  # the first step (momentum buffers made), its next value, then every value
    np.testing.assert_allclose(losses, eager_losses, rtol=1e-5, atol=1e-6)
    for p, q in zip(params, eager_params):
        np.testing.assert_allclose(p, q, rtol=1e-5, atol=1e-6)

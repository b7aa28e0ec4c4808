"""``out=`` against torch: the values, the object returned, resizing, and torch's refusals."""

import warnings

import numpy as np
import pytest
import torch
from opinfo import _build, _materialise
from test_ops import OPINFOS

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
    # forms whose siblings torch refuses out= (NO_OUT below): argsort with stable=, prod and median with a dim
    "argsort_stable": (lambda m, a, b, o: m.argsort(a, stable=True, out=o), "l"),
    "sum_dim_none": (lambda m, a, b, o: m.sum(a, None, out=o), "f"),
    "prod_dim": (lambda m, a, b, o: m.prod(a, 1, out=o), "f"),
    "median_dim": (lambda m, a, b, o: m.median(a, 0, out=o), ("f", "l")),
    "where_tensors": (lambda m, a, b, o: m.where(a > b, a, b, out=o), "f"),
    "F.gelu": (lambda m, a, b, o: m.nn.functional.gelu(a, out=o), "f"),  # F's own aten binding
    "F.normalize": (lambda m, a, b, o: m.nn.functional.normalize(a, out=o), "f"),
    "range": (lambda m, a, b, o: m.range(1, 4, out=o), "f"),
    "fft.fftfreq": (lambda m, a, b, o: m.fft.fftfreq(5, out=o), "f"),
    "fft.rfftfreq": (lambda m, a, b, o: m.fft.rfftfreq(6, 0.5, out=o), "f"),
}


def _empty(lib, kind, shape=(0,)):
    return lib.empty(*shape, dtype=lib.float32 if kind == "f" else lib.int64)


def _outs(lib, kinds, shape=(0,)):
    return tuple(_empty(lib, k, shape) for k in kinds) if isinstance(kinds, tuple) else _empty(lib, kinds, shape)


def _run(lib, name, shape=(0,)):
    call, kinds = CASES[name]
    out = _outs(lib, kinds, shape)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # range's deprecation
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


# Forms torch gives no out= (its argument parser refuses the keyword): tilewise refuses it too, before computing.
# name: call(lib, a, b, **out); the call without out= must work in both
NO_OUT = {
    "argsort": lambda m, a, b, **o: m.argsort(a, 1, **o),
    "einsum": lambda m, a, b, **o: m.einsum("ij,kj->ik", a, b, **o),
    "var_mean": lambda m, a, b, **o: m.var_mean(a, 1, **o),
    "std_mean": lambda m, a, b, **o: m.std_mean(a, **o),
    "sum": lambda m, a, b, **o: m.sum(a, **o),  # torch's sum takes out= only with dim given
    "prod": lambda m, a, b, **o: m.prod(a, **o),
    "median": lambda m, a, b, **o: m.median(a, **o),  # median(dim) takes it
    "unique": lambda m, a, b, **o: m.unique(a, **o),
    "flip": lambda m, a, b, **o: m.flip(a, [0], **o),
    "isnan": lambda m, a, b, **o: m.isnan(a, **o),
    "clone": lambda m, a, b, **o: m.clone(a, **o),
    "relu": lambda m, a, b, **o: m.relu(a, **o),
    "cdist": lambda m, a, b, **o: m.cdist(a, b, **o),
    "split": lambda m, a, b, **o: m.split(a, 1, **o),
    "meshgrid": lambda m, a, b, **o: m.meshgrid(a[0], b[0], indexing="ij", **o),
    "repeat_interleave": lambda m, a, b, **o: m.repeat_interleave(a, 2, **o),
    "conv1d": lambda m, a, b, **o: m.conv1d(a[None], b[:, :2, None], **o),
    "layer_norm": lambda m, a, b, **o: m.layer_norm(a, [3], **o),
    "matrix_exp": lambda m, a, b, **o: m.matrix_exp(a[:, :2], **o),
    "linalg.matrix_exp": lambda m, a, b, **o: m.linalg.matrix_exp(a[:, :2], **o),
    "fft.fftshift": lambda m, a, b, **o: m.fft.fftshift(a, **o),
    # torch.nn.functional's functions are Python functions without out= (torch.softmax has it, F.softmax not)
    "F.softmax": lambda m, a, b, **o: m.nn.functional.softmax(a, 1, **o),
    "F.relu": lambda m, a, b, **o: m.nn.functional.relu(a, **o),
    "F.threshold": lambda m, a, b, **o: m.nn.functional.threshold(a, 0.5, 0.0, **o),
    "F.silu": lambda m, a, b, **o: m.nn.functional.silu(a, **o),
    "F.conv1d": lambda m, a, b, **o: m.nn.functional.conv1d(a[None], b[:, :2, None], **o),
    "F.mse_loss": lambda m, a, b, **o: m.nn.functional.mse_loss(a, b, **o),
    # no Tensor method takes out=
    "Tensor.add": lambda m, a, b, **o: a.add(b, **o),
    "Tensor.sum": lambda m, a, b, **o: a.sum(1, **o),
    "Tensor.matmul": lambda m, a, b, **o: a.matmul(b.T, **o),
    "Tensor.sort": lambda m, a, b, **o: a.sort(1, **o),
}


@pytest.mark.parametrize("name", sorted(NO_OUT))
def test_out_is_refused_where_torch_has_no_out_form(name):
    call = NO_OUT[name]
    messages = []
    for lib in (torch, tw):
        a, b = lib.tensor(A), lib.tensor(B)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # meshgrid's indexing warning
            call(lib, a, b)  # the call itself is valid
        with pytest.raises(TypeError) as refused:
            call(lib, a, b, out=lib.empty(0))
        messages.append(str(refused.value))
    ours = messages[1]
    assert name.rpartition(".")[2] in ours
    # torch's parser lists the signatures of sort and argsort, which tilewise's refusal repeats (first lines)
    assert "unexpected keyword argument 'out'" in ours or ours.splitlines()[0] == messages[0].splitlines()[0]


@pytest.mark.parametrize("lib", [torch, tw], ids=["torch", "tilewise"])
def test_random_factories_take_out_as_torchs(lib):
    perm = lib.empty(0, dtype=lib.int64)
    assert lib.randperm(6, out=perm) is perm and sorted(perm.tolist()) == list(range(6))
    mean = lib.zeros(2, 3)
    for call in (lambda o: lib.normal(mean, 1.0, out=o), lambda o: lib.normal(0.0, mean + 1, out=o),
                 lambda o: lib.normal(mean, mean + 1, out=o), lambda o: lib.normal(0.0, 1.0, (2, 3), out=o)):
        out = lib.empty(2, 3)  # torch's normal(Tensor, float, out=) fails on an out of another shape
        assert call(out) is out and tuple(out.shape) == (2, 3) and out.dtype == lib.float32


def _sweep_arguments(info, sample, lib, arrays_and_args):
    args, kwargs, arrays = arrays_and_args
    tensor = lambda k: lib.from_numpy(arrays[k].copy())  # noqa: E731
    return _build(args, arrays, tensor, lib), {k: _build(v, arrays, tensor, lib) for k, v in kwargs.items()}


def _empty_outs(lib, result):
    """Empty tensors of ``result``'s dtypes (a tuple of them for several results), or None where it has others."""
    results = tuple(result) if isinstance(result, (tuple, list)) else (result,)
    if not results or not all(isinstance(r, torch.Tensor) for r in results):
        return None
    outs = tuple(lib.empty(0, dtype=getattr(lib, str(r.dtype).removeprefix("torch."))) for r in results)
    return outs if isinstance(result, (tuple, list)) else outs[0]


def _takes_out(fn, args, kwargs, out) -> bool:
    try:
        fn(*args, **kwargs, out=out)
    except TypeError:
        return False
    return True


SWEPT = [info for info in OPINFOS if info.call in ("function", "F") and info.reference is None]


@pytest.mark.parametrize("info", SWEPT, ids=[f"{'F.' if i.call == 'F' else ''}{i.name}" for i in SWEPT])
def test_out_is_taken_exactly_where_torch_takes_it(info):
    """Every function of the op table, on each of its samples: tilewise takes out= where torch does, and refuses it
    (a TypeError) where torch's has no out= form."""
    import torch.nn.functional as TF

    import tilewise.nn.functional as F

    ours, theirs = info.resolve(tw, F), info.resolve(torch, TF)
    for sample in info.samples():
        made: list = []
        rng = np.random.default_rng(0)
        args = _materialise(sample.args, rng, "float32", made)
        kwargs = {k: _materialise(v, rng, "float32", made) for k, v in sample.kwargs.items()}
        arrays = [m[0] for m in made]
        t_args, t_kwargs = _sweep_arguments(info, sample, torch, (args, kwargs, arrays))
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                expected = theirs(*t_args, **t_kwargs)
        except Exception:  # a sample of an error case: nothing to write into
            continue
        outs = _empty_outs(torch, expected)
        if outs is None:
            continue
        m_args, m_kwargs = _sweep_arguments(info, sample, tw, (args, kwargs, arrays))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch_takes = _takes_out(theirs, t_args, t_kwargs, outs)
            ours_takes = _takes_out(ours, m_args, m_kwargs, _empty_outs(tw, expected))
        assert ours_takes == torch_takes, f"{info.name}[{sample.name or sample.args}]: torch " \
            f"{'takes' if torch_takes else 'refuses'} out=, tilewise {'takes' if ours_takes else 'refuses'} it"

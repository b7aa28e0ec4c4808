"""tilewise.func.vmap against torch.func.vmap: every operator of the test table batched over each tensor argument
in turn and over all of them, nested vmap, in_dims/out_dims pytrees, chunk_size, randomness, and the errors."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as TF
from opinfo import T, _build, _materialise, to_numpy, tolerances
from test_ops import OPINFOS

import tilewise as tw
import tilewise.nn.functional as F
from tilewise.func import vmap
from tilewise.ops.batching import _WARNED

BATCH = 3


def _leaves(value, out: list):
    if isinstance(value, tuple) and len(value) == 2 and value[0] == "__tensor__":
        out.append(value[1])
    elif isinstance(value, (list, tuple)):
        for v in value:
            _leaves(v, out)
    return out


def _batched_case(info, sample, dtype: str, seed: int):
    """The sample's placeholders as arrays with a leading batch of BATCH examples (each drawn like the sample's)."""
    rng = np.random.default_rng(seed)
    made: list = []
    args = _materialise(sample.args, rng, dtype, made)
    kwargs = {k: _materialise(v, rng, dtype, made) for k, v in sample.kwargs.items()}
    examples = [np.stack([spec.make(rng, dtype) for _ in range(BATCH)]) for _, spec in made]
    singles = [arr for arr, _ in made]
    return args, kwargs, examples, singles


def _per_example_fn(info, args, kwargs, lib, functional, tensor_ids):
    fn = info.resolve(lib, functional)

    def call(*tensors):
        by_id = dict(zip(tensor_ids, tensors))
        a = _build(args, None, lambda k: by_id[k], lib)
        kw = {k: _build(v, None, lambda i: by_id[i], lib) for k, v in kwargs.items()}
        return fn(*a, **kw)

    return call


def _compare(actual, expected, where, rtol, atol):
    exp = list(expected) if isinstance(expected, (tuple, list)) else [expected]
    act = list(actual) if isinstance(actual, (tuple, list)) else [actual]
    assert len(exp) == len(act), f"{where}: {len(act)} outputs, torch gives {len(exp)}"
    for e, a in zip(exp, act):
        if not isinstance(e, torch.Tensor):
            continue
        assert tuple(a.shape) == tuple(e.shape), f"{where}: shape {tuple(a.shape)} != torch {tuple(e.shape)}"
        assert a.dtype.name == str(e.dtype).removeprefix("torch."), f"{where}: dtype {a.dtype} != torch {e.dtype}"
        np.testing.assert_allclose(to_numpy(a), to_numpy(e), rtol=rtol, atol=atol, equal_nan=True,
                                   err_msg=f"{where}: mismatch")


def _in_dims_variants(n: int):
    """All tensors batched, then each one alone (out_dims are tested apart: torch.func.vmap returns garbage
    for an unbatched output with a negative out_dim)."""
    yield (0,) * n, 0
    if n > 1:
        for k in range(n):
            yield tuple(0 if j == k else None for j in range(n)), 0


RANDOM = {"dropout", "bernoulli", "multinomial", "rand_like", "randn_like", "randint_like", "normal", "rrelu",
          "gumbel_softmax", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout", "feature_alpha_dropout",
          "randperm", "rand", "randn", "randint"}


# operators where torch.func.vmap itself departs from a loop over the examples: compared with that loop instead
TORCH_VMAP_BUGS = {
    "index_fill": "a batched 0-dim fill value: every example is filled with the last example's value",
    "linalg.qr": "mode='r': the empty Q comes back without the batch dim",
    "roll": "0-dim examples: the batch itself is rolled, where each example's roll is the example",
    "index_select": "a 0-dim index: every column comes back, where each example selects one",
    "aminmax": "keepdim without dim: a dim of each example is dropped",
}

# operators that vmap runs one example at a time, with torch's performance warning: not differentiable, and their
# output's shape or bins come from the values (tests/test_op_rules.py lists those without any rule)
LOOPING = {"bincount", "histc", "histogram", "nonzero_static", "unravel_index",
           "istft"}  # its window-overlap check (NOLA) reads the envelope's minimum in Python, as torch's does


def _torch_loop(fn, inputs, in_dims):
    outs = [fn(*[t[b] if d == 0 else t for t, d in zip(inputs, in_dims)]) for b in range(BATCH)]
    if isinstance(outs[0], torch.Tensor):
        return torch.stack(outs)
    return tuple(torch.stack(list(parts)) for parts in zip(*outs))


def check_vmap(info, sample, dtype: str, seed: int = 0):
    args, kwargs, examples, singles = _batched_case(info, sample, dtype, seed)
    ids = list(range(len(examples)))
    rtol, atol = tolerances(dtype, info)
    rtol, atol = rtol * 10, atol * 10  # a batched kernel may sum in another order
    th_fn = _per_example_fn(info, args, kwargs, torch, TF, ids)
    tw_fn = _per_example_fn(info, args, kwargs, tw, F, ids)
    compared = 0
    for in_dims, out_dims in _in_dims_variants(len(ids)):
        th_in = [torch.from_numpy(e.copy() if d == 0 else s.copy()) for e, s, d in zip(examples, singles, in_dims)]
        tw_in = [tw.from_numpy(e.copy() if d == 0 else s.copy()) for e, s, d in zip(examples, singles, in_dims)]
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                if info.name in TORCH_VMAP_BUGS:
                    expected = _torch_loop(th_fn, th_in, in_dims)
                else:
                    expected = torch.func.vmap(th_fn, in_dims=in_dims, out_dims=out_dims)(*th_in)
        except Exception:  # noqa: BLE001 — torch refuses this case (a data-dependent op, a non-tensor output)
            continue
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            _WARNED.clear()  # the loop warns once per operator and process
            actual = vmap(tw_fn, in_dims=in_dims, out_dims=out_dims)(*tw_in)
        looped = [str(w.message) for w in caught if "performance drop" in str(w.message)]
        assert not looped or info.name in LOOPING, f"{info.name}: runs one example at a time: {looped[0]}"
        _compare(actual, expected, f"{info.name}[{sample.name or sample.args}] in_dims={in_dims}", rtol, atol)
        compared += 1
    return compared


# operators vmap refuses with a clear error, where torch's run: the LU functions read their row swaps on the host to
# build the permutation (test_lu_functions_refuse_vmap_by_name below); eig's eigenvectors are compared up to phase
# in tests/test_linalg.py, which this comparison cannot do
NOT_BATCHED = {"linalg.lu", "lu_unpack", "linalg.lu_solve", "lu_solve", "linalg.eig"}

CASES = [(info, s) for info in OPINFOS if info.name not in RANDOM and info.name not in NOT_BATCHED
         for s in info.samples()[:1]
         if _leaves(_materialise(s.args, np.random.default_rng(0), "float64", []), [])
         or any(isinstance(v, T) for v in s.kwargs.values())]


@pytest.mark.parametrize("info,sample", CASES, ids=[f"{i.name}-{k}" for k, (i, _) in enumerate(CASES)])
def test_vmap_matches_torch(info, sample):
    check_vmap(info, sample, info.dtypes[-1] if "float64" in info.dtypes else info.dtypes[0])


EVERY_SAMPLE = [info for info in OPINFOS if info.name not in RANDOM and info.name not in NOT_BATCHED
                and len(info.samples()) > 1]


def test_lu_functions_refuse_vmap_by_name():
    a = tw.tensor(np.random.default_rng(0).standard_normal((3, 4, 4)) + 3 * np.eye(4))
    with pytest.raises(RuntimeError, match="lu_unpack: the row swaps .* are read on the host"):
        vmap(tw.linalg.lu)(a)
    factors, pivots = tw.linalg.lu_factor(a)  # the factorization itself batches
    p, lower, upper = tw.lu_unpack(factors, pivots)
    np.testing.assert_allclose((p @ lower @ upper).numpy(), a.numpy(), atol=1e-12)


@pytest.mark.slow
@pytest.mark.parametrize("info", EVERY_SAMPLE, ids=[f"{i.name}-{k}" for k, i in enumerate(EVERY_SAMPLE)])
def test_vmap_matches_torch_on_every_sample(info):
    """The samples after the first (the test above runs the first), each batched as it is there."""
    for sample in info.samples()[1:]:
        check_vmap(info, sample, info.dtypes[-1] if "float64" in info.dtypes else info.dtypes[0])


# ---------------------------------------------------------------- transforms and arguments

def test_the_top_level_vmap_is_func_vmap_as_in_torch():
    x = np.random.default_rng(0).standard_normal((3, 4))
    np.testing.assert_allclose(tw.vmap(lambda r: r.softmax(0))(tw.tensor(x)).numpy(),
                               torch.vmap(lambda r: r.softmax(0))(torch.tensor(x)).numpy(), rtol=1e-12)
    assert tw.vmap is tw.func.vmap and torch.vmap is torch.func.vmap


def test_nested_vmap_matches_torch():
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal((4, 6)), rng.standard_normal((6, 5))
    def f(a, b):
        return (a * b).sum(-1).softmax(0)
    exp = torch.func.vmap(torch.func.vmap(f, in_dims=(0, None)), in_dims=(None, 1))(torch.tensor(x), torch.tensor(y))
    act = vmap(vmap(f, in_dims=(0, None)), in_dims=(None, 1))(tw.tensor(x), tw.tensor(y))
    np.testing.assert_allclose(act.numpy(), exp.numpy(), rtol=1e-10)


def test_in_dims_and_out_dims_pytrees():
    x, b = np.random.default_rng(2).standard_normal((4, 3)), np.arange(4.0)

    def f(d, scale):
        return {"out": d["x"] * d["b"] * scale, "aux": (d["x"].sum(), d["b"])}

    exp = torch.func.vmap(f, in_dims=({"x": 1, "b": None}, None), out_dims={"out": 1, "aux": (0, None)})(
        {"x": torch.tensor(x), "b": torch.tensor(b)}, 2.0)
    act = vmap(f, in_dims=({"x": 1, "b": None}, None), out_dims={"out": 1, "aux": (0, None)})(
        {"x": tw.tensor(x), "b": tw.tensor(b)}, 2.0)
    np.testing.assert_allclose(act["out"].numpy(), exp["out"].numpy())
    np.testing.assert_allclose(act["aux"][0].numpy(), exp["aux"][0].numpy())
    np.testing.assert_allclose(act["aux"][1].numpy(), exp["aux"][1].numpy())


@pytest.mark.parametrize("out_dims", [0, 1, -1, (2, 0)])
def test_out_dims_place_the_batch(out_dims):
    x = np.random.default_rng(7).standard_normal((4, 2, 3))

    def f(a):
        return a.exp(), a.sum(0)

    for a, e in zip(vmap(f, out_dims=out_dims)(tw.tensor(x)), torch.func.vmap(f, out_dims=out_dims)(torch.tensor(x))):
        np.testing.assert_allclose(a.numpy(), e.numpy())


def test_unbatched_output_is_expanded():
    x = tw.ones(4, 3)
    out = vmap(lambda a: tw.zeros(2))(x)
    assert out.shape == (4, 2)


@pytest.mark.parametrize("chunk_size", [1, 2, 3, 7, 100])
def test_chunk_size_gives_the_same_result(chunk_size):
    x = np.random.default_rng(3).standard_normal((7, 5))
    def f(a):
        return a.exp().unsqueeze(1) @ a.sin().unsqueeze(0), a.sum()

    exp = torch.func.vmap(f, chunk_size=chunk_size)(torch.tensor(x))
    act = vmap(f, chunk_size=chunk_size)(tw.tensor(x))
    for a, e in zip(act, exp):
        np.testing.assert_allclose(a.numpy(), e.numpy(), rtol=1e-12)


def test_randomness_modes():
    x = tw.ones(5, 1000)
    same = vmap(lambda a: a * tw.rand(1000), randomness="same")(x)
    assert (same == same[0]).all()
    different = vmap(lambda a: a * tw.rand(1000), randomness="different")(x)
    assert not (different == different[0]).all()
    drop = vmap(lambda a: tw.nn.functional.dropout(a, 0.5), randomness="different")(x)
    assert not (drop == drop[0]).all()
    with pytest.raises(RuntimeError, match="randomness error mode"):
        vmap(lambda a: a * tw.rand(1000))(x)
    with pytest.raises(RuntimeError, match="same randomness with a batched tensor input"):
        vmap(lambda a: tw.bernoulli(a * 0.5), randomness="same")(x)


def test_same_randomness_is_the_same_across_chunks():
    out = vmap(lambda a: a * tw.rand(10), randomness="same", chunk_size=2)(tw.ones(5, 10))
    assert (out == out[0]).all()


def test_in_place_on_batched_and_unbatched():
    x = np.random.default_rng(4).standard_normal((3, 4))
    def f(a):
        b = a.clone()
        b.add_(1).mul_(a)
        b[1:3] = 0
        return b
    np.testing.assert_allclose(vmap(f)(tw.tensor(x)).numpy(), torch.func.vmap(f)(torch.tensor(x)).numpy())
    with pytest.raises(RuntimeError, match="inplace arithmetic"):
        vmap(lambda a: tw.ones(4).add_(a))(tw.tensor(x))


# ---------------------------------------------------------------- gradients inside and through vmap

def _mlp_params(rng):
    return [rng.standard_normal((8, 5)), rng.standard_normal(8), rng.standard_normal((2, 8)), rng.standard_normal(2)]


def test_per_example_gradients_with_autograd_grad_inside_vmap():
    rng = np.random.default_rng(5)
    params = _mlp_params(rng)
    xs, ys = rng.standard_normal((6, 5)), rng.integers(0, 2, 6)
    tw_params = [tw.tensor(p, requires_grad=True) for p in params]

    def loss_grads(x, y):
        h = tw.nn.functional.linear(x, tw_params[0], tw_params[1]).tanh()
        out = tw.nn.functional.linear(h, tw_params[2], tw_params[3])
        loss = tw.nn.functional.cross_entropy(out.unsqueeze(0), y.unsqueeze(0))
        return tw.autograd.grad(loss, tw_params)

    grads = vmap(loss_grads)(tw.tensor(xs), tw.tensor(ys))
    th_params = {str(k): torch.tensor(p) for k, p in enumerate(params)}

    def th_loss(ps, x, y):
        h = TF.linear(x, ps["0"], ps["1"]).tanh()
        return TF.cross_entropy(TF.linear(h, ps["2"], ps["3"]).unsqueeze(0), y.unsqueeze(0))

    expected = torch.func.vmap(torch.func.grad(th_loss), in_dims=(None, 0, 0))(th_params, torch.tensor(xs),
                                                                               torch.tensor(ys))
    for k, g in enumerate(grads):
        np.testing.assert_allclose(g.numpy(), expected[str(k)].numpy(), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("case", ["masked_scatter", "quantile", "cat_legacy_empty", "sort_topk"])
def test_per_example_gradients_through_data_dependent_looking_operators(case):
    """vmap(grad) through operators whose meaning reads values (a mask's running count, ranks, sorted order):
    each batches without the per-example loop and gives torch.func's gradients."""
    rng = np.random.default_rng(9)
    xs, ss = rng.standard_normal((4, 3, 5)), rng.standard_normal((4, 15))
    masks = rng.random((4, 3, 5)) < 0.5

    def loss(lib, x, s, m):
        if case == "masked_scatter":
            y = x.masked_scatter(m, s)
        elif case == "quantile":
            y = lib.quantile(x, lib.tensor([0.25, 0.9], dtype=x.dtype), dim=1)
        elif case == "cat_legacy_empty":
            y = lib.cat([x, s[:0], s.reshape(3, 5)])
        else:
            y = x.sort(1, descending=True)[0] * x.topk(2, 0)[0].sum()
        return (y * y.cos()).sum()

    def ours(x, s, m):
        x, s = x.requires_grad_(), s.requires_grad_()
        return tw.autograd.grad(loss(tw, x, s, m), (x, s), allow_unused=True, materialize_grads=True)

    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # the loop's performance warning would fail the test
        got = vmap(ours)(tw.tensor(xs), tw.tensor(ss), tw.tensor(masks))
    expected = torch.func.vmap(torch.func.grad(lambda x, s, m: loss(torch, x, s, m), argnums=(0, 1)))(
        torch.tensor(xs), torch.tensor(ss), torch.tensor(masks))
    for g, e in zip(got, expected):
        np.testing.assert_allclose(g.numpy(), e.numpy(), rtol=1e-10, atol=1e-12)


def test_per_example_gradients_example_agrees_with_its_loop():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "examples" / "per_example_gradients.py"
    spec = importlib.util.spec_from_file_location("per_example_gradients", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    params = example.make_params([5, 7, 7, 3], "cpu")
    xs, ys = tw.randn(8, 5), tw.randint(0, 3, (8,))
    batched = example.per_example_norms_vmap(params, xs, ys)
    looped = example.per_example_norms_loop(params, xs, ys)
    assert batched.shape == (8,)
    np.testing.assert_allclose(batched.numpy(), looped.numpy(), rtol=1e-5)


def test_jacobian_and_hessian_rows_from_vmap_over_autograd_grad():
    """The pattern jacrev builds on: vmap over vector-Jacobian products of one graph built outside vmap."""
    xn = np.random.default_rng(11).standard_normal(4)
    x = tw.tensor(xn, requires_grad=True)
    y = (x.sin() * x).softmax(0)
    jacobian = vmap(lambda v: tw.autograd.grad(y, x, v, retain_graph=True)[0])(tw.eye(4, dtype=tw.float64))
    gradient = tw.autograd.grad((x.sin() * x).sum(), x, create_graph=True)[0]
    hessian = vmap(lambda v: tw.autograd.grad(gradient, x, v, retain_graph=True)[0])(tw.eye(4, dtype=tw.float64))
    xt = torch.tensor(xn)
    expected_j = torch.autograd.functional.jacobian(lambda a: (a.sin() * a).softmax(0), xt)
    expected_h = torch.autograd.functional.hessian(lambda a: (a.sin() * a).sum(), xt)
    np.testing.assert_allclose(jacobian.numpy(), expected_j.numpy(), rtol=1e-10, atol=1e-14)
    np.testing.assert_allclose(hessian.numpy(), expected_h.numpy(), rtol=1e-10, atol=1e-14)


def test_backward_through_vmap_reaches_parameters_and_inputs():
    rng = np.random.default_rng(6)
    w, x = rng.standard_normal((4, 3)), rng.standard_normal((5, 3))
    tw_w, tw_x = tw.tensor(w, requires_grad=True), tw.tensor(x, requires_grad=True)
    th_w, th_x = torch.tensor(w, requires_grad=True), torch.tensor(x, requires_grad=True)
    vmap(lambda a: (tw_w @ a).tanh().sum())(tw_x).sum().backward()
    torch.func.vmap(lambda a: (th_w @ a).tanh().sum())(th_x).sum().backward()
    np.testing.assert_allclose(tw_w.grad.numpy(), th_w.grad.numpy(), rtol=1e-10)
    np.testing.assert_allclose(tw_x.grad.numpy(), th_x.grad.numpy(), rtol=1e-10)


# ---------------------------------------------------------------- errors, in torch's words

def _same_error(fn_tw, fn_th):
    with pytest.raises(Exception) as th_err:
        fn_th()
    with pytest.raises(type(th_err.value)) as tw_err:
        fn_tw()
    assert str(tw_err.value) == str(th_err.value)


X = np.ones((3, 4))


def _both(name, f_tw, f_th, **kwargs):
    return (lambda: vmap(f_tw, **kwargs)(tw.tensor(X)), lambda: torch.func.vmap(f_th, **kwargs)(torch.tensor(X)))


def test_error_item_and_data_dependent_control_flow():
    def item(t):
        return t.sum().item()

    def branch(t):
        return t if t.sum() > 0 else -t

    def numpy(t):
        return t.numpy()

    _same_error(*_both("item", item, item))
    _same_error(*_both("branch", branch, branch))
    _same_error(*_both("numpy", numpy, numpy))


def test_error_random_in_error_mode():
    _same_error(*_both("r", lambda t: t + tw.rand(4), lambda t: t + torch.rand(4)))


@pytest.mark.parametrize("kwargs", [dict(in_dims=2), dict(in_dims=(0, 0)), dict(in_dims=[0]), dict(in_dims=(0.5,)),
                                    dict(in_dims=None), dict(out_dims=(0, 0)), dict(chunk_size=0),
                                    dict(randomness="x")])
def test_error_bad_arguments(kwargs):
    def f(t):
        return t

    _same_error(lambda: vmap(f, **kwargs)(tw.tensor(X)), lambda: torch.func.vmap(f, **kwargs)(torch.tensor(X)))


def test_error_sizes_differ_and_no_input_batched():
    def f(a, b):
        return a + b

    _same_error(lambda: vmap(f)(tw.ones(3, 4), tw.ones(4, 4)), lambda: torch.func.vmap(f)(torch.ones(3, 4),
                                                                                           torch.ones(4, 4)))
    _same_error(lambda: vmap(f, in_dims=(None, None))(tw.ones(3), tw.ones(3)),
                lambda: torch.func.vmap(f, in_dims=(None, None))(torch.ones(3), torch.ones(3)))


def test_error_non_tensor_output_and_batched_output_with_out_dim_none():
    def three(t):
        return 3

    def same(t):
        return t

    _same_error(*_both("three", three, three))
    _same_error(*_both("same", same, same, out_dims=None))


def test_error_dynamic_shape():
    def nz(t):
        return t.nonzero()

    _same_error(*_both("nz", nz, nz))


def test_fallback_warns_once_naming_the_operator():
    from tilewise.ops import batching

    batching._WARNED.discard("histc")
    with pytest.warns(UserWarning, match="batching rule for histc"):
        out = vmap(lambda t: tw.histc(t, bins=4, min=0, max=2))(tw.tensor(X))
    assert out.shape == (3, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        vmap(lambda t: tw.histc(t, bins=4, min=0, max=2))(tw.tensor(X))


def test_printing_a_batched_tensor_as_torch():
    import contextlib
    import io

    def show(a):
        print(a)
        return a

    outputs = []
    for lib, fn in ((tw, vmap), (torch, torch.func.vmap)):
        buffer = io.StringIO()
        with contextlib.redirect_stdout(buffer):
            fn(show)(lib.ones(2, 3))
        outputs.append(buffer.getvalue())
    assert outputs[0] == outputs[1]


@pytest.mark.cuda
def test_per_example_gradients_on_cuda_match_the_cpu():
    rng = np.random.default_rng(8)
    params = [p.astype(np.float32) for p in _mlp_params(rng)]
    xs, ys = rng.standard_normal((6, 5)).astype(np.float32), rng.integers(0, 2, 6)

    def run(device):
        ps = [tw.tensor(p, device=device, requires_grad=True) for p in params]

        def loss_grads(x, y):
            h = tw.nn.functional.linear(x, ps[0], ps[1]).softmax(-1)
            out = tw.nn.functional.linear(h, ps[2], ps[3])
            return tw.autograd.grad(tw.nn.functional.cross_entropy(out.unsqueeze(0), y.unsqueeze(0)), ps)

        return [g.cpu().numpy() for g in vmap(loss_grads)(tw.tensor(xs, device=device), tw.tensor(ys, device=device))]

    for on_gpu, on_cpu in zip(run("cuda"), run("cpu")):
        np.testing.assert_allclose(on_gpu, on_cpu, rtol=1e-4, atol=1e-5)


@pytest.mark.cuda
def test_indexing_and_in_place_writes_batch_on_cuda():
    x = np.random.default_rng(9).standard_normal((4, 5, 3)).astype(np.float32)
    index = np.array([2, 0, 4])

    def f(a, i):
        b = a[i].clone()
        b[1] = a.sum(0)
        return b.flip(0)

    on_gpu = vmap(f, in_dims=(0, None))(tw.tensor(x, device="cuda"), tw.tensor(index, device="cuda"))
    expected = torch.func.vmap(f, in_dims=(0, None))(torch.tensor(x), torch.tensor(index))
    np.testing.assert_allclose(on_gpu.cpu().numpy(), expected.numpy(), rtol=1e-5, atol=1e-6)


def test_batch_norm_with_unbatched_running_stats_is_refused_as_torch():
    x = np.random.default_rng(10).standard_normal((4, 2, 3))

    def run(lib, fn, functional):
        stats = (lib.zeros(3), lib.ones(3))
        return lambda: fn(lambda a: functional.batch_norm(a, *stats, training=True))(lib.tensor(x))

    _same_error(run(tw, vmap, F), run(torch, torch.func.vmap, TF))
    act = vmap(lambda a: F.batch_norm(a, None, None, training=True))(tw.tensor(x))
    exp = torch.func.vmap(lambda a: TF.batch_norm(a, None, None, training=True))(torch.tensor(x))
    np.testing.assert_allclose(act.numpy(), exp.numpy(), rtol=1e-10)

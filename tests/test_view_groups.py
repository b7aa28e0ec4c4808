"""split, chunk, unbind and tensor_split record one autograd node per call, with torch's gradients and errors.

See [Note: view groups] in ops/shape.py and [Note: watched views] in ops/inplace.py. Every case runs in tilewise
and in torch: gradients (of every output used, or only some), the grad_fn the outputs share, version counters,
and the errors for in-place writes into the outputs, into their base, and into views made under no_grad. The
view geometry cache ([Note: view geometry cache] in ops/views.py) and inline composites ([Note: inline
composites] in dispatch.py) are checked here too: cached answers equal the rules' own, errors are raised anew.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tilewise as tw
from tilewise.ops import views as V
from tilewise.ops.registry import OPS, declare

GROUPS = {
    "split": lambda t: t.split(2),
    "split-dim1": lambda t: t.split(2, 1),
    "split-sections": lambda t: t.split([1, 4, 1]),
    "split_with_sizes": lambda t: t.split_with_sizes([2, 0, 4], -2),
    "chunk": lambda t: t.chunk(4),
    "chunk-dim1": lambda t: t.chunk(2, -1),
    "unbind": lambda t: t.unbind(),
    "unbind-dim1": lambda t: t.unbind(-1),
    "tensor_split": lambda t: t.tensor_split(4),
    "tensor_split-indices": lambda t: t.tensor_split([1, 4], dim=0),
    "tensor_split-overlapping": lambda t: t.tensor_split([4, 1, 5], dim=0),
    "tensor_split-clamped": lambda t: t.tensor_split([-2, 9], 1),
}
MULTIPLE = [name for name in GROUPS if not name.startswith("tensor_split")]  # torch's multi-output views
NODE_NAMES = {"split": "SplitBackward0", "split-dim1": "SplitBackward0", "split-sections": "SplitWithSizesBackward0",
              "split_with_sizes": "SplitWithSizesBackward0", "chunk": "SplitBackward0", "chunk-dim1": "SplitBackward0",
              "unbind": "UnbindBackward0", "unbind-dim1": "UnbindBackward0"}


def _input(lib, requires_grad=True):
    x = lib.tensor(np.arange(18, dtype=np.float32).reshape(6, 3) / 7, requires_grad=requires_grad)
    return x, x * 1  # a leaf, and a non-leaf base that in-place writes may change


def _run(lib, name, body):
    """``body(outputs, x, base)`` in ``lib``: the error's message, or x's gradient."""
    x, base = _input(lib)
    try:
        body(GROUPS[name](base), x, base)
    except RuntimeError as exc:
        return ("error", str(exc).split(": ", 1)[-1] if str(exc).split(": ", 1)[0].endswith("_") else str(exc))
    return ("grad", None if x.grad is None else x.grad.numpy())


def _same(name, body):
    ours, theirs = _run(tw, name, body), _run(torch, name, body)
    assert ours[0] == theirs[0]
    if ours[0] == "error" or ours[1] is None or theirs[1] is None:
        assert ours[1] is None if theirs[1] is None else ours[1] == theirs[1]
    else:
        np.testing.assert_allclose(ours[1], theirs[1], rtol=1e-6)


def _weighted_sum(outputs, used):
    total = 0
    for k in used:
        if k < len(outputs):
            total = total + (outputs[k] * (k + 2.0)).sum()
    return total


@pytest.mark.parametrize("name", GROUPS)
@pytest.mark.parametrize("used", [(0,), (1,), (0, 2), (0, 1, 2, 3, 4, 5), (5,)], ids=str)
def test_gradients_of_the_outputs_used_match_torch(name, used):
    def body(outputs, x, base):
        total = _weighted_sum(outputs, used)
        if isinstance(total, int):  # no output of that index: nothing to differentiate
            return
        total.backward()

    _same(name, body)


@pytest.mark.parametrize("name", GROUPS)
def test_the_outputs_share_one_node_whose_name_is_torchs(name):
    x, base = _input(tw)
    outputs = GROUPS[name](base)
    nodes = {id(o.grad_fn) for o in outputs}
    assert len(nodes) == 1 and all(o._base is base for o in outputs)
    assert [o._output_nr for o in outputs] == list(range(len(outputs)))
    if name in NODE_NAMES:
        assert outputs[0].grad_fn.name() == NODE_NAMES[name]
        assert type(GROUPS[name](_input(torch)[1])[0].grad_fn).__name__ == NODE_NAMES[name]
    assert outputs[0].grad_fn.next_functions == ((base.grad_fn, 0),)


@pytest.mark.parametrize("name", GROUPS)
def test_outputs_match_torch_and_share_the_version_counter(name):
    ours, theirs = GROUPS[name](_input(tw)[1]), GROUPS[name](_input(torch)[1])
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs):
        assert a.shape == b.shape and a.stride() == b.stride() and a.storage_offset() == b.storage_offset()
        np.testing.assert_array_equal(a.detach().numpy(), b.detach().numpy())
    for lib, outputs in ((tw, ours), (torch, theirs)):
        with lib.no_grad():
            outputs[0].add_(1)
        assert [o._version for o in outputs] == [1] * len(outputs)


@pytest.mark.parametrize("name", GROUPS)
@pytest.mark.parametrize("write", ["add_", "mul_", "fill_", "zero_", "copy_"])
def test_an_in_place_write_into_an_output_is_refused_or_recorded_as_in_torch(name, write):
    def body(outputs, x, base):
        target = outputs[1]
        if write == "copy_":
            target.copy_(target.detach() * 0 + 3)
        elif write in ("fill_", "zero_"):
            getattr(target, write)(*((2.5,) if write == "fill_" else ()))
        else:
            getattr(target, write)(x[0, 0] if write == "mul_" else 1.5)
        if write in ("add_", "mul_"):  # writes of a constant leave a stale history in tilewise (no FillBackward)
            _weighted_sum(outputs, range(6)).backward()

    _same(name, body)


@pytest.mark.parametrize("name", GROUPS)
@pytest.mark.parametrize("writer", ["base", "sibling under no_grad", "itself under no_grad"])
def test_an_output_used_after_its_memory_was_written_is_refused_or_regenerated_as_in_torch(name, writer):
    def body(outputs, x, base):
        if writer == "base":
            base.mul_(x[0, 1])
        else:
            with (tw if isinstance(x, tw.Tensor) else torch).no_grad():
                outputs[0 if writer == "sibling under no_grad" else 1].add_(1)
        _weighted_sum(outputs, (1, 2)).backward()

    _same(name, body)


@pytest.mark.parametrize("name", GROUPS)
def test_an_output_used_before_its_memory_was_written_keeps_its_gradient(name):
    def body(outputs, x, base):
        used = outputs[1] * 3
        with (tw if isinstance(x, tw.Tensor) else torch).no_grad():
            base.add_(1)
        used.sum().backward()

    _same(name, body)


@pytest.mark.parametrize("name", MULTIPLE)
def test_a_view_of_an_output_is_refused_in_place_writes_as_in_torch(name):
    def body(outputs, x, base):
        view = outputs[0][:1].unsqueeze(0)
        view.add_(1)

    ours = _run(tw, name, body)
    assert ours == _run(torch, name, body) and ours[0] == "error" and "of Unsqueeze is a view" in ours[1]


@pytest.mark.parametrize("name", GROUPS)
def test_views_made_under_no_grad_refuse_in_place_writes_under_grad_mode(name):
    def body(outputs, x, base):
        lib = tw if isinstance(x, tw.Tensor) else torch
        with lib.no_grad():
            made = GROUPS[name](base)
        made[0].add_(1)

    ours = _run(tw, name, body)
    assert ours == _run(torch, name, body) and ours[0] == "error"
    assert ours[1].startswith("A view was created in no_grad mode and is being modified inplace")


def test_a_view_made_under_no_grad_of_a_watched_view_and_its_views_are_watched_as_made_under_no_grad():
    for lib in (tw, torch):
        x, base = _input(lib)
        first = base.split(3)[0]
        with lib.no_grad():
            inner = first.view(-1)
        outer = inner[1:]
        for t in (inner, outer):  # torch words the second "a view of a view which was created in no_grad mode"
            with pytest.raises(RuntimeError, match="created in no_grad mode and is being modified inplace"):
                t.add_(1)
        with lib.no_grad():
            outer.add_(1)  # allowed where nothing records
        assert x._version == 0 and base._version == 1


@pytest.mark.parametrize("name", GROUPS)
def test_under_no_grad_and_inference_mode_no_node_is_recorded(name):
    x, base = _input(tw)
    with tw.no_grad():  # the views require grad through their base, as torch's do
        outputs = GROUPS[name](base)
    assert all(o.grad_fn is None and o.requires_grad and o._base is base for o in outputs)
    with tw.inference_mode():
        outputs = GROUPS[name](base)
        assert all(o.grad_fn is None and o.requires_grad for o in outputs)
    theirs = _input(torch)[1]
    with torch.inference_mode():
        assert all(o.grad_fn is None and o.requires_grad for o in GROUPS[name](theirs))
    with tw.inference_mode():
        made = tw.ones(6, 3)
        outputs = GROUPS[name](made)
        assert all(o.is_inference() and o._base is None for o in outputs)
    with tw.inference_mode():
        outputs[0].add_(1)  # an inference tensor's views are no views: nothing to refuse


def test_integer_outputs_are_not_differentiable_and_empty_groups_record_nothing():
    ints = tw.arange(6).reshape(3, 2)
    assert all(o.grad_fn is None for o in ints.split(2))
    x = tw.ones(0, 3, requires_grad=True)
    assert x.unbind() == () and torch.ones(0, 3, requires_grad=True).unbind() == ()
    (piece,) = x.split(2)
    piece.sum().backward()
    assert x.grad.shape == (0, 3)


def test_compiled_backward_of_a_split_matches_eager():
    def step(x):
        q, k, v = (x * 2).split(2, dim=1)
        return (q * k + v.unbind(0)[1]).sum()

    x = tw.tensor(np.arange(12, dtype=np.float32).reshape(2, 6) / 5)
    eager = x.clone().requires_grad_()
    step(eager).backward()
    compiled_fn = tw.compile(lambda t: step(t).backward())
    traced = x.clone().requires_grad_()
    compiled_fn(traced)
    np.testing.assert_allclose(traced.grad.numpy(), eager.grad.numpy(), rtol=1e-6)
    reference = torch.tensor(x.numpy(), requires_grad=True)
    q, k, v = (reference * 2).split(2, dim=1)
    (q * k + v.unbind(0)[1]).sum().backward()
    np.testing.assert_allclose(eager.grad.numpy(), reference.grad.numpy(), rtol=1e-6)


def test_tangents_and_vmap_through_a_group_match_torch():
    x = np.arange(12, dtype=np.float32).reshape(4, 3) / 3
    tangent = np.ones_like(x)

    def f(lib):
        return lambda t: sum((o * (k + 1)) for k, o in enumerate(t.split([1, 3])[1].unbind(1)))

    ours = tw.func.jvp(f(tw), (tw.tensor(x),), (tw.tensor(tangent),))
    theirs = torch.func.jvp(f(torch), (torch.tensor(x),), (torch.tensor(tangent),))
    for a, b in zip(ours, theirs):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-6)
    ours = tw.func.vmap(lambda t: t.chunk(2)[1] * 2)(tw.tensor(x))
    theirs = torch.func.vmap(lambda t: t.chunk(2)[1] * 2)(torch.tensor(x))
    np.testing.assert_allclose(ours.numpy(), theirs.numpy())


# ---------------------------------------------------------------- the view geometry cache and inline composites

VIEWS = [
    lambda t: t.view(2, -1), lambda t: t.view(-1), lambda t: t.transpose(0, 1), lambda t: t.permute(1, 0),
    lambda t: t.t(), lambda t: t.unsqueeze(-1), lambda t: t.squeeze(), lambda t: t.expand(2, 4, 3),
    lambda t: t.select(1, -1), lambda t: t.narrow(0, 1, 2), lambda t: t[1:], lambda t: t.diagonal(),
    lambda t: t.unfold(0, 2, 1), lambda t: t.reshape(3, 4), lambda t: t.flatten(), lambda t: t.unflatten(0, (2, 2)),
    lambda t: t.movedim(0, 1), lambda t: t.reshape(-1, 2),
]


def _view_or_error(lib, k, make, data):
    try:
        return VIEWS[k](make(lib.tensor(data)))
    except RuntimeError as exc:
        return type(exc)


@pytest.mark.parametrize("k", range(len(VIEWS)))
def test_cached_view_geometry_matches_torch_at_every_offset_and_layout(k):
    data = np.arange(48, dtype=np.float32)
    for make in (lambda t: t[:12].view(4, 3), lambda t: t[5:17].view(4, 3), lambda t: t[:24].view(3, 8)[:, 2:6].t(),
                 lambda t: t[:24].view(4, 6)[:, 1::2]):
        for _ in range(2):  # the second call answers from the cache
            ours, theirs = _view_or_error(tw, k, make, data), _view_or_error(torch, k, make, data)
            if isinstance(theirs, type):
                assert ours is theirs
                continue
            assert (ours.shape, ours.stride(), ours.storage_offset()) == \
                (theirs.shape, theirs.stride(), theirs.storage_offset())
            np.testing.assert_array_equal(ours.numpy(), theirs.numpy())
            assert ours._is_view() == theirs._is_view()


def test_a_view_error_is_raised_on_every_call_and_never_cached():
    x = tw.ones(4, 3).t()
    for _ in range(3):
        with pytest.raises(RuntimeError, match="view size is not compatible"):
            x.view(12)
        with pytest.raises(IndexError, match="out of bounds"):
            x.select(0, 3)
    assert x.reshape(12)._base is None  # the copy reshape makes where no view can
    assert x.contiguous().reshape(12)._is_view()


def test_the_geometry_cache_stays_bounded(monkeypatch):
    monkeypatch.setattr(V, "GEOMETRY_LIMIT", 8)
    monkeypatch.setattr(V, "_GEOMETRY", {})
    for n in range(1, 40):
        x = tw.ones(n, 2)
        assert x.view(-1).shape == (2 * n,)
        assert len(V._GEOMETRY) <= 8


def test_inline_composites_keep_their_profiler_event_and_refuse_rules_of_their_own():
    with tw.profiler.profile() as prof:
        tw.ones(2, 3).reshape(3, 2)
    names = [e.name for e in prof.events()]
    assert any("reshape" in name for name in names) and any(name.endswith("view") for name in names)
    assert OPS["reshape"].inline and OPS["narrow"].inline and not OPS["split_with_sizes"].inline
    with pytest.raises(ValueError, match="inline=True is for composites with no rule of their own"):
        declare("_inline_with_grad(Tensor self) -> Tensor", "composite", decomposition=lambda s: s,
                grad={"self": "grad"}, inline=True)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_groups_views_and_a_three_dim_linear_on_cuda_match_the_cpu(dtype):
    rng = np.random.default_rng(0)
    data = [rng.standard_normal(shape).astype(np.float32) for shape in ((2, 3, 12), (12, 12), (12,))]

    def step(device):
        x, w, b = (tw.tensor(d, device=device, dtype=getattr(tw, dtype), requires_grad=True) for d in data)
        y = tw.nn.functional.linear(x, w, b)
        assert y._base is None  # the product is the result, as torch's
        q, k, v = y.split(4, dim=2)
        heads = q.view(2, 3, 2, 2).transpose(1, 2)
        rows = k.unbind(1)
        loss = (heads.float().sum() + sum((r.float() * (n + 1)).sum() for n, r in enumerate(rows))
                + (v.chunk(2, -1)[1].float() ** 2).sum() + sum(p.float().sum() for p in v.tensor_split([1, 3], 2)))
        loss.backward()
        return [t.grad.float().cpu().numpy() for t in (x, w, b)]

    tolerance = 1e-5 if dtype == "float32" else 5e-2
    for ours, reference in zip(step("cuda"), step("cpu")):
        np.testing.assert_allclose(ours, reference, rtol=tolerance, atol=tolerance)

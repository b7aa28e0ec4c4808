"""In-place writes and the gradients that pass through what they overwrote, against torch.

A write of values that need no gradient (``fill_``, ``zero_``, ``copy_`` of a constant) into a tensor that does ends
the gradient's path to what the tensor held before; a view taken before its memory was written is made afresh from
its base when autograd takes it, so its gradient sees the write. Both were silently wrong before (the gradient went
on through the overwritten values, or skipped the write).
"""

import re

import numpy as np
import pytest
import torch

import tilewise as tw


def _grads(lib, scenario, compiled=False):
    a = lib.tensor([1.0, 2.0, 3.0], requires_grad=True)
    c = lib.tensor([0.5, -1.0, 2.0], requires_grad=True)
    out = tw.compile(lambda a, c: scenario(lib, a, c))(a, c) if compiled else scenario(lib, a, c)
    out.backward()
    return [None if t.grad is None else t.grad.numpy().copy() for t in (a, c)], out.detach().numpy().copy()


def _check(scenario, compiled=False):
    (want_grads, want), (got_grads, got) = _grads(torch, scenario), _grads(tw, scenario, compiled)
    np.testing.assert_allclose(got, want)
    for g, w in zip(got_grads, want_grads):
        if w is None:
            assert g is None or not np.any(g)
        else:
            assert g is not None
            np.testing.assert_allclose(g, w)


def _fill(lib, a, c):
    x = a * 2
    x.fill_(5.0)
    return (x * a).sum()


def _fill_with_a_tensor(lib, a, c):
    x = a * c
    x.fill_(lib.tensor(1.5))
    return (x * c).sum()


def _zero(lib, a, c):
    x = a * 3
    x.zero_()
    return (x + a * c).sum()


def _copy_of_a_constant(lib, a, c):
    x = a * c
    x.copy_(lib.ones(3))
    return (x * a).sum()


def _zero_through_a_slice(lib, a, c):
    x = a * c
    x[1:].zero_()
    return (x * a).sum()


def _fill_through_a_view_then_read_whole(lib, a, c):
    x = (a * c).view(3, 1)
    x[0].fill_(2.0)
    return (x.view(3) ** 2).sum()


def _view_taken_before_its_base_was_written(lib, a, c):
    b = a * 1
    v = b[:2]
    b.mul_(3)
    return (v * v).sum()


def _view_taken_before_another_view_was_written(lib, a, c):
    b = a * c
    first, second = b[:2], b[1:]
    second.mul_(c[1:])
    return (first * 2).sum() + second.sum()


def _view_of_a_view_taken_before_the_write(lib, a, c):
    b = (a + 1).view(3, 1)
    v = b.t()
    b.add_(c.view(3, 1))
    return (v ** 2).sum()


def _transposed_view_before_an_in_place_activation(lib, a, c):
    b = (a.view(3, 1) * c.view(1, 3))
    t = b.t()
    b.relu_()
    return (t * t).sum()


@pytest.mark.parametrize("scenario", [
    _fill, _fill_with_a_tensor, _zero, _copy_of_a_constant, _zero_through_a_slice,
    _fill_through_a_view_then_read_whole, _view_taken_before_its_base_was_written,
    _view_taken_before_another_view_was_written, _view_of_a_view_taken_before_the_write,
    _transposed_view_before_an_in_place_activation,
], ids=lambda f: f.__name__.strip("_"))
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_gradients_through_in_place_writes_equal_torchs(scenario, compiled):
    _check(scenario, compiled)


def test_zeroing_a_result_its_backward_needs_is_refused_at_backward_as_in_torch():
    for lib in (torch, tw):
        a = lib.tensor([1.0, 2.0, 3.0], requires_grad=True)
        x = a.exp()  # exp's backward reads its result
        x.zero_()
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            x.sum().backward()


@pytest.mark.parametrize("write", ["fill_", "zero_", "copy_"])
def test_a_leaf_that_requires_grad_refuses_a_constant_written_into_it(write):
    for lib in (torch, tw):
        leaf = lib.ones(3, requires_grad=True)
        args = {"fill_": (2.0,), "zero_": (), "copy_": (lib.zeros(3),)}[write]
        with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
            getattr(leaf, write)(*args)
        with lib.no_grad():  # as nn.init does
            getattr(leaf, write)(*args)


def test_a_compiled_function_that_fills_an_intermediate_has_torchs_gradients():
    def f(lib, a, c):
        x = a * c
        x[0:2].fill_(1.0)
        return (x * a).sum()

    want_grads, want = _grads(torch, f)
    compiled = tw.compile(lambda a, c: f(tw, a, c))
    for _ in range(2):
        a = tw.tensor([1.0, 2.0, 3.0], requires_grad=True)
        c = tw.tensor([0.5, -1.0, 2.0], requires_grad=True)
        out = compiled(a, c)
        out.backward()
        np.testing.assert_allclose(out.detach().numpy(), want)
        np.testing.assert_allclose(a.grad.numpy(), want_grads[0])
        np.testing.assert_allclose(c.grad.numpy(), want_grads[1])


def _data_written_between_forward_and_backward(lib, a, c):
    y = (a * a * c).sum()
    a.data.mul_(2)  # .data writes are hidden from autograd: the backward reads the new values, as in torch
    a.data[0].zero_()
    return y


def test_writes_through_data_are_hidden_from_autograd_as_in_torch():
    _check(_data_written_between_forward_and_backward)
    for lib in (torch, tw):
        a = lib.ones(3, requires_grad=True)
        before = a._version
        a.data.add_(1)
        assert a._version == before
        a.detach().add_(1)  # detach() shares the version counter
        assert a._version == before + 1


def test_a_compiled_function_sees_a_parameter_written_through_data():
    w = tw.nn.Parameter(tw.ones(3))
    f = tw.compile(lambda x: (x * w).sum())
    x = tw.tensor([1.0, 2.0, 3.0])
    assert f(x).item() == 6.0
    w.data.mul_(2)
    assert f(x).item() == 12.0
    with tw.no_grad():
        w.mul_(2)
    assert f(x).item() == 24.0


def _unsqueeze_in_place(lib, a, c):
    x = a * c
    x.unsqueeze_(0)
    return (x * lib.arange(3.0).view(1, 3)).sum()


def _transpose_in_place(lib, a, c):
    x = (a.view(3, 1) * c.view(1, 3))
    x.transpose_(0, 1)
    x.mul_(2)
    return (x * lib.arange(9.0).view(3, 3)).sum()


def _squeeze_and_t_in_place_through_a_view(lib, a, c):
    x = (a * c).view(1, 3, 1)
    v = x[:, :2]
    v.squeeze_()
    v.mul_(c[:2])
    x.t_() if x.dim() <= 2 else x.squeeze_(0)
    return (x ** 2).sum() + v.sum()


@pytest.mark.parametrize("scenario", [_unsqueeze_in_place, _transpose_in_place, _squeeze_and_t_in_place_through_a_view],
                         ids=lambda f: f.__name__.strip("_"))
def test_shape_changes_in_place_are_recorded_as_torchs(scenario):
    _check(scenario)


def test_shape_changes_in_place_refuse_as_torch_does():
    for lib in (torch, tw):
        leaf = lib.ones(3, requires_grad=True)
        with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
            leaf.unsqueeze_(0)
        a = lib.ones(3, requires_grad=True)
        x = a * 1
        y = x.sin()  # saves x in its old shape
        x.unsqueeze_(0)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            y.sum().backward()


def _channels_last_slice_written(lib, a):
    x = (a.view(1, 4, 2, 2) * 1).contiguous(memory_format=lib.channels_last)
    x[:, :2].mul_(3)
    return (x * lib.arange(16.0).view(1, 4, 2, 2)).sum()


def _channels_last_view_taken_before_a_write(lib, a):
    x = (a.view(1, 4, 2, 2) * 1).contiguous(memory_format=lib.channels_last)
    v = x[:, 1:3]
    x.add_(1)
    return (v * v).sum()


def _row_of_a_transposed_root_written(lib, a):
    x = a.view(4, 4) * 1
    x.t_()
    x[0].mul_(2)
    return (x * lib.arange(16.0).view(4, 4)).sum()


def _channels_last_activation_in_place_on_a_slice(lib, a):
    x = (a.view(1, 4, 2, 2) - 7).contiguous(memory_format=lib.channels_last)
    x[:, ::2].relu_()
    return (x * x).sum()


@pytest.mark.parametrize("scenario", [_channels_last_slice_written, _channels_last_view_taken_before_a_write,
                                      _row_of_a_transposed_root_written, _channels_last_activation_in_place_on_a_slice],
                         ids=lambda f: f.__name__.strip("_"))
def test_writes_through_views_of_a_base_that_is_not_row_major_have_torchs_gradients(scenario):
    """A channels-last base, or one transposed in place, is written through its views as torch writes it (these
    were refused: the view's storage geometry is replayed on the base's row-major permutation now)."""
    want = torch.arange(16.0, requires_grad=True)
    scenario(torch, want).backward()
    got = tw.arange(16.0, requires_grad=True)
    scenario(tw, got).backward()
    np.testing.assert_allclose(got.grad.numpy(), want.grad.numpy())


@pytest.mark.cuda
@pytest.mark.parametrize("scenario", [_fill, _zero_through_a_slice, _view_taken_before_its_base_was_written,
                                      _unsqueeze_in_place], ids=lambda f: f.__name__.strip("_"))
def test_in_place_gradients_on_cuda_match_torchs(scenario):
    want_grads, want = _grads(torch, scenario)

    class OnCuda:  # the scenario's library, making its tensors on the GPU
        def __getattr__(self, name):
            return getattr(tw, name)

        @staticmethod
        def tensor(*args, **kwargs):
            return tw.tensor(*args, device="cuda", **kwargs)

        @staticmethod
        def arange(*args, **kwargs):
            return tw.arange(*args, device="cuda", **kwargs)

    a = tw.tensor([1.0, 2.0, 3.0], device="cuda", requires_grad=True)
    c = tw.tensor([0.5, -1.0, 2.0], device="cuda", requires_grad=True)
    out = scenario(OnCuda(), a, c)
    out.backward()
    np.testing.assert_allclose(out.detach().cpu().numpy(), want, rtol=1e-6)
    for t, w in zip((a, c), want_grads):
        if w is None:
            assert t.grad is None or not t.grad.cpu().numpy().any()
        else:
            np.testing.assert_allclose(t.grad.cpu().numpy(), w, rtol=1e-6)


# Views made under no_grad (or inference mode) of a tensor that requires grad: torch's answer is that they require
# grad, through their base, with no grad_fn and no gradient accumulator of their own (a gradient that reaches them goes
# nowhere), and that an in-place write into them under grad mode, or a use by autograd after their memory was written,
# is refused. Their requires_grad follows their base's, whenever it changes; requires_grad_ changes only a flag of their
# own (set, it gives them an accumulator). Each scenario returns what it observed; an error is observed as its type and
# message.

def _leaf(lib):
    return lib.tensor([1.0, -2.0, 3.0], requires_grad=True)


def _made_under(lib, mode):
    return lib.no_grad() if mode == "no_grad" else lib.inference_mode()


def _flags(t):
    return t.requires_grad, t.grad_fn is None, t.is_leaf, t._is_view()


def _view_flags(lib, mode):
    x = _leaf(lib)
    b = x * 2
    with _made_under(lib, mode):
        made = {"slice": x[:2], "of a non-leaf": b[1:], "transpose": x.view(3, 1).t(), "expand": x.expand(2, 3),
                "unbind": x.unbind()[1], "split": x.split(2)[0], "view of it": x[:2][1:], "detach": x.detach(),
                "detach then slice": x.detach()[:2], "not a view": x * 2}
    return {k: _flags(t) for k, t in made.items()}


def _used_in_grad_mode(lib, mode):
    x = _leaf(lib)
    with _made_under(lib, mode):
        v = x[:2]
    y = (v * 2).sum()
    y.backward()
    return y.requires_grad, y.grad_fn is None, x.grad, v.grad


def _differentiated_with_respect_to_it(lib, mode):
    x = _leaf(lib)
    with _made_under(lib, mode):
        v = x[:2]
    unused = lib.autograd.grad((v * 2).sum(), [v, x], allow_unused=True)
    lib.autograd.grad((v * 3).sum(), v)  # "appears to not have been used in the graph"
    return unused


def _backward_from_it(lib, mode):
    x = _leaf(lib)
    with _made_under(lib, mode):
        v = x[:2]
    v.backward(lib.ones(2))  # no grad_fn, no accumulator: torch's "does not require grad and does not have a grad_fn"


def _written_in_place_under_grad_mode(lib, mode):
    x = _leaf(lib)
    with _made_under(lib, mode):
        v = x[:2]
    v.mul_(2)


def _a_view_of_it_written_in_place(lib, mode):
    x = _leaf(lib)
    with _made_under(lib, mode):
        v = x[:2]
    u = v[1:]
    flags = _flags(u)
    try:
        u.mul_(2)
    except RuntimeError as exc:
        return flags, _message(exc)
    return flags, None


def _written_where_nothing_records_then_used(lib, mode):
    x = _leaf(lib) * 1
    with _made_under(lib, mode):
        v = x[:2]
    with lib.no_grad():
        v.mul_(1)  # allowed: nothing records
    return v * 2  # torch refuses to let autograd take it now


def _base_written_then_used(lib, mode):
    x = _leaf(lib) * 1
    with _made_under(lib, mode):
        v = x[:2]
    x.add_(1)
    return v * 2


def _through_a_custom_function(lib, mode):
    class Double(lib.autograd.Function):
        @staticmethod
        def forward(ctx, a):
            return a * 2

        @staticmethod
        def backward(ctx, g):
            return g * 2

    x = _leaf(lib)
    with _made_under(lib, mode):
        v = x[:2]
    y = Double.apply(v)
    y.sum().backward()
    return y.requires_grad, x.grad, v.grad


def _its_flag_set_false(lib, mode):
    x = _leaf(lib)
    with _made_under(lib, mode):
        v = x[:2]
    v.requires_grad_(False)  # its own flag: it still requires grad through its base
    v.requires_grad = False
    y = v * 2
    y.sum().backward()
    return v.requires_grad, v.is_leaf, y.requires_grad, y.grad_fn is None, x.grad, v.grad


def _its_flag_set_true(lib, mode):
    x = _leaf(lib)
    with _made_under(lib, mode):
        v = x[:2]
    v.requires_grad_(True)  # a flag of its own: a gradient accumulator of its own
    (v * 2).sum().backward()
    return v.requires_grad, x.grad, v.grad


def _its_base_stops_requiring_grad(lib, mode):
    x = _leaf(lib)
    with _made_under(lib, mode):
        v = x[:2]
    w = v[1:]  # recorded: it has a grad_fn, and so requires grad whatever the base does
    x.requires_grad_(False)
    seen = v.requires_grad, w.requires_grad, (v * 2).requires_grad
    x.requires_grad_(True)
    return (*seen, v.requires_grad)


def _its_base_requires_grad_later(lib, mode):
    x = lib.tensor([1.0, -2.0, 3.0])
    with _made_under(lib, mode):
        v = x[:2]
    before = v.requires_grad
    x.requires_grad_(True)
    y = (v * 2).sum()
    y.backward()
    return before, v.requires_grad, v.is_leaf, y.requires_grad, x.grad, v.grad


UNDER_NO_GRAD = [_view_flags, _used_in_grad_mode, _differentiated_with_respect_to_it, _backward_from_it,
                 _written_in_place_under_grad_mode, _a_view_of_it_written_in_place,
                 _written_where_nothing_records_then_used, _base_written_then_used, _through_a_custom_function,
                 _its_flag_set_false, _its_flag_set_true, _its_base_stops_requiring_grad, _its_base_requires_grad_later]


def _message(exc: RuntimeError) -> str:
    """The error's message without the name of the in-place operator that tilewise puts first."""
    return re.sub(r"^[a-z_]+_: ", "", str(exc))


def _observe(lib, scenario, mode):
    try:
        seen = scenario(lib, mode)
    except RuntimeError as exc:
        return "error", _message(exc)
    if isinstance(seen, (lib.Tensor, tuple)) and not isinstance(seen, dict):
        seen = seen if isinstance(seen, tuple) else (seen.requires_grad, seen.grad_fn is None)
    return "ok", tuple(t.tolist() if isinstance(t, lib.Tensor) else t for t in seen) if isinstance(seen, tuple) \
        else seen


@pytest.mark.parametrize("mode", ["no_grad", "inference_mode"])
@pytest.mark.parametrize("scenario", UNDER_NO_GRAD, ids=lambda f: f.__name__.strip("_"))
def test_views_made_under_no_grad_require_grad_through_their_base_as_in_torch(scenario, mode):
    assert _observe(tw, scenario, mode) == _observe(torch, scenario, mode)


# Views made under no_grad (or inference mode) of a tensor that did not require grad then: once their base is given
# history by an in-place write under grad mode, torch refuses to let autograd take them, or to write into them in a way
# that records, as it refuses a view made so of a tensor that required grad (a view made under grad mode is made
# afresh from its base instead). A write that gives the base no history, or a base made to require grad by
# requires_grad_, leaves them usable.

def _plain_base(lib):
    return lib.tensor([1.0, -2.0, 3.0]) + 1


def _weight(lib):
    return lib.tensor([2.0, 3.0, 4.0], requires_grad=True)


def _plain_base_given_history_then_used(lib, mode):
    b, w = _plain_base(lib), _weight(lib)
    with _made_under(lib, mode):
        v = b[:2]
    b.mul_(w)
    return v * 2


def _plain_base_given_history_then_its_view_written(lib, mode):
    b, w = _plain_base(lib), _weight(lib)
    with _made_under(lib, mode):
        v = b[:2]
    b.mul_(w)
    v.mul_(2)


def _plain_base_given_history_then_differentiated(lib, mode):
    b, w = _plain_base(lib), _weight(lib)
    with _made_under(lib, mode):
        v = b[:2]
    b.mul_(w)
    return lib.autograd.grad((v * w[:2]).sum(), w)


def _plain_base_given_history_through_another_view(lib, mode):
    b, w = _plain_base(lib), _weight(lib)
    with _made_under(lib, mode):
        v = b[:2]
    b[2:].mul_(w[2:])
    return lib.cat([v, v])


def _plain_base_given_history_then_a_grad_mode_view_of_it_used(lib, mode):
    b, w = _plain_base(lib), _weight(lib)
    with _made_under(lib, mode):
        v = b[:2]
    u = v[1:]  # made under grad mode, of a view made under no_grad: watched alike
    b.mul_(w)
    return u * 2


def _plain_base_given_history_then_used_where_nothing_records(lib, mode):
    b, w = _plain_base(lib), _weight(lib)
    with _made_under(lib, mode):
        v = b[:2]
    b.mul_(w)
    with lib.no_grad():
        out = v * 2
        v.mul_(3)
    return out, v.detach() * 1, b.detach() * 1


def _plain_view_written_with_a_value_that_requires_grad(lib, mode):
    b, w = _plain_base(lib), _weight(lib)
    with _made_under(lib, mode):
        v = b[:2]
    v.mul_(w[:2])


def _plain_view_written_where_nothing_requires_grad(lib, mode):
    b = _plain_base(lib)
    with _made_under(lib, mode):
        v = b[:2]
    v.mul_(2)
    return v, b


def _plain_base_written_without_history_then_used(lib, mode):
    b, w = _plain_base(lib), _weight(lib)
    with _made_under(lib, mode):
        v = b[:2]
    b.mul_(2)
    y = (v * w[:2]).sum()
    y.backward()
    return y.requires_grad, v.requires_grad, w.grad


def _its_base_stops_requiring_grad_then_it_is_written(lib, mode):
    x = _leaf(lib)
    with _made_under(lib, mode):
        v = x[:2]
    x.requires_grad_(False)
    v.mul_(2)  # nothing records: allowed
    return v, x


PLAIN_BASE = [_plain_base_given_history_then_used, _plain_base_given_history_then_its_view_written,
              _plain_base_given_history_then_differentiated, _plain_base_given_history_through_another_view,
              _plain_base_given_history_then_a_grad_mode_view_of_it_used,
              _plain_base_given_history_then_used_where_nothing_records,
              _plain_view_written_with_a_value_that_requires_grad, _plain_view_written_where_nothing_requires_grad,
              _plain_base_written_without_history_then_used, _its_base_stops_requiring_grad_then_it_is_written]


@pytest.mark.parametrize("mode", ["no_grad", "inference_mode"])
@pytest.mark.parametrize("scenario", PLAIN_BASE, ids=lambda f: f.__name__.strip("_"))
def test_views_made_under_no_grad_of_a_base_given_history_later_are_refused_as_in_torch(scenario, mode):
    assert _observe(tw, scenario, mode) == _observe(torch, scenario, mode)


def test_a_compiled_function_refuses_a_view_made_under_no_grad_of_a_base_given_history_later():
    def f(x, w):
        b = x * 1
        with tw.no_grad():
            v = b[:2]
        b.mul_(w)
        return v * 2

    with pytest.raises(RuntimeError, match="A view was created in no_grad mode and its base or another view of its "
                                           "base has been modified inplace with grad mode enabled"):
        tw.compile(f)(tw.ones(3), tw.ones(3, requires_grad=True))


# A view made under grad mode of a tensor that did not require grad has no grad_fn: like a view made under no_grad,
# it requires grad whenever its base does (torch's differentiable views), with no gradient accumulator of its own;
# once its base was given history by an in-place write, it is made afresh from its base, as torch regenerates it.

def _grad_mode_view_of_a_base_that_later_requires_grad(lib):
    x = lib.tensor([1.0, -2.0, 3.0])
    v = x[:2]
    w = v.unsqueeze(0)
    x.requires_grad_(True)
    y = (v * 2).sum()
    y.backward()
    seen = v.requires_grad, w.requires_grad, v.is_leaf, y.requires_grad, x.grad
    x.requires_grad_(False)
    return (*seen, v.requires_grad, w.requires_grad)


def _grad_mode_view_of_a_base_written_with_history(lib):
    b = lib.tensor([1.0, -2.0, 3.0])
    v = b[:2]
    w = lib.tensor(3.0, requires_grad=True)
    b.mul_(w)
    y = (v * 2).sum()
    y.backward()
    return v.requires_grad, y.requires_grad, w.grad


def _its_flag_changed(lib):
    x = lib.tensor([1.0, -2.0, 3.0])
    v = x[:2]
    v.requires_grad_(True)  # its own accumulator
    (v * 2).sum().backward()
    seen = v.requires_grad, x.requires_grad, v.grad
    v.requires_grad_(False)
    return (*seen, v.requires_grad)


@pytest.mark.parametrize("scenario", [_grad_mode_view_of_a_base_that_later_requires_grad,
                                      _grad_mode_view_of_a_base_written_with_history, _its_flag_changed],
                         ids=lambda f: f.__name__.strip("_"))
def test_a_view_without_grad_fn_follows_its_base_as_in_torch(scenario):
    assert _observe(tw, lambda lib, _: scenario(lib), None) == _observe(torch, lambda lib, _: scenario(lib), None)


# A view torch refuses to let autograd take (made under no_grad or in inference mode, or an output of split or unbind,
# whose memory was written since it was made while it or its base has history): reading its grad_fn or is_leaf, or
# registering a hook on it, raises torch's refusal too; its repr says grad_fn=<Invalid>. A fresh one reads as ever.

def _refused_view(lib, kind):
    if kind in ("no_grad", "inference_mode"):
        b = _leaf(lib) * 1
        with _made_under(lib, kind):
            v = b[:2]
        b.mul_(2)
    elif kind == "plain base given history":
        b = _plain_base(lib)
        with lib.no_grad():
            v = b[:2]
        b.mul_(_weight(lib))
    elif kind == "written where nothing records":
        b = _leaf(lib) * 1
        with lib.no_grad():
            v = b[:2]
            b.mul_(2)
    elif kind == "through another view":
        b = _leaf(lib) * 1
        with lib.no_grad():
            v = b[:2]
        b[2:].mul_(2)
    else:
        b = _leaf(lib) * 1
        v = b.split(2)[0] if kind == "split" else b.unbind()[0]
        b[2:].mul_(2)
    return v


READS = {"grad_fn": lambda v: v.grad_fn is None, "is_leaf": lambda v: v.is_leaf,
         "register_hook": lambda v: v.register_hook(lambda g: g) is None, "repr": lambda v: repr(v).split("grad_fn")[1],
         "requires_grad": lambda v: v.requires_grad, "retain_grad": lambda v: v.retain_grad(),
         "output_nr": lambda v: v.output_nr, "grad": lambda v: v.grad, "detach": lambda v: v.detach().tolist()}


@pytest.mark.parametrize("read", READS)
@pytest.mark.parametrize("kind", ["no_grad", "inference_mode", "plain base given history",
                                  "written where nothing records", "through another view", "split", "unbind"])
def test_reading_the_history_of_a_refused_view_raises_as_in_torch(kind, read):
    def observe(lib):
        v = _refused_view(lib, kind)
        try:
            return "ok", READS[read](v)
        except RuntimeError as exc:
            return "error", _message(exc)

    assert observe(tw) == observe(torch)


def test_a_view_read_before_its_base_is_written_reads_as_a_leaf_as_in_torch():
    for lib in (tw, torch):
        b = _leaf(lib) * 1
        with lib.no_grad():
            v = b[:2]
        assert v.grad_fn is None and v.is_leaf and v.requires_grad
        b.mul_(2)
        with pytest.raises(RuntimeError, match="A view was created in no_grad mode and its base"):
            v.grad_fn  # noqa: B018 — reading it is what raises

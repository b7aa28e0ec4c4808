"""Tensor methods that are not operators, beside torch: Python callbacks (apply_, map_, map2_), resize_ and its
relatives, new_empty_strided, dim_order, output_nr, the device predicates, post-accumulate gradient hooks, and
the random fills log_normal_, cauchy_ and geometric_ (their distributions, since torch's generator differs)."""

from __future__ import annotations

import re
import warnings

import numpy as np
import pytest
import torch

import tilewise as tw


def _both(values, dtype="float32"):
    array = np.asarray(values, dtype=dtype)
    return tw.tensor(array), torch.tensor(array)


def _same(ours, theirs):
    assert tuple(ours.shape) == tuple(theirs.shape) and ours.dtype.name == str(theirs.dtype).removeprefix("torch.")
    np.testing.assert_array_equal(ours.numpy(), theirs.clone().numpy())  # torch's numpy() pins its storage's size


def test_apply_map_and_map2_match_torch():
    for dtype in ("float32", "int64"):
        (a, ta), (b, tb) = _both([[1, 2, 3], [4, 5, 6]], dtype), _both([10, 20, 30], dtype)
        _same(a.apply_(lambda v: v * 2.7), ta.apply_(lambda v: v * 2.7))
        _same(a.map_(b, lambda x, y: x + y), ta.map_(tb, lambda x, y: x + y))
        _same(a.map2_(b, a.clone(), lambda x, y, z: x - y + z), ta.map2_(tb, ta.clone(), lambda x, y, z: x - y + z))
    view, tview = _both(np.arange(12).reshape(3, 4), "float32")
    view[:, ::2].apply_(lambda v: -v)
    tview[:, ::2].apply_(lambda v: -v)
    _same(view, tview)


def test_callbacks_refuse_what_torch_refuses():
    for fw in (torch, tw):
        with pytest.raises(RuntimeError, match="requires grad"):
            fw.ones(2, requires_grad=True).apply_(lambda v: v)
        with pytest.raises(RuntimeError):
            fw.ones(2, 3).map_(fw.ones(4), lambda x, y: x)
        with pytest.raises(TypeError, match="must be real number"):
            fw.ones(2).apply_(lambda v: "a")


@pytest.mark.parametrize("start,sizes", [((6,), (2, 2)), ((6,), (2, 4)), ((3, 4), (4, 3)), ((6,), (0,)),
                                         ((2, 3), (2, 3)), ((4,), (3, 3))], ids=str)
def test_resize_matches_torch(start, sizes):
    ours, theirs = tw.arange(float(np.prod(start))).view(start), torch.arange(float(np.prod(start))).view(start)
    assert ours.resize_(*sizes) is ours
    theirs.resize_(*sizes)
    assert tuple(ours.shape) == tuple(theirs.shape) and ours.stride() == theirs.stride()
    kept = min(int(np.prod(start)), int(np.prod(sizes)))
    np.testing.assert_array_equal(ours.reshape(-1)[:kept].numpy(), theirs.reshape(-1)[:kept].numpy())


def test_resize_of_an_offset_view_and_of_a_transposed_tensor():
    ours, theirs = tw.arange(6.0)[1:], torch.arange(6.0)[1:]
    _same(ours.resize_(2, 2), theirs.resize_(2, 2))
    assert ours.storage_offset() == theirs.storage_offset() == 1
    assert tw.ones(3, 4).t().resize_(4, 3).stride() == torch.ones(3, 4).t().resize_(4, 3).stride()
    a, ta = tw.zeros(5), torch.zeros(5)
    _same(tw.resize_as_(a, tw.ones(1, 2)), torch.resize_as_(ta, torch.ones(1, 2)))
    _same(a.resize_as_(tw.ones(3, 2)).fill_(1), ta.resize_as_(torch.ones(3, 2)).fill_(1))
    for fw in (torch, tw):
        with pytest.raises(RuntimeError, match="cannot resize variables that require grad"):
            fw.ones(2, requires_grad=True).resize_(3)


def test_non_inplace_resize_keeps_the_elements():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        x, tx = _both(np.arange(6))
        _same(x.resize(3, 2), tx.resize(3, 2))
        _same(x.resize_as(tw.ones(2, 3)), tx.resize_as(torch.ones(2, 3)))
        for t in (tx, x):
            with pytest.raises(RuntimeError, match="autograd's resize"):
                t.resize(4)
    w = tw.ones(2, requires_grad=True)
    with pytest.warns(UserWarning, match="deprecated"):
        w.resize(2, 1).sum().backward()
    assert w.grad.tolist() == [1.0, 1.0]


def test_new_empty_strided_like_torch():
    for x in (tw.ones(2, dtype=tw.float64), torch.ones(2, dtype=torch.float64)):
        out = x.new_empty_strided((2, 3), (1, 2))
        assert out.stride() == (1, 2) and tuple(out.shape) == (2, 3) and str(out.dtype).endswith("float64")
        assert x.new_empty_strided((2,), (1,), dtype=type(x).__module__ == "torch" and torch.int32 or tw.int32,
                                   ).dtype.__repr__().endswith("int32")
    assert tw.ones(1).new_empty_strided((2, 2), (2, 1), requires_grad=True).requires_grad


@pytest.mark.parametrize("make", [
    "fw.ones(2, 3)", "fw.ones(2, 3).t()", "fw.empty_permuted((2, 3, 4), (0, 2, 1))", "fw.ones(2, 1, 3)",
    "fw.ones(2, 6)[:, ::2]", "fw.ones(4)", "fw.ones(())", "fw.ones(2, 3, 4, 5).permute(0, 2, 3, 1)",
    "fw.ones(2, 3, 4, 5).permute(3, 1, 0, 2)", "fw.ones(3, 1).expand(3, 4)"])
def test_dim_order_matches_torch(make):
    assert eval(make, {"fw": tw}).dim_order() == eval(make, {"fw": torch}).dim_order()


def test_dim_order_ambiguity_check():
    assert tw.ones(2, 3).dim_order(ambiguity_check=True) == (0, 1)
    for fw in (torch, tw):
        with pytest.raises(RuntimeError, match="unique dim order"):
            fw.ones(2, 1, 3).dim_order(ambiguity_check=True)


def test_output_nr_name_and_predicates():
    for fw in (torch, tw):
        leaf = fw.ones(3, requires_grad=True)
        assert leaf.output_nr == 0 and (leaf * 2).output_nr == 0
        assert [t.output_nr for t in fw.var_mean(leaf)] == [0, 1]
        assert leaf.name is None
        assert not (leaf.is_meta or leaf.is_mps or leaf.is_xpu or leaf.is_maia)
        assert not fw.ones(2).is_shared()
        x = fw.arange(3.0)
        assert x.const_data_ptr() == x.data_ptr()
    assert tw.ones(2).cfloat().dtype == tw.complex64 and tw.ones(2).cdouble().dtype == tw.complex128
    assert tw.ones(2).cfloat().tolist() == torch.ones(2).cfloat().tolist()


def test_post_accumulate_grad_hook_sees_the_accumulated_gradient():
    seen = {}
    for fw in (torch, tw):
        w = fw.ones(3, requires_grad=True)
        def record(p, name=fw.__name__):
            seen.setdefault(name, []).append(p.grad.tolist())

        def zero(p):
            p.grad.mul_(0)

        w.register_post_accumulate_grad_hook(record)
        (w * 2).sum().backward()
        handle = w.register_post_accumulate_grad_hook(zero)
        (w * 3).sum().backward()
        handle.remove()
        (w * 1).sum().backward()
        seen[fw.__name__].append(w.grad.tolist())
        with pytest.raises(RuntimeError, match="non-leaf"):
            (w * 2).register_post_accumulate_grad_hook(lambda p: None)
        with pytest.raises(RuntimeError, match="doesn't require gradient"):
            fw.ones(2).register_post_accumulate_grad_hook(lambda p: None)
    assert seen["tilewise"] == seen["torch"]


def test_random_fills_follow_their_distributions():
    tw.manual_seed(0)
    x = tw.empty(200_000).log_normal_(0.5, 0.25)
    assert abs(x.log().mean().item() - 0.5) < 0.01 and abs(x.log().std().item() - 0.25) < 0.01
    c = tw.empty(200_000, dtype=tw.float64).cauchy_(1.0, 2.0)
    quartiles = np.quantile(c.numpy(), [0.25, 0.5, 0.75])
    np.testing.assert_allclose(quartiles, [-1.0, 1.0, 3.0], atol=0.05)  # median +- sigma
    g = tw.empty(200_000).geometric_(0.3)
    assert g.min().item() == 1.0 and abs(g.mean().item() - 1 / 0.3) < 0.05
    assert float((g == 1).float().mean()) == pytest.approx(0.3, abs=0.01)
    gi = tw.empty(1000, dtype=tw.int64).geometric_(0.5)
    assert gi.dtype == tw.int64 and gi.min().item() >= 1


def test_random_fill_errors_match_torch():
    cases = ["fw.ones(3).log_normal_(1, 0)", "fw.ones(3, dtype=fw.int64).log_normal_()", "fw.ones(3).cauchy_(0, -1)",
             "fw.ones(3, dtype=fw.int64).cauchy_()", "fw.ones(3).geometric_(0)", "fw.ones(3).geometric_(1.5)",
             "fw.ones(3, dtype=fw.bool).geometric_(0.5)", "fw.ones(3).geometric_()"]
    for code in cases:
        with pytest.raises(Exception) as expected:
            eval(code, {"fw": torch})
        with pytest.raises(type(expected.value)):
            eval(code, {"fw": tw})


def test_legacy_new_constructor_like_torch():
    for fw in (torch, tw):
        x = fw.arange(6.0)
        assert tuple(x.new(2, 3).shape) == (2, 3) and x.new(2, 3).dtype == fw.float32
        assert x.new([1, 2]).tolist() == [1.0, 2.0] and x.new((2, 3)).tolist() == [2.0, 3.0]
        assert tuple(x.new().shape) == (0,)
        assert fw.arange(3).new([1.5]).tolist() == [1]


def test_set_and_is_set_to_like_torch():
    for fw in (torch, tw):
        x = fw.arange(6.0)
        assert x.is_set_to(x) and x.is_set_to(x[:]) and not x.is_set_to(x.view(2, 3))
        assert not x.is_set_to(x.clone())
        y = fw.zeros(2)
        assert y.set_(x) is y and y.is_set_to(x)
        y[0] = 7.0
        assert x[0].item() == 7.0
        z = fw.zeros(2).set_(x, 1, (2, 2), (2, 1))
        assert z.tolist() == [[1.0, 2.0], [3.0, 4.0]]
        assert tuple(fw.zeros(2).set_().shape) == (0,)
        with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
            fw.zeros(2, requires_grad=True).set_(x)
        with pytest.raises(RuntimeError, match="Could not set tensor of type"):
            fw.zeros(2).set_(fw.zeros(2, dtype=fw.int64))
    x = tw.arange(4.0)
    assert tw.zeros(1).set_(x.untyped_storage()).tolist() == [0.0, 1.0, 2.0, 3.0]


def test_module_load_volatile_and_reinforce():
    for fw in (torch, tw):
        x = fw.zeros(3)
        loaded = x.module_load(fw.ones(3))
        assert loaded.tolist() == [1.0, 1.0, 1.0] and x.tolist() == [1.0, 1.0, 1.0]
        other = fw.full((3,), 2.0)
        assert x.module_load(other, assign=True).tolist() == [2.0, 2.0, 2.0] and x.tolist() == [1.0, 1.0, 1.0]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            assert x.volatile is False
        with pytest.raises(RuntimeError, match="reinforce\\(\\) was removed"):
            x.reinforce(1.0)
    with pytest.warns(UserWarning, match="volatile was removed"):
        assert tw.ones(1).volatile is False


@pytest.mark.parametrize("name", ["eig", "lstsq", "solve", "symeig", "matrix_rank"])
def test_functions_removed_in_torch_raise_like_torch(name):
    a = np.eye(3, dtype=np.float32)
    operands = 2 if name in ("lstsq", "solve") else 1
    spellings = [lambda fw: getattr(fw, name)(*[fw.tensor(a)] * operands)]
    if name != "matrix_rank":
        spellings.append(lambda fw: getattr(fw.tensor(a), name)(fw.tensor(a)))
    for call in spellings:
        with pytest.raises(RuntimeError, match="deprecated since version 1.9 and is now removed"):
            call(torch)
        with pytest.raises(RuntimeError, match="deprecated since version 1.9 and is now removed"):
            call(tw)


def test_grad_scaler_and_out_of_memory_error_are_the_device_modules():
    assert tw.GradScaler is tw.amp.GradScaler and torch.GradScaler is torch.amp.GradScaler
    assert tw.OutOfMemoryError is tw.cuda.OutOfMemoryError and torch.OutOfMemoryError is torch.cuda.OutOfMemoryError
    assert issubclass(tw.OutOfMemoryError, RuntimeError) and issubclass(torch.OutOfMemoryError, RuntimeError)


def test_share_memory_is_refused_on_the_cpu():
    assert torch.ones(2).share_memory_().is_shared()  # torch moves the storage to shared memory
    with pytest.raises(NotImplementedError, match="cannot move to shared memory"):
        tw.ones(2).share_memory_()
    assert not tw.ones(2).is_shared()


@pytest.mark.parametrize("spec", [".2f", "", ">8"])
@pytest.mark.parametrize("values", [2.5, [2.5], [[1.0, 2.0]]])
def test_format_spec_like_torch(values, spec):
    """A format spec formats a 0-d tensor's number; on a tensor of more dims it is object.__format__'s TypeError."""
    ours, theirs = _both(values)
    try:
        expected = format(theirs, spec)
    except TypeError as exc:
        with pytest.raises(TypeError, match=re.escape(str(exc))):
            format(ours, spec)
    else:
        assert format(ours, spec) == expected.replace("torch.", "tilewise.")


@pytest.mark.parametrize("convert", [np.asarray, np.array, np.exp, lambda t: np.asarray(t, dtype=np.float64)],
                         ids=["asarray", "array", "ufunc", "asarray-dtype"])
def test_numpy_conversion_of_a_tensor_that_requires_grad_is_refused_as_torch_refuses_it(convert):
    for lib in (tw, torch):
        t = lib.ones(2, requires_grad=True)
        with pytest.raises(RuntimeError, match=re.escape("Can't call numpy() on Tensor that requires grad")):
            convert(t)
        with lib.no_grad():  # grad mode off: the values are handed out
            np.testing.assert_allclose(np.asarray(convert(t)), convert(np.ones(2)), rtol=1e-6)
        np.testing.assert_allclose(np.asarray(convert(t.detach())), convert(np.ones(2)), rtol=1e-6)


def test_numpy_array_with_copy_owns_its_memory():
    t = tw.arange(3.0)
    shared, owned = np.asarray(t), np.array(t, copy=True)
    t.add_(1)
    assert shared.tolist() == [1.0, 2.0, 3.0] and owned.tolist() == [0.0, 1.0, 2.0]


@pytest.mark.parametrize("attr", ["mT", "mH", "H", "adjoint"])
@pytest.mark.parametrize("shape", [(), (3,), (2, 3), (2, 3, 4)], ids=["0d", "1d", "2d", "3d"])
def test_matrix_transposes_conjugate_and_refuse_as_torch(attr, shape):
    """``mH``, ``H`` and ``adjoint()`` conjugate complex matrices (they were plain transposes); each refuses, or warns
    on a 0-dim tensor, with torch's words."""
    a = (np.arange(np.prod(shape)) + 1j * np.arange(np.prod(shape))[::-1]).reshape(shape).astype(np.complex64)
    found = []
    for lib in (torch, tw):
        t = lib.tensor(a)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                out = t.adjoint() if attr == "adjoint" else getattr(t, attr)
                found.append(("value", out.resolve_conj().numpy() if lib is torch else out.numpy()))
            except RuntimeError as exc:
                found.append(("error", str(exc)))
        found.append(("warnings", [str(w.message).split(" (Triggered")[0] for w in caught]))
    (kind, theirs), (_, their_warnings), (our_kind, ours), (_, our_warnings) = found
    assert kind == our_kind and our_warnings == their_warnings
    if kind == "error":
        assert ours == theirs
    else:
        np.testing.assert_array_equal(ours, theirs)

"""Inference mode and inference tensors, beside torch: which tensors are inference tensors, what torch refuses to
do with them outside the mode (in-place writes, saving for backward, requiring grad) with its messages, what it
still allows, grad mode inside the mode, and compiled functions called inside it."""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest
import torch

import tilewise as tw

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]


def _made_inside(fw, device: str, shape=(2, 3)):
    with fw.inference_mode():
        return fw.arange(float(np.prod(shape)), device=device).reshape(shape)


def _outcome(fn, fw, device: str):
    """What ``fn(fw, device)`` gives: its tensor's values, whether it is an inference tensor and whether it requires
    grad (or a plain value), or the exception's type and message."""
    try:
        value = fn(fw, device)
    except Exception as exc:  # noqa: BLE001 — the exception is the outcome compared
        return type(exc).__name__, str(exc).replace("`tilewise.", "`torch.")  # each names its own no_grad
    if isinstance(value, (torch.Tensor, tw.Tensor)):
        return value.detach().cpu().tolist(), value.is_inference(), value.requires_grad
    if isinstance(value, tuple):
        return tuple(v.is_inference() if isinstance(v, (torch.Tensor, tw.Tensor)) else v for v in value)
    return value


def _inplace(method: str, *args):
    def case(fw, device):
        return getattr(_made_inside(fw, device), method)(*args)

    return case


def _in_mode(fn):
    """``fn``'s tensors made and checked inside inference mode."""
    def case(fw, device):
        with fw.inference_mode():
            return fn(fw, device)

    return case


def _set_requires_grad(fw, device):
    t = _made_inside(fw, device)
    t.requires_grad = True
    return t


def _normal_inplace_inside(fw, device):
    n = fw.ones(3, device=device)
    with fw.inference_mode():
        n.mul_(3)
        v = n.view(3)
        v.add_(1)
    return n, n.is_inference(), v.is_inference(), n._version


def _view_inside_then_outside(fw, device):
    with fw.inference_mode():
        t = fw.ones(4, device=device)
        inside = t[1:]
    outside = t.view(2, 2)
    return inside.is_inference(), outside.is_inference(), outside.t().is_inference(), t.detach().is_inference()


def _mode_false_inside(fw, device):
    with fw.inference_mode():
        with fw.inference_mode(False):
            made = fw.ones(2, device=device)
            state = fw.is_grad_enabled(), fw.is_inference_mode_enabled()
        after = fw.ones(2, device=device)
    return made.is_inference(), after.is_inference(), *state


def _enable_grad_inside(fw, device):
    with fw.inference_mode():
        with fw.enable_grad():
            x = fw.ones(2, device=device, requires_grad=True)
            y = x * 2
            state = fw.is_grad_enabled(), fw.is_inference_mode_enabled()
        with fw.no_grad():
            z = fw.ones(1, device=device)
            still = fw.is_inference_mode_enabled()
    return x.is_inference(), x.requires_grad, y.is_inference(), y.requires_grad, y.grad_fn is None, z.is_inference(), \
        still, *state


def _grad_mode_restored(fw, device):
    with fw.no_grad():
        with fw.inference_mode():
            fw.set_grad_enabled(True)
            inside = fw.is_grad_enabled()
        after = fw.is_grad_enabled()
    return inside, after, fw.is_grad_enabled()


def _saves(fw, device):
    w = fw.ones(2, 3, device=device, requires_grad=True)
    return w * _made_inside(fw, device)


def _saves_in_function(fw, device):
    class Keep(fw.autograd.Function):
        @staticmethod
        def forward(ctx, x, y):
            ctx.save_for_backward(y)
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return g, None

    return Keep.apply(fw.ones(2, 3, device=device, requires_grad=True), _made_inside(fw, device))


def _adds_without_saving(fw, device):
    w = fw.ones(2, 3, device=device, requires_grad=True)
    return w + _made_inside(fw, device)


def _factories_inside(fw, device):
    normal = fw.ones(3, device=device)
    blob = pickle.dumps(fw.ones(2))
    with fw.inference_mode():
        return (fw.tensor([1.0], device=device), fw.as_tensor(np.ones(2)), fw.from_numpy(np.ones(2)),
                fw.zeros_like(normal), fw.rand(2, device=device), fw.arange(3, device=device),
                fw.empty(2, device=device), fw.Tensor(2), pickle.loads(blob), copy.deepcopy(normal), normal.clone(),
                normal.to(fw.float64),
                fw.nn.Linear(2, 2).to(device).weight, normal.contiguous(), normal.reshape(3, 1), normal.detach(),
                normal.to(fw.float32), fw.as_tensor(normal))


def _module_made_inside_used_outside(fw, device):
    with fw.inference_mode():
        layer = fw.nn.Linear(3, 2).to(device)
    x = fw.ones(4, 3, device=device, requires_grad=True)
    return layer(x)


def _module_made_inside_outside_no_grad_input(fw, device):
    with fw.inference_mode():
        layer = fw.nn.Linear(3, 2).to(device)
        layer.weight.fill_(0.5)
        layer.bias.fill_(1.0)
    return layer(fw.ones(4, 3, device=device))


def _is_inference_function(fw, device):
    return fw.is_inference(_made_inside(fw, device)), fw.is_inference(fw.ones(1, device=device))


def _autocast_inference_weight(fw, device):
    with fw.inference_mode():
        w = fw.full((2, 2), 0.5, device=device, requires_grad=True)
        with fw.autocast(device, dtype=fw.bfloat16):
            y = fw.ones(2, 2, device=device) @ w
    return y.float()


CASES = {
    # which tensors are inference tensors
    "factory inside": lambda fw, device: _made_inside(fw, device),
    "operator inside on a normal tensor": _in_mode(lambda fw, device: fw.ones(3, device=device).neg()),
    "view inside of a normal tensor": _in_mode(lambda fw, device: fw.ones(3, device=device).view(3, 1)),
    "slice inside of a normal tensor": _in_mode(lambda fw, device: fw.ones(3, device=device)[1:]),
    "views of an inference tensor": _view_inside_then_outside,
    "factories inside": _factories_inside,
    "is_inference()": _is_inference_function,
    "is_inference(3)": lambda fw, device: fw.is_inference(3),
    "functional op outside": lambda fw, device: _made_inside(fw, device) * 2,
    "reduction outside": lambda fw, device: _made_inside(fw, device).sum(),
    "clone outside": lambda fw, device: _made_inside(fw, device).clone(),
    "cast outside": lambda fw, device: _made_inside(fw, device).to(fw.float64),
    "contiguous outside (itself)": lambda fw, device: _made_inside(fw, device).contiguous(),
    "numpy outside": lambda fw, device: _made_inside(fw, device).cpu().numpy().tolist(),
    "deepcopy outside": lambda fw, device: copy.deepcopy(_made_inside(fw, device)),
    "pickle outside": lambda fw, device: pickle.loads(pickle.dumps(_made_inside(fw, device).cpu())),
    # grad mode inside the mode
    "inference_mode(False) inside": _mode_false_inside,
    "enable_grad and no_grad inside": _enable_grad_inside,
    "grad mode restored on exit": _grad_mode_restored,
    "in place on normal tensors inside": _normal_inplace_inside,
    "in place on an inference tensor inside": _in_mode(lambda fw, device: _made_inside(fw, device).add_(1)),
    "requires_grad_ inside": _in_mode(lambda fw, device: _made_inside(fw, device).requires_grad_()),
    # in-place writes outside
    "add_": _inplace("add_", 1),
    "mul_ of a view": lambda fw, device: _made_inside(fw, device)[0].mul_(2),
    "+=": _inplace("__iadd__", 1),
    "copy_": lambda fw, device: _made_inside(fw, device).copy_(fw.zeros(2, 3, device=device)),
    "fill_": _inplace("fill_", 1.0),
    "zero_": _inplace("zero_"),
    "uniform_": _inplace("uniform_"),
    "normal_": _inplace("normal_"),
    "clamp_": _inplace("clamp_", 0, 1),
    "masked_fill_": lambda fw, device: _made_inside(fw, device).masked_fill_(fw.ones(2, 3, dtype=fw.bool,
                                                                                      device=device), 1.0),
    "index_put_": lambda fw, device: _made_inside(fw, device).index_put_(
        (fw.tensor([0], device=device),), fw.tensor(2.0, device=device)),
    "setitem": lambda fw, device: _made_inside(fw, device).__setitem__((0, 0), 1.0),
    "setitem with a tensor index": lambda fw, device: _made_inside(fw, device).__setitem__(
        fw.tensor([1], device=device), 1.0),
    "addmm_": lambda fw, device: _made_inside(fw, device).addmm_(fw.ones(2, 2, device=device),
                                                                fw.ones(2, 3, device=device)),
    "fill_diagonal_": _inplace("fill_diagonal_", 0.0),
    "t_": _inplace("t_"),
    "unsqueeze_": _inplace("unsqueeze_", 0),
    "as_strided_": _inplace("as_strided_", (6,), (1,)),
    "resize_": _inplace("resize_", 6),
    "set_": lambda fw, device: _made_inside(fw, device).set_(fw.zeros(6, device=device)),
    "detach_ (allowed)": _inplace("detach_"),
    "requires_grad_(False) (allowed)": _inplace("requires_grad_", False),
    # requiring grad outside
    "requires_grad_": _inplace("requires_grad_"),
    "requires_grad = True": _set_requires_grad,
    "requires_grad_ of a view": lambda fw, device: _made_inside(fw, device).view(6).requires_grad_(),
    "nn.Parameter": lambda fw, device: fw.nn.Parameter(_made_inside(fw, device)),
    "_version": lambda fw, device: _made_inside(fw, device)._version,
    # saving for backward outside
    "saved by mul": _saves,
    "saved by a custom Function": _saves_in_function,
    "add saves nothing": _adds_without_saving,
    "module made inside, input requires grad": _module_made_inside_used_outside,
    "module made inside, plain input": _module_made_inside_outside_no_grad_input,
    # caches keyed on a weight's writes
    "autocast inside, inference weight": _autocast_inference_weight,
}


@pytest.fixture(autouse=True)
def _grad_mode_back():
    yield
    torch.set_grad_enabled(True)
    tw.set_grad_enabled(True)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", list(CASES))
def test_inference_tensors_like_torch(name, device):
    case = CASES[name]
    expected = _outcome(case, torch, "cpu")
    assert _outcome(case, tw, device) == expected


def test_refused_write_leaves_the_tensor_unchanged():
    t = _made_inside(tw, "cpu")
    for write in (lambda: t.add_(1), lambda: t.copy_(tw.zeros(2, 3)), lambda: t.__setitem__(0, 7.0)):
        with pytest.raises(RuntimeError, match="Inplace update to inference tensor outside InferenceMode"):
            write()
    assert t.tolist() == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]


@pytest.mark.parametrize("fw", [torch, tw], ids=["torch", "tilewise"])
def test_inference_mode_as_a_bare_decorator(fw):
    @fw.inference_mode
    def made():
        return fw.ones(1), fw.is_inference_mode_enabled()

    t, on = made()
    assert t.is_inference() and on and not fw.is_inference_mode_enabled()


def test_compiled_function_outputs_inside_inference_mode():
    compiled = tw.compile(lambda x: x * 2 + 1)
    normal = tw.ones(3)
    with tw.inference_mode():
        inside = compiled(normal)
        fresh_input = compiled(tw.ones(3))
    outside = compiled(normal)
    assert inside.is_inference() and fresh_input.is_inference() and not outside.is_inference()
    assert inside.tolist() == outside.tolist() == [3.0, 3.0, 3.0]


def test_compiled_function_with_a_graph_break_inside_inference_mode():
    def fn(x):
        y = x * 2
        if float(y.sum()) > 0:  # a graph break: the Python runs, its operators run as compiled segments
            y = y + 1
        return y

    compiled = tw.compile(fn)
    with tw.inference_mode():
        assert compiled(tw.ones(3)).is_inference()
    assert not compiled(tw.ones(3)).is_inference()


def test_compiled_in_place_write_into_an_inference_tensor_is_refused():
    def step(x):
        x.add_(1)
        return x

    compiled = tw.compile(step)
    frozen = _made_inside(tw, "cpu", (3,))
    with pytest.raises(RuntimeError, match="Inplace update to inference tensor outside InferenceMode"):
        compiled(frozen)  # recorded: refused as eagerly
    normal = tw.zeros(3)
    compiled(normal)
    compiled(normal)
    assert len(compiled.variants) == 1 and normal.tolist() == [2.0, 2.0, 2.0]
    with pytest.raises(RuntimeError, match="Inplace update to inference tensor outside InferenceMode"):
        compiled(frozen)  # replayed by the variant: refused before its program writes
    assert frozen.tolist() == [0.0, 1.0, 2.0]
    with tw.inference_mode():
        compiled(frozen)  # inside the mode the write is allowed
    assert frozen.tolist() == [1.0, 2.0, 3.0]


@pytest.mark.cuda
def test_compiled_function_outputs_inside_inference_mode_cuda():
    compiled = tw.compile(lambda x: (x * 2).relu())
    x = tw.ones(4, device="cuda")
    with tw.inference_mode():
        inside = compiled(x)
    outside = compiled(x)
    assert inside.is_inference() and not outside.is_inference()
    assert inside.cpu().tolist() == outside.cpu().tolist() == [2.0] * 4


def test_views_of_inference_tensors_are_not_tracked_as_views_as_in_torch():
    def outcome(lib):
        normal = lib.ones(4)
        with lib.inference_mode():
            x = lib.ones(4)
            inside = x.view(2, 2)
            of_normal = normal.view(2, 2)
        outside = x.view(2, 2)
        return [(v._base is None, v._is_view(), v.is_inference()) for v in (inside, outside, of_normal)] + \
            [of_normal._base is normal, normal.view(4)._is_view(), normal._is_view()]

    assert outcome(tw) == outcome(torch)


def test_from_dlpack_of_foreign_memory_inside_the_mode_is_an_inference_tensor():
    def outcome(lib):
        with lib.inference_mode():
            made = lib.from_dlpack(np.ones(3, dtype=np.float32))
        later = lib.from_dlpack(np.ones(3, dtype=np.float32))
        return made.is_inference(), later.is_inference()

    assert outcome(tw) == outcome(torch)

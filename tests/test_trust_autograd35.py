"""Autograd as user code exercises it, against torch: tensor hooks (order, replacement, removal, retain_grad,
post-accumulate hooks), module hooks (kwargs, always_call, full backward hooks with None entries, in-place writes
refused through a hooked module's views, global hooks, prepend), custom autograd.Function (saved inputs, outputs
and intermediates, mark_dirty, mark_non_differentiable, materialize_grads, needs_input_grad, setup_context, vmap,
once_differentiable, double backward), higher order (gradient penalties through common layers, Hessian-vector
products, autograd.functional), backward(inputs=), retain_graph, allow_unused and materialize_grads, saved-tensor
hooks and save_on_cpu, multi-grad hooks, anomaly mode, grad modes and inference tensors, and a node's own hooks.

Each scenario runs once with ``m = torch`` and once with ``m = tilewise``; its returned values, what it logged, the
error it raised (type, and torch's message within ours) and its warnings must agree.
"""

from __future__ import annotations

import re
import warnings

import numpy as np
import pytest
import torch

import tilewise as tw

SCENARIOS: dict = {}
# warned once per process (by torch and by tilewise): compared on its own (test_create_graph_backward_warns_once)
ONCE_PER_PROCESS = "Using backward() with create_graph=True"
# where our message words a detail differently from torch's (a dtype as float32, not torch.FloatTensor; our hint
# in place of torch's anomaly-mode one), the fragments of torch's message that ours must hold
FRAGMENTS = {
    "hook_wrong_dtype": ("hook '<lambda>' has changed the type of value", "float32", "float64"),
    "custom_fn_saved_modified": (
        "one of the variables needed for gradient computation has been modified by an inplace operation",
        "which is output 0 of Add, is at version 1; expected version 0 instead",
    ),
    "grad_input_nograd": ("One of the differentiated Tensors", "does not require grad"),
    "custom_fn_forward_instance_call": ("Legacy autograd function with non-static forward method is deprecated",),
}


def scenario(fn):
    SCENARIOS[fn.__name__] = fn
    return fn


def _plain(v):
    if isinstance(v, (torch.Tensor, tw.Tensor)):
        values = v.detach().tolist()
        return ("tensor", tuple(v.shape), str(v.dtype).split(".")[-1], values)
    if isinstance(v, (list, tuple)):
        return (type(v).__name__, [_plain(x) for x in v])
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    return v


def _same(a, b) -> bool:
    if isinstance(a, tuple) and a and a[0] == "tensor":
        return (
            isinstance(b, tuple)
            and b[:3] == a[:3]
            and np.allclose(
                np.asarray(b[3], dtype=float), np.asarray(a[3], dtype=float), rtol=1e-5, atol=1e-6, equal_nan=True
            )
        )
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, float) and isinstance(b, float):
        return np.isclose(a, b, rtol=1e-5, equal_nan=True)
    return a == b


def _first_line(message: str) -> str:
    return message.splitlines()[0] if message else message


def _outcome(fn, m):
    log: list = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            value, error = fn(m, log), None
        except Exception as exc:  # noqa: BLE001 — what the scenario raises is compared
            value, error = None, exc
    seen = [
        (w.category.__name__, _first_line(str(w.message))[:72])
        for w in caught
        if (not issubclass(w.category, DeprecationWarning) or "instantiated" in str(w.message))
        and ONCE_PER_PROCESS not in str(w.message)
    ]
    return _plain(value), _plain(log), error, seen


def _normalized(message: str) -> str:
    return message.replace("torch.", "tilewise.").replace("PyTorch", "tilewise")


# --------------------------------------------------------------------- tensor hooks, retain_grad, post-accumulate hooks


@scenario
def leaf_hooks_order_modify(m, log):
    x = m.tensor([1.0, 2.0, 3.0], requires_grad=True)
    x.register_hook(lambda g: log.append(("h1", g)) or g * 2)
    h = x.register_hook(lambda g: log.append(("h2", g)) or g + 1)
    x.register_hook(lambda g: log.append(("h3", g)))
    (x * x).sum().backward()
    h.remove()
    h.remove()
    (x * x).sum().backward()
    return x.grad


@scenario
def nonleaf_hooks(m, log):
    x = m.tensor([1.0, 2.0, 3.0], requires_grad=True)
    y = x * 3
    y.register_hook(lambda g: log.append(("a", g)) or g * 10)
    y.register_hook(lambda g: log.append(("b", g)))
    y.retain_grad()
    y.register_hook(lambda g: log.append(("c", g)) or g + 1)
    (y * y).sum().backward()
    return x.grad, y.grad


@scenario
def retain_grad_before_hooks(m, log):
    x = m.tensor([1.0, 2.0, 3.0], requires_grad=True)
    y = x * 3
    y.retain_grad()
    y.register_hook(lambda g: g * 10)
    (y * y).sum().backward()
    return x.grad, y.grad


@scenario
def retain_grad_twice_accumulates(m, log):
    x = m.tensor([1.0, 2.0, 3.0], requires_grad=True)
    y = x * 3
    y.retain_grad()
    z = (y * y).sum()
    z.backward(retain_graph=True)
    a = y.grad.clone()
    z.backward()
    return a, y.grad, x.grad


@scenario
def post_acc(m, log):
    w = m.nn.Parameter(m.tensor([1.0, 2.0]))
    w.register_hook(lambda g: log.append(("pre", g)) or g * 2)

    def post(p):
        log.append(("post", p.grad.clone()))
        with m.no_grad():
            p.sub_(0.1 * p.grad)
        p.grad = None

    w.register_post_accumulate_grad_hook(post)
    (w * w).sum().backward()
    (w * w).sum().backward()
    return w, w.grad


@scenario
def post_acc_nonleaf(m, log):
    w = m.tensor([1.0, 2.0], requires_grad=True)
    (w * 2).register_post_accumulate_grad_hook(lambda p: None)


@scenario
def post_acc_no_grad(m, log):
    w = m.tensor([1.0, 2.0])
    w.register_post_accumulate_grad_hook(lambda p: None)


@scenario
def post_acc_with_autograd_grad(m, log):
    w = m.tensor([1.0, 2.0], requires_grad=True)
    w.register_post_accumulate_grad_hook(lambda p: log.append("post"))
    (g,) = m.autograd.grad((w * w).sum(), w)
    return g


@scenario
def used_twice(m, log):
    x = m.tensor([1.0, 2.0], requires_grad=True)
    y = x * 2
    y.register_hook(lambda g: log.append(("y", g)))
    x.register_hook(lambda g: log.append(("x", g)))
    z = (y * y + y.sin() + x).sum()
    z.backward()
    return x.grad


@scenario
def hook_raises(m, log):
    x = m.tensor([1.0, 2.0], requires_grad=True)
    y = x * 2

    def bad(g):
        raise ValueError("boom")

    y.register_hook(bad)
    try:
        y.sum().backward()
    except ValueError as e:
        log.append(str(e))
    return x.grad


@scenario
def hook_raises_leaf(m, log):
    x = m.tensor([1.0, 2.0], requires_grad=True)

    def bad(g):
        raise KeyError("boom")

    x.register_hook(bad)
    (x * 2).sum().backward()


@scenario
def hook_wrong_shape(m, log):
    x = m.tensor([1.0, 2.0], requires_grad=True)
    y = x * 2
    y.register_hook(lambda g: g.sum())
    y.sum().backward()


@scenario
def hook_wrong_dtype(m, log):
    x = m.tensor([1.0, 2.0], requires_grad=True)
    y = x * 2
    y.register_hook(lambda g: g.double())
    y.sum().backward()


@scenario
def hook_returns_nontensor(m, log):
    x = m.tensor([1.0, 2.0], requires_grad=True)
    y = x * 2
    y.register_hook(lambda g: 3)
    y.sum().backward()


@scenario
def hook_wrong_shape_leaf(m, log):
    x = m.tensor([1.0, 2.0], requires_grad=True)
    x.register_hook(lambda g: g.sum())
    (x * 2).sum().backward()


@scenario
def hook_grad_mode(m, log):
    x = m.tensor([1.0, 2.0], requires_grad=True)
    y = x * 2
    y.register_hook(lambda g: log.append(m.is_grad_enabled()))
    y.sum().backward()
    y = x * 2
    y.register_hook(lambda g: log.append(m.is_grad_enabled()))
    y.sum().backward(create_graph=True)


@scenario
def hook_remove_during(m, log):
    x = m.tensor([1.0, 2.0], requires_grad=True)
    y = x * 2
    hs = []

    def h1(g):
        log.append("h1")
        hs[1].remove()

    hs.append(y.register_hook(h1))
    hs.append(y.register_hook(lambda g: log.append("h2")))
    y.sum().backward()


@scenario
def hook_on_view(m, log):
    x = m.tensor([1.0, 2.0, 3.0, 4.0], requires_grad=True)
    y = x * 1
    v = y[1:3]
    v.register_hook(lambda g: log.append(("v", g)) or g * 5)
    (v * v).sum().backward()
    return x.grad


@scenario
def hook_on_leaf_via_autograd_grad(m, log):
    x = m.tensor([1.0, 2.0], requires_grad=True)
    x.register_hook(lambda g: log.append(("x", g)) or g * 3)
    return m.autograd.grad((x * x).sum(), x)


@scenario
def hook_remove_handle_ctx(m, log):
    x = m.tensor([1.0, 2.0], requires_grad=True)
    with x.register_hook(lambda g: g * 3):
        pass
    (x * x).sum().backward()
    return x.grad


@scenario
def hook_on_nograd(m, log):
    x = m.tensor([1.0, 2.0])
    x.register_hook(lambda g: g)


@scenario
def retain_grad_nograd(m, log):
    x = m.tensor([1.0, 2.0])
    x.retain_grad()


@scenario
def retains_grad_attr(m, log):
    x = m.tensor([1.0, 2.0], requires_grad=True)
    y = x * 2
    a = y.retains_grad
    y.retain_grad()
    return a, y.retains_grad, x.retains_grad


@scenario
def grad_nonleaf_warning(m, log):
    x = m.tensor([1.0, 2.0], requires_grad=True)
    y = x * 2
    y.sum().backward()
    return y.grad


@scenario
def requires_grad_nonleaf(m, log):
    x = m.tensor([1.0, 2.0], requires_grad=True)
    (x * 2).requires_grad_(False)


@scenario
def requires_grad_nonleaf_true(m, log):
    x = m.tensor([1.0, 2.0], requires_grad=True)
    return (x * 2).requires_grad_(True).requires_grad


# --------------------------------------------------------------------------------------------------------- module hooks


def lin(m):
    m.manual_seed(0)
    layer = m.nn.Linear(3, 2)
    with m.no_grad():
        layer.weight.copy_(m.tensor([[1.0, 2.0, 3.0], [-1.0, 0.5, 2.0]]))
        layer.bias.copy_(m.tensor([0.1, -0.2]))
    return layer


@scenario
def fwd_pre_kwargs(m, log):
    class M(m.nn.Module):
        def forward(self, x, scale=1.0, *, shift=0.0):
            return x * scale + shift

    mod = M()

    def pre(module, args, kwargs):
        log.append(("pre", len(args), sorted(kwargs)))
        return (args[0] * 2,), {**kwargs, "shift": 1.0}

    mod.register_forward_pre_hook(pre, with_kwargs=True)

    def pre2(module, args):
        log.append(("pre2", len(args)))
        return args[0] + 1

    mod.register_forward_pre_hook(pre2)
    return mod(m.tensor([1.0, 2.0]), scale=3.0)


@scenario
def fwd_pre_kwargs_bad_return(m, log):
    class M(m.nn.Module):
        def forward(self, x):
            return x

    mod = M()
    mod.register_forward_pre_hook(lambda mod, a, k: a, with_kwargs=True)
    return mod(m.tensor([1.0]))


@scenario
def fwd_hook_kwargs_always_call(m, log):
    class M(m.nn.Module):
        def forward(self, x, flag=False):
            if flag:
                raise ValueError("bad forward")
            return x + 1

    mod = M()
    mod.register_forward_hook(
        lambda mod, a, k, out: log.append(("always", len(a), sorted(k), out)), with_kwargs=True, always_call=True
    )
    mod.register_forward_hook(lambda mod, a, out: log.append(("normal", out)))
    mod(m.tensor([1.0]))
    try:
        mod(m.tensor([1.0]), flag=True)
    except ValueError as e:
        log.append(str(e))


@scenario
def fwd_hook_kwargs_modify_out(m, log):
    mod = lin(m)
    mod.register_forward_hook(lambda mod, a, k, out: out * 10, with_kwargs=True)
    mod.register_forward_hook(lambda mod, a, out: out + 1, prepend=True)
    return mod(m.tensor([[1.0, 1.0, 1.0]]))


@scenario
def prepend_order(m, log):
    mod = lin(m)
    for i in range(3):
        mod.register_forward_pre_hook(lambda mod, a, i=i: log.append(("pre", i)), prepend=(i == 1))
        mod.register_forward_hook(lambda mod, a, o, i=i: log.append(("fwd", i)), prepend=(i == 2))
        mod.register_full_backward_hook(lambda mod, gi, go, i=i: log.append(("bwd", i)))
        mod.register_full_backward_pre_hook(lambda mod, go, i=i: log.append(("bpre", i)), prepend=(i == 2))
    mod(m.tensor([[1.0, 1.0, 1.0]], requires_grad=True)).sum().backward()


@scenario
def global_forward_hooks(m, log):
    mod = lin(m)
    h1 = m.nn.modules.module.register_module_forward_hook(lambda mod, a, o: log.append(("gfwd", type(mod).__name__)))
    h2 = m.nn.modules.module.register_module_forward_pre_hook(lambda mod, a: log.append(("gpre", type(mod).__name__)))
    h3 = m.nn.modules.module.register_module_full_backward_hook(
        lambda mod, gi, go: log.append(("gbwd", len(gi), len(go)))
    )
    h4 = m.nn.modules.module.register_module_full_backward_pre_hook(lambda mod, go: log.append(("gbpre", len(go))))
    mod.register_forward_hook(lambda mod, a, o: log.append("local"))
    try:
        x = m.tensor([[1.0, 1.0, 1.0]], requires_grad=True)
        mod(x).sum().backward()
    finally:
        h1.remove()
        h2.remove()
        h3.remove()
        h4.remove()
    mod(m.tensor([[1.0, 1.0, 1.0]]))


@scenario
def global_forward_hook_always_call(m, log):
    class M(m.nn.Module):
        def forward(self, x):
            raise ValueError("x")

    h = m.nn.modules.module.register_module_forward_hook(lambda mod, a, o: log.append(("g", o)), always_call=True)
    try:
        M()(m.tensor([1.0]))
    except ValueError:
        log.append("raised")
    finally:
        h.remove()


@scenario
def full_bwd_none_entries(m, log):
    class M(m.nn.Module):
        def forward(self, a, b):
            return a * 2, b.detach() * 3

    mod = M()

    def hook(mod, gin, gout):
        log.append(("gin", gin))
        log.append(("gout", gout))

    mod.register_full_backward_hook(hook)
    a = m.tensor([1.0, 2.0], requires_grad=True)
    b = m.tensor([1.0, 2.0], requires_grad=True)
    x, y = mod(a, b)
    x.sum().backward()
    return a.grad


@scenario
def full_bwd_input_nograd(m, log):
    layer = lin(m)

    def hook(mod, gin, gout):
        log.append(("gin", gin))
        log.append(("gout", gout))

    layer.register_full_backward_hook(hook)
    x = m.tensor([[1.0, 2.0, 3.0]])
    layer(x).sum().backward()
    return layer.weight.grad


@scenario
def full_bwd_modify_gin(m, log):
    layer = lin(m)
    layer.register_full_backward_hook(lambda mod, gin, gout: (gin[0] * 100,))
    layer.register_full_backward_pre_hook(lambda mod, gout: (gout[0] * 2,))
    x = m.tensor([[1.0, 2.0, 3.0]], requires_grad=True)
    layer(x).sum().backward()
    return x.grad, layer.weight.grad


@scenario
def full_bwd_inplace_inside(m, log):
    class M(m.nn.Module):
        def forward(self, x):
            y = x * 2
            y.relu_()
            return y

    mod = M()
    mod.register_full_backward_hook(lambda mod, gin, gout: log.append((gin, gout)))
    x = m.tensor([-1.0, 2.0], requires_grad=True)
    mod(x).sum().backward()
    return x.grad


@scenario
def full_bwd_inplace_relu_module(m, log):
    mod = m.nn.Sequential(lin(m), m.nn.ReLU(inplace=True))
    mod[1].register_full_backward_hook(lambda mod, gin, gout: log.append((gin, gout)))
    x = m.tensor([[1.0, -2.0, 3.0]], requires_grad=True)
    mod(x).sum().backward()
    return x.grad


@scenario
def full_bwd_output_view_modified_inplace(m, log):
    class M(m.nn.Module):
        def forward(self, x):
            return x[0]

    mod = M()
    mod.register_full_backward_hook(lambda mod, gin, gout: None)
    x = m.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
    y = x * 1
    out = mod(y)
    out.mul_(2)


@scenario
def full_bwd_output_view_modified_inplace2(m, log):
    class M(m.nn.Module):
        def forward(self, x):
            return x.view(-1)

    mod = M()
    mod.register_full_backward_hook(lambda mod, gin, gout: None)
    x = m.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
    out = mod(x * 1)
    out += 1


@scenario
def full_bwd_input_is_output(m, log):
    class M(m.nn.Module):
        def forward(self, x):
            return x

    mod = M()
    mod.register_full_backward_hook(lambda mod, gin, gout: log.append((gin, gout)))
    x = m.tensor([1.0, 2.0], requires_grad=True)
    (mod(x * 1) * 3).sum().backward()
    return x.grad


@scenario
def full_bwd_inplace_input_module(m, log):
    class M(m.nn.Module):
        def forward(self, x):
            return x.mul_(2)

    mod = M()
    mod.register_full_backward_hook(lambda mod, gin, gout: log.append((gin, gout)))
    x = m.tensor([1.0, 2.0], requires_grad=True)
    (mod(x * 1) * 3).sum().backward()
    return x.grad


@scenario
def full_bwd_kwargs_tensor(m, log):
    class M(m.nn.Module):
        def forward(self, x, w=None):
            return x * w

    mod = M()
    mod.register_full_backward_hook(lambda mod, gin, gout: log.append((gin, gout)))
    x = m.tensor([1.0, 2.0], requires_grad=True)
    w = m.tensor([3.0, 4.0], requires_grad=True)
    mod(x, w=w).sum().backward()
    return x.grad, w.grad


@scenario
def full_bwd_multiple_calls(m, log):
    layer = lin(m)
    layer.register_full_backward_hook(lambda mod, gin, gout: log.append(("h", gin, gout)))
    x = m.tensor([[1.0, 2.0, 3.0]], requires_grad=True)
    (layer(x).sum() + layer(2 * x).sum()).backward()


@scenario
def full_bwd_pre_returns_none_entries(m, log):
    class M(m.nn.Module):
        def forward(self, a):
            return a * 2, a * 3

    mod = M()

    def pre(mod, gout):
        log.append(("pre", gout))

    mod.register_full_backward_pre_hook(pre)
    mod.register_full_backward_hook(lambda mod, gin, gout: log.append(("h", gin, gout)))
    a = m.tensor([1.0, 2.0], requires_grad=True)
    x, y = mod(a)
    x.sum().backward()
    return a.grad


@scenario
def full_bwd_non_tensor_output(m, log):
    class M(m.nn.Module):
        def forward(self, a):
            return {"x": a * 2}

    mod = M()
    mod.register_full_backward_hook(lambda mod, gin, gout: log.append(("h", gin, gout)))
    a = m.tensor([1.0, 2.0], requires_grad=True)
    mod(a)["x"].sum().backward()
    return a.grad


@scenario
def fwd_hook_nontensor_args(m, log):
    layer = lin(m)
    layer.register_forward_pre_hook(lambda mod, a: log.append(type(a).__name__))
    layer.register_forward_hook(lambda mod, a, o: log.append((type(a).__name__, len(a))))
    layer(m.tensor([[1.0, 2.0, 3.0]]))


# --------------------------------------------------------------------------------------------- custom autograd.Function


@scenario
def save_inputs_outputs_intermediates(m, log):
    class Fn(m.autograd.Function):
        @staticmethod
        def forward(ctx, x, w):
            h = x * w
            out = h.exp()
            ctx.save_for_backward(x, w, h, out)
            return out

        @staticmethod
        def backward(ctx, g):
            x, w, h, out = ctx.saved_tensors
            log.append(("grad_enabled", m.is_grad_enabled()))
            return g * out * w, g * out * x

    x = m.tensor([0.5, 1.0], requires_grad=True)
    w = m.tensor([2.0, -1.0], requires_grad=True)
    y = Fn.apply(x, w)
    y.sum().backward()
    return y, x.grad, w.grad


@scenario
def saved_tensors_twice_access(m, log):
    class Fn(m.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return g * 2

    x = m.tensor([1.0], requires_grad=True)
    y = Fn.apply(x)
    y.backward()
    _ = y.grad_fn.saved_tensors


@scenario
def saved_tensors_after_backward(m, log):
    class Fn(m.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * 2

        @staticmethod
        def backward(ctx, g):
            _ = ctx.saved_tensors
            return g * 2

    x = m.tensor([1.0], requires_grad=True)
    y = Fn.apply(x)
    y.backward(retain_graph=False)
    y.backward()


@scenario
def save_non_tensor(m, log):
    class Fn(m.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x, 3)
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return g * 2

    Fn.apply(m.tensor([1.0], requires_grad=True))


@scenario
def save_none(m, log):
    class Fn(m.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x, None)
            return x * 2

        @staticmethod
        def backward(ctx, g):
            a, b = ctx.saved_tensors
            log.append(b)
            return g * 2

    Fn.apply(m.tensor([1.0], requires_grad=True)).backward()


@scenario
def mark_dirty_inplace(m, log):
    class MulInplace(m.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            x.mul_(2)
            ctx.mark_dirty(x)
            return x

        @staticmethod
        def backward(ctx, g):
            return g * 2

    a = m.tensor([1.0, 2.0], requires_grad=True)
    x = a * 1
    y = MulInplace.apply(x)
    log.append(y is x)
    log.append(type(y.grad_fn).__name__)
    log.append(x._version)
    (y * y).sum().backward()
    return y, a.grad


@scenario
def mark_dirty_leaf(m, log):
    class MulInplace(m.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            x.mul_(2)
            ctx.mark_dirty(x)
            return x

        @staticmethod
        def backward(ctx, g):
            return g * 2

    a = m.tensor([1.0, 2.0], requires_grad=True)
    MulInplace.apply(a)


@scenario
def inplace_without_mark_dirty(m, log):
    class MulInplace(m.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            x.mul_(2)
            return x

        @staticmethod
        def backward(ctx, g):
            return g * 2

    a = m.tensor([1.0, 2.0], requires_grad=True)
    x = a * 1
    y = MulInplace.apply(x)
    log.append(y is x)
    (y * y).sum().backward()
    return y, a.grad


@scenario
def mark_dirty_not_returned(m, log):
    class Fn(m.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            x.mul_(2)
            ctx.mark_dirty(x)
            return x * 1

        @staticmethod
        def backward(ctx, g):
            return g * 2

    a = m.tensor([1.0, 2.0], requires_grad=True)
    Fn.apply(a * 1)


@scenario
def mark_dirty_view(m, log):
    class MulInplace(m.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            x.mul_(2)
            ctx.mark_dirty(x)
            return x

        @staticmethod
        def backward(ctx, g):
            return g * 2

    a = m.tensor([1.0, 2.0, 3.0], requires_grad=True)
    b = a * 1
    v = b[1:]
    MulInplace.apply(v)
    (b * b).sum().backward()
    return b, a.grad


@scenario
def return_input_view_then_inplace(m, log):
    class Id(m.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x

        @staticmethod
        def backward(ctx, g):
            return g

    a = m.tensor([1.0, 2.0], requires_grad=True)
    y = Id.apply(a * 1)
    log.append(y._is_view())
    y.mul_(2)


@scenario
def return_view_of_input_then_inplace(m, log):
    class V(m.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x[1:]

        @staticmethod
        def backward(ctx, g):
            return m.cat([g.new_zeros(1), g])

    a = m.tensor([1.0, 2.0], requires_grad=True)
    y = V.apply(a * 1)
    log.append(y._is_view())
    y.mul_(2)


@scenario
def non_differentiable(m, log):
    class Sort(m.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            v, i = x.sort()
            ctx.mark_non_differentiable(i)
            ctx.save_for_backward(i)
            return v, i

        @staticmethod
        def backward(ctx, gv, gi):
            log.append(("gi", gi))
            (i,) = ctx.saved_tensors
            g = m.zeros_like(gv)
            g[i] = gv
            return g

    x = m.tensor([3.0, 1.0, 2.0], requires_grad=True)
    v, i = Sort.apply(x)
    log.append((v.requires_grad, i.requires_grad, i.grad_fn is None))
    (v * m.tensor([1.0, 2.0, 3.0])).sum().backward()
    return x.grad


@scenario
def non_differentiable_float(m, log):
    class Fn(m.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            a = x * 2
            b = x * 3
            ctx.mark_non_differentiable(b)
            return a, b

        @staticmethod
        def backward(ctx, ga, gb):
            log.append(("gb", gb))
            return ga * 2

    x = m.tensor([3.0, 1.0], requires_grad=True)
    a, b = Fn.apply(x)
    log.append((a.requires_grad, b.requires_grad))
    (a.sum() + b.sum()).backward()
    return x.grad


@scenario
def non_differentiable_backward_through(m, log):
    class Fn(m.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            b = x * 3
            ctx.mark_non_differentiable(b)
            return b

        @staticmethod
        def backward(ctx, gb):
            return gb

    x = m.tensor([3.0, 1.0], requires_grad=True)
    b = Fn.apply(x)
    b.sum().backward()


@scenario
def materialize_false(m, log):
    class Fn(m.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.set_materialize_grads(False)
            return x * 2, x * 3

        @staticmethod
        def backward(ctx, ga, gb):
            log.append((ga, gb))
            g = None
            if ga is not None:
                g = ga * 2
            if gb is not None:
                g = gb * 3 if g is None else g + gb * 3
            return g

    x = m.tensor([3.0, 1.0], requires_grad=True)
    a, b = Fn.apply(x)
    a.sum().backward()
    return x.grad


@scenario
def materialize_true(m, log):
    class Fn(m.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2, x * 3

        @staticmethod
        def backward(ctx, ga, gb):
            log.append((ga, gb))
            return ga * 2 + gb * 3

    x = m.tensor([3.0, 1.0], requires_grad=True)
    a, b = Fn.apply(x)
    b.sum().backward()
    return x.grad


@scenario
def needs_input_grad(m, log):
    class Fn(m.autograd.Function):
        @staticmethod
        def forward(ctx, x, k, w, flag=True):
            log.append(ctx.needs_input_grad)
            return x * w * k

        @staticmethod
        def backward(ctx, g):
            log.append(ctx.needs_input_grad)
            return (g if ctx.needs_input_grad[0] else None), None, (g if ctx.needs_input_grad[2] else None), None

    x = m.tensor([3.0, 1.0], requires_grad=True)
    w = m.tensor([1.0, 1.0])
    Fn.apply(x, 2, w).sum().backward()
    Fn.apply(x, 2, w, False).sum().backward()
    return x.grad


@scenario
def too_many_grads(m, log):
    class Fn(m.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return g, g

    x = m.tensor([3.0, 1.0], requires_grad=True)
    Fn.apply(x).sum().backward()


@scenario
def too_few_grads(m, log):
    class Fn(m.autograd.Function):
        @staticmethod
        def forward(ctx, x, y):
            return x * y

        @staticmethod
        def backward(ctx, g):
            return g

    x = m.tensor([3.0, 1.0], requires_grad=True)
    Fn.apply(x, x).sum().backward()


@scenario
def grad_for_nongrad_input(m, log):
    class Fn(m.autograd.Function):
        @staticmethod
        def forward(ctx, x, y):
            return x * y

        @staticmethod
        def backward(ctx, g):
            return g, g

    x = m.tensor([3.0, 1.0], requires_grad=True)
    y = m.tensor([3.0, 1.0])
    Fn.apply(x, y).sum().backward()
    return x.grad


@scenario
def grad_for_nontensor_input(m, log):
    class Fn(m.autograd.Function):
        @staticmethod
        def forward(ctx, x, k):
            return x * k

        @staticmethod
        def backward(ctx, g):
            return g, g

    x = m.tensor([3.0, 1.0], requires_grad=True)
    Fn.apply(x, 2).sum().backward()


@scenario
def wrong_shape_grad(m, log):
    class Fn(m.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return g[:1]

    x = m.tensor([3.0, 1.0], requires_grad=True)
    Fn.apply(x).sum().backward()


@scenario
def nontensor_grad(m, log):
    class Fn(m.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return 1.0

    x = m.tensor([3.0, 1.0], requires_grad=True)
    Fn.apply(x).sum().backward()


@scenario
def setup_context_style(m, log):
    class Fn(m.autograd.Function):
        @staticmethod
        def forward(x, w, scale=2.0):
            return (x * w * scale).sin()

        @staticmethod
        def setup_context(ctx, inputs, output):
            x, w, scale = inputs
            log.append(("setup", len(inputs), scale, output.requires_grad))
            ctx.save_for_backward(x, w, output)
            ctx.scale = scale

        @staticmethod
        def backward(ctx, g):
            x, w, out = ctx.saved_tensors
            c = (x * w * ctx.scale).cos() * g * ctx.scale
            return c * w, c * x, None

    x = m.tensor([0.5, 1.0], requires_grad=True)
    w = m.tensor([2.0, -1.0], requires_grad=True)
    y = Fn.apply(x, w, scale=3.0)
    y.sum().backward()
    return y, x.grad, w.grad


@scenario
def setup_context_forward_with_ctx_error(m, log):
    class Fn(m.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def setup_context(ctx, inputs, output):
            pass

        @staticmethod
        def backward(ctx, g):
            return g

    Fn.apply(m.tensor([1.0], requires_grad=True))


@scenario
def vmap_generate_rule(m, log):
    class Cube(m.autograd.Function):
        generate_vmap_rule = True

        @staticmethod
        def forward(x):
            return x**3, 3 * x**2

        @staticmethod
        def setup_context(ctx, inputs, output):
            ctx.save_for_backward(inputs[0], output[1])

        @staticmethod
        def backward(ctx, g, gd):
            x, d = ctx.saved_tensors
            return g * d + gd * 6 * x

    x = m.tensor([[1.0, 2.0], [3.0, 4.0]])
    f = lambda v: Cube.apply(v)[0]
    vm = m.vmap(f)(x)
    gr = m.vmap(m.func.grad(lambda v: Cube.apply(v)[0].sum()))(x)
    return vm, gr


@scenario
def func_grad_custom(m, log):
    class Cube(m.autograd.Function):
        @staticmethod
        def forward(x):
            return x**3

        @staticmethod
        def setup_context(ctx, inputs, output):
            ctx.save_for_backward(inputs[0])

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return g * 3 * x**2

    return m.func.grad(lambda v: Cube.apply(v).sum())(m.tensor([1.0, 2.0]))


@scenario
def once_diff(m, log):
    from importlib import import_module

    od = import_module(m.__name__ + ".autograd.function").once_differentiable

    class Fn(m.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x**2

        @staticmethod
        @od
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            log.append(m.is_grad_enabled())
            return 2 * x * g

    x = m.tensor([1.0, 2.0], requires_grad=True)
    y = Fn.apply(x).sum()
    (g,) = m.autograd.grad(y, x, create_graph=True)
    log.append((g.requires_grad, type(g.grad_fn).__name__ if g.grad_fn is not None else None))
    try:
        g.sum().backward()
    except RuntimeError as e:
        log.append(str(e))
    return g


@scenario
def once_diff_no_create(m, log):
    from importlib import import_module

    od = import_module(m.__name__ + ".autograd.function").once_differentiable

    class Fn(m.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x**2

        @staticmethod
        @od
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return 2 * x * g

    x = m.tensor([1.0, 2.0], requires_grad=True)
    Fn.apply(x).sum().backward()
    return x.grad


@scenario
def double_backward_custom(m, log):
    class Sq(m.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x**2

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return 2 * x * g

    x = m.tensor([1.0, 2.0, 3.0], requires_grad=True)
    y = Sq.apply(x).sin().sum()
    (g,) = m.autograd.grad(y, x, create_graph=True)
    (gg,) = m.autograd.grad(g.sum(), x)
    return g, gg


@scenario
def double_backward_custom_saved_output(m, log):
    class Exp(m.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            r = x.exp()
            ctx.save_for_backward(r)
            return r

        @staticmethod
        def backward(ctx, g):
            (r,) = ctx.saved_tensors
            return r * g

    x = m.tensor([0.1, 0.2], requires_grad=True)
    y = Exp.apply(x).sum()
    (g,) = m.autograd.grad(y, x, create_graph=True)
    (gg,) = m.autograd.grad(g.sum(), x)
    return g, gg


@scenario
def custom_fn_grad_fn_name(m, log):
    class MyFn(m.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return g * 2

    y = MyFn.apply(m.tensor([1.0], requires_grad=True))
    return (
        y.grad_fn.name(),
        type(y.grad_fn).__name__,
        [type(n).__name__ if n is not None else None for n, _ in y.grad_fn.next_functions],
    )


@scenario
def custom_fn_non_tensor_output(m, log):
    class MyFn(m.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2, 5

        @staticmethod
        def backward(ctx, g, g2):
            log.append(g2)
            return g * 2

    y, k = MyFn.apply(m.tensor([1.0], requires_grad=True))
    y.backward()
    return k


@scenario
def custom_fn_int_output(m, log):
    class MyFn(m.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return (x * 2).long()

        @staticmethod
        def backward(ctx, g):
            return g

    y = MyFn.apply(m.tensor([1.0], requires_grad=True))
    return y.requires_grad


@scenario
def custom_fn_no_grad_inside(m, log):
    class MyFn(m.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            log.append(m.is_grad_enabled())
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return g

    MyFn.apply(m.tensor([1.0], requires_grad=True))


@scenario
def custom_fn_forward_instance_call(m, log):
    class MyFn(m.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return g

    MyFn()(m.tensor([1.0]))


@scenario
def custom_fn_kwargs_old_style(m, log):
    class MyFn(m.autograd.Function):
        @staticmethod
        def forward(ctx, x, scale=2.0):
            return x * scale

        @staticmethod
        def backward(ctx, g):
            return g, None

    return MyFn.apply(m.tensor([1.0], requires_grad=True), scale=3.0)


@scenario
def custom_fn_saved_modified(m, log):
    class Sq(m.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x**2

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return 2 * x * g

    a = m.tensor([1.0, 2.0], requires_grad=True)
    x = a * 1
    y = Sq.apply(x)
    x.add_(1)
    y.sum().backward()


@scenario
def custom_fn_mark_dirty_and_save(m, log):
    class F2(m.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            x.add_(1)
            ctx.mark_dirty(x)
            return x

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return g

    a = m.tensor([1.0, 2.0], requires_grad=True)
    y = F2.apply(a * 1)
    y.sum().backward()
    return a.grad


# ----------------------------------- higher order, backward(inputs=), autograd.grad and its errors, autograd.functional


def data(m, *shape, seed=0):
    return m.tensor(np.random.default_rng(seed).standard_normal(shape), dtype=m.float64)


def penalty(m, f, x, params=()):
    x = x.clone().requires_grad_()
    out = f(x)
    (g,) = m.autograd.grad(out.sum() if out.dim() else out, x, create_graph=True)
    pen = (g.norm(2) - 1) ** 2
    ps = [x] + list(params)
    return m.autograd.grad(pen, ps)


@scenario
def gp_linear(m, log):
    m.manual_seed(0)
    layer = m.nn.Linear(4, 3).double()
    with m.no_grad():
        layer.weight.copy_(data(m, 3, 4, seed=1))
        layer.bias.copy_(data(m, 3, seed=2))
    return penalty(m, lambda x: m.tanh(layer(x)), data(m, 2, 4), layer.parameters())


@scenario
def gp_conv(m, log):
    w = data(m, 3, 2, 3, 3, seed=1).requires_grad_()
    b = data(m, 3, seed=2).requires_grad_()
    return penalty(
        m, lambda x: m.nn.functional.gelu(m.nn.functional.conv2d(x, w, b, padding=1)), data(m, 1, 2, 5, 5), [w, b]
    )


@scenario
def gp_conv_stride(m, log):
    w = data(m, 3, 2, 3, 3, seed=1).requires_grad_()
    return penalty(m, lambda x: m.nn.functional.conv2d(x, w, stride=2).relu() ** 2, data(m, 1, 2, 6, 6), [w])


@scenario
def gp_layer_norm(m, log):
    w = data(m, 4, seed=1).requires_grad_()
    b = data(m, 4, seed=2).requires_grad_()
    return penalty(m, lambda x: m.nn.functional.layer_norm(x, (4,), w, b).sin(), data(m, 3, 4), [w, b])


@scenario
def gp_softmax(m, log):
    return penalty(m, lambda x: (m.softmax(x, -1) * data(m, 3, 4, seed=5)).sum(), data(m, 3, 4))


@scenario
def gp_log_softmax(m, log):
    return penalty(m, lambda x: (m.log_softmax(x, -1) * data(m, 3, 4, seed=5)).sum(), data(m, 3, 4))


@scenario
def gp_gelu_tanh(m, log):
    return penalty(m, lambda x: m.nn.functional.gelu(x, approximate="tanh") * m.tanh(x), data(m, 3, 4))


@scenario
def gp_logsumexp(m, log):
    return penalty(m, lambda x: m.logsumexp(x, 1) ** 2, data(m, 3, 4))


@scenario
def gp_cross_entropy(m, log):
    t = m.tensor([1, 0, 3])
    return penalty(m, lambda x: m.nn.functional.cross_entropy(x, t, label_smoothing=0.1), data(m, 3, 4))


@scenario
def gp_cross_entropy_probs(m, log):
    t = m.softmax(data(m, 3, 4, seed=7), -1)
    return penalty(m, lambda x: m.nn.functional.cross_entropy(x, t), data(m, 3, 4))


@scenario
def gp_mse_sigmoid(m, log):
    return penalty(m, lambda x: m.nn.functional.mse_loss(m.sigmoid(x), data(m, 3, 4, seed=3)), data(m, 3, 4))


@scenario
def gp_silu_batchnorm(m, log):
    w = data(m, 4, seed=1).requires_grad_()
    b = data(m, 4, seed=2).requires_grad_()
    return penalty(
        m,
        lambda x: m.nn.functional.silu(m.nn.functional.batch_norm(x, None, None, w, b, training=True)),
        data(m, 5, 4),
        [w, b],
    )


@scenario
def gp_maxpool_leaky(m, log):
    return penalty(
        m, lambda x: m.nn.functional.leaky_relu(m.nn.functional.max_pool2d(x, 2), 0.2) ** 2, data(m, 1, 1, 4, 4)
    )


@scenario
def hvp_manual(m, log):
    x = data(m, 4).requires_grad_()
    v = data(m, 4, seed=3)
    y = (x.sin() * x.exp()).sum() + (x**3).prod()
    (g,) = m.autograd.grad(y, x, create_graph=True)
    (hv,) = m.autograd.grad(g, x, grad_outputs=v)
    return g, hv


@scenario
def func_hvp_vhp(m, log):
    f = lambda x, y: (x.sin() * y.exp()).sum() + (x * y).pow(2).sum()
    xs = (data(m, 3), data(m, 3, seed=1))
    vs = (data(m, 3, seed=2), data(m, 3, seed=3))
    a = m.autograd.functional.hvp(f, xs, vs)
    b = m.autograd.functional.vhp(f, xs, vs)
    c = m.autograd.functional.hessian(f, xs)
    return a, b, c


@scenario
def func_hvp_nonscalar_error(m, log):
    m.autograd.functional.hvp(lambda x: x * 2, data(m, 3), data(m, 3))


@scenario
def func_hvp_v_none_error(m, log):
    m.autograd.functional.hvp(lambda x: (x * 2).sum(), data(m, 3))


@scenario
def func_jacobian_forward_novec(m, log):
    m.autograd.functional.jacobian(lambda x: x, data(m, 3), strategy="forward-mode")


@scenario
def func_jacobian_create_graph(m, log):
    x = data(m, 3).requires_grad_()
    j = m.autograd.functional.jacobian(lambda x: x**3, x, create_graph=True)
    j.trace().backward()
    return j, x.grad


@scenario
def func_jacobian_strict(m, log):
    m.autograd.functional.jacobian(lambda x: data(m, 3), data(m, 3), strict=True)


@scenario
def func_vjp_jvp(m, log):
    f = lambda x: x.sin() * 2
    a = m.autograd.functional.vjp(f, data(m, 3), data(m, 3, seed=1))
    b = m.autograd.functional.jvp(f, data(m, 3), data(m, 3, seed=1))
    return a, b


@scenario
def backward_inputs(m, log):
    x = data(m, 3).requires_grad_()
    w = data(m, 3, seed=1).requires_grad_()
    y = x * w
    y.retain_grad()
    (y.sin()).sum().backward(inputs=[w])
    log.append((x.grad, y.grad))
    (y.sin()).sum().backward(inputs=[y, x]) if False else None
    return w.grad


@scenario
def backward_inputs_nonleaf(m, log):
    x = data(m, 3).requires_grad_()
    y = x * 2
    z = (y.sin()).sum()
    z.backward(inputs=[y])
    return x.grad, y.grad


@scenario
def backward_inputs_empty(m, log):
    x = data(m, 3).requires_grad_()
    (x * 2).sum().backward(inputs=[])


@scenario
def backward_inputs_nograd(m, log):
    x = data(m, 3).requires_grad_()
    (x * 2).sum().backward(inputs=[data(m, 3)])


@scenario
def backward_inputs_unused(m, log):
    x = data(m, 3).requires_grad_()
    w = data(m, 3).requires_grad_()
    (x * 2).sum().backward(inputs=[w])
    return w.grad


@scenario
def backward_inputs_tensor(m, log):
    x = data(m, 3).requires_grad_()
    (x * 2).sum().backward(inputs=x)
    return x.grad


@scenario
def retain_graph_error(m, log):
    x = data(m, 3).requires_grad_()
    y = (x.exp() * 2).sum()
    y.backward()
    y.backward()


@scenario
def retain_graph_error_grad(m, log):
    x = data(m, 3).requires_grad_()
    y = (x.exp() * 2).sum()
    m.autograd.grad(y, x)
    m.autograd.grad(y, x)


@scenario
def retain_graph_ok(m, log):
    x = data(m, 3).requires_grad_()
    y = (x.exp() * 2).sum()
    y.backward(retain_graph=True)
    y.backward()
    return x.grad


@scenario
def grad_nonscalar(m, log):
    x = data(m, 3).requires_grad_()
    m.autograd.grad(x * 2, x)


@scenario
def backward_nonscalar(m, log):
    x = data(m, 3).requires_grad_()
    (x * 2).backward()


@scenario
def backward_no_grad_fn(m, log):
    x = data(m, 3)
    x.sum().backward()


@scenario
def grad_unused(m, log):
    x = data(m, 3).requires_grad_()
    w = data(m, 3).requires_grad_()
    m.autograd.grad((x * 2).sum(), [x, w])


@scenario
def grad_allow_unused(m, log):
    x = data(m, 3).requires_grad_()
    w = data(m, 3).requires_grad_()
    return m.autograd.grad((x * 2).sum(), [x, w], allow_unused=True)


@scenario
def grad_materialize(m, log):
    x = data(m, 3).requires_grad_()
    w = data(m, 3).requires_grad_()
    return m.autograd.grad((x * 2).sum(), [x, w], materialize_grads=True)


@scenario
def grad_materialize_allow_false(m, log):
    x = data(m, 3).requires_grad_()
    m.autograd.grad((x * 2).sum(), [x], materialize_grads=True, allow_unused=False)


@scenario
def grad_input_nograd(m, log):
    x = data(m, 3).requires_grad_()
    m.autograd.grad((x * 2).sum(), [data(m, 3)])


@scenario
def grad_output_nograd(m, log):
    x = data(m, 3).requires_grad_()
    m.autograd.grad(data(m, 3).sum(), [x])


@scenario
def grad_outputs_shape_mismatch(m, log):
    x = data(m, 3).requires_grad_()
    m.autograd.grad(x * 2, x, grad_outputs=data(m, 2))


@scenario
def grad_outputs_dtype_mismatch(m, log):
    x = data(m, 3).requires_grad_()
    return m.autograd.grad(x * 2, x, grad_outputs=data(m, 3).float())


@scenario
def grad_create_graph_on_leaf_result(m, log):
    x = data(m, 3).requires_grad_()
    (g,) = m.autograd.grad((x * 2).sum(), x, create_graph=True)
    return g.requires_grad, g.grad_fn is None


@scenario
def grad_of_intermediate_twice(m, log):
    x = data(m, 3).requires_grad_()
    y = x * 2
    z = (y**2).sum()
    gy, gx = m.autograd.grad(z, [y, x])
    return gy, gx


@scenario
def grad_same_input_twice(m, log):
    x = data(m, 3).requires_grad_()
    return m.autograd.grad((x**2).sum(), [x, x])


@scenario
def backward_grad_tensors_scalar_number(m, log):
    x = data(m, 3).requires_grad_()
    (x * 2).sum().backward(m.tensor(2.0, dtype=m.float64))
    return x.grad


@scenario
def grad_is_grads_batched(m, log):
    x = data(m, 3).requires_grad_()
    return m.autograd.grad(x.sin(), x, grad_outputs=m.eye(3, dtype=m.float64), is_grads_batched=True)


# ------------------------ saved-tensor hooks, multi-grad hooks, anomaly mode, grad modes, inference tensors, node hooks


@scenario
def saved_hooks_basic(m, log):
    def pack(t):
        log.append(("pack", tuple(t.shape)))
        return t.clone()

    def unpack(t):
        log.append(("unpack", tuple(t.shape)))
        return t

    x = data(m, 3).requires_grad_()
    w = data(m, 3, seed=1).requires_grad_()
    with m.autograd.graph.saved_tensors_hooks(pack, unpack):
        y = (x * w).exp().sum()
    y.backward()
    return x.grad, w.grad


@scenario
def saved_hooks_pack_to_tuple(m, log):
    store = {}

    def pack(t):
        k = len(store)
        store[k] = t.detach().numpy().copy() if hasattr(t, "numpy") else None
        return (k, t.shape, t.dtype)

    def unpack(p):
        k, shape, dtype = p
        return m.tensor(store[k], dtype=dtype)

    x = data(m, 3).requires_grad_()
    with m.autograd.graph.saved_tensors_hooks(pack, unpack):
        y = (x.sin() * x).sum()
    y.backward()
    return x.grad


@scenario
def saved_hooks_inplace_after_save(m, log):
    x = data(m, 3).requires_grad_()
    with m.autograd.graph.saved_tensors_hooks(lambda t: t.clone(), lambda t: t):
        a = x * 1
        y = (a * a).sum()
    a.add_(1)
    y.backward()
    return x.grad


@scenario
def saved_hooks_nested(m, log):
    x = data(m, 3).requires_grad_()
    with m.autograd.graph.saved_tensors_hooks(lambda t: log.append("outer") or t, lambda t: t):
        with m.autograd.graph.saved_tensors_hooks(lambda t: log.append("inner") or t, lambda t: t):
            y = (x * x).sum()
        z = (x * x).sum()
    (y + z).backward()
    return x.grad


@scenario
def saved_hooks_custom_fn(m, log):
    class Sq(m.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x**2

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return 2 * x * g

    x = data(m, 3).requires_grad_()
    with m.autograd.graph.saved_tensors_hooks(
        lambda t: log.append("pack") or t * 1, lambda t: log.append("unpack") or t
    ):
        y = Sq.apply(x).sum()
    y.backward()
    return x.grad


@scenario
def saved_hooks_unpack_wrong(m, log):
    x = data(m, 3).requires_grad_()
    with m.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: 3):
        y = (x * x).sum()
    y.backward()


@scenario
def saved_hooks_pack_inplace(m, log):
    x = data(m, 3).requires_grad_()

    def pack(t):
        t.mul_(2)
        return t

    with m.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = (x * 1) * 2
        y = (y * y).sum()


@scenario
def save_on_cpu(m, log):
    x = data(m, 3).requires_grad_()
    with m.autograd.graph.save_on_cpu(pin_memory=False):
        y = (x.exp() * x).sum()
    y.backward()
    return x.grad


@scenario
def disable_saved_hooks(m, log):
    data(m, 3).requires_grad_()
    with m.autograd.graph.disable_saved_tensors_hooks("no hooks here"):
        with m.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
            pass


@scenario
def multi_grad_hook_all(m, log):
    a = data(m, 3).requires_grad_()
    b = data(m, 3, seed=1).requires_grad_()
    c = data(m, 3, seed=2).requires_grad_()

    def hook(grads):
        log.append(("all", grads))

    h = m.autograd.graph.register_multi_grad_hook((a, b, c), hook)
    (a * 2 + b.sin()).sum().backward()
    (a * 3).sum().backward()
    h.remove()
    (a * 3).sum().backward()


@scenario
def multi_grad_hook_any(m, log):
    a = data(m, 3).requires_grad_()
    b = data(m, 3, seed=1).requires_grad_()
    y = a * 2

    def hook(g):
        log.append(("any", g))

    m.autograd.graph.register_multi_grad_hook((y, b), hook, mode="any")
    (y * b).sum().backward(retain_graph=True)
    (y * 1).sum().backward()


@scenario
def multi_grad_hook_nonleaf_all(m, log):
    a = data(m, 3).requires_grad_()
    y = a * 2
    z = a * 3
    m.autograd.graph.register_multi_grad_hook((y, z), lambda gs: log.append(gs))
    (y * z).sum().backward()
    return a.grad


@scenario
def multi_grad_hook_bad_mode(m, log):
    a = data(m, 3).requires_grad_()
    m.autograd.graph.register_multi_grad_hook((a,), lambda gs: None, mode="some")


@scenario
def multi_grad_hook_autograd_grad(m, log):
    a = data(m, 3).requires_grad_()
    b = data(m, 3, seed=1).requires_grad_()
    m.autograd.graph.register_multi_grad_hook((a, b), lambda gs: log.append(gs))
    m.autograd.grad((a * b).sum(), [a])


@scenario
def anomaly_nan(m, log):
    class Bad(m.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 1

        @staticmethod
        def backward(ctx, g):
            return g * float("nan")

    x = data(m, 3).requires_grad_()
    with m.autograd.detect_anomaly():
        y = Bad.apply(x).sum()
        try:
            y.backward()
        except RuntimeError as e:
            log.append(str(e).splitlines()[0])


@scenario
def anomaly_nan_builtin(m, log):
    x = m.tensor([0.0, 1.0], requires_grad=True)
    with m.autograd.detect_anomaly():
        y = (x.sqrt() * 0).sum()
        try:
            y.backward()
        except RuntimeError as e:
            log.append(str(e).splitlines()[0])


@scenario
def anomaly_nan_builtin2(m, log):
    x = m.tensor([-1.0, 1.0], requires_grad=True)
    with m.autograd.detect_anomaly():
        y = x.log().sum()
        y.backward()


@scenario
def anomaly_off_no_error(m, log):
    x = m.tensor([0.0, 1.0], requires_grad=True)
    (x.sqrt() * 0).sum().backward()
    return x.grad


@scenario
def anomaly_check_nan_false(m, log):
    x = m.tensor([0.0, 1.0], requires_grad=True)
    m.autograd.set_detect_anomaly(True, check_nan=False)
    try:
        log.append((m.is_anomaly_enabled(), m.is_anomaly_check_nan_enabled()))
        (x.sqrt() * 0).sum().backward()
    finally:
        m.autograd.set_detect_anomaly(False)
    log.append((m.is_anomaly_enabled(), m.is_anomaly_check_nan_enabled()))
    return x.grad


@scenario
def anomaly_ctx_check_nan_false(m, log):
    x = m.tensor([0.0, 1.0], requires_grad=True)
    with m.autograd.detect_anomaly(check_nan=False):
        (x.sqrt() * 0).sum().backward()
    return x.grad


@scenario
def anomaly_error_in_backward_warning(m, log):
    class Boom(m.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 1

        @staticmethod
        def backward(ctx, g):
            raise ValueError("boom in backward")

    x = data(m, 3).requires_grad_()
    with m.autograd.detect_anomaly():
        y = Boom.apply(x).sum()
        try:
            y.backward()
        except ValueError as e:
            log.append(str(e))


@scenario
def set_grad_enabled_forms(m, log):
    x = data(m, 3).requires_grad_()

    @m.autograd.grad_mode.set_grad_enabled(False)
    def f(t):
        return (t * 2).requires_grad

    log.append(f(x))
    log.append(m.is_grad_enabled())
    m.autograd.grad_mode.set_grad_enabled(False)
    log.append(m.is_grad_enabled())
    log.append((x * 2).requires_grad)
    m.autograd.grad_mode.set_grad_enabled(True)
    with m.set_grad_enabled(False):
        log.append(m.is_grad_enabled())
        with m.set_grad_enabled(True):
            log.append((x * 2).requires_grad)
    log.append(m.is_grad_enabled())
    g = m.set_grad_enabled(False)
    log.append(m.is_grad_enabled())
    with g:
        pass
    log.append(m.is_grad_enabled())


@scenario
def set_grad_enabled_bad(m, log):
    m.set_grad_enabled("yes")


@scenario
def no_grad_generator(m, log):
    @m.no_grad()
    def gen():
        yield m.is_grad_enabled()
        yield m.is_grad_enabled()

    out = []
    for v in gen():
        out.append((v, m.is_grad_enabled()))
    return out


@scenario
def inference_tensor_in_autograd(m, log):
    with m.inference_mode():
        t = data(m, 3)
    w = data(m, 3).requires_grad_()
    y = (t * w).sum()
    y.backward()
    return w.grad


@scenario
def inference_tensor_saved_error(m, log):
    with m.inference_mode():
        t = data(m, 3)
    w = data(m, 3).requires_grad_()
    y = t.exp() * w  # saves t
    return y


@scenario
def inference_tensor_requires_grad(m, log):
    with m.inference_mode():
        t = data(m, 3)
    t.requires_grad_()
    (t * t).sum()


@scenario
def inference_tensor_inplace(m, log):
    with m.inference_mode():
        t = data(m, 3)
    t.add_(1)


@scenario
def inference_tensor_clone_ok(m, log):
    with m.inference_mode():
        t = data(m, 3)
    c = t.clone().requires_grad_()
    (c * c).sum().backward()
    return c.grad, t.is_inference(), c.is_inference()


@scenario
def inference_mode_requires_grad_inside(m, log):
    w = data(m, 3).requires_grad_()
    with m.inference_mode():
        y = w * 2
    log.append((y.requires_grad, y.is_inference(), y.grad_fn is None))
    (y * w).sum().backward()
    return w.grad


@scenario
def requires_grad_nonleaf_false(m, log):
    x = data(m, 3).requires_grad_()
    (x * 2).requires_grad_(False)


@scenario
def requires_grad_attr_nonleaf(m, log):
    x = data(m, 3).requires_grad_()
    y = x * 2
    y.requires_grad = False


@scenario
def grad_access_nonleaf(m, log):
    x = data(m, 3).requires_grad_()
    y = x * 2
    y.sum().backward()
    return y.grad


@scenario
def grad_access_nonleaf_retained(m, log):
    x = data(m, 3).requires_grad_()
    y = x * 2
    y.retain_grad()
    return y.grad


@scenario
def grad_access_leaf_nograd(m, log):
    x = data(m, 3)
    return x.grad, (x * 2).grad


@scenario
def grad_access_view_of_leaf(m, log):
    x = data(m, 3).requires_grad_()
    return x[1:].grad


@scenario
def node_register_hook_replace(m, log):
    x = data(m, 3).requires_grad_()
    y = x.sin()

    def post(gin, gout):
        log.append(("post", len(gin), len(gout)))
        return tuple(g * 10 if g is not None else None for g in gin)

    y.grad_fn.register_hook(post)
    y.sum().backward()
    return x.grad


@scenario
def node_register_prehook(m, log):
    x = data(m, 3).requires_grad_()
    y = x.sin()

    def pre(gout):
        log.append(("pre", len(gout)))
        return (gout[0] * 10,)

    y.grad_fn.register_prehook(pre)
    y.sum().backward()
    return x.grad


@scenario
def node_hook_and_tensor_hook_order(m, log):
    x = data(m, 3).requires_grad_()
    y = x.sin()
    y.grad_fn.register_prehook(lambda go: log.append("node_pre"))
    y.register_hook(lambda g: log.append("tensor"))
    y.grad_fn.register_hook(lambda gi, go: log.append("node_post"))
    y.retain_grad()
    y.sum().backward()


@scenario
def acc_grad_node_hooks(m, log):
    x = data(m, 3).requires_grad_()
    y = x * 2
    acc = y.grad_fn.next_functions[0][0]
    log.append(type(acc).__name__)
    acc.register_prehook(lambda go: log.append("acc_pre"))
    acc.register_hook(lambda gi, go: log.append(("acc_post", len(gi), len(go))))
    x.register_hook(lambda g: log.append("tensor"))
    x.register_post_accumulate_grad_hook(lambda p: log.append("post_acc"))
    y.sum().backward()
    return x.grad


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_scenario_matches_torch(name):
    expected = _outcome(SCENARIOS[name], torch)
    got = _outcome(SCENARIOS[name], tw)
    assert _same(expected[0], got[0]), (expected[0], got[0])
    assert _same(expected[1], got[1]), (expected[1], got[1])
    if expected[2] is None:
        assert got[2] is None, repr(got[2])
    else:
        assert got[2] is not None, f"torch raised {expected[2]!r}; tilewise did not"
        assert type(got[2]).__name__ == type(expected[2]).__name__, (expected[2], got[2])
        fragments = FRAGMENTS.get(name, (_normalized(_first_line(str(expected[2]))),))
        for fragment in fragments:
            assert fragment in str(got[2]), (fragment, str(got[2]))
    assert [(c, _normalized(t)[:60]) for c, t in expected[3]] == [(c, t[:60]) for c, t in got[3]], (expected[3], got[3])


def test_create_graph_backward_warns_once_per_process_as_torch():
    from tilewise.autograd import _Once

    _Once.create_graph_warned = False
    x = tw.ones(2, requires_grad=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        (x * x).sum().backward(create_graph=True)
        (x * x).sum().backward(create_graph=True)
        tw.autograd.grad((x * x).sum(), x, create_graph=True)  # autograd.grad never warns
    assert [str(w.message)[: len(ONCE_PER_PROCESS)] for w in caught] == [ONCE_PER_PROCESS]


def _nan_in_backward(m):
    x = m.tensor([0.0, 1.0], requires_grad=True)
    h = x * 2
    y = (h.sqrt() * 0).sum()  # the forward call that makes the failing node
    y.backward()


@pytest.mark.parametrize("check_nan", [True, False])
def test_anomaly_mode_names_the_failing_node_and_its_forward_line_as_torch(check_nan):
    outcomes = {}
    for m in (torch, tw):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with m.autograd.detect_anomaly(check_nan=check_nan):
                try:
                    _nan_in_backward(m)
                    error = None
                except RuntimeError as exc:
                    error = _first_line(str(exc))
        messages = [str(w.message) for w in caught]
        stacks = [text for text in messages if text.startswith("Error detected in")]
        outcomes[m] = (
            error,
            [_first_line(text) for text in messages],
            [re.findall(r"line \d+, in _nan_in_backward\n\s+(.*)", text) for text in stacks],
        )
    assert outcomes[tw] == outcomes[torch]
    if check_nan:
        assert outcomes[tw][0] == "Function 'SqrtBackward0' returned nan values in its 0th output."
        assert outcomes[tw][2] == [["y = (h.sqrt() * 0).sum()  # the forward call that makes the failing node"]]


def test_anomaly_mode_off_records_no_forward_stacks():
    x = tw.ones(2, requires_grad=True)
    assert "forward_stack" not in (x * 2).grad_fn.__dict__
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with tw.autograd.detect_anomaly():
            assert "forward_stack" in (x * 2).grad_fn.__dict__
    assert "forward_stack" not in (x * 2).grad_fn.__dict__


def test_gradient_penalty_through_attention_matches_torchs_math_backend():
    from torch.nn.attention import SDPBackend, sdpa_kernel

    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 2, 3, 4)) for _ in range(3))
    grads = {}
    for m in (torch, tw):
        tq, tk, tv = (m.tensor(a, requires_grad=True) for a in (q, k, v))

        def penalty(tq=tq, tk=tk, tv=tv, m=m):
            out = m.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=True)
            (g,) = m.autograd.grad((out**2).sum(), tv, create_graph=True)
            return m.autograd.grad((g.norm() - 1) ** 2, (tq, tk, tv))

        if m is torch:
            with sdpa_kernel(SDPBackend.MATH):
                grads[m] = penalty()
        else:
            grads[m] = penalty()
    for a, b in zip(grads[torch], grads[tw]):
        np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=1e-7, atol=1e-9)


def test_forward_mode_jacobian_values_match_torch():
    rng = np.random.default_rng(1)
    xs = [rng.standard_normal(3) for _ in range(2)]
    jac = {}
    for m in (torch, tw):
        args = tuple(m.tensor(a) for a in xs)
        jac[m] = m.autograd.functional.jacobian(
            lambda x, y, m=m: (x.sin() * y, x.sum() * y.cos()), args, vectorize=True, strategy="forward-mode"
        )
    for row_t, row_w in zip(jac[torch], jac[tw]):
        for a, b in zip(row_t, row_w):
            np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=1e-12)


def test_a_hooked_module_runs_its_hooks_once_per_backward_and_frees_its_state():
    calls = {"pre": 0, "hook": 0}
    lin = tw.nn.Linear(3, 2)
    lin.register_full_backward_pre_hook(lambda mod, gout: calls.__setitem__("pre", calls["pre"] + 1))
    lin.register_full_backward_hook(lambda mod, gin, gout: calls.__setitem__("hook", calls["hook"] + 1))
    x = tw.ones(1, 3, requires_grad=True)
    y = lin(x).sum()
    (g,) = tw.autograd.grad(y, x, create_graph=True)  # the hooks run in the first backward only
    g.sum().backward()  # a second pass reaches the inputs without passing the outputs: no hook, as torch
    assert calls == {"pre": 1, "hook": 1}

"""Module backward hooks: ``register_full_backward_hook`` and ``register_full_backward_pre_hook``, as in torch.

[Note: module backward hooks] A module with backward hooks runs its forward between two identity autograd
Functions: one over the input tensors that require grad, one over the output tensors. In backward the output
identity receives the gradients of the outputs (``grad_output``): the pre-hooks run on them and may replace
them. The input identity then receives the gradients of the inputs (``grad_input``, None for inputs that need
none): the hooks run with ``(module, grad_input, grad_output)`` and may replace ``grad_input``. A replacement
must keep the count of gradients and each one's shape and dtype; otherwise the error says which hook broke
which. When no input requires grad, the hooks run from the output identity with ``grad_input`` all None.
"""

from __future__ import annotations

from tilewise.autograd.function import Function
from tilewise.tensor import Tensor


class BackwardHookRun:
    """One call of a hooked module: its hooks, and the gradients of its outputs once backward reaches them."""

    def __init__(self, module, hooks: list, pre_hooks: list, n_inputs: int):
        self.module, self.hooks, self.pre_hooks, self.n_inputs = module, hooks, pre_hooks, n_inputs
        self.grad_output: tuple = ()
        self.inputs_need_grad = False

    def run_pre_hooks(self, grad_output: tuple) -> tuple:
        for hook in self.pre_hooks:
            new = hook(self.module, grad_output)
            if new is not None:
                grad_output = _replacement(hook, self.module, "pre hook", "grad_output", grad_output, new)
        return grad_output

    def run_hooks(self, grad_input: tuple) -> tuple:
        for hook in self.hooks:
            new = hook(self.module, grad_input, self.grad_output)
            if new is not None:
                grad_input = _replacement(hook, self.module, "hook", "grad_input", grad_input, new)
        return grad_input


def _replacement(hook, module, kind: str, what: str, old: tuple, new) -> tuple:
    """A hook's replacement gradients, which must match the ones it was given in count, shape and dtype."""
    name = getattr(hook, "__name__", type(hook).__name__)
    new = tuple(new) if isinstance(new, (tuple, list)) else (new,)
    if len(new) != len(old):
        raise RuntimeError(f"Backward {kind} '{name}' of {type(module).__name__} returned an invalid number of "
                           f"{what}, got {len(new)}, but expected {len(old)}")
    for k, (g, n) in enumerate(zip(old, new)):
        if n is None or g is None:
            continue
        if not isinstance(n, Tensor):
            raise TypeError(f"Backward {kind} '{name}' of {type(module).__name__} returned {type(n).__name__} as "
                            f"{what}[{k}]; expected None or a tensor of shape {list(g.shape)}")
        if n.shape != g.shape:
            raise RuntimeError(f"Backward {kind} '{name}' of {type(module).__name__} has changed the size of "
                               f"{what}[{k}]: {list(g.shape)} became {list(n.shape)}")
        if n.dtype is not g.dtype:
            raise RuntimeError(f"Backward {kind} '{name}' of {type(module).__name__} has changed the type of "
                               f"{what}[{k}] (was {g.dtype.name} got {n.dtype.name})")
    return new


class _OutputIdentity(Function):
    @staticmethod
    def forward(ctx, run, *tensors):
        ctx.run = run
        return tensors

    @staticmethod
    def backward(ctx, *grads):
        run = ctx.run
        run.grad_output = run.run_pre_hooks(grads)
        if not run.inputs_need_grad:
            run.run_hooks((None,) * run.n_inputs)
        return (None, *run.grad_output)


class _InputIdentity(Function):
    @staticmethod
    def forward(ctx, run, positions, *tensors):
        ctx.run, ctx.positions = run, positions
        return tensors

    @staticmethod
    def backward(ctx, *grads):
        run = ctx.run
        grad_input = [None] * run.n_inputs
        for k, g in zip(ctx.positions, grads):
            grad_input[k] = g
        grad_input = run.run_hooks(tuple(grad_input))
        return (None, None, *(grad_input[k] for k in ctx.positions))


def hooked_inputs(run: BackwardHookRun, args: tuple) -> tuple:
    """``args`` with the tensors that require grad passed through the input identity."""
    tensors = [a for a in args if isinstance(a, Tensor)]
    positions = tuple(k for k, t in enumerate(tensors) if t.requires_grad)
    if not positions:
        return args
    run.inputs_need_grad = True
    wrapped = iter(_InputIdentity.apply(run, positions, *(tensors[k] for k in positions)))
    needing = {id(tensors[k]) for k in positions}
    return tuple(next(wrapped) if isinstance(a, Tensor) and id(a) in needing else a for a in args)


def hooked_output(run: BackwardHookRun, output):
    """``output`` (a tensor, or a tuple or list of them) passed through the output identity."""
    single = isinstance(output, Tensor)
    items = (output,) if single else output
    if not isinstance(items, (tuple, list)) or not any(isinstance(o, Tensor) and o.requires_grad for o in items):
        return output
    positions = [k for k, o in enumerate(items) if isinstance(o, Tensor) and o.requires_grad]
    wrapped = iter(_OutputIdentity.apply(run, *(items[k] for k in positions)))
    out = [next(wrapped) if k in positions else o for k, o in enumerate(items)]
    return out[0] if single else type(items)(out)

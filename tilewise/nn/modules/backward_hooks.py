"""Module backward hooks: ``register_full_backward_hook`` and ``register_full_backward_pre_hook``, as in torch.

[Note: module backward hooks] A module with backward hooks runs its forward between two identity autograd
Functions (``BackwardHookFunction``, as torch names it): one over its input tensors, one over its output tensors,
each applied only where one of them requires grad. In backward the output identity receives the gradients of the
outputs: ``grad_output`` has one entry per output (a tuple's items; None for a non-tensor, for a tensor that needs
no gradient and for one no gradient reached); the pre-hooks run on it and may replace it. The input identity then
receives the gradients of the inputs: ``grad_input`` has one entry per positional argument (None for a
non-tensor); the hooks run with ``(module, grad_input, grad_output)`` and may replace ``grad_input``. A replacement
must keep the count of gradients and each one's shape and dtype; otherwise the error says which hook broke which.
When no input requires grad, the hooks run from the output identity with ``grad_input`` all None, after torch's
warning; when the output is neither a tensor nor a tuple, they never run, after torch's warning. The outputs
are views of what forward returned, refused for in-place writes as every autograd.Function's are.
"""

from __future__ import annotations

import warnings

from tilewise.autograd.function import Function
from tilewise.autograd.grad_mode import is_grad_enabled
from tilewise.tensor import Tensor


class BackwardHookRun:
    """One call of a hooked module: its hooks, and the gradients of its outputs once backward reaches them."""

    def __init__(self, module, hooks: list, pre_hooks: list, n_inputs: int):
        self.module, self.hooks, self.pre_hooks, self.n_inputs = module, hooks, pre_hooks, n_inputs
        self.grad_output: tuple | None = None
        self.input_positions: tuple | None = None  # of the input tensors, when one of them requires grad
        self.n_outputs = 0

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

    def run_hooks_without_inputs(self) -> None:
        warnings.warn("Full backward hook is firing when gradients are computed with respect to module outputs since "
                      "no inputs require gradients. See the documentation of "
                      "tilewise.nn.Module.register_full_backward_hook for more details.", UserWarning, stacklevel=2)
        grad_input = (None,) * self.n_inputs
        for hook in self.hooks:
            new = hook(self.module, grad_input, self.grad_output)
            if new is not None and not (isinstance(new, tuple) and all(g is None for g in new)):
                raise RuntimeError("Backward hook for Modules where no input requires gradient should always return "
                                   "None or None for all gradients.")


def _replacement(hook, module, kind: str, what: str, old: tuple, new) -> tuple:
    """A hook's replacement gradients, which must match the ones it was given in count, shape and dtype."""
    name = getattr(hook, "__name__", type(hook).__name__)
    new = tuple(new) if isinstance(new, (tuple, list)) else (new,)
    if len(new) != len(old):
        raise RuntimeError(f"Backward {kind} returned an invalid number of {what}, got {len(new)}, but expected "
                           f"{len(old)} (hook '{name}' of {type(module).__name__})")
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


class BackwardHookFunction(Function):
    """The identity around a hooked module's inputs (``ctx.run`` set, ``ctx.outputs`` False) or outputs."""

    @staticmethod
    def forward(ctx, run, outputs, positions, *tensors):
        ctx.run, ctx.outputs, ctx.positions = run, outputs, positions
        ctx.mark_non_differentiable(*(t for t in tensors if not t.requires_grad))
        if outputs:
            ctx.set_materialize_grads(False)  # an output no gradient reached is None in grad_output, as in torch
        return tensors

    @staticmethod
    def backward(ctx, *grads):
        run = ctx.run
        if ctx.outputs:
            grad_output = run.run_pre_hooks(_with_nones(ctx.positions, grads, run.n_outputs))
            run.grad_output = grad_output
            if run.input_positions is None:
                run.run_hooks_without_inputs()
                run.grad_output = None
            return (None, None, None, *(grad_output[k] for k in ctx.positions))
        if run.grad_output is None:  # the gradient reached the inputs without passing the outputs (double backward)
            return (None, None, None, *grads)
        grad_input = run.run_hooks(_with_nones(ctx.positions, grads, run.n_inputs))
        run.grad_output = None
        return (None, None, None, *(grad_input[k] for k in ctx.positions))


def _with_nones(positions: tuple, values: tuple, size: int) -> tuple:
    packed = [None] * size
    for k, v in zip(positions, values):
        packed[k] = v
    return tuple(packed)


def _through_identity(run: BackwardHookRun, items: tuple, outputs: bool) -> tuple | None:
    """``items`` with its tensors passed through the identity, or None when none of them requires grad."""
    positions = tuple(k for k, a in enumerate(items) if isinstance(a, Tensor))
    if not any(items[k].requires_grad for k in positions) or not is_grad_enabled():
        return None
    wrapped = BackwardHookFunction.apply(run, outputs, positions, *(items[k] for k in positions))
    out = list(items)
    for k, t in zip(positions, wrapped):
        out[k] = t
    if outputs:
        run.n_outputs = len(items)
    else:
        run.input_positions = positions
    return tuple(out)


def hooked_inputs(run: BackwardHookRun, args: tuple) -> tuple:
    """``args`` with their tensors passed through the input identity (where one of them requires grad)."""
    wrapped = _through_identity(run, args, False)
    return args if wrapped is None else wrapped


def hooked_output(run: BackwardHookRun, output):
    """``output`` (a tensor or a tuple) with its tensors passed through the output identity."""
    if not isinstance(output, (Tensor, tuple)):
        warnings.warn("For backward hooks to be called, module output should be a Tensor or a tuple of Tensors but "
                      f"received {type(output)}", UserWarning, stacklevel=4)
    single = not isinstance(output, tuple)
    wrapped = _through_identity(run, (output,) if single else output, True)
    if wrapped is None:
        return output
    if single:
        return wrapped[0]
    return wrapped if type(output) is tuple else type(output)(*wrapped)

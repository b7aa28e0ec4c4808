"""User-defined differentiable functions: ``class F(autograd.Function)`` with static forward/backward."""

from __future__ import annotations

import functools
import inspect

from tilewise.autograd.graph import Node, SavedTensor, accumulate_node, edge
from tilewise.dispatch import STATE
from tilewise.tensor import Tensor


class FunctionCtx:
    def __init__(self):
        self._saved: tuple = ()
        self.needs_input_grad: tuple = ()
        self.non_differentiable: set[int] = set()
        self.materialize_grads = True
        self.dirty: tuple = ()

    def save_for_backward(self, *tensors) -> None:
        self._saved = tuple(SavedTensor(t) if isinstance(t, Tensor) else t for t in tensors)

    @property
    def saved_tensors(self) -> tuple:
        return tuple(s.unpack() if isinstance(s, SavedTensor) else s for s in self._saved)

    def mark_non_differentiable(self, *tensors) -> None:
        self.non_differentiable.update(id(t) for t in tensors)

    def mark_dirty(self, *tensors) -> None:
        self.dirty = tensors

    def set_materialize_grads(self, value: bool) -> None:
        self.materialize_grads = value


class FunctionNode(Node):
    def __init__(self, cls, ctx: FunctionCtx, arg_tensors: list, outputs: tuple):
        super().__init__()
        self.cls, self.ctx = cls, ctx
        self.n_args = len(arg_tensors)
        self.tensor_positions = [k for k, a in enumerate(arg_tensors) if isinstance(a, Tensor)]
        tensors = [arg_tensors[k] for k in self.tensor_positions]
        self.next_functions = tuple(edge(a) if a.requires_grad else (None, 0) for a in tensors)  # like torch
        self.arg_meta = [(a.shape, a.dtype) for a in tensors]
        self.output_meta = [(o.shape, o.dtype, o.device) if isinstance(o, Tensor) else None for o in outputs]

    def name(self) -> str:
        return f"{self.cls.__name__}Backward"

    def __repr__(self) -> str:
        return f"<{type(self).__module__}.{type(self).__qualname__} object at {id(self):#x}>"

    @property
    def n_outputs(self) -> int:
        return len(self.output_meta)

    def apply(self, grads: list):
        from tilewise.ops.creation import zeros

        if self.ctx.materialize_grads:
            grads = [zeros(m[0], dtype=m[1], device=m[2]) if g is None and m is not None else g
                     for g, m in zip(grads, self.output_meta)]
        out = self.cls.backward(self.ctx, *grads)
        out = out if isinstance(out, tuple) else (out,)
        if len(out) > self.n_args and all(g is None for g in out[self.n_args:]):
            out = out[:self.n_args]  # torch drops trailing Nones beyond the inputs (an optional input not given)
        if len(out) != self.n_args:
            raise RuntimeError(f"function {self.name()} returned an incorrect number of gradients (expected "
                               f"{self.n_args}, got {len(out)}): backward returns one per forward input, None for "
                               "non-tensors")
        return [self._fit(k, out[k], *meta) for k, meta in zip(self.tensor_positions, self.arg_meta)]

    def _fit(self, k: int, grad, shape, dtype):
        """The gradient in its input's shape and dtype, as torch's engine makes it (a forward that cast its
        inputs, e.g. under ``amp.custom_fwd``, returns gradients in the cast dtype)."""
        if grad is None:
            return grad
        if grad.dtype is not dtype and grad.dtype.is_floating_point and dtype.is_floating_point:
            grad = grad.to(dtype)
        if grad.shape == shape:
            return grad
        try:
            return grad.sum_to_size(shape)
        except RuntimeError:
            raise RuntimeError(f"function {self.name()} returned an invalid gradient at index {k} - got "
                               f"{list(grad.shape)} but expected shape compatible with {list(shape)}") from None

    def release(self) -> None:
        for s in self.ctx._saved:
            if isinstance(s, SavedTensor):
                s.release()


BackwardCFunction = FunctionNode  # torch's name for the base of every custom function's node class


def _backward_class(cls) -> type:
    """torch's ``<Name>Backward``: the class of the nodes ``cls.apply`` records (``cls._backward_cls``), made once
    per Function subclass, so that a node's type names the function that made it."""
    return type(f"{cls.__name__}Backward", (FunctionNode,), {"_forward_cls": cls, "__module__": __name__,
                                                             "__qualname__": f"{cls.__name__}Backward"})


class Function:
    """Subclass with ``forward(ctx, *args)`` and ``backward(ctx, *grad_outputs)`` static methods.

    >>> import tilewise as tw
    >>> class Square(tw.autograd.Function):
    ...     @staticmethod
    ...     def forward(ctx, x):
    ...         ctx.save_for_backward(x)
    ...         return x * x
    ...     @staticmethod
    ...     def backward(ctx, g):
    ...         (x,) = ctx.saved_tensors
    ...         return 2 * x * g
    >>> x = tw.tensor([3.0], requires_grad=True)
    >>> Square.apply(x).backward()
    >>> x.grad.tolist()
    [6.0]
    """

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        cls._backward_cls = _backward_class(cls)

    @staticmethod
    def forward(ctx, *args, **kwargs):
        raise NotImplementedError("autograd.Function subclasses must implement forward(ctx, ...)")

    @staticmethod
    def setup_context(ctx, inputs: tuple, output):
        """Overridden, it fills ``ctx`` after a ``forward(*args)`` that takes no ctx (torch 2's separate style)."""
        raise NotImplementedError("setup_context is not implemented.")

    @staticmethod
    def backward(ctx, *grad_outputs):
        raise NotImplementedError("autograd.Function subclasses must implement backward(ctx, ...)")

    @classmethod
    def _separate_setup(cls) -> bool:
        return getattr(cls.setup_context, "__func__", cls.setup_context) is not Function.__dict__[
            "setup_context"].__func__

    @classmethod
    def apply(cls, *args, **kwargs):
        separate = cls._separate_setup()
        if separate:  # as torch, keywords and defaults become positional inputs, which setup_context receives
            bound = inspect.signature(cls.forward).bind(*args, **kwargs)
            bound.apply_defaults()
            args, kwargs = tuple(bound.args), {}
        ctx = FunctionCtx()
        ctx.needs_input_grad = tuple(isinstance(a, Tensor) and a.requires_grad for a in args)
        prev = STATE.grad_enabled
        STATE.grad_enabled = False
        try:
            if separate:
                out = cls.forward(*args)
                cls.setup_context(ctx, args, out)
            else:
                out = cls.forward(ctx, *args, **kwargs)
        finally:
            STATE.grad_enabled = prev
        if not (prev and any(ctx.needs_input_grad)):
            return out
        outputs = out if isinstance(out, tuple) else (out,)
        node = cls.__dict__.get("_backward_cls", FunctionNode)(cls, ctx, list(args), outputs)
        fixed = []
        for i, o in enumerate(outputs):
            if isinstance(o, Tensor) and id(o) not in ctx.non_differentiable and o.dtype.is_floating_point:
                if any(o is a for a in args) and o not in ctx.dirty:
                    o = o.view_as(o)
                o._grad_fn, o._output_nr, o._requires_grad = node, i, True
            fixed.append(o)
        return tuple(fixed) if isinstance(out, tuple) else fixed[0]


class DelayedError(Node):
    """The grad_fn of what a ``once_differentiable`` backward returns under ``create_graph``: differentiating it
    again raises (torch's ``torch.autograd._functions.DelayedError``, whose node is named ``Error``)."""

    def __init__(self, message: str, inputs: list):
        super().__init__()
        self.message = message
        self.next_functions = tuple((accumulate_node(t), 0) if isinstance(t, Tensor) else (None, 0) for t in inputs)
        self.n_outputs = len(inputs)

    def name(self) -> str:
        return "Error"

    def apply(self, grads: list):
        raise RuntimeError(self.message)


def once_differentiable(fn):
    """Decorates a ``backward`` that is not itself differentiable: it runs without recording a graph, and where a
    double backward would need it (``create_graph=True`` with gradients that require grad), what it returns leads to
    an error at that second backward instead of to silently missing terms."""

    @functools.wraps(fn)
    def wrapper(ctx, *args, **kwargs):
        prev = STATE.grad_enabled
        STATE.grad_enabled = False
        try:
            outputs = fn(ctx, *args, **kwargs)
        finally:
            STATE.grad_enabled = prev
        if not prev or not any(isinstance(a, Tensor) and a.requires_grad for a in args):
            return outputs
        several = isinstance(outputs, tuple)
        leaves = [o.detach().requires_grad_(True) if isinstance(o, Tensor) else o for o in
                  (outputs if several else (outputs,))]
        node = DelayedError("trying to differentiate twice a function that was marked with @once_differentiable",
                            leaves)
        aliased = []
        for i, leaf in enumerate(leaves):
            if isinstance(leaf, Tensor):
                leaf = leaf.view_as(leaf).detach()
                leaf._grad_fn, leaf._output_nr, leaf._requires_grad = node, i, True
            aliased.append(leaf)
        return tuple(aliased) if several else aliased[0]

    return wrapper

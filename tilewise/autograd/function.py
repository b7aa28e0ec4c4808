"""User-defined differentiable functions: ``class F(autograd.Function)`` with static forward/backward."""

from __future__ import annotations

import functools
import inspect
import warnings

from tilewise.autograd.anomaly_mode import ANOMALY
from tilewise.autograd.graph import Node, SavedTensor, accumulate_node, edge, keep_forward_stack
from tilewise.dispatch import STATE
from tilewise.ops.inplace import CUSTOM_FUNCTION, rebase_view_history, watch_view
from tilewise.tensor import Tensor


class FunctionCtx:
    def __init__(self):
        self._saved: tuple = ()
        self.needs_input_grad: tuple = ()
        self.non_differentiable: set[int] = set()
        self.materialize_grads = True
        self.dirty: tuple = ()
        self._to_save: tuple | None = None

    def save_for_backward(self, *tensors) -> None:
        """Keep ``tensors`` (or None) for backward. As in torch they are packed once forward has returned (``apply``),
        so an input that forward then writes in place and marks dirty is saved as the output it became."""
        self._saved = self._to_save = tensors

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

    @property
    def saved_tensors(self) -> tuple:
        """What forward saved, as in torch, where the node is the ctx (freed after backward: torch's error then)."""
        return self.ctx.saved_tensors

    def __getattr__(self, name: str):
        # torch's node *is* the ctx: what forward stored on ctx (``ctx.scale``) reads from ``y.grad_fn`` too
        if name == "ctx" or name.startswith("__"):
            raise AttributeError(name)
        try:
            return getattr(self.ctx, name)
        except AttributeError:
            raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'") from None

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
        for k, g in enumerate(out):
            if g is not None and not isinstance(g, Tensor):
                raise RuntimeError(f"expected Variable or None (got {type(g).__name__}) as gradient {k} of "
                                   f"{self.name()}")
        if len(self.tensor_positions) != self.n_args:
            for k, g in enumerate(out):
                if g is not None and k not in self.tensor_positions:
                    raise RuntimeError(f"function {self.name()} returned a gradient different than None at position "
                                       f"{k + 1}, but the corresponding forward input was not a Variable")
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
            raise RuntimeError(f"Function {self.name()} returned an invalid gradient at index {k} - got "
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

    def __init__(self, *args, **kwargs) -> None:
        warnings.warn(f"{self.__class__} should not be instantiated. Methods on autograd functions are all static, so "
                      "you should invoke them on the class itself. Instantiating an autograd function will raise an "
                      "error in a future version.", DeprecationWarning, stacklevel=2)

    def __call__(self, *args, **kwargs):
        raise RuntimeError("Legacy autograd function with non-static forward method is deprecated. Please use "
                           "new-style autograd function with static forward method: call Function.apply.")

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
        outputs = out if isinstance(out, tuple) else (out,)
        if ctx.dirty:
            _check_dirty(ctx.dirty, outputs)
        if not (prev and any(ctx.needs_input_grad)):
            return out
        node = cls.__dict__.get("_backward_cls", FunctionNode)(cls, ctx, list(args), outputs)
        if ANOMALY.enabled:
            keep_forward_stack(node)
        fixed = []
        for i, o in enumerate(outputs):
            if isinstance(o, Tensor) and id(o) not in ctx.non_differentiable and o.dtype.is_floating_point:
                dirty = any(o is d for d in ctx.dirty)
                if dirty and o._base is not None:
                    _rebase_dirty_view(o, node, i)
                else:
                    if not dirty and any(o is a for a in args):
                        o = o.view_as(o)
                    o._grad_fn, o._output_nr, o._requires_grad = node, i, True
                if o._base is not None and not dirty:  # made in forward, or an input returned as-is
                    watch_view(o, CUSTOM_FUNCTION)
            fixed.append(o)
        if ctx._to_save is not None:
            ctx._saved = _pack_saved(ctx._to_save, fixed, node)
        return tuple(fixed) if isinstance(out, tuple) else fixed[0]


def _check_dirty(dirty: tuple, outputs: tuple) -> None:
    """torch's rules for ``ctx.mark_dirty``: every tensor marked is returned, and is no leaf (nor view of one) that
    requires grad; each gets a new version, as an in-place operator's output does."""
    for t in dirty:
        if not any(t is o for o in outputs):
            raise RuntimeError("Some elements marked as dirty during the forward method were not returned as output. "
                               "The inputs that are modified inplace must all be outputs of the Function.")
    for t in dirty:
        base = t._base
        if STATE.grad_enabled and t._grad_fn is None and t._requires_grad and base is None:
            raise RuntimeError("a leaf Variable that requires grad has been used in an in-place operation.")
        if STATE.grad_enabled and base is not None and base._grad_fn is None and base._requires_grad:
            raise RuntimeError("a view of a leaf Variable that requires grad is being used in an in-place operation.")
        t._bump_version()


def _rebase_dirty_view(view: Tensor, node: FunctionNode, i: int) -> None:
    """A view that forward wrote in place: its base takes the write into its history (torch's CopySlices around the
    function's node), as an in-place operator's write through a view does."""
    written = view.detach()
    written._grad_fn, written._output_nr, written._requires_grad = node, i, True
    rebase_view_history(view, written)


def _pack_saved(tensors: tuple, outputs: list, node: FunctionNode) -> tuple:
    packed = []
    for k, t in enumerate(tensors):
        if t is None:
            packed.append(None)
        elif not isinstance(t, Tensor):
            raise TypeError(f"save_for_backward can only save variables, but argument {k} is of type "
                            f"{type(t).__name__}")
        else:
            nr = next((i for i, o in enumerate(outputs) if o is t and t._grad_fn is node), None)
            packed.append(SavedTensor(t) if nr is None else SavedTensor(t, True, node, nr, node.name()))
    return tuple(packed)


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

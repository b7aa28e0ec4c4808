"""Reverse-mode automatic differentiation with torch's interface.

>>> import tilewise as tw
>>> x = tw.tensor([1.0, 2.0], requires_grad=True)
>>> (x * x).sum().backward()
>>> x.grad.tolist()
[2.0, 4.0]
"""

from __future__ import annotations

import warnings

from tilewise.autograd import (
    forward_ad,  # noqa: F401 — fills the dispatcher's ForwardAD key
    functional,  # noqa: F401 — torch.autograd.functional
    profiler,  # noqa: F401 — torch.autograd.profiler.emit_nvtx
)
from tilewise.autograd.anomaly_mode import detect_anomaly, set_detect_anomaly
from tilewise.autograd.engine import run_backward
from tilewise.autograd.function import Function, FunctionCtx
from tilewise.autograd.grad_mode import (
    enable_grad,
    inference_mode,
    is_grad_enabled,
    is_inference_mode_enabled,
    no_grad,
    set_grad_enabled,
)
from tilewise.autograd.gradcheck import gradcheck, gradgradcheck
from tilewise.autograd.graph import Node
from tilewise.autograd.variable import Variable
from tilewise.overrides import has_subclass_instances, overridden_call
from tilewise.tensor import Tensor

__all__ = ["backward", "grad", "Function", "FunctionCtx", "no_grad", "enable_grad", "set_grad_enabled",
           "inference_mode", "is_grad_enabled", "is_inference_mode_enabled", "Node", "detect_anomaly",
           "set_detect_anomaly", "Variable", "forward_ad", "functional", "gradcheck", "gradgradcheck",
           "compiled_backward"]


class compiled_backward:  # noqa: N801 — a switch, named like set_detect_anomaly
    """Run each eager ``backward()`` whose graph was seen before as one compiled program ([Note: compiled backward]
    in ``compiler/backward.py``): on at construction, so it works as a plain call
    (``tilewise.autograd.compiled_backward()`` or ``compiled_backward(False)``); as a context manager it restores
    the previous setting on exit. ``TILEWISE_COMPILED_BACKWARD=1`` turns it on for the process."""

    def __init__(self, enabled: bool = True) -> None:
        from tilewise.config import settings

        self._prev = settings.compiled_backward
        settings.compiled_backward = bool(enabled)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> bool:
        from tilewise.config import settings

        settings.compiled_backward = self._prev
        return False


def _as_tuple(x) -> tuple:
    if x is None:
        return ()
    return (x,) if isinstance(x, Tensor) else tuple(x)


def _default_grads(tensors: tuple, grad_tensors) -> list:
    from tilewise.ops.creation import ones_like

    grads = list(_as_tuple(grad_tensors)) if grad_tensors is not None else [None] * len(tensors)
    if len(grads) != len(tensors):
        raise RuntimeError(f"got {len(grads)} gradients for {len(tensors)} tensors")
    out = []
    for k, (t, g) in enumerate(zip(tensors, grads)):
        if g is None:
            if t.numel() != 1:
                raise RuntimeError(f"grad can be implicitly created only for scalar outputs; got a tensor of shape "
                                   f"{list(t.shape)}: pass gradient= with that shape")
            if t.dtype.is_complex:
                raise RuntimeError("grad can be implicitly created only for real scalar outputs; this output is "
                                   f"{t.dtype.name}: take its .abs() or .real, or pass gradient=")
            g = ones_like(t)
        elif not isinstance(g, Tensor):
            from tilewise.tensor import tensor

            g = tensor(g, dtype=t.dtype, device=t.device)
        elif g.shape != t.shape:
            raise RuntimeError(f"Mismatch in shape: grad_output[{k}] has a shape of {g.shape} and output[{k}] has a "
                               f"shape of {t.shape}.")
        out.append(g)
    return out


class _Once:
    create_graph_warned = False


def _warn_create_graph_cycle() -> None:
    """torch warns once per process that ``backward(create_graph=True)`` ties each ``.grad`` to its parameter."""
    if not _Once.create_graph_warned:
        _Once.create_graph_warned = True
        warnings.warn("Using backward() with create_graph=True will create a reference cycle between the parameter "
                      "and its gradient which can cause a memory leak. We recommend using autograd.grad when "
                      "creating the graph to avoid this. If you have to use this function, make sure to reset the "
                      ".grad fields of your parameters to None after use to break the cycle and avoid the leak.",
                      UserWarning, stacklevel=4)


def backward(tensors, grad_tensors=None, retain_graph: bool | None = None, create_graph: bool = False,
             inputs=None) -> None:
    if has_subclass_instances((tensors, grad_tensors, inputs)):  # their overrides; the engine reads plain tensors
        return overridden_call(backward, (tensors, grad_tensors, retain_graph, create_graph, inputs), {})
    tensors = _as_tuple(tensors)
    if inputs is not None:
        inputs = tuple(inputs.values()) if type(inputs) is dict else _as_tuple(inputs)
        if not inputs:
            raise RuntimeError("`inputs` argument to `backward()` cannot be empty.")
        for t in inputs:  # as torch: a non-leaf input gets its gradient in .grad, like a leaf
            t.retain_grad()
    grads = _default_grads(tensors, grad_tensors)
    if retain_graph is None:
        retain_graph = create_graph
    if create_graph:
        _warn_create_graph_cycle()
    run_backward(tensors, grads, retain_graph=retain_graph, create_graph=create_graph, inputs=inputs,
                 accumulate=True)


def grad(outputs, inputs, grad_outputs=None, retain_graph: bool | None = None, create_graph: bool = False,
         only_inputs: bool = True, allow_unused: bool | None = None, is_grads_batched: bool = False,
         materialize_grads: bool = False) -> tuple | dict:
    """Gradients of outputs with respect to inputs, returned rather than accumulated into ``.grad``.

    ``inputs`` may be a dict (``dict(model.named_parameters())``); the gradients then come back under its keys.
    ``is_grads_batched=True`` reads the first dimension of every grad_output as a batch of vectors and returns one
    vector-Jacobian product per vector, stacked.

    >>> import tilewise as tw
    >>> x = tw.tensor([1.0, 2.0], requires_grad=True)
    >>> tw.autograd.grad((x * x).sum(), {"x": x})["x"].tolist()
    [2.0, 4.0]
    """
    if type(inputs) is dict:
        result = grad(outputs, tuple(inputs.values()), grad_outputs, retain_graph, create_graph, only_inputs,
                      allow_unused, is_grads_batched, materialize_grads)
        return dict(zip(inputs.keys(), result))
    if has_subclass_instances((outputs, inputs, grad_outputs)):  # their overrides; the engine reads plain tensors
        return overridden_call(grad, (outputs, inputs, grad_outputs, retain_graph, create_graph, only_inputs,
                                      allow_unused, is_grads_batched, materialize_grads), {})
    if not only_inputs:
        warnings.warn("only_inputs argument is deprecated and is ignored now (defaults to True). To accumulate "
                      "gradient for other parts of the graph, please use torch.autograd.backward.", FutureWarning,
                      stacklevel=2)
    if materialize_grads and allow_unused is False:
        raise ValueError("Expected allow_unused to be True or not passed when materialize_grads=True, but got: "
                         "allow_unused=False.")
    outputs = _as_tuple(outputs)
    inputs_t = _as_tuple(inputs)
    if not inputs_t:
        raise RuntimeError("`inputs` argument to `grad()` cannot be empty.")
    if retain_graph is None:
        retain_graph = create_graph
    if is_grads_batched:
        result = _batched_vjps(outputs, inputs_t, grad_outputs, create_graph,
                               bool(allow_unused) or materialize_grads)
    else:
        result = run_backward(outputs, _default_grads(outputs, grad_outputs), retain_graph=retain_graph,
                              create_graph=create_graph, inputs=inputs_t,
                              allow_unused=bool(allow_unused) or materialize_grads, accumulate=False)
    if materialize_grads:
        from tilewise.ops.creation import zeros_like

        result = [g if g is not None else zeros_like(x) for g, x in zip(result, inputs_t)]
    return tuple(result)


def _batched_vjps(outputs: tuple, inputs: tuple, grad_outputs, create_graph: bool, allow_unused: bool) -> list:
    """torch maps the vector-Jacobian product over the grad_outputs' first dimension with vmap; one backward per
    vector, stacked, gives the same gradients."""
    from tilewise.ops.registry import call

    batched = list(_as_tuple(grad_outputs))
    if len(batched) != len(outputs):
        raise RuntimeError(f"got {len(batched)} gradients for {len(outputs)} tensors")
    for i, (out, g) in enumerate(zip(outputs, batched)):
        if g.shape[1:] != out.shape:
            raise RuntimeError(
                "If `is_grads_batched=True`, we interpret the first dimension of each grad_output as the batch "
                "dimension. The sizes of the remaining dimensions are expected to match the shape of corresponding "
                f"output, but a mismatch was detected: grad_output[{i}] has a shape of {list(g.shape[1:])} and "
                f"output[{i}] has a shape of {list(out.shape)}. If you only want some tensors in `grad_output` to be "
                "considered batched, consider using vmap.")
    per_vector = [run_backward(outputs, [g[b] for g in batched], retain_graph=True, create_graph=create_graph,
                               inputs=inputs, allow_unused=allow_unused, accumulate=False)
                  for b in range(batched[0].shape[0])]
    return [None if column[0] is None else call("stack", list(column)) for column in zip(*per_vector)]


def _tensor_backward(self: Tensor, gradient: Tensor | None = None, retain_graph: bool | None = None,
                     create_graph: bool = False, inputs=None) -> None:
    backward(self, gradient, retain_graph=retain_graph, create_graph=create_graph, inputs=inputs)


_tensor_backward.__name__ = _tensor_backward.__qualname__ = "backward"
Tensor.backward = _tensor_backward  # see [Note: methods from above] in tensor.py

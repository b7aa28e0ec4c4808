"""torch.autograd.functional: vjp, jvp, jacobian, hessian, vhp and hvp of a function of tensors.

The older, tensor-in tensor-out cousin of ``tilewise.func``: ``inputs`` is a tensor or a tuple of tensors, the
answer has the same structure, and nothing requires grad afterwards unless ``create_graph=True``. ``jvp`` runs
forward-mode AD (``autograd.forward_ad``), where torch's differentiates a vjp a second time; the values agree.
"""

from __future__ import annotations

import tilewise.autograd.forward_ad as forward_ad
from tilewise.autograd.forward_ad import gradients
from tilewise.autograd.grad_mode import enable_grad
from tilewise.tensor import Tensor

__all__ = ["vjp", "jvp", "jacobian", "hessian", "vhp", "hvp"]


def _as_tuple(x, arg: str, fn: str) -> tuple[bool, tuple]:
    many = isinstance(x, tuple)
    items = x if many else (x,)
    for k, t in enumerate(items):
        if not isinstance(t, Tensor):
            raise TypeError(f"The {arg} given to {fn} must be either a Tensor or a tuple of Tensors but the value "
                            f"at index {k} has type {type(t)}.")
    return many, items


def _fresh(inputs: tuple, create_graph: bool) -> tuple:
    """Leaves to differentiate with respect to: aliases that keep the caller's graph when asked to."""
    return tuple(x.view_as(x) if create_graph and x.requires_grad else x.detach().requires_grad_() for x in inputs)


def _zeros_where_unused(grads, like: tuple) -> tuple:
    from tilewise.ops.creation import zeros_like

    return tuple(g if g is not None else zeros_like(x) for g, x in zip(grads, like))


def _done(values: tuple, create_graph: bool) -> tuple:
    return values if create_graph else tuple(v.detach() for v in values)


def _outputs(func, fresh: tuple, fn: str) -> tuple[bool, tuple]:
    return _as_tuple(func(*fresh), "outputs of the user-provided function", fn)


_STRICT = {
    "outputs": "Output {i} of the user-provided function does not require gradients. The outputs must be computed in "
               "a differentiable manner from the input when running in strict mode.",
    "jacobian": "While computing the hessian, found that the jacobian of the user-provided function with respect to "
                "input {i} is independent of the input. This is not allowed in strict mode. You should ensure that "
                "your function is twice differentiable and that the jacobian depends on the inputs (this would be "
                "violated by a linear function for example).",
    "back": "The output of the user-provided function is independent of input {i}. This is not allowed in strict mode.",
}


def _check_requires_grad(values: tuple, stage: str, strict: bool) -> None:
    """In strict mode, every value must be on the graph of the inputs (torch's messages per stage)."""
    if strict:
        for i, value in enumerate(values):
            if value is None or not value.requires_grad:
                raise RuntimeError(_STRICT[stage].format(i=i))


def vjp(func, inputs, v=None, create_graph: bool = False, strict: bool = False):
    """``(func(inputs), v^T J)``."""
    many_in, inputs = _as_tuple(inputs, "inputs", "vjp")
    many_out, outputs, found = _pull(func, inputs, v, create_graph, strict)
    if strict:
        for i, g in enumerate(found):
            if g is None:
                raise RuntimeError(_STRICT["back"].format(i=i))
    result = _done(_zeros_where_unused(found, inputs), create_graph)
    outputs = _done(outputs, create_graph)
    return (outputs if many_out else outputs[0]), (result if many_in else result[0])


def _pull(func, inputs: tuple, v, create_graph: bool, strict: bool):
    """(whether func returned a tuple, its outputs, v^T J per input: None for an input no output depends on)."""
    with enable_grad():
        fresh = _fresh(inputs, create_graph)
        many_out, outputs = _outputs(func, fresh, "vjp")
        _check_requires_grad(outputs, "outputs", strict)
        if v is None:
            if len(outputs) != 1 or outputs[0].numel() != 1:
                raise RuntimeError("The vector v can only be None if the user-provided function returns a single "
                                   "Tensor with a single element.")
            cotangents = None
        else:
            cotangents = _as_tuple(v, "v", "vjp")[1]
        live = [k for k, o in enumerate(outputs) if o.requires_grad]
        found = gradients([outputs[k] for k in live], fresh, None if cotangents is None else
                          [cotangents[k] for k in live], create_graph=create_graph) if live else (None,) * len(fresh)
    return many_out, outputs, tuple(found)


def jvp(func, inputs, v=None, create_graph: bool = False, strict: bool = False):
    """``(func(inputs), J v)``, by forward mode."""
    many_in, inputs = _as_tuple(inputs, "inputs", "jvp")
    if v is None:
        if len(inputs) != 1 or inputs[0].numel() != 1:
            raise RuntimeError("The vector v can only be None if the input to the user-provided function is a single "
                               "Tensor with a single element.")
        tangents = tuple(x.new_ones(x.shape) for x in inputs)
    else:
        tangents = _as_tuple(v, "v", "jvp")[1]
    level = forward_ad.open_level()
    try:
        duals = tuple(forward_ad.make_dual(x if create_graph else x.detach(), t, level=level)
                      for x, t in zip(inputs, tangents))
        many_out, outputs = _outputs(func, duals, "jvp")
        unpacked = [forward_ad.unpack_dual(o, level=level) for o in outputs]
    finally:
        forward_ad.close_level(level)
    from tilewise.ops.creation import zeros_like

    primals = _done(tuple(p for p, _ in unpacked), create_graph)
    products = _done(tuple(t if t is not None else zeros_like(p) for p, t in unpacked), create_graph)
    return (primals if many_out else primals[0]), (products if many_out else products[0])


def jacobian(func, inputs, create_graph: bool = False, strict: bool = False, vectorize: bool = False,
             strategy: str = "reverse-mode"):
    """d func / d inputs: one vjp per output element (``strategy="reverse-mode"``) or one jvp per input element
    (``"forward-mode"``). Shapes as torch's: ``output.shape + input.shape`` per pair, nested as the outputs and
    inputs are."""
    if strategy not in ("forward-mode", "reverse-mode"):
        raise ValueError('Expected strategy to be either "forward-mode" or "reverse-mode". Hint: If your function '
                         'has more outputs than inputs, "forward-mode" tends to be more performant. Otherwise, prefer '
                         'to use "reverse-mode".')
    if strategy == "forward-mode" and not vectorize:  # torch's restrictions, kept so that code moves over unchanged
        raise NotImplementedError("Computing Jacobian using forward-AD or forward-over-reverse Hessian isonly "
                                  "implemented for `vectorize=True`.")
    if strategy == "forward-mode" and create_graph:
        raise NotImplementedError("torch.autograd.functional.jacobian: `create_graph=True` and "
                                  '`strategy="forward-mode"` are not supported together (yet). Please either set '
                                  '`create_graph=False` or `strategy="reverse-mode"`.')
    if strict and vectorize:
        raise RuntimeError("torch.autograd.functional.jacobian: `strict=True` and `vectorized=True` are not supported "
                           "together. Please either set `strict=False` or `vectorize=False`.")
    many_in, inputs = _as_tuple(inputs, "inputs", "jacobian")
    if strict:
        with enable_grad():
            many_out, outputs = _outputs(func, _fresh(inputs, False), "jacobian")
        _check_requires_grad(outputs, "outputs", strict)
        outputs = tuple(o.detach() for o in outputs)
    else:
        many_out, outputs = _as_tuple(func(*(x.detach() for x in inputs)), "outputs of the user-provided function",
                                      "jacobian")
    blocks = _jacobian_blocks(func, inputs, outputs, create_graph, strategy, strict)
    rows = [tuple(row) if many_in else row[0] for row in blocks]
    return tuple(rows) if many_out else rows[0]


def _one_hot(like: Tensor, i: int) -> Tensor:
    flat = like.new_zeros(like.numel())
    flat[i] = 1
    return flat.view(like.shape)


def _jacobian_blocks(func, inputs: tuple, outputs: tuple, create_graph: bool, strategy: str,
                     strict: bool = False) -> list[list[Tensor]]:
    from tilewise.ops.registry import OPS

    blocks = []
    for k, out in enumerate(outputs):
        row = []
        if strategy == "reverse-mode":
            pulled = []
            for i in range(out.numel()):
                cot = tuple(_one_hot(o, i) if j == k else o.new_zeros(o.shape) for j, o in enumerate(outputs))
                found = _pull(func, inputs, cot, create_graph, False)[2]
                for j, g in enumerate(found if strict else ()):
                    if g is None:
                        raise RuntimeError(f"Output {k} of the user-provided function is independent of input {j}. "
                                           "This is not allowed in strict mode.")
                    if create_graph and not g.requires_grad:
                        raise RuntimeError(f"The jacobian of the user-provided function is independent of input {j}. "
                                           "This is not allowed in strict mode when create_graph=True.")
                pulled.append(_done(_zeros_where_unused(found, inputs), create_graph))
            for j, x in enumerate(inputs):
                parts = [p[j].reshape(-1) for p in pulled]
                stacked = OPS["stack"](parts, 0) if parts else x.new_zeros((0, x.numel()))
                row.append(stacked.reshape(*out.shape, *x.shape))
        else:
            for j, x in enumerate(inputs):
                cols = []
                for i in range(x.numel()):
                    tangents = tuple(_one_hot(y, i) if m == j else y.new_zeros(y.shape) for m, y in enumerate(inputs))
                    product = jvp(func, inputs, tangents, create_graph)[1]
                    cols.append((product if isinstance(product, tuple) else (product,))[k].reshape(-1))
                stacked = OPS["stack"](cols, -1) if cols else out.new_zeros((out.numel(), 0))
                row.append(stacked.reshape(*out.shape, *x.shape))
        blocks.append(row)
    return blocks


def hessian(func, inputs, create_graph: bool = False, strict: bool = False, vectorize: bool = False,
            outer_jacobian_strategy: str = "reverse-mode"):
    """The Hessian of a function returning a single-element tensor."""
    many_in, inputs = _as_tuple(inputs, "inputs", "hessian")

    def gradient(*xs):
        if outer_jacobian_strategy == "forward-mode":  # so that the inner vjp views the dual inputs, not detaches
            xs = tuple(x.requires_grad_(True) for x in xs)
        with enable_grad():
            out = func(*xs)
        many_out, outs = _as_tuple(out, "outputs of the user-provided function", "hessian")
        if strict:
            with enable_grad():
                _check_requires_grad(_outputs(func, _fresh(xs, False), "hessian")[1], "outputs", strict)
        if many_out or not isinstance(out, Tensor):
            raise RuntimeError("The function given to hessian should return a single Tensor")
        if out.numel() != 1:
            raise RuntimeError("The Tensor returned by the function given to hessian should contain a single element")
        grads = vjp(func, xs, None, create_graph=True)[1]
        _check_requires_grad(grads, "jacobian", strict)
        return grads if many_in else grads[0]

    found = jacobian(gradient, inputs if many_in else inputs[0], create_graph, strict=strict, vectorize=vectorize,
                     strategy=outer_jacobian_strategy)
    return found


def _second_order(func, inputs, v, create_graph: bool, name: str, transpose: bool):

    many_in, inputs = _as_tuple(inputs, "inputs", name)
    if v is None:  # torch's rule: only for one input of one element
        if len(inputs) != 1 or inputs[0].numel() != 1:
            raise RuntimeError("The vector v can only be None if the input to the user-provided function is a single "
                               "Tensor with a single element.")
        vectors = (inputs[0].new_ones(inputs[0].shape),)
    else:
        vectors = _as_tuple(v, "v", name)[1]
    with enable_grad():
        fresh = _fresh(inputs, True)
        out = func(*fresh)
        if isinstance(out, tuple) and len(out) == 1:
            out = out[0]
        if not isinstance(out, Tensor):
            raise RuntimeError(f"The function given to {name} should return a single Tensor")
        if out.numel() != 1:
            raise RuntimeError(f"The Tensor returned by the function given to {name} should contain a single element")
        first = _zeros_where_unused(gradients([out], fresh, None, create_graph=True), fresh)
        pairing = sum((g * w).sum() for g, w in zip(first, vectors))
        second = gradients([pairing], fresh, None, create_graph=create_graph) if pairing.requires_grad \
            else (None,) * len(fresh)
    result = _done(_zeros_where_unused(second, inputs), create_graph)
    value = out if create_graph else out.detach()
    return value, (result if many_in else result[0])


def vhp(func, inputs, v=None, create_graph: bool = False, strict: bool = False):
    """``(func(inputs), v^T H)``."""
    return _second_order(func, inputs, v, create_graph, "vhp", True)


def hvp(func, inputs, v=None, create_graph: bool = False, strict: bool = False):
    """``(func(inputs), H v)`` (H is symmetric, so this is vhp's product; torch computes it the same way)."""
    return _second_order(func, inputs, v, create_graph, "hvp", False)

"""``tilewise.autograd.gradcheck`` and ``gradgradcheck``: backward against finite differences, as torch checks.

[Note: gradcheck] For every differentiable input (a floating tensor that requires grad) and every floating output,
the numerical Jacobian is taken by central differences, ``(f(x + eps e_k) - f(x - eps e_k)) / 2 eps`` for each
element ``k`` of the input (the input perturbed in place on a copy, on its own device), and the analytical one
row by row: the vector-Jacobian product of each output element's one-hot cotangent, through ``autograd.grad``.
They must agree elementwise within ``atol + rtol * |numerical|``, else ``GradcheckError`` (a ``RuntimeError``)
names the output and the input and prints both Jacobians, in torch's words; ``raise_exception=False`` returns
False instead. ``fast_mode=True`` checks one random direction per input/output pair instead of whole Jacobians
(torch's fast gradcheck: ``u^T J v`` both ways). Inputs that are not double precision get torch's warning.
``gradgradcheck`` runs the same check on the function's first derivative (its vector-Jacobian product with
random cotangents, built with ``create_graph=True``).
"""

from __future__ import annotations

import warnings

import numpy as np

from tilewise.autograd.engine import run_backward
from tilewise.tensor import Tensor


class GradcheckError(RuntimeError):
    """Raised by ``gradcheck`` and ``gradgradcheck`` when the analytical and numerical derivatives differ."""


def _tuple(values) -> tuple:
    return (values,) if isinstance(values, Tensor) else tuple(values)


def _differentiable(inputs: tuple) -> list[int]:
    found = []
    for k, value in enumerate(inputs):
        if isinstance(value, Tensor) and value.requires_grad:
            if not (value.dtype.is_floating_point or value.dtype.is_complex):
                raise ValueError(f"gradcheck: input #{k} requires grad but is {value.dtype.name}; only floating "
                                 "point and complex tensors can require gradients")
            if value.dtype.name not in ("float64", "complex128"):
                warnings.warn(f"Input #{k} requires gradient and is not a double precision floating point or "
                              "complex. This check will likely fail if all the inputs are not of double precision "
                              "floating point or complex. ", stacklevel=3)
            found.append(k)
    return found


def _outputs(func, inputs: tuple) -> tuple:
    return tuple(o for o in _tuple(func(*inputs)))


def _numerical(func, inputs: tuple, k: int, eps: float) -> list[np.ndarray]:
    """d(outputs)/d(inputs[k]) by central differences: one (output numel, input numel) array per output."""
    from tilewise.autograd.grad_mode import no_grad

    base = inputs[k]
    columns: list[list[np.ndarray]] = []
    with no_grad():
        flat = base.detach().reshape(-1).clone()
    for e in range(flat.numel()):
        value = float(flat[e])
        results = []
        for step in (eps, -eps):
            with no_grad():  # the perturbation; the function runs with grad mode as given (gradgradcheck's needs it)
                probe = flat.clone()
                probe[e] = value + step
            shifted = list(inputs)
            shifted[k] = probe.reshape(base.shape).detach().requires_grad_(base.requires_grad)
            results.append([o.detach().cpu().numpy().astype(np.float64).reshape(-1)
                            for o in _outputs(func, tuple(shifted))])
        columns.append([(plus - minus) / (2 * eps) for plus, minus in zip(*results)])
    if not columns:
        outs = _outputs(func, inputs)
        return [np.zeros((o.numel(), 0)) for o in outs]
    return [np.stack([c[j] for c in columns], axis=1) for j in range(len(columns[0]))]


def _analytical(func, inputs: tuple, k: int) -> list[np.ndarray]:
    """d(outputs)/d(inputs[k]) row by row, one vector-Jacobian product per output element."""
    from tilewise.ops.creation import zeros_like

    outs = _outputs(func, inputs)
    jacobians = []
    for out in outs:
        rows = np.zeros((out.numel(), inputs[k].numel()))
        if out.requires_grad and out.dtype.is_floating_point:
            for r in range(out.numel()):
                cotangent = zeros_like(out).reshape(-1)
                cotangent[r] = 1.0
                (g,) = run_backward((out,), (cotangent.reshape(out.shape),), retain_graph=True, create_graph=False,
                                    inputs=(inputs[k],), allow_unused=True, accumulate=False)
                if g is not None:
                    rows[r] = g.detach().cpu().numpy().astype(np.float64).reshape(-1)
        jacobians.append(rows)
    return jacobians


def _fail(message: str, raise_exception: bool) -> bool:
    if raise_exception:
        raise GradcheckError(message)
    return False


def _format(matrix: np.ndarray) -> str:
    return np.array2string(matrix, precision=4, suppress_small=True)


def gradcheck(func, inputs, *, eps: float = 1e-6, atol: float = 1e-5, rtol: float = 1e-3,
              raise_exception: bool = True, nondet_tol: float = 0.0, check_undefined_grad: bool = True,
              check_grad_dtypes: bool = False, check_batched_grad: bool = False,
              check_batched_forward_grad: bool = False, check_forward_ad: bool = False,
              check_backward_ad: bool = True, fast_mode: bool = False, masked: bool | None = None) -> bool:
    """Check the gradients of ``func`` at ``inputs`` against finite differences (see [Note: gradcheck])."""
    inputs = _tuple(inputs)
    wrt = _differentiable(inputs)
    if not wrt:
        raise ValueError("gradcheck expects at least one input tensor to require gradient, but none of them "
                         "have requires_grad=True.")
    if not check_backward_ad:
        return True
    rng = np.random.default_rng(0)
    for k in wrt:
        numerical = _numerical(func, inputs, k, eps)
        analytical = _analytical(func, inputs, k)
        for j, (num, ana) in enumerate(zip(numerical, analytical)):
            if fast_mode:  # u^T J v, the same random directions both ways
                u = rng.standard_normal(num.shape[0])
                v = rng.standard_normal(num.shape[1])
                num_value, ana_value = u @ num @ v, u @ ana @ v
                if abs(ana_value - num_value) > atol + rtol * abs(num_value):
                    return _fail(f"Jacobian mismatch for output {j} with respect to input {k},\n"
                                 f"numerical:{num_value!r}\nanalytical:{ana_value!r}\n", raise_exception)
                continue
            if not np.all(np.abs(ana - num) <= atol + rtol * np.abs(num)):
                return _fail(f"Jacobian mismatch for output {j} with respect to input {k},\n"
                             f"numerical:{_format(num)}\nanalytical:{_format(ana)}\n", raise_exception)
    return True


def gradgradcheck(func, inputs, grad_outputs=None, *, eps: float = 1e-6, atol: float = 1e-5, rtol: float = 1e-3,
                  gen_non_contig_grad_outputs: bool = False, raise_exception: bool = True, nondet_tol: float = 0.0,
                  check_undefined_grad: bool = True, check_grad_dtypes: bool = False,
                  check_batched_grad: bool = False, check_fwd_over_rev: bool = False,
                  check_rev_over_rev: bool = True, fast_mode: bool = False, masked: bool = False) -> bool:
    """``gradcheck`` of ``func``'s vector-Jacobian product with ``grad_outputs`` (random ones by default)."""
    from tilewise.ops.creation import randn_like

    inputs = _tuple(inputs)
    outputs = _outputs(func, inputs)
    if grad_outputs is None:
        grad_outputs = tuple(randn_like(o).requires_grad_() for o in outputs
                             if o.requires_grad and o.dtype.is_floating_point)
    grad_outputs = _tuple(grad_outputs)
    count = len(inputs)
    wrt = [k for k in range(count) if isinstance(inputs[k], Tensor) and inputs[k].requires_grad]

    def first_derivative(*values):
        ins, cots = values[:count], values[count:]
        outs = [o for o in _outputs(func, ins) if o.requires_grad and o.dtype.is_floating_point]
        grads = run_backward(tuple(outs), tuple(cots), retain_graph=True, create_graph=True,
                             inputs=tuple(ins[k] for k in wrt), allow_unused=True, accumulate=False)
        return tuple(g for g in grads if g is not None)

    return gradcheck(first_derivative, inputs + grad_outputs, eps=eps, atol=atol, rtol=rtol,
                     raise_exception=raise_exception, fast_mode=fast_mode)

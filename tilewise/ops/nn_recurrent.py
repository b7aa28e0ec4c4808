"""The recurrent cells of tilewise.nn.RNN / LSTM / GRU: the gate arithmetic of one time step, and its backward.

[Note: recurrent cells] A recurrent layer projects the inputs of every time step at once (one matmul per layer
and direction, ``x @ W_ih^T + b``); what stays inside the time loop is one matmul for the hidden projection and
the gate arithmetic. Each cell here is that arithmetic, as one operator with an explicit derivative:
  * ``_lstm_cell(input_gates, hidden_gates, cx) -> (hy, cy)``: the gates in torch's order (input, forget, cell,
    output), both biases already in ``input_gates``; the backward recomputes the gates from what it saved (the two
    gate tensors and ``cx``), so a step keeps nothing it would not keep anyway;
  * ``_gru_cell(input_gates, hidden_gates, hx) -> hy``: torch's GRU, whose new gate multiplies the reset gate by
    the hidden projection *with* its bias (``r * (W_hn h + b_hn)``), so ``hidden_gates`` carries ``b_hh``;
  * ``_split_steps(input, sizes)``: the projected inputs cut into per-step pieces whose backward is one ``cat``
    (slicing each step out of the projection would add a whole projection-sized gradient per step).
Both cells and their backwards are composites of pointwise primitives; on CUDA each runs as one generated kernel
(``backends/cuda/fused.py``), so a step is a GEMM and one kernel each way. Arithmetic runs in float32 for
half-precision gates, as cuDNN's does.
"""

from __future__ import annotations

from tilewise.dtypes import compute_dtype
from tilewise.ops.registry import OPS, declare


def _cell_op(schema: str, decomposition, grad: dict | None = None, **attrs):
    """A function of the tilewise namespace (``tw._lstm_cell``, as torch has ``torch._thnn_fused_lstm_cell``), not a
    Tensor method."""
    return declare(schema, "composite", decomposition=decomposition, grad=grad, method=False, **attrs)


def _widened(*tensors):
    return tuple(t.to(compute_dtype(t.dtype)) for t in tensors)


def _check_gates(op: str, input_gates, hidden_gates, state, chunks: int) -> None:
    hidden = state.shape[-1] if state.ndim == 2 else -1
    expected = (state.shape[0], chunks * hidden)
    for name, t in (("input_gates", input_gates), ("hidden_gates", hidden_gates)):
        if state.ndim != 2 or t.ndim != 2 or tuple(t.shape) != expected:
            raise RuntimeError(f"{op}: {name} has shape {list(t.shape)}; with a state of shape {list(state.shape)} "
                               f"it must be [batch, {chunks} * hidden] = {list(expected)}")


def _columns(pieces):
    return OPS["cat"](pieces, 1)


def _lstm_gates(input_gates, hidden_gates, cx):
    ig, hg, c = _widened(input_gates, hidden_gates, cx)
    i, f, g, o = (a + b for a, b in zip(ig.chunk(4, 1), hg.chunk(4, 1)))  # per gate: one fused nest of [B, H]
    return i.sigmoid(), f.sigmoid(), g.tanh(), o.sigmoid(), c


def _lstm_cell(input_gates, hidden_gates, cx):
    _check_gates("_lstm_cell", input_gates, hidden_gates, cx, 4)
    i, f, g, o, c = _lstm_gates(input_gates, hidden_gates, cx)
    cy = f * c + i * g
    hy = o * cy.tanh()
    return hy.to(input_gates.dtype), cy.to(cx.dtype)


def _lstm_cell_backward(grad_hy, grad_cy, input_gates, hidden_gates, cx):
    """(gradient of the gates, gradient of cx); the gates' gradient is that of input_gates and hidden_gates."""
    i, f, g, o, c = _lstm_gates(input_gates, hidden_gates, cx)
    dh, dc = _widened(grad_hy, grad_cy)
    tanh_cy = (f * c + i * g).tanh()
    dc = dc + dh * o * (1 - tanh_cy * tanh_cy)
    grad_gates = _columns([dc * g * i * (1 - i), dc * c * f * (1 - f), dc * i * (1 - g * g),
                           dh * tanh_cy * o * (1 - o)])
    return grad_gates.to(input_gates.dtype), (dc * f).to(cx.dtype)


def _gru_gates(input_gates, hidden_gates, hx):
    ig, hg, h = _widened(input_gates, hidden_gates, hx)
    ir, iz, in_ = ig.chunk(3, 1)
    hr, hz, hn = hg.chunk(3, 1)
    r, z = (ir + hr).sigmoid(), (iz + hz).sigmoid()
    return r, z, (in_ + r * hn).tanh(), hn, h


def _gru_cell(input_gates, hidden_gates, hx):
    _check_gates("_gru_cell", input_gates, hidden_gates, hx, 3)
    _, z, n, _, h = _gru_gates(input_gates, hidden_gates, hx)
    return (n + z * (h - n)).to(hx.dtype)


def _gru_cell_backward(grad, input_gates, hidden_gates, hx):
    """Gradients of input_gates, hidden_gates and hx."""
    r, z, n, hn, h = _gru_gates(input_gates, hidden_gates, hx)
    (g,) = _widened(grad)
    dn = g * (1 - z) * (1 - n * n)
    dr = dn * hn * r * (1 - r)
    dz = g * (h - n) * z * (1 - z)
    grad_input = _columns([dr, dz, dn]).to(input_gates.dtype)
    grad_hidden = _columns([dr, dz, dn * r]).to(hidden_gates.dtype)
    return grad_input, grad_hidden, (g * z).to(hx.dtype)


def _split_steps(input, sizes):
    if sum(sizes) != input.shape[0] or any(s < 0 for s in sizes):
        raise RuntimeError(f"_split_steps: step sizes {list(sizes)} must be non-negative and sum to the first "
                           f"dimension of the input, {input.shape[0]}")
    return tuple(input.split(list(sizes), 0))


_cell_op("_lstm_cell(Tensor input_gates, Tensor hidden_gates, Tensor cx) -> (Tensor, Tensor)", _lstm_cell,
         {"input_gates, hidden_gates, cx":
          "(lambda g: (g[0], g[0], g[1]))(OPS['_lstm_cell_backward'](grads[0], grads[1], input_gates, hidden_gates, "
          "cx))"})
_cell_op("_lstm_cell_backward(Tensor grad_hy, Tensor grad_cy, Tensor input_gates, Tensor hidden_gates, Tensor cx) "
         "-> (Tensor, Tensor)", _lstm_cell_backward)
_cell_op("_gru_cell(Tensor input_gates, Tensor hidden_gates, Tensor hx) -> Tensor", _gru_cell,
         {"input_gates, hidden_gates, hx": "OPS['_gru_cell_backward'](grad, input_gates, hidden_gates, hx)"})
_cell_op("_gru_cell_backward(Tensor grad, Tensor input_gates, Tensor hidden_gates, Tensor hx) "
         "-> (Tensor, Tensor, Tensor)", _gru_cell_backward)
_cell_op("_split_steps(Tensor input, int[] sizes) -> Tensor[]", _split_steps, {"input": "cat(grads, 0)"})

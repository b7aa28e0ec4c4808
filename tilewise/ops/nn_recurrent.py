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
    (slicing each step out of the projection would add a whole projection-sized gradient per step);
  * ``_rnn_hidden_projection(h, W_hh)``: a step's hidden projection, giving W_hh no gradient (a layer computes
    it in one product, see nn/modules/rnn.py);
  * ``_lstm_layer(input_gates, h0, c0, W_hh)``: a whole LSTM layer in one direction over full-length sequences
    (see [Note: an LSTM layer as one operator]).
Both cells and their backwards are composites of pointwise primitives; on CUDA each runs as one generated kernel
(``compiler/composites.py``), and in a compiled step likewise. The backwards return their gradients packed in one
tensor (``_by_slot``) so that the one kernel writes them all. Arithmetic runs in float32 for half-precision
gates, as cuDNN's does.
"""

from __future__ import annotations

from tilewise.dtypes import compute_dtype
from tilewise.ops.creation import arange, zeros
from tilewise.ops.registry import OPS, declare, public_function


def _cell_op(schema: str, decomposition, grad: dict | None = None, **attrs):
    """A function of the tilewise namespace (``tw._lstm_cell``, as torch has ``torch._thnn_fused_lstm_cell``), not a
    Tensor method."""
    return declare(schema, "composite", decomposition=decomposition, grad=grad, method=False, **attrs)


def _check_gates(op: str, input_gates, hidden_gates, state, chunks: int) -> None:
    hidden = state.shape[-1] if state.ndim == 2 else -1
    expected = (state.shape[0], chunks * hidden)
    for name, t in (("input_gates", input_gates), ("hidden_gates", hidden_gates)):
        if state.ndim != 2 or t.ndim != 2 or tuple(t.shape) != expected:
            raise RuntimeError(f"{op}: {name} has shape {list(t.shape)}; with a state of shape {list(state.shape)} "
                               f"it must be [batch, {chunks} * hidden] = {list(expected)}")


def _widened(t):
    return t.to(compute_dtype(t.dtype))


# Operands are cut and broadcast before they are widened: in a compiled training step the forward's cell and the
# backward's (which broadcasts to its packed shape) then share no widened value that would need its own kernel.
def _chunk(t, k: int, chunks: int, slots: int):
    """Chunk ``k`` of ``t``'s columns (``[B, chunks * H]``) as ``[B, H]``, or broadcast to ``[B, slots, H]``;
    widened to the compute dtype."""
    width = t.shape[1] // chunks
    if not slots:
        return _widened(t.narrow(1, k * width, width))
    return _widened(t.reshape(t.shape[0], chunks, width)[:, k:k + 1].expand(t.shape[0], slots, width))


def _state(t, slots: int):
    return _widened(t.unsqueeze(1).expand(t.shape[0], slots, t.shape[1]) if slots else t)


def _by_slot(values: list):
    """``[B, len(values), H]`` holding each value (``[B, len(values), H]``, equal along dim 1) in its slot. A
    backward returns its gradients packed so, as one tensor: its arithmetic runs on operands broadcast to the
    packed shape, so the whole backward is one elementwise nest that writes every gradient once (separate
    outputs joined by ``cat`` would be a copy per gradient after the kernel)."""
    slot = arange(len(values), device=values[0].device).view(1, len(values), 1)
    packed = values[-1]
    for k in reversed(range(len(values) - 1)):
        packed = public_function("where")(slot == k, values[k], packed)
    return packed


def _lstm_gates(input_gates, hidden_gates, cx, slots: int = 0):
    i, f, g, o = (_chunk(input_gates, k, 4, slots) + _chunk(hidden_gates, k, 4, slots) for k in range(4))
    return i.sigmoid(), f.sigmoid(), g.tanh(), o.sigmoid(), _state(cx, slots)


def _lstm_cell(input_gates, hidden_gates, cx):
    _check_gates("_lstm_cell", input_gates, hidden_gates, cx, 4)
    i, f, g, o, c = _lstm_gates(input_gates, hidden_gates, cx)
    cy = f * c + i * g
    hy = o * cy.tanh()
    return hy.to(input_gates.dtype), cy.to(cx.dtype)


def _lstm_cell_backward(grad_hy, grad_cy, input_gates, hidden_gates, cx):
    """The gradients packed ``[B, 5, H]`` (see ``_by_slot``): slots 0-3 the gates' (those of input_gates and of
    hidden_gates, flattened ``[B, 4H]``), slot 4 that of cx."""
    i, f, g, o, c = _lstm_gates(input_gates, hidden_gates, cx, slots=5)
    dh, dc = _state(grad_hy, 5), _state(grad_cy, 5)
    tanh_cy = (f * c + i * g).tanh()
    dc = dc + dh * o * (1 - tanh_cy * tanh_cy)
    return _by_slot([dc * g * i * (1 - i), dc * c * f * (1 - f), dc * i * (1 - g * g), dh * tanh_cy * o * (1 - o),
                     dc * f]).to(input_gates.dtype)


def _gru_gates(input_gates, hidden_gates, hx, slots: int = 0):
    ir, iz, in_ = (_chunk(input_gates, k, 3, slots) for k in range(3))
    hr, hz, hn = (_chunk(hidden_gates, k, 3, slots) for k in range(3))
    r, z = (ir + hr).sigmoid(), (iz + hz).sigmoid()
    return r, z, (in_ + r * hn).tanh(), hn, _state(hx, slots)


def _gru_cell(input_gates, hidden_gates, hx):
    _check_gates("_gru_cell", input_gates, hidden_gates, hx, 3)
    _, z, n, _, h = _gru_gates(input_gates, hidden_gates, hx)
    return ((h - n) * z + n).to(hx.dtype)  # torch's order of operands: the result is laid out as hx


def _gru_cell_backward(grad, input_gates, hidden_gates, hx):
    """The gradients packed ``[B, 7, H]`` (see ``_by_slot``): slots 0-2 input_gates', 3-5 hidden_gates', 6 hx's."""
    r, z, n, hn, h = _gru_gates(input_gates, hidden_gates, hx, slots=7)
    g = _state(grad, 7)
    dn = g * (1 - z) * (1 - n * n)
    dr = dn * hn * r * (1 - r)
    dz = g * (h - n) * z * (1 - z)
    return _by_slot([dr, dz, dn, dr, dz, dn * r, g * z]).to(input_gates.dtype)


def _rnn_hidden_projection(input, weight):
    return input.mm(weight.t())


def _split_steps(input, sizes):
    if sum(sizes) != input.shape[0] or any(s < 0 for s in sizes):
        raise RuntimeError(f"_split_steps: step sizes {list(sizes)} must be non-negative and sum to the first "
                           f"dimension of the input, {input.shape[0]}")
    return tuple(input.split(list(sizes), 0))


_cell_op("_lstm_cell(Tensor input_gates, Tensor hidden_gates, Tensor cx) -> (Tensor, Tensor)", _lstm_cell,
         {"input_gates, hidden_gates, cx":
          "(lambda p: (p[:, :4].flatten(1), p[:, :4].flatten(1), p[:, 4].to(cx.dtype)))("
          "OPS['_lstm_cell_backward'](grads[0], grads[1], input_gates, hidden_gates, cx))"},
         fwd="lstm_cell_jvp(input_gates, hidden_gates, cx, input_gates_t, hidden_gates_t, cx_t)")
_cell_op("_lstm_cell_backward(Tensor grad_hy, Tensor grad_cy, Tensor input_gates, Tensor hidden_gates, Tensor cx) "
         "-> Tensor", _lstm_cell_backward)
_cell_op("_gru_cell(Tensor input_gates, Tensor hidden_gates, Tensor hx) -> Tensor", _gru_cell,
         {"input_gates, hidden_gates, hx":
          "(lambda p: (p[:, :3].flatten(1), p[:, 3:6].flatten(1).to(hidden_gates.dtype), p[:, 6].to(hx.dtype)))("
          "OPS['_gru_cell_backward'](grad, input_gates, hidden_gates, hx))"},
         fwd="gru_cell_jvp(input_gates, hidden_gates, hx, input_gates_t, hidden_gates_t, hx_t)")
_cell_op("_gru_cell_backward(Tensor grad, Tensor input_gates, Tensor hidden_gates, Tensor hx) -> Tensor",
         _gru_cell_backward)
# A time step's hidden projection ``h @ W_hh^T`` that gives W_hh no gradient: a layer gives W_hh its gradient in
# one product over all steps (nn/modules/rnn.py). Its input's gradient reads W_hh, so a second derivative does.
_cell_op("_rnn_hidden_projection(Tensor input, Tensor weight) -> Tensor", _rnn_hidden_projection,
         {"input": "grad.mm(weight)", "weight": None}, autocast="lower",
         fwd="auto_linear")
_cell_op("_split_steps(Tensor input, int[] sizes) -> Tensor[]", _split_steps, {"input": "cat(grads, 0)"},
         fwd="auto_linear")


# [Note: an LSTM layer as one operator]
# Run step by step, a layer is two operator calls per time step each way (the hidden projection and the cell),
# each through the dispatcher and autograd: at a few microseconds of host time per call, a 256-step layer of large
# batch waits on the host, not the GPU. ``_lstm_layer`` is the whole time loop as one operator with an explicit
# derivative, ``_lstm_layer_backward``, so a backend can run the loop below the dispatcher on raw buffers (on
# CUDA, backends/cuda/recurrent.py: a GEMM and a generated cell kernel per step). Its decomposition is the loop
# of ``_lstm_cell`` and products the modules ran before, so where no kernel takes it (the CPU, a compiled trace)
# results and gradients are unchanged. Besides the outputs and final state it returns what the backward reads,
# as cuDNN keeps a reserve: every step's cell state ``cs`` [T, B, H] and hidden projection ``hidden_gates``
# [T, B, 4H] (the backward recomputes the gates from them, as ``_lstm_cell_backward`` does). The backward
# returns the gradients of input_gates, h0, c0 and W_hh; W_hh's is one product over all steps (see [Note: the
# hidden weight's gradient in one product] in nn/modules/rnn.py). Layers with a projection (``proj_size``) or
# packed sequences keep the step-by-step loop.

def _check_layer(input_gates, h0, c0, w_hh) -> None:
    op = "_lstm_layer"
    if input_gates.ndim != 3 or h0.ndim != 2 or c0.ndim != 2 or w_hh.ndim != 2:
        raise RuntimeError(f"{op}: expected input_gates [T, B, 4H], h0 and c0 [B, H] and w_hh [4H, H]; got "
                           f"{list(input_gates.shape)}, {list(h0.shape)}, {list(c0.shape)} and {list(w_hh.shape)}")
    steps, batch, gates = input_gates.shape
    hidden = h0.shape[1]
    expected = ((steps, batch, 4 * hidden), (batch, hidden), (batch, hidden), (4 * hidden, hidden))
    got = tuple(tuple(t.shape) for t in (input_gates, h0, c0, w_hh))
    if got != expected:
        raise RuntimeError(f"{op}: input_gates {list(got[0])}, h0 {list(got[1])}, c0 {list(got[2])}, "
                           f"w_hh {list(got[3])}; with h0 of shape [B, H] = {list(got[1])} they must be "
                           f"{', '.join(str(list(e)) for e in expected)}")
    if steps == 0:
        raise RuntimeError(f"{op}: expected at least one time step, got input_gates of shape {list(got[0])}")
    dtypes = {t.dtype for t in (input_gates, h0, c0, w_hh)}
    if len(dtypes) != 1:
        raise RuntimeError(f"{op}: input_gates, h0, c0 and w_hh must have one dtype, got {input_gates.dtype}, "
                           f"{h0.dtype}, {c0.dtype} and {w_hh.dtype}")
    devices = {t.device for t in (input_gates, h0, c0, w_hh)}
    if len(devices) != 1:
        raise RuntimeError(f"{op}: input_gates, h0, c0 and w_hh must be on one device, got {input_gates.device}, "
                           f"{h0.device}, {c0.device} and {w_hh.device}")


def _lstm_layer(input_gates, h0, c0, w_hh):
    _check_layer(input_gates, h0, c0, w_hh)
    h, c = h0, c0
    outputs, cells, hidden = [], [], []
    for t in range(input_gates.shape[0]):
        hidden_gates = _rnn_hidden_projection(h, w_hh)
        h, c = OPS["_lstm_cell"](input_gates[t], hidden_gates, c)
        outputs.append(h)
        cells.append(c)
        hidden.append(hidden_gates)
    stack = public_function("stack")
    return stack(outputs, 0), h, c, stack(cells, 0), stack(hidden, 0)


def _lstm_layer_backward(grad_output, grad_hy, grad_cy, grad_cs, grad_hidden_gates, input_gates, h0, c0, w_hh,
                         output, cs, hidden_gates):
    """The gradients of input_gates, h0, c0 and w_hh; an output's gradient is None where none reached it (those of
    ``cs`` and ``hidden_gates`` only reach them in a second derivative, through a first backward that read them)."""
    steps = input_gates.shape[0]
    dh, dc = grad_hy, grad_cy
    grad_gates, grad_projections = [None] * steps, [None] * steps
    for t in reversed(range(steps)):
        dh = _summed(grad_output[t] if grad_output is not None else None, dh)
        dc = _summed(grad_cs[t] if grad_cs is not None else None, dc)
        c_prev = c0 if t == 0 else cs[t - 1]
        packed = OPS["_lstm_cell_backward"](_or_zeros(dh, h0), _or_zeros(dc, c0), input_gates[t], hidden_gates[t],
                                            c_prev)
        grad_gates[t] = packed[:, :4].flatten(1)
        grad_projections[t] = _summed(grad_hidden_gates[t] if grad_hidden_gates is not None else None, grad_gates[t])
        dc = packed[:, 4].to(c0.dtype)
        dh = grad_projections[t].mm(w_hh)
    stack = public_function("stack")
    projections = stack(grad_projections, 0)
    steps_in = public_function("cat")([h0.unsqueeze(0), output[:-1]], 0)
    rows = projections.reshape(-1, projections.shape[2])
    grad_w_hh = rows.t().mm(steps_in.reshape(-1, h0.shape[1]).to(rows.dtype))
    return stack(grad_gates, 0), dh, dc, grad_w_hh


def _summed(a, b):
    """``a + b`` where either may be None (no gradient)."""
    if a is None:
        return b
    return a if b is None else a + b


def _or_zeros(grad, like):
    return grad if grad is not None else zeros(like.shape, dtype=like.dtype, device=like.device)


_cell_op("_lstm_layer(Tensor input_gates, Tensor h0, Tensor c0, Tensor w_hh) -> (Tensor, Tensor, Tensor, Tensor, "
         "Tensor)", _lstm_layer,
         {"input_gates, h0, c0, w_hh":
          "OPS['_lstm_layer_backward'](*output_grads, input_gates, h0, c0, w_hh, result[0], result[3], result[4])"},
         autocast="lower",
         fwd="lstm_layer_jvp(input_gates, h0, c0, w_hh, input_gates_t, h0_t, c0_t, w_hh_t, result)")
_cell_op("_lstm_layer_backward(Tensor? grad_output, Tensor? grad_hy, Tensor? grad_cy, Tensor? grad_cs, "
         "Tensor? grad_hidden_gates, Tensor input_gates, Tensor h0, Tensor c0, Tensor w_hh, Tensor output, Tensor cs, "
         "Tensor hidden_gates) -> (Tensor, Tensor, Tensor, Tensor)", _lstm_layer_backward)

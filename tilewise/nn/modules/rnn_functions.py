"""torch.lstm, torch.gru, torch.rnn_tanh and torch.rnn_relu: the recurrent layers as functions of a flat list of
weights, with ATen's two signatures.

    lstm(input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first)
    lstm(data, batch_sizes, hx, params, has_biases, num_layers, dropout, train, bidirectional)   (packed)

``params`` holds, per layer and direction (the reverse one second), ``w_ih, w_hh`` then ``b_ih, b_hh`` where
``has_biases``, then an LSTM's ``w_hr`` where it projects (its h and c states differ in size), the order of
``nn.LSTM._flat_weights``. Each runs the layers' own time loop (``_run_layers`` in ``rnn.py``), so results,
gradients and every backend are the modules'. LSTM returns ``(output, h_n, c_n)``, the others ``(output, h_n)``.
"""

from __future__ import annotations

from tilewise.nn.modules.rnn import _run_layers
from tilewise.tensor import Tensor

__all__ = ["gru", "lstm", "rnn_relu", "rnn_tanh"]


class _FlatWeights:
    """What ``_run_layers`` reads of a module, from ATen's arguments."""

    def __init__(self, mode: str, params, has_biases: bool, num_layers: int, dropout: float, train: bool,
                 bidirectional: bool, projects: bool):
        self.mode, self.num_layers, self.bidirectional = mode, num_layers, bidirectional
        self.dropout, self.training = float(dropout), bool(train)
        self._params, self._has_biases = list(params), has_biases
        self._stride = len(self._params) // (num_layers * (2 if bidirectional else 1))
        expected = 2 + 2 * bool(has_biases) + bool(projects)
        if self._stride != expected:
            raise RuntimeError("got an incorrect number of RNN parameters")
        self._projects = projects

    def _direction_weights(self, layer: int, direction: int) -> tuple:
        k = (layer * (2 if self.bidirectional else 1) + direction) * self._stride
        group = self._params[k:k + self._stride]
        w_ih, w_hh = group[0], group[1]
        b_ih, b_hh = (group[2], group[3]) if self._has_biases else (None, None)
        return w_ih, w_hh, b_ih, b_hh, (group[-1] if self._projects else None)


def _check_counts(params, hidden: Tensor, num_layers: int, bidirectional: bool) -> None:
    states = num_layers * (2 if bidirectional else 1)
    if len(params) % states:
        raise RuntimeError("got an incorrect number of RNN parameters")
    if hidden.ndim < 1 or hidden.shape[0] != states:
        raise RuntimeError("Expected more hidden states in stacked_rnn")


def _check_states(h0: Tensor, c0, batch: int) -> None:
    """States of the input's batch (torch's kernel reads past a smaller one; this refuses it in its modules' words)."""
    for state in (h0, c0):
        if state is not None and (state.ndim != 3 or state.shape[1] != batch):
            expected = (h0.shape[0], batch, state.shape[-1])
            raise RuntimeError(f"Expected hidden size {expected}, got {list(state.shape)}")


def _run(mode: str, input: Tensor, batch_sizes, h0: Tensor, c0, params, has_biases, num_layers, dropout, train,
         bidirectional, batch_first):
    _check_counts(params, h0, num_layers, bidirectional)
    projects = c0 is not None and c0.shape[-1] != h0.shape[-1]
    spec = _FlatWeights(mode, params, has_biases, num_layers, dropout, train, bidirectional, projects)
    if batch_sizes is not None:
        sizes = [int(b) for b in batch_sizes.tolist()]
        _check_states(h0, c0, sizes[0] if sizes else 0)
        return _run_layers(spec, input, sizes, h0, c0)
    if input.ndim != 3:
        raise RuntimeError(f"input must have 3 dimensions, got {input.ndim}")
    steps_first = input.transpose(0, 1) if batch_first else input
    steps, batch = steps_first.shape[:2]
    _check_states(h0, c0, batch)
    if steps == 0:
        raise RuntimeError("Expected sequence length to be larger than 0 in RNN")
    rows = steps_first.reshape(steps * batch, steps_first.shape[2])
    out, h_n, c_n = _run_layers(spec, rows, [batch] * steps, h0, c0)
    out = out.view(steps, batch, out.shape[-1])
    return (out.transpose(0, 1) if batch_first else out), h_n, c_n


def lstm(*args):
    """torch.lstm: ``(output, h_n, c_n)``; ``hx`` is the pair ``(h_0, c_0)``. The packed form is told apart by its
    second argument, the batch sizes (a tensor where the other form has the pair)."""
    if len(args) != 9:
        raise TypeError(f"lstm() takes 9 positional arguments but {len(args)} were given")
    if isinstance(args[1], Tensor):
        data, batch_sizes, hx, params, has_biases, num_layers, dropout, train, bidirectional = args
        batch_first = False
    else:
        data, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first = args
        batch_sizes = None
    if len(hx) != 2:
        raise RuntimeError(f"lstm expects two hidden states, got {len(hx)}")
    return _run("LSTM", data, batch_sizes, hx[0], hx[1], params, has_biases, num_layers, dropout, train,
                bidirectional, batch_first)


def _single_state(mode: str, name: str):
    def function(*args):
        if len(args) != 9:
            raise TypeError(f"{name}() takes 9 positional arguments but {len(args)} were given")
        if isinstance(args[2], Tensor):  # (data, batch_sizes, hx, params, ...): the packed form
            data, batch_sizes, hx, params, has_biases, num_layers, dropout, train, bidirectional = args
            batch_first = False
        else:
            data, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first = args
            batch_sizes = None
        output, h_n, _ = _run(mode, data, batch_sizes, hx, None, params, has_biases, num_layers, dropout, train,
                              bidirectional, batch_first)
        return output, h_n

    function.__name__ = function.__qualname__ = name
    function.__doc__ = (f"torch.{name}: ``(output, h_n)`` of the {mode} layers over a flat list of weights (see the "
                        "module's note for the two signatures).")
    return function


gru = _single_state("GRU", "gru")
rnn_tanh = _single_state("RNN_TANH", "rnn_tanh")
rnn_relu = _single_state("RNN_RELU", "rnn_relu")

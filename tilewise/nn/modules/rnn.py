"""Recurrent layers: RNN (tanh / ReLU), LSTM (with projections), GRU, and their single-step cells.

[Note: recurrent layers] Parameter names, shapes, initialisation (uniform in ±1/sqrt(hidden_size)) and the
order of ``all_weights`` are torch's, so a torch state dict loads unchanged. A layer runs, per layer and
direction: one matmul projecting the inputs of every time step (``x @ W_ih^T`` plus both biases where the cell
allows), then a Python loop over time steps, each one matmul for the hidden projection and one gate operator
(``ops/nn_recurrent.py``). On CUDA each gate operator is one generated kernel, forward and backward, and
``tilewise.compile`` of a training step captures the whole loop into one program. An LSTM layer without
projection over full-length sequences hands the whole loop to one operator, ``_lstm_layer``, which a backend may
run below the dispatcher (on CUDA, ``backends/cuda/recurrent.py``). Gradients come from autograd
over these operators. Packed sequences run the same loop over steps of shrinking batch (see
``nn/utils/rnn.py``): sequences that end leave the running batch, and their final state is kept aside.
There are no cuDNN weight buffers, so ``flatten_parameters`` has nothing to do.
"""

from __future__ import annotations

import math
import numbers
import warnings

from tilewise.amp.autocast_mode import cast_to, get_autocast_dtype, is_autocast_enabled
from tilewise.autograd.function import Function
from tilewise.autograd.grad_mode import is_grad_enabled
from tilewise.autograd.graph import SavedTensor
from tilewise.nn import functional as F  # noqa: N812 — torch's spelling
from tilewise.nn import init
from tilewise.nn.modules.module import Module
from tilewise.nn.parameter import Parameter
from tilewise.nn.utils.rnn import PackedSequence
from tilewise.ops.creation import empty, zeros
from tilewise.ops.registry import OPS, public_function
from tilewise.tensor import Tensor

__all__ = ["RNNBase", "RNN", "LSTM", "GRU", "RNNCellBase", "RNNCell", "LSTMCell", "GRUCell"]

_GATES = {"LSTM": 4, "GRU": 3, "RNN_TANH": 1, "RNN_RELU": 1}
_cat, _stack = public_function("cat"), public_function("stack")


# ---------------------------------------------------------------- one time step of each kind


# A step takes its input gates, the state (h, c) and ``project``, which makes the hidden gates from h.


def _rnn_step(nonlinearity: str):
    def step(input_gates, h, c, project, w_hr):
        pre = input_gates + project(h)
        return (pre.tanh() if nonlinearity == "tanh" else pre.relu()), None

    return step


def _lstm_step(input_gates, h, c, project, w_hr):
    hy, cy = OPS["_lstm_cell"](input_gates, project(h), c)
    return (F.linear(hy, w_hr) if w_hr is not None else hy), cy


def _gru_step(input_gates, h, c, project, w_hr):
    return OPS["_gru_cell"](input_gates, project(h), h), None


def _linear_projection(w_hh, b_hh):
    return lambda h: F.linear(h, w_hh, b_hh)


def _projection_without_weight_gradient(w_hh):
    return lambda h: OPS["_rnn_hidden_projection"](h, w_hh)


_STEPS = {"LSTM": _lstm_step, "GRU": _gru_step, "RNN_TANH": _rnn_step("tanh"), "RNN_RELU": _rnn_step("relu")}


def _input_bias(mode: str, b_ih, b_hh):
    """The bias added to the input projection: both biases, except for GRU, whose b_hh sits inside the reset
    gate's product and goes with the hidden projection."""
    if b_ih is None or mode == "GRU":
        return b_ih
    return b_ih + b_hh


# ---------------------------------------------------------------- the time loop


class _HiddenWeightGradient(Function):
    """[Note: the hidden weight's gradient in one product] Where the gate pre-activation is the sum of the input
    and hidden projections (LSTM, RNN), both get the same gradient, so the gradient of ``W_hh`` is
    ``sum_t grad(gates_t)^T h_{t-1}`` = ``grad(projection)^T @ [h_{t-1} of every step]``: one GEMM over all steps,
    where autograd through each step's product would make a small GEMM and an accumulation per step. The loop's
    products (``_rnn_hidden_projection``) give no gradient to ``W_hh``, and this identity on the input projection
    gives it its gradient from the states the loop read, saved as it goes (``_saved_state``). Both stay
    differentiable, so a backward with ``create_graph`` (a gradient penalty) is torch's."""

    @staticmethod
    def forward(ctx, projection, weight_hh, saved):
        saved.ctx = ctx
        return projection

    @staticmethod
    def backward(ctx, grad):
        states_read = _cat(list(ctx.saved_tensors), 0)
        return grad, grad.t().mm(states_read.to(grad.dtype)), None


class _SavedStates:
    ctx = None


def _saved_state(h: Tensor) -> SavedTensor:
    """A state the loop read, saved for W_hh's gradient as its producer's output (holding the node weakly, as
    autograd saves outputs): no reference cycle through the graph, and a backward with ``create_graph`` still
    differentiates through it."""
    if h._grad_fn is None:
        return SavedTensor(h)
    return SavedTensor(h, is_output=True, node=h._grad_fn, output_nr=h._output_nr, op_name=h._grad_fn.name())


def _one_product_for_w_hh(mode: str, w_hh: Tensor) -> bool:
    return mode != "GRU" and is_grad_enabled() and w_hh.requires_grad


def _run_direction(mode: str, data: Tensor, sizes: list[int], h0: Tensor, c0, weights: tuple, reverse: bool):
    """One layer in one direction over steps of ``sizes`` rows of ``data`` (see the note in nn/utils/rnn.py).
    Returns the outputs (rows as in data) and the final hidden and cell states."""
    w_ih, w_hh, b_ih, b_hh, w_hr = weights
    if mode == "LSTM" and w_hr is None and all(s == sizes[0] for s in sizes):
        return _lstm_layer(data, len(sizes), h0, c0, weights, reverse)
    projection = F.linear(data, w_ih, _input_bias(mode, b_ih, b_hh))
    states_read = saved = None
    project = _linear_projection(w_hh, b_hh if mode == "GRU" else None)
    if _one_product_for_w_hh(mode, w_hh):
        saved, states_read = _SavedStates(), [None] * len(sizes)
        projection = _HiddenWeightGradient.apply(projection, w_hh, saved)
        project = _projection_without_weight_gradient(w_hh)
    steps = OPS["_split_steps"](projection, sizes)
    step = _STEPS[mode]
    outputs = [None] * len(sizes)
    if reverse:
        h, c = _rows(h0, sizes[-1]), _rows(c0, sizes[-1])
    else:
        h, c, ended_h, ended_c = h0, c0, [], []
    for t in (reversed(range(len(sizes))) if reverse else range(len(sizes))):
        if reverse and sizes[t] > h.shape[0]:  # sequences that start here (packed input: they are shorter)
            h, c = _grow(h, h0, sizes[t]), _grow(c, c0, sizes[t])
        elif not reverse and sizes[t] < h.shape[0]:  # sequences that ended: their state is final
            ended_h.append(h[sizes[t]:])
            ended_c.append(c[sizes[t]:] if c is not None else None)
            h, c = h[:sizes[t]], (c[:sizes[t]] if c is not None else None)
        if states_read is not None:
            states_read[t] = _saved_state(h)
        h, c = step(steps[t], h, c, project, w_hr)
        outputs[t] = h
    if saved is not None:
        saved.ctx._saved = tuple(states_read)
    if reverse:
        return _cat(outputs, 0), h, c
    h_n = _cat([h, *reversed(ended_h)], 0) if ended_h else h
    c_n = _cat([c, *reversed(ended_c)], 0) if ended_c and c is not None else c
    return _cat(outputs, 0), h_n, c_n


def _lstm_layer(data: Tensor, steps: int, h0: Tensor, c0: Tensor, weights: tuple, reverse: bool):
    """An LSTM layer without projection over full-length sequences: the whole time loop is one operator (see
    [Note: an LSTM layer as one operator] in ops/nn_recurrent.py). Returns (output rows, h_n, c_n)."""
    w_ih, w_hh, b_ih, b_hh, _ = weights
    projection = F.linear(data, w_ih, _input_bias("LSTM", b_ih, b_hh)).view(steps, data.shape[0] // steps,
                                                                               w_ih.shape[0])
    if reverse:
        projection = projection.flip(0)
    output, h_n, c_n, _, _ = OPS["_lstm_layer"](projection, h0, c0, w_hh)
    if reverse:
        output = output.flip(0)
    return output.reshape(data.shape[0], output.shape[2]), h_n, c_n


def _rows(state, n: int):
    return state if state is None or state.shape[0] == n else state[:n]


def _grow(state, initial, n: int):
    return None if state is None else _cat([state, initial[state.shape[0]:n]], 0)


def _run_layers(module: RNNBase, data: Tensor, sizes: list[int], hx: Tensor, cx) -> tuple:
    """Every layer and direction; returns (output rows, h_n, c_n or None). ``module`` is read for its ``mode``,
    ``num_layers``, ``bidirectional``, ``dropout``, ``training`` and ``_direction_weights`` alone (torch.lstm and its
    kin pass those of a flat weight list: ``rnn_functions.py``)."""
    directions = 2 if module.bidirectional else 1
    layer_input, final_h, final_c = data, [], []
    for layer in range(module.num_layers):
        if layer > 0 and module.dropout > 0 and module.training:
            layer_input = F.dropout(layer_input, module.dropout, True)
        outputs = []
        for direction in range(directions):
            k = layer * directions + direction
            weights = module._direction_weights(layer, direction)
            out, h, c = _run_direction(module.mode, layer_input, sizes, hx[k], cx[k] if cx is not None else None,
                                       weights, reverse=direction == 1)
            outputs.append(out)
            final_h.append(h)
            final_c.append(c)
        layer_input = outputs[0] if directions == 1 else _cat(outputs, 1)
    return layer_input, _stack(final_h, 0), (_stack(final_c, 0) if cx is not None else None)


def _autocast_dtype(t: Tensor):
    device_type = t.device.type
    if t.dtype.is_floating_point and is_autocast_enabled(device_type):
        return get_autocast_dtype(device_type)
    return None


# ---------------------------------------------------------------- modules


class RNNBase(Module):
    """The parameters and the time loop shared by RNN, LSTM and GRU (``mode``: "RNN_TANH", "RNN_RELU", "LSTM",
    "GRU")."""

    def __init__(self, mode: str, input_size: int, hidden_size: int, num_layers: int = 1, bias: bool = True,
                 batch_first: bool = False, dropout: float = 0.0, bidirectional: bool = False, proj_size: int = 0,
                 device=None, dtype=None) -> None:
        super().__init__()
        self.mode, self.input_size, self.hidden_size, self.num_layers = mode, input_size, hidden_size, num_layers
        self.bias, self.batch_first, self.bidirectional, self.proj_size = bias, batch_first, bidirectional, proj_size
        _check_arguments(input_size, hidden_size, num_layers, bias, batch_first, dropout, proj_size)
        self.dropout = float(dropout)
        if mode not in _GATES:
            raise ValueError("Unrecognized RNN mode: " + mode)
        gate_size = _GATES[mode] * hidden_size
        real_hidden = proj_size if proj_size > 0 else hidden_size
        directions = 2 if bidirectional else 1
        self._flat_weights_names, self._all_weights = [], []
        for layer in range(num_layers):
            for direction in range(directions):
                layer_input = input_size if layer == 0 else real_hidden * directions
                shapes = {"weight_ih": (gate_size, layer_input), "weight_hh": (gate_size, real_hidden)}
                if bias:
                    shapes.update(bias_ih=(gate_size,), bias_hh=(gate_size,))
                if proj_size > 0:
                    shapes["weight_hr"] = (proj_size, hidden_size)
                names = []
                for kind, shape in shapes.items():
                    name = f"{kind}_l{layer}{'_reverse' if direction == 1 else ''}"
                    setattr(self, name, Parameter(empty(*shape, device=device, dtype=dtype)))
                    names.append(name)
                self._flat_weights_names.extend(names)
                self._all_weights.append(names)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        stdv = 1.0 / math.sqrt(self.hidden_size) if self.hidden_size > 0 else 0
        for weight in self.parameters():
            init.uniform_(weight, -stdv, stdv)

    def flatten_parameters(self) -> None:
        """Nothing to do: the weights are used where they lie (torch packs them into one cuDNN buffer)."""

    @property
    def _flat_weights(self) -> list:
        return [getattr(self, name, None) for name in self._flat_weights_names]

    @property
    def all_weights(self) -> list[list[Parameter]]:
        return [[getattr(self, name) for name in names] for names in self._all_weights]

    def _direction_weights(self, layer: int, direction: int) -> tuple:
        """(w_ih, w_hh, b_ih, b_hh, w_hr) of one layer and direction, None where absent."""
        suffix = f"_l{layer}{'_reverse' if direction == 1 else ''}"
        return tuple(getattr(self, kind + suffix, None)
                     for kind in ("weight_ih", "weight_hh", "bias_ih", "bias_hh", "weight_hr"))

    # -- checks, with torch's messages

    def check_input(self, input: Tensor, batch_sizes: Tensor | None) -> None:
        weight = self._flat_weights[0]
        if input.dtype != weight.dtype and _autocast_dtype(input) is None:
            raise ValueError(f"RNN input dtype ({input.dtype}) does not match weight dtype ({weight.dtype}). "
                             f"Convert input: input.to({weight.dtype}), or convert model: model.to({input.dtype})")
        expected_dim = 2 if batch_sizes is not None else 3
        if input.dim() != expected_dim:
            raise RuntimeError(f"input must have {expected_dim} dimensions, got {input.dim()}")
        if self.input_size != input.size(-1):
            raise RuntimeError(f"input.size(-1) must be equal to input_size. Expected {self.input_size}, "
                               f"got {input.size(-1)}")

    def get_expected_hidden_size(self, input: Tensor, batch_sizes: Tensor | None) -> tuple[int, int, int]:
        if batch_sizes is not None:
            mini_batch = int(batch_sizes[0])
        else:
            mini_batch = input.size(0) if self.batch_first else input.size(1)
        directions = 2 if self.bidirectional else 1
        return (self.num_layers * directions, mini_batch, self.proj_size if self.proj_size > 0 else self.hidden_size)

    def check_hidden_size(self, hx: Tensor, expected_hidden_size: tuple, msg: str = "Expected hidden size {}, got {}"
                          ) -> None:
        if tuple(hx.size()) != tuple(expected_hidden_size):
            raise RuntimeError(msg.format(tuple(expected_hidden_size), list(hx.size())))

    def check_forward_args(self, input: Tensor, hidden: Tensor, batch_sizes: Tensor | None) -> None:
        self.check_input(input, batch_sizes)
        self.check_hidden_size(hidden, self.get_expected_hidden_size(input, batch_sizes))

    def permute_hidden(self, hx: Tensor, permutation: Tensor | None):
        return hx if permutation is None else hx.index_select(1, permutation)

    # -- the forward shared by RNN, LSTM and GRU

    def _zero_state(self, input: Tensor, batch: int, size: int) -> Tensor:
        directions = 2 if self.bidirectional else 1
        return zeros(self.num_layers * directions, batch, size, dtype=input.dtype, device=input.device)

    def _forward(self, input, hx):
        """``hx``: the hidden state, or for LSTM the pair (h, c); returns (output, h_n, c_n or None)."""
        is_lstm = self.mode == "LSTM"
        real_hidden = self.proj_size if self.proj_size > 0 else self.hidden_size
        packed = isinstance(input, PackedSequence)
        if packed:
            input, batch_sizes, sorted_indices, unsorted_indices = input
            batch = int(batch_sizes[0])
            is_batched = True
        else:
            batch_sizes, sorted_indices, unsorted_indices = None, None, None
            input, hx, is_batched = self._batch_unbatched(input, hx)
            batch = input.size(0) if self.batch_first else input.size(1)
        if hx is None:
            hx = self._zero_state(input, batch, real_hidden)
            if is_lstm:
                hx = (hx, self._zero_state(input, batch, self.hidden_size))
        elif is_lstm:
            hx = (self.permute_hidden(hx[0], sorted_indices), self.permute_hidden(hx[1], sorted_indices))
        else:
            hx = self.permute_hidden(hx, sorted_indices)
        self.check_forward_args(input, hx, batch_sizes)
        output, h_n, c_n = self._run(input, batch_sizes, hx if not is_lstm else hx[0], hx[1] if is_lstm else None)
        if packed:
            output = PackedSequence(output, batch_sizes, sorted_indices, unsorted_indices)
        elif not is_batched:
            output = output.squeeze(0 if self.batch_first else 1)
            h_n, c_n = h_n.squeeze(1), (c_n.squeeze(1) if c_n is not None else None)
        return output, self.permute_hidden(h_n, unsorted_indices), (
            self.permute_hidden(c_n, unsorted_indices) if c_n is not None else None)

    def _batch_unbatched(self, input: Tensor, hx):
        """A 2-D input is one unbatched sequence: give it (and its state) a batch dimension of one."""
        name = {"LSTM": "LSTM", "GRU": "GRU"}.get(self.mode, "RNN")
        if input.dim() not in (2, 3):
            instead = "D tensor instead" if name == "RNN" else "D instead"
            raise ValueError(f"{name}: Expected input to be 2D or 3D, got {input.dim()}{instead}")
        is_batched = input.dim() == 3
        if not is_batched:
            input = input.unsqueeze(0 if self.batch_first else 1)
        if hx is None:
            return input, hx, is_batched
        if self.mode == "LSTM":
            dims = (hx[0].dim(), hx[1].dim())
            want = 3 if is_batched else 2
            if dims != (want, want):
                kind = "batched 3-D" if is_batched else "unbatched 2-D"
                raise RuntimeError(f"For {kind} input, hx and cx should also be {want}-D but got "
                                   f"({dims[0]}-D, {dims[1]}-D) tensors")
            return input, (hx if is_batched else (hx[0].unsqueeze(1), hx[1].unsqueeze(1))), is_batched
        if is_batched and hx.dim() != 3:
            raise RuntimeError(f"For batched 3-D input, hx should also be 3-D but got {hx.dim()}-D tensor")
        if not is_batched and hx.dim() != 2:
            raise RuntimeError(f"For unbatched 2-D input, hx should also be 2-D but got {hx.dim()}-D tensor")
        return input, (hx if is_batched else hx.unsqueeze(1)), is_batched

    def _run(self, input: Tensor, batch_sizes: Tensor | None, hx: Tensor, cx):
        lower = _autocast_dtype(input)
        if lower is not None:  # torch's autocast runs the whole recurrence in the lower precision
            input, hx = cast_to(input, lower), cast_to(hx, lower)
            cx = cast_to(cx, lower) if cx is not None else None
        if batch_sizes is not None:
            return _run_layers(self, input, batch_sizes.tolist(), hx, cx)
        steps_first = input.transpose(0, 1) if self.batch_first else input
        steps, batch = steps_first.shape[:2]
        if steps == 0:
            raise RuntimeError("Expected sequence length to be larger than 0 in RNN")
        rows = steps_first.reshape(steps * batch, steps_first.shape[2])
        out, h_n, c_n = _run_layers(self, rows, [batch] * steps, hx, cx)
        out = out.view(steps, batch, out.shape[-1])
        return (out.transpose(0, 1) if self.batch_first else out), h_n, c_n

    def extra_repr(self) -> str:
        s = f"{self.input_size}, {self.hidden_size}"
        if self.proj_size != 0:
            s += f", proj_size={self.proj_size}"
        if self.num_layers != 1:
            s += f", num_layers={self.num_layers}"
        if self.bias is not True:
            s += f", bias={self.bias}"
        if self.batch_first is not False:
            s += f", batch_first={self.batch_first}"
        if self.dropout != 0:
            s += f", dropout={self.dropout}"
        if self.bidirectional is not False:
            s += f", bidirectional={self.bidirectional}"
        return s


def _check_arguments(input_size, hidden_size, num_layers, bias, batch_first, dropout, proj_size) -> None:
    if not isinstance(dropout, numbers.Number) or not 0 <= dropout <= 1 or isinstance(dropout, bool):
        raise ValueError("dropout should be a number in range [0, 1] representing the probability of an element "
                         "being zeroed")
    if dropout > 0 and num_layers == 1:
        warnings.warn("dropout option adds dropout after all but last recurrent layer, so non-zero dropout expects "
                      f"num_layers greater than 1, but got dropout={dropout} and num_layers={num_layers}",
                      stacklevel=4)
    for name, value, kind in (("bias", bias, bool), ("batch_first", batch_first, bool),
                              ("input_size", input_size, int)):
        if not isinstance(value, kind):
            raise TypeError(f"{name} should be of type {kind.__name__}, got: {type(value).__name__}")
    if input_size <= 0:
        raise ValueError("input_size must be greater than zero")
    if not isinstance(hidden_size, int):
        raise TypeError(f"hidden_size should be of type int, got: {type(hidden_size).__name__}")
    if hidden_size <= 0:
        raise ValueError("hidden_size must be greater than zero")
    if num_layers <= 0:
        raise ValueError("num_layers must be greater than zero")
    if proj_size < 0:
        raise ValueError("proj_size should be a positive integer or zero to disable projections")
    if proj_size >= hidden_size:
        raise ValueError("proj_size has to be smaller than hidden_size")


class RNN(RNNBase):
    """Elman RNN: ``h_t = tanh(x_t W_ih^T + b_ih + h_{t-1} W_hh^T + b_hh)`` (or ReLU), as torch.nn.RNN.

    >>> import tilewise as tw
    >>> output, h_n = tw.nn.RNN(4, 8, num_layers=2)(tw.randn(5, 3, 4))
    >>> output.shape, h_n.shape
    (tilewise.Size([5, 3, 8]), tilewise.Size([2, 3, 8]))
    """

    def __init__(self, *args, **kwargs) -> None:
        if "proj_size" in kwargs:
            raise ValueError("proj_size argument is only supported for LSTM, not RNN or GRU")
        if len(args) > 3:
            nonlinearity = args[3]
            args = args[:3] + args[4:]
        else:
            nonlinearity = kwargs.pop("nonlinearity", "tanh")
        if nonlinearity == "tanh":
            mode = "RNN_TANH"
        elif nonlinearity == "relu":
            mode = "RNN_RELU"
        else:
            raise ValueError(f"Unknown nonlinearity '{nonlinearity}'. Select from 'tanh' or 'relu'.")
        super().__init__(mode, *args, **kwargs)
        self.nonlinearity = nonlinearity

    def forward(self, input, hx: Tensor | None = None):
        output, h_n, _ = self._forward(input, hx)
        return output, h_n


class LSTM(RNNBase):
    """Long short-term memory, as torch.nn.LSTM (``proj_size`` > 0 projects each hidden state).

    >>> import tilewise as tw
    >>> output, (h_n, c_n) = tw.nn.LSTM(4, 8, batch_first=True)(tw.randn(3, 5, 4))
    >>> output.shape, h_n.shape, c_n.shape
    (tilewise.Size([3, 5, 8]), tilewise.Size([1, 3, 8]), tilewise.Size([1, 3, 8]))
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__("LSTM", *args, **kwargs)

    def get_expected_cell_size(self, input: Tensor, batch_sizes: Tensor | None) -> tuple[int, int, int]:
        layers, batch, _ = self.get_expected_hidden_size(input, batch_sizes)
        return layers, batch, self.hidden_size

    def check_forward_args(self, input: Tensor, hidden: tuple, batch_sizes: Tensor | None) -> None:
        self.check_input(input, batch_sizes)
        self.check_hidden_size(hidden[0], self.get_expected_hidden_size(input, batch_sizes),
                               "Expected hidden[0] size {}, got {}")
        self.check_hidden_size(hidden[1], self.get_expected_cell_size(input, batch_sizes),
                               "Expected hidden[1] size {}, got {}")

    def forward(self, input, hx: tuple[Tensor, Tensor] | None = None):
        output, h_n, c_n = self._forward(input, hx)
        return output, (h_n, c_n)


class GRU(RNNBase):
    """Gated recurrent unit, as torch.nn.GRU.

    >>> import tilewise as tw
    >>> output, h_n = tw.nn.GRU(4, 8, bidirectional=True)(tw.randn(5, 3, 4))
    >>> output.shape, h_n.shape
    (tilewise.Size([5, 3, 16]), tilewise.Size([2, 3, 8]))
    """

    def __init__(self, *args, **kwargs) -> None:
        if "proj_size" in kwargs:
            raise ValueError("proj_size argument is only supported for LSTM, not RNN or GRU")
        super().__init__("GRU", *args, **kwargs)

    def forward(self, input, hx: Tensor | None = None):
        output, h_n, _ = self._forward(input, hx)
        return output, h_n


# ---------------------------------------------------------------- cells


class RNNCellBase(Module):
    """The parameters of a single-step cell: ``weight_ih`` [chunks * hidden, input], ``weight_hh``
    [chunks * hidden, hidden] and, with ``bias``, ``bias_ih`` and ``bias_hh``."""

    def __init__(self, input_size: int, hidden_size: int, bias: bool, num_chunks: int, device=None,
                 dtype=None) -> None:
        super().__init__()
        self.input_size, self.hidden_size, self.bias = input_size, hidden_size, bias
        self.weight_ih = Parameter(empty(num_chunks * hidden_size, input_size, device=device, dtype=dtype))
        self.weight_hh = Parameter(empty(num_chunks * hidden_size, hidden_size, device=device, dtype=dtype))
        if bias:
            self.bias_ih = Parameter(empty(num_chunks * hidden_size, device=device, dtype=dtype))
            self.bias_hh = Parameter(empty(num_chunks * hidden_size, device=device, dtype=dtype))
        else:
            self.register_parameter("bias_ih", None)
            self.register_parameter("bias_hh", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        stdv = 1.0 / math.sqrt(self.hidden_size) if self.hidden_size > 0 else 0
        for weight in self.parameters():
            init.uniform_(weight, -stdv, stdv)

    def extra_repr(self) -> str:
        s = f"{self.input_size}, {self.hidden_size}"
        if self.bias is not True:
            s += f", bias={self.bias}"
        if getattr(self, "nonlinearity", "tanh") != "tanh":
            s += f", nonlinearity={self.nonlinearity}"
        return s

    def _batched(self, name: str, input: Tensor, states: tuple):
        """Check dims like torch; an unbatched (1-D) input and its states get a batch dimension of one."""
        if input.dim() not in (1, 2):
            raise ValueError(f"{name}: Expected input to be 1D or 2D, got {input.dim()}D instead")
        for label, state in states:
            if state is not None and state.dim() not in (1, 2):
                raise ValueError(f"{name}: Expected {label} to be 1D or 2D, got {state.dim()}D instead")
        is_batched = input.dim() == 2
        if is_batched:
            return input, [s for _, s in states], True
        return input.unsqueeze(0), [s.unsqueeze(0) if s is not None else None for _, s in states], False

    def _zeros(self, input: Tensor) -> Tensor:
        return zeros(input.size(0), self.hidden_size, dtype=input.dtype, device=input.device)

    def _check_cell(self, input: Tensor, *states: Tensor) -> None:
        if input.size(1) != self.input_size:
            raise RuntimeError(f"input has inconsistent input_size: got {input.size(1)} expected {self.input_size}")
        for k, state in enumerate(states):
            if state.size(0) != input.size(0):
                raise RuntimeError(f"Input batch size {input.size(0)} doesn't match hidden{k} batch size "
                                   f"{state.size(0)}")
            if state.size(1) != self.hidden_size:
                raise RuntimeError(f"hidden{k} has inconsistent hidden_size: got {state.size(1)}, expected "
                                   f"{self.hidden_size}")

    def _input_gates(self, input: Tensor, bias) -> Tensor:
        return F.linear(input, self.weight_ih, bias)


class RNNCell(RNNCellBase):
    """One step of an Elman RNN, as torch.nn.RNNCell.

    >>> import tilewise as tw
    >>> tw.nn.RNNCell(4, 8)(tw.randn(3, 4)).shape
    tilewise.Size([3, 8])
    """

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, nonlinearity: str = "tanh",
                 device=None, dtype=None) -> None:
        super().__init__(input_size, hidden_size, bias, num_chunks=1, device=device, dtype=dtype)
        self.nonlinearity = nonlinearity

    def forward(self, input: Tensor, hx: Tensor | None = None) -> Tensor:
        input, (hx,), is_batched = self._batched("RNNCell", input, (("hidden", hx),))
        hx = self._zeros(input) if hx is None else hx
        if self.nonlinearity not in ("tanh", "relu"):
            raise RuntimeError(f"Unknown nonlinearity: {self.nonlinearity}")
        self._check_cell(input, hx)
        input_gates = self._input_gates(input, _input_bias("RNN", self.bias_ih, self.bias_hh))
        out, _ = _rnn_step(self.nonlinearity)(input_gates, hx, None, _linear_projection(self.weight_hh, None), None)
        return out if is_batched else out.squeeze(0)


class LSTMCell(RNNCellBase):
    """One LSTM step, as torch.nn.LSTMCell: returns (h_1, c_1).

    >>> import tilewise as tw
    >>> h, c = tw.nn.LSTMCell(4, 8)(tw.randn(3, 4))
    >>> h.shape, c.shape
    (tilewise.Size([3, 8]), tilewise.Size([3, 8]))
    """

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, device=None, dtype=None) -> None:
        super().__init__(input_size, hidden_size, bias, num_chunks=4, device=device, dtype=dtype)

    def forward(self, input: Tensor, hx: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, Tensor]:
        states = (("hx[0]", None), ("hx[1]", None)) if hx is None else (("hx[0]", hx[0]), ("hx[1]", hx[1]))
        input, (h, c), is_batched = self._batched("LSTMCell", input, states)
        if h is None:
            h = c = self._zeros(input)
        self._check_cell(input, h, c)
        hy, cy = _lstm_step(self._input_gates(input, _input_bias("LSTM", self.bias_ih, self.bias_hh)), h, c,
                            _linear_projection(self.weight_hh, None), None)
        return (hy, cy) if is_batched else (hy.squeeze(0), cy.squeeze(0))


class GRUCell(RNNCellBase):
    """One GRU step, as torch.nn.GRUCell.

    >>> import tilewise as tw
    >>> tw.nn.GRUCell(4, 8)(tw.randn(3, 4)).shape
    tilewise.Size([3, 8])
    """

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, device=None, dtype=None) -> None:
        super().__init__(input_size, hidden_size, bias, num_chunks=3, device=device, dtype=dtype)

    def forward(self, input: Tensor, hx: Tensor | None = None) -> Tensor:
        input, (hx,), is_batched = self._batched("GRUCell", input, (("hidden", hx),))
        hx = self._zeros(input) if hx is None else hx
        self._check_cell(input, hx)
        hy, _ = _gru_step(self._input_gates(input, self.bias_ih), hx, None,
                          _linear_projection(self.weight_hh, self.bias_hh), None)
        return hy if is_batched else hy.squeeze(0)

"""Recurrent layers and sequence utilities against torch: RNN / LSTM / GRU and their cells given torch's weights
(outputs, final states, and gradients of input, initial states and every parameter), packed and padded sequences,
parameter names, shapes and initialisation, and torch's errors for malformed calls."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import tilewise as tw
from tilewise.nn.utils import rnn as tw_rnn

RTOL, ATOL = 1e-4, 1e-5


def _pair(make, seed=0, dtype=torch.float32):
    """The same layer in torch and tilewise, tilewise given torch's weights through its state dict."""
    torch.manual_seed(seed)
    ref = make(torch.nn).to(dtype)
    ours = make(tw.nn).to(getattr(tw, str(dtype).split(".")[-1]))
    missing, unexpected = ours.load_state_dict({k: v.detach() for k, v in ref.state_dict().items()})
    assert not missing and not unexpected
    return ours, ref


def _leaf(array, lib, requires_grad=True):
    if lib is torch:
        return torch.tensor(array, requires_grad=requires_grad)
    return tw.tensor(array, requires_grad=requires_grad)


def _close(ours, theirs, what="", rtol=RTOL, atol=ATOL):
    assert ours is not None and theirs is not None, f"{what}: a gradient is missing ({ours}, {theirs})"
    assert tuple(ours.shape) == tuple(theirs.shape), f"{what}: shape {tuple(ours.shape)} vs {tuple(theirs.shape)}"
    np.testing.assert_allclose(np.asarray(ours.detach().numpy(), dtype=np.float64),
                               theirs.detach().numpy().astype(np.float64), rtol=rtol, atol=atol, err_msg=what)


def _flat_outputs(out) -> list:
    """Every tensor of a layer's result, in order (a PackedSequence contributes its data)."""
    if isinstance(out, (tw_rnn.PackedSequence, torch.nn.utils.rnn.PackedSequence)):
        return [out.data]
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in _flat_outputs(o)]
    return [out]


def _loss(outputs, lib, seed=1):
    """A weighted sum of every output, so each output's gradient differs."""
    rng = np.random.default_rng(seed)
    total = 0
    for o in outputs:
        w = rng.uniform(-1, 1, size=tuple(o.shape)).astype(np.float32)
        total = total + (o * (torch.tensor(w) if lib is torch else tw.tensor(w))).sum()
    return total


def _check_layer(make, input_shape, states=None, rtol=RTOL, atol=ATOL, seed=0):
    """Forward and backward of ``make(nn)`` on a random input (and initial states of ``states`` shapes) against
    torch: outputs, gradients of the input and states, and every parameter's gradient."""
    ours, ref = _pair(make, seed)
    rng = np.random.default_rng(seed + 7)
    x = rng.uniform(-1, 1, size=input_shape).astype(np.float32)
    state_arrays = [rng.uniform(-1, 1, size=s).astype(np.float32) for s in (states or [])]
    results = {}
    for lib, model in ((tw, ours), (torch, ref)):
        xi = _leaf(x, lib)
        hs = [_leaf(a, lib) for a in state_arrays]
        hx = None if not hs else (tuple(hs) if len(hs) == 2 else hs[0])
        out = model(xi) if hx is None else model(xi, hx)
        flat = _flat_outputs(out)
        _loss(flat, lib).backward()
        results[lib] = (flat, xi.grad, [h.grad for h in hs], dict(model.named_parameters()))
    (o_tw, gx_tw, gh_tw, p_tw), (o_t, gx_t, gh_t, p_t) = results[tw], results[torch]
    assert len(o_tw) == len(o_t)
    for k, (a, b) in enumerate(zip(o_tw, o_t)):
        _close(a, b, f"output {k}", rtol, atol)
    _close(gx_tw, gx_t, "input gradient", rtol, atol)
    for k, (a, b) in enumerate(zip(gh_tw, gh_t)):
        _close(a, b, f"state {k} gradient", rtol, atol)
    assert p_tw.keys() == p_t.keys()
    for name in p_t:
        _close(p_tw[name].grad, p_t[name].grad, f"gradient of {name}", rtol, atol)


# ---------------------------------------------------------------- full layers, every constructor variant

LAYER_CASES = {
    "rnn-tanh": (lambda nn: nn.RNN(4, 6), (5, 3, 4), [(1, 3, 6)]),
    "rnn-relu-2layer": (lambda nn: nn.RNN(4, 6, 2, nonlinearity="relu"), (5, 3, 4), [(2, 3, 6)]),
    "rnn-positional-nonlinearity": (lambda nn: nn.RNN(4, 6, 1, "relu"), (5, 3, 4), None),
    "rnn-nobias-bidir-batch-first": (lambda nn: nn.RNN(4, 6, bias=False, batch_first=True, bidirectional=True),
                                     (3, 5, 4), [(2, 3, 6)]),
    "lstm": (lambda nn: nn.LSTM(4, 6), (5, 3, 4), [(1, 3, 6), (1, 3, 6)]),
    "lstm-no-state": (lambda nn: nn.LSTM(4, 6), (5, 3, 4), None),
    "lstm-2layer-bidir": (lambda nn: nn.LSTM(4, 6, num_layers=2, bidirectional=True), (5, 3, 4),
                          [(4, 3, 6), (4, 3, 6)]),
    "lstm-nobias-batch-first": (lambda nn: nn.LSTM(4, 6, bias=False, batch_first=True), (3, 5, 4),
                                [(1, 3, 6), (1, 3, 6)]),
    "lstm-proj": (lambda nn: nn.LSTM(4, 6, proj_size=3), (5, 3, 4), [(1, 3, 3), (1, 3, 6)]),
    "lstm-proj-2layer-bidir": (lambda nn: nn.LSTM(4, 6, 2, bidirectional=True, proj_size=2), (5, 3, 4),
                               [(4, 3, 2), (4, 3, 6)]),
    "lstm-proj-nobias": (lambda nn: nn.LSTM(4, 6, 2, bias=False, proj_size=3), (5, 3, 4), None),
    "lstm-dropout-0": (lambda nn: nn.LSTM(4, 6, 3, dropout=0.0), (4, 2, 4), None),
    "gru": (lambda nn: nn.GRU(4, 6), (5, 3, 4), [(1, 3, 6)]),
    "gru-2layer-bidir-batch-first": (lambda nn: nn.GRU(4, 6, 2, batch_first=True, bidirectional=True), (3, 5, 4),
                                     [(4, 3, 6)]),
    "gru-nobias": (lambda nn: nn.GRU(4, 6, bias=False), (5, 3, 4), None),
    "rnn-unbatched": (lambda nn: nn.RNN(4, 6, 2), (5, 4), [(2, 6)]),
    "lstm-unbatched-batch-first": (lambda nn: nn.LSTM(4, 6, batch_first=True, bidirectional=True), (5, 4),
                                   [(2, 6), (2, 6)]),
    "lstm-unbatched-proj": (lambda nn: nn.LSTM(4, 6, proj_size=2), (5, 4), [(1, 2), (1, 6)]),
    "gru-unbatched": (lambda nn: nn.GRU(4, 6), (5, 4), None),
    "lstm-one-step": (lambda nn: nn.LSTM(4, 6, 2), (1, 2, 4), None),
}


@pytest.mark.parametrize("case", LAYER_CASES)
def test_layer_matches_torch(case):
    make, shape, states = LAYER_CASES[case]
    _check_layer(make, shape, states)


def test_eval_mode_skips_dropout_and_training_mode_drops():
    ours, ref = _pair(lambda nn: nn.LSTM(4, 6, 3, dropout=0.5))
    x = np.random.default_rng(0).uniform(-1, 1, size=(5, 3, 4)).astype(np.float32)
    ours.eval()
    ref.eval()
    _close(ours(tw.tensor(x))[0], ref(torch.tensor(x))[0], "eval output")
    ours.train()
    tw.manual_seed(0)
    first = ours(tw.tensor(x))[0]
    tw.manual_seed(1)
    second = ours(tw.tensor(x))[0]
    assert not np.allclose(first.detach().numpy(), second.detach().numpy()), "dropout in training changed nothing"


def test_dropout_on_one_layer_warns_like_torch():
    with pytest.warns(UserWarning, match="non-zero dropout expects num_layers greater than 1"):
        tw.nn.LSTM(3, 4, dropout=0.5)


# ---------------------------------------------------------------- packed sequences through layers

PACKED_CASES = {
    "lstm-sorted": (lambda nn: nn.LSTM(3, 5), [4, 3, 1], True),
    "lstm-unsorted-bidir-2layer": (lambda nn: nn.LSTM(3, 5, 2, bidirectional=True), [2, 4, 1, 4], False),
    "lstm-proj-unsorted": (lambda nn: nn.LSTM(3, 5, proj_size=2, bidirectional=True), [3, 1, 4], False),
    "gru-unsorted-bidir": (lambda nn: nn.GRU(3, 5, bidirectional=True), [1, 3, 4], False),
    "rnn-relu-sorted-2layer": (lambda nn: nn.RNN(3, 5, 2, nonlinearity="relu"), [4, 4, 2], True),
}


@pytest.mark.parametrize("case", PACKED_CASES)
@pytest.mark.parametrize("with_state", [False, True], ids=["no-state", "state"])
def test_packed_sequence_through_layer_matches_torch(case, with_state):
    make, lengths, enforce_sorted = PACKED_CASES[case]
    ours, ref = _pair(make)
    rng = np.random.default_rng(3)
    x = rng.uniform(-1, 1, size=(max(lengths), len(lengths), 3)).astype(np.float32)
    layers = ref.num_layers * (2 if ref.bidirectional else 1)
    state_shapes = [(layers, len(lengths), ref.proj_size or ref.hidden_size)]
    if isinstance(ref, torch.nn.LSTM):
        state_shapes.append((layers, len(lengths), ref.hidden_size))
    states = [rng.uniform(-1, 1, size=s).astype(np.float32) for s in state_shapes] if with_state else []
    results = {}
    for lib, model, utils in ((tw, ours, tw_rnn), (torch, ref, torch.nn.utils.rnn)):
        xi = _leaf(x, lib)
        hs = [_leaf(a, lib) for a in states]
        packed = utils.pack_padded_sequence(xi, lengths, enforce_sorted=enforce_sorted)
        hx = None if not hs else (tuple(hs) if len(hs) == 2 else hs[0])
        out, hidden = model(packed, hx)
        padded, out_lengths = utils.pad_packed_sequence(out)
        flat = [padded, *_flat_outputs(hidden)]
        _loss(flat, lib).backward()
        results[lib] = (flat, out_lengths, xi.grad, [h.grad for h in hs], dict(model.named_parameters()), out)
    ours_r, ref_r = results[tw], results[torch]
    for k, (a, b) in enumerate(zip(ours_r[0], ref_r[0])):
        _close(a, b, f"output {k}")
    assert ours_r[1].tolist() == ref_r[1].tolist()
    _close(ours_r[2], ref_r[2], "input gradient")
    for k, (a, b) in enumerate(zip(ours_r[3], ref_r[3])):
        _close(a, b, f"state {k} gradient")
    for name, p in ref_r[4].items():
        _close(ours_r[4][name].grad, p.grad, f"gradient of {name}")
    assert isinstance(ours_r[5], tw_rnn.PackedSequence)
    assert ours_r[5].batch_sizes.tolist() == ref_r[5].batch_sizes.tolist()


# ---------------------------------------------------------------- cells

CELL_CASES = {
    "rnn-cell": (lambda nn: nn.RNNCell(4, 6), (3, 4), [(3, 6)]),
    "rnn-cell-relu-nobias": (lambda nn: nn.RNNCell(4, 6, bias=False, nonlinearity="relu"), (3, 4), [(3, 6)]),
    "rnn-cell-no-state": (lambda nn: nn.RNNCell(4, 6), (3, 4), None),
    "rnn-cell-unbatched": (lambda nn: nn.RNNCell(4, 6), (4,), [(6,)]),
    "lstm-cell": (lambda nn: nn.LSTMCell(4, 6), (3, 4), [(3, 6), (3, 6)]),
    "lstm-cell-nobias-no-state": (lambda nn: nn.LSTMCell(4, 6, bias=False), (3, 4), None),
    "lstm-cell-unbatched": (lambda nn: nn.LSTMCell(4, 6), (4,), [(6,), (6,)]),
    "gru-cell": (lambda nn: nn.GRUCell(4, 6), (3, 4), [(3, 6)]),
    "gru-cell-nobias": (lambda nn: nn.GRUCell(4, 6, bias=False), (3, 4), [(3, 6)]),
    "gru-cell-unbatched-no-state": (lambda nn: nn.GRUCell(4, 6), (4,), None),
}


@pytest.mark.parametrize("case", CELL_CASES)
def test_cell_matches_torch(case):
    make, shape, states = CELL_CASES[case]
    _check_layer(make, shape, states)


def test_float64_layer_matches_torch():
    ours, ref = _pair(lambda nn: nn.GRU(3, 4, 2, bidirectional=True), dtype=torch.float64)
    x = np.random.default_rng(0).uniform(-1, 1, size=(4, 2, 3))
    out, h = ours(tw.tensor(x))
    out_t, h_t = ref(torch.tensor(x))
    assert out.dtype == tw.float64 and h.dtype == tw.float64
    _close(out, out_t, "output", rtol=1e-10, atol=1e-12)
    _close(h, h_t, "h_n", rtol=1e-10, atol=1e-12)


# ---------------------------------------------------------------- parameters, state dicts, initialisation


@pytest.mark.parametrize("make", [
    lambda nn: nn.LSTM(3, 5, 2, bidirectional=True, proj_size=2),
    lambda nn: nn.LSTM(3, 5, 2, bias=False, proj_size=2),
    lambda nn: nn.GRU(3, 5, 3, bias=False, batch_first=True),
    lambda nn: nn.RNN(3, 5, 2, "relu", bidirectional=True),
    lambda nn: nn.LSTMCell(3, 5),
    lambda nn: nn.GRUCell(3, 5, bias=False),
    lambda nn: nn.RNNCell(3, 5, nonlinearity="relu"),
], ids=["lstm-proj-bidir", "lstm-proj-nobias", "gru-nobias", "rnn-relu-bidir", "lstm-cell", "gru-cell", "rnn-cell"])
def test_parameter_names_shapes_repr_and_state_dict_match_torch(make):
    ours, ref = make(tw.nn), make(torch.nn)
    assert [(k, tuple(v.shape)) for k, v in ours.state_dict().items()] == \
        [(k, tuple(v.shape)) for k, v in ref.state_dict().items()]
    assert repr(ours) == repr(ref)
    if isinstance(ref, torch.nn.RNNBase):
        assert [[tuple(w.shape) for w in ws] for ws in ours.all_weights] == \
            [[tuple(w.shape) for w in ws] for ws in ref.all_weights]
        assert ours._flat_weights_names == ref._flat_weights_names
        ours.flatten_parameters()
        for attr in ("mode", "input_size", "hidden_size", "num_layers", "bias", "batch_first", "dropout",
                     "bidirectional", "proj_size"):
            assert getattr(ours, attr) == getattr(ref, attr), attr


def test_initialisation_is_uniform_in_inverse_sqrt_hidden():
    tw.manual_seed(0)
    model = tw.nn.LSTM(16, 64, 2)
    bound = 1 / math.sqrt(64)
    values = np.concatenate([p.detach().numpy().ravel() for p in model.parameters()])
    assert values.min() >= -bound and values.max() <= bound
    assert values.min() < -0.95 * bound and values.max() > 0.95 * bound  # reaches both ends
    assert abs(values.mean()) < 0.05 * bound and abs(values.std() - bound / math.sqrt(3)) < 0.02 * bound


def test_assigning_a_parameter_is_used_by_forward():
    ours, ref = _pair(lambda nn: nn.GRU(3, 4))
    new = np.random.default_rng(0).uniform(-1, 1, size=(12, 4)).astype(np.float32)
    ours.weight_hh_l0 = tw.nn.Parameter(tw.tensor(new))
    ref.weight_hh_l0 = torch.nn.Parameter(torch.tensor(new))
    x = np.random.default_rng(1).uniform(-1, 1, size=(3, 2, 3)).astype(np.float32)
    _close(ours(tw.tensor(x))[0], ref(torch.tensor(x))[0], "output after assignment")


# ---------------------------------------------------------------- errors


def _same_error(make, call):
    """Calling both libraries raises the same exception type with the same message."""
    errors = []
    for lib in (tw, torch):
        with pytest.raises(Exception) as info:
            call(lib, make(lib.nn))
        errors.append(info.value)
    assert type(errors[0]) is type(errors[1]), (errors[0], errors[1])
    assert str(errors[0]) == str(errors[1]).replace("torch.", "tilewise.")


def _t(lib, *shape, dtype=None):
    return lib.zeros(*shape) if dtype is None else lib.zeros(*shape, dtype=dtype)


ERROR_CASES = {
    "input-1d": (lambda nn: nn.LSTM(3, 4), lambda lib, m: m(_t(lib, 3))),
    "rnn-input-4d": (lambda nn: nn.RNN(3, 4), lambda lib, m: m(_t(lib, 2, 2, 2, 3))),
    "gru-input-4d": (lambda nn: nn.GRU(3, 4), lambda lib, m: m(_t(lib, 2, 2, 2, 3))),
    "input-size": (lambda nn: nn.GRU(3, 4), lambda lib, m: m(_t(lib, 5, 2, 6))),
    "hidden-size": (lambda nn: nn.GRU(3, 4), lambda lib, m: m(_t(lib, 5, 2, 3), _t(lib, 1, 3, 4))),
    "hidden-dims-batched": (lambda nn: nn.RNN(3, 4), lambda lib, m: m(_t(lib, 5, 2, 3), _t(lib, 2, 4))),
    "hidden-dims-unbatched": (lambda nn: nn.RNN(3, 4), lambda lib, m: m(_t(lib, 5, 3), _t(lib, 1, 1, 4))),
    "lstm-hidden0": (lambda nn: nn.LSTM(3, 4, proj_size=2),
                     lambda lib, m: m(_t(lib, 5, 2, 3), (_t(lib, 1, 2, 4), _t(lib, 1, 2, 4)))),
    "lstm-hidden1": (lambda nn: nn.LSTM(3, 4), lambda lib, m: m(_t(lib, 5, 2, 3), (_t(lib, 1, 2, 4),
                                                                                    _t(lib, 2, 2, 4)))),
    "lstm-hx-dims": (lambda nn: nn.LSTM(3, 4), lambda lib, m: m(_t(lib, 5, 2, 3), (_t(lib, 2, 4), _t(lib, 2, 4)))),
    "lstm-hx-dims-unbatched": (lambda nn: nn.LSTM(3, 4), lambda lib, m: m(_t(lib, 5, 3), (_t(lib, 1, 1, 4),
                                                                                          _t(lib, 1, 4)))),
    "dtype": (lambda nn: nn.LSTM(3, 4), lambda lib, m: m(_t(lib, 5, 2, 3, dtype=lib.float64))),
    "empty-sequence": (lambda nn: nn.GRU(3, 4, batch_first=True), lambda lib, m: m(_t(lib, 2, 0, 3))),
    "cell-input-3d": (lambda nn: nn.LSTMCell(3, 4), lambda lib, m: m(_t(lib, 1, 2, 3))),
    "cell-hx-3d": (lambda nn: nn.GRUCell(3, 4), lambda lib, m: m(_t(lib, 2, 3), _t(lib, 1, 2, 4))),
    "lstm-cell-hx-3d": (lambda nn: nn.LSTMCell(3, 4), lambda lib, m: m(_t(lib, 2, 3), (_t(lib, 2, 4),
                                                                                       _t(lib, 1, 2, 4)))),
    "rnn-cell-input-3d": (lambda nn: nn.RNNCell(3, 4), lambda lib, m: m(_t(lib, 1, 2, 3))),
    "cell-nonlinearity": (lambda nn: nn.RNNCell(3, 4, nonlinearity="gelu"), lambda lib, m: m(_t(lib, 2, 3))),
}


@pytest.mark.parametrize("case", ERROR_CASES)
def test_errors_match_torch(case):
    make, call = ERROR_CASES[case]
    _same_error(make, call)


@pytest.mark.parametrize("call", [
    lambda nn: nn.LSTM(3, 4, dropout=1.5), lambda nn: nn.LSTM(3, 4, dropout=True), lambda nn: nn.GRU(3, 4, bias=1),
    lambda nn: nn.GRU(3, 4, batch_first=None), lambda nn: nn.RNN(3.0, 4), lambda nn: nn.RNN(0, 4),
    lambda nn: nn.RNN(3, 4.0), lambda nn: nn.RNN(3, 0), lambda nn: nn.LSTM(3, 4, 0),
    lambda nn: nn.LSTM(3, 4, 1, proj_size=-1),
    lambda nn: nn.LSTM(3, 4, proj_size=4), lambda nn: nn.GRU(3, 4, proj_size=2), lambda nn: nn.RNN(3, 4, proj_size=2),
    lambda nn: nn.RNN(3, 4, nonlinearity="gelu"), lambda nn: nn.RNNBase("XYZ", 3, 4),
], ids=["dropout-range", "dropout-bool", "bias-int", "batch-first-none", "input-size-float", "input-size-0",
        "hidden-float", "hidden-0", "layers-0", "proj-negative", "proj-too-big", "gru-proj", "rnn-proj",
        "nonlinearity", "mode"])
def test_constructor_errors_match_torch(call):
    errors = []
    for lib in (tw, torch):
        with pytest.raises(Exception) as info:
            call(lib.nn)
        errors.append(info.value)
    assert type(errors[0]) is type(errors[1]) and str(errors[0]) == str(errors[1]), errors


@pytest.mark.parametrize("case", [
    ("input-size", lambda lib, m: m(_t(lib, 2, 5))),
    ("hidden-batch", lambda lib, m: m(_t(lib, 2, 3), _t(lib, 3, 4))),
    ("hidden-size", lambda lib, m: m(_t(lib, 2, 3), _t(lib, 2, 5))),
], ids=lambda c: c[0])
def test_cell_size_errors_are_runtime_errors_naming_the_sizes(case):
    _, call = case
    for lib in (tw, torch):
        with pytest.raises(RuntimeError):
            call(lib, lib.nn.GRUCell(3, 4))
    with pytest.raises(RuntimeError) as ours:
        call(tw, tw.nn.GRUCell(3, 4))
    with pytest.raises(RuntimeError) as theirs:
        call(torch, torch.nn.GRUCell(3, 4))
    assert str(ours.value) == str(theirs.value)


# ---------------------------------------------------------------- nn.utils.rnn

def _sequences(lengths, trailing=(3,), seed=0, dtype=np.float32):
    rng = np.random.default_rng(seed)
    return [rng.uniform(-1, 1, size=(n, *trailing)).astype(dtype) for n in lengths]


@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("padding_side", ["right", "left"])
@pytest.mark.parametrize("trailing", [(3,), (), (2, 2)], ids=["1d", "0d", "2d"])
def test_pad_sequence_matches_torch_with_gradients(batch_first, padding_side, trailing):
    arrays = _sequences([2, 4, 1], trailing)
    outs, grads = [], []
    for lib, utils in ((tw, tw_rnn), (torch, torch.nn.utils.rnn)):
        seqs = [_leaf(a, lib) for a in arrays]
        out = utils.pad_sequence(seqs, batch_first=batch_first, padding_value=-2.5, padding_side=padding_side)
        _loss([out], lib).backward()
        outs.append(out)
        grads.append([s.grad for s in seqs])
    _close(outs[0], outs[1], "padded")
    for a, b in zip(*grads):
        _close(a, b, "gradient")


def test_pad_sequence_dtype_of_first_and_tensor_input():
    a, b = np.arange(3), np.ones((2,), dtype=np.float32) * 0.5
    for first, second in ((a, b), (b, a)):
        ours = tw_rnn.pad_sequence([tw.tensor(first), tw.tensor(second)], padding_value=0.5)
        theirs = torch.nn.utils.rnn.pad_sequence([torch.tensor(first), torch.tensor(second)], padding_value=0.5)
        assert str(ours.dtype).split(".")[-1] == str(theirs.dtype).split(".")[-1]
        assert ours.tolist() == theirs.tolist()
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    assert tw_rnn.pad_sequence(tw.tensor(x)).tolist() == torch.nn.utils.rnn.pad_sequence(torch.tensor(x)).tolist()


@pytest.mark.parametrize("call", [
    lambda lib, u: u.pad_sequence([]),
    lambda lib, u: u.pad_sequence(5),
    lambda lib, u: u.pad_sequence([lib.ones(2)], padding_side="up"),
    lambda lib, u: u.pack_padded_sequence(lib.zeros(4, 3, 2), [4, 2, 3]),
    lambda lib, u: u.pack_padded_sequence(lib.zeros(4, 3, 2), [4, 2, 0], enforce_sorted=False),
    lambda lib, u: u.pack_padded_sequence(lib.zeros(4, 3, 2), [4, 2]),
    lambda lib, u: u.pad_packed_sequence(u.pack_padded_sequence(lib.zeros(4, 3, 2), [4, 2, 1]), total_length=3),
    lambda lib, u: u.PackedSequence(lib.ones(3)),
], ids=["empty", "not-iterable", "padding-side", "unsorted", "zero-length", "lengths-count", "total-length",
        "packed-without-sizes"])
def test_sequence_utility_errors_match_torch(call):
    errors = []
    for lib, utils in ((tw, tw_rnn), (torch, torch.nn.utils.rnn)):
        with pytest.raises(Exception) as info:
            call(lib, utils)
        errors.append(info.value)
    assert type(errors[0]) is type(errors[1]), errors
    assert str(errors[0]) == str(errors[1]).replace("torch.", "tilewise.")


def test_lengths_longer_than_the_input_are_an_error():
    with pytest.raises(RuntimeError, match="longest length is 5"):
        tw_rnn.pack_padded_sequence(tw.zeros(4, 3, 2), [5, 2, 1])


@pytest.mark.parametrize("enforce_sorted", [True, False])
@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("lengths_as", ["list", "tensor"])
def test_pack_and_pad_packed_round_trip_match_torch(enforce_sorted, batch_first, lengths_as):
    lengths = [5, 3, 3, 1] if enforce_sorted else [3, 5, 1, 3]
    x = np.random.default_rng(0).uniform(-1, 1, size=(4, 5, 2) if batch_first else (5, 4, 2)).astype(np.float32)
    results = []
    for lib, utils in ((tw, tw_rnn), (torch, torch.nn.utils.rnn)):
        xi = _leaf(x, lib)
        lens = lengths if lengths_as == "list" else lib.tensor(lengths)
        packed = utils.pack_padded_sequence(xi, lens, batch_first=batch_first, enforce_sorted=enforce_sorted)
        padded, out_lengths = utils.pad_packed_sequence(packed, batch_first=batch_first, padding_value=9.0,
                                                        total_length=7)
        _loss([packed.data, padded], lib).backward()
        results.append((packed, padded, out_lengths, xi.grad))
    (p_tw, pad_tw, len_tw, g_tw), (p_t, pad_t, len_t, g_t) = results
    _close(p_tw.data, p_t.data, "packed data")
    assert p_tw.batch_sizes.tolist() == p_t.batch_sizes.tolist() and p_tw.batch_sizes.dtype == tw.int64
    for ours, theirs in ((p_tw.sorted_indices, p_t.sorted_indices), (p_tw.unsorted_indices, p_t.unsorted_indices)):
        assert (ours is None) == (theirs is None) and (ours is None or ours.tolist() == theirs.tolist())
    _close(pad_tw, pad_t, "padded")
    assert len_tw.tolist() == len_t.tolist() and len_tw.dtype == tw.int64 and len_tw.device.type == "cpu"
    _close(g_tw, g_t, "input gradient")


@pytest.mark.parametrize("enforce_sorted", [True, False])
def test_pack_sequence_unpack_and_unpad_match_torch(enforce_sorted):
    arrays = _sequences([4, 2, 2, 1] if enforce_sorted else [2, 4, 1, 2])
    results = []
    for lib, utils in ((tw, tw_rnn), (torch, torch.nn.utils.rnn)):
        seqs = [_leaf(a, lib) for a in arrays]
        packed = utils.pack_sequence(seqs, enforce_sorted=enforce_sorted)
        unpacked = utils.unpack_sequence(packed)
        padded = utils.pad_sequence(seqs, batch_first=True)
        unpadded = utils.unpad_sequence(padded, lib.tensor([len(a) for a in arrays]), batch_first=True)
        _loss([packed.data, *unpacked, *unpadded], lib).backward()
        results.append((packed, unpacked, unpadded, [s.grad for s in seqs]))
    (p_tw, u_tw, d_tw, g_tw), (p_t, u_t, d_t, g_t) = results
    _close(p_tw.data, p_t.data, "packed")
    assert p_tw.batch_sizes.tolist() == p_t.batch_sizes.tolist()
    for a, b in zip(u_tw + d_tw + g_tw, u_t + d_t + g_t):
        _close(a, b)
    for a, b in zip(u_tw + d_tw, u_t + d_t):  # torch picks each by a mask: a new contiguous tensor
        assert a.stride() == b.stride()


def test_unpad_sequence_time_major():
    x = np.random.default_rng(0).uniform(size=(4, 3, 2)).astype(np.float32)
    ours = tw_rnn.unpad_sequence(tw.tensor(x), tw.tensor([4, 2, 1]))
    theirs = torch.nn.utils.rnn.unpad_sequence(torch.tensor(x), torch.tensor([4, 2, 1]))
    for a, b in zip(ours, theirs):
        _close(a, b)
        assert a.stride() == b.stride()


def test_packed_sequence_is_a_named_tuple_with_to_and_invert_permutation():
    packed = tw_rnn.PackedSequence(tw.ones(3), tw.tensor([2, 1]), tw.tensor([1, 0]))
    assert packed.unsorted_indices.tolist() == [1, 0]
    data, batch_sizes, sorted_indices, unsorted_indices = packed
    assert packed._fields == ("data", "batch_sizes", "sorted_indices", "unsorted_indices")
    assert packed.to(tw.float32) is packed
    doubled = packed.to(tw.float64)
    assert isinstance(doubled, tw_rnn.PackedSequence) and doubled.data.dtype == tw.float64
    assert doubled.batch_sizes is packed.batch_sizes and doubled.sorted_indices.tolist() == [1, 0]
    assert packed.double().data.dtype == tw.float64 and packed.long().data.dtype == tw.int64
    assert not packed.is_cuda
    from_pair = tw_rnn.PackedSequence((tw.ones(3), tw.tensor([2, 1])))
    assert from_pair.sorted_indices is None and from_pair.unsorted_indices is None
    perm = [3, 0, 2, 1]
    assert tw_rnn.invert_permutation(tw.tensor(perm)).tolist() == \
        torch.nn.utils.rnn.invert_permutation(torch.tensor(perm)).tolist()
    assert tw_rnn.invert_permutation(None) is None


# ---------------------------------------------------------------- the cells as fused programs (CUDA's mechanism)

def test_cells_run_as_one_program_per_shape_on_every_time_step():
    """On CUDA a cell and its backward each run as one compiled program (compiler/composites.py); here the same
    mechanism with the C target. The projected inputs of every time step are slices at different offsets of one
    tensor: they share one program rather than compiling one per step."""
    from tilewise.compiler import composites as fused
    from tilewise.dispatch import STATE
    from tilewise.ops.registry import OPS

    steps, batch, hidden = 5, 4, 8
    projection = tw.randn(steps * batch, 4 * hidden)
    hidden_gates, c = tw.randn(batch, 4 * hidden), tw.randn(batch, hidden)
    cell, backward = OPS["_lstm_cell"], OPS["_lstm_cell_backward"]
    for t in range(steps):
        gates = projection[t * batch:(t + 1) * batch]
        args = (gates, hidden_gates, c)
        for got, want in zip(fused.run_fused(cell, args), cell.decomposition(*args)):
            _close(got, want, atol=1e-6)
        args = (tw.randn(batch, hidden), tw.randn(batch, hidden), gates, hidden_gates, c)
        _close(fused.run_fused(backward, args), backward.decomposition(*args), atol=1e-6)
    for op in (cell, backward):
        programs = [f for (_, o, _), f in fused._programs.items() if o is op and f is not None]
        assert len(programs) == 1, f"{op.name}: {len(programs)} programs for {steps} steps of one shape"
        steps = [s for p in programs[0].programs() for s in p.steps]
        assert len(steps) == 1, f"{op.name}: one kernel and nothing else, got {[s.describe() for s in steps]}"
    gru, gru_backward = OPS["_gru_cell"], OPS["_gru_cell_backward"]
    gates = tw.randn(batch, 3 * hidden)
    h = tw.randn(batch, hidden)
    _close(fused.run_fused(gru, (gates, gates * 2, h)), gru.decomposition(gates, gates * 2, h), atol=1e-6)
    args = (tw.randn(batch, hidden), gates, gates * 2, h)
    _close(fused.run_fused(gru_backward, args), gru_backward.decomposition(*args), atol=1e-6)
    key = (STATE.grad_enabled, *fused._key(gru_backward, args))
    assert [s.describe().split("(")[0] for p in fused._programs[key].programs() for s in p.steps] == \
        ["kernel " + fused._programs[key].programs()[0].steps[0].kernel.name]
    # slices that do not start on a 16-byte boundary (9 floats a step): one program per distinct misalignment
    projection, h = tw.randn(12, 9), tw.randn(1, 3)
    before = sum(1 for (_, o, _) in fused._programs if o is gru)
    for t in range(12):
        gates = projection[t:t + 1]
        _close(fused.run_fused(gru, (gates, gates, h)), gru.decomposition(gates, gates, h), atol=1e-6)
    assert sum(1 for (_, o, _) in fused._programs if o is gru) - before <= 4


@pytest.fixture
def cells_fused_on_cpu(monkeypatch):
    """The CPU backend running the recurrent cells as CUDA does: through fused.run_fused (with the C target)."""
    from tilewise.backends import cpu
    from tilewise.compiler import composites as fused

    calls = []

    def run(op, args, device):
        if op.name.startswith(("_lstm_cell", "_gru_cell")):
            out = fused.run_fused(op, args)
            if out is not None:
                calls.append(op.name)
                return out
        return cpu.run(op, args, device)

    monkeypatch.setattr(cpu.backend, "run", run)
    return calls


@pytest.mark.parametrize("case", ["lstm-2layer-bidir", "lstm-proj", "gru-2layer-bidir-batch-first"])
def test_layers_with_fused_cells_match_torch(case, cells_fused_on_cpu):
    make, shape, states = LAYER_CASES[case]
    _check_layer(make, shape, states)
    assert cells_fused_on_cpu, "no cell ran fused"


def test_packed_layer_with_fused_cells_matches_torch(cells_fused_on_cpu):
    test_packed_sequence_through_layer_matches_torch("lstm-unsorted-bidir-2layer", True)
    test_packed_sequence_through_layer_matches_torch("gru-unsorted-bidir", True)
    assert {"_lstm_cell", "_lstm_cell_backward", "_gru_cell", "_gru_cell_backward"} <= set(cells_fused_on_cpu)


# ---------------------------------------------------------------- CUDA

def _cuda_against_cpu(make, shape, autocast=False):
    tw.manual_seed(0)
    cpu_model = make(tw.nn)
    gpu_model = make(tw.nn)
    gpu_model.load_state_dict(cpu_model.state_dict())
    gpu_model.to("cuda")
    x = np.random.default_rng(0).uniform(-1, 1, size=shape).astype(np.float32)
    results = []
    for model, device in ((cpu_model, "cpu"), (gpu_model, "cuda")):
        xi = tw.tensor(x, device=device, requires_grad=True)
        if autocast and device == "cuda":
            with tw.autocast(device_type="cuda", dtype=tw.bfloat16):
                out = model(xi)
        else:
            out = model(xi)
        flat = _flat_outputs(out)
        sum((o.float() * (k + 1)).sin().sum() for k, o in enumerate(flat)).backward()
        results.append((flat, xi.grad, {k: p.grad for k, p in model.named_parameters()}))
    return results


@pytest.mark.cuda
@pytest.mark.parametrize("make", [lambda nn: nn.LSTM(16, 32, 2, bidirectional=True, proj_size=8),
                                  lambda nn: nn.GRU(16, 32, 2, batch_first=True),
                                  lambda nn: nn.RNN(16, 32, nonlinearity="relu")], ids=["lstm", "gru", "rnn"])
def test_layers_on_cuda_match_the_cpu(make):
    (out_c, gx_c, gp_c), (out_g, gx_g, gp_g) = _cuda_against_cpu(make, (7, 5, 16))
    for a, b in zip(out_g, out_c):
        _close(a.cpu(), b, atol=1e-4)
    _close(gx_g.cpu(), gx_c, atol=1e-4)
    for name in gp_c:
        _close(gp_g[name].cpu(), gp_c[name], "gradient of " + name, atol=1e-4)


@pytest.mark.cuda
def test_lstm_on_cuda_fuses_each_step_and_compiles_one_cell_program():
    from tilewise.compiler import composites as fused

    before = {k for k, f in fused._programs.items() if k[1].name.startswith("_lstm_cell")}
    # with a projection the layer runs step by step (without one, its loop is _lstm_layer's CUDA kernel)
    _cuda_against_cpu(lambda nn: nn.LSTM(16, 32, 1, proj_size=8), (40, 4, 16))
    new = {k: f for k, f in fused._programs.items() if k[1].name.startswith("_lstm_cell") and k not in before}
    assert new and all(f is not None for f in new.values()), "the compiler gave up on a cell"
    # one per 16-byte alignment of a step's slice (4 for float32) and the whole-tensor first step, not one per step
    assert len(new) <= 6, f"{len(new)} cell programs for 40 steps of one shape: one per step offset?"


@pytest.mark.cuda
def test_lstm_under_bfloat16_autocast_runs_in_bfloat16_like_torch_on_cuda():
    (out_c, _, _), (out_g, gx_g, gp_g) = _cuda_against_cpu(lambda nn: nn.LSTM(16, 32, 2), (6, 3, 16), autocast=True)
    assert all(o.dtype == tw.bfloat16 for o in out_g)
    for a, b in zip(out_g, out_c):
        _close(a.float().cpu(), b, rtol=5e-2, atol=5e-2)
    assert gx_g.dtype == tw.float32 and all(g.dtype == tw.float32 for g in gp_g.values())


# ---------------------------------------------------------------- compiled training steps

def _training_step(model, opt):
    def step(x):
        out, _ = model(x)
        loss = (out * out).sum()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    return step


@pytest.mark.parametrize("make", [lambda nn: nn.LSTM(4, 5, 2, bidirectional=True), lambda nn: nn.GRU(4, 5),
                                  lambda nn: nn.RNN(4, 5, batch_first=True)], ids=["lstm", "gru", "rnn"])
def test_compiled_training_step_matches_eager_and_compiles_once(make):
    """The whole step (forward, backward, SGD) in one tilewise.compile: the same losses and weights as eager, and
    one program however many steps (LSTM and RNN give W_hh its gradient from a Function the loop feeds: the
    trace must learn that W_hh.grad was None before the step although no forward operator reads W_hh)."""
    x = tw.tensor(np.random.default_rng(0).uniform(-1, 1, size=(3, 2, 4)).astype(np.float32))
    losses, weights, compiled = [], [], None
    for compile_it in (False, True):
        tw.manual_seed(0)
        model = make(tw.nn)
        step = _training_step(model, tw.optim.SGD(model.parameters(), lr=0.1))
        run = tw.compile(step) if compile_it else step
        losses.append([float(run(x)) for _ in range(3)])
        weights.append({k: v.detach().numpy().copy() for k, v in model.state_dict().items()})
        compiled = run if compile_it else None
    np.testing.assert_allclose(losses[1], losses[0], rtol=1e-5)
    for k in weights[0]:
        np.testing.assert_allclose(weights[1][k], weights[0][k], rtol=1e-5, atol=1e-6, err_msg=k)
    assert compiled.eager_reason is None and len(compiled.variants) == 1


@pytest.mark.parametrize("module", ["tilewise.nn.modules.rnn", "tilewise.nn.utils.rnn"])
def test_docstring_examples_run(module):
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(module), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0 and result.attempted > 0


def test_lstm_training_step_lowers_to_cuda_kernels_that_compile():
    """A bf16-autocast LSTM training step (embedding, 2-layer LSTM, linear, cross entropy, AdamW) traced whole and
    lowered for the CUDA target: every generated kernel compiles with NVRTC, and each time step's cell is one
    kernel forward and one backward."""
    from tilewise.codegen.toolchain import compile_cached, nvrtc_available
    from tilewise.compiler.capture import trace
    from tilewise.compiler.passes import run_pipeline
    from tilewise.compiler.program import lower_program
    from tilewise.compiler.targets import CUDA_TARGET

    if not nvrtc_available():
        pytest.skip("NVRTC is not installed")
    tw.manual_seed(0)
    embed, lstm, head = tw.nn.Embedding(16, 8), tw.nn.LSTM(8, 8, 2, batch_first=True), tw.nn.Linear(8, 16)
    params = [*embed.parameters(), *lstm.parameters(), *head.parameters()]
    opt = tw.optim.AdamW(params, lr=1e-3)

    def step(x, y):
        with tw.autocast(device_type="cpu", dtype=tw.bfloat16):
            logits = head(lstm(embed(x))[0])
            loss = tw.nn.functional.cross_entropy(logits.reshape(-1, 16), y.reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    x, y = tw.randint(0, 16, (2, 3)), tw.randint(0, 16, (2, 3))
    low = lower_program(run_pipeline(trace(step, (x, y), {}).graph), CUDA_TARGET)
    for name, source in low.sources.items():
        assert f".entry {name}" in compile_cached(source, name, "sm_90").ptx
    cells = [k for k in low.kernels.values() if "sigmoid" in low.sources[k.name] or "tanh" in low.sources[k.name]]
    assert len(cells) == 2 * 3 * 2, f"{len(cells)} kernels with gate arithmetic for 2 layers x 3 steps x 2 ways"
    # per layer (``_lstm_layer``'s decomposition): its outputs, cell states and hidden projections, their gate
    # gradients and the states W_hh's gradient reads; none per step
    assert str(low.fused).count(" cat(") == 2 * 5


def test_lstm_training_step_keeps_each_layer_whole_on_the_cuda_target():
    """The CUDA target's passes keep ``_lstm_layer`` and its backward whole: a compiled step runs each layer's time
    loop as the backend's one call (backends/cuda/recurrent.py), not 2 x steps operators per layer."""
    from tilewise.codegen.toolchain import compile_cached, nvrtc_available
    from tilewise.compiler.capture import trace
    from tilewise.compiler.passes import run_pipeline
    from tilewise.compiler.program import lower_program
    from tilewise.compiler.targets import CUDA_TARGET

    tw.manual_seed(0)
    embed, lstm, head = tw.nn.Embedding(16, 8), tw.nn.LSTM(8, 8, 2, batch_first=True), tw.nn.Linear(8, 16)

    def step(x, y):
        logits = head(lstm(embed(x))[0])
        loss = tw.nn.functional.cross_entropy(logits.reshape(-1, 16), y.reshape(-1))
        loss.backward()
        return loss.detach()

    x, y = tw.randint(0, 16, (2, 5)), tw.randint(0, 16, (2, 5))
    graph = run_pipeline(trace(step, (x, y), {}).graph, CUDA_TARGET.passes)
    ops = [n.op for n in graph.body]
    assert (ops.count("_lstm_layer"), ops.count("_lstm_layer_backward"), ops.count("_lstm_cell")) == (2, 2, 0)
    low = lower_program(graph, CUDA_TARGET)
    fused = str(low.fused)
    assert (fused.count(" _lstm_layer("), fused.count(" _lstm_layer_backward(")) == (2, 2)
    if nvrtc_available():
        for name, source in low.sources.items():
            assert f".entry {name}" in compile_cached(source, name, "sm_90").ptx


def test_empty_batch_matches_torch():
    _check_layer(lambda nn: nn.LSTM(3, 4, 2, bidirectional=True), (5, 0, 3))


@pytest.mark.parametrize("make", [lambda nn: nn.LSTM(3, 4, 2), lambda nn: nn.RNN(3, 4, bidirectional=True),
                                  lambda nn: nn.GRU(3, 4)], ids=["lstm", "rnn", "gru"])
def test_double_backward_matches_torch(make):
    """Gradients taken with create_graph and differentiated again (a gradient penalty), as torch's CPU kernels
    allow: W_hh's one-product gradient differentiates through the states it read."""
    ours, ref = _pair(make, dtype=torch.float64)
    x = np.random.default_rng(0).uniform(-1, 1, size=(4, 2, 3))
    results = []
    for lib, model in ((tw, ours), (torch, ref)):
        xi = _leaf(x, lib)
        out = model(xi)[0]
        params = list(model.parameters())
        grads = lib.autograd.grad((out * out).sum(), [xi, *params], create_graph=True)
        penalty = sum((g * g).sum() for g in grads)
        penalty.backward()
        results.append([xi.grad, *[p.grad for p in params]])
    for k, (a, b) in enumerate(zip(*results)):
        _close(a, b, f"second-order gradient {k}", rtol=1e-7, atol=1e-9)

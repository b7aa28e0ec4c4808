"""``print(model)`` is in nearly every published script: the printed modules read as torch prints them."""

from __future__ import annotations

import warnings

import pytest
import torch as real_torch

import tilewise

MODULES = {
    "convolutions": lambda nn: nn.Sequential(
        nn.Conv2d(3, 8, (3, 5), stride=2, padding=(1, 2), dilation=2, bias=False, padding_mode="reflect"),
        nn.ConvTranspose2d(3, 8, 3, stride=2, padding=1, output_padding=1), nn.Conv1d(3, 8, 3, padding="same")),
    "recurrent": lambda nn: nn.ModuleList([
        nn.LSTM(3, 4, num_layers=2, batch_first=True, dropout=0.1, bidirectional=True, proj_size=2), nn.GRU(3, 4),
        nn.RNN(3, 4, nonlinearity="relu", bias=False), nn.LSTMCell(3, 4)]),
    "attention": lambda nn: nn.ModuleList([
        nn.MultiheadAttention(8, 2, dropout=0.1, kdim=4, vdim=4, batch_first=True),
        nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, activation="gelu", batch_first=True, norm_first=True)]),
    "padding": lambda nn: nn.Sequential(nn.ZeroPad2d(1), nn.ReflectionPad1d(2), nn.ConstantPad2d((1, 2), 0.5),
                                        nn.ZeroPad2d([1, 2, 3, 4, 5, 6]), nn.ReplicationPad2d(1), nn.CircularPad1d(1)),
    "containers": lambda nn: nn.ModuleDict({"a": nn.Linear(1, 1), "b": nn.ModuleList([nn.ReLU(), nn.ReLU()]),
                                            "c": nn.ParameterList([nn.Parameter(real_torch.ones(2, 3))])})
    if nn is real_torch.nn else nn.ModuleDict({"a": nn.Linear(1, 1), "b": nn.ModuleList([nn.ReLU(), nn.ReLU()]),
                                               "c": nn.ParameterList([nn.Parameter(tilewise.ones(2, 3))])}),
}


@pytest.mark.parametrize("name", list(MODULES))
def test_modules_print_as_torch_prints_them(name):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ours, theirs = (repr(MODULES[name](torch.nn)) for torch in (tilewise, real_torch))
    assert ours.replace("tilewise.", "torch.") == theirs


def test_a_padding_sequence_is_kept_as_given_and_checked_where_it_pads_as_torch():
    # torch keeps any sequence (ConstantPad2d((1, 2)) pads the last dim only); F.pad refuses what fits no rank
    shapes = [tuple(torch.nn.ConstantPad2d((1, 2), 0.5)(torch.ones(1, 1, 2, 2)).shape) for torch in
              (tilewise, real_torch)]
    assert shapes[0] == shapes[1] == (1, 1, 2, 5)
    for torch in (tilewise, real_torch):
        with pytest.raises(NotImplementedError, match="Padding size 2 is not supported for 4D input tensor"):
            torch.nn.ReflectionPad2d((1, 1))(torch.ones(1, 1, 3, 3))

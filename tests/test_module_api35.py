"""nn.Module's API and printing against torch.nn: the repr of every layer class torch.nn.modules has, built with
default and with non-default arguments, containers nested, and the Module methods (state dicts and their hooks,
traversal, lookups by dotted name, assignment rules, dtype and device moves, copies, checkpoints) with torch's
results and torch's errors."""

from __future__ import annotations

import copy
import io
import pickle
import warnings
from collections import OrderedDict

import pytest
import torch

import tilewise as tw


def _text(value):
    """torch's name where tilewise's stands, in every string inside ``value``."""
    if isinstance(value, str):
        return value.replace("tilewise", "torch")
    if isinstance(value, (list, tuple)):
        return type(value)(_text(v) for v in value)
    if isinstance(value, dict):
        return {_text(k): _text(v) for k, v in value.items()}
    return value


def _outcome(lib, case):
    """What ``case(lib)`` returns, or the type and message of what it raises."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return "returned", _text(case(lib))
        except Exception as exc:  # noqa: BLE001 — the error is the result compared
            return "raised", type(exc).__name__, _text(str(exc))


def _same_as_torch(case):
    assert _outcome(tw, case) == _outcome(torch, case)


# ---------------------------------------------------------------------------- the repr of every layer

# each class of torch.nn.modules: makers (nn -> module), the first with defaults where the class has any
LAYERS = {
    "AdaptiveAvgPool1d": (lambda nn: nn.AdaptiveAvgPool1d(3),),
    "AdaptiveAvgPool2d": (lambda nn: nn.AdaptiveAvgPool2d(3), lambda nn: nn.AdaptiveAvgPool2d((None, 4))),
    "AdaptiveAvgPool3d": (lambda nn: nn.AdaptiveAvgPool3d(2), lambda nn: nn.AdaptiveAvgPool3d((1, None, 2))),
    "AdaptiveMaxPool1d": (lambda nn: nn.AdaptiveMaxPool1d(3), lambda nn: nn.AdaptiveMaxPool1d(3, return_indices=True)),
    "AdaptiveMaxPool2d": (lambda nn: nn.AdaptiveMaxPool2d((2, 3)), lambda nn: nn.AdaptiveMaxPool2d(3, True)),
    "AdaptiveMaxPool3d": (lambda nn: nn.AdaptiveMaxPool3d(2), lambda nn: nn.AdaptiveMaxPool3d((2, None, 1), True)),
    "AdaptiveLogSoftmaxWithLoss": (lambda nn: nn.AdaptiveLogSoftmaxWithLoss(8, 10, [4, 8]),
                                   lambda nn: nn.AdaptiveLogSoftmaxWithLoss(8, 10, [4], div_value=2.0, head_bias=True)),
    "AlphaDropout": (lambda nn: nn.AlphaDropout(), lambda nn: nn.AlphaDropout(0.2, inplace=True)),
    "AvgPool1d": (lambda nn: nn.AvgPool1d(3),
                  lambda nn: nn.AvgPool1d(3, 2, 1, ceil_mode=True, count_include_pad=False)),
    "AvgPool2d": (lambda nn: nn.AvgPool2d(3),
                  lambda nn: nn.AvgPool2d((2, 3), (1, 2), 1, True, False, divisor_override=2)),
    "AvgPool3d": (lambda nn: nn.AvgPool3d(2), lambda nn: nn.AvgPool3d(3, 2, 1, True, False, 3)),
    "BCELoss": (lambda nn: nn.BCELoss(), lambda nn: nn.BCELoss(reduction="sum")),
    "BCEWithLogitsLoss": (lambda nn: nn.BCEWithLogitsLoss(), lambda nn: nn.BCEWithLogitsLoss(reduction="none")),
    "BatchNorm1d": (lambda nn: nn.BatchNorm1d(4), lambda nn: nn.BatchNorm1d(4, eps=1e-3, momentum=None, affine=False,
                                                                            track_running_stats=False)),
    "BatchNorm2d": (lambda nn: nn.BatchNorm2d(4), lambda nn: nn.BatchNorm2d(4, momentum=0.3, affine=False)),
    "BatchNorm3d": (lambda nn: nn.BatchNorm3d(4), lambda nn: nn.BatchNorm3d(4, track_running_stats=False)),
    "Bilinear": (lambda nn: nn.Bilinear(2, 3, 4), lambda nn: nn.Bilinear(2, 3, 4, bias=False)),
    "CELU": (lambda nn: nn.CELU(), lambda nn: nn.CELU(0.5, inplace=True)),
    "CTCLoss": (lambda nn: nn.CTCLoss(), lambda nn: nn.CTCLoss(blank=1, reduction="sum", zero_infinity=True)),
    "ChannelShuffle": (lambda nn: nn.ChannelShuffle(2),),
    "CircularPad1d": (lambda nn: nn.CircularPad1d(2), lambda nn: nn.CircularPad1d((1, 2))),
    "CircularPad2d": (lambda nn: nn.CircularPad2d(1), lambda nn: nn.CircularPad2d((1, 2, 3, 0))),
    "CircularPad3d": (lambda nn: nn.CircularPad3d(1), lambda nn: nn.CircularPad3d((1, 2, 3, 0, 1, 1))),
    "ConstantPad1d": (lambda nn: nn.ConstantPad1d(2, 0.0), lambda nn: nn.ConstantPad1d((1, 2), -1.5)),
    "ConstantPad2d": (lambda nn: nn.ConstantPad2d(1, 3.5), lambda nn: nn.ConstantPad2d((1, 2, 3, 4), 2)),
    "ConstantPad3d": (lambda nn: nn.ConstantPad3d(1, 0.5), lambda nn: nn.ConstantPad3d((1, 2, 3, 4, 5, 6), 1.0)),
    "Conv1d": (lambda nn: nn.Conv1d(2, 4, 3), lambda nn: nn.Conv1d(2, 4, 3, stride=2, padding=1,
                                                                   dilation=2, groups=2, bias=False,
                                                                   padding_mode="reflect"),
               lambda nn: nn.Conv1d(2, 4, 3, padding="same"), lambda nn: nn.Conv1d(2, 4, 3, padding="valid")),
    "Conv2d": (lambda nn: nn.Conv2d(2, 4, 3), lambda nn: nn.Conv2d(4, 8, (3, 5), stride=(2, 1), padding=(1, 2),
                                                                   dilation=(2, 1), groups=2, bias=False,
                                                                   padding_mode="circular"),
               lambda nn: nn.Conv2d(2, 4, 3, padding="same", padding_mode="replicate"),
               lambda nn: nn.Conv2d(2, 4, 1, stride=1, padding=0, dilation=1, groups=1, bias=True)),
    "Conv3d": (lambda nn: nn.Conv3d(2, 3, 3), lambda nn: nn.Conv3d(2, 4, 3, 2, 1, 1, 2, False, "zeros")),
    "ConvTranspose1d": (lambda nn: nn.ConvTranspose1d(2, 4, 3),
                        lambda nn: nn.ConvTranspose1d(2, 4, 3, stride=2, padding=1, output_padding=1, groups=2,
                                                      bias=False, dilation=2)),
    "ConvTranspose2d": (lambda nn: nn.ConvTranspose2d(2, 3, 3),
                        lambda nn: nn.ConvTranspose2d(2, 4, (3, 2), stride=2, padding=(1, 0), output_padding=1,
                                                      groups=2, bias=False, dilation=(1, 2))),
    "ConvTranspose3d": (lambda nn: nn.ConvTranspose3d(2, 3, 3),
                        lambda nn: nn.ConvTranspose3d(2, 4, 3, stride=2, padding=1, output_padding=1, dilation=2)),
    "CosineEmbeddingLoss": (lambda nn: nn.CosineEmbeddingLoss(),
                            lambda nn: nn.CosineEmbeddingLoss(0.5, reduction="sum")),
    "CosineSimilarity": (lambda nn: nn.CosineSimilarity(), lambda nn: nn.CosineSimilarity(dim=0, eps=1e-6)),
    "CrossEntropyLoss": (lambda nn: nn.CrossEntropyLoss(),
                         lambda nn: nn.CrossEntropyLoss(ignore_index=2, reduction="sum", label_smoothing=0.1)),
    "CrossMapLRN2d": (lambda nn: nn.CrossMapLRN2d(3), lambda nn: nn.CrossMapLRN2d(5, 1e-3, 0.5, 2)),
    "Dropout": (lambda nn: nn.Dropout(), lambda nn: nn.Dropout(0.1, inplace=True)),
    "Dropout1d": (lambda nn: nn.Dropout1d(), lambda nn: nn.Dropout1d(0.3, True)),
    "Dropout2d": (lambda nn: nn.Dropout2d(), lambda nn: nn.Dropout2d(0.3)),
    "Dropout3d": (lambda nn: nn.Dropout3d(), lambda nn: nn.Dropout3d(p=0.0, inplace=True)),
    "ELU": (lambda nn: nn.ELU(), lambda nn: nn.ELU(alpha=0.5, inplace=True)),
    "Embedding": (lambda nn: nn.Embedding(10, 4), lambda nn: nn.Embedding(10, 4, padding_idx=2, max_norm=1.0),
                  lambda nn: nn.Embedding(10, 4, padding_idx=-1, max_norm=2.0, norm_type=1.0, scale_grad_by_freq=True,
                                          sparse=True)),
    "EmbeddingBag": (lambda nn: nn.EmbeddingBag(10, 4),
                     lambda nn: nn.EmbeddingBag(10, 4, max_norm=1.0, norm_type=3.0, scale_grad_by_freq=True, mode="sum",
                                                sparse=True, include_last_offset=True, padding_idx=0),
                     lambda nn: nn.EmbeddingBag(10, 4, mode="max")),
    "FeatureAlphaDropout": (lambda nn: nn.FeatureAlphaDropout(), lambda nn: nn.FeatureAlphaDropout(0.25, True)),
    "Flatten": (lambda nn: nn.Flatten(), lambda nn: nn.Flatten(0, 2)),
    "Fold": (lambda nn: nn.Fold((4, 5), 2), lambda nn: nn.Fold(4, (2, 3), dilation=2, padding=1, stride=(1, 2))),
    "FractionalMaxPool2d": (lambda nn: nn.FractionalMaxPool2d(2, output_size=3),
                            lambda nn: nn.FractionalMaxPool2d((2, 3), output_ratio=(0.5, 0.5), return_indices=True)),
    "FractionalMaxPool3d": (lambda nn: nn.FractionalMaxPool3d(2, output_size=3),
                            lambda nn: nn.FractionalMaxPool3d(2, output_ratio=0.5)),
    "GELU": (lambda nn: nn.GELU(), lambda nn: nn.GELU(approximate="tanh")),
    "GLU": (lambda nn: nn.GLU(), lambda nn: nn.GLU(dim=0)),
    "GRU": (lambda nn: nn.GRU(3, 4), lambda nn: nn.GRU(3, 4, num_layers=2, bias=False, batch_first=True, dropout=0.5,
                                                       bidirectional=True)),
    "GRUCell": (lambda nn: nn.GRUCell(3, 4), lambda nn: nn.GRUCell(3, 4, bias=False)),
    "GaussianNLLLoss": (lambda nn: nn.GaussianNLLLoss(),
                        lambda nn: nn.GaussianNLLLoss(full=True, eps=1e-3, reduction="sum")),
    "GroupNorm": (lambda nn: nn.GroupNorm(2, 4), lambda nn: nn.GroupNorm(2, 4, eps=1e-3, affine=False)),
    "Hardshrink": (lambda nn: nn.Hardshrink(), lambda nn: nn.Hardshrink(0.25)),
    "Hardsigmoid": (lambda nn: nn.Hardsigmoid(), lambda nn: nn.Hardsigmoid(inplace=True)),
    "Hardswish": (lambda nn: nn.Hardswish(), lambda nn: nn.Hardswish(inplace=True)),
    "Hardtanh": (lambda nn: nn.Hardtanh(), lambda nn: nn.Hardtanh(-2.0, 3, inplace=True)),
    "HingeEmbeddingLoss": (lambda nn: nn.HingeEmbeddingLoss(), lambda nn: nn.HingeEmbeddingLoss(2.0, reduction="none")),
    "HuberLoss": (lambda nn: nn.HuberLoss(), lambda nn: nn.HuberLoss(reduction="sum", delta=0.5)),
    "Identity": (lambda nn: nn.Identity(), lambda nn: nn.Identity(3, unused="x")),
    "InstanceNorm1d": (lambda nn: nn.InstanceNorm1d(4),
                       lambda nn: nn.InstanceNorm1d(4, affine=True, track_running_stats=True)),
    "InstanceNorm2d": (lambda nn: nn.InstanceNorm2d(4), lambda nn: nn.InstanceNorm2d(4, 1e-3, 0.2, True, False)),
    "InstanceNorm3d": (lambda nn: nn.InstanceNorm3d(4), lambda nn: nn.InstanceNorm3d(4, momentum=None, affine=True)),
    "KLDivLoss": (lambda nn: nn.KLDivLoss(), lambda nn: nn.KLDivLoss(reduction="batchmean", log_target=True)),
    "L1Loss": (lambda nn: nn.L1Loss(), lambda nn: nn.L1Loss(reduction="sum")),
    "LPPool1d": (lambda nn: nn.LPPool1d(2, 3), lambda nn: nn.LPPool1d(1.5, 3, 2, ceil_mode=True)),
    "LPPool2d": (lambda nn: nn.LPPool2d(2, 3), lambda nn: nn.LPPool2d(3, (2, 3), (1, 2), True)),
    "LPPool3d": (lambda nn: nn.LPPool3d(2, 2), lambda nn: nn.LPPool3d(2, 3, 2, ceil_mode=True)),
    "LSTM": (lambda nn: nn.LSTM(3, 4), lambda nn: nn.LSTM(3, 4, num_layers=2, bidirectional=True, batch_first=True),
             lambda nn: nn.LSTM(3, 4, 2, False, True, 0.25, True, proj_size=2)),
    "LSTMCell": (lambda nn: nn.LSTMCell(3, 4), lambda nn: nn.LSTMCell(3, 4, bias=False)),
    "LayerNorm": (lambda nn: nn.LayerNorm(4), lambda nn: nn.LayerNorm((3, 4), eps=1e-6, elementwise_affine=False),
                  lambda nn: nn.LayerNorm([4], bias=False)),
    "LazyBatchNorm1d": (lambda nn: nn.LazyBatchNorm1d(), lambda nn: nn.LazyBatchNorm1d(affine=False)),
    "LazyBatchNorm2d": (lambda nn: nn.LazyBatchNorm2d(), lambda nn: nn.LazyBatchNorm2d(momentum=None)),
    "LazyBatchNorm3d": (lambda nn: nn.LazyBatchNorm3d(), lambda nn: nn.LazyBatchNorm3d(track_running_stats=False)),
    "LazyConv1d": (lambda nn: nn.LazyConv1d(4, 3), lambda nn: nn.LazyConv1d(4, 3, padding=1, bias=False)),
    "LazyConv2d": (lambda nn: nn.LazyConv2d(4, 3), lambda nn: nn.LazyConv2d(4, 3, stride=2, groups=2)),
    "LazyConv3d": (lambda nn: nn.LazyConv3d(4, 3), lambda nn: nn.LazyConv3d(4, 3, dilation=2, padding_mode="reflect")),
    "LazyConvTranspose1d": (lambda nn: nn.LazyConvTranspose1d(4, 3), lambda nn: nn.LazyConvTranspose1d(4, 3, stride=2)),
    "LazyConvTranspose2d": (lambda nn: nn.LazyConvTranspose2d(4, 3),
                            lambda nn: nn.LazyConvTranspose2d(4, 2, output_padding=0, groups=2)),
    "LazyConvTranspose3d": (lambda nn: nn.LazyConvTranspose3d(4, 3),
                            lambda nn: nn.LazyConvTranspose3d(4, 3, bias=False)),
    "LazyInstanceNorm1d": (lambda nn: nn.LazyInstanceNorm1d(), lambda nn: nn.LazyInstanceNorm1d(affine=True)),
    "LazyInstanceNorm2d": (lambda nn: nn.LazyInstanceNorm2d(),
                           lambda nn: nn.LazyInstanceNorm2d(track_running_stats=True)),
    "LazyInstanceNorm3d": (lambda nn: nn.LazyInstanceNorm3d(), lambda nn: nn.LazyInstanceNorm3d(eps=1e-3)),
    "LazyLinear": (lambda nn: nn.LazyLinear(3), lambda nn: nn.LazyLinear(3, bias=False)),
    "LeakyReLU": (lambda nn: nn.LeakyReLU(), lambda nn: nn.LeakyReLU(0.2, inplace=True)),
    "Linear": (lambda nn: nn.Linear(3, 4), lambda nn: nn.Linear(3, 4, bias=False)),
    "LinearCrossEntropyLoss": (lambda nn: nn.LinearCrossEntropyLoss(4, 10),),
    "LocalResponseNorm": (lambda nn: nn.LocalResponseNorm(3), lambda nn: nn.LocalResponseNorm(5, 1e-3, 0.5, 2.0)),
    "LogSigmoid": (lambda nn: nn.LogSigmoid(),),
    "LogSoftmax": (lambda nn: nn.LogSoftmax(), lambda nn: nn.LogSoftmax(dim=1)),
    "MSELoss": (lambda nn: nn.MSELoss(), lambda nn: nn.MSELoss(reduction="none")),
    "MarginRankingLoss": (lambda nn: nn.MarginRankingLoss(), lambda nn: nn.MarginRankingLoss(margin=0.5)),
    "MaxPool1d": (lambda nn: nn.MaxPool1d(3), lambda nn: nn.MaxPool1d(3, 2, 1, 2, return_indices=True, ceil_mode=True)),
    "MaxPool2d": (lambda nn: nn.MaxPool2d(2), lambda nn: nn.MaxPool2d((2, 3), stride=(1, 2), padding=1, dilation=(1, 2),
                                                                      ceil_mode=True)),
    "MaxPool3d": (lambda nn: nn.MaxPool3d(2), lambda nn: nn.MaxPool3d(2, 1, 1)),
    "MaxUnpool1d": (lambda nn: nn.MaxUnpool1d(2), lambda nn: nn.MaxUnpool1d(3, 2, 1)),
    "MaxUnpool2d": (lambda nn: nn.MaxUnpool2d(2), lambda nn: nn.MaxUnpool2d((2, 3), (1, 2), (0, 1))),
    "MaxUnpool3d": (lambda nn: nn.MaxUnpool3d(2), lambda nn: nn.MaxUnpool3d(3, 2, 1)),
    "Mish": (lambda nn: nn.Mish(), lambda nn: nn.Mish(inplace=True)),
    "Module": (lambda nn: nn.Module(),),
    "ModuleDict": (lambda nn: nn.ModuleDict(),
                   lambda nn: nn.ModuleDict({"a": nn.ReLU(), "b": nn.Sequential(nn.Linear(2, 3), nn.Tanh())})),
    "ModuleList": (lambda nn: nn.ModuleList(),
                   lambda nn: nn.ModuleList([nn.ReLU(), nn.ReLU(), nn.Linear(2, 2), nn.ReLU()]),
                   lambda nn: nn.ModuleList([nn.Linear(2, 2) for _ in range(3)] + [nn.ModuleList([nn.ReLU()] * 3)])),
    "MultiLabelMarginLoss": (lambda nn: nn.MultiLabelMarginLoss(), lambda nn: nn.MultiLabelMarginLoss(reduction="sum")),
    "MultiLabelSoftMarginLoss": (lambda nn: nn.MultiLabelSoftMarginLoss(),
                                 lambda nn: nn.MultiLabelSoftMarginLoss(reduction="sum")),
    "MultiMarginLoss": (lambda nn: nn.MultiMarginLoss(),
                        lambda nn: nn.MultiMarginLoss(p=2, margin=0.5, reduction="none")),
    "MultiheadAttention": (lambda nn: nn.MultiheadAttention(8, 2),
                           lambda nn: nn.MultiheadAttention(8, 2, dropout=0.1, bias=False, add_bias_kv=True,
                                                            add_zero_attn=True, kdim=4, vdim=6, batch_first=True)),
    "NLLLoss": (lambda nn: nn.NLLLoss(), lambda nn: nn.NLLLoss(ignore_index=1, reduction="sum")),
    "NLLLoss2d": (lambda nn: nn.NLLLoss2d(),),
    "PReLU": (lambda nn: nn.PReLU(), lambda nn: nn.PReLU(3, 0.1)),
    "PairwiseDistance": (lambda nn: nn.PairwiseDistance(), lambda nn: nn.PairwiseDistance(1.0, 1e-3, True)),
    "ParameterDict": (lambda nn: nn.ParameterDict(),),
    "ParameterList": (lambda nn: nn.ParameterList(),),
    "PixelShuffle": (lambda nn: nn.PixelShuffle(2),),
    "PixelUnshuffle": (lambda nn: nn.PixelUnshuffle(3),),
    "PoissonNLLLoss": (lambda nn: nn.PoissonNLLLoss(), lambda nn: nn.PoissonNLLLoss(log_input=False, full=True)),
    "RMSNorm": (lambda nn: nn.RMSNorm(4), lambda nn: nn.RMSNorm([3, 4], eps=1e-5, elementwise_affine=False)),
    "RNN": (lambda nn: nn.RNN(3, 4), lambda nn: nn.RNN(3, 4, 2, nonlinearity="relu", bias=False, batch_first=True,
                                                       dropout=0.1, bidirectional=True)),
    "RNNBase": (lambda nn: nn.RNNBase("LSTM", 3, 4), lambda nn: nn.RNNBase("GRU", 3, 4, 2, bidirectional=True)),
    "RNNCell": (lambda nn: nn.RNNCell(3, 4), lambda nn: nn.RNNCell(3, 4, bias=False, nonlinearity="relu")),
    "RNNCellBase": (lambda nn: nn.RNNCellBase(3, 4, True, 2), lambda nn: nn.RNNCellBase(3, 4, False, 4)),
    "RReLU": (lambda nn: nn.RReLU(), lambda nn: nn.RReLU(0.1, 0.3, inplace=True)),
    "ReLU": (lambda nn: nn.ReLU(), lambda nn: nn.ReLU(True)),
    "ReLU6": (lambda nn: nn.ReLU6(), lambda nn: nn.ReLU6(inplace=True)),
    "ReflectionPad1d": (lambda nn: nn.ReflectionPad1d(2), lambda nn: nn.ReflectionPad1d((1, 0))),
    "ReflectionPad2d": (lambda nn: nn.ReflectionPad2d(2), lambda nn: nn.ReflectionPad2d((1, 0, 2, 1))),
    "ReflectionPad3d": (lambda nn: nn.ReflectionPad3d(1), lambda nn: nn.ReflectionPad3d((1, 0, 2, 1, 0, 1))),
    "ReplicationPad1d": (lambda nn: nn.ReplicationPad1d(2), lambda nn: nn.ReplicationPad1d((1, 3))),
    "ReplicationPad2d": (lambda nn: nn.ReplicationPad2d(2), lambda nn: nn.ReplicationPad2d((1, 3, 0, 2))),
    "ReplicationPad3d": (lambda nn: nn.ReplicationPad3d(2), lambda nn: nn.ReplicationPad3d((1, 2, 3, 4, 5, 6))),
    "SELU": (lambda nn: nn.SELU(), lambda nn: nn.SELU(inplace=True)),
    "Sequential": (lambda nn: nn.Sequential(), lambda nn: nn.Sequential(nn.Linear(2, 3), nn.ReLU())),
    "SiLU": (lambda nn: nn.SiLU(), lambda nn: nn.SiLU(inplace=True)),
    "Sigmoid": (lambda nn: nn.Sigmoid(),),
    "SmoothL1Loss": (lambda nn: nn.SmoothL1Loss(), lambda nn: nn.SmoothL1Loss(reduction="sum", beta=0.5)),
    "SoftMarginLoss": (lambda nn: nn.SoftMarginLoss(), lambda nn: nn.SoftMarginLoss(reduction="none")),
    "Softmax": (lambda nn: nn.Softmax(), lambda nn: nn.Softmax(dim=-1)),
    "Softmax2d": (lambda nn: nn.Softmax2d(),),
    "Softmin": (lambda nn: nn.Softmin(), lambda nn: nn.Softmin(1)),
    "Softplus": (lambda nn: nn.Softplus(), lambda nn: nn.Softplus(beta=2.0, threshold=10.0)),
    "Softshrink": (lambda nn: nn.Softshrink(), lambda nn: nn.Softshrink(0.25)),
    "Softsign": (lambda nn: nn.Softsign(),),
    "SyncBatchNorm": (lambda nn: nn.SyncBatchNorm(4),
                      lambda nn: nn.SyncBatchNorm(4, affine=False, track_running_stats=False)),
    "Tanh": (lambda nn: nn.Tanh(),),
    "Tanhshrink": (lambda nn: nn.Tanhshrink(),),
    "Threshold": (lambda nn: nn.Threshold(0.1, 20.0), lambda nn: nn.Threshold(0.5, -1, inplace=True)),
    "Transformer": (lambda nn: nn.Transformer(d_model=8, nhead=2, dim_feedforward=16, num_encoder_layers=1,
                                              num_decoder_layers=1),
                    lambda nn: nn.Transformer(8, 2, 2, 1, 16, 0.0, "gelu", batch_first=True, norm_first=True,
                                              bias=False)),
    "TransformerDecoder": (lambda nn: nn.TransformerDecoder(nn.TransformerDecoderLayer(8, 2, 16), 2),
                           lambda nn: nn.TransformerDecoder(nn.TransformerDecoderLayer(8, 2, 16, norm_first=True), 1,
                                                            norm=nn.LayerNorm(8))),
    "TransformerDecoderLayer": (lambda nn: nn.TransformerDecoderLayer(8, 2),
                                lambda nn: nn.TransformerDecoderLayer(8, 2, 16, 0.0, "gelu", 1e-6, True, True,
                                                                      bias=False)),
    "TransformerEncoder": (lambda nn: nn.TransformerEncoder(nn.TransformerEncoderLayer(8, 2, 16), 2,
                                                            enable_nested_tensor=False),
                           lambda nn: nn.TransformerEncoder(nn.TransformerEncoderLayer(8, 2, 16, batch_first=True), 1,
                                                            norm=nn.LayerNorm(8), enable_nested_tensor=False)),
    "TransformerEncoderLayer": (lambda nn: nn.TransformerEncoderLayer(8, 2),
                                lambda nn: nn.TransformerEncoderLayer(8, 2, 16, 0.1, activation="gelu",
                                                                      layer_norm_eps=1e-6,
                                                                      batch_first=True, norm_first=True, bias=False)),
    "TripletMarginLoss": (lambda nn: nn.TripletMarginLoss(),
                          lambda nn: nn.TripletMarginLoss(margin=0.5, p=1.0, swap=True)),
    "TripletMarginWithDistanceLoss": (lambda nn: nn.TripletMarginWithDistanceLoss(),
                                      lambda nn: nn.TripletMarginWithDistanceLoss(margin=0.5, swap=True,
                                                                                  reduction="sum")),
    "Unflatten": (lambda nn: nn.Unflatten(1, (2, 3)), lambda nn: nn.Unflatten(-1, [2, -1])),
    "Unfold": (lambda nn: nn.Unfold(2), lambda nn: nn.Unfold((2, 3), dilation=2, padding=1, stride=(1, 2))),
    "Upsample": (lambda nn: nn.Upsample(), lambda nn: nn.Upsample(scale_factor=2, mode="bilinear"),
                 lambda nn: nn.Upsample(size=(3, 4), mode="bicubic", align_corners=True),
                 lambda nn: nn.Upsample(scale_factor=(2.0, 1.5), mode="nearest-exact", recompute_scale_factor=True),
                 lambda nn: nn.Upsample(size=5, mode="linear", align_corners=False)),
    "UpsamplingBilinear2d": (lambda nn: nn.UpsamplingBilinear2d(scale_factor=2),
                             lambda nn: nn.UpsamplingBilinear2d(size=(3, 4))),
    "UpsamplingNearest2d": (lambda nn: nn.UpsamplingNearest2d(size=3),
                            lambda nn: nn.UpsamplingNearest2d(scale_factor=2.5)),
    "ZeroPad1d": (lambda nn: nn.ZeroPad1d(2), lambda nn: nn.ZeroPad1d((1, 2))),
    "ZeroPad2d": (lambda nn: nn.ZeroPad2d(2), lambda nn: nn.ZeroPad2d((1, 2, 0, 3))),
    "ZeroPad3d": (lambda nn: nn.ZeroPad3d(2), lambda nn: nn.ZeroPad3d((1, 2, 0, 3, 1, 1))),
}



def _torch_layer_classes() -> list[str]:
    return sorted(name for name in dir(torch.nn.modules)
                  if isinstance(getattr(torch.nn.modules, name), type)
                  and issubclass(getattr(torch.nn.modules, name), torch.nn.Module) and name != "Container")


def test_the_table_has_every_layer_class_of_torch_nn_modules():
    """``Container`` (deprecated since torch 0.4, a Module that warns) is the one class left out."""
    assert [name for name in _torch_layer_classes() if name not in LAYERS] == []
    assert [name for name in _torch_layer_classes() if not hasattr(tw.nn, name)] == []


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_layer_repr_matches_torch(name):
    for make in LAYERS[name]:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ours, theirs = make(tw.nn), make(torch.nn)
        assert _text(repr(ours)) == repr(theirs)
        assert _text(ours.extra_repr()) == theirs.extra_repr()


def _containers(nn, lib):
    parameters = nn.ParameterList([nn.Parameter(lib.zeros(2, 3)), nn.Parameter(lib.zeros(4, dtype=lib.float64),
                                                                                 requires_grad=False), lib.ones(2)])
    mixed = nn.ParameterList()
    mixed.append(nn.Parameter(lib.zeros(1)))
    mixed.append(3)
    mixed.append(nn.Linear(1, 1))
    named = nn.Sequential(OrderedDict([("conv", nn.Conv2d(1, 2, 3)), ("act", nn.ReLU()),
                                       ("inner", nn.Sequential(OrderedDict([("fc", nn.Linear(2, 2))])))]))
    grown = nn.Sequential(nn.Linear(2, 2))
    grown.add_module("named", nn.ReLU())
    grown.append(nn.Tanh())
    plain = nn.Module()
    plain.p = nn.Parameter(lib.zeros(1))
    plain.child = nn.Linear(1, 1)
    plain.register_module("empty", None)
    same = nn.ModuleList([nn.Linear(2, 2), nn.Linear(2, 2), nn.Linear(2, 3), nn.Linear(2, 2), nn.Linear(2, 2),
                          nn.Linear(2, 2)])
    return [named, parameters, mixed, grown, plain, same,
            nn.ParameterDict({"a": nn.Parameter(lib.zeros(2, 3)), "b": lib.zeros(2, dtype=lib.float64), "c": 5}),
            nn.Sequential(nn.ParameterList([nn.Parameter(lib.zeros(2, 2, dtype=lib.float64)),
                                            nn.Parameter(lib.zeros(1, dtype=lib.bfloat16))]),
                          nn.ParameterDict({"x": nn.Parameter(lib.zeros(3, dtype=lib.complex64)),
                                            "h": nn.Parameter(lib.zeros(3, dtype=lib.float16))})),
            nn.ModuleDict({"x": nn.ModuleList([nn.ReLU(), nn.ReLU()]), "y": nn.ModuleDict({"z": nn.Identity()})}),
            nn.ModuleList([nn.Sequential(nn.ReLU()), nn.Sequential(nn.ReLU())]),
            nn.Sequential(nn.ReLU(), nn.ReLU()),  # a Sequential lists each, as torch's
            nn.ModuleList([nn.ReLU(), nn.Tanh(), nn.ReLU()])[::2],
            nn.ModuleList([nn.ReLU()]) + nn.ModuleList([nn.ReLU()])]


def test_nested_container_reprs_match_torch():
    """ModuleList folds runs of equal children into ``(i-j): n x child``; the other containers list each."""
    ours, theirs = _containers(tw.nn, tw), _containers(torch.nn, torch)
    for a, b in zip(ours, theirs):
        assert _text(repr(a)) == repr(b)


def test_user_extra_repr_and_get_name_print_as_torch():
    def texts(lib):
        class Scaled(lib.nn.Module):
            def __init__(self):
                super().__init__()
                self.k, self.lin = 3, lib.nn.Linear(1, 1)

            def extra_repr(self):
                return f"k={self.k}"

        class TwoLines(lib.nn.Module):
            def extra_repr(self):
                return "line1\nline2"

        class Outer(lib.nn.Module):
            def __init__(self):
                super().__init__()
                self.e = TwoLines()

        class Renamed(lib.nn.Module):
            def _get_name(self):
                return "Other"

        return [repr(Scaled()), str(Scaled()), repr(TwoLines()), repr(Outer()), repr(lib.nn.Sequential(Renamed()))]

    assert _text(texts(tw)) == texts(torch)


# ---------------------------------------------------------------------------- state dicts and their hooks

def _state_dict_with_prefix_and_kept_variables(lib):
    model = lib.nn.Sequential(lib.nn.Linear(2, 2), lib.nn.BatchNorm1d(2))
    state = model.state_dict(prefix="pre.", keep_vars=True)
    return (list(state), [isinstance(v, lib.nn.Parameter) for v in state.values()],
            [v.requires_grad for v in state.values()], list(state._metadata.items()),
            [isinstance(v, lib.nn.Parameter) or v.requires_grad for v in model.state_dict().values()])


def _state_dict_positional_arguments_warn(lib):
    destination = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = lib.nn.Linear(2, 2).state_dict(destination, "x.")
    return list(result), [(w.category.__name__, str(w.message)) for w in caught], result is destination


def _state_dict_into_a_plain_dict(lib):
    destination = {}
    result = lib.nn.Linear(1, 1).state_dict(destination=destination, prefix="a.")
    return result is destination, list(destination)


def _incompatible_keys(lib):
    layer = lib.nn.Linear(2, 2)
    result = layer.load_state_dict({"weight": lib.zeros(2, 2), "foo": lib.zeros(1)}, strict=False)
    matched = layer.load_state_dict(layer.state_dict(), strict=False)
    return (repr(result), str(result), result.missing_keys, result.unexpected_keys, tuple(result),
            result == (["bias"], ["foo"]), repr(matched), type(matched).__name__, isinstance(matched, tuple))


def _load_with_assign(lib):
    layer = lib.nn.Linear(2, 2)
    layer.bias.requires_grad_(False)
    weight = lib.ones(2, 2, dtype=lib.float64)
    layer.load_state_dict({"weight": weight, "bias": lib.nn.Parameter(lib.zeros(2, dtype=lib.float64))}, assign=True)
    return (isinstance(layer.weight, lib.nn.Parameter), str(layer.weight.dtype), layer.weight.requires_grad,
            layer.weight.data_ptr() == weight.data_ptr(), layer.bias.requires_grad)


def _state_dict_pre_hook(lib):
    model = lib.nn.Sequential(lib.nn.Linear(2, 2))
    calls = []
    handle = model[0].register_state_dict_pre_hook(
        lambda module, prefix, keep_vars: calls.append((type(module).__name__, prefix, keep_vars)))
    model.state_dict(prefix="p.", keep_vars=True)
    handle.remove()
    model.state_dict()
    return calls


def _state_dict_post_hook_edits_in_place(lib):
    model = lib.nn.Sequential(lib.nn.Linear(2, 2))
    calls = []

    def hook(module, state, prefix, local_metadata):
        calls.append((type(module).__name__, list(state), prefix, local_metadata))
        state[prefix + "extra"] = lib.zeros(1)

    model[0].register_state_dict_post_hook(hook)
    return list(model.state_dict()), calls


def _state_dict_post_hook_must_return_none(lib):
    layer = lib.nn.Linear(2, 2)
    layer.register_state_dict_post_hook(lambda *args: {"x": 1})
    return list(layer.state_dict())


def _private_state_dict_hook_may_replace_the_dict(lib):
    layer = lib.nn.Linear(2, 2)
    layer._register_state_dict_hook(
        lambda module, state, prefix, local_metadata: OrderedDict((k + "_r", v) for k, v in state.items()))
    return list(layer.state_dict())


def _the_same_hook_through_both_registrations(lib):
    layer = lib.nn.Linear(2, 2)

    def hook(module, state, prefix, local_metadata):
        return None

    layer.register_state_dict_post_hook(hook)
    layer._register_state_dict_hook(hook)


def _load_state_dict_post_hooks_see_and_edit_the_keys(lib):
    model = lib.nn.Sequential(lib.nn.Linear(2, 2))
    seen = []

    def hook(module, keys):
        seen.append((type(module).__name__, list(keys.missing_keys), list(keys.unexpected_keys)))
        keys.missing_keys.clear()

    model[0].register_load_state_dict_post_hook(hook)
    model.register_load_state_dict_post_hook(hook)
    result = model.load_state_dict({"0.weight": lib.zeros(2, 2), "1.x": lib.zeros(1)})
    return seen, repr(result)


def _non_persistent_buffers(lib):
    module = lib.nn.Module()
    module.register_buffer("a", lib.zeros(1), persistent=False)
    module.register_buffer("b", lib.zeros(1))
    module.register_buffer("none", None)
    return (list(module.state_dict()), [n for n, _ in module.named_buffers()],
            sorted(module._non_persistent_buffers_set), module.none, "none" in module._buffers)


def _extra_state(lib):
    class Stateful(lib.nn.Module):
        def get_extra_state(self):
            return {"k": 1}

        def set_extra_state(self, state):
            self.got = state

    model = lib.nn.Sequential(Stateful())
    keys = list(model.state_dict())
    model.load_state_dict({"0._extra_state": {"k": 2}})
    return keys, model[0].got, repr(model.load_state_dict({}, strict=False))


def _batch_norm_checkpoint_from_before_num_batches_tracked(lib):
    """BatchNorm's ``_version`` 2 added ``num_batches_tracked``: a version-1 state dict without it loads."""
    layer = lib.nn.BatchNorm1d(2)
    old = layer.state_dict()
    del old["num_batches_tracked"]
    old._metadata[""] = {"version": 1}
    result = layer.load_state_dict(old)
    return repr(result), layer.num_batches_tracked.item(), str(layer.num_batches_tracked.dtype)


def _batch_norm_state_dict_without_metadata_or_the_counter(lib):
    layer = lib.nn.BatchNorm1d(2)
    plain = dict(layer.state_dict())
    del plain["num_batches_tracked"]
    current = layer.state_dict()
    del current["num_batches_tracked"]
    return repr(layer.load_state_dict(plain)), repr(layer.load_state_dict(current, strict=False))


def _batch_norm_counter_stored_as_shape_one(lib):
    layer = lib.nn.BatchNorm1d(2)
    state = layer.state_dict()
    state["num_batches_tracked"] = lib.tensor([5])
    layer.load_state_dict(state)
    return layer.num_batches_tracked.item(), tuple(layer.num_batches_tracked.shape)


def _version_and_load_from_state_dict_override(lib):
    seen = []

    class Renamed(lib.nn.Module):
        _version = 3

        def __init__(self):
            super().__init__()
            self.w = lib.nn.Parameter(lib.zeros(1))

        def _load_from_state_dict(self, state, prefix, local_metadata, strict, missing, unexpected, errors):
            seen.append((prefix, local_metadata.get("version")))
            if local_metadata.get("version", 0) < 3 and prefix + "old_w" in state:
                state[prefix + "w"] = state.pop(prefix + "old_w")
            super()._load_from_state_dict(state, prefix, local_metadata, strict, missing, unexpected, errors)

    model = lib.nn.Sequential(Renamed())
    state = model.state_dict()
    current = repr(model.load_state_dict(state))
    old = repr(model.load_state_dict({"0.old_w": lib.ones(1)}))
    return list(state._metadata.items()), seen, current, old, model[0].w.tolist()


def _load_state_dict_errors(lib):
    outcomes = []
    for state in ([1], {"weight": [[1.0]], "bias": lib.zeros(1)}):
        try:
            lib.nn.Linear(1, 1).load_state_dict(state)
        except Exception as exc:  # noqa: BLE001 — compared with torch's
            outcomes.append((type(exc).__name__, str(exc)))
    try:
        lib.nn.Linear(1, 1).load_state_dict({"weight": lib.zeros(2, 2), "bias": lib.zeros(1)}, strict=False)
    except Exception as exc:  # noqa: BLE001
        outcomes.append((type(exc).__name__, str(exc)))
    return outcomes


STATE_DICT_CASES = [_state_dict_with_prefix_and_kept_variables, _state_dict_positional_arguments_warn,
                    _state_dict_into_a_plain_dict, _incompatible_keys, _load_with_assign, _state_dict_pre_hook,
                    _state_dict_post_hook_edits_in_place, _state_dict_post_hook_must_return_none,
                    _private_state_dict_hook_may_replace_the_dict, _the_same_hook_through_both_registrations,
                    _load_state_dict_post_hooks_see_and_edit_the_keys, _non_persistent_buffers, _extra_state,
                    _batch_norm_checkpoint_from_before_num_batches_tracked,
                    _batch_norm_state_dict_without_metadata_or_the_counter, _batch_norm_counter_stored_as_shape_one,
                    _version_and_load_from_state_dict_override, _load_state_dict_errors]


@pytest.mark.parametrize("case", STATE_DICT_CASES, ids=lambda case: case.__name__.strip("_"))
def test_state_dict_api_matches_torch(case):
    _same_as_torch(case)


# ---------------------------------------------------------------------------- traversal and lookups by name

def _named_modules_with_duplicates_and_prefix(lib):
    shared = lib.nn.Linear(2, 2)
    model = lib.nn.Sequential(shared, shared, lib.nn.Sequential(shared))
    return ([n for n, _ in model.named_modules()], [n for n, _ in model.named_modules(remove_duplicate=False)],
            [n for n, _ in model.named_modules(prefix="root")],
            [n for n, _ in model.named_modules(prefix="r", remove_duplicate=False)],
            [n for n, _ in model.named_modules(memo={shared})], [n for n, _ in model.named_children()])


def _named_parameters_of_shared_weights(lib):
    module = lib.nn.Module()
    module.a, module.b = lib.nn.Linear(2, 2), lib.nn.Linear(2, 2)
    module.b.weight = module.a.weight
    module.p = module.a.bias
    return ([n for n, _ in module.named_parameters()], [n for n, _ in module.named_parameters(remove_duplicate=False)],
            [n for n, _ in module.named_parameters(recurse=False)],
            [n for n, _ in module.named_parameters(prefix="x", recurse=False, remove_duplicate=False)],
            len(list(module.parameters())), list(module.state_dict()))


def _named_buffers_of_one_tensor_twice(lib):
    module = lib.nn.Module()
    buffer = lib.zeros(1)
    module.register_buffer("a", buffer)
    module.register_buffer("b", buffer)
    return ([n for n, _ in module.named_buffers()], [n for n, _ in module.named_buffers(remove_duplicate=False)],
            list(module.state_dict()))


def _lookup_errors(lib):
    model = lib.nn.Sequential(lib.nn.Linear(2, 2))
    model.register_buffer("buf", lib.zeros(1))
    lookups = [lambda: model.get_submodule("1"), lambda: model.get_submodule("0.weight"),
               lambda: model.get_submodule("0.x.y"), lambda: model.get_parameter("0.nope"),
               lambda: model.get_parameter("0.in_features"), lambda: model.get_parameter("buf"),
               lambda: model.get_buffer("0.weight"), lambda: model.get_buffer("nope"),
               lambda: model.get_buffer("0.in_features"), lambda: model.get_parameter("x.weight"),
               lambda: type(model.get_submodule("")).__name__, lambda: model.get_parameter(""),
               lambda: model.get_buffer("buf").shape, lambda: model.get_parameter("0.bias").shape,
               lambda: model.set_submodule("", lib.nn.ReLU()), lambda: model.set_submodule("0", 3),
               lambda: model.set_submodule("0.weight", lib.nn.ReLU()),
               lambda: model.set_submodule("5", lib.nn.ReLU(), strict=True),
               lambda: model.set_submodule("a.b", lib.nn.ReLU()), lambda: model.set_submodule("0.new", lib.nn.ReLU()),
               lambda: model.set_submodule("0.other", lib.nn.ReLU(), strict=True),
               lambda: model.set_submodule("0.in_features", lib.nn.ReLU()), lambda: repr(model)]
    return [_outcome(lib, lambda lib, lookup=lookup: lookup()) for lookup in lookups]


def _apply_visits_children_first(lib):
    model = lib.nn.Sequential(lib.nn.Linear(2, 2), lib.nn.Sequential(lib.nn.ReLU()))
    order = []
    result = model.apply(lambda module: order.append(type(module).__name__))
    return order, result is model


def _dir_lists_members(lib):
    layer = lib.nn.Linear(2, 2)
    layer.register_buffer("buf", lib.zeros(1))
    layer.sub = lib.nn.ReLU()
    names = dir(layer)
    return ([k in names for k in ("weight", "bias", "buf", "sub", "forward", "in_features", "_parameters", "training")],
            "0" in dir(lib.nn.Sequential(lib.nn.ReLU())), names == sorted(names))


TRAVERSAL_CASES = [_named_modules_with_duplicates_and_prefix, _named_parameters_of_shared_weights,
                   _named_buffers_of_one_tensor_twice, _lookup_errors, _apply_visits_children_first,
                   _dir_lists_members]


@pytest.mark.parametrize("case", TRAVERSAL_CASES, ids=lambda case: case.__name__.strip("_"))
def test_traversal_and_lookups_match_torch(case):
    _same_as_torch(case)


# ---------------------------------------------------------------------------- assignment and registration

def _assignment_outcomes(lib):
    def parameter_over_buffer():
        module = lib.nn.Module()
        module.register_buffer("x", lib.zeros(1))
        module.x = lib.nn.Parameter(lib.ones(1))
        return list(module._parameters), list(module._buffers)

    def tensor_over_parameter():
        lib.nn.Linear(2, 2).weight = lib.zeros(2, 2)

    def module_over_parameter():
        lib.nn.Linear(2, 2).weight = lib.nn.ReLU()

    def buffer_over_parameter():
        lib.nn.Linear(2, 2).weight = lib.nn.Buffer(lib.zeros(1))

    def int_over_buffer():
        lib.nn.BatchNorm1d(2).running_mean = 5

    def int_over_module():
        setattr(lib.nn.Sequential(lib.nn.ReLU()), "0", 5)

    def parameter_over_module():
        model = lib.nn.Sequential(lib.nn.ReLU())
        setattr(model, "0", lib.nn.Parameter(lib.ones(1)))
        return list(model._parameters), list(model._modules)

    def parameter_over_attribute():
        layer = lib.nn.Linear(2, 2)
        layer.in_features = lib.nn.Parameter(lib.ones(1))
        return list(layer._parameters), "in_features" in layer.__dict__

    def none_over_parameter():
        layer = lib.nn.Linear(1, 1)
        layer.bias = None
        return list(layer._parameters), repr(layer), list(layer.state_dict())

    def register_parameter_none():
        module = lib.nn.Module()
        module.register_parameter("p", None)
        return list(module._parameters), module.p, list(module.state_dict()), list(module.named_parameters())

    def delete_and_reassign():
        layer = lib.nn.Linear(2, 2)
        del layer.weight
        deleted = (list(layer._parameters), hasattr(layer, "weight"), list(layer.state_dict()))
        layer.weight = lib.nn.Parameter(lib.ones(2, 2))
        reassigned = list(layer._parameters)
        del layer.bias
        layer.bias = lib.zeros(2)  # after del, a plain tensor is a plain attribute
        return deleted, reassigned, list(layer._parameters), "bias" in layer.__dict__, list(layer.state_dict())

    def delete_missing():
        del lib.nn.Linear(2, 2).nothing

    def read_missing():
        return lib.nn.Linear(2, 2).nothing

    def register_buffer_of_a_parameter():
        module = lib.nn.Module()
        module.register_buffer("b", lib.nn.Parameter(lib.zeros(1)))
        return list(module._buffers), list(module._parameters)

    cases = [parameter_over_buffer, tensor_over_parameter, module_over_parameter, buffer_over_parameter,
             int_over_buffer, int_over_module, parameter_over_module, parameter_over_attribute, none_over_parameter,
             register_parameter_none, delete_and_reassign, delete_missing, read_missing,
             register_buffer_of_a_parameter]
    return [(case.__name__, _outcome(lib, lambda lib, case=case: case())) for case in cases]


def _registration_errors(lib):
    layer = lib.nn.Linear(2, 2)
    calls = [lambda: layer.register_parameter("in_features", None), lambda: layer.register_parameter("a.b", None),
             lambda: layer.register_parameter("", None), lambda: layer.register_parameter(3, None),
             lambda: layer.register_parameter("x", lib.zeros(1)),
             lambda: layer.register_parameter("y", lib.nn.Parameter(lib.ones(1)) * 2),
             lambda: layer.register_buffer("in_features", None), lambda: layer.register_buffer("a.b", None),
             lambda: layer.register_buffer("", None), lambda: layer.register_buffer(3, None),
             lambda: layer.register_buffer("z", 3), lambda: layer.register_buffer("weight", lib.zeros(1)),
             lambda: layer.register_parameter("weight", None), lambda: layer.register_module("a.b", None),
             lambda: layer.register_module("", None), lambda: layer.register_module(3, None),
             lambda: layer.register_module("w", 3), lambda: layer.register_module("weight", lib.nn.ReLU()),
             lambda: layer.register_module("in_features", lib.nn.ReLU()), lambda: layer.add_module("q", lib.nn.ReLU())]
    return [_outcome(lib, lambda lib, call=call: call()) for call in calls]


def _assignment_before_init(lib):
    def make(body):
        class Early(lib.nn.Module):
            def __init__(self):
                body(self)

        return _outcome(lib, lambda lib: Early())

    return [make(lambda self: setattr(self, "p", lib.nn.Parameter(lib.zeros(1)))),
            make(lambda self: setattr(self, "m", lib.nn.Linear(1, 1))),
            make(lambda self: self.register_buffer("b", lib.zeros(1))),
            make(lambda self: self.register_parameter("p", None)),
            make(lambda self: setattr(self, "b", lib.nn.Buffer(lib.zeros(1))))]


@pytest.mark.parametrize("case", [_assignment_outcomes, _registration_errors, _assignment_before_init],
                         ids=lambda case: case.__name__.strip("_"))
def test_assignment_and_registration_match_torch(case):
    _same_as_torch(case)


# ---------------------------------------------------------------------------- modes, dtypes and devices

def _train_and_eval_propagate(lib):
    model = lib.nn.Sequential(lib.nn.Linear(2, 2), lib.nn.Sequential(lib.nn.Dropout()))
    first = model.train(False)
    after_train_false = [m.training for m in model.modules()]
    model[1].train()
    after_inner_train = [m.training for m in model.modules()]
    second = model.eval()
    return first is model, second is model, after_train_false, after_inner_train, [m.training for m in model.modules()]


def _train_mode_must_be_a_bool(lib):
    return [_outcome(lib, lambda lib, mode=mode: lib.nn.Linear(2, 2).train(mode)) for mode in (1, None, "yes")]


def _zero_grad_sets_none_by_default(lib):
    layer = lib.nn.Linear(2, 2)
    before = [p.grad for p in layer.parameters()]
    layer(lib.ones(1, 2)).sum().backward()
    layer.zero_grad()
    cleared = layer.weight.grad
    layer(lib.ones(1, 2)).sum().backward()
    layer.zero_grad(set_to_none=False)
    return before, cleared, layer.weight.grad.tolist(), layer.weight.grad.requires_grad


def _requires_grad_toggles_parameters_only(lib):
    model = lib.nn.Sequential(lib.nn.Linear(2, 2), lib.nn.BatchNorm1d(2))
    result = model.requires_grad_(False)
    frozen = [p.requires_grad for p in model.parameters()] + [b.requires_grad for b in model.buffers()]
    model.requires_grad_()
    return result is model, frozen, [p.requires_grad for p in model.parameters()]


def _to_dtype_moves_floating_tensors_only(lib):
    layer = lib.nn.BatchNorm1d(2)
    layer.register_buffer("ints", lib.ones(2, dtype=lib.int32))
    layer.register_buffer("complex", lib.ones(2, dtype=lib.complex64))
    layer.to(lib.float64)
    return [(n, str(t.dtype)) for n, t in layer.state_dict().items()]


def _to_an_integer_dtype(lib):
    return [_outcome(lib, lambda lib: lib.nn.Linear(2, 2).to(lib.int64)),
            _outcome(lib, lambda lib: lib.nn.Linear(1, 1).to("cpu", lib.int32))]


def _casts_keep_integer_buffers(lib):
    layer = lib.nn.BatchNorm1d(2)
    layer.register_buffer("ints", lib.ones(2, dtype=lib.int32))
    out = []
    for cast in ("half", "bfloat16", "double", "float"):
        result = getattr(layer, cast)()
        out.append((result is layer, [str(t.dtype) for t in layer.state_dict().values()]))
    layer.type(lib.float64)
    out.append([str(t.dtype) for t in layer.state_dict().values()])
    return out


def _casts_move_gradients_too(lib):
    layer = lib.nn.Linear(2, 2)
    layer(lib.ones(1, 2)).sum().backward()
    layer.double()
    return str(layer.weight.dtype), str(layer.weight.grad.dtype), isinstance(layer.weight, lib.nn.Parameter)


def _to_empty(lib):
    layer = lib.nn.Linear(2, 2)
    layer(lib.ones(1, 2)).sum().backward()
    result = layer.to_empty(device="cpu")
    model = lib.nn.Sequential(lib.nn.Linear(2, 2))
    model.register_buffer("b", lib.ones(2))
    model.to_empty(device=lib.device("cpu"), recurse=False)
    return (result is layer, str(layer.weight.device), isinstance(layer.weight, lib.nn.Parameter),
            tuple(layer.weight.shape), layer.weight.requires_grad, layer.weight.grad is None, str(model.b.device),
            _outcome(lib, lambda lib: layer.to_empty("cpu")))


MODE_CASES = [_train_and_eval_propagate, _train_mode_must_be_a_bool, _zero_grad_sets_none_by_default,
              _requires_grad_toggles_parameters_only, _to_dtype_moves_floating_tensors_only, _to_an_integer_dtype,
              _casts_keep_integer_buffers, _casts_move_gradients_too, _to_empty]


@pytest.mark.parametrize("case", MODE_CASES, ids=lambda case: case.__name__.strip("_"))
def test_modes_dtypes_and_devices_match_torch(case):
    _same_as_torch(case)


# ---------------------------------------------------------------------------- copies, pickles, calls

def _deepcopy(lib):
    model = lib.nn.Sequential(lib.nn.Linear(2, 2), lib.nn.Linear(2, 2))
    model[1].weight = model[0].weight
    calls = []
    model.register_forward_hook(lambda module, args, output: calls.append(1))
    model.register_buffer("b", lib.zeros(1), persistent=False)
    model(lib.ones(1, 2)).sum().backward()
    model.eval()
    twin = copy.deepcopy(model)
    twin(lib.ones(1, 2))
    return (twin[0].weight is not model[0].weight, twin[1].weight is twin[0].weight, len(twin._forward_hooks), calls,
            list(twin.state_dict()), sorted(twin._non_persistent_buffers_set),
            isinstance(twin[0].weight, lib.nn.Parameter), twin[0].weight.requires_grad,
            [m.training for m in twin.modules()], twin[0].weight.grad is not model[0].weight.grad,
            twin[0].weight.grad.tolist() == model[0].weight.grad.tolist())


def _pickle_round_trip(lib):
    model = lib.nn.Sequential(lib.nn.Linear(2, 2), lib.nn.BatchNorm1d(2))
    model[1].weight = model[0].bias
    model.eval()
    back = pickle.loads(pickle.dumps(model))
    return (repr(back), back[1].weight is back[0].bias, back.training, list(back.state_dict()),
            all(bool((a == b).all()) for a, b in zip(back.state_dict().values(), model.state_dict().values())))


def _parameters_to_vector_and_back(lib):
    layer = lib.nn.Linear(3, 2)
    with lib.no_grad():
        for i, p in enumerate(layer.parameters()):
            p.copy_(lib.arange(p.numel(), dtype=lib.float32).reshape(p.shape) + i)
    vector = lib.nn.utils.parameters_to_vector(layer.parameters())
    longer = lib.cat([vector.detach() * 2, lib.zeros(3)])
    lib.nn.utils.vector_to_parameters(longer, layer.parameters())  # the parameters become views of it
    longer[0] = 100.0
    return (vector.tolist(), vector.requires_grad, [p.tolist() for p in layer.parameters()],
            isinstance(layer.weight, lib.nn.Parameter), layer.weight.requires_grad, layer.weight.is_leaf,
            _outcome(lib, lambda lib: lib.nn.utils.vector_to_parameters([1.0], lib.nn.Linear(1, 1).parameters())),
            _outcome(lib, lambda lib: lib.nn.utils.vector_to_parameters(lib.zeros(1),
                                                                        lib.nn.Linear(2, 1).parameters())),
            _outcome(lib, lambda lib: lib.nn.utils.parameters_to_vector([lib.nn.Linear(2, 3).weight.t()])))


def _call_passes_keywords_to_forward(lib):
    class Scale(lib.nn.Module):
        def forward(self, x, *, scale=1.0, **extra):
            return x * scale, sorted(extra)

    class Plain(lib.nn.Module):
        def forward(self, x, scale=1.0):
            return x * scale

    plain = Plain()
    plain.register_forward_pre_hook(lambda module, args, kwargs: (args, {"scale": kwargs["scale"] * 2}),
                                    with_kwargs=True)
    y, extra = Scale()(lib.ones(1), scale=3.0, a=1)
    return (y.tolist(), extra, plain(lib.ones(1), scale=3.0).tolist(), callable(lib.nn.Module.compile),
            _outcome(lib, lambda lib: lib.nn.Module()(1)))


COPY_CASES = [_deepcopy, _pickle_round_trip, _parameters_to_vector_and_back, _call_passes_keywords_to_forward]


@pytest.mark.parametrize("case", COPY_CASES, ids=lambda case: case.__name__.strip("_"))
def test_copies_pickles_and_calls_match_torch(case):
    _same_as_torch(case)


def test_whole_module_checkpoints_are_refused_with_the_state_dict_route():
    """torch.save pickles a whole module and torch.load(weights_only=False) runs that pickle; tilewise's checkpoints
    never hold code (see [Note: which format] in serialization.py), so saving a module says to save its state dict,
    and the state dict round trip gives the same module back."""
    model = tw.nn.Sequential(tw.nn.Linear(2, 2), tw.nn.ReLU())
    with pytest.raises(TypeError, match=r"Save its state_dict\(\)"):
        tw.save(model, io.BytesIO())
    buffer = io.BytesIO()
    tw.save(model.state_dict(), buffer)
    buffer.seek(0)
    twin = tw.nn.Sequential(tw.nn.Linear(2, 2), tw.nn.ReLU())
    assert repr(twin.load_state_dict(tw.load(buffer, weights_only=False))) == "<All keys matched successfully>"
    assert all(bool((a == b).all()) for a, b in zip(twin.state_dict().values(), model.state_dict().values()))


def test_module_has_torchs_public_methods_and_flags():
    """All of torch.nn.Module's public names but the deprecated non-full ``register_backward_hook`` and the
    ipu/mtia/xpu device moves; ``share_memory`` reaches the tensors' own (refused on tilewise's storages)."""
    missing = {n for n in dir(torch.nn.Module) if not n.startswith("_") and not hasattr(tw.nn.Module, n)}
    assert missing <= {"T_destination", "register_backward_hook", "ipu", "mtia", "xpu"}
    assert tw.nn.Module.call_super_init is torch.nn.Module.call_super_init is False
    assert tw.nn.Module.dump_patches is torch.nn.Module.dump_patches is False
    with pytest.raises(NotImplementedError, match="share_memory_"):
        tw.nn.Linear(2, 2).share_memory()

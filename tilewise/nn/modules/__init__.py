"""The layers of tilewise.nn, one module per family (as torch.nn.modules)."""

from tilewise.nn.modules.activation import (
    CELU,
    ELU,
    GELU,
    GLU,
    SELU,
    Hardshrink,
    Hardsigmoid,
    Hardswish,
    Hardtanh,
    LeakyReLU,
    LogSigmoid,
    LogSoftmax,
    Mish,
    PReLU,
    ReLU,
    ReLU6,
    RReLU,
    Sigmoid,
    SiLU,
    Softmax,
    Softmax2d,
    Softmin,
    Softplus,
    Softshrink,
    Softsign,
    Tanh,
    Tanhshrink,
    Threshold,
)
from tilewise.nn.modules.adaptive import AdaptiveLogSoftmaxWithLoss
from tilewise.nn.modules.channelshuffle import ChannelShuffle
from tilewise.nn.modules.container import ModuleDict, ModuleList, ParameterDict, ParameterList, Sequential
from tilewise.nn.modules.conv import Conv1d, Conv2d
from tilewise.nn.modules.distance import CosineSimilarity, PairwiseDistance
from tilewise.nn.modules.dropout import AlphaDropout, Dropout, Dropout1d, Dropout2d, Dropout3d, FeatureAlphaDropout
from tilewise.nn.modules.linear import Bilinear, Flatten, Identity, Linear, Unflatten
from tilewise.nn.modules.linear_cross_entropy import LinearCrossEntropyLoss, LinearCrossEntropyOptions
from tilewise.nn.modules.local_response import CrossMapLRN2d, LocalResponseNorm
from tilewise.nn.modules.loss import (
    BCELoss,
    BCEWithLogitsLoss,
    CosineEmbeddingLoss,
    CrossEntropyLoss,
    CTCLoss,
    GaussianNLLLoss,
    HingeEmbeddingLoss,
    HuberLoss,
    KLDivLoss,
    L1Loss,
    MarginRankingLoss,
    MSELoss,
    MultiLabelMarginLoss,
    MultiLabelSoftMarginLoss,
    MultiMarginLoss,
    NLLLoss,
    NLLLoss2d,
    PoissonNLLLoss,
    SmoothL1Loss,
    SoftMarginLoss,
    TripletMarginLoss,
    TripletMarginWithDistanceLoss,
)
from tilewise.nn.modules.module import Module
from tilewise.nn.modules.normalization import (
    BatchNorm1d,
    BatchNorm2d,
    BatchNorm3d,
    GroupNorm,
    InstanceNorm1d,
    InstanceNorm2d,
    InstanceNorm3d,
    LayerNorm,
    RMSNorm,
)
from tilewise.nn.modules.padding import ZeroPad2d
from tilewise.nn.modules.pooling import AdaptiveAvgPool2d, AvgPool2d, MaxPool2d
from tilewise.nn.modules.sparse import Embedding, EmbeddingBag
from tilewise.nn.modules.transformer import MultiheadAttention, TransformerEncoder, TransformerEncoderLayer

__all__ = [
    "Module", "Sequential", "ModuleList", "ModuleDict", "ParameterList", "ParameterDict",
    "Identity", "Linear", "Bilinear", "Flatten", "Unflatten", "Embedding",
    "LayerNorm", "RMSNorm", "GroupNorm", "BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "InstanceNorm1d",
    "InstanceNorm2d", "InstanceNorm3d", "Dropout", "Dropout1d", "Dropout2d", "Dropout3d",
    "Conv1d", "Conv2d", "MaxPool2d", "AvgPool2d", "AdaptiveAvgPool2d", "ZeroPad2d", "CosineSimilarity",
    "MultiheadAttention", "TransformerEncoderLayer", "TransformerEncoder",
    "ReLU", "ReLU6", "LeakyReLU", "PReLU", "GELU", "SiLU", "Mish", "Softplus", "Hardswish", "Hardsigmoid",
    "Hardtanh", "ELU", "SELU", "CELU", "Softsign", "LogSigmoid", "Sigmoid", "Tanh", "Threshold", "Softmax",
    "LogSoftmax", "Softmin", "Softmax2d", "Tanhshrink", "Hardshrink", "Softshrink", "GLU",
    "MSELoss", "L1Loss", "SmoothL1Loss", "HuberLoss", "NLLLoss", "CrossEntropyLoss", "KLDivLoss", "BCELoss",
    "BCEWithLogitsLoss",
    "CosineEmbeddingLoss", "HingeEmbeddingLoss", "MarginRankingLoss", "SoftMarginLoss", "MultiMarginLoss",
    "MultiLabelMarginLoss", "MultiLabelSoftMarginLoss", "PoissonNLLLoss", "GaussianNLLLoss", "TripletMarginLoss",
    "TripletMarginWithDistanceLoss", "CTCLoss", "NLLLoss2d", "AdaptiveLogSoftmaxWithLoss",
    "RReLU", "AlphaDropout", "FeatureAlphaDropout", "PairwiseDistance", "EmbeddingBag", "LocalResponseNorm",
    "CrossMapLRN2d", "ChannelShuffle", "LinearCrossEntropyLoss", "LinearCrossEntropyOptions",
]

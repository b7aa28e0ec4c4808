"""Bad input to convolution, pooling, resampling and normalisation layers raises what torch raises: each case runs
the same call on torch and on tilewise and compares the exception type and a key phrase of the message.

A case's phrase is one regular expression both messages must match; where torch's CPU wording names things its own
way (ScalarType names, a kernel's internal name) the case gives torch's phrase and tilewise's apart. The same table
runs with tilewise's tensors on CUDA (``@pytest.mark.cuda``), against torch's CPU errors, so every device refuses
the same input the same way. Input and weight on different devices are checked last: the message must name both.
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass

import pytest
import torch

import tilewise as tw
from tilewise.device import Device
from tilewise.tensor import Tensor


@dataclass
class Lib:
    """One framework on one device: ``t(*shape)`` makes a tensor of ones there; ``nn`` and ``F`` are its layers."""

    module: object
    device: str

    @property
    def nn(self):
        return self.module.nn

    @property
    def F(self):  # noqa: N802 — torch's spelling
        return self.module.nn.functional

    def t(self, *shape, dtype="float32"):
        return self.module.ones(*shape, dtype=getattr(self.module, dtype)).to(self.device)

    def module_on_device(self, layer):
        return layer.to(self.device)


# name: (call, phrase) or (call, (torch phrase, tilewise phrase)); m is a Lib
CASES = {
    # ---------------------------------------------------------------- convolution: channels and groups
    "conv1d-channels": (lambda m: m.F.conv1d(m.t(1, 3, 5), m.t(4, 4, 3)),
                        r"weight of size \[4, 4, 3\], expected input\[1, 3, 5\] to have 4 channels"),
    "conv2d-channels": (lambda m: m.F.conv2d(m.t(1, 3, 5, 5), m.t(4, 4, 3, 3)),
                        r"expected input\[1, 3, 5, 5\] to have 4 channels, but got 3 channels"),
    "conv3d-channels": (lambda m: m.F.conv3d(m.t(1, 3, 5, 5, 5), m.t(4, 4, 3, 3, 3)),
                        r"expected input\[1, 3, 5, 5, 5\] to have 4 channels"),
    "conv2d-unbatched-channels": (lambda m: m.F.conv2d(m.t(3, 5, 5), m.t(4, 4, 3, 3)),
                                  r"expected input\[1, 3, 5, 5\] to have 4 channels"),
    "conv_transpose2d-channels": (lambda m: m.F.conv_transpose2d(m.t(1, 3, 4, 4), m.t(2, 3, 3, 3)),
                                  r"Given transposed=1, weight of size \[2, 3, 3, 3\], expected input\[1, 3, 4, 4\] "
                                  r"to have 2 channels"),
    "conv2d-groups-in-channels": (lambda m: m.F.conv2d(m.t(1, 3, 5, 5), m.t(4, 1, 3, 3), groups=2),
                                  r"Given groups=2, weight of size \[4, 1, 3, 3\], expected input\[1, 3, 5, 5\] to "
                                  r"have 2 channels"),
    "conv2d-groups-out-channels": (lambda m: m.F.conv2d(m.t(1, 4, 5, 5), m.t(3, 2, 3, 3), groups=2),
                                   r"Given groups=2, expected weight to be divisible by 2 at dimension 0"),
    "conv_transpose2d-groups": (lambda m: m.F.conv_transpose2d(m.t(1, 3, 4, 4), m.t(3, 3, 3, 3), groups=2),
                                r"expected weight to be divisible by 2 at dimension 0"),
    "conv2d-no-output-channels": (lambda m: m.F.conv2d(m.t(1, 4, 5, 5), m.t(0, 4, 3, 3)),
                                  r"expected weight to be at least 1 at dimension 0"),
    "conv2d-groups-0": (lambda m: m.F.conv2d(m.t(1, 4, 5, 5), m.t(4, 4, 3, 3), groups=0),
                        r"non-positive groups is not supported"),
    "conv1d-groups-negative": (lambda m: m.F.conv1d(m.t(1, 4, 5), m.t(4, 4, 3), groups=-2),
                               r"non-positive groups is not supported"),
    "conv_transpose2d-groups-0": (lambda m: m.F.conv_transpose2d(m.t(1, 2, 4, 4), m.t(2, 3, 3, 3), groups=0),
                                  r"non-positive groups is not supported"),
    # ---------------------------------------------------------------- convolution: geometry
    "conv1d-kernel-too-large": (lambda m: m.F.conv1d(m.t(1, 3, 2), m.t(4, 3, 3)),
                                r"padded input size per channel: \(2\)\. Kernel size: \(3\)\. Kernel size can't be "
                                r"greater than actual input size"),
    "conv2d-kernel-too-large": (lambda m: m.F.conv2d(m.t(1, 3, 2, 2), m.t(4, 3, 3, 3)),
                                r"\(2 x 2\)\. Kernel size: \(3 x 3\)\. Kernel size can't be greater"),
    "conv2d-dilated-kernel-too-large": (lambda m: m.F.conv2d(m.t(1, 3, 4, 4), m.t(4, 3, 3, 3), dilation=2),
                                        r"\(4 x 4\)\. Kernel size: \(5 x 5\)"),
    "conv3d-kernel-too-large": (lambda m: m.F.conv3d(m.t(1, 2, 2, 2, 2), m.t(2, 2, 3, 3, 3)),
                                r"Kernel size can't be greater than actual input size"),
    "conv2d-stride-0": (lambda m: m.F.conv2d(m.t(1, 4, 5, 5), m.t(4, 4, 3, 3), stride=0),
                        r"non-positive stride is not supported"),
    "conv2d-stride-negative": (lambda m: m.F.conv2d(m.t(1, 4, 5, 5), m.t(4, 4, 3, 3), stride=(1, -1)),
                               r"non-positive stride is not supported"),
    "conv_transpose1d-stride-0": (lambda m: m.F.conv_transpose1d(m.t(1, 2, 4), m.t(2, 3, 3), stride=0),
                                  r"non-positive stride is not supported"),
    "conv2d-dilation-0": (lambda m: m.F.conv2d(m.t(1, 4, 5, 5), m.t(4, 4, 3, 3), dilation=0),
                          r"dilation should be greater than zero"),
    "conv_transpose2d-dilation-0": (lambda m: m.F.conv_transpose2d(m.t(1, 2, 4, 4), m.t(2, 3, 3, 3), dilation=0),
                                    r"dilation should be greater than zero"),
    "conv2d-padding-negative": (lambda m: m.F.conv2d(m.t(1, 4, 5, 5), m.t(4, 4, 3, 3), padding=-1),
                                r"negative padding is not supported"),
    "conv2d-same-strided": (lambda m: m.F.conv2d(m.t(1, 4, 5, 5), m.t(2, 4, 3, 3), stride=2, padding="same"),
                            r"padding='same' is not supported for strided convolutions"),
    "conv2d-padding-string": (lambda m: m.F.conv2d(m.t(1, 4, 5, 5), m.t(2, 4, 3, 3), padding="full"),
                              r"Invalid padding string: 'full'"),
    "conv_transpose1d-output-padding": (lambda m: m.F.conv_transpose1d(m.t(1, 2, 4), m.t(2, 3, 3), output_padding=1),
                                        r"output padding must be smaller than either stride or dilation"),
    "conv_transpose2d-output-padding": (lambda m: m.F.conv_transpose2d(m.t(1, 2, 4, 4), m.t(2, 3, 3, 3), stride=2,
                                                                       output_padding=2),
                                        r"output padding must be smaller than either stride or dilation"),
    "conv_transpose3d-output-padding": (lambda m: m.F.conv_transpose3d(m.t(1, 2, 3, 3, 3), m.t(2, 3, 2, 2, 2),
                                                                       output_padding=(0, 1, 0)),
                                        r"output padding must be smaller than either stride or dilation"),
    "conv_transpose2d-output-too-small": (lambda m: m.F.conv_transpose2d(m.t(1, 2, 1, 1), m.t(2, 3, 1, 1), padding=1),
                                          r"Given input size per channel: \(1 x 1\)\. Calculated output size per "
                                          r"channel: \(-1 x -1\)\. Output size is too small"),
    # ---------------------------------------------------------------- convolution: ranks, bias, dtypes
    "conv1d-rank": (lambda m: m.F.conv1d(m.t(1, 4, 5, 5), m.t(4, 4, 3)),
                    r"Expected 2D \(unbatched\) or 3D \(batched\) input to conv1d, but got input of size: "
                    r"\[1, 4, 5, 5\]"),
    "conv2d-rank-low": (lambda m: m.F.conv2d(m.t(4, 5), m.t(4, 4, 3, 3)),
                        r"Expected 3D \(unbatched\) or 4D \(batched\) input to conv2d"),
    "conv2d-rank-high": (lambda m: m.F.conv2d(m.t(1, 1, 4, 5, 5), m.t(4, 4, 3, 3)),
                         r"Expected 3D \(unbatched\) or 4D \(batched\) input to conv2d"),
    "conv3d-rank": (lambda m: m.F.conv3d(m.t(4, 5, 5), m.t(4, 4, 3, 3, 3)),
                    r"Expected 4D \(unbatched\) or 5D \(batched\) input to conv3d"),
    "conv_transpose2d-rank": (lambda m: m.F.conv_transpose2d(m.t(2, 4), m.t(2, 3, 3, 3)),
                              r"Expected 3D \(unbatched\) or 4D \(batched\) input to conv_transpose2d"),
    "conv2d-weight-rank": (lambda m: m.F.conv2d(m.t(1, 4, 5, 5), m.t(4, 4, 3)),
                           (r"expected stride to be a single integer value or a list of 1 values",
                            r"Expected 4-dimensional weight")),
    "conv2d-bias-size": (lambda m: m.F.conv2d(m.t(1, 4, 5, 5), m.t(2, 4, 3, 3), m.t(3)),
                         r"Given weight of size \[2, 4, 3, 3\], expected bias to be 1-dimensional with 2 elements, "
                         r"but got bias of size \[3\]"),
    "conv2d-bias-rank": (lambda m: m.F.conv2d(m.t(1, 4, 5, 5), m.t(2, 4, 3, 3), m.t(1, 2)),
                         r"expected bias to be 1-dimensional with 2 elements, but got bias of size \[1, 2\]"),
    "conv_transpose2d-bias-size": (lambda m: m.F.conv_transpose2d(m.t(1, 2, 4, 4), m.t(2, 3, 3, 3), m.t(2)),
                                   r"Given transposed=1, weight of size \[2, 3, 3, 3\], expected bias to be "
                                   r"1-dimensional with 3 elements"),
    "conv2d-weight-dtype": (lambda m: m.F.conv2d(m.t(1, 4, 5, 5), m.t(2, 4, 3, 3, dtype="float64")),
                            (r"expected scalar type Float but found Double",
                             r"Input type \(tilewise\.float32\) and weight type \(tilewise\.float64\) should be the "
                             r"same")),
    "conv2d-bias-dtype": (lambda m: m.F.conv2d(m.t(1, 4, 5, 5), m.t(2, 4, 3, 3), m.t(2, dtype="float64")),
                          r"Input type \(.*float.*\) and bias type \(.*(double|float64)\) should be the same"),
    "conv_transpose1d-weight-dtype": (lambda m: m.F.conv_transpose1d(m.t(1, 2, 4), m.t(2, 3, 3, dtype="float64")),
                                      (r"expected scalar type Float but found Double",
                                       r"weight type \(tilewise\.float64\) should be the same")),
    # ---------------------------------------------------------------- convolution modules
    "Conv2d-groups-0": (lambda m: m.nn.Conv2d(4, 4, 3, groups=0), r"groups must be a positive integer"),
    "Conv2d-in-channels-groups": (lambda m: m.nn.Conv2d(3, 4, 3, groups=2), r"in_channels must be divisible by groups"),
    "Conv2d-out-channels-groups": (lambda m: m.nn.Conv2d(4, 3, 3, groups=2),
                                   r"out_channels must be divisible by groups"),
    "Conv2d-padding-mode": (lambda m: m.nn.Conv2d(4, 4, 3, padding_mode="foo"),
                            r"padding_mode must be one of \{.*'circular'.*\}, but got padding_mode='foo'"),
    "Conv2d-padding-string": (lambda m: m.nn.Conv2d(4, 4, 3, padding="foo"), r"Invalid padding string 'foo'"),
    "Conv1d-same-strided": (lambda m: m.nn.Conv1d(4, 4, 3, padding="same", stride=2),
                            r"padding='same' is not supported for strided convolutions"),
    "ConvTranspose2d-padding-mode": (lambda m: m.nn.ConvTranspose2d(4, 4, 3, padding_mode="reflect"),
                                     r'Only "zeros" padding mode is supported for ConvTranspose2d'),
    "ConvTranspose2d-output-size": (lambda m: m.module_on_device(m.nn.ConvTranspose2d(4, 4, 3, stride=2))(
        m.t(1, 4, 3, 3), output_size=(10, 10)), r"requested an output size of .10, 10., but valid sizes range from "
                                                r"\[7, 7\] to \[8, 8\]"),
    "ConvTranspose1d-output-size-length": (lambda m: m.module_on_device(m.nn.ConvTranspose1d(4, 4, 3, stride=2))(
        m.t(1, 4, 3), output_size=(7, 7)), r"ConvTranspose1D: for 3D input, output_size must have 1 or 3 elements"),
    "Conv2d-reflect-padding-too-large": (lambda m: m.module_on_device(m.nn.Conv2d(2, 2, 3, padding=3,
                                                                                  padding_mode="reflect"))(
        m.t(1, 2, 3, 3)), r"padding \(3, 3\) at dimension 3 of input \[1, 2, 3, 3\]"),
    "Conv1d-circular-padding-too-large": (lambda m: m.module_on_device(m.nn.Conv1d(2, 2, 3, padding=4,
                                                                                   padding_mode="circular"))(
        m.t(1, 2, 3)), r"^Padding value causes wrapping around more than once"),
    # ---------------------------------------------------------------- pooling
    "max_pool1d-kernel-too-large": (lambda m: m.F.max_pool1d(m.t(1, 2, 3), 4),
                                    r"(Invalid computed output size: 0|Output size is too small)"),
    "max_pool2d-kernel-too-large": (lambda m: m.F.max_pool2d(m.t(1, 2, 3, 3), 4),
                                    r"Given input size: \(2x3x3\)\. Calculated output size: \(2x0x0\)\. Output size "
                                    r"is too small"),
    "max_pool3d-kernel-too-large": (lambda m: m.F.max_pool3d(m.t(1, 1, 3, 3, 3), 4), r"Output size is too small"),
    "avg_pool1d-kernel-too-large": (lambda m: m.F.avg_pool1d(m.t(1, 2, 3), 4), r"Output size is too small"),
    "avg_pool2d-kernel-too-large": (lambda m: m.F.avg_pool2d(m.t(1, 2, 3, 3), 4), r"Output size is too small"),
    "avg_pool3d-kernel-too-large": (lambda m: m.F.avg_pool3d(m.t(1, 1, 3, 3, 3), 4),
                                    r"input image \(T: 3 H: 3 W: 3\) smaller than kernel size \(kT: 4 kH: 4 kW: 4\)"),
    "avg_pool3d-kernel-over-unpadded-input": (lambda m: m.F.avg_pool3d(m.t(1, 2, 2, 2, 6), (3, 2, 2), 2, 1),
                                              r"input image \(T: 2 H: 2 W: 6\) smaller than kernel size"),
    "MaxPool2d-kernel-too-large": (lambda m: m.nn.MaxPool2d(4)(m.t(1, 2, 3, 3)), r"Output size is too small"),
    "max_pool2d-padding-over-half": (lambda m: m.F.max_pool2d(m.t(1, 2, 6, 6), 2, padding=2),
                                     r"pad should be at most half of effective kernel size, but got pad=2, "
                                     r"kernel_size=2 and dilation=1"),
    "avg_pool3d-padding-over-half": (lambda m: m.F.avg_pool3d(m.t(1, 2, 6, 6, 6), 2, padding=2),
                                     r"pad should be at most half of effective kernel size"),
    "max_pool2d-stride-0": (lambda m: m.F.max_pool2d(m.t(1, 2, 6, 6), 2, stride=0), r"stride should not be zero"),
    "max_pool2d-kernel-0": (lambda m: m.F.max_pool2d(m.t(1, 2, 6, 6), 0, 1),
                            r"kernel size should be greater than zero"),
    "avg_pool2d-stride-negative": (lambda m: m.F.avg_pool2d(m.t(1, 2, 6, 6), 2, -1),
                                   r"stride should be greater than zero"),
    "max_pool3d-dilation-0": (lambda m: m.F.max_pool3d(m.t(1, 2, 6, 6, 6), 2, 1, dilation=0),
                              r"dilation should be greater than zero"),
    "avg_pool2d-padding-negative": (lambda m: m.F.avg_pool2d(m.t(1, 2, 6, 6), 2, 1, padding=-1),
                                    r"pad must be non-negative"),
    "avg_pool2d-divisor-0": (lambda m: m.F.avg_pool2d(m.t(1, 2, 6, 6), 2, divisor_override=0),
                             r"divisor must be not zero"),
    "avg_pool2d-int32": (lambda m: m.F.avg_pool2d(m.t(1, 2, 6, 6, dtype="int32"), 2), r"not implemented for"),
    "max_pool2d-rank": (lambda m: m.F.max_pool2d(m.t(6, 6), 2), r"(3D or 4D|3D \(unbatched\) or 4D \(batched\))"),
    "adaptive_avg_pool2d-rank": (lambda m: m.F.adaptive_avg_pool2d(m.t(3, 3), 2), r"adaptive_avg_pool2d.*\[3, 3\]"),
    "adaptive_avg_pool2d-none-rank": (lambda m: m.nn.AdaptiveAvgPool2d((None, 2))(m.t(4)),
                                      r"Input dimension should be at least 3"),
    "adaptive_max_pool2d-none-rank": (lambda m: m.F.adaptive_max_pool2d(m.t(4), (None, 2)),
                                      r"Input dimension should be at least 3"),
    "adaptive_avg_pool2d-output-length": (lambda m: m.F.adaptive_avg_pool2d(m.t(1, 2, 3, 3), (1, 2, 3)),
                                          r"adaptive_avg_pool2d: output_size must be 2"),
    "adaptive_max_pool2d-empty": (lambda m: m.F.adaptive_max_pool2d(m.t(1, 3, 0, 4), 5),
                                  r"non-zero size for non-batch dimensions"),
    # ---------------------------------------------------------------- interpolate
    "interpolate-size-and-scale": (lambda m: m.F.interpolate(m.t(1, 2, 4, 4), size=3, scale_factor=2),
                                   r"only one of size or scale_factor should be defined"),
    "Upsample-size-and-scale": (lambda m: m.nn.Upsample(size=3, scale_factor=2)(m.t(1, 2, 3, 3)),
                                r"only one of size or scale_factor should be defined"),
    "interpolate-neither": (lambda m: m.F.interpolate(m.t(1, 2, 4, 4)),
                            r"either size or scale_factor should be defined"),
    "interpolate-size-length": (lambda m: m.F.interpolate(m.t(1, 2, 4, 4), size=(3, 3, 3)),
                                r"Input and output must have the same number of spatial dimensions"),
    "interpolate-scale-length": (lambda m: m.F.interpolate(m.t(1, 2, 4, 4), scale_factor=(2, 2, 2)),
                                 r"Input and scale_factor must have the same number of spatial dimensions"),
    "interpolate-one-scale-of-two": (lambda m: m.F.interpolate(m.t(1, 2, 4, 4), scale_factor=(2.0,)),
                                     r"Input and scale_factor must have the same number of spatial dimensions"),
    "interpolate-recompute-with-size": (lambda m: m.F.interpolate(m.t(1, 2, 4, 4), size=3,
                                                                  recompute_scale_factor=True),
                                        r"recompute_scale_factor is not meaningful with an explicit size"),
    "interpolate-align-corners-nearest": (lambda m: m.F.interpolate(m.t(1, 2, 4, 4), size=3, align_corners=True),
                                          r"align_corners option can only be set with the interpolating modes"),
    "interpolate-antialias-nearest": (lambda m: m.F.interpolate(m.t(1, 2, 4, 4), size=3, antialias=True),
                                      r"Anti-alias option is restricted to bilinear, bicubic, and lanczos modes"),
    "interpolate-antialias-linear": (lambda m: m.F.interpolate(m.t(1, 2, 4), size=3, mode="linear", antialias=True),
                                     r"requires a 4-D tensor as input"),
    "interpolate-lanczos-align-corners": (lambda m: m.F.interpolate(m.t(1, 2, 4, 4), size=3, mode="lanczos",
                                                                    antialias=True, align_corners=True),
                                          r"Lanczos mode does not support align_corners=True"),
    "interpolate-lanczos-no-antialias": (lambda m: m.F.interpolate(m.t(1, 2, 4, 4), size=3, mode="lanczos"),
                                         r"Lanczos mode requires antialias=True"),
    "interpolate-trilinear-4d": (lambda m: m.F.interpolate(m.t(1, 2, 4, 4), size=3, mode="trilinear"),
                                 r"Got 4D input, but trilinear mode needs 5D input"),
    "UpsamplingBilinear2d-3d": (lambda m: m.nn.UpsamplingBilinear2d(size=3)(m.t(1, 2, 3)),
                                r"Got 3D input, but bilinear mode needs 4D input"),
    "interpolate-rank-2": (lambda m: m.F.interpolate(m.t(2, 4), size=3),
                           r"Only 3D, 4D and 5D input Tensors supported \(got 2D\)"),
    "interpolate-mode": (lambda m: m.F.interpolate(m.t(1, 2, 4), size=3, mode="foo"), r"\(got foo\)"),
    "interpolate-size-0": (lambda m: m.F.interpolate(m.t(1, 2, 4, 4), size=0),
                           r"Input and output sizes should be greater than 0, but got input \(H: 4, W: 4\)"),
    "interpolate-empty-input": (lambda m: m.F.interpolate(m.t(1, 2, 0, 4), size=3),
                                r"Input and output sizes should be greater than 0"),
    # ---------------------------------------------------------------- sampling grids
    "grid_sample-grid-rank": (lambda m: m.F.grid_sample(m.t(1, 1, 3, 3), m.t(1, 2, 2), align_corners=False),
                              r"expected 4D input and grid with same number of dimensions"),
    "grid_sample-grid-last-dim": (lambda m: m.F.grid_sample(m.t(1, 1, 3, 3), m.t(1, 2, 2, 3), align_corners=False),
                                  r"expected grid to have size 2 in last dimension, but got grid with sizes "
                                  r"\[1, 2, 2, 3\]"),
    "grid_sample-5d-grid-last-dim": (lambda m: m.F.grid_sample(m.t(1, 1, 3, 3, 3), m.t(1, 2, 2, 2, 2),
                                                               align_corners=False),
                                     r"expected grid to have size 3 in last dimension"),
    "grid_sample-batch": (lambda m: m.F.grid_sample(m.t(1, 1, 3, 3), m.t(2, 2, 2, 2), align_corners=False),
                          r"expected grid and input to have same batch size"),
    "grid_sample-bicubic-5d": (lambda m: m.F.grid_sample(m.t(1, 1, 3, 3, 3), m.t(1, 2, 2, 2, 3), mode="bicubic",
                                                         align_corners=False),
                               r"bicubic interpolation only supports 4D input"),
    "grid_sample-empty-input": (lambda m: m.F.grid_sample(m.t(1, 1, 0, 3), m.t(1, 2, 2, 2), align_corners=False),
                                r"expected input to have non-empty spatial dimensions"),
    "grid_sample-mode": (lambda m: m.F.grid_sample(m.t(1, 1, 3, 3), m.t(1, 2, 2, 2), mode="foo"),
                         r"expected mode to be 'bilinear', 'nearest' or 'bicubic', but got: 'foo'"),
    "grid_sample-padding-mode": (lambda m: m.F.grid_sample(m.t(1, 1, 3, 3), m.t(1, 2, 2, 2), padding_mode="x"),
                                 r"expected padding_mode to be 'zeros', 'border', or 'reflection'"),
    "affine_grid-size-rank": (lambda m: m.F.affine_grid(m.t(1, 2, 3), (1, 1, 4), align_corners=False),
                              r"affine_grid only supports 4D and 5D sizes"),
    "affine_grid-theta-shape": (lambda m: m.F.affine_grid(m.t(1, 2, 3), (1, 1, 2, 4, 4), align_corners=False),
                                r"Expected a batch of 3D affine matrices of shape Nx3x4"),
    "affine_grid-batch": (lambda m: m.F.affine_grid(m.t(2, 2, 3), (1, 1, 4, 4), align_corners=False),
                          r"Expected size for first two dimensions of batch2 tensor to be: \[1, 3\] but got: \[2, 3\]"),
    "affine_grid-integer-theta": (lambda m: m.F.affine_grid(m.t(1, 2, 3, dtype="int64"), (1, 1, 4, 4),
                                                            align_corners=False),
                                  r"Expected theta to have floating point type"),
    # ---------------------------------------------------------------- shuffles, fold, normalisation
    "pixel_shuffle-channels": (lambda m: m.F.pixel_shuffle(m.t(1, 6, 2, 2), 2), r"pixel_shuffle expects .*divisible"),
    "pixel_shuffle-rank": (lambda m: m.F.pixel_shuffle(m.t(6, 2), 2),
                           r"pixel_shuffle expects input to have at least 3 dimensions"),
    "pixel_shuffle-factor-0": (lambda m: m.F.pixel_shuffle(m.t(1, 4, 2, 2), 0),
                               r"pixel_shuffle expects a positive upscale_factor, but got 0"),
    "pixel_unshuffle-factor-0": (lambda m: m.F.pixel_unshuffle(m.t(1, 1, 4, 4), 0),
                                 r"pixel_unshuffle expects a positive downscale_factor, but got 0"),
    "pixel_unshuffle-size": (lambda m: m.F.pixel_unshuffle(m.t(1, 1, 3, 4), 2),
                             r"pixel_unshuffle expects .*divisible by downscale_factor"),
    "unfold-kernel-too-large": (lambda m: m.F.unfold(m.t(1, 2, 3, 3), 4),
                                r"calculated shape of the array of sliding blocks as \(0, 0\), but its components must "
                                r"be at least one"),
    "fold-rank": (lambda m: m.nn.Fold((4, 4), 2)(m.t(2, 2, 4, 4)), r"Expected 2D or 3D \(batch mode\) tensor"),
    "fold-blocks": (lambda m: m.F.fold(m.t(1, 8, 5), (3, 3), 2), r"match the calculated number of sliding blocks"),
    "batch_norm-running-stats": (lambda m: m.F.batch_norm(m.t(2, 3, 4), m.t(4), m.t(4), training=True),
                                 r"running_mean should contain 3 elements"),
    "batch_norm-one-value": (lambda m: m.F.batch_norm(m.t(1, 3), m.t(3), m.t(3), training=True),
                             r"Expected more than 1 value per channel when training"),
    "BatchNorm2d-rank": (lambda m: m.nn.BatchNorm2d(3)(m.t(2, 3, 4)), r"expected 4D input"),
    "InstanceNorm1d-rank": (lambda m: m.nn.InstanceNorm1d(3)(m.t(1, 3, 4, 4)), r"expected 2D .*or 3D .*input"),
    "InstanceNorm1d-affine-features": (lambda m: m.module_on_device(m.nn.InstanceNorm1d(3, affine=True))(
        m.t(2, 4, 5)), r"expected input's size at dim=1 to match num_features \(3\), but got: 4"),
    "instance_norm-one-value": (lambda m: m.F.instance_norm(m.t(2, 3, 1)),
                                r"Expected more than 1 spatial element when training"),
    "group_norm-groups": (lambda m: m.F.group_norm(m.t(2, 6, 4), 4),
                          r"Expected number of channels in input to be divisible by num_groups"),
    "group_norm-weight": (lambda m: m.F.group_norm(m.t(2, 6, 4), 3, m.t(5)),
                          r"Expected weight to be a vector of size equal to the number of channels in input"),
    "group_norm-rank": (lambda m: m.F.group_norm(m.t(6), 3), r"Expected at least 2 dimensions for input tensor"),
    "GroupNorm-divisible": (lambda m: m.nn.GroupNorm(4, 6),
                            r"num_channels \(6\) must be divisible by num_groups \(4\)"),
}


def _raised(call, lib: Lib) -> BaseException | None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            call(lib)
        except Exception as exc:  # noqa: BLE001 — the exception is what is compared
            return exc
    return None


def _check_case(name: str, device: str) -> None:
    call, phrase = CASES[name]
    torch_phrase, tw_phrase = phrase if isinstance(phrase, tuple) else (phrase, phrase)
    expected = _raised(call, Lib(torch, "cpu"))
    assert expected is not None, f"{name}: torch accepts this call; the case is wrong"
    assert re.search(torch_phrase, str(expected)), f"{name}: torch says {expected!r}"
    actual = _raised(call, Lib(tw, device))
    assert actual is not None, f"{name}: tilewise accepts what torch refuses with {expected!r}"
    assert type(actual) is type(expected), f"{name}: tilewise raised {actual!r}, torch {expected!r}"
    assert re.search(tw_phrase, str(actual)), f"{name}: tilewise says {actual}, expected the gist {tw_phrase!r}"


@pytest.mark.parametrize("name", CASES)
def test_bad_input_raises_what_torch_raises(name):
    _check_case(name, "cpu")


@pytest.mark.cuda
@pytest.mark.parametrize("name", CASES)
def test_bad_input_raises_what_torch_raises_on_cuda(name):
    """On CUDA, tilewise raises what it raises on the CPU (which the test above holds to torch 2.13's errors; a
    GPU machine's torch may be another version, with other words)."""
    call, phrase = CASES[name]
    tw_phrase = phrase[1] if isinstance(phrase, tuple) else phrase
    expected = _raised(call, Lib(tw, "cpu"))
    actual = _raised(call, Lib(tw, "cuda"))
    assert actual is not None, f"{name}: tilewise on CUDA accepts what it refuses on the CPU with {expected!r}"
    assert type(actual) is type(expected), f"{name}: on CUDA {actual!r}, on the CPU {expected!r}"
    assert re.search(tw_phrase, str(actual)), f"{name}: tilewise on CUDA says {actual}, expected the gist {tw_phrase!r}"


# ---------------------------------------------------------------------------- devices

def _labelled_cuda(t: Tensor) -> Tensor:
    """The same storage labelled as a CUDA tensor: enough to reach the dispatcher's device check without a GPU."""
    return Tensor._make(t._storage, t._shape, t._strides, t._offset, t._dtype, Device("cuda"))


DEVICE_CASES = {
    "conv2d-cuda-input-cpu-weight": lambda cuda: tw.nn.functional.conv2d(cuda(tw.ones(1, 2, 4, 4)),
                                                                         tw.ones(3, 2, 3, 3)),
    "conv2d-cpu-input-cuda-weight": lambda cuda: tw.nn.functional.conv2d(tw.ones(1, 2, 4, 4),
                                                                         cuda(tw.ones(3, 2, 3, 3))),
    "conv1d-cuda-bias": lambda cuda: tw.nn.functional.conv1d(tw.ones(1, 2, 4), tw.ones(3, 2, 3), cuda(tw.ones(3))),
    "conv3d-cuda-input": lambda cuda: tw.nn.functional.conv3d(cuda(tw.ones(1, 2, 3, 3, 3)), tw.ones(3, 2, 2, 2, 2)),
    "conv_transpose2d-cuda-input": lambda cuda: tw.nn.functional.conv_transpose2d(cuda(tw.ones(1, 2, 4, 4)),
                                                                                  tw.ones(2, 3, 3, 3)),
    "Conv2d-cuda-input-cpu-module": lambda cuda: tw.nn.Conv2d(2, 3, 3)(cuda(tw.ones(1, 2, 4, 4))),
    "batch_norm-cuda-input": lambda cuda: tw.nn.functional.batch_norm(cuda(tw.ones(2, 3, 4)), tw.zeros(3), tw.ones(3)),
    "group_norm-cuda-input": lambda cuda: tw.nn.functional.group_norm(cuda(tw.ones(2, 4, 3)), 2, tw.ones(4)),
    "grid_sample-cuda-grid": lambda cuda: tw.nn.functional.grid_sample(tw.ones(1, 1, 3, 3), cuda(tw.ones(1, 2, 2, 2)),
                                                                       align_corners=False),
}


def _check_names_both_devices(call, cuda) -> None:
    with pytest.raises(RuntimeError) as raised:
        call(cuda)
    message = str(raised.value)
    assert "cuda:0" in message and "cpu" in message and "same device" in message, message


@pytest.mark.parametrize("name", DEVICE_CASES)
def test_input_and_weight_on_two_devices_names_both(name):
    _check_names_both_devices(DEVICE_CASES[name], _labelled_cuda)


@pytest.mark.cuda
@pytest.mark.parametrize("name", DEVICE_CASES)
def test_input_and_weight_on_two_devices_names_both_on_cuda(name):
    """With real CUDA tensors the error comes before any kernel runs (no crash, no illegal address), as torch's
    RuntimeError does."""
    _check_names_both_devices(DEVICE_CASES[name], lambda t: t.to("cuda"))

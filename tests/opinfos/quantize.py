"""Samples for fake quantisation (per tensor, with number or tensor qparams, and per channel with integer or float
zero points): values past the quantised range on both sides, so that the straight-through gradient is cut there."""

from __future__ import annotations

from opinfo import OpInfo, Sample, T


def _per_tensor():
    return [Sample((T((4, 5), "float", -3, 3), 0.02, 3, -128, 127)),
            Sample((T((4, 5), "float", -3, 3), 0.05, 0, 0, 40), name="narrow-range"),
            Sample((T((4, 5), "float", -3, 3), T((), "positive", 0.01, 0.03, grad=False, dtype="float32"),
                    T((), "int", -5, 5, grad=False, dtype="int32"), -128, 127), name="tensor-qparams")]


def _per_channel():
    return [Sample((T((4, 5), "float", -3, 3), T((5,), "positive", 0.01, 0.03, grad=False, dtype="float32"),
                    T((5,), "int", -5, 5, grad=False, dtype="int32"), 1, -128, 127)),
            Sample((T((3, 4, 2), "float", -3, 3), T((3,), "positive", 0.01, 0.03, grad=False, dtype="float32"),
                    T((3,), "float", -5, 5, grad=False, dtype="float32"), 0, -100, 100), name="float-zero-point")]


OPINFOS = [
    OpInfo("fake_quantize_per_tensor_affine", _per_tensor,
           covers=("fake_quantize_per_tensor_affine.tensor_qparams", "fake_quantize_per_tensor_affine_cachemask",
                   "_fake_quantize_per_tensor_affine_cachemask_tensor_qparams")),
    OpInfo("fake_quantize_per_channel_affine", _per_channel, covers=("fake_quantize_per_channel_affine_cachemask",)),
]

"""Fake quantisation: ``fake_quantize_per_tensor_affine`` and ``fake_quantize_per_channel_affine``, the rounding of
quantisation-aware training done in floating point.

[Note: fake quantisation] Each value is quantised and dequantised at once, as torch's CPU kernels do:
``q = zero_point + nearbyint(x * (1 / scale))`` with the reciprocal taken in float32 (the product in the input's
precision, float32 for the 16-bit types), ``(clamp(q, quant_min, quant_max) - zero_point) * scale`` in the input's
dtype. A float zero point (per channel only) is added before the rounding, ``nearbyint(x * (1 / scale) +
zero_point)``, as torch's float-zero-point kernel does. The last product is exact in float64 (a small integer times a
float32) and is rounded once to the output's dtype: float32 arithmetic rounds it once too for a float32 result and an
integer zero point, and is used there. The gradient is straight through: ``grad`` where ``q`` fell within
[quant_min, quant_max], zero elsewhere; the public operators are composites over private ones that return that mask
beside the result and carry the derivative, as torch's ``*_cachemask`` operators do. Scale and zero point get no
gradient (torch refuses them requiring one). A NaN quantises to ``quant_min`` with no gradient, as torch's kernels
give it.

>>> import tilewise as tw
>>> tw.fake_quantize_per_tensor_affine(tw.tensor([0.26, -3.0, 40.0]), 0.1, 0, -128, 127)
tensor([ 0.3000, -3.0000, 12.7000])
"""

from __future__ import annotations

import numpy as np

from tilewise import dtypes
from tilewise.dispatch import STATE
from tilewise.ops.nn_functional import concrete_cpu, where
from tilewise.ops.registry import OPS, declare

_RANGE = "`quant_min` should be less than or         equal to `quant_max`."  # torch's words, spaces and all
_ZERO_POINT = "`zero_point` must be between `quant_min` and `quant_max`."


def _check_range(quant_min: int, quant_max: int) -> None:
    if quant_min > quant_max:
        raise RuntimeError(_RANGE)


def _check_floating(self, kernel: str) -> None:
    if not self.dtype.is_floating_point:
        raise NotImplementedError(f'"{kernel}" not implemented for \'{dtypes.c10_name(self.dtype)}\'')


def _refuse_grad(function: str, name: str, t) -> None:
    if t.requires_grad and STATE.grad_enabled:
        raise RuntimeError(f"The function '{function}' is not differentiable with respect to argument '{name}'. This "
                           "input cannot have requires_grad True.")


def _one_value(t):
    """A qparams tensor's one value (torch reads it with ``item()``), as a 0-dim tensor, so that it stays on the
    device and in a traced program."""
    if t.numel() != 1:
        raise RuntimeError(f"a Tensor with {t.numel()} elements cannot be converted to Scalar")
    return t.reshape(())


def _quantised(self, inv_scale, zero_point, float_zero_point: bool):
    """The rounded, shifted values q (in the product's precision; NaN stays NaN)."""
    work = self.double() if self.dtype == dtypes.float64 else self.float()
    product = work * inv_scale
    return (product + zero_point).round() if float_zero_point else product.round() + zero_point


def _dequantised(self, q, scale, zero_point, quant_min: int, quant_max: int, float_zero_point: bool):
    clamped = where(q.isnan(), quant_min, q.clamp(quant_min, quant_max))
    if self.dtype in (dtypes.float16, dtypes.bfloat16) or float_zero_point:
        clamped = clamped.double()  # one rounding to the output's dtype: see [Note: fake quantisation]
    return ((clamped - zero_point) * scale).to(self.dtype)


def _mask(q, quant_min: int, quant_max: int):
    return (q >= quant_min).logical_and(q <= quant_max)


def _per_tensor_cachemask(self, scale, zero_point, quant_min, quant_max):
    scale32 = float(np.float32(scale))
    q = _quantised(self, float(np.float32(1.0) / np.float32(scale32)), zero_point, False)
    return _dequantised(self, q, scale32, zero_point, quant_min, quant_max, False), _mask(q, quant_min, quant_max)


def _per_tensor_tensor_qparams_cachemask(self, scale, zero_point, quant_min, quant_max):
    scale32 = scale.float()
    zero = zero_point.long()  # torch reads the zero point as an integer, truncating a float one
    q = _quantised(self, 1.0 / scale32, zero, False)
    return _dequantised(self, q, scale32, zero, quant_min, quant_max, False), _mask(q, quant_min, quant_max)


def _per_channel_cachemask(self, scale, zero_point, axis, quant_min, quant_max):
    shape = [1] * self.ndim
    shape[axis] = self.shape[axis]
    scale32 = scale.float().reshape(shape)
    float_zero_point = zero_point.dtype.is_floating_point
    zero = zero_point.float().reshape(shape) if float_zero_point else zero_point.reshape(shape)
    q = _quantised(self, 1.0 / scale32, zero, float_zero_point)
    return (_dequantised(self, q, scale32, zero, quant_min, quant_max, float_zero_point),
            _mask(q, quant_min, quant_max))


def _fake_quantize_per_tensor_affine(self, scale, zero_point, quant_min, quant_max):
    _check_range(quant_min, quant_max)
    if not quant_min <= zero_point <= quant_max:
        raise RuntimeError(_ZERO_POINT)
    _check_floating(self, "fake_quantize_tensor_cachemask_kernel_type_handling")
    return OPS["fake_quantize_per_tensor_affine_cachemask"](self, scale, zero_point, quant_min, quant_max)[0]


def _fake_quantize_per_tensor_affine_tensor_qparams(self, scale, zero_point, quant_min, quant_max):
    name = "_fake_quantize_per_tensor_affine_cachemask_tensor_qparams"
    for argument, t in (("scale", scale), ("zero_point", zero_point)):
        _refuse_grad(name, argument, t)
    _check_range(quant_min, quant_max)
    scale, zero_point = _one_value(scale), _one_value(zero_point)
    _check_floating(self, "fake_quantize_tensor_cachemask_kernel_type_handling")
    return OPS[name](self, scale, zero_point, quant_min, quant_max)[0]


def _check_per_channel(self, scale, zero_point, axis, quant_min, quant_max) -> None:
    if scale.dtype not in (dtypes.float32, dtypes.bfloat16):
        raise RuntimeError(f"Scale must be Float or BFloat16, found {dtypes.c10_name(scale.dtype)}")
    if zero_point.dtype not in (dtypes.int32, dtypes.float32, dtypes.float16):
        raise RuntimeError(f"Zero-point must be Int32, Float or Half, found {dtypes.c10_name(zero_point.dtype)}")
    if scale.ndim != 1:
        raise RuntimeError("scale should be a 1-D tensor")
    if zero_point.ndim != 1:
        raise RuntimeError("zero point should be a 1-D tensor")
    if scale.numel() != zero_point.numel():
        raise RuntimeError("scale and zero-point need to have the same dimensions")
    if scale.numel() != self.size(axis):
        raise RuntimeError("dimensions of scale and zero-point are not consistent with input tensor")
    _check_range(quant_min, quant_max)
    if not zero_point.dtype.is_floating_point and zero_point.numel() and concrete_cpu(zero_point):
        if int(zero_point.min()) < quant_min or int(zero_point.max()) > quant_max:
            raise RuntimeError(_ZERO_POINT)
    if not 0 <= axis <= self.ndim:
        raise RuntimeError("`axis` must be between 0 and number of dimensions of input")


def _fake_quantize_per_channel_affine(self, scale, zero_point, axis, quant_min, quant_max):
    name = "fake_quantize_per_channel_affine_cachemask"
    for argument, t in (("scale", scale), ("zero_point", zero_point)):
        _refuse_grad(name, argument, t)
    _check_per_channel(self, scale, zero_point, axis, quant_min, quant_max)
    _check_floating(self, "fake_quantize_channel_cachemask_cpu_type_handling")
    return OPS[name](self, scale, zero_point, axis, quant_min, quant_max)[0]


_STRAIGHT_THROUGH = {"self": "grad * result[1]"}
_STRAIGHT_THROUGH_TANGENT = "(self_t * result[1], None)"


def _private(schema: str, decomposition, grad: dict):
    return declare(schema, "composite", decomposition=decomposition, grad=grad, nondiff_outputs=(1,),
                   fwd=_STRAIGHT_THROUGH_TANGENT, public=False, method=False)


_private("fake_quantize_per_tensor_affine_cachemask(Tensor self, float scale, int zero_point, int quant_min, "
         "int quant_max) -> (Tensor output, Tensor mask)", _per_tensor_cachemask, _STRAIGHT_THROUGH)
_private("_fake_quantize_per_tensor_affine_cachemask_tensor_qparams(Tensor self, Tensor scale, Tensor zero_point, "
         "int quant_min, int quant_max) -> (Tensor output, Tensor mask)", _per_tensor_tensor_qparams_cachemask,
         {**_STRAIGHT_THROUGH, "scale": None, "zero_point": None})
_private("fake_quantize_per_channel_affine_cachemask(Tensor self, Tensor scale, Tensor zero_point, int axis, "
         "int quant_min, int quant_max) -> (Tensor output, Tensor mask)", _per_channel_cachemask,
         {**_STRAIGHT_THROUGH, "scale": None, "zero_point": None})
declare("fake_quantize_per_tensor_affine(Tensor self, float scale, int zero_point, int quant_min, int quant_max) -> "
        "Tensor", "composite", decomposition=_fake_quantize_per_tensor_affine, method=False, out=False,
        autocast={"cpu": "fp32"})  # torch's CPU autocast lists this overload, not the tensor-qparams one
declare("fake_quantize_per_tensor_affine.tensor_qparams(Tensor self, Tensor scale, Tensor zero_point, int quant_min, "
        "int quant_max) -> Tensor", "composite", decomposition=_fake_quantize_per_tensor_affine_tensor_qparams,
        method=False, out=False)
declare("fake_quantize_per_channel_affine(Tensor self, Tensor scale, Tensor zero_point, int axis, int quant_min, "
        "int quant_max) -> Tensor", "composite", decomposition=_fake_quantize_per_channel_affine, method=False,
        out=False)

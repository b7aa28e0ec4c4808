"""``_scaled_mm``: the FP8 matrix product with scales, torch's ``torch._scaled_mm``.

[Note: scaled matrix products] ``_scaled_mm(a, b, scale_a, scale_b)`` multiplies two float8 matrices and
applies their dequantisation scales: ``(a * scale_a) @ (b * scale_b) (+ bias)``, accumulated in float32 and
written in ``out_dtype`` (``a``'s dtype by default). Two scalings are accepted, as torch accepts them:
*tensorwise* (both scales one float32 element) and *rowwise* (``scale_a`` of shape ``(M, 1)``, ``scale_b`` of
shape ``(1, N)``, float32, contiguous). A float8 result is divided by ``scale_result`` on the CPU (torch's CPU
kernel) and multiplied by it on CUDA (cuBLASLt's D scale, as torch's CUDA kernel passes it): the two devices
of torch disagree there and each is matched. The checks common to both devices live here; what cuBLASLt
adds (sizes multiple of 16, ``a`` row-major and ``b`` column-major, no e5m2 x e5m2, bias dtypes, sm_89+) is
checked by the CUDA kernel (``backends/cuda/scaled_mm.py``). Like torch's, it has no derivative: FP8
training (``tilewise.float8``) differentiates through an autograd Function that calls it three times.
"""

from __future__ import annotations

from tilewise import dtypes
from tilewise.dtypes import c10_name
from tilewise.ops.batching import loop
from tilewise.ops.registry import declare


def scaling_of(a, b, scale_a, scale_b) -> str | None:
    """"tensorwise", "rowwise", or None when the operands and scales fit neither scheme."""
    if not (a.dtype.is_float8 and b.dtype.is_float8):
        return None
    if scale_a.dtype is not dtypes.float32 or scale_b.dtype is not dtypes.float32:
        return None
    if scale_a.numel() == 1 and scale_b.numel() == 1:
        return "tensorwise"
    m, n = a.shape[0], b.shape[1]
    if tuple(scale_a.shape) == (m, 1) and tuple(scale_b.shape) == (1, n):
        return "rowwise"
    return None


def _invalid_scaling(a, b, scale_a, scale_b) -> ValueError:
    m, n = a.shape[0], b.shape[1]

    def described(mat, scale, side, last=", "):
        return (f"mat_{side}.dtype()={c10_name(mat.dtype)}, scale_{side}.dtype()={c10_name(scale.dtype)}, "
                f"scale_{side}.size()={list(scale.shape)}{last}scale_{side}.stride()={list(scale.stride())}")

    return ValueError(
        "Invalid scaling configuration.\n"
        "- For TensorWise scaling, a and b should be float8, scales should be float and singletons.\n"
        f"- For RowWise scaling, a and b should be float8, scales should be float, scale_a should be ({m}, 1) and "
        f"scale_b should be (1, {n}), and both should be contiguous.\n"
        f"Got {described(a, scale_a, 'a')}, {described(b, scale_b, 'b', ' and ')}")


def check_scaled_mm(a, b, scale_a, scale_b, bias=None, scale_result=None, cuda: bool = False) -> str:
    """torch's checks on every device, in its order (its CUDA kernel names the operands mat1/mat2 where its CPU
    kernel says mat_a/mat_b); returns the scaling ("tensorwise" or "rowwise")."""
    if a.ndim != 2:
        raise RuntimeError("mat1 must be a matrix")
    if b.ndim != 2:
        raise RuntimeError("mat2 must be a matrix")
    if a.shape[1] != b.shape[0]:
        names = "mat1 and mat2" if cuda else "mat_a and mat_b"
        raise RuntimeError(f"{names} shapes cannot be multiplied ({a.shape[0]}x{a.shape[1]} and "
                           f"{b.shape[0]}x{b.shape[1]})")
    scaling = scaling_of(a, b, scale_a, scale_b)
    if scaling is None:
        raise _invalid_scaling(a, b, scale_a, scale_b)
    if scaling == "rowwise":
        for side, scale in (("a", scale_a), ("b", scale_b)):
            if scale.stride()[1] != 1:
                raise ValueError(f"expected scale_{side}.stride(1) to be 1, but got {scale.stride()[1]}")
    if scale_result is not None and (scale_result.numel() != 1 or scale_result.dtype is not dtypes.float32):
        raise RuntimeError("scale_result must be a float scalar")
    if bias is not None and bias.numel() != b.shape[1]:
        raise RuntimeError(f"Bias must be size {b.shape[1]} but got {bias.numel()}")
    return scaling


def _result_type(args):
    a, b, scale_a, scale_b, bias, scale_result, out_dtype = args[:7]
    check_scaled_mm(a, b, scale_a, scale_b, bias, scale_result)
    return (a.shape[0], b.shape[1]), out_dtype if out_dtype is not None else a.dtype


def _dtype_rule(op, args):
    out = _result_type(args)[1]
    return out, dtypes.float32


def _batched(op, args, batched, size):
    """A batch of left operands against one right operand with tensorwise scales folds into the rows of one
    product; anything else runs example by example."""
    a, b, scale_a, scale_b, bias, scale_result = args[:6]
    if batched[0] and not any(batched[1:6]) and scale_a.numel() == 1 and a.ndim == 3:
        out = OP(a.reshape(-1, a.shape[-1]), *args[1:])
        return out.reshape(size, a.shape[1], out.shape[-1])
    return loop(op, args, batched, size)


OP = declare(
    "_scaled_mm(Tensor self, Tensor mat2, Tensor scale_a, Tensor scale_b, Tensor? bias=None, "
    "Tensor? scale_result=None, ScalarType? out_dtype=None, bool use_fast_accum=False) -> Tensor",
    "other", dtype=_dtype_rule, differentiable=False, method=False, meta=_result_type, batch=_batched,
    doc="FP8 matrix product with dequantisation scales, ``(self * scale_a) @ (mat2 * scale_b) (+ bias)`` in "
        "``out_dtype``; tensorwise (one-element) or rowwise ((M, 1) and (1, N)) float32 scales. See "
        "[Note: scaled matrix products].\n\n"
        ">>> a = tw.ones(16, 32).to(tw.float8_e4m3fn); b = tw.ones(16, 32).to(tw.float8_e4m3fn).t()\n"
        ">>> tw._scaled_mm(a, b, tw.tensor(0.5), tw.tensor(2.0), out_dtype=tw.float32)[0, :2]\n"
        "tensor([32., 32.])")

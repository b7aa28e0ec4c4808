"""Complex tensors: views of their parts, construction, and which operators take complex operands.

[Note: complex tensors] A complex64 element is a pair of float32 values (real, imaginary), as in numpy and
torch, so ``view_as_real`` is a view of the same storage as float32 with a trailing dim of 2 (strides and offset
doubled), and ``view_as_complex`` its inverse. ``real``, ``imag``, ``conj``, ``angle``, ``complex`` and
``polar`` are composites over those views and real operators: they run on every device, and autograd sees only
real operators below them. The gradient a real view receives, (dL/dre, dL/dim), comes back through
``view_as_complex`` as dL/dre + i dL/dim, which is torch's convention for complex gradients (the conjugate
Wirtinger derivative, doubled); the pointwise formulas that differ for complex operands (``mul``, ``div``,
``abs``, ``exp``, ...) conjugate what they multiply by, as derivatives.yaml does, and a complex gradient
reaching a real input keeps its real part (``_fit_grad``'s cast), torch's ``handle_r_to_c``.
Operators take complex operands where torch does: the names in ``dtype_rules.COMPLEX_OPERATORS``; the dtype
rules refuse the rest with torch's exception type. On CUDA, pointwise kernels are generated for real dtypes only: the
backend computes ``COMPLEX_REAL_FORMS`` (the arithmetic fft users need) on the real views, and other complex
pointwise operators on host copies.
"""

from __future__ import annotations

import math

from tilewise import dtypes
from tilewise import strides as S
from tilewise.ops.registry import OPS, declare
from tilewise.tensor import Tensor

# ---------------------------------------------------------------- views of the parts

def _parts_dtype(x: Tensor):
    if not x._dtype.is_complex:
        raise RuntimeError(f"view_as_real is only supported for complex tensors, got {x._dtype.name}; "
                           "complex dtypes are complex64 and complex128")
    return x._dtype.to_real()


def _complex_dtype(x: Tensor):
    if x._dtype not in (dtypes.float32, dtypes.float64):
        raise RuntimeError(f"view_as_complex is only supported for float and double tensors, but got a tensor of "
                           f"scalar type: {x._dtype.name}")
    return x._dtype.to_complex()


def _as_real_geometry(shape, strides, offset):
    return shape + (2,), tuple(2 * s for s in strides) + (1,), 2 * offset


def _as_complex_geometry(shape, strides, offset):
    if not shape:
        raise RuntimeError("view_as_complex: Input tensor must have one or more dimensions")
    if shape[-1] != 2:
        raise RuntimeError(f"view_as_complex: Tensor must have a last dimension of size 2, got shape {list(shape)}")
    if strides[-1] != 1:
        raise RuntimeError(f"view_as_complex: Tensor must have a last dimension with stride 1, got strides "
                           f"{list(strides)}; call .contiguous() first")
    if any(s % 2 for s in strides[:-1]):
        raise RuntimeError(f"view_as_complex: Tensor must have a stride divisible by 2 for all but last dimension, "
                           f"got strides {list(strides)}; call .contiguous() first")
    if offset % 2:
        raise RuntimeError(f"view_as_complex: Tensor must have a storage_offset divisible by 2, got {offset}")
    return shape[:-1], tuple(s // 2 for s in strides[:-1]), offset // 2


declare("view_as_real(Tensor(a) self) -> Tensor(a)", "view", view=_as_real_geometry, view_dtype=_parts_dtype,
        grad={"self": "view_as_complex(grad.contiguous())"}, method=False, compiles=False)
declare("view_as_complex(Tensor(a) self) -> Tensor(a)", "view", view=_as_complex_geometry, view_dtype=_complex_dtype,
        grad={"self": "view_as_real(grad.contiguous())"}, method=False, compiles=False, autocast={"cpu": "fp32"})


def real_view(t: Tensor) -> Tensor:
    """``view_as_real`` without the dispatcher, for backends: same storage, real dtype, trailing dim of 2."""
    shape, strides, offset = _as_real_geometry(t._shape, t._strides, t._offset)
    return Tensor._make(t._storage, shape, strides, offset, t._dtype.to_real(), t._device)


def part_view(t: Tensor, part: int) -> Tensor:
    """The real (0) or imaginary (1) part of complex ``t`` as a strided view, without the dispatcher."""
    return Tensor._make(t._storage, t._shape, tuple(2 * s for s in t._strides), 2 * t._offset + part,
                        t._dtype.to_real(), t._device)


def complex_view(t: Tensor) -> Tensor:
    """``view_as_complex`` of a real tensor whose last dim is a contiguous pair, without the dispatcher."""
    shape, strides, offset = _as_complex_geometry(t._shape, t._strides, t._offset)
    return Tensor._make(t._storage, shape, strides, offset, t._dtype.to_complex(), t._device)


def _real(x):
    return OPS["view_as_real"](x).select(-1, 0) if x.dtype.is_complex else x


def _imag(x):
    if not x.dtype.is_complex:
        raise RuntimeError(f"imag is not implemented for tensors with non-complex dtypes (got {x.dtype.name})")
    return OPS["view_as_real"](x).select(-1, 1)


def _pair(re, im, strides: tuple | None = None):
    """The complex tensor with parts ``re`` and ``im`` (real tensors of one shape and dtype), laid out densely with
    its dims in the order of ``strides`` (an element-wise result's, ``strides.pointwise_strides``), else row-major."""
    order = None if strides is None else S.memory_order(re.shape, strides)
    if order is None or order == tuple(range(re.ndim)):
        return OPS["view_as_complex"](OPS["stack"]([re, im], -1))
    pairs = OPS["view_as_complex"](OPS["stack"]([re.permute(order), im.permute(order)], -1))
    return pairs.permute(sorted(range(len(order)), key=order.__getitem__))


def _elementwise_strides(shape, *operands) -> tuple:
    """The strides torch's TensorIterator gives an element-wise result of ``shape`` from tensor ``operands``."""
    return S.pointwise_strides(tuple(shape), [(t._shape, t._strides) for t in operands])


def _conj(x):
    return _pair(_real(x), -_imag(x), _elementwise_strides(x.shape, x)) if x.dtype.is_complex else x


def _angle(x):
    if x.dtype.is_complex:  # torch computes it complex to complex, then copies the real part into a row-major result
        return OPS["atan2"](_imag(x), _real(x)).contiguous()
    if not x.dtype.is_floating_point:
        x = x.to(dtypes.get_default_dtype())
    return OPS["where.self"](x.isnan(), x, (x < 0).to(x.dtype) * math.pi)


def _check_parts(real, imag, op: str) -> None:
    for t in (real, imag):
        if t.dtype not in (dtypes.float16, dtypes.float32, dtypes.float64):
            raise RuntimeError(f"{op}: Expected both inputs to be Half, Float or Double tensors but got "
                               f"{real.dtype.name} and {imag.dtype.name}")
    if real.dtype is not imag.dtype:
        raise RuntimeError(f"{op}: Expected object of scalar type {real.dtype.name} but got scalar type "
                           f"{imag.dtype.name} for second argument")
    if real.dtype is dtypes.float16:
        raise RuntimeError(f"{op}: complex32 (half-precision parts) is not supported; convert the parts to float32")


def _complex(real, imag):
    _check_parts(real, imag, "complex")
    shape = S.broadcast_shapes(real.shape, imag.shape, op="complex")
    return _pair(real.expand(shape).contiguous(), imag.expand(shape).contiguous(),
                 _elementwise_strides(shape, real, imag))


def _polar(abs, angle):  # noqa: A002 — torch's argument name
    _check_parts(abs, angle, "polar")
    return _complex(abs * angle.cos(), abs * angle.sin())


declare("real(Tensor(a) self) -> Tensor(a)", "composite", decomposition=_real, method=False,
        doc="The real part of a complex tensor (a view); a real tensor itself. ``x.real`` is the same view.")
declare("imag(Tensor(a) self) -> Tensor(a)", "composite", decomposition=_imag, method=False,
        doc="The imaginary part of a complex tensor (a view). ``x.imag`` is the same view.")
declare("conj(Tensor self) -> Tensor", "composite", decomposition=_conj, out=False,
        doc="The complex conjugate (a copy for complex tensors, ``self`` for real ones).")
declare("conj_physical(Tensor self) -> Tensor", "composite", decomposition=_conj,  # conj with torch's out= form
        doc="The complex conjugate (a copy for complex tensors, ``self`` for real ones).")
declare("angle(Tensor self) -> Tensor", "composite", decomposition=_angle,
        doc="The argument of each element in radians (0 or pi for real tensors, NaN kept).")
declare("complex(Tensor real, Tensor imag) -> Tensor", "composite", decomposition=_complex, method=False,
        doc=">>> tw.complex(tw.tensor([1.0]), tw.tensor([2.0]))\ntensor([1.+2.j])")
declare("polar(Tensor abs, Tensor angle) -> Tensor", "composite", decomposition=_polar, method=False,
        autocast={"cpu": "fp32"},
        doc="abs * (cos(angle) + i sin(angle)).")


def _resolve_conj(self):
    return self


Tensor.real = property(_real)
Tensor.imag = property(_imag)
Tensor.resolve_conj = Tensor.resolve_neg = _resolve_conj
Tensor.is_conj = Tensor.is_neg = lambda self: False


# ---------------------------------------------------------------- real forms for backends without complex kernels

def _parts(value):
    """(real, imag) of an operand: views of a complex tensor, or a real tensor or number with a zero imaginary part."""
    if type(value) is Tensor and value._dtype.is_complex:
        return _real(value), _imag(value)
    if isinstance(value, complex):
        return value.real, value.imag
    return value, 0


def _mul_form(a, b):
    (ar, ai), (br, bi) = _parts(a), _parts(b)
    return ar * br - ai * bi, ar * bi + ai * br


def _div_form(a, b):
    (ar, ai), (br, bi) = _parts(a), _parts(b)
    denominator = br * br + bi * bi
    return (ar * br + ai * bi) / denominator, (ai * br - ar * bi) / denominator


def _add_form(a, b, alpha=1):
    (ar, ai), (br, bi) = _parts(a), _parts(b)
    return ar + br * alpha, ai + bi * alpha


def _sub_form(a, b, alpha=1):
    (ar, ai), (br, bi) = _parts(a), _parts(b)
    return ar - br * alpha, ai - bi * alpha


def _neg_form(a):
    ar, ai = _parts(a)
    return -ar, -ai


def _abs_form(a):
    ar, ai = _parts(a)
    return (ar * ar + ai * ai).sqrt()


def _sgn_form(a):
    ar, ai = _parts(a)
    magnitude = (ar * ar + ai * ai).sqrt()
    safe = magnitude.masked_fill(magnitude == 0, 1.0)
    return ar / safe, ai / safe


def _exp_form(a):
    ar, ai = _parts(a)
    scale = ar.exp()
    return scale * ai.cos(), scale * ai.sin()


# operator -> function of its arguments giving (real part, imaginary part), or a real result
COMPLEX_REAL_FORMS = {"mul": _mul_form, "div": _div_form, "add": _add_form, "sub": _sub_form, "neg": _neg_form,
                      "abs": _abs_form, "sgn": _sgn_form, "exp": _exp_form}


def run_real_form(op, args: tuple, out_dtype, device):
    """A complex pointwise operator computed by real operators on the parts of its operands, or None where it
    has no real form (the caller then runs it another way)."""
    form = COMPLEX_REAL_FORMS.get(op.name)
    if form is None or (op.name == "div" and args[2] is not None):
        return None
    result = form(*(args[:2] if op.name == "div" else args))
    if not isinstance(result, tuple):
        return result.to(out_dtype)
    re, im = result
    real_dtype = out_dtype.to_real()
    shape = S.broadcast_shapes(*(t.shape for t in (re, im) if type(t) is Tensor), op=op.name)
    re, im = (_filled(p, shape, real_dtype, device) for p in (re, im))
    return _pair(re, im, _elementwise_strides(shape, *(a for a in args if type(a) is Tensor)))


def _filled(part, shape, dtype, device) -> Tensor:
    if type(part) is Tensor:
        return part.to(dtype).expand(shape).contiguous()
    from tilewise.ops.creation import full

    return full(shape, part, dtype=dtype, device=device)

"""Data types and type promotion.

[Note: dtypes] A ``DType`` is an interned description of an element type: its torch-style name, the numpy
dtype that stores it on the CPU (ml_dtypes supplies bfloat16 and the float8 formats), its width and its
category (bool < integer < floating < complex). A complex dtype is a pair of its real dtype's values
(``complex64`` of float32s): views of its real and imaginary parts are strided views of that dtype.
Promotion follows torch exactly, because ported code depends on it:
``promote_types`` is the pairwise lattice, and ``result_type`` ranks operands in three priority groups —
tensors with dimensions, zero-dim tensors, Python scalars — where a lower group only raises the category,
never the width. Every operator's dtype rule is built from these two functions.

[Note: scalar overflow] A Python number that becomes an element — a fill value, a value written by
``x[i] = v``, a bound of ``clamp``, data given to ``tensor()`` — must fit its dtype, as in torch
(``c10::checked_convert``): an integer within the dtype's range (uint8 also takes -255..-1, which wrap, so
``a - b`` can be written ``a + 255 * b``), a float that is not NaN or infinite and lies within the range
before truncation; for float16, bfloat16 and float32, a finite number within the largest finite value
(infinity and NaN pass; float8 values saturate). Otherwise the error is torch's: "value cannot be
converted to type int8 without overflow". Operands of arithmetic (``int8_tensor + 300``) are not
elements: they wrap, as in torch. ``tensor()`` refuses integers past int64 whatever the dtype, and does
not check floating data (``tensor([1e300], dtype=float32)`` is inf), as torch.
"""

from __future__ import annotations

import builtins
import math
from dataclasses import dataclass, field
from numbers import Number

import ml_dtypes
import numpy as np

BOOL, INT, FLOAT, COMPLEX = 0, 1, 2, 3
_STORAGE_ONLY_NAMES = frozenset({"float8_e8m0fnu", "float4_e2m1fn_x2"})


@dataclass(frozen=True, eq=False)
class DType:
    name: str
    np: np.dtype
    category: int
    is_signed: bool
    c_name: str
    itemsize: int = field(init=False)  # plain attributes, not properties: every kernel launch reads them
    is_floating_point: bool = field(init=False)
    # float8_e8m0fnu (MX block scales) and float4_e2m1fn_x2 (two FP4 values per byte) have no arithmetic, as in
    # torch: they are created, copied, viewed, compared for equality and cast (e8m0 only). The dispatcher reads
    # this for every tensor argument of every arithmetic call.
    is_storage_only: bool = field(init=False)
    is_complex: bool = field(init=False)  # the compiler's capture asks it of every operand of every operator

    def __post_init__(self) -> None:
        object.__setattr__(self, "itemsize", self.np.itemsize)
        object.__setattr__(self, "is_floating_point", self.category == FLOAT)
        object.__setattr__(self, "is_storage_only", self.name in _STORAGE_ONLY_NAMES)
        object.__setattr__(self, "is_complex", self.category == COMPLEX)

    def to_real(self) -> DType:
        """The dtype of a complex dtype's parts (complex64 -> float32); other dtypes are their own."""
        return _REAL_OF.get(self, self)

    def to_complex(self) -> DType:
        """The complex dtype whose parts are this floating dtype (float32 -> complex64), as torch's toComplexType."""
        found = _COMPLEX_OF.get(self.to_real())
        if found is None:
            raise RuntimeError(f"Unknown Complex ScalarType for {self.name}: complex dtypes are complex64 (float32 "
                               "parts) and complex128 (float64 parts)")
        return found

    @property
    def is_float8(self) -> bool:
        return self.name.startswith("float8")

    @property
    def bits(self) -> int:
        return self.itemsize * 8

    def __repr__(self) -> str:
        return f"tilewise.{self.name}"

    def __reduce__(self):
        return (from_name, (self.name,))


def _make(name: str, np_type, category: int, signed: bool, c_name: str) -> DType:
    return DType(name, np.dtype(np_type), category, signed, c_name)


bool_ = _make("bool", np.bool_, BOOL, False, "bool")
uint8 = _make("uint8", np.uint8, INT, False, "unsigned char")
int8 = _make("int8", np.int8, INT, True, "signed char")
int16 = _make("int16", np.int16, INT, True, "short")
int32 = _make("int32", np.int32, INT, True, "int")
int64 = _make("int64", np.int64, INT, True, "long long")
float16 = _make("float16", np.float16, FLOAT, True, "half")
bfloat16 = _make("bfloat16", ml_dtypes.bfloat16, FLOAT, True, "bf16")
float32 = _make("float32", np.float32, FLOAT, True, "float")
float64 = _make("float64", np.float64, FLOAT, True, "double")
float8_e4m3fn = _make("float8_e4m3fn", ml_dtypes.float8_e4m3fn, FLOAT, True, "fp8e4m3")
float8_e5m2 = _make("float8_e5m2", ml_dtypes.float8_e5m2, FLOAT, True, "fp8e5m2")
float8_e8m0fnu = _make("float8_e8m0fnu", ml_dtypes.float8_e8m0fnu, FLOAT, False, "fp8e8m0")
# two e2m1 values per byte, the first in the low nibble (torch's layout); stored as raw bytes on the CPU
float4_e2m1fn_x2 = _make("float4_e2m1fn_x2", np.dtype([("float4_e2m1fn_x2", np.uint8)]), FLOAT, True, "fp4e2m1x2")
complex64 = _make("complex64", np.complex64, COMPLEX, True, "float2")
complex128 = _make("complex128", np.complex128, COMPLEX, True, "double2")

ALL = (bool_, uint8, int8, int16, int32, int64, float16, bfloat16, float32, float64, float8_e4m3fn, float8_e5m2,
       float8_e8m0fnu, float4_e2m1fn_x2, complex64, complex128)
_BY_NAME = {d.name: d for d in ALL}
# c10's ScalarType names, which torch's error messages print ("Float", "Long", "Float8_e4m3fn")
_C10_NAMES = {"bool": "Bool", "uint8": "Byte", "int8": "Char", "int16": "Short", "int32": "Int", "int64": "Long",
              "float16": "Half", "bfloat16": "BFloat16", "float32": "Float", "float64": "Double",
              "float8_e4m3fn": "Float8_e4m3fn", "float8_e5m2": "Float8_e5m2", "float8_e8m0fnu": "Float8_e8m0fnu",
              "float4_e2m1fn_x2": "Float4_e2m1fn_x2", "complex64": "ComplexFloat", "complex128": "ComplexDouble"}


def c10_name(dtype: DType) -> str:
    """torch's name of ``dtype`` in its messages: ``c10_name(float32) == "Float"``."""
    return _C10_NAMES[dtype.name]


# the C++ type names torch's checks print where they format a TypeMeta ("expected dtype float ... got dtype double")
_TYPE_META_NAMES = {"bool": "bool", "uint8": "unsigned char", "int8": "signed char", "int16": "short int",
                    "int32": "int", "int64": "long int", "float16": "c10::Half", "bfloat16": "c10::BFloat16",
                    "float32": "float", "float64": "double", "complex64": "c10::complex<float>",
                    "complex128": "c10::complex<double>", "float8_e4m3fn": "c10::Float8_e4m3fn",
                    "float8_e5m2": "c10::Float8_e5m2", "float8_e8m0fnu": "c10::Float8_e8m0fnu",
                    "float4_e2m1fn_x2": "c10::Float4_e2m1fn_x2"}


def type_meta_name(dtype: DType) -> str:
    """torch's C++ name of ``dtype`` in messages that print a TypeMeta: ``type_meta_name(int64) == "long int"``."""
    return _TYPE_META_NAMES.get(dtype.name, dtype.name)

_ALIASES = {"half": float16, "float": float32, "double": float64, "long": int64, "int": int32, "short": int16,
            "cfloat": complex64, "cdouble": complex128}
_REAL_OF = {complex64: float32, complex128: float64}
_COMPLEX_OF = {float32: complex64, float64: complex128}
_BY_NP = {d.np: d for d in ALL}

# torch names the plain Python types too: tilewise.bool is bool_
half, float, double, long, int, short = float16, float32, float64, int64, int32, int16  # noqa: A001
cfloat, cdouble = complex64, complex128
bool = bool_  # noqa: A001


NO_COMPLEX32 = ("tilewise has no complex32 (ComplexHalf, torch.chalf) dtype: its complex dtypes are complex64 "
                "(cfloat) and complex128 (cdouble); use .cfloat() for a complex tensor of float32 parts")


def from_name(name: str) -> DType:
    found = _BY_NAME.get(name) or _ALIASES.get(name)
    if found is None:
        missing = f" ({NO_COMPLEX32})" if name in ("complex32", "chalf") else ""
        raise TypeError(f"unknown dtype {name!r}; valid dtypes: {', '.join(_BY_NAME)}{missing}")
    return found


def from_numpy(np_dtype) -> DType:
    found = _BY_NP.get(np.dtype(np_dtype))
    if found is None:
        raise TypeError(f"numpy dtype {np.dtype(np_dtype)} has no tilewise equivalent; valid: {', '.join(_BY_NAME)}")
    return found


def as_dtype(value) -> DType:
    """Accepts a DType, a numpy dtype, a name ("float32", "torch.float32"), a torch dtype, or bool/int/float/complex."""
    if isinstance(value, DType):
        return value
    if value is builtins.bool:
        return bool_
    if value is builtins.int:
        return int64
    if value is builtins.float:
        return get_default_dtype()
    if value is builtins.complex:  # torch's Python-type mapping: complex is complex128, whatever the default
        return complex128
    if isinstance(value, str) or type(value).__module__ == "torch":
        return from_name(str(value).removeprefix("torch.").removeprefix("tilewise."))
    return from_numpy(value)


# ---------------------------------------------------------------- default dtype

_default = float32


def get_default_dtype() -> DType:
    return _default


def set_default_dtype(dtype: DType) -> None:
    global _default
    dtype = as_dtype(dtype)
    if not dtype.is_floating_point or dtype.is_float8:
        raise TypeError(f"set_default_dtype: only float16/bfloat16/float32/float64 are valid defaults, got {dtype}")
    _default = dtype


# ---------------------------------------------------------------- promotion

def can_cast(from_: DType, to: DType) -> bool:
    """Whether type promotion may cast ``from_`` to ``to`` (torch.can_cast): never complex to real, floating to
    integral, or anything but bool to bool.

    >>> import tilewise as tw
    >>> tw.can_cast(tw.int32, tw.float32), tw.can_cast(tw.float32, tw.int32)
    (True, False)
    """
    for position, (name, value) in enumerate((("from_", from_), ("to", to)), 1):
        if not isinstance(value, DType):
            raise TypeError(f"can_cast(): argument '{name}' (position {position}) must be tilewise.dtype, not "
                            f"{type(value).__name__}")
    return castable(from_, to)


_INT_ORDER = (uint8, int8, int16, int32, int64)
_FLOAT_ORDER = (float16, bfloat16, float32, float64)


def promote_types(a: DType, b: DType) -> DType:
    """torch.promote_types: the smallest dtype both values fit into."""
    if a is b:
        return a
    if a.is_float8 or b.is_float8:
        raise TypeError(f"Promotion for Float8 Types is not supported, attempted to promote {a} and {b}")
    if a.category != b.category:
        hi, lo = (a, b) if a.category > b.category else (b, a)
        if hi.category == COMPLEX and lo.category == FLOAT:  # float64 with complex64: complex128
            return promote_types(hi.to_real(), lo).to_complex()
        return hi
    if a.category == COMPLEX:
        return complex128
    if a.category == INT:
        if uint8 in (a, b):
            other = b if a is uint8 else a
            return int16 if other is int8 else other
        return a if _INT_ORDER.index(a) > _INT_ORDER.index(b) else b
    if {a, b} == {float16, bfloat16}:
        return float32
    return a if _FLOAT_ORDER.index(a) > _FLOAT_ORDER.index(b) else b


def scalar_dtype(value) -> DType:
    """The dtype torch gives a Python scalar that appears as an operand."""
    if isinstance(value, builtins.bool) or isinstance(value, np.bool_):
        return bool_
    if isinstance(value, (builtins.int, np.integer)):
        return int64
    if isinstance(value, (builtins.float, np.floating)):
        return float64
    if isinstance(value, (builtins.complex, np.complexfloating)):
        return complex128
    raise TypeError(f"expected a number, got {type(value).__name__}")


def overflow_error(op: str, value, dtype: DType) -> RuntimeError:
    """torch's error for a number that does not fit ``dtype``, naming the operator and the dtype's range."""
    if dtype.category == INT:
        info = np.iinfo(dtype.np)
        valid = f"{dtype.name} holds integers from {info.min} to {info.max}"
        if dtype is uint8:
            valid += " (integers from -255 to -1 wrap around)"
        if isinstance(value, builtins.float) and not math.isfinite(value):
            valid = f"{value} has no integer value; " + valid
    else:
        valid = f"{dtype.name}'s finite range is ±{builtins.float(ml_dtypes.finfo(dtype.np).max):.6g}"
    return RuntimeError(f"{op}: value cannot be converted to type {dtype.name} without overflow: got {value!r}; "
                        f"{valid}")


def checked_scalar(value, dtype: DType, op: str):
    """``value`` as an element of ``dtype`` (a Python int for integer dtypes: truncated, and wrapped for negative
    uint8 values), or torch's error where it does not fit (see [Note: scalar overflow])."""
    bounds = _INT_BOUNDS.get(dtype)
    if bounds is not None and type(value) is builtins.int and bounds[0] <= value <= bounds[1]:
        return value  # the common case, decided without the checks below
    if isinstance(value, np.generic):
        value = value.item()
    if dtype.is_complex:
        return value
    if dtype is float4_e2m1fn_x2 and value != 0:  # zeros and empty are the only fills torch has for packed FP4
        raise NotImplementedError(f"{op}: float4_e2m1fn_x2 tensors can only be filled with zeros, as in torch (got "
                                  f"{value!r}); make FP4 data with tilewise.quantize(t, 'nvfp4')")
    if isinstance(value, builtins.complex):
        raise RuntimeError(f"{op}: value cannot be converted to type {dtype.name} without overflow: got {value!r}; "
                           "a complex number fits only a complex dtype (complex64, complex128)")
    if dtype is bool_:
        return builtins.bool(value)
    if isinstance(value, builtins.int) and not -(1 << 63) <= value < (1 << 64):
        raise OverflowError(f"{op}: int too big to convert: {value} does not fit in 64 bits")
    if dtype.category == INT:
        info = np.iinfo(dtype.np)
        if isinstance(value, builtins.int):
            if (-info.max if dtype is uint8 else info.min) <= value <= info.max:
                return value % 256 if value < 0 and dtype is uint8 else builtins.int(value)
        elif info.min <= value <= info.max:  # NaN compares false
            return builtins.int(value)
        raise overflow_error(op, value, dtype)
    if dtype is not float64 and not isinstance(value, builtins.bool) and math.isfinite(value) and \
            abs(value) > _FLOAT_MAX[dtype]:
        raise overflow_error(op, value, dtype)
    return value


# float64 takes every Python float; float8 types saturate (their casts clip to the largest finite value)
_FLOAT_MAX = {d: builtins.float(ml_dtypes.finfo(d.np).max) if d.itemsize > 1 else math.inf
              for d in ALL if d.is_floating_point}
_FLOAT_MAX[float8_e8m0fnu] = builtins.float(np.finfo(np.float32).max)  # torch: NaN past 2**128, refused past float
_INT_BOUNDS = {d: (builtins.int(np.iinfo(d.np).min), builtins.int(np.iinfo(d.np).max)) for d in ALL
               if d.category == INT}


def _combine_categories(higher: DType | None, lower: DType | None) -> DType | None:
    """torch's combine_categories: a lower priority group raises the category, keeping a floating width."""
    if higher is None:
        return lower
    if lower is None or higher.is_complex:
        return higher
    if lower.is_complex:  # float64 tensor + complex scalar: complex128; an integer tensor takes the scalar's dtype
        return higher.to_complex() if higher.is_floating_point else lower
    if higher.is_floating_point:
        return higher
    if higher is bool_ or lower.is_floating_point:
        return promote_types(higher, lower)
    return higher


_PYTHON_SCALARS = {builtins.bool: BOOL, builtins.int: INT, builtins.float: FLOAT,
                   builtins.complex: COMPLEX}  # Python scalar -> category


def result_type(*operands) -> DType:
    """torch.result_type over tensors and Python scalars (tensors: anything with .dtype and .ndim)."""
    if len(operands) == 1 and getattr(operands[0], "_dtype", None) is not None:
        return operands[0]._dtype
    if len(operands) == 2:  # the eager hot paths: tensor op tensor of one dtype, tensor op no-wider scalar
        a, b = operands
        d = getattr(a, "_dtype", None)
        if d is not None and a._shape:
            if d is getattr(b, "_dtype", None) and b._shape:
                return d
            if _PYTHON_SCALARS.get(type(b), 4) <= d.category:
                return d
    dim_result = zero_result = wrapped_result = None
    for x in operands:
        if x is None:
            continue
        if type(x) in _PYTHON_SCALARS or isinstance(x, Number) or isinstance(x, np.generic):
            d = scalar_dtype(x)
            if d.is_floating_point:
                d = _default
            elif d.is_complex:
                d = default_complex_dtype()
            wrapped_result = d if wrapped_result is None else promote_types(wrapped_result, d)
        elif x.ndim == 0:
            zero_result = x.dtype if zero_result is None else promote_types(zero_result, x.dtype)
        else:
            dim_result = x.dtype if dim_result is None else promote_types(dim_result, x.dtype)
    out = _combine_categories(dim_result, _combine_categories(zero_result, wrapped_result))
    if out is None:
        raise TypeError("result_type needs at least one operand")
    return out


def to_float(d: DType) -> DType:
    """Integer and bool results of a floating operation become the default float dtype (torch's rule)."""
    return d if d.category >= FLOAT else _default


def default_complex_dtype() -> DType:
    """The dtype of a Python complex number among tensors: complex128 when the default dtype is float64."""
    return complex128 if _default is float64 else complex64


def compute_dtype(d: DType) -> DType:
    """Arithmetic precision for a storage dtype ('opmath'): half and float8 types compute in float32."""
    return _COMPUTE[d]


_COMPUTE = {d: float32 if d.is_floating_point and d.itemsize < 4 else d for d in ALL}


def castable(src: DType, dst: DType) -> bool:
    """Whether an in-place op may write a src result into a dst tensor (torch.can_cast without argument checks):
    bool < integral < floating < complex."""
    return src.category <= dst.category


# ---------------------------------------------------------------- finfo / iinfo


class finfo:  # noqa: N801 — torch's name
    def __init__(self, dtype: DType | None = None):
        dtype = (as_dtype(dtype) if dtype is not None else _default).to_real()
        if dtype is float4_e2m1fn_x2:
            raise TypeError("finfo: float4_e2m1fn_x2 packs two FP4 values in a byte and has no finfo, as in torch; "
                            "its values are 0, ±0.5, ±1, ±1.5, ±2, ±3, ±4 and ±6 (tilewise.dtypes.describe shows bits)")
        if not dtype.is_floating_point:
            raise TypeError(f"finfo: {dtype} is not a floating point dtype; use iinfo for integers")
        info = ml_dtypes.finfo(dtype.np)
        self.dtype = dtype
        self.bits = dtype.bits
        self.eps = builtins.float(info.eps)
        self.max = builtins.float(info.max)
        self.min = builtins.float(info.min)
        self.tiny = self.smallest_normal = builtins.float(info.tiny)
        self.resolution = 10.0 ** -math.floor(-math.log10(self.eps))  # torch: 10**-digits10, an exact power of ten

    def __repr__(self) -> str:
        return (f"finfo(resolution={self.resolution}, min={self.min}, max={self.max}, eps={self.eps}, "
                f"smallest_normal={self.smallest_normal}, tiny={self.tiny}, dtype={self.dtype.name})")


class iinfo:  # noqa: N801 — torch's name
    def __init__(self, dtype: DType):
        dtype = as_dtype(dtype)
        if dtype.category != INT:
            raise TypeError(f"iinfo: {dtype} is not an integer dtype; use finfo for floating point")
        info = np.iinfo(dtype.np)
        self.dtype, self.bits, self.min, self.max = dtype, dtype.bits, builtins.int(info.min), builtins.int(info.max)

    def __repr__(self) -> str:
        return f"iinfo(min={self.min}, max={self.max}, dtype={self.dtype.name})"


# ---------------------------------------------------------------- bit fields

# (sign bits, exponent bits, mantissa bits, exponent bias) of each floating format; float4_e2m1fn_x2 describes
# one of its two e2m1 values
_FIELDS = {float16: (1, 5, 10, 15), bfloat16: (1, 8, 7, 127), float32: (1, 8, 23, 127), float64: (1, 11, 52, 1023),
           float8_e4m3fn: (1, 4, 3, 7), float8_e5m2: (1, 5, 2, 15), float8_e8m0fnu: (0, 8, 0, 127),
           float4_e2m1fn_x2: (1, 2, 1, 1)}
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)  # the magnitudes of e2m1 codes 0..7; bit 3 is the sign


def encode_e2m1(values: np.ndarray) -> np.ndarray:
    """float32 values -> e2m1 codes (uint8, 0..15): round to nearest, ties to even, saturating at ±6. A tie goes
    to the even code, so the midpoints after an even code (0.25, 1.25, 2.5, 5) round down and those after an odd
    one (0.75, 1.75, 3.5) round up. NaN has no e2m1 code: callers flag it in the block scale."""
    a = np.abs(values)
    code = ((a > 0.25).astype(np.uint8) + (a >= 0.75) + (a > 1.25) + (a >= 1.75) + (a > 2.5) + (a >= 3.5) + (a > 5))
    return (code | (np.signbit(values).astype(np.uint8) << 3)).astype(np.uint8)


def decode_e2m1(codes: np.ndarray) -> np.ndarray:
    magnitude = np.asarray(E2M1_VALUES, np.float32)[codes & 7]
    return np.where(codes & 8, -magnitude, magnitude).astype(np.float32)


def round_to_e8m0(values) -> np.ndarray:
    """torch's float -> float8_e8m0fnu: the float32 exponent, rounded up when the first dropped mantissa bit is
    set (a float32 subnormal rounds up only past half); the sign is dropped; NaN and infinity give NaN (0xFF)."""
    with np.errstate(invalid="ignore", over="ignore"):
        bits = np.asarray(values, np.float32).view(np.uint32)
    exponent = (bits >> 23) & 0xFF
    guard = (bits & 0x400000) != 0
    rest = (bits & 0x3FFFFF) != 0
    round_up = guard & (rest | (exponent > 0)) & (exponent != 0xFF)
    return (exponent + round_up).astype(np.uint8).view(float8_e8m0fnu.np)


def _bits_of(value, dtype: DType) -> builtins.int:
    if dtype is float4_e2m1fn_x2:
        return builtins.int(encode_e2m1(np.float32(value))) & 0xF
    if dtype is float8_e8m0fnu:
        return builtins.int(round_to_e8m0(np.float32(value)).view(np.uint8))
    x = np.asarray(value, np.float64)
    if dtype is float8_e4m3fn:
        x = np.clip(x, -448.0, 448.0)  # tilewise's (and torch's) cast saturates
    return builtins.int(x.astype(dtype.np).reshape(1).view(f"u{dtype.itemsize}")[0])


def _field_value(sign: builtins.int, exponent: builtins.int, mantissa: builtins.int, fields) -> str:
    sign_bits, exponent_bits, mantissa_bits, bias = fields
    top = (1 << exponent_bits) - 1
    scale = 1 << mantissa_bits
    if sign_bits == 0:  # e8m0: a power of two, 0xFF is NaN
        return "NaN" if exponent == top else f"2^{exponent - bias}"
    sign_text = "-" if sign else "+"
    if exponent == 0:
        return f"{sign_text}(0 + {mantissa}/{scale}) × 2^{1 - bias} (subnormal)" if mantissa else f"{sign_text}0"
    return f"{sign_text}(1 + {mantissa}/{scale}) × 2^{exponent - bias}"


def describe(value, dtype) -> str:
    """The bits of ``value`` once stored as ``dtype``: sign, exponent and mantissa fields and what they encode.
    The value is first rounded as a cast to ``dtype`` rounds it (float4_e2m1fn_x2: one of its two e2m1 values).

    >>> import tilewise as tw
    >>> print(tw.dtypes.describe(1.75, tw.float8_e4m3fn))
    float8_e4m3fn 0x3e = 0|0111|110: sign + exponent 7 (bias 7) mantissa 6/8 -> +(1 + 6/8) × 2^0 = 1.75
    """
    dtype = as_dtype(dtype)
    fields = _FIELDS.get(dtype)
    if fields is None:
        raise TypeError(f"describe: {dtype.name} is not a floating-point format; valid: "
                        f"{', '.join(d.name for d in _FIELDS)}")
    sign_bits, exponent_bits, mantissa_bits, bias = fields
    bits = _bits_of(value, dtype)
    mantissa = bits & ((1 << mantissa_bits) - 1)
    exponent = (bits >> mantissa_bits) & ((1 << exponent_bits) - 1)
    sign = (bits >> (mantissa_bits + exponent_bits)) & 1 if sign_bits else 0
    width = sign_bits + exponent_bits + mantissa_bits
    groups = ([format(sign, "b")] if sign_bits else []) + [format(exponent, f"0{exponent_bits}b")]
    if mantissa_bits:
        groups.append(format(mantissa, f"0{mantissa_bits}b"))
    stored = _stored_value(bits, dtype)
    name = "float4_e2m1fn_x2 (one e2m1 nibble)" if dtype is float4_e2m1fn_x2 else dtype.name
    parts = [f"{name} 0x{bits:0{(width + 3) // 4}x} = {'|'.join(groups)}:"]
    if sign_bits:
        parts.append(f"sign {'-' if sign else '+'}")
    parts.append(f"exponent {exponent} (bias {bias})")
    if mantissa_bits:
        parts.append(f"mantissa {mantissa}/{1 << mantissa_bits}")
    meaning = _field_value(sign, exponent, mantissa, fields) if math.isfinite(stored) else "special"
    parts.append(f"-> {meaning} = {stored!r}")
    return " ".join(parts)


def _stored_value(bits: builtins.int, dtype: DType) -> builtins.float:
    if dtype is float4_e2m1fn_x2:
        return builtins.float(decode_e2m1(np.uint8(bits)))
    raw = np.array([bits], f"u{dtype.itemsize}").view(dtype.np)
    return builtins.float(raw.astype(np.float64)[0])

"""The operator library. Importing it loads every declaration and derives the Python surface from them.

From each ``OpDef`` come: the public function (``tilewise.exp``), the Tensor method (``x.exp()``), the
in-place method (``x.exp_()``) for pointwise and other operators that allow it, operator dunders
(``x + y``), and aliases (``tilewise.clip`` for clamp). The derivative formulas are then given their
namespace, the same public functions.
"""

from __future__ import annotations

from numbers import Number

import numpy as np

from tilewise._warnings import warn_once
from tilewise.ops import (  # noqa: F401 — each module declares its operators on import
    assemble,
    aten_spellings,
    batching,
    batching_rules,
    complex,
    conversions,
    creation,
    fake_quantize,
    fft,
    foreach,
    forward_formulas,
    host_methods,
    indexed,
    indexing,
    linalg,
    linalg_forward,
    linalg_functions,
    linalg_packed,
    linalg_solvers,
    methods,
    movement,
    nn,
    nn_activations,
    nn_ctc,
    nn_embedding_bag,
    nn_functional,
    nn_losses,
    nn_margin_losses,
    nn_pooling,
    nn_recurrent,
    nn_resampling,
    nn_spatial,
    norms,
    parser_signatures,
    pointwise,
    products,
    reductions,
    removed,
    scaled_mm,
    scans,
    sets,
    shape,
    special,
    statistics,
    storage_api,
    views,
)
from tilewise.ops.formulas import HELPERS
from tilewise.ops.inplace import check_no_internal_overlap, copy_into, make_inplace
from tilewise.ops.registry import OPS, OVERLOADS, public_function, set_formula_namespace
from tilewise.overrides import has_torch_function_unary
from tilewise.tensor import Tensor

_INPLACE_DUNDERS = {"add": "iadd", "sub": "isub", "mul": "imul", "div": "itruediv", "floor_divide": "ifloordiv",
                    "remainder": "imod", "pow": "ipow", "bitwise_and": "iand", "bitwise_or": "ior",
                    "bitwise_xor": "ixor", "bitwise_left_shift": "ilshift", "bitwise_right_shift": "irshift"}


# reflected dunders that torch binds to the operator itself, the tensor first (``0.1 * x`` is ``x.mul(0.1)``, which
# reads the number as mul's second operand: see [Note: half operands]); ``__rshift__`` is no reflection
_UNSWAPPED = frozenset({"rshift", "radd", "rmul", "rand", "ror", "rxor"})


def _swapped(fn):
    def reflected(self, other):
        return fn(other, self)

    reflected.__name__ = f"r{fn.__name__}"
    return reflected


def _binary_dunder(fn):
    """Python operators return NotImplemented for operands no schema accepts (so ``x == None`` is False), save an
    object with ``__torch_function__``, which the operator hands to it, as torch's does."""
    def dunder(self, other):
        # a numpy bool is a number to torch's operators
        if not isinstance(other, (Tensor, Number, np.bool_)) and not has_torch_function_unary(other):
            return NotImplemented
        return fn(self, other)

    dunder.__name__ = fn.__name__
    return dunder


def _reverses_operands(op) -> bool:
    """rsub, rdiv, rpow: operators declared with their operands already swapped (their dunders call them as is)."""
    return op.name.startswith("r") and op.name[1:] in OVERLOADS


def _inplace_allowed(overloads) -> bool:
    first = overloads[0]
    default = first.kind == "pointwise" and first.differentiable is not None
    return first.attrs.get("inplace", default) and first.attrs.get("method", True)


def build_api() -> dict:
    """Attach methods to Tensor and return the public functions by name."""
    functions: dict = {}
    for name, overloads in OVERLOADS.items():
        attrs = overloads[0].attrs
        if not attrs.get("public", True):
            continue
        fn = public_function(name)
        names = (name, *attrs.get("aliases", ()))
        if attrs.get("function", True):
            for n in names:
                functions[n] = fn
        if attrs.get("method", True):
            method = public_function(name, out=False)  # no method of torch's Tensor takes out=
            for n in names:
                if not hasattr(Tensor, n):
                    setattr(Tensor, n, method)
        if _inplace_allowed(overloads):
            method = make_inplace(fn, name)
            for n in names:
                setattr(Tensor, f"{n}_", method)
            if name in _INPLACE_DUNDERS:
                setattr(Tensor, f"__{_INPLACE_DUNDERS[name]}__", method)
    for op in OPS.values():
        for dunder in op.attrs.get("dunder", ()):
            # the method's binder: torch's overrides are told ``Tensor.add`` for ``x + y``
            fn = public_function(op.name, out=False) if op.attrs.get("method", True) else public_function(op.name)
            reflected = dunder.startswith("r") and not _reverses_operands(op) and dunder not in _UNSWAPPED
            method = _swapped(fn) if reflected else fn
            setattr(Tensor, f"__{dunder}__", _binary_dunder(method) if len(op.tensor_idx) >= 2 else method)
    _attach_special_methods(functions)
    factories = {name: getattr(creation, name) for name in creation.__all__}
    set_formula_namespace({**functions, **factories, **HELPERS, "OPS": OPS})
    parser_signatures.attach(functions)  # after the formulas' namespace: operators take numbers from one another
    return functions


def _matrices_only(self, name: str, zero_dim: str) -> bool:
    """torch's check of ``mT``, ``mH`` and ``adjoint()``: at least two dims; a 0-dim tensor warns and is taken
    (True: the caller returns it, conjugated where the name says so)."""
    if self.ndim >= 2:
        return False
    if self.ndim == 0:
        import warnings

        warnings.warn(zero_dim, UserWarning, stacklevel=3)
        return True
    raise RuntimeError(f"tensor.{name} is only supported on matrices or batches of matrices. Got {self.ndim}-D tensor.")


_T_ON_A_SCALAR = "Tensor.T is deprecated on 0-D tensors. This function is the identity in these cases."
_T_BEYOND_MATRICES = ("The use of `x.T` on tensors of dimension other than 2 to reverse their shape is deprecated and "
                      "it will throw an error in a future release. Consider `x.mT` to transpose batches of matrices "
                      "or `x.permute(*torch.arange(x.ndim - 1, -1, -1))` to reverse the dimensions of a tensor.")


def _reversed_dims(self):
    """``x.T``: the dims reversed, with torch's once-per-process deprecation for other than matrices."""
    if self.ndim != 2:
        warn_once(_T_ON_A_SCALAR if self.ndim == 0 else _T_BEYOND_MATRICES)
    return self.permute(tuple(range(self.ndim - 1, -1, -1)))


def _matrix_transpose(self):
    if _matrices_only(self, "mT", "Tensor.mT is deprecated on 0-D tensors. This function is the identity in these "
                                  "cases."):
        return self
    return self.transpose(-2, -1)


def _matrix_adjoint(self):
    """The conjugate transpose of the last two dims (torch's ``mH``; a plain transpose of real tensors)."""
    if _matrices_only(self, "mH", "Tensor.mH is deprecated on 0-D tensors. Consider using x.conj()."):
        return self.conj()
    return self.transpose(-2, -1).conj()


def _adjoint_2d(self):
    if self.ndim == 0:
        import warnings

        warnings.warn("Tensor.H is deprecated on 0-D tensors. Consider using x.conj().", UserWarning, stacklevel=2)
        return self.conj()
    if self.ndim != 2:
        hint = " For batches of matrices, consider using tensor.mH" if self.ndim > 2 else ""
        raise RuntimeError(f"tensor.H is only supported on matrices (2-D tensors). Got {self.ndim}-D tensor.{hint}")
    return self.t().conj()


def _attach_special_methods(functions: dict) -> None:
    from tilewise.ops.indexing import getitem, setitem

    Tensor.__getitem__ = getitem
    Tensor.__setitem__ = setitem
    where = functions["where"]
    Tensor.where = lambda self, condition, other: where(condition, self, other)
    Tensor.T = property(_reversed_dims)
    Tensor.mT = property(_matrix_transpose)
    Tensor.mH = property(_matrix_adjoint)
    Tensor.H = property(_adjoint_2d)
    Tensor.copy_ = make_copy_()
    bitwise_not = functions["bitwise_not"]

    def __invert__(self):  # noqa: N807 — the operator's method
        """``~x``: torch's Python operator refuses floating and complex tensors before its kernel would."""
        if self.dtype.is_floating_point or self.dtype.is_complex:
            raise TypeError("~ (operator.invert) is only implemented on integer and Boolean-type tensors")
        return bitwise_not(self)

    Tensor.__invert__ = __invert__
    for method in creation.INPLACE_FILLS + creation.NEW_LIKE:
        setattr(Tensor, method.__name__, method)
    functions.update(methods.attach(functions))
    functions.update(aten_spellings.spellings())
    host_methods.attach()
    storage_api.attach()
    functions.update(removed.attach())
    functions.update(statistics.FUNCTIONS)
    functions.update(foreach.FUNCTIONS)
    functions["resize_as_"] = host_methods.resize_as_


def make_copy_():
    def copy_(self, src, non_blocking: bool = False):
        check_no_internal_overlap(self, "copy_")
        return copy_into(self, src, "copy_", non_blocking)

    return copy_


class OpNamespace:
    """``tilewise.ops.mylib``: the custom operators registered under one namespace (``tilewise.library``), by
    name, as ``torch.ops.mylib.name``."""

    def __init__(self, name: str):
        self.name = name

    def __getattr__(self, op: str):
        if f"{self.name}::{op}" not in OVERLOADS:
            raise AttributeError(f"'_OpNamespace' '{self.name}' object has no attribute '{op}'")
        return public_function(f"{self.name}::{op}")

    def __repr__(self) -> str:
        return f"tilewise.ops.{self.name}"


def __getattr__(name: str):
    """``tilewise.ops.<namespace>`` for a namespace that holds custom operators."""
    if not name.startswith("_") and any(qualname.startswith(f"{name}::") for qualname in OVERLOADS):
        return OpNamespace(name)
    raise AttributeError(f"module 'tilewise.ops' has no attribute {name!r} (nor a custom operator namespace of that "
                         "name: register one with tilewise.library.custom_op)")

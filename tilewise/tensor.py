"""Tensor: a strided view on a Storage, plus its autograd identity.

[Note: tensors] A Tensor owns no data: it is ``(storage, shape, strides, offset)`` with a dtype and a
device, so every view operator is pure stride arithmetic (``_strides``) and shares the storage.
Operator methods (``x.exp()``, ``x + y``, ``x.sum(1)``) are not written here: ``tilewise.ops`` attaches
them from the operator declarations, so a method, its function form and its in-place form can never
disagree. What stays here is identity and conversion: shape queries, ``item``/``numpy``/``tolist``,
autograd attributes (``requires_grad``, ``grad``, ``grad_fn``) and pinned memory (through the device's
:class:`~tilewise.device.Backend`).

[Note: methods from above] This module is the bottom of the tensor model, so it imports no layer above it.
The methods that need one are installed by the layer that implements them, when it loads:
``to`` (``ops.conversions``, which dispatches ``_to_copy``), ``backward``, ``retain_grad`` and
``register_hook`` (``autograd``), ``__repr__`` (``_tensor_str``), ``type`` (``tensortypes``); the legacy
constructor ``Tensor(2, 3)`` calls the factory ``ops.creation`` puts in ``FACTORIES``. ``tilewise/_plugins.py``
lists them with every other plug-in point of the core.
"""

from __future__ import annotations

import contextlib
import copy
import warnings
from numbers import Number

import numpy as np

from tilewise import dtypes
from tilewise import strides as _strides
from tilewise._warnings import warn_at_caller
from tilewise.device import Device, as_device, cpu, pinning_backend
from tilewise.device import is_pinned as pinned_by_a_backend
from tilewise.dtypes import (
    DType,
    as_dtype,
    checked_scalar,
    float4_e2m1fn_x2,
    float8_e4m3fn,
    float8_e5m2,
    float8_e8m0fnu,
    get_default_dtype,
    round_to_e8m0,
)
from tilewise.dtypes import from_numpy as dtype_from_numpy
from tilewise.layouts import format_name, strided
from tilewise.storage import Storage


class _TraceHooks:
    """Where the compiler's tracer plugs into tensors (filled when ``tilewise.compiler.capture`` loads):
    ``value_needed(t, what, required)`` runs before Python reads a tensor's values; ``shares_memory(src, dst)``
    when a new tensor object takes a traced tensor's memory (``detach``, ``.data =``); ``version`` and
    ``bump_version`` keep a traced tensor's version counter where eager would keep it, on its memory."""

    value_needed = None
    shares_memory = None
    version = None  # (t) -> the version counter of the memory a traced tensor stands for
    bump_version = None
    untraced = contextlib.nullcontext  # () -> a context in which operators run, not recorded
    grad_assigned = None  # (t) -> None, before ``t.grad = ...`` (a trace learns what .grad was before the call)
    detached = None  # (src, out) -> None, when a real tensor is detached while any thread traces
    grad_read = None  # (t) -> None, when ``t.grad`` is read while any thread traces
    backward_started = None  # (roots, nodes) -> None, as a backward starts while tracing, with every node it reaches
    lay_out = None  # (t, strides) -> None: a fresh traced tensor takes the strides eager gives it (``empty_like``)


TRACE_HOOKS = _TraceHooks()


class _VmapHooks:
    """Where vmap plugs into tensors (filled when ``tilewise.ops.batching`` loads): ``detach(t)`` detaches a
    batched tensor's physical tensor and wraps it again at the same level."""

    detach = None


VMAP_HOOKS = _VmapHooks()


class _AutogradHooks:
    """Where autograd plugs into tensors (filled when ``tilewise.autograd.graph`` loads): ``refuse_stale_view(t)``
    raises torch's refusal for a watched view autograd would refuse to take (see [Note: watched views] in
    ``ops/inplace.py``), when ``t.grad_fn`` is read."""

    @staticmethod
    def refuse_stale_view(t) -> None:
        return None


AUTOGRAD_HOOKS = _AutogradHooks()


def grad_enabled() -> bool:
    """Whether grad mode is on, for the few tensor methods whose meaning depends on it (``numpy()``): the grad
    modes sit above tensors, so ``tilewise._grad_mode`` installs its reader (``register_grad_mode``) on load."""
    return True


def inference_mode_enabled() -> bool:
    """Whether ``tilewise.inference_mode`` is on, for the refusals of inference tensors and the factories below
    that make tensors without the dispatcher; installed with ``grad_enabled``'s reader."""
    return False


def register_grad_mode(reader, inference_reader) -> None:
    global grad_enabled, inference_mode_enabled
    grad_enabled, inference_mode_enabled = reader, inference_reader


def made_here(t: Tensor) -> Tensor:
    """``t``, a tensor a factory made on memory of its own: an inference tensor when made inside inference mode
    (see [Note: inference tensors] in ``storage.py``); operators' outputs are marked by the dispatcher."""
    if inference_mode_enabled() and t._storage is not None:
        t._storage.inference = True
    return t


INFERENCE_INPLACE = ("Inplace update to inference tensor outside InferenceMode is not allowed.You can make a clone to "
                     "get a normal tensor before doing inplace update.See https://github.com/pytorch/rfcs/pull/17 for "
                     "more details.")
INFERENCE_SAVED = ("Inference tensors cannot be saved for backward. Please do not use Tensors created in inference "
                   "mode in computation tracked by autograd. To work around this, you can make a clone to get a "
                   "normal tensor and use it in autograd, or use `tilewise.no_grad()` instead of "
                   "`tilewise.inference_mode()`.")


def _existing_dim(dim: int, shape: tuple) -> int:
    """``dim`` of a tensor of ``shape`` made non-negative for ``size(dim)`` and ``stride(dim)``, or torch's
    IndexError where the tensor has no such dim (a 0-dim tensor has none)."""
    if not shape:
        raise IndexError(f"Dimension specified as {dim} but tensor has no dimensions")
    return _strides.normalize_dim(dim, len(shape))


NON_LEAF_GRAD = ("The .grad attribute of a Tensor that is not a leaf Tensor is being accessed. Its .grad attribute "
                 "won't be populated during autograd.backward(). If you indeed want the .grad field to be populated "
                 "for a non-leaf Tensor, use .retain_grad() on the non-leaf Tensor. If you access the non-leaf Tensor "
                 "by mistake, make sure you access the leaf Tensor instead.")


def vmap_value_error(what: str) -> str:
    """torch's vmap errors for Python reading a batched tensor's values: ``item()`` and the scalar conversions
    built on it have their own, every other read is data-dependent control flow."""
    if what in ("item()", "float()", "int()"):
        return ("vmap: It looks like you're calling .item() on a Tensor. We don't support vmap over calling .item() "
                "on a Tensor, please try to rewrite what you're doing with other operations. If error is occurring "
                "somewhere inside PyTorch internals, please file a bug report.")
    if what == "bool()":
        return ("vmap: It looks like you're attempting to use a Tensor in some data-dependent control flow. We "
                "don't support that yet, please file an issue at https://github.com/pytorch/pytorch/issues .")
    return "Cannot access data pointer of Tensor that doesn't have storage"


class _Factories:
    """Where the operator library plugs in the factory tensors' own constructors call (filled when
    ``tilewise.ops.creation`` loads): ``empty(sizes, dtype=, device=)`` makes ``Tensor(2, 3)`` and the legacy
    types' ``FloatTensor(2, 3)``, with the factory's checks and errors."""

    empty = None


FACTORIES = _Factories()


class Size(tuple):
    """torch.Size: a tuple of ints with a torch-like repr."""

    def __repr__(self) -> str:
        return f"tilewise.Size({list(self)})"

    def numel(self) -> int:
        return _strides.numel(self)

    # sizes joined or repeated stay sizes, as torch's (``x.shape[:-1] + (n,)`` prints as one); indexing is
    # tuple's own, kept fast
    def __add__(self, other):
        if not isinstance(other, tuple):
            raise TypeError(f"can only concatenate tuple (not {type(other).__name__}) to tilewise.Size")
        return Size(tuple.__add__(self, other))

    def __radd__(self, other):
        return Size(tuple.__add__(other, self))

    def __mul__(self, times):
        return Size(tuple.__mul__(self, times))

    __rmul__ = __mul__


class Tensor:
    __slots__ = ("_storage", "_shape", "_strides", "_offset", "_dtype", "_device", "_array", "_requires_grad",
                 "_grad", "_grad_fn", "_output_nr", "_base", "_hooks", "_retains_grad", "_trace", "_wrapped",
                 "__weakref__", "__dict__")

    # A batched tensor of vmap (see [Note: batched tensors] in ops/batching.py) holds ``(level, physical)`` here,
    # in its ``__dict__``; every other tensor reads this class default, so constructing one costs nothing more.
    _vmap = None
    # A leaf that requires grad keeps a weak reference to its AccumulateGrad node here, in its ``__dict__``, once
    # autograd has made one (``autograd.graph.accumulate_node``); reading the class default costs no dict lookup.
    _acc = None
    # A view whose later history autograd must watch (an output of split or unbind, a view made under no_grad of a
    # tensor that requires grad, and views of those) keeps ``(version when made, kind)`` here, in its ``__dict__``;
    # see [Note: watched views] in ops/inplace.py. Every other tensor reads this class default.
    _view_meta = None
    # ``Tensor.data``'s result and its views: their writes are hidden from autograd (see ``Storage.untracked``).
    _untracked = False

    # ------------------------------------------------------------------ construction
    def __new__(cls, *args, **kwargs):
        if cls is not Tensor:  # a subclass's ``T(data)``, ``T(2, 3)``, ``T()``: the tensor Tensor(...) makes, as a T
            # (of a tensor, an alias of its memory, as torch's)
            alias = len(args) == 1 and not kwargs and isinstance(args[0], Tensor)
            made = args[0].detach() if alias else Tensor.__new__(Tensor, *args, **kwargs)
            object.__setattr__(made, "__class__", cls)
            return made
        if not args and not kwargs:
            return _empty_tensor(Size((0,)))
        if args and all(isinstance(a, int) for a in args):
            return FACTORIES.empty(*args, dtype=kwargs.get("dtype", get_default_dtype()), device=kwargs.get("device"))
        if len(args) == 1:
            return tensor(args[0], dtype=kwargs.get("dtype", get_default_dtype()), device=kwargs.get("device"))
        raise TypeError("Tensor(): expected sizes (ints) or data; use tilewise.tensor(data, dtype=...) instead")

    @staticmethod
    def _make(storage: Storage | None, shape: tuple, strides: tuple, offset: int, dtype: DType,
              device: Device) -> Tensor:
        t = object.__new__(Tensor)
        t._storage = storage
        t._shape = shape
        t._strides = strides
        t._offset = offset
        t._dtype = dtype
        t._device = device
        t._array = t._grad = t._grad_fn = t._base = t._hooks = t._trace = None
        t._requires_grad = t._retains_grad = t._wrapped = False
        t._output_nr = 0
        return t

    # ------------------------------------------------------------------ geometry
    @property
    def shape(self) -> Size:
        return Size(self._shape)

    def size(self, dim: int | None = None):
        if dim is None:
            return Size(self._shape)
        return self._shape[_existing_dim(dim, self._shape)]

    def stride(self, dim: int | None = None):
        if dim is None:
            return self._strides
        return self._strides[_existing_dim(dim, self._shape)]

    def storage_offset(self) -> int:
        return self._offset

    @property
    def ndim(self) -> int:
        return len(self._shape)

    def dim(self) -> int:
        return len(self._shape)

    ndimension = dim

    def numel(self) -> int:
        return _strides.numel(self._shape)

    nelement = numel

    @property
    def dtype(self) -> DType:
        return self._dtype

    @property
    def device(self) -> Device:
        return self._device

    @property
    def is_cuda(self) -> bool:
        return self._device.type == "cuda"

    @property
    def is_cpu(self) -> bool:
        return self._device.type == "cpu"

    @property
    def grad_fn(self):
        """The node that made this tensor (None for a leaf). A watched view that autograd would refuse to take
        (made under no_grad or in inference mode, or an output of split or unbind, whose memory was written since)
        raises torch's refusal here too, as torch's regenerating getter does; tilewise's own code reads
        ``_grad_fn``."""
        if self._view_meta is not None:
            AUTOGRAD_HOOKS.refuse_stale_view(self)
        return self._grad_fn

    @grad_fn.setter
    def grad_fn(self, node) -> None:
        self._grad_fn = node

    @property
    def is_leaf(self) -> bool:
        return self.grad_fn is None

    def element_size(self) -> int:
        return self._dtype.itemsize

    itemsize = property(element_size)

    @property
    def nbytes(self) -> int:
        return self.numel() * self._dtype.itemsize

    def is_floating_point(self) -> bool:
        return self._dtype.is_floating_point

    def is_complex(self) -> bool:
        return self._dtype.is_complex

    def is_contiguous(self, memory_format=None) -> bool:
        """Dense in the order of ``memory_format`` (default: row-major); size-1 dims may have any stride. A traced
        value's strides are those eager gives it (see [Note: eager strides of traced values] in compiler/formats.py),
        so ``.contiguous()`` copies it where eager copies."""
        strides = self._strides
        if memory_format is None:
            return _strides.is_contiguous(self._shape, strides)
        return _strides.is_contiguous_as(format_name(memory_format, "is_contiguous"), self._shape, strides)

    @property
    def layout(self):
        """The tensor's layout: always ``tilewise.strided``."""
        return strided

    # dense, unquantized and on a CPU or CUDA device: torch's flags for its other layouts, kinds and devices are
    # False (code asks ``p.grad.is_sparse`` before a dense update)
    is_sparse = is_sparse_csr = is_quantized = is_mkldnn = is_nested = property(lambda self: False)
    is_vulkan = is_ipu = is_mtia = is_xla = property(lambda self: False)

    def untyped_storage(self) -> Storage:
        return self._storage

    def data_ptr(self) -> int:
        self._require_real("data_ptr")
        if not self.numel():
            return 0  # torch: an empty tensor points at nothing
        return self._storage.data_ptr() + self._offset * self._dtype.itemsize

    @property
    def _version(self) -> int:
        storage = self._storage
        if storage is not None:
            if storage.inference:
                raise RuntimeError("Inference tensors do not track version counter.")
            return storage.version - storage.untracked  # what autograd sees (writes through ``.data`` are not)
        return self._write_count()

    def _write_count(self) -> int:
        """The version counter, an inference tensor's included (for caches keyed on a tensor's writes)."""
        if self._storage is not None:
            return self._storage.version
        if self._vmap is not None:
            return self._vmap[1]._version
        return TRACE_HOOKS.version(self) if self._trace is not None else 0

    def _bump_version(self) -> None:
        if self._storage is not None:
            self._storage.version += 1
            if self._untracked:
                self._storage.untracked += 1
        elif self._trace is not None:
            TRACE_HOOKS.bump_version(self)
        elif self._vmap is not None:
            self._vmap[1]._bump_version()
        self._array = None

    # ------------------------------------------------------------------ host access
    def _require_real(self, what: str) -> None:
        """Python code is about to read this tensor's values: while a function is traced, the tracer decides
        (a graph break, or an error naming the user's line); see ``TRACE_HOOKS``. A batched tensor of vmap
        has one value per example, so Python cannot read one: torch's vmap errors."""
        if self._vmap is not None:
            raise RuntimeError(vmap_value_error(what))
        hook = TRACE_HOOKS.value_needed
        if hook is not None:
            hook(self, what, True)
        elif self._trace is not None:
            raise RuntimeError(f"{what}: this tensor belongs to a traced function and has no values")

    def _np(self) -> np.ndarray:
        """The CPU tensor as a numpy view on its storage (no copy)."""
        a = self._array
        if a is None:
            if self._device.type != "cpu":
                raise RuntimeError(
                    f"expected a CPU tensor, got one on {self._device}; use .cpu() to copy it to the host")
            size = self._dtype.itemsize
            if 0 in self._shape:  # an empty view may point anywhere, even past the end of its storage
                a = np.empty(self._shape, self._dtype.np)
            else:
                try:
                    a = np.ndarray(self._shape, self._dtype.np, self._storage.data, self._offset * size,
                                   tuple(s * size for s in self._strides))
                except (TypeError, ValueError):
                    raise RuntimeError(_outgrown_storage(self)) from None
            self._array = a
        return a

    def numpy(self, *, force: bool = False) -> np.ndarray:
        self._require_real("numpy()")
        if self.requires_grad and not force and grad_enabled():  # under no_grad torch hands the values out
            raise RuntimeError("Can't call numpy() on Tensor that requires grad. Use tensor.detach().numpy() instead.")
        if self._device.type != "cpu":
            if not force:
                raise TypeError(f"can't convert {self._device} tensor to numpy. Use Tensor.cpu() to copy the "
                                "tensor to host memory first.")
            return self._host()
        return self._np()

    def _host(self) -> np.ndarray:
        """The values as a numpy array on the host (a copy from a device), after ``_require_real``: the copy
        is not recorded even while a function is traced (a graph break just gave this tensor its values)."""
        with TRACE_HOOKS.untraced():
            return self.detach().cpu()._np()

    # numpy's binary operators defer to an operand of higher priority: ``np.float64(0.5) * x`` is x's __rmul__, a
    # tensor on the graph (numpy's own product would return an array), and ``np.ones(2) * x`` is refused, as in torch
    __array_priority__ = 1000

    def __array__(self, dtype=None, copy=None):
        """``np.asarray(t)``: ``t.numpy()``, with its refusals (a tensor that requires grad while grad mode is on, a
        device tensor), as torch's ``__array__``; ``copy=True`` hands out memory of the array's own."""
        self._require_real("numpy conversion (np.asarray / __array__)")
        a = self.numpy()
        b = a.astype(dtype, copy=False) if dtype is not None else a
        return b.copy() if copy and b is a else b

    def __array_wrap__(self, array, context=None, return_scalar=False):
        """A numpy function's result on a tensor is a tensor again (``np.sin(x)``, ``x + np.ones(2)``); booleans come
        back as uint8, as in torch."""
        if array.dtype == bool:
            array = array.astype(np.uint8)
        return from_numpy(array)

    def item(self):
        self._require_real("item()")
        if self.numel() != 1:
            raise RuntimeError(f"a Tensor with {self.numel()} elements cannot be converted to Scalar; item() "
                               "needs exactly one element")
        return self._host().reshape(()).item() if self._dtype.category else bool(self._host().reshape(()))

    def tolist(self):
        self._require_real("tolist()")
        a = self._host()
        if self._dtype.is_floating_point and a.dtype.itemsize < 4:
            a = a.astype(np.float32)
        return a.tolist()

    def __float__(self) -> float:
        self._require_one_element("float()")
        return float(self.item())

    def __int__(self) -> int:
        self._require_one_element("int()")
        return int(self.item())

    def _require_one_element(self, what: str) -> None:
        if self.numel() != 1:
            raise ValueError(f"{what}: only one element tensors can be converted to Python scalars, got a tensor of "
                             f"shape {list(self._shape)}")

    def __index__(self) -> int:
        if self._dtype.is_floating_point or self.numel() != 1:
            raise TypeError("only integer tensors of a single element can be converted to an index")
        return int(self.item())

    def __contains__(self, element) -> bool:
        """``x in t``: whether some element of ``t`` equals ``x`` (a number or a tensor, broadcast), as torch's."""
        if isinstance(element, (Tensor, Number)):
            return bool((element == self).any().item())
        raise RuntimeError(f"Tensor.__contains__ only supports Tensor or scalar, but you passed in a {type(element)}.")

    def __bool__(self) -> bool:
        self._require_real("bool()")
        if self.numel() != 1:
            raise RuntimeError(f"Boolean value of Tensor with {self.numel()} elements is ambiguous")
        return bool(self.item())

    def __len__(self) -> int:
        if not self._shape:
            raise TypeError("len() of a 0-d tensor")
        return self._shape[0]

    def __iter__(self):
        if not self._shape:
            raise TypeError("iteration over a 0-d tensor")
        return (self[i] for i in range(self._shape[0]))

    def __hash__(self) -> int:
        return id(self)

    def __format__(self, spec: str) -> str:
        if self.ndim == 0 and (self._trace is None or TRACE_HOOKS.value_needed is not None):
            return format(self.item(), spec)
        if spec and self.ndim != 0:  # object.__format__, as torch: a format spec is for one number
            raise TypeError(f"unsupported format string passed to {type(self).__name__}.__format__")
        return repr(self)

    def _attributes(self) -> dict:
        """Attributes set on this tensor (the Parameter flag, a user's own), less ``_acc``, its autograd sink."""
        return {k: v for k, v in self.__dict__.items() if k != "_acc"}

    def __reduce_ex__(self, protocol):
        self._require_real("pickling")
        data = (self._host().copy(), str(self._device), self.requires_grad)
        return (_rebuild, data, self._attributes() or None)

    def __deepcopy__(self, memo):
        """torch's deepcopy: only of a leaf; a parameter becomes a fresh parameter (no grad, no attributes); any
        other tensor keeps its grad, its attributes and its place on its storage, the storage copied once per
        deepcopy, so views copied together stay views of one another."""
        if self._grad_fn is not None:
            raise RuntimeError("Only Tensors created explicitly by the user (graph leaves) support the deepcopy "
                               "protocol at the moment.  If you were attempting to deepcopy a module, this may be "
                               "because of a tilewise.nn.utils.weight_norm usage, see "
                               "https://github.com/pytorch/pytorch/pull/103001")
        if id(self) in memo:
            return memo[id(self)]
        if self.__dict__.get("_is_param") and "_uninitialized" not in self.__dict__:  # as Parameter.__deepcopy__
            out = self.detach().clone().requires_grad_(self.requires_grad)
            out._is_param = True
            memo[id(self)] = out
            return out
        out = self._copy_on_copied_storage(memo)
        out.requires_grad_(self.requires_grad)
        if self._grad is not None:
            out._grad = self._grad.__deepcopy__(memo)
        memo[id(self)] = out  # before the attributes: a bound method among them refers to the tensor
        out.__dict__.update(copy.deepcopy(self._attributes(), memo))
        return out

    def _copy_on_copied_storage(self, memo) -> Tensor:
        if self._storage is None or self._trace is not None:
            return self.detach().clone()
        storage = memo.get(id(self._storage))
        if storage is None:
            flat = Tensor._make(self._storage, (self._storage.numel,), (1,), 0, self._storage.dtype, self._device)
            storage = memo[id(self._storage)] = flat.clone()._storage
            memo.setdefault(id(memo), []).append(self._storage)  # keeps the id above from being reused
        return Tensor._make(storage, self._shape, self._strides, self._offset, self._dtype, self._device)

    # ------------------------------------------------------------------ autograd attributes
    @property
    def requires_grad(self) -> bool:
        """Whether autograd records what reads this tensor: it was asked to (``requires_grad_``), it has a grad_fn,
        or it is a view whose base requires grad now (torch's differentiable views: a view made under no_grad
        follows its base's flag, and ``requires_grad_(False)`` on it changes only its own).

        >>> import tilewise as tw
        >>> x = tw.ones(3, requires_grad=True)
        >>> with tw.no_grad():
        ...     v = x[:2]
        >>> v.requires_grad, v.requires_grad_(False).requires_grad, x.requires_grad_(False) is x, v.requires_grad
        (True, True, True, False)
        """
        if self._requires_grad:
            return True
        base = self._base
        return base is not None and base._requires_grad

    @requires_grad.setter
    def requires_grad(self, value: bool) -> None:
        self.requires_grad_(value)

    def requires_grad_(self, requires_grad: bool = True) -> Tensor:
        if self._grad_fn is not None and not requires_grad:
            raise RuntimeError("you can only change requires_grad flags of leaf variables. If you want to use a "
                               "computed variable in a subgraph that doesn't require differentiation use "
                               "var_no_grad = var.detach().")
        if requires_grad and not (self._dtype.is_floating_point or self._dtype.is_complex):
            raise RuntimeError(f"only Tensors of floating point and complex dtype can require gradients, got "
                               f"{self._dtype}")
        if requires_grad and self.is_inference() and not inference_mode_enabled():
            raise RuntimeError("Setting requires_grad=True on inference tensor outside InferenceMode is not allowed.")
        self._requires_grad = requires_grad
        return self

    @property
    def grad(self) -> Tensor | None:
        hook = TRACE_HOOKS.grad_read
        if hook is not None:
            hook(self)
        grad = self._grad
        if grad is None and self._grad_fn is not None and not self._retains_grad:  # a non-leaf
            warnings.warn(NON_LEAF_GRAD, UserWarning, stacklevel=2)
        return grad

    @grad.setter
    def grad(self, value: Tensor | None) -> None:
        if value is not None and (value._shape != self._shape or value._device is not self._device):
            raise RuntimeError(f"assigned grad has shape {list(value._shape)} on {value._device}, but the tensor "
                               f"has shape {list(self._shape)} on {self._device}")
        hook = TRACE_HOOKS.grad_assigned
        if hook is not None:
            hook(self)
        self._grad = value

    @property
    def data(self) -> Tensor:
        """The tensor's memory, detached, with writes that autograd does not see (torch gives ``.data`` a version
        counter of its own: ``p.data.mul_(2)`` between forward and backward is not an error, and the backward reads
        the new values)."""
        out = self.detach()
        if out._storage is not None:
            out.__dict__["_untracked"] = True
        return out

    @data.setter
    def data(self, value: Tensor) -> None:
        self._storage, self._shape = value._storage, value._shape
        self._strides, self._offset = value._strides, value._offset
        self._dtype, self._device, self._array, self._trace = value._dtype, value._device, None, value._trace
        self.__dict__.pop("_tw_alias", None)
        if value._trace is not None:
            TRACE_HOOKS.shares_memory(value, self)

    def detach(self) -> Tensor:
        if self._storage is None and self._vmap is not None:  # the storage test first: one slot read in the common case
            return VMAP_HOOKS.detach(self)
        out = Tensor._make(self._storage, self._shape, self._strides, self._offset, self._dtype, self._device)
        out._array = self._array  # same storage and geometry, so the same numpy view
        if self._trace is not None:
            out._trace = self._trace
            TRACE_HOOKS.shares_memory(self, out)
        elif TRACE_HOOKS.detached is not None:
            TRACE_HOOKS.detached(self, out)
        return out

    def detach_(self) -> Tensor:
        """Detach this tensor from the graph that made it, in place; refused for a view, as torch refuses it."""
        if self._base is not None:
            raise RuntimeError(
                "Can't detach views in-place. Use detach() instead. If you are using DistributedDataParallel (DDP) "
                "for training, and gradient_as_bucket_view is set as True, gradients are views of DDP buckets, and "
                "hence detach_() cannot be called on these gradients. To fix this error, please refer to the "
                "Optimizer.zero_grad() function in tilewise/optim/optimizer.py as the solution.")
        self._grad_fn = None
        self._requires_grad = False
        return self

    @property
    def retains_grad(self) -> bool:
        return self._retains_grad

    def is_inference(self) -> bool:
        """Whether this is an inference tensor: made inside ``tilewise.inference_mode``, or a view of one.

        >>> import tilewise as tw
        >>> with tw.inference_mode():
        ...     x = tw.ones(2)
        >>> x.is_inference(), x[0].is_inference(), x.clone().is_inference()
        (True, True, False)
        """
        storage = self._storage
        if storage is None:
            return self._vmap is not None and self._vmap[1].is_inference()
        return storage.inference

    def _is_view(self) -> bool:
        """Whether autograd tracks this tensor as a view of another (its ``_base``), as torch's ``_is_view``."""
        return self._base is not None

    # ------------------------------------------------------------------ device / dtype conversion
    def cpu(self) -> Tensor:
        return self.to(cpu)

    def cuda(self, device=None, non_blocking: bool = False) -> Tensor:
        target = Device("cuda", device) if device is None or isinstance(device, int) else as_device(device)
        return self.to(target, non_blocking=non_blocking)

    def type_as(self, other: Tensor) -> Tensor:
        return self.to(other._dtype)

    def pin_memory(self) -> Tensor:
        """A copy of this CPU tensor in page-locked memory (``self`` if it already is), from which
        ``.to("cuda", non_blocking=True)`` copies without blocking the host. Needs CUDA.

        >>> import tilewise as tw
        >>> x = tw.ones(4).pin_memory()  # doctest: +SKIP
        >>> x.is_pinned()  # doctest: +SKIP
        True
        """
        if self._device.type != "cpu":
            raise RuntimeError(f"pin_memory(): only CPU tensors can be pinned, this one is on {self._device}")
        if self.is_pinned():
            return self
        return pinning_backend().pin_memory(self)

    def is_pinned(self) -> bool:
        """True when this CPU tensor (or the tensor it views) lives in page-locked memory."""
        if self._device.type != "cpu" or self._storage is None:
            return False
        return pinned_by_a_backend(self)


_CONVERSIONS = {"float": "float32", "double": "float64", "half": "float16", "bfloat16": "bfloat16", "long": "int64",
                "int": "int32", "short": "int16", "char": "int8", "byte": "uint8", "bool": "bool"}


def _conversion(method: str, dtype: DType):
    def convert(self: Tensor) -> Tensor:
        return self.to(dtype)

    convert.__name__ = convert.__qualname__ = method
    convert.__doc__ = f"``self.to(tilewise.{dtype.name})``"
    return convert


for _method, _name in _CONVERSIONS.items():
    setattr(Tensor, _method, _conversion(_method, as_dtype(_name)))


def _parse_to(t: Tensor, *args, **kwargs):
    device = kwargs.pop("device", None)
    dtype = kwargs.pop("dtype", None)
    non_blocking = kwargs.pop("non_blocking", False)
    copy = kwargs.pop("copy", False)
    memory_format = kwargs.pop("memory_format", None)
    if memory_format is not None:
        format_name(memory_format, "to")
    if kwargs:
        raise TypeError(f"to(): unexpected keyword arguments {sorted(kwargs)}")
    for a in args:
        if isinstance(a, Tensor):
            device, dtype = a._device, a._dtype
        elif isinstance(a, DType) or a in (float, int, bool) or type(a).__name__ == "dtype":
            dtype = as_dtype(a)
        elif isinstance(a, (str, Device)) or type(a).__name__ == "device":
            device = as_device(a)
        elif isinstance(a, bool):
            non_blocking = a
        else:
            raise TypeError(f"to(): expected a device, dtype or tensor, got {a!r}")
    return (as_device(device) if device is not None else None, as_dtype(dtype) if dtype is not None else None,
            non_blocking, copy, memory_format)


def _rebuild(array: np.ndarray, device: str, requires_grad: bool) -> Tensor:
    out = made_here(from_array(array.copy())).to(device)
    return out.requires_grad_(requires_grad) if requires_grad else out


# ---------------------------------------------------------------------- numpy ⇄ tensor

_E4M3FN_MAX = 448.0


try:  # numpy >= 2 keeps its floating-point error state in a context variable: setting it costs a tenth of errstate
    from numpy._core._ufunc_config import _extobj_contextvar as _numpy_errors
    from numpy._core._ufunc_config import _make_extobj

    _IGNORE_ALL = _make_extobj(all="ignore")
except (ImportError, AttributeError, TypeError):  # a numpy whose private names moved: errstate, slower
    _numpy_errors = None


def _astype_quietly(a: np.ndarray, np_dtype: np.dtype) -> np.ndarray:
    if _numpy_errors is None:
        with np.errstate(all="ignore"):
            return a.astype(np_dtype)
    token = _numpy_errors.set(_IGNORE_ALL)
    try:
        return a.astype(np_dtype)
    finally:
        _numpy_errors.reset(token)


def _outgrown_storage(t: Tensor) -> str:
    return (f"a tensor of sizes {list(t._shape)}, strides {list(t._strides)}, storage offset {t._offset} and itemsize "
            f"{t._dtype.itemsize} needs more memory than its storage's {t._storage.nbytes()} bytes (was the storage "
            "resized with untyped_storage().resize_()?)")


def cast_array(a: np.ndarray, np_dtype: np.dtype) -> np.ndarray:
    """``a`` converted to ``np_dtype`` bit for bit as torch converts: float8_e4m3fn has no infinity, so finite
    values beyond its range and infinities become ±448 rather than NaN; a float8_e5m2 NaN has every mantissa
    bit set."""
    if np_dtype == float4_e2m1fn_x2.np or a.dtype == float4_e2m1fn_x2.np:
        raise fp4_cast_error(a.dtype, np_dtype)
    if a.dtype.kind == "c" and np_dtype.kind != "c":  # torch keeps the real part (bool: whether either is nonzero)
        a = a != 0 if np_dtype.kind == "b" else a.real
    if np_dtype == float8_e8m0fnu.np:
        return round_to_e8m0(a)
    if np_dtype == float8_e4m3fn.np and a.dtype != np_dtype and a.dtype.kind != "b":
        a = np.clip(a if a.dtype.kind == "f" else a.astype(np.float32), -_E4M3FN_MAX, _E4M3FN_MAX)
    # From floating values, NaN, inf and out-of-range values (1e10 to float16, 3e38 to an int): torch gives the
    # CPU's conversion, without a warning
    out = _astype_quietly(a, np_dtype) if a.dtype.kind in "fcV" else a.astype(np_dtype)
    if np_dtype == float8_e5m2.np:
        out.view(np.uint8)[np.isnan(out)] |= 1
    return out


def fp4_cast_error(source: np.dtype, target: np.dtype) -> NotImplementedError:
    names = [dtype_from_numpy(d).name for d in (source, target)]
    return NotImplementedError(f"_to_copy: a cast from {names[0]} to {names[1]} is not implemented, as in torch: "
                               "float4_e2m1fn_x2 holds two packed FP4 values per byte and converts to nothing; read "
                               "its bytes with .view(tilewise.uint8), or make and read FP4 data with "
                               "tilewise.quantize(t, 'nvfp4') and tilewise.dequantize(q)")


def from_array(a: np.ndarray, dtype: DType | None = None) -> Tensor:
    """Wrap a numpy array as a CPU tensor without copying when its layout allows (non-negative strides)."""
    dtype = dtype or dtype_from_numpy(a.dtype)
    if a.dtype is not dtype.np and a.dtype != dtype.np:  # identity first: numpy's own dtypes are singletons
        a = cast_array(a, dtype.np)
    if a.flags.c_contiguous:
        return from_contiguous_array(a, dtype)
    size = a.itemsize
    strides = a.strides
    if all(s >= 0 and s % size == 0 for s in strides) and a.size:
        base = a.base if isinstance(a.base, np.ndarray) else None
        if base is not None and base.flags.c_contiguous and base.dtype == a.dtype:
            flat = base.reshape(-1)
            offset = (a.__array_interface__["data"][0] - flat.__array_interface__["data"][0]) // size
            if 0 <= offset and _strides.storage_span(a.shape, [s // size for s in strides], offset) <= flat.shape[0]:
                return Tensor._make(Storage(flat, cpu, dtype, flat.shape[0]), a.shape,
                                    tuple(s // size for s in strides), offset, dtype, cpu)
        if _strides.is_non_overlapping_and_dense(a.shape, [s // size for s in strides]):
            flat = a.ravel(order="K")
            if np.shares_memory(flat, a):
                return Tensor._make(Storage(flat, cpu, dtype, flat.shape[0]), a.shape,
                                    tuple(s // size for s in strides), 0, dtype, cpu)
    return from_array(np.ascontiguousarray(a), dtype)


_new_object = object.__new__


def from_contiguous_array(a: np.ndarray, dtype: DType) -> Tensor:
    """A CPU tensor on ``a`` itself, which must be C-contiguous and of ``dtype``'s numpy type (a kernel's fresh
    result): ``from_array`` without its checks, and ``Tensor._make`` spelled out (every slot as there, which a test
    asserts), since every eager CPU operator ends here and a call costs a tenth of a tiny operator's time."""
    shape = a.shape
    strides = _strides.cached_contiguous_strides(shape)
    if strides is None:
        strides = _strides.contiguous_strides(shape)
    t = _new_object(Tensor)
    t._storage = Storage(a.ravel(), cpu, dtype, a.size)
    t._shape = shape
    t._strides = strides
    t._offset = 0
    t._dtype = dtype
    t._device = cpu
    t._array = a
    t._grad = t._grad_fn = t._base = t._hooks = t._trace = None
    t._requires_grad = t._retains_grad = t._wrapped = False
    t._output_nr = 0
    return t


def from_array_strided(a: np.ndarray, strides: tuple, dtype: DType | None = None) -> Tensor:
    """A CPU tensor with ``a``'s values laid out with the given dense ``strides`` (a channels-last result, say):
    ``a`` itself when it already lies so, else a copy."""
    t = from_array(a, dtype)
    if t._strides == strides:
        return t
    shape = t._shape
    if t._offset == 0 and all(x == y or n == 1 for x, y, n in zip(t._strides, strides, shape)):
        return Tensor._make(t._storage, shape, strides, 0, t._dtype, cpu)  # size-1 dims: same memory
    return strided_copy(t._np(), strides, t._dtype)


def strided_copy(a: np.ndarray, strides: tuple, dtype: DType) -> Tensor:
    """A new CPU tensor with ``a``'s values (of ``dtype``'s numpy type) written once into the dense ``strides``."""
    flat = np.empty(_strides.storage_span(a.shape, strides, 0), dtype.np)
    size = flat.itemsize
    np.lib.stride_tricks.as_strided(flat, a.shape, tuple(st * size for st in strides))[...] = a
    return Tensor._make(Storage(flat, cpu, dtype, flat.shape[0]), tuple(a.shape), strides, 0, dtype, cpu)


def _empty_tensor(shape) -> Tensor:
    dtype = get_default_dtype()
    return from_array(np.empty(shape, dtype.np), dtype)


def _numpy_dtypes() -> frozenset:
    return frozenset(d.np for d in dtypes.ALL)


_NUMPY_DTYPES = _numpy_dtypes()


def _leaves(data):
    """The non-sequence elements of nested lists and tuples, depth first."""
    if isinstance(data, (list, tuple)):
        for x in data:
            yield from _leaves(x)
    else:
        yield data


def _ragged(data, op: str) -> ValueError:
    """torch's error for nested sequences of unequal lengths, naming the first dim where they differ."""
    def shape_of(x) -> list[int]:
        return [len(x), *shape_of(x[0])] if isinstance(x, (list, tuple)) and x else \
            ([0] if isinstance(x, (list, tuple)) else [])

    def check(x, dims: list[int], depth: int):
        if depth == len(dims):
            if isinstance(x, (list, tuple)):
                return f"expected a number at dim {depth}, got a sequence of length {len(x)}"
            return None
        if not isinstance(x, (list, tuple)):
            return f"expected a sequence of length {dims[depth]} at dim {depth}, got a number ({x!r})"
        if len(x) != dims[depth]:
            return f"expected sequence of length {dims[depth]} at dim {depth} (got {len(x)})"
        return next((m for m in (check(e, dims, depth + 1) for e in x) if m), None)

    found = check(data, shape_of(data), 0) or "nested sequences of unequal lengths"
    return ValueError(f"{op}(): data is not rectangular: {found}; nested lists of one depth must have one length")


def _not_a_number(value, op: str) -> Exception:
    kind = type(value).__name__
    if isinstance(value, (str, bytes)):
        return TypeError(f"{op}(): invalid data type '{kind}': data must be numbers (bool, int, float), nested "
                         "lists or tuples of them, a numpy array or a tensor")
    return RuntimeError(f"{op}(): Could not infer dtype of {kind}: data must be numbers (bool, int, float), nested "
                        "lists or tuples of them, a numpy array or a tensor")


def _int64_overflow(value, op: str) -> ValueError:
    return ValueError(f"{op}(): Overflow when unpacking long long: {value} does not fit in int64 (from "
                      f"{-(1 << 63)} to {(1 << 63) - 1}); give dtype=tilewise.float64 to store it approximately")


def _numbers_array(data, op: str) -> np.ndarray:
    """``data`` (a number, nested sequences of numbers) as numpy sees it, with torch's errors for data that is
    not numbers or not rectangular. Integers beyond int64 stay Python ints in an object array."""
    try:
        arr = np.array(data)
    except ValueError:
        raise _ragged(data, op) from None
    if arr.dtype.kind in "OUS":
        for leaf in _leaves(data):
            if not isinstance(leaf, (Number, np.generic)):
                raise _not_a_number(leaf, op)
        if any(isinstance(x, (float, np.floating)) for x in _leaves(data)):
            arr = arr.astype(np.float64)  # integers beyond int64 beside floats: the data is floating
    return arr


def _infer_dtype(data, arr: np.ndarray) -> DType:
    first = data
    while isinstance(first, (list, tuple)) and first:
        first = first[0]
    if isinstance(first, np.generic):  # numpy scalars keep their own dtype, as in torch
        return dtype_from_numpy(arr.dtype)
    kind = arr.dtype.kind
    if kind == "b":
        return dtypes.bool_
    if kind in "iuO":
        return dtypes.int64
    if kind == "c":
        return dtypes.default_complex_dtype()
    if kind == "f" and not isinstance(first, float) and arr.size and np.abs(arr).max() >= 2.0 ** 63 and \
            not any(isinstance(x, float) for x in _leaves(data)):  # numpy's float64 for ints like [2**63, -1]
        raise _int64_overflow(max(_leaves(data), key=abs), "tensor")
    return get_default_dtype()


def _fitted(arr: np.ndarray, dtype: DType, op: str) -> np.ndarray:
    """``arr`` as ``dtype`` holds it, refusing a value it cannot hold (see [Note: scalar overflow] in dtypes)."""
    kind = arr.dtype.kind
    if dtype.is_floating_point or dtype.is_complex:
        return arr.astype(np.float64) if kind in "Ou" else arr
    if dtype.name == "bool" or not arr.size or (kind in "ib" and dtype.np == np.int64):
        return arr  # every value fits
    if kind == "O" or (kind == "u" and arr.max() >= 1 << 63):  # Python ints past int64
        raise _int64_overflow(max(arr.reshape(-1).tolist(), key=abs), op)
    for value in (arr.min(), arr.max()):  # the extremes (NaN, if any, among them) decide
        checked_scalar(value.item(), dtype, f"{op}()")
    return arr


COPY_CONSTRUCT = ("To copy construct from a tensor, it is recommended to use sourceTensor.detach().clone() or "
                  "sourceTensor.detach().clone().requires_grad_(True), rather than {}.")


def copy_construct(data: Tensor, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    """A detached copy of ``data`` (of ``dtype`` on ``device`` where given), as ``tensor(data)`` makes."""
    out = data.detach().to(dtype=as_dtype(dtype) if dtype else data.dtype, device=device, copy=True)
    return out.requires_grad_(requires_grad) if requires_grad else out


def tensor(data, *, dtype=None, device=None, requires_grad: bool = False, pin_memory: bool = False) -> Tensor:
    """Build a tensor by copying ``data`` (a number, nested sequence, numpy array or tensor); with ``pin_memory``
    the copy is a CPU tensor in page-locked memory, as :meth:`Tensor.pin_memory` makes (needs CUDA).

    >>> import tilewise as tw
    >>> tw.tensor([[1, 2], [3, 4]]).dtype
    tilewise.int64
    """
    if pin_memory:
        check_pinnable(as_device(device) if device is not None else cpu, "tensor")
        out = tensor(data, dtype=dtype).pin_memory()
        return out.requires_grad_(True) if requires_grad else out
    if isinstance(data, Tensor):
        warn_at_caller(COPY_CONSTRUCT.format("torch.tensor(sourceTensor)"))
        return copy_construct(data, dtype, device, requires_grad)
    if isinstance(data, np.ndarray):
        dt = as_dtype(dtype) if dtype is not None else dtype_from_numpy(_supported(data, "tensor").dtype)
        out = made_here(from_array(cast_array(data, dt.np), dt))  # a copy, converted as torch converts (quietly)
    else:
        typed = _typed_leaves_dtype(data) if isinstance(data, (list, tuple)) else None
        if typed is not None:
            data = _tensor_leaves_as_numbers(data)
        arr = _numbers_array(data, "tensor")
        dt = as_dtype(dtype) if dtype is not None else typed or _infer_dtype(data, arr)
        out = made_here(from_array(cast_array(_fitted(arr, dt, "tensor"), dt.np), dt))
    if device is not None and as_device(device) is not cpu:
        out = out.to(as_device(device))
    return out.requires_grad_(True) if requires_grad else out


def check_pinnable(device: Device, factory: str) -> None:
    """Refuse ``pin_memory=True`` for a factory asked for a tensor on ``device``. The factories pin through
    :meth:`Tensor.pin_memory`'s backend, so without CUDA their error is that method's."""
    if device.type != "cpu":
        raise RuntimeError(f"{factory}(): pin_memory=True makes a page-locked CPU tensor, but this one would be made "
                           f"on {device}; only CPU tensors can be pinned")


def _python_number_dtype(x) -> DType:
    if isinstance(x, (bool, np.bool_)):
        return dtypes.bool_
    if isinstance(x, int):
        return dtypes.int64
    if isinstance(x, complex):
        return dtypes.default_complex_dtype()
    return get_default_dtype()


def _typed_leaves_dtype(data) -> DType | None:
    """[Note: tensors inside lists] torch.tensor infers a nested list's dtype by promoting the type of every leaf:
    a tensor, numpy array or numpy scalar brings its own dtype (``[tensor(1., dtype=float64), 2.]`` is float64,
    ``[1., np.float64(2.)]`` too), a Python number the dtype it would have alone. The promoted dtype, where some
    leaf carries one; None for lists of Python numbers alone, whose inference numpy's array already does."""
    leaves = list(_leaves(data))
    if not any(isinstance(x, (Tensor, np.ndarray, np.generic)) for x in leaves):
        return None
    out = None
    for x in leaves:
        if isinstance(x, Tensor):
            leaf = x.dtype
        elif isinstance(x, (np.ndarray, np.generic)) and x.dtype in _NUMPY_DTYPES:
            leaf = dtype_from_numpy(x.dtype)
        elif isinstance(x, Number):
            leaf = _python_number_dtype(x)
        else:
            return None  # not numbers: _numbers_array names the offending leaf
        out = leaf if out is None else dtypes.promote_types(out, leaf)
    return out


def _tensor_leaves_as_numbers(data):
    """A tensor inside a list is one number, as torch reads it (a tensor is not a sequence to torch.tensor):
    ``[tensor([1.5])]`` has shape (1,), and a leaf of more or fewer than one element is an error."""
    if isinstance(data, Tensor):
        if data.numel() != 1:
            raise ValueError("only one element tensors can be converted to Python scalars (tensor(): a tensor inside "
                             f"a list is read as one number, but one of shape {list(data.shape)} was given; stack "
                             "tensors with tilewise.stack instead)")
        return data.item()
    if isinstance(data, (list, tuple)):
        return [_tensor_leaves_as_numbers(x) for x in data]
    return data


def as_tensor(data, dtype=None, device=None) -> Tensor:
    if isinstance(data, Tensor):
        return data.to(dtype=as_dtype(dtype) if dtype else data.dtype, device=device or data.device)
    if isinstance(data, np.ndarray) and device in (None, "cpu", cpu):
        if dtype is None or as_dtype(dtype).np == data.dtype:
            _warn_if_read_only(data, "as_tensor")
            return made_here(from_array(_supported(data, "as_tensor")))
    return tensor(data, dtype=dtype, device=device)


def _supported(array: np.ndarray, op: str) -> np.ndarray:
    """``array``, if tilewise has its dtype; else torch's TypeError, naming the dtypes that work."""
    if array.dtype not in _NUMPY_DTYPES:
        raise TypeError(f"{op}(): can't convert a numpy array of dtype {array.dtype}; the supported dtypes are "
                        f"{', '.join(d.name for d in dtypes.ALL)} (convert with array.astype(...) first)")
    return array


def _warn_if_read_only(array: np.ndarray, op: str) -> None:
    if not array.flags.writeable:
        warnings.warn(f"{op}(): the given numpy array is not writable; the tensor shares its memory, so writing to "
                      "the tensor will raise. Copy the array first (array.copy() or tilewise.tensor(array)) to get a "
                      "writable tensor.", UserWarning, stacklevel=3)


def from_numpy(array: np.ndarray) -> Tensor:
    if not isinstance(array, np.ndarray):
        raise TypeError(f"from_numpy(): expected np.ndarray, got {type(array).__name__}")
    _warn_if_read_only(array, "from_numpy")
    t = from_array(_supported(array, "from_numpy"))
    if not np.shares_memory(t._np(), array) and array.size:
        raise ValueError("from_numpy(): arrays with negative strides are not supported; use array.copy() first")
    if not array.size and min(array.strides, default=-1) >= 0:  # an empty array's strides, in elements, as torch's
        t._strides = tuple(s // array.itemsize for s in array.strides)
    t._storage.resizable_memory = False  # the array's memory: resize_ is refused, as torch's
    return made_here(t)


def is_tensor(obj) -> bool:
    return isinstance(obj, Tensor)


def is_inference(input: Tensor) -> bool:  # noqa: A002 — torch's parameter name
    """Whether ``input`` is an inference tensor (see :meth:`Tensor.is_inference`)."""
    if not isinstance(input, Tensor):
        raise TypeError(f"is_inference(): argument 'input' (position 1) must be Tensor, not {type(input).__name__}")
    return input.is_inference()


def wrap_scalar(value: Number, dtype: DType, device: Device) -> Tensor:
    """A 0-dim tensor for a Python scalar (marked as a wrapped number for type promotion)."""
    t = from_array(np.asarray(value, dtype=dtype.np), dtype)
    if device is not cpu:
        t = t.to(device)
    t._wrapped = True
    return t

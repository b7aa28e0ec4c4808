"""Creation, copy and random operators, and the torch-style factory functions over them.

Factories accept sizes as varargs or one sequence (``zeros(2, 3)`` and ``zeros((2, 3))``) like torch; the
declared operators take one ``int[] size`` so every backend sees a single form. Random operators draw from
a ``Generator`` whose state is ``(seed, offset)`` into the Philox4x32-10 stream (``tilewise._philox``):
a draw consumes counters and advances the offset, and the CUDA kernels compute the same counters, so a
seed gives bit-identical tensors on CPU and GPU.
"""

from __future__ import annotations

import functools
import math
import operator
from numbers import Number

import numpy as np

from tilewise import strides as S
from tilewise._warnings import warn_at_caller
from tilewise.device import Device, as_device, default_device, pinning_backend
from tilewise.dtypes import (
    DType,
    as_dtype,
    bool_,
    c10_name,
    checked_scalar,
    default_complex_dtype,
    get_default_dtype,
    scalar_dtype,
)
from tilewise.layouts import copy_strides, format_name
from tilewise.ops import dtype_rules as R
from tilewise.ops.batching import apply_directly
from tilewise.ops.batching_rules import write_into
from tilewise.ops.inplace import copy_into
from tilewise.ops.registry import declare
from tilewise.ops.schema import register_generator_class
from tilewise.overrides import overridden_call, routed_to_overrides
from tilewise.storage import HostOutOfMemoryError, out_of_host_memory
from tilewise.tensor import FACTORIES, TRACE_HOOKS, Tensor, check_pinnable


def factory_out(name: str):
    """``out=`` for a factory function (see [Note: out= arguments] in ``ops/out_args.py``): the values are made
    with ``out``'s dtype and device unless given, as torch's factories do, and written into ``out``."""
    def wrap(fn):
        @functools.wraps(fn)
        def factory(*args, out=None, **kwargs):
            if out is None:
                return fn(*args, **kwargs)
            from tilewise.ops.out_args import write_out

            if type(out) is not Tensor:
                raise TypeError(f"{name}(): argument 'out' must be Tensor, not {type(out).__name__}")
            dtype = kwargs.get("dtype")
            if dtype is not None and as_dtype(dtype) is not out.dtype:
                raise RuntimeError(f"dtype {c10_name(as_dtype(dtype))} does not match dtype of out parameter "
                                   f"({c10_name(out.dtype)})")
            kwargs["dtype"] = out.dtype
            kwargs.setdefault("device", out.device)
            return write_out(name, fn(*args, **kwargs), out)

        return factory

    return wrap


# ---------------------------------------------------------------- declarations
declare("full(int[] size, Scalar fill_value, *, ScalarType? dtype=None, Device? device=None) -> Tensor",
        "creation", differentiable=False, public=False)
declare("empty(int[] size, *, ScalarType? dtype=None, Device? device=None) -> Tensor", "creation",
        differentiable=False, public=False)
declare("arange(Scalar start, Scalar end, Scalar step=1, *, ScalarType? dtype=None, Device? device=None) -> Tensor",
        "creation", differentiable=False, public=False)
declare("linspace(Scalar start, Scalar end, int steps, *, ScalarType? dtype=None, Device? device=None) -> Tensor",
        "creation", differentiable=False, public=False)
declare("eye(int n, int? m=None, *, ScalarType? dtype=None, Device? device=None) -> Tensor", "creation",
        differentiable=False, public=False)
declare("_to_copy(Tensor self, ScalarType? dtype=None, Device? device=None, bool non_blocking=False, *, "
        "MemoryFormat? memory_format=None) -> Tensor",
        "copy", grad={"self": "grad"}, fwd="auto_linear", public=False, batch=apply_directly)
declare("clone(Tensor self, *, MemoryFormat? memory_format=None) -> Tensor", "copy", grad={"self": "grad"},
        fwd="auto_linear", batch=apply_directly, out=False)
declare("_write_(Tensor(a!) self, Tensor src) -> Tensor(a!)", "copy", differentiable=False, public=False,
        doc="Copy src (already of self's shape, dtype and device) into self's memory; no autograd.", batch=write_into)
declare("_overwrite(Tensor self, Tensor src) -> Tensor", "pointwise", expr=lambda a, b: b, dtype=R.first_input,
        grad={"self": "zeros_like(grad)", "src": "grad"}, fwd="auto_linear", public=False,
        doc="src's values standing for self after an in-place write of values that need no gradient into a tensor "
            "that does (fill_, zero_, copy_ of a constant): the gradient reaching self's earlier history is zero, "
            "as torch's FillBackward and CopyBackwards give.")
declare("uniform(int[] size, float low=0.0, float high=1.0, *, ScalarType? dtype=None, Device? device=None, "
        "Generator? generator=None) -> Tensor", "random", differentiable=False, public=False)
declare("normal_sample(int[] size, *, ScalarType? dtype=None, Device? device=None, Generator? generator=None) "
        "-> Tensor", "random", differentiable=False, public=False)
declare("randint(int low, int high, int[] size, *, ScalarType? dtype=None, Device? device=None, "
        "Generator? generator=None) -> Tensor", "random", differentiable=False, public=False)
declare("bernoulli(Tensor self, *, Generator? generator=None) -> Tensor", "random", dtype=R.first_input,
        differentiable=False)
def _binomial_dtype(op, args) -> tuple:
    """torch's checks, in its order: floating count and prob, of one dtype, float32 or float64."""
    count, prob = args[0], args[1]
    for name, t in (("count", count), ("prob", prob)):
        if not t.dtype.is_floating_point:
            raise ValueError(f"binomial only supports floating-point dtypes for {name}, got: {c10_name(t.dtype)}")
    if prob.dtype is not count.dtype:
        raise RuntimeError(f"Found dtype {c10_name(prob.dtype)} but expected {c10_name(count.dtype)}")
    if count.dtype.itemsize < 4:
        raise NotImplementedError(f'"binomial_{count.device.type}" not implemented for \'{c10_name(count.dtype)}\'')
    return count.dtype, count.dtype


# See [Note: Poisson and binomial samples] in backends/cpu/sampling_kernels.py.
declare("poisson(Tensor self, Generator? generator=None) -> Tensor", "random", dtype=R.floating_kernel,
        grad={"self": "zeros_like(grad)"}, fwd="zeros_like(self_t)", method=False, out=False,
        doc="One Poisson sample per element of the rates ``self`` (torch's samplers, Philox's uniforms).\n\n"
            ">>> tw.poisson(tw.zeros(2))\ntensor([0., 0.])")
declare("binomial(Tensor count, Tensor prob, Generator? generator=None) -> Tensor", "random", dtype=_binomial_dtype,
        grad={"count": "aten_derivative_not_implemented('binomial')",
              "prob": "aten_derivative_not_implemented('binomial')"},
        fwd="forward_not_implemented('aten::binomial')", method=False, out=False,
        doc="One binomial sample per element of ``count`` trials of success probability ``prob`` (broadcast).\n\n"
            ">>> tw.binomial(tw.tensor([3.0]), tw.tensor([1.0]))\ntensor([3.])")
declare("randperm(int n, *, ScalarType? dtype=None, Device? device=None, Generator? generator=None) -> Tensor",
        "random", differentiable=False, public=False)
declare("multinomial(Tensor self, int num_samples, bool replacement=False, *, Generator? generator=None) -> Tensor",
        "random", differentiable=False,
        doc="``num_samples`` category indices per row of the (unnormalised) probabilities ``self``; without "
            "replacement each category is drawn at most once. See [Note: multinomial draws].\n\n"
            ">>> tw.multinomial(tw.tensor([0.0, 1.0, 0.0]), 1)\ntensor([1])")

MULTINOMIAL_TILES = 256
"""Tiles of the fixed order in which multinomial sums a row's weights (see [Note: multinomial draws])."""


def check_multinomial(self: Tensor, num_samples: int, replacement: bool) -> None:
    """Refuse arguments no backend samples from (shared by every backend's multinomial kernel).

    [Note: multinomial draws]
    Row r's sample j takes the float64 uniform draw u number ``r * num_samples + j`` of the generator, and is the
    category whose stretch of the cumulative weights holds ``x = u * total``: the number of categories whose
    cumulative weight is at most x (at most n - 1, since x can round up to the total), moved back over
    categories of weight zero (so one is never drawn while any weight remains). Without replacement a drawn
    category's weight then counts as zero, and once no weight remains the lowest category not yet drawn is
    taken. For the same seed to give the same samples on every backend, the float64 cumulative sums are
    defined by one order of additions, chosen so that a GPU block of :data:`MULTINOMIAL_TILES` threads
    computes it in parallel: the row is cut into that many tiles of ``ceil(n / MULTINOMIAL_TILES)``
    categories; prefix sums run left to right inside each tile, the tiles' totals are summed left to right,
    and the cumulative weight of a category is (the sum of the totals of the tiles before its own) + (its
    prefix inside its tile). numpy computes the same numbers with two ``cumsum`` calls. Samples with
    replacement search these sums once per row; without replacement they are recomputed after each draw.
    """
    if not self.dtype.is_floating_point:
        raise RuntimeError(f"multinomial: probabilities must have a floating-point dtype, got {self.dtype.name}")
    if self.ndim not in (1, 2):
        raise RuntimeError(f"multinomial: prob_dist must be 1 or 2 dim, got shape {list(self.shape)}")
    if num_samples <= 0:
        raise RuntimeError(f"multinomial: cannot sample n_sample <= 0 samples, got num_samples={num_samples}")
    if not replacement and num_samples > self.shape[-1]:
        raise RuntimeError(f"multinomial: cannot sample n_sample={num_samples} > prob_dist.size(-1)="
                           f"{self.shape[-1]} samples without replacement")


def check_probabilities(invalid: bool, weightless: bool) -> None:
    """Refuse probabilities holding a negative, infinite or NaN element (``invalid``), or a row whose
    probabilities are all zero (``weightless``), in the words every backend uses."""
    if invalid:
        raise RuntimeError("multinomial: probability tensor contains either `inf`, `nan` or element < 0")
    if weightless:
        raise RuntimeError("multinomial: invalid multinomial distribution (sum of probabilities <= 0)")


def refuse_entry_drawn_with_replacement(rows: np.ndarray) -> None:
    """torch's CPU sampler with replacement (more than one sample) names the first bad entry it meets, row by row:
    a negative or NaN one, or an infinite one, in words of its own."""
    flat = rows.reshape(-1)
    first = flat[np.flatnonzero(~(flat >= 0) | ~np.isfinite(flat))[0]]
    entry = "= infinity or NaN" if np.isinf(first) and first > 0 else "< 0"
    raise RuntimeError(f"multinomial: invalid multinomial distribution (encountering probability entry {entry})")


def _as_count(n):
    """``n`` as a Python int where torch reads it as one (a numpy integer, a one-element integer tensor such as
    ``sum`` of a tensor of lengths gives); anything else as given, for the argument parser to refuse."""
    if isinstance(n, bool):
        return n
    try:
        return operator.index(n)
    except TypeError:
        return n


def check_randperm(n: int, dtype: DType) -> None:
    """Refuse an ``n`` the dtype cannot number exactly (every permutation holds 0 .. n - 1)."""
    from tilewise import dtypes

    if n < 0:
        raise RuntimeError(f"randperm(): n must be non-negative, got {n}")
    if dtype is dtypes.bool_:
        raise RuntimeError("randperm(): dtype bool cannot hold a permutation; use an integer or floating dtype")
    if dtype.is_floating_point:
        largest = 2 ** (round(-math.log2(dtypes.finfo(dtype).eps)) + 1) + 1  # every integer up to 2**precision
    else:
        largest = dtypes.iinfo(dtype).max + 1
    if n > largest:
        raise RuntimeError(f"randperm(): n={n} is too large for dtype {dtype.name}, which numbers at most "
                           f"{largest} elements exactly")


# ---------------------------------------------------------------- generators

class Generator:
    """Philox stream state ``(seed, offset)``; ``offset`` counts 128-bit counters already used."""

    def __init__(self, device="cpu"):
        self.device = as_device(device)
        self._seed = 67280421310721
        self._offset = 0

    def manual_seed(self, seed: int) -> Generator:
        self._seed = int(seed) % (1 << 64)
        self._offset = 0
        return self

    def seed(self) -> int:
        import secrets

        self.manual_seed(secrets.randbits(63))
        return self._seed

    def initial_seed(self) -> int:
        return self._seed

    def get_state(self) -> Tensor:
        """The state as torch's CUDA generator gives it: a uint8 tensor of 16 bytes, the seed and then the offset,
        each a little-endian 64-bit integer."""
        from tilewise.dtypes import uint8
        from tilewise.tensor import from_array

        return from_array(np.array([self._seed, self._offset], dtype="<u8").view(np.uint8).copy(), uint8)

    def position(self) -> tuple[int, int]:
        """(seed, offset) as Python numbers: the state ``get_state`` returns, without a tensor to read back (a
        traced function can save and restore it without a graph break)."""
        return self._seed, self._offset

    def set_position(self, position: tuple[int, int]) -> None:
        self._seed, self._offset = position

    def set_state(self, state: Tensor) -> None:
        from tilewise.dtypes import uint8

        if getattr(state, "dtype", None) is not uint8:
            raise TypeError("RNG state must be a torch.ByteTensor")
        if state.numel() != 16:
            raise RuntimeError(f"RNG state is wrong size: expected 16 bytes (a 64-bit seed and a 64-bit offset), "
                               f"got {state.numel()}")
        seed, offset = (int(v) for v in np.ascontiguousarray(state.cpu().numpy().reshape(16)).view("<u8"))
        self._seed, self._offset = seed, offset

    def claim(self, counters: int) -> tuple[int, int]:
        """Reserve ``counters`` Philox counters; return the (seed, offset) the draw must use."""
        offset = self._offset
        self._offset += counters
        return self._seed, offset

    @property
    def offset(self) -> int:
        """The Philox counters used so far: where the next draw starts (what ``get_state`` holds besides the seed).
        A trace moves it to name its draws and puts it back (see [Note: random draws in a trace])."""
        return self._offset

    @offset.setter
    def offset(self, value: int) -> None:
        self._offset = value


register_generator_class(Generator)
default_generator = Generator("cpu")


def manual_seed(seed: int) -> Generator:
    """Seed the default generator (shared by CPU and CUDA, so one seed gives the same numbers on both)."""
    default_generator.manual_seed(seed)
    return default_generator


def seed() -> int:
    return default_generator.seed()


def initial_seed() -> int:
    return default_generator.initial_seed()


def get_rng_state() -> Tensor:
    return default_generator.get_state()


def set_rng_state(state: Tensor) -> None:
    default_generator.set_state(state)


def generator_or_default(g: Generator | None) -> Generator:
    return default_generator if g is None else g


# ---------------------------------------------------------------- factory functions

def _size(size: tuple, name: str) -> tuple[int, ...]:
    if len(size) == 1 and isinstance(size[0], (tuple, list)) or (len(size) == 1 and type(size[0]).__name__ == "Size"):
        size = tuple(size[0])
    for s in size:
        if not isinstance(s, int) or isinstance(s, bool):
            if isinstance(s, np.integer):  # numpy integers are the ints they hold (a size read off an array)
                return _size(tuple(int(v) if isinstance(v, np.integer) else v for v in size), name)
            raise TypeError(f"{name}(): size must be a sequence of ints, got {list(size)}")
        if s < 0:
            raise RuntimeError(f"{name}(): trying to create tensor with negative dimension {s}: {list(size)}")
    return tuple(size)


def _sizes(sizes: tuple, size, name: str) -> tuple[int, ...]:
    """A factory's size given as ints (``zeros(2, 3)``), one sequence (``zeros((2, 3))``) or by keyword
    (``zeros(size=(2, 3))``), as torch's factories take it."""
    if size is not None:
        if sizes:
            raise TypeError(f"{name}() got multiple values for argument 'size'")
        sizes = (size,)
    return _size(sizes, name)


_MAX_BYTES = (1 << 63) - 1


def _allocate(factory: str, size: tuple, dtype: DType, make):
    """``make()``, naming the factory and the tensor it makes when memory runs out (the backend can name only
    its operator)."""
    if math.prod(size) * dtype.itemsize > _MAX_BYTES:
        raise RuntimeError(f"{factory}(): Storage size calculation overflowed with sizes={list(size)}: a {dtype.name} "
                           f"tensor of that shape would take {math.prod(size) * dtype.itemsize} bytes, more than any "
                           "address space holds")
    try:
        return make()
    except HostOutOfMemoryError:
        raise out_of_host_memory(f"{factory}()", math.prod(size) * dtype.itemsize, f"for a tensor of shape "
                                 f"{list(size)} and dtype {dtype.name}") from None


def _finish(t: Tensor, requires_grad: bool) -> Tensor:
    return t.requires_grad_(True) if requires_grad else t


def _call(name: str, *args, **kwargs) -> Tensor:
    from tilewise.ops.registry import OVERLOADS

    return OVERLOADS[name][0](*args, **kwargs)


@factory_out("full")
def full(size, fill_value, *, dtype=None, device=None, requires_grad: bool = False, pin_memory: bool = False) -> Tensor:
    return _full("full", size, fill_value, dtype, device, requires_grad, pin_memory)


@factory_out("zeros")
def zeros(*sizes, size=None, dtype=None, device=None, requires_grad: bool = False,
          pin_memory: bool = False) -> Tensor:
    return _full("zeros", _sizes(sizes, size, "zeros"), 0, dtype or get_default_dtype(), device, requires_grad,
                 pin_memory)


@factory_out("ones")
def ones(*sizes, size=None, dtype=None, device=None, requires_grad: bool = False,
         pin_memory: bool = False) -> Tensor:
    return _full("ones", _sizes(sizes, size, "ones"), 1, dtype or get_default_dtype(), device, requires_grad,
                 pin_memory)


@factory_out("empty")
def empty(*sizes, size=None, dtype=None, device=None, requires_grad: bool = False, pin_memory: bool = False,
          memory_format=None) -> Tensor:
    size = _sizes(sizes, size, "empty")
    return _empty("empty", size, dtype, device, requires_grad, pin_memory, _new_strides(size, memory_format, "empty"))


def _require_number(factory: str, name: str, value) -> None:
    if not isinstance(value, (Number, Tensor)):
        raise TypeError(f"{factory}(): argument '{name}' must be a number (bool, int, float or complex), got "
                        f"{type(value).__name__} {value!r}")


def _full(factory: str, size: tuple, fill_value, dtype, device, requires_grad: bool, pin_memory: bool,
          strides: tuple | None = None) -> Tensor:
    _require_number(factory, "fill_value", fill_value)
    if isinstance(fill_value, Tensor):  # a one-element tensor is a Scalar, as in torch
        fill_value = fill_value.item()
    if dtype is None:
        d = scalar_dtype(fill_value)
        dtype = get_default_dtype() if d.is_floating_point else default_complex_dtype() if d.is_complex else d
    fill_value = checked_scalar(fill_value, as_dtype(dtype), factory)
    if pin_memory:
        check_pinnable(_target(device), factory)
    size, dtype = tuple(size), as_dtype(dtype)
    out = _allocate(factory, size, dtype, lambda: _call("full", size, fill_value, dtype=dtype, device=device))
    return _finish(_restrided(out.pin_memory() if pin_memory else out, strides), requires_grad)


def _empty(factory: str, size: tuple, dtype, device, requires_grad: bool, pin_memory: bool,
           strides: tuple | None = None) -> Tensor:
    """With ``pin_memory`` the tensor is allocated in page-locked memory directly (nothing to copy)."""
    dtype = as_dtype(dtype or get_default_dtype())
    if not pin_memory:
        size = tuple(size)
        out = _allocate(factory, size, dtype, lambda: _call("empty", size, dtype=dtype, device=device))
        return _finish(_restrided(out, strides), requires_grad)
    check_pinnable(_target(device), factory)
    return _finish(_restrided(pinning_backend().empty_pinned(tuple(size), dtype), strides), requires_grad)


def _new_strides(size: tuple, memory_format, factory: str) -> tuple | None:
    """The strides a factory's ``memory_format`` asks for (None: row-major); torch has no source to preserve."""
    if memory_format is None:
        return None
    name = format_name(memory_format, factory)
    if name == "preserve_format":
        raise RuntimeError(f"{factory}(): unsupported memory format Preserve")
    return S.format_strides(name, size)


def _like_strides(x: Tensor, memory_format, factory: str) -> tuple:
    """The strides of a ``*_like`` tensor: ``x``'s own where dense under the default ``preserve_format``."""
    if memory_format is not None:
        format_name(memory_format, factory)
    return copy_strides(x, memory_format)


def _restrided(out: Tensor, strides: tuple | None) -> Tensor:
    """A new (hence dense, row-major) tensor with its memory read in another dense order: a fill or fresh random
    values are the same in any order, so no copy is needed. A traced tensor takes the strides as the compiler's
    other results do (see [Note: eager strides of traced values] in compiler/formats.py)."""
    if strides is None or strides == out._strides:
        return out
    if out._storage is None:
        if out._trace is not None and TRACE_HOOKS.lay_out is not None:
            TRACE_HOOKS.lay_out(out, tuple(strides))
        return out
    return Tensor._make(out._storage, out._shape, tuple(strides), out._offset, out._dtype, out._device)


def _target(device) -> Device:
    return as_device(device) if device is not None else default_device()


def _like(x: Tensor, dtype, device) -> tuple[DType, Device]:
    return (as_dtype(dtype) if dtype is not None else x.dtype), (as_device(device) if device is not None else x.device)


def zeros_like(x: Tensor, *, dtype=None, device=None, requires_grad: bool = False, memory_format=None,
               pin_memory: bool = False) -> Tensor:
    if type(x) is not Tensor and routed_to_overrides(x):  # a subclass instance or __torch_function__ object
        return overridden_call(zeros_like, (x,), dict(
            dtype=dtype, device=device, requires_grad=requires_grad, memory_format=memory_format,
            pin_memory=pin_memory))
    dt, dev = _like(x, dtype, device)
    return _full("zeros_like", x.shape, 0, dt, dev, requires_grad, pin_memory,
                 _like_strides(x, memory_format, "zeros_like"))


def ones_like(x: Tensor, *, dtype=None, device=None, requires_grad: bool = False, memory_format=None,
              pin_memory: bool = False) -> Tensor:
    if type(x) is not Tensor and routed_to_overrides(x):  # a subclass instance or __torch_function__ object
        return overridden_call(ones_like, (x,), dict(
            dtype=dtype, device=device, requires_grad=requires_grad, memory_format=memory_format,
            pin_memory=pin_memory))
    dt, dev = _like(x, dtype, device)
    return _full("ones_like", x.shape, 1, dt, dev, requires_grad, pin_memory,
                 _like_strides(x, memory_format, "ones_like"))


def full_like(x: Tensor, fill_value, *, dtype=None, device=None, requires_grad: bool = False,
              memory_format=None, pin_memory: bool = False) -> Tensor:
    if type(x) is not Tensor and routed_to_overrides(x):  # a subclass instance or __torch_function__ object
        return overridden_call(full_like, (x, fill_value), dict(
            dtype=dtype, device=device, requires_grad=requires_grad, memory_format=memory_format,
            pin_memory=pin_memory))
    dt, dev = _like(x, dtype, device)
    return _full("full_like", x.shape, fill_value, dt, dev, requires_grad, pin_memory,
                 _like_strides(x, memory_format, "full_like"))


def empty_like(x: Tensor, *, dtype=None, device=None, requires_grad: bool = False, memory_format=None,
               pin_memory: bool = False) -> Tensor:
    if type(x) is not Tensor and routed_to_overrides(x):  # a subclass instance or __torch_function__ object
        return overridden_call(empty_like, (x,), dict(
            dtype=dtype, device=device, requires_grad=requires_grad, memory_format=memory_format,
            pin_memory=pin_memory))
    dt, dev = _like(x, dtype, device)
    strides = _like_strides(x, memory_format, "empty_like")
    return _empty("empty_like", x.shape, dt, dev, requires_grad, pin_memory, strides)


@factory_out("arange")
def arange(start, end=None, step=1, *, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    if end is None:
        start, end = 0, start
    for name, value in (("start", start), ("end", end), ("step", step)):
        _require_number("arange", name, value)
    start, end, step = (v.item() if isinstance(v, Tensor) else v for v in (start, end, step))
    if step == 0 or step != step:
        raise RuntimeError(f"arange(): step must be nonzero, got step={step}")
    if not (math.isfinite(start) and math.isfinite(end)):
        raise RuntimeError(f"arange(): unsupported range: {start} -> {end}; start and end must be finite")
    if (end - start) * step < 0:
        raise RuntimeError(f"arange(): upper bound and lower bound inconsistent with step sign: start={start}, "
                           f"end={end}, step={step}")
    if dtype is None:
        from tilewise import dtypes

        dtype = get_default_dtype() if any(isinstance(v, float) for v in (start, end, step)) else dtypes.int64
    dtype = as_dtype(dtype)
    if not dtype.is_floating_point:  # the range is computed in int64, whatever the dtype (torch's rule)
        from tilewise import dtypes

        for v in (start, end, step):
            checked_scalar(v, dtypes.int64, "arange()")
    length = math.ceil((end - start) / step)
    if length >= 1 << 63:
        raise RuntimeError(f"arange(): invalid size, possible overflow? {start} -> {end} in steps of {step} would "
                           f"hold {length} elements")
    out = _allocate("arange", (length,), dtype, lambda: _call("arange", start, end, step, dtype=dtype, device=device))
    return _finish(out, requires_grad)


@factory_out("linspace")
def linspace(start, end, steps: int, *, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    if steps < 0:
        raise RuntimeError(f"linspace(): number of steps must be non-negative, got {steps}")
    dtype = as_dtype(dtype or get_default_dtype())
    if dtype is bool_:
        place = as_device(device) if device is not None else default_device()
        raise NotImplementedError(f"\"linspace_{place.type}\" not implemented for 'Bool'")
    if steps >= 1:  # torch converts the ends it reads: none for no steps, the start alone for one
        start = checked_scalar(start, dtype, "linspace")
    if steps >= 2:
        end = checked_scalar(end, dtype, "linspace")
    return _finish(_call("linspace", start, end, steps, dtype=dtype, device=device), requires_grad)


@factory_out("eye")
def eye(n: int, m: int | None = None, *, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    n, m = (int(v) if isinstance(v, np.integer) else v for v in (n, m))  # numpy integers are the ints they hold
    for name, value in (("n", n), ("m", m)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
            raise TypeError(f"eye(): {name} must be an int, got {type(value).__name__} {value!r}")
        if value is not None and value < 0:
            raise RuntimeError(f"eye(): {name} must be greater or equal to 0, got {value}")
    return _finish(_call("eye", n, m, dtype=as_dtype(dtype or get_default_dtype()), device=device), requires_grad)


def _require_floating(factory: str, dtype: DType) -> None:
    if not dtype.is_floating_point:
        raise NotImplementedError(f"{factory}(): random floating samples cannot be drawn into a {dtype.name} tensor; "
                                  "give a floating dtype (randint draws integers)")


def _require_non_negative_std(factory: str, std) -> None:
    if isinstance(std, Number) and not std >= 0:
        raise RuntimeError(f"{factory}: normal expects std >= 0.0, but found std {std}")


def _complex_draws(size: tuple, dtype: DType, draw) -> Tensor:
    """A complex tensor whose real and imaginary parts are ``draw(shape, real dtype)`` of (*size, 2) values, as
    torch fills a complex tensor's parts."""
    from tilewise.ops.registry import OPS

    return OPS["view_as_complex"](draw((*size, 2), dtype.to_real())).clone()  # its own storage, no view's base


@factory_out("rand")
def rand(*sizes, size=None, generator=None, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    size, dtype = _sizes(sizes, size, "rand"), as_dtype(dtype or get_default_dtype())
    if dtype.is_complex:  # real and imaginary parts each uniform in [0, 1), as torch's
        return _finish(_complex_draws(size, dtype, lambda shape, real: rand(shape, generator=generator, dtype=real,
                                                                              device=device)), requires_grad)
    _require_floating("rand", dtype)
    out = _allocate("rand", size, dtype, lambda: _call("uniform", size, 0.0, 1.0, dtype=dtype, device=device,
                                                        generator=generator))
    return _finish(out, requires_grad)


@factory_out("randn")
def randn(*sizes, size=None, generator=None, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    size, dtype = _sizes(sizes, size, "randn"), as_dtype(dtype or get_default_dtype())
    if dtype.is_complex:  # real and imaginary parts each normal of variance 1/2 (the whole of variance 1), as torch's
        return _finish(_complex_draws(size, dtype, lambda shape, real: randn(shape, generator=generator, dtype=real,
                                                                               device=device) * 0.5 ** 0.5),
                       requires_grad)
    _require_floating("randn", dtype)
    out = _allocate("randn", size, dtype, lambda: _call("normal_sample", size, dtype=dtype, device=device,
                                                         generator=generator))
    return _finish(out, requires_grad)


def rand_like(x: Tensor, *, dtype=None, device=None, requires_grad: bool = False, memory_format=None) -> Tensor:
    if type(x) is not Tensor and routed_to_overrides(x):  # a subclass instance or __torch_function__ object
        return overridden_call(rand_like, (x,), dict(
            dtype=dtype, device=device, requires_grad=requires_grad, memory_format=memory_format))
    dt, dev = _like(x, dtype, device)
    strides = _like_strides(x, memory_format, "rand_like")
    return _finish(_restrided(rand(x.shape, dtype=dt, device=dev), strides), requires_grad)


def randn_like(x: Tensor, *, dtype=None, device=None, requires_grad: bool = False, memory_format=None) -> Tensor:
    if type(x) is not Tensor and routed_to_overrides(x):  # a subclass instance or __torch_function__ object
        return overridden_call(randn_like, (x,), dict(
            dtype=dtype, device=device, requires_grad=requires_grad, memory_format=memory_format))
    dt, dev = _like(x, dtype, device)
    strides = _like_strides(x, memory_format, "randn_like")
    return _finish(_restrided(randn(x.shape, dtype=dt, device=dev), strides), requires_grad)


_RANDINT_OVERLOADS = ("randint() received an invalid combination of arguments - got ({given}), but expected one of:\n"
                      " * (int high, tuple of ints size, *, Generator generator = None, dtype dtype = None, "
                      "Device device = None, bool requires_grad = False)\n"
                      " * (int low, int high, tuple of ints size, *, Generator generator = None, dtype dtype = None, "
                      "Device device = None, bool requires_grad = False)\n")


def _randint_bounds_and_size(args: tuple, named: dict):
    """torch's two overloads, ``randint(high, size)`` and ``randint(low, high, size)``, each argument by position or
    by name, with its parser's refusals."""
    def refuse():
        shown = [type(a).__name__ for a in args] + [f"{k}={type(v).__name__}" for k, v in named.items()]
        raise TypeError(_RANDINT_OVERLOADS.format(given=", ".join(shown)))

    names = ("low", "high", "size") if len(args) + len(named) == 3 or "low" in named else ("high", "size")
    if len(args) > len(names) or any(k in dict(zip(names, args)) or k not in names for k in named):
        refuse()
    given = {**dict(zip(names, args)), **named}
    if len(given) != len(names):
        refuse()
    for position, name in enumerate(names, 1):
        value = given[name]
        where = f"(position {position}) " if position <= len(args) else ""
        if name == "size":
            if isinstance(value, (int, float)) and len(names) == 3:
                refuse()  # a third number matches neither overload
            if not isinstance(value, (tuple, list)) and type(value).__name__ != "Size":
                raise TypeError(f"randint(): argument 'size' {where}must be tuple of ints, not {type(value).__name__}")
        elif isinstance(value, Tensor) and value.ndim == 0 and not value.dtype.is_floating_point:
            given[name] = int(value.item())
        elif not isinstance(value, (int, np.integer)) or isinstance(value, bool):
            if name == "high" and len(names) == 3:
                refuse()
            raise TypeError(f"randint(): argument '{name}' {where}must be int, not {type(value).__name__}")
    return int(given.get("low", 0)), int(given["high"]), given["size"]


@factory_out("randint")
def randint(*args, generator=None, dtype=None, device=None, requires_grad: bool = False, **named) -> Tensor:
    low, high, size = _randint_bounds_and_size(args, named)
    if requires_grad and not (dtype is not None and (as_dtype(dtype).is_floating_point or as_dtype(dtype).is_complex)):
        raise RuntimeError("Only Tensors of floating point and complex dtype can require gradients")
    if low >= high:
        raise RuntimeError(f"randint(): random_ expects 'from' to be less than 'to', but got from={low} >= to={high}")
    from tilewise import dtypes

    result = _call("randint", low, high, _size((size,), "randint"), dtype=as_dtype(dtype or dtypes.int64),
                   device=device, generator=generator)
    return _finish(result, requires_grad)


def randint_like(x: Tensor, low, high=None, *, dtype=None, device=None, memory_format=None) -> Tensor:
    if type(x) is not Tensor and routed_to_overrides(x):  # a subclass instance or __torch_function__ object
        return overridden_call(randint_like, (x, low, high),
                               dict(dtype=dtype, device=device, memory_format=memory_format))
    if high is None:  # randint_like(x, high)
        low, high = 0, low
    dt, dev = _like(x, dtype, device)
    strides = _like_strides(x, memory_format, "randint_like")
    return _restrided(randint(low, high, x.shape, dtype=dt, device=dev), strides)


@factory_out("randperm")
def randperm(n: int, *, generator=None, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    from tilewise import dtypes

    dtype = as_dtype(dtype or dtypes.int64)
    n = _as_count(n)
    if isinstance(n, int) and not isinstance(n, bool):
        check_randperm(n, dtype)
    return _finish(_call("randperm", n, dtype=dtype, device=device, generator=generator), requires_grad)


@factory_out("normal")
def normal(mean=0.0, std=1.0, size=None, *, generator=None, dtype=None, device=None) -> Tensor:
    _require_non_negative_std("normal", std)
    if isinstance(mean, Tensor) or isinstance(std, Tensor):
        ref = mean if isinstance(mean, Tensor) else std
        shape = size if size is not None else ref.shape
        return randn(shape, generator=generator, dtype=ref.dtype, device=ref.device) * std + mean
    if size is None:
        raise TypeError("normal(): with scalar mean and std, size= is required")
    return randn(size, generator=generator, dtype=dtype, device=device) * std + mean


# ---------------------------------------------------------------- in-place fills (Tensor methods)

def _fill_from(self: Tensor, values: Tensor) -> Tensor:
    from tilewise._grad_mode import no_grad

    with no_grad():
        return self.copy_(values)


def fill_(self: Tensor, value) -> Tensor:
    _require_number("fill_", "value", value)
    if isinstance(value, Tensor):
        return copy_into(self, value.expand(self.shape), "fill_")
    return copy_into(self, full_like(self, checked_scalar(value, self.dtype, "fill_")), "fill_")


def zero_(self: Tensor) -> Tensor:
    return fill_(self, 0)


def check_uniform_range(a: float, b: float) -> None:
    """uniform_'s bounds in order (torch prints them as C++ streams a double: 2.0 as 2)."""
    if a > b:
        raise RuntimeError(f"uniform_ expects to return a [from, to) range, but found from={float(a):g} > "
                           f"to={float(b):g}")


def uniform_(self: Tensor, a: float = 0.0, b: float = 1.0, *, generator=None) -> Tensor:
    _require_floating("uniform_", self.dtype)
    check_uniform_range(a, b)
    return _fill_from(self, _call("uniform", self.shape, float(a), float(b), dtype=self.dtype, device=self.device,
                                  generator=generator))


def normal_(self: Tensor, mean: float = 0.0, std: float = 1.0, *, generator=None) -> Tensor:
    _require_floating("normal_", self.dtype)
    _require_non_negative_std("normal_", std)
    return _fill_from(self, randn(self.shape, dtype=self.dtype, device=self.device, generator=generator) * std + mean)


def bernoulli_(self: Tensor, p=0.5, *, generator=None) -> Tensor:
    if not isinstance(p, Tensor) and not 0 <= p <= 1:
        raise RuntimeError(f"bernoulli_ expects p to be in [0, 1], but got p={p:g}")
    probs = p if isinstance(p, Tensor) else full_like(self, p, dtype=get_default_dtype())
    return _fill_from(self, _call("bernoulli", probs.expand(self.shape), generator=generator))


def _bernoulli_p(self: Tensor, p: float, generator=None) -> Tensor:
    """``bernoulli(x, p)``: draws of probability ``p`` in ``x``'s shape and dtype (``x``'s values unread)."""
    return bernoulli_(empty_like(self), p, generator=generator)


declare("bernoulli.p(Tensor self, float p, *, Generator? generator=None) -> Tensor", "composite",
        decomposition=_bernoulli_p, differentiable=False)


def exponential_(self: Tensor, lambd: float = 1.0, *, generator=None) -> Tensor:
    _require_floating("exponential_", self.dtype)
    if not lambd > 0:
        raise RuntimeError(f"exponential_ expects lambda > 0.0, but found lambda={lambd}")
    u = rand(self.shape, dtype=self.dtype, device=self.device, generator=generator)
    return _fill_from(self, -(1 - u).log() / lambd)


def random_(self: Tensor, low: int = 0, high: int | None = None, *, generator=None) -> Tensor:
    if high is None:
        low, high = 0, (1 << 24 if self.dtype.is_floating_point else (1 << 63) - 1) if low == 0 else low
    return _fill_from(self, randint(low, high, self.shape, dtype=self.dtype, device=self.device, generator=generator))


def log_normal_(self: Tensor, mean: float = 1.0, std: float = 2.0, *, generator=None) -> Tensor:
    """``exp`` of normal draws with the given mean and standard deviation (of the logarithm)."""
    if not self.dtype.is_floating_point:
        raise NotImplementedError(f'"log_normal_" not implemented for {self.dtype.name} tensors; it fills floating '
                                  "tensors")
    if not std > 0:
        raise RuntimeError(f"log_normal_ expects std > 0.0, but found std={std}")
    draws = randn(self.shape, dtype=self.dtype, device=self.device, generator=generator)
    return _fill_from(self, (draws * std + mean).exp())


def cauchy_(self: Tensor, median: float = 0.0, sigma: float = 1.0, *, generator=None) -> Tensor:
    """Cauchy draws by inversion: ``median + sigma * tan(pi * (u - 1/2))``."""
    if not self.dtype.is_floating_point:
        raise RuntimeError("Cauchy distribution is a continuous probability distribution. dtype must be a floating "
                           f"point but you specified {self.dtype.name}")
    if not sigma > 0:
        raise RuntimeError(f"cauchy_ expects sigma > 0.0, but found sigma={sigma}")
    u = rand(self.shape, dtype=self.dtype, device=self.device, generator=generator)
    return _fill_from(self, ((u - 0.5) * math.pi).tan() * sigma + median)


def geometric_(self: Tensor, p: float, *, generator=None) -> Tensor:
    """The number of Bernoulli(p) trials up to the first success, ``ceil(log(u) / log(1 - p))``, in any numeric
    dtype but bool."""
    if self.dtype.name == "bool":
        raise NotImplementedError('"geometric_" not implemented for bool tensors')
    if not 0 < p < 1:
        raise RuntimeError(f"geometric_ expects p to be in (0, 1), but got p={p}")
    compute = self.dtype if self.dtype.is_floating_point else get_default_dtype()
    u = rand(self.shape, dtype=compute, device=self.device, generator=generator)
    trials = ((1 - u).log() / math.log1p(-p)).ceil().clamp_min(1)  # 1 - u in (0, 1]: never log(0)
    return _fill_from(self, trials.to(self.dtype))


INPLACE_FILLS = (fill_, zero_, uniform_, normal_, bernoulli_, exponential_, random_, log_normal_, cauchy_, geometric_)


# ---------------------------------------------------------------- new tensors like self (Tensor methods)

def new_zeros(self: Tensor, *sizes, size=None, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    """A zero tensor of ``size`` with ``self``'s dtype and device unless given.

    >>> tw.ones(2, dtype=tw.int8).new_zeros(3)
    tensor([0, 0, 0], dtype=tilewise.int8)
    """
    dt, dev = _like(self, dtype, device)
    return _full("new_zeros", _sizes(sizes, size, "new_zeros"), 0, dt, dev, requires_grad, False)


def new_ones(self: Tensor, *sizes, size=None, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    dt, dev = _like(self, dtype, device)
    return _full("new_ones", _sizes(sizes, size, "new_ones"), 1, dt, dev, requires_grad, False)


def new_full(self: Tensor, size, fill_value, *, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    dt, dev = _like(self, dtype, device)
    return _full("new_full", _size((size,), "new_full"), fill_value, dt, dev, requires_grad, False)


def new_empty(self: Tensor, *sizes, size=None, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    dt, dev = _like(self, dtype, device)
    return _empty("new_empty", _sizes(sizes, size, "new_empty"), dt, dev, requires_grad, False)


def new_tensor(self: Tensor, data, *, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    from tilewise.tensor import COPY_CONSTRUCT, copy_construct, tensor

    dt, dev = _like(self, dtype, device)
    if isinstance(data, Tensor):
        warn_at_caller(COPY_CONSTRUCT.format("tensor.new_tensor(sourceTensor)"))
        return copy_construct(data, dt, dev, requires_grad)
    return tensor(data, dtype=dt, device=dev, requires_grad=requires_grad)


def empty_strided(size, stride, *, dtype=None, layout=None, device=None, requires_grad: bool = False,
                  pin_memory: bool = False):
    """An uninitialised tensor of the given size and strides over a buffer just large enough for them."""
    size, stride = tuple(size), tuple(stride)
    extent = 1 + sum((n - 1) * s for n, s in zip(size, stride)) if all(size) else 0
    out = empty(extent, dtype=dtype, device=device).as_strided(size, stride, 0)
    return out.requires_grad_(requires_grad) if requires_grad else out


def new_empty_strided(self: Tensor, size, stride, *, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    """An uninitialised tensor of the given size and strides, with ``self``'s dtype and device unless given."""
    dt, dev = _like(self, dtype, device)
    return empty_strided(size, stride, dtype=dt, device=dev, requires_grad=requires_grad)


NEW_LIKE = (new_zeros, new_ones, new_full, new_empty, new_tensor, new_empty_strided)


def to_device(x: Tensor, device: Device, non_blocking: bool = False, dtype: DType | None = None,
              memory_format=None) -> Tensor:
    return _call("_to_copy", x, dtype, device, non_blocking, memory_format=memory_format)


def scalar_tensor(value: Number, *, dtype=None, device=None) -> Tensor:
    return full((), value, dtype=dtype or get_default_dtype(), device=device)


@factory_out("range")
def deprecated_range(start=0, end=None, step=1, *, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    """Deprecated in torch: ``[start, end]`` with ``end`` included, in the default floating dtype unless given."""

    if end is None:
        raise TypeError('range() missing 1 required positional arguments: "end"')
    warn_at_caller("tilewise.range is deprecated and will be removed in a future release because its behavior is "
                   "inconsistent with Python's range builtin. Instead, use tilewise.arange, which produces values in "
                   "[start, end).")
    start, end, step = (v.item() if isinstance(v, Tensor) else v for v in (start, end, step))
    if step == 0:
        raise RuntimeError(f"range(): step must be nonzero, got step={step}")
    if (end - start) * step < 0:
        raise RuntimeError(f"range(): upper bound and lower bound inconsistent with step sign: start={start}, "
                           f"end={end}, step={step}")
    dtype = as_dtype(dtype or get_default_dtype())
    length = math.floor((end - start) / step) + 1
    if dtype.is_floating_point:  # each value start + i * step in double, then rounded once, as torch's kernel
        from tilewise.dtypes import float64

        out = (arange(length, dtype=float64, device=device) * step + start).to(dtype)
    else:
        out = arange(start, start + length * step, step, dtype=dtype, device=device)
    return _finish(out, requires_grad)


def empty_permuted(size, physical_layout, *, dtype=None, layout=None, device=None, requires_grad: bool = False,
                   pin_memory: bool = False) -> Tensor:
    """An uninitialised tensor of ``size`` whose dims lie in memory in the order ``physical_layout`` (outermost
    first): ``empty_permuted((2, 3, 4), (0, 2, 1))`` has strides (12, 1, 3)."""
    size, order = _size((size,), "empty_permuted"), tuple(physical_layout)
    if len(size) != len(order):
        raise RuntimeError("Number of dimensions in size does not match the length of the physical_layout; i.e. "
                           f"len(size) = {len(size)} is not equal to len(physical_layout) = {len(order)}")
    for k, d in enumerate(order):
        if not 0 <= d < len(size):
            raise RuntimeError(f"Dimension out of range (expected to be between 0 and {len(size) - 1}, but got {d} "
                               f"at index {k}).  NB: negative dims not currently supported; file an issue if you "
                               "want it.")
    if len(set(order)) != len(order):
        raise RuntimeError("Duplicate dim not allowed")
    physical = _empty("empty_permuted", tuple(size[d] for d in order), dtype, device, False, pin_memory)
    inverse = sorted(range(len(order)), key=order.__getitem__)
    return _finish(physical.permute(inverse), requires_grad)


def frombuffer(buffer, *, dtype, count: int = -1, offset: int = 0, requires_grad: bool = False) -> Tensor:
    """A 1-D tensor sharing the memory of an object with Python's buffer protocol (torch.frombuffer)."""
    import numpy as np

    from tilewise.tensor import from_array

    dtype = as_dtype(dtype)
    try:
        length = memoryview(buffer).nbytes
    except TypeError:
        raise ValueError("object does not implement Python buffer protocol.") from None
    if length == 0 or count == 0:
        raise ValueError(f"both buffer length ({length}) and count ({count}) must not be 0")
    if not 0 <= offset < length:
        raise ValueError(f"offset ({offset} bytes) must be non-negative and no greater than buffer length "
                         f"({length} bytes) minus 1")
    size = dtype.itemsize
    if count < 0:
        if (length - offset) % size:
            raise ValueError(f"buffer length ({length - offset} bytes) after offset ({offset} bytes) must be a "
                             f"multiple of element size ({size})")
        count = (length - offset) // size
    elif offset + count * size > length:
        raise ValueError(f"requested buffer length ({count} * {size} bytes) after offset ({offset} bytes) must not "
                         f"be greater than actual buffer length ({length} bytes)")
    array = np.frombuffer(buffer, dtype=dtype.np, count=count, offset=offset)
    out = from_array(array, dtype)
    out._storage.resizable_memory = False  # the buffer's memory: resize_ is refused, as torch's
    return _finish(out, requires_grad)


FACTORIES.empty = empty  # Tensor(2, 3) and the legacy types' constructors (see [Note: methods from above])

__all__ = ["Generator", "default_generator", "manual_seed", "seed", "initial_seed", "get_rng_state", "set_rng_state",
           "full", "zeros", "ones", "empty", "zeros_like", "ones_like", "full_like", "empty_like", "arange",
           "linspace", "eye", "rand", "randn", "rand_like", "randn_like", "randint", "randint_like", "randperm",
           "normal", "scalar_tensor", "empty_permuted", "frombuffer"]

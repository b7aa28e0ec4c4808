"""``tilewise.autocast``: automatic mixed precision, with torch.autocast's interface and casting policy.

[Note: autocast] Inside ``with tilewise.autocast(device_type):`` the dispatcher's Autocast key
(``dispatch.autocast_call``) looks at each operator that user code calls. torch keeps one list of operators per
device type (ATen's ``autocast_mode.cpp``: its CUDA lists and its CPU lists differ widely), so an operator declares
its policy once, per device type, in its declaration: ``declare(..., autocast="lower")`` on every device type, or
``autocast={"cuda": "fp32", "cpu": None}`` where the lists differ (see ``ops/registry.py``). The policies:
  "lower"   — matrix products, convolutions, attention: floating tensors run in the autocast dtype
              (float16 or bfloat16);
  "fp32"    — ops whose range or accumulation needs float32: low-precision floating tensors are cast to
              float32; an op given an explicit ``dtype=`` is left alone (torch's "fp32_set_opt_dtype"). On CUDA
              these are exp, log, pow, sums, softmax, norms and losses; on the CPU torch keeps pointwise math,
              sums, softmax and normalisations in the low dtype and lists losses, 3-d pooling, reflection and
              replication padding, FFTs, LAPACK-backed linear algebra and a few others instead;
  "promote" — ops that take several floating tensors (addcmul, dot, index_put on CUDA; cat, stack, index_copy
              on the CPU): all are cast to the widest floating dtype among them;
  "banned"  — binary_cross_entropy on CUDA: refused with torch's advice (float32 on the CPU).
A per-device-type entry may also be a function of the bound arguments that names the policy (``pad`` is float32
on the CPU only for the modes and ranks torch sends to its reflection and replication kernels). Each device type's
policy touches only the tensors on that device type, and never float64 ones; operators without a policy run on
the dtypes they are given (ordinary type promotion). Casts are ordinary ``to`` calls, recorded by autograd and by
``tilewise.compile``'s trace, so a gradient returns in its input's dtype. An operator's own decomposition runs with
autocast off (torch's autocast wrappers exclude their key the same way), so only the operators user code calls
are cast; where torch's operator is a composite of listed ones (einsum and tensordot reach bmm/mm, chain_matmul
and matrix_power reach mm, cov and affine_grid reach mm/bmm), tilewise's declaration states the policy the
composite ends up with. Backward runs with autocast off too (the recorded casts already fix its dtypes).
In-place operators are not cast (torch lists none).

Within the outermost region, the cast of a float32 leaf that requires grad (a weight) is cached and reused
(``cache_enabled``), keyed by the tensor, its version (an optimizer step in the region makes a new cast),
the target dtype and grad mode; the cache is emptied when the outermost region exits.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import warnings
from collections.abc import Callable

from tilewise.dispatch import STATE
from tilewise.dtypes import DType, as_dtype, bfloat16, float16, float32, float64
from tilewise.tensor import Tensor

DEFAULT_DTYPES: dict[str, DType] = {"cuda": float16, "cpu": bfloat16}  # torch's defaults per device type
SUPPORTED_DTYPES: tuple[DType, ...] = (float16, bfloat16)


class _Regions(threading.local):
    """What outlives one region and is restored by each: nesting depth, the cast cache and its switch, and
    the dtype each device type is set to (``get_autocast_dtype`` reads it even outside a region). One per
    thread, as torch's: ``__init__`` runs again in each thread that reads it."""

    def __init__(self) -> None:
        self.depth = 0
        self.cache_enabled = True
        self.cache: dict[tuple, tuple] = {}
        self.dtypes: dict[str, DType] = dict(DEFAULT_DTYPES)


_REGIONS = _Regions()


DEVICE_ORDER = ("cuda", "cpu")  # torch's dispatch key order: AutocastCUDA runs before AutocastCPU


class AutocastState:
    """What the dispatcher's Autocast key reads: the device types autocast is on for, each with its dtype."""

    __slots__ = ("dtypes", "key", "regions")

    def __init__(self, dtypes: dict[str, DType]) -> None:
        self.dtypes = dtypes
        self.key = tuple(sorted((device_type, dtype.name) for device_type, dtype in dtypes.items()))
        # one Region per device type, made here rather than at each cast call
        self.regions = tuple((device_type, Region(device_type, dtypes[device_type])) for device_type in DEVICE_ORDER
                             if device_type in dtypes)

    def __repr__(self) -> str:
        return describe(self.key)

    def cast_args(self, op, args: tuple) -> tuple:
        """``args`` after each device type's policy for ``op`` (its declaration's ``autocast``) cast its tensors."""
        policies = op.autocast
        for device_type, region in self.regions:
            policy = policies.get(device_type)
            if policy is not None and not isinstance(policy, str):
                policy = policy(op, args)
            if policy is not None:
                args = POLICIES[policy](region, op, args)
        return args


class Region:
    """One device type's autocast: the tensors a policy may cast (floating, not float64, on that device type)
    and the dtype "lower" ops run in there."""

    __slots__ = ("device_type", "dtype")

    def __init__(self, device_type: str, dtype: DType) -> None:
        self.device_type, self.dtype = device_type, dtype

    def target(self, t) -> DType | None:
        """The autocast dtype, when autocast may cast ``t`` at all."""
        if type(t) is not Tensor or t._device.type != self.device_type:
            return None
        dtype = t._dtype
        if not dtype.is_floating_point or dtype is float64:
            return None
        return self.dtype

    def lowered(self, t):
        """``t`` in the autocast dtype where autocast may cast it (the "lower" policy's cast)."""
        dtype = self.target(t)
        return t if dtype is None else cast_to(t, dtype)


def describe(key: tuple) -> str:
    """A guard key (``AutocastState.key``) as a reader would write it."""
    if not key:
        return "autocast off"
    return " and ".join(f"autocast({device_type!r}, dtype={name})" for device_type, name in key)


# ---------------------------------------------------------------------------- casting policies

def _map_tensors(op, args: tuple, cast: Callable) -> tuple:
    """``args`` with ``cast`` applied to every tensor argument, those inside tensor lists included."""
    out = None
    for k in op.tensor_idx:
        a = args[k]
        if type(a) is Tensor:
            b = cast(a)
            if b is not a:
                out = out or list(args)
                out[k] = b
    for k in op.list_idx:
        items = args[k]
        cast_items = tuple(cast(a) if type(a) is Tensor else a for a in items)
        if any(b is not a for a, b in zip(items, cast_items)):
            out = out or list(args)
            out[k] = type(items)(cast_items) if isinstance(items, (list, tuple)) else cast_items
    return tuple(out) if out is not None else args


def _lower(state: Region, op, args: tuple) -> tuple:
    return _map_tensors(op, args, state.lowered)


def _dtype_given(op, args: tuple) -> bool:
    names = op.param_names()
    return "dtype" in names and args[names.index("dtype")] is not None


def _fp32(state: Region, op, args: tuple) -> tuple:
    if _dtype_given(op, args):
        return args

    def cast(t):
        return t if state.target(t) is None else cast_to(t, float32)

    return _map_tensors(op, args, cast)


def _promote(state: Region, op, args: tuple) -> tuple:
    widest = state.dtype
    for k in sorted(op.tensor_idx + op.list_idx):
        for t in (args[k],) if k in op.tensor_idx else args[k]:
            widest = _prioritize(state, op, widest, t)

    def cast(t):
        return t if state.target(t) is None else cast_to(t, widest)

    return _map_tensors(op, args, cast)


def _prioritize(state: Region, op, widest: DType, t) -> DType:
    """torch's ``at::autocast::prioritize``: float32 wins once met; another low-precision dtype than the autocast
    dtype before any float32 is an error."""
    if state.target(t) is None:
        return widest
    if widest is float32 or t._dtype is float32:
        return float32
    if t._dtype is not state.dtype:
        raise RuntimeError(f"{op.name}: under autocast({state.device_type!r}, dtype={state.dtype.name}) its floating "
                           f"inputs meet in float32 or {state.dtype.name}, but a {t._dtype.name} input came before "
                           f"any float32 one (torch: Unexpected floating ScalarType in at::autocast::prioritize); cast "
                           f"it to {state.dtype.name} or float32 first")
    return widest


BCE_BANNED = ("{op} (and nn.BCELoss) is unsafe to autocast on CUDA: models usually apply a sigmoid right before it, "
              "whose float16 output loses the precision the loss needs. Combine the two with "
              "tilewise.nn.functional.binary_cross_entropy_with_logits (or nn.BCEWithLogitsLoss), which is safe to "
              "autocast, or compute this loss outside the autocast region on float32 inputs.")


def _banned(state: Region, op, args: tuple) -> tuple:
    for k in op.tensor_idx:
        if state.target(args[k]) is not None:
            raise RuntimeError(BCE_BANNED.format(op=op.name))
    return _fp32(state, op, args)


POLICIES: dict[str, Callable] = {"lower": _lower, "fp32": _fp32, "promote": _promote, "banned": _banned}


def cast_inputs_policy(dtype: DType) -> str:
    """The name of the policy that casts an operator's floating tensors (not float64) to ``dtype`` itself, whatever
    the region's autocast dtype: what ``tilewise.library.register_autocast(op, device_type, cast_inputs)`` asks
    for, as torch's does. Made on first use."""
    name = f"cast_inputs_{dtype.name}"
    if name not in POLICIES:
        def policy(state: Region, op, args: tuple) -> tuple:
            return _lower(Region(state.device_type, dtype), op, args)

        POLICIES[name] = policy
    return name


def cast_to(t: Tensor, dtype: DType) -> Tensor:
    """``t.to(dtype)``, reusing this region's cast of a weight (a float32 leaf that requires grad)."""
    if t._dtype is dtype:
        return t
    regions = _REGIONS  # (a thread-local: read once)
    if not (regions.depth and regions.cache_enabled and t._requires_grad and t._grad_fn is None and t._base is None
            and t._dtype is float32 and not STATE.trace_depth):
        return t._to_dtype(dtype)
    key = (id(t), dtype, STATE.grad_enabled)
    version = t._write_count()  # an inference weight has no public _version, as in torch
    cache = regions.cache
    hit = cache.get(key)
    if hit is not None and hit[0] is t and hit[1] == version:
        return hit[2]
    out = t._to_dtype(dtype)
    cache[key] = (t, version, out)  # holding t keeps its id from being reused while the entry lives
    return out


# ---------------------------------------------------------------------------- the public interface

def _check_device_type(device_type, what: str) -> str:
    if not isinstance(device_type, str):
        raise ValueError(f"{what}: expected device_type to be a str such as 'cuda' or 'cpu', got "
                         f"{type(device_type).__name__} {device_type!r}")
    if device_type not in DEFAULT_DTYPES:
        raise RuntimeError(f"{what}: unsupported device_type {device_type!r}; autocast supports "
                           f"{', '.join(repr(d) for d in DEFAULT_DTYPES)} (a device type, without an index)")
    return device_type


def _check_dtype(dtype, device_type: str) -> DType:
    valid = ", ".join(f"tilewise.{d.name}" for d in SUPPORTED_DTYPES)
    try:
        resolved = as_dtype(dtype)
    except (TypeError, ValueError, KeyError):
        raise TypeError(f"autocast(device_type={device_type!r}): dtype must be one of {valid}, got {dtype!r}") from None
    if resolved not in SUPPORTED_DTYPES and device_type != "cpu":
        kind = "" if resolved.is_floating_point else " (not a floating-point dtype)"
        raise RuntimeError(f"autocast(device_type={device_type!r}): unsupported dtype tilewise.{resolved.name}{kind}; "
                           f"autocast runs ops in one of {valid}")
    return resolved


def _cuda_available() -> bool:
    from tilewise._cuda_api import is_available

    return is_available()


class autocast:  # noqa: N801 — torch's name
    """Run the ops of a region in mixed precision: matrix products and convolutions in ``dtype`` (float16 on
    "cuda", bfloat16 on "cpu" unless given), precision-sensitive ops in float32, after torch's lists for the
    device type (on "cpu", softmax and normalisations stay in ``dtype``; losses run in float32), as
    ``torch.autocast`` does. A context manager or a decorator; regions nest, and ``enabled=False`` turns autocast
    off inside one.

    >>> import tilewise as tw
    >>> x, w = tw.randn(4, 8), tw.randn(3, 8, requires_grad=True)
    >>> with tw.autocast("cpu"):
    ...     y = tw.nn.functional.linear(x, w)
    ...     p = y.softmax(-1)
    ...     loss = tw.nn.functional.mse_loss(p, tw.zeros(4, 3))
    >>> y.dtype, p.dtype, loss.dtype
    (tilewise.bfloat16, tilewise.bfloat16, tilewise.float32)
    >>> loss.backward()
    >>> w.grad.dtype
    tilewise.float32
    """

    def __init__(self, device_type: str, dtype: DType | None = None, enabled: bool = True,
                 cache_enabled: bool | None = None) -> None:
        self.device = _check_device_type(device_type, "autocast")
        self.fast_dtype = _check_dtype(dtype, device_type) if dtype is not None else _REGIONS.dtypes[device_type]
        if enabled and device_type == "cuda" and not _cuda_available():
            warnings.warn("CUDA is not available or torch_xla is imported. Disabling autocast.", stacklevel=2)
            enabled = False
        if enabled and self.fast_dtype not in SUPPORTED_DTYPES:  # on "cpu": torch warns and turns autocast off
            warnings.warn("In CPU autocast, but the target dtype is not supported. Disabling autocast.\nCPU Autocast "
                          f"only supports dtypes of {bfloat16}, {float16} currently.",
                          stacklevel=2)
            enabled = False
        self._enabled = bool(enabled)
        self._cache_enabled = cache_enabled
        self._saved: list[tuple] = []  # one entry per entered, not yet exited, use (the object may be re-entered)

    def __enter__(self) -> autocast:
        regions = _REGIONS
        state = STATE.autocast
        self._saved.append((state, regions.cache_enabled, regions.dtypes[self.device]))
        dtypes = dict(state.dtypes) if state is not None else {}
        if self._enabled:
            dtypes[self.device] = self.fast_dtype
        else:
            dtypes.pop(self.device, None)
        STATE.autocast = AutocastState(dtypes) if dtypes else None
        regions.dtypes[self.device] = self.fast_dtype
        if self._cache_enabled is not None:
            regions.cache_enabled = bool(self._cache_enabled)
        regions.depth += 1
        return self

    def __exit__(self, *exc) -> bool:
        regions = _REGIONS
        STATE.autocast, regions.cache_enabled, regions.dtypes[self.device] = self._saved.pop()
        regions.depth -= 1
        if regions.depth == 0:
            regions.cache.clear()
        return False

    def __call__(self, fn: Callable) -> Callable:
        @functools.wraps(fn)
        def decorated(*args, **kwargs):
            with autocast(self.device, self.fast_dtype, self._enabled, self._cache_enabled):
                return fn(*args, **kwargs)

        return decorated


def is_autocast_enabled(device_type: str = "cuda") -> bool:
    """Whether autocast is on for ``device_type`` here (``torch.is_autocast_enabled``; "cuda" by default)."""
    _check_device_type(device_type, "is_autocast_enabled")
    state = STATE.autocast
    return state is not None and device_type in state.dtypes


def get_autocast_dtype(device_type: str) -> DType:
    """The dtype autocast runs "lower" ops in for ``device_type``: the innermost region's, else the default."""
    return _REGIONS.dtypes[_check_device_type(device_type, "get_autocast_dtype")]


def is_autocast_available(device_type: str) -> bool:
    return device_type in DEFAULT_DTYPES


def is_autocast_cache_enabled() -> bool:
    return _REGIONS.cache_enabled


def clear_autocast_cache() -> None:
    _REGIONS.cache.clear()


@contextlib.contextmanager
def suspended():
    """Autocast off for a moment, whatever the regions around say (a decomposition re-traced by the compiler
    runs as it ran eagerly: below the Autocast key)."""
    state, STATE.autocast = STATE.autocast, None
    try:
        yield
    finally:
        STATE.autocast = state


# ---------------------------------------------------------------------------- torch's raw state functions
# torch.set_autocast_enabled and friends write the state an ``autocast`` region writes on entry, without a region
# to restore it; the device-specific spellings (``*_cpu_*``, ``*_gpu_*``) are deprecated in torch and warn alike.

def _deprecated(old: str, new: str) -> None:
    warnings.warn(f"torch.{old} is deprecated. Please use torch.{new} instead.", DeprecationWarning, stacklevel=3)


def _check_bool(value, what: str) -> bool:
    if type(value) is not bool:
        raise TypeError(f"{what}: expected a bool, got {type(value).__name__} {value!r}")
    return value


def _check_any_dtype(dtype, what: str) -> DType:
    if not isinstance(dtype, DType):
        raise TypeError(f"{what}: expected a tilewise.dtype, got {type(dtype).__name__} {dtype!r}")
    return dtype


def set_autocast_enabled(device_type, enabled=None) -> None:
    """Turn autocast on or off for ``device_type`` ("cuda" when only ``enabled`` is given), outside any region."""
    if enabled is None:
        device_type, enabled = "cuda", device_type
    _check_device_type(device_type, "set_autocast_enabled")
    _check_bool(enabled, "set_autocast_enabled")
    state = STATE.autocast
    dtypes = dict(state.dtypes) if state is not None else {}
    if enabled:
        dtypes[device_type] = _REGIONS.dtypes[device_type]
    else:
        dtypes.pop(device_type, None)
    STATE.autocast = AutocastState(dtypes) if dtypes else None


def set_autocast_dtype(device_type: str, dtype: DType) -> None:
    """The dtype autocast casts "lower" ops to on ``device_type``, taking effect at once where it is on."""
    _check_device_type(device_type, "set_autocast_dtype")
    _REGIONS.dtypes[device_type] = _check_any_dtype(dtype, "set_autocast_dtype")
    state = STATE.autocast
    if state is not None and device_type in state.dtypes:
        STATE.autocast = AutocastState({**state.dtypes, device_type: dtype})


def set_autocast_cache_enabled(enabled: bool) -> None:
    _REGIONS.cache_enabled = _check_bool(enabled, "set_autocast_cache_enabled")


def is_autocast_cpu_enabled() -> bool:
    _deprecated("is_autocast_cpu_enabled()", "is_autocast_enabled('cpu')")
    return is_autocast_enabled("cpu")


def set_autocast_cpu_enabled(enabled: bool) -> None:
    _deprecated("set_autocast_cpu_enabled(enabled)", "set_autocast_enabled('cpu', enabled)")
    set_autocast_enabled("cpu", enabled)


def get_autocast_cpu_dtype() -> DType:
    _deprecated("get_autocast_cpu_dtype()", "get_autocast_dtype('cpu')")
    return get_autocast_dtype("cpu")


def get_autocast_gpu_dtype() -> DType:
    _deprecated("get_autocast_gpu_dtype()", "get_autocast_dtype('cuda')")
    return get_autocast_dtype("cuda")


def set_autocast_cpu_dtype(dtype: DType) -> None:
    _deprecated("set_autocast_cpu_dtype(dtype)", "set_autocast_dtype('cpu', dtype)")
    set_autocast_dtype("cpu", dtype)


def set_autocast_gpu_dtype(dtype: DType) -> None:
    _deprecated("set_autocast_gpu_dtype(dtype)", "set_autocast_dtype('cuda', dtype)")
    set_autocast_dtype("cuda", dtype)

"""The dispatcher: every operator call walks Profiler → ForwardAD → Autocast → Autograd → backend.

[Note: dispatch] ``call(op, args)`` receives arguments already bound by the operator's schema binder.
Keys are consulted in a fixed order, each cheap to skip:
  Profiler  — while ``tilewise.profiler.profile`` records (``profiling``, one module flag for every thread),
              the call runs inside a host event (``profile_op``), so a composite's primitives nest under it;
  ForwardAD — while a dual level is open (``autograd.forward_ad``, ``func.jvp``), a call whose inputs carry
              tangents runs below this key for its primal and its tangent rule (see [Note: forward-mode AD]);
  Autocast  — inside ``tilewise.autocast``, casts floating inputs of ops that declare a policy
              (``op.autocast``; see [Note: autocast] in ``amp/autocast_mode.py``), then runs the op, its
              decomposition included, with autocast off;
  Autograd  — when grad mode is on and a tensor input requires grad, runs the op below this key and
              records a node holding exactly the values its derivative formulas read;
  Inference — inside ``tilewise.inference_mode`` (``STATE.inference``; grad mode is then off for the dispatcher,
              whatever ``is_grad_enabled`` says, as torch's InferenceMode excludes its Autograd key), the
              call runs below and its outputs become inference tensors (``mark_inference``; see
              [Note: inference tensors] in ``storage.py``). Outside the mode this is no check at all: it
              sits on the grad-off branch, behind the Autograd key's own flag;
  Vmap      — inside ``tilewise.func.vmap`` (``STATE.vmap``, one entry per active level), an op with a batched
              tensor argument, or a random op, runs its batching rule on the physical tensors instead
              (``batch``; see [Note: batched tensors] in ``ops/batching.py``). It sits below autograd so
              that a gradient taken inside vmap is recorded on the per-example (logical) tensors;
  backend   — picks the device of the tensor inputs (CPU, CUDA) and runs the kernel; views never reach a
              kernel, they are stride arithmetic on any device. While ``tilewise.compile`` captures a
              function (``trace_depth > 0``) every operator goes to the Trace backend instead.
[Note: inline composites] A composite declared ``inline`` (reshape, narrow, split and the other shape composites:
views and copies put together, with no derivative, tangent rule, autocast policy, check or batching rule of its
own, and no backend kernel) would meet every key below the profiler only to be handed to its decomposition: the
ForwardAD, Autograd, Vmap and Trace keys decompose such a composite, Autocast has nothing to cast, and backends
run the decomposition. ``call`` runs the decomposition at once instead, whose operators then meet every key; the
profiler still sees the composite as one event around them.
The compiler's Trace backend sits *below* autograd on purpose: tracing a function that calls
``loss.backward()`` then records forward, backward and optimizer ops into one graph.
Composite operators without their own kernel run their decomposition, so each primitive they call goes
through this same path (and autograd sees primitives unless the composite declared its own derivative).

[Note: dispatcher plug-ins] The dispatcher sits below the layers that implement its keys, so it imports none
of them: each fills its slot when it loads, through one registration function —
  ``register_recorder(fn)``     the Autograd key's ``record(op, args)``          (``autograd.graph``)
  ``register_view_applier(fn)`` a view's stride arithmetic ``apply_view(op, args)`` (``ops.views``)
  ``register_tracer(fn)``       the Trace key's ``run(op, args, device)``        (``compiler.capture``)
  ``register_number_resolver(fn)`` dynamic numbers as an op's operands ``resolve(op, args)`` (``compiler.numbers``)
  ``register_profiler(fn)``     the Profiler key's ``profile_op(op, args)``      (``profiler.profile``)
  ``register_batcher(fn)``      the Vmap key's ``batch(op, args)``               (``ops.batching``)
  ``register_forward_ad(fn)``   the ForwardAD key's ``forward_ad(op, args)``     (``autograd.forward_ad``)
and device backends register in ``tilewise.device`` (``register_backend``), whose ``BACKENDS`` this module
reads. ``tilewise/_plugins.py`` lists every plug-in point of the core in one table.
"""

from __future__ import annotations

import threading

from tilewise.device import BACKENDS, Device, cpu, default_device
from tilewise.tensor import Tensor


class _State(threading.local):
    """The dispatcher's state, one copy per thread as torch's (grad mode, autocast, tracing and saved-tensor
    hooks are thread-local there): a thread that evaluates under ``no_grad`` or traces for ``compile`` leaves
    every other thread's operators as they were. The class attributes are each new thread's starting values
    (a ``threading.local`` subclass reads them without an exception when a thread has not set them yet)."""

    grad_enabled = True
    autocast = None  # the active amp.autocast_mode.AutocastState, or None
    trace_depth = 0
    captures = ()  # the compiler's active captures, innermost last (see compiler/capture.py)
    saved_tensor_hooks = ()  # active (pack_hook, unpack_hook) pairs, innermost last
    saved_tensor_hooks_refused = None  # inside disable_saved_tensors_hooks: its error message
    into = None  # (tensor, op name): an in-place op's target, for the next call (see call_into)
    vmap = ()  # the active vmap levels, innermost last (see ops/batching.py); empty outside vmap
    dual_masked = ()  # forward-AD levels whose tangents this thread's calls ignore (see autograd/forward_ad.py)
    inference = False  # inside tilewise.inference_mode (where grad_enabled stays False: nothing is recorded)
    inference_grad = False  # inside it, the grad mode is_grad_enabled reports (enable_grad there changes only this)


STATE = _State()


def values_readable(t: Tensor) -> bool:
    """Whether an argument check may read ``t``'s values now: not while this thread traces a function for
    ``tilewise.compile`` (a trace tensor has none, and a real tensor's memory may not yet hold what the traced
    program writes before this point; the program's kernels check what they can), nor a batched tensor of vmap
    (one value per example: its kernels check the physical tensor)."""
    return t._trace is None and not STATE.trace_depth and t._vmap is None


def call(op, args: tuple):
    if profiling:  # the Profiler key: while no profiler records, this one flag read is all it costs
        return profile_op(op, args)
    if op.inline:  # see [Note: inline composites]
        return op.decomposition(*args)
    if dual_levels:  # the ForwardAD key: while no dual level is open, this one flag read is all it costs
        out = forward_ad(op, args)
        if out is not NO_TANGENT:
            return out
    state = STATE
    if state.into is not None:
        return call_into(op, args)
    if state.autocast is not None:
        return autocast_call(op, args)
    if state.grad_enabled:
        if op.differentiable and _requires_grad(op, args):
            return record(op, args)
    elif state.inference:
        return mark_inference(run(op, args), op, args)
    return run(op, args)


def call_below_profiler(op, args: tuple):
    """The keys below the Profiler key: ``call`` without its first check, spelled out again rather than called
    from ``call`` so that an unprofiled operator pays no extra Python call for the profiler."""
    if dual_levels:
        out = forward_ad(op, args)
        if out is not NO_TANGENT:
            return out
    state = STATE
    if state.into is not None:
        return call_into(op, args)
    if state.autocast is not None:
        return autocast_call(op, args)
    if state.grad_enabled:
        if op.differentiable and _requires_grad(op, args):
            return record(op, args)
    elif state.inference:
        return mark_inference(run(op, args), op, args)
    return run(op, args)


def autocast_call(op, args: tuple):
    """The Autocast key: cast the arguments of an op with a policy, then run the op with autocast off, so that
    its decomposition runs on the dtypes it was given (torch's autocast wrappers exclude their key the same way)
    and only the operators user code calls are cast."""
    autocast = STATE.autocast
    STATE.autocast = None
    try:
        if op.autocast is not None:
            args = autocast.cast_args(op, args)
        return call_below_profiler(op, args)  # the Profiler key, above, already saw this call
    finally:
        STATE.autocast = autocast


def call_into(op, args: tuple):
    """The first call under an in-place op offered its target (see [Note: in-place writes] in
    ``ops/inplace.py``): when it is that op's pointwise form reading the target as its first tensor, and the
    backend can write the result straight into the target, it does, and the target is the result (recorded by
    autograd as the op's output where the op records); any other call (a decomposition's first step, a
    conversion) runs as usual."""
    out, name = STATE.into
    STATE.into = None
    if op.name == name and op.kind == "pointwise" and op.tensor_idx and args[op.tensor_idx[0]] is out \
            and not STATE.trace_depth and STATE.autocast is None:
        if STATE.grad_enabled and op.differentiable and _requires_grad(op, args):
            return record(op, args, out)
        result = run_written(op, args, out)
        if result is not None:
            return result
    return call_below_profiler(op, args)


def run_written(op, args: tuple, out: Tensor) -> Tensor | None:
    """``op(*args)`` written into ``out`` by its backend (``out`` returned), or None where the backend cannot."""
    backend = BACKENDS.get(out._device.type)
    if backend is None or device_of(op, args) is not out._device:
        return None
    if op.check is not None:  # as run does: the operator's own argument check, before any kernel
        op.check(op, args)
    return backend.run_into(op, args, out._device, out)


# ------------------------------------------------------------ plug-ins (see [Note: dispatcher plug-ins])
# Each slot is a module global, called as one: the registration rebinds it, so a call through a plug-in costs
# no more than a call of a function of this module.

def _unfilled(slot: str, layer: str):
    def missing(*args):
        raise RuntimeError(f"dispatch: {slot} is not registered; it is filled when {layer} is imported "
                           "(import tilewise rather than its submodules alone)")

    missing.__name__ = slot
    return missing


record = _unfilled("record", "tilewise.autograd")  # (op, args) -> run below autograd and record a node
apply_view = _unfilled("apply_view", "tilewise.ops")  # (op, args) -> the view's stride arithmetic
trace = _unfilled("trace", "tilewise.compiler")  # (op, args, device) -> record op into the active capture
profile_op = _unfilled("profile_op", "tilewise.profiler")  # (op, args) -> run the call inside a profiler event
batch = _unfilled("batch", "tilewise.ops")  # (op, args) -> the op's batching rule on batched arguments, or None
profiling = False  # whether any profiler records, in any thread: the Profiler key's one check per call
forward_ad = _unfilled("forward_ad", "tilewise.autograd")  # (op, args) -> the call with tangents, or NO_TANGENT
forward_ad_write = _unfilled("forward_ad_write", "tilewise.autograd")  # (target, result): an in-place write's tangents
dual_levels: tuple = ()  # the open forward-AD levels, innermost last: the ForwardAD key's one check per call
NO_TANGENT = object()  # forward_ad's answer when no input of the call carries a tangent at an open level
resolve_numbers = _unfilled("resolve_numbers", "tilewise.compiler.numbers")  # (op, args) -> args, numbers resolved
numbers_in_flight = 0  # traces with dynamic numbers in progress, in any thread: run's one check per call


def register_recorder(fn) -> None:
    """The Autograd key: ``fn(op, args, into=None)`` runs ``op`` below autograd and records its node (its result
    written into ``into`` where the backend can: see ``call_into``)."""
    global record
    record = fn


def register_number_resolver(fn) -> None:
    """Dynamic numbers of a compiled function: ``fn(op, args)`` returns the arguments with each such number made a
    0-dim tensor the operator reads as it would the number, or its value (see [Note: dynamic numbers])."""
    global resolve_numbers
    resolve_numbers = fn


_NUMBERS_LOCK = threading.Lock()  # threads that trace at once share the count


def numbers_traced(delta: int) -> None:
    """A trace with dynamic numbers starts (+1) or ends (-1): ``run`` resolves them while any is in progress."""
    global numbers_in_flight
    with _NUMBERS_LOCK:
        numbers_in_flight += delta


def register_view_applier(fn) -> None:
    """Views: ``fn(op, args)`` returns the view a view op makes (stride arithmetic on any device)."""
    global apply_view
    apply_view = fn


def register_tracer(fn) -> None:
    """The Trace key: ``fn(op, args, device)`` records ``op`` while ``tilewise.compile`` captures a function."""
    global trace
    trace = fn


def register_profiler(fn) -> None:
    """The Profiler key: ``fn(op, args)`` runs ``call_below_profiler`` inside an event while ``profiling``."""
    global profile_op
    profile_op = fn


def register_batcher(fn) -> None:
    """The Vmap key: ``fn(op, args)`` runs the op's batching rule when an argument is batched (or the op is
    random) and returns its result, or returns ``NOT_BATCHED`` when the call has nothing to batch."""
    global batch
    batch = fn


# ``STATE.grad_enabled`` while the Autograd key runs the op it records: falsy like no_grad's False, yet distinct
# from it, so that a batching rule below knows grad mode is on for the physical tensors (see ops/batching.py)
GRAD_OFF_FOR_RECORDING = None

NOT_BATCHED = object()  # the Vmap key's answer for a call it leaves to the keys below


def register_forward_ad(fn, write) -> None:
    """The ForwardAD key: ``fn(op, args)`` runs a call whose inputs carry tangents and gives its outputs theirs,
    or returns ``NO_TANGENT`` for a call none of whose inputs carries one; ``write(target, result)`` gives an
    in-place write's target (and, through a view, its base) the tangents of what was written."""
    global forward_ad, forward_ad_write
    forward_ad, forward_ad_write = fn, write


def set_dual_levels(levels: tuple) -> None:
    """The open forward-AD levels (``autograd.forward_ad`` entering and leaving a level)."""
    global dual_levels
    dual_levels = levels


def set_profiling(on: bool) -> None:
    """Turn the Profiler key on or off for every thread (``tilewise.profiler.profile`` starting and stopping)."""
    global profiling
    profiling = on


def mark_inference(out, op, args: tuple):
    """The Inference key: ``out``, whose tensors are now inference tensors, except those on the memory of a tensor
    argument (a view of a normal tensor made inside inference mode stays normal, as in torch)."""
    if type(out) is Tensor:
        outputs = (out,)
    elif isinstance(out, (tuple, list)):
        outputs = out
    else:
        return out
    for t in outputs:
        if type(t) is Tensor and t._storage is not None and not t._storage.inference \
                and not _is_argument_storage(t._storage, op, args):
            t._storage.inference = True
    return out


def _is_argument_storage(storage, op, args: tuple) -> bool:
    for k in op.tensor_idx:
        a = args[k]
        if type(a) is Tensor and a._storage is storage:
            return True
    for k in op.list_idx:
        for a in args[k]:
            if type(a) is Tensor and a._storage is storage:
                return True
    return False


def _requires_grad(op, args: tuple) -> bool:
    """Whether a tensor argument requires grad (``Tensor.requires_grad``, spelled out: a view follows its base)."""
    for k in op.tensor_idx:
        a = args[k]
        if type(a) is Tensor and (a._requires_grad or a._base is not None and a._base._requires_grad):
            return True
    for k in op.list_idx:
        for a in args[k]:
            if type(a) is Tensor and (a._requires_grad or a._base is not None and a._base._requires_grad):
                return True
    return False


def run(op, args: tuple):
    """Below autograd: run the operator on the backend of its inputs' device."""
    if numbers_in_flight and STATE.trace_depth:
        args = resolve_numbers(op, args)
    for k in op.arithmetic_tensor_idx:  # storage-only dtypes have no arithmetic (see the property)
        a = args[k]
        if type(a) is Tensor and a._dtype.is_storage_only:
            _refuse_storage_only(op, a)
    if op.check is not None:
        op.check(op, args)
    if STATE.vmap:
        out = batch(op, args)
        if out is not NOT_BATCHED:
            return out
    if STATE.trace_depth:  # capturing: every operator, views and reads of real tensors included, is recorded
        return trace(op, args, device_of(op, args))
    if op.kind == "view":
        return apply_view(op, args)
    if op.kind == "matmul":
        op.dtype_rule(op, args)  # library GEMMs take one dtype: refuse a mix on every device, before any kernel
    device = device_of(op, args)
    backend = BACKENDS.get(device.type)
    if backend is None:
        raise RuntimeError(_no_backend_message(op, device))
    return backend.run(op, args, device)


def _refuse_storage_only(op, a: Tensor) -> None:
    """float8_e8m0fnu and float4_e2m1fn_x2 have no arithmetic in torch (no kernel is compiled for them)."""
    raise NotImplementedError(
        f'"{op.name}" not implemented for \'{a._dtype.name}\', as in torch: it is a storage format '
        "(created, copied, viewed, compared with == and !=, cast when it is float8_e8m0fnu); cast to float32 "
        "first, or use tilewise.dequantize for block-scaled data")


def _no_backend_message(op, device: Device) -> str:
    if device.type == "meta":
        return (f"{op.name}: tilewise has no meta tensors (device 'meta'); make the tensors or the module on 'cpu' "
                "or 'cuda' (e.g. inside `with tilewise.device('cuda'):`)")
    return f"{op.name}: no backend for device {device}; is the CUDA extra installed? (pip install -e '.[cuda]')"


def device_of(op, args: tuple) -> Device:
    """The device an op runs on: its tensors' common device (0-dim CPU tensors may join any device)."""
    if not op.list_idx:  # the common case: when every tensor argument is on one device, that device is the answer
        found = None
        for k in op.tensor_idx:
            a = args[k]
            if type(a) is Tensor:
                if found is None:
                    found = a._device
                elif a._device is not found:
                    break
        else:
            if found is not None:
                return found
    return _common_device(op, args)


def _common_device(op, args: tuple) -> Device:
    found = None
    scalar_cpu = None
    for k in op.tensor_idx:
        a = args[k]
        if type(a) is Tensor and a._device is not found:  # a tensor on the device already found always fits
            found, scalar_cpu = _merge_device(op, a, found, scalar_cpu)
    for k in op.list_idx:
        for a in args[k]:
            found, scalar_cpu = _merge_device(op, a, found, scalar_cpu)
    if found is not None:
        return found
    if scalar_cpu is not None:
        return scalar_cpu
    names = op.param_names()
    if "device" in names:
        dev = args[names.index("device")]
        if dev is not None:
            return dev
    return default_device() if op.kind in ("creation", "random") else cpu


def _merge_device(op, a, found, scalar_cpu):
    if type(a) is not Tensor:
        return found, scalar_cpu
    dev = a._device
    if not a._shape and dev.type == "cpu":
        return found, scalar_cpu or dev
    if found is None or found is dev:
        return dev, scalar_cpu
    raise RuntimeError(f"{op.name}: expected all tensors to be on the same device, but found at least two devices, "
                       f"{found} and {dev}! Move them with .to(device) first.")

"""Convolution on CUDA through cuDNN (the cuDNN frontend's convolution graphs).

[Note: cuDNN convolution]
The convolution operators of ``ops/nn_spatial.py`` — ``_conv2d``/``_conv3d``, their transposes, and the input and
weight gradients of both (one operator each, see [Note: convolution backward]) — are three cuDNN operations:
fprop (x, w -> y), dgrad (dy, w -> dx) and wgrad (x, dy -> dw). A convolution's input gradient is dgrad and its
weight gradient wgrad; a transposed convolution is dgrad of the convolution it transposes, its input gradient
that convolution's fprop and its weight gradient wgrad with the roles of image and output gradient swapped.
Conv1d reaches here as conv2d over a height of 1 (``nn_spatial``); groups are cuDNN's, from the channel counts.

Memory format: as torch's ``cudnn_conv_suggest_memory_format``, every operand and result is channels-last
(NHWC / NDHWC) when the input or the weight is, else contiguous (NCHW). cuDNN's tensor-core kernels work in
channels-last, so a channels-last network runs without the transposes cuDNN adds around NCHW operands. An
operand that is dense in the chosen format is passed where it lies (with the canonical strides: the stride of
a size-1 dim is never read), any other is copied first.

Plans: a graph is built once per (operation, dtype, geometry, format, numerics flags) and kept. Its plan is
the heuristics' first that builds (mode A, then the fallback list); with ``tilewise.backends.cudnn.benchmark``
set, or while a ``mode="max-autotune"`` compiled function runs for the first time, every candidate is built
and timed on the real operands and the fastest kept — remembered on disk (``$TILEWISE_CACHE_DIR/cudnn``) by
the plan's name, so a later process builds only that one ([Note: library algorithm choice] in
``tuning.py``). Float32 convolutions may use TF32 tensor cores
where the conv precision allows (``tilewise.backends.cudnn.allow_tf32``, True by default as in torch);
otherwise the plans cuDNN marks TENSOR_CORE are left out, as are those marked NONDETERMINISTIC in
deterministic mode. Anything cuDNN declines (a dtype, an empty tensor, a configuration no engine supports)
runs the im2col decomposition; ``TILEWISE_LOG=convolution`` says why, once per reason.
"""

from __future__ import annotations

import hashlib
import json
import time

from tilewise import strides as S
from tilewise._stages import stage
from tilewise.backends import flags
from tilewise.backends.cuda import cudnn, tuning
from tilewise.backends.cuda.device_memory import data_ptr, empty, empty_fast, stream_handle
from tilewise.backends.cuda.kernels import kernel, kernel_into
from tilewise.config import log
from tilewise.device import Device
from tilewise.dispatch import STATE
from tilewise.ops.registry import OPS
from tilewise.tensor import Tensor

_IO_TYPES = {"float32": "FLOAT", "bfloat16": "BFLOAT16", "float16": "HALF", "float64": "DOUBLE"}
FPROP, DGRAD, WGRAD = "fprop", "dgrad", "wgrad"

_graphs: dict[tuple, cudnn.Graph | None] = {}
_reported: set[str] = set()


def _report(reason: str) -> None:
    if reason not in _reported:
        _reported.add(reason)
        log("convolution", f"convolution runs its decomposition (im2col and a GEMM): {reason}")


# ---------------------------------------------------------------------------------------------- layouts

def channels_last_suggested(t: Tensor) -> bool:
    """Whether torch's ``suggest_memory_format`` names a channels-last format for ``t``."""
    return t.ndim in (4, 5) and S.suggest_memory_format(t._shape, t._strides) != "contiguous_format"


def _channels_last_strides(shape: tuple) -> tuple:
    return S.format_strides("channels_last" if len(shape) == 4 else "channels_last_3d", shape)


def _layout(shape: tuple, channels_last: bool) -> tuple:
    return _channels_last_strides(shape) if channels_last else S.contiguous_strides(shape)


def _in_layout(t: Tensor, strides: tuple) -> bool:
    """Whether ``t`` lies exactly as ``strides`` say (size-1 dims' strides never read) at an aligned address."""
    return all(n == 1 or s == c for n, s, c in zip(t._shape, t._strides, strides)) and data_ptr(t) % 16 == 0


def _placed(t: Tensor, channels_last: bool) -> Tensor:
    """``t`` itself when it lies in the chosen format, else a copy that does."""
    strides = _layout(t._shape, channels_last)
    if _in_layout(t, strides):
        return t
    from tilewise.backends.cuda.kernels.copy import copy_into

    out = empty(t._shape, t._dtype, t._device, strides)
    copy_into(out, t)
    return out


# ---------------------------------------------------------------------------------------------- support

def unsupported(dtype, shapes: tuple) -> str | None:
    """Why cuDNN cannot run a convolution of these operand shapes (None when it can), from types alone: what the
    compiler knows when it decides to keep the operator whole."""
    if not flags.cudnn_flag("enabled"):
        return "cuDNN is off (tilewise.backends.cudnn.enabled = False)"
    if dtype.name not in _IO_TYPES:
        return f"cuDNN convolution takes float32, float64, bfloat16 or float16, got {dtype}"
    if any(0 in shape for shape in shapes):
        return "an empty operand"
    return cudnn.unavailable()


def _numerics(dtype) -> tuple:
    """(TF32, deterministic, timed choice) for a convolution of ``dtype``."""
    _, tf32, deterministic, benchmark = flags.conv_numerics()
    return (dtype.name == "float32" and tf32, deterministic, benchmark or tuning.active())


# ---------------------------------------------------------------------------------------------- graphs

def _build(kind: str, tensors: list[Tensor], params: tuple, numerics: tuple, key: tuple) -> cudnn.Graph:
    """The ``kind`` graph over ``tensors`` (its two inputs, then its output) with their strides."""
    frontend = cudnn.library()
    device = tensors[0]._device.index
    io = getattr(frontend.data_type, _IO_TYPES[tensors[0]._dtype.name])
    compute = frontend.data_type.DOUBLE if tensors[0]._dtype.name == "float64" else frontend.data_type.FLOAT
    graph = frontend.pygraph(io_data_type=io, intermediate_data_type=compute, compute_data_type=compute,
                             handle=cudnn.handle(device))
    a, b, out = (graph.tensor(name=name, dim=list(t._shape), stride=list(t._strides), data_type=io)
                 for name, t in zip("abc", tensors))
    stride, pads, dilation = params
    geometry = dict(pre_padding=list(pads[0::2]), post_padding=list(pads[1::2]), stride=list(stride),
                    dilation=list(dilation), compute_data_type=compute)
    if kind == FPROP:
        y = graph.conv_fprop(image=a, weight=b, **geometry)
    elif kind == DGRAD:
        y = graph.conv_dgrad(loss=a, filter=b, **geometry)
    else:
        y = graph.conv_wgrad(image=a, loss=b, **geometry)
    result = tensors[2]
    y.set_output(True).set_dim(list(result._shape)).set_stride(list(result._strides)).set_data_type(io)
    tf32, deterministic, timed = numerics
    with stage("cuDNN graph build"):
        graph.validate()
        graph.build_operation_graph()
        graph.create_execution_plans([frontend.heur_mode.A, frontend.heur_mode.FALLBACK])
        if tensors[0]._dtype.name == "float32" and not tf32:
            graph.deselect_numeric_notes([frontend.numerical_note.TENSOR_CORE])
        if deterministic:
            graph.deselect_numeric_notes([frontend.numerical_note.NONDETERMINISTIC])
        graph.check_support()
        remembered = _remembered(key, graph)
        if remembered is not None:
            graph.select_plan(remembered)
        graph.build_plans()
    built = cudnn.Graph(graph, [a, b, y], device, kind)
    if timed and remembered is None:
        _choose(built, tensors, key)
    return built


def _run(kind: str, tensors: list[Tensor], params: tuple) -> bool:
    """Run the ``kind`` operation over ``tensors`` (inputs, then output); False when cuDNN cannot build it
    (remembered)."""
    first = tensors[0]
    numerics = _numerics(first._dtype)
    key = (kind, first._dtype.name, first._device.index, params, numerics[:2],
           tuple((t._shape, t._strides) for t in tensors))
    graph = _graphs.get(key, False)
    if graph is False:
        try:
            graph = _graphs[key] = cudnn.cached_graph(("convolution", *key[:2], *key[3:], numerics[2]),
                                                      first._device.index, kind,
                                                      lambda: _build(kind, tensors, params, numerics, key))
        except Exception as e:  # noqa: BLE001 — cuDNN declines this configuration: the decomposition runs
            _report(f"cuDNN could not build the {kind} graph for {[tuple(t._shape) for t in tensors]} "
                    f"({first._dtype}, stride/padding/dilation {params}): {e}")
            graph = _graphs[key] = None
    if graph is None:
        return False
    _last_graph[0] = graph
    graph.run([data_ptr(t) for t in tensors], stream_handle(first._device.index))
    return True


_last_graph: list = [None]  # the graph :func:`_run` ran last (the eager fast path keeps it per signature)


# ---------------------------------------------------------------------------------------------- timed choice

_ROUNDS, _RUNS = 3, 2
MAX_TIMED_WORKSPACE = 1 << 30  # candidates needing a larger workspace are not timed


def _choose(built: cudnn.Graph, tensors: list[Tensor], key: tuple) -> None:
    """Time every built candidate plan on the real operands, pin the fastest and remember it on disk."""
    from tilewise.backends.cuda.runtime import Event

    graph, frontend = built.graph, cudnn.library()
    device = tensors[0]._device.index
    stream = stream_handle(device)
    frontend.set_stream(built.handle, stream)
    pack = dict(zip(built.operands, [data_ptr(t) for t in tensors]))
    built_indices = []
    for index in range(graph.get_execution_plan_count()):
        try:
            graph.build_plan_at_index(index)
            built_indices.append(index)
        except Exception as e:  # noqa: BLE001 — cuDNN declines the plan (or filtered it out): not a candidate
            log("convolution", lambda index=index, e=e: f"cuDNN {built.name} plan {index} does not build: {e}")
    sizes = {index: graph.get_workspace_size_plan_at_index(index) for index in built_indices}
    need = max([n for n in sizes.values() if n <= MAX_TIMED_WORKSPACE], default=0)
    ws = cudnn.workspace(device, need)  # one workspace large enough for every candidate timed
    candidates = []
    for index in built_indices:
        if sizes[index] > need:
            continue
        try:
            graph.execute_plan_at_index(pack, ws or None, index, built.handle)
            candidates.append((index, ws))
        except Exception as e:  # noqa: BLE001 — a candidate that does not run is not a candidate
            log("convolution", lambda index=index, e=e: f"cuDNN {built.name} plan {index} is not timed: {e}")
    if len(candidates) > 1:
        with stage("cuDNN plan choice"):
            times = {index: [] for index, _ in candidates}
            for _ in range(_ROUNDS):
                for index, ws in candidates:
                    start, end = Event(enable_timing=True), Event(enable_timing=True)
                    start.record(stream)
                    for _ in range(_RUNS):
                        graph.execute_plan_at_index(pack, ws or None, index, built.handle)
                    end.record(stream)
                    end.synchronize()
                    times[index].append(start.elapsed_time(end) / _RUNS)
        medians = {index: sorted(t)[len(t) // 2] for index, t in times.items()}
        best = min(medians, key=medians.__getitem__)
        log("convolution", f"cuDNN {built.name} {[tuple(t._shape) for t in tensors]}: candidate medians (ms) "
            f"{ {graph.get_plan_name_at_index(i): round(m, 4) for i, m in medians.items()} }, chose "
            f"{graph.get_plan_name_at_index(best)}")
    elif candidates:
        best = candidates[0][0]
    else:
        log("convolution", f"cuDNN {built.name}: no candidate plan ran; the heuristics' first is kept")
        graph.build_plans()
        return
    graph.select_plan(best)
    graph.build_plans()
    built.workspace_size = graph.get_workspace_size()
    built.lowered = None
    _remember(key, graph.get_plan_name_at_index(best))


_disk: list = []


def _store():
    if not _disk:
        from tilewise.codegen.toolchain.cache import default_cache_dir
        from tilewise.codegen.toolchain.disk import DiskCache

        _disk.append(DiskCache(default_cache_dir() / "cudnn", "cuDNN plan choice cache"))
    return _disk[0]


def _entry_name(key: tuple) -> str:
    from tilewise.backends.cuda.runtime import get_device_properties

    frontend = cudnn.library()
    version = getattr(frontend, "backend_version", lambda: 0)()
    identity = repr((key, get_device_properties(key[2]).name, version, "conv-plan-v1"))
    return hashlib.sha256(identity.encode()).hexdigest()[:32] + ".json"


def _remembered(key: tuple, graph) -> int | None:
    """The index of the plan a timed choice picked for ``key`` in an earlier process, if it is still listed."""
    try:
        payload = _store().read(_entry_name(key))
        if payload is None:
            return None
        name = json.loads(payload)["plan"]
        for index in range(graph.get_execution_plan_count()):
            if graph.get_plan_name_at_index(index) == name:
                return index
    except Exception:  # noqa: BLE001 — a remembered choice is only an optimisation
        return None
    return None


def _remember(key: tuple, plan: str) -> None:
    try:
        _store().write(_entry_name(key), json.dumps({"plan": plan, "at": time.time()}).encode())
    except Exception:  # noqa: BLE001, S110 — a choice not remembered is timed again in the next process
        pass


# ---------------------------------------------------------------------------------------------- kernels

def _check(dtype, *tensors: Tensor) -> str | None:
    reason = unsupported(dtype, tuple(t._shape for t in tensors))
    if reason is None and any(t._dtype is not dtype for t in tensors):
        reason = f"operands of different dtypes {[str(t._dtype) for t in tensors]}"
    return reason


def _convolve(kind: str, a: Tensor, b: Tensor, out_shape: tuple, params: tuple, device: Device,
              out: Tensor | None = None, channels_last: bool | None = None) -> Tensor | None:
    """``kind`` over ``a`` and ``b`` in ``channels_last`` format (by default the one torch picks), into ``out``
    when given (a planned buffer: then only when the operands and ``out`` already lie in that format); None when
    cuDNN declines."""
    if channels_last is None:
        channels_last = channels_last_suggested(a) or channels_last_suggested(b)
    if out is None:
        a, b = _placed(a, channels_last), _placed(b, channels_last)
        result = empty(out_shape, a._dtype, device, _layout(out_shape, channels_last))
    else:
        if not all(_in_layout(t, _layout(t._shape, channels_last)) for t in (a, b, out)):
            return None
        result = _as_laid_out(out, channels_last)
    canonical = [_as_laid_out(t, channels_last) for t in (a, b)]
    if not _run(kind, [*canonical, result], params):
        return None
    return result


def _as_laid_out(t: Tensor, channels_last: bool) -> Tensor:
    """``t`` with the canonical strides of its format (they differ at most in size-1 dims, never read)."""
    strides = _layout(t._shape, channels_last)
    if t._strides == strides:
        return t
    return Tensor._make(t._storage, t._shape, strides, t._offset, t._dtype, t._device)


def _transposed_sizes(input_shape, weight_shape, stride, pads, dilation, groups, output_padding) -> tuple:
    sizes = [(n - 1) * s - pads[2 * k] - pads[2 * k + 1] + d * (w - 1) + extra + 1
             for k, (n, w, s, d, extra) in enumerate(zip(input_shape[2:], weight_shape[2:], stride, dilation,
                                                         output_padding))]
    return (input_shape[0], weight_shape[1] * groups, *sizes)


def _forward_shape(input_shape, weight_shape, stride, pads, dilation) -> tuple:
    sizes = [(n + pads[2 * k] + pads[2 * k + 1] - d * (w - 1) - 1) // s + 1
             for k, (n, w, s, d) in enumerate(zip(input_shape[2:], weight_shape[2:], stride, dilation))]
    return (input_shape[0], weight_shape[0], *sizes)


_SLOW = object()  # a signature whose operands must be copied into the chosen format first: no fast path
_signatures: dict[tuple, object] = {}  # eager calls: signature -> (graph, result shape, strides, numel), or None


def _register(name: str, kind: str, shape_of, operands_of, backward: bool = False):
    """The eager kernel and the kernel into a planned buffer of one convolution operator.

    An eager call whose signature (operand geometry, dtype, device, arguments, flags) was seen before, with its
    operands where cuDNN reads them, costs a dictionary lookup, an allocation and the graph's launch: a
    ResNet-50 training step makes about 160 of these calls."""
    op = OPS[name]

    def run(device: Device, *args):
        a, b, params = operands_of(*args)
        if backward and STATE.grad_enabled:  # differentiated again (create_graph): differentiable primitives
            return op.decomposition(*args)
        signature = (name, flags.conv_numerics(), device,
                     *[(t._shape, t._strides, t._dtype) if type(t) is Tensor else tuple(t) if type(t) is list else t
                       for t in args])
        found = _signatures.get(signature, _SLOW)
        if found is None:
            return op.decomposition(*args)
        if found is not _SLOW:
            pa, pb = data_ptr(a), data_ptr(b)
            if not (pa | pb) & 15:
                graph, shape, strides, numel = found
                stream = stream_handle(device.index)
                out = empty_fast(shape, strides, numel, a._dtype, device, stream)
                graph.run([pa, pb, data_ptr(out)], stream)
                return out
        reason = _check(a._dtype, a, b)
        if reason is not None:
            _report(reason)
            _signatures[signature] = None
            return op.decomposition(*args)
        out = _convolve(kind, a, b, shape_of(*args), params, device)
        if out is None:
            _signatures[signature] = None
            return op.decomposition(*args)
        if signature not in _signatures:
            graph = _last_graph[0]
            laid_out = all(_in_layout(t, _layout(t._shape, _channels_last_of(out))) for t in (a, b))
            _signatures[signature] = (graph, out._shape, out._strides, out.numel()) if laid_out else _SLOW
        return out

    def run_into(out: Tensor, *args) -> bool:
        a, b, params = operands_of(*args)
        if _check(a._dtype, a, b) is not None or out._dtype is not a._dtype:
            return False
        return _convolve(kind, a, b, tuple(out._shape), params, out._device, out, False) is not None

    def run_into_channels_last(out: Tensor, *args) -> bool:
        """The ``_channels_last`` variant (see [Note: channels-last programs]): ``out`` is the result laid out
        (N, *S, C); cuDNN writes it through its (N, C, *S) view."""
        a, b, params = operands_of(*args)
        if _check(a._dtype, a, b) is not None or out._dtype is not a._dtype:
            return False
        rank = out.ndim
        order = (0, rank - 1, *range(1, rank - 1))
        view = Tensor._make(out._storage, tuple(out._shape[d] for d in order), tuple(out._strides[d] for d in order),
                            out._offset, out._dtype, out._device)
        return _convolve(kind, a, b, view._shape, params, out._device, view, True) is not None

    kernel(name)(run)
    kernel_into(name)(run_into)
    kernel_into(f"{name}_channels_last")(run_into_channels_last)


def reset() -> None:
    """Forget every built graph and eager signature (the next calls build again, as a new process would)."""
    _graphs.clear()
    _signatures.clear()


def _channels_last_of(t: Tensor) -> bool:
    return t.ndim in (4, 5) and t._strides == _channels_last_strides(t._shape) and t._strides != \
        S.contiguous_strides(t._shape)


def _params(stride, pads, dilation) -> tuple:
    return (tuple(stride), tuple(pads), tuple(dilation))


for _n in (2, 3):
    # a convolution, its input gradient (dgrad) and its weight gradient (wgrad)
    _register(f"_conv{_n}d", FPROP,
              lambda x, w, stride, pads, dilation, groups: _forward_shape(x._shape, w._shape, stride, pads, dilation),
              lambda x, w, stride, pads, dilation, groups: (x, w, _params(stride, pads, dilation)))
    _register(f"_conv{_n}d_backward_input", DGRAD,
              lambda g, x, w, stride, pads, dilation, groups: tuple(x._shape),
              lambda g, x, w, stride, pads, dilation, groups: (g, w, _params(stride, pads, dilation)), True)
    _register(f"_conv{_n}d_backward_weight", WGRAD,
              lambda g, x, w, stride, pads, dilation, groups: tuple(w._shape),
              lambda g, x, w, stride, pads, dilation, groups: (x, g, _params(stride, pads, dilation)), True)
    # a transposed convolution is the dgrad of the convolution it transposes
    _register(f"_conv_transpose{_n}d", DGRAD,
              lambda x, w, stride, pads, dilation, groups, output_padding:
              _transposed_sizes(x._shape, w._shape, stride, pads, dilation, groups, output_padding),
              lambda x, w, stride, pads, dilation, groups, output_padding: (x, w, _params(stride, pads, dilation)))
    _register(f"_conv_transpose{_n}d_backward_input", FPROP,
              lambda g, x, w, stride, pads, dilation, groups: tuple(x._shape),
              lambda g, x, w, stride, pads, dilation, groups: (g, w, _params(stride, pads, dilation)), True)
    _register(f"_conv_transpose{_n}d_backward_weight", WGRAD,
              lambda g, x, w, stride, pads, dilation, groups: tuple(w._shape),
              lambda g, x, w, stride, pads, dilation, groups: (g, x, _params(stride, pads, dilation)), True)


# ---------------------------------------------------------------------------------------------- compiler

_KEPT = frozenset(name for n in (2, 3) for name in (
    f"_conv{n}d", f"_conv{n}d_backward_input", f"_conv{n}d_backward_weight", f"_conv_transpose{n}d",
    f"_conv_transpose{n}d_backward_input", f"_conv_transpose{n}d_backward_weight"))


PATCH_CHANNELS = 4  # at most this many input channels (an image's) make a patch embedding a GEMM's


def _patches(op_name: str, args: tuple) -> bool:
    """Whether a convolution, or its weight gradient, is an image's patch embedding: a stride equal to the kernel,
    no padding or dilation, one group, at most ``PATCH_CHANNELS`` input channels (a ViT's or a ConvNeXt's stem).
    Its decomposition is then a transposing copy and one GEMM, where cuDNN's kernels for so few channels move
    90-190 GB/s (ViT-B/16's on an H200: 0.44 ms forward, 0.22 ms weight gradient, against about 0.05 ms each as a
    GEMM). Wider patch convolutions (a ConvNeXt's downsampling) and every input gradient stay cuDNN's."""
    if op_name not in ("_conv2d", "_conv3d", "_conv2d_backward_weight", "_conv3d_backward_weight"):
        return False
    weight = args[2] if "backward" in op_name else args[1]
    stride, pads, dilation, groups = args[-4:]
    kernel = tuple(weight.shape[2:])
    return (groups == 1 and weight.shape[1] <= PATCH_CHANNELS and tuple(stride) == kernel
            and all(d == 1 for d in dilation)
            and not any(p for pair in pads for p in (pair if isinstance(pair, (tuple, list)) else (pair,))))


def keeps(op_name: str, args: tuple) -> bool:
    """Whether the compiler should keep a convolution operator whole, as one cuDNN call, rather than decompose
    it into im2col and a GEMM (the CUDA target's passes, ``compiler.targets``). ``args`` are its bound
    arguments, tensors standing for anything with ``shape``, ``dtype`` and ``device``."""
    if op_name not in _KEPT or _patches(op_name, args):
        return False
    tensors = [a for a in args if hasattr(a, "shape") and hasattr(a, "dtype")]
    dtype = tensors[0].dtype
    if any(t.dtype is not dtype for t in tensors):
        return False
    return unsupported(dtype, tuple(tuple(t.shape) for t in tensors)) is None

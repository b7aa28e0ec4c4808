"""Attention on CUDA through cuDNN's fused flash attention (the cuDNN frontend's SDPA graphs).

[Note: cuDNN attention]
``scaled_dot_product_attention`` without dropout calls ``_scaled_dot_product_attention_math`` (output and the
rows' log-sum-exp), whose derivative is ``_scaled_dot_product_attention_backward``; both are declared by their
decomposition into matmul and softmax (``ops/nn_functional.py``), which materialises the L×S scores. On CUDA,
for bfloat16/float16 inputs of rank 4 ([batch, heads, length, head dim]) with a head dim that is a multiple
of 8 up to 128, no attention mask but the causal one (``is_causal``, top-left aligned as in torch), both run
as one cuDNN SDPA graph each, which never writes the scores: the forward keeps the log-sum-exp ("stats",
float32 [B, H, L, 1], exactly what the decomposition returns) and the backward recomputes the
probabilities from it. Anything else runs the decomposition; ``TILEWISE_LOG=attention`` says why, once per
reason.

Grouped-query attention (``enable_gqa``: key and value heads each dividing the query's) goes to cuDNN with key
and value as they are: its graphs take a head count per operand, query head ``h`` reading key/value head
``h // (H_q / H_kv)`` (torch's ``repeat_interleave`` order), and its backward returns dK and dV in the key/value
head count, summed over each group in float32. The decomposition instead repeats the heads (a copy of key and
value forward, a reduction of their gradients backward); compiled programs hand cuDNN the un-repeated tensors
of a head repeat the model wrote itself (``compiler/passes/attention.py``).

A graph is built once per (dtypes, shapes, strides, scale, causal, device) — validation, heuristics and
kernel build take a while the first time — and kept, with a workspace that is never freed (see [Note: cuDNN
graphs] in ``cudnn.py``), so that a CUDA graph of a compiled program that replays it finds it; a compiled
program builds its attention steps' graphs when it is built, beside its kernels' compiles (see [Note: library
calls prepared at build]), each kernel into planned buffers being one function giving the graph call, which
the run executes and the preparation only builds, under the one key :func:`graph_key`. Operands are
passed with their strides (the per-head views a fused QKV projection gives need no copy); the innermost
stride must be 1 and the others multiples of 8 elements, with 16-byte aligned addresses, else the eager
kernel copies the operand first and the kernel into a planned buffer (what compiled programs call,
see [Note: kernels into a given output]) declines.
"""

from __future__ import annotations

from functools import partial

from tilewise import dtypes
from tilewise import strides as S
from tilewise._stages import stage
from tilewise.backends import flags
from tilewise.backends.cuda import cudnn
from tilewise.backends.cuda.device_memory import data_ptr, empty, stream_handle
from tilewise.backends.cuda.kernels import kernel, kernel_into
from tilewise.config import log
from tilewise.device import Device
from tilewise.dispatch import STATE
from tilewise.ops.registry import OPS
from tilewise.tensor import Tensor

FORWARD, BACKWARD = "_scaled_dot_product_attention_math", "_scaled_dot_product_attention_backward"
MAX_HEAD_DIM = 128
_IO_TYPES = {"bfloat16": "BFLOAT16", "float16": "HALF"}

_graphs: dict[tuple, cudnn.Graph | None] = {}
_reported: set[str] = set()


def _report(reason: str) -> None:
    if reason not in _reported:
        _reported.add(reason)
        log("attention", f"scaled_dot_product_attention runs its decomposition (matmul, softmax, matmul): {reason}")


def unsupported(dtype, query_shape, key_shape, value_shape, has_bias: bool, device: Device,
                enable_gqa: bool = False) -> str | None:
    """Why cuDNN cannot run this attention (None when it can), from types alone: what the compiler knows when
    it decides to keep the operator whole."""
    if not flags.sdp_enabled("cudnn"):
        return "cuDNN attention is off (tilewise.backends.cuda.enable_cudnn_sdp(False))"
    if flags.are_deterministic_algorithms_enabled() and not flags.is_deterministic_algorithms_warn_only_enabled():
        return "deterministic algorithms are on, and cuDNN attention's backward accumulates with atomics"
    if dtype.name not in _IO_TYPES:
        return f"cuDNN attention takes bfloat16 or float16, got {dtype}"
    if has_bias:
        return "an explicit attn_mask (only is_causal runs fused)"
    if not (len(query_shape) == len(key_shape) == len(value_shape) == 4):
        return f"cuDNN attention takes [batch, heads, length, dim] operands, got ranks {len(query_shape)}, " \
               f"{len(key_shape)}, {len(value_shape)}"
    mismatch = _head_mismatch(query_shape, key_shape, value_shape, enable_gqa)
    if mismatch:
        return mismatch
    head_dim = query_shape[-1]
    if value_shape[-1] != head_dim or head_dim % 8 or head_dim > MAX_HEAD_DIM:
        return f"head dims {head_dim} (query/key) and {value_shape[-1]} (value): cuDNN attention here takes " \
               f"equal head dims that are multiples of 8 up to {MAX_HEAD_DIM}"
    if 0 in query_shape or 0 in key_shape:
        return "an empty operand"
    # lowered for the CUDA target from tensors elsewhere (``explain`` without a GPU) there is no GPU to ask: the
    # target builds for compute capability 8.0 or newer
    if device.type == "cuda" and _capability_major(device) < 8:
        return "cuDNN flash attention needs compute capability 8.0 or newer"
    return cudnn.unavailable()


def _head_mismatch(query_shape, key_shape, value_shape, enable_gqa: bool) -> str | None:
    """Why the batch and head dims do not fit cuDNN: one batch size; the query's head count, or with
    ``enable_gqa`` key/value head counts that divide it."""
    if not query_shape[0] == key_shape[0] == value_shape[0]:
        return f"batch dims differ: query {list(query_shape)}, key {list(key_shape)}, value {list(value_shape)}"
    heads = query_shape[1]
    if enable_gqa and all(0 < s[1] <= heads and heads % s[1] == 0 for s in (key_shape, value_shape)):
        return None
    if key_shape[1] != heads or value_shape[1] != heads:
        return f"head dims differ: query {list(query_shape)}, key {list(key_shape)}, value {list(value_shape)}" + \
            ("" if enable_gqa else " (without enable_gqa)")
    return None


def _capability_major(device: Device) -> int:
    """The major number of the GPU's compute capability."""
    from tilewise.backends.cuda.runtime import get_device_properties

    return get_device_properties(device.index).major


def _fits(t: Tensor) -> bool:
    """Whether cuDNN can read ``t`` where it lies: innermost stride 1, others multiples of 8, 16-byte aligned."""
    strides = t._strides
    return strides[-1] == 1 and all(s % 8 == 0 for s in strides[:-1]) and data_ptr(t) % 16 == 0


def _fits_stats(t: Tensor) -> bool:
    return t.is_contiguous() and data_ptr(t) % 16 == 0


def _build(backward: bool, tensors: list[Tensor | None], scale: float, causal: bool) -> cudnn.Graph:
    """The forward (q, k, v, o[, stats]) or backward (q, k, v, o, dO, stats, dq, dk, dv) graph for these
    operands' geometry."""
    frontend = cudnn.library()
    device = tensors[0]._device.index
    io = getattr(frontend.data_type, _IO_TYPES[tensors[0]._dtype.name])
    fp32 = frontend.data_type.FLOAT
    graph = frontend.pygraph(io_data_type=io, intermediate_data_type=fp32, compute_data_type=fp32,
                             handle=cudnn.handle(device))

    def operand(k: int, name: str, data_type=None):
        t = tensors[k]
        return graph.tensor(name=name, dim=list(t._shape), stride=list(t._strides), data_type=data_type or io)

    def output(value, k: int, data_type=None):
        t = tensors[k]
        value.set_output(True).set_dim(list(t._shape)).set_stride(list(t._strides)).set_data_type(data_type or io)
        return value

    q, k, v = operand(0, "q"), operand(1, "k"), operand(2, "v")
    if backward:
        o, d_o, stats = operand(3, "o"), operand(4, "dO"), operand(5, "stats", fp32)
        dq, dk, dv = graph.sdpa_backward(name="sdpa_backward", q=q, k=k, v=v, o=o, dO=d_o, stats=stats,
                                         attn_scale=scale, use_causal_mask=causal)
        operands = [q, k, v, o, d_o, stats, output(dq, 6), output(dk, 7), output(dv, 8)]
    else:
        with_stats = tensors[4] is not None
        o, stats = graph.sdpa(name="sdpa", q=q, k=k, v=v, generate_stats=with_stats, attn_scale=scale,
                              use_causal_mask=causal)
        operands = [q, k, v, output(o, 3)] + ([output(stats, 4, fp32)] if with_stats else [])
    with stage("cuDNN graph build"):
        graph.validate()
        graph.build_operation_graph()
        graph.create_execution_plans([frontend.heur_mode.A, frontend.heur_mode.FALLBACK])
        graph.check_support()
        graph.build_plans()
    return cudnn.Graph(graph, operands, device, "attention")


def graph_key(backward: bool, tensors: list[Tensor | None], scale: float, causal: bool) -> tuple:
    """What the graph over ``tensors`` is built for: its direction, dtype, device, scale, causal mask and each
    operand's (shape, strides). A run and a compiled program's preparation ask :func:`_graph` for a graph by
    this one key (see [Note: library calls prepared at build])."""
    query = tensors[0]
    return (backward, query._dtype, query._device.index, scale, causal,
            tuple((t._shape, t._strides) if t is not None else None for t in tensors))


def _graph(backward: bool, tensors: list[Tensor | None], scale: float, causal: bool) -> cudnn.Graph | None:
    """The forward or backward graph for ``tensors``' geometry, built (or loaded from the disk) the first time it
    is asked for; None when cuDNN cannot build it (remembered). Only the operands' geometry is read."""
    key = graph_key(backward, tensors, scale, causal)
    graph = _graphs.get(key, False)
    if graph is False:
        try:
            identity = ("attention", key[0], key[1].name, *key[3:])
            graph = _graphs[key] = cudnn.cached_graph(identity, key[2], "attention",
                                                      lambda: _build(backward, tensors, scale, causal))
        except Exception as e:  # noqa: BLE001 — cuDNN declines this configuration: the decomposition runs
            _report(f"cuDNN could not build the graph for {'backward' if backward else 'forward'} "
                    f"{[tuple(t._shape) for t in tensors if t is not None]}: {e}")
            graph = _graphs[key] = None
    return graph


def _run(backward: bool, tensors: list[Tensor | None], scale: float, causal: bool) -> bool:
    """Run the forward or backward graph over ``tensors``; False when cuDNN cannot build it (remembered)."""
    graph = _graph(backward, tensors, scale, causal)
    if graph is None:
        return False
    graph.run([data_ptr(t) for t in tensors if t is not None], stream_handle(tensors[0]._device.index))
    return True


def _kernel_into(*names: str):
    """Register ``call(outs, *bound_args)`` — the graph call ``(backward, operands, scale, causal)`` that writes
    an operator's results into ``outs``, or None where cuDNN cannot write them there — as the operator's kernel
    into its outputs, which runs that call, and as its preparation, which builds that call's graph (see [Note:
    library calls prepared at build]): both find the graph under the key the one ``call`` gives."""

    def register(call):
        kernel_into(*names, prepare=partial(_prepare_call, call))(partial(_run_call, call))
        return call

    return register


def _run_call(call, outs, *args) -> bool:
    found = call(outs, *args)
    return found is not None and _run(*found)


def _prepare_call(call, outs, *args) -> None:
    found = call(outs, *args)
    if found is not None:
        _graph(*found)


_decisions: dict[tuple, str | None] = {}


def _checked(query, key, value, bias, enable_gqa: bool = False) -> str | None:
    """:func:`unsupported` for these operands, remembered per signature (this runs at every eager call)."""
    signature = (query._dtype, query._shape, key._shape, value._shape, bias is not None, query._device,
                 bool(enable_gqa))
    try:
        return _decisions[signature]
    except KeyError:
        reason = _decisions[signature] = unsupported(*signature)
        return reason


# ---------------------------------------------------------------------------------------------- forward

def _forward_into(out: Tensor, stats: Tensor | None, query: Tensor, key: Tensor, value: Tensor, scale: float,
                  is_causal: bool) -> bool:
    return _run(False, [query, key, value, out, stats], float(scale), bool(is_causal))


def _empty_like_query(shape: tuple, query: Tensor, device: Device) -> Tensor:
    """The output, dense in the query's memory order: what ``scaled_dot_product_attention`` returns (see [Note:
    attention's output layout] in ``ops/nn_functional.py``), so that laying it out costs no copy."""
    return empty(shape, query._dtype, device, S.strides_in_order(shape, S.order_by_strides(query._strides)[::-1]))


@kernel(FORWARD)
def attention(device: Device, query: Tensor, key: Tensor, value: Tensor, bias: Tensor | None, scale: float,
              is_causal: bool = False, enable_gqa: bool = False):
    reason = _checked(query, key, value, bias, enable_gqa)
    if reason is None:
        q, k, v = (t if _fits(t) else t.contiguous() for t in (query, key, value))
        out = _empty_like_query((*query._shape[:-1], value._shape[-1]), query, device)
        stats = empty((*query._shape[:-1], 1), dtypes.float32, device)
        if _forward_into(out, stats, q, k, v, scale, is_causal):
            return out, stats
    else:
        _report(reason)
    return OPS[FORWARD].decomposition(query, key, value, bias, scale, is_causal, enable_gqa)


@_kernel_into(FORWARD)
def attention_call(outs: tuple, query: Tensor, key: Tensor, value: Tensor, bias: Tensor | None, scale: float,
                   is_causal: bool = False, enable_gqa: bool = False) -> tuple | None:
    out, stats = outs
    if out is None or _checked(query, key, value, bias, enable_gqa) is not None:
        return None
    if not all(map(_fits, (query, key, value))):
        return None
    return False, [query, key, value, out, stats], float(scale), bool(is_causal)


# ---------------------------------------------------------------------------------------------- backward

def _backward_into(grads: tuple, grad: Tensor, query: Tensor, key: Tensor, value: Tensor, out: Tensor,
                   logsumexp: Tensor, scale: float, is_causal: bool) -> bool:
    return _run(True, [query, key, value, out, grad, logsumexp, *grads], float(scale), bool(is_causal))


def _backward_unsupported(grad, query, key, value, bias, out, logsumexp, enable_gqa) -> bool:
    return (_checked(query, key, value, bias, enable_gqa) is not None or grad._dtype is not query._dtype
            or out._dtype is not query._dtype or logsumexp._dtype is not dtypes.float32
            or logsumexp._shape != (*query._shape[:-1], 1))


@kernel(BACKWARD)
def attention_backward(device: Device, grad: Tensor, query: Tensor, key: Tensor, value: Tensor,
                       bias: Tensor | None, scale: float, is_causal: bool, out: Tensor, logsumexp: Tensor,
                       enable_gqa: bool = False):
    # differentiated again (create_graph), the backward must be built of differentiable primitives
    if not STATE.grad_enabled and not _backward_unsupported(grad, query, key, value, bias, out, logsumexp,
                                                            enable_gqa):
        operands = [t if _fits(t) else t.contiguous() for t in (grad, query, key, value, out)]
        operands.append(logsumexp if _fits_stats(logsumexp) else logsumexp.contiguous())
        grads = tuple(empty(t._shape, t._dtype, device) for t in (query, key, value))
        if _backward_into(grads, *operands, scale, is_causal):
            return (*grads, None)
    return OPS[BACKWARD].decomposition(grad, query, key, value, bias, scale, is_causal, out, logsumexp,
                                       enable_gqa)


@_kernel_into(BACKWARD)
def attention_backward_call(outs: tuple, grad: Tensor, query: Tensor, key: Tensor, value: Tensor,
                            bias: Tensor | None, scale: float, is_causal: bool, out: Tensor,
                            logsumexp: Tensor, enable_gqa: bool = False) -> tuple | None:
    if any(o is None for o in outs[:3]) or _backward_unsupported(grad, query, key, value, bias, out, logsumexp,
                                                                 enable_gqa):
        return None
    if not all(map(_fits, (grad, query, key, value, out))) or not _fits_stats(logsumexp):
        return None
    return True, [query, key, value, out, grad, logsumexp, *outs[:3]], float(scale), bool(is_causal)


# ---------------------------------------------------------------------------------------------- ordered results

def _seen_unordered(out: Tensor | None, order) -> Tensor | None:
    """A result written in ``order`` (the permuted value, row-major) seen as the operator's own result: the view
    through the inverse permute (see [Note: attention written in a given order])."""
    if out is None:
        return None
    order = tuple(order)
    inverse = [order.index(d) for d in range(len(order))]
    return Tensor._make(out._storage, tuple(out._shape[d] for d in inverse), tuple(out._strides[d] for d in inverse),
                        out._offset, out._dtype, out._device)


@_kernel_into(FORWARD + "_ordered")
def attention_call_ordered(outs: tuple, query: Tensor, key: Tensor, value: Tensor, bias: Tensor | None,
                           scale: float, is_causal: bool, enable_gqa: bool, out_order) -> tuple | None:
    out, stats = outs
    return attention_call((_seen_unordered(out, out_order), stats), query, key, value, bias, scale, is_causal,
                          enable_gqa)


@_kernel_into(BACKWARD + "_ordered")
def attention_backward_call_ordered(outs: tuple, grad: Tensor, query: Tensor, key: Tensor, value: Tensor,
                                    bias: Tensor | None, scale: float, is_causal: bool, out: Tensor,
                                    logsumexp: Tensor, enable_gqa: bool, query_order, key_order,
                                    value_order) -> tuple | None:
    grads = tuple(_seen_unordered(g, order) for g, order in zip(outs[:3], (query_order, key_order, value_order)))
    return attention_backward_call((*grads, *outs[3:]), grad, query, key, value, bias, scale, is_causal, out,
                                   logsumexp, enable_gqa)


@_kernel_into(BACKWARD + "_packed")
def attention_backward_call_packed(out: Tensor, grad: Tensor, query: Tensor, key: Tensor, value: Tensor,
                                   bias: Tensor | None, scale: float, is_causal: bool, attn_out: Tensor,
                                   logsumexp: Tensor, enable_gqa: bool, query_order, key_order, value_order,
                                   query_piece, key_piece, value_piece, dim: int) -> tuple | None:
    """The three gradients written into their slices of ``out`` (their ``cat`` along ``dim``, each reshaped to
    its piece): each slice seen as the gradient in its order, then through the inverse permute."""
    strides, offset, grads = S.contiguous_strides(out._shape), out._offset, []
    for operand, order, piece in zip((query, key, value), (query_order, key_order, value_order),
                                     (query_piece, key_piece, value_piece)):
        memory_shape = tuple(operand._shape[d] for d in order)
        viewed = S.view_strides(tuple(piece), strides, memory_shape)
        if viewed is None or any(st % 8 for st in viewed[:-1]) or viewed[-1] != 1 or \
                (offset * out._dtype.itemsize) % 16:
            return None
        grads.append(_seen_unordered(Tensor._make(out._storage, memory_shape, viewed, offset, out._dtype,
                                                  out._device), order))
        offset += piece[dim] * strides[dim]
    return attention_backward_call((*grads, None), grad, query, key, value, bias, scale, is_causal, attn_out,
                                   logsumexp, enable_gqa)


# ---------------------------------------------------------------------------------------------- compiler

def keeps(op_name: str, args: tuple) -> bool:
    """Whether the compiler should keep an operator whole, as one cuDNN call, rather than decompose it
    (the CUDA target's passes, ``compiler.targets``): an attention forward or backward whose operands cuDNN
    takes. ``args`` are its bound arguments, tensors standing for anything with ``shape``, ``dtype`` and
    ``device``."""
    if op_name not in (FORWARD, BACKWARD):
        return False
    query, key, value, bias = args[1:5] if op_name == BACKWARD else args[:4]
    return unsupported(query.dtype, tuple(query.shape), tuple(key.shape), tuple(value.shape), bias is not None,
                       query.device, bool(args[-1])) is None

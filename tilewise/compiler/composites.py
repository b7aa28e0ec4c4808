"""Composite operators in one generated kernel: eager calls compiled by the compiler (a CUDA and CPU backend plug-in).

[Note: fused composites] A composite operator (softmax, layer_norm, a loss, the backward composites their
derivatives call) is declared by its decomposition into primitives. Run as it is, that is one launch and
one trip through memory per primitive. On CUDA, the operators in ``FUSED`` instead go through
``tilewise.compile`` of their own decomposition, once per call signature (shapes, strides, dtypes, the
non-tensor arguments): the compiler fuses the primitives into one kernel (softmax reads its input once
and writes its output once) and keeps that program for later calls with the same signature. Anything
the compiler gives up on for a signature (it then runs the decomposition as before) is remembered, so
the attempt is made once.

On the CPU the same mechanism runs ``CPU_FUSED`` through the C target: softmax, layer norm, cross-entropy,
their backwards, gelu (a pointwise operator whose numpy form, fdlibm's ``erf`` in numpy calls, cost 6 ms
forward and 15 ms backward on a 768x256 tensor, a fifth of a small nanoGPT step), and max pooling with indices
(its decomposition walks the window in numpy passes: 31 ms against 3.3 ms compiled for the 64x64x24x24 input of
the MNIST CNN's pooling, bit for bit the same values and indices), and attention's math and its backward (the
softmax chain between the products in one kernel; forward and backward of a 12x4x64x16 causal attention 3.2 ms
against 2.6 ms, CPU time, best of 30). Numpy runs a composite as
one pass per primitive with a temporary each; the C kernel reads its input once. A call takes the compiled
path only from ``settings.cpu_fused_min_elements`` elements (``TILEWISE_CPU_FUSED``): below it numpy is as
fast as the program's call, and a shape seen once (a test's) is not worth a C compile; float16 and bfloat16
keep numpy's path, whose rounding the op tests pin.
"""

from __future__ import annotations

import operator
import warnings

from tilewise import strides as S
from tilewise.compiler.capture import signature
from tilewise.compiler.formats import from_channels_last, to_channels_last
from tilewise.compiler.windows import rebased
from tilewise.config import settings
from tilewise.dispatch import STATE
from tilewise.dispatch import call as dispatch_call
from tilewise.tensor import Tensor

FUSED = frozenset({
    "softmax", "log_softmax", "_softmax_backward_data", "_log_softmax_backward_data", "logsumexp",
    "layer_norm", "native_layer_norm", "_layer_norm_backward",
    "rms_norm", "_fused_rms_norm", "group_norm", "mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss",
    "binary_cross_entropy", "binary_cross_entropy_with_logits", "_binary_cross_entropy", "kl_div",
    "_cross_entropy_loss", "_cross_entropy_backward", "_cross_entropy_target_backward",
    "normalize", "cosine_similarity", "var", "std", "var_mean", "std_mean",
    "_lstm_cell", "_lstm_cell_backward", "_gru_cell", "_gru_cell_backward",
    "native_batch_norm", "_batch_norm_backward",
    "max_pool1d_with_indices", "max_pool2d_with_indices", "max_pool3d_with_indices",
})
CPU_FUSED = frozenset({
    "softmax", "log_softmax", "_softmax_backward_data", "_log_softmax_backward_data",
    "native_layer_norm", "_layer_norm_backward", "_cross_entropy_loss", "_cross_entropy_backward",
    "gelu", "gelu_backward",
    "max_pool1d_with_indices", "max_pool2d_with_indices", "max_pool3d_with_indices",
    "_scaled_dot_product_attention_math", "_scaled_dot_product_attention_backward",
})
CPU_FUSED_DTYPES = frozenset({"float32", "float64"})
MAX_SIGNATURES = 256  # per operator; past it, new signatures run the decomposition

_programs: dict = {}  # (grad mode, op, signature) -> compiled function, or None when the compiler gave up


def _key(op, args: tuple):
    return op, _parts(args)


def _parts(args: tuple) -> tuple:
    parts = []
    for a in args:
        if type(a) is Tensor:
            parts.append(signature(a))
        elif isinstance(a, (list, tuple)):
            parts.append((type(a), tuple((type(x), x) for x in a)))
        else:
            parts.append((type(a), a))
    return tuple(parts)


def run_fused(op, args: tuple):
    """``op(*args)`` by its compiled decomposition (see the note); None when it must run as declared."""
    for a in args:
        if isinstance(a, (list, tuple)) and any(type(x) is Tensor for x in a):
            return None  # tensors inside lists would be baked into the program
    args = tuple([rebased(a) if type(a) is Tensor else a for a in args])
    try:
        key = (STATE.grad_enabled, op, _parts(args))
        fast = _variants.get(key)
    except TypeError:  # an unhashable argument
        return None
    if fast is not None:  # see [Note: fused calls skip the guards]
        variant, last = fast
        tensors = [_permuted(a, True) if k in last else a for k, a in enumerate(args) if type(a) is Tensor]
        if len({id(t._storage) for t in tensors}) == len(tensors):
            return _restored(variant.run(tensors), last)
    last = _channels_last_positions(op, args)
    tensors = [_permuted(a, True) if k in last else a for k, a in enumerate(args) if type(a) is Tensor]
    fn = _programs.get(key, False)
    if fn is None:
        return None
    if fn is False:
        if sum(k[1] is op for k in _programs) >= MAX_SIGNATURES:
            return None
        fn = _programs[key] = _compile(op, args, last)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        out = fn(*tensors)
    if fn.eager_reason is not None:
        _programs[key] = None
    elif len(fn.variants) == 1 and len({id(t._storage) for t in tensors}) == len(tensors):
        _variants[key] = (fn.variants[0], last)  # ``last`` follows from the strides in the key
    return _restored(out, last)


# [Note: fused composites in channels-last memory]
# A compiled program's results are laid out row-major, but batch norm and max pooling keep a channels-last
# input's format (torch's kernels do, and the next convolution reads it where it lies). For these operators a
# channels-last argument is handed to the program as its (N, *S, C) permutation, which is row-major in memory;
# the decomposition sees it through the inverse permutation, and each result of the same rank leaves as its
# (N, *S, C) permutation, computed in that order (``lowering/channels_last.py`` keeps the element-wise work in
# it) and handed back through the inverse permutation: channels-last, with no transposing copy either way.
KEEP_CHANNELS_LAST = frozenset({"native_batch_norm", "_batch_norm_backward", "max_pool2d_with_indices",
                                "max_pool3d_with_indices"})


def _channels_last_positions(op, args: tuple) -> frozenset:
    """The positions of the channels-last arguments of an operator that keeps the format (else none)."""
    if op.name not in KEEP_CHANNELS_LAST:
        return frozenset()
    return frozenset(k for k, a in enumerate(args) if type(a) is Tensor and a.ndim in (4, 5)
                     and S.suggest_memory_format(a._shape, a._strides) != "contiguous_format")


def _order(rank: int, to_last: bool) -> tuple:
    return to_channels_last(rank) if to_last else from_channels_last(rank)


# (rank, to_last) -> the permutation picking a shape's or strides' entries, for ranks 4 and 5
_PICK = {(rank, to_last): operator.itemgetter(*_order(rank, to_last)) for rank in (4, 5) for to_last in (True, False)}


def _permuted(t: Tensor, to_last: bool) -> Tensor:
    """``t`` seen in (N, *S, C) order (``to_last``) or back in (N, C, *S) order: a view made below the dispatcher."""
    pick = _PICK[len(t._shape), to_last]
    return Tensor._make(t._storage, pick(t._shape), pick(t._strides), t._offset, t._dtype, t._device)


def _restored(out, last: frozenset):
    """The program's results back in (N, C, *S) order where its arguments came channels-last."""
    if not last:
        return out
    if isinstance(out, (tuple, list)):
        return type(out)([_permuted(o, False) if type(o) is Tensor and len(o._shape) in (4, 5) else o for o in out])
    return _permuted(out, False) if type(out) is Tensor and len(out._shape) in (4, 5) else out


# [Note: fused calls skip the guards]
# A compiled function checks its guards at every call: the arguments' structure, grad and autocast modes, each
# tensor's signature, which tensors share storage. A fused composite's key already holds all of them but the
# last: the grad mode, every non-tensor argument, every tensor's ``signature``; autocast is always off below the
# dispatcher's Autocast key, where backends run. So once a key's function has compiled its one variant for
# arguments in distinct storages, a later call with that key and distinct storages runs the variant directly
# (half of a fused call's host time was the guards); any other call goes through the function and its guards.
# key -> (the one variant of _programs[key], its channels-last positions), for calls in distinct storages
_variants: dict = {}


def _compile(op, args: tuple, last: frozenset = frozenset()):
    from tilewise.compiler.function import compile as compile_fn

    positions = [k for k, a in enumerate(args) if type(a) is Tensor]
    template = [None if type(a) is Tensor else a for a in args]  # keeps no caller's tensor alive
    meaning = op.decomposition or _through_dispatcher(op)  # a pointwise operator: the program is the operator

    def decomposition(*tensors):
        bound = list(template)
        for k, t in zip(positions, tensors):
            bound[k] = t.permute(*_order(t.ndim, False)) if k in last else t
        out = meaning(*bound)
        if not last:
            return out
        # see [Note: fused composites in channels-last memory]
        if isinstance(out, (tuple, list)):
            return type(out)(o.permute(*_order(o.ndim, True)) if isinstance(o, Tensor) and o.ndim in (4, 5) else o
                             for o in out)
        return out.permute(*_order(out.ndim, True)) if out.ndim in (4, 5) else out

    decomposition.__name__ = decomposition.__qualname__ = op.name
    fn = compile_fn(decomposition)
    fn.arenas = _ARENAS  # see [Note: one arena for every fused composite]
    fn.arena_keep = ARENA_KEEP
    fn.graph_bytes = GRAPH_BYTES
    return fn


def _through_dispatcher(op):
    def call(*bound):
        return dispatch_call(op, bound)
    return call


# [Note: one arena for every fused composite]
# Each compiled function keeps an arena for its programs' intermediate values, as large as its largest plan. The
# fused composites of a network are many functions (a batch norm and its backward per activation shape), and
# their calls run one after another on the device's stream like the programs of one function, so they share one
# arena per device: a ResNet-50 held one per batch-norm signature, about 2 GiB more than its largest. On CUDA
# that arena keeps plans up to ``ARENA_KEEP``; a composite whose intermediates need more takes its arena from the
# caching allocator for each call and gives it back after ([Note: transient arenas] in program.py), as an eager
# operator's temporaries are, so a network's largest batch norm leaves nothing allocated behind it.
_ARENAS: dict = {}
ARENA_KEEP = {"cuda": 16 << 20}
# A CUDA graph holds the arguments' staging copies and the outputs it writes for as long as it lives, and a
# composite's programs live as long as the process: a composite is captured only where those are at most 1 MiB
# (the cost rule of [Note: CUDA programs] alone let a ResNet-50's batch norms keep 0.3-0.6 GiB in graphs).
GRAPH_BYTES = 1 << 20


def run_fused_on_cpu(op, args: tuple):
    """``op(*args)`` as one C kernel when its tensors are large enough and of a dtype the C path serves (see the
    note); None to run it as declared."""
    least = settings.cpu_fused_min_elements
    if least < 0:
        return None
    largest = 0
    for a in args:
        if type(a) is Tensor:
            if a._dtype.is_floating_point and a._dtype.name not in CPU_FUSED_DTYPES:
                return None
            largest = max(largest, S.numel(a._shape))
    if largest < least or largest == 0:
        return None
    return run_fused(op, args)


def _register() -> None:
    from tilewise.backends import cpu, cuda

    cuda.register_composite_runner(FUSED, run_fused)
    cpu.register_composite_runner(CPU_FUSED, run_fused_on_cpu)


_register()

"""The gradient reducer behind DistributedDataParallel: buckets of gradients all-reduced while backward runs.

[Note: DDP buckets] Parameters are grouped by device and dtype into *buckets*, each one flat buffer of at most
``bucket_cap_mb`` (torch's ``_compute_bucket_assignment_by_size``: a bucket closes as soon as it reaches its
limit; the first bucket of each group is capped at 1 MiB when the cap is left at its default). Buckets are
numbered in the reverse of the order in which the module registered its parameters, the order in which backward
produces their gradients for a module used front to back (torch's first iteration). Each parameter carries a
post-accumulate-grad hook: when backward has accumulated its ``.grad``, the reducer copies it (times
``1 / world_size``, or unscaled where a communication hook divides) into its place in the bucket, and once every
gradient of a bucket is in, starts that bucket's all-reduce asynchronously (or hands it to the communication
hook) — in bucket order, so every rank issues its collectives in the same sequence. The first hook of a backward
queues an end-of-backward callback (``Variable._execution_engine.queue_callback``) that waits for every bucket
and writes the averaged gradients back into ``.grad``.

Parameters that get no gradient: with ``find_unused_parameters`` the forward's outputs are searched, as torch
does, for the parameters no path of the autograd graph reaches; the first hook of the backward marks those
ready (reduced as zeros, or as the gradient they already hold), so their buckets need not wait, and the
end-of-backward callback does the same for any other parameter that got no gradient (one reached only through
an output the loss left out). Their ``.grad`` is written only where some rank used them, as in torch: a
parameter no rank used keeps its ``.grad``. Without the option the buckets holding them never start, the
reduction stays unfinished, and the next forward raises torch's "Expected to have finished reduction in the
prior iteration" naming their indices.

Under ``tilewise.compile`` the gradients that reach the hooks are trace tensors, and the reducer records the
bucket's reduction instead of running it (see [Note: compiled DDP]). A communication hook runs Python on real
buffers: with one, ``with_values`` breaks the graph before the bucket's collective, so that the buffer holds the
gradients, and the hook runs untraced on it (its casts and divisions feed its own collectives).

[Note: compiled DDP] Traced, a bucket is not a buffer the gradients are copied into: the hook records each
gradient times ``1 / world_size`` (the operator eager mode copies with), and the bucket's launch records
``cat`` of them, flattened, and the functional all-reduce (``_c10d_functional::all_reduce``, see [Note:
collectives in compiled programs]) of that. The compiler does the rest as torch's ``gradient_as_bucket_view``
does by hand: the scaling fuses into the kernel that produces each gradient, the memory planner lays the
``cat`` out in place (each gradient is written straight into its slice of the bucket) and gives the all-reduce
its input's buffer (NCCL reduces in place), and the CUDA program runs the all-reduce on a communication stream
as soon as the bucket's last gradient is written, overlapped with the rest of backward ([Note: collectives on
their own stream] in ``compiler/lowering/streams``). The end of backward reads each parameter's gradient out of
the reduced bucket (``.grad`` copies it, as eager's does, unless the step drops it); the persistent bucket
buffer is written only with ``gradient_as_bucket_view`` (one copy a bucket, at the end). At world size 1 the
scaling is a multiplication by one, which the compiler removes; what is left beside a step without DDP is the
collective itself.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass, field

import tilewise.distributed as dist
from tilewise.autograd.grad_mode import no_grad
from tilewise.autograd.graph import AccumulateGrad, edge
from tilewise.autograd.variable import Variable
from tilewise.dispatch import STATE
from tilewise.distributed._functional_collectives import all_reduce as functional_all_reduce
from tilewise.ops.creation import zeros, zeros_like
from tilewise.ops.functions import cat
from tilewise.tensor import TRACE_HOOKS, Tensor, tensor

DEFAULT_FIRST_BUCKET_BYTES = 1024 * 1024  # torch's dist._DEFAULT_FIRST_BUCKET_BYTES
MB = 1024 * 1024


def compute_bucket_assignment_by_size(tensors: list[Tensor], size_limits: list[int]) -> list[list[int]]:
    """Indices of ``tensors`` grouped by (device, dtype) into buckets, in torch's order: each group fills a
    bucket until it holds at least its limit (``size_limits[k]`` for the group's ``k``-th bucket, the last limit
    for all later ones), and the buckets are sorted by the first index they hold."""
    open_buckets: dict[tuple, list[int]] = {}
    open_bytes: dict[tuple, int] = {}
    closed_count: dict[tuple, int] = {}
    buckets = []
    for index, t in enumerate(tensors):
        key = (str(t.device), t.dtype)
        open_buckets.setdefault(key, []).append(index)
        open_bytes[key] = open_bytes.get(key, 0) + t.numel() * t.element_size()
        limit = size_limits[min(closed_count.get(key, 0), len(size_limits) - 1)]
        if open_bytes[key] >= limit:
            buckets.append(open_buckets.pop(key))
            open_bytes[key] = 0
            closed_count[key] = closed_count.get(key, 0) + 1
    buckets.extend(open_buckets.values())
    return sorted(buckets, key=min)


def with_values(t: Tensor) -> Tensor:
    """``t``, its memory up to date before a collective reads or writes it from the transport's thread: inside a
    ``tilewise.compile``d function this is a graph break (the operators recorded so far run, and the trace
    tensors become real), or with ``fullgraph=True`` an error naming the user's line."""
    t._require_real("a collective (DistributedDataParallel's gradient all-reduce)")
    return t


@dataclass(eq=False)
class Bucket:
    """One flat buffer of gradients, reduced as one collective."""
    index: int
    params: list[Tensor]
    indices: list[int]  # positions of ``params`` among the reducer's parameters
    flat: Tensor  # the bucket's own memory
    views: list[Tensor]  # each parameter's gradient inside ``flat``, in its shape
    buffer: Tensor  # what the collective reduces: ``flat``, unless a hook's ``set_buffer`` replaced it
    pending: int = 0
    work: object = None  # the all-reduce in flight
    future: object = None  # what a communication hook returned
    reduced: Tensor | None = None  # under tilewise.compile: the functional all-reduce's (traced) result
    traced: list = field(default_factory=list)  # under tilewise.compile: each gradient, scaled (see the note)
    is_last: bool = False


class GradBucket:
    """torch's ``dist.GradBucket``: what a communication hook receives for one bucket.

    ``buffer()`` is the flat tensor of the bucket's gradients, ``gradients()`` and ``parameters()`` list them in
    the bucket's order; a hook returns a Future whose value is the reduced buffer.
    """

    def __init__(self, bucket: Bucket) -> None:
        self._bucket = bucket

    def index(self) -> int:
        return self._bucket.index

    def buffer(self) -> Tensor:
        return self._bucket.buffer

    def set_buffer(self, buffer: Tensor) -> None:
        self._bucket.buffer = buffer

    def gradients(self) -> list[Tensor]:
        return list(self._bucket.views)

    def parameters(self) -> list[Tensor]:
        return list(self._bucket.params)

    def is_last(self) -> bool:
        return self._bucket.is_last


_MARKED_TWICE = (
    "Expected to mark a variable ready only once. This error is caused by one of the following reasons: 1) Use of a "
    "module parameter outside the `forward` function. Please make sure model parameters are not shared across "
    "multiple concurrent forward-backward passes. 2) Reused parameters in multiple reentrant backward passes. For "
    "example, if you use multiple `checkpoint` functions to wrap the same part of your model, it would result in "
    "the same set of parameters been used by different reentrant backward passes multiple times, and hence marking "
    "a variable ready multiple times. DDP does not support such use cases in default. Parameter at index {index} "
    "has been marked as ready twice. This means that multiple autograd engine hooks have fired for this particular "
    "parameter during this iteration."
)

_UNFINISHED = (
    "Expected to have finished reduction in the prior iteration before starting a new one. This error indicates "
    "that your module has parameters that were not used in producing loss. You can enable unused parameter "
    "detection by passing the keyword argument `find_unused_parameters=True` to "
    "`torch.nn.parallel.DistributedDataParallel`, and by \nmaking sure all `forward` function outputs participate "
    "in calculating loss. \nIf you already have done the above, then the distributed data parallel module wasn't "
    "able to locate the output tensors in the return value of your module's `forward` function. Please include the "
    "loss function and the structure of the return value of `forward` of your module when reporting this issue "
    "(e.g. list, dict, iterable).\nParameter indices which did not receive grad for rank {rank}: {indices}"
)


@dataclass(eq=False)
class Reducer:
    """Averages the gradients of ``params`` over ``process_group`` during backward (see [Note: DDP buckets])."""
    params: list[Tensor]
    bucket_indices: list[list[int]]  # parameter indices per bucket, in the order the buckets are reduced
    process_group: object
    find_unused_parameters: bool
    gradient_as_bucket_view: bool
    comm_hook: Callable | None = None
    comm_state: object = None
    buckets: list[Bucket] = field(default_factory=list)
    expect_hooks: bool = False  # a DDP forward with gradient sync ran, and its backward has not finished
    require_finalize: bool = False  # a hook fired in this backward: its reduction must finish before the next
    next_bucket: int = 0
    ready: list[bool] = field(default_factory=list)
    used: list[bool] = field(default_factory=list)
    unused: list[int] = field(default_factory=list)  # parameters the forward's outputs do not reach
    handles: list = field(default_factory=list)

    def __post_init__(self) -> None:
        self.world_size = dist.get_world_size(self.process_group)
        self.place: dict[int, tuple[Bucket, int]] = {}
        for b, indices in enumerate(self.bucket_indices):
            self.buckets.append(self._make_bucket(b, indices))
        self.buckets[-1].is_last = True
        for index, param in enumerate(self.params):
            self.handles.append(param.register_post_accumulate_grad_hook(self._hook_for(index)))
        self.ready = [False] * len(self.params)
        self.used = [False] * len(self.params)

    def _make_bucket(self, b: int, indices: list[int]) -> Bucket:
        params = [self.params[i] for i in indices]
        flat = zeros(sum(p.numel() for p in params), dtype=params[0].dtype, device=params[0].device)
        bucket = Bucket(b, params, list(indices), flat, _split(flat, params), flat)
        for k, i in enumerate(indices):
            self.place[i] = (bucket, k)
        return bucket

    def _hook_for(self, index: int):
        reducer = weakref.ref(self)  # a parameter's hook must not keep the reducer (and its process group) alive

        def ready(param: Tensor) -> None:
            alive = reducer()
            if alive is not None:
                alive.autograd_hook(index)
        return ready

    # ------------------------------------------------------------------ forward
    def prepare_for_backward(self, outputs: list[Tensor]) -> None:
        """A forward that will be differentiated has run (``outputs`` are its tensors, searched for unused
        parameters with ``find_unused_parameters``): its backward reduces the gradients."""
        self.ensure_prior_reduction_finished()
        self.unused = self._unreached(outputs) if self.find_unused_parameters else []
        self.expect_hooks = True
        self.next_bucket = 0
        self.ready = [False] * len(self.params)
        self.used = [False] * len(self.params)
        for bucket in self.buckets:
            bucket.pending = len(bucket.params)
            bucket.work = bucket.future = bucket.reduced = None
            bucket.buffer = bucket.flat
            bucket.traced = [None] * len(bucket.params)

    def _unreached(self, outputs: list[Tensor]) -> list[int]:
        """Indices of the parameters whose gradient accumulators no path from ``outputs`` reaches."""
        reached, seen = set(), set()
        stack = [edge(t)[0] for t in outputs]
        while stack:
            node = stack.pop()
            if node is None or node in seen:
                continue
            seen.add(node)
            if isinstance(node, AccumulateGrad):
                reached.add(id(node.variable))
            stack.extend(nxt for nxt, _ in node.next_functions)
        return [index for index, p in enumerate(self.params) if id(p) not in reached]

    def ensure_prior_reduction_finished(self) -> None:
        if self.require_finalize:
            missing = " ".join(str(i) for i, done in enumerate(self.ready) if not done)
            raise RuntimeError(_UNFINISHED.format(rank=dist.get_rank(self.process_group), indices=missing))

    # ------------------------------------------------------------------ backward
    def autograd_hook(self, index: int) -> None:
        if not self.expect_hooks:
            return  # no_sync(), a second backward through one forward, or a forward without grad
        if self.ready[index]:
            raise RuntimeError(_MARKED_TWICE.format(index=index))
        self.used[index] = True
        if not self.require_finalize:
            self.require_finalize = True
            Variable._execution_engine.queue_callback(self.finalize_backward)
            for unused in self.unused:
                self.mark_ready(unused)
        if self.ready[index]:  # found unreached by the forward's outputs, yet given a gradient
            raise RuntimeError(_MARKED_TWICE.format(index=index))
        self.mark_ready(index)

    def mark_ready(self, index: int) -> None:
        bucket, k = self.place[index]
        if self._traced():
            bucket.traced[k] = self._scaled_grad(self.params[index], bucket.views[k])
        else:
            self._copy_grad_to_bucket(self.params[index], bucket.views[k])
        self.ready[index] = True
        bucket.pending -= 1
        while self.next_bucket < len(self.buckets) and self.buckets[self.next_bucket].pending == 0:
            self._launch(self.buckets[self.next_bucket])
            self.next_bucket += 1

    def _copy_grad_to_bucket(self, param: Tensor, view: Tensor) -> None:
        grad = param.grad
        with no_grad():
            if grad is None:
                view.zero_()
            elif self.comm_hook is not None:
                if grad is not view:
                    view.copy_(grad)
            elif grad is view:
                view.div_(self.world_size)
            else:
                view.copy_(grad.mul(1.0 / self.world_size))  # torch scales while copying (mul_out)

    def _traced(self) -> bool:
        """Whether the reduction is recorded into a compiled step (see [Note: compiled DDP])."""
        return self.comm_hook is None and STATE.trace_depth > 0

    def _scaled_grad(self, param: Tensor, view: Tensor) -> Tensor:
        """What ``_copy_grad_to_bucket`` would write into ``view``, as a value of the traced step."""
        grad = param.grad
        with no_grad():
            if grad is None:
                return zeros_like(view)
            if grad is view:
                return grad.div(self.world_size)
            return grad.mul(1.0 / self.world_size)

    def _launch(self, bucket: Bucket) -> None:
        if self._traced():
            with no_grad():
                flat = cat([g.reshape(-1) for g in bucket.traced])
            bucket.reduced = functional_all_reduce(flat, "sum", self.process_group)
            return
        with_values(bucket.buffer)
        if self.comm_hook is None:
            bucket.work = dist.all_reduce(bucket.buffer, group=self.process_group, async_op=True)
        else:
            with TRACE_HOOKS.untraced():  # the hook's casts feed its collectives: they run, not recorded
                bucket.future = self.comm_hook(self.comm_state, GradBucket(bucket))

    def finalize_backward(self) -> None:
        """The end-of-backward callback: reduce what got no gradient (if allowed), wait, write ``.grad``."""
        if self.next_bucket < len(self.buckets):
            if not self.find_unused_parameters:
                return  # the reduction stays unfinished: the next forward raises torch's error
            for index, done in enumerate(self.ready):
                if not done:
                    self.mark_ready(index)
        globally_used = self._globally_used() if self.find_unused_parameters else None
        for bucket in self.buckets:
            views = self._wait(bucket)
            for k, index in enumerate(bucket.indices):
                if globally_used is None or globally_used[index]:
                    self._copy_bucket_to_grad(self.params[index], views[k])
        self.expect_hooks = self.require_finalize = False

    def _globally_used(self) -> list[bool]:
        """Whether any rank's backward gave each parameter a gradient (torch's ``local_used_map``)."""
        used = with_values(tensor([float(flag) for flag in self.used], device=self.params[0].device))
        dist.all_reduce(used, group=self.process_group)
        return [count > 0 for count in used.tolist()]

    def _wait(self, bucket: Bucket) -> list[Tensor]:
        """Wait for the bucket's reduction; the reduced gradients, one view per parameter."""
        if bucket.reduced is not None:
            reduced, bucket.reduced = bucket.reduced, None
            if not self.gradient_as_bucket_view:  # traced: the gradients are read out of the result itself
                return _split(reduced, bucket.params)
            with no_grad():
                bucket.flat.copy_(reduced)
            return _split(bucket.flat, bucket.params)  # views made while traced: values of the program
        if bucket.future is None:
            bucket.work.wait()
            return bucket.views
        result = bucket.future.wait()
        if isinstance(result, (list, tuple)):
            result = result[0]
        if not isinstance(result, Tensor):
            raise RuntimeError(f"a DDP communication hook's Future must hold a Tensor (or a list of them), got "
                               f"{type(result).__name__}")
        if result is not bucket.flat:
            if result.numel() != bucket.flat.numel():
                raise RuntimeError(f"the communication hook's result has {result.numel()} elements, but bucket "
                                   f"{bucket.index} holds {bucket.flat.numel()}")
            with no_grad():
                bucket.flat.copy_(result.reshape(bucket.flat.shape))
        return bucket.views

    def _copy_bucket_to_grad(self, param: Tensor, view: Tensor) -> None:
        with no_grad():
            if self.gradient_as_bucket_view:
                param.grad = view
            elif param.grad is None:
                param.grad = view.clone()
            else:
                param.grad.copy_(view)


def _split(flat: Tensor, params: list[Tensor]) -> list[Tensor]:
    """Views of ``flat`` in the shapes of ``params``, one after another."""
    views, offset = [], 0
    for p in params:
        views.append(flat[offset:offset + p.numel()].view(p.shape))
        offset += p.numel()
    return views

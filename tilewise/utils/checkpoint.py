"""Activation checkpointing: trade compute for memory by recomputing a segment's activations in backward.

[Note: checkpointing] ``checkpoint(fn, *args)`` runs ``fn`` normally, except that every tensor its
operators save for backward is replaced by a small integer handle (``saved_tensors_hooks``), so the
segment's activations die as soon as the forward no longer needs them. The first time backward unpacks a
handle, ``fn`` is run again on detached copies of its inputs, under the same RNG state (so dropout masks
match) and autocast state (backward itself runs without autocast), recording the tensors saved in the
same order; each unpacked handle takes its tensor back out, and the recomputed activations are freed as
backward consumes them. Because ``fn``'s own graph is the one backward walks, gradients reach everything
``fn`` reads, arguments and captured parameters alike, and ``autograd.grad`` works as it does without
checkpointing (torch's non-reentrant variant).

``use_reentrant=True`` gives torch's older form instead: ``fn`` runs without grad inside an
``autograd.Function`` whose backward recomputes it and calls ``backward`` on the recomputed outputs, so
gradients flow to tensor arguments and accumulate into captured parameters' ``.grad``. As in torch, leaving
``use_reentrant`` out warns (pass it explicitly) and uses this older form.

Random operators in ``fn`` (dropout, rand, bernoulli, randperm, multinomial, ...) draw the same numbers when
recomputed: with ``preserve_rng_state`` (the default) the recomputation starts from the generator state the
forward started from, so it claims the same Philox counters, and the generator is put back afterwards.
Inside ``tilewise.compile`` the same state restore makes each recomputed draw the very node of the forward's
draw (see [Note: random draws in a trace]), so the compiled program draws those numbers once.

>>> import tilewise as tw
>>> from tilewise.utils.checkpoint import checkpoint
>>> x = tw.tensor([1.0, 2.0], requires_grad=True)
>>> checkpoint(lambda t: (t.exp() * t).sum(), x, use_reentrant=False).backward()
>>> [round(g, 4) for g in x.grad.tolist()]
[5.4366, 22.1672]
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

from tilewise.autograd.function import Function
from tilewise.autograd.grad_mode import enable_grad
from tilewise.autograd.graph import saved_tensors_hooks
from tilewise.dispatch import STATE
from tilewise.ops.creation import default_generator
from tilewise.tensor import Tensor

__all__ = ["checkpoint", "checkpoint_sequential"]


def _unspecified_reentrant(where: str) -> bool:
    warnings.warn(f"{where}: the use_reentrant parameter should be passed explicitly; left out, it is True (the "
                  "older, reentrant variant), as in torch. use_reentrant=False is recommended: it supports "
                  "autograd.grad, keyword arguments and inputs that do not require grad; pass use_reentrant=True to "
                  "keep the current behaviour.", UserWarning, stacklevel=3)
    return True


def checkpoint(function: Callable, *args, use_reentrant: bool | None = None, preserve_rng_state: bool = True,
               **kwargs):
    """Run ``function(*args, **kwargs)`` without keeping its activations; recompute them during backward.
    ``use_reentrant`` left out warns and means True, as in torch."""
    if use_reentrant is None:
        use_reentrant = _unspecified_reentrant("tilewise.utils.checkpoint")
    if use_reentrant:
        if kwargs:
            raise ValueError(f"checkpoint(use_reentrant=True) does not take keyword arguments for the function, got "
                             f"{sorted(kwargs)}; pass use_reentrant=False to use them")
        return _ReentrantCheckpoint.apply(function, preserve_rng_state, *args)
    if not STATE.grad_enabled:
        return function(*args, **kwargs)
    return _Segment(function, args, kwargs, preserve_rng_state).run()


def checkpoint_sequential(functions, segments: int, input, use_reentrant: bool | None = None, **kwargs):
    """Run ``functions`` (a Sequential or a list of callables) in order on ``input``, checkpointing all but the
    last of ``segments`` consecutive groups, as torch.utils.checkpoint.checkpoint_sequential does."""
    if use_reentrant is None:
        use_reentrant = _unspecified_reentrant("tilewise.utils.checkpoint.checkpoint_sequential")
    preserve_rng_state = kwargs.pop("preserve_rng_state", True)
    if kwargs:
        raise ValueError(f"checkpoint_sequential: unexpected keyword arguments {sorted(kwargs)}; it takes "
                         "use_reentrant and preserve_rng_state")
    functions = list(functions.children()) if hasattr(functions, "children") else list(functions)
    if not 0 < segments <= max(len(functions), 1):
        raise ValueError(f"checkpoint_sequential: segments must be between 1 and the number of functions "
                         f"({len(functions)}), got {segments}")
    size = len(functions) // segments
    end = -1
    for start in range(0, size * (segments - 1), size):
        end = start + size - 1
        input = checkpoint(_run_functions(functions[start:end + 1]), input, use_reentrant=use_reentrant,
                           preserve_rng_state=preserve_rng_state)
    return _run_functions(functions[end + 1:])(input)


def _run_functions(functions: list) -> Callable:
    def run(x):
        for fn in functions:
            x = fn(x)
        return x

    return run


class _ForwardState:
    """The default generator's state and the autocast state at one moment, replayable around a recomputation."""

    def __init__(self, preserve: bool):
        self.state = default_generator.position() if preserve else None
        self.autocast = STATE.autocast

    def replay(self, fn: Callable):
        autocast, STATE.autocast = STATE.autocast, self.autocast
        now = default_generator.position() if self.state is not None else None
        if now is not None:
            default_generator.set_position(self.state)
        try:
            return fn()
        finally:
            STATE.autocast = autocast
            if now is not None:
                default_generator.set_position(now)


def _detached_like(value):
    if isinstance(value, Tensor):
        return value.detach().requires_grad_(value.requires_grad)
    return value


class _Segment:
    """One checkpointed call: the forward's handles and, once backward needs them, the recomputed tensors."""

    def __init__(self, function: Callable, args: tuple, kwargs: dict, preserve_rng_state: bool):
        self.function, self.args, self.kwargs = function, args, kwargs
        self.rng = _ForwardState(preserve_rng_state)
        self.count = 0
        self.recomputed: dict[int, Tensor] = {}

    def run(self):
        with saved_tensors_hooks(self._pack_handle, self._unpack_handle):
            return self.function(*self.args, **self.kwargs)

    def _pack_handle(self, t: Tensor) -> int:
        self.count += 1
        return self.count - 1

    def _unpack_handle(self, handle: int) -> Tensor:
        if handle not in self.recomputed:
            self._recompute()
        return self.recomputed.pop(handle)

    def _recompute(self) -> None:
        saved: list[Tensor] = []

        def record(t: Tensor) -> int:
            saved.append(t.detach())
            return len(saved) - 1

        args = tuple(_detached_like(a) for a in self.args)
        kwargs = {k: _detached_like(v) for k, v in self.kwargs.items()}
        with enable_grad(), saved_tensors_hooks(record, _never_unpacked):
            self.rng.replay(lambda: self.function(*args, **kwargs))
        if len(saved) != self.count:
            raise RuntimeError(f"checkpoint: recomputing the function saved {len(saved)} tensors for backward, but "
                               f"its forward saved {self.count}; the checkpointed function must do the same work "
                               "each time it runs (no data- or state-dependent control flow)")
        self.recomputed = dict(enumerate(saved))


def _never_unpacked(handle: int):
    raise RuntimeError("checkpoint: a tensor saved during recomputation was unpacked; recomputed graphs are not "
                       "meant to be differentiated")


class _ReentrantCheckpoint(Function):
    @staticmethod
    def forward(ctx, function, preserve_rng_state, *args):
        ctx.function, ctx.rng = function, _ForwardState(preserve_rng_state)
        # the tensors saved, the other arguments kept as they are (save_for_backward takes tensors only, as torch's)
        ctx.tensor_positions = [k for k, a in enumerate(args) if isinstance(a, Tensor)]
        ctx.arguments = [None if isinstance(a, Tensor) else a for a in args]
        ctx.save_for_backward(*(args[k] for k in ctx.tensor_positions))
        return function(*args)

    @staticmethod
    def backward(ctx, *grads):
        from tilewise.autograd import backward

        arguments = list(ctx.arguments)
        for k, t in zip(ctx.tensor_positions, ctx.saved_tensors):
            arguments[k] = t
        inputs = tuple(_detached_like(a) for a in arguments)
        with enable_grad():
            outputs = ctx.rng.replay(lambda: ctx.function(*inputs))
        outputs = outputs if isinstance(outputs, tuple) else (outputs,)
        pairs = [(o, g) for o, g in zip(outputs, grads)
                 if isinstance(o, Tensor) and o.requires_grad and g is not None]
        if pairs:
            backward([o for o, _ in pairs], [g for _, g in pairs])
        return (None, None, *(a.grad if isinstance(a, Tensor) else None for a in inputs))

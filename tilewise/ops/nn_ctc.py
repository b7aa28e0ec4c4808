"""Connectionist temporal classification loss (torch.nn.functional.ctc_loss), as tensor operations over time.

[Note: CTC as a recursion of tensor ops] The forward variable alpha of Graves et al. runs over the extended
targets (a blank before, between and after the labels: 2S + 1 states) in log space. One step of time is a
handful of pointwise operations on an (N, 2S + 1) tensor: the state itself, its left neighbour, and the
neighbour two to the left where the label differs from the one two back (and is not blank), combined by a
log-sum-exp and added to the emissions of time t. So the loss is a Python loop of T such steps, vectorised
over the batch and the states, and every backend and the compiler run it from this one decomposition;
sequences shorter than T keep their alpha once their length is reached. The gradient comes from autograd
through the recursion, with two adjustments so that it is torch's:
  * torch returns ``exp(log_probs) - occupancy`` for the frames within each input length, not the gradient
    ``-occupancy`` of the loss as written: the extra ``exp(log_probs)`` is annihilated by the backward of
    the log_softmax that produced the log-probabilities (its rows sum to one), and torch relies on that. The
    loss adds ``E - E.detach()`` with E the sum of those probabilities: zero in value, that term in gradient;
  * a target that cannot be aligned (infinite loss) has a NaN gradient over its frames in torch, and zero
    with ``zero_infinity``.
The log-sum-exp is written so that states no path reaches (-inf) pass a zero gradient, not a NaN.
"""

from __future__ import annotations

from tilewise.dispatch import values_readable
from tilewise.dtypes import c10_name, int64
from tilewise.ops.nn_functional import functional, where
from tilewise.ops.nn_losses import _reduction_mode

_NEG_INF = float("-inf")


def _logsumexp3(a, b, c):
    """log(e^a + e^b + e^c) elementwise; -inf (with zero gradient) where all three are -inf."""
    from tilewise.ops.registry import call

    peak = call("maximum", call("maximum", a, b), c).detach()
    peak = where(peak == _NEG_INF, 0.0, peak)
    total = (a - peak).exp() + (b - peak).exp() + (c - peak).exp()
    empty = total == 0
    return where(empty, _NEG_INF, where(empty, 1.0, total).log() + peak)


def _shifted_right(alpha, by: int):
    """alpha[:, s - by] at state s, -inf for the first ``by`` states."""
    from tilewise.ops.creation import full

    pad = full((alpha.shape[0], by), _NEG_INF, dtype=alpha.dtype, device=alpha.device)
    return call_cat([pad, alpha[:, :alpha.shape[1] - by]])


def call_cat(tensors):
    from tilewise.ops.registry import call

    return call("cat", tensors, 1)


def _lengths_tensor(lengths, device):
    from tilewise.tensor import Tensor, tensor

    if isinstance(lengths, Tensor):
        return lengths.to(device=device, dtype=int64).reshape(-1)
    return tensor(list(lengths), dtype=int64, device=device)


def _known_values(lengths):
    """The lengths as Python ints where they can be read (not inside a trace), else None."""
    from tilewise.tensor import Tensor

    if not isinstance(lengths, Tensor):
        return [int(v) for v in lengths]
    return [int(v) for v in lengths.reshape(-1).tolist()] if values_readable(lengths) else None


def _check_ctc(log_probs, targets, input_lengths, target_lengths, blank: int) -> None:
    from tilewise.tensor import Tensor

    if log_probs.dtype.name not in ("float32", "float64"):  # torch's kernels: float and double (autocast casts)
        raise NotImplementedError(f"\"ctc_loss_{log_probs.device.type}\" not implemented for "
                                  f"'{c10_name(log_probs.dtype)}'")
    where_ = "(while checking arguments for ctc_loss_allocate_outputs)"
    if log_probs.ndim not in (2, 3):  # torch unsqueezes all but a 3-D log_probs as unbatched, then checks
        raise RuntimeError(f"Expected 3-dimensional tensor, but got {log_probs.ndim + 1}-dimensional tensor for "
                           f"argument #1 'log_probs' {where_}")
    if not 1 <= targets.ndim <= 2:
        raise RuntimeError(f"Expected 1 to 2 dimensions, but got {targets.ndim}-dimensional tensor for argument #2 "
                           f"'targets' {where_}")
    for name, lengths in (("input_lengths", input_lengths), ("target_lengths", target_lengths)):
        if isinstance(lengths, Tensor) and (lengths.dtype.is_floating_point or lengths.dtype.name == "bool"):
            raise RuntimeError(f"{name} must be integral")
    if targets.dtype.name == "bool":
        raise RuntimeError(f"ctc_loss: targets must hold integer class indices, got {targets.dtype}")
    if not 0 <= blank < log_probs.shape[-1]:
        raise RuntimeError("blank must be in label range")


def _check_lengths(log_probs, targets, input_lengths, target_lengths) -> None:
    """torch's checks of the lengths against the shapes (where the lengths can be read)."""
    where_ = "(while checking arguments for ctc_loss_allocate_outputs)"
    steps, batch = log_probs.shape[0], log_probs.shape[1]
    inputs, labels = _known_values(input_lengths), _known_values(target_lengths)
    if inputs is not None and len(inputs) != batch:
        raise RuntimeError("input_lengths must be of size batch_size")
    if labels is not None and len(labels) != batch:
        raise RuntimeError("target_lengths must be of size batch_size")
    if labels is not None:
        for n in labels:
            if n < 0:
                raise RuntimeError(f"Expected target_lengths to have value at least 0, but got value {n} {where_}")
        if targets.ndim == 1 and targets.shape[0] != sum(labels):
            raise RuntimeError(f"Expected tensor to have size {sum(labels)} at dimension 0, but got size "
                               f"{targets.shape[0]} for argument #2 'targets' {where_}")
        if targets.ndim == 2:
            if targets.shape[0] != batch:
                raise RuntimeError(f"Expected tensor to have size {batch} at dimension 0, but got size "
                                   f"{targets.shape[0]} for argument #2 'targets' {where_}")
            if labels and targets.shape[1] < max(labels):
                raise RuntimeError(f"Expected tensor to have size at least {max(labels)} at dimension 1, but got "
                                   f"size {targets.shape[1]} for argument #2 'targets' {where_}")
    for n in inputs or ():
        if n < 0:
            raise RuntimeError(f"Expected input_lengths to have value at least 0, but got value {n} {where_}")
        if n > steps:
            raise RuntimeError(f"Expected input_lengths to have value at most {steps}, but got value {n} {where_}")


def _padded_targets(targets, target_lengths, known_lengths, blank: int):
    """(N, S) labels, blank beyond each target's length, from padded (N, S') or concatenated (sum of lengths)
    targets."""
    from tilewise.ops.creation import arange

    device = target_lengths.device
    targets = targets.to(device)  # torch takes the targets on the host beside a GPU's log_probs (cuDNN's layout)
    if targets.ndim == 2:
        width = targets.shape[1]
        flat = targets.reshape(-1)
        starts = arange(targets.shape[0], device=device) * width
    else:
        width = max(known_lengths, default=0) if known_lengths is not None else targets.shape[0]
        flat = targets
        starts = target_lengths.cumsum(0) - target_lengths
    positions = arange(width, device=device)
    listed = positions < target_lengths.unsqueeze(1)
    if flat.numel() == 0:
        return where(listed, blank, blank).to(int64) if width else listed.long()
    index = (starts.unsqueeze(1) + positions).clamp(0, flat.numel() - 1)
    return where(listed, flat.to(int64)[index], blank)


def _extended_targets(labels, blank: int):
    """(N, 2S + 1): blank, l1, blank, l2, ..., lS, blank."""
    from tilewise.ops.creation import full
    from tilewise.ops.registry import call

    batch, width = labels.shape
    blanks = full((batch, width), blank, dtype=int64, device=labels.device)
    interleaved = call("stack", [blanks, labels], 2).reshape(batch, 2 * width)
    return call_cat([interleaved, full((batch, 1), blank, dtype=int64, device=labels.device)])


def _skip_allowed(extended, blank: int):
    """Whether state s may be entered from s - 2: its label is not blank and differs from the one at s - 2."""
    from tilewise.ops.creation import zeros

    batch = extended.shape[0]
    head = zeros((batch, min(2, extended.shape[1])), dtype=extended.dtype, device=extended.device) != 0
    tail = (extended[:, 2:] != blank) & (extended[:, 2:] != extended[:, :-2])
    return call_cat([head, tail])


def _log_likelihood(log_probs, extended, input_lengths, target_lengths, blank: int):
    """log p(target | input) per sample by the alpha recursion, and whether any alignment exists."""
    from tilewise.ops.creation import arange

    steps, batch, _ = log_probs.shape
    states = extended.shape[1]
    emissions = log_probs.gather(2, extended.unsqueeze(0).expand(steps, batch, states))
    skip = _skip_allowed(extended, blank)
    first_states = arange(states, device=log_probs.device) < 2
    alpha = where(first_states, emissions[0], _NEG_INF)
    running = input_lengths.unsqueeze(1)
    for t in range(1, steps):
        stepped = _logsumexp3(alpha, _shifted_right(alpha, 1), where(skip, _shifted_right(alpha, 2), _NEG_INF))
        alpha = where(t < running, stepped + emissions[t], alpha)
    last = (2 * target_lengths).unsqueeze(1)
    end_blank = alpha.gather(1, last).squeeze(1)
    end_label = where(target_lengths > 0, alpha.gather(1, (last - 1).clamp(min=0)).squeeze(1), _NEG_INF)
    both = _logsumexp3(end_blank, end_label, where(target_lengths < 0, 0.0, _NEG_INF))
    empty_input = input_lengths == 0
    return where(empty_input, where(target_lengths == 0, 0.0, _NEG_INF), both)


def _frame_probability_mass(log_probs, input_lengths):
    """Per sample, the sum of exp(log_probs) over the frames within its input length (see the note)."""
    from tilewise.ops.creation import arange

    steps = log_probs.shape[0]
    within = (arange(steps, device=log_probs.device).unsqueeze(1) < input_lengths).unsqueeze(2)
    return where(within, log_probs.exp(), 0.0).sum((0, 2))


def _with_torch_gradient(neg_log_likelihood, log_probs, input_lengths, zero_infinity: bool):
    mass = _frame_probability_mass(log_probs, input_lengths)
    finite = neg_log_likelihood + (mass - mass.detach())
    infinite = neg_log_likelihood.isinf()
    if zero_infinity:
        return where(infinite, 0.0, finite)
    # value +inf and gradient NaN over the sample's frames, as torch; the inner where keeps the NaN that
    # log(0)'s backward makes out of the samples that take the finite branch
    unreachable = -(where(infinite, mass, 1.0) * 0).log()
    return where(infinite, unreachable, finite)


def _ctc_loss(log_probs, targets, input_lengths, target_lengths, blank=0, reduction="mean", zero_infinity=False):
    reduction = _reduction_mode("ctc_loss", reduction)
    _check_ctc(log_probs, targets, input_lengths, target_lengths, blank)
    batched = log_probs.ndim == 3
    if not batched:  # the targets as given: 1-D concatenated (of the one sample) or 2-D padded, as torch
        log_probs = log_probs.unsqueeze(1)
    _check_lengths(log_probs, targets, input_lengths, target_lengths)
    device = log_probs.device
    known_target_lengths = _known_values(target_lengths)
    input_lengths = _lengths_tensor(input_lengths, device)
    target_lengths = _lengths_tensor(target_lengths, device)
    labels = _padded_targets(targets, target_lengths, known_target_lengths, blank)
    extended = _extended_targets(labels, blank)
    nll = -_log_likelihood(log_probs, extended, input_lengths, target_lengths, blank)
    loss = _with_torch_gradient(nll, log_probs, input_lengths, zero_infinity)
    if reduction == "mean":
        return (loss / target_lengths.clamp(min=1).to(loss.dtype)).mean()
    if reduction == "sum":
        return loss.sum()
    return loss if batched else loss.squeeze(0)


_CTC_OPTIONS = "int blank=0, str reduction='mean', bool zero_infinity=False) -> Tensor"
functional("ctc_loss.Tensor(Tensor log_probs, Tensor targets, Tensor input_lengths, Tensor target_lengths, "
           + _CTC_OPTIONS, _ctc_loss, function=False, autocast="fp32")
functional("ctc_loss.IntList(Tensor log_probs, Tensor targets, int[] input_lengths, int[] target_lengths, "
           + _CTC_OPTIONS, _ctc_loss, function=False, autocast="fp32")

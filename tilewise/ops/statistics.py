"""Sample statistics of the torch namespace: cov, corrcoef and mode.

``cov`` and ``corrcoef`` follow torch's formulas step by step (weighted mean, centred product through one matrix
product, division by the degrees of freedom, zeroed with torch's warning where they are not positive), so their
values, dtypes and gradients come from the composed operators. Checks that read values (negative weights, weights
that sum to zero) run where values can be read; a compiled function skips them, as it skips every data check.
``mode`` is sort-based: after a stable sort, equal values form runs; the longest run wins (the smallest value
among equally long ones) and its index is the value's last position in the input, torch's CPU answer. Its
derivative routes the gradient to that index and saves the indices alone, as torch's does.
"""

from __future__ import annotations

import math
import warnings
from collections import namedtuple

from tilewise import strides as S
from tilewise.dispatch import values_readable
from tilewise.dtypes import int64
from tilewise.ops.creation import ones, zeros
from tilewise.ops.reductions import nonempty_reduction
from tilewise.ops.registry import OPS, declare


def _check_weights(name: str, w, observations: int, integral: bool) -> None:
    if w.ndim > 1:
        raise RuntimeError(f"cov(): expected {name} to have one or fewer dimensions but got {name} with {w.ndim} "
                           "dimensions")
    if w.numel() != observations:
        raise RuntimeError(f"cov(): expected {name} to have the same numel as there are observations in the input "
                           f"but got {w.numel()} != {observations}")
    if integral and (w.dtype.is_floating_point or w.dtype.is_complex):
        raise RuntimeError(f"cov(): expected {name} to have integral dtype but got {name} with {w.dtype.name} dtype")
    if not integral and not w.dtype.is_floating_point:
        raise RuntimeError(f"cov(): expected {name} to have floating point dtype but got {name} with "
                           f"{w.dtype.name} dtype")
    if values_readable(w) and bool((w < 0).any()):
        raise RuntimeError(f"cov(): {name} cannot be negative")


def _cov(input, correction=1, fweights=None, aweights=None):
    if input.ndim > 2:
        raise RuntimeError(f"cov(): expected input to have two or fewer dimensions but got an input with "
                           f"{input.ndim} dimensions")
    if input.dtype.name == "bool":
        raise RuntimeError("cov(): bool dtype is not supported for input")
    x = input.reshape(1, -1) if input.ndim < 2 else input
    observations = x.shape[1]
    w = None
    if fweights is not None:
        _check_weights("fweights", fweights, observations, True)
        w = fweights
    if aweights is not None:
        _check_weights("aweights", aweights, observations, False)
        w = w * aweights if w is not None else aweights
    if w is None:
        w_sum = observations
        average = x.sum(1) / w_sum
        norm_factor = w_sum - correction
        if norm_factor <= 0:
            _warn_degrees_of_freedom()
            norm_factor = 0
    else:
        w_sum = w.sum()
        if values_readable(w_sum) and bool(w_sum == 0):
            raise RuntimeError("cov(): weights sum to zero, can't be normalized")
        average = (x * w).sum(1) / w_sum
        if aweights is not None and correction != 0:
            norm_factor = w_sum - correction * (w * aweights).sum() / w_sum
        else:
            norm_factor = w_sum - correction
        if values_readable(norm_factor) and bool(norm_factor <= 0):
            _warn_degrees_of_freedom()
        norm_factor = OPS["where.self"](norm_factor <= 0, 0, norm_factor)
    centred = x - average.unsqueeze(1)
    weighted = centred * w if w is not None else centred
    product = centred.mm((weighted.conj() if weighted.dtype.is_complex else weighted).t())
    return (product / norm_factor).squeeze()


def _warn_degrees_of_freedom() -> None:
    warnings.warn("cov(): degrees of freedom is <= 0. Correction should be strictly less than the number of "
                  "observations.", UserWarning, stacklevel=5)


declare("cov(Tensor self, *, int correction=1, Tensor? fweights=None, Tensor? aweights=None) -> Tensor", "composite",
        decomposition=_cov, autocast={"cpu": "lower"}, out=False)


def _corrcoef(self):
    if self.ndim > 2:
        raise RuntimeError(f"corrcoef(): expected input to have two or fewer dimensions but got an input with "
                           f"{self.ndim} dimensions")
    c = _cov(self)
    if c.ndim == 0:
        return c / c
    stddev = c.diagonal().sqrt()
    c = c / stddev.view(-1, 1)
    c = c / stddev.view(1, -1)
    return c.clip(-1, 1)


declare("corrcoef(Tensor self) -> Tensor", "composite", decomposition=_corrcoef, autocast={"cpu": "lower"}, out=False)


def _mode(self, dim=-1, keepdim=False):
    dim = S.normalize_dim(dim, self.ndim, "mode")
    if self.ndim == 0:
        return self.clone(), zeros((), dtype=int64, device=self.device)
    if self.numel() == 0:  # along a dim of non-zero size (see [Note: empty reductions])
        shape = tuple(n for d, n in enumerate(self.shape) if d != dim) if not keepdim else \
            tuple(1 if d == dim else n for d, n in enumerate(self.shape))
        return self.new_empty(shape), zeros(shape, dtype=int64, device=self.device)
    x = self.movedim(dim, -1)
    ordered, order = x.sort(dim=-1, stable=True)
    first = zeros(ordered.shape[:-1] + (1,), dtype=int64, device=self.device)
    new_run = (ordered[..., 1:] != ordered[..., :-1]).to(int64)
    run = OPS["cat"]([first, new_run], -1).cumsum(-1)  # each element's run, numbered from 0 along the dim
    run_length = zeros(run.shape, dtype=int64, device=self.device).scatter_add(-1, run, ones(
        run.shape, dtype=int64, device=self.device))
    chosen_run = run_length.gather(-1, run).argmax(-1, keepdim=True)  # the first longest run: its smallest value
    chosen_run = run.gather(-1, chosen_run)
    index = OPS["where.self"](run == chosen_run, order, -1).amax(-1, keepdim=True)
    values = x.gather(-1, index)
    if keepdim:
        return values.movedim(-1, dim), index.movedim(-1, dim)
    return values.squeeze(-1), index.squeeze(-1)


declare("mode(Tensor self, int dim=-1, bool keepdim=False) -> (Tensor values, Tensor indices)", "composite",
        decomposition=_mode, nondiff_outputs=(1,), check=nonempty_reduction(),
        grad={"self": "select_backward_indices(grad, self_shape, dim, result[1], keepdim)"},
        fwd="selected_jvp(self_t, dim, result[1], keepdim)")


# ---------------------------------------------------------------------------- histograms
# torch's kernel: an element counts when it lies within [first edge, last edge]; its bin is the last edge at or
# below it (``upper_bound - 1``), the last bin closed on the right. Evenly spaced edges come from the range (the
# data's minimum and maximum unless given, widened by 0.5 each way when they are equal, [0, 1] for no data).

def _check_histogram_input(op: str, input, weight, dims: int) -> None:
    if not input.dtype.is_floating_point:
        raise NotImplementedError(f'"{op}" not implemented for {input.dtype.name} tensors; histograms take '
                                  "floating tensors")
    if weight is not None and tuple(weight.shape) != tuple(input.shape[:-1]):
        raise RuntimeError(f"torch.histogramdd: if weight tensor is provided it should have the same shape as the "
                           f"input tensor excluding its innermost dimension, but got input with shape "
                           f"{list(input.shape)} and weight with shape {list(weight.shape)}")


def _even_edges(samples, dim: int, bins: int, given_range, dtype, device):
    from tilewise.ops.creation import linspace

    if bins <= 0:
        raise RuntimeError(f"torch.histogram(): bins must be > 0, but got {bins} for dimension {dim}")
    if given_range is not None:
        low, high = float(given_range[2 * dim]), float(given_range[2 * dim + 1])
    elif samples.shape[0] == 0:
        low, high = 0.0, 1.0
    else:
        column = samples[:, dim]
        low, high = column.min().item(), column.max().item()
    if low > high:
        raise RuntimeError(f"torch.histogramdd: min should not exceed max, but got min {low:g} max {high:g} for "
                           f"dimension {dim}")
    if not (math.isfinite(low) and math.isfinite(high)):
        raise RuntimeError(f"torch.histogramdd: dimension {dim}'s range [{low:g}, {high:g}] is not finite")
    if low == high:
        low, high = low - 0.5, high + 0.5
    return linspace(low, high, bins + 1, dtype=dtype, device=device)


def _bin_positions(column, edges):
    """Each value's bin along one dim, and whether it falls inside the edges at all."""
    inside = (column >= edges[0]) & (column <= edges[-1])
    position = OPS["searchsorted"](edges, column, right=True) - 1
    last = edges.shape[0] - 1
    return position.clamp(0, max(last - 1, 0)), inside


def _histogramdd(input, bins, range=None, weight=None, density=False):  # noqa: A002 — torch's argument name
    if input.ndim < 2:
        raise RuntimeError("torch.histogramdd: input tensor should have at least 2 dimensions")
    _check_histogram_input("histogramdd", input, weight, input.shape[-1])
    samples = input.reshape(-1, input.shape[-1])
    dims = samples.shape[1]
    if isinstance(bins, int):
        bins = [bins] * dims
    edges = [b if hasattr(b, "shape") else _even_edges(samples, d, int(b), range, input.dtype, input.device)
             for d, b in enumerate(bins)]
    sizes = [max(e.shape[0] - 1, 0) for e in edges]
    flat = zeros((), dtype=int64, device=input.device)
    counted = None
    for d, e in enumerate(edges):
        position, inside = _bin_positions(samples[:, d], e)
        flat = flat * sizes[d] + position
        counted = inside if counted is None else counted & inside
    values = weight.reshape(-1).to(input.dtype) if weight is not None else ones(samples.shape[0], dtype=input.dtype,
                                                                                device=input.device)
    values = OPS["where.self"](counted, values, 0) if counted is not None else values
    total = 1
    for s in sizes:
        total *= s
    hist = zeros(total, dtype=input.dtype, device=input.device)
    if total:
        hist = hist.index_put((flat.clamp(0, total - 1),), values, True)
    hist = hist.reshape(sizes)
    if density:
        hist = hist / hist.sum()
        for d, e in enumerate(edges):
            shape = [1] * dims
            shape[d] = -1
            hist = hist / e.diff().reshape(shape)
    return hist, tuple(edges)


def _histogram(input, bins=100, range=None, weight=None, density=False):  # noqa: A002
    _check_histogram_input("histogram", input, None, 1)
    if weight is not None and tuple(weight.shape) != tuple(input.shape):
        raise RuntimeError(f"torch.histogram: weight should have the same shape as input, but got input with shape "
                           f"{list(input.shape)} and weight with shape {list(weight.shape)}")
    if hasattr(bins, "shape") and bins.ndim != 1:
        raise RuntimeError(f"torch.histogram(): bins tensor should have one dimension, but got {bins.ndim}")
    hist, edges = _histogramdd(input.reshape(-1, 1), [bins], range, None if weight is None else weight.reshape(-1),
                               density)
    return hist, edges[0]


declare("histogram.bins_tensor(Tensor self, Tensor bins, *, Tensor? weight=None, bool density=False) -> "
        "(Tensor hist, Tensor bin_edges)", "composite",
        decomposition=lambda self, bins, weight=None, density=False: _histogram(self, bins, None, weight, density),
        differentiable=False)
declare("histogram.bin_ct(Tensor self, int bins=100, *, float[]? range=None, Tensor? weight=None, "
        "bool density=False) -> (Tensor hist, Tensor bin_edges)", "composite", decomposition=_histogram,
        differentiable=False)
# histogramdd's result nests its edges, (hist, (edges, ...)); the operator returns them flat, [hist, *edges], as
# every backend and the compiler take tensor lists, and the public function nests them
declare("_histogramdd(Tensor self, Any bins, float[]? range=None, Tensor? weight=None, bool density=False) -> "
        "Tensor[]", "composite", decomposition=lambda *args: (lambda hist, edges: (hist, *edges))(*_histogramdd(*args)),
        differentiable=False, public=False, method=False)
HistogramddResult = namedtuple("histogramdd", ["hist", "bin_edges"])
HistogramddResult.__module__ = "tilewise.return_types"


def histogramdd(input, bins, *, range=None, weight=None, density=False):  # noqa: A002
    """A histogram of the rows of ``input`` ([..., D] points in D dims): ``(hist, bin_edges)`` with one tuple of
    edges per dim; ``bins`` is a count (for every dim), a count per dim, or a tensor of edges per dim."""
    hist, *edges = OPS["_histogramdd"](input, bins, range, weight, density)
    return HistogramddResult(hist, tuple(edges))


FUNCTIONS = {"histogramdd": histogramdd}

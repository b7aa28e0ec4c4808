"""The autograd function of ``SyncBatchNorm``: batch statistics over every rank of a process group.

[Note: synchronised batch norm]
Each rank computes its per-channel mean and inverse standard deviation and its element count; one
``all_gather_into_tensor`` of ``[mean, invstd, count]`` gives every rank all of them, and the statistics of the
whole global batch follow by the parallel variance formula: the mean weighted by counts, and the variance as the
counts' weighted sum of each rank's variance plus its mean's squared distance from the global mean. Running
statistics take the global mean and the unbiased global variance, as one process on the whole batch would. A
rank whose batch is empty still joins the collectives, with a count of 0, and is left out of the statistics.
Backward needs two global sums per channel, of the output gradient and of the gradient times the centred input:
one ``all_reduce``. The weight and bias gradients stay local, like any parameter's before DDP reduces them.
Half-precision inputs are normalised in float32 and the result cast back, as torch's kernels do.
"""

from __future__ import annotations

from tilewise import dtypes
from tilewise.autograd.function import Function
from tilewise.dispatch import STATE
from tilewise.ops.creation import empty, zeros
from tilewise.ops.functions import cat, where
from tilewise.tensor import Tensor, tensor


def _compute(x: Tensor) -> Tensor:
    return x.float() if x.dtype in (dtypes.float16, dtypes.bfloat16) else x


def _gathered(combined: Tensor, world_size: int, group) -> Tensor:
    """Every rank's ``combined`` as the rows of one tensor. Eagerly one all_gather; recorded into a compiled step,
    the functional all_reduce (its collective a compiled program holds) of a matrix where each rank fills its own
    row, so the step stays one program."""
    import tilewise.distributed as dist

    if STATE.trace_depth:
        from tilewise.distributed._functional_collectives import all_reduce as functional_all_reduce

        rows = zeros((world_size, combined.numel()), dtype=combined.dtype, device=combined.device)
        rows[dist.get_rank(group)] = combined
        return functional_all_reduce(rows, "sum", group)
    gathered = empty((world_size, combined.numel()), dtype=combined.dtype, device=combined.device)
    dist.all_gather_into_tensor(gathered, combined, group)
    return gathered


def _summed(t: Tensor, group) -> Tensor:
    """``t`` summed over the ranks (in place eagerly; the functional all_reduce in a compiled step)."""
    import tilewise.distributed as dist

    if STATE.trace_depth:
        from tilewise.distributed._functional_collectives import all_reduce as functional_all_reduce

        return functional_all_reduce(t, "sum", group)
    dist.all_reduce(t, dist.ReduceOp.SUM, group)
    return t


def _channel_view(t: Tensor, ndim: int) -> Tensor:
    """A per-channel vector shaped to broadcast over (N, C, *)."""
    return t.reshape((1, -1) + (1,) * (ndim - 2))


class SyncBatchNormFunction(Function):
    @staticmethod
    def forward(ctx, input, weight, bias, running_mean, running_var, eps, momentum, process_group, world_size):

        channels = input.shape[1]
        size = input.numel() // channels
        if size == 1 and world_size < 2:
            raise ValueError(f"Expected more than 1 value per channel when training, got input size {size}")
        x = _compute(input)
        dims = [d for d in range(input.dim()) if d != 1]
        if input.numel() > 0:
            mean = x.mean(dims)
            invstd = (x.var(dims, correction=0) + eps).rsqrt()
            combined = cat([mean, invstd, tensor([float(size)], dtype=x.dtype, device=x.device)])
        else:
            combined = zeros(2 * channels + 1, dtype=x.dtype, device=x.device)
        gathered = _gathered(combined, world_size, process_group)
        # a rank with an empty batch has count 0 (and mean and invstd 0), so it weighs nothing; no indexing by
        # value, so the shapes never depend on the data (a CUDA graph can hold this)
        means, invstds, weights = gathered[:, :channels], gathered[:, channels:2 * channels], \
            gathered[:, 2 * channels:]
        total = weights.sum()
        global_mean = (means * weights).sum(0) / total
        variances = where(weights > 0, invstds, 1.0).reciprocal().square() - eps
        var_sum = (weights * (variances + (means - global_mean).square())).sum(0)  # N * the biased variance
        global_invstd = (var_sum / total + eps).rsqrt()
        if running_mean is not None:
            running_mean.mul_(1 - momentum).add_(global_mean.to(running_mean.dtype), alpha=momentum)
        if running_var is not None:
            unbiased = var_sum / (total - 1)
            running_var.mul_(1 - momentum).add_(unbiased.to(running_var.dtype), alpha=momentum)
        ctx.save_for_backward(input, weight, global_mean, global_invstd, total)
        ctx.process_group = process_group
        if input.numel() == 0:
            return empty(input.shape, dtype=input.dtype, device=input.device)
        ndim = input.dim()
        out = (x - _channel_view(global_mean, ndim)) * _channel_view(global_invstd, ndim)
        if weight is not None:
            out = out * _channel_view(weight.to(out.dtype), ndim)
        if bias is not None:
            out = out + _channel_view(bias.to(out.dtype), ndim)
        return out.to(input.dtype)

    @staticmethod
    def backward(ctx, grad_output):

        saved_input, weight, mean, invstd, total = ctx.saved_tensors
        needs_input, needs_weight, needs_bias = ctx.needs_input_grad[:3]
        channels = saved_input.shape[1]
        grad_input = grad_weight = grad_bias = None
        if saved_input.numel() > 0:
            ndim = saved_input.dim()
            dims = [d for d in range(ndim) if d != 1]
            x, dy = _compute(saved_input), _compute(grad_output)
            xmu = x - _channel_view(mean, ndim)
            sum_dy, sum_dy_xmu = dy.sum(dims), (dy * xmu).sum(dims)
            if weight is not None and needs_weight:
                grad_weight = (sum_dy_xmu * invstd).to(weight.dtype)
            if weight is not None and needs_bias:
                grad_bias = sum_dy.to(weight.dtype)
            if needs_input:
                combined = _summed(cat([sum_dy, sum_dy_xmu]), ctx.process_group)
                mean_dy, mean_dy_xmu = combined[:channels] / total, combined[channels:] / total
                scale = invstd if weight is None else invstd * weight.to(invstd.dtype)
                grad = (dy - _channel_view(mean_dy, ndim)
                        - xmu * _channel_view(invstd.square() * mean_dy_xmu, ndim)) * _channel_view(scale, ndim)
                grad_input = grad.to(saved_input.dtype)
        elif needs_input:  # an empty batch here: the other ranks' all_reduce still needs this one
            nothing = zeros(2 * channels, dtype=_compute(saved_input).dtype, device=saved_input.device)
            _summed(nothing, ctx.process_group)
        return grad_input, grad_weight, grad_bias, None, None, None, None, None, None

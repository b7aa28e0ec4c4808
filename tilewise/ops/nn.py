"""Neural-network composites (tilewise.nn.functional): decompositions into primitives, with explicit
derivatives where the composed backward would be slower or less stable."""

from __future__ import annotations

from tilewise import strides as S
from tilewise.dtypes import c10_name, compute_dtype
from tilewise.ops.batching import shift_dims
from tilewise.ops.registry import declare


def composite(schema: str, decomposition, grad: dict | None = None, **attrs):
    return declare(schema, "composite", decomposition=decomposition, grad=grad, **attrs)


def _row_major(x):
    """torch's softmax kernels read a contiguous input and write a contiguous result, whatever the input's
    layout (a channels-last input included)."""
    return x.contiguous()


def _floating_softmax_input(x, dim, kernel: str) -> bool:
    """torch's softmax kernels take floating inputs only (ask for ``dtype=`` to convert); an empty tensor is
    returned before the kernel runs. Whether there is nothing to compute."""
    d = S.normalize_dim(dim, max(x.ndim, 1), kernel)
    if x.numel() == 0:
        return True
    if not x.dtype.is_floating_point:
        last = "_lastdim" if d == max(x.ndim, 1) - 1 else ""
        raise NotImplementedError(f'"{kernel}{last}_kernel_impl" not implemented for \'{c10_name(x.dtype)}\'')
    return False


def _softmax(self, dim, dtype=None):
    x = self.to(dtype) if dtype is not None else self
    if _floating_softmax_input(x, dim, "softmax"):
        return x.clone()
    work = _row_major(x.to(compute_dtype(x.dtype)))
    shifted = work - work.amax(dim, keepdim=True)
    e = shifted.exp()
    out = e / e.sum(dim, keepdim=True)
    return out.to(x.dtype)


def _log_softmax(self, dim, dtype=None):
    x = self.to(dtype) if dtype is not None else self
    if _floating_softmax_input(x, dim, "log_softmax"):
        return x.clone()
    work = _row_major(x.to(compute_dtype(x.dtype)))
    shifted = work - work.amax(dim, keepdim=True)
    out = shifted - shifted.exp().sum(dim, keepdim=True).log()
    return out.to(x.dtype)


def _in_compute_dtype(*tensors):
    return tuple(t.to(compute_dtype(t.dtype)) for t in tensors)


def _softmax_backward_data(grad_output, output, dim, input_dtype):
    g, y = _in_compute_dtype(grad_output, output)
    return (y * (g - (g * y).sum(dim, keepdim=True))).to(input_dtype)


def _log_softmax_backward_data(grad_output, output, dim, input_dtype):
    g, y = _in_compute_dtype(grad_output, output)
    return (g - y.exp() * g.sum(dim, keepdim=True)).to(input_dtype)


composite("softmax(Tensor self, int dim, ScalarType? dtype=None) -> Tensor", _softmax,
          {"self": "OPS['_softmax_backward_data'](grad, result, dim, result.dtype)"}, autocast={"cuda": "fp32"},
          fwd="result * (self_t.to(result.dtype) - (self_t.to(result.dtype) * result).sum(dim, keepdim=True))")
composite("log_softmax(Tensor self, int dim, ScalarType? dtype=None) -> Tensor", _log_softmax,
          {"self": "OPS['_log_softmax_backward_data'](grad, result, dim, result.dtype)"}, autocast={"cuda": "fp32"},
          fwd="self_t.to(result.dtype) - (self_t.to(result.dtype) * result.exp()).sum(dim, keepdim=True)",
          batch=shift_dims)
# The backward of softmax and log_softmax as operators of their own (torch's schemas), so that a backend can run
# each as one kernel (one read of grad and output, one write) instead of four; they have no derivative of their
# own, so a second derivative flows through their decompositions.
composite("_softmax_backward_data(Tensor grad_output, Tensor output, int dim, ScalarType input_dtype) -> Tensor",
          _softmax_backward_data, public=False, method=False)
composite("_log_softmax_backward_data(Tensor grad_output, Tensor output, int dim, ScalarType input_dtype) -> Tensor",
          _log_softmax_backward_data, public=False, method=False)

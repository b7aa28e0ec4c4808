"""Lazy modules: layers whose input size is read from their first input.

[Note: lazy modules] As in torch, a lazy layer starts with ``UninitializedParameter``s (and
``UninitializedBuffer``s) and a forward pre-hook; the first call infers the sizes from the input, materialises
each tensor in place (so the tensor objects stay the same), runs the ordinary initialisation, removes the hook and
turns the module into its ordinary class (LazyLinear becomes Linear). Loading a state dict into a lazy module
materialises its tensors with the checkpoint's shapes. Create optimizers after the first call: until then the
parameters have no elements.
"""

from __future__ import annotations

from tilewise.autograd.grad_mode import no_grad
from tilewise.dtypes import int64
from tilewise.nn.modules.conv import Conv1d, Conv2d, Conv3d, ConvTranspose1d, ConvTranspose2d, ConvTranspose3d
from tilewise.nn.modules.linear import Linear
from tilewise.nn.modules.normalization import (
    BatchNorm1d,
    BatchNorm2d,
    BatchNorm3d,
    InstanceNorm1d,
    InstanceNorm2d,
    InstanceNorm3d,
)
from tilewise.nn.parameter import UninitializedBuffer, UninitializedParameter, is_lazy
from tilewise.ops.creation import zeros
from tilewise.tensor import Tensor


class LazyModuleMixin:
    """Infers parameter shapes at the first forward (see [Note: lazy modules])."""

    cls_to_become: type | None = None

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._initialize_hook = self.register_forward_pre_hook(self._infer_parameters, with_kwargs=True)

    def has_uninitialized_params(self) -> bool:
        tensors = list(self._parameters.values()) + list(self._buffers.values())
        return any(is_lazy(t) for t in tensors)

    def initialize_parameters(self, *args, **kwargs) -> None:
        raise NotImplementedError(f"initialize_parameters is not implemented for {type(self).__name__}")

    def _infer_parameters(self, module, args, kwargs=None) -> None:
        self.initialize_parameters(*args, **(kwargs or {}))
        if self.has_uninitialized_params():
            raise RuntimeError(f"module {type(self).__name__} has not been fully initialized")
        self._initialize_hook.remove()
        del self._initialize_hook
        if self.cls_to_become is not None:
            self.__class__ = self.cls_to_become

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs) -> None:
        for store in (self._parameters, self._buffers):
            for name, tensor in store.items():
                key = prefix + name
                if is_lazy(tensor) and key in state_dict and not is_lazy(state_dict[key]):
                    with no_grad():
                        tensor.materialize(tuple(state_dict[key].shape))
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)


class LazyLinear(LazyModuleMixin, Linear):
    """A Linear whose ``in_features`` is the last dim of its first input.

    >>> import tilewise as tw
    >>> layer = tw.nn.LazyLinear(3)
    >>> layer(tw.ones(2, 5)).shape, type(layer).__name__, layer.weight.shape
    (tilewise.Size([2, 3]), 'Linear', tilewise.Size([3, 5]))
    """

    cls_to_become = Linear

    def __init__(self, out_features: int, bias: bool = True, device=None, dtype=None) -> None:
        super().__init__(0, 0, False)
        self.weight = UninitializedParameter(device=device, dtype=dtype)
        self.out_features = out_features
        if bias:
            self.bias = UninitializedParameter(device=device, dtype=dtype)

    def reset_parameters(self) -> None:
        if not self.has_uninitialized_params() and self.in_features != 0:
            super().reset_parameters()

    def initialize_parameters(self, input: Tensor) -> None:
        if self.has_uninitialized_params():
            with no_grad():
                self.in_features = input.shape[-1]
                self.weight.materialize((self.out_features, self.in_features))
                if self.bias is not None:
                    self.bias.materialize((self.out_features,))
                self.reset_parameters()


class _LazyConvMixin(LazyModuleMixin):
    def reset_parameters(self) -> None:
        if not self.has_uninitialized_params() and self.in_channels != 0:
            super().reset_parameters()

    def _in_channels_of(self, input: Tensor) -> int:
        batched = input.dim() == self._dims + 2
        if input.dim() not in (self._dims + 1, self._dims + 2):
            raise RuntimeError(f"Expected {self._dims + 1}D (unbatched) or {self._dims + 2}D (batched) input to "
                               f"{type(self).__name__}, but got input of size: {list(input.shape)}")
        return input.shape[1] if batched else input.shape[0]

    def initialize_parameters(self, input: Tensor, *args, **kwargs) -> None:
        if not self.has_uninitialized_params():
            return
        self.in_channels = self._in_channels_of(input)
        if self.in_channels % self.groups:
            raise ValueError("in_channels must be divisible by groups")
        if self._transposed:
            shape = (self.in_channels, self.out_channels // self.groups)
        else:
            shape = (self.out_channels, self.in_channels // self.groups)
        with no_grad():
            self.weight.materialize((*shape, *self.kernel_size))
            if self.bias is not None:
                self.bias.materialize((self.out_channels,))
            self.reset_parameters()


def _make_lazy(module, out_channels: int, bias: bool, device, dtype) -> None:
    module.weight = UninitializedParameter(device=device, dtype=dtype)
    module.out_channels = out_channels
    if bias:
        module.bias = UninitializedParameter(device=device, dtype=dtype)


class _LazyConv(_LazyConvMixin):
    def __init__(self, out_channels: int, kernel_size, stride=1, padding=0, dilation=1, groups: int = 1,
                 bias: bool = True, padding_mode: str = "zeros", device=None, dtype=None) -> None:
        super().__init__(0, 0, kernel_size, stride, padding, dilation, groups, False, padding_mode, device, dtype)
        _make_lazy(self, out_channels, bias, device, dtype)


class _LazyConvTranspose(_LazyConvMixin):
    def __init__(self, out_channels: int, kernel_size, stride=1, padding=0, output_padding=0, groups: int = 1,
                 bias: bool = True, dilation=1, padding_mode: str = "zeros", device=None, dtype=None) -> None:
        super().__init__(0, 0, kernel_size, stride, padding, output_padding, groups, False, dilation, padding_mode,
                         device, dtype)
        _make_lazy(self, out_channels, bias, device, dtype)


class LazyConv1d(_LazyConv, Conv1d):
    """A Conv1d whose ``in_channels`` is read from its first input."""

    cls_to_become = Conv1d


class LazyConv2d(_LazyConv, Conv2d):
    """A Conv2d whose ``in_channels`` is read from its first input."""

    cls_to_become = Conv2d


class LazyConv3d(_LazyConv, Conv3d):
    cls_to_become = Conv3d


class LazyConvTranspose1d(_LazyConvTranspose, ConvTranspose1d):
    cls_to_become = ConvTranspose1d


class LazyConvTranspose2d(_LazyConvTranspose, ConvTranspose2d):
    cls_to_become = ConvTranspose2d


class LazyConvTranspose3d(_LazyConvTranspose, ConvTranspose3d):
    cls_to_become = ConvTranspose3d


class _LazyNormMixin(LazyModuleMixin):
    def _become_lazy(self, affine: bool, track_running_stats: bool, device, dtype) -> None:
        self.affine, self.track_running_stats = affine, track_running_stats
        if affine:
            self.weight = UninitializedParameter(device=device, dtype=dtype)
            self.bias = UninitializedParameter(device=device, dtype=dtype)
        if track_running_stats:
            self.running_mean = UninitializedBuffer(device=device, dtype=dtype)
            self.running_var = UninitializedBuffer(device=device, dtype=dtype)
            self.num_batches_tracked = zeros((), dtype=int64, device=device)

    def reset_parameters(self) -> None:
        if not self.has_uninitialized_params() and self.num_features != 0:
            super().reset_parameters()

    def initialize_parameters(self, input: Tensor) -> None:
        if not self.has_uninitialized_params():
            return
        self.num_features = input.shape[1]
        with no_grad():
            for name in ("weight", "bias", "running_mean", "running_var"):
                tensor = getattr(self, name)
                if tensor is not None and is_lazy(tensor):
                    tensor.materialize((self.num_features,))
            self.reset_parameters()


class _LazyNorm(_LazyNormMixin):
    """torch's lazy norms all default to affine parameters and running statistics, instance norms included."""

    def __init__(self, eps: float = 1e-5, momentum: float | None = 0.1, affine: bool = True,
                 track_running_stats: bool = True, device=None, dtype=None) -> None:
        super().__init__(0, eps, momentum, False, False, device, dtype)
        self._become_lazy(affine, track_running_stats, device, dtype)


class LazyBatchNorm1d(_LazyNorm, BatchNorm1d):
    """A BatchNorm1d whose ``num_features`` is read from its first input."""

    cls_to_become = BatchNorm1d


class LazyBatchNorm2d(_LazyNorm, BatchNorm2d):
    cls_to_become = BatchNorm2d


class LazyBatchNorm3d(_LazyNorm, BatchNorm3d):
    cls_to_become = BatchNorm3d


class LazyInstanceNorm1d(_LazyNorm, InstanceNorm1d):
    cls_to_become = InstanceNorm1d


class LazyInstanceNorm2d(_LazyNorm, InstanceNorm2d):
    cls_to_become = InstanceNorm2d


class LazyInstanceNorm3d(_LazyNorm, InstanceNorm3d):
    cls_to_become = InstanceNorm3d

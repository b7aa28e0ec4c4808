"""Normalisation layers: LayerNorm, RMSNorm, GroupNorm, BatchNorm1d/2d/3d, InstanceNorm1d/2d/3d.

BatchNorm keeps ``running_mean``/``running_var``/``num_batches_tracked`` as buffers (so they are in the
state dict and move with ``.to``); ``F.batch_norm`` updates the running statistics in place when training,
exactly as torch's functional does (without bumping their version, so a second forward before backward is
fine). InstanceNorm is the same module with torch's other defaults: no affine parameters and no running
statistics unless asked, and statistics of each instance whenever it has none to use.
"""

from __future__ import annotations

import warnings
from numbers import Integral

from tilewise import dtypes
from tilewise.nn import functional as F  # noqa: N812 — torch's spelling
from tilewise.nn import init
from tilewise.nn.modules.module import Module
from tilewise.nn.parameter import Parameter
from tilewise.ops.creation import empty, ones, zeros
from tilewise.tensor import Tensor


def _shape(normalized_shape) -> tuple[int, ...]:
    return (int(normalized_shape),) if isinstance(normalized_shape, Integral) else tuple(normalized_shape)


def _register_bias(module: Module, enabled: bool, value: Tensor) -> None:
    if enabled:
        module.bias = Parameter(value)
    else:
        module.register_parameter("bias", None)


class LayerNorm(Module):
    """Normalise over the last ``len(normalized_shape)`` dims, then scale and shift (``weight``, ``bias``)."""

    def __init__(self, normalized_shape, eps: float = 1e-5, elementwise_affine: bool = True, bias: bool = True,
                 device=None, dtype=None) -> None:
        super().__init__()
        self.normalized_shape = _shape(normalized_shape)
        self.eps, self.elementwise_affine = eps, elementwise_affine
        if elementwise_affine:
            self.weight = Parameter(ones(self.normalized_shape, device=device, dtype=dtype))
            if bias:
                self.bias = Parameter(zeros(self.normalized_shape, device=device, dtype=dtype))
            else:
                self.register_parameter("bias", None)
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)

    def reset_parameters(self) -> None:
        if self.weight is not None:
            init.ones_(self.weight)
        if self.bias is not None:
            init.zeros_(self.bias)

    def forward(self, input: Tensor) -> Tensor:
        return F.layer_norm(input, self.normalized_shape, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return (f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}, "
                f"bias={self.bias is not None}")


class RMSNorm(Module):
    """``x / sqrt(mean(x**2) + eps) * weight`` over the last ``len(normalized_shape)`` dims."""

    def __init__(self, normalized_shape, eps: float | None = None, elementwise_affine: bool = True, device=None,
                 dtype=None) -> None:
        super().__init__()
        self.normalized_shape = _shape(normalized_shape)
        self.eps, self.elementwise_affine = eps, elementwise_affine
        if elementwise_affine:
            self.weight = Parameter(ones(self.normalized_shape, device=device, dtype=dtype))
        else:
            self.register_parameter("weight", None)

    def reset_parameters(self) -> None:
        if self.weight is not None:
            init.ones_(self.weight)

    def forward(self, input: Tensor) -> Tensor:
        return F.rms_norm(input, self.normalized_shape, self.weight, self.eps)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"


class GroupNorm(Module):
    def __init__(self, num_groups: int, num_channels: int, eps: float = 1e-5, affine: bool = True, device=None,
                 dtype=None, *, bias: bool = True) -> None:
        super().__init__()
        if num_channels % num_groups:
            raise ValueError(f"GroupNorm: num_channels ({num_channels}) must be divisible by num_groups "
                             f"({num_groups})")
        self.num_groups, self.num_channels, self.eps, self.affine = num_groups, num_channels, eps, affine
        if affine:
            self.weight = Parameter(ones(num_channels, device=device, dtype=dtype))
            _register_bias(self, bias, zeros(num_channels, device=device, dtype=dtype))
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)

    def forward(self, input: Tensor) -> Tensor:
        return F.group_norm(input, self.num_groups, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return (f"{self.num_groups}, {self.num_channels}, eps={self.eps}, affine={self.affine}, "
                f"bias={self.bias is not None}")


class _BatchNorm(Module):
    _expected_dims: tuple[int, ...] = ()
    _version = 2  # version 2 added num_batches_tracked

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1, affine: bool = True,
                 track_running_stats: bool = True, device=None, dtype=None, *, bias: bool = True) -> None:
        super().__init__()
        self.num_features, self.eps, self.momentum = num_features, eps, momentum
        self.affine, self.track_running_stats = affine, track_running_stats
        if affine:
            self.weight = Parameter(empty(num_features, device=device, dtype=dtype))
            _register_bias(self, bias, empty(num_features, device=device, dtype=dtype))
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)
        if track_running_stats:
            self.register_buffer("running_mean", zeros(num_features, device=device, dtype=dtype))
            self.register_buffer("running_var", ones(num_features, device=device, dtype=dtype))
            self.register_buffer("num_batches_tracked", zeros((), dtype=dtypes.int64, device=device))
        else:
            self.register_buffer("running_mean", None)
            self.register_buffer("running_var", None)
            self.register_buffer("num_batches_tracked", None)
        self.reset_parameters()

    def reset_running_stats(self) -> None:
        if self.track_running_stats:
            init.zeros_(self.running_mean)
            init.ones_(self.running_var)
            self.num_batches_tracked.copy_(zeros((), dtype=dtypes.int64))

    def reset_parameters(self) -> None:
        self.reset_running_stats()
        if self.affine:
            init.ones_(self.weight)
            if self.bias is not None:
                init.zeros_(self.bias)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs) -> None:
        """A checkpoint older than version 2 (or a plain dict, which has no version) may lack
        ``num_batches_tracked``: the module keeps its own, as torch's does."""
        version = local_metadata.get("version")
        key = prefix + "num_batches_tracked"
        if (version is None or version < 2) and self.track_running_stats and key not in state_dict:
            tracked = self.num_batches_tracked
            state_dict[key] = tracked if tracked is not None and tracked.device.type != "meta" else \
                zeros((), dtype=dtypes.int64)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)

    def _check_input_dim(self, input: Tensor) -> None:
        if input.dim() not in self._expected_dims:
            raise ValueError(f"expected {' or '.join(f'{d}D' for d in self._expected_dims)} input (got {input.dim()}D "
                             f"input) ({type(self).__name__}, input of shape {list(input.shape)})")

    def forward(self, input: Tensor) -> Tensor:
        self._check_input_dim(input)
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:
                factor = 1.0 / float(self.num_batches_tracked.item())
        use_batch_stats = self.training or self.running_mean is None
        track = not self.training or self.track_running_stats
        return F.batch_norm(input, self.running_mean if track else None, self.running_var if track else None,
                            self.weight, self.bias, use_batch_stats, factor, self.eps)

    def extra_repr(self) -> str:
        return (f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, affine={self.affine}, "
                f"bias={self.bias is not None}, track_running_stats={self.track_running_stats}")


class BatchNorm1d(_BatchNorm):
    _expected_dims = (2, 3)


class BatchNorm2d(_BatchNorm):
    _expected_dims = (4,)


class BatchNorm3d(_BatchNorm):
    _expected_dims = (5,)


class SyncBatchNorm(_BatchNorm):
    """Batch norm whose training statistics cover the batches of every rank of ``process_group`` (default: the
    whole job), as torch's: the module of data-parallel training where each GPU sees too few examples for good
    statistics (see [Note: synchronised batch norm] in ``nn/parallel/_sync_batch_norm.py``). Outside training,
    without an initialised process group, or in a group of one rank it is a plain batch norm. Unlike torch's,
    it also synchronises CPU tensors (over gloo), where torch raises."""

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1, affine: bool = True,
                 track_running_stats: bool = True, process_group=None, device=None, dtype=None, *,
                 bias: bool = True) -> None:
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device, dtype, bias=bias)
        self.process_group = process_group

    def _check_input_dim(self, input: Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")

    def forward(self, input: Tensor) -> Tensor:
        self._check_input_dim(input)
        if input.shape[1] == 0:
            raise ValueError("SyncBatchNorm number of input channels should be non-zero")
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:
                factor = 1.0 / float(self.num_batches_tracked.item())
        use_batch_stats = self.training or (self.running_mean is None and self.running_var is None)
        track = not self.training or self.track_running_stats
        running_mean = self.running_mean if track else None
        running_var = self.running_var if track else None
        import tilewise.distributed as dist

        world_size, group = 1, None
        if use_batch_stats and self.training and dist.is_available() and dist.is_initialized():
            group = self.process_group if self.process_group else dist.group.WORLD
            world_size = dist.get_world_size(group)
        if world_size <= 1:
            return F.batch_norm(input, running_mean, running_var, self.weight, self.bias, use_batch_stats, factor,
                                self.eps)
        from tilewise.nn.parallel._sync_batch_norm import SyncBatchNormFunction

        return SyncBatchNormFunction.apply(input, self.weight, self.bias, running_mean, running_var, self.eps,
                                           factor, group, world_size)

    @classmethod
    def convert_sync_batchnorm(cls, module: Module, process_group=None) -> Module:
        """``module`` with every batch norm in it (BatchNorm1d/2d/3d) replaced by a SyncBatchNorm that shares its
        parameters and buffers; the module itself when it is one."""
        converted = module
        if isinstance(module, _BatchNorm) and not isinstance(module, _InstanceNorm):
            converted = cls(module.num_features, module.eps, module.momentum, module.affine,
                            module.track_running_stats, process_group)
            if module.affine:
                converted.weight = module.weight
                converted.bias = module.bias
            converted.running_mean = module.running_mean
            converted.running_var = module.running_var
            converted.num_batches_tracked = module.num_batches_tracked
            converted.training = module.training
            if hasattr(module, "qconfig"):
                converted.qconfig = module.qconfig
        for name, child in module.named_children():
            converted.add_module(name, cls.convert_sync_batchnorm(child, process_group))
        return converted


class _InstanceNorm(_BatchNorm):
    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1, affine: bool = False,
                 track_running_stats: bool = False, device=None, dtype=None) -> None:
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device, dtype)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs) -> None:
        """A plain dict (no version) with running statistics for a module that tracks none: a checkpoint of torch
        before 0.4, whose InstanceNorm tracked them by default; refused by name, as torch refuses it."""
        stats = [prefix + name for name in ("running_mean", "running_var") if prefix + name in state_dict]
        if local_metadata.get("version") is None and not self.track_running_stats and stats:
            names = " and ".join(f'"{k}"' for k in stats)
            klass = type(self).__name__
            error_msgs.append(f"Unexpected running stats buffer(s) {names} for {klass} with track_running_stats=False. "
                              "If state_dict is a checkpoint saved before 0.4.0, this may be expected because "
                              f"{klass} does not track running stats by default since 0.4.0. Please remove these "
                              "keys from state_dict. If the running stats are actually needed, instead set "
                              f"track_running_stats=True in {klass} to enable them. See the documentation of "
                              f"{klass} for details.")
            for key in stats:
                state_dict.pop(key)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)

    def _check_input_dim(self, input: Tensor) -> None:
        batched = self._expected_dims[-1]
        if input.dim() not in (batched - 1, batched):
            raise ValueError(f"expected {batched - 1}D or {batched}D input (got {input.dim()}D input) "
                             f"({type(self).__name__}: {batched - 1}D unbatched or {batched}D batched, input of shape "
                             f"{list(input.shape)})")

    def _check_features(self, input: Tensor) -> None:
        """The weight needs input's channels to be num_features; without one, torch only warns."""
        feature_dim = input.dim() - (self._expected_dims[-1] - 1)
        if input.shape[feature_dim] == self.num_features:
            return
        if self.affine:
            raise ValueError(f"expected input's size at dim={feature_dim} to match num_features "
                             f"({self.num_features}), but got: {input.shape[feature_dim]}.")
        warnings.warn(f"input's size at dim={feature_dim} does not match num_features. You can silence this warning "
                      "by not passing in num_features, which is not used because affine=False", stacklevel=3)

    def forward(self, input: Tensor) -> Tensor:
        self._check_input_dim(input)
        self._check_features(input)
        unbatched = input.dim() == self._expected_dims[-1] - 1
        x = input.unsqueeze(0) if unbatched else input
        out = F.instance_norm(x, self.running_mean, self.running_var, self.weight, self.bias,
                              self.training or not self.track_running_stats, self.momentum or 0.0, self.eps)
        return out.squeeze(0) if unbatched else out


class InstanceNorm1d(_InstanceNorm):
    _expected_dims = (3,)


class InstanceNorm2d(_InstanceNorm):
    _expected_dims = (4,)


class InstanceNorm3d(_InstanceNorm):
    _expected_dims = (5,)

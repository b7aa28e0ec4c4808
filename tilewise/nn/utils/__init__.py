"""tilewise.nn.utils: gradient clipping, flattening parameters to one vector, weight and spectral normalisation,
folding batch norms into the layer before them, module construction helpers, (``rnn``) padded and packed
sequences, (``parametrize``, ``parametrizations``) tensors of a module computed from others at every read,
(``prune``) pruning of module tensors by masks, and (``stateless``) the older spelling of func.functional_call."""

from tilewise.nn.utils import parametrizations, parametrize, prune, rnn, stateless
from tilewise.nn.utils.clip_grad import (
    clip_grad_norm,
    clip_grad_norm_,
    clip_grad_value_,
    clip_grads_with_norm_,
    get_total_norm,
)
from tilewise.nn.utils.construction import (
    convert_conv2d_weight_memory_format,
    convert_conv3d_weight_memory_format,
    skip_init,
)
from tilewise.nn.utils.convert_parameters import parameters_to_vector, vector_to_parameters
from tilewise.nn.utils.fusion import (
    fuse_conv_bn_eval,
    fuse_conv_bn_weights,
    fuse_linear_bn_eval,
    fuse_linear_bn_weights,
)
from tilewise.nn.utils.reparametrize import remove_spectral_norm, remove_weight_norm, spectral_norm, weight_norm

__all__ = ["clip_grad_norm", "clip_grad_norm_", "clip_grad_value_", "clip_grads_with_norm_", "get_total_norm",
           "parameters_to_vector", "vector_to_parameters", "weight_norm", "remove_weight_norm", "spectral_norm",
           "remove_spectral_norm", "fuse_conv_bn_eval", "fuse_conv_bn_weights", "fuse_linear_bn_eval",
           "fuse_linear_bn_weights", "skip_init", "convert_conv2d_weight_memory_format",
           "convert_conv3d_weight_memory_format", "rnn", "parametrize", "parametrizations", "prune", "stateless"]

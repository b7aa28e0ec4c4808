"""tilewise.nn.utils: gradient clipping, flattening parameters to one vector, and (``rnn``) padded and packed
sequences."""

from tilewise.nn.utils import rnn
from tilewise.nn.utils.clip_grad import clip_grad_norm_, clip_grad_value_, get_total_norm
from tilewise.nn.utils.convert_parameters import parameters_to_vector, vector_to_parameters

__all__ = ["clip_grad_norm_", "clip_grad_value_", "get_total_norm", "parameters_to_vector", "vector_to_parameters",
           "rnn"]

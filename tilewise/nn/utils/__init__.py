"""tilewise.nn.utils: gradient clipping and flattening parameters to one vector."""

from tilewise.nn.utils.clip_grad import clip_grad_norm_, clip_grad_value_, get_total_norm
from tilewise.nn.utils.convert_parameters import parameters_to_vector, vector_to_parameters

__all__ = ["clip_grad_norm_", "clip_grad_value_", "get_total_norm", "parameters_to_vector", "vector_to_parameters"]

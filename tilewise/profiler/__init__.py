"""Observability: seeing what every layer makes of a call.

``explain`` follows one call from the Python expression through the operators, eager dispatch, the
compiler's passes and kernels, down to CUDA C, PTX and SASS, running exactly the pipeline ``compile`` runs
for the chosen target. It is built over the whole public API, above the compiler.
"""

from tilewise.profiler.explain import Explanation, StepRecord  # noqa: F401 — tilewise.explain returns one
from tilewise.profiler.roofline import Roofline  # noqa: F401 — tilewise.profiler.roofline.roofline(device) gives one

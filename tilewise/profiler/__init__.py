"""Observability: seeing what every layer makes of a call.

``explain`` follows one call from the Python expression through the operators, eager dispatch, the
compiler's passes and kernels, down to CUDA C, PTX and SASS, running exactly the pipeline ``compile`` runs
for the chosen target. It is built over the whole public API, above the compiler.
"""

from tilewise.profiler.profile import (
    ProfilerAction,  # noqa: F401
    ProfilerActivity,  # noqa: F401
    profile,  # noqa: F401
    record_function,  # noqa: F401
    schedule,  # noqa: F401
    supported_activities,  # noqa: F401
    tensorboard_trace_handler,  # noqa: F401
)

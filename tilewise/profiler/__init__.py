"""Observability: seeing what every layer makes of a call.

``explain`` follows one call, or a whole function such as a training step, through every layer down to CUDA
C, PTX and SASS, reading what ``compile`` built and ran, each step timed and placed on the device's measured
roofline (``roofline``); ``report`` draws the same as one self-contained HTML page. ``profile`` is
torch.profiler's API: operator, program-step, memory and device events, ``key_averages().table()`` and
Chrome/Perfetto traces. All are built over the whole public API, above the compiler.
"""

from tilewise.profiler import nvtx_ranges  # noqa: F401 — fills emit_nvtx's slot in tilewise.autograd.profiler
from tilewise.profiler.explain import Explanation, StepRecord  # noqa: F401 — tilewise.explain returns one
from tilewise.profiler.profile import (
    ProfilerAction,  # noqa: F401
    ProfilerActivity,  # noqa: F401
    profile,  # noqa: F401
    record_function,  # noqa: F401
    schedule,  # noqa: F401
    supported_activities,  # noqa: F401
    tensorboard_trace_handler,  # noqa: F401
)
from tilewise.profiler.roofline import Roofline  # noqa: F401 — tilewise.profiler.roofline.roofline(device) gives one

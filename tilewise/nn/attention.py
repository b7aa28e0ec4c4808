"""``tilewise.nn.attention``: torch's way of choosing the kernels of ``scaled_dot_product_attention``.

``sdpa_kernel`` sets the four switches that ``tilewise.backends.cuda.enable_*_sdp`` set (see
[Note: backend flags] in ``backends/flags.py``): the listed backends on, the others off, and every switch back as
it was on exit. tilewise's attention runs on cuDNN or as its decomposition (torch's "math" backend), so the
cuDNN switch is the one that changes which kernel runs; the others are kept and read back as torch's.

>>> import tilewise as tw
>>> from tilewise.nn.attention import SDPBackend, sdpa_kernel
>>> with sdpa_kernel([SDPBackend.MATH]):
...     tw.backends.cuda.math_sdp_enabled(), tw.backends.cuda.flash_sdp_enabled()
(True, False)
"""

from __future__ import annotations

import contextlib
import enum

from tilewise.backends import flags

__all__ = ["SDPBackend", "sdpa_kernel"]


class SDPBackend(enum.IntEnum):
    """The kernels scaled-dot-product attention may run on, with torch's numbers."""

    ERROR = -1
    MATH = 0
    FLASH_ATTENTION = 1
    EFFICIENT_ATTENTION = 2
    CUDNN_ATTENTION = 3
    OVERRIDEABLE = 4


_SWITCHES = {SDPBackend.MATH: "math", SDPBackend.FLASH_ATTENTION: "flash",
             SDPBackend.EFFICIENT_ATTENTION: "mem_efficient", SDPBackend.CUDNN_ATTENTION: "cudnn"}


@contextlib.contextmanager
def sdpa_kernel(backends: list[SDPBackend] | SDPBackend, set_priority: bool = False):
    """Within the block, let scaled-dot-product attention use only ``backends`` (one or a list of them).

    ``set_priority`` asks torch to try the listed backends in their order; tilewise has one choice to make
    (cuDNN or the decomposition), so it is accepted and changes nothing.
    """
    if not isinstance(backends, (list, SDPBackend)):
        raise AssertionError("Backend must be an instance of SDPBackend or a list of SDPBackend instances, got "
                             f"{type(backends).__name__}")
    chosen = [backends] if isinstance(backends, SDPBackend) else list(dict.fromkeys(backends))
    previous = {kind: flags.sdp_enabled(kind) for kind in _SWITCHES.values()}
    try:
        for backend, kind in _SWITCHES.items():
            flags.enable_sdp(kind, backend in chosen)
        yield {}
    finally:
        for kind, enabled in previous.items():
            flags.enable_sdp(kind, enabled)

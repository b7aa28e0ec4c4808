"""torch.backends.cuda's functions on ``tilewise.backends.cuda``: whether CUDA support is installed, and the
scaled-dot-product-attention switches. The state is in ``backends/flags.py`` (see [Note: backend flags]);
``tilewise.backends.cuda.matmul`` is the cuBLASLt module, which carries torch.backends.cuda.matmul's attributes.
tilewise's attention runs on cuDNN or as its decomposition (the "math" path), so ``enable_cudnn_sdp`` is the
switch with an effect; the flash and memory-efficient switches are kept and read back as torch's.
"""

from __future__ import annotations

import contextlib
import warnings

from tilewise.backends import flags


def is_built() -> bool:
    """Whether tilewise's CUDA support is installed (the ``[cuda]`` extra), whether or not a GPU is present."""
    try:
        import cuda.bindings  # noqa: F401
    except ImportError:
        return False
    return True


def flash_sdp_enabled() -> bool:
    return flags.sdp_enabled("flash")


def enable_flash_sdp(enabled: bool) -> None:
    flags.enable_sdp("flash", enabled)


def mem_efficient_sdp_enabled() -> bool:
    return flags.sdp_enabled("mem_efficient")


def enable_mem_efficient_sdp(enabled: bool) -> None:
    flags.enable_sdp("mem_efficient", enabled)


def math_sdp_enabled() -> bool:
    return flags.sdp_enabled("math")


def enable_math_sdp(enabled: bool) -> None:
    flags.enable_sdp("math", enabled)


def cudnn_sdp_enabled() -> bool:
    return flags.sdp_enabled("cudnn")


def enable_cudnn_sdp(enabled: bool) -> None:
    """Let scaled_dot_product_attention run on cuDNN (the default) or not (its decomposition runs instead)."""
    flags.enable_sdp("cudnn", enabled)


@contextlib.contextmanager
def sdp_kernel(enable_flash: bool = True, enable_math: bool = True, enable_mem_efficient: bool = True,
               enable_cudnn: bool = True):
    """torch's deprecated context manager over the four switches (torch.nn.attention.sdpa_kernel replaces it)."""
    warnings.warn("`tilewise.backends.cuda.sdp_kernel()` is deprecated, as torch's is. In the future, this context "
                  "manager will be removed; the enable_*_sdp functions set the same switches.", FutureWarning,
                  stacklevel=3)
    kinds = {"flash": enable_flash, "math": enable_math, "mem_efficient": enable_mem_efficient, "cudnn": enable_cudnn}
    saved = {kind: flags.sdp_enabled(kind) for kind in kinds}
    try:
        for kind, enabled in kinds.items():
            flags.enable_sdp(kind, enabled)
        yield
    finally:
        for kind, enabled in saved.items():
            flags.enable_sdp(kind, enabled)

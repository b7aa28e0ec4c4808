"""The CPU backend's hand-written kernels, by operator name (see [Note: CPU kernels] in ``__init__.py``).

The kernel modules register here with :func:`kernel` and the backend looks them up in :data:`KERNELS`; the
table sits apart from the backend so that the kernel modules need not import the backend that loads them.
"""

from __future__ import annotations

KERNELS: dict[str, object] = {}  # operator full name -> numpy implementation taking bound arguments


def kernel(*names: str):
    def register(fn):
        for name in names:
            if name in KERNELS:
                raise ValueError(f"CPU kernel for {name} registered twice")
            KERNELS[name] = fn
        return fn

    return register

"""``tilewise.signal``: torch.signal's names. Its one submodule, ``windows``, holds the window functions with SciPy's
arguments (``sym``, ``std``, ``tau``, ``a``) that torch.signal.windows has.

>>> import tilewise as tw
>>> tw.signal.windows.hann(5)
tensor([0.0000, 0.5000, 1.0000, 0.5000, 0.0000])
"""

from tilewise.signal import windows

__all__ = ["windows"]

"""``tilewise.backends.mps``: torch.backends.mps's queries. tilewise has no Metal backend, so both answer False.

>>> import tilewise as tw
>>> tw.backends.mps.is_available()
False
"""

from __future__ import annotations


def is_available() -> bool:
    return False


def is_built() -> bool:
    return False

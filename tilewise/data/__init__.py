"""Text shipped with tilewise, for the demo and the examples.

``kjv.txt`` (864 KB, 74 distinct characters): the books of Genesis, Exodus, Psalms, Proverbs, Ecclesiastes
and Matthew from the King James Version of the Bible (1611, public domain), one verse per line as
``chapter:verse text``, each book under a ``THE BOOK OF ...`` heading.
"""

from __future__ import annotations

from importlib import resources

TEXTS = ("kjv",)


def load_text(name: str = "kjv") -> str:
    """The full text of a shipped corpus.

    >>> from tilewise.data import load_text
    >>> load_text()[:19]
    'THE BOOK OF GENESIS'
    """
    if name not in TEXTS:
        raise ValueError(f"no shipped text named {name!r}; available: {', '.join(TEXTS)}")
    return resources.files(__name__).joinpath(f"{name}.txt").read_text(encoding="utf-8")

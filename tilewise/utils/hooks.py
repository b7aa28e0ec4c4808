"""Handles returned by every ``register_*_hook``: ``handle.remove()`` takes the hook out again."""

from __future__ import annotations

import itertools

_ids = itertools.count()


class RemovableHandle:
    """Removes one entry from the dict of hooks it was registered in (torch.utils.hooks.RemovableHandle)."""

    def __init__(self, hooks: dict, *extra: dict):
        self.id = next(_ids)
        self._dicts = (hooks, *extra)

    def remove(self) -> None:
        for hooks in self._dicts:
            hooks.pop(self.id, None)

    def __enter__(self) -> RemovableHandle:
        return self

    def __exit__(self, *exc) -> None:
        self.remove()

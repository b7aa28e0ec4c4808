"""Handles returned by every ``register_*_hook``: ``handle.remove()`` takes the hook out again."""

from __future__ import annotations

import itertools

_ids = itertools.count()


class RemovableHandle:
    """Removes one hook, by id, from the dict it was registered in and from any sets that mark it
    (torch.utils.hooks.RemovableHandle)."""

    def __init__(self, hooks: dict, *markers: set):
        self.id = next(_ids)
        self._hooks, self._markers = hooks, markers

    def remove(self) -> None:
        self._hooks.pop(self.id, None)
        for marker in self._markers:
            marker.discard(self.id)

    def __enter__(self) -> RemovableHandle:
        return self

    def __exit__(self, *exc) -> None:
        self.remove()

"""``tilewise.sparse``: the namespace of torch.sparse, without sparse tensors.

tilewise has no sparse layouts (see ``tilewise/coverage.py`` for the APIs left out), so none of torch.sparse's
functions is here. The namespace exists for what scripts reach through it: ``torch.sparse.torch`` is the torch module
itself (torch.sparse imports torch), and a widely copied capsule network builds its one-hot targets with
``torch.sparse.torch.eye(10).index_select(dim=0, index=target)``.

>>> import tilewise as torch
>>> torch.sparse.torch.eye(3).index_select(dim=0, index=torch.tensor([2]))
tensor([[0., 0., 1.]])
"""

from __future__ import annotations

import sys

__all__: list[str] = []


def __getattr__(name: str):
    if name == "torch":  # the package this module is in (read, not imported: its modules never import the root)
        return sys.modules[__name__.rpartition(".")[0]]
    raise AttributeError(f"module 'tilewise.sparse' has no attribute {name!r} (tilewise has no sparse tensors)")

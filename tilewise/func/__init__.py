"""Function transforms, as torch.func: ``vmap`` (see [Note: vmap] in ``func/_vmap.py``)."""

from tilewise.func._vmap import vmap

__all__ = ["vmap"]

"""tilewise.utils: data loading (``tilewise.utils.data``), hook handles (``tilewise.utils.hooks``) and activation
checkpointing (``tilewise.utils.checkpoint``), each loaded with the package as torch loads its own."""

from tilewise.utils import checkpoint, data, hooks

__all__ = ["checkpoint", "data", "hooks"]

"""tilewise.utils: data loading (``tilewise.utils.data``) and hook handles (``tilewise.utils.hooks``)."""

from tilewise.utils import data, hooks

__all__ = ["data", "hooks"]

"""The public operator functions (``tilewise.add``, ``tilewise.log``, ``tilewise.where``, ...), in one module.

[Note: public functions] Each public operator's function and aliases are derived from its declaration by
``build_api`` (which also gives Tensor its methods) when this module is first imported, and kept here. The
package root re-exports exactly these; modules inside the package import them from here
(``from tilewise.ops.functions import log, where``), never from the root, which imports those modules in turn.
One list, so the root's names and these cannot drift apart.
"""

from tilewise.ops import build_api as _build_api

FUNCTIONS: dict = _build_api()  # name -> public function, aliases included
globals().update(FUNCTIONS)
__all__ = sorted(FUNCTIONS)

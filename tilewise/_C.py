# ruff: noqa: N999 — torch's module name, for code that spells torch._C.DisableTorchFunctionSubclass
"""torch._C's spellings of the ``__torch_function__`` switches, for code written against torch
(``torch._C.DisableTorchFunctionSubclass()``); they live in ``tilewise.overrides``."""

from tilewise.overrides import (  # noqa: F401 — re-exported under torch's names
    DisableTorchFunction,
    DisableTorchFunctionSubclass,
    _disabled_torch_function_impl,
    _is_torch_function_enabled,
)

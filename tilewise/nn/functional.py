"""tilewise.nn.functional: the neural-network operators, as functions (torch.nn.functional's names).

Everything here is a declared operator (``tilewise/ops``); this module only gathers the names.
"""

from __future__ import annotations

import tilewise as _tw  # noqa: F401 — loads every declaration before the names are gathered
from tilewise.ops.registry import OVERLOADS, public_function

_NN_OPS = ("relu", "relu6", "leaky_relu", "threshold", "hardtanh", "gelu", "silu", "mish", "softplus", "hardswish",
           "hardsigmoid", "elu", "selu", "celu", "softsign", "logsigmoid", "sigmoid", "tanh", "softmax",
           "log_softmax", "linear")


def _export(names) -> None:
    for name in names:
        if name in OVERLOADS:
            globals()[name] = public_function(name)


_export(_NN_OPS)
_export(name for name, ops in OVERLOADS.items() if ops[0].attrs.get("functional"))

unfold = public_function("im2col")  # torch.nn.functional's names for its im2col and col2im
fold = public_function("col2im")

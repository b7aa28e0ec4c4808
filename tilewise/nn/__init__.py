"""tilewise.nn: layers, parameters, initialisation and losses with torch.nn's names and behaviour.

>>> import tilewise as tw
>>> model = tw.nn.Sequential(tw.nn.Linear(4, 8), tw.nn.GELU(), tw.nn.Linear(8, 2))
>>> model
Sequential(
  (0): Linear(in_features=4, out_features=8, bias=True)
  (1): GELU(approximate='none')
  (2): Linear(in_features=8, out_features=2, bias=True)
)
"""

from tilewise.nn import attention, functional, init, utils
from tilewise.nn.modules import *  # noqa: F403 — the layer classes, listed in modules.__all__
from tilewise.nn.modules import __all__ as _modules_all
from tilewise.nn.parameter import Buffer, Parameter, UninitializedBuffer, UninitializedParameter

__all__ = ["Buffer", "Parameter", "UninitializedParameter", "UninitializedBuffer", "functional", "init", "utils",
           *_modules_all]


def __getattr__(name: str):
    """``nn.parallel`` (DistributedDataParallel) and ``nn.DataParallel`` on first use: they bring
    tilewise.distributed with them."""
    if name in ("parallel", "DataParallel"):
        import importlib

        parallel = importlib.import_module("tilewise.nn.parallel")
        return parallel if name == "parallel" else parallel.DataParallel
    raise AttributeError(f"module 'tilewise.nn' has no attribute {name!r}")

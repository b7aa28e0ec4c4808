"""torch.utils.data._utils's module paths, for scripts that import from them.

Private in torch, yet where torch's own ``default_collate`` documentation sends users to extend collation
(``from torch.utils.data._utils.collate import collate, default_collate_fn_map``), and where many training scripts
find ``default_collate`` and ``get_worker_info``. Each module here re-exports tilewise's objects themselves (the
same ``default_collate_fn_map`` dict, the same functions), so an extension made through one path is seen by all.
"""

from tilewise.utils.data._utils import collate, pin_memory, worker
from tilewise.utils.data._worker import MP_STATUS_CHECK_INTERVAL, ExceptionWrapper

__all__ = ["MP_STATUS_CHECK_INTERVAL", "ExceptionWrapper", "collate", "pin_memory", "worker"]

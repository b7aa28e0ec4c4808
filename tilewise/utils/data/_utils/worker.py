"""torch.utils.data._utils.worker's public names: what a worker process knows about itself."""

from tilewise.utils.data._worker import MP_STATUS_CHECK_INTERVAL, ExceptionWrapper
from tilewise.utils.data._worker_info import WorkerInfo, get_worker_info

__all__ = ["MP_STATUS_CHECK_INTERVAL", "ExceptionWrapper", "WorkerInfo", "get_worker_info"]

"""tilewise.distributed: torch.distributed's API for several processes (and several GPUs).

[Note: distributed] ``import tilewise.distributed as dist`` ports ``import torch.distributed as dist``: the
same names, signatures, defaults and errors. The package is layered like torch's c10d:

- ``store.py`` — key-value stores (``TCPStore``, ``HashStore``, ``FileStore``, ``PrefixStore``) through which
  processes rendezvous before any transport exists;
- ``backend.py`` — the interface a transport implements (``Backend``: allreduce, broadcast,
  allgather_into_tensor, reduce_scatter_tensor, alltoall_base, send, recv, barrier), the ``Work`` and
  ``Future`` its operations return, and ``ReduceOp``;
- ``c10d.py`` — process groups (``init_process_group``, ``new_group``, ``group.WORLD``), one transport per
  device type in each group, and every module-level collective composed from the transport primitives;
- ``gloo.py`` — CPU tensors over a TCP mesh with ring algorithms (backend "gloo");
- ``nccl.py`` — CUDA tensors through nccl4py (backend "nccl"), imported on the first CUDA collective;
- ``run.py`` — the launcher, ``python -m tilewise.distributed.run`` (torchrun's flags).

A job is started by the launcher (or by hand with RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set):

>>> import tilewise, tilewise.distributed as dist                        # doctest: +SKIP
>>> dist.init_process_group("gloo")                                      # doctest: +SKIP
>>> t = tilewise.ones(3) * (dist.get_rank() + 1); dist.all_reduce(t)     # doctest: +SKIP
>>> dist.destroy_process_group()                                         # doctest: +SKIP

``dist.Backend`` is torch's class of backend *names* ("gloo", "nccl"); the transport interface is
``tilewise.distributed.backend.Backend``, as in torch (``torch._C._distributed_c10d.Backend``).
"""

from tilewise.distributed.backend import Future, ReduceOp, Work
from tilewise.distributed.c10d import (
    Backend,
    GroupMember,
    P2POp,
    ProcessGroup,
    all_gather,
    all_gather_into_tensor,
    all_gather_object,
    all_reduce,
    all_to_all,
    all_to_all_single,
    barrier,
    batch_isend_irecv,
    broadcast,
    broadcast_object_list,
    default_pg_timeout,
    destroy_process_group,
    gather,
    gather_object,
    get_backend,
    get_global_rank,
    get_group_rank,
    get_process_group_ranks,
    get_rank,
    get_world_size,
    group,
    init_process_group,
    irecv,
    is_available,
    is_gloo_available,
    is_initialized,
    is_mpi_available,
    is_nccl_available,
    is_torchelastic_launched,
    is_ucc_available,
    isend,
    monitored_barrier,
    new_group,
    recv,
    reduce,
    reduce_scatter,
    reduce_scatter_tensor,
    scatter,
    scatter_object_list,
    send,
)
from tilewise.distributed.store import (
    DistError,
    DistNetworkError,
    DistStoreError,
    FileStore,
    HashStore,
    PrefixStore,
    Store,
    TCPStore,
)

__all__ = [
    "Backend", "DistError", "DistNetworkError", "DistStoreError", "FileStore", "Future", "GroupMember",
    "HashStore", "P2POp", "PrefixStore", "ProcessGroup", "ReduceOp", "Store", "TCPStore", "Work", "all_gather",
    "all_gather_into_tensor", "all_gather_object", "all_reduce", "all_to_all", "all_to_all_single", "barrier",
    "batch_isend_irecv", "broadcast", "broadcast_object_list", "default_pg_timeout", "destroy_process_group",
    "gather", "gather_object", "get_backend", "get_global_rank", "get_group_rank", "get_process_group_ranks",
    "get_rank", "get_world_size", "group", "init_process_group", "irecv", "is_available", "is_gloo_available",
    "is_initialized", "is_mpi_available", "is_nccl_available", "is_torchelastic_launched", "is_ucc_available",
    "isend", "monitored_barrier", "new_group", "recv", "reduce", "reduce_scatter", "reduce_scatter_tensor",
    "scatter", "scatter_object_list", "send",
]

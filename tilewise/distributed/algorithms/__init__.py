"""tilewise.distributed.algorithms: torch.distributed.algorithms' communication hooks for DistributedDataParallel
(``ddp_comm_hooks``)."""

"""Communication hooks for ``DistributedDataParallel.register_comm_hook``, at torch's module paths
(``default_hooks``: average, and average in float16 or bfloat16)."""

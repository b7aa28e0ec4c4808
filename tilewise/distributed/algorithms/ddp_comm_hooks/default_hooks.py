"""torch's default DDP communication hooks: average a bucket's gradients, optionally in 16-bit.

A hook receives ``(state, bucket)``, ``state`` being the process group to reduce over (``None`` for the default
group), and returns a Future of the reduced bucket; DistributedDataParallel writes the Future's value back into
the gradients. Each hook divides before it sums, as torch's do, so 16-bit sums do not overflow. Unlike torch,
``bf16_compress_hook`` also runs on CPU tensors (gloo), where torch requires CUDA and NCCL.

>>> # xdoctest: +SKIP("needs a DistributedDataParallel model")
>>> ddp_model.register_comm_hook(None, fp16_compress_hook)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tilewise.distributed as dist
from tilewise.dtypes import bfloat16, float16
from tilewise.nn.parallel._reducer import GradBucket
from tilewise.tensor import Tensor

__all__ = ["allreduce_hook", "fp16_compress_hook", "bf16_compress_hook", "fp16_compress_wrapper",
           "bf16_compress_wrapper"]


def _allreduce_fut(process_group, tensor: Tensor):
    """Average ``tensor`` in place over the group; a Future of it."""
    tensor.div_(dist.get_world_size(process_group))
    return dist.all_reduce(tensor, group=process_group, async_op=True).get_future().then(lambda fut: fut.value()[0])


def allreduce_hook(process_group, bucket: GradBucket):
    """The average DDP computes without a hook (a reference to start a custom hook from)."""
    return _allreduce_fut(process_group, bucket.buffer())


def _compress_hook(dtype, process_group, bucket: GradBucket):
    buffer = bucket[0] if isinstance(bucket, tuple) else bucket.buffer()
    compressed = buffer.to(dtype).div_(dist.get_world_size(process_group))

    def decompress(fut):
        value = fut if isinstance(fut, Tensor) else fut.value()[0]
        buffer.copy_(value)  # in place, to keep the peak memory down
        return buffer

    return dist.all_reduce(compressed, group=process_group, async_op=True).get_future().then(decompress)


def fp16_compress_hook(process_group, bucket: GradBucket):
    """Average the bucket in float16 (divided by the group's size first), then cast back."""
    return _compress_hook(float16, process_group, bucket)


def bf16_compress_hook(process_group, bucket: GradBucket):
    """Average the bucket in bfloat16 (divided by the group's size first), then cast back."""
    return _compress_hook(bfloat16, process_group, bucket)


def _compress_wrapper(dtype, hook: Callable[[Any, GradBucket], Any], name: str):
    def wrapper_hook(hook_state, bucket: GradBucket):
        bucket.set_buffer(bucket.buffer().to(dtype))
        fut = hook(hook_state, bucket)

        def decompress(fut):
            decompressed = bucket.buffer()
            decompressed.copy_(fut.value())
            return decompressed

        return fut.then(decompress)

    wrapper_hook.__name__ = wrapper_hook.__qualname__ = name
    return wrapper_hook


def fp16_compress_wrapper(hook: Callable[[Any, GradBucket], Any]):
    """``hook`` run on the bucket cast to float16; ``fp16_compress_wrapper(allreduce_hook)`` is
    ``fp16_compress_hook``."""
    return _compress_wrapper(float16, hook, "fp16_compress_wrapper_hook")


def bf16_compress_wrapper(hook: Callable[[Any, GradBucket], Any]):
    """``hook`` run on the bucket cast to bfloat16."""
    return _compress_wrapper(bfloat16, hook, "bf16_compress_wrapper_hook")

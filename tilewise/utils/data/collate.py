"""Collation: a list of samples becomes a batch, as torch.utils.data's ``default_collate`` and ``default_convert``.

[Note: collation] ``collate`` looks the type of the first sample up in a table (``default_collate_fn_map``:
tensors are stacked, numpy arrays become tensors and are stacked, Python floats become float64 tensors, ints int64
(bools bool), numpy scalars keep their dtype, strings and bytes stay lists) and otherwise recurses through
mappings, named tuples and sequences field by field. Tuples become lists and other sequences keep their type, as
in torch, whose output structure scripts unpack. Inside a worker process the stack writes straight into shared
memory (see ``_shared_memory``), so the batch reaches the main process without another copy of its bytes.
"""

from __future__ import annotations

import collections.abc
import copy
import re
from collections.abc import Callable

import numpy as np

from tilewise.tensor import Tensor

np_str_obj_array_pattern = re.compile(r"[SaUO]")

default_collate_err_msg_format = (
    "default_collate: batch must contain tensors, numpy arrays, numbers, dicts or lists; found {}"
)


def default_convert(data):
    """Every numpy array (and numpy scalar) in ``data`` becomes a tensor, through mappings, named tuples and
    sequences; anything else is left as it is. What a DataLoader applies to samples when it does not batch.

    >>> import numpy as np
    >>> from tilewise.utils.data import default_convert
    >>> default_convert({"x": np.array([1, 2]), "label": "cat"})
    {'x': tensor([1, 2]), 'label': 'cat'}
    """
    from tilewise.tensor import as_tensor

    elem_type = type(data)
    if isinstance(data, Tensor):
        return data
    if elem_type.__module__ == "numpy" and elem_type.__name__ not in ("str_", "string_"):
        if elem_type.__name__ == "ndarray" and np_str_obj_array_pattern.search(data.dtype.str) is not None:
            return data
        return as_tensor(data)
    if isinstance(data, collections.abc.Mapping):
        return _rebuild_mapping(data, {key: default_convert(data[key]) for key in data})
    if isinstance(data, tuple) and hasattr(data, "_fields"):
        return elem_type(*(default_convert(d) for d in data))
    if isinstance(data, tuple):
        return [default_convert(d) for d in data]
    if isinstance(data, collections.abc.Sequence) and not isinstance(data, (str, bytes)):
        return _rebuild_sequence(data, [default_convert(d) for d in data])
    return data


def _rebuild_mapping(original, values: dict):
    """``values`` in a mapping of ``original``'s type where it can be built, else a dict (torch's rule)."""
    try:
        if isinstance(original, collections.abc.MutableMapping):
            clone = copy.copy(original)
            clone.update(values)
            return clone
        return type(original)(values)
    except TypeError:
        return values


def _rebuild_sequence(original, values: list):
    try:
        if isinstance(original, collections.abc.MutableSequence):
            clone = copy.copy(original)
            for i, value in enumerate(values):
                clone[i] = value
            return clone
        return type(original)(values)
    except TypeError:
        return values


def collate(batch, *, collate_fn_map: dict[type | tuple[type, ...], Callable] | None = None):
    """Collate ``batch`` with the function ``collate_fn_map`` gives the first sample's type (exact type first,
    then the first entry it is an instance of), recursing through mappings, named tuples and sequences."""
    elem = batch[0]
    elem_type = type(elem)
    if collate_fn_map is not None:
        if elem_type in collate_fn_map:
            return collate_fn_map[elem_type](batch, collate_fn_map=collate_fn_map)
        for collate_type in collate_fn_map:
            if isinstance(elem, collate_type):
                return collate_fn_map[collate_type](batch, collate_fn_map=collate_fn_map)
    if isinstance(elem, collections.abc.Mapping):
        return _rebuild_mapping(elem, {key: collate([d[key] for d in batch], collate_fn_map=collate_fn_map)
                                       for key in elem})
    if isinstance(elem, tuple) and hasattr(elem, "_fields"):
        return elem_type(*(collate(samples, collate_fn_map=collate_fn_map) for samples in zip(*batch)))
    if isinstance(elem, collections.abc.Sequence):
        elem_size = len(elem)
        if not all(len(sample) == elem_size for sample in batch):
            raise RuntimeError("each element in list of batch should be of equal size")
        fields = [collate(samples, collate_fn_map=collate_fn_map) for samples in zip(*batch)]
        return fields if isinstance(elem, tuple) else _rebuild_sequence(elem, fields)
    raise TypeError(default_collate_err_msg_format.format(elem_type))


def collate_tensor_fn(batch, *, collate_fn_map=None) -> Tensor:
    from tilewise.ops.functions import stack

    if _in_worker() and _stackable_on_host(batch):
        from tilewise.utils.data._shared_memory import shared_empty

        elem = batch[0]
        out = shared_empty((len(batch), *elem.shape), elem.dtype)
        np.stack([t._np() for t in batch], axis=0, out=out._np())
        return out
    return stack(batch, 0)


def _stackable_on_host(batch: list[Tensor]) -> bool:
    """True when numpy can stack ``batch`` into a preallocated buffer with the result ``tilewise.stack`` gives."""
    elem = batch[0]
    return all(isinstance(t, Tensor) and t.device.type == "cpu" and t.dtype is elem.dtype and t.shape == elem.shape
               and not t.requires_grad for t in batch)


def _in_worker() -> bool:
    from tilewise.utils.data._worker_info import get_worker_info

    return get_worker_info() is not None


def gather_rows(t: Tensor, indices: list[int]) -> Tensor:
    """``t[indices]`` (the rows of a batch), written into shared memory inside a worker process."""
    if _in_worker() and t.device.type == "cpu":
        from tilewise.utils.data._shared_memory import shared_empty

        out = shared_empty((len(indices), *t.shape[1:]), t.dtype)
        np.take(t._np(), np.asarray(indices, dtype=np.int64), axis=0, out=out._np())
        return out
    from tilewise.tensor import tensor

    return t[tensor(indices, device=t.device)]


def collate_numpy_array_fn(batch, *, collate_fn_map=None):
    from tilewise.tensor import as_tensor

    elem = batch[0]
    if np_str_obj_array_pattern.search(elem.dtype.str) is not None:
        raise TypeError(default_collate_err_msg_format.format(elem.dtype))
    return collate([as_tensor(b) for b in batch], collate_fn_map=collate_fn_map)


def collate_numpy_scalar_fn(batch, *, collate_fn_map=None):
    from tilewise.tensor import as_tensor

    return as_tensor(np.asarray(batch))


def collate_float_fn(batch, *, collate_fn_map=None):
    from tilewise.dtypes import float64
    from tilewise.tensor import tensor

    return tensor(batch, dtype=float64)


def collate_int_fn(batch, *, collate_fn_map=None):
    from tilewise.tensor import tensor

    return tensor(batch)


def collate_str_fn(batch, *, collate_fn_map=None):
    return batch


default_collate_fn_map: dict[type | tuple[type, ...], Callable] = {
    Tensor: collate_tensor_fn,
    np.ndarray: collate_numpy_array_fn,
    (np.bool_, np.number, np.object_): collate_numpy_scalar_fn,
    float: collate_float_fn,
    int: collate_int_fn,
    str: collate_str_fn,
    bytes: collate_str_fn,
}


def default_collate(batch):
    """Stack a list of samples into a batch, field by field (see [Note: collation]).

    >>> import tilewise as tw
    >>> from tilewise.utils.data import default_collate
    >>> x, y = default_collate([(tw.ones(2), 0), (tw.zeros(2), 1)])
    >>> x.shape, y.tolist()
    (tilewise.Size([2, 2]), [0, 1])
    >>> default_collate([{"a": 0, "b": 1.5}, {"a": 100, "b": 2.5}])
    {'a': tensor([  0, 100]), 'b': tensor([1.5000, 2.5000], dtype=tilewise.float64)}
    """
    return collate(batch, collate_fn_map=default_collate_fn_map)

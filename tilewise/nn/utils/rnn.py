"""Variable-length sequences for recurrent layers: padding, packing and ``PackedSequence``, as torch.nn.utils.rnn.

[Note: packed sequences] A packed batch stores its sequences time step by time step, longest first: ``data``
holds, for each step t, the rows of the ``batch_sizes[t]`` sequences still running (``batch_sizes`` is a CPU
int64 tensor, non-increasing). ``sorted_indices`` records how the caller's batch was reordered by length and
``unsorted_indices`` undoes it. Lengths and batch sizes live on the CPU, so packing and padding work out their
row indices on the host and move data with one gather each way (``index_select``): one kernel on any device,
and autograd's backward of the gather is the scatter back.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from tilewise.dtypes import int64
from tilewise.layouts import contiguous_format
from tilewise.ops.creation import arange, full, zeros_like
from tilewise.ops.registry import public_function
from tilewise.tensor import Tensor, as_tensor, tensor

_cat, _stack = public_function("cat"), public_function("stack")

__all__ = ["PackedSequence", "invert_permutation", "pack_padded_sequence", "pad_packed_sequence", "pad_sequence",
           "unpad_sequence", "pack_sequence", "unpack_sequence"]


class PackedSequence_(NamedTuple):  # noqa: N801 — torch's name
    data: Tensor
    batch_sizes: Tensor
    sorted_indices: Tensor | None
    unsorted_indices: Tensor | None


class PackedSequence(PackedSequence_):
    """Sequences of different lengths packed step by step (see the note); made by ``pack_padded_sequence`` and
    ``pack_sequence``, read back by ``pad_packed_sequence``, and accepted by RNN, LSTM and GRU.

    >>> import tilewise as tw
    >>> from tilewise.nn.utils.rnn import pack_sequence
    >>> pack_sequence([tw.tensor([1, 2, 3]), tw.tensor([4, 5])]).batch_sizes
    tensor([2, 2, 1])
    """

    def __new__(cls, data, batch_sizes=None, sorted_indices=None, unsorted_indices=None):
        if unsorted_indices is None:
            unsorted_indices = invert_permutation(sorted_indices)
        if batch_sizes is not None:
            if batch_sizes.device.type != "cpu":
                raise ValueError("batch_sizes should always be on CPU. Instances of PackedSequence should never be "
                                 "created manually. They should be instantiated by functions like pack_sequence "
                                 "and pack_padded_sequences in nn.utils.rnn.")
            return super().__new__(cls, data, batch_sizes, sorted_indices, unsorted_indices)
        if not (isinstance(data, (list, tuple)) and len(data) == 2):
            raise AssertionError("Expected data to be a list or tuple of length 2")
        return super().__new__(cls, data[0], data[1], sorted_indices, unsorted_indices)

    def to(self, *args, **kwargs) -> PackedSequence:
        """``data.to(...)``; the indices follow data to its device, ``batch_sizes`` stays on the CPU."""
        data = self.data.to(*args, **kwargs)
        if data is self.data:
            return self

        def follow(t):
            return None if t is None else t.to(data.device)

        return type(self)(data, self.batch_sizes, follow(self.sorted_indices), follow(self.unsorted_indices))

    def cuda(self, *args, **kwargs) -> PackedSequence:
        return self.to("cuda" if not args and "device" not in kwargs else args[0] if args else kwargs["device"])

    def cpu(self) -> PackedSequence:
        return self.to("cpu")

    def pin_memory(self) -> PackedSequence:
        def pinned(t):
            return None if t is None else t.pin_memory()

        return type(self)(self.data.pin_memory(), self.batch_sizes, pinned(self.sorted_indices),
                          pinned(self.unsorted_indices))

    def double(self) -> PackedSequence:
        return self.to(dtype=_dtype("float64"))

    def float(self) -> PackedSequence:
        return self.to(dtype=_dtype("float32"))

    def half(self) -> PackedSequence:
        return self.to(dtype=_dtype("float16"))

    def long(self) -> PackedSequence:
        return self.to(dtype=_dtype("int64"))

    def int(self) -> PackedSequence:
        return self.to(dtype=_dtype("int32"))

    def short(self) -> PackedSequence:
        return self.to(dtype=_dtype("int16"))

    def char(self) -> PackedSequence:
        return self.to(dtype=_dtype("int8"))

    def byte(self) -> PackedSequence:
        return self.to(dtype=_dtype("uint8"))

    @property
    def is_cuda(self) -> bool:
        return self.data.is_cuda

    def is_pinned(self) -> bool:
        return self.data.is_pinned()


def _dtype(name: str):
    from tilewise import dtypes

    return getattr(dtypes, name)


def invert_permutation(permutation: Tensor | None) -> Tensor | None:
    """The permutation that undoes ``permutation`` (None stays None)."""
    if permutation is None:
        return None
    positions = arange(permutation.numel(), device=permutation.device, dtype=permutation.dtype)
    return zeros_like(permutation).scatter(0, permutation, positions)


# ---------------------------------------------------------------- packing


def _check_lengths(lengths: Tensor, batch_size: int, steps: int) -> list[int]:
    if lengths.ndim != 1 or lengths.device.type != "cpu" or lengths.dtype is not int64:
        raise RuntimeError(f"'lengths' argument should be a 1D CPU int64 tensor, but got {lengths.ndim}D "
                           f"{lengths.device} {lengths.dtype} tensor")
    values = lengths.tolist()
    if len(values) != batch_size:
        raise RuntimeError(f"Expected `len(lengths)` to be equal to batch_size, but got {len(values)} "
                           f"(batch_size={batch_size})")
    if values and values[-1] <= 0:
        raise RuntimeError("Length of all samples has to be greater than 0, but found an element in 'lengths' "
                           "that is <= 0")
    if any(a < b for a, b in zip(values, values[1:])):
        raise RuntimeError("`lengths` array must be sorted in decreasing order when `enforce_sorted` is True. You "
                           "can pass `enforce_sorted=False` to pack_padded_sequence and/or pack_sequence to "
                           "sidestep this requirement if you do not need ONNX exportability.")
    if values and values[0] > steps:
        raise RuntimeError(f"pack_padded_sequence: the longest length is {values[0]}, but the input holds only "
                           f"{steps} time steps")
    return values


def _batch_sizes(lengths: list[int]) -> list[int]:
    """How many sequences are still running at each step (lengths sorted longest first)."""
    steps = lengths[0] if lengths else 0
    return [sum(1 for n in lengths if n > t) for t in range(steps)]


def _pack(input: Tensor, lengths: Tensor, batch_first: bool) -> tuple[Tensor, Tensor]:
    if input.ndim < 2:
        raise IndexError(f"pack_padded_sequence: the input must have a time and a batch dimension, got a "
                         f"{input.ndim}-D tensor of shape {list(input.shape)}")
    steps_first = input.transpose(0, 1) if batch_first else input
    steps, batch = steps_first.shape[:2]
    sizes = _batch_sizes(_check_lengths(lengths, batch, steps))
    rows = [t * batch + b for t, size in enumerate(sizes) for b in range(size)]
    flat = steps_first.reshape(steps * batch, *steps_first.shape[2:])
    index = tensor(rows, dtype=int64, device=input.device)
    return flat.index_select(0, index), tensor(sizes, dtype=int64)


def pack_padded_sequence(input: Tensor, lengths, batch_first: bool = False,
                         enforce_sorted: bool = True) -> PackedSequence:
    """Pack a padded batch (``[T, B, *]``, or ``[B, T, *]`` with ``batch_first``) of sequences of ``lengths``."""
    if not isinstance(lengths, Tensor):
        lengths = as_tensor(lengths, dtype=int64, device="cpu")
    else:
        lengths = lengths.to(dtype=int64)
    sorted_indices = None
    if not enforce_sorted:
        lengths, sorted_indices = lengths.sort(descending=True, stable=True)
        sorted_indices = sorted_indices.to(input.device)
        input = input.index_select(0 if batch_first else 1, sorted_indices)
    data, batch_sizes = _pack(input, lengths, batch_first)
    return PackedSequence(data, batch_sizes, sorted_indices, None)


def pad_packed_sequence(sequence: PackedSequence, batch_first: bool = False, padding_value: float = 0.0,
                        total_length: int | None = None) -> tuple[Tensor, Tensor]:
    """The padded batch of a packed one, and each sequence's length (a CPU int64 tensor)."""
    steps = sequence.batch_sizes.size(0)
    if total_length is not None:
        if total_length < steps:
            raise ValueError("Expected total_length to be at least the length of the longest sequence in input, "
                             f"but got total_length={total_length} and max sequence length being {steps}")
        steps = total_length
    padded, lengths = _pad_packed(sequence.data, sequence.batch_sizes.tolist(), batch_first, padding_value, steps)
    if sequence.unsorted_indices is not None:
        return (padded.index_select(0 if batch_first else 1, sequence.unsorted_indices),
                lengths[sequence.unsorted_indices.cpu()])
    return padded, lengths


def _pad_packed(data: Tensor, sizes: list[int], batch_first: bool, padding_value, steps: int):
    batch = sizes[0] if sizes else 0
    pad_row = data.shape[0]  # index of the padding row appended to data
    rows, start = [], 0
    for t in range(steps):
        size = sizes[t] if t < len(sizes) else 0
        rows.extend(range(start, start + size))
        rows.extend([pad_row] * (batch - size))
        start += size
    padding = full((1, *data.shape[1:]), padding_value, dtype=data.dtype, device=data.device)
    index = tensor(rows, dtype=int64, device=data.device)
    padded = _cat([data, padding], 0).index_select(0, index)
    padded = padded.view(steps, batch, *data.shape[1:])
    lengths = tensor([sum(1 for s in sizes if s > b) for b in range(batch)], dtype=int64)
    return (padded.transpose(0, 1) if batch_first else padded), lengths


def pad_sequence(sequences, batch_first: bool = False, padding_value: float = 0.0,
                 padding_side: str = "right") -> Tensor:
    """Stack sequences of different lengths (``[L_i, *]``) into ``[T, B, *]`` (``[B, T, *]`` with
    ``batch_first``), filling with ``padding_value`` on ``padding_side``; the result has the first's dtype.

    >>> import tilewise as tw
    >>> pad_sequence([tw.tensor([1, 2, 3]), tw.tensor([4])], batch_first=True).tolist()
    [[1, 2, 3], [4, 0, 0]]
    """
    if not isinstance(sequences, Iterable):
        raise RuntimeError(f"pad_sequence: Expected iterable for input sequences, but got arg of type: "
                           f"{type(sequences)}")
    sequences = tuple(sequences)
    if not sequences:
        raise RuntimeError("received an empty list of sequences")
    if padding_side not in ("left", "right"):
        raise RuntimeError(f"Expected padding_side to be one of left or right, but got {padding_side}.")
    first = sequences[0]
    if any(s.ndim == 0 for s in sequences):
        raise RuntimeError("pad_sequence: every sequence needs a time dimension, but got a 0-d tensor")
    longest = max(s.shape[0] for s in sequences)
    trailing = tuple(first.shape[1:])
    padded = [_padded(s.to(first.dtype), longest, trailing, padding_value, padding_side) for s in sequences]
    return _stack(padded, 0 if batch_first else 1)


def _padded(seq: Tensor, longest: int, trailing: tuple, padding_value, side: str) -> Tensor:
    seq = seq.expand(seq.shape[0], *trailing)
    if seq.shape[0] == longest:
        return seq
    padding = full((longest - seq.shape[0], *trailing), padding_value, dtype=seq.dtype, device=seq.device)
    return _cat([seq, padding] if side == "right" else [padding, seq], 0)


def unpad_sequence(padded_sequences: Tensor, lengths: Tensor, batch_first: bool = False) -> list[Tensor]:
    """The sequences of a padded batch, each cut to its length."""
    batch_major = padded_sequences if batch_first else padded_sequences.transpose(0, 1)
    # a new contiguous tensor each, as torch's mask indexing gives
    return [seq[:int(length)].clone(memory_format=contiguous_format)
            for seq, length in zip(batch_major, lengths.tolist(), strict=True)]


def pack_sequence(sequences: list[Tensor], enforce_sorted: bool = True) -> PackedSequence:
    """Pack a list of sequences (``[L_i, *]``), longest first unless ``enforce_sorted=False``."""
    lengths = as_tensor([v.size(0) for v in sequences], dtype=int64)
    return pack_padded_sequence(pad_sequence(sequences), lengths, enforce_sorted=enforce_sorted)


def unpack_sequence(packed_sequences: PackedSequence) -> list[Tensor]:
    """The list of sequences a packed batch holds, in the caller's order."""
    padded, lengths = pad_packed_sequence(packed_sequences, batch_first=True)
    return unpad_sequence(padded, lengths, batch_first=True)

"""TensorBoard's event files without TensorBoard: TFRecord framing, CRC32C, and the few protobuf messages
(``Event``, ``Summary``, ``HistogramProto``, ``TensorProto``...) a summary writer needs, encoded by hand.

[Note: event files] An event file is a sequence of TFRecords: the payload's length (uint64, little-endian),
the masked CRC32C of those 8 bytes, the payload, the masked CRC32C of the payload. Each payload is one
serialized ``tensorflow.Event``; the first says ``file_version: "brain.Event:2"``. Protobuf's wire format is
small enough to write directly: a field is its number and wire type as a varint key, then a varint (ints,
enums), 8 or 4 little-endian bytes (double, float), or a length-prefixed body (strings, bytes, nested
messages, packed repeated numbers). As protobuf's own encoder does, proto3 fields at their default value are
left out, except members of a ``oneof`` (a ``simple_value`` of 0.0 is still a value). The field numbers are
those of tensorflow's ``event.proto``, ``summary.proto``, ``tensor.proto`` and ``tensor_shape.proto``.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable

_CASTAGNOLI = 0x82F63B78  # CRC-32C's polynomial, bit-reversed
_MASK_DELTA = 0xA282EAD8


def _crc_table() -> tuple[int, ...]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ _CASTAGNOLI if crc & 1 else crc >> 1
        table.append(crc)
    return tuple(table)


_TABLE = _crc_table()


def crc32c(data: bytes, crc: int = 0) -> int:
    """CRC-32C (Castagnoli), the checksum TFRecords carry.

    >>> hex(crc32c(b"123456789"))
    '0xe3069283'
    """
    crc ^= 0xFFFFFFFF
    table = _TABLE
    for byte in data:
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc32c(data: bytes) -> int:
    """The rotated, offset CRC that TFRecords store (so a CRC of data holding CRCs is not trivially zero)."""
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def tfrecord(payload: bytes) -> bytes:
    length = struct.pack("<Q", len(payload))
    return (length + struct.pack("<I", masked_crc32c(length)) + payload
            + struct.pack("<I", masked_crc32c(payload)))


# ---------------------------------------------------------------------------- protobuf wire format

_VARINT, _FIXED64, _LENGTH, _FIXED32 = 0, 1, 2, 5


def varint(value: int) -> bytes:
    value &= (1 << 64) - 1  # negative int64s are written as their two's complement, in ten bytes
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _key(field: int, wire: int) -> bytes:
    return varint(field << 3 | wire)


def int_field(field: int, value: int, always: bool = False) -> bytes:
    return _key(field, _VARINT) + varint(int(value)) if value or always else b""


def double_field(field: int, value: float, always: bool = False) -> bytes:
    return _key(field, _FIXED64) + struct.pack("<d", value) if value or always else b""


def float_field(field: int, value: float, always: bool = False) -> bytes:
    return _key(field, _FIXED32) + struct.pack("<f", value) if value or always else b""


def bytes_field(field: int, data: bytes | str, always: bool = False) -> bytes:
    if isinstance(data, str):
        data = data.encode("utf-8")
    return _key(field, _LENGTH) + varint(len(data)) + data if data or always else b""


def message_field(field: int, body: bytes) -> bytes:
    """A nested message: present even when all its fields are defaults (its presence is the information)."""
    return bytes_field(field, body, always=True)


def packed_doubles(field: int, values: Iterable[float]) -> bytes:
    values = list(values)
    return bytes_field(field, struct.pack(f"<{len(values)}d", *values))


# ---------------------------------------------------------------------------- the messages a writer needs

DT_FLOAT, DT_DOUBLE, DT_STRING = 1, 2, 7  # tensorflow's DataType
SESSION_START = 1  # SessionLog.SessionStatus


def event(wall_time: float, step: int = 0, *, file_version: str | None = None, summary: bytes | None = None,
          session_log: bytes | None = None) -> bytes:
    body = double_field(1, wall_time) + int_field(2, step)
    if file_version is not None:
        body += bytes_field(3, file_version, always=True)
    if summary is not None:
        body += message_field(5, summary)
    if session_log is not None:
        body += message_field(7, session_log)
    return body


def session_log(status: int) -> bytes:
    return int_field(1, status)


def summary(*values: bytes) -> bytes:
    return b"".join(message_field(1, value) for value in values)


def summary_value(tag: str, *, simple_value: float | None = None, histo: bytes | None = None,
                  tensor: bytes | None = None, metadata: bytes | None = None) -> bytes:
    body = bytes_field(1, tag)
    if simple_value is not None:
        body += float_field(2, simple_value, always=True)
    if histo is not None:
        body += message_field(5, histo)
    if tensor is not None:
        body += message_field(8, tensor)
    if metadata is not None:
        body += message_field(9, metadata)
    return body


def summary_metadata(plugin_name: str, content: bytes = b"") -> bytes:
    return message_field(1, bytes_field(1, plugin_name) + bytes_field(2, content))


def histogram_proto(minimum: float, maximum: float, num: float, total: float, sum_squares: float,
                    bucket_limit: list[float], bucket: list[float]) -> bytes:
    return (double_field(1, minimum) + double_field(2, maximum) + double_field(3, num) + double_field(4, total)
            + double_field(5, sum_squares) + packed_doubles(6, bucket_limit) + packed_doubles(7, bucket))


def tensor_proto(dtype: int, *, dims: tuple[int, ...] | None = None, float_val: list[float] = (),
                 double_val: list[float] = (), string_val: list[bytes] = ()) -> bytes:
    body = int_field(1, dtype)
    if dims is not None:
        body += message_field(2, b"".join(message_field(2, int_field(1, size)) for size in dims))
    if float_val:
        body += bytes_field(5, struct.pack(f"<{len(float_val)}f", *float_val))
    if double_val:
        body += bytes_field(6, struct.pack(f"<{len(double_val)}d", *double_val))
    body += b"".join(bytes_field(8, s, always=True) for s in string_val)
    return body


__all__ = ["crc32c", "masked_crc32c", "tfrecord", "varint"]

"""Length-prefixed records: 4-byte length (network byte order) then the bytes, repeated.

Shared by the envelope pack format and the batch format, which differ only in their headers.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

_LENGTH = struct.Struct("!I")


def join_records(records: Sequence[bytes]) -> bytes:
    return b"".join(_LENGTH.pack(len(r)) + bytes(r) for r in records)


def split_records(data: bytes | memoryview, offset: int, count: int, what: str, error: type[Exception]) -> list[bytes]:
    """Read ``count`` records from ``data[offset:]``, which must end exactly after the last one.
    ``what`` names a record in error messages ("message", "record"); ``error`` is raised. Each record
    is its own bytes (of a memoryview, the one copy made)."""
    records = []
    for i in range(count):
        if offset + _LENGTH.size > len(data):
            raise error(f"truncated at {what} {i} of {count}")
        (length,) = _LENGTH.unpack_from(data, offset)
        offset += _LENGTH.size
        if offset + length > len(data):
            raise error(f"{what} {i} claims {length} bytes but only {len(data) - offset} follow")
        records.append(bytes(data[offset : offset + length]))  # of bytes: the slice itself, no second copy
        offset += length
    if offset != len(data):
        raise error(f"{len(data) - offset} bytes after its {count} {what}s")
    return records

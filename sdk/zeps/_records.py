"""The record layout shared by the journal (on disk) and DELIVER-BATCH (on the wire).

One layout in one place: the broker sends journal records to version-3 clients byte for byte as it
wrote them, and the client checks the same CRC the journal wrote — so a record is protected from
the broker's disk to the subscriber. All numbers are network byte order::

    offset  size  field
    0       4     length L of everything after this field
    4       4     CRC32C of bytes 8 .. 4+L
    8       8     sequence
    16      8     timestamp, milliseconds since the epoch
    24      1     key length K
    25      K     key (ASCII)
    25+K    …     body
"""

from __future__ import annotations

import struct

import crc32c

HEAD = struct.Struct("!II")  # length, crc
META = struct.Struct("!QQB")  # sequence, timestamp, key length
OVERHEAD = HEAD.size + META.size  # bytes a record adds to its key and body
_RECORD = struct.Struct("!IIQQB")  # HEAD then META, read in one call


class RecordFormatError(ValueError):
    """Bytes that are not a run of whole, intact records (the message says where and why)."""


def encode_record(sequence: int, timestamp_ms: int, raw_key: bytes, body: bytes) -> bytes:
    payload = b"".join((META.pack(sequence, timestamp_ms, len(raw_key)), raw_key, body))
    return HEAD.pack(len(payload) + 4, crc32c.crc32c(payload)) + payload


def unpack_records(data: bytes) -> list[tuple[int, str, bytes, int]]:
    """(sequence, key, body, timestamp) of every record in ``data``, which must hold whole, intact
    records with increasing sequences; RecordFormatError otherwise."""
    out: list[tuple[int, str, bytes, int]] = []
    append, unpack, crc = out.append, _RECORD.unpack_from, crc32c.crc32c
    offset, size, last = 0, len(data), -1
    view = memoryview(data)
    while offset < size:
        if offset + OVERHEAD > size:
            raise RecordFormatError(f"record at byte {offset} is truncated ({size - offset} bytes left)")
        length, checksum, sequence, timestamp, klen = unpack(data, offset)
        end = offset + 4 + length
        if length < 4 + META.size or end > size:
            raise RecordFormatError(f"record at byte {offset} claims {length} bytes; {size - offset - 4} follow")
        if crc(view[offset + 8 : end]) != checksum:
            raise RecordFormatError(f"record at byte {offset} fails its CRC32C")
        body_at = offset + OVERHEAD + klen
        if body_at > end or sequence <= last:
            raise RecordFormatError(f"record at byte {offset} has a bad key length or sequence {sequence}")
        append((sequence, data[offset + OVERHEAD : body_at].decode("latin-1"), data[body_at:end], timestamp))
        last, offset = sequence, end
    return out

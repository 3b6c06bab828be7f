"""The bytes of a batch and of a store object, and the errors every store raises.

Batch format (inline in ZooKeeper or as a store object)::

    offset  size  field
    0       3     magic "ZQB"
    3       1     version, 1
    4       4     record count C, unsigned, network byte order
    8       …     C times: length L (4 bytes) then L bytes of one record

Store object format (what every store keeps, so a torn or corrupt object is detected on read)::

    0       4     magic "ZBS1"
    4       8     payload length, network byte order
    12      4     CRC32C of the payload
    16      …     payload (a batch, as above)

A batch's reference in ZooKeeper is the object's URL with the payload's CRC32C as its fragment
(``s3://bucket/prefix/orders-7.batch#crc32c=1a2b3c4d``): a reader checks that the object it got is
the one the reference was made for, not another valid object stored under the same name later (a
publisher whose commit failed, or someone behind zeps's back). References without the fragment (made
before it existed) are read with the object's own check only.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass

import crc32c

from zeps._framing import join_records, split_records
from zeps.errors import DataLossError, ZepsError

__all__ = [
    "BatchLostError",
    "BatchStoreError",
    "ForeignObjectError",
    "Prefetch",
    "decode_batch",
    "encode_batch",
    "object_header",
    "object_payload",
    "reference",
    "reference_crc",
]

_BATCH = struct.Struct("!3sBI")
_OBJECT = struct.Struct("!4sQI")
_CRC_FRAGMENT = re.compile(r"#crc32c=([0-9a-f]{8})\Z")


class BatchStoreError(ZepsError):
    """A batch could not be stored or read back (the store refused, or could not be reached)."""


class ForeignObjectError(BatchStoreError):
    """A URL that names no object of this store: a reference written by something other than zeps,
    or for another store. Nothing of the store's is read or deleted for it."""


class BatchLostError(BatchStoreError, DataLossError):
    """A stored batch is gone or damaged: missing, torn or failing its CRC32C. Never returned as data."""


def encode_batch(records: Sequence[bytes]) -> bytes:
    return _BATCH.pack(b"ZQB", 1, len(records)) + join_records(records)


def decode_batch(data: bytes | memoryview) -> list[bytes]:
    if len(data) < _BATCH.size:
        raise BatchStoreError(f"batch truncated: {len(data)} bytes")
    magic, version, count = _BATCH.unpack_from(data)
    if magic != b"ZQB" or version != 1:
        raise BatchStoreError(f"not a version-1 batch (magic {magic!r}, version {version})")
    return split_records(data, _BATCH.size, count, "record", _BatchFormatError)


class _BatchFormatError(BatchStoreError):
    def __init__(self, detail: str) -> None:
        super().__init__(f"batch {detail}")


def object_header(payload: bytes) -> bytes:
    """The 16 bytes a store writes before ``payload``."""
    return _OBJECT.pack(b"ZBS1", len(payload), crc32c.crc32c(payload))


def object_payload(raw: bytes | memoryview, where: str, reference_crc: int | None = None) -> memoryview:
    """The payload of a stored object (a view of ``raw``: no copy), checked: BatchLostError naming
    ``where`` if it is torn, foreign or corrupt, or (given the CRC32C its reference names) another
    object than the one the reference was made for."""
    if len(raw) < _OBJECT.size:
        raise BatchLostError(f"batch object {where} is torn: {len(raw)} bytes")
    magic, length, crc = _OBJECT.unpack_from(raw)
    payload = memoryview(raw)[_OBJECT.size :]
    if magic != b"ZBS1" or len(payload) != length:
        raise BatchLostError(f"batch object {where} is torn or foreign (expected {length} bytes, got {len(payload)})")
    if crc32c.crc32c(payload) != crc:
        raise BatchLostError(f"batch object {where} is corrupt: CRC32C mismatch")
    if reference_crc is not None and crc != reference_crc:
        raise BatchLostError(
            f"batch object {where} is not the one its reference names (CRC32C {crc:08x}, the reference's "
            f"{reference_crc:08x}): it was replaced after the batch was published"
        )
    return payload


def reference(url: str, header: bytes) -> str:
    """The reference a batch's ZooKeeper node holds: ``url`` with the CRC32C of ``header``'s object."""
    return f"{url}#crc32c={_OBJECT.unpack_from(header)[2]:08x}"


def reference_crc(ref: str) -> int | None:
    """The CRC32C a reference names; None for a reference without one (or with any other fragment)."""
    found = _CRC_FRAGMENT.search(ref)
    return int(found.group(1), 16) if found else None


@dataclass(frozen=True)
class Prefetch:
    """An object a store began to read before its reference was known (``BatchStore.prefetch``): the
    URL it read, and the raw object to come. Used only if the reference names that URL and the object
    passes every check, the reference's CRC32C included; otherwise the store reads it again."""

    url: str
    raw: Future[bytes | memoryview]

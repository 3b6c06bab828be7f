"""A tiered object's bytes: a run of records as the journal stores them, behind their index.

    index      4 bytes per record, big-endian: where each record starts in ``records``
    records    the records ``first .. last`` (:mod:`zeps._records`), without producer marks

The store wraps this payload in its object format (length and CRC32C) and the manifest entry's
reference names that CRC32C, so a read checks the index and the records in one pass and lays them out
without walking them record by record (:func:`zeps._records.indexed_run`: the check a DELIVER-RUN
gets, in numpy for long runs).
"""

from __future__ import annotations

import sys
from array import array

from zeps._records import RecordFormatError, indexed_run
from zeps.batchstore import BatchLostError
from zeps.journal import Chunk
from zeps.tiering.manifest import TierEntry

__all__ = ["decode_object", "encode_object"]


def encode_object(records: bytes, offsets: array[int]) -> bytes:
    """The payload of ``records`` whose starts are ``offsets`` (and where the last ends)."""
    index = array("I", offsets[:-1])
    if sys.byteorder == "little":
        index.byteswap()
    return index.tobytes() + records


def decode_object(entry: TierEntry, payload: bytes, crc: int) -> Chunk:
    """The records of ``entry``'s object, checked: ``crc`` (the CRC32C its reference names) over all
    of it, the index against the records, and the run exactly ``entry.first .. entry.last``;
    BatchLostError (a DataLossError) naming the object otherwise."""
    count = entry.last - entry.first + 1
    try:
        run = indexed_run(payload[4 * count :], payload[: 4 * count], crc)
    except RecordFormatError as exc:
        raise BatchLostError(f"tiered object {entry.key}: {exc}") from None
    if len(run) != count or run.sequence(0) != entry.first or run.sequence(-1) != entry.last:
        raise BatchLostError(f"tiered object {entry.key} does not hold records {entry.first}..{entry.last}")
    return Chunk(entry.first, run.data, run.offsets)

"""A tiered object's bytes: a run of records as the journal stores them, behind their index.

    index      4 bytes per record, big-endian: where each record starts in ``records``
    records    the records ``first .. last`` (:mod:`zeps._records`), without producer marks; of a
               compacted run, the ones compaction kept (``TierEntry.records``: sequences with gaps,
               in order; none at all when it kept none)

The store wraps this payload in its object format (length and CRC32C) and the manifest entry's
reference names that CRC32C, so a read checks the index and the records in one pass and lays them out
without walking them record by record (:func:`zeps._records.indexed_run`: the check a DELIVER-RUN
gets, in numpy for long runs).
"""

from __future__ import annotations

import sys
from array import array

import crc32c

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
    of it, the index against the records, and the run exactly ``entry.first .. entry.last`` (of a
    compacted run: ``entry.records`` records, in order, within it; the chunk carries their
    sequences); BatchLostError (a DataLossError) naming the object otherwise."""
    count = entry.count
    if count == 0:  # compaction kept none of the run's records
        if payload or crc32c.crc32c(b"") != crc:
            raise BatchLostError(f"tiered object {entry.key} should hold no record, it holds {len(payload)} bytes")
        return Chunk(entry.first, b"", array("I", [0]), sequences=array("Q"))
    try:
        run = indexed_run(payload[4 * count :], payload[: 4 * count], crc)
    except RecordFormatError as exc:
        raise BatchLostError(f"tiered object {entry.key}: {exc}") from None
    if len(run) != count or run.sequence(0) < entry.first or run.sequence(-1) > entry.last:
        raise BatchLostError(f"tiered object {entry.key} does not hold {count} records of {entry.first}..{entry.last}")
    if entry.records is None:
        if run.sequence(0) != entry.first:
            raise BatchLostError(f"tiered object {entry.key} does not hold records {entry.first}..{entry.last}")
        return Chunk(entry.first, run.data, run.offsets)
    sequences = array("Q", (run.sequence(i) for i in range(count)))
    return Chunk(sequences[0], run.data, run.offsets, sequences=sequences)

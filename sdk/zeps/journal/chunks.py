"""What reads hand out: records, and chunks of them as stored.

Reading hands out chunks (:class:`Chunk`): a run of consecutive records as the bytes on disk plus their
boundaries and keys, so the broker can route and send them without taking each record apart. A tail
cache keeps the most recent chunks in memory for live delivery.

A :class:`ReplicaSlice` is the same for a follower: a leader's segment bytes as they are, to copy.
"""

from __future__ import annotations

import bisect
import itertools
from array import array
from dataclasses import dataclass

from zeps._records import HEAD as _HEAD
from zeps._records import META as _META
from zeps._records import OVERHEAD

__all__ = ["Chunk", "Record", "ReplicaSlice", "fit_chunk", "join_chunks"]


@dataclass(frozen=True, slots=True)
class Record:
    sequence: int
    timestamp_ms: int
    key: str
    body: bytes

    @property
    def size(self) -> int:
        return OVERHEAD + len(self.key) + len(self.body)


class Chunk:
    """Records as stored: ``data[offsets[i]:offsets[i + 1]]`` is record ``i``, with key ``keys[i]``
    (keys are read from the data when first asked for: a replay to a subscription that takes every key
    never needs them) and sequence :meth:`sequence` ``(i)``: ``first + i``, or ``sequences[i]`` for a
    chunk read from a compacted segment, whose records have gaps between them."""

    __slots__ = ("_keys", "data", "first", "offsets", "sequences")

    def __init__(
        self,
        first: int,
        data: bytes,
        offsets: array[int],
        keys: list[str] | None = None,
        sequences: array[int] | None = None,
    ) -> None:
        self.first, self.data, self.offsets, self._keys, self.sequences = first, data, offsets, keys, sequences

    @property
    def keys(self) -> list[str]:
        if self._keys is None:
            data, at = self.data, OVERHEAD - 1
            self._keys = [data[o + at + 1 : o + at + 1 + data[o + at]].decode("ascii", "replace")
                          for o in self.offsets[:-1]]  # fmt: skip
        return self._keys

    @property
    def last(self) -> int:
        return self.first + len(self.offsets) - 2 if self.sequences is None else self.sequences[-1]

    def sequence(self, i: int) -> int:
        """The sequence of record ``i``."""
        return self.first + i if self.sequences is None else self.sequences[i]

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def record(self, i: int) -> Record:
        start, end = self.offsets[i], self.offsets[i + 1]
        seq, ts, klen = _META.unpack_from(self.data, start + _HEAD.size)
        return Record(seq, ts, self.keys[i], self.data[start + OVERHEAD + klen : end])

    def records(self) -> list[Record]:
        return [self.record(i) for i in range(len(self))]

    def part(self, begin: int, end: int) -> Chunk:
        """Records ``begin .. end - 1`` (indexes) as a chunk of their own."""
        if begin == 0 and end == len(self):
            return self
        base = self.offsets[begin]
        keys = None if self._keys is None else self._keys[begin:end]
        sequences = None if self.sequences is None else self.sequences[begin:end]
        return Chunk(self.sequence(begin), self.data[base : self.offsets[end]],
                     array("I", [o - base for o in self.offsets[begin : end + 1]]), keys, sequences)  # fmt: skip


@dataclass(frozen=True, slots=True)
class ReplicaSlice:
    """What a leader sends a follower (:meth:`Journal.replica_read`): ``data`` goes at ``offset`` of
    segment ``base``; ``next_base`` (not 0): that segment ends there, the next starts at this base;
    ``reset``: the follower's position is not one the leader can continue: start over, empty, at ``base``;
    ``gapped``: the segment was compacted (on either side), so its bytes are not the follower's: ``data``
    holds whole records after the follower's last sequence, with gaps, for the end of its copy
    (``offset``), and ``next_base`` may lie beyond its next sequence (the segment's last records are gone)."""

    base: int
    offset: int
    data: bytes
    next_base: int = 0
    reset: bool = False
    #: where each record of ``data`` starts in the segment (4-byte offsets, network order: the leader's
    #: .off entries), and each producer mark as (start, end) pairs likewise: the follower writes and
    #: indexes the bytes without walking them record by record
    starts: bytes = b""
    marks: bytes = b""
    gapped: bool = False


def fit_chunk(chunk: Chunk, begin: int, stop: int, max_bytes: int, max_records: int, *, force: bool) -> int:
    """How far from ``begin`` (towards ``stop``) the chunk fits the limits; at least one record if
    ``force``."""
    stop = min(stop, begin + max(max_records, 0))
    limit = chunk.offsets[begin] + max_bytes
    fits = bisect.bisect_right(chunk.offsets, limit, begin, stop + 1) - 1
    return max(fits, begin + 1) if force and stop > begin else max(fits, begin)


def join_chunks(parts: list[Chunk]) -> Chunk:
    offsets, base = array("I", [0]), 0
    for part in parts:
        offsets.extend(o + base for o in part.offsets[1:])
        base += len(part.data)
    sequences = None
    gapped = any(p.sequences is not None for p in parts)
    if gapped or any(b.first != a.last + 1 for a, b in itertools.pairwise(parts)):
        sequences = array("Q", (p.sequence(i) for p in parts for i in range(len(p))))
    return Chunk(parts[0].first, b"".join(p.data for p in parts), offsets, [k for p in parts for k in p.keys],
                 sequences)  # fmt: skip

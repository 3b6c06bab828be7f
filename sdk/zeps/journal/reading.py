"""Reads of durable records, as chunks from the tail cache or from disk.

Reading hands out chunks (:class:`Chunk`): a run of consecutive records as the bytes on disk plus their
boundaries and keys, so the broker can route and send them without taking each record apart. A tail
cache keeps the most recent chunks in memory for live delivery.

Readers only see records up to :attr:`Journal.durable` — the synced tail (or the written tail with
``never``) — so nobody is shown a record a machine crash could take back.
"""

from __future__ import annotations

import bisect
import logging
from array import array
from operator import attrgetter, itemgetter

import crc32c

from zeps._records import OVERHEAD, RECORD
from zeps.journal.appending import Appending
from zeps.journal.chunks import Chunk, Record, fit_chunk, join_chunks
from zeps.journal.config import (
    JournalError,
)
from zeps.journal.segments import (
    OFFSET,
    Segment,
    cut_marks,
)

__all__ = ["Reading"]

log = logging.getLogger(__name__)


class Reading(Appending):
    """Reads of durable records: from the tail cache, or from disk (checked as first read)."""

    def read(self, start: int, *, max_records: int = 1000, max_bytes: int = 1 << 20) -> list[Record]:
        """Durable records from sequence ``start`` on (fewer if limits apply; [] at the tail)."""
        chunk = self.read_chunk(start, max_bytes=max_bytes, max_records=max_records)
        return chunk.records() if chunk else []

    def read_chunk(
        self, start: int, *, max_bytes: int = 1 << 20, max_records: int = 1 << 30, end: int | None = None
    ) -> Chunk | None:
        """Durable records from sequence ``start`` (or the oldest retained, if that is later) up to
        ``end`` (default: the durable tail), within ``max_bytes`` — but at least one record; None when
        there is nothing to read."""
        start = max(start, self.first_sequence)
        end = self.durable if end is None else min(end, self.durable)
        if start > end:
            return None
        cache = self._cache
        if cache and cache[0].first <= start <= cache[-1].last:
            i = bisect.bisect_right(cache, start, key=lambda c: c.first) - 1
            parts: list[Chunk] = []
            size = count = 0
            while i < len(cache) and size < max_bytes and count < max_records:
                chunk = cache[i]
                begin = max(start, chunk.first) - chunk.first
                stop = fit_chunk(chunk, begin, min(end, chunk.last) - chunk.first + 1, max_bytes - size,
                                 max_records - count, force=not parts)  # fmt: skip
                if stop <= begin:
                    break
                parts.append(chunk.part(begin, stop))
                size += chunk.offsets[stop] - chunk.offsets[begin]
                count += stop - begin
                if stop < len(chunk) or chunk.last >= end:
                    break
                i += 1
            return parts[0] if len(parts) == 1 else join_chunks(parts)
        return self._read_disk(start, end, max_records, max_bytes)

    def _read_disk(self, start: int, end: int, max_records: int, max_bytes: int) -> Chunk | None:
        """Records ``start ..`` (at most to ``end`` and to the end of its segment) from disk: where
        they start comes from the segment's .off file, so this costs two preads and no Python work
        per record beyond the slice of offsets. A sequence lost with a damaged closed segment reads
        as the next segment's first (like a gap retention left), and so does one compacted away;
        None if nothing of ``start .. end`` is left."""
        while start <= end:
            found = self._read_segment(start, end, max_records, max_bytes)
            if not isinstance(found, int):
                return found
            start = found  # a compacted segment kept nothing before this sequence
        return None

    def _read_segment(self, start: int, end: int, max_records: int, max_bytes: int) -> Chunk | int | None:
        """:meth:`_read_disk` within the segment holding ``start``; the sequence to go on from if a
        compacted segment kept none of the records asked for."""
        i = bisect.bisect_right(self._segments, start, key=attrgetter("base")) - 1
        seg = self._segments[max(i, 0)]
        while start > seg.last_seq and i + 1 < len(self._segments):
            i += 1
            seg = self._segments[i]
            start = seg.base
        if start > min(end, seg.last_seq):
            return None  # gone with the damaged part of a closed segment
        last = min(end, seg.last_seq, start + max(max_records, 1) - 1)
        k = start - seg.base
        starts = array("I")
        raw = self._readers.pread(seg.offsets_path, (last - start + 2) * OFFSET, k * OFFSET)
        starts.frombytes(raw[: len(raw) - len(raw) % OFFSET])
        if len(starts) == last - start + 1:
            starts.append(seg.size)  # the segment's last record ends where the segment does
        if len(starts) < last - start + 2:
            raise JournalError(f"journal {self.name}: {seg.offsets_path.name} lacks sequences {start}..{last}")
        sequences = None
        if seg.gapped:  # a sequence compacted away starts where the next kept one does
            starts, sequences = _kept(starts, start)
            if len(sequences) == 0:  # (not ``not sequences``: compiled, that tests for None only)
                return last + 1
        count = max(bisect.bisect_right(starts, starts[0] + max_bytes) - 1, 1)
        base = starts[0]
        data = self._readers.pread(seg.path, starts[count] - base, base)
        if seg.verified_to < starts[count]:  # a sealed segment: its records are checked as first read
            good = self._verify(seg, start, data, starts, count=count, sequences=sequences)
            if good == 0:  # the first record asked for is damaged: the segment ends before it
                return self._read_disk(start, end, max_records, max_bytes)
            count = good
        if count + 1 < len(starts):
            del starts[count + 1 :]
            if sequences is not None:
                del sequences[count:]
        first_mark = bisect.bisect_left(seg.marks, base, key=itemgetter(0))
        if first_mark < len(seg.marks) and seg.marks[first_mark][0] < starts[count]:
            data, starts = cut_marks(data, base, starts, seg.marks[first_mark:])
        elif base:
            starts = array("I", [o - base for o in starts])
        return Chunk(start if sequences is None else sequences[0], data, starts, sequences=sequences)

    def _verify(
        self, seg: Segment, start: int, data: bytes, starts: array[int], *, count: int, sequences: array[int] | None
    ) -> int:
        """Check the CRCs of records ``start ..`` of a closed segment, read as ``data`` (from offset
        ``starts[0]``; ``starts[i]`` is record ``start + i``'s offset, or ``sequences[i]``'s in a
        compacted one): how many of the ``count`` are intact. At a damaged one the segment is cut in
        memory (reads skip to the next segment, as after a damaged segment at open) and an error is
        logged; the file is left for inspection."""
        base, view, unpack, crc = starts[0], memoryview(data), RECORD.unpack_from, crc32c.crc32c
        for i in range(count):
            expected = start + i if sequences is None else sequences[i]
            at = starts[i] - base
            intact = at + OVERHEAD <= len(data)
            if intact:
                length, checksum, sequence, _, _ = unpack(data, at)
                end = at + 4 + length
                intact = end <= len(data) and sequence == expected and crc(view[at + 8 : end]) == checksum
            if not intact:
                log.error("journal %s: segment %s: record %d (offset %d) is damaged; sequences %d..%d of this segment "
                          "are not served", self.name, seg.path.name, expected, starts[i], expected,
                          seg.last_seq)  # fmt: skip
                self.damaged_records += seg.last_seq - expected + 1
                seg.last_seq, seg.size = expected - 1, starts[i]
                del seg.index[bisect.bisect_left(seg.index, expected, key=itemgetter(0)) :]
                return i
        if base <= seg.verified_to:
            seg.verified_to = max(seg.verified_to, starts[count])
        return count

    def seek_time(self, timestamp_ms: int) -> int:
        """The sequence of the first retained record at or after ``timestamp_ms`` (next if none)."""
        for seg in self._segments:
            if seg.last_seq < seg.base or seg.last_ts < timestamp_ms:
                continue
            j = max(bisect.bisect_left(seg.index, timestamp_ms, key=itemgetter(1)) - 1, 0)
            seq = seg.index[j][0] if seg.index else seg.base
            while seq <= seg.last_seq:
                chunk = self._read_disk(seq, seg.last_seq, 1000, 1 << 20)
                if chunk is None:  # the rest of the segment was damaged
                    break
                batch = chunk.records()
                for record in batch:
                    if record.timestamp_ms >= timestamp_ms:
                        return record.sequence
                seq = batch[-1].sequence + 1
        return self._next


def _kept(starts: array[int], start: int) -> tuple[array[int], array[int]]:
    """A compacted segment's .off entries for sequences ``start ..`` (and where the last ends) as the
    kept records' starts (and where the last ends) and their sequences: a sequence compacted away has
    the entry of the next kept one."""
    kept, sequences = array("I"), array("Q")
    for j in range(len(starts) - 1):
        if starts[j] < starts[j + 1]:
            kept.append(starts[j])
            sequences.append(start + j)
    kept.append(starts[-1])
    return kept, sequences

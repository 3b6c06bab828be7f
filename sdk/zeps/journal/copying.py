"""Replication at the journal: a follower copies the leader's segment files byte for byte.

The leader reads slices of its durable segment bytes (:meth:`Copying.replica_read`), cut at a record
or a whole group; the follower writes them at the same offsets (:meth:`Copying.replica_write`),
indexes them from the leader's offsets, rolls where the leader rolled, and truncates its own tail
where the epochs say it diverged (:meth:`Copying.truncate_after`).

A compacted stream's replicas each compact their own closed, committed segments, so a closed segment's
bytes differ from one replica to the next. A follower only ever copies the leader's active segment in
step; one that is behind (restarted, new, lagging) and reaches a segment the leader compacted copies it
*by sequence*: the leader sends the records after the follower's last sequence, gaps and all, for the
end of the follower's own copy, and says where the segment ends (a ``gapped`` slice).
"""

from __future__ import annotations

import bisect
import logging
import os
import struct
import sys
import time
from array import array
from operator import attrgetter, itemgetter

import crc32c

from zeps._records import OVERHEAD, RECORD
from zeps.journal._files import fsync_path
from zeps.journal.chunks import ReplicaSlice
from zeps.journal.config import (
    JournalError,
    JournalWriteError,
)
from zeps.journal.producers import MARK_TIMESTAMP, SNAPSHOT, Producer, decode_mark
from zeps.journal.reading import Reading
from zeps.journal.segments import (
    MARK_SPAN,
    OFFSET,
    IndexFile,
    Segment,
    walk_segment,
)

__all__ = ["Copying"]

log = logging.getLogger(__name__)


class Copying(Reading):
    """A follower's copy of the leader's segments, and the leader's side of it."""

    def replica_position(self) -> tuple[int, int, int]:
        """Where a follower's copy ends: (its active segment's base, that segment's size, last sequence)."""
        seg = self._segments[-1]
        return seg.base, seg.size, self.written

    def replica_has_more(self, base: int, offset: int, last: int) -> bool:
        """Whether a follower at ``offset`` of segment ``base`` after sequence ``last`` has anything to
        fetch (cheap: no reads)."""
        active = self._segments[-1]
        if base > active.base and self.config.compacts:  # its segment starts inside our active one
            return last < self.durable  # (cut where a compacted segment ends): counted in records
        if base != active.base:
            return True
        if active.gapped:  # its copy's offsets are its own: what it lacks is counted in records
            return last < self.durable
        return offset < self._durable_size(active)

    def _durable_size(self, seg: Segment) -> int:
        if seg is not self._segments[-1] or self.config.fsync == "never":
            return seg.size
        return self._synced_size

    def replica_read(self, base: int, offset: int, last: int, max_bytes: int = 1 << 20) -> ReplicaSlice:
        """The leader's durable bytes for a follower whose copy ends at ``offset`` of segment ``base``
        after sequence ``last``: whole records and producer marks (never part of a group), CRC-checked.
        A position this journal cannot continue (the segment is gone to retention, or the follower holds
        bytes that are not ours) answers ``reset``: start over from our oldest segment."""
        i = bisect.bisect_left(self._segments, base, key=attrgetter("base"))
        if i == len(self._segments) or self._segments[i].base != base:
            holding = self._holding(last + 1)
            if self.config.compacts and holding is not None:  # its segments were cut where a compacted one ends
                return self._read_by_sequence(holding, base, offset, last, max_bytes)
            return self._reset_slice(f"no segment {base} here")
        seg = self._segments[i]
        durable = self._durable_size(seg)
        closed = seg is not self._segments[-1]
        if seg.gapped:
            return self._read_by_sequence(i, base, offset, last, max_bytes)
        if offset > durable or not self._at_boundary(seg, offset, last):
            if self.config.compacts and seg.base - 1 <= last <= seg.last_seq:  # its copy was compacted
                return self._read_by_sequence(i, base, offset, last, max_bytes)
            return self._reset_slice(
                f"offset {offset} after {last} in segment {base}: durable to {durable}, "
                f"holding {seg.base}..{seg.last_seq}"
            )
        if offset == durable:
            return ReplicaSlice(base, offset, b"", self._segments[i + 1].base if closed else 0)
        limit = min(durable, offset + max(max_bytes, 1))
        last_durable = self._synced if seg is self._segments[-1] and self.config.fsync != "never" else seg.last_seq
        cut = None if limit == durable else self._replica_cut(seg, offset, last, last_durable, limit)
        if cut is not None:  # a boundary from the index and the marks: no record is read twice
            good, count = cut
            data = self._readers.pread(seg.path, good, offset)
        while cut is None:
            data = self._readers.pread(seg.path, limit - offset, offset)
            if limit == durable:  # the durable end is where an append ended: whole entries, whole groups
                good = len(data)
                count = last_durable - last
                break
            walked, _, good = walk_segment(data, last + 1)  # where the last whole entry (and group) ends
            count = len(walked)
            if good:
                break
            limit = min(durable, offset + 2 * (limit - offset))  # a group larger than max_bytes goes whole
        data = data[:good]
        starts = array("I")
        if count > 0:  # the records' offsets, as the .off file holds them
            starts.frombytes(self._readers.pread(seg.offsets_path, count * OFFSET, (last + 1 - seg.base) * OFFSET))
        if sys.byteorder == "little":
            starts.byteswap()
        first_mark = bisect.bisect_left(seg.marks, offset, key=itemgetter(0))
        marks = [m for m in seg.marks[first_mark:] if m[0] < offset + good]
        ends = closed and offset + good == durable
        return ReplicaSlice(base, offset, data, self._segments[i + 1].base if ends else 0,
                            starts=starts.tobytes(), marks=b"".join(MARK_SPAN.pack(*m) for m in marks))  # fmt: skip

    def _holding(self, sequence: int) -> int | None:
        """The index of the segment that holds (or, the active one, will hold) ``sequence``."""
        i = bisect.bisect_right(self._segments, sequence, key=attrgetter("base")) - 1
        if i < 0 or (sequence > self._segments[i].last_seq and i < len(self._segments) - 1):
            return None
        return i

    def _read_by_sequence(self, i: int, base: int, offset: int, last: int, max_bytes: int) -> ReplicaSlice:
        """Segment ``i``'s entries after sequence ``last`` for a follower whose copy ends at ``offset``
        of its segment ``base``, laid out its own way (one side compacted it): whole entries, in the
        follower's offsets, as a ``gapped`` slice. A follower at the segment's start gets it from its
        first byte (``offset`` 0: the snapshot mark included); else from the end of record ``last``
        (the next one's start in a compacted segment, whose only mark is that snapshot)."""
        seg = self._segments[i]
        closed = seg is not self._segments[-1]
        next_base = self._segments[i + 1].base if closed else 0
        durable = self._durable_size(seg)
        last_durable = seg.last_seq if closed else self.durable
        if not seg.base - 1 <= last <= seg.last_seq:
            return self._reset_slice(f"sequence {last} is not in segment {seg.base}..{seg.last_seq}")
        if last >= last_durable:
            start = durable
        elif last < seg.base:
            start = 0 if offset == 0 else self._record_start(seg, seg.base)
        elif seg.gapped:
            start = self._record_start(seg, last + 1)
        else:
            start = self._record_end(seg, last)
        if start >= durable:  # the follower holds every record of it: on to the next, if it is closed
            return ReplicaSlice(base, offset, b"", next_base, gapped=True)
        limit = min(durable, start + max(max_bytes, 1))
        while True:
            data = self._readers.pread(seg.path, limit - start, start)
            walked, marks, good = walk_segment(data, last + 1, gaps=True, below=seg.last_seq + 1)
            if good or limit == durable:
                break
            limit = min(durable, start + 2 * (limit - start))  # a record larger than max_bytes goes whole
        if not good:
            raise JournalError(f"journal {self.name}: segment {seg.base} holds no intact entry at {start}")
        starts = array("I", (offset + s for s in walked))
        if sys.byteorder == "little":
            starts.byteswap()
        spans = b"".join(MARK_SPAN.pack(offset + a, offset + b) for a, b, _, _ in marks)
        ends = closed and start + good == durable
        return ReplicaSlice(base, offset, data[:good], next_base if ends else 0, starts=starts.tobytes(),
                            marks=spans, gapped=True)  # fmt: skip

    def _replica_cut(self, seg: Segment, offset: int, last: int, last_durable: int, limit: int
                     ) -> tuple[int, int] | None:  # fmt: skip
        """Where a slice from ``offset`` (after record ``last``) ends, at or before ``limit``, as
        (bytes, records), found in the segment's index and marks without reading the records: the
        start of the last record or producer mark at or before ``limit``, never inside a group (a mark
        and the records it covers). A slice that begins with a group reaching ``limit`` holds that
        group whole. None if it would hold nothing."""
        starts = IndexFile(self._readers, seg.offsets_path, seg.base, last + 1, last_durable)
        marks = seg.marks
        group_end = offset  # the end of the group the slice begins with, if it does
        first = bisect.bisect_left(marks, offset, key=itemgetter(0))
        if first < len(marks) and marks[first][0] == offset:
            follows = self._group_size(seg, marks[first])
            group_end = self._record_end(seg, last + follows) if follows else marks[first][1]
            if group_end >= limit:
                return group_end - offset, follows
        following = starts.at_most(limit)  # records after ``last`` that start at or before limit
        cut = starts[following - 1] if following else offset
        before = bisect.bisect_right(marks, limit, key=itemgetter(0))  # marks that start at or before limit
        if before and marks[before - 1][0] > offset:  # a mark begins its group: everything before it is whole
            mark = marks[before - 1][0]
            cut = mark if mark > cut or self._in_group(seg, marks[before - 1], cut, starts) else cut
        cut = max(cut, group_end)
        if cut <= offset:
            return None
        return cut - offset, starts.below(cut)

    def _in_group(self, seg: Segment, mark: tuple[int, int], cut: int, starts: IndexFile) -> bool:
        """Whether a slice cut at ``cut`` (a record's start after ``mark``) would end inside the mark's group."""
        covered = starts.below(cut) - starts.below(mark[1])  # its records before cut
        return covered < self._group_size(seg, mark)

    def _group_size(self, seg: Segment, mark: tuple[int, int]) -> int:
        """How many records follow the producer mark at ``mark`` (start, end) in its group."""
        start, end = mark
        entry = self._readers.pread(seg.path, end - start, start)
        return decode_mark(entry[OVERHEAD:])[1]

    def _reset_slice(self, why: str = "") -> ReplicaSlice:
        log.info("journal %s: a follower's copy cannot go on here (%s): it starts over", self.name, why)
        return ReplicaSlice(self._segments[0].base, 0, b"", reset=True)

    def _at_boundary(self, seg: Segment, offset: int, last: int) -> bool:
        """Whether ``offset`` of ``seg`` is where an entry ends, after record ``last`` and before the next."""
        if last > seg.last_seq or last < seg.base - 1:
            return False
        end = self._record_end(seg, last) if last >= seg.base else 0
        if offset == end:
            return True
        following = self._record_start(seg, last + 1) if last < seg.last_seq else seg.size
        return end < offset <= following and any(e == offset for _, e in seg.marks)

    def _record_start(self, seg: Segment, sequence: int) -> int:
        raw = self._readers.pread(seg.offsets_path, OFFSET, (sequence - seg.base) * OFFSET)
        if len(raw) < OFFSET:
            raise JournalError(f"journal {self.name}: {seg.offsets_path.name} lacks sequence {sequence}")
        return array("I", raw)[0]

    def _record_end(self, seg: Segment, sequence: int) -> int:
        start = self._record_start(seg, sequence)
        (length,) = struct.unpack("!I", self._readers.pread(seg.path, 4, start))
        return start + 4 + int(length)

    def replica_write(self, base: int, offset: int, data: bytes, *, starts: bytes | None = None,
                      marks: bytes = b"", gapped: bool = False) -> int:  # fmt: skip
        """A follower appends bytes the leader sent for ``offset`` of segment ``base`` (its position):
        whole entries; returns the last sequence written. With the leader's ``starts`` and ``marks``
        (:class:`ReplicaSlice`; the frame's CRC covered them) the records are not walked one by one:
        their count, first and last sequence and the end of the last entry are checked, each mark
        decoded. Without, they are checked as recovery checks them. ``gapped``: records of a compacted
        segment, whose sequences only increase (each compacted away gets the next kept one's offset).
        Raises JournalError if they do not continue this copy (the follower then asks where to go on)."""
        seg = self._segments[-1]
        if (seg.base, seg.size) != (base, offset):
            raise JournalError(f"journal {self.name}: replica bytes for segment {base} at {offset}, but this "
                               f"copy ends at {seg.size} of segment {seg.base}")  # fmt: skip
        if gapped:
            if starts is None:
                raise JournalError(f"journal {self.name}: compacted replica bytes come with their index")
            absolute, decoded = self._indexed(offset, data, starts, marks, gapped=True)
            dense = self._dense(data, offset, absolute)
            if len(dense) != len(absolute):
                seg.gapped = True
            return self._copy(seg, offset, data, dense, decoded)
        if starts is None:
            walked, decoded, good = walk_segment(data, self._next)
            if good != len(data):
                raise JournalError(f"journal {self.name}: replica bytes from the leader are damaged at {offset + good}")
            absolute = array("I", (offset + s for s in walked))
        else:
            absolute, decoded = self._indexed(offset, data, starts, marks)
        return self._copy(seg, offset, data, absolute, decoded)

    def _indexed(self, offset: int, data: bytes, raw_starts: bytes, raw_marks: bytes, *, gapped: bool = False
                 ) -> tuple[array[int], list[tuple[int, int, int, dict[str, Producer]]]]:  # fmt: skip
        """The record starts (segment offsets) and decoded marks (relative to ``data``) of a leader's
        indexed slice, after the checks that need no walk (JournalError naming what is wrong); ``gapped``:
        each record's sequence is checked to follow the one before."""
        starts = array("I")
        starts.frombytes(raw_starts[: len(raw_starts) - len(raw_starts) % OFFSET])
        if sys.byteorder == "little":
            starts.byteswap()
        spans = [(a - offset, b - offset) for a, b in MARK_SPAN.iter_unpack(raw_marks[: len(raw_marks) // 8 * 8])]

        def bad(why: str) -> JournalError:
            return JournalError(f"journal {self.name}: replica bytes from the leader at {offset}: {why}")

        if not starts and not spans:
            if data:
                raise bad("bytes without an index")
            return starts, []
        first_entry = min(starts[0] - offset if starts else len(data), spans[0][0] if spans else len(data))
        if first_entry != 0:
            raise bad("the index does not start where the bytes do")
        if starts and gapped:
            after = self._next - 1
            for start in starts:
                if not 0 <= start - offset <= len(data) - OVERHEAD:
                    raise bad(f"a record start {start} lies outside the bytes")
                length, _, sequence, _, _ = RECORD.unpack_from(data, start - offset)
                if sequence <= after:
                    raise bad(f"record {sequence} where one after {after} was due")
                after = sequence
        elif starts:
            first = RECORD.unpack_from(data, starts[0] - offset)[2]
            length, _, last, _, _ = RECORD.unpack_from(data, starts[-1] - offset)
            if (first, last) != (self._next, self._next + len(starts) - 1):
                raise bad(f"records {first}..{last} where {self._next}..{self._next + len(starts) - 1} were due")
        record_end = starts[-1] - offset + 4 + length if starts else 0
        end = max(record_end, spans[-1][1] if spans else 0)
        if end != len(data):
            raise bad(f"the last entry ends at {end}, the bytes at {len(data)}")
        decoded = []
        for a, b in spans:
            mark = data[a:b]
            length, checksum, _, timestamp, klen = RECORD.unpack_from(mark)
            if (timestamp != MARK_TIMESTAMP or klen or 4 + length != len(mark)
                    or crc32c.crc32c(mark[8:]) != checksum):  # fmt: skip
                raise bad(f"the producer mark at {offset + a} is damaged")
            try:
                kind, _, producers = decode_mark(mark[OVERHEAD:])
            except ValueError as exc:
                raise bad(f"the producer mark at {offset + a} does not decode: {exc}") from None
            decoded.append((a, b, kind, producers))
        return starts, decoded

    def _dense(self, data: bytes, offset: int, starts: array[int]) -> array[int]:
        """A gapped slice's .off entries from this copy's next sequence on: each kept record's start,
        and for each sequence compacted away before it, that same start."""
        dense, expect = array("I"), self._next
        for start in starts:
            sequence = RECORD.unpack_from(data, start - offset)[2]
            dense.extend([start] * (sequence + 1 - expect))
            expect = sequence + 1
        return dense

    def _copy(self, seg: Segment, offset: int, data: bytes, starts: array[int],
              marks: list[tuple[int, int, int, dict[str, Producer]]]) -> int:  # fmt: skip
        """Write a follower's checked bytes (``starts``: its records, as segment offsets)."""
        if not data:
            return self.written
        save = self._savepoint(None)
        try:
            self._flush(self._fd, memoryview(data))
            self._flush(self._off_fd, memoryview(starts.tobytes()))
        except OSError as exc:
            self._rollback(save, exc)
            raise JournalWriteError(self.name, exc) from None
        # the sparse index: the first record every interval bytes, found by bisection (no walk)
        index: list[tuple[int, int, int]] = []
        interval, at, count = self.config.index_interval_bytes, 0, len(starts)
        anchor = starts[0] - interval if count and not seg.index else offset - self._since_index
        while (at := bisect.bisect_left(starts, anchor + interval, at)) < count:
            _, _, sequence, timestamp, _ = RECORD.unpack_from(data, starts[at] - offset)
            index.append((sequence, timestamp, starts[at]))
            anchor, at = starts[at], at + 1
        since = offset + len(data) - anchor
        if starts:
            _, _, sequence, timestamp, _ = RECORD.unpack_from(data, starts[-1] - offset)
            self._next, self._last_ts = sequence + 1, timestamp
        for start, end, kind, producers in marks:
            self.producers.apply(kind, producers)
            if kind == SNAPSHOT:
                self._journaled.clear()
            self._journaled.update(producers)
            seg.marks.append((offset + start, offset + end))
            self._marks_unsynced = True
        self._index(seg, index, self._next - 1, self._last_ts, offset + len(data))
        seg.size = offset + len(data)  # trailing marks count too
        self._since_index = since
        # no tail cache: a follower serves no reader (elected, it reads what it needs from disk)
        if self._unsynced_since is None:
            self._unsynced_since = time.monotonic()
        if self.config.fsync == "always":
            self.sync()
        return self.written

    def replica_roll(self, next_base: int, *, gapped: bool = False) -> None:
        """The leader closed the segment this copy ends with, and went on to ``next_base``: close and
        seal ours, and begin an empty one (the leader's snapshot mark comes first in its bytes).
        ``gapped``: the segment was compacted, and its last records may be gone (``next_base`` beyond
        this copy's next sequence: those sequences are gaps at its end)."""
        closed = self._segments[-1]
        if gapped and next_base > self._next:
            missing = array("I", [closed.size] * (next_base - self._next))
            try:
                self._flush(self._off_fd, memoryview(missing.tobytes()))
            except OSError as exc:
                raise JournalWriteError(self.name, exc) from None
            closed.last_seq, closed.gapped, self._next = next_base - 1, True, next_base
        if next_base != self._next:
            raise JournalError(f"journal {self.name}: the leader's next segment starts at {next_base}, but this "
                               f"copy's next sequence is {self._next}")  # fmt: skip
        self.sync()
        self._close_files()
        self._seal(closed)
        seg = Segment(next_base, self._log_path(next_base), last_seq=next_base - 1)
        self._segments.append(seg)
        self._open_active(seg)
        self._since_index = self.config.index_interval_bytes
        fsync_path(self.directory)
        self._synced_size = 0

    def replica_reset(self, base: int) -> None:
        """Start this copy over, empty, at segment ``base`` (the leader's oldest): everything is removed."""
        log.warning("journal %s: starting the copy over from the leader's segment %d", self.name, base)
        self.close()
        for path in self.directory.iterdir():
            if path.suffix in (".log", ".idx", ".off", ".seal"):
                path.unlink()
        self.epochs.clear()
        self.checkpoint.clear()
        self._log_path(base).touch()
        fsync_path(self.directory)
        self._reset()
        self.open()

    def truncate_after(self, last: int) -> None:
        """Remove every record after sequence ``last`` and every producer mark after it (with the
        segments that hold nothing else): what a replica wrote that the current leader never had.
        The journal is closed and opened again around the cut."""
        if last > self.written or last == self.written == 0:
            # epochs begun beyond the last record (a leader's that wrote nothing that lasted) claim
            # records this replica does not hold: the leader's copy will bring them with their own epoch
            self.epochs.truncate(min(last, self.written))
            return
        keep = [seg for seg in self._segments if seg.base <= last]
        if not keep:
            self.replica_reset(last + 1)
            return
        tail = keep[-1]
        if tail.gapped and tail is not self._segments[-1] and last == tail.last_seq:
            # a compacted segment ending at ``last`` stays closed (its seal says where it ends, its last
            # records gone: opened again as the active one, it would seem to end at its last kept record);
            # the segment after it is emptied to become the active one, at ``last + 1``
            log.info("journal %s: cutting what follows sequence %d, where a compacted segment ends", self.name,
                     last)  # fmt: skip
            self._cut(len(keep) + 1, self._segments[len(keep)], 0, last)
            return
        if tail.gapped:  # compacted: ``last`` may be gone, and the next kept record starts where it ended
            end = self._record_start(tail, last + 1) if last < tail.last_seq else tail.size
        else:
            end = self._record_end(tail, last) if last >= tail.base else 0
        if last == self.written:
            if tail is self._segments[-1] and tail.size == end:
                self.epochs.truncate(last)  # nothing follows the record; an epoch begun after it goes
                return
            # only producer marks follow it (a segment this replica rolled as a leader): the leader's
            # segments may be laid out otherwise, so the copy goes on from the record itself
            log.info("journal %s: cutting the producer marks after record %d", self.name, last)
        else:
            log.warning("journal %s: cutting records %d..%d that the leader does not have", self.name, last + 1,
                        self.written)  # fmt: skip
        self._cut(len(keep), tail, end, last)

    def _cut(self, keep: int, tail: Segment, end: int, last: int) -> None:
        """Keep the first ``keep`` segments, the last of them ``tail`` cut at byte ``end`` and opened
        again as the active one (its .off and index rebuilt at the open), after sequence ``last``."""
        self.close()
        for seg in self._segments[keep:]:
            for path in (seg.path, seg.path.with_suffix(".idx"), seg.offsets_path, seg.path.with_suffix(".seal")):
                path.unlink(missing_ok=True)
        tail.path.with_suffix(".seal").unlink(missing_ok=True)
        os.truncate(tail.path, end)
        fsync_path(tail.path)
        fsync_path(self.directory)
        self.epochs.truncate(last)
        if self.checkpoint.sequence > last:  # the protocol never cuts a committed record: say so loudly
            log.error("journal %s: cutting after %d, below its commit checkpoint %d", self.name, last,
                      self.checkpoint.sequence)  # fmt: skip
            self.checkpoint.lower(last)
        self._reset()
        self.open()

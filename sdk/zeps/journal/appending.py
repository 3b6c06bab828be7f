"""Appends: groups of records (and producer marks) written, rolled into new segments, synced.

Durability (``fsync`` policy) and what a crash can lose — a process crash (kill -9) loses nothing
that ``append`` returned, since every append is written to the kernel at once; the policy is about
machine crashes and power loss:

* ``always``   — fsync after every append batch. Loss window: none.
* ``group``    — (default) fsync when the oldest unsynced record is ``group_commit_ms`` old, or
  when the caller runs out of work. Loss window: at most ``group_commit_ms`` of appends.
* ``interval`` — fsync every ``interval_ms``. Loss window: at most ``interval_ms``.
* ``never``    — leave it to the operating system. Loss window: the OS writeback delay (~30 s).
"""

from __future__ import annotations

import os
import time
from array import array
from collections.abc import Iterable

from zeps._records import encode_record
from zeps.journal._files import fsync_path
from zeps.journal.chunks import Chunk
from zeps.journal.config import (
    JournalError,
    JournalWriteError,
)
from zeps.journal.producers import GROUP, MARK_TIMESTAMP, SNAPSHOT, Producer
from zeps.journal.producers import encode_mark_body as _mark_body
from zeps.journal.recovery import SegmentFiles
from zeps.journal.segments import (
    INDEX,
    OFFSET,
    Savepoint,
    Segment,
)

__all__ = ["Appending"]


class Appending(SegmentFiles):
    """Appends, segment rolls, syncs and the tail cache, on top of the opened files."""

    def append(self, key: str, body: bytes, *, timestamp_ms: int | None = None) -> int:
        """Append one record; returns its sequence. Written to the kernel before returning."""
        return self.append_many([(key, body)], timestamp_ms=timestamp_ms)

    def append_many(
        self,
        entries: Iterable[tuple[str, bytes]],
        *,
        timestamp_ms: int | None = None,
        changes: dict[str, Producer] | None = None,
    ) -> int:
        """Append records in one write; returns the sequence of the last one. With ``changes`` (the
        idempotent producers these records advance, as they are once written; a claim's change may
        come with no record) the records are one group: a group mark first, all in one segment —
        it rolls first if the segment is three quarters full, so keep groups to a quarter of one.

        All or nothing: if the file system fails it (a full volume), the journal is put back as it was
        before the call (files truncated, the producers' marks as they were) and
        :class:`JournalWriteError` is raised; :class:`JournalError` if even that fails."""
        if self._fd < 0:
            raise JournalError(f"journal {self.name} is not open")
        save = self._savepoint(changes)
        try:
            return self._append_many(entries, timestamp_ms, changes)
        except OSError as exc:
            self._rollback(save, exc)
            raise JournalWriteError(self.name, exc) from None

    def _savepoint(self, changes: dict[str, Producer] | None) -> Savepoint:
        seg = self._segments[-1]
        journaled = {name: self._journaled.get(name) for name in changes} if changes else {}
        return Savepoint(len(self._segments), seg.size, seg.last_seq, seg.last_ts, len(seg.index), len(seg.marks),
                          self._next, self._synced, self._since_index, self._last_ts, self._marks_unsynced,
                          self._unsynced_since, journaled, self._synced_size)  # fmt: skip

    def _rollback(self, save: Savepoint, cause: OSError) -> None:
        """Undo a failed append: segments it opened are removed, the active one cut back to where it
        ended, the state restored. A failure here is fatal (JournalError): the files no longer say
        what the journal holds."""
        seg = self._segments[save.segments - 1]
        try:
            if len(self._segments) > save.segments:  # it rolled: drop the segments it began
                self._close_files()
                self._readers.close()
                for new in self._segments[save.segments :]:
                    for path in (new.path, new.path.with_suffix(".idx"), new.offsets_path):
                        path.unlink(missing_ok=True)
                del self._segments[save.segments :]
            if self._fd < 0:  # it failed in a roll (or undid one): the old segment is active again, unsealed
                seg.path.with_suffix(".seal").unlink(missing_ok=True)
                self._open_active(seg)
            records = max(save.last_seq - seg.base + 1, 0)
            os.truncate(seg.path, save.size)
            os.truncate(seg.offsets_path, records * OFFSET)
            os.truncate(seg.path.with_suffix(".idx"), save.index * INDEX.size)
        except OSError as exc:
            raise JournalError(f"journal {self.name}: a write failed ({cause.strerror}) and could not be undone: "
                               f"{exc}") from None  # fmt: skip
        seg.size, seg.last_seq, seg.last_ts = save.size, save.last_seq, save.last_ts
        del seg.index[save.index :]
        del seg.marks[save.marks :]
        self._next, self._synced, self._since_index = save.next, save.synced, save.since_index
        self._synced_size = save.synced_size
        self._last_ts = save.last_ts_all
        self._marks_unsynced, self._unsynced_since = save.marks_unsynced, save.unsynced_since
        for name, producer in save.journaled.items():
            if producer is None:
                self._journaled.pop(name, None)
            else:
                self._journaled[name] = producer

    def _append_many(
        self, entries: Iterable[tuple[str, bytes]], timestamp_ms: int | None, changes: dict[str, Producer] | None
    ) -> int:
        now = int(time.time() * 1000) if timestamp_ms is None else timestamp_ms
        ts = max(now, self._last_ts)
        seg, mark = self._segments[-1], b""
        if grouped := changes is not None:  # the producers' changes open the append, in the same segment
            seg, entries, mark = self._open_group(entries, changes)
        first, raws, keys = self._next, list[bytes](), list[str]()
        offsets = array("I", [0])
        written = total = 0  # bytes of raws already written (segment rolls), and in all
        seq, offset, since_index = self._next, seg.size, self._since_index
        index: list[tuple[int, int, int]] = []  # new index entries of the current segment
        starts = array("I")  # where the new records of the current segment start in it (its .off)
        segment_bytes, interval = self.config.segment_bytes, self.config.index_interval_bytes
        raw_keys: dict[str, bytes] = {}
        for key, body in entries:
            if offset >= segment_bytes and not grouped and seq > seg.base:  # a segment holds a record at least
                self._write(raws, written, total)
                self._flush(self._off_fd, memoryview(starts.tobytes()))
                self._index(seg, index, seq - 1, ts, offset)
                written, index, starts = total, [], array("I")
                self._next = seq
                seg = self._roll()
                offset, since_index = seg.size, self._since_index
            raw_key = raw_keys.get(key)
            if raw_key is None:
                raw_key = raw_keys[key] = key.encode("ascii")
            raw = encode_record(seq, ts, raw_key, body)
            if since_index >= interval or (not seg.index and not index):
                index.append((seq, ts, offset))
                since_index = 0
            raws.append(raw)
            starts.append(offset)
            keys.append(key)
            size = len(raw)
            offset += size
            since_index += size
            total += size
            offsets.append(total)
            seq += 1
        if not keys:
            return self._claim_alone(mark)
        data = self._write(raws, written, total, mark)
        self._flush(self._off_fd, memoryview(starts.tobytes()))
        self._index(seg, index, seq - 1, ts, offset)
        self._next, self._since_index, self._last_ts = seq, since_index, ts
        self._cache_add(Chunk(first, data, offsets, keys))
        if self._unsynced_since is None:
            self._unsynced_since = time.monotonic()
        if self.config.fsync == "always":
            self.sync()
        return self._next - 1

    @staticmethod
    def _index(seg: Segment, entries: list[tuple[int, int, int]], last_seq: int, ts: int, size: int) -> None:
        """Record what an append added to ``seg``: its size, last record, and new index entries."""
        if last_seq >= seg.base:
            seg.size, seg.last_seq, seg.last_ts = size, last_seq, ts
        if entries:
            seg.index += entries
            with open(seg.path.with_suffix(".idx"), "ab") as idx:
                idx.write(b"".join(INDEX.pack(*e) for e in entries))

    def _open_group(
        self, entries: Iterable[tuple[str, bytes]], changes: dict[str, Producer]
    ) -> tuple[Segment, list[tuple[str, bytes]], bytes]:
        """The group mark of an append of ``entries`` (rolling first if the segment is three quarters
        full: the group stays in one segment), placed at the segment's end but not written yet: the
        append writes it with its records, in one system call. Returns the segment, the entries as a
        list, and the mark's bytes."""
        entries = entries if isinstance(entries, list) else list(entries)
        seg = self._segments[-1]
        if seg.size >= self.config.segment_bytes - self.config.segment_bytes // 4 and seg.last_seq >= seg.base:
            seg = self._roll()
        mark = self._place_mark(seg, _mark_body(GROUP, len(entries), changes))
        self._journaled.update(changes)  # no roll comes before the group's records are written
        return seg, entries, mark

    def _claim_alone(self, mark: bytes) -> int:
        """An append with no record: its group mark (a claim) is all it writes, as durable as a publish.
        Returns the last sequence, as append_many does."""
        if mark:
            self._flush(self._fd, memoryview(mark))
            if self.config.fsync == "always":
                self.sync()
        return self._next - 1

    def _place_mark(self, seg: Segment, body: bytes) -> bytes:
        """A producer mark at the end of the active segment ``seg`` (it takes no sequence), counted in
        the segment's size; the caller writes the bytes returned."""
        raw = encode_record(self._next - 1, MARK_TIMESTAMP, b"", body)
        seg.marks.append((seg.size, seg.size + len(raw)))
        seg.size += len(raw)
        self._marks_unsynced = True
        if self._unsynced_since is None:
            self._unsynced_since = time.monotonic()
        return raw

    def _write(self, raws: list[bytes], start: int, end: int, before: bytes = b"") -> bytes:
        """Write ``before`` (a group mark), then bytes ``start .. end`` of the joined ``raws``, to the
        active segment in one system call (``writev``: nothing is copied to join them); returns the join."""
        data = b"".join(raws)
        view = memoryview(data)[start:end]
        if before:
            written = os.writev(self._fd, [before, view])
            if written < len(before):  # a short write (rare on a file): the rest of the mark first
                self._flush(self._fd, memoryview(before)[written:])
                written = len(before)
            view = view[written - len(before) :]
        self._flush(self._fd, view)
        return data

    def _roll(self) -> Segment:
        """Close the active segment (durable, sealed: the next open reads its seal, not its records)
        and begin the next with a snapshot of the producer table, made durable before any record
        follows it: the last segment alone then rebuilds the table at open."""
        self.sync()  # a closed segment is fully durable
        closed = self._segments[-1]
        self._close_files()
        self._seal(closed)
        seg = Segment(self._next, self._log_path(self._next), last_seq=self._next - 1)
        self._segments.append(seg)
        self._open_active(seg)
        self._since_index = self.config.index_interval_bytes
        # retention removes whole segments: each starts with the table as journaled (empty, too)
        table = {name: p for name, p in self._journaled.items() if name in self.producers.producers}
        self._flush(self._fd, memoryview(self._place_mark(seg, _mark_body(SNAPSHOT, 0, table))))
        os.fsync(self._fd)
        fsync_path(self.directory)  # the new segment's name is durable too
        self._synced_size = seg.size
        return seg

    def sync(self) -> None:
        """fsync the active segment: everything written becomes durable."""
        if self._fd >= 0 and (self._synced < self.written or self._marks_unsynced):
            os.fsync(self._fd)
        self._synced = self.written
        self._synced_size = self._segments[-1].size if self._segments else 0
        self._marks_unsynced = False
        self._unsynced_since = None
        self._last_sync = time.monotonic()

    def maybe_sync(self, *, idle: bool = False) -> bool:
        """Apply the fsync policy; the broker calls this every loop (``idle``: no more work queued).
        Returns True if it synced."""
        if self._unsynced_since is None:
            return False
        policy, now = self.config.fsync, time.monotonic()
        due = (
            (policy == "group" and (idle or (now - self._unsynced_since) * 1000 >= self.config.group_commit_ms))
            or (policy == "interval" and (now - self._last_sync) * 1000 >= self.config.interval_ms)
            or policy == "always"
        )
        if due:
            self.sync()
        return due

    def _cache_add(self, chunk: Chunk) -> None:
        if self._cache and self._cache[-1].last + 1 != chunk.first:
            # records came in another way meanwhile (a follower's copy): the cache holds one run only
            self._cache.clear()
            self._cache_bytes = 0
        self._cache.append(chunk)
        self._cache_bytes += len(chunk.data)
        drop = 0
        while self._cache_bytes > self.config.tail_cache_bytes and drop < len(self._cache) - 1:
            self._cache_bytes -= len(self._cache[drop].data)
            drop += 1
        if drop:
            del self._cache[:drop]

    def close(self) -> None:
        self._readers.close()
        if self._fd >= 0:
            try:
                self.sync()
            finally:
                self._close_files()

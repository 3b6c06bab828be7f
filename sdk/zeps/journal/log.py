"""The per-stream journal: append-only segment files, sparse indexes, recovery, retention.

Files in the stream's directory::

    00000000000000000001.log    a segment, named by the sequence of its first record (20 digits)
    00000000000000000001.idx    its sparse index: every ~index_interval_bytes, (sequence, time, offset)
    00000000000000000001.off    where each of its records starts (4 bytes each, native order): a read
                                of sequences a..b is two preads, never a walk over record boundaries.
                                Rebuilt from the records at every open, so it never needs an fsync.

Record layout: :mod:`zeps._records` (length, CRC32C, sequence, timestamp, key, body) — the same bytes
a version-3 client receives in DELIVER-BATCH. Timestamps never decrease within a stream.

Producer marks (:mod:`zeps.journal.producers`): entries in the segment files that carry the idempotent
producers' table, take no sequence and are never read out — a group mark opens each append that changes
the table, a snapshot mark opens each segment but the first. ``.off`` lists records only; a read from
disk cuts out the marks between the records it returns.

Reading hands out chunks (:class:`Chunk`): a run of consecutive records as the bytes on disk plus their
boundaries and keys, so the broker can route and send them without taking each record apart. A tail
cache keeps the most recent chunks in memory for live delivery.

Recovery (``open``): the last segment is scanned; at the first record that is torn (short), fails
its CRC, or breaks the sequence, the file is truncated there and a warning says how many bytes
went; an append whose group mark reached the disk without all of its records is cut the same way
(a group is all or nothing). The producer marks are replayed into :attr:`Journal.producers`. The next
sequence continues from the last good record — or from the segment's name when it
is empty — so sequences never restart, even after retention removed everything.

Closed segments are not read at open, so start-up does not grow with retention: a segment is
*sealed* when it closes (its files fsynced, then ``.seal``: its size, last record, index length and
producer marks, with a CRC), and open reads the seal, the index and the size of the offsets file. A
sealed segment's records are CRC-checked when a reader first asks for them; a damaged record is
logged, counted (:attr:`Journal.damaged_records`) and the segment cut before it, as open does for an
unsealed segment. The producer table comes from the last segment alone: every segment but the
first starts with a snapshot of it (an empty one too), made durable before any record follows. A
closed segment without a seal, or whose files disagree with it (a journal from before seals, a
crash during a roll), is read whole once and sealed.

Durability (``fsync`` policy) and what a crash can lose — a process crash (kill -9) loses nothing
that ``append`` returned, since every append is written to the kernel at once; the policy is about
machine crashes and power loss:

* ``always``   — fsync after every append batch. Loss window: none.
* ``group``    — (default) fsync when the oldest unsynced record is ``group_commit_ms`` old, or
  when the caller runs out of work. Loss window: at most ``group_commit_ms`` of appends.
* ``interval`` — fsync every ``interval_ms``. Loss window: at most ``interval_ms``.
* ``never``    — leave it to the operating system. Loss window: the OS writeback delay (~30 s).

Readers only see records up to :attr:`Journal.durable` — the synced tail (or the written tail with
``never``) — so nobody is shown a record a machine crash could take back.
"""

from __future__ import annotations

import bisect
import errno
import logging
import os
import struct
import sys
import time
from array import array
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from operator import attrgetter, itemgetter
from pathlib import Path
from typing import Literal

import crc32c

from zeps._records import HEAD as _HEAD
from zeps._records import META as _META
from zeps._records import OVERHEAD, RECORD, encode_record
from zeps.errors import ZepsError
from zeps.journal.epochs import EpochHistory
from zeps.journal.producers import GROUP, MARK_TIMESTAMP, SNAPSHOT, Producer, ProducerTable, decode_mark
from zeps.journal.producers import encode_mark_body as _mark_body

__all__ = [
    "DEFAULT_MAX_PRODUCERS",
    "DEFAULT_PRODUCER_TTL_MS",
    "Chunk",
    "FsyncPolicy",
    "Journal",
    "JournalConfig",
    "JournalError",
    "JournalWriteError",
    "Record",
    "ReplicaSlice",
]

log = logging.getLogger(__name__)

FsyncPolicy = Literal["always", "group", "interval", "never"]
_INDEX = struct.Struct("!QQI")  # sequence, timestamp, offset
_NAME_DIGITS = 20
_OFFSET = array("I").itemsize  # bytes per entry of a .off file
DEFAULT_PRODUCER_TTL_MS = 24 * 3600 * 1000  # the broker's --producer-ttl, the ZepsStream's producers.ttlSeconds
DEFAULT_MAX_PRODUCERS = 100_000  # --max-producers, producers.max
_MAX_SEGMENT_BYTES = 1 << 31  # offsets in a .off file are 4 bytes; a record may overshoot segment_bytes
# a closed segment's seal (.seal): magic, size, last sequence, last timestamp, index entries, marks,
# then each mark's (start, end), then a CRC32C of all that
_SEAL_MAGIC = b"ZEPSEAL1"
_SEAL_HEAD = struct.Struct("!8sQQQII")
_SEAL_MARK = struct.Struct("!QQ")
_SEAL_CRC = struct.Struct("!I")
_MARK_SPAN = struct.Struct("!II")  # a producer mark's (start, end) in a segment, in a REPLICA-DATA


class JournalError(ZepsError):
    """The journal cannot do what was asked (closed, unreadable segment, bad configuration)."""


class JournalWriteError(JournalError):
    """An append failed in the file system (``errno`` says how: ENOSPC for a full volume). The journal
    undid it: nothing of that append is on disk or in the table, and the journal takes appends again
    (they may fail the same way). ``space`` is true for a full volume or an exhausted quota: the
    broker refuses the publishes and keeps serving; any other error is fatal for the broker."""

    def __init__(self, journal: str, error: OSError) -> None:
        super().__init__(f"journal {journal}: could not write: {error.strerror or error} (errno {error.errno})")
        self.errno = error.errno
        self.space = error.errno in (errno.ENOSPC, errno.EDQUOT)


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
    """Consecutive records ``first .. last`` as stored: ``data[offsets[i]:offsets[i + 1]]`` is the
    record with sequence ``first + i`` and key ``keys[i]`` (keys are read from the data when first
    asked for: a replay to a subscription that takes every key never needs them)."""

    __slots__ = ("_keys", "data", "first", "offsets")

    def __init__(self, first: int, data: bytes, offsets: array[int], keys: list[str] | None = None) -> None:
        self.first, self.data, self.offsets, self._keys = first, data, offsets, keys

    @property
    def keys(self) -> list[str]:
        if self._keys is None:
            data, at = self.data, OVERHEAD - 1
            self._keys = [data[o + at + 1 : o + at + 1 + data[o + at]].decode("ascii", "replace")
                          for o in self.offsets[:-1]]  # fmt: skip
        return self._keys

    @property
    def last(self) -> int:
        return self.first + len(self.offsets) - 2

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
        return Chunk(self.first + begin, self.data[base : self.offsets[end]],
                     array("I", [o - base for o in self.offsets[begin : end + 1]]), keys)  # fmt: skip


@dataclass(frozen=True)
class JournalConfig:
    segment_bytes: int = 64 * 1024 * 1024
    index_interval_bytes: int = 4096
    fsync: FsyncPolicy = "group"
    group_commit_ms: float = 5.0
    interval_ms: float = 1000.0
    retention_ms: int | None = None  #: remove closed segments whose newest record is older
    retention_bytes: int | None = None  #: remove the oldest closed segments while the journal is larger
    tail_cache_bytes: int = 16 * 1024 * 1024  #: recent records kept in memory for live delivery
    producer_ttl_ms: int = DEFAULT_PRODUCER_TTL_MS  #: forget an idempotent producer idle this long
    max_producers: int = DEFAULT_MAX_PRODUCERS  #: idempotent producers the table holds at most

    def __post_init__(self) -> None:
        if not 0 < self.segment_bytes <= _MAX_SEGMENT_BYTES:
            raise JournalError(
                f"segment_bytes={self.segment_bytes}: must be between 1 and {_MAX_SEGMENT_BYTES} (2 GiB)"
            )
        if self.producer_ttl_ms <= 0 or self.max_producers <= 0:
            raise JournalError(f"producer TTL {self.producer_ttl_ms} ms and max producers {self.max_producers}: "
                               "both must be above 0")  # fmt: skip


@dataclass
class _Segment:
    base: int
    path: Path
    size: int = 0
    last_seq: int = 0  # base - 1 when empty
    last_ts: int = 0
    index: list[tuple[int, int, int]] = field(default_factory=list)  # (seq, ts, offset)
    marks: list[tuple[int, int]] = field(default_factory=list)  # producer marks: (start, end) offsets
    verified_to: int = 0  # offset up to which its records' CRCs were checked (a sealed one: as they are read)

    @property
    def offsets_path(self) -> Path:
        return self.path.with_suffix(".off")


@dataclass(frozen=True, slots=True)
class _Savepoint:
    """The journal's state before an append: what :meth:`Journal._rollback` restores if it fails."""

    segments: int
    size: int  # the active segment's
    last_seq: int
    last_ts: int
    index: int  # entries of its index
    marks: int
    next: int  # the journal's
    synced: int
    since_index: int
    last_ts_all: int
    marks_unsynced: bool
    unsynced_since: float | None
    journaled: dict[str, Producer | None]  # the producers the append changes, as journaled before it
    synced_size: int = 0


@dataclass(frozen=True, slots=True)
class ReplicaSlice:
    """What a leader sends a follower (:meth:`Journal.replica_read`): ``data`` goes at ``offset`` of
    segment ``base``; ``next_base`` (not 0): that segment ends there, the next starts at this base;
    ``reset``: the follower's position is not one the leader can continue: start over, empty, at ``base``."""

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


class Journal:
    """One stream's journal. The broker's single writer calls ``append``; readers call ``read``."""

    def __init__(self, directory: Path, config: JournalConfig | None = None, *, name: str = "") -> None:
        self.directory = directory
        self.config = config or JournalConfig()
        self.name = name or directory.name
        #: which leader epoch wrote which records (a replicated stream's; :mod:`zeps.journal.epochs`)
        self.epochs = EpochHistory(directory / "epochs")
        self._readers = _Readers()
        self._reset()

    def _reset(self) -> None:
        """The state of a journal not opened yet (``open`` reads it from the files)."""
        self._readers.close()
        self._segments: list[_Segment] = []
        self._fd = -1
        self._off_fd = -1  # the active segment's .off file
        self._next = 1
        self._synced = 0
        self._synced_size = 0  # the active segment's bytes that are durable (what a follower may copy)
        self._last_ts = 0
        self._unsynced_since: float | None = None
        self._last_sync = time.monotonic()
        self._cache: list[Chunk] = []  # recent chunks, consecutive, oldest first
        self._cache_bytes = 0
        self._since_index = 0
        self._marks_unsynced = False
        #: records found damaged in closed segments as they were first read (no longer served)
        self.damaged_records = 0
        #: idempotent producers, as the broker checks them (ahead of the journal by what it has not
        #: appended yet); rebuilt from the marks at open, and their changes reach the marks through
        #: append_many(changes=…)
        self.producers = ProducerTable(ttl_ms=self.config.producer_ttl_ms, max_producers=self.config.max_producers)
        self._journaled: dict[str, Producer] = {}  # the producers as the marks written so far hold them

    # -- state ----------------------------------------------------------------------------------
    @property
    def next_sequence(self) -> int:
        return self._next

    @property
    def written(self) -> int:
        """The last sequence written to the kernel (0 when empty)."""
        return self._next - 1

    @property
    def durable(self) -> int:
        """The last sequence readers may see: synced, or written with fsync=never."""
        return self.written if self.config.fsync == "never" else self._synced

    @property
    def first_sequence(self) -> int:
        """The oldest retained sequence (== next_sequence when nothing is retained)."""
        for seg in self._segments:
            if seg.last_seq >= seg.base:
                return seg.base
        return self._next

    @property
    def size_bytes(self) -> int:
        return sum(s.size for s in self._segments)

    @property
    def journaled(self) -> Mapping[str, Producer]:
        """The idempotent producers as the marks written so far hold them (:attr:`producers` runs
        ahead of this by what the broker has not appended yet)."""
        return self._journaled

    @property
    def last_timestamp_ms(self) -> int:
        return self._last_ts

    # -- opening and recovery -------------------------------------------------------------------
    def open(self) -> Journal:
        self.directory.mkdir(parents=True, exist_ok=True)
        bases = sorted(int(p.stem) for p in self.directory.glob("*.log") if p.stem.isdigit())
        for base in bases[:-1]:  # closed segments: their seal, else a full read (which seals them)
            seg = self._load_sealed(base)
            if seg is None:
                seg = self._load(base, last=False)
                try:
                    self._seal(seg)
                except OSError as exc:  # the next start reads it whole again; nothing is lost
                    log.warning("journal %s: could not seal %s (%s)", self.name, seg.path.name, exc)
            self._segments.append(seg)
        if bases:  # the active segment, whose tail may be torn: read and checked whole
            self._segments.append(self._load(bases[-1], last=True))
            if len(bases) > 1 and not self._segments[-1].marks:
                self._replay_closed_marks()
        if not self._segments:
            self._segments.append(_Segment(1, self._log_path(1), last_seq=0))
        active = self._segments[-1]
        self._next = active.last_seq + 1
        self._synced = active.last_seq  # what survived on disk is as durable as it gets
        self._synced_size = active.size
        self.epochs.load()
        self._last_ts = max((s.last_ts for s in self._segments), default=0)
        self._open_active(active)
        self._since_index = active.size - (active.index[-1][2] if active.index else 0)
        self.expire_producers(int(time.time() * 1000))
        return self

    def expire_producers(self, now_ms: int) -> list[str]:
        """Forget idempotent producers idle longer than the TTL; returns their names."""
        gone = self.producers.expire(now_ms)
        for name in gone:
            self._journaled.pop(name, None)
        return gone

    def _open_active(self, seg: _Segment) -> None:
        self._fd = os.open(seg.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._off_fd = os.open(seg.offsets_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def _close_files(self) -> None:
        """Close the active segment's files (marked closed first: a number is never closed twice)."""
        fd, off_fd, self._fd, self._off_fd = self._fd, self._off_fd, -1, -1
        for number in (fd, off_fd):
            if number >= 0:
                os.close(number)

    def _log_path(self, base: int) -> Path:
        return self.directory / f"{base:0{_NAME_DIGITS}d}.log"

    def _load(self, base: int, *, last: bool) -> _Segment:
        path = self._log_path(base)
        seg = _Segment(base, path, last_seq=base - 1)
        data = path.read_bytes()
        starts, marks, good_end = _walk_segment(data, base)  # what follows the first bad entry is dropped
        since_index = self.config.index_interval_bytes  # index the first record
        for offset in starts:
            length, _, sequence, timestamp, _ = RECORD.unpack_from(data, offset)
            if since_index >= self.config.index_interval_bytes:
                seg.index.append((sequence, timestamp, offset))
                since_index = 0
            since_index += 4 + length
            seg.last_seq, seg.last_ts = sequence, timestamp
        for start, end, kind, producers in marks:
            self.producers.apply(kind, producers)
            if kind == SNAPSHOT:
                self._journaled.clear()
            self._journaled.update(producers)
            seg.marks.append((start, end))
        if good_end < len(data):
            log.warning(
                "journal %s: segment %s has a torn or corrupt record at offset %d; truncating %d bytes "
                "(records from sequence %d on are dropped)",
                self.name, path.name, good_end, len(data) - good_end, seg.last_seq + 1,
            )  # fmt: skip
            with open(path, "r+b") as f:
                f.truncate(good_end)
                f.flush()
                os.fsync(f.fileno())
        if not last and good_end < len(data):
            log.warning("journal %s: a closed segment was damaged; later segments continue from their names", self.name)
        seg.size = seg.verified_to = good_end
        self._write_index(seg)
        seg.offsets_path.write_bytes(starts.tobytes())
        return seg

    def _load_sealed(self, base: int) -> _Segment | None:
        """A closed segment from its seal, without reading its records (None if there is no seal, or it
        does not match the files: then the segment is read whole). Its records are CRC-checked when
        first read (:meth:`_verify`); its producer marks are not replayed (the next segment's snapshot
        holds what they did)."""
        path = self._log_path(base)
        try:
            raw = path.with_suffix(".seal").read_bytes()
            size = path.stat().st_size
            off_size = path.with_suffix(".off").stat().st_size
            idx = path.with_suffix(".idx").read_bytes()
        except FileNotFoundError:
            return None
        sealed = _read_seal(raw)
        if sealed is None:
            log.warning("journal %s: the seal of %s is damaged; reading the segment whole", self.name, path.name)
            return None
        seal_size, last_seq, last_ts, entries, marks = sealed
        records = last_seq - base + 1
        if (seal_size, off_size, len(idx)) != (size, records * _OFFSET, entries * _INDEX.size) or records < 0:
            log.warning("journal %s: %s does not match its seal (size %d, offsets %d, index %d); reading it whole",
                        self.name, path.name, size, off_size, len(idx))  # fmt: skip
            return None
        index = list(_INDEX.iter_unpack(idx))
        return _Segment(base, path, size=size, last_seq=last_seq, last_ts=last_ts, index=index, marks=marks)

    def _seal(self, seg: _Segment) -> None:
        """Write ``seg``'s seal, once it is closed and its files are durable: what :meth:`_load_sealed`
        reads instead of the records (size, last record, producer marks, index length), with a CRC."""
        for sibling in (seg.offsets_path, seg.path.with_suffix(".idx")):
            _fsync_file(sibling)
        body = _SEAL_HEAD.pack(_SEAL_MAGIC, seg.size, seg.last_seq, seg.last_ts, len(seg.index), len(seg.marks))
        body += b"".join(_SEAL_MARK.pack(*mark) for mark in seg.marks)
        raw = body + _SEAL_CRC.pack(crc32c.crc32c(body))
        fd = os.open(seg.path.with_suffix(".seal"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            self._flush(fd, memoryview(raw))
            os.fsync(fd)
        finally:
            os.close(fd)

    def _replay_closed_marks(self) -> None:
        """The active segment does not start with a snapshot (a journal from before empty snapshots, or
        a crash right after a roll): the producer table is rebuilt from every closed segment's marks
        instead, reading them (and checking them) whole."""
        log.warning("journal %s: the last segment has no producer snapshot; replaying every segment's marks",
                    self.name)  # fmt: skip
        active = self._segments.pop()
        self.producers.producers.clear()
        self._journaled.clear()
        closed, self._segments = self._segments, []
        for seg in closed:
            self._segments.append(self._load(seg.base, last=False))
        self._segments.append(self._load(active.base, last=True))

    def _write_index(self, seg: _Segment) -> None:
        seg.path.with_suffix(".idx").write_bytes(b"".join(_INDEX.pack(*e) for e in seg.index))

    # -- writing --------------------------------------------------------------------------------
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

    def _savepoint(self, changes: dict[str, Producer] | None) -> _Savepoint:
        seg = self._segments[-1]
        journaled = {name: self._journaled.get(name) for name in changes} if changes else {}
        return _Savepoint(len(self._segments), seg.size, seg.last_seq, seg.last_ts, len(seg.index), len(seg.marks),
                          self._next, self._synced, self._since_index, self._last_ts, self._marks_unsynced,
                          self._unsynced_since, journaled, self._synced_size)  # fmt: skip

    def _rollback(self, save: _Savepoint, cause: OSError) -> None:
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
            os.truncate(seg.offsets_path, records * _OFFSET)
            os.truncate(seg.path.with_suffix(".idx"), save.index * _INDEX.size)
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
    def _index(seg: _Segment, entries: list[tuple[int, int, int]], last_seq: int, ts: int, size: int) -> None:
        """Record what an append added to ``seg``: its size, last record, and new index entries."""
        if last_seq >= seg.base:
            seg.size, seg.last_seq, seg.last_ts = size, last_seq, ts
        if entries:
            seg.index += entries
            with open(seg.path.with_suffix(".idx"), "ab") as idx:
                idx.write(b"".join(_INDEX.pack(*e) for e in entries))

    def _open_group(
        self, entries: Iterable[tuple[str, bytes]], changes: dict[str, Producer]
    ) -> tuple[_Segment, list[tuple[str, bytes]], bytes]:
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

    def _place_mark(self, seg: _Segment, body: bytes) -> bytes:
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

    @staticmethod
    def _flush(fd: int, data: memoryview) -> None:
        while data:
            written = os.write(fd, data)
            data = data[written:]

    def _roll(self) -> _Segment:
        """Close the active segment (durable, sealed: the next open reads its seal, not its records)
        and begin the next with a snapshot of the producer table, made durable before any record
        follows it: the last segment alone then rebuilds the table at open."""
        self.sync()  # a closed segment is fully durable
        closed = self._segments[-1]
        self._close_files()
        self._seal(closed)
        seg = _Segment(self._next, self._log_path(self._next), last_seq=self._next - 1)
        self._segments.append(seg)
        self._open_active(seg)
        self._since_index = self.config.index_interval_bytes
        # retention removes whole segments: each starts with the table as journaled (empty, too)
        table = {name: p for name, p in self._journaled.items() if name in self.producers.producers}
        self._flush(self._fd, memoryview(self._place_mark(seg, _mark_body(SNAPSHOT, 0, table))))
        os.fsync(self._fd)
        _fsync_file(self.directory)  # the new segment's name is durable too
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

    # -- reading --------------------------------------------------------------------------------
    def _cache_add(self, chunk: Chunk) -> None:
        self._cache.append(chunk)
        self._cache_bytes += len(chunk.data)
        drop = 0
        while self._cache_bytes > self.config.tail_cache_bytes and drop < len(self._cache) - 1:
            self._cache_bytes -= len(self._cache[drop].data)
            drop += 1
        if drop:
            del self._cache[:drop]

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
        if cache and start >= cache[0].first:
            i = bisect.bisect_right(cache, start, key=lambda c: c.first) - 1
            parts: list[Chunk] = []
            size = count = 0
            while i < len(cache) and size < max_bytes and count < max_records:
                chunk = cache[i]
                begin = max(start, chunk.first) - chunk.first
                stop = _fit(chunk, begin, min(end, chunk.last) - chunk.first + 1, max_bytes - size, max_records - count,
                            force=not parts)  # fmt: skip
                if stop <= begin:
                    break
                parts.append(chunk.part(begin, stop))
                size += chunk.offsets[stop] - chunk.offsets[begin]
                count += stop - begin
                if stop < len(chunk) or chunk.last >= end:
                    break
                i += 1
            return parts[0] if len(parts) == 1 else _join(parts)
        return self._read_disk(start, end, max_records, max_bytes)

    def _read_disk(self, start: int, end: int, max_records: int, max_bytes: int) -> Chunk | None:
        """Records ``start ..`` (at most to ``end`` and to the end of its segment) from disk: where
        they start comes from the segment's .off file, so this costs two preads and no Python work
        per record beyond the slice of offsets. A sequence lost with a damaged closed segment reads
        as the next segment's first (like a gap retention left); None if nothing of ``start .. end``
        is left."""
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
        raw = self._readers.pread(seg.offsets_path, (last - start + 2) * _OFFSET, k * _OFFSET)
        starts.frombytes(raw[: len(raw) - len(raw) % _OFFSET])
        if len(starts) == last - start + 1:
            starts.append(seg.size)  # the segment's last record ends where the segment does
        if len(starts) < last - start + 2:
            raise JournalError(f"journal {self.name}: {seg.offsets_path.name} lacks sequences {start}..{last}")
        count = max(bisect.bisect_right(starts, starts[0] + max_bytes) - 1, 1)
        base = starts[0]
        data = self._readers.pread(seg.path, starts[count] - base, base)
        if seg.verified_to < starts[count]:  # a sealed segment: its records are checked as first read
            good = self._verify(seg, start, data, starts, count)
            if good == 0:  # the first record asked for is damaged: the segment ends before it
                return self._read_disk(start, end, max_records, max_bytes)
            count = good
        if count + 1 < len(starts):
            del starts[count + 1 :]
        first_mark = bisect.bisect_left(seg.marks, base, key=itemgetter(0))
        if first_mark < len(seg.marks) and seg.marks[first_mark][0] < starts[count]:
            data, starts = _cut_marks(data, base, starts, seg.marks[first_mark:])
        elif base:
            starts = array("I", [o - base for o in starts])
        return Chunk(start, data, starts)

    def _verify(self, seg: _Segment, start: int, data: bytes, starts: array[int], count: int) -> int:
        """Check the CRCs of records ``start ..`` of a closed segment, read as ``data`` (from offset
        ``starts[0]``; ``starts[i]`` is record ``start + i``'s offset): how many of the ``count`` are
        intact. At a damaged one the segment is cut in memory (reads skip to the next segment, as
        after a damaged segment at open) and an error is logged; the file is left for inspection."""
        base, view, unpack, crc = starts[0], memoryview(data), RECORD.unpack_from, crc32c.crc32c
        for i in range(count):
            at = starts[i] - base
            intact = at + OVERHEAD <= len(data)
            if intact:
                length, checksum, sequence, _, _ = unpack(data, at)
                end = at + 4 + length
                intact = end <= len(data) and sequence == start + i and crc(view[at + 8 : end]) == checksum
            if not intact:
                log.error("journal %s: segment %s: record %d (offset %d) is damaged; sequences %d..%d of this segment "
                          "are not served", self.name, seg.path.name, start + i, starts[i], start + i,
                          seg.last_seq)  # fmt: skip
                self.damaged_records += seg.last_seq - (start + i) + 1
                seg.last_seq, seg.size = start + i - 1, starts[i]
                del seg.index[bisect.bisect_left(seg.index, start + i, key=itemgetter(0)) :]
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

    # -- replication: followers copy the leader's segment files byte for byte ------------------
    def replica_position(self) -> tuple[int, int, int]:
        """Where a follower's copy ends: (its active segment's base, that segment's size, last sequence)."""
        seg = self._segments[-1]
        return seg.base, seg.size, self.written

    def replica_has_more(self, base: int, offset: int) -> bool:
        """Whether a follower at ``offset`` of segment ``base`` has anything to fetch (cheap: no reads)."""
        active = self._segments[-1]
        return base != active.base or offset < self._durable_size(active)

    def _durable_size(self, seg: _Segment) -> int:
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
            return self._reset_slice()
        seg = self._segments[i]
        durable = self._durable_size(seg)
        if offset > durable or not self._at_boundary(seg, offset, last):
            return self._reset_slice()
        closed = seg is not self._segments[-1]
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
            walked, _, good = _walk_segment(data, last + 1)  # where the last whole entry (and group) ends
            count = len(walked)
            if good:
                break
            limit = min(durable, offset + 2 * (limit - offset))  # a group larger than max_bytes goes whole
        data = data[:good]
        starts = array("I")
        if count > 0:  # the records' offsets, as the .off file holds them
            starts.frombytes(self._readers.pread(seg.offsets_path, count * _OFFSET, (last + 1 - seg.base) * _OFFSET))
        if sys.byteorder == "little":
            starts.byteswap()
        first_mark = bisect.bisect_left(seg.marks, offset, key=itemgetter(0))
        marks = [m for m in seg.marks[first_mark:] if m[0] < offset + good]
        ends = closed and offset + good == durable
        return ReplicaSlice(base, offset, data, self._segments[i + 1].base if ends else 0,
                            starts=starts.tobytes(), marks=b"".join(_MARK_SPAN.pack(*m) for m in marks))  # fmt: skip

    def _replica_cut(self, seg: _Segment, offset: int, last: int, last_durable: int, limit: int
                     ) -> tuple[int, int] | None:  # fmt: skip
        """Where a slice from ``offset`` (after record ``last``) ends, at or before ``limit``, as
        (bytes, records), found in the segment's index and marks without reading the records: the
        start of the last record or producer mark at or before ``limit``, never inside a group (a mark
        and the records it covers). A slice that begins with a group reaching ``limit`` holds that
        group whole. None if it would hold nothing."""
        starts = _IndexFile(self._readers, seg.offsets_path, seg.base, last + 1, last_durable)
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

    def _in_group(self, seg: _Segment, mark: tuple[int, int], cut: int, starts: _IndexFile) -> bool:
        """Whether a slice cut at ``cut`` (a record's start after ``mark``) would end inside the mark's group."""
        covered = starts.below(cut) - starts.below(mark[1])  # its records before cut
        return covered < self._group_size(seg, mark)

    def _group_size(self, seg: _Segment, mark: tuple[int, int]) -> int:
        """How many records follow the producer mark at ``mark`` (start, end) in its group."""
        start, end = mark
        entry = self._readers.pread(seg.path, end - start, start)
        return decode_mark(entry[OVERHEAD:])[1]

    def _reset_slice(self) -> ReplicaSlice:
        return ReplicaSlice(self._segments[0].base, 0, b"", reset=True)

    def _at_boundary(self, seg: _Segment, offset: int, last: int) -> bool:
        """Whether ``offset`` of ``seg`` is where an entry ends, after record ``last`` and before the next."""
        if last > seg.last_seq or last < seg.base - 1:
            return False
        end = self._record_end(seg, last) if last >= seg.base else 0
        if offset == end:
            return True
        following = self._record_start(seg, last + 1) if last < seg.last_seq else seg.size
        return end < offset <= following and any(e == offset for _, e in seg.marks)

    def _record_start(self, seg: _Segment, sequence: int) -> int:
        raw = self._readers.pread(seg.offsets_path, _OFFSET, (sequence - seg.base) * _OFFSET)
        if len(raw) < _OFFSET:
            raise JournalError(f"journal {self.name}: {seg.offsets_path.name} lacks sequence {sequence}")
        return array("I", raw)[0]

    def _record_end(self, seg: _Segment, sequence: int) -> int:
        start = self._record_start(seg, sequence)
        (length,) = struct.unpack("!I", self._readers.pread(seg.path, 4, start))
        return start + 4 + int(length)

    def replica_write(self, base: int, offset: int, data: bytes, *, starts: bytes | None = None,
                      marks: bytes = b"") -> int:  # fmt: skip
        """A follower appends bytes the leader sent for ``offset`` of segment ``base`` (its position):
        whole entries; returns the last sequence written. With the leader's ``starts`` and ``marks``
        (:class:`ReplicaSlice`; the frame's CRC covered them) the records are not walked one by one:
        their count, first and last sequence and the end of the last entry are checked, each mark
        decoded. Without, they are checked as recovery checks them. Raises JournalError if they do not
        continue this copy (the follower then asks where to go on)."""
        seg = self._segments[-1]
        if (seg.base, seg.size) != (base, offset):
            raise JournalError(f"journal {self.name}: replica bytes for segment {base} at {offset}, but this "
                               f"copy ends at {seg.size} of segment {seg.base}")  # fmt: skip
        if starts is None:
            walked, decoded, good = _walk_segment(data, self._next)
            if good != len(data):
                raise JournalError(f"journal {self.name}: replica bytes from the leader are damaged at {offset + good}")
            absolute = array("I", (offset + s for s in walked))
        else:
            absolute, decoded = self._indexed(offset, data, starts, marks)
        return self._copy(seg, offset, data, absolute, decoded)

    def _indexed(self, offset: int, data: bytes, raw_starts: bytes, raw_marks: bytes
                 ) -> tuple[array[int], list[tuple[int, int, int, dict[str, Producer]]]]:  # fmt: skip
        """The record starts (segment offsets) and decoded marks (relative to ``data``) of a leader's
        indexed slice, after the checks that need no walk (JournalError naming what is wrong)."""
        starts = array("I")
        starts.frombytes(raw_starts[: len(raw_starts) - len(raw_starts) % _OFFSET])
        if sys.byteorder == "little":
            starts.byteswap()
        spans = [(a - offset, b - offset) for a, b in _MARK_SPAN.iter_unpack(raw_marks[: len(raw_marks) // 8 * 8])]

        def bad(why: str) -> JournalError:
            return JournalError(f"journal {self.name}: replica bytes from the leader at {offset}: {why}")

        if not starts and not spans:
            if data:
                raise bad("bytes without an index")
            return starts, []
        first_entry = min(starts[0] - offset if starts else len(data), spans[0][0] if spans else len(data))
        if first_entry != 0:
            raise bad("the index does not start where the bytes do")
        if starts:
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

    def _copy(self, seg: _Segment, offset: int, data: bytes, starts: array[int],
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

    def replica_roll(self, next_base: int) -> None:
        """The leader closed the segment this copy ends with, and went on to ``next_base``: close and
        seal ours, and begin an empty one (the leader's snapshot mark comes first in its bytes)."""
        if next_base != self._next:
            raise JournalError(f"journal {self.name}: the leader's next segment starts at {next_base}, but this "
                               f"copy's next sequence is {self._next}")  # fmt: skip
        self.sync()
        closed = self._segments[-1]
        self._close_files()
        self._seal(closed)
        seg = _Segment(next_base, self._log_path(next_base), last_seq=next_base - 1)
        self._segments.append(seg)
        self._open_active(seg)
        self._since_index = self.config.index_interval_bytes
        _fsync_file(self.directory)
        self._synced_size = 0

    def replica_reset(self, base: int) -> None:
        """Start this copy over, empty, at segment ``base`` (the leader's oldest): everything is removed."""
        log.warning("journal %s: starting the copy over from the leader's segment %d", self.name, base)
        self.close()
        for path in self.directory.iterdir():
            if path.suffix in (".log", ".idx", ".off", ".seal"):
                path.unlink()
        self.epochs.clear()
        self._log_path(base).touch()
        _fsync_file(self.directory)
        self._reset()
        self.open()

    def truncate_after(self, last: int) -> None:
        """Remove every record after sequence ``last`` (and the marks after it): what a replica wrote
        that the current leader never had. The journal is closed and opened again around the cut."""
        if last >= self.written:
            return
        log.warning("journal %s: cutting records %d..%d that the leader does not have", self.name, last + 1,
                    self.written)  # fmt: skip
        keep = [seg for seg in self._segments if seg.base <= last]
        if not keep:
            self.replica_reset(last + 1)
            return
        tail = keep[-1]
        end = self._record_end(tail, last) if last >= tail.base else 0
        self.close()
        for seg in self._segments[len(keep) :]:
            for path in (seg.path, seg.path.with_suffix(".idx"), seg.offsets_path, seg.path.with_suffix(".seal")):
                path.unlink(missing_ok=True)
        tail.path.with_suffix(".seal").unlink(missing_ok=True)
        os.truncate(tail.path, end)
        _fsync_file(tail.path)
        _fsync_file(self.directory)
        self.epochs.truncate(last)
        self._reset()
        self.open()

    # -- retention ------------------------------------------------------------------------------
    def apply_retention(self, *, now_ms: int | None = None) -> list[int]:
        """Delete whole closed segments past retention (age or bytes); returns their base sequences."""
        now = int(time.time() * 1000) if now_ms is None else now_ms
        removed = []
        while len(self._segments) > 1:
            oldest = self._segments[0]
            too_old = self.config.retention_ms is not None and oldest.last_ts < now - self.config.retention_ms
            too_big = self.config.retention_bytes is not None and self.size_bytes > self.config.retention_bytes
            if not (too_old or too_big):
                break
            self._readers.forget(oldest.path)
            self._readers.forget(oldest.offsets_path)
            oldest.path.unlink(missing_ok=True)
            oldest.path.with_suffix(".idx").unlink(missing_ok=True)
            oldest.offsets_path.unlink(missing_ok=True)
            oldest.path.with_suffix(".seal").unlink(missing_ok=True)
            self._segments.pop(0)
            removed.append(oldest.base)
            log.info("journal %s: retention removed segment %d..%d", self.name, oldest.base, oldest.last_seq)
        return removed

    def close(self) -> None:
        self._readers.close()
        if self._fd >= 0:
            try:
                self.sync()
            finally:
                self._close_files()


class _Readers:
    """Read-only descriptors of the files the journal reads, kept open (at most ``most``, the least
    recently used closed first): a follower's fetch reads a segment and its .off file several times
    (where to cut, whole groups), and Python's ``open`` costs five system calls each time. A path
    is forgotten before its file is removed, so a descriptor never outlives what it names."""

    def __init__(self, most: int = 8) -> None:
        self.most = most
        self._fds: dict[Path, int] = {}  # in order of use, the most recent last

    def pread(self, path: Path, size: int, offset: int) -> bytes:
        fd = self._fds.pop(path, -1)
        if fd < 0:
            fd = os.open(path, os.O_RDONLY)
            if len(self._fds) >= self.most:
                os.close(self._fds.pop(next(iter(self._fds))))
        self._fds[path] = fd
        return os.pread(fd, size, offset)

    def forget(self, path: Path) -> None:
        fd = self._fds.pop(path, -1)
        if fd >= 0:
            os.close(fd)

    def close(self) -> None:
        fds, self._fds = self._fds, {}
        for fd in fds.values():
            os.close(fd)


class _IndexFile:
    """Records ``first`` .. ``last`` of a segment's .off file as a sequence of their start offsets,
    read an entry at a time (for bisect: a few reads, not the file)."""

    def __init__(self, readers: _Readers, path: Path, base: int, first: int, last: int) -> None:
        self.readers, self.path, self.skip, self.count = readers, path, first - base, max(0, last - first + 1)

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, i: int) -> int:
        raw = self.readers.pread(self.path, _OFFSET, (self.skip + i) * _OFFSET)
        if len(raw) < _OFFSET:
            raise JournalError(f"journal index {self.path.name} lacks entry {self.skip + i}")
        return int(array("I", raw)[0])

    def below(self, offset: int) -> int:
        """How many of the records start before ``offset`` (a read per bisection step)."""
        return bisect.bisect_left(range(self.count), offset, key=self.__getitem__)

    def at_most(self, offset: int) -> int:
        """How many of the records start at or before ``offset`` (a read per bisection step)."""
        return bisect.bisect_right(range(self.count), offset, key=self.__getitem__)


def _walk_segment(data: bytes, base: int) -> tuple[array[int], list[tuple[int, int, int, dict[str, Producer]]], int]:
    """(record starts, producer marks as (start, end, kind, producers), where the intact part ends) of
    a segment whose first record is ``base``. Intact: each entry's length fits and its CRC32C matches;
    records have the sequences base, base + 1, …; a mark sits where the sequence before it ended and
    decodes; and the last group has all its records (else it is cut off, mark included)."""
    starts, marks = array("I"), list[tuple[int, int, int, dict[str, Producer]]]()
    offset, size, expect = 0, len(data), base
    group_at, missing = 0, 0  # the last group mark, and its records not seen yet
    view, unpack = memoryview(data), RECORD.unpack_from
    while offset + OVERHEAD <= size:
        length, checksum, sequence, timestamp, klen = unpack(data, offset)
        end = offset + 4 + length
        if length < 4 + _META.size or end > size or crc32c.crc32c(view[offset + 8 : end]) != checksum:
            break
        if timestamp == MARK_TIMESTAMP:
            if sequence != expect - 1 or klen or missing:
                break
            try:
                kind, follows, producers = decode_mark(data[offset + OVERHEAD : end])
            except ValueError:
                break
            marks.append((offset, end, kind, producers))
            group_at, missing = offset, follows
        else:
            if offset + OVERHEAD + klen > end or sequence != expect:
                break
            starts.append(offset)
            expect += 1
            missing = max(missing - 1, 0)
        offset = end
    if missing:  # the last group's records did not all reach the disk: drop the group, mark included
        del starts[bisect.bisect_left(starts, group_at) :]
        del marks[-1]
        offset = group_at
    return starts, marks, offset


def _read_seal(raw: bytes) -> tuple[int, int, int, int, list[tuple[int, int]]] | None:
    """(size, last sequence, last timestamp, index entries, marks) of a seal; None if it is damaged."""
    if len(raw) < _SEAL_HEAD.size + _SEAL_CRC.size:
        return None
    body, (crc,) = raw[: -_SEAL_CRC.size], _SEAL_CRC.unpack_from(raw, len(raw) - _SEAL_CRC.size)
    if crc32c.crc32c(body) != crc:
        return None
    magic, size, last_seq, last_ts, entries, count = _SEAL_HEAD.unpack_from(body)
    if magic != _SEAL_MAGIC or len(body) != _SEAL_HEAD.size + count * _SEAL_MARK.size:
        return None
    marks = [(int(a), int(b)) for a, b in _SEAL_MARK.iter_unpack(body[_SEAL_HEAD.size :])]
    return size, last_seq, last_ts, entries, marks


def _fsync_file(path: Path) -> None:
    """fsync a file (or a directory: its entries) by path."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _cut_marks(data: bytes, base: int, starts: array[int], marks: list[tuple[int, int]]) -> tuple[bytes, array[int]]:
    """``data`` (segment bytes from offset ``base``) without the producer marks in it, and ``starts``
    (the records' segment offsets, and where the last one ends) as offsets into the result."""
    end = base + len(data)
    pieces, at, cut = [], base, list[tuple[int, int]]()
    for mark_start, mark_end in marks:
        if mark_start >= end:
            break
        pieces.append(data[at - base : mark_start - base])
        at = mark_end
        cut.append((mark_start, mark_end))
    pieces.append(data[at - base :])
    out, k, shift = array("I"), 0, base
    for offset in starts:
        while k < len(cut) and cut[k][0] < offset:
            shift += cut[k][1] - cut[k][0]
            k += 1
        out.append(offset - shift)
    return b"".join(pieces), out


def _fit(chunk: Chunk, begin: int, stop: int, max_bytes: int, max_records: int, *, force: bool) -> int:
    """How far from ``begin`` (towards ``stop``) the chunk fits the limits; at least one record if
    ``force``."""
    stop = min(stop, begin + max(max_records, 0))
    limit = chunk.offsets[begin] + max_bytes
    fits = bisect.bisect_right(chunk.offsets, limit, begin, stop + 1) - 1
    return max(fits, begin + 1) if force and stop > begin else max(fits, begin)


def _join(parts: list[Chunk]) -> Chunk:
    offsets, base = array("I", [0]), 0
    for part in parts:
        offsets.extend(o + base for o in part.offsets[1:])
        base += len(part.data)
    return Chunk(parts[0].first, b"".join(p.data for p in parts), offsets, [k for p in parts for k in p.keys])

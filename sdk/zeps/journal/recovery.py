"""A journal's files and its state as they are read back: opening, recovery, sealing closed segments.

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
"""

from __future__ import annotations

import itertools
import logging
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Self

from zeps._records import RECORD
from zeps.journal._files import fsync_path
from zeps.journal.checkpoint import CommitCheckpoint
from zeps.journal.chunks import Chunk
from zeps.journal.cleaned import finish_compaction
from zeps.journal.config import (
    JournalConfig,
)
from zeps.journal.epochs import EpochHistory
from zeps.journal.producers import SNAPSHOT, Producer, ProducerTable
from zeps.journal.segments import (
    INDEX,
    NAME_DIGITS,
    OFFSET,
    Readers,
    Segment,
    dense_offsets,
    encode_seal,
    read_seal,
    walk_segment,
)

__all__ = ["SegmentFiles"]

log = logging.getLogger(__name__)


class SegmentFiles:
    """A journal's state and its segment files, opened and recovered (the bottom layer of :class:`Journal`)."""

    def __init__(self, directory: Path, config: JournalConfig | None = None, *, name: str = "") -> None:
        self.directory = directory
        self.config = config or JournalConfig()
        self.name = name or directory.name
        #: which leader epoch wrote which records (a replicated stream's; :mod:`zeps.journal.epochs`)
        self.epochs = EpochHistory(directory / "epochs")
        #: the last sequence this replica knows committed (a replicated stream's; :mod:`zeps.journal.checkpoint`)
        self.checkpoint = CommitCheckpoint(directory / "commit")
        self._readers = Readers()
        self._reset()

    def _reset(self) -> None:
        """The state of a journal not opened yet (``open`` reads it from the files)."""
        self._readers.close()
        self._segments: list[Segment] = []
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

    def open(self) -> Self:
        self.directory.mkdir(parents=True, exist_ok=True)
        finish_compaction(self.directory)
        bases = sorted(int(p.stem) for p in self.directory.glob("*.log") if p.stem.isdigit())
        for base, after in itertools.pairwise(bases):  # closed segments: their seal, else a full read (which seals)
            seg = self._load_sealed(base)
            if seg is None:
                seg = self._load(base, last=False, below=after)
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
            self._segments.append(Segment(1, self._log_path(1), last_seq=0))
        active = self._segments[-1]
        self._next = active.last_seq + 1
        self._synced = active.last_seq  # what survived on disk is as durable as it gets
        self._synced_size = active.size
        self.epochs.load()
        self.checkpoint.load()
        self._last_ts = max((s.last_ts for s in self._segments), default=0)
        self._open_active(active)
        self._since_index = active.size - (active.index[-1][2] if active.index else 0)
        self.expire_producers(self._last_ts)  # the stream's own time: see expire_producers
        return self

    def expire_producers(self, now_ms: int) -> list[str]:
        """Forget idempotent producers idle longer than the TTL at ``now_ms``; returns their names.
        The broker passes the stream's own time (:attr:`last_timestamp_ms`, its newest record's stamp),
        never a replica's clock: replicas of one journal then hold the same producers at the same
        point of it, and a replica whose clock is set wrong forgets nothing early (a failover to it
        would otherwise take a resent publish for a new one)."""
        gone = self.producers.expire(now_ms)
        for name in gone:
            self._journaled.pop(name, None)
        return gone

    def _open_active(self, seg: Segment) -> None:
        self._fd = os.open(seg.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._off_fd = os.open(seg.offsets_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def _close_files(self) -> None:
        """Close the active segment's files (marked closed first: a number is never closed twice)."""
        fd, off_fd, self._fd, self._off_fd = self._fd, self._off_fd, -1, -1
        for number in (fd, off_fd):
            if number >= 0:
                os.close(number)

    def _log_path(self, base: int) -> Path:
        return self.directory / f"{base:0{NAME_DIGITS}d}.log"

    def _load(self, base: int, *, last: bool, below: int = 2**64) -> Segment:
        path = self._log_path(base)
        seg = Segment(base, path, last_seq=base - 1)
        data = path.read_bytes()
        # what follows the first bad entry is dropped; a closed segment may have been compacted (gaps), and
        # so may a compacted stream's active one: a follower's copy of a segment its leader compacted
        starts, marks, good_end = walk_segment(data, base, gaps=not last or self.config.compacts, below=below)
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
        elif not last and below < 2**64:  # intact and closed: it ends where the next begins (its last
            seg.last_seq = below - 1  # records may have been compacted away: gaps, as its seal said)
        seg.size = seg.verified_to = good_end
        self._write_index(seg)
        dense = dense_offsets(data, starts, base, seg.last_seq, good_end)
        seg.gapped = dense is not starts
        seg.offsets_path.write_bytes(dense.tobytes())
        return seg

    def _load_sealed(self, base: int) -> Segment | None:
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
        sealed = read_seal(raw)
        if sealed is None:
            log.warning("journal %s: the seal of %s is damaged; reading the segment whole", self.name, path.name)
            return None
        seal_size, last_seq, last_ts, entries, marks, gapped = sealed
        records = last_seq - base + 1
        if (seal_size, off_size, len(idx)) != (size, records * OFFSET, entries * INDEX.size) or records < 0:
            log.warning("journal %s: %s does not match its seal (size %d, offsets %d, index %d); reading it whole",
                        self.name, path.name, size, off_size, len(idx))  # fmt: skip
            return None
        index = list(INDEX.iter_unpack(idx))
        return Segment(base, path, size=size, last_seq=last_seq, last_ts=last_ts, index=index, marks=marks,
                       gapped=gapped)  # fmt: skip

    def _seal(self, seg: Segment) -> None:
        """Write ``seg``'s seal, once it is closed and its files are durable: what :meth:`_load_sealed`
        reads instead of the records (size, last record, producer marks, index length), with a CRC."""
        seg.path.with_suffix(".idx").touch()  # a segment of marks alone (its records compacted away) has none yet
        for sibling in (seg.offsets_path, seg.path.with_suffix(".idx")):
            fsync_path(sibling)
        fd = os.open(seg.path.with_suffix(".seal"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            self._flush(fd, memoryview(encode_seal(seg)))
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
        for seg, after in zip(closed, [*(s.base for s in closed[1:]), active.base], strict=True):
            self._segments.append(self._load(seg.base, last=False, below=after))
        self._segments.append(self._load(active.base, last=True))

    def _write_index(self, seg: Segment) -> None:
        seg.path.with_suffix(".idx").write_bytes(b"".join(INDEX.pack(*e) for e in seg.index))

    @staticmethod
    def _flush(fd: int, data: memoryview) -> None:
        while data:
            written = os.write(fd, data)
            data = data[written:]

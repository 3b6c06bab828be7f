"""The per-stream journal: append-only segment files, sparse indexes, recovery, retention.

Files in the stream's directory::

    00000000000000000001.log    a segment, named by the sequence of its first record (20 digits)
    00000000000000000001.idx    its sparse index: every ~index_interval_bytes, (sequence, time, offset)

Record layout (all numbers network byte order)::

    offset  size  field
    0       4     length L of everything after this field
    4       4     CRC32C of bytes 8 .. 4+L
    8       8     sequence
    16      8     timestamp, milliseconds since the epoch (never decreases within a stream)
    24      1     key length K
    25      K     key (ASCII)
    25+K    …     body

Recovery (``open``): the last segment is scanned; at the first record that is torn (short), fails
its CRC, or breaks the sequence, the file is truncated there and a warning says how many bytes
went. The next sequence continues from the last good record — or from the segment's name when it
is empty — so sequences never restart, even after retention removed everything.

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
import logging
import os
import struct
import time
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import crc32c

from zeps.errors import ZepsError

__all__ = ["FsyncPolicy", "Journal", "JournalConfig", "JournalError", "Record"]

log = logging.getLogger(__name__)

FsyncPolicy = Literal["always", "group", "interval", "never"]
_HEAD = struct.Struct("!II")  # length, crc
_META = struct.Struct("!QQB")  # sequence, timestamp, key length
_INDEX = struct.Struct("!QQI")  # sequence, timestamp, offset
_NAME_DIGITS = 20


class JournalError(ZepsError):
    """The journal cannot do what was asked (closed, unreadable segment, bad configuration)."""


@dataclass(frozen=True, slots=True)
class Record:
    sequence: int
    timestamp_ms: int
    key: str
    body: bytes

    @property
    def size(self) -> int:
        return _HEAD.size + _META.size + len(self.key) + len(self.body)


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


@dataclass
class _Segment:
    base: int
    path: Path
    size: int = 0
    last_seq: int = 0  # base - 1 when empty
    last_ts: int = 0
    index: list[tuple[int, int, int]] = field(default_factory=list)  # (seq, ts, offset)


def _encode(seq: int, ts: int, key: str, body: bytes) -> bytes:
    raw_key = key.encode("ascii")
    payload = _META.pack(seq, ts, len(raw_key)) + raw_key + body
    return _HEAD.pack(len(payload) + 4, crc32c.crc32c(payload)) + payload


def _scan(data: bytes, start: int, expect_seq: int) -> Iterator[tuple[int, Record]]:
    """Yield (offset, record) for every intact record from ``start``; stop at the first bad one."""
    offset = start
    while offset + _HEAD.size <= len(data):
        length, crc = _HEAD.unpack_from(data, offset)
        end = offset + 4 + length
        if length < 4 + _META.size or end > len(data):
            return
        payload = data[offset + _HEAD.size : end]
        if crc32c.crc32c(payload) != crc:
            return
        seq, ts, klen = _META.unpack_from(payload)
        if seq != expect_seq or _META.size + klen > len(payload):
            return
        key = payload[_META.size : _META.size + klen].decode("ascii", "replace")
        yield offset, Record(seq, ts, key, payload[_META.size + klen :])
        expect_seq += 1
        offset = end


class Journal:
    """One stream's journal. The broker's single writer calls ``append``; readers call ``read``."""

    def __init__(self, directory: Path, config: JournalConfig | None = None, *, name: str = "") -> None:
        self.directory = directory
        self.config = config or JournalConfig()
        self.name = name or directory.name
        self._segments: list[_Segment] = []
        self._fd = -1
        self._next = 1
        self._synced = 0
        self._last_ts = 0
        self._unsynced_since: float | None = None
        self._last_sync = time.monotonic()
        self._cache: deque[Record] = deque()
        self._cache_bytes = 0
        self._since_index = 0

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
    def last_timestamp_ms(self) -> int:
        return self._last_ts

    # -- opening and recovery -------------------------------------------------------------------
    def open(self) -> Journal:
        self.directory.mkdir(parents=True, exist_ok=True)
        bases = sorted(int(p.stem) for p in self.directory.glob("*.log") if p.stem.isdigit())
        for base in bases:
            self._segments.append(self._load(base, last=base == bases[-1]))
        if not self._segments:
            self._segments.append(_Segment(1, self._log_path(1), last_seq=0))
        active = self._segments[-1]
        self._next = active.last_seq + 1
        self._synced = active.last_seq  # what survived on disk is as durable as it gets
        self._last_ts = max((s.last_ts for s in self._segments), default=0)
        self._fd = os.open(active.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._since_index = active.size - (active.index[-1][2] if active.index else 0)
        return self

    def _log_path(self, base: int) -> Path:
        return self.directory / f"{base:0{_NAME_DIGITS}d}.log"

    def _load(self, base: int, *, last: bool) -> _Segment:
        path = self._log_path(base)
        seg = _Segment(base, path, last_seq=base - 1)
        data = path.read_bytes()
        good_end = 0
        since_index = self.config.index_interval_bytes  # index the first record
        for offset, record in _scan(data, 0, base):
            if since_index >= self.config.index_interval_bytes:
                seg.index.append((record.sequence, record.timestamp_ms, offset))
                since_index = 0
            size = record.size
            since_index += size
            good_end = offset + size
            seg.last_seq, seg.last_ts = record.sequence, record.timestamp_ms
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
        seg.size = good_end
        self._write_index(seg)
        return seg

    def _write_index(self, seg: _Segment) -> None:
        seg.path.with_suffix(".idx").write_bytes(b"".join(_INDEX.pack(*e) for e in seg.index))

    # -- writing --------------------------------------------------------------------------------
    def append(self, key: str, body: bytes, *, timestamp_ms: int | None = None) -> int:
        """Append one record; returns its sequence. Written to the kernel before returning."""
        return self.append_many([(key, body)], timestamp_ms=timestamp_ms)

    def append_many(self, entries: Iterable[tuple[str, bytes]], *, timestamp_ms: int | None = None) -> int:
        """Append records in one write; returns the sequence of the last one."""
        if self._fd < 0:
            raise JournalError(f"journal {self.name} is not open")
        now = int(time.time() * 1000) if timestamp_ms is None else timestamp_ms
        ts = max(now, self._last_ts)
        seg = self._segments[-1]
        chunks: list[bytes] = []
        offset = seg.size
        for key, body in entries:
            if offset >= self.config.segment_bytes and offset > 0:
                self._flush(chunks)
                chunks = []
                seg = self._roll()
                offset = 0
            raw = _encode(self._next, ts, key, body)
            if self._since_index >= self.config.index_interval_bytes or not seg.index:
                entry = (self._next, ts, offset)
                seg.index.append(entry)
                with open(seg.path.with_suffix(".idx"), "ab") as idx:
                    idx.write(_INDEX.pack(*entry))
                self._since_index = 0
            chunks.append(raw)
            offset += len(raw)
            self._since_index += len(raw)
            seg.size = offset
            seg.last_seq, seg.last_ts = self._next, ts
            self._cache_add(Record(self._next, ts, key, body))
            self._next += 1
        self._flush(chunks)
        self._last_ts = ts
        if self._unsynced_since is None:
            self._unsynced_since = time.monotonic()
        if self.config.fsync == "always":
            self.sync()
        return self._next - 1

    def _flush(self, chunks: list[bytes]) -> None:
        data = b"".join(chunks)
        while data:
            written = os.write(self._fd, data)
            data = data[written:]

    def _roll(self) -> _Segment:
        self.sync()  # a closed segment is fully durable
        os.close(self._fd)
        seg = _Segment(self._next, self._log_path(self._next), last_seq=self._next - 1)
        self._segments.append(seg)
        self._fd = os.open(seg.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._since_index = self.config.index_interval_bytes
        return seg

    def sync(self) -> None:
        """fsync the active segment: everything written becomes durable."""
        if self._fd >= 0 and self._synced < self.written:
            os.fsync(self._fd)
        self._synced = self.written
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
    def _cache_add(self, record: Record) -> None:
        self._cache.append(record)
        self._cache_bytes += record.size
        while self._cache_bytes > self.config.tail_cache_bytes and len(self._cache) > 1:
            self._cache_bytes -= self._cache.popleft().size

    def read(self, start: int, *, max_records: int = 1000, max_bytes: int = 1 << 20) -> list[Record]:
        """Durable records from sequence ``start`` on (fewer if limits apply; [] at the tail)."""
        start = max(start, self.first_sequence)
        end = self.durable
        if start > end:
            return []
        out: list[Record] = []
        budget = max_bytes
        if self._cache and start >= self._cache[0].sequence:
            first = self._cache[0].sequence
            for i in range(start - first, len(self._cache)):
                record = self._cache[i]
                if record.sequence > end or len(out) >= max_records or (out and record.size > budget):
                    break
                out.append(record)
                budget -= record.size
            return out
        return self._read_disk(start, end, max_records, max_bytes)

    def _read_disk(self, start: int, end: int, max_records: int, max_bytes: int) -> list[Record]:
        i = bisect.bisect_right([s.base for s in self._segments], start) - 1
        seg = self._segments[max(i, 0)]
        positions = [e[0] for e in seg.index]
        j = bisect.bisect_right(positions, start) - 1
        offset, expect = (seg.index[j][2], seg.index[j][0]) if j >= 0 else (0, seg.base)
        with open(seg.path, "rb") as f:
            f.seek(offset)
            data = f.read(min(seg.size - offset, max_bytes + (start - expect + 1) * 64 + 65536))
        out: list[Record] = []
        budget = max_bytes
        for _, record in _scan(data, 0, expect):
            if record.sequence < start:
                continue
            if record.sequence > end or len(out) >= max_records or (out and record.size > budget):
                break
            out.append(record)
            budget -= record.size
        if not out and seg.last_seq >= start:
            raise JournalError(f"journal {self.name}: cannot read sequence {start} from {seg.path.name}")
        return out

    def seek_time(self, timestamp_ms: int) -> int:
        """The sequence of the first retained record at or after ``timestamp_ms`` (next if none)."""
        for seg in self._segments:
            if seg.last_seq < seg.base or seg.last_ts < timestamp_ms:
                continue
            times = [e[1] for e in seg.index]
            j = max(bisect.bisect_left(times, timestamp_ms) - 1, 0)
            seq = seg.index[j][0] if seg.index else seg.base
            while seq <= seg.last_seq:
                batch = self._read_disk(seq, seg.last_seq, 1000, 1 << 20)
                for record in batch:
                    if record.timestamp_ms >= timestamp_ms:
                        return record.sequence
                seq = batch[-1].sequence + 1
        return self._next

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
            oldest.path.unlink(missing_ok=True)
            oldest.path.with_suffix(".idx").unlink(missing_ok=True)
            self._segments.pop(0)
            removed.append(oldest.base)
            log.info("journal %s: retention removed segment %d..%d", self.name, oldest.base, oldest.last_seq)
        return removed

    def close(self) -> None:
        if self._fd >= 0:
            self.sync()
            os.close(self._fd)
            self._fd = -1

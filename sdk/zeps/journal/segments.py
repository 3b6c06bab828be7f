"""A segment's files and their formats: the records, the sparse index, the offsets, the seal.

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
"""

from __future__ import annotations

import bisect
import os
import struct
from array import array
from dataclasses import dataclass, field
from pathlib import Path

import crc32c

from zeps._records import META as _META
from zeps._records import OVERHEAD, RECORD
from zeps.journal.config import (
    JournalError,
)
from zeps.journal.producers import MARK_TIMESTAMP, Producer, decode_mark

__all__ = [
    "INDEX",
    "MARK_SPAN",
    "NAME_DIGITS",
    "OFFSET",
    "SEAL_CRC",
    "SEAL_HEAD",
    "SEAL_MAGIC",
    "SEAL_MAGIC_GAPPED",
    "SEAL_MARK",
    "ClosedSegment",
    "IndexFile",
    "Readers",
    "Savepoint",
    "Segment",
    "cut_marks",
    "dense_offsets",
    "encode_seal",
    "read_records",
    "read_seal",
    "walk_segment",
]


INDEX = struct.Struct("!QQI")  # sequence, timestamp, offset
NAME_DIGITS = 20
OFFSET = array("I").itemsize  # bytes per entry of a .off file
# a closed segment's seal (.seal): magic, size, last sequence, last timestamp, index entries, marks,
# then each mark's (start, end), then a CRC32C of all that
SEAL_MAGIC = b"ZEPSEAL1"
SEAL_MAGIC_GAPPED = b"ZEPSEALC"  # the same, of a compacted segment
SEAL_HEAD = struct.Struct("!8sQQQII")
SEAL_MARK = struct.Struct("!QQ")
SEAL_CRC = struct.Struct("!I")
MARK_SPAN = struct.Struct("!II")  # a producer mark's (start, end) in a segment, in a REPLICA-DATA


@dataclass
class Segment:
    base: int
    path: Path
    size: int = 0
    last_seq: int = 0  # base - 1 when empty
    last_ts: int = 0
    index: list[tuple[int, int, int]] = field(default_factory=list)  # (seq, ts, offset)
    marks: list[tuple[int, int]] = field(default_factory=list)  # producer marks: (start, end) offsets
    verified_to: int = 0  # offset up to which its records' CRCs were checked (a sealed one: as they are read)
    #: compacted (:mod:`zeps.journal.compaction`): sequences base .. last_seq with gaps where records
    #: were removed; its .off entry for a removed sequence is where the next kept record starts
    gapped: bool = False

    @property
    def offsets_path(self) -> Path:
        return self.path.with_suffix(".off")


@dataclass(frozen=True, slots=True)
class ClosedSegment:
    """A closed segment as others see it (:meth:`Journal.closed_segments`): its file no longer changes
    until retention removes it, so another thread may read it (:func:`read_records`)."""

    first: int
    last: int  #: first - 1 when it holds no record
    last_ts: int
    size: int  #: bytes on disk, records and producer marks
    path: Path


@dataclass(frozen=True, slots=True)
class Savepoint:
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


class Readers:
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


class IndexFile:
    """Records ``first`` .. ``last`` of a segment's .off file as a sequence of their start offsets,
    read an entry at a time (for bisect: a few reads, not the file)."""

    def __init__(self, readers: Readers, path: Path, base: int, first: int, last: int) -> None:
        self.readers, self.path, self.skip, self.count = readers, path, first - base, max(0, last - first + 1)

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, i: int) -> int:
        raw = self.readers.pread(self.path, OFFSET, (self.skip + i) * OFFSET)
        if len(raw) < OFFSET:
            raise JournalError(f"journal index {self.path.name} lacks entry {self.skip + i}")
        return int(array("I", raw)[0])

    def below(self, offset: int) -> int:
        """How many of the records start before ``offset`` (a read per bisection step)."""
        return bisect.bisect_left(range(self.count), offset, key=self.__getitem__)

    def at_most(self, offset: int) -> int:
        """How many of the records start at or before ``offset`` (a read per bisection step)."""
        return bisect.bisect_right(range(self.count), offset, key=self.__getitem__)


def walk_segment(
    data: bytes, base: int, *, gaps: bool = False, below: int = 2**64
) -> tuple[array[int], list[tuple[int, int, int, dict[str, Producer]]], int]:
    """(record starts, producer marks as (start, end, kind, producers), where the intact part ends) of
    a segment whose first record is ``base``. Intact: each entry's length fits and its CRC32C matches;
    records have the sequences base, base + 1, … (with ``gaps``, a closed segment that may have been
    compacted: increasing sequences from ``base`` on, each below ``below``, the next segment's base);
    a mark sits where the sequence before it ended and decodes; and the last group has all its records
    (else it is cut off, mark included)."""
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
            if offset + OVERHEAD + klen > end or not expect <= sequence < below or (sequence != expect and not gaps):
                break
            starts.append(offset)
            expect = sequence + 1
            missing = max(missing - 1, 0)
        offset = end
    if missing:  # the last group's records did not all reach the disk: drop the group, mark included
        del starts[bisect.bisect_left(starts, group_at) :]
        del marks[-1]
        offset = group_at
    return starts, marks, offset


def read_seal(raw: bytes) -> tuple[int, int, int, int, list[tuple[int, int]], bool] | None:
    """(size, last sequence, last timestamp, index entries, marks, whether it is compacted) of a seal;
    None if it is damaged."""
    if len(raw) < SEAL_HEAD.size + SEAL_CRC.size:
        return None
    body, (crc,) = raw[: -SEAL_CRC.size], SEAL_CRC.unpack_from(raw, len(raw) - SEAL_CRC.size)
    if crc32c.crc32c(body) != crc:
        return None
    magic, size, last_seq, last_ts, entries, count = SEAL_HEAD.unpack_from(body)
    if magic not in (SEAL_MAGIC, SEAL_MAGIC_GAPPED) or len(body) != SEAL_HEAD.size + count * SEAL_MARK.size:
        return None
    marks = [(int(a), int(b)) for a, b in SEAL_MARK.iter_unpack(body[SEAL_HEAD.size :])]
    return size, last_seq, last_ts, entries, marks, magic == SEAL_MAGIC_GAPPED


def encode_seal(seg: Segment) -> bytes:
    """A closed segment's seal (see :func:`read_seal`)."""
    magic = SEAL_MAGIC_GAPPED if seg.gapped else SEAL_MAGIC
    body = SEAL_HEAD.pack(magic, seg.size, seg.last_seq, seg.last_ts, len(seg.index), len(seg.marks))
    body += b"".join(SEAL_MARK.pack(*mark) for mark in seg.marks)
    return body + SEAL_CRC.pack(crc32c.crc32c(body))


def dense_offsets(data: bytes, starts: array[int], base: int, last: int, end: int) -> array[int]:
    """A segment's .off entries for sequences ``base .. last`` from its records' ``starts`` in ``data``
    (which ends at ``end``): each sequence's record start, or for a sequence compacted away, where the
    next kept record starts (``end`` past the last one). Without gaps this is ``starts``."""
    if len(starts) == last - base + 1:
        return starts
    out, sequence_at = array("I"), _META.unpack_from
    for offset in starts:
        sequence = sequence_at(data, offset + 8)[0]
        out.extend([offset] * (sequence - base + 1 - len(out)))
    out.extend([end] * (last - base + 1 - len(out)))
    return out


def cut_marks(data: bytes, base: int, starts: array[int], marks: list[tuple[int, int]]) -> tuple[bytes, array[int]]:
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


def read_records(segment: ClosedSegment, first: int, last: int) -> tuple[bytes, array[int]]:
    """The records ``first .. last`` of a closed segment as stored, without its producer marks (the
    bytes a DELIVER-BATCH carries), and where each starts in them (and where the last ends), read from
    its file with a descriptor of its own (any thread may). A compacted segment holds only the kept
    records of that range. JournalError if the file does not hold all of them intact."""
    if not segment.first <= first <= last <= segment.last:
        raise JournalError(f"records {first}..{last} are not in segment {segment.first}..{segment.last}")
    try:
        data = segment.path.read_bytes()
    except OSError as exc:
        raise JournalError(f"segment {segment.path}: {exc.strerror or exc}") from None
    starts, marks, end = walk_segment(data, segment.first, gaps=True)
    walked_to = _META.unpack_from(data, starts[-1] + 8)[0] if len(starts) else segment.first - 1
    if walked_to < last and end < max(len(data), segment.size):
        raise JournalError(f"segment {segment.path} holds intact records up to {walked_to}, "
                           f"not {segment.first}..{last}")  # fmt: skip
    dense = dense_offsets(data, starts, segment.first, segment.last, end)
    begin = dense[first - segment.first]
    stop = dense[last - segment.first + 1] if last < segment.last else end
    # marks between the records are cut out; one right after the last record is beyond ``stop`` already
    kept = [(a, b) for a, b, _, _ in marks if begin <= a < stop]
    wanted = array("I", starts[bisect.bisect_left(starts, begin) : bisect.bisect_left(starts, stop)])
    records, offsets = cut_marks(data[begin:stop], begin, wanted, kept)
    offsets.append(len(records))
    return records, offsets

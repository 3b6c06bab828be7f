"""Compaction: a compacted journal keeps the latest record of each key.

A journal whose ``cleanup`` includes ``compact`` rewrites its closed segments without the records a
later record of the same key superseded. What readers see:

* **Sequences never change and order is kept.** A compacted segment keeps its name, its first and last
  sequence; the records it lost leave gaps (a read from a sequence compacted away starts at the next
  kept one, as after retention). A reader from 0 sees at least the latest record of every key.
* **A delete is a tombstone**: a record with an empty body. It supersedes the key's values like any
  record, and is itself removed once it is ``tombstone_retention_ms`` old (by its own timestamp), so a
  reader that starts within that window sees the delete.
* **The active segment is never compacted**, and a key's latest record in it does not supersede
  anything in the closed ones before the segment closes: a pass looks at closed segments only.

When: a pass scans the closed segments (oldest first, mapping each key to its latest sequence, at most
``compaction_max_keys`` keys: past that it stops and compacts the segments mapped so far; a stream
with more distinct keys in its closed segments than that compacts only its oldest ones, until a map
of the segments not compacted yet, as Kafka's cleaner keeps, takes this one's place) and starts
rewriting only if the superseded share of their records (and expired tombstones) is at least
``min_cleanable_ratio``. It scans again once a segment closes or a kept tombstone expires, not before.

How: one segment at a time, its kept records are written beside it (``.cleaned`` files) and put in
its place by :func:`~zeps.journal.cleaned.commit_cleaned`, so the disk holds at most one segment more
than before, and a crash at any point leaves the old or the new segment whole (recovery finishes a
committed swap). Reads and writes are held to ``compaction_bytes_per_s``. A compacted segment's
producer marks become one snapshot at its start with the producers as they were at its end (what
the marks it had added up to). Its .off file keeps an entry per sequence (a removed one points to
the next kept record), so reads find any sequence with two preads as before.
"""

from __future__ import annotations

import logging
import os
import time
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from zeps._records import META, OVERHEAD, RECORD, encode_record
from zeps.journal.cleaned import SUFFIXES, cleaned_path, commit_cleaned, write_durably
from zeps.journal.config import JournalConfig, JournalWriteError
from zeps.journal.copying import Copying
from zeps.journal.producers import MARK_TIMESTAMP, SNAPSHOT, Producer, encode_mark_body
from zeps.journal.segments import INDEX, Segment, encode_seal, walk_segment

__all__ = ["Compacting", "CompactionReport", "Throttle", "is_tombstone"]

log = logging.getLogger(__name__)

_TOMBSTONE_LENGTH = 4 + META.size  # a record's length field when its body is empty, beside its key


def is_tombstone(length: int, key_length: int) -> bool:
    """Whether a record with this length field and key length has an empty body: a delete."""
    return length == _TOMBSTONE_LENGTH + key_length


class Throttle:
    """An I/O budget: :meth:`spend` sleeps as long as the bytes spent so far are ahead of
    ``bytes_per_s`` (None: never sleeps). Clock and sleep are given, so a test runs it in no time."""

    def __init__(
        self,
        bytes_per_s: int | None,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.bytes_per_s, self.clock, self.sleep = bytes_per_s, clock, sleep
        self.started, self.spent, self.slept = clock(), 0, 0.0

    def spend(self, count: int) -> None:
        self.spent += count
        if self.bytes_per_s is None:
            return
        ahead = self.spent / self.bytes_per_s - (self.clock() - self.started)
        if ahead > 0:
            self.slept += ahead
            self.sleep(ahead)


@dataclass
class CompactionReport:
    """What one pass found and did."""

    records: int = 0  #: records in the closed segments it scanned
    keys: int = 0  #: distinct keys among them
    superseded: int = 0  #: records a later one of the same key superseded, plus expired tombstones
    segments: int = 0  #: segments rewritten
    removed: int = 0  #: records removed
    bytes_before: int = 0  #: the rewritten segments' size before
    bytes_after: int = 0  #: and after
    slept_s: float = 0.0  #: time the I/O budget held it back
    next_expiry_ms: int = 1 << 62  #: when the first tombstone it kept expires (a pass is due then)

    @property
    def ratio(self) -> float:
        """The superseded share of the records scanned (0 when there were none)."""
        return self.superseded / self.records if self.records else 0.0


@dataclass
class KeyMap:
    """What a pass's first step found (:func:`map_keys`): each key's latest sequence in the closed
    segments scanned, the time of each latest record that is a tombstone, the segments scanned."""

    latest: dict[bytes, int] = field(default_factory=dict)
    tombstones: dict[bytes, int] = field(default_factory=dict)
    records: int = 0
    segments: list[Segment] = field(default_factory=list)

    def report(self, config: JournalConfig, now_ms: int) -> CompactionReport:
        """The pass's report so far: what is superseded at ``now_ms``, when the next tombstone expires."""
        cutoff = now_ms - config.tombstone_retention_ms
        expired = sum(1 for ts in self.tombstones.values() if ts <= cutoff)
        kept = [ts + config.tombstone_retention_ms for ts in self.tombstones.values() if ts > cutoff]
        return CompactionReport(records=self.records, keys=len(self.latest),
                                superseded=self.records - len(self.latest) + expired,
                                next_expiry_ms=min(kept, default=1 << 62))  # fmt: skip


@dataclass(frozen=True)
class Cleaned:
    """A segment's compacted files, written and fsynced beside it (``.cleaned``), waiting for
    :meth:`Compacting.install` to put them in its place."""

    old_size: int  #: the segment's size it was made from (install refuses it if that changed)
    new: Segment  #: the segment as it is once installed
    removed: int  #: records it lost


def read_segment(seg: Segment) -> bytes:
    """A closed segment's bytes, read with a descriptor of its own (any thread may)."""
    fd = os.open(seg.path, os.O_RDONLY)
    try:
        return os.pread(fd, seg.size, 0)
    finally:
        os.close(fd)


def map_keys(closed: list[Segment], config: JournalConfig, throttle: Throttle, *, name: str = "") -> KeyMap:
    """A pass's first step: read the closed segments oldest first (files only: any thread may), each
    key's latest sequence, up to ``compaction_max_keys`` keys; stops before a damaged segment (left for
    reads to report) or one that retention removed meanwhile."""
    keys = KeyMap()
    latest, tombstones, unpack = keys.latest, keys.tombstones, RECORD.unpack_from
    for seg in closed:
        if len(latest) >= config.compaction_max_keys:
            log.info("journal %s: a compaction pass maps %d keys at most; it stops before segment %d",
                     name, config.compaction_max_keys, seg.base)  # fmt: skip
            break
        try:
            data = read_segment(seg)
        except FileNotFoundError:  # retention removed it meanwhile: the pass ends
            break
        throttle.spend(len(data))
        starts, _, end = walk_segment(data, seg.base, gaps=True)
        if end < seg.size:
            log.warning("journal %s: segment %s is damaged at offset %d; compaction stops before it",
                        name, seg.path.name, end)  # fmt: skip
            break
        for offset in starts:
            length, _, sequence, timestamp, klen = unpack(data, offset)
            key = data[offset + OVERHEAD : offset + OVERHEAD + klen]
            latest[key] = sequence
            if is_tombstone(length, klen):
                tombstones[key] = timestamp
            else:
                tombstones.pop(key, None)
        keys.records += len(starts)
        keys.segments.append(seg)
    return keys


def rewrite(seg: Segment, keys: KeyMap, cutoff: int, config: JournalConfig, throttle: Throttle) -> Cleaned | None:
    """A pass's second step, a segment at a time: write ``seg`` without its superseded records (and
    tombstones at or before ``cutoff``) as ``.cleaned`` files beside it, fsynced (files only: any
    thread may). None if it loses nothing; OSError if the file system fails it (nothing is left
    beside the segment then)."""
    data = read_segment(seg)
    throttle.spend(len(data))
    starts, marks, _ = walk_segment(data, seg.base, gaps=True)
    latest, tombstones, unpack = keys.latest, keys.tombstones, RECORD.unpack_from
    out, dense, index = bytearray(), array("I"), list[tuple[int, int, int]]()
    new_marks = []
    if marks:  # the producers as the segment's marks left them, as one snapshot at its start
        state: dict[str, Producer] = {}
        for _, _, kind, producers in marks:
            if kind == SNAPSHOT:
                state.clear()
            state.update(producers)
        out += encode_record(seg.base - 1, MARK_TIMESTAMP, b"", encode_mark_body(SNAPSHOT, 0, state))
        new_marks.append((0, len(out)))
    interval = config.index_interval_bytes
    since_index, removed = interval, 0  # the first kept record is indexed
    for offset in starts:
        length, _, sequence, timestamp, klen = unpack(data, offset)
        key = data[offset + OVERHEAD : offset + OVERHEAD + klen]
        if latest.get(key, sequence) != sequence or tombstones.get(key, cutoff + 1) <= cutoff:
            removed += 1
            continue
        dense.extend([len(out)] * (sequence - seg.base + 1 - len(dense)))
        if since_index >= interval:
            index.append((sequence, timestamp, len(out)))
            since_index = 0
        out += data[offset : offset + 4 + length]
        since_index += 4 + length
    if not removed:
        return None
    dense.extend([len(out)] * (seg.last_seq - seg.base + 1 - len(dense)))
    new = Segment(seg.base, seg.path, size=len(out), last_seq=seg.last_seq, last_ts=seg.last_ts, index=index,
                  marks=new_marks, verified_to=len(out), gapped=True)  # fmt: skip
    files = {".log": bytes(out), ".off": dense.tobytes(), ".idx": b"".join(INDEX.pack(*e) for e in index),
             ".seal": encode_seal(new)}  # fmt: skip
    try:
        for suffix, content in files.items():
            write_durably(cleaned_path(seg.path.with_suffix(suffix)), content)
            throttle.spend(len(content))
    except OSError:  # a full volume: the segment stays as it was
        discard(seg.path)
        raise
    return Cleaned(seg.size, new, removed)


def run_pass(
    closed: list[Segment],
    config: JournalConfig,
    now_ms: int,
    install: Callable[[Cleaned], bool],
    throttle: Throttle,
    *,
    name: str = "",
) -> CompactionReport:
    """One pass over ``closed`` (files only, but for ``install``): map the keys and, if enough records
    are superseded, rewrite one segment at a time, each handed to ``install`` (the journal's owner puts
    it in place; False: it was not, and the pass ends) before the next is written. A segment that
    retention removed meanwhile ends the pass; JournalWriteError if the file system fails a rewrite
    (that segment stays as it was)."""
    keys = map_keys(closed, config, throttle, name=name)
    report = keys.report(config, now_ms)
    if report.superseded and report.ratio >= config.min_cleanable_ratio:
        cutoff = now_ms - config.tombstone_retention_ms
        for seg in keys.segments:
            try:
                cleaned = rewrite(seg, keys, cutoff, config, throttle)
            except FileNotFoundError:  # retention removed it meanwhile (delete,compact)
                break
            except OSError as exc:
                raise JournalWriteError(name, exc) from None
            if cleaned is None:
                continue
            if not install(cleaned):  # the segment changed, or its owner stops
                break
            report.segments += 1
            report.removed += cleaned.removed
            report.bytes_before += cleaned.old_size
            report.bytes_after += cleaned.new.size
        if report.segments:
            log.info("journal %s: compacted %d segments: %d records removed (%.0f%% superseded), %d bytes to %d",
                     name, report.segments, report.removed, 100 * report.ratio, report.bytes_before,
                     report.bytes_after)  # fmt: skip
    report.slept_s = throttle.slept
    return report


def discard(log_path: Path) -> None:
    """Remove a segment's ``.cleaned`` files (a rewrite that failed or will not be installed)."""
    for suffix in SUFFIXES:
        cleaned_path(log_path.with_suffix(suffix)).unlink(missing_ok=True)


class Compacting(Copying):
    """Compaction of closed segments (see the module's notes). :meth:`compact` runs a pass in the
    caller's thread; a broker runs the reading and writing on a thread of its own
    (:func:`map_keys`, :func:`rewrite` on :meth:`compaction_view`) and :meth:`install` on its loop."""

    _compaction_seen: tuple[tuple[tuple[int, int], ...], int] | None = None  # (closed segments, next expiry)

    def compaction_due(self, now_ms: int, upto: int | None = None) -> bool:
        """Whether a pass should run: the journal compacts, and a segment closed (or one changed) or a
        kept tombstone expired since the last pass. ``upto``: only segments wholly at or below this
        sequence may be compacted (a replica's commit checkpoint: never a record that may be cut)."""
        if not self.config.compacts or len(self._segments) < 2:
            return False
        last = self._compaction_seen
        return last is None or last[0] != self._closed_signature(upto) or now_ms >= last[1]

    def compaction_view(self, upto: int | None = None) -> list[Segment]:
        """Copies of the closed segments (those wholly at or below ``upto``), oldest first, for a pass on
        another thread."""
        return [replace(s, index=list(s.index), marks=list(s.marks)) for s in self._compactable(upto)]

    def compaction_done(self, report: CompactionReport, upto: int | None = None) -> None:
        """Note a finished pass: the next is due once a segment closes (or comes under ``upto``) or its
        first kept tombstone expires."""
        self._compaction_seen = (self._closed_signature(upto), report.next_expiry_ms)

    def _compactable(self, upto: int | None) -> list[Segment]:
        closed = self._segments[:-1]
        return closed if upto is None else [s for s in closed if s.last_seq <= upto]

    def _closed_signature(self, upto: int | None = None) -> tuple[tuple[int, int], ...]:
        return tuple((s.base, s.size) for s in self._compactable(upto))

    def install(self, cleaned: Cleaned, step: Callable[[str], None] | None = None) -> bool:
        """Put a rewritten segment in place (the journal's owner, between its reads); ``step`` is called
        after each step that changes the disk (the crash tests stop there). False, and its files
        removed, if the segment is no longer what it was made from (retention removed it, a read found
        it damaged)."""
        new = cleaned.new
        found = [s for s in self._segments[:-1] if s.base == new.base]
        if not found or found[0].size != cleaned.old_size:
            discard(new.path)
            return False
        seg = found[0]
        (step or _no_step)("written")
        self._readers.forget(seg.path)
        self._readers.forget(seg.offsets_path)
        commit_cleaned(seg.path, step or _no_step)
        seg.size, seg.index, seg.marks, seg.verified_to, seg.gapped = new.size, new.index, new.marks, new.size, True
        self._forget_cached(seg.last_seq)
        return True

    def compact(
        self,
        *,
        now_ms: int | None = None,
        force: bool = False,
        step: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        upto: int | None = None,
    ) -> CompactionReport | None:
        """Run a compaction pass in this thread if one is due (``force``: even if nothing changed since
        the last) over the closed segments wholly at or below ``upto``; None if the journal does not
        compact or nothing changed. JournalWriteError if the file system fails a rewrite: that segment
        stays as it was."""
        now = int(time.time() * 1000) if now_ms is None else now_ms
        if not self.config.compacts or not (force or self.compaction_due(now, upto)):
            return None
        throttle = Throttle(self.config.compaction_bytes_per_s, clock=clock, sleep=sleep)
        report = run_pass(self.compaction_view(upto), self.config, now, lambda cleaned: self.install(cleaned, step),
                          throttle, name=self.name)  # fmt: skip
        self.compaction_done(report, upto)
        return report

    def _forget_cached(self, last: int) -> None:
        """Drop the tail cache's chunks holding records up to ``last`` (a compacted segment's): reads
        of them then come from the compacted file. What stays is one run still."""
        drop = 0
        while drop < len(self._cache) and self._cache[drop].first <= last:
            self._cache_bytes -= len(self._cache[drop].data)
            drop += 1
        del self._cache[:drop]


def _no_step(_: str) -> None:
    return None

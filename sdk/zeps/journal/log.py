"""The per-stream journal: append-only segment files, sparse indexes, recovery, retention.

A journal is built in layers, one concept a module, each a subclass of the one below:
:mod:`~zeps.journal.segments` (the files' formats), :mod:`~zeps.journal.recovery` (opening,
recovery, seals), :mod:`~zeps.journal.appending` (appends, rolls, the fsync policy),
:mod:`~zeps.journal.reading` (chunks from the tail cache or disk), :mod:`~zeps.journal.copying` (a
follower's byte-for-byte copy), :mod:`~zeps.journal.compaction` (the latest record per key) and this
one, :class:`Journal`, with retention.
"""

from __future__ import annotations

import logging
import time

from zeps.journal.chunks import Chunk, Record, ReplicaSlice
from zeps.journal.compaction import Compacting, CompactionReport
from zeps.journal.config import (
    DEFAULT_MAX_PRODUCERS,
    DEFAULT_PRODUCER_TTL_MS,
    FsyncPolicy,
    JournalConfig,
    JournalError,
    JournalWriteError,
)
from zeps.journal.segments import ClosedSegment

__all__ = [
    "DEFAULT_MAX_PRODUCERS",
    "DEFAULT_PRODUCER_TTL_MS",
    "Chunk",
    "ClosedSegment",
    "CompactionReport",
    "FsyncPolicy",
    "Journal",
    "JournalConfig",
    "JournalError",
    "JournalWriteError",
    "Record",
    "ReplicaSlice",
]

log = logging.getLogger(__name__)


class Journal(Compacting):
    """One stream's journal. The broker's single writer calls ``append``; readers call ``read``."""

    def closed_segments(self) -> list[ClosedSegment]:
        """Its closed segments, oldest first (every one but the active segment): what a tiered stream
        uploads."""
        return [ClosedSegment(s.base, s.last_seq, s.last_ts, s.size, s.path) for s in self._segments[:-1]]

    def close_idle_segment(self, *, now_ms: int, idle_ms: int) -> bool:
        """Close the active segment if it holds a record and its newest one is ``idle_ms`` old or more
        (by the records' own time): a quiet tiered stream's records then reach the object store within
        about that long, instead of waiting for a segment to fill. ``idle_ms`` 0 closes it whatever the
        records' time (the caller found it idle by its own clock). True if it closed one."""
        active = self._segments[-1]
        if active.last_seq < active.base or (idle_ms > 0 and now_ms - self._last_ts < idle_ms):
            return False
        self._roll()
        return True

    def apply_retention(self, *, now_ms: int | None = None, tiered_to: int | None = None) -> list[int]:
        """Delete whole closed segments past retention (age or bytes); returns their base sequences. A
        tiered stream's (``tiered_to``: the object store holds every record up to it) keeps a segment
        until the store holds all of it, whatever its age or size; its retention is the local copy's,
        so it applies whatever the cleanup (a compacted stream's records stay in the store)."""
        now = int(time.time() * 1000) if now_ms is None else now_ms
        removed: list[int] = []
        while len(self._segments) > 1 and (self.config.deletes or tiered_to is not None):
            oldest = self._segments[0]
            if tiered_to is not None and oldest.last_seq > tiered_to:
                break
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

"""The journal's settings (a ZepsStream's ``journal``, the broker's flags), their defaults and errors."""

from __future__ import annotations

import errno
from dataclasses import dataclass
from typing import Literal

from zeps.errors import ZepsError

__all__ = [
    "CLEANUPS",
    "DEFAULT_COMPACTION_MAX_KEYS",
    "DEFAULT_MAX_PRODUCERS",
    "DEFAULT_MIN_CLEANABLE_RATIO",
    "DEFAULT_PRODUCER_TTL_MS",
    "DEFAULT_TOMBSTONE_RETENTION_MS",
    "MAX_SEGMENT_BYTES",
    "Cleanup",
    "FsyncPolicy",
    "JournalConfig",
    "JournalError",
    "JournalWriteError",
]


FsyncPolicy = Literal["always", "group", "interval", "never"]
#: what happens to old records: ``delete`` by retention (age, bytes), ``compact`` to the latest record
#: per key (:mod:`zeps.journal.compaction`), or both
Cleanup = Literal["delete", "compact", "delete,compact"]
CLEANUPS: tuple[Cleanup, ...] = ("delete", "compact", "delete,compact")
DEFAULT_TOMBSTONE_RETENTION_MS = 24 * 3600 * 1000  #: how long a compacted stream keeps a key's delete
DEFAULT_MIN_CLEANABLE_RATIO = 0.5  #: the share of superseded records in closed segments that starts a compaction
#: distinct keys one compaction pass maps at most: its memory, about 100 MB with keys of 255 bytes
DEFAULT_COMPACTION_MAX_KEYS = 250_000
DEFAULT_PRODUCER_TTL_MS = 24 * 3600 * 1000  # the broker's --producer-ttl, the ZepsStream's producers.ttlSeconds
DEFAULT_MAX_PRODUCERS = 100_000  # --max-producers, producers.max
MAX_SEGMENT_BYTES = 1 << 31  # offsets in a .off file are 4 bytes; a record may overshoot segment_bytes


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
    cleanup: Cleanup = "delete"  #: retention deletes old segments; ``compact`` keeps the latest record per key
    tombstone_retention_ms: int = DEFAULT_TOMBSTONE_RETENTION_MS  #: a delete (empty body) is kept this long
    min_cleanable_ratio: float = DEFAULT_MIN_CLEANABLE_RATIO  #: superseded share that starts a compaction
    compaction_bytes_per_s: int | None = None  #: a compaction's reads and writes at most (None: no limit)
    compaction_max_keys: int = DEFAULT_COMPACTION_MAX_KEYS  #: distinct keys a compaction pass maps at most

    @property
    def deletes(self) -> bool:
        """Whether retention (age, bytes) removes old segments."""
        return "delete" in self.cleanup

    @property
    def compacts(self) -> bool:
        """Whether compaction keeps the latest record per key (:mod:`zeps.journal.compaction`)."""
        return "compact" in self.cleanup

    def __post_init__(self) -> None:
        if not 0 < self.segment_bytes <= MAX_SEGMENT_BYTES:
            raise JournalError(f"segment_bytes={self.segment_bytes}: must be between 1 and {MAX_SEGMENT_BYTES} (2 GiB)")
        if self.producer_ttl_ms <= 0 or self.max_producers <= 0:
            raise JournalError(f"producer TTL {self.producer_ttl_ms} ms and max producers {self.max_producers}: "
                               "both must be above 0")  # fmt: skip
        if self.cleanup not in CLEANUPS:
            raise JournalError(f"cleanup={self.cleanup!r}: must be one of {', '.join(CLEANUPS)}")
        if not 0 <= self.min_cleanable_ratio <= 1 or self.tombstone_retention_ms < 0 or self.compaction_max_keys < 1:
            raise JournalError(f"min_cleanable_ratio={self.min_cleanable_ratio} must be within 0..1, "
                               f"tombstone_retention_ms={self.tombstone_retention_ms} at least 0, "
                               f"compaction_max_keys={self.compaction_max_keys} at least 1")  # fmt: skip
        if self.compaction_bytes_per_s is not None and self.compaction_bytes_per_s <= 0:
            raise JournalError(f"compaction_bytes_per_s={self.compaction_bytes_per_s}: must be above 0 (or unset)")

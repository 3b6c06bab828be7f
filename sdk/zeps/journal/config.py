"""The journal's settings (a ZepsStream's ``journal``, the broker's flags), their defaults and errors."""

from __future__ import annotations

import errno
from dataclasses import dataclass
from typing import Literal

from zeps.errors import ZepsError

__all__ = [
    "DEFAULT_MAX_PRODUCERS",
    "DEFAULT_PRODUCER_TTL_MS",
    "MAX_SEGMENT_BYTES",
    "FsyncPolicy",
    "JournalConfig",
    "JournalError",
    "JournalWriteError",
]


FsyncPolicy = Literal["always", "group", "interval", "never"]
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

    def __post_init__(self) -> None:
        if not 0 < self.segment_bytes <= MAX_SEGMENT_BYTES:
            raise JournalError(f"segment_bytes={self.segment_bytes}: must be between 1 and {MAX_SEGMENT_BYTES} (2 GiB)")
        if self.producer_ttl_ms <= 0 or self.max_producers <= 0:
            raise JournalError(f"producer TTL {self.producer_ttl_ms} ms and max producers {self.max_producers}: "
                               "both must be above 0")  # fmt: skip

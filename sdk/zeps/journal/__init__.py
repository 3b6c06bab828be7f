"""The per-stream journal: segment files, sparse indexes, recovery, retention. No sockets."""

from zeps.journal.log import (
    DEFAULT_MAX_PRODUCERS,
    DEFAULT_PRODUCER_TTL_MS,
    Chunk,
    ClosedSegment,
    CompactionReport,
    FsyncPolicy,
    Journal,
    JournalConfig,
    JournalError,
    JournalWriteError,
    Record,
    ReplicaSlice,
)

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

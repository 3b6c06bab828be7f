"""The per-stream journal: segment files, sparse indexes, recovery, retention. No sockets."""

from zeps.journal.log import Chunk, FsyncPolicy, Journal, JournalConfig, JournalError, Record

__all__ = ["Chunk", "FsyncPolicy", "Journal", "JournalConfig", "JournalError", "Record"]

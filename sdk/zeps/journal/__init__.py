"""The per-stream journal (seed 004): segment files, sparse indexes, recovery, retention. No sockets."""

from zeps.journal.log import Chunk, FsyncPolicy, Journal, JournalConfig, JournalError, Record

__all__ = ["Chunk", "FsyncPolicy", "Journal", "JournalConfig", "JournalError", "Record"]

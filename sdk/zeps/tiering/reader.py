"""Reads of a tiered stream's records from the object store: the runs its manifest lists as
``copy-finished`` (:mod:`zeps.tiering.manifest`), as the same :class:`~zeps.journal.Chunk` a local
read gives, so whoever serves a replay sends them as it sends the journal's.

Every object is checked twice: by the store (its length and the CRC32C its reference names) and here
(:func:`~zeps.tiering.objects.decode_object`: that CRC32C again, the index against the records, the
sequences exactly the entry's run). Fetched objects are
kept in a cache directory, bounded in bytes (the least recently used go first), written atomically;
one read from the cache is checked like one from the store. The most recently read object is also
kept parsed in memory, so a replay reading forward asks for it once, and the next object's GET begins
as one is read (at most one ahead), so the store's latency overlaps the reader's work.
"""

from __future__ import annotations

import bisect
import logging
import os
import tempfile
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from zeps.batchstore import BatchLostError, BatchStore
from zeps.batchstore.format import reference_crc
from zeps.journal import Chunk
from zeps.journal.chunks import fit_chunk
from zeps.paths import StreamPaths
from zeps.tiering.manifest import TierEntry, current, tiered_to
from zeps.tiering.objects import decode_object
from zeps.tiering.uploader import Manifest

__all__ = ["DEFAULT_CACHE_BYTES", "TierReader"]

log = logging.getLogger(__name__)

#: bytes of fetched objects the cache keeps by default
DEFAULT_CACHE_BYTES = 256 << 20


class TierReader:
    """The records of one stream (or partition) that its object store holds."""

    def __init__(self, zk: Any, paths: StreamPaths, store: BatchStore, *, cache: Path | None = None,
                 cache_bytes: int = DEFAULT_CACHE_BYTES) -> None:  # fmt: skip
        self.zk, self.paths, self.store = zk, paths, store
        self.cache, self.cache_bytes = cache, cache_bytes
        self.fetches = 0  #: objects read from the store (not from the cache)
        self._entries: list[TierEntry] = []
        self._manifest = Manifest(zk, paths)
        self._hot: tuple[str, Chunk] | None = None  # the last object read, parsed
        self._ahead: tuple[str, Future[bytes]] | None = None  # the next object's GET, begun early
        self._pool: ThreadPoolExecutor | None = None

    def close(self) -> None:
        """Stop reading ahead (a GET under way finishes in its thread, its object unused)."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool, self._ahead = None, None

    def refresh(self, *, full: bool = False) -> list[TierEntry]:
        """Read the manifest again (what it lists finished and contiguous from the lowest is readable);
        ``full``: every node of it, none taken from the last read."""
        entries, _ = self._manifest.read(full=full)
        done = tiered_to(entries)
        self._entries = [e for e in current(entries) if e.last <= done]
        return self._entries

    @property
    def first_sequence(self) -> int:
        """The oldest record the store holds (0: none)."""
        return self._entries[0].first if self._entries else 0

    @property
    def last_sequence(self) -> int:
        """The newest record the store holds (0: none)."""
        return self._entries[-1].last if self._entries else 0

    def read_chunk(self, start: int, *, max_bytes: int = 1 << 20, max_records: int = 1 << 30,
                   end: int | None = None) -> Chunk | None:  # fmt: skip
        """Records from ``start`` (or the oldest the store holds, if later) up to ``end`` (default: all
        it holds), within one object and ``max_bytes`` (but at least one record); None when the store
        holds none of them. A compacted stream's chunk may skip sequences (``Chunk.sequence``): the
        records compaction removed, and whole runs it emptied."""
        if not self._entries:
            return None
        start = max(start, self.first_sequence)
        end = self.last_sequence if end is None else min(end, self.last_sequence)
        while start <= end and self._entries:
            i = bisect.bisect_right(self._entries, start, key=lambda e: e.first) - 1
            entry, chunk = self._object_again_if_replaced(self._entries[max(i, 0)])
            if chunk.sequences is None:
                begin, stop = start - entry.first, min(end, entry.last) - entry.first + 1
            else:  # compacted: the records at or after start, up to end
                begin = bisect.bisect_left(chunk.sequences, start)
                stop = bisect.bisect_right(chunk.sequences, end)
            if begin < stop:
                return chunk.part(begin, fit_chunk(chunk, begin, stop, max_bytes, max_records, force=True))
            start = entry.last + 1  # none left of this run: the next one's
        return None

    def _object_again_if_replaced(self, entry: TierEntry) -> tuple[TierEntry, Chunk]:
        """``entry`` and its object; if that is gone, the manifest read again: a compacted generation may
        have replaced it (the run's newest one is read then), else the loss is raised."""
        try:
            return entry, self._object(entry)
        except BatchLostError:
            runs = self.refresh(full=True)
            newer = next((e for e in runs if e.first == entry.first and e.generation > entry.generation), None)
            if newer is None:
                raise
            return newer, self._object(newer)

    def seek_time(self, timestamp_ms: int) -> int:
        """The first sequence the store holds with a timestamp at or after ``timestamp_ms`` (0: none)."""
        for entry in self._entries:
            if entry.last_ts >= timestamp_ms and entry.count:
                chunk = self._object(entry)
                for i in range(len(chunk)):
                    if chunk.record(i).timestamp_ms >= timestamp_ms:
                        return chunk.sequence(i)
        return 0

    # -- objects ------------------------------------------------------------------------------------
    def _object(self, entry: TierEntry) -> Chunk:
        if self._hot is not None and self._hot[0] == entry.key:
            return self._hot[1]
        crc = reference_crc(entry.reference)
        if crc is None:
            raise BatchLostError(f"tiered object {entry.key}: its reference names no CRC32C ({entry.reference!r})")
        data = self._cached(entry)
        if data is not None:
            try:
                chunk = decode_object(entry, data, crc)
            except BatchLostError as exc:
                log.warning("tier cache %s: %s; reading it from the store again", entry.key, exc)
                chunk = None
        else:
            chunk = None
        if chunk is None:
            raw = self._fetch(entry)
            self.fetches += 1
            chunk = decode_object(entry, raw, crc)
            self._keep(entry, raw)
        self._hot = (entry.key, chunk)
        self._read_ahead(entry)
        return chunk

    def _fetch(self, entry: TierEntry) -> bytes:
        """The object's payload from the store: the GET begun ahead for it, if there is one."""
        ahead, self._ahead = self._ahead, None
        if ahead is not None and ahead[0] == entry.key:
            try:
                return ahead[1].result()
            except Exception:
                log.debug("tier read-ahead of %s failed; reading it again", entry.key)
        return bytes(self.store.get(entry.reference))

    def _read_ahead(self, entry: TierEntry) -> None:
        """Begin the GET of the object after ``entry`` (a replay reads forward), unless the cache has
        it: its records arrive while the caller sends these. At most one object is held ahead."""
        i = bisect.bisect_left(self._entries, entry.first, key=lambda e: e.first)
        if i + 1 >= len(self._entries):
            return
        following = self._entries[i + 1]
        if (self._ahead is not None and self._ahead[0] == following.key) or (
                self.cache is not None and self._cache_path(following.key).exists()):  # fmt: skip
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="zeps-tier-ahead")
        reference = following.reference
        self._ahead = (following.key, self._pool.submit(lambda: bytes(self.store.get(reference))))

    def _cache_path(self, key: str) -> Path:
        assert self.cache is not None
        return self.cache / f"{key}.records"

    def _cached(self, entry: TierEntry) -> bytes | None:
        if self.cache is None:
            return None
        path = self._cache_path(entry.key)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        os.utime(path)  # most recently used
        return data

    def _keep(self, entry: TierEntry, data: bytes) -> None:
        """Into the cache (atomically), the least recently used out while it holds more than its bound."""
        if self.cache is None or len(data) > self.cache_bytes:
            return
        self.cache.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.cache, prefix=".", suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, self._cache_path(entry.key))
        files = sorted((st.st_mtime, st.st_size, p) for p in self.cache.glob("*.records") for st in [p.stat()])
        total = sum(size for _, size, _ in files)
        for _, size, path in files:  # the least recently used first
            if total <= self.cache_bytes:
                break
            total -= size
            path.unlink(missing_ok=True)

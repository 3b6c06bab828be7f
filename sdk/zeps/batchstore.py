"""Batch bodies: their byte format, and the stores that keep the large ones outside ZooKeeper.

Batch format (inline in ZooKeeper or as a store object)::

    offset  size  field
    0       3     magic "ZQB"
    3       1     version, 1
    4       4     record count C, unsigned, network byte order
    8       …     C times: length L (4 bytes) then L bytes of one record

Store object format (what a store keeps, so a torn or corrupt object is detected on read)::

    0       4     magic "ZBS1"
    4       8     payload length, network byte order
    12      4     CRC32C of the payload
    16      …     payload (a batch, as above)

A store is named by a URL. ``file:///path`` is a local or mounted directory (a PersistentVolume in
Kubernetes): objects are written to a temporary file, fsynced, renamed into place and the directory
fsynced, so a reader never sees a half-written batch. Another kind of store (object storage)
implements :class:`BatchStore` and registers its URL scheme in ``STORES``.
"""

from __future__ import annotations

import os
import struct
import tempfile
import time
import urllib.parse
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

import crc32c

from zeps._framing import join_records, split_records
from zeps.errors import ConfigError, ZepsError

__all__ = ["STORES", "BatchStore", "BatchStoreError", "FileBatchStore", "decode_batch", "encode_batch", "open_store"]

_BATCH = struct.Struct("!3sBI")
_OBJECT = struct.Struct("!4sQI")


class BatchStoreError(ZepsError):
    """A batch could not be stored or read back intact."""


def encode_batch(records: Sequence[bytes]) -> bytes:
    return _BATCH.pack(b"ZQB", 1, len(records)) + join_records(records)


def decode_batch(data: bytes) -> list[bytes]:
    if len(data) < _BATCH.size:
        raise BatchStoreError(f"batch truncated: {len(data)} bytes")
    magic, version, count = _BATCH.unpack_from(data)
    if magic != b"ZQB" or version != 1:
        raise BatchStoreError(f"not a version-1 batch (magic {magic!r}, version {version})")
    return split_records(data, _BATCH.size, count, "record", _BatchFormatError)


class _BatchFormatError(BatchStoreError):
    def __init__(self, detail: str) -> None:
        super().__init__(f"batch {detail}")


class BatchStore(Protocol):
    """Where large batches live. Objects are immutable: written once, read many times, deleted."""

    url: str

    def put(self, key: str, data: bytes) -> str:
        """Store ``data`` under ``key`` atomically; return the object's URL."""
        ...

    def get(self, url: str) -> bytes:
        """The object's bytes, verified; BatchStoreError if missing, torn or corrupt."""
        ...

    def delete(self, url: str) -> None:
        """Remove the object (no error if it is already gone)."""
        ...


class FileBatchStore:
    """A directory of batch objects (``file:///path``), written atomically."""

    def __init__(self, url: str) -> None:
        parsed = urllib.parse.urlparse(url)
        if parsed.scheme != "file" or parsed.netloc not in ("", "localhost") or not parsed.path.startswith("/"):
            raise ConfigError(f"batch store URL {url!r} must look like file:///absolute/path")
        self.url = url
        self.root = Path(parsed.path)

    def _path(self, url: str) -> Path:
        parsed = urllib.parse.urlparse(url)
        path = Path(parsed.path)
        if parsed.scheme != "file" or path.parent != self.root:
            raise BatchStoreError(f"{url!r} is not an object of the store {self.url!r}")
        return path

    def put(self, key: str, data: bytes) -> str:
        if "/" in key or key.startswith("."):
            raise BatchStoreError(f"batch key {key!r} must be a plain file name")
        self.root.mkdir(parents=True, exist_ok=True)
        final = self.root / f"{key}.batch"
        header = _OBJECT.pack(b"ZBS1", len(data), crc32c.crc32c(data))
        fd, tmp = tempfile.mkstemp(dir=self.root, prefix=f".{key}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(header)
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, final)  # atomic: readers see nothing or everything
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        dir_fd = os.open(self.root, os.O_RDONLY)
        try:
            os.fsync(dir_fd)  # the rename itself survives a crash
        finally:
            os.close(dir_fd)
        return final.as_uri()

    def get(self, url: str) -> bytes:
        path = self._path(url)
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            raise BatchStoreError(
                f"batch object {path} is missing (removed by retention, or the volume changed)"
            ) from None
        if len(raw) < _OBJECT.size:
            raise BatchStoreError(f"batch object {path} is torn: {len(raw)} bytes")
        magic, length, crc = _OBJECT.unpack_from(raw)
        payload = raw[_OBJECT.size :]
        if magic != b"ZBS1" or len(payload) != length:
            raise BatchStoreError(
                f"batch object {path} is torn or foreign (expected {length} bytes, got {len(payload)})"
            )
        if crc32c.crc32c(payload) != crc:
            raise BatchStoreError(f"batch object {path} is corrupt: CRC32C mismatch")
        return payload

    def delete(self, url: str) -> None:
        self._path(url).unlink(missing_ok=True)

    def remove_stale_temporaries(self, older_than: float = 3600) -> int:
        """Delete temporary files left by writers that crashed mid-write; returns how many."""
        removed = 0
        cutoff = time.time() - older_than
        for tmp in self.root.glob(".*.tmp"):
            if tmp.stat().st_mtime < cutoff:
                tmp.unlink(missing_ok=True)
                removed += 1
        return removed


#: URL scheme -> store class; object storage adds its own here
STORES: dict[str, Callable[[str], BatchStore]] = {"file": FileBatchStore}


def open_store(url: str) -> BatchStore:
    scheme = urllib.parse.urlparse(url).scheme
    if scheme not in STORES:
        raise ConfigError(
            f"batch store URL {url!r}: scheme {scheme!r} is not supported; use one of "
            f"{', '.join(sorted(s + '://' for s in STORES))}"
        )
    return STORES[scheme](url)

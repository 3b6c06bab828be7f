"""``file:///path``: a local or mounted directory (in Kubernetes a PersistentVolume) of batch objects.

Each object is written to a temporary file, fsynced, renamed into place and the directory fsynced,
so a reader never sees a half-written batch, and a rename that returned survives a crash. A
ReadWriteOnce volume is mounted on one node only: for readers on several nodes use ``s3://``.
"""

from __future__ import annotations

import os
import tempfile
import time
import urllib.parse
from pathlib import Path

from zeps.batchstore.format import (
    BatchLostError,
    BatchStoreError,
    ForeignObjectError,
    Prefetch,
    object_header,
    object_payload,
    reference,
    reference_crc,
)
from zeps.errors import ConfigError

__all__ = ["FileBatchStore"]


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
            raise ForeignObjectError(f"{url!r} is not an object of the store {self.url!r}")
        return path

    def put(self, key: str, data: bytes) -> str:
        if "/" in key or key.startswith("."):
            raise BatchStoreError(f"batch key {key!r} must be a plain file name")
        self.root.mkdir(parents=True, exist_ok=True)
        final = self.root / f"{key}.batch"
        header = object_header(data)
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
        return reference(final.as_uri(), header)

    def get(self, url: str, prefetched: Prefetch | None = None) -> memoryview:
        """The object at ``url``, checked (``prefetched`` is always None here: see :meth:`prefetch`)."""
        path = self._path(url)
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            raise BatchLostError(
                f"batch object {path} is missing (removed by retention, or the volume changed)"
            ) from None
        return object_payload(raw, str(path), reference_crc(url))

    def object_url(self, key: str) -> str:
        return (self.root / f"{key}.batch").as_uri()

    def prefetch(self, key: str) -> None:
        """Nothing: a file (from the page cache, most often) is read in less than the lookup takes."""
        return None

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

"""Where large batches live: the :class:`BatchStore` protocol, the stores, and :func:`open_store`.

A store is named by a URL:

* ``file:///path`` (:mod:`zeps.batchstore.file`): a local or mounted directory, a PersistentVolume in
  Kubernetes. Readable on the node that mounts it.
* ``s3://bucket/prefix`` (:mod:`zeps.batchstore.s3`): S3-compatible object storage, readable from
  every node (needs ``zeps[s3]``).

The bytes of a batch and of a stored object are in :mod:`zeps.batchstore.format`. Every store checks
an object's length and CRC32C on read and raises :class:`BatchLostError` (a DataLossError) for a
missing, torn or damaged one. Another kind of store implements :class:`BatchStore` and registers its
URL scheme in ``STORES``.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Callable
from typing import Any, Protocol

from zeps.batchstore.file import FileBatchStore
from zeps.batchstore.format import (
    BatchLostError,
    BatchStoreError,
    ForeignObjectError,
    Prefetch,
    decode_batch,
    encode_batch,
)
from zeps.errors import ConfigError

__all__ = [
    "STORES",
    "BatchLostError",
    "BatchStore",
    "BatchStoreError",
    "FileBatchStore",
    "ForeignObjectError",
    "Prefetch",
    "decode_batch",
    "encode_batch",
    "open_store",
]


class BatchStore(Protocol):
    """Where large batches live. Objects are immutable: written once, read many times, deleted."""

    url: str

    def put(self, key: str, data: bytes) -> str:
        """Store ``data`` under ``key`` atomically; return its reference: the object's URL with the
        CRC32C of ``data`` (``format.reference``)."""
        ...

    def get(self, url: str, prefetched: Prefetch | None = None) -> bytes | memoryview:
        """The object's bytes (or a view of them), verified; BatchLostError if missing, torn, corrupt or
        not the object the reference names. ``prefetched`` (from :meth:`prefetch`) is used if it is
        that object, else read again."""
        ...

    def object_url(self, key: str) -> str:
        """The URL of the object ``put(key, …)`` makes, without its CRC32C: what :meth:`delete` takes
        for an object whose put may or may not have finished (its reference was never learnt)."""
        ...

    def prefetch(self, key: str) -> Prefetch | None:
        """Begin reading the object ``put(key, …)`` makes, before its reference is known (a reader
        overlaps the object's read with its ZooKeeper lookup); None where that gains nothing."""
        ...

    def delete(self, url: str) -> None:
        """Remove the object (no error if it is already gone)."""
        ...


def _file(url: str, **options: Any) -> BatchStore:
    given = sorted(k for k, v in options.items() if v is not None)
    if given:
        raise ConfigError(f"batch store {url!r}: {', '.join('store_' + k for k in given)} applies to s3:// stores only")
    return FileBatchStore(url)


def _s3(url: str, **options: Any) -> BatchStore:
    from zeps.batchstore.s3 import S3BatchStore  # noqa: PLC0415  (obstore is an optional dependency)

    return S3BatchStore(url, **options)


#: URL scheme -> store factory (the URL, then the store options: endpoint, region, path_style,
#: credentials_secret, credentials)
STORES: dict[str, Callable[..., BatchStore]] = {"file": _file, "s3": _s3}


def open_store(
    url: str,
    *,
    endpoint: str | None = None,
    region: str | None = None,
    path_style: bool | None = None,
    credentials_secret: str | None = None,
    credentials: tuple[str, str] | None = None,
) -> BatchStore:
    """The store a URL names, with the object-storage options (ConfigError for an unknown scheme, or
    options the store does not take)."""
    scheme = urllib.parse.urlparse(url).scheme
    if scheme not in STORES:
        raise ConfigError(
            f"batch store URL {url!r}: scheme {scheme!r} is not supported; use one of "
            f"{', '.join(sorted(s + '://' for s in STORES))}"
        )
    return STORES[scheme](
        url,
        endpoint=endpoint,
        region=region,
        path_style=path_style,
        credentials_secret=credentials_secret,
        credentials=credentials,
    )

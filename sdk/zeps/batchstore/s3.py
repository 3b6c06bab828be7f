"""``s3://bucket/prefix``: batch objects in S3-compatible object storage (AWS S3, SeaweedFS, MinIO, Ceph
RGW), readable from every node: the place large batches belong when consumers or Spark executors run
on several nodes.

The client is `obstore <https://developmentseed.org/obstore>`_ (Rust's ``object_store``
under a typed Python API): no dependencies, a connection pool per store, multipart uploads and
bounded retries built in, and reads at close to the network's speed (``make bench-batches``).

What the store promises, and how:

* **Atomic objects.** An S3 PUT, or the completion of a multipart upload, makes the whole object
  visible at once; a writer that dies mid-upload leaves no object (an abandoned multipart upload
  is invisible to readers; a bucket lifecycle rule removes its parts).
* **Integrity.** Each object carries the same header as the file store's (length and CRC32C of the
  payload), checked on every read: a missing, torn or damaged object raises
  :class:`~zeps.batchstore.format.BatchLostError` naming it, never returns bytes. The batch's
  reference names the CRC32C too, so another object stored under the same name since is refused.
* **Reads overlap the lookup.** :meth:`S3BatchStore.prefetch` begins the GET of a batch's object
  (named by its id) while the reader asks ZooKeeper for the reference; :meth:`S3BatchStore.get` uses
  it only if it is the object the reference names, else reads again.
* **Bounded waits.** Connecting takes at most 5 s, a request at most ``timeout`` (60 s), and a
  failing request is retried up to eight times within 15 s (jittered backoff from 0.1 s: a refused
  connection gives up after about 2 s); then the caller gets a BatchStoreError
  that says what failed (bucket missing, access denied, endpoint unreachable).
* **Credentials** given by the caller (``zeps.batches()`` reads the Queue's
  ``batches.storeCredentialsSecret`` through the Kubernetes API when the environment has none), or
  from the environment: ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` (and ``AWS_SESSION_TOKEN``;
  a pod or a Spark executor mounts the Secret with ``envFrom``), web identity
  (``AWS_WEB_IDENTITY_TOKEN_FILE`` with ``AWS_ROLE_ARN``, as IRSA sets them) or ECS-style container
  credentials. The instance metadata service is never asked: a process without credentials gets a
  ConfigError naming what to set. A pickled store carries no credentials.
"""

from __future__ import annotations

import os
import re
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import TYPE_CHECKING, Any

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
from zeps.errors import ConfigError, SetupError

if TYPE_CHECKING:
    from obstore.store import S3Store

__all__ = ["MULTIPART_BYTES", "S3BatchStore", "credentials_in_environment"]

#: objects larger than this are uploaded in parts of this size (S3's minimum part is 5 MiB)
MULTIPART_BYTES = 8 << 20
#: objects read ahead of their references at once, per store (a consumer reads ahead 2 batches)
PREFETCHES = 4
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_CREDENTIALS = (
    ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"),
    ("AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_ROLE_ARN"),
    ("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",),
    ("AWS_CONTAINER_CREDENTIALS_FULL_URI",),
)


def _parse(url: str) -> tuple[str, str]:
    """(bucket, prefix without slashes at either end) of ``s3://bucket/prefix``."""
    parsed = urllib.parse.urlparse(url)
    if parsed.scheme != "s3" or parsed.query or parsed.fragment or parsed.params:
        raise ConfigError(f"batch store URL {url!r} must look like s3://bucket/prefix")
    if not _BUCKET.match(parsed.netloc) or ".." in parsed.netloc:
        raise ConfigError(f"batch store URL {url!r}: {parsed.netloc!r} is not a valid S3 bucket name "
                          "(3-63 lowercase letters, digits, dots and hyphens)")  # fmt: skip
    prefix = parsed.path.strip("/")
    if prefix and any(part in ("", ".", "..") for part in prefix.split("/")):
        raise ConfigError(f"batch store URL {url!r}: the prefix {prefix!r} has an empty, '.' or '..' segment")
    return parsed.netloc, prefix


_DENIED = ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "403 Forbidden")
_UNREACHABLE = ("error sending request", "Connection refused", "tcp connect error", "timed out", "dns error")


def credentials_in_environment() -> bool:
    """Whether the environment holds S3 credentials of a kind this store uses."""
    return any(all(os.environ.get(name) for name in names) for names in _CREDENTIALS)


class S3BatchStore:
    """Batch objects under ``s3://bucket/prefix``: ``<prefix>/<key>.batch``."""

    def __init__(
        self,
        url: str,
        *,
        endpoint: str | None = None,
        region: str | None = None,
        path_style: bool | None = None,
        credentials_secret: str | None = None,
        credentials: tuple[str, str] | None = None,
        timeout_s: float = 60.0,
    ) -> None:
        self.url = url
        self.bucket, self.prefix = _parse(url)
        if endpoint is not None and urllib.parse.urlparse(endpoint).scheme not in ("http", "https"):
            raise ConfigError(f"store_endpoint {endpoint!r} must be an http:// or https:// URL (the S3 API's address)")
        self.endpoint = endpoint
        self.region = region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
        #: S3-compatible servers usually want path-style requests (http://host/bucket/key); AWS virtual-hosted
        self.path_style = path_style if path_style is not None else endpoint is not None
        self._credentials = credentials  #: (access key id, secret key), when given rather than in the environment
        if credentials is None and not credentials_in_environment():
            where = f" (mount the Secret {credentials_secret!r} with envFrom)" if credentials_secret else ""
            raise ConfigError(f"batch store {url}: no S3 credentials in the environment; set AWS_ACCESS_KEY_ID and "
                              f"AWS_SECRET_ACCESS_KEY{where}, or web identity (AWS_WEB_IDENTITY_TOKEN_FILE, "
                              "AWS_ROLE_ARN)")  # fmt: skip
        self.timeout_s = timeout_s
        self._store: S3Store | None = None
        self._prefetcher: ThreadPoolExecutor | None = None  #: made on first prefetch (obstore's GET leaves the GIL)

    # -- the client (made on first use, so a store pickles and forks as its URL and options) ------
    def _client(self) -> S3Store:
        if self._store is None:
            try:
                from obstore.store import S3Store  # noqa: PLC0415
            except ImportError:
                raise SetupError("s3:// batch stores need obstore: pip install 'zeps[s3]'") from None
            config: dict[str, Any] = {"region": self.region, "virtual_hosted_style_request": not self.path_style}
            if self.endpoint is not None:
                config["endpoint"] = self.endpoint
            if self._credentials is not None:
                config["access_key_id"], config["secret_access_key"] = self._credentials
            self._store = S3Store(
                self.bucket,
                config=config,  # type: ignore[arg-type]
                client_options={
                    "allow_http": self.endpoint is not None and self.endpoint.startswith("http://"),
                    "connect_timeout": timedelta(seconds=5),
                    "timeout": timedelta(seconds=self.timeout_s),
                },
                retry_config={
                    "max_retries": 8,  # backing off from 0.1 s to at most 3 s apart
                    "retry_timeout": timedelta(seconds=15),
                    "backoff": {
                        "init_backoff": timedelta(milliseconds=100),
                        "max_backoff": timedelta(seconds=3),
                        "base": 2,
                    },
                },
            )
        return self._store

    def __getstate__(self) -> dict[str, Any]:
        """Without its client, and without credentials: a pickled store (a Spark task's) finds them in
        the environment where it is unpickled, and secrets never travel in a plan."""
        return {**self.__dict__, "_store": None, "_credentials": None, "_prefetcher": None}

    def _where(self) -> str:
        return f"{self.endpoint or 'AWS S3'} ({self.region})"

    def _path(self, url: str) -> str:
        """The object path (in the bucket) of one of this store's object URLs; anything else is refused
        (a URL read from ZooKeeper is not trusted to point where it likes)."""
        parsed = urllib.parse.urlparse(url)
        path = parsed.path.lstrip("/")
        directory, _, name = path.rpartition("/")
        if (parsed.scheme != "s3" or parsed.netloc != self.bucket or directory != self.prefix or not name
                or name.startswith(".") or not name.endswith(".batch")):  # fmt: skip
            raise ForeignObjectError(f"{url!r} is not an object of the store {self.url!r}")
        return path

    def _object_url(self, path: str) -> str:
        return f"s3://{self.bucket}/{path}"

    def _error(self, exc: Exception, doing: str) -> BatchStoreError:
        """A zeps error saying what failed, from obstore's (which raises its own classes, and the
        builtin FileNotFoundError and PermissionError for some answers)."""
        from obstore import exceptions as ox  # noqa: PLC0415

        text = str(exc)
        if "NoSuchBucket" in text:
            return BatchStoreError(f"{doing}: bucket {self.bucket!r} does not exist at {self._where()}; create it "
                                   "(or correct the store URL)")  # fmt: skip
        denied = (PermissionError, ox.PermissionDeniedError, ox.UnauthenticatedError)
        if isinstance(exc, denied) or any(code in text for code in _DENIED):
            return BatchStoreError(f"{doing}: access denied by {self._where()}; check the credentials "
                                   "(AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY) and what they may do in bucket "
                                   f"{self.bucket!r}")  # fmt: skip
        if any(s in text for s in _UNREACHABLE):
            return BatchStoreError(f"{doing}: the S3 endpoint {self._where()} cannot be reached ({_first_line(text)})")
        return BatchStoreError(f"{doing}: {_first_line(text)}")

    # -- BatchStore ---------------------------------------------------------------------------------
    def put(self, key: str, data: bytes) -> str:
        import obstore  # noqa: PLC0415

        if "/" in key or key.startswith(".") or not key:
            raise BatchStoreError(f"batch key {key!r} must be a plain name")
        path = self._key_path(key)
        header = object_header(data)
        size = len(header) + len(data)
        client = self._client()
        try:
            if size > MULTIPART_BYTES:  # parts of MULTIPART_BYTES, four in flight; completed at once
                obstore.put(client, path, [header, memoryview(data)], use_multipart=True, chunk_size=MULTIPART_BYTES,
                            max_concurrency=4)  # fmt: skip
            else:
                obstore.put(client, path, header + data, use_multipart=False)
        except Exception as exc:  # obstore's errors, and the builtin ones it raises for some answers
            raise self._error(exc, f"storing batch {key}") from None
        return reference(self._object_url(path), header)

    def _key_path(self, key: str) -> str:
        return f"{self.prefix}/{key}.batch" if self.prefix else f"{key}.batch"

    def object_url(self, key: str) -> str:
        return self._object_url(self._key_path(key))

    def _fetch(self, path: str) -> bytes | memoryview:
        import obstore  # noqa: PLC0415

        url = self._object_url(path)
        try:
            return memoryview(obstore.get(self._client(), path).bytes())
        except (FileNotFoundError, obstore.exceptions.NotFoundError) as exc:
            if "NoSuchBucket" in str(exc):
                raise self._error(exc, f"reading {url}") from None
            raise BatchLostError(f"batch object {url} is missing (removed by retention, or deleted behind zeps's "
                                 "back)") from None  # fmt: skip
        except Exception as exc:  # obstore's errors, and the builtin ones it raises for some answers
            raise self._error(exc, f"reading {url}") from None

    def get(self, url: str, prefetched: Prefetch | None = None) -> memoryview:
        path = self._path(url)
        crc = reference_crc(url)
        # a prefetched object counts only if the reference names its CRC32C: the same name may have held
        # another object when the GET was served (a publisher whose commit failed wrote it first)
        if prefetched is not None and crc is not None and prefetched.url == self._object_url(path):
            try:
                return object_payload(prefetched.raw.result(), url, crc)
            except BatchStoreError:
                pass  # missing, or not yet that object, when it was read: read it again
        return object_payload(self._fetch(path), url, crc)

    def prefetch(self, key: str) -> Prefetch:
        """A GET of ``key``'s object in a thread of this store's, while the caller looks its reference up."""
        if self._prefetcher is None:
            self._prefetcher = ThreadPoolExecutor(PREFETCHES, thread_name_prefix="zeps-s3-prefetch")
        path = self._key_path(key)
        return Prefetch(self._object_url(path), self._prefetcher.submit(self._fetch, path))

    def delete(self, url: str) -> None:
        import obstore  # noqa: PLC0415

        path = self._path(url)
        try:
            obstore.delete(self._client(), path)  # S3 answers a delete of a missing key with success
        except (FileNotFoundError, obstore.exceptions.NotFoundError) as exc:
            if "NoSuchBucket" in str(exc):
                raise self._error(exc, f"deleting {url}") from None
        except Exception as exc:  # obstore's errors, and the builtin ones it raises for some answers
            raise self._error(exc, f"deleting {url}") from None


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else "no detail"

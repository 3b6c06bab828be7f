"""Batch format, the directory store and the S3 store's checks that need no server: torn and corrupt
objects are detected, never returned; URLs read from ZooKeeper cannot point outside the store.
(The S3 store against a real server: tests/integration/test_batch_stores.py.)"""

from __future__ import annotations

import pickle
from pathlib import Path

import crc32c
import pytest
from hypothesis import given
from hypothesis import strategies as st

from zeps.batchstore import BatchLostError, BatchStoreError, FileBatchStore, decode_batch, encode_batch, open_store
from zeps.batchstore.format import reference_crc
from zeps.batchstore.s3 import S3BatchStore
from zeps.errors import ConfigError, DataLossError


@given(st.lists(st.binary(max_size=300), max_size=20))
def test_batch_round_trip(records: list[bytes]) -> None:
    assert decode_batch(encode_batch(records)) == records


def test_store_round_trip_and_detects_damage(tmp_path: Path) -> None:
    store = FileBatchStore(tmp_path.as_uri())
    url = store.put("orders-7", b"payload" * 100)
    assert url == f"{(tmp_path / 'orders-7.batch').as_uri()}#crc32c={crc32c.crc32c(b'payload' * 100):08x}"
    assert store.get(url) == b"payload" * 100
    assert store.get(url.partition("#")[0]) == b"payload" * 100, "a reference made before the CRC fragment"
    assert store.prefetch("orders-7") is None
    path = tmp_path / "orders-7.batch"
    raw = bytearray(path.read_bytes())
    raw[-1] ^= 0xFF
    path.write_bytes(bytes(raw))
    with pytest.raises(BatchLostError, match="CRC32C mismatch"):
        store.get(url)
    path.write_bytes(bytes(raw[:-10]))
    with pytest.raises(BatchStoreError, match="torn"):
        store.get(url)
    store.delete(url)
    with pytest.raises(DataLossError, match="missing"):
        store.get(url)
    store.delete(url)  # idempotent


def test_an_object_replaced_after_its_reference_was_made_is_not_returned(tmp_path: Path) -> None:
    """Another valid object under the same name (a publisher whose commit failed wrote one; or someone
    behind zeps's back) passes the object's own checks; the reference's CRC32C refuses it."""
    store = FileBatchStore(tmp_path.as_uri())
    url = store.put("orders-7", b"the batch that was published")
    store.put("orders-7", b"another, valid object of the same name")
    with pytest.raises(BatchLostError, match=r"orders-7\.batch is not the one its reference names .* replaced"):
        store.get(url)
    assert store.get(url.partition("#")[0]) == b"another, valid object of the same name", "no fragment, no check"


def test_reference_fragments() -> None:
    assert reference_crc("s3://b/p/q-1.batch#crc32c=0a1b2c3d") == 0x0A1B2C3D
    for ref in ("s3://b/p/q-1.batch", "s3://b/p/q-1.batch#crc32c=0A1B2C3D", "s3://b/p/q-1.batch#crc32c=123",
                "s3://b/p/q-1.batch#crc32c=0a1b2c3d0", "s3://b/p/q-1.batch#other=0a1b2c3d"):  # fmt: skip
        assert reference_crc(ref) is None, ref


def test_urls_are_checked() -> None:
    with pytest.raises(ConfigError, match="scheme 'gs' is not supported; use one of file://, s3://"):
        open_store("gs://bucket/prefix")
    with pytest.raises(ConfigError, match="store_endpoint applies to s3:// stores only"):
        open_store("file:///tmp/x", endpoint="http://127.0.0.1:1")
    with pytest.raises(ConfigError, match="file:///absolute/path"):
        FileBatchStore("file://relative/path")
    with pytest.raises(BatchStoreError, match="plain file name"):
        FileBatchStore("file:///tmp/x").put("../escape", b"")


@pytest.fixture
def s3_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "id")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("s3://Bucket/p", "not a valid S3 bucket name"),
        ("s3://b/p", "not a valid S3 bucket name"),
        ("s3://bucket/a/../b", "'..' segment"),
        ("s3://bucket/a//b", "empty"),
        ("s3://bucket/p?x=1", "must look like s3://bucket/prefix"),
    ],
)
def test_s3_urls_are_checked(url: str, problem: str, s3_credentials: None) -> None:
    with pytest.raises(ConfigError, match=problem):
        open_store(url, endpoint="http://127.0.0.1:1")


def test_s3_store_options_and_credentials_are_checked(monkeypatch: pytest.MonkeyPatch, s3_credentials: None) -> None:
    with pytest.raises(ConfigError, match="http:// or https://"):
        S3BatchStore("s3://bucket/p", endpoint="ftp://127.0.0.1")
    store = S3BatchStore("s3://bucket/p/", endpoint="http://127.0.0.1:1")
    assert (store.bucket, store.prefix, store.path_style, store.region) == ("bucket", "p", True, "us-east-1")
    assert S3BatchStore("s3://bucket").path_style is False  # AWS itself: virtual-hosted requests
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    with pytest.raises(ConfigError, match=r"no S3 credentials.*mount the Secret 'batch-s3' with envFrom"):
        S3BatchStore("s3://bucket/p", credentials_secret="batch-s3")


def test_s3_object_urls_outside_the_store_are_refused(s3_credentials: None) -> None:
    """An object URL comes from ZooKeeper, where anyone with access could write one: only this store's
    bucket and prefix, and a plain ``<key>.batch`` name, are ever requested (no request is made here)."""
    store = S3BatchStore("s3://bucket/queues/orders", endpoint="http://127.0.0.1:1")
    for url in ("s3://other/queues/orders/b-1.batch", "s3://bucket/queues/b-1.batch",
                "s3://bucket/queues/orders/../secret.batch", "s3://bucket/queues/orders/x/b-1.batch",
                "s3://bucket/queues/orders/b-1.txt", "file:///queues/orders/b-1.batch"):  # fmt: skip
        with pytest.raises(BatchStoreError, match="is not an object of the store"):
            store.get(url)
        with pytest.raises(BatchStoreError, match="is not an object of the store"):
            store.delete(url)
    with pytest.raises(BatchStoreError, match="plain name"):
        store.put("../b-1", b"")


def test_an_s3_store_pickles_without_its_client(s3_credentials: None) -> None:
    """Spark ships handles (and so their stores) to executors: the connection pool is made there."""
    store = S3BatchStore("s3://bucket/p", endpoint="http://127.0.0.1:1")
    store._client()
    copy = pickle.loads(pickle.dumps(store))
    assert copy._store is None and copy.url == store.url and copy.endpoint == store.endpoint

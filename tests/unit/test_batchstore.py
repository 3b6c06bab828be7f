"""Batch format and the directory store: torn and corrupt objects are detected, never returned."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from zeps.batchstore import BatchStoreError, FileBatchStore, decode_batch, encode_batch, open_store
from zeps.errors import ConfigError


@given(st.lists(st.binary(max_size=300), max_size=20))
def test_batch_round_trip(records: list[bytes]) -> None:
    assert decode_batch(encode_batch(records)) == records


def test_store_round_trip_and_detects_damage(tmp_path: Path) -> None:
    store = FileBatchStore(tmp_path.as_uri())
    url = store.put("orders-7", b"payload" * 100)
    assert url == (tmp_path / "orders-7.batch").as_uri()
    assert store.get(url) == b"payload" * 100
    path = tmp_path / "orders-7.batch"
    raw = bytearray(path.read_bytes())
    raw[-1] ^= 0xFF
    path.write_bytes(bytes(raw))
    with pytest.raises(BatchStoreError, match="CRC32C mismatch"):
        store.get(url)
    path.write_bytes(bytes(raw[:-10]))
    with pytest.raises(BatchStoreError, match="torn"):
        store.get(url)
    store.delete(url)
    with pytest.raises(BatchStoreError, match="missing"):
        store.get(url)
    store.delete(url)  # idempotent


def test_urls_are_checked() -> None:
    with pytest.raises(ConfigError, match="scheme 's3' is not supported; use one of file://"):
        open_store("s3://bucket/prefix")
    with pytest.raises(ConfigError, match="file:///absolute/path"):
        FileBatchStore("file://relative/path")
    with pytest.raises(BatchStoreError, match="plain file name"):
        FileBatchStore("file:///tmp/x").put("../escape", b"")

"""The s3:// batch store against a real S3 server (SeaweedFS, built from its pinned module), through
the batch queue: large batches in parts, damage and loss detected and named, the S3 errors a user
meets said plainly, and a server that dies mid-publish losing nothing it confirmed."""

from __future__ import annotations

import threading

import obstore
import pytest
from obstore.store import S3Store

from harness import ZooKeeperHarness
from zeps.batchstore import BatchLostError, BatchStoreError, Prefetch, encode_batch
from zeps.batchstore.s3 import MULTIPART_BYTES, S3BatchStore
from zeps.coordination.batches import BatchQueue
from zeps.errors import CoordinationError, DataLossError
from zeps.options import BatchOptions
from zeps_dev.process import free_port, wait_until
from zeps_dev.seaweedfs import SeaweedFS


def _queue(zookeeper: ZooKeeperHarness, url: str, endpoint: str, **options: object) -> BatchQueue:
    opts = BatchOptions.make(inline_max_bytes=1024, store_url=url, store_endpoint=endpoint, **options)
    return BatchQueue(zookeeper.client(), "orders", chroot=zookeeper.root, options=opts)


def _prefix(url: str) -> str:
    return url.removeprefix("s3://").partition("/")[2]


def _raw(server: SeaweedFS, url: str) -> S3Store:
    """A plain S3 client on the store's bucket, as someone else with the admin's keys would use one
    behind zeps's back."""
    key, secret = server.admin
    bucket = url.removeprefix("s3://").partition("/")[0]
    return S3Store(bucket, endpoint=server.endpoint, region="us-east-1", access_key_id=key, secret_access_key=secret,
                   client_options={"allow_http": True})  # fmt: skip


def test_a_batch_larger_than_a_part_goes_up_in_parts_and_reads_back_whole(
    zookeeper: ZooKeeperHarness, seaweedfs_server: SeaweedFS, s3_url: str
) -> None:
    q = _queue(zookeeper, s3_url, seaweedfs_server.endpoint)
    records = [bytes([n]) * (1 << 20) for n in range(3 * MULTIPART_BYTES >> 20)]  # 24 MiB: three parts
    batch = q.publish(records)
    assert q.read(1).records == records
    head = obstore.head(_raw(seaweedfs_server, s3_url), f"{_prefix(s3_url)}/{batch}.batch")
    assert head["size"] == 16 + 8 + sum(4 + len(r) for r in records)  # object header + batch header + records
    assert "-" in str(head["e_tag"]), "a multipart upload's ETag is '<md5 of the parts' md5s>-<parts>'"


def test_damaged_and_deleted_objects_are_data_loss_naming_the_batch_and_the_others_stay_readable(
    zookeeper: ZooKeeperHarness, seaweedfs_server: SeaweedFS, s3_url: str
) -> None:
    q = _queue(zookeeper, s3_url, seaweedfs_server.endpoint)
    for n in range(4):
        q.publish([b"%d" % n * 2000])
    raw, prefix = _raw(seaweedfs_server, s3_url), _prefix(s3_url)
    obstore.delete(raw, f"{prefix}/orders-2.batch")
    good = bytes(obstore.get(raw, f"{prefix}/orders-3.batch").bytes())
    obstore.put(raw, f"{prefix}/orders-3.batch", good[:-1] + bytes([good[-1] ^ 1]))  # one bit flipped
    obstore.put(raw, f"{prefix}/orders-4.batch", good[: len(good) // 2])  # torn
    with pytest.raises(DataLossError, match=r"batch orders-2 of queue orders: .*orders-2.batch is missing"):
        q.read(2)
    with pytest.raises(BatchLostError, match=r"batch orders-3 .* CRC32C mismatch"):
        q.read(3)
    with pytest.raises(BatchLostError, match=r"batch orders-4 .* torn"):
        q.read(4)
    assert q.read(1).records == [b"0" * 2000], "the other batches are still readable"


def test_the_errors_a_user_meets_say_what_is_wrong_and_publish_nothing(
    zookeeper: ZooKeeperHarness, seaweedfs_server: SeaweedFS, s3_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    endpoint = seaweedfs_server.endpoint
    big = [b"x" * 4096]
    with pytest.raises(BatchStoreError, match=r"bucket 'no-such-bucket' does not exist at http://127\.0\.0\.1:"):
        _queue(zookeeper, "s3://no-such-bucket/q", endpoint).publish(big)
    closed = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(BatchStoreError, match=f"the S3 endpoint {closed} .* cannot be reached"):
        _queue(zookeeper, s3_url, closed).publish(big)
    q = _queue(zookeeper, s3_url, endpoint)
    assert q.publish(big) == "orders-1"
    for key, value in seaweedfs_server.credentials("reader").items():  # may read, not write
        monkeypatch.setenv(key, value)
    reader = _queue(zookeeper, s3_url, endpoint)
    assert reader.read(1).records == big
    with pytest.raises(BatchStoreError, match=r"access denied by .*check the credentials"):
        reader.publish(big)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    with pytest.raises(BatchStoreError, match="access denied"):
        _queue(zookeeper, s3_url, endpoint).read(1)
    assert q.latest() == 1, "no failed publish made a batch"
    with pytest.raises(CoordinationError, match="orders-2 is not retained"):
        q.read(2)


def test_a_server_killed_and_restarted_mid_publish_loses_no_confirmed_batch(
    zookeeper: ZooKeeperHarness, own_seaweedfs: SeaweedFS
) -> None:
    """A server of its own (the session's must not die): kill -9 while a publisher writes 12 MiB
    batches (multipart) in a loop, then start it again on the same data; the publisher goes on until
    three batches are confirmed after the restart. Every publish either returned a batch id or raised
    a BatchStoreError (those made while the server was down: the client's retries give up after about
    2 s); every id returned is readable, byte for byte, after the restart; ids stay linear; no publish
    made a batch it did not confirm."""
    server = own_seaweedfs
    q = _queue(zookeeper, "s3://own/q", server.endpoint)
    confirmed: dict[str, bytes] = {}
    failures: list[BaseException] = []
    started = threading.Event()
    in_flight = threading.Event()
    restarted = threading.Event()

    def publish() -> None:
        after_restart = 0
        for n in range(12):  # until three batches are confirmed after the restart (at most 12)
            record = bytes([n]) * (12 << 20)
            in_flight.set()
            try:
                confirmed[q.publish([record])] = record
                after_restart += restarted.is_set()
            except BatchStoreError as exc:
                failures.append(exc)
            except BaseException as exc:  # anything else is a defect: recorded, and fails the test
                failures.append(exc)
            in_flight.clear()
            started.set()
            if after_restart == 3:
                return

    publisher = threading.Thread(target=publish)
    publisher.start()
    assert started.wait(120), "the first publish never ended"
    wait_until(in_flight.is_set, timeout=60, what="the next publish under way")  # a 12 MiB upload
    server.kill()
    killed_mid_publish = in_flight.is_set()
    server.start()
    restarted.set()
    publisher.join(600)
    assert not publisher.is_alive()
    assert all(isinstance(f, BatchStoreError) for f in failures), failures
    assert killed_mid_publish, "the kill landed between two publishes: the test proved nothing"
    assert len(confirmed) >= 4, f"three batches after the restart, one before; failures: {failures}"
    assert sorted(confirmed) == sorted(f"orders-{n}" for n in range(1, len(confirmed) + 1)), "ids are linear"
    assert q.latest() == len(confirmed), "every batch made was confirmed to its publisher"
    for batch_id, record in confirmed.items():
        assert _queue(zookeeper, "s3://own/q", server.endpoint).read(int(batch_id[7:])).records == [record]


def test_a_read_overlaps_its_lookup_with_the_get_and_never_returns_an_object_replaced_since(
    zookeeper: ZooKeeperHarness, seaweedfs_server: SeaweedFS, s3_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """read() starts the object's GET beside its ZooKeeper lookup (``BatchStore.prefetch``) and uses
    what it got, one GET per batch, if it is the object the reference names. Here the early GET found
    another valid object of the same name (what a publisher whose commit failed leaves, before the next
    publisher stores the batch again): the store reads the object again and returns the committed one.
    After a batch found inline, the next read does not ask the store before its lookup."""
    q = _queue(zookeeper, s3_url, seaweedfs_server.endpoint)
    store = q.store
    assert isinstance(store, S3BatchStore)
    fetched: list[str] = []  # each GET: the object's name, "early" if begun beside the lookup
    fetch = store._fetch

    def counted(path: str) -> bytes | memoryview:
        early = threading.current_thread().name.startswith("zeps-s3-prefetch")
        fetched.append(path.rpartition("/")[2].removesuffix(".batch") + (" early" if early else ""))
        return fetch(path)

    monkeypatch.setattr(store, "_fetch", counted)
    q.publish([b"small"])  # 1: inline
    q.publish([b"a" * 4096])  # 2: in the store
    assert q.read(1).records == [b"small"]
    assert fetched == ["orders-1 early"], "the first read asks the store beside the lookup (a 404 here)"
    assert q.read(2).records == [b"a" * 4096]
    assert fetched[1:] == ["orders-2"], "after an inline batch, the store is asked after the lookup only"
    assert q.read(2).records == [b"a" * 4096]
    assert fetched[2:] == ["orders-2 early"], "after a stored batch: one GET, begun beside the lookup, used"

    fetched.clear()
    store.put("orders-3", encode_batch([b"orphan" * 1000]))  # a publisher's PUT whose commit failed
    early = store.prefetch("orders-3")
    early.raw.result()  # served before the next publisher's PUT
    assert q.publish([b"committed" * 1000]) == "orders-3"
    _, ref = q._lookup("orders-3")
    assert ref is not None
    assert bytes(store.get(ref[0].decode(), early)) == encode_batch([b"committed" * 1000])
    assert fetched == ["orders-3 early", "orders-3"], "the early object was refused, and read again"
    assert q.read(3).records == [b"committed" * 1000]


def test_reads_in_sequence_fetch_the_next_object_ahead_and_check_it_like_any_other(
    zookeeper: ZooKeeperHarness, seaweedfs_server: SeaweedFS, s3_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """From the second read in sequence on, read(n) also begins the GET of batch n + 1, and read(n + 1)
    uses it: one GET per batch. A read out of sequence drops what was fetched ahead. An object fetched
    ahead that is not the one the reference names (another object stored under the batch's name before
    the batch was published) is refused and read again."""
    q = _queue(zookeeper, s3_url, seaweedfs_server.endpoint)
    store = q.store
    assert isinstance(store, S3BatchStore)
    asked: list[str] = []  # "<batch> by <read>": a GET begun early; "<batch> again by <read>": one after the lookup
    reading = [0]  # the batch read() is reading now
    prefetch, fetch = store.prefetch, store._fetch

    def early(key: str) -> Prefetch:
        asked.append(f"{key.rpartition('-')[2]} by {reading[0]}")
        return prefetch(key)

    def fetched(path: str) -> bytes | memoryview:
        if not threading.current_thread().name.startswith("zeps-s3-prefetch"):
            asked.append(f"{path.rpartition('-')[2].removesuffix('.batch')} again by {reading[0]}")
        return fetch(path)

    monkeypatch.setattr(store, "prefetch", early)
    monkeypatch.setattr(store, "_fetch", fetched)
    for n in range(1, 5):
        q.publish([b"%d" % n * 4096])

    def read(number: int) -> list[bytes]:
        reading[0] = number
        return q.read(number).records

    assert [read(n) for n in (1, 2, 3)] == [[b"%d" % n * 4096] for n in (1, 2, 3)]
    assert asked == ["1 by 1", "2 by 2", "3 by 2", "4 by 3"]

    asked.clear()
    assert read(1) == [b"1" * 4096]
    assert asked == ["1 by 1"], "out of sequence: batch 4, fetched ahead, is dropped; nothing fetched ahead"

    asked.clear()
    store.put("orders-6", encode_batch([b"orphan" * 1000]))  # a publisher's PUT whose commit failed
    assert q.publish([b"5" * 4096]) == "orders-5"
    assert read(4) == [b"4" * 4096] and read(5) == [b"5" * 4096]
    held = q._held
    assert held is not None and held[0] == 6
    held[1].raw.result()  # the orphan, fetched ahead before the next publisher stores batch 6
    assert q.publish([b"committed" * 1000]) == "orders-6"
    assert read(6) == [b"committed" * 1000]
    assert asked == ["4 by 4", "5 by 5", "6 by 5", "7 by 6", "6 again by 6"], (
        "the orphan fetched ahead was refused and batch 6 read again (batch 7, not published, asked for ahead)"
    )


def test_retention_deletes_the_objects_the_store_refused_to_delete_at_its_next_pass(
    zookeeper: ZooKeeperHarness, seaweedfs_server: SeaweedFS, s3_url: str, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    """A prune whose store refuses the deletes (credentials that may read, not delete: S3's access
    denied, as from a real server) still removes the references, and notes the objects in ZooKeeper;
    no reference is left naming a deleted object, and the next prune that may delete deletes them."""
    q = _queue(zookeeper, s3_url, seaweedfs_server.endpoint, retention_seconds=0)
    for n in range(4):
        q.publish([b"%d" % n * 2000])
    q.consumer("billing").process_available(lambda batch: None, limit=3)
    raw, prefix = _raw(seaweedfs_server, s3_url), _prefix(s3_url)

    def objects() -> list[str]:
        return sorted(m["path"].rpartition("/")[2] for page in obstore.list(raw, prefix=prefix) for m in page)

    for key, value in seaweedfs_server.credentials("reader").items():
        monkeypatch.setenv(key, value)
    reader = _queue(zookeeper, s3_url, seaweedfs_server.endpoint, retention_seconds=0)
    with caplog.at_level("WARNING", logger="zeps.coordination.batches"):
        assert reader.prune() == ["orders-1", "orders-2", "orders-3"]
    assert "3 removed batches' objects are still in the store (" in caplog.text
    assert "access denied" in caplog.text
    assert objects() == [f"orders-{n}.batch" for n in (1, 2, 3, 4)], "the store refused every delete"
    assert sorted(q.client.get_children(q.paths.batch_deleting)) == ["orders-1", "orders-2", "orders-3"]
    with pytest.raises(CoordinationError, match="orders-2 is not retained"):
        q.read(2)  # the reference went with the note: no reference to an object about to go
    assert q.read(4).records == [b"3" * 2000]

    for key, value in seaweedfs_server.credentials("admin").items():
        monkeypatch.setenv(key, value)
    admin = _queue(zookeeper, s3_url, seaweedfs_server.endpoint, retention_seconds=0)
    assert admin.prune() == [], "nothing more to remove: the earlier pass's objects are deleted"
    assert objects() == ["orders-4.batch"]
    assert q.client.get_children(q.paths.batch_deleting) == []
    assert q.read(4).records == [b"3" * 2000]

"""Replayable batch queue against a real ZooKeeper server, with both batch stores: a real directory
(file://) and a real S3 server (s3://, SeaweedFS). The S3 store's own faults: test_batch_stores.py."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from harness import WorkerProcess, ZooKeeperHarness
from zeps.batchstore import FileBatchStore, Prefetch
from zeps.coordination.batches import Batch, BatchQueue, ConsumerConflictError
from zeps.errors import ConfigError, CoordinationError
from zeps.options import BatchOptions
from zeps_dev.process import wait_until


def _queue(zookeeper: ZooKeeperHarness, name: str = "orders", **options: object) -> BatchQueue:
    return BatchQueue(zookeeper.client(), name, chroot=zookeeper.root, options=BatchOptions.make(**options))


# the s3 variants ask for the S3 server with request.getfixturevalue: the module runs once weed is built
pytestmark = pytest.mark.testbin


@pytest.fixture(params=["file", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, str]:
    """The store options of a batch queue, for each kind of store: a directory, or a bucket on the
    session's S3 server (the admin's credentials in the environment)."""
    if request.param == "file":
        return {"store_url": (tmp_path / "store").as_uri()}
    url = request.getfixturevalue("s3_url")
    return {"store_url": url, "store_endpoint": request.getfixturevalue("seaweedfs_server").endpoint}


def _objects(store: dict[str, str]) -> list[str]:
    """The names of the batch objects in the store, sorted (listed behind zeps's back)."""
    url = store["store_url"]
    if url.startswith("file://"):
        return sorted(p.name for p in Path(url.removeprefix("file://")).glob("*.batch"))
    import obstore  # noqa: PLC0415
    from obstore.store import S3Store  # noqa: PLC0415

    bucket, _, prefix = url.removeprefix("s3://").partition("/")
    client = S3Store(bucket, endpoint=store["store_endpoint"], region="us-east-1", client_options={"allow_http": True})
    return sorted(m["path"].rpartition("/")[2] for page in obstore.list(client, prefix=prefix) for m in page)


def test_concurrent_publishers_get_unique_linear_ids(zookeeper: ZooKeeperHarness) -> None:
    ids: list[str] = []
    lock = threading.Lock()

    def publish(n: int) -> None:
        q = _queue(zookeeper)
        for i in range(10):
            batch_id = q.publish([b"%d-%d" % (n, i)])
            with lock:
                ids.append(batch_id)

    threads = [threading.Thread(target=publish, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(ids, key=lambda i: int(i.split("-")[1])) == [f"orders-{n}" for n in range(1, 41)]
    q = _queue(zookeeper)
    assert q.latest() == 40
    seen = sorted(r for n in range(1, 41) for r in q.read(n).records)
    assert seen == sorted(b"%d-%d" % (n, i) for n in range(4) for i in range(10))


def test_an_idempotent_writer_publishes_each_sequence_once_even_from_two_handles(zookeeper: ZooKeeperHarness) -> None:
    """A Spark query's sink is such a writer: a micro-batch run again (a retried task set, a restarted
    driver: a new handle) gets back the batch it made the first time; an older sequence is refused."""
    q = _queue(zookeeper)
    q.publish([b"someone else"])
    assert q.publish([b"a0"], writer="query-1", sequence=0) == "orders-2"
    assert _queue(zookeeper).publish([b"a0 again"], writer="query-1", sequence=0) == "orders-2"
    assert q.publish([b"b0"], writer="query-2", sequence=0) == "orders-3"  # another writer: its own sequences
    assert q.publish([b"a1"], writer="query-1", sequence=1) == "orders-4"
    with pytest.raises(CoordinationError, match=r"already published sequence 1 \(orders-4\); sequence 0 is older"):
        q.publish([b"a0 late"], writer="query-1", sequence=0)
    with pytest.raises(ConfigError, match="writer and sequence together"):
        q.publish([b"x"], writer="query-1")
    assert q.latest() == 4
    assert [q.read(n).records for n in range(1, 5)] == [[b"someone else"], [b"a0"], [b"b0"], [b"a1"]]


def test_two_consumers_at_different_positions_each_see_every_batch_once(zookeeper: ZooKeeperHarness) -> None:
    q = _queue(zookeeper)
    for i in range(5):
        q.publish([b"early-%d" % i])
    early = q.consumer("early-bird")  # starts before the first batch
    late = q.consumer("latecomer", start="latest")  # starts after batch 5
    for i in range(3):
        q.publish([b"late-%d" % i])
    got: dict[str, list[str]] = {"early": [], "late": []}
    assert early.process_available(lambda b: got["early"].append(b.id)) == 8
    assert late.process_available(lambda b: got["late"].append(b.id)) == 3
    assert got["early"] == [f"orders-{n}" for n in range(1, 9)]
    assert got["late"] == ["orders-6", "orders-7", "orders-8"]
    assert early.process_available(lambda b: got["early"].append(b.id)) == 0
    assert q.lag() == {"early-bird": 0, "latecomer": 0}
    q.publish([b"more"])
    assert q.lag() == {"early-bird": 1, "latecomer": 1}


def test_run_wakes_on_new_batches(zookeeper: ZooKeeperHarness) -> None:
    q = _queue(zookeeper)
    seen: list[int] = []
    stop = threading.Event()
    consumer = q.consumer("runner")
    thread = threading.Thread(target=consumer.run, args=(lambda b: seen.append(b.number), stop), daemon=True)
    thread.start()
    for i in range(3):
        q.publish([b"%d" % i])
    wait_until(lambda: seen == [1, 2, 3], timeout=10, what="the running consumer to see three batches")
    stop.set()
    thread.join(10)


def test_consumer_killed_between_processing_and_commit_reprocesses_only_that_batch(
    zookeeper: ZooKeeperHarness, tmp_path: Path
) -> None:
    q = _queue(zookeeper)
    for i in range(6):
        q.publish([b"%d" % i])
    args = ["consume", "--hosts", zookeeper.connect_string, "--chroot", zookeeper.root, "--queue", "orders",
            "--name", "billing"]  # fmt: skip
    doomed = WorkerProcess(tmp_path, "batch_worker.py", "doomed", [*args, "--die-at", "3"])
    doomed.process.start()
    wait_until(lambda: not doomed.process.running(), timeout=30, what="the consumer to die at batch 3")
    again = WorkerProcess(tmp_path, "batch_worker.py", "again", args).start()
    try:
        wait_until(lambda: any("orders-6" in line for line in again.lines()), timeout=30, what="batch 6")
        first = [line.split()[1] for line in doomed.lines() if line.startswith("processed")]
        second = [line.split()[1] for line in again.lines() if line.startswith("processed")]
        assert first == ["orders-1", "orders-2", "orders-3"]
        assert second == ["orders-3", "orders-4", "orders-5", "orders-6"], "only batch 3 is processed twice"
        assert q.positions()["billing"] == 6
    finally:
        again.stop()


def test_large_batches_go_to_the_store_and_small_ones_stay_inline(
    zookeeper: ZooKeeperHarness, store: dict[str, str]
) -> None:
    q = _queue(zookeeper, inline_max_bytes=1024, **store)
    small = q.publish([b"tiny"])
    big = q.publish([b"y" * 4096, b"z" * 10])
    assert q.read(1).records == [b"tiny"] and small == "orders-1"
    assert q.read(2).records == [b"y" * 4096, b"z" * 10]
    assert _objects(store) == [f"{big}.batch"]
    assert _queue(zookeeper, inline_max_bytes=1024, **store).read(2).records == [b"y" * 4096, b"z" * 10], (
        "another handle (another pod) reads it from the store too"
    )


def test_a_torn_file_write_is_never_visible(zookeeper: ZooKeeperHarness, tmp_path: Path) -> None:
    store_dir = tmp_path / "store"
    url = store_dir.as_uri()
    q = _queue(zookeeper, inline_max_bytes=1024, store_url=url)
    q.publish([b"tiny"])
    q.publish([b"y" * 4096])
    args = ["publish", "--hosts", zookeeper.connect_string, "--chroot", zookeeper.root, "--queue", "orders",
            "--store", url, "--size-mb", "300"]  # fmt: skip
    for attempt in range(3):  # catch the writer mid-write (it writes, then fsyncs, then renames)
        writer = WorkerProcess(tmp_path, "batch_worker.py", f"writer-{attempt}", args)
        writer.process.start()
        try:
            wait_until(lambda: any(store_dir.glob(".orders-3.*.tmp")), timeout=60, what="the temporary file")
        except Exception:
            writer.kill()
            continue
        writer.kill()  # kill -9 mid-write
        if not (store_dir / "orders-3.batch").exists():
            break
    else:
        pytest.fail("could not catch the writer mid-write in three tries")
    assert q.latest() == 2, "a torn batch must never be published"
    with pytest.raises(CoordinationError, match="orders-3 is not retained"):
        q.read(3)
    assert FileBatchStore(url).remove_stale_temporaries(older_than=0) >= 1
    assert q.publish([b"after"]) == "orders-3"  # ids stay linear


def test_reset_replays_and_retention_keeps_what_consumers_need(
    zookeeper: ZooKeeperHarness, store: dict[str, str]
) -> None:
    q = _queue(zookeeper, retention_seconds=0, inline_max_bytes=8, **store)
    for i in range(5):
        q.publish([b"record-%d" % i])  # all larger than 8 bytes: in the store
    fast, slow = q.consumer("fast"), q.consumer("slow")
    fast.process_available(lambda b: None)
    slow.process_available(lambda b: None, limit=2)
    removed = q.prune()
    assert removed == ["orders-1", "orders-2"], "only what every consumer has processed"
    assert _objects(store) == [f"orders-{n}.batch" for n in (3, 4, 5)], "retention removed the objects"
    replay: list[int] = []
    fast.reset(3)
    fast.process_available(lambda b: replay.append(b.number))
    assert replay == [3, 4, 5]
    with pytest.raises(ConfigError, match=r"retained batches are 3\.\.5"):
        fast.reset(1)
    assert q.consumer("newcomer").position() == 2, "a new earliest consumer starts at the oldest retained batch"


def test_conflicting_instances_of_one_consumer_are_detected(zookeeper: ZooKeeperHarness) -> None:
    q = _queue(zookeeper)
    q.publish([b"a"])
    one, two = q.consumer("dup"), _queue(zookeeper).consumer("dup")

    def handler(batch: Batch) -> None:
        two.process_available(lambda b: None)  # the other instance moves the position meanwhile

    with pytest.raises(ConsumerConflictError, match="one instance per consumer name"):
        one.process_available(handler)


def test_large_batch_without_a_store_is_refused_clearly(zookeeper: ZooKeeperHarness) -> None:
    q = _queue(zookeeper, inline_max_bytes=16)
    with pytest.raises(ConfigError, match="set store_url"):
        q.publish([b"x" * 100])


def test_a_consumer_reads_ahead_while_its_handler_runs_and_handles_in_order(
    zookeeper: ZooKeeperHarness, tmp_path: Path
) -> None:
    """With read_ahead 2, the store is asked for batches 2 and 3 while the handler still holds batch 1
    (the handler waits for that, so the test cannot pass by timing); every batch is handled once, in
    order; with read_ahead 0, nothing is read before its turn."""

    class Watched(FileBatchStore):
        def __init__(self, url: str) -> None:
            super().__init__(url)
            self.asked: list[str] = []
            self.third = threading.Event()

        def get(self, url: str, prefetched: Prefetch | None = None) -> memoryview:
            self.asked.append(Path(url).stem)
            if {"2", "3"} <= {stem.rsplit("-", 1)[1] for stem in self.asked}:  # both read ahead, in either
                self.third.set()  # order (two threads read ahead)
            return super().get(url, prefetched)

    for ahead in (2, 0):
        store = Watched((tmp_path / f"s{ahead}").as_uri())
        options = BatchOptions.make(inline_max_bytes=8, store_url=store.url, read_ahead=ahead)
        q = BatchQueue(zookeeper.client(), f"orders{ahead}", chroot=zookeeper.root, options=options, store=store)
        for n in range(1, 6):
            q.publish([b"record %d" % n])
        handled: list[tuple[int, list[str]]] = []

        def handler(
            batch: Batch, store: Watched = store, ahead: int = ahead, handled: list[tuple[int, list[str]]] = handled
        ) -> None:
            if batch.number == 1 and ahead:
                assert store.third.wait(30), "batches 2 and 3 were not read while batch 1 was handled"
            handled.append((batch.number, list(store.asked)))

        consumer = q.consumer("billing")
        consumer.register("earliest")
        assert consumer.process_available(handler) == 5
        assert [n for n, _ in handled] == [1, 2, 3, 4, 5] and consumer.position() == 5
        if ahead:
            assert {"orders2-2", "orders2-3"} <= set(handled[0][1])
        else:
            assert [asked for _, asked in handled] == [[f"orders0-{m}" for m in range(1, n + 1)] for n in range(1, 6)]


def test_inline_batches_read_where_the_store_cannot_be_opened(
    zookeeper: ZooKeeperHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read asks the store for the object beside its lookup; a handle whose S3 store cannot be opened
    (no credentials here) still reads the inline batches, and is told what is missing only for a
    batch that is in the store."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_WEB_IDENTITY_TOKEN_FILE"):
        monkeypatch.delenv(name, raising=False)
    writer = BatchQueue(zookeeper.client(), "orders", chroot=zookeeper.root, options=BatchOptions.make())
    writer.publish([b"small"])
    s3 = BatchOptions.make(store_url="s3://bucket/orders", store_endpoint="http://127.0.0.1:9")
    reader = BatchQueue(zookeeper.client(), "orders", chroot=zookeeper.root, options=s3)
    assert reader.read(1).records == [b"small"]
    zookeeper.client().create(f"{reader.paths.batch_refs}/orders-2", b"s3://bucket/orders/orders-2.batch")
    with pytest.raises(ConfigError, match="no S3 credentials in the environment"):
        reader.read(2)


def test_a_position_written_by_something_else_is_left_out_of_the_lag_and_stops_retention(
    zookeeper: ZooKeeperHarness, caplog: pytest.LogCaptureFixture
) -> None:
    """A consumer node anyone with the namespace's ACL wrote, holding no batch id of the queue: the
    lag (what the operator's status shows) leaves it out with a warning naming it; positions() and
    retention refuse, naming it, rather than remove batches such a consumer might need."""
    q = _queue(zookeeper, retention_seconds=0)
    for i in range(3):
        q.publish([b"%d" % i])
    q.consumer("billing").process_available(lambda batch: None)
    q.consumer("audit")
    q.client.create(q.paths.processor("forged"), b"\xff not a batch id")
    with caplog.at_level("WARNING", logger="zeps.coordination.batches"):
        assert q.lag() == {"billing": 0, "audit": 3}
    assert "batch consumer 'forged' of queue orders" in caplog.text
    for refused in (q.positions, q.prune):
        with pytest.raises(CoordinationError, match=r"batch consumer 'forged' of queue orders: its position .* is not"):
            refused()
    assert q.read(1).records == [b"0"], "nothing was removed"


def test_retention_deletes_no_object_a_note_written_by_something_else_names(
    zookeeper: ZooKeeperHarness, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Notes of objects to delete (``batches/deleting``) are ZooKeeper data anyone with the namespace's
    ACL can write: retention deletes only the object named after the note's own batch, once that
    batch's reference is gone; a note naming a retained batch's object, another batch's, another
    store's or another queue's batch in the same store is dropped with a warning, and every batch
    stays readable."""
    url = (tmp_path / "store").as_uri()
    q = _queue(zookeeper, retention_seconds=0, inline_max_bytes=8, store_url=url)
    for i in range(3):
        q.publish([b"record-%d" % i])  # larger than 8 bytes: in the store
    q.consumer("billing").register("earliest")  # at the start: retention may remove nothing
    retained = q.client.get(f"{q.paths.batch_refs}/orders-2")[0]
    q.ensure()
    other = _queue(zookeeper, "refunds", inline_max_bytes=8, store_url=url)  # the same store
    other.publish([b"refund-0"])
    forged = {
        "orders-2": retained,  # a retained batch's own object
        "orders-9": retained,  # another batch's object
        "orders-8": b"file:///etc/orders-8.batch",  # another store's
        "refunds-1": other.client.get(f"{other.paths.batch_refs}/refunds-1")[0],  # another queue's batch
    }
    for name, target in forged.items():
        q.client.create(f"{q.paths.batch_deleting}/{name}", target)
    with caplog.at_level("WARNING", logger="zeps.coordination.batches"):
        assert q.prune() == []
    assert caplog.text.count("names no object retention may delete") == 4
    assert other.read(1).records == [b"refund-0"]
    assert q.client.get_children(q.paths.batch_deleting) == []
    assert [q.read(n).records for n in (1, 2, 3)] == [[b"record-0"], [b"record-1"], [b"record-2"]]

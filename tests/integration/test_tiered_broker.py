"""A tiered broker (``zeps-broker --tier-store``) against a real ZooKeeper and a real S3 server
(SeaweedFS): the broker's own thread uploads its closed, committed segments while publishers write,
local retention deletes only what the store holds, and every record is read back from 1, the store's
part and the volume's; with the store stopped under publishing nothing is deleted locally, the
backlog shows in the metrics, and it drains once the store is back; of three replicas only the
leader uploads, and the next one goes on after it is killed."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from harness import ReplicaSet, ZooKeeperHarness, next_millisecond, tiered_records
from zeps.batchstore import open_store
from zeps.broker import BrokerConfig, BrokerServer, Registration
from zeps.broker.tiering import Tiering
from zeps.client import Seq, StreamClient, Time
from zeps.errors import PublishRefusedError
from zeps.journal import Journal, JournalConfig, Record
from zeps.paths import StreamPaths
from zeps.tiering import TierReader, read_manifest
from zeps.tiering.uploader import MAX_BACKOFF_S
from zeps_dev.process import wait_until
from zeps_dev.seaweedfs import SeaweedFS

#: a segment every 2,000 bytes (about 25 records), and a volume that keeps as little as it may
JOURNAL = JournalConfig(segment_bytes=2000, fsync="always", retention_bytes=1)
#: how long uploads may take to catch up: rounds start every tick (1 s) while a segment waits; a
#: failed one waits out its backoff (MAX_BACKOFF_S at most) first
CATCH_UP_S = 4 * MAX_BACKOFF_S


def _broker(zookeeper: ZooKeeperHarness, data: Path, tiered: Tiering) -> BrokerServer:
    return BrokerServer(
        BrokerConfig(data, ("orders",), journal=JOURNAL),
        registration=Registration(zookeeper.connect_string, "shop", "orders-0", chroot=zookeeper.root),
        tiering=tiered,
    ).start()


def _publish(endpoint: str, first: int, count: int) -> None:
    """Records ``first ..`` in publishes of 20: a publish's batch is written whole, and 20 records are
    about 1,000 bytes, so a segment holds two publishes at most."""
    with StreamClient(endpoint, "orders") as client:
        for start in range(first, first + count, 20):
            client.publish_many((f"order.{i % 5}", b"order-%05d" % i) for i in range(start, start + 20))
            client.flush()


def _publish_one(endpoint: str, body: bytes) -> None:
    with StreamClient(endpoint, "orders") as client:
        client.publish("order.0", body)
        client.flush()


def _sample(broker: BrokerServer, name: str) -> float:
    value = broker.registry.get_sample_value(name, {"stream": "orders"})
    assert value is not None, f"{name} is not exported"
    return value


def _everything(zookeeper: ZooKeeperHarness, tiered: Tiering, data: Path, cache: Path) -> list[Record]:
    """Every record from 1: the store's part (below the volume's first), then the volume's."""
    store = open_store(tiered.store_url, endpoint=tiered.endpoint)
    reader = TierReader(zookeeper.client(), StreamPaths.of("shop", "orders", chroot=zookeeper.root), store,
                        cache=cache)  # fmt: skip
    journal = Journal(data / "orders", JOURNAL).open()
    try:
        return tiered_records(reader, journal, max_bytes=4000)
    finally:
        journal.close()
        reader.close()


def _uploaded_all(broker: BrokerServer) -> bool:
    """The store holds every closed segment, and the volume keeps nothing else of them."""
    journal = broker.core.streams["orders"].journal
    closed = journal.closed_segments()
    return not closed and journal.first_sequence > 1 and _sample(broker, "zeps_broker_tier_backlog_segments") == 0


def test_a_tiered_broker_uploads_while_publishers_write_and_every_record_is_read_back_from_1(
    zookeeper: ZooKeeperHarness, seaweedfs_server: SeaweedFS, s3_url: str, tmp_path: Path
) -> None:
    """400 records in 20 publishes, in 10 segments or more: the broker's thread uploads each closed one, local retention
    (1 byte) deletes each once the store holds it and never the active one, the gauges say so; the
    store's part and the volume's together are every record, once, in order."""
    tiered = Tiering(s3_url, endpoint=seaweedfs_server.endpoint)
    broker = _broker(zookeeper, tmp_path / "data", tiered)
    try:
        _publish(broker.endpoint, 1, 400)
        wait_until(lambda: _uploaded_all(broker), timeout=CATCH_UP_S, what="every closed segment in the store")
        tiered_to = _sample(broker, "zeps_broker_tier_tiered_to")
        first = broker.core.streams["orders"].journal.first_sequence
        assert tiered_to == first - 1 >= 300, f"the volume starts at {first}, the store holds up to {tiered_to}"
        assert _sample(broker, "zeps_broker_tier_uploads_total") >= 9
        assert _sample(broker, "zeps_broker_tier_backlog_bytes") == 0
    finally:
        broker.stop()
    records = _everything(zookeeper, tiered, tmp_path / "data", tmp_path / "cache")
    assert [r.sequence for r in records] == list(range(1, 401))
    assert [r.body for r in records] == [b"order-%05d" % i for i in range(1, 401)]


def _replayed(endpoint: str, pattern: str, count: int) -> list[tuple[int, bytes]]:
    """(sequence, body) of what a subscriber from sequence 0 gets: ``count`` records, then nothing more
    for 0.7 s (bounded by CATCH_UP_S)."""
    got: list[tuple[int, bytes]] = []
    with StreamClient(endpoint, "orders", timeout=30) as reader:
        reader.start(pattern, since=Seq(0))
        deadline = time.monotonic() + CATCH_UP_S
        while len(got) < count and time.monotonic() < deadline:
            got += [(m.sequence, m.body) for m in reader.receive_many(0.5)]
        got += [(m.sequence, m.body) for m in reader.receive_many(0.7)]  # a negative check: nothing twice
    return got


def test_a_subscriber_from_0_gets_through_the_broker_what_only_the_store_holds(
    zookeeper: ZooKeeperHarness, seaweedfs_server: SeaweedFS, s3_url: str, tmp_path: Path
) -> None:
    """Once the volume keeps only the active segment, a subscription from sequence 0 (every record, and
    a key prefix) is served the store's part by the broker, then the journal's, then live records:
    same protocol, same client, every record once and in order."""
    broker = _broker(zookeeper, tmp_path / "data", Tiering(s3_url, endpoint=seaweedfs_server.endpoint))
    try:
        _publish(broker.endpoint, 1, 400)
        wait_until(lambda: _uploaded_all(broker), timeout=CATCH_UP_S, what="every closed segment in the store")
        assert broker.core.streams["orders"].journal.first_sequence > 300
        every = _replayed(broker.endpoint, "", 400)
        assert every == [(i, b"order-%05d" % i) for i in range(1, 401)]
        threes = _replayed(broker.endpoint, "order.3", 80)
        assert threes == [(i, b"order-%05d" % i) for i in range(1, 401) if i % 5 == 3]
        assert sum(serve.reads for serve in broker._tier_serves.values()) >= 2, "served from the journal alone"
    finally:
        broker.stop()


def test_a_replay_from_a_time_only_the_store_holds_starts_at_its_first_record_at_or_after_it(
    zookeeper: ZooKeeperHarness, seaweedfs_server: SeaweedFS, s3_url: str, tmp_path: Path
) -> None:
    """Records 1-200, a moment, records 201-400; once the volume keeps only the last segment, a
    subscription and a fetch from that moment start at 201, found in the store (the manifest's last
    timestamps name its object), then go on through the journal: every record from 201 once, in order.
    A time past every record the store holds starts in the journal."""
    broker = _broker(zookeeper, tmp_path / "data", Tiering(s3_url, endpoint=seaweedfs_server.endpoint))
    try:
        _publish(broker.endpoint, 1, 200)
        next_millisecond()  # the broker stamps records in milliseconds: ``moment`` falls between two
        moment = time.time()
        next_millisecond()
        _publish(broker.endpoint, 201, 200)
        wait_until(lambda: _uploaded_all(broker), timeout=CATCH_UP_S, what="every closed segment in the store")
        journal = broker.core.streams["orders"].journal
        assert journal.first_sequence > 300
        expected = [(i, b"order-%05d" % i) for i in range(201, 401)]
        got: list[tuple[int, bytes]] = []
        with StreamClient(broker.endpoint, "orders", timeout=30) as reader:
            reader.start("", since=Time(moment))
            deadline = time.monotonic() + CATCH_UP_S
            while len(got) < 200 and time.monotonic() < deadline:
                got += [(m.sequence, m.body) for m in reader.receive_many(0.5)]
            got += [(m.sequence, m.body) for m in reader.receive_many(0.7)]  # nothing twice
        assert got == expected
        with StreamClient(broker.endpoint, "orders", timeout=30) as fetcher:
            fetched = fetcher.fetch(since=Time(moment))
            assert [(m.sequence, m.body) for m in fetched.messages] == expected and fetched.first == 201
            late = fetcher.fetch(since=Time(time.time() + 60))
            assert late.messages == []
    finally:
        broker.stop()


def test_with_the_store_stopped_nothing_is_deleted_locally_the_backlog_shows_and_drains_when_it_returns(
    zookeeper: ZooKeeperHarness, own_seaweedfs: SeaweedFS, tmp_path: Path
) -> None:
    """The store stops after the first 200 records are uploaded; 300 more are published: the volume
    keeps every segment the store lacks (its first record does not move), the backlog gauges count them and
    failed rounds are counted. Once the store is back the backlog drains to 0 and every record of the
    500 is read back."""
    tiered = Tiering("s3://own/orders", endpoint=own_seaweedfs.endpoint)
    broker = _broker(zookeeper, tmp_path / "data", tiered)
    journal = broker.core.streams["orders"].journal
    try:
        _publish(broker.endpoint, 1, 200)
        wait_until(lambda: _uploaded_all(broker), timeout=CATCH_UP_S, what="the first 200 records in the store")
        kept_from = journal.first_sequence
        own_seaweedfs.stop()
        _publish(broker.endpoint, 201, 300)
        closed = len(journal.closed_segments())
        assert closed >= 5, f"300 records closed {closed} segments"
        wait_until(lambda: _sample(broker, "zeps_broker_tier_failures_total") >= 1
                   and _sample(broker, "zeps_broker_tier_backlog_segments") == closed,
                   timeout=CATCH_UP_S, what=f"failed rounds and a backlog of the {closed} closed segments")  # fmt: skip
        assert journal.first_sequence == kept_from, "a segment the store lacks was deleted"
        assert _sample(broker, "zeps_broker_tier_backlog_bytes") >= closed * 1000
        own_seaweedfs.start()
        wait_until(lambda: _uploaded_all(broker), timeout=CATCH_UP_S, what="the backlog drained")
        assert journal.first_sequence > 400
    finally:
        broker.stop()
    records = _everything(zookeeper, tiered, tmp_path / "data", tmp_path / "cache")
    assert [r.body for r in records] == [b"order-%05d" % i for i in range(1, 501)]


def test_past_its_backlog_limit_a_tiered_broker_refuses_publishes_and_takes_them_again_once_the_store_is_back(
    zookeeper: ZooKeeperHarness, own_seaweedfs: SeaweedFS, tmp_path: Path
) -> None:
    """``max_backlog_bytes``: with the store stopped, publishes go on until that much waits for it,
    then are refused (JOURNAL_FULL, naming the store), never dropped; once the store is back and the
    backlog drains they are taken again, and every confirmed record is in the store or on the volume."""
    tiered = Tiering("s3://own/orders", endpoint=own_seaweedfs.endpoint, max_backlog_bytes=6000)
    broker = _broker(zookeeper, tmp_path / "data", tiered)
    confirmed = 0
    try:
        own_seaweedfs.stop()
        publisher = StreamClient(broker.endpoint, "orders", timeout=30).connect()
        refusal = None
        # the broker looks at its backlog once a tick (a second): publishing goes on until then, bounded
        deadline = time.monotonic() + CATCH_UP_S
        for first in range(1, 200_001, 20):
            if time.monotonic() > deadline:
                break
            try:
                publisher.publish_many((f"order.{i % 5}", b"order-%05d" % i) for i in range(first, first + 20))
                publisher.flush()
            except PublishRefusedError as exc:
                refusal = exc
                break
            confirmed = first + 19
        assert refusal is not None, "publishes were never refused"
        # refused within the loop's bounds, and not before the limit
        assert "wait for the object store, more than its limit of 6000" in str(refusal), refusal
        assert confirmed * 40 > 6000, f"refused after {confirmed} records only"
        with contextlib.suppress(PublishRefusedError):
            publisher.close()
        own_seaweedfs.start()
        wait_until(lambda: not broker.core.streams["orders"].tier_behind, timeout=CATCH_UP_S,
                   what="the backlog under its limit")  # fmt: skip
        _publish(broker.endpoint, confirmed + 1, 100)  # the refused ones again, and more
    finally:
        broker.stop()
    bodies = [r.body for r in _everything(zookeeper, tiered, tmp_path / "data", tmp_path / "cache")]
    assert bodies[:confirmed] == [b"order-%05d" % i for i in range(1, confirmed + 1)]
    # of the refused round, what the broker wrote before its refusal began (plain publishes: at least once)
    written = len(bodies) - confirmed - 100
    again = [b"order-%05d" % i for i in range(confirmed + 1, confirmed + 101)]
    assert 0 <= written < 20 and bodies[confirmed:] == again[:written] + again, "nothing lost, nothing else"


def _gauge(replicas: ReplicaSet, name: str, metric: str) -> float:
    """Replica ``name``'s ``metric`` for its stream (0 when it has no sample yet: a counter never raised)."""
    for family in text_string_to_metric_families(replicas.scrape(name)):
        for sample in family.samples:
            if sample.name == metric and sample.labels.get("stream") == replicas.stream:
                return float(sample.value)
    return 0.0


def _publish_replicated(replicas: ReplicaSet, first: int, count: int) -> None:
    with replicas.client(producer_id=f"tiered-{first}") as client:
        for start in range(first, first + count, 20):
            for n in range(start, start + 20):
                client.publish("k", b"%d" % n)
            client.flush(timeout=60)


def test_only_the_leader_of_a_replicated_stream_uploads_and_the_next_leader_goes_on_after_a_kill(
    zookeeper: ZooKeeperHarness, seaweedfs_server: SeaweedFS, s3_url: str, tmp_path: Path
) -> None:
    """Three ``zeps-broker --tier-store`` replicas: the leader uploads, the followers upload nothing yet
    learn from the manifest how far the store holds the stream and trim their volumes behind it. The
    leader is killed (-9) amid it all; the next one uploads in its own, higher epoch. The store's part
    and a survivor's volume together hold every record, once, in order."""
    replicas = ReplicaSet(zookeeper, tmp_path / "replicas")
    replicas.extra = ["--segment-bytes", "2000", "--tier-store", s3_url, "--tier-store-endpoint",
                      seaweedfs_server.endpoint, "--local-retention-bytes", "1"]  # fmt: skip
    try:
        first = replicas.start_in_sync()
        _publish_replicated(replicas, 1, 200)
        followers = [n for n in replicas.names if n != first]
        wait_until(lambda: all(_gauge(replicas, n, "zeps_broker_tier_tiered_to") >= 100 for n in replicas.names),
                   timeout=CATCH_UP_S, what="every replica to learn the store holds 100 records")  # fmt: skip
        # a 2000-byte segment (and the last batch of 20 it took) holds fewer than 100 of these 28-byte
        # records, so the store's 100 came in two objects at least, each uploaded by the leader
        entries, _ = read_manifest(zookeeper.client(), replicas.paths)
        assert len(entries) >= 2, f"{len(entries)} objects hold {max(e.last for e in entries)} records"
        # the counter follows the manifest: an upload is counted once its entry is written, and the broker's
        # metrics take the count at their next update (CI once read 3 here beside 4 entries)
        wait_until(lambda: _gauge(replicas, first, "zeps_broker_tier_uploads_total") >= len(entries), timeout=30,
                   what=f"the leader to count the {len(entries)} uploads the manifest lists")  # fmt: skip
        assert all(_gauge(replicas, n, "zeps_broker_tier_uploads_total") == 0 for n in followers)
        replicas.kill(first)
        _publish_replicated(replicas, 201, 200)
        second = replicas.leader()
        assert second != first
        wait_until(lambda: _gauge(replicas, second, "zeps_broker_tier_tiered_to") >= 300,
                   timeout=CATCH_UP_S, what="the next leader to upload past record 300")  # fmt: skip
        entries, refused = read_manifest(zookeeper.client(), replicas.paths)
        epochs = sorted({e.epoch for e in entries})
        assert refused == 0 and len(epochs) == 2 and epochs[0] < epochs[1], f"entries' epochs {epochs}"
    finally:
        replicas.stop()
    survivor = next(n for n in replicas.names if n != first)
    store = open_store(s3_url, endpoint=seaweedfs_server.endpoint)
    reader = TierReader(zookeeper.client(), replicas.paths, store, cache=tmp_path / "cache")
    local = replicas.records(survivor)
    reader.refresh()
    from_store: list[Record] = []
    while (at := len(from_store) + 1) < local[0].sequence:
        chunk = reader.read_chunk(at, max_bytes=4000, end=local[0].sequence - 1)
        assert chunk is not None, f"neither the store nor {survivor}'s volume holds record {at}"
        from_store += chunk.records()
    reader.close()
    bodies = [r.body for r in from_store + local]
    assert bodies == [b"%d" % n for n in range(1, 401)], f"{len(bodies)} records, {len(set(bodies))} distinct"


def test_a_quiet_stream_s_records_reach_the_store_once_its_segment_is_idle(
    zookeeper: ZooKeeperHarness, seaweedfs_server: SeaweedFS, s3_url: str, tmp_path: Path
) -> None:
    """30 records, far from filling a segment, then nothing: the broker closes the idle segment
    (``segment_idle_ms``) and uploads it, and the volume keeps nothing of them. A subscriber from 0
    then gets all 30 from the store, past the durable tail, and goes live for the next record."""
    tiered = Tiering(s3_url, endpoint=seaweedfs_server.endpoint, segment_idle_ms=1000)
    broker = BrokerServer(
        BrokerConfig(tmp_path / "data", ("orders",), journal=JournalConfig(fsync="always", retention_bytes=1)),
        registration=Registration(zookeeper.connect_string, "shop", "orders-0", chroot=zookeeper.root),
        tiering=tiered,
    ).start()
    try:
        with StreamClient(broker.endpoint, "orders") as client:
            client.publish_many((f"order.{i}", b"order-%05d" % i) for i in range(1, 31))
            client.flush()
        wait_until(lambda: _sample(broker, "zeps_broker_tier_tiered_to") == 30, timeout=CATCH_UP_S,
                   what="the idle segment's 30 records in the store")  # fmt: skip
        wait_until(lambda: broker.core.streams["orders"].journal.first_sequence == 31, timeout=CATCH_UP_S,
                   what="the volume to let them go")  # fmt: skip
        # the volume holds no record: a subscriber from 0 gets the store's 30, then goes live
        with StreamClient(broker.endpoint, "orders", timeout=30) as reader:
            reader.start("", since=Seq(0))
            got: list[tuple[int, bytes]] = []
            deadline = time.monotonic() + CATCH_UP_S
            while len(got) < 30 and time.monotonic() < deadline:
                got += [(m.sequence, m.body) for m in reader.receive_many(0.5)]
            _publish_one(broker.endpoint, b"order-00031")
            while len(got) < 31 and time.monotonic() < deadline:
                got += [(m.sequence, m.body) for m in reader.receive_many(0.5)]
            got += [(m.sequence, m.body) for m in reader.receive_many(0.7)]  # a negative check: nothing twice
        assert got == [(i, b"order-%05d" % i) for i in range(1, 32)]
        assert broker.failure is None, broker.failure
    finally:
        broker.stop()
    records = _everything(zookeeper, tiered, tmp_path / "data", tmp_path / "cache")
    assert [r.body for r in records] == [b"order-%05d" % i for i in range(1, 32)]

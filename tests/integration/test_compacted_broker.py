"""A compacted broker (``zeps-broker --cleanup compact``), real sockets and files: its compaction
thread rewrites closed segments while publishers write, and a subscriber from sequence 0 (all keys,
and a prefix) gets each key's latest record from the closed segments, every record of the active
one, and the deletes (records with an empty body) that are still within their retention."""

from __future__ import annotations

import time
from pathlib import Path

from harness import ZooKeeperHarness
from zeps.broker import BrokerConfig, BrokerServer, Registration
from zeps.broker.tiering import Tiering
from zeps.client import Seq, StreamClient, read_table
from zeps.journal import JournalConfig
from zeps.paths import StreamPaths
from zeps.tiering import read_manifest
from zeps_dev.process import wait_until
from zeps_dev.seaweedfs import SeaweedFS

#: a segment every 2,000 bytes (about 40 records); any superseded record starts a pass
JOURNAL = JournalConfig(segment_bytes=2000, fsync="always", cleanup="compact", min_cleanable_ratio=0.1)
KEYS = 10
WAIT_S = 30.0  # the compaction thread is offered a pass every tick (1 s) once a segment closes


def _publish(endpoint: str, rounds: int) -> dict[str, tuple[int, bytes]]:
    """``rounds`` values of each key, then a delete of ``key.3``; each key's last (round, body)."""
    last: dict[str, tuple[int, bytes]] = {}
    with StreamClient(endpoint, "prices") as client:
        for r in range(rounds):
            client.publish_many((f"key.{k}", b"v%03d-%d" % (r, k)) for k in range(KEYS))
            client.flush()
            last.update({f"key.{k}": (r, b"v%03d-%d" % (r, k)) for k in range(KEYS)})
        client.publish("key.3", b"")
        client.flush()
    return last


def _replayed(endpoint: str, pattern: str, count: int) -> list[tuple[int, str, bytes]]:
    """(sequence, key, body) a subscriber from sequence 0 gets: ``count`` records, then nothing more
    for 0.7 s (bounded by WAIT_S)."""
    got: list[tuple[int, str, bytes]] = []
    with StreamClient(endpoint, "prices", timeout=30) as reader:
        reader.start(pattern, since=Seq(0))
        deadline = time.monotonic() + WAIT_S
        while len(got) < count and time.monotonic() < deadline:
            got += [(m.sequence, m.key, m.body) for m in reader.receive_many(0.5)]
        got += [(m.sequence, m.key, m.body) for m in reader.receive_many(0.7)]  # a negative check: nothing twice
    return got


def test_a_compacted_broker_serves_each_keys_latest_record_to_a_subscriber_from_0(tmp_path: Path) -> None:
    """50 rounds of 10 keys and a delete, about 12 segments: the thread removes superseded records
    from the closed ones (the journal's own count says how many); a subscriber from 0 gets, in
    order and once each, exactly what the journal holds: the closed segments' latest record per
    key, the active segment whole, key.3's delete among them; a prefix subscription the same of
    its keys. Folding either into a table gives each key's last value, and no key.3; so does the
    SDK's read_table (fetches of 7 sequences), and a subscription from its sequence on folds in what
    follows."""
    broker = BrokerServer(BrokerConfig(tmp_path / "data", ("prices",), journal=JOURNAL)).start()
    try:
        last = _publish(broker.endpoint, 50)
        journal = broker.core.streams["prices"].journal

        def sample(name: str) -> float:
            return broker.registry.get_sample_value(name, {"stream": "prices"}) or 0.0

        wait_until(lambda: sample("zeps_broker_compaction_segments_total") >= 10, timeout=WAIT_S,
                   what="compaction passes over the closed segments")  # fmt: skip
        wait_until(lambda: sample("zeps_broker_compaction_removed_records_total") > 300, timeout=WAIT_S,
                   what="most of 500 records removed as superseded")  # fmt: skip
        wait_until(lambda: sample("zeps_broker_compaction_passes_total") >= 1, timeout=WAIT_S,
                   what="the pass's end noted")  # fmt: skip
        assert sample("zeps_broker_compaction_failures_total") == 0
        held = []
        sequence = 0
        while records := journal.read(sequence, max_records=1000):
            held += [(r.sequence, r.key, r.body) for r in records]
            sequence = records[-1].sequence + 1
        assert len(held) < 200 and held[-1][0] == 501
        active = journal.replica_position()[0]
        closed = [h for h in held if h[0] < active]
        assert len({key for _, key, _ in closed}) == len(closed), "one record per key in the closed segments"

        everything = _replayed(broker.endpoint, "", len(held))
        assert everything == held
        table = {}
        for _, key, body in everything:
            if body:
                table[key] = body
            else:
                table.pop(key, None)
        assert table == {key: body for key, (_, body) in last.items() if key != "key.3"}
        assert (501, "key.3", b"") in everything  # the delete, within its retention

        prefix = _replayed(broker.endpoint, "key.1", len([h for h in held if h[1] == "key.1"]))
        assert prefix == [h for h in held if h[1] == "key.1"]

        with StreamClient(broker.endpoint, "prices") as client:  # the SDK's table view, a window at a time
            snapshot = read_table(client, window=7)
            assert dict(snapshot) == table and snapshot.sequence == 501
            assert dict(read_table(client, "key.1")) == {k: v for k, v in table.items() if k.startswith("key.1")}
        with StreamClient(broker.endpoint, "prices") as follower:  # a fetching client does not subscribe
            follower.publish("key.1", b"")  # a change after the snapshot, folded in from a subscription
            follower.flush()
            follower.start("", since=Seq(snapshot.sequence))
            wait_until(lambda: snapshot.apply(follower.receive_many(0.2)) or snapshot.sequence == 502,
                       timeout=WAIT_S, what="the delete after the snapshot")  # fmt: skip
            assert "key.1" not in snapshot and len(snapshot) == KEYS - 2
    finally:
        broker.stop()


def test_a_compacted_tiered_broker_keeps_each_key_s_latest_record_in_the_store_and_serves_it_from_0(
    zookeeper: ZooKeeperHarness, seaweedfs_server: SeaweedFS, s3_url: str, tmp_path: Path
) -> None:
    """``--cleanup compact --tier-store`` on a real S3 server: closed segments are uploaded, then
    compacted, then uploaded again (the manifest's runs in a newer generation, the older objects
    deleted); once 2 s old the local copies go. A subscriber from 0 then gets the store's compacted
    runs and the journal's rest: each key's latest record (key.3's delete among them), sequences
    rising with gaps, far fewer than were published."""
    journal = JournalConfig(segment_bytes=2000, fsync="always", cleanup="compact", min_cleanable_ratio=0.1,
                            retention_ms=2000)  # fmt: skip
    broker = BrokerServer(
        BrokerConfig(tmp_path / "data", ("prices",), journal=journal),
        registration=Registration(zookeeper.connect_string, "shop", "prices-0", chroot=zookeeper.root),
        tiering=Tiering(s3_url, endpoint=seaweedfs_server.endpoint, segment_idle_ms=1000),
    ).start()
    paths = StreamPaths.of("shop", "prices", chroot=zookeeper.root)
    try:
        last = _publish(broker.endpoint, 50)
        stream = broker.core.streams["prices"]

        def generations() -> set[int]:
            return {e.generation for e in read_manifest(zookeeper.client(), paths)[0]}

        wait_until(lambda: max(generations(), default=0) >= 1, timeout=WAIT_S,
                   what="a compacted run uploaded again")  # fmt: skip
        wait_until(lambda: stream.journal.first_sequence > 400, timeout=WAIT_S,
                   what="the local copies of the store's runs deleted")  # fmt: skip
        entries, refused = read_manifest(zookeeper.client(), paths)
        assert refused == 0 and len({e.first for e in entries}) == len(entries), "one generation of each run"
        got: list[tuple[int, str, bytes]] = []
        with StreamClient(broker.endpoint, "prices", timeout=30) as reader:
            reader.start("", since=Seq(0))
            deadline = time.monotonic() + WAIT_S
            while (not got or got[-1][0] < 501) and time.monotonic() < deadline:  # 501: key.3's delete
                got += [(m.sequence, m.key, m.body) for m in reader.receive_many(0.5)]
        sequences = [s for s, _, _ in got]
        assert sequences == sorted(set(sequences)) and sequences[0] < stream.journal.first_sequence
        assert len(got) < 300, f"{len(got)} records: the store's runs are compacted"
        table: dict[str, bytes] = {}
        for _, key, body in got:
            table[key] = body
        assert table == {key: body for key, (_, body) in last.items()} | {"key.3": b""}
    finally:
        broker.stop()

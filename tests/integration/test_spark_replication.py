"""Spark across failovers of replicated streams: a real local SparkSession runs a streaming query
from a replicated stream ``prices`` into a replicated stream ``out`` (three broker processes each,
a real ZooKeeper electing their leaders). Both leaders are killed (SIGKILL) while the query runs;
the query waits for the new leaders (the source's ``leaderWaitSeconds``), its tasks follow them,
and ``out`` holds every row exactly once."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness import ReplicaSet, ZooKeeperHarness, until
from zeps.client import Seq
from zeps.client.discovery import broker_metadata
from zeps.spark import ZepsDataSource
from zeps.spark.queries import start_query

pytestmark = pytest.mark.spark

ROWS = 2000


@pytest.fixture
def sets(zookeeper: ZooKeeperHarness, tmp_path: Path) -> Iterator[dict[str, ReplicaSet]]:
    made = {name: ReplicaSet(zookeeper, tmp_path / name, stream=name) for name in ("prices", "out")}
    for replica_set in made.values():
        for replica in replica_set.names:
            replica_set.start(replica)
    try:
        for replica_set in made.values():
            until(lambda r=replica_set: r.state() is not None and len(r.state().isr) == 3,
                  "three replicas in sync", timeout=60)  # fmt: skip
        yield made
    finally:
        for replica_set in made.values():
            replica_set.stop()


def _options(zookeeper: ZooKeeperHarness, replica_set: ReplicaSet) -> dict[str, str]:
    return {"stream": replica_set.stream, "namespace": "default", "zookeeper": zookeeper.connect_string,
            "chroot": zookeeper.root, "endpoint": replica_set.locator()()}  # fmt: skip


def _publish(replica_set: ReplicaSet, ids: range) -> None:
    """Publish ``ids``, then wait until the leader's facts in ZooKeeper (what the source plans with) say so."""
    with replica_set.client(producer_id="source") as client:
        client.publish_many([("k", b"%d" % i) for i in ids])
        client.flush(timeout=60)

    def tail() -> int:
        meta = broker_metadata(replica_set.zk, "default", replica_set.stream, chroot=replica_set.zookeeper.root)
        return int(meta.get("lastSequence", 0))

    until(lambda: tail() >= ids[-1] + 1, "the leader's tail in ZooKeeper", timeout=30)


def test_a_streaming_query_between_replicated_streams_is_exactly_once_across_failovers(
    spark: Any, zookeeper: ZooKeeperHarness, sets: dict[str, ReplicaSet], tmp_path: Path
) -> None:
    spark.dataSource.register(ZepsDataSource)
    prices, out = sets["prices"], sets["out"]
    _publish(prices, range(ROWS // 2))
    reader = spark.readStream.format("zeps")
    for k, v in {**_options(zookeeper, prices), "startingOffsets": "earliest", "maxOffsetsPerTrigger": "250",
                 "partitionSize": "125"}.items():  # fmt: skip
        reader = reader.option(k, v)
    writer = reader.load().selectExpr("key", "body").writeStream.format("zeps")
    writer = writer.option("checkpointLocation", str(tmp_path / "checkpoint"))
    for k, v in _options(zookeeper, out).items():
        writer = writer.option(k, v)
    query = start_query(writer.start)
    try:
        query.processAllAvailable()
        for replica_set in (prices, out):  # both leaders die; the query goes on with their successors
            replica_set.kill(replica_set.leader())
        _publish(prices, range(ROWS // 2, ROWS))  # waits for the new leader of prices
        query.processAllAvailable()
    finally:
        query.stop()
    with out.client() as client:
        client.start("", since=Seq(0))
        bodies: list[bytes] = []
        for _ in range(60):
            bodies += [m.body for m in client.receive_many(1.0)]
            if len(bodies) >= ROWS:
                break
        bodies += [m.body for m in client.receive_many(1.0)]
    assert len(bodies) == ROWS, f"{len(bodies) - ROWS:+d} rows against {ROWS}"
    assert sorted(bodies) == sorted(b"%d" % i for i in range(ROWS))


def test_a_batch_read_with_follower_reads_is_served_by_the_followers(
    spark: Any, zookeeper: ZooKeeperHarness, tmp_path: Path
) -> None:
    """``followerReads``: the executors read every row from the in-sync followers; the leader, which
    took the publishes, delivers none (the replicas' delivery counters)."""
    spark.dataSource.register(ZepsDataSource)
    prices = ReplicaSet(zookeeper, tmp_path / "prices")
    for replica in prices.names:
        prices.start(replica)
    try:
        until(lambda: prices.state() is not None and len(prices.state().isr) == 3, "three in sync", timeout=60)
        _publish(prices, range(ROWS))
        reader = spark.read.format("zeps")
        for k, v in {**_options(zookeeper, prices), "followerReads": "true", "partitionSize": "500"}.items():
            reader = reader.option(k, v)
        bodies = sorted(bytes(r.body) for r in reader.load().select("body").collect())
        assert bodies == sorted(b"%d" % i for i in range(ROWS))
        leader = prices.leader()

        def delivered(name: str) -> float:  # each replica's exporter copies its count about once a second
            lines = prices.scrape(name).splitlines()
            return sum(float(x.split()[-1]) for x in lines if x.startswith("zeps_broker_messages_out_total"))

        until(lambda: sum(delivered(n) for n in prices.names if n != leader) >= ROWS, "the followers' counts",
              timeout=10)  # fmt: skip
        assert delivered(leader) == 0
    finally:
        prices.stop()

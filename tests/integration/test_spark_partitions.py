"""The zeps Spark source and sink over a partitioned stream (three brokers, one per partition, a real
ZooKeeper, a local[2,2] SparkSession): input partitions per stream partition, per-partition offsets
in the checkpoint, a ``partition`` column, and rows written to their key's partition exactly once."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from harness import ZooKeeperHarness
from zeps.client import PartitionedStreamClient, StreamClient
from zeps.errors import ConfigError
from zeps.partitioning import partition_of
from zeps.spark import ZepsDataSource
from zeps.spark.queries import start_query
from zeps_dev.process import wait_until

pytestmark = pytest.mark.spark
PARTITIONS = 3


def _options(zookeeper: ZooKeeperHarness, plain: list[str]) -> dict[str, str]:
    return {"stream": "orders", "namespace": "default", "zookeeper": zookeeper.connect_string,
            "chroot": zookeeper.root, "endpoint": plain[0]}  # fmt: skip


def _publish(plain: list[str], start: int, n: int) -> None:
    with PartitionedStreamClient(plain, "orders", producer_id=f"p{start}") as client:
        client.publish_many([(f"customer-{i % 40}", b"%d" % i) for i in range(start, start + n)])
        client.flush(timeout=30)


def _tails(zookeeper: ZooKeeperHarness, n: int) -> None:
    """The brokers publish their durable tails in ZooKeeper within a second: wait until they add up to n."""
    from zeps.client.discovery import read_broker_metadata  # noqa: PLC0415

    def total() -> int:
        facts = [read_broker_metadata(zookeeper.connect_string, "default", "orders", chroot=zookeeper.root,
                                      partition=p) for p in range(PARTITIONS)]  # fmt: skip
        return sum(int(f.get("lastSequence", 0)) for f in facts)

    wait_until(lambda: total() >= n, timeout=20, what=f"the partitions' tails to reach {n}")


def _reader(spark: Any, options: dict[str, str], *, stream: bool = True, **extra: str) -> Any:
    spark.dataSource.register(ZepsDataSource)
    reader = spark.readStream.format("zeps") if stream else spark.read.format("zeps")
    for k, v in {**options, **extra}.items():
        reader = reader.option(k, v)
    return reader.load()


def test_a_streaming_read_has_a_partition_column_and_per_partition_offsets_exactly_once_across_a_restart(
    spark: Any, zookeeper: ZooKeeperHarness, plain: list[str], tmp_path: Path
) -> None:
    _publish(plain, 0, 3000)
    _tails(zookeeper, 3000)
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"

    def start() -> Any:
        df = _reader(spark, _options(zookeeper, plain), startingOffsets="earliest", maxOffsetsPerTrigger="900",
                     partitionSize="200")  # fmt: skip
        writer = (df.select("partition", "sequence", "key", "body").writeStream.format("parquet")
                  .option("path", str(out)).option("checkpointLocation", str(checkpoint))
                  .trigger(processingTime="200 milliseconds"))  # fmt: skip
        return start_query(writer.start)

    query = start()
    wait_until(lambda: len(query.recentProgress) >= 2, timeout=120, what="two micro-batches")
    end_offset = json.loads(query.recentProgress[-1].json)["sources"][0]["endOffset"]
    query.stop()
    assert set(end_offset["orders"]) == {"0", "1", "2"}  # the checkpoint holds a sequence per partition
    assert spark.read.parquet(str(out)).count() < 3000, "the first run should not have finished"
    _publish(plain, 3000, 600)
    _tails(zookeeper, 3600)
    query = start()  # resumes from its checkpoint
    wait_until(lambda: spark.read.parquet(str(out)).count() >= 3600, timeout=180, what="all 3600 rows")
    query.processAllAvailable()
    query.stop()
    rows = spark.read.parquet(str(out)).collect()
    seen = [(r["partition"], r["sequence"]) for r in rows]
    assert len(seen) == len(set(seen)) == 3600, "every message exactly once"
    by_key: dict[str, list[int]] = defaultdict(list)
    for r in sorted(rows, key=lambda r: (r["partition"], r["sequence"])):
        assert r["partition"] == partition_of(r["key"], PARTITIONS)
        by_key[r["key"]].append(int(r["body"]))
    assert all(v == sorted(v) for v in by_key.values()) and len(by_key) == 40  # in order, per key


def test_a_batch_read_splits_into_min_partitions_and_a_write_goes_to_each_keys_partition_once(
    spark: Any, zookeeper: ZooKeeperHarness, plain: list[str]
) -> None:
    _publish(plain, 0, 900)
    _tails(zookeeper, 900)
    df = _reader(spark, _options(zookeeper, plain), stream=False, minPartitions="12")
    assert df.rdd.getNumPartitions() >= 12
    assert df.columns == ["partition", "sequence", "key", "body", "timestamp"]
    assert df.count() == 900 and df.select("partition", "sequence").distinct().count() == 900
    with pytest.raises(Exception, match="startSequence/endSequence name no range"):
        _reader(spark, _options(zookeeper, plain), stream=False, endSequence="5").count()

    rows = spark.createDataFrame([(f"order-{i}", b"w%d" % i) for i in range(300)], "key string, body binary")
    writer = rows.write.format("zeps").mode("append")
    for k, v in _options(zookeeper, plain).items():
        writer = writer.option(k, v)
    writer.save()
    written: dict[int, list[str]] = {}
    for p, endpoint in enumerate(plain):
        with StreamClient(endpoint, "orders") as c:
            written[p] = [m.key for m in c.fetch("order-", first=1).messages]
    assert sum(len(v) for v in written.values()) == 300  # each row once
    assert all(partition_of(k, PARTITIONS) == p for p, keys in written.items() for k in keys)


def test_reading_a_partition_the_settings_do_not_list_is_refused(zookeeper: ZooKeeperHarness) -> None:
    from zeps.config import resolve  # noqa: PLC0415

    settings = resolve("ZepsStream", "orders", namespace="default", endpoint="tcp://127.0.0.1:1")
    with pytest.raises(ConfigError, match="no endpoint is known for partition 2"):
        StreamClient.of(settings, 2)


def test_a_driver_that_cannot_reach_zookeeper_still_reads_a_range_named_in_full(tmp_path: Path) -> None:
    """examples/spark/spark-submit.sh runs the driver outside the cluster, where ZooKeeper's address
    (from the resource's status) does not resolve, and names the range (endSequence): the driver
    must neither look for partitions nor ask for the tail (the kind suite's Spark test failed so)."""
    from zeps.config import Resolved  # noqa: PLC0415
    from zeps.spark.source import STREAM_COLUMNS, ZepsBatchReader  # noqa: PLC0415

    unreachable = "zookeeper.nowhere.invalid:2181"
    from_status = Resolved(kind="ZepsStream", name="orders", namespace="default", zookeeper=unreachable,
                           endpoint="tcp://127.0.0.1:1", spec={"partitions": 1})  # fmt: skip
    reader = ZepsBatchReader(from_status, {"endsequence": "400", "partitionsize": "100"}, STREAM_COLUMNS)
    assert [(r.start, r.end, r.partition) for r in reader.partitions()] == [(0, 100, 0), (100, 200, 0),
                                                                            (200, 300, 0), (300, 400, 0)]  # fmt: skip

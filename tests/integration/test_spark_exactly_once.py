"""Writes into a ZepsStream from Spark, exactly once across task retries and a query restart: a real
local[2,2] SparkSession (a failed task is tried again once), a real broker, a real ZooKeeper. A task
is made to fail mid-write by a row the writer refuses, given only while a marker file says so (files:
executors run in other processes)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness import ZooKeeperHarness
from zeps.broker import BrokerConfig, BrokerServer, Registration
from zeps.client import Seq, StreamClient
from zeps.journal import JournalConfig
from zeps.spark import ZepsDataSource
from zeps.spark.queries import start_query
from zeps_dev.process import wait_until

pytestmark = pytest.mark.spark

ROWS = 2000


@pytest.fixture
def broker(zookeeper: ZooKeeperHarness, tmp_path: Path) -> Iterator[BrokerServer]:
    server = BrokerServer(
        BrokerConfig(tmp_path / "journal", ("prices", "out"), journal=JournalConfig(fsync="group")),
        registration=Registration(zookeeper.connect_string, "spark", "prices-0", chroot=zookeeper.root),
    ).start()
    try:
        yield server
    finally:
        server.stop()


def _options(zookeeper: ZooKeeperHarness, broker: BrokerServer, stream: str) -> dict[str, str]:
    return {"stream": stream, "namespace": "spark", "zookeeper": zookeeper.connect_string, "chroot": zookeeper.root,
            "endpoint": broker.endpoint}  # fmt: skip


def _failing_rows(fail_at: int, failures: Path, times: int) -> Any:
    """A ``mapInArrow`` function making (key, body) rows from (key, id). The first ``times`` times it
    runs over id ``fail_at`` (counted in files under ``failures``), that row gets a key with a space,
    which the writer refuses to publish (LocalProtocolError): the task fails after the writer published
    the rows before it. (Spark hands a task's rows to a Python writer only once they are all made, so
    the failure has to come from the writer.)"""

    def rows(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa  # noqa: PLC0415

        for batch in batches:
            ids, keys = batch.column("id").to_pylist(), batch.column("key").to_pylist()
            if fail_at in ids:
                failures.mkdir(exist_ok=True)
                done = len(list(failures.iterdir()))
                if done < times:
                    (failures / str(done)).touch()
                    keys[ids.index(fail_at)] = "not a key"
            yield pa.record_batch([pa.array(keys, pa.string()), pa.array([b"v%d" % i for i in ids], pa.binary())],
                                  names=["key", "body"])  # fmt: skip

    return rows


def _stream(broker: BrokerServer, stream: str, expect: int, wait: float = 60) -> list[bytes]:
    """Every body in ``stream`` (waiting up to ``wait`` seconds for ``expect``, then a moment more for
    any extra)."""
    bodies: list[bytes] = []
    with StreamClient(broker.endpoint, stream, idempotent=False) as reader:
        reader.start("", since=Seq(0))
        deadline = time.monotonic() + wait
        while len(bodies) < expect and time.monotonic() < deadline:
            bodies += [body for _, _, body, _ in reader.receive_rows(1.0)]
        bodies += [body for _, _, body, _ in reader.receive_rows(1.0)]
    return bodies


def test_a_batch_write_whose_task_is_retried_writes_each_row_once(
    spark: Any, zookeeper: ZooKeeperHarness, broker: BrokerServer, tmp_path: Path
) -> None:
    from pyspark.sql import functions as F  # noqa: N812, PLC0415

    spark.dataSource.register(ZepsDataSource)
    rows = _failing_rows(ROWS - 10, tmp_path / "failures", times=1)  # late in the second partition
    ids = spark.range(0, ROWS, 1, numPartitions=2).select(
        F.concat(F.lit("k."), F.col("id").cast("string")).alias("key"), "id"
    )
    df = ids.mapInArrow(rows, "key string, body binary")
    writer = df.write.format("zeps").mode("append")
    for k, v in _options(zookeeper, broker, "out").items():
        writer = writer.option(k, v)
    writer.save()
    assert len(list((tmp_path / "failures").iterdir())) == 1, "the task failed once and was retried"
    bodies = _stream(broker, "out", ROWS)
    assert len(bodies) == ROWS, f"{len(bodies) - ROWS:+d} rows against {ROWS} written"
    assert sorted(bodies) == sorted(b"v%d" % i for i in range(ROWS))
    producers = broker.core.streams["out"].journal.producers.producers
    retried = [p for name, p in producers.items() if name.endswith("-1")]
    assert [p.epoch for p in retried] == [2], "the retry claimed the second partition's producer afresh"


def test_a_streaming_write_is_exactly_once_across_task_retries_and_a_query_restart(
    spark: Any, zookeeper: ZooKeeperHarness, broker: BrokerServer, tmp_path: Path
) -> None:
    """Micro-batch 0 has a task that fails once (retried: the query goes on); micro-batch 1 has one
    that fails on both attempts, so the query fails with part of that micro-batch published. Started
    again from its checkpoint, the query runs micro-batch 1 again: the stream holds every row once."""
    spark.dataSource.register(ZepsDataSource)

    def source(ids: range) -> None:
        with StreamClient(broker.endpoint, "prices", idempotent=False) as client:
            client.publish_many([("k", b"%d" % i) for i in ids])
            client.flush()
        wait_until(lambda: broker.facts("prices").get("lastSequence", 0) >= ids[-1] + 1, timeout=15,
                   what="the tail in ZooKeeper")  # fmt: skip

    def start(failures: Path, fail_at: int, times: int) -> Any:
        rows = _failing_rows(fail_at, failures, times)
        reader = spark.readStream.format("zeps")
        for k, v in {**_options(zookeeper, broker, "prices"), "startingOffsets": "earliest",
                     "maxOffsetsPerTrigger": str(ROWS // 2), "partitionSize": str(ROWS // 4)}.items():  # fmt: skip
            reader = reader.option(k, v)
        df = (
            reader.load()
            .selectExpr("key", "cast(cast(body as string) as long) as id")
            .mapInArrow(rows, "key string, body binary")
        )
        writer = df.writeStream.format("zeps").option("checkpointLocation", str(tmp_path / "checkpoint"))
        for k, v in _options(zookeeper, broker, "out").items():
            writer = writer.option(k, v)
        return start_query(writer.start)

    # micro-batch 0: ids 0..999 in two partitions of 500, the task with id 300 fails once
    source(range(0, ROWS // 2))
    first = start(tmp_path / "batch-0-failures", fail_at=300, times=1)
    first.processAllAvailable()
    first.stop()
    assert len(list((tmp_path / "batch-0-failures").iterdir())) == 1
    # micro-batch 1: ids 1000..1999, the task with id 1900 fails on both attempts: the query fails
    source(range(ROWS // 2, ROWS))
    second = start(tmp_path / "batch-1-failures", fail_at=1900, times=2)
    with pytest.raises(Exception, match="printable ASCII without spaces"):
        second.awaitTermination(120)
    partial = len(_stream(broker, "out", ROWS - 100, wait=5))
    # micro-batch 0, and of micro-batch 1 the 400 rows its failed task wrote before id 1900, and as much
    # of its other task as ran before Spark aborted the job
    assert ROWS // 2 + 400 <= partial <= ROWS - 100, partial
    third = start(tmp_path / "batch-1-failures", fail_at=1900, times=2)  # its failures are used up
    third.processAllAvailable()
    third.stop()
    bodies = _stream(broker, "out", ROWS)
    assert len(bodies) == ROWS, f"{len(bodies) - ROWS:+d} rows against {ROWS}"
    assert sorted(bodies) == sorted(b"v%d" % i for i in range(ROWS))

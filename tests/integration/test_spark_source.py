"""The zeps Spark data source on a local[2,2] SparkSession, with a real broker and a real ZooKeeper."""

from __future__ import annotations

import json
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql.types import StructField, StructType

import zeps
import zeps.errors
from harness import ZooKeeperHarness, fresh_py4j_connection, next_millisecond
from zeps.batchstore import open_store
from zeps.broker import BrokerConfig, BrokerServer, Registration
from zeps.client import Seq, StreamClient, read_table
from zeps.config import Resolved
from zeps.coordination.batches import BatchQueue
from zeps.errors import ConfigError
from zeps.journal import Journal, JournalConfig
from zeps.options import BatchOptions
from zeps.paths import StreamPaths
from zeps.spark import ZepsDataSource, latest_per_key, queue_sink, tombstones, topic_sink
from zeps.spark.queries import WORKER_DID_NOT_CONNECT, start_query
from zeps.spark.source import _QUEUE_TYPES, DataLossError, _Range, _StreamRead
from zeps.tiering import TierUploader
from zeps_dev.process import wait_until

pytestmark = pytest.mark.spark


@pytest.fixture
def broker(zookeeper: ZooKeeperHarness, tmp_path: Path) -> Iterator[BrokerServer]:
    journal = JournalConfig(fsync="group", segment_bytes=8192, retention_bytes=None)
    server = BrokerServer(
        BrokerConfig(tmp_path / "journal", ("prices", "out"), journal=journal),
        registration=Registration(zookeeper.connect_string, "spark", "prices-0", chroot=zookeeper.root),
    ).start()
    try:
        yield server
    finally:
        server.stop()


def _options(zookeeper: ZooKeeperHarness, broker: BrokerServer, stream: str = "prices") -> dict[str, str]:
    return {
        "stream": stream,
        "namespace": "spark",
        "zookeeper": zookeeper.connect_string,
        "chroot": zookeeper.root,
        "endpoint": broker.endpoint,
    }


def _publish(broker: BrokerServer, n: int, start: int = 0, stream: str = "prices") -> None:
    with StreamClient(broker.endpoint, stream) as c:
        for i in range(start, start + n):
            c.publish(f"eu.{i % 3}", b"%d" % i)
        c.flush()


def _tail_published(broker: BrokerServer, n: int) -> None:
    """The durable tail reaches ZooKeeper within a second (the driver's source of latestOffset)."""
    wait_until(
        lambda: broker.facts("prices").get("lastSequence", 0) >= n,
        timeout=15,
        what=f"the broker to publish lastSequence {n}",
    )


def _reader(spark: Any, options: dict[str, str], **extra: str) -> Any:
    spark.dataSource.register(ZepsDataSource)
    reader = spark.readStream.format("zeps")
    for k, v in {**options, **extra}.items():
        reader = reader.option(k, v)
    return reader.load()


# its two waits (120 s, 180 s) and the queries' starts: a slow run fails in a wait, not in
# pytest-timeout's interrupt of a py4j call (which leaves the shared SparkSession's connection out of step)
@pytest.mark.timeout(420)
def test_stream_into_files_exactly_once_across_a_restart(
    spark: Any, zookeeper: ZooKeeperHarness, broker: BrokerServer, tmp_path: Path
) -> None:
    _publish(broker, 3000)
    _tail_published(broker, 3000)
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"

    def start() -> Any:
        df = _reader(
            spark,
            _options(zookeeper, broker),
            startingOffsets="earliest",
            maxOffsetsPerTrigger="700",
            partitionSize="400",
        )
        writer = (
            df.select("sequence", "key", "body")
            .writeStream.format("parquet")
            .option("path", str(out))
            .option("checkpointLocation", str(checkpoint))
            .trigger(processingTime="200 milliseconds")
        )
        return start_query(writer.start)

    query = start()
    wait_until(lambda: len(query.recentProgress) >= 2, timeout=120, what="two micro-batches")
    query.stop()  # killed mid-way
    assert spark.read.parquet(str(out)).count() < 3000, "the first run should not have finished"
    _publish(broker, 1000, start=3000)
    _tail_published(broker, 4000)
    query = start()  # resumes from its checkpoint
    wait_until(lambda: spark.read.parquet(str(out)).count() >= 4000, timeout=180, what="all 4000 rows")
    query.processAllAvailable()
    query.stop()
    rows = spark.read.parquet(str(out)).orderBy("sequence").collect()
    assert [r["sequence"] for r in rows] == list(range(1, 4001)), "every message exactly once"
    assert rows[41]["body"] == b"41" and rows[41]["key"] == "eu.2"


def test_starting_offsets_and_patterns(spark: Any, zookeeper: ZooKeeperHarness, broker: BrokerServer) -> None:
    _publish(broker, 60)
    _tail_published(broker, 60)

    def run(name: str, **extra: str) -> list[int]:
        df = _reader(spark, _options(zookeeper, broker), **extra)
        query = start_query(df.writeStream.format("memory").queryName(name).start)
        query.processAllAvailable()
        if name == "q_latest":  # started at the tail: only what comes after
            _publish(broker, 5, start=60)
            _tail_published(broker, 65)
            query.processAllAvailable()
        query.stop()
        return [r["sequence"] for r in spark.sql(f"select sequence from {name} order by sequence").collect()]

    assert run("q_earliest", startingOffsets="earliest") == list(range(1, 61))
    assert run("q_json", startingOffsets=json.dumps({"prices": 50})) == list(range(51, 61))
    assert run("q_latest", startingOffsets="latest") == list(range(61, 66))
    assert run("q_pattern", startingOffsets="earliest", pattern="eu.1") == [s for s in range(1, 66) if (s - 1) % 3 == 1]
    ts = int(time.time() * 1000)
    next_millisecond()  # the broker stamps records in milliseconds: the next ones come after ts
    _publish(broker, 3, start=65)
    _tail_published(broker, 68)
    assert run("q_time", startingOffsets=str(ts)) == [66, 67, 68]


def test_a_schema_naming_fewer_columns_reads_only_those(
    spark: Any, zookeeper: ZooKeeperHarness, broker: BrokerServer
) -> None:
    """Spark gives a Python data source no column pruning; naming the columns in ``.schema()`` is
    how a query asks for fewer, in any order — with a pattern too, though ``key`` is not among them."""
    _publish(broker, 90)
    _tail_published(broker, 90)
    spark.dataSource.register(ZepsDataSource)

    def read(schema: str, **extra: str) -> Any:
        reader = spark.read.format("zeps").schema(schema)
        for k, v in {**_options(zookeeper, broker), "endSequence": "90", "partitionSize": "40", **extra}.items():
            reader = reader.option(k, v)
        return reader.load()

    rows = read("body binary, key string").collect()
    assert [tuple(r) for r in rows] == [(b"%d" % i, f"eu.{i % 3}") for i in range(90)]
    assert read("sequence long", pattern="eu.2").columns == ["sequence"]
    assert [r["sequence"] for r in read("sequence long", pattern="eu.2").collect()] == list(range(3, 91, 3))
    stamps = read("timestamp timestamp, sequence long").orderBy("sequence").collect()
    assert [r["sequence"] for r in stamps] == list(range(1, 91)) and stamps[0]["timestamp"] <= stamps[-1]["timestamp"]
    for bad, field in [("body string", "body string"), ("key string, offset long", "offset bigint")]:
        with pytest.raises(Exception, match=f"schema field {field}: a stream's rows have sequence long"):
            read(bad).collect()


def test_fail_on_data_loss_both_ways(spark: Any, zookeeper: ZooKeeperHarness, tmp_path: Path) -> None:
    journal = JournalConfig(fsync="group", segment_bytes=2048, retention_bytes=4096)  # keeps ~4 KB
    registration = Registration(zookeeper.connect_string, "spark", "prices-0", chroot=zookeeper.root)
    broker = BrokerServer(BrokerConfig(tmp_path / "j", ("prices",), journal=journal), registration=registration).start()
    try:
        _publish(broker, 400)
        _tail_published(broker, 400)
        journal_now = broker.core.streams["prices"].journal
        wait_until(lambda: journal_now.first_sequence > 1, timeout=10, what="retention to remove old segments")
        first = journal_now.first_sequence

        df = _reader(spark, _options(zookeeper, broker), startingOffsets="earliest")
        query = start_query(df.writeStream.format("memory").queryName("lossy_fail").start)
        with pytest.raises(Exception, match="removed by retention"):
            query.processAllAvailable()
        query.stop()

        df = _reader(spark, _options(zookeeper, broker), startingOffsets="earliest", failOnDataLoss="false")
        query = start_query(df.writeStream.format("memory").queryName("lossy_skip").start)
        query.processAllAvailable()
        query.stop()
        got = [r["sequence"] for r in spark.sql("select sequence from lossy_skip order by sequence").collect()]
        assert got[0] >= first and got == list(range(got[0], 401))
    finally:
        broker.stop()


def test_a_compacted_stream_read_as_a_table_and_deletes_written_back(
    spark: Any, zookeeper: ZooKeeperHarness, tmp_path: Path
) -> None:
    """A compacted stream (--cleanup compact) read from the start in a batch job: its gaps are what
    compaction removed, not data loss (option compacted=true; a ZepsStream's spec.cleanup says so),
    and latest_per_key gives each key's latest value without the deleted keys; tombstones written by
    the zeps writer delete keys for every table view after, the SDK's read_table included."""
    journal = JournalConfig(fsync="group", segment_bytes=2048, cleanup="compact", min_cleanable_ratio=0.1)
    registration = Registration(zookeeper.connect_string, "spark", "prices-0", chroot=zookeeper.root)
    broker = BrokerServer(BrokerConfig(tmp_path / "j", ("prices",), journal=journal), registration=registration).start()
    try:
        with StreamClient(broker.endpoint, "prices") as c:
            for i in range(400):
                c.publish(f"eu.{i % 7}", b"" if i == 393 else b"%d" % i)  # eu.1's last record deletes it
            c.flush()
        _tail_published(broker, 400)

        def compacted(what: str) -> float:
            return broker.registry.get_sample_value(f"zeps_broker_compaction_{what}_total", {"stream": "prices"}) or 0

        wait_until(lambda: compacted("segments") >= 1 and compacted("passes") >= 1, timeout=30,
                   what="compaction of the closed segments")  # fmt: skip
        spark.dataSource.register(ZepsDataSource)
        reader = spark.read.format("zeps")
        for k, v in {**_options(zookeeper, broker), "compacted": "true"}.items():
            reader = reader.option(k, v)
        rows = latest_per_key(reader.load()).collect()
        expected = {f"eu.{k}": b"%d" % max(i for i in range(400) if i % 7 == k) for k in range(7) if k != 1}
        assert {r["key"]: bytes(r["body"]) for r in rows} == expected
        assert all(r["sequence"] == int(bytes(r["body"])) + 1 for r in rows)

        writer = tombstones(spark.createDataFrame([("eu.2",), ("eu.3",)], "key string")).write.format("zeps")
        for k, v in _options(zookeeper, broker).items():
            writer = writer.option(k, v)
        writer.mode("append").save()
        with StreamClient(broker.endpoint, "prices") as c:
            assert set(read_table(c)) == set(expected) - {"eu.2", "eu.3"}
        with pytest.raises(Exception, match="removed by retention"):  # read as any stream, its gaps are loss
            reader = spark.read.format("zeps")
            for k, v in _options(zookeeper, broker).items():
                reader = reader.option(k, v)
            reader.load().collect()
    finally:
        broker.stop()


def test_a_range_retention_removed_whole_or_in_part(tmp_path: Path) -> None:
    """A partition's read straight from the executor side (no Spark needed): a range wholly removed
    fails or yields nothing; one half removed fails or yields exactly what is left of it."""
    journal = JournalConfig(fsync="group", segment_bytes=2048, retention_bytes=4096)
    broker = BrokerServer(BrokerConfig(tmp_path / "j", ("prices",), journal=journal)).start()
    try:
        _publish(broker, 400)
        stream_journal = broker.core.streams["prices"].journal
        wait_until(lambda: stream_journal.first_sequence > 20, timeout=10, what="retention to remove old segments")
        # One group write lands in one segment whatever its size, so how many records retention
        # keeps varies with how the 400 were batched: the ranges follow what is really retained.
        first, last = stream_journal.first_sequence, stream_journal.next_sequence - 1
        settings = Resolved(kind="ZepsStream", name="prices", namespace="spark", endpoint=broker.endpoint)

        def read(part: _Range, fail: str) -> list[int]:
            reader = _StreamRead(settings, {"failondataloss": fail})
            return [s for batch in reader.read_range(part) for s in batch.column(0).to_pylist()]

        with pytest.raises(DataLossError, match=f"sequences 1..{first - 10} were removed by retention"):
            read(_Range(0, first - 10), "true")
        assert read(_Range(0, first - 10), "false") == []
        with pytest.raises(DataLossError, match=f"sequences 11..{first - 1} were removed"):
            read(_Range(10, last), "true")
        assert read(_Range(10, last), "false") == list(range(first, last + 1))
    finally:
        broker.stop()


def test_what_the_broker_no_longer_holds_is_read_from_the_tiered_store(
    spark: Any, zookeeper: ZooKeeperHarness, tmp_path: Path
) -> None:
    """A stream's journal uploaded to its object store (the uploader run by hand: the broker does not
    run it yet), then trimmed by the broker's retention: with ``tierStore`` the executors read the part
    the broker no longer holds from the store themselves and the broker's part from it, every record
    once and in order (straight from the executor side, then in a Spark batch read); without it, the
    same range fails as removed by retention."""
    settings = Resolved(kind="ZepsStream", name="prices", namespace="spark", zookeeper=zookeeper.connect_string,
                        chroot=zookeeper.root)  # fmt: skip
    keep = BrokerServer(BrokerConfig(tmp_path / "j", ("prices",), journal=JournalConfig(segment_bytes=2048))).start()
    try:
        _publish(keep, 400)
    finally:
        keep.stop()
    journal = Journal(tmp_path / "j" / "prices").open()
    store = (tmp_path / "tier").as_uri()
    uploader = TierUploader(zookeeper.client(), StreamPaths.of("spark", "prices", chroot=zookeeper.root),
                            open_store(store), epoch=1)  # fmt: skip
    while uploader.step(journal.closed_segments(), journal.durable, now_ms=0).uploaded is not None:
        pass
    journal.close()
    trimmed = JournalConfig(segment_bytes=2048, retention_bytes=4096)
    broker = BrokerServer(BrokerConfig(tmp_path / "j", ("prices",), journal=trimmed)).start()
    try:
        first = broker.core.streams["prices"].journal
        wait_until(lambda: first.first_sequence > 100, timeout=10, what="retention to remove old segments")
        settings = settings.model_copy(update={"endpoint": broker.endpoint})

        def read(**options: str) -> list[int]:
            reader = _StreamRead(settings, {"failondataloss": "true", **options})
            return [s for batch in reader.read_range(_Range(0, 400)) for s in batch.column(0).to_pylist()]

        with pytest.raises(DataLossError, match="removed by retention"):
            read()
        assert read(tierstore=store) == list(range(1, 401))
        spark.dataSource.register(ZepsDataSource)
        reader = spark.read.format("zeps")
        for k, v in {**_options(zookeeper, broker), "tierStore": store, "startSequence": "1", "endSequence": "400",
                     "partitionSize": "150"}.items():  # fmt: skip
            reader = reader.option(k, v)
        rows = reader.load().select("sequence", "body").collect()
        assert sorted((r["sequence"], bytes(r["body"])) for r in rows) == [(i + 1, b"%d" % i) for i in range(400)]
        with pytest.raises(ConfigError, match=r"tierStore .* use s3://bucket/prefix"):
            _StreamRead(settings, {"tierstore": "http://example.invalid/x"})
        with pytest.raises(ConfigError, match="tierStore needs ZooKeeper"):
            _StreamRead(settings.model_copy(update={"zookeeper": ""}), {"tierstore": store})
    finally:
        broker.stop()


def test_writer_round_trip(spark: Any, zookeeper: ZooKeeperHarness, broker: BrokerServer) -> None:
    spark.dataSource.register(ZepsDataSource)
    df = spark.createDataFrame([(f"k.{i}", f"v{i}".encode()) for i in range(500)], "key string, body binary")
    writer = df.write.format("zeps").mode("append")
    for k, v in _options(zookeeper, broker, stream="out").items():
        writer = writer.option(k, v)
    writer.save()
    with StreamClient(broker.endpoint, "out") as c:
        c.start("", since=Seq(0))
        got = [c.receive(10) for _ in range(500)]
    assert sorted(m.body for m in got if m) == sorted(f"v{i}".encode() for i in range(500))


def test_batch_queue_source_exactly_once_across_a_restart(
    spark: Any, zookeeper: ZooKeeperHarness, tmp_path: Path
) -> None:
    batches = BatchQueue(zookeeper.client(), "orders", namespace="spark", chroot=zookeeper.root)
    for n in range(5):
        batches.publish([b"order-%d-%d" % (n, i) for i in range(3)])
    out, checkpoint = tmp_path / "orders", tmp_path / "orders-checkpoint"
    options = {"queue": "orders", "namespace": "spark", "zookeeper": zookeeper.connect_string, "chroot": zookeeper.root}

    def run() -> None:
        df = _reader(spark, options, startingOffsets="earliest")
        writer = df.writeStream.format("parquet").option("path", str(out)).option("checkpointLocation", str(checkpoint))
        query = start_query(writer.start)
        query.processAllAvailable()
        query.stop()

    run()
    for n in range(5, 8):
        batches.publish([b"order-%d-%d" % (n, i) for i in range(3)])
    run()
    records = sorted(r["record"] for r in spark.read.parquet(str(out)).collect())
    assert records == sorted(b"order-%d-%d" % (n, i) for n in range(8) for i in range(3))


def test_batch_read_of_a_batch_queue(spark: Any, zookeeper: ZooKeeperHarness) -> None:
    """spark.read (not readStream) of a batch Queue: every retained batch, or startBatch..endBatch."""
    batches = BatchQueue(zookeeper.client(), "invoices", namespace="spark", chroot=zookeeper.root)
    for n in range(4):
        batches.publish([b"invoice-%d-%d" % (n, i) for i in range(2)])
    spark.dataSource.register(ZepsDataSource)

    def read(**extra: str) -> list[tuple[int, str, bytes]]:
        reader = spark.read.format("zeps")
        options = {"queue": "invoices", "namespace": "spark", "zookeeper": zookeeper.connect_string,
                   "chroot": zookeeper.root, **extra}  # fmt: skip
        for k, v in options.items():
            reader = reader.option(k, v)
        return sorted((r["batch"], r["batch_id"], bytes(r["record"])) for r in reader.load().collect())

    assert read() == [(n + 1, f"invoices-{n + 1}", b"invoice-%d-%d" % (n, i)) for n in range(4) for i in range(2)]
    assert [row[0] for row in read(startBatch="2", endBatch="3")] == [2, 2, 3, 3]


def test_a_batch_queue_whose_batches_are_on_s3_is_read_whole(
    spark: Any, zookeeper: ZooKeeperHarness, seaweedfs_server: Any, s3_url: str
) -> None:
    """Batches in an s3:// store (a real S3 server), read by the executors: the store named in the
    source's options, the credentials from the executors' environment. One batch is over the multipart
    threshold; every record comes back once."""
    endpoint = seaweedfs_server.endpoint
    options = BatchOptions.make(inline_max_bytes=64, store_url=s3_url, store_endpoint=endpoint)
    batches = BatchQueue(zookeeper.client(), "ledger", namespace="spark", chroot=zookeeper.root, options=options)
    for n in range(6):
        batches.publish([b"entry-%d-%d" % (n, i) for i in range(50)])
    batches.publish([bytes([7]) * (3 << 20)] * 3)  # 9 MiB: uploaded in parts
    spark.dataSource.register(ZepsDataSource)
    reader = spark.read.format("zeps")
    for k, v in {"queue": "ledger", "namespace": "spark", "zookeeper": zookeeper.connect_string,
                 "chroot": zookeeper.root, "storeUrl": s3_url, "storeEndpoint": endpoint}.items():  # fmt: skip
        reader = reader.option(k, v)
    rows = reader.load().selectExpr("batch", "length(record) AS size", "record").collect()
    small = sorted(bytes(r["record"]) for r in rows if r["batch"] <= 6)
    assert small == sorted(b"entry-%d-%d" % (n, i) for n in range(6) for i in range(50))
    assert [(r["batch"], r["size"]) for r in rows if r["batch"] == 7] == [(7, 3 << 20)] * 3


def test_the_source_refuses_a_work_queue(monkeypatch: pytest.MonkeyPatch) -> None:
    """A Queue of mode work holds items to take, not batches to read: the source says so (the spec as
    the resource's status would give it; resolving through Kubernetes is the cluster tier's)."""
    work = Resolved(kind="Queue", name="jobs", namespace="spark", zookeeper="zk:2181", spec={"mode": "work"})
    monkeypatch.setattr("zeps.spark.source.resolve", lambda *_a, **_k: work)
    with pytest.raises(ConfigError, match=r"has spec\.mode 'work', not 'batches': use zeps\.queue\(name\)"):
        ZepsDataSource({"queue": "jobs"}).reader(StructType([StructField(n, t) for n, t in _QUEUE_TYPES]))
    assert DataLossError is zeps.errors.DataLossError  # the name Spark users import from zeps.spark


def test_topic_and_queue_sinks_deliver(spark: Any, zookeeper: ZooKeeperHarness) -> None:
    topic = zeps.topic("alerts", namespace="spark", zookeeper=zookeeper.connect_string, chroot=zookeeper.root)
    work = zeps.queue("jobs", namespace="spark", zookeeper=zookeeper.connect_string, chroot=zookeeper.root)
    got: list[bytes] = []
    seen = threading.Event()

    def collect(message: Any) -> None:
        got.append(message.body)
        if len(got) == 40:
            seen.set()

    df = spark.createDataFrame([(f"item-{i}",) for i in range(40)], "body string").repartition(4)
    with topic.subscribe(collect, consumer_id="driver-side"):
        df.foreachPartition(topic_sink(topic))
        assert seen.wait(30), f"only {len(got)} of 40 broadcasts arrived"
    assert sorted(got) == sorted(f"item-{i}".encode() for i in range(40))
    df.foreachPartition(queue_sink(work))
    assert work.stats().depth == 40


def test_a_query_whose_planning_process_connects_back_late_is_started_again(
    spark: Any, zookeeper: ZooKeeperHarness, broker: BrokerServer, tmp_path: Path
) -> None:
    """Spark waits a fixed 10 s for the Python process that plans the source to connect back; a
    load that slows that process past 10 s is made here by a Python that starts the planner 12 s late
    (a shell wrapper of this interpreter, the only stand-in: the real process still runs after it).
    start_query starts the failed query again; another error it raises at once."""
    _publish(broker, 50)
    _tail_published(broker, 50)
    starts, late = tmp_path / "planner-starts", tmp_path / "late-once"
    python = tmp_path / "python"
    python.write_text(
        "#!/bin/sh\n"
        'if [ "$2" = pyspark.sql.streaming.python_streaming_source_runner ]; then\n'
        f"  echo start >> {starts}\n"
        f"  if mkdir {late} 2>/dev/null; then sleep 12; fi\n"
        "fi\n"
        f'exec {sys.executable} "$@"\n'
    )
    python.chmod(0o755)
    context = spark.sparkContext
    normal, context.pythonExec = context.pythonExec, str(python)
    try:
        spark.dataSource.register(ZepsDataSource)  # the source's planner now runs through the wrapper
    finally:
        context.pythonExec = normal

    def start(name: str, **extra: str) -> Any:
        reader = spark.readStream.format("zeps")
        for k, v in {**_options(zookeeper, broker), "startingOffsets": "earliest", **extra}.items():
            reader = reader.option(k, v)
        return lambda: reader.load().writeStream.format("memory").queryName(name).start()

    try:
        query = start_query(start("q_late_then_on_time"), attempts=2)
        assert starts.read_text().count("start") == 2, "the first attempt failed, the second planned again"
        query.processAllAvailable()
        query.stop()
        rows = spark.sql("select sequence from q_late_then_on_time order by sequence").collect()
        assert [r["sequence"] for r in rows] == list(range(1, 51))
        with pytest.raises(StreamingQueryException) as refused:  # not the late planner: raised at once
            start_query(start("q_refused", startingOffsets="not-an-offset"), attempts=3)
        assert WORKER_DID_NOT_CONNECT not in str(refused.value)
        assert starts.read_text().count("start") == 3, "another error is not retried"
    finally:
        spark.dataSource.register(ZepsDataSource)  # the session's other tests plan with this interpreter


class _Interrupted(BaseException):
    """What a test's timeout raises (pytest-timeout's is a BaseException too)."""


def test_a_spark_call_interrupted_midway_leaves_the_next_test_a_working_session(spark: Any) -> None:
    """The ``spark`` fixture's reset, as a test that timed out needs it: a job interrupted while the
    main thread waits for its answer (a SIGALRM raising inside the Py4J call) leaves that answer
    unread; once the connection is renewed and the job cancelled, the next job answers for itself."""

    def interrupt(*_: object) -> None:
        raise _Interrupted

    slow = spark.range(0, 4, numPartitions=2).rdd.map(lambda x: time.sleep(3) or x)  # the job's work: 3 s a row
    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.5)
        with pytest.raises(_Interrupted):
            slow.collect()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    fresh_py4j_connection(spark)
    active = spark._get_j_spark_session_class(spark._jvm).getActiveSession()
    assert active.isDefined() and active.get().equals(spark._jsparkSession)  # on the new JVM thread too
    total = spark.range(0, 1000, numPartitions=2).selectExpr("sum(id) AS s").first()
    assert total is not None and total["s"] == 499_500
    assert spark.range(0, 10).count() == 10

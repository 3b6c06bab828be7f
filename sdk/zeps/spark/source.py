"""The ``zeps`` Spark data source (PySpark 4 Python Data Source API).

Register once, then read and write::

    spark.dataSource.register(ZepsDataSource)
    df = (spark.readStream.format("zeps").option("stream", "prices")
          .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", 100000).load())
    df.writeStream.format("zeps").option("stream", "prices-out").option("checkpointLocation", ...).start()

Where code runs. ``ZepsDataSource`` and the readers' ``initialOffset``/``latestOffset``/``partitions``
run on the **driver**: they resolve the resource's settings once (arguments in options, then the
environment, then the resource's status through the Kubernetes API) and keep only the result, which
is pickled to the **executors** running ``read``/``write`` — executors never need Kubernetes.

Streams. Offsets are ``{"<stream>": <sequence>}``: a micro-batch covers sequences (start, end]. The
driver learns the durable tail from the broker's ZooKeeper group metadata (published every second).
A partition is a sequence range; ``read`` replays exactly that range from the broker's journal with
pattern "" and filters by ``pattern`` itself, so a partition always yields the same rows: restarting
a query from its checkpoint gives exactly-once output into an idempotent sink. ``failOnDataLoss``
says what to do when retention removed part of a range: fail, or skip what is gone.

Partitioned streams (``spec.partitions`` above 1; the partitions are found in the status, in
``ZEPS_STREAM_<NAME>_PARTITIONS`` or in ZooKeeper): offsets are ``{"<stream>": {"<partition>":
<sequence>, ...}}``, as Spark's Kafka source keeps them; a micro-batch covers (start, end] of each
partition, in input partitions of ``partitionSize`` sequences of one partition each (at least
``minPartitions`` in all, where the ranges allow); rows get a ``partition int`` column first (their
sequence is their partition's); a partition added while the query runs is read from its start;
``maxOffsetsPerTrigger`` is shared out among the partitions. Writes go to each row's key's partition.

Batch queues (option ``queue``): offsets are batch numbers ``{"<queue>": n}``; batches are immutable,
so this source is exactly-once too.

Options: ``stream`` or ``queue`` (the resource name), ``namespace``, ``endpoint``, ``zookeeper``,
``zookeeperCA`` (the servers' TLS CA, a PEM file on the driver: its PEM travels to the executors),
``chroot`` (explicit settings), ``pattern`` (prefix, or ``~regex``), ``startingOffsets`` (``earliest`` |
``latest`` | JSON ``{"prices": 1000}`` | epoch milliseconds), ``maxOffsetsPerTrigger``,
``failOnDataLoss`` (true/false, default true), ``partitionSize`` (sequences per partition, default
100000), ``minPartitions`` (split the ranges into at least this many input partitions), ``storeUrl``,
``storeEndpoint``, ``storeRegion``, ``storePathStyle`` (a batch Queue's store, when the settings are
explicit rather than read from the resource; credentials always come from the executors' environment),
``tierStore``, ``tierStoreEndpoint``, ``tierStoreRegion``, ``tierStorePathStyle`` (a tiered stream's
object store: the executors read what the broker no longer holds of a range from it themselves,
credentials from their environment), ``leaderWaitSeconds`` (how long a micro-batch waits for a
replicated stream's new leader, default 60), ``followerReads`` (true: executors read a replicated stream
from its in-sync followers, taking replay load off the leader; default false),
``startSequence``/``endSequence`` (batch reads of a stream), ``startBatch``/``endBatch`` (batch reads of
a batch Queue: by default every retained batch).
Written rows need ``key`` (string) and ``body`` (binary or string) columns.

Writes are exactly-once across task retries and query restarts. Each task publishes as an idempotent
producer named after the query (its id, kept in the checkpoint; a batch write's own random id) and
its partition, with the micro-batch (+1) as the producer's generation (1 for a batch write): a
retried task, or a restarted query running the same micro-batch again, claims the producer afresh
(fencing an attempt still running), learns how many of its rows the broker already holds
(``generation_sequence``), skips them and publishes the rest in the same order. Into a partitioned
stream the same holds per partition: each broker counts the rows of the task routed to it. This needs what
Spark asks of an exactly-once sink anyway: a task given the same input gives the same rows, in order.

Columns: a stream's rows are ``sequence long, key string, body binary, timestamp timestamp``. Spark
gives Python data sources no column pruning, so a query that needs fewer names them in a schema
(``spark.read.format("zeps").schema("key string, body binary")``, any order): only those are built,
and Spark converts only those.
"""

from __future__ import annotations

import json
import logging
import time
import urllib.parse
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows
from pyspark.sql.types import BinaryType, DataType, IntegerType, LongType, StringType, StructType, TimestampType

from zeps.batchstore import open_store
from zeps.broker.matching import Matcher, compile_pattern
from zeps.client import BrokerUnavailableError, PartitionedStreamClient, Records, Seq, StreamClient, Time
from zeps.client.discovery import broker_metadata, partition_endpoints
from zeps.config import Resolved, require_queue_mode, resolve
from zeps.coordination import shared_client
from zeps.coordination.batches import BatchQueue
from zeps.errors import ConfigError, DataLossError, ZepsError
from zeps.options import BatchOptions
from zeps.paths import StreamPaths
from zeps.spark.columns import STREAM_COLUMNS, arrow_batch
from zeps.tiering import TierReader

__all__ = ["DataLossError", "ZepsDataSource"]

log = logging.getLogger(__name__)

STREAM_SCHEMA = "sequence long, key string, body binary, timestamp timestamp"
QUEUE_SCHEMA = "batch long, batch_id string, record binary"
_ARROW_ROWS = 32_768  # rows per Arrow batch handed to Spark
_ARROW_BYTES = 64 << 20  # ... or fewer, when they are large
_STREAM_TYPES: dict[str, DataType] = {
    "sequence": LongType(), "key": StringType(), "body": BinaryType(), "timestamp": TimestampType(),
    "partition": IntegerType(),
}  # STREAM_SCHEMA's, and a partitioned stream's partition  # fmt: skip
PARTITIONED_SCHEMA = "partition int, " + STREAM_SCHEMA  #: a partitioned stream's rows (sequences are per partition)
_QUEUE_TYPES: list[tuple[str, DataType]] = [("batch", LongType()), ("batch_id", StringType()), ("record", BinaryType())]
_ARROW_QUEUE = pa.schema([("batch", pa.int64()), ("batch_id", pa.string()), ("record", pa.binary())])


def _normalised(options: Any) -> dict[str, str]:
    """Option names are case-insensitive in Spark (and arrive lower-cased): look them up lower-cased."""
    return {str(k).lower(): str(v) for k, v in dict(options).items()}


def _bool(value: str | None, default: bool) -> bool:
    if value is None:
        return default
    if value.lower() not in ("true", "false"):
        raise ConfigError(f"option value {value!r} must be true or false")
    return value.lower() == "true"


#: a batch Queue's store, as options (the Queue's spec.batches fields): for a driver that names its
#: settings explicitly instead of reading the resource
_STORE_OPTIONS = ("storeUrl", "storeEndpoint", "storeRegion", "storePathStyle")
#: a tiered stream's object store, when the executors read old ranges from it themselves
_TIER_OPTIONS = ("tierStore", "tierStoreEndpoint", "tierStoreRegion", "tierStorePathStyle")


def _zookeeper(settings: Resolved) -> Any:
    """This process's ZooKeeper client for ``settings`` (a driver's, or an executor's: one per process)."""
    return shared_client(settings.zookeeper, auth=settings.auth, ca=settings.zookeeper_ca)


def _settings(options: dict[str, str]) -> Resolved:
    """Resolve once, on the driver: explicit options, then environment, then the resource's status."""
    kind = "Queue" if "queue" in options else "ZepsStream"
    name = options.get("queue") or options.get("stream")
    if not name:
        raise ConfigError("the zeps source needs option stream=<ZepsStream name> (or queue=<Queue name>)")
    explicit = {k: options[k] for k in ("zookeeper", "chroot", "endpoint") if options.get(k)}
    if options.get("zookeeperca"):  # option zookeeperCA (Spark hands options over lower-cased)
        explicit["zookeeper_ca"] = options["zookeeperca"]
    settings = resolve(kind, name, namespace=options.get("namespace"), **explicit)  # type: ignore[arg-type]
    if kind == "Queue":
        require_queue_mode(settings, "batches")  # the source reads batches; work items are taken, not read
        store = {field: options[field.lower()] for field in _STORE_OPTIONS if field.lower() in options}
        if store:  # the batch store named explicitly (no resource spec read): it overrides the spec's
            spec = dict(settings.spec)
            spec["batches"] = {**(spec.get("batches") or {}), **store}
            BatchOptions.from_spec(spec["batches"])  # a bad value fails here, on the driver, naming the option
            settings = settings.model_copy(update={"spec": spec})
    elif not settings.partitions and settings.zookeeper and "partitions" not in settings.spec:
        # settings given without the resource's spec: whether the stream is partitioned, ZooKeeper says
        # (a driver that cannot reach it, outside the cluster, reads one partition as before)
        try:
            found = partition_endpoints(_zookeeper(settings), settings.namespace,
                                        settings.name, chroot=settings.chroot)  # fmt: skip
        except ZepsError as exc:
            log.warning("stream %s: could not look for its partitions in ZooKeeper (%s): reading one", name, exc)
            found = ()
        settings = settings.model_copy(update={"partitions": found})
    return settings


def _stream_columns(schema: StructType) -> tuple[str, ...]:
    """The columns a read of a stream builds: those the query's schema names (Python data sources
    get no column pruning from Spark, so ``.schema("key string, body binary")`` is how a query
    asks for fewer). Each must be one of the stream's columns, with its type."""
    known = _STREAM_TYPES
    names = [f.name for f in schema.fields]
    for f in schema.fields:
        if known.get(f.name) != f.dataType or names.count(f.name) > 1:
            raise ConfigError(
                f"schema field {f.name} {f.dataType.simpleString()}: a stream's rows have {STREAM_SCHEMA}; "
                "give a schema naming some of these, each once and with its type (or none, for all of them)"
            )
    if not names:
        raise ConfigError(f"the schema names no columns; a stream's rows have {STREAM_SCHEMA}")
    return tuple(names)


def _check_queue_schema(schema: StructType) -> None:
    if [(f.name, f.dataType) for f in schema.fields] != _QUEUE_TYPES:
        raise ConfigError(
            f"schema {schema.simpleString()}: a batch queue's rows have {QUEUE_SCHEMA}; give no schema for them"
        )


def _durable_tail(settings: Resolved, partition: int = 0) -> tuple[int, str]:
    """(last durable sequence, broker endpoint) from the stream's (partition's) broker group in ZooKeeper."""
    if not settings.zookeeper:
        raise ConfigError(
            f"stream {settings.name}: the zeps source needs ZooKeeper (option zookeeper=host:port) "
            "to learn the broker's durable tail"
        )
    try:
        meta = broker_metadata(_zookeeper(settings), settings.namespace,
                               settings.name, chroot=settings.chroot, partition=partition)  # fmt: skip
    except BrokerUnavailableError as exc:
        raise BrokerUnavailableError(f"the zeps source cannot learn the durable tail: {exc}") from None
    return int(meta.get("lastSequence", 0)), str(meta.get("endpoint", settings.endpoint))


@dataclass(frozen=True)
class _Range(InputPartition):
    start: int  # exclusive
    end: int  # inclusive
    partition: int = 0  # of a partitioned stream


def _ranges(start: int, end: int, size: int, partition: int = 0) -> list[_Range]:
    return [_Range(s, min(s + size, end), partition) for s in range(start, end, size)]


Offsets = dict[str, Any]  #: {"<stream>": n}; a partitioned stream's {"<stream>": {"<partition>": n, ...}}


class _StreamRead:
    """Reading (start, end] of a stream on an executor, deterministically."""

    def __init__(self, settings: Resolved, options: dict[str, str], columns: tuple[str, ...] = STREAM_COLUMNS) -> None:
        self.settings = settings
        self.columns = columns  # what the query's schema names: only these are built
        self.pattern = options.get("pattern", "")
        self.fail_on_data_loss = _bool(options.get("failondataloss"), True)
        #: a compacted stream (spec.cleanup with compact, or option compacted=true) has gaps by design:
        #: they are not data loss (zeps.spark.latest_per_key reads it as a table)
        self.compacted = "compact" in str(settings.spec.get("cleanup", "delete")) or _bool(
            options.get("compacted"), False
        )
        self.partition_size = int(options.get("partitionsize", "100000"))
        self.min_partitions = int(options.get("minpartitions", "1"))
        self.follower_reads = _bool(options.get("followerreads"), False)
        self.stream_partitions = max(1, len(settings.partitions))  #: the stream's, found on the driver
        #: a tiered stream's object store (options tierStore…), read where the broker no longer holds a range
        self.tier = {field: options[field.lower()] for field in _TIER_OPTIONS if options.get(field.lower())}
        if self.tier and "tierStore" not in self.tier:
            raise ConfigError("options tierStoreEndpoint, tierStoreRegion, tierStorePathStyle need tierStore "
                              "(the stream's object store: s3://bucket/prefix)")  # fmt: skip
        if self.tier and urllib.parse.urlparse(self.tier["tierStore"]).scheme not in ("s3", "file"):
            raise ConfigError(f"option tierStore {self.tier['tierStore']!r}: use s3://bucket/prefix (or file:///path)")
        if self.tier and not settings.zookeeper:
            raise ConfigError("option tierStore needs ZooKeeper (option zookeeper=host:port): the store's "
                              "manifest is kept there")  # fmt: skip

    def split(self, spans: dict[int, tuple[int, int]]) -> list[_Range]:
        """Input partitions for (start, end] of each stream partition: ``partitionSize`` sequences
        each at most, and at least ``minPartitions`` in all where the spans allow (as Spark's Kafka
        source splits large offset ranges)."""
        total = sum(max(0, end - start) for start, end in spans.values())
        size = self.partition_size
        if self.min_partitions > 1 and total:
            size = max(1, min(size, -(-total // self.min_partitions)))
        return [r for p, (start, end) in sorted(spans.items()) for r in _ranges(start, end, size, p)]

    def read_range(self, part: _Range) -> Iterator[pa.RecordBatch]:
        if part.end <= part.start:
            return
        s = self.settings
        matcher = compile_pattern(self.pattern) if self.pattern else None
        with StreamClient.of(s, part.partition, credit_window=32 << 20, follower_reads=self.follower_reads) as c:
            c.start("", since=Seq(part.start))
            expected = part.start + 1  # the next sequence the range needs
            pending: list[Records] = []  # handed to Spark in Arrow batches of about _ARROW_ROWS rows
            pending_rows = pending_bytes = 0
            pending_from = expected  # the first sequence the pending runs should hold
            while expected <= part.end:
                runs = c.receive_records(60)
                if not runs:
                    raise BrokerUnavailableError(
                        f"stream {s.name}: the broker sent nothing for 60 s while replaying {expected}..{part.end}"
                    )
                for received in runs:
                    if expected > part.end:  # the range is complete; the rest is beyond it
                        break
                    # never a record twice, whatever the broker sends (an older one sent a replay asked
                    # from past its durable tail from the tail on)
                    run = received if received.sequence(0) >= expected else received.after(expected - 1)
                    if not len(run):
                        continue
                    if run.sequence(0) > expected and self.tier:  # the broker no longer holds these
                        for old in self._from_tier(part.partition, expected, min(run.sequence(0) - 1, part.end)):
                            pending.append(old)
                            pending_rows, pending_bytes = pending_rows + len(old), pending_bytes + len(old.data)
                            expected = old.sequence(-1) + 1
                        if expected > part.end:  # the store held the rest of the range
                            break
                    if run.sequence(0) > part.end:  # the rest of the range is gone (retention)
                        self._check_gaps([run.sequence(0)], expected, part.end)
                        expected = part.end + 1
                        break
                    pending.append(run)
                    pending_rows, pending_bytes = pending_rows + len(run), pending_bytes + len(run.data)
                    expected = run.sequence(-1) + 1
                full = pending_rows >= _ARROW_ROWS or pending_bytes >= _ARROW_BYTES
                if pending and (full or expected > part.end):
                    batch = self._batch(pending, pending_from, part.end, matcher, part.partition)
                    pending, pending_rows, pending_bytes, pending_from = [], 0, 0, expected
                    if batch.num_rows:
                        yield batch

    def _from_tier(self, partition: int, first: int, last: int) -> list[Records]:
        """The records ``first .. last`` a tiered stream's object store holds (read by this executor
        straight from the store, as the broker would: :class:`~zeps.tiering.TierReader`), in runs; a
        gap the store lacks too is left for :meth:`_check_gaps`."""
        s = self.settings
        store = open_store(self.tier["tierStore"], endpoint=self.tier.get("tierStoreEndpoint"),
                           region=self.tier.get("tierStoreRegion"),
                           path_style=_bool(self.tier.get("tierStorePathStyle"), True)
                           if "tierStorePathStyle" in self.tier else None)  # fmt: skip
        reader = TierReader(_zookeeper(s), StreamPaths.of(s.namespace, s.name, chroot=s.chroot, partition=partition),
                            store)  # fmt: skip
        runs, at = [], first
        try:
            reader.refresh()
            while at <= last and (chunk := reader.read_chunk(at, max_bytes=8 << 20, end=last)) is not None:
                runs.append(Records(chunk.data, chunk.offsets))
                at = chunk.last + 1
        finally:
            reader.close()
        return runs

    def _batch(
        self, runs: list[Records], expected: int, end: int, matcher: Matcher | None, partition: int = 0
    ) -> pa.RecordBatch:
        """The rows of ``runs`` up to ``end`` that match, as Arrow; the runs should start at ``expected``
        and leave no gap (retention may have made one: see _check_gaps)."""
        if "partition" in self.columns:  # not in the records: the range's, added as a column of its own
            rest = tuple(c for c in self.columns if c != "partition")
            batch = self._records_batch(runs, expected, end, matcher, rest) if rest else None
            rows = batch.num_rows if batch is not None else self._records_batch(
                runs, expected, end, matcher, ("sequence",)).num_rows  # fmt: skip
            column = pa.array(np.full(rows, partition, np.int32))
            arrays = {"partition": column, **({n: batch.column(i) for i, n in enumerate(rest)} if batch else {})}
            fields = [pa.field(n, pa.int32()) if n == "partition" else batch.schema.field(n)  # type: ignore[union-attr]
                      for n in self.columns]  # fmt: skip
            return pa.RecordBatch.from_arrays([arrays[n] for n in self.columns], schema=pa.schema(fields))
        return self._records_batch(runs, expected, end, matcher, self.columns)

    def _records_batch(
        self, runs: list[Records], expected: int, end: int, matcher: Matcher | None, wanted: tuple[str, ...]
    ) -> pa.RecordBatch:
        columns = wanted
        if matcher is not None and "key" not in columns:
            columns = (*columns, "key")  # to filter by; dropped after
        sequences, batch = arrow_batch(runs, columns)
        first, last = int(sequences[0]), int(sequences[-1])
        if first != expected or last - first != len(sequences) - 1:  # sequences only increase
            self._check_gaps(sequences.tolist(), expected, end)
        if last > end:
            batch = batch.slice(0, int(np.searchsorted(sequences, end, side="right")))
        if matcher is not None:
            keys = batch.column(columns.index("key")).to_pylist()
            batch = batch.filter(pa.array([matcher.matches(k) for k in keys], pa.bool_()))
            if columns != wanted:  # the key was added last, to filter by
                batch = pa.RecordBatch.from_arrays(batch.columns[:-1], schema=batch.schema.remove(len(columns) - 1))
        return batch

    def _check_gaps(self, sequences: list[int], expected: int, end: int) -> None:
        """Retention removed sequences this range needs: fail, or (failOnDataLoss=false) skip them. A
        compacted stream's gaps are records compaction removed: skipped."""
        for sequence in sequences:
            if sequence > expected and self.fail_on_data_loss and not self.compacted:
                raise DataLossError(
                    f"stream {self.settings.name}: sequences {expected}..{min(sequence - 1, end)} were "
                    "removed by retention; set failOnDataLoss=false to skip them"
                )
            expected = sequence + 1


def _starting_offsets(starting: str, stream: str) -> str:
    """``startingOffsets`` checked when the reader is made (while Spark initializes the query's
    sources, so a bad one fails the query's start, not its first batch)."""
    if starting in ("earliest", "latest") or starting.isdigit():
        return starting
    if starting.lstrip().startswith("{"):
        try:
            if stream in json.loads(starting):
                return starting
        except (ValueError, TypeError):
            pass
    raise ConfigError(f"startingOffsets {starting!r}: use earliest, latest, epoch milliseconds, or a JSON "
                      f"offset of stream {stream!r} as the query's progress shows it")  # fmt: skip


class ZepsStreamReader(DataSourceStreamReader, _StreamRead):
    """Structured Streaming over a ZepsStream (or a batch Queue, see ZepsBatchQueueReader)."""

    def __init__(self, settings: Resolved, options: dict[str, str], columns: tuple[str, ...] = STREAM_COLUMNS) -> None:
        _StreamRead.__init__(self, settings, options, columns)
        self.starting = _starting_offsets(options.get("startingoffsets", "latest"), settings.name)
        self.max_per_trigger = int(options["maxoffsetspertrigger"]) if options.get("maxoffsetspertrigger") else None
        self.leader_wait = float(options.get("leaderwaitseconds", "60"))

    def _offsets(self, values: dict[int, int]) -> Offsets:
        """Spark's offset of per-partition sequences: ``{"<stream>": n}`` for a stream of one partition
        (as before partitions existed), else ``{"<stream>": {"<partition>": n, ...}}``."""
        if self.stream_partitions == 1:
            return {self.settings.name: values[0]}
        return {self.settings.name: {str(p): v for p, v in sorted(values.items())}}

    def _positions(self, offsets: Offsets) -> dict[int, int]:
        """Each partition's sequence in an offset; a partition added since it was written: 0 (its start)."""
        value = offsets[self.settings.name]
        given = {int(p): int(v) for p, v in value.items()} if isinstance(value, dict) else {0: int(value)}
        return {p: given.get(p, 0) for p in range(self.stream_partitions)}

    def initialOffset(self) -> Offsets:  # noqa: N802 — the Spark API's names
        name, starting, every = self.settings.name, self.starting, range(self.stream_partitions)
        if starting == "earliest":
            return self._offsets(dict.fromkeys(every, 0))
        if starting == "latest":
            return self._offsets({p: _durable_tail(self.settings, p)[0] for p in every})
        if starting.lstrip().startswith("{"):
            return self._offsets(self._positions({name: json.loads(starting)[name]}))
        if starting.isdigit():  # epoch milliseconds: start before the first message at or after it
            out = {}
            for p in every:
                with StreamClient.of(self.settings, p) as c:
                    c.start("", since=Time(int(starting) / 1000))
                    first = c.receive(5)
                out[p] = (first.sequence - 1) if first else _durable_tail(self.settings, p)[0]
            return self._offsets(out)
        raise AssertionError(f"startingOffsets {starting!r} was checked when the reader was made")

    def getDefaultReadLimit(self) -> ReadLimit:  # noqa: N802
        return ReadMaxRows(self.max_per_trigger) if self.max_per_trigger else ReadAllAvailable()

    def latestOffset(self, start: Offsets, limit: ReadLimit) -> Offsets:  # noqa: N802
        begin = self._positions(start)
        tails = {p: self._tail(p) for p in begin}
        if isinstance(limit, ReadMaxRows):  # shared out among the partitions
            share = -(-limit.max_rows // len(begin))
            tails = {p: min(tail, begin[p] + share) for p, tail in tails.items()}
        return self._offsets({p: max(begin[p], tails[p]) for p in begin})

    def _tail(self, partition: int = 0) -> int:
        """The durable tail; while a replicated stream elects a new leader (none is registered), asked
        again for up to ``leaderWaitSeconds`` (the micro-batch waits rather than the query failing)."""
        deadline = time.monotonic() + self.leader_wait
        while True:
            try:
                return _durable_tail(self.settings, partition)[0]
            except BrokerUnavailableError:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.5)

    def partitions(self, start: Offsets, end: Offsets) -> list[_Range]:
        first, last = self._positions(start), self._positions(end)
        return self.split({p: (first[p], last[p]) for p in first})

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, _Range)
        return self.read_range(partition)

    def commit(self, end: Offsets) -> None:
        pass  # the broker's retention decides what it keeps; offsets live in Spark's checkpoint


class ZepsBatchReader(DataSourceReader, _StreamRead):
    """A batch read of the sequences ``startSequence`` to ``endSequence``, both included (by default the
    first sequence to the durable tail)."""

    def __init__(self, settings: Resolved, options: dict[str, str], columns: tuple[str, ...] = STREAM_COLUMNS) -> None:
        _StreamRead.__init__(self, settings, options, columns)
        if self.stream_partitions > 1 and ("startsequence" in options or "endsequence" in options):
            raise ConfigError(f"stream {settings.name} is partitioned: its sequences are per partition, so "
                              "startSequence/endSequence name no range of it; read it whole")  # fmt: skip
        self.first = int(options.get("startsequence", "1"))
        if options.get("endsequence"):  # a range named in full: no need to ask ZooKeeper for the tail
            self.lasts = {0: int(options["endsequence"])}
        else:
            self.lasts = {p: _durable_tail(settings, p)[0] for p in range(self.stream_partitions)}

    def partitions(self) -> list[_Range]:
        return self.split({p: (self.first - 1, last) for p, last in self.lasts.items()})

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, _Range)
        return self.read_range(partition)


class _QueueRead:
    """Reading batches (start, end] of a batch Queue on an executor: one partition per batch."""

    def __init__(self, settings: Resolved) -> None:
        self.settings = settings

    def _queue(self) -> BatchQueue:
        s = self.settings
        options = BatchOptions.from_spec(s.spec.get("batches") or {})  # its batch store, where large batches are
        return BatchQueue(_zookeeper(s), s.name, namespace=s.namespace, chroot=s.chroot,
                          options=options)  # fmt: skip

    def read_batches(self, part: _Range) -> Iterator[pa.RecordBatch]:
        queue = self._queue()
        for number in range(part.start + 1, part.end + 1):
            batch = queue.read(number)
            yield pa.RecordBatch.from_pydict(
                {
                    "batch": [number] * len(batch.records),
                    "batch_id": [batch.id] * len(batch.records),
                    "record": batch.records,
                },
                schema=_ARROW_QUEUE,
            )


class ZepsBatchQueueReader(DataSourceStreamReader, _QueueRead):
    """Structured Streaming over a replayable batch Queue: offsets are batch numbers."""

    def __init__(self, settings: Resolved, options: dict[str, str]) -> None:
        _QueueRead.__init__(self, settings)
        self.starting = options.get("startingoffsets", "earliest")

    def initialOffset(self) -> dict[str, int]:  # noqa: N802
        queue = self._queue()
        return {self.settings.name: queue.latest() if self.starting == "latest" else queue.first_retained() - 1}

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:  # noqa: N802
        return {self.settings.name: self._queue().latest()}

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[_Range]:
        return _ranges(start[self.settings.name], end[self.settings.name], 1)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, _Range)
        return self.read_batches(partition)

    def commit(self, end: dict[str, int]) -> None:
        pass


class ZepsBatchQueueBatchReader(DataSourceReader, _QueueRead):
    """A batch read of a batch Queue: every retained batch (``startBatch``..``endBatch`` to narrow it)."""

    def __init__(self, settings: Resolved, options: dict[str, str]) -> None:
        _QueueRead.__init__(self, settings)
        queue = self._queue()
        self.first = int(options["startbatch"]) if options.get("startbatch") else queue.first_retained()
        self.last = int(options["endbatch"]) if options.get("endbatch") else queue.latest()

    def partitions(self) -> list[_Range]:
        return _ranges(self.first - 1, self.last, 1)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, _Range)
        return self.read_batches(partition)


class _Count(WriterCommitMessage):
    def __init__(self, count: int) -> None:
        self.count = count


def task_producer(write_id: str) -> tuple[str, int]:
    """(producer name, generation) of the running task: the query (its id from the checkpoint, else
    ``write_id``) and partition name the producer; the micro-batch + 1 is the generation (1 outside
    a streaming query)."""
    context = TaskContext.get()
    if context is None:  # not in a Spark task (a direct call): one producer for the writer
        return f"spark-{write_id}-0", 1
    query = context.getLocalProperty("sql.streaming.queryId") or write_id
    batch = context.getLocalProperty("streaming.sql.batchId")
    return f"spark-{query}-{context.partitionId()}", int(batch) + 1 if batch else 1


def _publish_rows(settings: Resolved, rows: Iterator[Any], write_id: str) -> _Count:
    """Publish a task's rows exactly once, however often Spark runs the task (see the module docstring)."""
    producer, generation = task_producer(write_id)
    if len(settings.partitions) > 1:
        return _publish_partitioned(settings, rows, producer, generation)
    count = 0
    with StreamClient.of(settings, producer_id=producer, generation=generation) as client:
        held = client.generation_sequence  # rows an earlier attempt of this task published
        for row in rows:
            count += 1
            if count > held:
                body = row["body"]
                client.publish(str(row["key"]), body.encode() if isinstance(body, str) else bytes(body))
        client.flush(timeout=120)  # the broker confirmed every row before the task reports success
    return _Count(count)


def _publish_partitioned(settings: Resolved, rows: Iterator[Any], producer: str, generation: int) -> _Count:
    """A task's rows to a partitioned stream, each to its key's partition, exactly once: the same
    producer and generation on every partition; each partition's broker says how many of the rows
    routed to it an earlier attempt published, and those are skipped (a task given the same input
    routes the same rows to each partition, in the same order)."""
    count = 0
    # the partitions the driver saw, however the stream grows meanwhile: a retry routes every row alike
    with PartitionedStreamClient.of(settings, follow_growth=False, producer_id=producer,
                                    generation=generation) as client:  # fmt: skip
        held = [c.generation_sequence for c in client.clients]
        routed = [0] * client.partitions
        for row in rows:
            count += 1
            key, body = str(row["key"]), row["body"]
            p = client.partition_of(key)
            routed[p] += 1
            if routed[p] > held[p]:
                client.clients[p].publish(key, body.encode() if isinstance(body, str) else bytes(body))
        client.flush(timeout=120)
    return _Count(count)


class ZepsWriter(DataSourceWriter):
    def __init__(self, settings: Resolved) -> None:
        self.settings = settings
        self.write_id = uuid.uuid4().hex  # made on the driver: every attempt of a task shares it

    def write(self, iterator: Iterator[Any]) -> _Count:
        return _publish_rows(self.settings, iterator, self.write_id)


class ZepsStreamWriter(DataSourceStreamWriter):
    def __init__(self, settings: Resolved) -> None:
        self.settings = settings
        self.write_id = uuid.uuid4().hex  # used only if a task does not see the query's id

    def write(self, iterator: Iterator[Any]) -> _Count:
        return _publish_rows(self.settings, iterator, self.write_id)

    def commit(self, messages: list[Any], batchId: int) -> None:  # noqa: N803
        pass

    def abort(self, messages: list[Any], batchId: int) -> None:  # noqa: N803
        pass


class ZepsDataSource(DataSource):
    """``format("zeps")``; see the module docstring for options."""

    @classmethod
    def name(cls) -> str:
        return "zeps"

    def schema(self) -> str:
        if "queue" in _normalised(self.options):
            return QUEUE_SCHEMA
        return PARTITIONED_SCHEMA if len(self._resolved().partitions) > 1 else STREAM_SCHEMA

    def _resolved(self) -> Resolved:
        return _settings(_normalised(self.options))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:  # noqa: N802
        if "queue" in _normalised(self.options):
            _check_queue_schema(schema)
            return ZepsBatchQueueReader(self._resolved(), _normalised(self.options))
        return ZepsStreamReader(self._resolved(), _normalised(self.options), _stream_columns(schema))

    def reader(self, schema: StructType) -> DataSourceReader:
        if "queue" in _normalised(self.options):
            _check_queue_schema(schema)
            return ZepsBatchQueueBatchReader(self._resolved(), _normalised(self.options))
        return ZepsBatchReader(self._resolved(), _normalised(self.options), _stream_columns(schema))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        return ZepsWriter(self._resolved())

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:  # noqa: N802
        return ZepsStreamWriter(self._resolved())

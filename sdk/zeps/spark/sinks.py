"""Sinks for Topic (broadcast), work Queue (put) and batch Queue (one batch per micro-batch).

::

    cache = zeps.topic("cache-invalidation")            # resolved on the driver
    df.select("key").foreachPartition(topic_sink(cache, column="key"))
    df.foreachPartition(queue_sink(zeps.queue("crawl-links"), column="url"))
    totals.writeStream.foreachBatch(batch_queue_sink(zeps.batches("revenue"))).start()

``topic_sink`` and ``queue_sink`` return functions that run on the executors; they hold only the
handle's resolved settings (picklable), and are at-least-once (a retried task publishes again).
``batch_queue_sink`` runs on the driver, once per micro-batch, and is exactly-once: the query is an
idempotent writer of the batch queue (its id, kept in the checkpoint, names the writer; the micro-batch
id is the sequence), so a micro-batch Spark runs again after a failure or a restart publishes nothing new.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from zeps.errors import ConfigError

__all__ = ["batch_queue_sink", "queue_sink", "topic_sink"]

_CHUNK = 500


def _bytes(value: Any) -> bytes:
    return value.encode() if isinstance(value, str) else bytes(value)


def _bodies(rows: Iterable[Any], column: str) -> Iterator[list[bytes]]:
    chunk: list[bytes] = []
    for row in rows:
        chunk.append(_bytes(row[column]))
        if len(chunk) >= _CHUNK:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def topic_sink(handle: Any, *, column: str = "body") -> Callable[[Iterable[Any]], None]:
    """Broadcast one message per row (the column's value) to every subscriber of the Topic."""

    def publish_partition(rows: Iterable[Any]) -> None:
        for chunk in _bodies(rows, column):
            handle.publish_many(chunk)

    return publish_partition


def queue_sink(handle: Any, *, column: str = "body", priority: int | None = None) -> Callable[[Iterable[Any]], None]:
    """Put one work item per row (the column's value) into the Queue."""

    def put_partition(rows: Iterable[Any]) -> None:
        for chunk in _bodies(rows, column):
            handle.put_all(chunk, priority=priority)

    return put_partition


def batch_queue_sink(handle: Any, *, column: str = "body") -> Callable[[Any, int], None]:
    """For ``writeStream.foreachBatch``: each micro-batch's rows (the column's values, collected on
    the driver: meant for results such as aggregates) become one batch of the batch Queue, exactly once."""

    def publish_micro_batch(df: Any, batch_id: int) -> None:
        query = df.sparkSession.sparkContext.getLocalProperty("sql.streaming.queryId")
        if not query:
            raise ConfigError(
                "batch_queue_sink runs in writeStream.foreachBatch(...): no streaming query is running here"
            )
        records = [_bytes(row[column]) for row in df.select(column).collect()]
        if records:
            handle.publish(records, writer=f"spark-{query}", sequence=batch_id)

    return publish_micro_batch

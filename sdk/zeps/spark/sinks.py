"""Sinks for Topic (broadcast) and work Queue (put), for ``foreachPartition`` / ``foreachBatch``.

::

    cache = zeps.topic("cache-invalidation")            # resolved on the driver
    df.select("key").foreachPartition(topic_sink(cache, column="key"))
    df.foreachPartition(queue_sink(zeps.queue("crawl-links"), column="url"))

The returned function runs on the executors; it holds only the handle's resolved settings (picklable).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

__all__ = ["queue_sink", "topic_sink"]

_CHUNK = 500


def _bodies(rows: Iterable[Any], column: str) -> Iterator[list[bytes]]:
    chunk: list[bytes] = []
    for row in rows:
        value = row[column]
        chunk.append(value.encode() if isinstance(value, str) else bytes(value))
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

"""Spark integration: the ``zeps`` data source (stream and batch, read and write) and sinks.

``pyspark`` is imported only here (import-linter contract). Register the source once per session::

    from zeps.spark import ZepsDataSource
    spark.dataSource.register(ZepsDataSource)
"""

from zeps.spark.queries import start_query
from zeps.spark.sinks import batch_queue_sink, queue_sink, topic_sink
from zeps.spark.source import DataLossError, ZepsDataSource
from zeps.spark.tables import latest_per_key, tombstones

__all__ = [
    "DataLossError",
    "ZepsDataSource",
    "batch_queue_sink",
    "latest_per_key",
    "queue_sink",
    "start_query",
    "tombstones",
    "topic_sink",
]

"""Spark integration: the ``zeps`` data source (stream and batch, read and write) and sinks.

``pyspark`` is imported only here (import-linter contract). Register the source once per session::

    from zeps.spark import ZepsDataSource
    spark.dataSource.register(ZepsDataSource)
"""

from zeps.spark.queries import start_query
from zeps.spark.sinks import batch_queue_sink, queue_sink, topic_sink
from zeps.spark.source import DataLossError, ZepsDataSource

__all__ = ["DataLossError", "ZepsDataSource", "batch_queue_sink", "queue_sink", "start_query", "topic_sink"]

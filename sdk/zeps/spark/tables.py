"""A compacted stream as a table in Spark: each key's latest value, and deletes written back.

``latest_per_key(df)`` turns the zeps source's rows (a batch read from the start, of a compacted stream
or any other) into one row per key, the one with the highest sequence, without the keys whose latest
record is a delete (an empty body). ``tombstones(df)`` turns rows of keys into deletes for the zeps
writer: a job that finds rows gone from its own table writes them, and every table view drops them::

    prices = latest_per_key(spark.read.format("zeps").option("stream", "prices").load())
    tombstones(gone.select("key")).write.format("zeps").option("stream", "prices").mode("append").save()
"""

from __future__ import annotations

from typing import Any

__all__ = ["latest_per_key", "tombstones"]


def latest_per_key(df: Any) -> Any:
    """One row per key: its highest sequence's, with every column the rows have; keys whose latest
    record has an empty body (a delete) are left out. ``df`` needs the columns key, sequence and body."""
    from pyspark.sql import functions as F  # noqa: PLC0415, N812 — pyspark only where Spark runs

    columns = df.columns
    missing = {"key", "sequence", "body"} - set(columns)
    if missing:
        raise ValueError(f"latest_per_key needs the columns key, sequence and body; the rows lack {sorted(missing)}")
    latest = df.groupBy("key").agg(F.max(F.struct("sequence", *[c for c in columns if c not in ("key", "sequence")]))
                                   .alias("latest"))  # fmt: skip
    rows = latest.select("key", *[F.col(f"latest.{c}").alias(c) for c in columns if c != "key"])
    return rows.filter(F.length("body") > 0).select(*columns)


def tombstones(df: Any) -> Any:
    """Rows (key string, body binary) that delete each key of ``df``'s ``key`` column, for the zeps writer."""
    from pyspark.sql import functions as F  # noqa: PLC0415, N812

    return df.select(F.col("key").cast("string").alias("key"), F.lit(b"").cast("binary").alias("body"))

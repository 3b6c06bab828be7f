"""make bench-spark: reading N messages with the zeps source vs Spark's json source, same session.

The same N = 1,000,000 100-byte messages are published to a broker and written as JSON-lines files
(key, body as string); each side is read in full by a batch query that touches every row
(count plus the sum of body lengths). Each read is done once to warm up (the JVM; Spark's Python
workers, which start and import zeps on first use and are reused after), then timed three times,
the three reads taking turns; rows/s of the best run of each, from the start of the read to its
result. Prints one JSON line last.

Two zeps reads: with ``.schema("key string, body binary")`` — the columns the JSON files hold, so
both sides make the same rows (``ratio``) — and with the source's whole schema (sequence, key, body,
timestamp: ``ratio_all_columns``); Spark gives Python data sources no column pruning, so each column
costs. The JSON line also carries the latest figure of spark-submit.sh with 2 executor pods on kind
(``e2e/kind/test_spark.py`` writes it during ``make e2e``): reported, never compared or asserted.

The zeps reads use 4 partitions of 250,000 sequences (2 per core); ZEPS_BENCH_SPARK_PARTITION sets
another partitionSize (the source's default, 100,000, makes 10 tasks and reads about 15% slower
here: each task connects, subscribes and starts its replay).
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path

from pyspark.sql import functions as sf

from workers import local_spark
from zeps.broker import BrokerConfig, BrokerServer, Registration
from zeps.client import StreamClient
from zeps.journal import JournalConfig
from zeps_dev import ZooKeeperServer
from zeps_dev.kind import spark_kind_figure

N = int(os.environ.get("ZEPS_BENCH_SPARK_N", "1000000"))
BODY = "x" * 100
KIND_FIGURE = spark_kind_figure()


def _kind_figure() -> dict[str, object]:
    if not KIND_FIGURE.exists():
        return {"kind_2_executor_pods": None, "kind_note": "not measured yet: make e2e writes it"}
    return {"kind_2_executor_pods": json.loads(KIND_FIGURE.read_text())}


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="zeps-bench-spark-") as tmp_name:
        tmp = Path(tmp_name)
        with ZooKeeperServer(tmp / "zk") as zk:
            broker = BrokerServer(
                BrokerConfig(tmp / "journal", ("bench",), journal=JournalConfig(fsync="never")),
                registration=Registration(zk.connect_string, "bench", "bench-0"),
            ).start()
            try:
                with StreamClient(broker.endpoint, "bench", timeout=300) as client:
                    client.publish_many((f"k.{i % 10}", BODY.encode()) for i in range(N))
                    client.flush(timeout=300)
                (tmp / "json").mkdir()
                per_file = N // 8
                for f in range(8):
                    with open(tmp / "json" / f"part-{f}.json", "w") as out:
                        for i in range(f * per_file, (f + 1) * per_file):
                            out.write(json.dumps({"key": f"k.{i % 10}", "body": BODY}) + "\n")
                spark = local_spark()

                def timed(df: object) -> tuple[float, int]:
                    start = time.monotonic()
                    row = df.agg(sf.count("*").alias("n"), sf.sum(sf.length("body")).alias("b")).collect()[0]  # type: ignore[attr-defined]
                    return time.monotonic() - start, int(row["n"])

                def zeps_read(schema: str | None) -> object:
                    reader = spark.read.format("zeps")
                    if schema:
                        reader = reader.schema(schema)
                    return (
                        reader.option("stream", "bench")
                        .option("namespace", "bench")
                        .option("zookeeper", zk.connect_string)
                        .option("endpoint", broker.endpoint)
                        .option("endSequence", str(N))
                        .option("partitionSize", os.environ.get("ZEPS_BENCH_SPARK_PARTITION", str(N // 4)))
                        .load()
                    )

                zeps_df, zeps_all_df = zeps_read("key string, body binary"), zeps_read(None)
                json_df = spark.read.schema("key string, body string").json(str(tmp / "json"))
                # each read once to warm up (JVM code paths; Spark's Python workers start and import
                # zeps and pyarrow on first use and are reused after), then the best of three
                for df in (json_df, zeps_df, zeps_all_df):
                    timed(df)
                # interleaved, so that neither side gets a JVM warmed longer by the other's runs
                rounds = [(timed(json_df), timed(zeps_df), timed(zeps_all_df)) for _ in range(3)]
                (json_s, json_n), (zeps_s, zeps_n), (all_s, all_n) = (min(side) for side in zip(*rounds, strict=True))
                spark.stop()
            finally:
                broker.stop()
    assert zeps_n == all_n == N and json_n == per_file * 8, (zeps_n, all_n, json_n)
    print(
        json.dumps(
            {
                "scenario": "spark",
                "rows": N,
                "zeps_rows_per_s": round(zeps_n / zeps_s, 1),
                "zeps_all_columns_rows_per_s": round(all_n / all_s, 1),
                "json_rows_per_s": round(json_n / json_s, 1),
                "ratio": round((zeps_n / zeps_s) / (json_n / json_s), 3),
                "ratio_all_columns": round((all_n / all_s) / (json_n / json_s), 3),
                **_kind_figure(),
            }
        )
    )


if __name__ == "__main__":
    main()

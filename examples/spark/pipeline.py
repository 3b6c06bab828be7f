"""A Spark pipeline over zeps: order events in a ZepsStream -> revenue per country -> a batch Queue.

    pipeline.py run [--checkpoint DIR] [--trigger-seconds N] [--once]
        Reads the ZepsStream ``orders`` (JSON bodies {"country": ..., "amount": ...}), keeps the
        running count and revenue per country, and publishes the totals after every micro-batch as
        one batch of the batch Queue ``revenue`` — exactly once (zeps.spark.batch_queue_sink), so a
        micro-batch Spark runs again after losing an executor or the driver publishes nothing new.
        Prints one JSON line per micro-batch published. --once: what the stream holds now, then exit.
    pipeline.py report
        Reads every retained batch of ``revenue`` with the zeps source (a batch read of the batch
        queue) and prints one JSON line per batch: its number, the micro-batch that made it, and the
        totals per country.
    pipeline.py totals --through N [--repeat R]
        A batch job (an audit): revenue per country over sequences 1..N of ``orders``, read by the
        executors straight from the broker; prints one JSON line per country, then the read's rate
        (--repeat: read R times, a rate line each; the first includes the executors' Python start).
        The driver needs only the Kubernetes API (it resolves ``orders`` there), no ZooKeeper and no
        broker: spark-submit.sh runs it from outside the cluster.

On Kubernetes the driver resolves ``orders`` and ``revenue`` from their status (in-cluster config, the
``spark-driver`` ServiceAccount); executors get the resolved settings inside the source's options and
need no Kubernetes access (driver-pod.yaml, executor-pod-template.yaml). Locally, set
ZEPS_STREAM_ORDERS_ENDPOINT and ZEPS_ZOOKEEPER (and ZEPS_NAMESPACE, ZEPS_CHROOT if not the defaults).
The tests run both commands: locally (tests/integration/test_examples.py) and with executors in pods
on kind (e2e/kind/test_spark.py).
"""

import argparse
import json
import time

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as sf

import zeps
from zeps.spark import ZepsDataSource, batch_queue_sink, start_query

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
commands = parser.add_subparsers(dest="command", required=True)
run = commands.add_parser("run", help="orders -> revenue per country -> the revenue batch queue")
run.add_argument("--checkpoint", default="/tmp/zeps-pipeline-checkpoint", help="the query's checkpoint directory")
run.add_argument("--trigger-seconds", type=float, default=10, help="seconds between micro-batches")
run.add_argument("--once", action="store_true", help="process what the stream holds now, then exit")
commands.add_parser("report", help="every batch of the revenue batch queue, as JSON lines")
totals_command = commands.add_parser("totals", help="revenue per country over sequences 1..N of orders")
totals_command.add_argument("--through", type=int, required=True, help="the last sequence to read")
totals_command.add_argument("--repeat", type=int, default=1, help="read the range this many times (a rate each)")
args = parser.parse_args()

spark = SparkSession.builder.appName(f"zeps-pipeline-{args.command}").getOrCreate()
if not spark.sparkContext.getConf().contains("spark.sql.shuffle.partitions"):
    # A few countries: 4 aggregation partitions unless spark-submit sets it (as driver-pod.yaml does).
    # Spark's default, 200, is 200 state-store tasks per micro-batch; the first checkpoint fixes it.
    spark.conf.set("spark.sql.shuffle.partitions", "4")
spark.dataSource.register(ZepsDataSource)

if args.command == "report":
    batches = spark.read.format("zeps").option("queue", "revenue").load()  # batch, batch_id, record
    totals: dict[int, dict] = {}
    for row in batches.orderBy("batch").collect():
        line = json.loads(row["record"])
        entry = totals.setdefault(row["batch"], {"batch": row["batch"], "microBatch": line["microBatch"]})
        entry[line["country"]] = {"orders": line["orders"], "revenue": round(line["revenue"], 2)}
    for entry in totals.values():
        print(json.dumps(entry), flush=True)
    spark.stop()
    raise SystemExit(0)

if args.command == "totals":

    def per_country() -> DataFrame:
        """A new DataFrame for every read: collecting the same one again would reuse its shuffle
        output and read nothing from the broker."""
        read = spark.read.format("zeps").schema("body binary").option("stream", "orders")
        return (
            read.option("endSequence", args.through)
            .option("partitionSize", max(1, args.through // 4))
            .load()
            .select(sf.from_json(sf.col("body").cast("string"), "country string, amount double").alias("o"))
            .groupBy("o.country")
            .agg(sf.count("*").alias("orders"), sf.sum("o.amount").alias("revenue"))
            .orderBy("country")
        )

    for attempt in range(args.repeat):
        started = time.monotonic()
        rows = per_country().collect()
        seconds = time.monotonic() - started
        if attempt == 0:
            for row in rows:
                print(
                    json.dumps(
                        {"country": row["country"], "orders": row["orders"], "revenue": round(row["revenue"], 2)}
                    )
                )
        rate = {"rows": args.through, "seconds": round(seconds, 2), "rows_per_s": round(args.through / seconds)}
        print(json.dumps(rate), flush=True)
    spark.stop()
    raise SystemExit(0)

orders = (
    spark.readStream.format("zeps")
    .option("stream", "orders")
    .option("startingOffsets", "earliest")
    .option("maxOffsetsPerTrigger", 100_000)
    .load()
)
revenue = (
    orders.select(sf.from_json(sf.col("body").cast("string"), "country string, amount double").alias("o"))
    .groupBy("o.country")
    .agg(sf.count("*").alias("orders"), sf.sum("o.amount").alias("revenue"))
)
publish = batch_queue_sink(zeps.batches("revenue"))  # resolved here, on the driver


def publish_totals(totals: DataFrame, micro_batch: int) -> None:
    """One batch of ``revenue`` per micro-batch: every country's running totals, as JSON records."""
    totals.persist()  # read twice below: computed once (Spark's advice for foreachBatch)
    try:
        records = totals.select(
            sf.to_json(sf.struct(sf.lit(micro_batch).alias("microBatch"), "country", "orders", "revenue")).alias("body")
        )
        publish(records, micro_batch)
        orders_so_far = sum(row["orders"] for row in totals.collect())
    finally:
        totals.unpersist()
    print(json.dumps({"published": micro_batch, "orders": orders_so_far, "at": round(time.time(), 3)}), flush=True)


writer = revenue.writeStream.outputMode("complete").option("checkpointLocation", args.checkpoint)
writer = writer.foreachBatch(publish_totals).trigger(processingTime=f"{args.trigger_seconds} seconds")
query = start_query(writer.start)  # started again if Spark's planning process was slow to start (zeps.spark.queries)
if args.once:
    query.processAllAvailable()  # every offset the stream had when the query started
    query.stop()
    spark.stop()
else:
    query.awaitTermination()

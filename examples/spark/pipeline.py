"""A Spark pipeline over zeps: order events in a ZepsStream -> revenue per country, every 10 s.

On Kubernetes the driver resolves the ZepsStream ``orders`` from its status (in-cluster config);
executors get the resolved settings in the source's options. Locally, set ZEPS_STREAM_ORDERS_ENDPOINT
and ZEPS_ZOOKEEPER (and ZEPS_NAMESPACE, ZEPS_CHROOT if not the defaults).

    python pipeline.py                 # runs until stopped, printing the totals every 10 s
    python pipeline.py --once          # what the stream holds now, as JSON lines, then exits

The tests run it with ``--once`` against a local broker (tests/integration/test_examples.py).
"""

import argparse
import json

from pyspark.sql import SparkSession
from pyspark.sql import functions as sf

from zeps.spark import ZepsDataSource

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--once", action="store_true", help="process what the stream holds now, print it, exit")
parser.add_argument("--checkpoint", default="/tmp/zeps-pipeline-checkpoint", help="the query's checkpoint directory")
args = parser.parse_args()

spark = SparkSession.builder.appName("zeps-pipeline").getOrCreate()
spark.dataSource.register(ZepsDataSource)
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
writer = revenue.writeStream.outputMode("complete").option("checkpointLocation", args.checkpoint)
if args.once:
    query = writer.format("memory").queryName("revenue").start()
    query.processAllAvailable()  # every offset the stream had when the query started
    query.stop()
    for row in spark.table("revenue").orderBy("country").collect():
        print(json.dumps({"country": row["country"], "orders": row["orders"], "revenue": round(row["revenue"], 2)}))
    spark.stop()
else:
    writer.format("console").trigger(processingTime="10 seconds").start().awaitTermination()

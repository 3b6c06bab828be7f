"""A Spark pipeline over zeps: order events in a ZepsStream -> revenue per country, every 10 s.

On Kubernetes the driver resolves the ZepsStream ``orders`` from its status (in-cluster config);
executors get the resolved settings in the source's options. Locally, pass ``endpoint`` and
``zookeeper`` options (or set ZEPS_STREAM_ORDERS_ENDPOINT and ZEPS_ZOOKEEPER).
"""

from pyspark.sql import SparkSession
from pyspark.sql import functions as sf

from zeps.spark import ZepsDataSource

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
    .agg(sf.sum("o.amount").alias("revenue"))
)
(
    revenue.writeStream.outputMode("complete")
    .format("console")
    .option("checkpointLocation", "/tmp/zeps-pipeline-checkpoint")
    .trigger(processingTime="10 seconds")
    .start()
    .awaitTermination()
)

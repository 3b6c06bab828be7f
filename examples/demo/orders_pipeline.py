"""The demo's Spark pipeline (make demo runs it; it runs anywhere the ZepsStream resolves).

1. A batch job generates order events and publishes them into the ZepsStream ``orders`` with the
   ``zeps`` data source's writer (key ``orders.<country>``, a JSON body).
2. A streaming query reads the stream from the start with the ``zeps`` source, aggregates orders
   and revenue per country, and writes the result (a memory table, then ``--out`` as JSON lines).

The settings come from the ZepsStream resource (KUBECONFIG, namespace) like any pod's would. The
last line printed is one JSON object: orders published, orders read, and the per-country figures.

    python examples/demo/orders_pipeline.py --orders 20000 --namespace zeps-demo --out /tmp/revenue
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from pyspark.sql import SparkSession
from pyspark.sql import functions as sf

from zeps.spark import ZepsDataSource, start_query

COUNTRIES = ["fr", "de", "es", "it", "nl", "pl"]


def expected(orders: int) -> dict[str, tuple[int, float]]:
    """The figures the pipeline must find: the generator below, computed in plain Python."""
    out: dict[str, tuple[int, float]] = {}
    for i in range(orders):
        country = COUNTRIES[i % len(COUNTRIES)]
        count, revenue = out.get(country, (0, 0.0))
        out[country] = (count + 1, revenue + (i * 37 % 20_000) / 100)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--orders", type=int, default=20_000)
    parser.add_argument("--namespace", default=os.environ.get("ZEPS_NAMESPACE", "default"))
    parser.add_argument("--stream", default="orders")
    parser.add_argument("--out", required=True, help="folder for the per-country result (JSON lines)")
    parser.add_argument("--timeout", type=float, default=120)
    args = parser.parse_args()

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (
        SparkSession.builder.master("local[2]").appName("zeps-demo-orders")
        .config("spark.ui.enabled", "false").config("spark.driver.host", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )  # fmt: skip
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(ZepsDataSource)
    try:
        countries = sf.array(*[sf.lit(c) for c in COUNTRIES])
        orders = spark.range(args.orders).select(
            sf.col("id").alias("order_id"),
            sf.element_at(countries, (sf.col("id") % len(COUNTRIES) + 1).cast("int")).alias("country"),
            ((sf.col("id") * 37 % 20_000) / 100).alias("amount"),
        )
        events = orders.select(
            sf.concat(sf.lit("orders."), "country").alias("key"),
            sf.to_json(sf.struct("order_id", "country", "amount")).alias("body"),
        )
        source = {"stream": args.stream, "namespace": args.namespace}
        events.write.format("zeps").options(**source).mode("append").save()  # waits for the broker's confirmation

        stream = spark.readStream.format("zeps").options(**source).option("startingOffsets", "earliest").load()
        order = "order_id long, country string, amount double"
        parsed = stream.select(sf.from_json(sf.col("body").cast("string"), order).alias("o"))
        per_country = parsed.groupBy("o.country").agg(
            sf.count("*").alias("orders"), sf.sum("o.amount").alias("revenue")
        )
        writer = per_country.writeStream.outputMode("complete").format("memory").queryName("revenue")
        query = start_query(writer.start)  # started again if Spark's planning process was slow to start
        deadline = time.monotonic() + args.timeout
        read = 0
        while time.monotonic() < deadline:  # the driver learns the stream's tail from the broker's facts (1 s)
            query.processAllAvailable()
            read = spark.sql("select coalesce(sum(orders), 0) from revenue").collect()[0][0]
            if read >= args.orders:
                break
            time.sleep(0.5)
        query.stop()
        result = spark.sql("select country, orders, revenue from revenue order by country")
        result.coalesce(1).write.mode("overwrite").json(args.out)
        figures = {r["country"]: {"orders": r["orders"], "revenue": round(r["revenue"], 2)} for r in result.collect()}
    finally:
        spark.stop()
    print(json.dumps({"published": args.orders, "read": read, "countries": figures}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

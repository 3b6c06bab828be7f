"""The Spark tier is real: a local[2,2] SparkSession on Java 17, running a job across two tasks."""

from __future__ import annotations

from typing import Any

import pytest
from pyspark.sql import functions as sf

pytestmark = pytest.mark.spark


def test_small_job_aggregates_across_partitions(spark: Any) -> None:
    rows = [(f"customer-{i % 7}", i) for i in range(1, 1001)]
    df = spark.createDataFrame(rows, ["customer", "amount"]).repartition(4)
    totals = {r["customer"]: r["total"] for r in df.groupBy("customer").agg(sf.sum("amount").alias("total")).collect()}
    expected: dict[str, int] = {}
    for customer, amount in rows:
        expected[customer] = expected.get(customer, 0) + amount
    assert totals == expected
    assert spark.sparkContext.master == "local[2,2]"

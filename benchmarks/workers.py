"""What the benchmarks share: their worker processes (each a script beside them that prints
``ready`` once set up and ``done <numbers…>`` at the end), and the local Spark session of the Spark
reads."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any


def local_spark() -> Any:
    """A ``local[2]`` Spark session on 127.0.0.1 (no UI, 4 GB driver), the zeps source registered;
    its Python workers run this interpreter."""
    from pyspark.sql import SparkSession  # noqa: PLC0415 — the JVM only for the Spark benchmarks

    from zeps.spark import ZepsDataSource  # noqa: PLC0415

    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.memory", "4g")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(ZepsDataSource)
    return spark


def nats_server() -> str:
    """The nats-server the JetStream baselines run: built from its pinned Go module by
    ``tools/setup.sh bench`` (``make bench-*`` runs it), named by ``ZEPS_NATS_SERVER``."""
    path = os.environ.get("ZEPS_NATS_SERVER", "")
    if not path or not os.access(path, os.X_OK):
        raise SystemExit(
            "nats-server is not built: run `tools/setup.sh bench`, then `source .zeps-env` (make bench-* does both)"
        )
    return path


def finish(procs: list[subprocess.Popen[str]], timeout: float = 600) -> list[list[float]]:
    """Each worker's numbers from its ``done`` line, once it ends; SystemExit with its output if it
    printed something else."""
    results = []
    for proc in procs:
        out, _ = proc.communicate(timeout=timeout)
        fields = out.split()
        if not fields or fields[0] != "done":
            raise SystemExit(f"worker failed: {out!r}")
        results.append([float(f) for f in fields[1:]])
    return results

"""The examples run as a user runs them: examples/spark/pipeline.py against a real broker and ZooKeeper.

(The YAML examples are applied by the e2e suite and the Spark-on-Kubernetes manifests checked by the
API server in the cluster tier; examples/demo runs in the demo test.)
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from harness import ZooKeeperHarness
from zeps.broker import BrokerConfig, BrokerServer, Registration
from zeps.client import StreamClient
from zeps.dev.process import wait_until

pytestmark = pytest.mark.spark

PIPELINE = Path(__file__).resolve().parents[2] / "examples" / "spark" / "pipeline.py"


def test_spark_pipeline_example_totals_revenue_per_country(zookeeper: ZooKeeperHarness, tmp_path: Path) -> None:
    rng = random.Random(7)
    sales = [(rng.choice(["fr", "de", "it"]), rng.randint(1, 500) / 4) for _ in range(2000)]
    want: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for country, amount in sales:
        want[country][0] += 1
        want[country][1] += amount

    broker = BrokerServer(
        BrokerConfig(tmp_path / "journal", ("orders",)),
        registration=Registration(zookeeper.connect_string, "shop", "orders-0", chroot=zookeeper.root),
    ).start()
    try:
        with StreamClient(broker.endpoint, "orders") as client:
            client.publish_many(
                (f"order.{country}", json.dumps({"country": country, "amount": amount}).encode())
                for country, amount in sales
            )
            client.flush()
        member = broker._memberships[0]
        wait_until(lambda: member.metadata.get("lastSequence") == len(sales), timeout=15, what="the broker's facts")
        env = {
            **os.environ,
            "ZEPS_STREAM_ORDERS_ENDPOINT": broker.endpoint,
            "ZEPS_ZOOKEEPER": zookeeper.connect_string,
            "ZEPS_CHROOT": zookeeper.root,
            "ZEPS_NAMESPACE": "shop",
            "PYSPARK_PYTHON": sys.executable,
            "SPARK_LOCAL_IP": "127.0.0.1",
        }
        run = subprocess.run(
            [sys.executable, str(PIPELINE), "--once", "--checkpoint", str(tmp_path / "checkpoint")],
            capture_output=True, text=True, env=env, timeout=240, check=False,
        )  # fmt: skip
    finally:
        broker.stop()
    assert run.returncode == 0, run.stderr[-3000:]
    got = {row["country"]: (row["orders"], row["revenue"]) for row in map(json.loads, run.stdout.splitlines())}
    assert got == {country: (n, round(total, 2)) for country, (n, total) in want.items()}

"""The README's Python examples run as written, against a real ZooKeeper, a real broker and a local
Spark, in a process whose environment is what a pod's would be (ZEPS_ZOOKEEPER, ZEPS_NAMESPACE, the
stream's endpoint; no Kubernetes): the blocks executed in order in one namespace, then checked. A
README example that no longer runs fails this test."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness import ZooKeeperHarness
from zeps.broker import BrokerConfig, BrokerServer, Registration

pytestmark = pytest.mark.spark

README = Path(__file__).resolve().parents[2] / "README.md"

RUNNER = r"""
import re, sys
from pyspark.sql import SparkSession

readme = open(sys.argv[1]).read()
blocks = re.findall(r"```python\n(.*?)```", readme, re.S)
assert len(blocks) == 4, f"one example each: Topic, Queue, stream, Spark (found {len(blocks)})"
spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
         .config("spark.sql.shuffle.partitions", "2").getOrCreate())
crawled = []
scope = {"cache": {"product:42": "stale"}, "crawl": crawled.append, "spark": spark, "print": lambda *_: None}
exec("import zeps", scope)
for block in blocks:
    exec(compile(block, sys.argv[1], "exec"), scope)
from zeps_dev.process import wait_until  # the subscription's callback runs on its own thread
wait_until(lambda: "product:42" not in scope["cache"], timeout=10, interval=0.05,
           what="the Topic example's subscriber getting the message")
scope["subscription"].close()
assert crawled == [b"https://example.org/"], crawled
query = scope["query"]
query.processAllAvailable()
rows = spark.sql("select * from counts").collect()
assert rows and rows[0]["count"] >= 1, rows
query.stop()
spark.stop()
print("README examples: ok")
"""


@pytest.fixture
def broker(zookeeper: ZooKeeperHarness, tmp_path: Path) -> Iterator[BrokerServer]:
    """The stream's broker, registered as the operator's would be (the Spark source reads its facts there)."""
    registration = Registration(zookeeper.connect_string, "shop", "prices-0", chroot=zookeeper.root)
    server = BrokerServer(BrokerConfig(tmp_path / "journal", ("prices",)), registration=registration).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.mark.timeout(300)
def test_the_readmes_examples_run(zookeeper: ZooKeeperHarness, broker: BrokerServer, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ZEPS_STREAM_", "KUBERNETES_"))}
    env.update({"KUBECONFIG": str(tmp_path / "no-cluster"), "ZEPS_ZOOKEEPER": zookeeper.connect_string,
                "ZEPS_CHROOT": zookeeper.root, "ZEPS_NAMESPACE": "shop",
                "ZEPS_STREAM_PRICES_ENDPOINT": broker.endpoint, "PYSPARK_PYTHON": sys.executable,
                "SPARK_LOCAL_IP": "127.0.0.1"})  # fmt: skip
    done = subprocess.run([sys.executable, "-c", RUNNER, str(README)], env=env, capture_output=True, text=True,
                          timeout=280, check=False)  # fmt: skip
    assert done.returncode == 0 and "README examples: ok" in done.stdout, done.stderr[-4000:]

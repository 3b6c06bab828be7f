"""Fixtures for every test tier: a real ZooKeeper root path per test with failure helpers, local Spark.
The servers themselves (ZooKeeper, the control plane, the operator) are the root conftest.py's,
shared with e2e/.

The kubernetes client and PySpark (the extras) are imported by the fixtures that need them, never
when this file loads: unit tests need neither (tests/unit/test_config.py checks it).
"""

from __future__ import annotations

import itertools
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

from harness import TEST_JVM_OPTIONS, PlainPartitions, ReplicaSet, ZooKeeperHarness, fresh_py4j_connection
from zeps_dev import ZooKeeperServer
from zeps_dev.seaweedfs import SeaweedFS

# property tests check what holds, never how fast: hypothesis's per-example deadline (200 ms) is a
# timed assertion that a busy machine fails (a 0.3 ms example took 253 ms once in CI)
settings.register_profile("zeps", deadline=None)
settings.load_profile("zeps")

_counter = itertools.count()

S3_TEST_BUCKET = "zeps-tests"
#: the session S3 server's admin keys: fixed, because the Spark session's Python workers take their
#: environment from the JVM started with the session (a loopback test server's, nothing else's)
S3_TEST_ADMIN = ("zeps-tests-admin", "zeps-tests-admin-secret")


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A ``pure`` test looks inside a module zeps._compiled compiles (wraps a private function, which
    compiled code does not look up, or inspects its classes): it runs on the pure-Python path (make
    test runs the unit tier there too), not here."""
    from zeps._compiled import active  # noqa: PLC0415

    if item.get_closest_marker("pure") is not None and active():
        pytest.skip("looks inside a compiled module: runs in make test's pure-Python unit step")


@pytest.fixture
def zookeeper(zookeeper_server: ZooKeeperServer, request: pytest.FixtureRequest) -> Iterator[ZooKeeperHarness]:
    """A real ZooKeeper server, a per-test root path and failure helpers (expire, stop, restart)."""
    slug = re.sub(r"[^A-Za-z0-9_-]", "-", request.node.name)[:60]
    harness = ZooKeeperHarness(zookeeper_server, f"/test/{slug}-{next(_counter)}")
    try:
        yield harness
    finally:
        harness.close()
        if not zookeeper_server.running():  # a test stopped or killed it: bring it back for the next
            zookeeper_server.start()


@pytest.fixture(scope="session")
def seaweedfs_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedFS]:
    """One real S3 server (SeaweedFS) for the session, with one bucket, S3_TEST_BUCKET: the s3://
    batch store's tests (each under a prefix of its own: SeaweedFS gives every bucket volumes of its
    own, so a bucket per test would use them up)."""
    server = SeaweedFS(tmp_path_factory.mktemp("seaweedfs"), admin=S3_TEST_ADMIN)
    server.start()
    try:
        server.create_bucket(S3_TEST_BUCKET)
        yield server
    finally:
        server.stop()


@pytest.fixture
def own_seaweedfs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[SeaweedFS]:
    """An S3 server of this test's own (one it may stop, kill and start again: the session's must not),
    with the bucket ``own`` and the admin's credentials in the environment; stopped at the end."""
    server = SeaweedFS(tmp_path / "own-s3")
    server.start()
    try:
        server.create_bucket("own")
        for key, value in server.credentials().items():
            monkeypatch.setenv(key, value)
        yield server
    finally:
        server.stop()


@pytest.fixture
def s3_url(seaweedfs_server: SeaweedFS, monkeypatch: pytest.MonkeyPatch) -> str:
    """A store URL of this test's own on the session's S3 server (``s3://<bucket>/test-<n>``), and the
    admin's credentials in the environment, as a pod gets them from the Queue's credentials Secret."""
    for key, value in seaweedfs_server.credentials("admin").items():
        monkeypatch.setenv(key, value)
    return f"s3://{S3_TEST_BUCKET}/test-{next(_counter)}"


@pytest.fixture
def spark(spark_session: Any) -> Iterator[Any]:
    """The session's SparkSession, on a fresh Py4J connection after each test. A test stopped midway
    (its timeout raises inside a Py4J call) leaves the answer it waited for unread on the main
    thread's connection, and every later call would read the answer of the call before it; so the
    connection is closed after each test (the next call opens another), and jobs still running are
    cancelled on the new one (:func:`harness.fresh_py4j_connection`)."""
    yield spark_session
    fresh_py4j_connection(spark_session)


@pytest.fixture(scope="session")
def spark_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A local[2,2] SparkSession (2 cores, a task may fail once) bound to 127.0.0.1, UI off; stopped at the end."""
    from pyspark.sql import SparkSession  # noqa: PLC0415 — an extra: only the tests that need it import it

    warehouse: Path = tmp_path_factory.mktemp("spark-warehouse")
    os.environ["PYSPARK_PYTHON"] = sys.executable  # Python workers run this interpreter (and its zeps)
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    # the executors' S3 credentials (an s3:// batch store), as a pod's come from its Secret
    os.environ["AWS_ACCESS_KEY_ID"], os.environ["AWS_SECRET_ACCESS_KEY"] = S3_TEST_ADMIN
    session = (
        SparkSession.builder.master("local[2,2]")  # a failed task is tried once more, as on a cluster
        .appName("zeps-tests")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.extraJavaOptions", TEST_JVM_OPTIONS)  # local mode: the executors' JVM too
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.warehouse.dir", str(warehouse))
        .config("spark.pyspark.python", sys.executable)
        .getOrCreate()
    )
    try:
        # the tier's health check: a job across two tasks on the JVM, in Python workers
        total = session.range(0, 1000, numPartitions=2).selectExpr("sum(id) AS s").first()
        if total is None or total["s"] != 499_500:
            pytest.exit(f"the Spark tier cannot run: a sum over two tasks gave {total}", 3)
        yield session
    finally:
        session.stop()


@pytest.fixture
def plain(zookeeper: ZooKeeperHarness, tmp_path: Path) -> Iterator[list[str]]:
    """Stream "orders" of three partitions, a broker each (not replicated), registered in ZooKeeper:
    each partition's endpoint, partition 0 first."""
    brokers = PlainPartitions(zookeeper, tmp_path, 3)
    try:
        yield brokers.endpoints()
    finally:
        brokers.stop()


@pytest.fixture
def replicas(zookeeper: ZooKeeperHarness, tmp_path: Path) -> Iterator[ReplicaSet]:
    """Stream "prices" on three replicas (``--min-insync 2``), started; stopped after the test."""
    replica_set = ReplicaSet(zookeeper, tmp_path)
    for name in replica_set.names:
        replica_set.start(name)
    try:
        yield replica_set
    finally:
        replica_set.stop()

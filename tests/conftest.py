"""Fixtures for every test tier: real ZooKeeper, a real Kubernetes control plane, local Spark.

Servers bind 127.0.0.1 only and are stopped at teardown, on failure and on Ctrl-C (and by the
kernel if pytest itself is killed; see ``zeps.dev.process``). The binaries come from the zeps cache
that ``make setup`` fills (``ZEPS_ZOOKEEPER_HOME``, ``ZEPS_TESTBIN``).

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
from kazoo.security import make_digest_acl_credential

from harness import OPERATOR_AUTH, ZooKeeperHarness
from zeps.coordination import close_shared
from zeps.dev import ControlPlane, ZooKeeperServer

_counter = itertools.count()


@pytest.fixture(scope="session")
def zookeeper_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ZooKeeperServer]:
    """One ZooKeeper server for the whole test session (each test gets its own root path)."""
    super_digest = make_digest_acl_credential(*OPERATOR_AUTH)
    server = ZooKeeperServer(
        tmp_path_factory.mktemp("zookeeper"),
        jvm_flags=[f"-Dzookeeper.DigestAuthenticationProvider.superDigest={super_digest}"],
    )
    server.start()
    try:
        yield server
    finally:
        close_shared()  # handles' shared sessions end before the server does (no retry noise at exit)
        server.stop()


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
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """etcd + kube-apiserver + controller-manager + scheduler + kwok, once per test session."""
    plane = ControlPlane(tmp_path_factory.mktemp("control-plane"))
    plane.start()
    try:
        yield plane
    finally:
        plane.stop()


@pytest.fixture(scope="session")
def kube_api(control_plane: ControlPlane) -> Iterator[Any]:
    """A ``kubernetes.client.ApiClient`` authenticated as cluster-admin on the control plane."""
    from kubernetes import config  # noqa: PLC0415 — an extra: only the tests that need it import it

    client = config.new_client_from_config(config_file=str(control_plane.kubeconfig))
    try:
        yield client
    finally:
        client.close()


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A local[2] SparkSession bound to 127.0.0.1, UI off; stopped at the end of the session."""
    from pyspark.sql import SparkSession  # noqa: PLC0415 — an extra: only the tests that need it import it

    warehouse: Path = tmp_path_factory.mktemp("spark-warehouse")
    os.environ["PYSPARK_PYTHON"] = sys.executable  # Python workers run this interpreter (and its zeps)
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    session = (
        SparkSession.builder.master("local[2]")
        .appName("zeps-tests")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.warehouse.dir", str(warehouse))
        .config("spark.pyspark.python", sys.executable)
        .getOrCreate()
    )
    try:
        yield session
    finally:
        session.stop()

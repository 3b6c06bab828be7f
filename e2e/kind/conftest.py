"""Fixtures of the kind tests (helpers in kindapp.py): a fresh application namespace per test, and
ZooKeeper's shell in the chart's ensemble."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from typing import Any

import pytest
from kindapp import ROOT, App, ZooKeeperShell

_names = itertools.count()


@pytest.fixture
def app(cluster: Any) -> Iterator[App]:
    """A fresh namespace with the examples' client RBAC (``examples/client-rbac.yaml``)."""
    name = f"e2e-{next(_names)}-{os.getpid() % 1000}"
    cluster.kubectl("create", "namespace", name)
    cluster.wait_for(f"the default SA in {name}", lambda: cluster.kubectl("get", "sa", "default", "-n", name))
    cluster.kubectl("apply", "-n", name, "-f", str(ROOT / "examples" / "client-rbac.yaml"))
    try:
        yield App(cluster, name)
    finally:
        cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture
def zk(cluster: Any) -> ZooKeeperShell:
    return ZooKeeperShell(cluster)

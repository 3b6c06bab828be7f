"""Fixtures of the kind tests (helpers in kindapp.py): a fresh application namespace per test, and
ZooKeeper's shell in the chart's ensemble."""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kindapp import ROOT, STACK_DUMP_LABEL, App, ZooKeeperShell

_names = itertools.count()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[Any]:
    """Keep each phase's report on the test item: ``app`` dumps its namespace when the test failed."""
    report = yield
    setattr(item, f"report_{report.when}", report)
    return report


def _dump(cluster: Any, namespace: str) -> None:
    """What a failed test's namespace held: pods, events and the end of every pod's log (and of the
    run before a restart)."""
    print(f"\n===== namespace {namespace} after the failure =====")
    print(cluster.kubectl("get", "pods,pvc", "-n", namespace, "-o", "wide", check=False))
    print(cluster.kubectl("get", "events", "-n", namespace, "--sort-by=.lastTimestamp", check=False)[-6000:])
    pods = cluster.kubectl("get", "pods", "-n", namespace, "-o", "name", check=False).split()
    # Pods labelled STACK_DUMP_LABEL print every thread's stack on SIGUSR1 (faulthandler): where a
    # stuck worker is stuck, in the log read below.
    dumping = cluster.kubectl("get", "pods", "-n", namespace, "-l", STACK_DUMP_LABEL, "-o", "name", check=False).split()
    for pod in dumping:
        cluster.kubectl("exec", pod, "-n", namespace, "--", "kill", "-USR1", "1", check=False)
    if dumping:
        time.sleep(1)
    for pod in pods:
        log = cluster.kubectl("logs", pod, "-n", namespace, "--all-containers", "--tail=60", check=False)
        print(f"----- {pod} (last 60 lines) -----\n{log}")
        previous = cluster.kubectl("logs", pod, "-n", namespace, "--all-containers", "--previous", "--tail=40",
                                   check=False)  # fmt: skip
        if previous.strip():  # the container restarted: how its last run ended
            print(f"----- {pod}, the run before its last restart (last 40 lines) -----\n{previous}")


@pytest.fixture
def app(request: pytest.FixtureRequest, cluster: Any) -> Iterator[App]:
    """A fresh namespace with the examples' client RBAC (``examples/client-rbac.yaml``); dumped to the
    output when the test fails."""
    name = f"e2e-{next(_names)}-{os.getpid() % 1000}"
    cluster.kubectl("create", "namespace", name)
    cluster.wait_for(f"the default SA in {name}", lambda: cluster.kubectl("get", "sa", "default", "-n", name))
    cluster.kubectl("apply", "-n", name, "-f", str(ROOT / "examples" / "client-rbac.yaml"))
    try:
        yield App(cluster, name)
    finally:
        report = getattr(request.node, "report_call", None)
        if report is not None and report.failed:
            _dump(cluster, name)
        cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture
def zk(cluster: Any) -> ZooKeeperShell:
    return ZooKeeperShell(cluster)

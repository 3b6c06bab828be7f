"""Fixtures of the kind tests (helpers in kindapp.py): a fresh application namespace per test, and
ZooKeeper's shell in the chart's ensemble."""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Iterator
from typing import Any

import pytest
from kindapp import OPERATOR_NAMESPACE, STACK_DUMP_LABEL, App, ZooKeeperShell, client_namespace, dump_stacks

_names = itertools.count()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[Any]:
    """Keep each phase's report on the test item: ``app`` dumps its namespace when the test failed."""
    report = yield
    setattr(item, f"report_{report.when}", report)
    return report


def _short(text: str, width: int = 240) -> str:
    """``text`` with each line cut to ``width`` characters: CI shows a failure's output only in part,
    and one 300-item JSON line must not push a crash's traceback out of it."""
    lines = text.splitlines()
    return "\n".join(line if len(line) <= width else f"{line[:width]}… ({len(line) - width} more)" for line in lines)


def _dump(cluster: Any, namespace: str, *, tail: int = 60, stacks: bool = True) -> None:
    """What a failed test's namespace held. Crash evidence first (containers that restarted: how
    their last run ended, and its log), then pods, events and the end of every pod's log."""
    print(f"\n===== namespace {namespace} after the failure =====")
    pods = cluster.kubectl("get", "pods", "-n", namespace, "-o", "json", check=False)
    items = json.loads(pods)["items"] if pods.strip() else []
    for pod in items:
        name = pod["metadata"]["name"]
        for status in pod["status"].get("containerStatuses", []):
            ended = (status.get("lastState") or {}).get("terminated")
            if not ended:
                continue
            how = {k: ended.get(k) for k in ("reason", "exitCode", "startedAt", "finishedAt")}
            previous = cluster.kubectl("logs", name, "-n", namespace, "-c", status["name"], "--previous",
                                       "--tail=40", check=False)  # fmt: skip
            print(f"----- pod/{name}: restarted {status.get('restartCount')}x, its last run ended {how} -----")
            print(_short(previous))
    print(cluster.kubectl("get", "pods,pvc", "-n", namespace, "-o", "wide", check=False))
    print(_short(cluster.kubectl("get", "events", "-n", namespace, "--sort-by=.lastTimestamp", check=False)[-5000:]))
    # Pods labelled STACK_DUMP_LABEL print every thread's stack on SIGUSR1 (faulthandler): where a
    # stuck worker is stuck, in the log read below.
    dumping = [p["metadata"]["name"] for p in items if STACK_DUMP_LABEL in p["metadata"].get("labels", {})]
    for name in dumping if stacks else []:
        dump_stacks(cluster, name, namespace)
    for pod in items:
        name = pod["metadata"]["name"]
        log = cluster.kubectl("logs", name, "-n", namespace, "--all-containers", f"--tail={tail}", check=False)
        print(f"----- pod/{name} (last {tail} lines) -----\n{_short(log)}")


@pytest.fixture(autouse=True)
def _operator_namespace_on_failure(request: pytest.FixtureRequest, cluster: Any) -> Iterator[None]:
    """After any failed kind test: the operator's namespace too (the operator, the ZooKeeper
    ensemble), briefly: restarts and how they ended, pods, events, the last lines of each log."""
    yield
    report = getattr(request.node, "report_call", None)
    if report is not None and report.failed:
        _dump(cluster, OPERATOR_NAMESPACE, tail=25, stacks=False)


@pytest.fixture
def app(request: pytest.FixtureRequest, cluster: Any) -> Iterator[App]:
    """A fresh namespace with the examples' client RBAC (``examples/client-rbac.yaml``), its pods let
    through to ZooKeeper (:func:`kindapp.client_namespace`); dumped to the output when the test fails."""
    name = f"e2e-{next(_names)}-{os.getpid() % 1000}"
    try:
        yield client_namespace(cluster, name)
    finally:
        report = getattr(request.node, "report_call", None)
        if report is not None and report.failed:
            _dump(cluster, name)
        cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture
def zk(cluster: Any) -> ZooKeeperShell:
    return ZooKeeperShell(cluster)

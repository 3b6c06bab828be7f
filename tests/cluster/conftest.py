"""Cluster tier: tests against a real kube-apiserver (etcd, controller-manager, scheduler, kwok).

There is no kubelet: kwok simulates one fake node, so pods are scheduled and reported Running but
no container runs. Everything else — admission, RBAC, CRDs and their validation, controllers,
watches — is the real Kubernetes code at the pinned version (tools/testbin/k8s/go.mod).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from zeps_dev import OperatorProcess
from zeps_dev.process import file_tail, wait_until

_namespaces = itertools.count()
BROKER_LOG_LINES = 30  #: of each broker log a failed test's report shows


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/cluster/" in str(item.path):
            item.add_marker(pytest.mark.cluster)
        if "solo" in getattr(item, "fixturenames", ()):  # a stack of its own: never beside the session's
            item.add_marker(pytest.mark.solo)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[Any]:
    """A failed test that used the shared operator gets the end of the operator's log in its report,
    and the end of each broker's log it ran from its pods' templates (``<pod>.log`` in its
    ``tmp_path``): what kopf and the brokers did is the first thing to read, and CI keeps no files."""
    report = yield
    funcargs = getattr(item, "funcargs", {})
    if not report.failed:
        return report
    tmp = funcargs.get("tmp_path")
    if isinstance(tmp, Path):
        for log in sorted(tmp.glob("*.log"))[:8]:
            title = f"{log.stem} log (last {BROKER_LOG_LINES} lines)"
            report.sections.append((title, file_tail(log, BROKER_LOG_LINES)))
    operator = funcargs.get("operator")
    if isinstance(operator, OperatorProcess):
        report.sections.append(("operator log (last 80 lines)", operator.process.log_tail(80)))
    return report


@pytest.fixture
def namespace(kube_api: Any) -> Iterator[str]:
    """A fresh namespace for one test, deleted afterwards."""
    core = client.CoreV1Api(kube_api)
    name = f"t{next(_namespaces)}-{id(core) % 10_000}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    # pods are rejected until the service-account controller has made the namespace's default SA
    wait_until(
        lambda: bool(core.list_namespaced_service_account(name, field_selector="metadata.name=default").items),
        timeout=60,
        what=f"the default ServiceAccount in {name}",
    )
    try:
        yield name
    finally:
        core.delete_namespace(name)

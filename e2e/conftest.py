"""The e2e suite's cluster: kind (ZEPS_E2E_KUBECONFIG set by e2e/run-kind.sh, operator installed by
the chart) or, everywhere else, the local control plane with ZooKeeper and the operator process.
The tests themselves are the same for both."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from zeps.dev import ControlPlane, OperatorProcess, ZooKeeperServer

ROOT = Path(__file__).resolve().parents[1]


class Cluster:
    def __init__(self, kubectl: ControlPlane | None, kubeconfig: Path) -> None:
        self.plane = kubectl
        self.kubeconfig = kubeconfig

    def kubectl(self, *args: str) -> str:
        if self.plane is not None:
            return self.plane.kubectl(*args)
        import subprocess  # noqa: PLC0415 — kind: the user's kubectl

        return subprocess.run(
            ["kubectl", f"--kubeconfig={self.kubeconfig}", *args],
            capture_output=True,
            text=True,
            check=True,
            timeout=300,
        ).stdout


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    external = os.environ.get("ZEPS_E2E_KUBECONFIG")
    if external:
        yield Cluster(None, Path(external))
        return
    work = tmp_path_factory.mktemp("e2e")
    with ZooKeeperServer(work / "zookeeper") as zk, ControlPlane(work / "control-plane") as plane:
        plane.kubectl("apply", "-f", str(ROOT / "crds"))
        for name in ("topics", "queues", "zepsstreams"):
            plane.kubectl("wait", "--for=condition=Established", f"crd/{name}.zeps.dev", "--timeout=60s")
        with OperatorProcess(
            work / "operator", kubeconfig=plane.kubeconfig, zookeeper=zk.connect_string, resync_seconds=5
        ):
            yield Cluster(plane, plane.kubeconfig)

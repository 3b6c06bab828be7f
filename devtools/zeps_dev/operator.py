"""The zeps operator as a local process (``kopf run -m zeps_operator.handlers``), as the chart runs it."""

from __future__ import annotations

import os
import sys
import urllib.request
from pathlib import Path

from zeps_dev.process import LocalServer, ManagedProcess, free_port

__all__ = ["OperatorProcess"]


class OperatorProcess(LocalServer):
    """Runs the operator against ``kubeconfig`` and ``zookeeper``; ready when its liveness endpoint
    answers. ``resync_seconds`` shortens the drift-check timers (tests use 3 s); ``namespace_quota``:
    each namespace's ZooKeeper quota, (nodes, bytes), 0 for none (the chart's zookeeper.namespaceQuota);
    ``zookeeper_ca``: the CA file of the servers' TLS certificates, for a ``zookeeper`` that is a TLS port."""

    def __init__(
        self,
        workdir: Path,
        *,
        kubeconfig: Path,
        zookeeper: str,
        chroot: str = "/zeps",
        resync_seconds: float = 30.0,
        delete_retries: int = 5,
        identity: str = "zeps-operator-local",
        zookeeper_auth: str = "",
        cleaner_lease_seconds: int = 45,
        namespace_quota: tuple[int, int] = (0, 0),
        zookeeper_ca: str = "",
    ) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.metrics_port = free_port()  #: its Prometheus metrics, on 127.0.0.1
        env = {
            **os.environ,
            "KUBECONFIG": str(kubeconfig),
            "ZEPS_ZOOKEEPER": zookeeper,
            "ZEPS_CHROOT": chroot,
            "ZEPS_RESYNC_SECONDS": str(resync_seconds),
            "ZEPS_DELETE_RETRIES": str(delete_retries),
            "POD_NAME": identity,
            "ZEPS_ZOOKEEPER_AUTH": zookeeper_auth,
            "ZEPS_CLEANER_LEASE_SECONDS": str(cleaner_lease_seconds),
            "ZEPS_OPERATOR_METRICS_PORT": str(self.metrics_port),
            "ZEPS_OPERATOR_METRICS_ADDR": "127.0.0.1",
            "ZEPS_NAMESPACE_QUOTA_NODES": str(namespace_quota[0]),
            "ZEPS_NAMESPACE_QUOTA_BYTES": str(namespace_quota[1]),
            "ZEPS_ZOOKEEPER_CA": zookeeper_ca,
        }
        argv = [
            sys.executable,
            "-m",
            "kopf",
            "run",
            "--standalone",
            "--all-namespaces",
            "-m",
            "zeps_operator.handlers",
            f"--liveness=http://127.0.0.1:{self.port}/healthz",
        ]
        self.process = ManagedProcess("zeps-operator", argv, log_path=workdir / "operator.log", env=env)

    @property
    def pid(self) -> int | None:
        return self.process.pid

    def start(self, timeout: float = 60.0) -> None:
        self.process.start()
        url = f"http://127.0.0.1:{self.port}/healthz"
        self.process.wait_ready(lambda: urllib.request.urlopen(url, timeout=2).status == 200, timeout=timeout)

    def metrics(self) -> str:
        """What a Prometheus scrape of the operator reads."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as answer:
            return str(answer.read().decode())

    def stop(self) -> None:
        self.process.stop()

"""The whole local zeps stack: ZooKeeper, the Kubernetes control plane, the chart, the operator.

``zeps dev up`` runs it in the foreground (``zeps dev down`` stops it from another shell) and
``make demo`` runs one for the demo. What runs where:

* ZooKeeper and the control plane (etcd, kube-apiserver, controller-manager, scheduler, kwok with
  one fake node) are local processes on 127.0.0.1, from the pinned binaries in the zeps cache;
* the chart is installed with the pinned helm, as a cluster would get it (CRDs, RBAC, the operator
  Deployment) — but there is no kubelet, so kwok only *reports* the operator's pod Running; the
  operator itself runs here as a local process (``kopf run``), against the same API server;
* a ZepsStream's broker is started from its Deployment's own pod template (command, ConfigMap
  environment) as a local process by :meth:`LocalStack.run_broker`, for the same reason.

It needs a source checkout (the chart and CRDs are read from ``charts/zeps``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from zeps.errors import SetupError
from zeps.resources import GROUP, PLURALS
from zeps_dev.controlplane import ControlPlane, binaries_dir
from zeps_dev.operator import OperatorProcess
from zeps_dev.process import LocalServer, ManagedProcess, free_port, wait_until
from zeps_dev.zookeeper import ZooKeeperServer

__all__ = ["REPOSITORY", "LocalStack"]

REPOSITORY = Path(__file__).resolve().parents[2]  # devtools/zeps_dev/stack.py -> the checkout
CHART = REPOSITORY / "charts" / "zeps"
OPERATOR_NAMESPACE = "zeps-system"


class LocalStack(LocalServer):
    """Start with :meth:`start` (or ``with``); :meth:`env` is what clients need to reach it."""

    def __init__(self, workdir: Path, *, namespace: str = "default", progress: Callable[[str], None] = print) -> None:
        self.workdir = workdir
        self.namespace = namespace
        self.progress = progress
        self.zookeeper = ZooKeeperServer(workdir / "zookeeper")
        self.plane = ControlPlane(workdir / "controlplane")
        self.operator: OperatorProcess | None = None
        self.brokers: list[ManagedProcess] = []
        self.endpoints: dict[str, str] = {}  # stream -> the endpoint of its broker started here

    # -- lifecycle --------------------------------------------------------------------------------
    def start(self) -> None:
        if not (CHART / "Chart.yaml").exists():
            raise SetupError(f"the local stack needs a zeps source checkout (no chart at {CHART})")
        self.workdir.mkdir(parents=True, exist_ok=True)
        try:
            self.progress("starting ZooKeeper (127.0.0.1, pinned jars)")
            self.zookeeper.start()
            self.progress(f"ZooKeeper at {self.zookeeper.connect_string}")
            self.progress("starting the Kubernetes control plane (etcd, kube-apiserver, controllers, kwok)")
            self.plane.start()
            self.progress(f"API server at {self.plane.server}; kubeconfig {self.plane.kubeconfig}")
            self.progress("installing the zeps chart with helm (CRDs, RBAC, the operator Deployment)")
            self._helm_install()
            self.progress("no kubelet here: kwok reports the operator's pod Running; the operator runs locally")
            self.operator = OperatorProcess(
                self.workdir / "operator",
                kubeconfig=self.plane.kubeconfig,
                zookeeper=self.zookeeper.connect_string,
                resync_seconds=5,
                identity="zeps-operator-local",
            )
            self.operator.start()
            if self.namespace != "default":
                self.plane.kubectl("create", "namespace", self.namespace)
            what = f"the default ServiceAccount of {self.namespace}"
            wait_until(self._default_service_account, timeout=60, what=what)
            self.progress("operator running (kopf); the stack is up")
        except BaseException:
            self.stop()
            raise

    def _helm_install(self) -> None:
        (self.workdir / "operator").mkdir(parents=True, exist_ok=True)
        result = subprocess.run(
            [str(binaries_dir() / "helm"), "install", "zeps", str(CHART), "--namespace", OPERATOR_NAMESPACE,
             "--create-namespace", "--kubeconfig", str(self.plane.kubeconfig),
             "--set", f"zookeeper.connect={self.zookeeper.connect_string}", "--set", "operator.cluster=local",
             "--wait", "--timeout", "120s"],
            capture_output=True, text=True, timeout=180, check=False,
        )  # fmt: skip
        if result.returncode != 0:
            raise SetupError(f"helm install of {CHART} failed: {result.stderr.strip()}")
        for name in PLURALS.values():
            self.plane.kubectl("wait", "--for=condition=Established", f"crd/{name}.{GROUP}", "--timeout=60s")

    def _default_service_account(self) -> bool:
        out = self.plane.kubectl("get", "serviceaccount", "default", "-n", self.namespace, check=False)
        return "default" in out

    def stop(self) -> None:
        for broker in self.brokers:
            broker.stop()
        self.brokers.clear()
        if self.operator is not None:
            self.operator.stop()
            self.operator = None
        self.plane.stop()
        self.zookeeper.stop()

    # -- using it ---------------------------------------------------------------------------------
    def env(self) -> dict[str, str]:
        """What a client in this machine's shell needs: the SDK resolves resources from there. A
        stream's status names its Service (the operator's word), which no DNS here resolves: the
        brokers started here are named by ``ZEPS_STREAM_<NAME>_ENDPOINT``, as a user outside the
        cluster would do."""
        return {
            "KUBECONFIG": str(self.plane.kubeconfig),
            "ZEPS_ZOOKEEPER": self.zookeeper.connect_string,
            "ZEPS_NAMESPACE": self.namespace,
            "ZEPS_TESTBIN": str(binaries_dir()),
            **{
                f"ZEPS_STREAM_{name.upper().replace('-', '_')}_ENDPOINT": endpoint
                for name, endpoint in self.endpoints.items()
            },
        }

    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> str:
        return self.plane.kubectl(*args, input=input, check=check)

    def get(self, kind: str, name: str) -> dict[str, Any]:
        return json.loads(self.kubectl("get", kind, name, "-n", self.namespace, "-o", "json"))  # type: ignore[no-any-return]

    def wait_ready(self, kind: str, name: str, timeout: int = 90) -> None:
        self.kubectl("wait", "--for=condition=Ready", f"{kind}/{name}", "-n", self.namespace, f"--timeout={timeout}s")

    def run_broker(self, stream: str) -> ManagedProcess:
        """Start ``stream``'s broker from its Deployment's pod template — its command and its
        environment from the ConfigMap — as a local process on 127.0.0.1 (kwok runs no containers)."""
        deployment_name = f"{stream}-broker"
        wait_until(
            lambda: bool(self.kubectl("get", "deployment", deployment_name, "-n", self.namespace, check=False)),
            timeout=60,
            what=f"the broker Deployment {deployment_name}",
        )
        deployment = self.get("deployment", deployment_name)
        container = deployment["spec"]["template"]["spec"]["containers"][0]
        config = self.get("configmap", deployment_name).get("data", {})
        port = free_port()
        data_dir = self.workdir / "brokers" / stream
        env = {
            **os.environ,
            **config,
            "ZEPS_BROKER_BIND": f"tcp://127.0.0.1:{port}",
            "ZEPS_BROKER_ADVERTISE": f"tcp://127.0.0.1:{port}",
            "ZEPS_BROKER_DATA_DIR": str(data_dir),
            "ZEPS_BROKER_METRICS_PORT": str(free_port()),
            "POD_NAME": f"{deployment_name}-local",
        }
        # the image's command, found beside this Python (the same zeps install)
        command = container["command"]
        program = shutil.which(command[0], path=str(Path(sys.executable).parent)) or command[0]
        broker = ManagedProcess(
            f"broker-{stream}", [program, *command[1:], *container.get("args", [])],
            log_path=self.workdir / "logs" / f"broker-{stream}.log", env=env,
        )  # fmt: skip
        broker.start()
        self.brokers.append(broker)
        self.endpoints[stream] = f"tcp://127.0.0.1:{port}"
        return broker

"""A replicated ZepsStream through the operator, on the real API server (kind runs the pods: the
e2e suite). The StatefulSet's pods are run here from its own pod template (command, ConfigMap and
the pod's environment with ``$(POD_NAME)`` expanded) as three local broker processes, which elect
their leader in the real ZooKeeper; the operator shows the leader, the epoch and the in-sync set
in status, follows a failover, and scales the stream 3 -> 1."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from zeps.client import StreamClient
from zeps.client.discovery import LeaderLocator
from zeps_dev import ControlPlane, OperatorProcess, ZooKeeperServer
from zeps_dev.process import free_port, wait_until

CHROOT = "/operator-tests"


def _apply(plane: ControlPlane, namespace: str, name: str, spec: dict[str, Any]) -> None:
    body = {"apiVersion": "zeps.dev/v1alpha1", "kind": "ZepsStream", "metadata": {"name": name}, "spec": spec}
    plane.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(body))


def _status(plane: ControlPlane, namespace: str, name: str) -> dict[str, Any]:
    body = json.loads(plane.kubectl("get", "zepsstream", name, "-n", namespace, "-o", "json"))
    return body.get("status", {})  # type: ignore[no-any-return]


def _replica(apps: Any, core: Any, namespace: str, ordinal: int, tmp: Path) -> tuple[subprocess.Popen[bytes], str]:
    """Replica ``ordinal`` of the StatefulSet, as its pod would run: the template's command, the
    ConfigMap, the pod's own environment (``$(POD_NAME)`` expanded); only where it binds and what it
    advertises are local (no cluster DNS here)."""
    template = apps.read_namespaced_stateful_set("orders-broker", namespace).spec.template.spec
    container = template.containers[0]
    pod_name = f"orders-broker-{ordinal}"
    env = dict(os.environ)
    env.update(core.read_namespaced_config_map("orders-broker", namespace).data or {})
    for var in container.env:
        if var.value is not None:
            env[var.name] = var.value.replace("$(POD_NAME)", pod_name)
    port = free_port()
    endpoint = f"tcp://127.0.0.1:{port}"
    env.update({"POD_NAME": pod_name, "ZEPS_BROKER_BIND": endpoint, "ZEPS_BROKER_ADVERTISE": endpoint,
                "ZEPS_BROKER_DATA_DIR": str(tmp / pod_name), "ZEPS_BROKER_METRICS_PORT": str(free_port()),
                "ZEPS_BROKER_ZOOKEEPER_SESSION_TIMEOUT": "2"})  # fmt: skip
    assert env["ZEPS_BROKER_MEMBER"] == pod_name  # the pod names itself in the group
    command = [os.path.join(os.path.dirname(sys.executable), container.command[0]), *(container.args or [])]
    log = open(tmp / f"{pod_name}.log", "ab")  # noqa: SIM115 — the child writes it
    proc = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    log.close()
    return proc, endpoint


@pytest.mark.usefixtures("operator")
def test_a_replicated_stream_runs_elects_fails_over_and_scales_down(
    crds: ControlPlane, namespace: str, kube_api: Any, zookeeper_server: ZooKeeperServer, tmp_path: Path
) -> None:
    core, apps, policy = client.CoreV1Api(kube_api), client.AppsV1Api(kube_api), client.PolicyV1Api(kube_api)
    _apply(crds, namespace, "orders", {"replicas": 3, "fsync": "always"})
    wait_until(lambda: bool(apps.list_namespaced_stateful_set(namespace).items), timeout=60, what="the StatefulSet")
    sts = apps.read_namespaced_stateful_set("orders-broker", namespace)
    assert sts.spec.replicas == 3 and sts.metadata.owner_references[0].name == "orders"
    wait_until(lambda: bool(policy.list_namespaced_pod_disruption_budget(namespace).items), timeout=30,
               what="the PodDisruptionBudget")  # fmt: skip
    assert policy.read_namespaced_pod_disruption_budget("orders-broker", namespace).spec.min_available == 2
    assert core.read_namespaced_service("orders-broker-pods", namespace).spec.cluster_ip == "None"
    wait_until(lambda: _status(crds, namespace, "orders").get("replicated") is True, timeout=30,
               what="status.replicated")  # fmt: skip

    procs: dict[int, subprocess.Popen[bytes]] = {}
    try:
        for i in range(3):
            procs[i], _ = _replica(apps, core, namespace, i, tmp_path)
        wait_until(lambda: len(_status(crds, namespace, "orders").get("replication", {}).get("inSync", [])) == 3,
                   timeout=90, what="a leader and three replicas in sync in status")  # fmt: skip
        status = _status(crds, namespace, "orders")
        leader, epoch = status["replication"]["leader"], status["replication"]["epoch"]
        assert status["endpoint"] == f"tcp://orders-broker.{namespace}.svc:5555"  # the operator's Service
        locator = LeaderLocator(zookeeper_server.connect_string, namespace, "orders", chroot=CHROOT)
        with StreamClient(locator(), "orders", locator=locator, timeout=30) as c:
            for i in range(50):
                c.publish("k", b"%d" % i)
            c.flush()
            procs[int(leader.rsplit("-", 1)[1])].send_signal(signal.SIGKILL)  # the leader's pod dies
            for i in range(50, 100):
                c.publish("k", b"%d" % i)
            c.flush(timeout=30)  # confirmed by the new leader
        wait_until(lambda: _status(crds, namespace, "orders").get("replication", {}).get("epoch", 0) > epoch,
                   timeout=60, what="the new epoch in status")  # fmt: skip
        after = _status(crds, namespace, "orders")["replication"]
        assert after["leader"] not in ("", leader)
        wait_until(lambda: _status(crds, namespace, "orders").get("lastSequence") == 100, timeout=30,
                   what="the leader's facts in status")  # fmt: skip

        # 3 -> 1: the StatefulSet scales, the manifest and minInSync follow
        _apply(crds, namespace, "orders", {"replicas": 1, "fsync": "always"})
        wait_until(lambda: apps.read_namespaced_stateful_set("orders-broker", namespace).spec.replicas == 1,
                   timeout=30, what="the StatefulSet scaled to 1")  # fmt: skip
        config = core.read_namespaced_config_map("orders-broker", namespace).data
        assert config["ZEPS_BROKER_MIN_INSYNC"] == "1"
        assert _status(crds, namespace, "orders")["replicated"] is True  # still a StatefulSet (its volumes)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs.values():
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
        crds.kubectl("delete", "zepsstream", "orders", "-n", namespace, "--timeout=60s", check=False)


def test_a_stream_of_one_broker_is_not_replicated_in_place(
    operator: OperatorProcess, crds: ControlPlane, namespace: str, kube_api: Any
) -> None:
    """Its journal is on one volume: replicating it would start the new replicas empty. The operator
    says so in a condition and leaves the broker as it is."""
    _apply(crds, namespace, "single", {})
    apps = client.AppsV1Api(kube_api)
    wait_until(lambda: bool(apps.list_namespaced_deployment(namespace).items), timeout=60, what="the Deployment")
    _apply(crds, namespace, "single", {"replicas": 3})

    def reason() -> str:
        ready = [c for c in _status(crds, namespace, "single").get("conditions", []) if c["type"] == "Ready"]
        return str(ready[0]["reason"]) if ready else ""

    wait_until(lambda: reason() == "ReplicasNotChangeable", timeout=60, what="the condition")
    assert not apps.list_namespaced_stateful_set(namespace).items
    crds.kubectl("delete", "zepsstream", "single", "-n", namespace, "--timeout=60s", check=False)

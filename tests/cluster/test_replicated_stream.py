"""A replicated ZepsStream through the operator, on the real API server (kind runs the pods: the
e2e suite). The StatefulSet's pods are run here from its own pod template (command, ConfigMap and
the pod's environment with ``$(POD_NAME)`` expanded) as three local broker processes, which elect
their leader in the real ZooKeeper; the operator shows the leader, the epoch and the in-sync set
in status, follows a failover, and scales the stream 3 -> 1. A partitioned stream's broker sets run
the same way, one per partition."""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, watch

from zeps.client import PartitionedStreamClient, StreamClient
from zeps.client.discovery import LeaderLocator
from zeps.partitioning import partition_of
from zeps_dev import ControlPlane, ZooKeeperServer
from zeps_dev.process import free_port, wait_until
from zeps_operator.plan import broker_name

CHROOT = "/operator-tests"


def _apply(plane: ControlPlane, namespace: str, name: str, spec: dict[str, Any]) -> None:
    body = {"apiVersion": "zeps.dev/v1alpha1", "kind": "ZepsStream", "metadata": {"name": name}, "spec": spec}
    plane.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(body))


def _status(plane: ControlPlane, namespace: str, name: str) -> dict[str, Any]:
    body = json.loads(plane.kubectl("get", "zepsstream", name, "-n", namespace, "-o", "json"))
    return body.get("status", {})  # type: ignore[no-any-return]


def _cond(plane: ControlPlane, namespace: str, name: str, kind: str) -> tuple[str, str, str]:
    """The status, reason and message of the condition ``kind`` of a ZepsStream (empty if none)."""
    found = next((c for c in _status(plane, namespace, name).get("conditions", []) if c["type"] == kind), {})
    return found.get("status", ""), found.get("reason", ""), found.get("message", "")


def _stop(procs: Iterable[subprocess.Popen[bytes]]) -> None:
    """SIGTERM to the broker processes still running, then up to 15 s each before SIGKILL."""
    procs = list(procs)
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()


@dataclass
class Pods:
    """Broker pods of a namespace run here as local processes, from their templates (no kubelet)."""

    core: Any
    apps: Any
    namespace: str
    tmp: Path

    def replica(self, ordinal: int, stream: str = "orders", partition: int = 0, **env: str
                ) -> tuple[subprocess.Popen[bytes], str]:  # fmt: skip
        """Replica ``ordinal`` of the stream's StatefulSet (of partition ``partition``), as its pod would
        run (``env``: settings of the test's, over the pod's)."""
        sts = broker_name(stream, partition)
        template = self.apps.read_namespaced_stateful_set(sts, self.namespace).spec.template.spec
        return self.run(stream, template.containers[0], f"{sts}-{ordinal}", partition=partition, extra=env)

    def run(self, stream: str, container: Any, pod_name: str, data: Path | None = None, *, partition: int = 0,
            extra: dict[str, str] | None = None) -> tuple[subprocess.Popen[bytes], str]:  # fmt: skip
        """A broker container: its command, its ConfigMap and its own environment (``$(POD_NAME)`` and
        ``$(POD_IP)`` expanded); only where it binds and what it advertises are local (no cluster DNS here)."""
        env = dict(os.environ)
        config = broker_name(stream, partition)
        env.update(self.core.read_namespaced_config_map(config, self.namespace).data or {})
        for var in container.env or []:
            if var.value is not None:
                env[var.name] = var.value.replace("$(POD_NAME)", pod_name).replace("$(POD_IP)", "127.0.0.1")
        endpoint = f"tcp://127.0.0.1:{free_port()}"
        env.update({"POD_NAME": pod_name, "ZEPS_BROKER_BIND": endpoint, "ZEPS_BROKER_ADVERTISE": endpoint,
                    "ZEPS_BROKER_DATA_DIR": str(data or self.tmp / pod_name),
                    "ZEPS_BROKER_METRICS_PORT": str(free_port()),
                    "ZEPS_BROKER_ZOOKEEPER_SESSION_TIMEOUT": "2", **(extra or {})})  # fmt: skip
        if pod_name.startswith(f"{stream}-broker-") and pod_name[-1].isdigit():  # a replica names itself
            assert env["ZEPS_BROKER_MEMBER"] == pod_name
        command = [os.path.join(os.path.dirname(sys.executable), container.command[0]), *(container.args or [])]
        log = open(self.tmp / f"{pod_name}.log", "ab")  # noqa: SIM115 — the child writes it
        proc = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        return proc, endpoint


@pytest.mark.usefixtures("operator")
def test_a_replicated_stream_runs_elects_fails_over_and_scales_down(
    crds: ControlPlane, namespace: str, kube_api: Any, zookeeper_server: ZooKeeperServer, tmp_path: Path
) -> None:
    core, apps, policy = client.CoreV1Api(kube_api), client.AppsV1Api(kube_api), client.PolicyV1Api(kube_api)
    pods = Pods(core, apps, namespace, tmp_path)
    _apply(crds, namespace, "orders", {"replicas": 3, "fsync": "always"})
    wait_until(lambda: bool(apps.list_namespaced_stateful_set(namespace).items), timeout=60, what="the StatefulSet")
    sts = apps.read_namespaced_stateful_set("orders-broker", namespace)
    assert sts.spec.replicas == 3 and sts.metadata.owner_references[0].name == "orders"
    wait_until(lambda: bool(policy.list_namespaced_pod_disruption_budget(namespace).items), timeout=30,
               what="the PodDisruptionBudget")  # fmt: skip
    assert policy.read_namespaced_pod_disruption_budget("orders-broker", namespace).spec.max_unavailable == 1
    assert core.read_namespaced_service("orders-broker-pods", namespace).spec.cluster_ip == "None"
    wait_until(lambda: _status(crds, namespace, "orders").get("replicated") is True, timeout=30,
               what="status.replicated")  # fmt: skip

    procs: dict[int, subprocess.Popen[bytes]] = {}
    try:
        for i in range(3):
            procs[i], _ = pods.replica(i)
        wait_until(lambda: len(_status(crds, namespace, "orders").get("replication", {}).get("inSync", [])) == 3,
                   timeout=90, what="a leader and three replicas in sync in status")  # fmt: skip
        wait_until(lambda: len(_status(crds, namespace, "orders")["replication"].get("followerLag", {})) == 2,
                   timeout=30, what="both followers' lag in status")  # fmt: skip
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
        # the dead leader's process is not started again (yet): the stream says so
        wait_until(lambda: f"{leader} not fetching" in (c := _cond(crds, namespace, "orders", "UnderReplicated"))[2]
                   and c[:2] == ("True", "ReplicasDown"), timeout=30, what="UnderReplicated: the dead one")  # fmt: skip
        # the new leader was a follower: a status patch merges maps, so the operator removes its entry
        # (whoever leads by then: the lead may have gone back to orders-broker-0, the preferred replica)
        replication = lambda: _status(crds, namespace, "orders")["replication"]  # noqa: E731
        wait_until(lambda: (r := replication()).get("leader", "") not in ("", *r.get("followerLag", {})),
                   timeout=30, what="the new leader gone from followerLag")  # fmt: skip
        wait_until(lambda: _status(crds, namespace, "orders").get("lastSequence") == 100, timeout=30,
                   what="the leader's facts in status")  # fmt: skip

        # 3 -> 1 while orders-broker-0, the one that stays, is down: the StatefulSet keeps its 3 (before,
        # it went down at once, and every record only the other two held was gone with them)
        dead = int(leader.rsplit("-", 1)[1])
        if dead != 0:
            procs[0].send_signal(signal.SIGKILL)
        wait_until(lambda: "orders-broker-0" not in _status(crds, namespace, "orders")["replication"]["inSync"],
                   timeout=60, what="orders-broker-0 out of the in-sync set")  # fmt: skip
        _apply(crds, namespace, "orders", {"replicas": 1, "fsync": "always"})
        wait_until(lambda: "orders-broker-0 not in sync" in str(_status(crds, namespace, "orders").get("scaling")),
                   timeout=30, what="the scale-down waiting in status")  # fmt: skip
        assert apps.read_namespaced_stateful_set("orders-broker", namespace).spec.replicas == 3
        assert len(zk_json(zookeeper_server, namespace, "manifest")["members"]) == 3  # none told to leave yet
        procs[0], _ = pods.replica(0)  # back: it catches up, and the new minInSync reaches it first
        wait_until(lambda: apps.read_namespaced_stateful_set("orders-broker", namespace).spec.replicas == 1,
                   timeout=120, what="the StatefulSet scaled to 1")  # fmt: skip
        config = core.read_namespaced_config_map("orders-broker", namespace).data
        assert config["ZEPS_BROKER_MIN_INSYNC"] == "1"
        assert _status(crds, namespace, "orders")["replicated"] is True  # still a StatefulSet (its volumes)
        wait_until(lambda: "scaling" not in _status(crds, namespace, "orders"), timeout=30, what="status.scaling gone")
    finally:
        _stop(procs.values())
        crds.kubectl("delete", "zepsstream", "orders", "-n", namespace, "--timeout=60s", check=False)


def test_a_scale_down_waits_for_the_replicas_that_stay_unless_an_annotation_skips_the_check(
    operator: Any, crds: ControlPlane, namespace: str, kube_api: Any, zookeeper_server: ZooKeeperServer
) -> None:
    """replicas 3 -> 2 while sd-broker-1, a replica that stays, is out of the in-sync set (the
    replication state written here as the brokers would hold it; no broker runs): the StatefulSet
    keeps 3 and ``status.scaling`` and the ScalingDown condition say why;
    ``zeps.dev/skip-scale-down-check: "true"`` (the admin's word that it will never be in sync again)
    takes it to 2 at once, with a warning event naming what was skipped."""
    from zeps.coordination import connect  # noqa: PLC0415
    from zeps.paths import StreamPaths  # noqa: PLC0415
    from zeps.replication.election import ReplicationState  # noqa: PLC0415

    apps = client.AppsV1Api(kube_api)
    zk = connect(zookeeper_server.connect_string)
    state = ReplicationState(2, "sd-broker-0", frozenset({"sd-broker-0", "sd-broker-2"})).encode()
    replicas = lambda: apps.read_namespaced_stateful_set("sd-broker", namespace).spec.replicas  # noqa: E731
    try:
        _apply(crds, namespace, "sd", {"replicas": 3, "minInSync": 1})
        wait_until(lambda: replicas() == 3, timeout=60, what="the StatefulSet of 3")
        _write_state(zk, StreamPaths.of(namespace, "sd", chroot=CHROOT).replication_state, state)
        _apply(crds, namespace, "sd", {"replicas": 2, "minInSync": 1})
        wait_until(lambda: "sd-broker-1 not in sync" in str(_status(crds, namespace, "sd").get("scaling")),
                   timeout=60, what="the scale-down waiting for sd-broker-1")  # fmt: skip
        assert replicas() == 3
        wait_until(lambda: _cond(crds, namespace, "sd", "ScalingDown")[:2] == ("True", "Waiting"), timeout=30,
                   what="ScalingDown: Waiting")  # fmt: skip
        assert "sd-broker-1 not in sync" in _cond(crds, namespace, "sd", "ScalingDown")[2]
        crds.kubectl("annotate", "zepsstream", "sd", "-n", namespace, "zeps.dev/skip-scale-down-check=true")
        wait_until(lambda: replicas() == 2, timeout=60, what="the StatefulSet down to 2, unchecked")
        events = _events(crds, namespace, "ScaleDownCheckSkipped", "sd-broker goes down to 2 now")
        assert "sd-broker-1 not in sync" in events, events
        wait_until(lambda: "scaling" not in _status(crds, namespace, "sd"), timeout=30, what="status.scaling gone")
        assert _cond(crds, namespace, "sd", "ScalingDown")[:2] == ("False", "Done")
    finally:
        zk.stop()
        zk.close()
        crds.kubectl("delete", "zepsstream", "sd", "-n", namespace, "--wait=false", check=False)


@pytest.mark.usefixtures("operator")
def test_an_annotation_elects_a_replica_out_of_sync_when_the_in_sync_ones_are_gone(
    crds: ControlPlane, namespace: str, kube_api: Any, zookeeper_server: ZooKeeperServer, tmp_path: Path
) -> None:
    """A follower stops and leaves the in-sync set; the other two confirm more, then both are lost.
    The follower alone may not lead: the status says no leader, and why. The annotation
    ``zeps.dev/unclean-election: <replica>`` elects it: the operator says in an event what it gives
    up (the records confirmed after it stopped) and removes the annotation."""
    core, apps = client.CoreV1Api(kube_api), client.AppsV1Api(kube_api)
    pods = Pods(core, apps, namespace, tmp_path)
    _apply(crds, namespace, "orders", {"replicas": 3, "fsync": "always"})
    wait_until(lambda: bool(apps.list_namespaced_stateful_set(namespace).items), timeout=60, what="the StatefulSet")
    procs: dict[int, subprocess.Popen[bytes]] = {}
    replication = lambda: _status(crds, namespace, "orders").get("replication", {})  # noqa: E731
    try:
        for i in range(3):
            procs[i], _ = pods.replica(i, ZEPS_BROKER_REPLICA_LAG="2")
        wait_until(lambda: len(replication().get("inSync", [])) == 3, timeout=90, what="three replicas in sync")
        # the lead settles at the preferred replica (whichever the first election chose): it stays there
        wait_until(lambda: replication().get("leader") == "orders-broker-0", timeout=60, what="the preferred leader")
        lagging = 1
        locator = LeaderLocator(zookeeper_server.connect_string, namespace, "orders", chroot=CHROOT)
        with StreamClient(locator(), "orders", locator=locator, timeout=30) as c:
            for i in range(50):
                c.publish("k", b"%d" % i)
            c.flush()
            procs[lagging].send_signal(signal.SIGKILL)
            procs[lagging].wait(10)
            wait_until(lambda: len(replication().get("inSync", [])) == 2, timeout=30, what="the follower out of sync")
            for i in range(50, 100):
                c.publish("k", b"%d" % i)
            c.flush(timeout=30)
        # the leader records its commit point every 5 s: the event's figure comes from it
        wait_until(lambda: zk_json(zookeeper_server, namespace, "committed").get("commit", 0) >= 100, timeout=30,
                   what="the leader's commit point recorded")  # fmt: skip
        for i in range(3):
            if i != lagging:
                procs[i].send_signal(signal.SIGKILL)
                procs[i].wait(10)
        procs[lagging], _ = pods.replica(lagging, ZEPS_BROKER_REPLICA_LAG="2")
        wait_until(lambda: "only the in-sync replicas" in _ready_message(crds, namespace), timeout=60,
                   what="the status saying why no replica leads")  # fmt: skip
        crds.kubectl("annotate", "zepsstream", "orders", "-n", namespace,
                     f"zeps.dev/unclean-election=orders-broker-{lagging}")  # fmt: skip
        wait_until(lambda: replication().get("leader") == f"orders-broker-{lagging}", timeout=60,
                   what="the replica elected uncleanly leading")  # fmt: skip

        # the election is written in ZooKeeper first; the annotation's removal and the event come after it
        def events() -> list[dict[str, Any]]:
            return list(json.loads(crds.kubectl("get", "events", "-n", namespace, "--field-selector",
                                                "reason=UncleanElection", "-o", "json"))["items"])  # fmt: skip

        def annotations() -> dict[str, str]:
            body = json.loads(crds.kubectl("get", "zepsstream", "orders", "-n", namespace, "-o", "json"))
            return dict(body["metadata"].get("annotations") or {})

        wait_until(lambda: bool(events()) and "zeps.dev/unclean-election" not in annotations(), timeout=30,
                   what="the UncleanElection event, the annotation removed")  # fmt: skip
        assert "gives up at least 50 confirmed records" in events()[0]["message"], events()
    finally:
        _stop(procs.values())
        crds.kubectl("delete", "zepsstream", "orders", "-n", namespace, "--timeout=60s", check=False)


def _ready_message(plane: ControlPlane, namespace: str) -> str:
    conditions = _status(plane, namespace, "orders").get("conditions", [])
    return next((str(c.get("message", "")) for c in conditions if c.get("type") == "Ready"), "")


@pytest.mark.usefixtures("operator")
def test_a_stream_of_one_broker_grows_replicas_in_place_and_keeps_its_journal(
    crds: ControlPlane, namespace: str, kube_api: Any, zookeeper_server: ZooKeeperServer, tmp_path: Path
) -> None:
    """replicas 1 -> 3 on a live stream: the old broker (its Deployment, restarted by the operator as
    the first replica) leads, the StatefulSet's replicas copy its journal, and once two hold it the
    Deployment and its volume go; a new replica leads, with every message of the old journal."""
    core, apps = client.CoreV1Api(kube_api), client.AppsV1Api(kube_api)
    pods = Pods(core, apps, namespace, tmp_path)
    claim = client.V1ObjectReference(namespace=namespace, name="grow-journal")  # its own: not another test's
    pv = client.V1PersistentVolume(
        metadata=client.V1ObjectMeta(name=f"grow-{namespace}"),
        spec=client.V1PersistentVolumeSpec(capacity={"storage": "1Gi"}, access_modes=["ReadWriteOnce"],
                                           host_path=client.V1HostPathVolumeSource(path=str(tmp_path / "pv")),
                                           storage_class_name="", claim_ref=claim),
    )  # fmt: skip
    core.create_persistent_volume(pv)
    spec: dict[str, Any] = {"storage": {"size": "1Gi", "storageClassName": ""}, "fsync": "always"}
    procs: list[subprocess.Popen[bytes]] = []
    try:
        _apply(crds, namespace, "grow", spec)
        wait_until(lambda: bool(apps.list_namespaced_deployment(namespace).items), timeout=60, what="the Deployment")

        def deployment_container() -> Any:
            return apps.read_namespaced_deployment("grow-broker", namespace).spec.template.spec.containers[0]

        old, endpoint = pods.run("grow", deployment_container(), "grow-broker-abc", data=tmp_path / "old-journal")
        procs.append(old)
        with StreamClient(endpoint, "grow", timeout=30) as c:
            for i in range(30):
                c.publish("k", b"old %d" % i)
            c.flush()

        _apply(crds, namespace, "grow", {**spec, "replicas": 3})
        wait_until(lambda: any(e.name == "ZEPS_BROKER_MIN_INSYNC" for e in deployment_container().env or []),
                   timeout=60, what="the old broker's pod template as the first replica")  # fmt: skip
        old.send_signal(signal.SIGTERM)  # the Deployment's rollout: the old pod goes, the new one starts
        old.wait(30)
        first, _ = pods.run("grow", deployment_container(), "grow-broker-def", data=tmp_path / "old-journal")
        procs.append(first)
        wait_until(lambda: bool(apps.list_namespaced_stateful_set(namespace).items), timeout=60,
                   what="the StatefulSet")  # fmt: skip
        for i in range(3):
            procs.append(pods.replica(i, stream="grow")[0])
        wait_until(lambda: _status(crds, namespace, "grow").get("replicated") is True, timeout=120,
                   what="the operator to finish growing the stream")  # fmt: skip
        assert not apps.list_namespaced_deployment(namespace).items
        wait_until(lambda: not core.list_namespaced_persistent_volume_claim(
            namespace, label_selector="zeps.dev/stream=grow").items or all(
            p.metadata.name != "grow-journal" for p in core.list_namespaced_persistent_volume_claim(namespace).items),
            timeout=30, what="the old volume gone")  # fmt: skip
        first.send_signal(signal.SIGTERM)  # the deleted Deployment's pod stops: a new replica leads
        first.wait(30)
        locator = LeaderLocator(zookeeper_server.connect_string, namespace, "grow", chroot=CHROOT)
        wait_until(lambda: locator().startswith("tcp://"), timeout=60, what="a new leader")
        with StreamClient(locator(), "grow", locator=locator, timeout=30) as c:
            c.publish("k", b"new")
            c.flush()
            fetched = c.fetch("", first=1)
        assert [m.body for m in fetched.messages] == [b"old %d" % i for i in range(30)] + [b"new"]
        wait_until(lambda: str(_status(crds, namespace, "grow").get("replication", {}).get("leader", ""))
                   .startswith("grow-broker-"), timeout=60, what="status naming a new replica the leader")  # fmt: skip
    finally:
        _stop(procs)
        crds.kubectl("delete", "zepsstream", "grow", "-n", namespace, "--timeout=60s", check=False)
        core.delete_persistent_volume(f"grow-{namespace}")


@pytest.mark.usefixtures("operator")
def test_a_partitioned_stream_runs_a_broker_set_per_partition_and_grows_on_a_live_stream(
    crds: ControlPlane, namespace: str, kube_api: Any, zookeeper_server: ZooKeeperServer, tmp_path: Path
) -> None:
    """partitions 2: partition 0 is the stream's own broker (its Deployment), partition 1 a StatefulSet
    of its own whose broker serves partition 1; status lists both; each key's records land in its
    partition's journal. Then 2 -> 3 on the live stream: a third broker set, and the stream is not
    Ready until it serves."""
    core, apps = client.CoreV1Api(kube_api), client.AppsV1Api(kube_api)
    pods = Pods(core, apps, namespace, tmp_path)
    for p in range(3):  # the partitions' journal volumes (their pods wait for them), each for its own claim: an
        # unclaimed volume would go to whichever claim of its class came first, another test's too
        claim = "orders-journal" if p == 0 else f"journal-orders-broker-p{p}-0"
        core.create_persistent_volume(client.V1PersistentVolume(
            metadata=client.V1ObjectMeta(name=f"parts-{p}-{namespace}"),
            spec=client.V1PersistentVolumeSpec(capacity={"storage": "1Gi"}, access_modes=["ReadWriteOnce"],
                                               host_path=client.V1HostPathVolumeSource(path=str(tmp_path / f"pv{p}")),
                                               storage_class_name="",
                                               claim_ref=client.V1ObjectReference(namespace=namespace, name=claim)),
        ))  # fmt: skip
    spec: dict[str, Any] = {"partitions": 2, "fsync": "always", "storage": {"size": "1Gi", "storageClassName": ""}}
    _apply(crds, namespace, "orders", spec)
    wait_until(lambda: len(apps.list_namespaced_stateful_set(namespace).items) == 1, timeout=60,
               what="partition 1's StatefulSet")  # fmt: skip
    sts = apps.read_namespaced_stateful_set("orders-broker-p1", namespace)
    assert sts.spec.replicas == 1 and sts.metadata.owner_references[0].name == "orders"
    assert sts.spec.template.metadata.labels["zeps.dev/partition"] == "1"
    deployment = apps.read_namespaced_deployment("orders-broker", namespace)

    def partitions() -> list[dict[str, Any]]:
        return list(_status(crds, namespace, "orders").get("partitions", []))

    def ready() -> bool:
        conditions = _status(crds, namespace, "orders").get("conditions", [])
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    procs: list[subprocess.Popen[bytes]] = []
    try:
        first, endpoint = pods.run("orders", deployment.spec.template.spec.containers[0], "orders-broker-abc")
        procs.append(first)
        procs.append(pods.replica(0, partition=1)[0])
        wait_until(lambda: [p.get("leader") for p in partitions()] == ["orders-0", "orders-broker-p1-0"],
                   timeout=90, what="both partitions' brokers in status")  # fmt: skip
        assert partitions()[1]["endpoint"] == f"tcp://orders-broker-p1.{namespace}.svc:5555"
        # Ready also waits for partition 1's pod to be Ready in kwok: its claim bound by the PV
        # controller, then the pod made and scheduled, each on its own loop (slow on a busy machine)
        wait_until(ready, timeout=90, what="the stream Ready")

        locators = [LeaderLocator(zookeeper_server.connect_string, namespace, "orders", chroot=CHROOT, partition=p)
                    for p in range(2)]  # fmt: skip
        located = [endpoint, locators[1]()]  # partition 0 is one broker: where it was reached
        with PartitionedStreamClient(located, "orders", locators=locators, producer_id="shop", timeout=30) as c:
            c.publish_many([(f"customer-{i}", b"%d" % i) for i in range(100)])
            c.flush()
            for p in range(2):
                keys = {m.key for m in c.clients[p].fetch("", first=1).messages}
                assert keys and all(partition_of(k, 2) == p for k in keys)
        wait_until(lambda: sum(p.get("lastSequence", 0) for p in partitions()) == 100, timeout=30,
                   what="each partition's last sequence in status")  # fmt: skip

        _apply(crds, namespace, "orders", {**spec, "partitions": 3})
        wait_until(lambda: len(apps.list_namespaced_stateful_set(namespace).items) == 2, timeout=60,
                   what="partition 2's StatefulSet")  # fmt: skip
        wait_until(lambda: not ready(), timeout=30, what="the stream not Ready while partition 2 has no broker")
        reason = next(c for c in _status(crds, namespace, "orders")["conditions"] if c["type"] == "Ready")["reason"]
        assert reason == "PartitionsNotReady"
        procs.append(pods.replica(0, partition=2)[0])
        wait_until(lambda: len(partitions()) == 3 and partitions()[2].get("leader") == "orders-broker-p2-0",
                   timeout=90, what="partition 2 serving, in status")  # fmt: skip
        wait_until(ready, timeout=90, what="the stream Ready again")
    finally:
        _stop(procs)
        crds.kubectl("delete", "zepsstream", "orders", "-n", namespace, "--timeout=60s", check=False)
        for p in range(3):
            core.delete_persistent_volume(f"parts-{p}-{namespace}")


def _pods_by_ordinal(core: Any, namespace: str, stream: str) -> dict[str, Any]:
    pods = core.list_namespaced_pod(namespace, label_selector=f"app.kubernetes.io/instance={stream}").items
    return {p.metadata.name: p for p in pods}


def _watch_roll(core: Any, namespace: str, names: list[str], first: dict[str, str]) -> list[str]:
    """Follow the roll of stream "roll" in ``namespace`` through every change of its pods (the API
    server's watch: no state between two looks is missed), asserting that never two of ``names`` are
    down at once; return the order in which they were replaced (``first``: each name's uid before)."""
    order: list[str] = []
    listed = core.list_namespaced_pod(namespace, label_selector="app.kubernetes.io/instance=roll")
    pods = {p.metadata.name: p for p in listed.items}
    watching = watch.Watch()
    changes = watching.stream(core.list_namespaced_pod, namespace, timeout_seconds=180,
                              label_selector="app.kubernetes.io/instance=roll",
                              resource_version=listed.metadata.resource_version)  # fmt: skip
    for change in changes:
        pod = change["object"]
        if change["type"] == "DELETED":
            pods.pop(pod.metadata.name, None)
        else:
            pods[pod.metadata.name] = pod
        order += [n for n in names if n not in order and (n not in pods or pods[n].metadata.uid != first[n])]
        missing = [n for n in names if n not in pods or not _ready(pods[n]) or pods[n].metadata.deletion_timestamp]
        assert len(missing) <= 1, f"two pods down at once: {missing}"
        if len(order) == 3 and not missing:
            watching.stop()
    return order


def zk_json(zookeeper_server: ZooKeeperServer, namespace: str, node: str) -> dict[str, Any]:
    """A node of the "orders" stream as ZooKeeper holds it: its ``manifest`` (the brokers that should
    run) or its ``committed`` point (the leader's record of it); {} if there is none."""
    from kazoo.exceptions import NoNodeError  # noqa: PLC0415

    from zeps.coordination import connect  # noqa: PLC0415
    from zeps.paths import StreamPaths  # noqa: PLC0415

    paths = StreamPaths.of(namespace, "orders", chroot=CHROOT)
    path = paths.brokers.manifest if node == "manifest" else paths.replication_committed
    assert path is not None
    zk = connect(zookeeper_server.connect_string)
    try:
        return dict(json.loads(zk.get(path)[0]))
    except NoNodeError:
        return {}
    finally:
        zk.stop()
        zk.close()


def _roll_blocked_s(operator: Any, namespace: str) -> float | None:
    """The operator's ``zeps_stream_roll_blocked_seconds`` of the stream "roll", as a scrape reads it."""
    from prometheus_client.parser import text_string_to_metric_families  # noqa: PLC0415

    wanted = {"namespace": namespace, "stream": "roll", "statefulset": "roll-broker"}
    for family in text_string_to_metric_families(operator.metrics()):
        for sample in family.samples:
            if sample.name == "zeps_stream_roll_blocked_seconds" and sample.labels == wanted:
                return float(sample.value)
    return None


def _ready(pod: Any) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in (pod.status.conditions or []))


def test_a_new_template_rolls_the_broker_pods_one_at_a_time_followers_first_the_leader_last(
    operator: Any, crds: ControlPlane, namespace: str, kube_api: Any, zookeeper_server: ZooKeeperServer
) -> None:
    """kwok plays the kubelet (the pods are never run: the replication state is written here, as
    brokers in sync would hold it). The StatefulSet updates ``OnDelete``; a new template (other
    resources) makes the operator delete one pod at a time, waiting for each to be back (Ready, and
    in the in-sync set), followers first and the leader last. With ``minInSync`` equal to the
    replicas, no restart keeps enough in sync: the roll is blocked, says so in status, and the
    operator's ``zeps_stream_roll_blocked_seconds`` counts how long (the ZepsStreamRollBlocked alert's)."""
    from zeps.coordination import connect  # noqa: PLC0415
    from zeps.paths import StreamPaths  # noqa: PLC0415
    from zeps.replication.election import ReplicationState  # noqa: PLC0415

    core, apps = client.CoreV1Api(kube_api), client.AppsV1Api(kube_api)
    names = [f"roll-broker-{i}" for i in range(3)]
    _offer_volumes(core, namespace, [(f"{namespace}-{name}", f"journal-{name}") for name in names])
    storage = {"size": "1Gi", "storageClassName": ""}
    _apply(crds, namespace, "roll", {"replicas": 3, "storage": storage})
    wait_until(lambda: len(pods := _pods_by_ordinal(core, namespace, "roll")) == 3 and all(map(_ready, pods.values())),
               timeout=120, what="three broker pods Ready (kwok)")  # fmt: skip
    assert apps.read_namespaced_stateful_set("roll-broker", namespace).spec.update_strategy.type == "OnDelete"
    zk = connect(zookeeper_server.connect_string)
    try:
        paths = StreamPaths.of(namespace, "roll", chroot=CHROOT)
        zk.ensure_path(paths.replication_state.rsplit("/", 1)[0])
        state = ReplicationState(3, "roll-broker-1", frozenset(names)).encode()
        if zk.exists(paths.replication_state):
            zk.set(paths.replication_state, state)
        else:
            zk.create(paths.replication_state, state)
        first = {name: pod.metadata.uid for name, pod in _pods_by_ordinal(core, namespace, "roll").items()}
        _apply(
            crds, namespace, "roll", {"replicas": 3, "storage": storage, "resources": {"limits": {"memory": "1536Mi"}}}
        )
        order = _watch_roll(core, namespace, names, first)
        assert order == ["roll-broker-2", "roll-broker-0", "roll-broker-1"], order
        wait_until(lambda: "roll" not in _status(crds, namespace, "roll"), timeout=60, what="status.roll gone")
        assert _cond(crds, namespace, "roll", "Rolling") == ("False", "Current", "every broker pod runs the current "
                                                            "template")  # fmt: skip

        # minInSync 3 of 3: any restart leaves 2 in sync
        _apply(crds, namespace, "roll", {"replicas": 3, "minInSync": 3, "storage": storage,
                                         "resources": {"limits": {"memory": "1Gi"}}})  # fmt: skip
        wait_until(lambda: (_status(crds, namespace, "roll").get("roll") or {}).get("roll-broker", {}).get("blocked")
                   and _cond(crds, namespace, "roll", "Rolling")[:2] == ("True", "Blocked"),
                   timeout=60, what="the roll blocked in status and its Rolling condition")  # fmt: skip
        waiting = _status(crds, namespace, "roll")["roll"]["roll-broker"]["waiting"]
        assert "fewer than minInSync 3" in waiting and waiting in _cond(crds, namespace, "roll", "Rolling")[2]
        first_seen = _roll_blocked_s(operator, namespace)
        assert first_seen is not None
        wait_until(lambda: (_roll_blocked_s(operator, namespace) or 0) > first_seen, timeout=60,
                   what="the blocked roll's seconds growing")  # fmt: skip
        assert {n: p.metadata.uid for n, p in _pods_by_ordinal(core, namespace, "roll").items()} != first
        assert len(_pods_by_ordinal(core, namespace, "roll")) == 3 and not any(
            p.metadata.deletion_timestamp for p in _pods_by_ordinal(core, namespace, "roll").values()
        )
    finally:
        zk.stop()
        zk.close()
        crds.kubectl("delete", "zepsstream", "roll", "-n", namespace, "--timeout=60s", check=False)
        for name in names:
            crds.kubectl("delete", "pv", f"{namespace}-{name}", "--wait=false", check=False)


def _claims(core: Any, namespace: str, names: list[str]) -> dict[str, Any]:
    return {n: core.read_namespaced_persistent_volume_claim(f"journal-{n}", namespace) for n in names}


def test_a_larger_storage_size_grows_the_journal_claims_in_place_and_a_smaller_one_is_refused(
    operator: Any, crds: ControlPlane, namespace: str, kube_api: Any
) -> None:
    """kwok plays the kubelet, and no volume plugin runs here: the claims bind to volumes offered by
    hand, of a StorageClass that allows expansion. A larger ``storage.size`` makes the operator ask
    each claim for it (the StatefulSet's claim template cannot change, and keeps its size: before,
    every pass failed applying it); ``Resizing`` says so until each volume holds it. **Mocked**, as
    no resizer runs here: the volume plugin's answer (the claims' status capacity) and a filesystem
    that grows only unmounted (``FileSystemResizePending`` for longer than kubelet is given to grow
    it online), which the roll answers by restarting that pod; one just asked is left to kubelet. A
    smaller size is refused (volumes never shrink); a StorageClass that cannot expand makes the API
    server refuse the claims' change, said in the condition and an event."""
    core, apps, storage_api = client.CoreV1Api(kube_api), client.AppsV1Api(kube_api), client.StorageV1Api(kube_api)
    names, sc = [f"grow-broker-{i}" for i in range(3)], f"expandable-{namespace}"
    storage_api.create_storage_class(client.V1StorageClass(metadata=client.V1ObjectMeta(name=sc),
                                     provisioner="zeps.test/none", allow_volume_expansion=True))  # fmt: skip
    for name in names:
        core.create_persistent_volume(client.V1PersistentVolume(
            metadata=client.V1ObjectMeta(name=f"{namespace}-{name}"),
            spec=client.V1PersistentVolumeSpec(
                capacity={"storage": "1Gi"}, access_modes=["ReadWriteOnce"], storage_class_name=sc,
                host_path=client.V1HostPathVolumeSource(path=f"/tmp/{namespace}-{name}"),
                claim_ref=client.V1ObjectReference(namespace=namespace, name=f"journal-{name}"))))  # fmt: skip
    resizing = lambda: _cond(crds, namespace, "grow", "Resizing")  # noqa: E731
    try:
        _apply(crds, namespace, "grow", {"replicas": 3, "storage": {"size": "1Gi", "storageClassName": sc}})
        wait_until(lambda: len(c := _claims(core, namespace, names)) == 3 and all(
            p.status.phase == "Bound" for p in c.values()), timeout=120, what="three claims bound")  # fmt: skip
        wait_until(lambda: resizing()[:2] == ("False", "Current"), timeout=60, what="Resizing: Current")

        _apply(crds, namespace, "grow", {"replicas": 3, "storage": {"size": "2Gi", "storageClassName": sc}})
        wait_until(lambda: all(p.spec.resources.requests["storage"] == "2Gi"
                               for p in _claims(core, namespace, names).values()),
                   timeout=60, what="each claim asked for 2Gi")  # fmt: skip
        wait_until(lambda: resizing()[:2] == ("True", "Resizing"), timeout=30, what="Resizing: True")
        template = apps.read_namespaced_stateful_set("grow-broker", namespace).spec.volume_claim_templates[0]
        assert template.spec.resources.requests["storage"] == "1Gi"  # as made: it cannot change
        first = {n: p.metadata.uid for n, p in _pods_by_ordinal(core, namespace, "grow").items()}
        # the volume plugin's part (mocked): each grown; names[1]'s filesystem just asked of kubelet (it
        # grows it online within seconds: no restart), names[2]'s waiting for longer than kubelet is
        # given (it grows only unmounted)
        since = {names[1]: dt.datetime.now(dt.UTC), names[2]: dt.datetime.now(dt.UTC) - dt.timedelta(minutes=10)}
        for name in names:
            status: dict[str, Any] = {"capacity": {"storage": "2Gi"}}
            if name in since:
                status["conditions"] = [{"type": "FileSystemResizePending", "status": "True",
                                         "lastTransitionTime": since[name].strftime("%Y-%m-%dT%H:%M:%SZ")}]  # fmt: skip
            core.patch_namespaced_persistent_volume_claim_status(f"journal-{name}", namespace, {"status": status})
        wait_until(lambda: _pods_by_ordinal(core, namespace, "grow").get(names[2]) is not None
                   and _pods_by_ordinal(core, namespace, "grow")[names[2]].metadata.uid != first[names[2]],
                   timeout=60, what="the pod whose filesystem waits restarted by the roll")  # fmt: skip
        assert {n: p.metadata.uid for n, p in _pods_by_ordinal(core, namespace, "grow").items() if n != names[2]} == {
            n: u for n, u in first.items() if n != names[2]}  # the others run on  # fmt: skip
        for name in since:  # the kubelet's part at the mount (mocked)
            core.patch_namespaced_persistent_volume_claim_status(f"journal-{name}", namespace,
                                                                 {"status": {"conditions": None}})  # fmt: skip
        wait_until(lambda: resizing()[:2] == ("False", "Current"), timeout=60, what="Resizing done")

        _apply(crds, namespace, "grow", {"replicas": 3, "storage": {"size": "1Gi", "storageClassName": sc}})
        wait_until(lambda: resizing()[:2] == ("False", "CannotShrink"), timeout=60, what="a shrink refused")
        assert all(p.spec.resources.requests["storage"] == "2Gi" for p in _claims(core, namespace, names).values())

        storage_api.patch_storage_class(sc, {"allowVolumeExpansion": False})
        _apply(crds, namespace, "grow", {"replicas": 3, "storage": {"size": "3Gi", "storageClassName": sc}})
        wait_until(lambda: resizing()[:2] == ("False", "NotExpandable"), timeout=60, what="growth refused")
        assert "cannot grow in place" in resizing()[2]
        _events(crds, namespace, "NotExpandable", "cannot grow in place")
    finally:
        crds.kubectl("delete", "zepsstream", "grow", "-n", namespace, "--timeout=60s", check=False)
        for name in names:
            crds.kubectl("delete", "pv", f"{namespace}-{name}", "--wait=false", check=False)
        crds.kubectl("delete", "storageclass", sc, "--wait=false", check=False)


def _the_move_is_done(crds: ControlPlane, core: Any, namespace: str) -> None:
    """Stream "mv" after its move of mv-broker-p2-1: the extra replica's claim deleted, the
    annotation removed, Reassigning False, and the ReplicaMoved event."""
    wait_until(lambda: not [c for c in core.list_namespaced_persistent_volume_claim(namespace).items
                            if c.metadata.name == "journal-mv-broker-p2-2" and not c.metadata.deletion_timestamp],
               timeout=60, what="the extra replica's claim deleted")  # fmt: skip
    # the pass that deleted it removes the annotation, then kopf writes its status: a moment later
    wait_until(lambda: "zeps.dev/move-replica" not in (json.loads(crds.kubectl(
                   "get", "zepsstream", "mv", "-n", namespace, "-o", "json"))["metadata"].get("annotations") or {})
               and _cond(crds, namespace, "mv", "Reassigning")[:2] == ("False", "Settled"),
               timeout=30, what="the annotation removed, Reassigning False (Settled)")  # fmt: skip
    _events(crds, namespace, "ReplicaMoved", "mv-broker-p2-1 moved from node")


def _events(crds: ControlPlane, namespace: str, reason: str, text: str) -> str:
    """The events of ``reason`` in ``namespace`` as kubectl lists them, once one says ``text``: kopf posts
    a handler's events from a queue of its own, a moment after the pass that made them."""
    listed = ""

    def said() -> bool:
        nonlocal listed
        listed = crds.kubectl("get", "events", "-n", namespace, "--field-selector", f"reason={reason}")
        return text in listed

    wait_until(said, timeout=30, what=f"a {reason} event saying {text!r}")
    return listed


def _write_state(zk: Any, path: str, state: bytes) -> None:
    """The replication state at ``path``, as the brokers would write it."""
    zk.ensure_path(path.rsplit("/", 1)[0])
    if zk.exists(path):
        zk.set(path, state)
    else:
        zk.create(path, state)


def _a_move_of_no_replica_is_refused(crds: ControlPlane, namespace: str) -> None:
    crds.kubectl("annotate", "zepsstream", "mv", "-n", namespace, "zeps.dev/move-replica=mv-broker-p2-7",
                 "--overwrite")  # fmt: skip
    wait_until(lambda: "is not a replica" in (_status(crds, namespace, "mv").get("move") or {}).get("refused", ""),
               timeout=60, what="a move refused")  # fmt: skip
    assert _cond(crds, namespace, "mv", "Reassigning")[:2] == ("False", "Refused")


def _offer_volumes(core: Any, namespace: str, volumes: list[tuple[str, str]]) -> None:
    """No provisioner without a kubelet: a volume offered to each (volume name, claim name)."""
    for volume, claim in volumes:
        core.create_persistent_volume(client.V1PersistentVolume(
            metadata=client.V1ObjectMeta(name=volume),
            spec=client.V1PersistentVolumeSpec(
                capacity={"storage": "1Gi"}, access_modes=["ReadWriteOnce"], storage_class_name="",
                host_path=client.V1HostPathVolumeSource(path=f"/tmp/{volume}"),
                claim_ref=client.V1ObjectReference(namespace=namespace, name=claim))))  # fmt: skip


def test_a_replica_moved_gets_a_copy_added_first_its_volume_made_again_and_the_copy_removed_last(
    operator: Any, crds: ControlPlane, namespace: str, kube_api: Any, zookeeper_server: ZooKeeperServer
) -> None:
    """``zeps.dev/move-replica`` walked through its phases against the real API server (kwok plays
    the kubelet; the volumes are offered by hand, the moved replica's new one once its new claim
    exists; the replication state is written here as the brokers would hold it, so each phase waits
    until the test says the replicas caught up), on partition 2 of a stream of two replicas: the set
    runs a third replica until it is in sync, then the moved replica's claim and pod are deleted and
    made again (a new claim), then the set goes back to two once the rebuilt replica is in sync, the
    extra claim is deleted, the annotation removed, and an event says the replica moved. No pod is
    rolled: the set's template never changes (its preferred leader is ordinal 2 mod 2 = 0 of the
    replicas wanted, not of those running). The data path runs on kind: e2e/kind/test_operations.py
    (partition 0)."""
    from zeps.coordination import connect  # noqa: PLC0415
    from zeps.paths import StreamPaths  # noqa: PLC0415
    from zeps.replication.election import ReplicationState  # noqa: PLC0415

    core, apps = client.CoreV1Api(kube_api), client.AppsV1Api(kube_api)
    names = [f"mv-broker-p2-{i}" for i in range(3)]
    volumes = [(f"{namespace}-{n}", f"journal-{n}") for n in names]
    _offer_volumes(core, namespace, volumes)
    zk = connect(zookeeper_server.connect_string)
    paths = StreamPaths.of(namespace, "mv", chroot=CHROOT, partition=2)

    def in_sync(*members: str) -> None:
        _write_state(zk, paths.replication_state, ReplicationState(3, names[0], frozenset(members)).encode())

    def move() -> dict[str, Any]:
        return dict(_status(crds, namespace, "mv").get("move") or {})

    def the_set() -> Any:
        return apps.read_namespaced_stateful_set("mv-broker-p2", namespace)

    def pods() -> dict[str, Any]:
        return _pods_by_ordinal(core, namespace, "mv.p2")  # a partition's pods: instance <stream>.p<N>

    storage = {"size": "1Gi", "storageClassName": ""}
    try:
        _apply(crds, namespace, "mv", {"replicas": 2, "partitions": 3, "storage": storage})
        wait_until(lambda: len(p := pods()) == 2 and all(map(_ready, p.values())), timeout=120,
                   what="partition 2's two broker pods Ready (kwok)")  # fmt: skip
        template, leader = the_set().spec.template.to_dict(), pods()[names[0]].metadata.uid
        in_sync(*names[:2])
        first = core.read_namespaced_persistent_volume_claim(f"journal-{names[1]}", namespace)
        old_claim, old_volume = first.metadata.uid, first.spec.volume_name
        crds.kubectl("annotate", "zepsstream", "mv", "-n", namespace, f"zeps.dev/move-replica={names[1]}")
        wait_until(lambda: the_set().spec.replicas == 3 and move().get("phase") == "adding", timeout=60,
                   what="a third replica added, the move adding")  # fmt: skip
        assert f"{names[2]}, the extra copy, to catch up" in move()["waiting"]
        assert _cond(crds, namespace, "mv", "Reassigning")[:2] == ("True", "Moving")
        claim = core.read_namespaced_persistent_volume_claim(f"journal-{names[1]}", namespace)
        assert claim.metadata.uid == old_claim and claim.metadata.deletion_timestamp is None, "deleted too soon"

        in_sync(names[0], names[2], names[1])  # the copy caught up
        wait_until(lambda: move().get("phase") == "settling", timeout=90, what="the moved replica rebuilt")
        rebuilt = lambda: core.read_namespaced_persistent_volume_claim(f"journal-{names[1]}", namespace)  # noqa: E731
        assert rebuilt().metadata.uid != old_claim and old_volume
        new_volume = (f"{namespace}-mv-1-new", f"journal-{names[1]}")  # offered now: the only one it can take
        volumes.append(new_volume)
        _offer_volumes(core, namespace, [new_volume])
        wait_until(lambda: rebuilt().spec.volume_name == new_volume[0], timeout=60,
                   what="the new claim bound to a new volume")  # fmt: skip
        in_sync(names[0], names[2])  # as the brokers would say: it is catching up
        assert the_set().spec.replicas == 3 and move().get("phase") == "settling", "the copy stays until it caught up"
        in_sync(*names)
        wait_until(lambda: not move() and the_set().spec.replicas == 2, timeout=90,
                   what="the move done, two replicas again")  # fmt: skip
        _the_move_is_done(crds, core, namespace)
        # no roll: the template as it was, the replica that stayed never restarted
        assert (the_set().spec.template.to_dict(), pods()[names[0]].metadata.uid) == (template, leader)

        _a_move_of_no_replica_is_refused(crds, namespace)
    finally:
        zk.stop()
        zk.close()
        crds.kubectl("delete", "zepsstream", "mv", "-n", namespace, "--wait=false", check=False)
        for volume, _ in volumes:
            crds.kubectl("delete", "pv", volume, "--wait=false", check=False)

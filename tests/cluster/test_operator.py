"""The operator (kopf) reconciling real resources on the real API server, into a real ZooKeeper.

There is no kubelet: kwok reports the broker's pod Running, and the broker itself is started here
from the Deployment's own pod template (command and environment) as a local process.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kazoo.client import KazooClient
from kubernetes import client
from prometheus_client.parser import text_string_to_metric_families

from harness import TEST_JVM_FLAGS, ZooKeeperHarness
from zeps.broker.certificates import public_key_of
from zeps.client import StreamClient
from zeps.coordination import Topic, connect
from zeps_dev import ControlPlane, OperatorProcess, ZooKeeperServer
from zeps_dev.process import ManagedProcess, free_port, wait_until
from zeps_dev.tls import certificates
from zeps_operator.curve import CURVE_SECRET

CHROOT = "/operator-tests"


def _apply(plane: ControlPlane, namespace: str, kind: str, name: str, spec: dict[str, Any] | None = None) -> None:
    body = {"apiVersion": "zeps.dev/v1alpha1", "kind": kind, "metadata": {"name": name}, "spec": spec or {}}
    plane.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(body))


def _get(plane: ControlPlane, namespace: str, kind: str, name: str) -> dict[str, Any]:
    return json.loads(plane.kubectl("get", kind, name, "-n", namespace, "-o", "json"))  # type: ignore[no-any-return]


def _wait_ready(plane: ControlPlane, namespace: str, kind: str, name: str, timeout: int = 60) -> None:
    plane.kubectl("wait", "--for=condition=Ready", f"{kind}/{name}", "-n", namespace, f"--timeout={timeout}s")


def _zk(zookeeper: ZooKeeperHarness) -> KazooClient:
    return zookeeper.client()


def test_topic_lifecycle_ready_update_drift_and_delete(
    operator: OperatorProcess, crds: ControlPlane, namespace: str, zookeeper: ZooKeeperHarness, kube_api: Any
) -> None:
    zk = _zk(zookeeper)
    root = f"{CHROOT}/{namespace}/topics/cache"
    _apply(crds, namespace, "Topic", "cache", {"maxQueueDepth": 500})
    _wait_ready(crds, namespace, "topic", "cache")
    for child in ("clients", "subscribers", "messages"):
        assert zk.exists(f"{root}/{child}") is not None
    spec_node = json.loads(zk.get(f"{root}/spec")[0])
    assert spec_node["spec"]["maxQueueDepth"] == 500 and spec_node["formatVersion"] == 1
    status = _get(crds, namespace, "topic", "cache")["status"]
    assert status["observedGeneration"] == 1 and status["path"] == root
    wait_until(
        lambda: _get(crds, namespace, "topic", "cache")["status"].get("cleanerHolder") == "zeps-operator-test",
        timeout=30,
        what="the cleaner Lease to be held",
    )
    # one Lease for the installation (in the operator's namespace: "default" for a local process), none per Topic
    lease = client.CoordinationV1Api(kube_api).read_namespaced_lease("zeps-operator-cleaner", "default")
    assert lease.spec is not None and lease.spec.holder_identity == "zeps-operator-test"
    assert not client.CoordinationV1Api(kube_api).list_namespaced_lease(namespace).items

    _apply(crds, namespace, "Topic", "cache", {"maxQueueDepth": 900})  # update
    wait_until(
        lambda: _get(crds, namespace, "topic", "cache")["status"].get("observedGeneration") == 2,
        timeout=30,
        what="observedGeneration to follow",
    )
    assert json.loads(zk.get(f"{root}/spec")[0])["spec"]["maxQueueDepth"] == 900

    zk.delete(f"{root}/messages", recursive=True)  # drift behind the operator's back
    wait_until(lambda: zk.exists(f"{root}/messages") is not None, timeout=30, what="the path to be restored")

    def drift_events() -> list[dict[str, Any]]:  # posted by the resync pass that restored it
        listed = crds.kubectl(
            "get", "events", "-n", namespace, "--field-selector", "reason=DriftRepaired", "-o", "json"
        )
        return list(json.loads(listed)["items"])

    wait_until(lambda: bool(drift_events()), timeout=15, what="the DriftRepaired event")
    (event,) = drift_events()
    assert event["type"] == "Warning" and f"{root}/messages" in event["message"]

    crds.kubectl("delete", "topic", "cache", "-n", namespace, "--timeout=60s")
    assert zk.exists(root) is None, "deletionPolicy Delete removes the subtree"


def test_a_new_stream_is_no_drift_and_a_path_removed_later_is(
    operator: OperatorProcess, crds: ControlPlane, namespace: str, zookeeper: ZooKeeperHarness
) -> None:
    """A ZepsStream's first pass makes its paths: that is no drift. Before, every new stream posted a
    DriftRepaired warning naming them (and counted towards the ZepsDriftRepaired alert). A path
    removed behind the operator's back later is drift: restored, and said so."""
    _apply(crds, namespace, "ZepsStream", "fresh", {})
    wait_until(lambda: _get(crds, namespace, "ZepsStream", "fresh").get("status", {}).get("observedGeneration") == 1,
               timeout=30, what="the stream reconciled")  # fmt: skip

    def drift() -> list[str]:
        listed = crds.kubectl("get", "events", "-n", namespace, "--field-selector", "reason=DriftRepaired",
                              "-o", "json")  # fmt: skip
        return [e["message"] for e in json.loads(listed)["items"]]

    root = f"{CHROOT}/{namespace}/streams/fresh"
    assert drift() == []
    zk = zookeeper.client()
    zk.delete(f"{root}/spec")
    crds.kubectl("annotate", "zepsstream", "fresh", "-n", namespace, "touch=1")  # a pass now, not at the timer
    wait_until(lambda: any(f"{root}/spec" in m for m in drift()), timeout=30, what="the DriftRepaired event")
    crds.kubectl("delete", "zepsstream", "fresh", "-n", namespace, "--timeout=60s")


def test_paths_removed_while_a_topic_shows_not_ready_are_reported_as_drift_when_restored(
    operator: OperatorProcess, crds: ControlPlane, namespace: str, zookeeper: ZooKeeperHarness, kube_api: Any
) -> None:
    """A resync pass during a ZooKeeper outage marks a Topic not Ready (ZooKeeperUnavailable); a path
    removed meanwhile is restored by the pass after the outage, and that is drift too: the
    DriftRepaired event is posted, and the Topic is Ready again. (The outage is stood in for by writing
    that status, so the order of the two is certain; passes had skipped the event for an object not
    Ready, and CI saw an expired session lose it so.)"""
    zk = _zk(zookeeper)
    root = f"{CHROOT}/{namespace}/topics/outage"
    _apply(crds, namespace, "Topic", "outage", {"noSubscribers": "ignore"})
    _wait_ready(crds, namespace, "topic", "outage")
    conditions = _get(crds, namespace, "topic", "outage")["status"]["conditions"]
    down = [
        {**c, "status": "False", "reason": "ZooKeeperUnavailable", "message": "ZooKeeper is not reachable"}
        if c["type"] == "Ready"
        else c
        for c in conditions
    ]
    custom = client.CustomObjectsApi(kube_api)
    zk.delete(f"{root}/messages", recursive=True)
    custom.patch_namespaced_custom_object_status(
        "zeps.dev", "v1alpha1", namespace, "topics", "outage", {"status": {"conditions": down}}
    )
    wait_until(lambda: zk.exists(f"{root}/messages") is not None, timeout=30, what="the path to be restored")

    def drift_events() -> list[dict[str, Any]]:
        listed = crds.kubectl(
            "get", "events", "-n", namespace, "--field-selector", "reason=DriftRepaired", "-o", "json"
        )
        return list(json.loads(listed)["items"])

    wait_until(lambda: bool(drift_events()), timeout=15, what="the DriftRepaired event")
    assert f"{root}/messages" in drift_events()[0]["message"]
    _wait_ready(crds, namespace, "topic", "outage", timeout=15)
    crds.kubectl("delete", "topic", "outage", "-n", namespace, "--timeout=60s")


def test_the_operator_cleaner_removes_a_vanished_consumers_queue_after_its_grace(
    operator: OperatorProcess, crds: ControlPlane, namespace: str, zookeeper: ZooKeeperHarness
) -> None:
    """The operator's cleaner passes (driven by the clients watch; the resync's sweep every 3 s here). A
    queue goes once its consumer has been gone for cleanerGrace, counted across passes; a live consumer's queue
    stays. (Each pass once started a fresh cleaner that forgot when it first missed the consumer, so
    with any grace above zero nothing was ever removed.)"""
    zk = _zk(zookeeper)
    _apply(crds, namespace, "Topic", "jobs", {"cleanerGrace": 4, "noSubscribers": "ignore"})
    _wait_ready(crds, namespace, "topic", "jobs")
    topic = Topic(zk, "jobs", namespace=namespace, chroot=CHROOT)
    staying = topic.subscribe(lambda _m: None, consumer_id="staying")
    leaving = topic.subscribe(lambda _m: None, consumer_id="leaving")
    try:
        topic.publish(b"kept for whoever comes back")
        leaving.close()  # leaves the group; the queue stays for a restart within the grace
        left = time.monotonic()
        wait_until(lambda: zk.exists(topic.paths.queue("leaving")) is None, timeout=60, what="the cleaner")
        assert time.monotonic() - left >= 4, "removed before its cleanerGrace was up"
        assert zk.exists(topic.paths.queue("staying")) is not None

        def cleaned_event() -> bool:  # posted by the next resync pass (3 s here) for the queues removed since
            events = crds.kubectl("get", "events", "-n", namespace, "--field-selector", "reason=Cleaned", "-o", "json")
            return any("leaving" in e["message"] for e in json.loads(events)["items"])

        wait_until(cleaned_event, timeout=15, what="the Cleaned event")
        removed = [s.value for f in text_string_to_metric_families(operator.metrics()) for s in f.samples
                   if s.name == "zeps_topic_queues_removed_total"
                   and s.labels.get("namespace") == namespace]  # fmt: skip
        assert removed == [1.0]
    finally:
        staying.close()
        leaving.close()


def test_retain_keeps_the_data(
    operator: OperatorProcess, crds: ControlPlane, namespace: str, zookeeper: ZooKeeperHarness
) -> None:
    zk = _zk(zookeeper)
    _apply(crds, namespace, "Queue", "jobs", {"deletionPolicy": "Retain", "maxAttempts": 3})
    _wait_ready(crds, namespace, "queue", "jobs")
    root = f"{CHROOT}/{namespace}/queues/jobs"
    zk.create(f"{root}/items/i-100-x-", b"work", sequence=True)
    wait_until(
        lambda: _get(crds, namespace, "queue", "jobs")["status"].get("depth") == 1,
        timeout=30,
        what="queue depth in status",
    )
    crds.kubectl("delete", "queue", "jobs", "-n", namespace, "--timeout=60s")
    assert zk.get_children(f"{root}/items"), "deletionPolicy Retain keeps the items"
    _apply(crds, namespace, "Queue", "jobs", {"maxAttempts": 3})  # the same name again adopts the data
    _wait_ready(crds, namespace, "queue", "jobs")
    assert len(zk.get_children(f"{root}/items")) == 1


@dataclass
class Solo:
    """A stack of its own: ZooKeeper, a control plane and an operator with a 1 s resync, for the tests
    that stop or freeze ZooKeeper or count every request the API server saw. The operator reaches
    ZooKeeper over TLS, as the chart's does with values-production.yaml (``ca``: the servers' CA
    file); the tests' own clients use the server's plain port, on 127.0.0.1."""

    zk: ZooKeeperServer
    plane: ControlPlane
    operator: OperatorProcess
    ca: Path


@pytest.fixture(scope="module")
def solo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Solo]:
    tmp = tmp_path_factory.mktemp("solo")
    tls = certificates(tmp / "tls")
    with ZooKeeperServer(tmp / "zk", tls=tls, jvm_flags=list(TEST_JVM_FLAGS)) as zk, ControlPlane(tmp / "cp") as plane:
        plane.kubectl("apply", "-f", str(Path(__file__).resolve().parents[2] / "crds"))
        plane.kubectl("wait", "--for=condition=Established", "crd/topics.zeps.dev", "--timeout=60s")
        with OperatorProcess(
            tmp / "op",
            kubeconfig=plane.kubeconfig,
            zookeeper=zk.secure_connect_string,
            zookeeper_ca=str(tls / "ca.crt"),
            resync_seconds=1,
            delete_retries=3,
            identity="solo-first",
            cleaner_lease_seconds=3,
        ) as operator:
            yield Solo(zk, plane, operator, tls / "ca.crt")


def _ready_and_resynced(plane: ControlPlane, name: str, spec: dict[str, Any] | None = None) -> None:
    _apply(plane, "default", "Topic", name, spec)
    _wait_ready(plane, "default", "topic", name)
    wait_until(
        lambda: bool(_get(plane, "default", "topic", name)["status"].get("cleanerHolder")),
        timeout=30,
        what="the resync timer to have run",
    )


def _resync_passes(operator: OperatorProcess) -> int:
    """Resync passes the operator has completed (its zeps_operator_resync_passes_total)."""
    for family in text_string_to_metric_families(operator.metrics()):
        if family.name == "zeps_operator_resync_passes":
            return int(family.samples[0].value)
    raise AssertionError("the operator exports no zeps_operator_resync_passes_total")


def _after_passes(operator: OperatorProcess, count: int, what: str) -> int:
    """Wait until the operator has made ``count`` more resync passes (a pass starts 1 s after the one
    before ends: the time passes on the operator's clock, however slow the machine); returns the total."""
    target = _resync_passes(operator) + count
    wait_until(lambda: _resync_passes(operator) >= target, timeout=30 + 5 * count, what=what)
    return _resync_passes(operator)


def test_an_idle_resync_makes_no_status_write_and_reads_the_namespace_secret_once_per_pass(solo: Solo) -> None:
    """With nothing changing, the 1 s resync passes of five Topics find every status field as it is and
    send no PATCH at all (kopf sends no empty patch), read the namespace's credentials Secret about once
    per interval for all five, not once per Topic, and touch no Lease: the installation's one cleaner
    Lease is renewed every third of its duration (1 s here), whatever the number of Topics."""
    names = [f"idle-{i}" for i in range(5)]
    for name in names:
        _ready_and_resynced(solo.plane, name)
    first = _after_passes(solo.operator, 2, "the first passes over the five Topics")  # they wrote what they found
    started = time.monotonic()
    counts = solo.plane.request_counts()
    before = {kind: counts.get(f"{verb} {kind}", 0) for kind, verb in IDLE_COUNTED}
    last = _after_passes(solo.operator, 5, "five resync passes of each Topic")
    counts = solo.plane.request_counts()
    after = {kind: counts.get(f"{verb} {kind}", 0) for kind, verb in IDLE_COUNTED}
    # the counters were read somewhere inside this window (a read of /metrics takes a while under load);
    # passes counted, and the Lease's renewals at most one per second of wall time
    passes, intervals = last - first, time.monotonic() - started
    assert after["topics"] == before["topics"]  # no PATCH
    secrets = after["secrets"] - before["secrets"]
    assert 3 <= secrets <= passes + 2, f"{secrets} reads in {passes} passes"  # per pass, not per Topic
    leases = after["leases"] - before["leases"]
    assert leases <= intervals + 2, f"{leases} writes in {intervals:.1f}s"  # renewals of the one Lease only
    for name in names:
        solo.plane.kubectl("delete", "topic", name, "-n", "default", "--timeout=30s")


def _events(plane: ControlPlane, name: str, reason: str, *, namespace: str = "default") -> int:
    """How many times the operator reported ``reason`` about Topic ``name`` (an event's count included)."""
    listed = json.loads(plane.kubectl("get", "events", "-n", namespace, "-o", "json"))["items"]
    return sum(
        e.get("count") or 1
        for e in listed
        if e["involvedObject"].get("kind") == "Topic" and e["involvedObject"]["name"] == name and e["reason"] == reason
    )


def test_events_are_posted_on_transitions_only(solo: Solo) -> None:
    """One Reconciled event when a Topic becomes Ready, one when a change is reconciled, and none
    when the operator restarts and resumes an object already Ready at its generation (a restart
    used to post one per object: 10,000 events for 10,000 Topics) or when a resync finds it as is."""
    _ready_and_resynced(solo.plane, "eventful")
    wait_until(lambda: _events(solo.plane, "eventful", "Reconciled") == 1, timeout=15, what="the first event")
    log = solo.operator.process.log_path
    resumed_before = log.read_text().count("Handler 'topic_changed' succeeded")
    solo.operator.stop()
    solo.operator.start()
    wait_until(
        lambda: log.read_text().count("Handler 'topic_changed' succeeded") > resumed_before,
        timeout=30,
        what="the restarted operator to resume the Topic",
    )
    _after_passes(solo.operator, 3, "three resync passes of the resumed operator")
    assert _events(solo.plane, "eventful", "Reconciled") == 1, "a resume or a resync posted an event"
    _apply(solo.plane, "default", "Topic", "eventful", {"cleanerGrace": 7})
    wait_until(lambda: _events(solo.plane, "eventful", "Reconciled") == 2, timeout=15, what="the change's event")
    solo.plane.kubectl("delete", "topic", "eventful", "-n", "default", "--timeout=30s")


LAST_HANDLED = "kopf.zalando.org/last-handled-configuration"  # where kopf kept it by default


def test_a_new_topic_costs_two_patches_and_kopf_keeps_its_bookkeeping_in_status(solo: Solo) -> None:
    """The finalizer, then one PATCH of the status subresource carrying both the handler's status and
    kopf's last-handled configuration (in an annotation, that was a third PATCH)."""
    before = solo.plane.request_counts().get("PATCH topics", 0)
    _apply(solo.plane, "default", "Topic", "frugal")
    _wait_ready(solo.plane, "default", "topic", "frugal")
    _after_passes(solo.operator, 2, "two resync passes over the new Topic")  # they find nothing to write
    assert solo.plane.request_counts().get("PATCH topics", 0) - before == 2
    topic = _get(solo.plane, "default", "topic", "frugal")
    assert LAST_HANDLED not in topic["metadata"].get("annotations", {})
    assert json.loads(topic["status"]["kopf"]["last-handled-configuration"])["spec"]["maxQueueDepth"] == 10000
    solo.plane.kubectl("delete", "topic", "frugal", "-n", "default", "--timeout=30s")


def test_the_annotation_of_an_earlier_operator_is_read_then_removed(solo: Solo) -> None:
    """A Topic last handled by an operator that kept its configuration in the annotation (here at
    maxQueueDepth 10): the new operator reads it, so the Topic is handled as an update (without it, as
    a creation), and moves it into the status."""
    earlier = {"spec": {"maxQueueDepth": 10}}
    body = {
        "apiVersion": "zeps.dev/v1alpha1",
        "kind": "Topic",
        "metadata": {"name": "inherited", "annotations": {LAST_HANDLED: json.dumps(earlier)}},
        "spec": {"maxQueueDepth": 20},
    }
    solo.plane.kubectl("apply", "-n", "default", "-f", "-", input=json.dumps(body))
    _wait_ready(solo.plane, "default", "topic", "inherited")
    wait_until(
        lambda: (
            LAST_HANDLED not in _get(solo.plane, "default", "topic", "inherited")["metadata"].get("annotations", {})
        ),
        timeout=15,
        what="the earlier operator's annotation to be removed",
    )
    log = solo.operator.process.log_path.read_text(errors="replace")
    assert "[default/inherited] Updating is processed" in log
    assert "[default/inherited] Creation is processed" not in log
    status = _get(solo.plane, "default", "topic", "inherited")["status"]
    assert json.loads(status["kopf"]["last-handled-configuration"])["spec"]["maxQueueDepth"] == 20
    solo.plane.kubectl("delete", "topic", "inherited", "-n", "default", "--timeout=30s")


IDLE_COUNTED = (("topics", "PATCH"), ("secrets", "GET"), ("leases", "PUT"))


def _replica(solo: Solo, tmp_path: Path, identity: str, *, resync_seconds: float) -> OperatorProcess:
    """Another operator replica on the solo stack (not started), with the same 3 s cleaner Lease."""
    return OperatorProcess(
        tmp_path / identity,
        kubeconfig=solo.plane.kubeconfig,
        zookeeper=solo.zk.secure_connect_string,
        zookeeper_ca=str(solo.ca),
        resync_seconds=resync_seconds,
        identity=identity,
        cleaner_lease_seconds=3,
    )


def test_another_replica_takes_over_cleaning_when_the_lease_holder_dies(solo: Solo, tmp_path: Path) -> None:
    """Two operator replicas (both reconcile; the Lease holder cleans). The holder is killed with
    SIGKILL, so it cannot give the Lease up: the other takes it once the 3 s duration has passed, says
    so in the Topic's status, and removes a vanished consumer's queue. The first replica comes back
    and the second stops; the second gives the Lease up as it stops, so the first leads again at once."""
    _ready_and_resynced(solo.plane, "handover", {"cleanerGrace": 1, "noSubscribers": "ignore"})
    assert _lease_holder(solo.plane) == "solo-first"
    second = _replica(solo, tmp_path, "solo-second", resync_seconds=1)
    zk = KazooClient(hosts=solo.zk.connect_string, timeout=10)
    zk.start(timeout=10)
    topic = Topic(zk, "handover", namespace="default")
    try:
        second.start()
        _after_passes(second, 2, "the second replica's first passes")  # up, and trying the Lease: held
        assert _lease_holder(solo.plane) == "solo-first"
        solo.operator.process.kill()
        wait_until(lambda: _lease_holder(solo.plane) == "solo-second", timeout=20, what="the second replica to lead")
        wait_until(
            lambda: _get(solo.plane, "default", "topic", "handover")["status"].get("cleanerHolder") == "solo-second",
            timeout=20,
            what="the Topic to name the new cleaner",
        )
        leaving = topic.subscribe(lambda _m: None, consumer_id="leaving")
        leaving.close()  # its queue stays, for the cleaner to remove once the grace is up
        wait_until(lambda: zk.exists(topic.paths.queue("leaving")) is None, timeout=30, what="the new leader to clean")
        solo.operator.start()
    finally:
        second.stop()
        if not solo.operator.process.running():  # for the tests after this one
            solo.operator.start()
        topic.close()
        zk.stop()
        zk.close()
    wait_until(lambda: _lease_holder(solo.plane) == "solo-first", timeout=10, what="the first replica to lead again")
    solo.plane.kubectl("delete", "topic", "handover", "-n", "default", "--timeout=30s")


def test_cleaning_is_driven_by_the_clients_watch_not_the_resync(solo: Solo, tmp_path: Path) -> None:
    """An operator with a 120 s resync (its first pass over a Topic only after 20 s idle): a consumer's
    queue is removed once its 1 s grace is up, within 15 s, because the watch on the Topic's live
    clients scheduled the pass."""
    solo.operator.stop()  # gives the Lease up: the slow replica leads at once
    slow = _replica(solo, tmp_path, "solo-slow", resync_seconds=120)
    zk = KazooClient(hosts=solo.zk.connect_string, timeout=10)
    zk.start(timeout=10)
    topic = Topic(zk, "watched", namespace="default")
    try:
        slow.start()
        wait_until(lambda: _lease_holder(solo.plane) == "solo-slow", timeout=20, what="the slow replica to lead")
        _apply(solo.plane, "default", "Topic", "watched", {"cleanerGrace": 1, "noSubscribers": "ignore"})
        _wait_ready(solo.plane, "default", "topic", "watched")
        leaving = topic.subscribe(lambda _m: None, consumer_id="leaving")
        leaving.close()  # its client node goes at once; its queue stays until the grace is up
        closed = time.monotonic()
        wait_until(lambda: zk.exists(topic.paths.queue("leaving")) is None, timeout=15, what="the queue to go")
        print(f"\n[cleaning] queue removed {time.monotonic() - closed:.1f}s after its consumer left (grace 1 s)")
        # The resync passes only objects unchanged for a sixth of its interval (20 s here): within the
        # 15 s waited for above, no resync pass can have run on this Topic; the watch did it.
    finally:
        slow.stop()
        topic.close()
        zk.stop()
        zk.close()
        solo.operator.start()
    wait_until(lambda: _lease_holder(solo.plane) == "solo-first", timeout=20, what="the first replica to lead again")
    solo.plane.kubectl("delete", "topic", "watched", "-n", "default", "--timeout=30s")


def test_after_losing_its_zookeeper_session_the_operator_resyncs_and_repairs(solo: Solo) -> None:
    """The operator is frozen (SIGSTOP) for 16 s, past its 10 s ZooKeeper session timeout, so the
    server expires its session. Meanwhile a Topic's messages path is removed behind its back. Thawed,
    the operator finds its session expired and opens a new one; its resync restores the path (with
    the DriftRepaired event) and the Topic is Ready again."""
    _ready_and_resynced(solo.plane, "expiry", {"noSubscribers": "ignore"})
    zk = KazooClient(hosts=solo.zk.connect_string, timeout=10)
    zk.start(timeout=10)
    messages = Topic(zk, "expiry", namespace="default").paths.messages
    pid = solo.operator.process.pid
    assert pid is not None
    log = solo.operator.process.log_path
    expired_before = log.read_text(errors="replace").count("Session has expired")
    try:
        os.kill(pid, signal.SIGSTOP)
        try:
            time.sleep(16)  # the fault: the operator frozen past its session timeout (10 s)
            zk.delete(messages, recursive=True)
        finally:
            os.kill(pid, signal.SIGCONT)
        wait_until(
            lambda: log.read_text(errors="replace").count("Session has expired") > expired_before,
            timeout=20,
            what="the operator to find its session expired",
        )
        wait_until(lambda: zk.exists(messages) is not None, timeout=30, what="the path to be restored")
        wait_until(lambda: _events(solo.plane, "expiry", "DriftRepaired") >= 1, timeout=15, what="the event")
        # The pass that posts the event patches the status only as it ends, and a pass run while the
        # session was being renewed marked the Topic not Ready (ZooKeeperUnavailable): wait for Ready.
        _wait_ready(solo.plane, "default", "topic", "expiry", timeout=15)
    finally:
        zk.stop()
        zk.close()
    solo.plane.kubectl("delete", "topic", "expiry", "-n", "default", "--timeout=30s")


def _lease_holder(plane: ControlPlane) -> str:
    lease = json.loads(plane.kubectl("get", "lease", "zeps-operator-cleaner", "-n", "default", "-o", "json"))
    return str(lease.get("spec", {}).get("holderIdentity") or "")


def test_a_deletion_that_catches_a_resync_pass_mid_run_is_released_promptly(solo: Solo) -> None:
    """ZooKeeper is frozen (SIGSTOP, as in a long GC pause) so a resync pass is blocked in a ZooKeeper
    call when the Topic is deleted. The deletion handler waits for that pass to end (so the pass cannot
    create the paths again after them being removed) and the finalizer must go soon after. (With a kopf
    timer per object, kopf looked again at a timer still running only every ``cancellation_polling``
    seconds, 60 by default: CI saw ``kubectl delete`` time out so.)"""
    # Retain: the deletion handler itself needs no ZooKeeper once the pass has ended
    _ready_and_resynced(solo.plane, "busy", {"deletionPolicy": "Retain"})
    # the operator is shared by this module's tests, and an earlier one expires its session on purpose
    log_path = solo.operator.process.log_path
    log_start = len(log_path.read_bytes())
    # a pass runs every ~1 s; 1.5 s into the freeze it is waiting on ZooKeeper. The freeze stays
    # under a third of the 10 s session timeout, so the operator's connection is not dropped.
    with solo.zk.paused():
        time.sleep(1.5)  # the fault's timing (above): a pass is waiting on ZooKeeper now
        solo.plane.kubectl("delete", "topic", "busy", "-n", "default", "--wait=false")
        time.sleep(1.0)  # the deletion arrives while ZooKeeper is still frozen
    solo.plane.kubectl("wait", "--for=delete", "topic/busy", "-n", "default", "--timeout=30s")
    log = log_path.read_bytes()[log_start:].decode(errors="replace")
    assert "Connection dropped" not in log, "the freeze was meant to stay within kazoo's heartbeat"


def test_the_finalizer_is_released_when_zookeeper_is_down(solo: Solo) -> None:
    """With ZooKeeper down, the finalizer gives up after its bounded retries and the object goes."""
    _apply(solo.plane, "default", "Topic", "doomed")
    _wait_ready(solo.plane, "default", "topic", "doomed")
    solo.zk.stop()
    try:
        solo.plane.kubectl("delete", "topic", "doomed", "-n", "default", "--timeout=90s")  # returns once released
        events = solo.plane.kubectl("get", "events", "-n", "default", "--field-selector", "reason=CleanupSkipped")
        assert "doomed" in events or "CleanupSkipped" in events
    finally:
        solo.zk.start()


def test_an_operator_over_tls_hands_the_ca_to_the_sdk_and_the_brokers(
    solo: Solo, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The operator reaches ZooKeeper over TLS only (its ZEPS_ZOOKEEPER is the TLS port): each object's
    status gives that address and the CA's PEM, so an SDK handle resolved from the status alone works;
    a stream's broker ConfigMap carries the CA for the brokers' own sessions."""
    import zeps  # noqa: PLC0415

    pem = solo.ca.read_text().strip()
    _apply(solo.plane, "default", "Queue", "tls-jobs")
    _wait_ready(solo.plane, "default", "queue", "tls-jobs")
    status = _get(solo.plane, "default", "queue", "tls-jobs")["status"]
    assert (status["zookeeper"], status["zookeeperCA"]) == (solo.zk.secure_connect_string, pem)
    for var in ("ZEPS_ZOOKEEPER", "ZEPS_ZOOKEEPER_CA", "ZEPS_CHROOT", "ZEPS_NAMESPACE", "KUBERNETES_SERVICE_HOST"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("KUBECONFIG", str(solo.plane.kubeconfig))
    jobs = zeps.queue("tls-jobs", namespace="default")
    assert jobs.settings.zookeeper_ca == pem
    jobs.put(b"resolved from the status, over TLS")
    item = jobs.take(timeout=10)
    assert item is not None and item.body == b"resolved from the status, over TLS"
    item.ack()
    _apply(solo.plane, "default", "ZepsStream", "tls-prices")
    wait_until(lambda: "tls-prices-broker" in solo.plane.kubectl("get", "configmaps", "-n", "default", "-o", "name"),
               timeout=30, what="the broker's ConfigMap")  # fmt: skip
    config = json.loads(solo.plane.kubectl("get", "configmap", "tls-prices-broker", "-n", "default", "-o", "json"))
    assert config["data"]["ZEPS_BROKER_ZOOKEEPER"] == solo.zk.secure_connect_string
    assert config["data"]["ZEPS_BROKER_ZOOKEEPER_CA"].strip() == pem
    for kind, name in (("zepsstream", "tls-prices"), ("queue", "tls-jobs")):
        solo.plane.kubectl("delete", kind, name, "-n", "default", "--timeout=60s")


def test_zepsstream_broker_objects_and_a_runnable_pod_template(
    operator: OperatorProcess, crds: ControlPlane, namespace: str, tmp_path: Path, kube_api: Any
) -> None:
    core = client.CoreV1Api(kube_api)
    pv = client.V1PersistentVolume(  # no provisioner without kubelet: offer a volume to bind
        metadata=client.V1ObjectMeta(name=f"journal-{namespace}"),
        spec=client.V1PersistentVolumeSpec(
            capacity={"storage": "1Gi"},
            access_modes=["ReadWriteOnce"],
            host_path=client.V1HostPathVolumeSource(path=str(tmp_path / "pv")),
            storage_class_name="",
            # for this claim only: an unclaimed volume goes to whichever claim of its class comes first
            claim_ref=client.V1ObjectReference(namespace=namespace, name="prices-journal"),
        ),
    )
    core.create_persistent_volume(pv)
    try:
        _apply(
            crds,
            namespace,
            "ZepsStream",
            "prices",
            {"storage": {"size": "1Gi", "storageClassName": ""}, "fsync": "always"},
        )
        apps = client.AppsV1Api(kube_api)
        wait_until(
            lambda: (
                bool(apps.list_namespaced_deployment(namespace).items)
                and bool(core.list_namespaced_service(namespace).items)
            ),
            timeout=60,
            what="the Deployment and the Service",
        )  # applied one after the other
        deployment = apps.read_namespaced_deployment("prices-broker", namespace)
        assert deployment.spec is not None and deployment.spec.strategy is not None
        assert deployment.spec.strategy.type == "Recreate" and deployment.spec.replicas == 1
        pod = deployment.spec.template.spec
        assert pod is not None and pod.security_context is not None and pod.security_context.run_as_non_root
        container = pod.containers[0]
        assert container.security_context is not None and container.security_context.read_only_root_filesystem
        assert container.readiness_probe is not None and container.liveness_probe is not None
        assert deployment.metadata is not None and deployment.metadata.owner_references
        assert core.read_namespaced_service("prices-broker", namespace).spec is not None

        # The pod template, run as a local process: its command, and its environment from the ConfigMap.
        config = core.read_namespaced_config_map("prices-broker", namespace).data or {}
        port = free_port()
        env = {
            **os.environ,
            **config,
            "ZEPS_BROKER_BIND": f"tcp://127.0.0.1:{port}",
            "ZEPS_BROKER_ADVERTISE": f"tcp://127.0.0.1:{port}",
            "ZEPS_BROKER_DATA_DIR": str(tmp_path / "journal"),
            "ZEPS_BROKER_METRICS_PORT": str(free_port()),
            "POD_NAME": "prices-broker-0",
        }
        command = [os.path.join(os.path.dirname(os.sys.executable), container.command[0]), *(container.args or [])]  # type: ignore[attr-defined, index]
        broker = ManagedProcess("broker-from-pod-template", command, log_path=tmp_path / "broker.log", env=env)
        broker.start()
        try:
            _wait_ready(crds, namespace, "zepsstream", "prices", timeout=90)
            status = _get(crds, namespace, "zepsstream", "prices")["status"]
            # the endpoint is the operator's word (its Service), not what the member node in ZooKeeper says
            assert status["brokerReady"] is True and status["endpoint"] == f"tcp://prices-broker.{namespace}.svc:5555"
            with StreamClient(f"tcp://127.0.0.1:{port}", "prices") as c:  # no cluster DNS here: the local broker
                c.start("", since="earliest")
                c.publish("eu.fr", b"through the operator's broker")
                message = c.receive(10)
            assert message is not None and message.body == b"through the operator's broker"
            wait_until(
                lambda: _get(crds, namespace, "zepsstream", "prices")["status"].get("lastSequence") == 1,
                timeout=40,
                what="the broker's live facts in status",
            )
            assert _get(crds, namespace, "zepsstream", "prices")["status"]["journalBytes"] > 0
        finally:
            broker.stop()
    finally:
        crds.kubectl("delete", "zepsstream", "prices", "-n", namespace, "--timeout=60s", check=False)
        core.delete_persistent_volume(f"journal-{namespace}")


def test_curve_keys_live_in_the_namespaces_secret_and_each_client_gets_its_own(
    operator: OperatorProcess, crds: ControlPlane, namespace: str, kube_api: Any
) -> None:
    """The broker's key pair and its clients' in the namespace's zeps-curve Secret (made once, kept),
    each listed client's certificate in a Secret of its own, the broker pod mounting its own items."""
    _apply(crds, namespace, "ZepsStream", "secure", {"curve": True, "curveClients": ["orders", "audit"]})
    core = client.CoreV1Api(kube_api)

    def secret(name: str) -> Any:
        try:
            return core.read_namespaced_secret(name, namespace)
        except client.ApiException as exc:
            if exc.status == 404:
                return None
            raise

    wait_until(lambda: secret("secure-curve-audit") is not None, timeout=30, what="the client Secrets")
    keys = {k: base64.b64decode(v).decode() for k, v in secret(CURVE_SECRET).data.items()}
    broker_key = public_key_of(keys["secure.broker.key"])
    assert json.loads(keys["secure.clients.json"]) == {
        name: public_key_of(keys[f"secure.client.{name}.key_secret"]) for name in ("audit", "orders")
    }
    orders = secret("secure-curve-orders")
    assert orders.metadata.owner_references[0].name == "secure"
    assert public_key_of(base64.b64decode(orders.data["server.key"]).decode()) == broker_key
    apps = client.AppsV1Api(kube_api)
    # the Secrets come first in a reconcile, the ConfigMap and the Deployment after: under load, a read
    # between them finds none (a CI run failed so)
    wait_until(lambda: bool(apps.list_namespaced_deployment(namespace).items), timeout=30,
               what="the broker's Deployment")  # fmt: skip
    config = core.read_namespaced_config_map("secure-broker", namespace).data or {}
    assert config["ZEPS_BROKER_CURVE_SECRET_KEY"] == "/etc/zeps/curve/broker.key_secret"
    assert config["ZEPS_BROKER_CURVE_CLIENTS"] == "/etc/zeps/curve/clients.json"
    volume = next(v for v in apps.read_namespaced_deployment("secure-broker", namespace)
                  .spec.template.spec.volumes if v.name == "curve")  # fmt: skip
    assert volume.secret.secret_name == CURVE_SECRET
    assert {i.key for i in volume.secret.items} == {"secure.broker.key_secret", "secure.clients.json"}

    # revoking orders: off the broker's list, its key kept (put back, it gets the same one)
    _apply(crds, namespace, "ZepsStream", "secure", {"curve": True, "curveClients": ["audit"]})
    wait_until(lambda: "orders" not in json.loads(base64.b64decode(secret(CURVE_SECRET).data["secure.clients.json"])),
               timeout=30, what="orders off the list")  # fmt: skip
    after = {k: base64.b64decode(v).decode() for k, v in secret(CURVE_SECRET).data.items()}
    assert after["secure.broker.key_secret"] == keys["secure.broker.key_secret"], "the broker's key is never replaced"
    assert after["secure.client.orders.key_secret"] == keys["secure.client.orders.key_secret"]


def _secret_data(core: Any, namespace: str, name: str) -> dict[str, str]:
    """A Secret's data, decoded (empty while there is no such Secret)."""
    try:
        found = core.read_namespaced_secret(name, namespace).data or {}
    except client.ApiException as exc:
        if exc.status == 404:
            return {}
        raise
    return {k: base64.b64decode(v).decode() for k, v in found.items()}


def test_a_curve_key_rotation_by_annotation_hands_out_the_new_key_before_the_broker_serves_it(
    operator: OperatorProcess, crds: ControlPlane, namespace: str, kube_api: Any
) -> None:
    """zeps.dev/rotate-curve-key: the coming key goes to every client's Secret (server.next.key) and
    the replica pods (broker.next.key) first; a window later the broker's certificate is the new one
    (brokers serve it once the kubelet brings it), clients trust the new key and the old; a window
    later the old one is gone. Each step in status.curveRotation (the pods are the kind tier's)."""
    _apply(crds, namespace, "ZepsStream", "safe", {"curve": True, "curveClients": ["teller"], "replicas": 3})
    core, apps = client.CoreV1Api(kube_api), client.AppsV1Api(kube_api)

    def data(name: str) -> dict[str, str]:
        return _secret_data(core, namespace, name)

    def phase() -> str:
        return str(_get(crds, namespace, "ZepsStream", "safe").get("status", {}).get("curveRotation", {}).get("phase"))

    wait_until(lambda: "server.key" in data("safe-curve-teller"), timeout=30, what="the client's Secret")
    old = public_key_of(data(CURVE_SECRET)["safe.broker.key"])
    crds.kubectl("annotate", "zepsstream", "safe", "-n", namespace, "zeps.dev/rotate-curve-key=first",
                 "zeps.dev/curve-rotation-window-seconds=1")  # fmt: skip
    wait_until(lambda: phase() in ("distributing", "switched", "done"), timeout=30, what="the rotation begun")
    # the timer may be past the first phase already (its window is a second): then the later checks
    # say it all. Each Secret is read once: a phase read, then a Secret, may see the next phase's Secret
    keys = data(CURVE_SECRET)
    coming = public_key_of(keys["safe.broker.next.key"]) if "safe.broker.next.key" in keys else None
    teller = data("safe-curve-teller")
    if coming is not None and "server.next.key" in teller:  # the client's Secret in the same phase
        assert public_key_of(teller["server.next.key"]) == coming
        assert public_key_of(teller["server.key"]) == old
    statefulset = apps.read_namespaced_stateful_set("safe-broker", namespace).spec.template.spec
    volume = next(v for v in statefulset.volumes if v.name == "curve-replicas")
    assert any(i.key == "safe.broker.next.key" and i.path == "broker.next.key" for i in volume.secret.items)
    wait_until(lambda: phase() in ("switched", "done"), timeout=60, what="the broker's certificate switched")
    keys, teller = data(CURVE_SECRET), data("safe-curve-teller")
    new = public_key_of(keys["safe.broker.key"])
    assert new != old and new == public_key_of(keys["safe.broker.key_secret"]) and new == (coming or new)
    assert public_key_of(teller["server.key"]) == new and "server.next.key" not in teller
    if "server.previous.key" in teller:  # switched, not done: a client whose broker has not switched
        assert public_key_of(teller["server.previous.key"]) == old  # yet still reaches it
    wait_until(lambda: phase() == "done", timeout=60, what="the rotation done")
    keys, teller = data(CURVE_SECRET), data("safe-curve-teller")
    assert not {"safe.broker.next.key", "safe.broker.next.key_secret", "safe.broker.previous.key"} & set(keys)
    assert public_key_of(teller["server.key"]) == new and not {"server.next.key", "server.previous.key"} & set(teller)
    assert _get(crds, namespace, "ZepsStream", "safe")["status"]["curvePublicKey"] == new
    events = json.loads(crds.kubectl("get", "events", "-n", namespace, "-o", "json"))["items"]
    said = [e["message"] for e in events if e.get("reason") == "CurveRotation"]
    assert any(m.endswith(": switched") for m in said) and any(m.endswith(": done") for m in said), said


def test_a_curve_stream_of_replicas_and_partitions_gives_each_replica_a_certificate(
    operator: OperatorProcess, crds: ControlPlane, namespace: str, kube_api: Any
) -> None:
    """Each replica of every partition of a replicated CURVE stream: a certificate in the namespace's
    Secret, listed by its public key in ``<s>.replicas.json``; each StatefulSet's pods mount their own
    partition's certificates beside that list (the broker's --curve-replicas); the broker's public key
    is in status, as for a stream of one broker. A replica of partition 1 moved: its set's extra copy
    is certified and listed too."""
    _apply(crds, namespace, "ZepsStream", "vault", {"curve": True, "replicas": 3, "partitions": 2})
    core, apps = client.CoreV1Api(kube_api), client.AppsV1Api(kube_api)

    def listed() -> dict[str, str]:
        data = _secret_data(core, namespace, CURVE_SECRET)
        return json.loads(data["vault.replicas.json"]) if "vault.replicas.json" in data else {}

    members = [f"vault-broker-{i}" for i in range(3)] + [f"vault-broker-p1-{i}" for i in range(3)]
    wait_until(lambda: sorted(listed()) == sorted(members), timeout=60, what="the replicas' keys")
    data = {
        k: base64.b64decode(v).decode() for k, v in core.read_namespaced_secret(CURVE_SECRET, namespace).data.items()
    }
    assert all(public_key_of(data[f"vault.replica.{m}.key_secret"]) == key for m, key in listed().items())
    # whose key clients trust, in status as for a stream of one broker (the operator's word, its Secret)
    broker_key = public_key_of(data["vault.broker.key"])
    wait_until(lambda: _get(crds, namespace, "ZepsStream", "vault").get("status", {}).get("curvePublicKey") ==
               broker_key, timeout=60, what="the broker's public key in status")  # fmt: skip
    wait_until(lambda: len(apps.list_namespaced_stateful_set(namespace).items) == 2, timeout=60,
               what="both partitions' StatefulSets")  # fmt: skip
    for statefulset, config_map in (("vault-broker", "vault-broker"), ("vault-broker-p1", "vault-broker-p1")):
        pod = apps.read_namespaced_stateful_set(statefulset, namespace).spec.template.spec
        volume = next(v for v in pod.volumes if v.name == "curve-replicas")
        assert {i.key for i in volume.secret.items} >= {
            "vault.replicas.json",
            f"vault.replica.{statefulset}-0.key_secret",
        }
        assert not any(i.key.startswith("vault.replica.vault-broker-p1") for i in volume.secret.items) or (
            statefulset == "vault-broker-p1")  # fmt: skip
        config = core.read_namespaced_config_map(config_map, namespace).data or {}
        assert config["ZEPS_BROKER_CURVE_REPLICAS"] == "/etc/zeps/curve-replicas/replicas.json"
    # a replica of partition 1 moved: the copy added first (a fourth replica) gets its certificate and
    # is listed, as partition 0's would be, or it could not peer and the move would wait for ever
    crds.kubectl("annotate", "zepsstream", "vault", "-n", namespace, "zeps.dev/move-replica=vault-broker-p1-1")
    wait_until(lambda: apps.read_namespaced_stateful_set("vault-broker-p1", namespace).spec.replicas == 4,
               timeout=60, what="partition 1's copy added")  # fmt: skip
    wait_until(lambda: "vault-broker-p1-3" in listed(), timeout=30, what="the copy's certificate listed")
    assert sorted(listed()) == sorted([*members, "vault-broker-p1-3"])


def test_a_retained_journal_has_no_owner_and_the_broker_gets_the_namespace_s_zookeeper_identity(
    operator: OperatorProcess, crds: ControlPlane, namespace: str, kube_api: Any
) -> None:
    """What the operator makes of deletionPolicy and of a namespace's ZooKeeper identity (kind runs
    the pods: e2e/kind/test_security.py): a Retain stream's PVC has no owner and a label naming the
    stream, a Delete one's is owned by it; the broker's pod takes the identity from the Secret."""
    core, apps = client.CoreV1Api(kube_api), client.AppsV1Api(kube_api)
    auth = {"user": "shop", "password": "pw"}
    core.create_namespaced_secret(
        namespace, client.V1Secret(metadata=client.V1ObjectMeta(name="zeps-zookeeper-auth"), string_data=auth)
    )
    _apply(crds, namespace, "ZepsStream", "kept", {"deletionPolicy": "Retain"})

    def pvc() -> Any:
        try:
            return core.read_namespaced_persistent_volume_claim("kept-journal", namespace)
        except client.ApiException:
            return None

    wait_until(lambda: pvc() is not None, timeout=30, what="the journal PVC")
    assert not pvc().metadata.owner_references and pvc().metadata.labels["zeps.dev/stream"] == "kept"
    wait_until(lambda: bool(apps.list_namespaced_deployment(namespace).items), timeout=30,
               what="the broker's Deployment (applied after the PVC)")  # fmt: skip
    container = apps.read_namespaced_deployment("kept-broker", namespace).spec.template.spec.containers[0]
    refs = {e.name: e.value_from.secret_key_ref for e in container.env if e.value_from and e.value_from.secret_key_ref}
    assert {n: (r.name, r.key) for n, r in refs.items()} == {
        "ZEPS_BROKER_ZOOKEEPER_USER": ("zeps-zookeeper-auth", "user"),
        "ZEPS_BROKER_ZOOKEEPER_PASSWORD": ("zeps-zookeeper-auth", "password"),
    }
    config = core.read_namespaced_config_map("kept-broker", namespace).data or {}
    assert "ZEPS_BROKER_METRICS_ADDRESS" not in config and "PASSWORD" not in json.dumps(config)
    assert {e.name: e.value for e in container.env}["ZEPS_BROKER_METRICS_ADDRESS"] == "$(POD_IP)"
    _apply(crds, namespace, "ZepsStream", "kept", {"deletionPolicy": "Delete"})
    wait_until(lambda: bool(pvc().metadata.owner_references), timeout=30, what="the stream to own its journal")
    assert pvc().metadata.owner_references[0].name == "kept"


def test_every_node_the_operator_makes_for_a_stream_carries_the_namespace_s_acl(
    operator: OperatorProcess, crds: ControlPlane, namespace: str, kube_api: Any, zookeeper: ZooKeeperHarness
) -> None:
    """A namespace with ZooKeeper credentials: the manifests of a partitioned stream's partitions (and
    the nodes above them) get the namespace's digest ACL, as its spec node does; another namespace's
    identity cannot change them (NoAuth). Before, the operator made them open to every ZooKeeper user:
    another tenant could stop the stream or move its partitions."""
    from kazoo.exceptions import NoAuthError  # noqa: PLC0415

    from zeps.coordination.client import digest_acl  # noqa: PLC0415
    from zeps.paths import StreamPaths  # noqa: PLC0415

    core = client.CoreV1Api(kube_api)
    auth = {"user": f"tenant-{namespace}", "password": "pw"}
    core.create_namespaced_secret(
        namespace, client.V1Secret(metadata=client.V1ObjectMeta(name="zeps-zookeeper-auth"), string_data=auth)
    )
    _apply(crds, namespace, "ZepsStream", "orders", {"partitions": 2})
    zk = zookeeper.client(auth=(auth["user"], auth["password"]))
    paths = [StreamPaths.of(namespace, "orders", chroot=CHROOT, partition=p) for p in (0, 1)]
    wait_until(lambda: all(zk.exists(p.brokers.manifest) for p in paths), timeout=60, what="both manifests")
    wanted = digest_acl(auth["user"], auth["password"])
    for p in paths:
        for node in (p.brokers.manifest, p.root):
            acls, _ = zk.get_acls(node)
            assert acls == wanted, f"{node}: {acls}"
    other = zookeeper.client(auth=("tenant-other", "pw"))
    for p in paths:
        with pytest.raises(NoAuthError):
            other.set(p.brokers.manifest, b'{"version": 1, "members": ["rogue"]}')
    crds.kubectl("delete", "zepsstream", "orders", "-n", namespace, "--timeout=60s")


def test_batch_queue_lag_in_status(
    operator: OperatorProcess, crds: ControlPlane, namespace: str, zookeeper: ZooKeeperHarness
) -> None:
    from zeps.coordination.batches import BatchQueue  # noqa: PLC0415

    _apply(crds, namespace, "Queue", "orders", {"mode": "batches"})
    _wait_ready(crds, namespace, "queue", "orders")
    batches = BatchQueue(_zk(zookeeper), "orders", namespace=namespace, chroot=CHROOT)
    batches.consumer("billing")
    batches.publish([b"order 11", b"order 13"])
    wait_until(
        lambda: _get(crds, namespace, "queue", "orders")["status"].get("consumerLag") == {"billing": 1},
        timeout=30,
        what="consumer lag in status",
    )


def test_a_batch_queues_status_shows_the_consumers_furthest_behind_and_counts_them_all(
    operator: OperatorProcess, crds: ControlPlane, namespace: str, zookeeper: ZooKeeperHarness
) -> None:
    """Consumer names are ZooKeeper nodes anyone with the namespace's ACL can make: the status shows
    the 20 furthest behind (as the metrics do) and counts them all in ``batchConsumers``; a consumer
    that leaves the 20 (here: unregistered) leaves ``consumerLag`` too (the status patch removes it)."""
    from zeps.coordination.batches import BatchQueue  # noqa: PLC0415

    _apply(crds, namespace, "Queue", "ledger", {"mode": "batches"})
    _wait_ready(crds, namespace, "queue", "ledger")
    zk = _zk(zookeeper)
    batches = BatchQueue(zk, "ledger", namespace=namespace, chroot=CHROOT)
    for n in range(30):
        batches.publish([b"entry %d" % n])
    for i in range(25):  # consumer c<i> has processed i batches: 30 - i behind
        batches.consumer(f"c{i:02}").reset(i + 1)

    def status() -> tuple[Any, Any]:
        got = _get(crds, namespace, "queue", "ledger")["status"]
        return got.get("consumerLag"), got.get("batchConsumers")

    wait_until(lambda: status() == ({f"c{i:02}": 30 - i for i in range(20)}, 25), timeout=30,
               what="the 20 consumers furthest behind, of 25")  # fmt: skip
    zk.delete(batches.paths.processor("c00"))
    wait_until(lambda: status() == ({f"c{i:02}": 30 - i for i in range(1, 21)}, 24), timeout=30,
               what="the unregistered consumer gone from the status, the next one in")  # fmt: skip


def test_the_operator_exports_its_resources_facts_and_forgets_deleted_ones(
    operator: OperatorProcess, crds: ControlPlane, namespace: str, zookeeper: ZooKeeperHarness
) -> None:
    """A Queue's depth and oldest item's age, a batch consumer's lag, a Topic's undelivered messages and
    cleaner passes, as a Prometheus scrape of the operator reads them (set as the operator reconciles
    and resyncs), its ZooKeeper session, and no series left once the Queue is deleted."""
    from zeps.coordination.batches import BatchQueue  # noqa: PLC0415
    from zeps.coordination.queue import WorkQueue  # noqa: PLC0415

    zk = _zk(zookeeper)
    _apply(crds, namespace, "Queue", "jobs")
    _apply(crds, namespace, "Queue", "ledger", {"mode": "batches"})
    _apply(crds, namespace, "Topic", "news", {"cleanerGrace": 3600, "noSubscribers": "ignore"})
    _wait_ready(crds, namespace, "queue", "jobs")
    _wait_ready(crds, namespace, "queue", "ledger")
    _wait_ready(crds, namespace, "topic", "news")
    WorkQueue(zk, "jobs", namespace=namespace, chroot=CHROOT).put_all([b"a", b"b", b"c"])
    news = Topic(zk, "news", namespace=namespace, chroot=CHROOT)
    for _ in range(3):  # three messages in the queue of a subscriber that never takes them
        zk.create(f"{news.paths.queue('away')}/m-", b"unread", sequence=True, makepath=True)
    batches = BatchQueue(_zk(zookeeper), "ledger", namespace=namespace, chroot=CHROOT)
    batches.consumer("audit").register("earliest")
    batches.publish([b"1"])
    batches.publish([b"2"])

    def value(metric: str, **labels: str) -> float | None:
        for family in text_string_to_metric_families(operator.metrics()):
            for sample in family.samples:
                if sample.name == metric and sample.labels == {"namespace": namespace, **labels}:
                    return float(sample.value)
        return None

    wait_until(lambda: value("zeps_queue_items", queue="jobs") == 3
               and value("zeps_batch_consumer_lag_batches", queue="ledger", consumer="audit") == 2, timeout=60,
               what="the queue's depth and the consumer's lag in the operator's metrics")  # fmt: skip
    assert "zeps_operator_zookeeper_connected 1.0" in operator.metrics()
    wait_until(lambda: value("zeps_topic_undelivered_messages", topic="news") == 3
               and (value("zeps_topic_cleaner_passes_total", topic="news") or 0) >= 1, timeout=60,
               what="the topic's undelivered messages and a cleaner pass over it")  # fmt: skip
    # the items were put before the first resync read them: their age grows from one pass to the next
    wait_until(lambda: (value("zeps_queue_oldest_item_age_seconds", queue="jobs") or 0) > 2, timeout=60,
               what="the age of the queue's oldest item")  # fmt: skip
    assert value("zeps_queue_oldest_item_age_seconds", queue="ledger") == 0, "an empty queue's"
    crds.kubectl("delete", "queue", "jobs", "-n", namespace, "--wait=true")
    wait_until(lambda: value("zeps_queue_items", queue="jobs") is None
               and value("zeps_queue_oldest_item_age_seconds", queue="jobs") is None, timeout=30,
               what="the deleted queue's series to go")  # fmt: skip
    assert value("zeps_queue_items", queue="ledger") == 0, "the other queue's stay"


def test_a_path_owned_by_another_cluster_is_a_conflict(
    operator: OperatorProcess, crds: ControlPlane, namespace: str, zookeeper: ZooKeeperHarness
) -> None:
    zk = _zk(zookeeper)
    root = f"{CHROOT}/{namespace}/topics/shared"
    foreign = {"formatVersion": 1, "owner": "other-cluster/1234", "generation": 1, "spec": {}}
    zk.create(f"{root}/spec", json.dumps(foreign).encode(), makepath=True)
    _apply(crds, namespace, "Topic", "shared")

    def ready_condition() -> dict[str, Any]:
        conditions = _get(crds, namespace, "topic", "shared").get("status", {}).get("conditions", [])
        return next((c for c in conditions if c["type"] == "Ready"), {})

    wait_until(lambda: ready_condition().get("reason") == "Conflict", timeout=30, what="a Conflict condition")
    assert ready_condition()["status"] == "False" and "other-cluster/1234" in ready_condition()["message"]
    assert json.loads(zk.get(f"{root}/spec")[0])["owner"] == "other-cluster/1234", "the other owner keeps the path"
    crds.kubectl("delete", "topic", "shared", "-n", namespace, "--timeout=60s")
    assert json.loads(zk.get(f"{root}/spec")[0])["owner"] == "other-cluster/1234", "deleting ours leaves theirs"


def test_namespace_credentials_put_acls_on_the_namespace_subtree(
    operator: OperatorProcess, crds: ControlPlane, namespace: str, zookeeper: ZooKeeperHarness, kube_api: Any
) -> None:
    from kazoo.exceptions import NoAuthError  # noqa: PLC0415

    from zeps.coordination import Topic, connect  # noqa: PLC0415

    core = client.CoreV1Api(kube_api)
    core.create_namespaced_secret(
        namespace,
        client.V1Secret(
            metadata=client.V1ObjectMeta(name="zeps-zookeeper-auth"), string_data={"user": "shop", "password": "pw"}
        ),
    )
    _apply(crds, namespace, "Topic", "private")
    _wait_ready(crds, namespace, "topic", "private")
    owner = connect(zookeeper.connect_string, auth=("shop", "pw"))
    try:
        root = f"{CHROOT}/{namespace}"
        walk = [root]
        while walk:  # every node of the namespace's subtree belongs to the namespace's user
            path = walk.pop()
            acl, _ = owner.get_acls(path)
            assert [(a.id.scheme, a.id.id.split(":")[0]) for a in acl] == [("digest", "shop")], path
            walk += [f"{path}/{child}" for child in owner.get_children(path)]
        with __import__("pytest").raises(NoAuthError):
            _zk(zookeeper).get_children(f"{root}/topics/private")
        topic = Topic(owner, "private", namespace=namespace, chroot=CHROOT)
        got: list[bytes] = []
        with topic.subscribe(lambda m: got.append(m.body), consumer_id="web-1"):
            topic.publish(b"only for shop")
            wait_until(lambda: got == [b"only for shop"], timeout=10, what="delivery with namespace credentials")
    finally:
        owner.stop()
        owner.close()
    crds.kubectl("delete", "topic", "private", "-n", namespace, "--timeout=60s")  # the operator is super user
    assert _zk(zookeeper).exists(f"{CHROOT}/{namespace}/topics/private") is None


def test_a_secret_created_after_a_namespaces_first_topic_is_read_for_the_next_one(
    operator: OperatorProcess, crds: ControlPlane, namespace: str, zookeeper: ZooKeeperHarness, kube_api: Any
) -> None:
    """The operator shares its reads of a namespace's credentials Secret between Topics
    (zeps_operator.freshness): the read made for the first Topic (no Secret yet) must not serve a
    Topic created after the Secret, however soon after."""
    _apply(crds, namespace, "Topic", "before")
    _wait_ready(crds, namespace, "topic", "before")
    client.CoreV1Api(kube_api).create_namespaced_secret(
        namespace,
        client.V1Secret(
            metadata=client.V1ObjectMeta(name="zeps-zookeeper-auth"), string_data={"user": "late", "password": "pw"}
        ),
    )
    _apply(crds, namespace, "Topic", "after")
    _wait_ready(crds, namespace, "topic", "after")
    # (the nodes of "before", made before the Secret, get its ACL at the next resync pass of "before":
    # nodes whose ACL is not the namespace's are repaired, so what they hold now depends on timing)
    owner = connect(zookeeper.connect_string, auth=("late", "pw"))
    try:
        acl, _ = owner.get_acls(f"{CHROOT}/{namespace}/topics/after")
        assert [(a.id.scheme, a.id.id.split(":")[0]) for a in acl] == [("digest", "late")]
    finally:
        owner.stop()
        owner.close()
    crds.kubectl("delete", "topic", "before", "after", "-n", namespace, "--timeout=60s")


def test_a_tenant_asking_for_an_image_or_privileges_the_admin_did_not_allow_gets_nothing(
    operator: OperatorProcess, crds: ControlPlane, namespace: str, kube_api: Any
) -> None:
    """spec.image off the admin's allow-list, or host networking outside the namespaces opted in: the
    stream is not Ready (PodNotAllowed, naming the chart value) and no broker object is made (before,
    any user who could create a ZepsStream ran any image, with the node's network)."""
    apps = client.AppsV1Api(kube_api)
    _apply(crds, namespace, "ZepsStream", "miner", {"image": "evil.example/miner:latest"})
    multicast = {"transport": "epgm", "group": "239.1.1.1", "port": 5555, "hostNetwork": True}
    _apply(crds, namespace, "ZepsStream", "sniffer", {"multicast": multicast})

    def refused(name: str) -> str:
        conditions = _get(crds, namespace, "ZepsStream", name).get("status", {}).get("conditions", [])
        return next((c["message"] for c in conditions if c.get("reason") == "PodNotAllowed"), "")

    wait_until(lambda: "brokers.allowedImages" in refused("miner"), timeout=60, what="the image refused")
    wait_until(lambda: "brokers.privilegedNamespaces" in refused("sniffer"), timeout=60, what="hostNetwork refused")
    assert apps.list_namespaced_deployment(namespace).items == []
    assert apps.list_namespaced_stateful_set(namespace).items == []
    for name in ("miner", "sniffer"):
        crds.kubectl("delete", "zepsstream", name, "-n", namespace, "--timeout=60s")


def test_a_brokers_pod_is_admitted_where_pod_security_enforces_restricted(
    operator: OperatorProcess, crds: ControlPlane, namespace: str, kube_api: Any
) -> None:
    """The API server's Pod Security admission, enforcing "restricted" in the namespace, admits the
    broker pods of a replicated stream (the StatefulSet controller makes them: no kubelet runs them)."""
    core = client.CoreV1Api(kube_api)
    crds.kubectl("label", "namespace", namespace, "pod-security.kubernetes.io/enforce=restricted")
    _apply(crds, namespace, "ZepsStream", "orders", {"replicas": 3})
    wait_until(lambda: len(core.list_namespaced_pod(namespace).items) == 3, timeout=90,
               what="three broker pods admitted")  # fmt: skip
    events = json.loads(crds.kubectl("get", "events", "-n", namespace, "-o", "json"))["items"]
    assert not [e for e in events if "violates PodSecurity" in e.get("message", "")]
    crds.kubectl("delete", "zepsstream", "orders", "-n", namespace, "--timeout=60s")


def test_the_operator_puts_a_quota_on_each_namespace_and_a_full_one_shows_on_its_objects(
    operator: OperatorProcess, crds: ControlPlane, namespace: str, zookeeper: ZooKeeperHarness
) -> None:
    """The namespace's first object gets it a ZooKeeper quota (the operator's settings: the chart's
    zookeeper.namespaceQuota), in nodes only the operator may change, with /zookeeper/quota closed to
    everyone else. A namespace whose nodes reach its quota: its next Topic is not Ready, with reason
    QuotaExceeded, a message saying what to do, and an event; a raised quota lets it through."""
    from kazoo.exceptions import NoAuthError  # noqa: PLC0415

    from harness import CLUSTER_TESTS_QUOTA, OPERATOR_AUTH  # noqa: PLC0415
    from zeps.coordination import digest_acl  # noqa: PLC0415
    from zeps.coordination.admin import ensure_quota  # noqa: PLC0415
    from zeps.coordination.quota import QUOTA_ROOT, Quota, read_quota  # noqa: PLC0415

    _apply(crds, namespace, "Topic", "first")
    _wait_ready(crds, namespace, "topic", "first")
    subtree = f"{CHROOT}/{namespace}"
    admin = zookeeper.client(auth=OPERATOR_AUTH)
    found = read_quota(admin, subtree)
    assert found is not None and found[0] == Quota(*CLUSTER_TESTS_QUOTA), found
    tenant = zookeeper.client(auth=(f"tenant-{namespace}", "pw"))
    with pytest.raises(NoAuthError):
        tenant.delete(f"{QUOTA_ROOT}{subtree}/zookeeper_limits")
    # the namespace full: a quota at what it holds now (the operator set its own once: it keeps this)
    held = found[1].nodes
    ensure_quota(admin, subtree, nodes=held, size=0, acl=digest_acl(*OPERATOR_AUTH))
    _apply(crds, namespace, "Topic", "second")

    def refused() -> dict[str, Any] | None:
        conditions = _get(crds, namespace, "topic", "second").get("status", {}).get("conditions", [])
        return next((c for c in conditions if c["type"] == "Ready" and c["reason"] == "QuotaExceeded"), None)

    wait_until(lambda: refused() is not None, timeout=60, what="the second Topic refused for the quota")
    condition = refused()
    assert condition is not None, "the condition went before it was read"
    assert "namespaceQuota" in condition["message"] and "Free room" in condition["message"], condition
    wait_until(lambda: _events(crds, "second", "QuotaExceeded", namespace=namespace) >= 1, timeout=30,
               what="a QuotaExceeded event")  # fmt: skip
    ensure_quota(admin, subtree, nodes=held + 100, size=0, acl=digest_acl(*OPERATOR_AUTH))
    _wait_ready(crds, namespace, "topic", "second", timeout=90)  # the retry after 30 s

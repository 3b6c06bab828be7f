"""Day-2 operations on a replicated ZepsStream on kind with three worker nodes, under a publisher Job
and a subscriber pod (docs: operations, "Changing a running stream"):

1. ``kubectl drain`` of the node that holds the leader (its broker pods only, so the suite's other
   pods stay): the PodDisruptionBudget lets the leader's pod go, its broker hands the lead over
   before it stops, the pod cannot start elsewhere (its volume is the node's), ``UnderReplicated``
   says so; uncordoned, it comes back, catches up, and the lead goes back to it (the preferred
   replica).
2. A follower held back (SIGSTOP of its broker, from its node) leaves the in-sync set; then a new
   template: the operator's roll must not restart the other follower (that would leave the leader
   alone, below minInSync 2), so it restarts the stopped one first, whose stop waits until it runs
   again (SIGCONT); then the rest, the leader last.

Every confirmed publish reaches the subscriber once, in order, with no gap. The longest wait for a
confirmation during the drain is printed as a figure (never asserted).

3. Replicas 1 -> 3 -> 1 on a stream of 100,000 records: every record read back from the replica
   left.
4. A replica moved off a cordoned node: copied first, then rebuilt elsewhere.
5. ``storage.size`` raised under load on volumes that can grow (the cluster's expandable
   StorageClass: a CSI driver, the upstream external-resizer, kubelet's node expansion)."""

from __future__ import annotations

import json
import subprocess
import time
from typing import Any

import pytest
from kindapp import WORKERS, App, docker, json_lines

from zeps_dev.kind import EXPANDABLE_STORAGE

STREAM = "ops"
PREFERRED, HELD = f"{STREAM}-broker-0", f"{STREAM}-broker-1"
COUNT, RATE, GROUP = 9000, 20.0, 10  # 450 s of publishing at least: both operations happen within it


def _stream(**spec: Any) -> dict[str, Any]:
    return {"apiVersion": "zeps.dev/v1alpha1", "kind": "ZepsStream", "metadata": {"name": STREAM},
            "spec": {"replicas": 3, "minInSync": 2, "storage": {"size": "1Gi"}, "fsync": "always", **spec}}  # fmt: skip


def _broker_process(app: App, pod: str) -> tuple[str, list[str]]:
    """The node of a broker pod, and its broker's PIDs as the node sees them (its processes whose
    cgroup names the pod's UID and whose command line is zeps-broker)."""
    body = app.get("pod", pod)
    node, uid = body["spec"]["nodeName"], body["metadata"]["uid"]
    script = (f"for f in $(grep -l -e {uid} -e {uid.replace('-', '_')} /proc/[0-9]*/cgroup 2>/dev/null); do "
              "p=${f%/cgroup}; grep -q zeps-broker $p/cmdline 2>/dev/null && echo ${p#/proc/}; done; true")  # fmt: skip
    return node, docker("exec", node, "bash", "-c", script).split()


def _start_clients(app: App) -> None:
    app.run_pod("subscriber", f"exec zeps --json stream replay {STREAM} --since 0 --count {COUNT} --timeout 900")
    app.start_publisher(STREAM, COUNT, RATE, GROUP)


def _whole_with_preferred_leading(app: App) -> bool:
    r = app.replication(STREAM)
    return r.get("leader") == PREFERRED and len(r.get("inSync", [])) == 3


def _all_received_once_in_order(app: App, count: int, job: str = "publisher", subscriber: str = "subscriber",
                                *, timeout: float = 600) -> None:  # fmt: skip
    """The publisher Job ``job`` hurried to its end (the faults are over: the rest at once), then
    each of its ``count`` confirmed records received by ``subscriber`` once, in order, no gap."""
    app.hurry(job)
    app.cluster.wait_for("the publisher to finish", lambda: app.confirmed_past(count, job), timeout=timeout,
                         interval=2)  # fmt: skip
    received = json_lines(app.wait_succeeded(subscriber, timeout=600))
    bodies = [m["body"] for m in received]
    assert bodies == [str(i) for i in range(1, count + 1)], f"{len(bodies)} received, {len(set(bodies))} distinct"


@pytest.mark.serial  # a node is drained, a broker stopped
@pytest.mark.timeout(1800)
def test_a_drain_of_the_leaders_node_and_a_roll_held_by_a_stopped_follower_lose_nothing(app: App) -> None:
    cluster = app.cluster
    app.apply(_stream())
    app.ready("zepsstream", STREAM, timeout=300)
    cluster.wait_for("three in sync, the preferred replica leading", lambda: _whole_with_preferred_leading(app),
                     timeout=240, interval=2)  # fmt: skip
    _start_clients(app)
    cluster.wait_for("300 confirmed", lambda: app.confirmed_past(300), timeout=240, interval=1)

    # 1. the leader's node drained (its broker pods): a hand-over, the pod pending until uncordoned
    node = app.get("pod", PREFERRED)["spec"]["nodeName"]
    epoch, began, before = app.replication(STREAM)["epoch"], time.time(), app.confirmed()[-1]["confirmed"]
    try:
        cluster.kubectl("drain", node, f"--pod-selector=app.kubernetes.io/instance={STREAM}", "--ignore-daemonsets",
                        "--delete-emptydir-data", "--timeout=240s", timeout=270)  # fmt: skip
        cluster.wait_for("another replica leading a later epoch", lambda: (r := app.replication(STREAM)).get(
            "leader") not in ("", PREFERRED) and r.get("epoch", 0) > epoch, timeout=120, interval=1)  # fmt: skip
        cluster.wait_for("confirmations after the drain", lambda: app.confirmed_past(before + 20 * GROUP),
                         timeout=240, interval=1)  # fmt: skip
        drained = time.time()
        cluster.wait_for("UnderReplicated naming the drained replica", lambda: (c := app.condition(
            STREAM, "UnderReplicated")).get("status") == "True" and f"{PREFERRED} not fetching" in c.get("message", ""),
            timeout=120, interval=2)  # fmt: skip
    finally:
        cluster.kubectl("uncordon", node)
    drain_pause = app.longest_pause(began, drained)
    cluster.wait_for("the drained replica back in sync, leading again", lambda: _whole_with_preferred_leading(app),
                     timeout=420, interval=2)  # fmt: skip

    # 2. a follower held back; a new template: the roll must restart the held one first, and waits for it
    held_node, pids = _broker_process(app, HELD)
    assert pids, f"no zeps-broker process of {HELD} found on {held_node}"
    docker("exec", held_node, "kill", "-STOP", *pids)
    try:
        cluster.wait_for(f"{HELD} out of the in-sync set", lambda: HELD not in app.replication(STREAM).get(
            "inSync", [HELD]), timeout=120, interval=1)  # fmt: skip
        app.apply(_stream(resources={"limits": {"memory": "768Mi"}}))  # a new template
        cluster.wait_for(f"the roll restarting {HELD}", lambda: any(e["message"].startswith(f"{HELD} ")
                         for e in app.rolled_pods()), timeout=180, interval=1)  # fmt: skip
        # the RollingPod event is posted as the pod is deleted; the Rolling condition comes with the
        # status patch at the end of the operator's handler, a moment later
        cluster.wait_for("the Rolling condition True", lambda: app.condition(STREAM, "Rolling").get("status") == "True",
                         timeout=60, interval=1)  # fmt: skip
    finally:
        subprocess.run(["docker", "exec", held_node, "kill", "-CONT", *pids], capture_output=True, timeout=60,
                       check=False)  # its pod may be gone already  # fmt: skip
    first = app.rolled_pods()[0]["message"].split(" ", 1)[0]
    assert first == HELD, f"the roll restarted {first} first, leaving fewer than minInSync in sync"

    def rolled() -> bool:
        status = app.get("zepsstream", STREAM).get("status", {})
        return not status.get("roll") and app.condition(STREAM, "Rolling").get("status") == "False" and len(
            status.get("replication", {}).get("inSync", [])) == 3  # fmt: skip

    cluster.wait_for("the roll done, all three in sync", rolled, timeout=600, interval=2)
    order = [e["message"].split(" ", 1)[0] for e in app.rolled_pods()]
    cluster.wait_for("the lead back at the preferred replica", lambda: _whole_with_preferred_leading(app),
                     timeout=180, interval=2)  # fmt: skip

    _all_received_once_in_order(app, COUNT, timeout=900)
    print("\nFIGURE " + json.dumps({
        "fault": "kubectl drain of the leader's node, then a roll held by a stopped follower",
        "drain_longest_confirmation_pause_s": drain_pause,
        "restart_order": order, "confirmed": COUNT, "lost": 0}), flush=True)  # fmt: skip


SCALED, RECORDS = "scaled", 100_000
#: replays the stream and prints one summary (100,000 lines would outgrow the pod's log), with the
#: replay's exit status and the end of its stderr
CHECK = """import json, subprocess, sys
name, count = sys.argv[1], sys.argv[2]
done = subprocess.run(["zeps", "--json", "stream", "replay", name, "--since", "0", "--count", count,
                       "--timeout", "300"], capture_output=True, text=True)
bodies = [json.loads(line)["body"] for line in done.stdout.splitlines() if line.startswith("{")]
print(json.dumps({"read": len(bodies), "in_order_once": bodies == [str(i) for i in range(1, len(bodies) + 1)],
                  "exit": done.returncode, "stderr": done.stderr[-2000:]}))
"""


def _scaled(replicas: int) -> dict[str, Any]:
    return {"apiVersion": "zeps.dev/v1alpha1", "kind": "ZepsStream", "metadata": {"name": SCALED},
            "spec": {"replicas": replicas, "storage": {"size": "1Gi"}}}  # fmt: skip


def _scaled_status(app: App) -> dict[str, Any]:
    return dict(app.get("zepsstream", SCALED).get("status", {}))


def _under_replicated(app: App) -> str:
    conditions: list[dict[str, Any]] = _scaled_status(app).get("conditions", [])
    return str(next((c.get("status") for c in conditions if c.get("type") == "UnderReplicated"), ""))


@pytest.mark.timeout(1500)
def test_replicas_1_to_3_to_1_on_a_stream_of_100000_records_keep_every_record(app: App) -> None:
    """A stream of one broker holding 100,000 records grows to three replicas in place (its broker
    restarts as the first replica, the StatefulSet's copy its journal, the Deployment goes) and
    shrinks back to one: the scale-down waits until the replica that stays is in sync and runs the
    new minInSync, then removes the others. Every record is read back, once, in order, from the one
    replica left; UnderReplicated is False at each end."""
    cluster = app.cluster
    app.apply(_scaled(1))
    app.ready("zepsstream", SCALED, timeout=300)
    app.apply({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "loader"},
               "data": {"publisher.py": (WORKERS / "ledger_publisher.py").read_text(), "check.py": CHECK}})  # fmt: skip
    spec = App.pod_spec(f"exec python /worker/publisher.py {SCALED} {RECORDS} 1000000 2000")
    spec["containers"][0]["volumeMounts"] = [{"name": "worker", "mountPath": "/worker"}]
    spec["volumes"] = [{"name": "worker", "configMap": {"name": "loader"}}]
    app.apply({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "loader"}, "spec": spec})
    loaded = json_lines(app.wait_succeeded("loader", timeout=600))
    assert loaded[-1].get("confirmed") == RECORDS, loaded[-3:]

    app.apply(_scaled(3))  # 1 -> 3: the journal copied to the new replicas
    cluster.wait_for("three replicas in sync, a StatefulSet", lambda: (s := _scaled_status(app)).get("replicated")
                     is True and len(s.get("replication", {}).get("inSync", [])) == 3, timeout=600,
                     interval=2)  # fmt: skip
    assert not app.get("deployments")["items"], "the one broker's Deployment is still there"
    cluster.wait_for("UnderReplicated False", lambda: _under_replicated(app) == "False", timeout=120, interval=2)

    app.apply(_scaled(1))  # 3 -> 1: the replicas that go, only once the one that stays is in sync
    cluster.wait_for("the StatefulSet down to one replica", lambda: app.get("statefulset", f"{SCALED}-broker")[
        "spec"]["replicas"] == 1 and "scaling" not in _scaled_status(app), timeout=600, interval=2)  # fmt: skip
    cluster.wait_for("one replica serving", lambda: (r := _scaled_status(app).get("replication", {})).get("leader")
                     == f"{SCALED}-broker-0" and r.get("inSync") == [f"{SCALED}-broker-0"], timeout=300,
                     interval=2)  # fmt: skip
    app.ready("zepsstream", SCALED, timeout=300)
    reader = App.pod_spec(f"exec python /worker/check.py {SCALED} {RECORDS}")
    reader["containers"][0]["volumeMounts"] = spec["containers"][0]["volumeMounts"]
    reader["volumes"] = spec["volumes"]
    app.apply({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "reader"}, "spec": reader})
    (summary,) = json_lines(app.wait_succeeded("reader", timeout=420))
    assert (summary["read"], summary["in_order_once"], summary["exit"]) == (RECORDS, True, 0), summary


MOVED, MOVE_COUNT = "moved", 4000


@pytest.mark.serial  # a node is cordoned
@pytest.mark.timeout(1500)
def test_a_replica_moved_off_a_cordoned_node_is_copied_first_then_rebuilt_elsewhere(app: App) -> None:
    """``zeps.dev/move-replica`` on an R3 stream (minInSync 2) under a publisher Job and a subscriber,
    the replica's node cordoned first (the admin's act): the operator adds a fourth replica and waits
    for it in sync, then deletes the moved replica's volume and pod; the pod starts on another node
    with a new volume and copies the stream; then the extra replica goes, its volume with it, and
    the annotation is removed. Every confirmed publish reaches the subscriber once, in order."""
    cluster = app.cluster
    moved, extra = f"{MOVED}-broker-1", f"{MOVED}-broker-3"
    body = _stream()
    body["metadata"]["name"] = MOVED
    app.apply(body)
    app.ready("zepsstream", MOVED, timeout=300)

    def in_sync() -> list[str]:
        return list(app.get("zepsstream", MOVED).get("status", {}).get("replication", {}).get("inSync", []))

    cluster.wait_for("three in sync", lambda: len(in_sync()) == 3, timeout=240, interval=2)
    app.run_pod("move-subscriber", f"exec zeps --json stream replay {MOVED} --since 0 --count {MOVE_COUNT} "
                "--timeout 900")  # fmt: skip
    app.start_publisher(MOVED, MOVE_COUNT, 20.0, 10, job="move-publisher")
    cluster.wait_for("200 confirmed", lambda: app.confirmed_past(200, "move-publisher"), timeout=240, interval=1)
    node = app.get("pod", moved)["spec"]["nodeName"]
    old_claim = app.get("pvc", f"journal-{moved}")["metadata"]["uid"]
    cluster.kubectl("cordon", node)
    try:
        cluster.kubectl("annotate", "zepsstream", MOVED, "-n", app.ns, f"zeps.dev/move-replica={moved}")
        cluster.wait_for("Reassigning True", lambda: app.condition(MOVED, "Reassigning").get("status") == "True",
                         timeout=120, interval=1)  # fmt: skip
        cluster.wait_for("the move done (the annotation removed)", lambda: "zeps.dev/move-replica" not in (
            app.get("zepsstream", MOVED)["metadata"].get("annotations") or {}), timeout=900, interval=2)  # fmt: skip
    finally:
        cluster.kubectl("uncordon", node)
    rebuilt = app.get("pod", moved)
    assert rebuilt["spec"]["nodeName"] != node, f"{moved} is still on {node}"
    assert app.get("pvc", f"journal-{moved}")["metadata"]["uid"] != old_claim, "its volume was not rebuilt"
    assert app.get("statefulset", f"{MOVED}-broker")["spec"]["replicas"] == 3
    cluster.wait_for(f"the extra replica's volume gone (journal-{extra})", lambda: not [
        c for c in app.get("pvc")["items"] if c["metadata"]["name"] == f"journal-{extra}"], timeout=120,
        interval=2)  # fmt: skip
    cluster.wait_for("three in sync, the moved replica among them", lambda: sorted(in_sync()) == [
        f"{MOVED}-broker-{i}" for i in range(3)], timeout=240, interval=2)  # fmt: skip
    assert app.condition(MOVED, "Reassigning").get("status") == "False"
    events = app.get("events", "--field-selector", "reason=ReplicaMoved")["items"]
    assert any(f"from node {node} to node {rebuilt['spec']['nodeName']}" in e["message"] for e in events), events
    phases = [e["message"].split(": ", 1)[1].split(",")[0] for e in sorted(
        app.get("events", "--field-selector", "reason=MovingReplica")["items"],
        key=lambda e: e.get("lastTimestamp") or e["metadata"]["creationTimestamp"])]  # fmt: skip
    # each phase once (a pass that ran before the last one's status was written may say it again)
    assert [p for i, p in enumerate(phases) if i == 0 or p != phases[i - 1]] == ["adding", "rebuilding", "settling",
                                                                                 "removing"], phases  # fmt: skip

    _all_received_once_in_order(app, MOVE_COUNT, "move-publisher", "move-subscriber")


GROWN, GROW_COUNT = "grown", 3000
MI = 1 << 20


def _bytes(quantity: str) -> int:
    """A quantity as the API gives a size back: ``96Mi`` or a number of bytes."""
    for suffix, factor in (("Ki", 1 << 10), ("Mi", MI), ("Gi", 1 << 30)):
        if quantity.endswith(suffix):
            return int(quantity.removesuffix(suffix)) * factor
    return int(quantity or 0)


@pytest.mark.timeout(1200)
def test_a_stream_s_volumes_grown_under_load_reach_the_new_size_and_lose_nothing(app: App) -> None:
    """``storage.size`` raised from 64Mi to 96Mi on an R3 stream (minInSync 2) whose claims are of
    the expandable StorageClass, while a publisher Job and a subscriber run: the operator asks each
    of the three claims for the new size (``Resizing`` True, an event), the real external-resizer
    grows each volume and kubelet finishes it on the node while the pod runs (the driver expands
    online), each claim's ``status.capacity`` reaches 96Mi and ``Resizing`` goes back to False; no
    broker pod restarts. Every confirmed publish reaches the subscriber once, in order."""
    cluster = app.cluster
    body = _stream(storage={"size": "64Mi", "storageClassName": EXPANDABLE_STORAGE})
    body["metadata"]["name"] = GROWN
    app.apply(body)
    app.ready("zepsstream", GROWN, timeout=300)
    claims = [f"journal-{GROWN}-broker-{i}" for i in range(3)]

    def capacities() -> list[int]:
        return [_bytes(app.get("pvc", c).get("status", {}).get("capacity", {}).get("storage", "")) for c in claims]

    # Ready wants minInSync (2) brokers: the third claim may still be provisioning (a provisioner
    # retries a claim it could not save)
    cluster.wait_for("each claim bound at 64Mi", lambda: capacities() == [64 * MI] * 3, timeout=240, interval=2)
    pods = {p: app.get("pod", p)["metadata"]["uid"] for p in (f"{GROWN}-broker-{i}" for i in range(3))}
    app.run_pod("grow-subscriber", f"exec zeps --json stream replay {GROWN} --since 0 --count {GROW_COUNT} "
                "--timeout 900")  # fmt: skip
    app.start_publisher(GROWN, GROW_COUNT, 20.0, 10, job="grow-publisher")
    cluster.wait_for("200 confirmed", lambda: app.confirmed_past(200, "grow-publisher"), timeout=240, interval=1)

    body["spec"]["storage"]["size"] = "96Mi"
    app.apply(body)
    cluster.wait_for("each claim asked for 96Mi", lambda: all(
        app.get("pvc", c)["spec"]["resources"]["requests"]["storage"] == "96Mi" for c in claims), timeout=120,
        interval=1)  # fmt: skip
    cluster.wait_for("each volume grown (status.capacity 96Mi)", lambda: capacities() == [96 * MI] * 3, timeout=300,
                     interval=2)  # fmt: skip
    cluster.wait_for("Resizing False again", lambda: app.condition(GROWN, "Resizing").get("status") == "False",
                     timeout=120, interval=2)  # fmt: skip
    assert app.condition(GROWN, "Resizing").get("reason") == "Current"
    volumes = [app.get("pv", app.get("pvc", c)["spec"]["volumeName"]) for c in claims]
    assert [_bytes(v["spec"]["capacity"]["storage"]) for v in volumes] == [96 * MI] * 3
    assert {v["spec"]["csi"]["driver"] for v in volumes} == {"hostpath.csi.zeps.dev"}
    events = app.get("events", "--field-selector", "reason=Resizing")["items"]
    assert any("asked for 96Mi" in e["message"] for e in events), events
    assert {p: app.get("pod", p)["metadata"]["uid"] for p in pods} == pods, "a broker pod restarted"

    _all_received_once_in_order(app, GROW_COUNT, "grow-publisher", "grow-subscriber")

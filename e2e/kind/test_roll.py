"""A change to a replicated ZepsStream's pod template, rolled by the operator on kind with three worker
nodes (docs: "Replicated streams", rolling a change): a publisher Job and a subscriber pod run
against an R3 stream while its resources change. The StatefulSet updates ``OnDelete``; the operator
restarts one broker pod at a time, followers first and the leader last, each back in the in-sync set
before the next; each stopping broker hands over (a follower leaves the in-sync set, the leader its
lead), and once the last is back the lead returns to the preferred replica (ordinal 0). Every
confirmed publish reaches the subscriber once, in order, with no gap; the order of restarts is the
operator's events'. The publisher's longest wait for a confirmation is printed as a figure (never
asserted)."""

from __future__ import annotations

import itertools
import json
import time
from pathlib import Path
from typing import Any

from kindapp import STACK_DUMP_LABEL, App, json_lines

WORKERS = Path(__file__).resolve().parent / "workers"
STREAM = "rolled"
COUNT, RATE, GROUP = 3000, 30.0, 10  # 100 s of publishing at least: the roll happens within it


def _stream(**spec: Any) -> dict[str, Any]:
    return {"apiVersion": "zeps.dev/v1alpha1", "kind": "ZepsStream", "metadata": {"name": STREAM},
            "spec": {"replicas": 3, "minInSync": 2, "storage": {"size": "1Gi"}, "fsync": "always", **spec}}  # fmt: skip


def _replication(app: App) -> dict[str, Any]:
    return dict(app.get("zepsstream", STREAM).get("status", {}).get("replication", {}))


def _confirmed(app: App) -> list[dict[str, Any]]:
    return [m for m in json_lines(app.logs("job/publisher")) if "confirmed" in m]


def _revisions(app: App) -> tuple[str, dict[str, str]]:
    sts = app.get("statefulset", f"{STREAM}-broker")
    pods = app.get("pods", "-l", f"app.kubernetes.io/instance={STREAM}")["items"]
    return sts["status"].get("updateRevision", ""), {
        p["metadata"]["name"]: p["metadata"]["labels"].get("controller-revision-hash", "") for p in pods
    }


def test_a_changed_template_is_rolled_one_pod_at_a_time_the_leader_last_losing_nothing(app: App) -> None:
    app.apply(_stream())
    app.ready("zepsstream", STREAM, timeout=300)
    app.cluster.wait_for("three replicas in sync", lambda: len(_replication(app).get("inSync", [])) == 3,
                         timeout=180)  # fmt: skip
    app.run_pod("subscriber", f"exec zeps --json stream replay {STREAM} --since 0 --count {COUNT} --timeout 600")
    app.apply({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "publisher"},
               "data": {"publisher.py": (WORKERS / "ledger_publisher.py").read_text()}})  # fmt: skip
    spec = App.pod_spec(f"exec python /worker/publisher.py {STREAM} {COUNT} {RATE} {GROUP}")
    spec["containers"][0]["volumeMounts"] = [{"name": "worker", "mountPath": "/worker"}]
    spec["volumes"] = [{"name": "worker", "configMap": {"name": "publisher"}}]
    app.apply({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "publisher"},
               "spec": {"backoffLimit": 0, "template": {"metadata": {"labels": {STACK_DUMP_LABEL: "1"}},
                                                        "spec": spec}}})  # fmt: skip
    app.cluster.wait_for("500 confirmed", lambda: bool(c := _confirmed(app)) and c[-1]["confirmed"] >= 500,
                         timeout=240, interval=1)  # fmt: skip
    # the lead is at the preferred replica (ordinal 0 of partition 0), whichever the first election chose
    preferred = f"{STREAM}-broker-0"
    app.cluster.wait_for("the preferred replica leading", lambda: _replication(app).get("leader") == preferred,
                         timeout=120, interval=1)  # fmt: skip
    leader = _replication(app)["leader"]
    began = time.time()
    app.apply(_stream(resources={"limits": {"memory": "768Mi"}}))  # a new template
    app.cluster.wait_for("the roll to begin", lambda: len(set(_revisions(app)[1].values())) > 1 or bool(
        app.get("zepsstream", STREAM).get("status", {}).get("roll")), timeout=120, interval=1)  # fmt: skip

    def rolled() -> bool:
        revision, pods = _revisions(app)
        status = app.get("zepsstream", STREAM).get("status", {})
        return len(pods) == 3 and set(pods.values()) == {revision} and not status.get("roll") and len(
            status.get("replication", {}).get("inSync", [])) == 3  # fmt: skip

    app.cluster.wait_for("every pod restarted with the new template, all three in sync", rolled, timeout=600,
                         interval=2)  # fmt: skip
    ended = time.time()
    events = app.get("events", "--field-selector", "reason=RollingPod")["items"]
    events.sort(key=lambda e: e.get("lastTimestamp") or e["metadata"]["creationTimestamp"])
    order = [e["message"].split(" ", 1)[0] for e in events]
    assert len(order) == 3 and order[-1] == leader, f"restarts: {order}, the leader {leader} not last"
    # its restart handed the lead to a follower; once back in sync, the lead goes back to it
    app.cluster.wait_for("the lead back at the preferred replica", lambda: _replication(app).get("leader") == preferred,
                         timeout=120, interval=1)  # fmt: skip

    app.cluster.wait_for("the publisher to finish", lambda: _confirmed(app)[-1]["confirmed"] >= COUNT, timeout=600,
                         interval=2)  # fmt: skip
    received = json_lines(app.wait_succeeded("subscriber", timeout=400))
    bodies = [m["body"] for m in received]
    assert bodies == [str(i) for i in range(1, COUNT + 1)], f"{len(bodies)} received, {len(set(bodies))} distinct"
    times = [m["t"] for m in _confirmed(app) if began - 1 <= m["t"] <= ended]
    print("\nFIGURE " + json.dumps({
        "fault": "a replicated stream's template changed: the operator's roll under publishing",
        "restart_order": order, "leader": leader, "roll_s": round(ended - began, 1),
        "longest_confirmation_pause_s": round(max((b - a for a, b in itertools.pairwise(times)), default=0.0), 2),
        "confirmed": COUNT, "lost": 0}), flush=True)  # fmt: skip

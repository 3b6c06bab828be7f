"""make bench-roll-kind: bench-roll's question on kind: what a roll of an R3 stream costs its publisher.

The stack of ``make e2e`` (the images built here, a kind cluster with three workers, the chart with
``values-production.yaml``: the operator and a 3-server ZooKeeper ensemble in pods). A ZepsStream of
3 replicas, minInSync 2, fsync always, and a publisher Job (``e2e/kind/workers/ledger_publisher.py``:
one idempotent producer, ``GROUP`` messages per confirmed flush, ``RATE`` a second). Then two rolls of
its three broker pods, one after the other, in the same run:

* **as shipped**: a new pod template (a memory limit changed); the operator's data-aware roll
  restarts the pods one at a time, followers first, the leader last, each broker handing its part
  over as it stops (a follower leaves the in-sync set, the leader hands the lead to an in-sync
  follower), and the lead goes back to the preferred replica after;
* **the baseline, leadership moved by failover only**: the same pods' brokers in the same order
  killed with SIGKILL from their node (no hand-over: a follower's peering drops, the leader's
  ZooKeeper session expires and the next leader is elected), each once the one before is back in
  sync. (A pod deleted, even with ``--grace-period=0 --force``, gets SIGTERM first: its broker hands
  over as shipped.)

Per restarted pod, the longest the publisher waited for a confirmation (the publisher's own
timestamps, from the pod's restart until the next one or the roll's end); the roll's total time;
and at the end every confirmed record read back once, in order (confirmed lost: 0 expected). The
figure is the ratio of the two rolls' per-pod pauses. Everything is removed at the end (cluster and
dockerd). Prints one JSON line last.
"""

from __future__ import annotations

import itertools
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from zeps_dev.kind import E2E_WORKERS, kind_stack_from_env

ROOT = Path(__file__).resolve().parents[1]
STREAM, PREFERRED = "rolled", "rolled-broker-0"
RATE, GROUP = 100.0, 5  # a confirmed flush every 50 ms when nothing is in the way
COUNT = int(os.environ.get("ZEPS_BENCH_ROLL_COUNT", "90000"))  # 15 minutes at RATE: more than both rolls take
NAMESPACE = "bench-roll"
RESYNC_S = 10  # the kind stack's operator.resyncSeconds: status is at most this old


def say(text: str) -> None:
    print(f"[bench-roll-kind] {text}", flush=True)


def _stream(**spec: Any) -> dict[str, Any]:
    return {"apiVersion": "zeps.dev/v1alpha1", "kind": "ZepsStream", "metadata": {"name": STREAM},
            "spec": {"replicas": 3, "minInSync": 2, "storage": {"size": "1Gi"}, "fsync": "always", **spec}}  # fmt: skip


def main() -> None:  # noqa: PLR0915 — one scenario, step by step
    with kind_stack_from_env(cluster_name="zeps-bench", workers=E2E_WORKERS) as stack:
        assert stack.cluster is not None
        os.environ.update(stack.env())  # what the e2e helpers read (the image, the kubeconfig)
        sys.path[:0] = [str(ROOT / "e2e"), str(ROOT / "e2e" / "kind")]
        from kindapp import App, client_namespace, docker, json_lines  # noqa: PLC0415
        from test_operations import CHECK, _broker_process  # noqa: PLC0415 — a stream read back whole; a broker's PIDs

        from conftest import Cluster  # noqa: PLC0415 — e2e/conftest.py: kubectl and its waits

        cluster = Cluster([str(stack.binaries / "kubectl"), f"--kubeconfig={stack.cluster.kubeconfig}"])
        app = client_namespace(cluster, NAMESPACE)  # its pods reach ZooKeeper (the production NetworkPolicy)
        pods = [f"{STREAM}-broker-{i}" for i in range(3)]

        def whole() -> bool:
            r = app.replication(STREAM)
            return r.get("leader") == PREFERRED and len(r.get("inSync", [])) == 3

        app.apply(_stream())
        app.ready("zepsstream", STREAM, timeout=300)
        cluster.wait_for("three in sync, the preferred replica leading", whole, timeout=240, interval=2)
        app.start_publisher(STREAM, COUNT, RATE, GROUP, control_plane=True)
        cluster.wait_for("the publisher confirming", lambda: app.confirmed_past(20 * GROUP), timeout=240, interval=1)

        def pauses(marks: list[tuple[str, float]], ended: float) -> dict[str, float]:
            """Per restarted pod: the longest gap between confirmations from its restart to the next
            pod's (the last: to ``ended``), seconds."""
            gaps = list(itertools.pairwise(m["t"] for m in app.confirmed()))
            out = {}
            for i, (pod, began) in enumerate(marks):
                until = marks[i + 1][1] if i + 1 < len(marks) else ended
                # every wait that overlaps the window (one may begin before the restart and end after it)
                out[pod] = round(max((b - a for a, b in gaps if b >= began and a <= until), default=0.0), 3)
            return out

        # 1. as shipped: a new template, the operator's roll with hand-overs
        say("roll 1: a new pod template, the operator's data-aware roll (hand-overs)")
        began = time.time()
        app.apply(_stream(resources={"limits": {"memory": "768Mi"}}))

        def rolled() -> bool:
            status = app.get("zepsstream", STREAM).get("status", {})
            return not status.get("roll") and app.condition(STREAM, "Rolling").get("status") == "False" and len(
                status.get("replication", {}).get("inSync", [])) == 3  # fmt: skip

        cluster.wait_for("the roll started", app.rolled_pods, timeout=180, interval=1)
        cluster.wait_for("the roll done, all three in sync", rolled, timeout=900, interval=1)
        cluster.wait_for("the lead back at the preferred replica", whole, timeout=300, interval=1)
        shipped_s = time.time() - began
        events = app.rolled_pods()
        marks = [(e["message"].split(" ", 1)[0], _when(e)) for e in events]
        shipped = pauses(marks, time.time())
        say(f"roll 1: {shipped_s:.0f} s, per pod {shipped}")

        # 2. the baseline: the same order, each pod killed (no hand-over), the next once it is back
        say("roll 2: the same brokers killed one at a time (SIGKILL from their node: failover only)")
        order = [pod for pod, _ in marks]
        assert sorted(order) == pods, f"roll 1 restarted {order}"
        began, kills = time.time(), []
        for pod in order:
            node, pids = _broker_process(app, pod)
            assert pids, f"no zeps-broker process of {pod} found on {node}"
            restarts, confirmed, killed = _restarts(app, pod), app.confirmed()[-1]["confirmed"], time.time()
            kills.append((pod, killed))
            docker("exec", node, "kill", "-KILL", *pids)

            def back(p: str = pod, r: int = restarts, n: int = confirmed, k: float = killed) -> bool:
                # restarted and confirming again; all three in sync in a status written since (the
                # operator's resync, 10 s, at least once after the kill)
                return (
                    _restarts(app, p) > r
                    and _ready(app, p)
                    and app.confirmed_past(n + 10 * GROUP)
                    and time.time() > k + RESYNC_S + 2
                    and len(app.replication(STREAM).get("inSync", [])) == 3
                )

            cluster.wait_for(f"{pod} back and all three in sync", back, timeout=600, interval=1)
        cluster.wait_for("the lead back at the preferred replica", whole, timeout=300, interval=1)
        baseline_s = time.time() - began
        baseline = pauses(kills, time.time())
        say(f"roll 2: {baseline_s:.0f} s, per pod {baseline}")

        app.hurry()
        cluster.wait_for("the publisher to finish", lambda: app.confirmed_past(COUNT), timeout=1200, interval=5)
        app.apply({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "check"}, "data": {"check.py": CHECK}})
        spec = App.pod_spec(f"exec python /worker/check.py {STREAM} {COUNT}")
        spec["containers"][0]["volumeMounts"] = [{"name": "worker", "mountPath": "/worker"}]
        spec["volumes"] = [{"name": "worker", "configMap": {"name": "check"}}]
        app.apply({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "check"}, "spec": spec})
        check = json_lines(app.wait_succeeded("check", timeout=900))[-1]
        lost = COUNT - check["read"] if check["in_order_once"] else None
        cluster.kubectl("delete", "namespace", NAMESPACE, "--wait=false", check=False)
    followers, leader = order[:-1], order[-1]
    result = {
        "scenario": "roll-kind", "replicas": 3, "min_insync": 2, "rate": RATE, "group": GROUP,
        "order": order,
        "longest_confirmation_wait_s": {"handover": shipped, "failover_only": baseline},
        "follower_ratio_failover_to_handover": _ratio([baseline[p] for p in followers],
                                                      [shipped[p] for p in followers]),
        "leader_ratio_failover_to_handover": _ratio([baseline[leader]], [shipped[leader]]),
        "roll_seconds": {"handover": round(shipped_s), "failover_only": round(baseline_s)},
        "confirmed": COUNT, "read_back": check["read"], "in_order_once": check["in_order_once"], "lost": lost,
    }  # fmt: skip
    print(json.dumps(result))


def _when(event: dict[str, Any]) -> float:
    """An event's time (its lastTimestamp, to the second) as time.time() would say it."""
    from datetime import datetime  # noqa: PLC0415

    stamp = event.get("lastTimestamp") or event["metadata"]["creationTimestamp"]
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def _restarts(app: Any, pod: str) -> int:
    """How often ``pod``'s containers restarted."""
    return sum(c.get("restartCount", 0) for c in app.get("pod", pod)["status"].get("containerStatuses", []))


def _ready(app: Any, pod: str) -> bool:
    conditions = app.get("pod", pod)["status"].get("conditions", [])
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _ratio(slow: list[float], fast: list[float]) -> float | None:
    return round(max(slow) / max(fast), 2) if fast and max(fast) > 0 else None


if __name__ == "__main__":
    main()

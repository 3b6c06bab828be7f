"""A partitioned, replicated ZepsStream on kind (README, "Partitioned streams"): three partitions of
three replicas each (``examples/zepsstream-partitioned.yaml``), a publisher Job spreading keys over
them, and a consumer group of three pods (a Deployment) sharing the partitions. One member pod is
deleted mid-run: its partition passes to another member, the Deployment's new pod joins, and in the
end every message took effect exactly once, none was processed twice by the group, and each key's
records are in order in its partition.

The members' handler is idempotent (``workers/group_member.py``): its effect is a ZooKeeper node per
(partition, sequence, body), and a message it finds already processed is recorded apart. A member
that leaves commits first, so that record stays empty; without the hand-over (a member that left
without committing, or two members reading one partition) it fills, and without reassignment the
deleted member's partition is never finished."""

from __future__ import annotations

import json
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from kindapp import STACK_DUMP_LABEL, App, ZooKeeperShell, json_lines

from zeps.partitioning import partition_of

WORKERS = Path(__file__).resolve().parent / "workers"
STREAM, GROUP, PARTITIONS = "orders", "billing", 3  # examples/zepsstream-partitioned.yaml
COUNT, RATE, FLUSH, KEYS = 3000, 60.0, 20, 50  # about 50 s of publishing: the deletion happens within it


def _figure(**fields: object) -> None:
    print("\nFIGURE " + json.dumps(fields), flush=True)


def _partitions(app: App) -> list[dict[str, Any]]:
    return list(app.get("zepsstream", STREAM).get("status", {}).get("partitions", []))


def _members(app: App) -> list[str]:
    """The consumer group's running pods (not the ones being deleted)."""
    pods = app.pods(GROUP)
    return sorted(p["metadata"]["name"] for p in pods
                  if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp"))  # fmt: skip


def _group(app: App) -> dict[str, Any]:
    """``zeps --json stream lag orders --group billing``, run in a member's pod (the CLI as a user
    of the cluster runs it); {} when it has no answer yet."""
    members = _members(app)
    if not members:
        return {}
    out = app.cluster.kubectl("exec", members[0], "-n", app.ns, "--", "zeps", "--json", "stream", "lag", STREAM,
                              "--group", GROUP, check=False, timeout=60)  # fmt: skip
    lines = [line for line in str(out).splitlines() if line.startswith("{")]
    return dict(json.loads(lines[-1])) if lines else {}


def _owners(lag: dict[str, Any]) -> list[str]:
    return [p.get("group", {}).get("owner", "") for p in lag.get("partitions", [])]


def _start(app: App, effects: str, again: str) -> None:
    """The workers as a ConfigMap, the group's Deployment of three members, the publisher Job."""
    scripts = {f"{n}.py": (WORKERS / f"{n}.py").read_text() for n in ("group_member", "ledger_publisher")}
    app.apply({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "workers"}, "data": scripts})

    def spec(command: str, restart: str) -> dict[str, Any]:
        out = App.pod_spec(command, restart=restart)
        out["containers"][0]["volumeMounts"] = [{"name": "workers", "mountPath": "/workers"}]
        out["volumes"] = [{"name": "workers", "configMap": {"name": "workers"}}]
        return out

    labels = {"app": GROUP, STACK_DUMP_LABEL: "1"}
    app.apply({
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": GROUP},
        "spec": {"replicas": 3, "selector": {"matchLabels": {"app": GROUP}},
                 "template": {"metadata": {"labels": labels},
                              "spec": spec(f"exec python /workers/group_member.py {STREAM} {GROUP} {effects} {again}",
                                           "Always")}},
    })  # fmt: skip
    publish = f"exec python /workers/ledger_publisher.py {STREAM} {COUNT} {RATE} {FLUSH} {KEYS}"
    app.apply({
        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "publisher"},
        "spec": {"backoffLimit": 0, "template": {"metadata": {"labels": {"app": "publisher", STACK_DUMP_LABEL: "1"}},
                                                 "spec": spec(publish, "Never")}},
    })  # fmt: skip


@pytest.mark.timeout(900)
def test_a_consumer_group_of_pods_shares_a_partitioned_streams_partitions_and_loses_a_member_losing_nothing(
    cluster: Any, app: App, zk: ZooKeeperShell
) -> None:
    app.apply_example("zepsstream-partitioned.yaml")
    app.ready("zepsstream", STREAM, timeout=420)
    cluster.wait_for(
        "every partition with three replicas in sync",
        lambda: len(ps := _partitions(app)) == PARTITIONS and all(len(p.get("inSync", [])) == 3 for p in ps),
        timeout=180,
    )  # fmt: skip
    for p in range(PARTITIONS):  # each partition's replicas on three nodes
        instance = STREAM if p == 0 else f"{STREAM}.p{p}"
        pods = app.get("pods", "-l", f"app.kubernetes.io/instance={instance}")["items"]
        assert len({pod["spec"].get("nodeName") for pod in pods}) == 3, f"partition {p}'s replicas share nodes"

    root = f"/zeps-e2e/{app.ns}"  # the handler's effects, outside what zeps keeps in ZooKeeper
    for path in ("/zeps-e2e", root, f"{root}/effects", f"{root}/again"):
        zk.run("create", path)
    assert zk.children(f"{root}/effects") == []
    _start(app, f"{root}/effects", f"{root}/again")

    def shared_by_three() -> bool:
        members = _members(app)
        return len(members) == 3 and sorted(_owners(_group(app))) == members

    def committed() -> int:
        return sum(p.get("group", {}).get("committed", 0) for p in _group(app).get("partitions", []))

    cluster.wait_for("three members in the group, a partition each", shared_by_three, timeout=240, interval=2)
    cluster.wait_for("a third of the messages processed", lambda: committed() >= COUNT // 3, timeout=240, interval=2)

    # a member deleted mid-run: it commits and leaves, another member takes its partition over
    before = _group(app)
    gone = _owners(before)[0]
    deleted_at = time.monotonic()
    cluster.kubectl("delete", "pod", gone, "-n", app.ns, "--wait=true", timeout=60)
    cluster.wait_for(f"partition 0 read by a member other than {gone}",
                     lambda: (o := _owners(_group(app))) and o[0] not in ("", gone),
                     timeout=120, interval=1)  # fmt: skip
    handed_over_s = time.monotonic() - deleted_at

    cluster.wait_for("the publisher to finish", lambda: app.get("job", "publisher")["status"].get("succeeded") == 1,
                     timeout=300, interval=3)  # fmt: skip
    confirmed = [m["confirmed"] for m in json_lines(app.logs("job/publisher")) if "confirmed" in m]
    assert confirmed[-1] == COUNT

    def caught_up() -> bool:
        g = _group(app)
        return g.get("group", {}).get("lag") == 0 and sum(p["lastSequence"] for p in g["partitions"]) == COUNT

    cluster.wait_for("the group caught up: every partition committed to its last sequence", caught_up, timeout=240,
                     interval=3)  # fmt: skip
    final = _group(app)

    # every message took effect once, in its key's partition, in order per key; none processed twice
    effects = [name.split("-") for name in zk.children(f"{root}/effects")]
    bodies = sorted(int(b) for _p, _s, b in effects)
    missing, twice_stored = COUNT - len(set(bodies)), len(bodies) - len(set(bodies))
    assert bodies == list(range(1, COUNT + 1)), f"{missing} missing, {twice_stored} took effect twice"
    by_partition: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for p, s, b in effects:
        assert int(p) == partition_of(f"customer-{int(b) % KEYS}", PARTITIONS), f"body {b} in partition {p}"
        by_partition[int(p)].append((int(s), int(b)))
    for p, records in by_partition.items():
        records.sort()
        assert [s for s, _b in records] == list(range(1, len(records) + 1)), f"partition {p}: a gap in its sequences"
        per_key: dict[int, list[int]] = defaultdict(list)
        for _s, b in records:
            per_key[b % KEYS].append(b)
        assert all(v == sorted(v) for v in per_key.values()), f"partition {p}: a key's records out of order"
    twice = zk.children(f"{root}/again")
    assert twice == [], f"processed twice by the group: {twice[:10]}"
    members = final["group"]["members"]
    assert gone not in members and len(members) == 3, members  # the Deployment's new pod joined
    zk.run("deleteall", root)
    _figure(
        scenario="partitioned stream 3x3, consumer group of 3 pods, one member pod deleted mid-run",
        partition_sizes={p: len(r) for p, r in sorted(by_partition.items())},
        member_deleted=gone,
        partition_zero_read_again_after_s=round(handed_over_s, 1),
        owners_before=_owners(before),
        owners_after=_owners(final),
        processed=len(effects),
        processed_twice=len(twice),
    )

"""A chart upgrade on kind with three worker nodes, as users run one (docs: operations, "Upgrading"):
``kubectl apply -f crds/``, then ``helm upgrade --reuse-values`` with a new image tag and a changed
setting, while a publisher Job and a subscriber pod run against an R3 stream, and another pair
against a 2-partition R3 stream.

The new tag names the same image (retagged in each node's containerd: no registry here), so the
operator's Deployment rolls, and every broker pod template changes with the operator's broker image.
The StatefulSets update ``OnDelete``; the operator restarts the pods of each broker set one at a
time, followers first and the set's leader last, each back in the in-sync set before the next; each
stopping broker hands over (a follower leaves the in-sync set, the leader its lead), and once the
set is rolled the lead returns to its preferred replica (ordinal *partition* mod 3). Every confirmed
publish reaches the subscriber once, in order (per partition), with no gap; the order of restarts is
the operator's events'. The publishers' longest waits for a confirmation are printed as a figure
(never asserted)."""

from __future__ import annotations

import json
import os
import time
from collections import defaultdict
from typing import Any

import pytest
from kindapp import IMAGE, OPERATOR_NAMESPACE, RELEASE, ROOT, App, docker, helm, json_lines

from zeps.partitioning import partition_of

SINGLE, PARTED = "rolled", "parted"
COUNT, RATE, GROUP, KEYS = 6000, 20.0, 10, 8  # 300 s of publishing at least, the roll within it (then hurried)


def _stream(name: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "zeps.dev/v1alpha1", "kind": "ZepsStream", "metadata": {"name": name},
            "spec": {"replicas": 3, "minInSync": 2, "storage": {"size": "256Mi"}, "fsync": "always",
                     **spec}}  # fmt: skip


def _leaders(app: App) -> dict[str, str]:
    """Each broker set (its StatefulSet's name) and its leader: "" while it has none."""
    out = {f"{SINGLE}-broker": app.replication(SINGLE).get("leader", "")}
    for p in app.status("zepsstream", PARTED).get("partitions", []):
        out[f"{PARTED}-broker" + (f"-p{p['partition']}" if p["partition"] else "")] = p.get("leader", "")
    return out


def _preferred(sets: dict[str, str]) -> dict[str, str]:
    """Each set's preferred leader: ordinal *partition* mod 3 (partition 0 for the single stream)."""
    return {s: f"{s}-{int(s.rsplit('-p', 1)[1]) % 3 if '-p' in s else 0}" for s in sets}


def _whole(app: App) -> bool:
    """Both streams: every set's three replicas in sync, the preferred replica leading."""
    partitions = app.status("zepsstream", PARTED).get("partitions", [])
    leaders = _leaders(app)
    return (len(partitions) == 2 and all(len(p.get("inSync", [])) == 3 for p in partitions)
            and len(app.replication(SINGLE).get("inSync", [])) == 3 and leaders == _preferred(leaders))  # fmt: skip


def _images(app: App) -> dict[str, str]:
    """Each broker pod of both streams and the image its broker runs."""
    pods = app.get("pods", "-l", "app.kubernetes.io/name=zeps-broker")["items"]
    return {p["metadata"]["name"]: p["spec"]["containers"][0]["image"] for p in pods}


def _reference(image: str) -> str:
    """``image`` as containerd names it (``zeps:x`` is ``docker.io/library/zeps:x``)."""
    first = image.split("/", 1)[0]
    if "/" not in image:
        return f"docker.io/library/{image}"
    return image if ("." in first or ":" in first or first == "localhost") else f"docker.io/{image}"


def _retag(app: App, image: str, tag: str) -> None:
    """``image`` tagged ``tag`` too, in every node's containerd (what pushing a new tag is here)."""
    repository = image.rsplit(":", 1)[0]
    for node in app.cluster.json("nodes")["items"]:
        docker("exec", node["metadata"]["name"], "ctr", "-n", "k8s.io", "images", "tag", "--force",
               _reference(image), _reference(f"{repository}:{tag}"))  # fmt: skip


def _upgrade(*values: str) -> None:
    sets = [arg for value in values for arg in ("--set", value)]
    helm("upgrade", RELEASE, str(ROOT / "charts" / "zeps"), "--namespace", OPERATOR_NAMESPACE, "--reuse-values", *sets,
         "--wait", "--timeout", "5m")  # fmt: skip


def _every_body_once_in_order(app: App) -> None:
    """Each subscriber got every confirmed body once: in order on the single stream, in order and
    without a gap in each partition (one producer: its bodies ascend) on the partitioned one."""
    received = json_lines(app.wait_succeeded(f"subscriber-{SINGLE}", timeout=400))
    bodies = [m["body"] for m in received]
    assert bodies == [str(i) for i in range(1, COUNT + 1)], f"{len(bodies)} received, {len(set(bodies))} distinct"
    received = json_lines(app.wait_succeeded(f"subscriber-{PARTED}", timeout=400))
    assert sorted(int(m["body"]) for m in received) == list(range(1, COUNT + 1)), (
        f"{len(received)} received, {len({m['body'] for m in received})} distinct")  # fmt: skip
    by_partition: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for m in received:
        body = int(m["body"])
        assert m["partition"] == partition_of(f"customer-{body % KEYS}", 2), f"body {body} in {m['partition']}"
        by_partition[m["partition"]].append((m["sequence"], body))
    for p, records in by_partition.items():  # one producer: its bodies ascend in each partition, no gap
        sequences = [s for s, _ in records]
        assert sequences == list(range(sequences[0], sequences[0] + len(records))), f"partition {p}: a gap"
        assert [b for _, b in records] == sorted(b for _, b in records), f"partition {p}: out of order"


@pytest.mark.serial  # the chart is upgraded: the operator restarts, and it rolls every stream's brokers
@pytest.mark.timeout(1800)
def test_a_chart_upgrade_to_a_new_image_tag_rolls_every_broker_set_the_leader_last_losing_nothing(app: App) -> None:
    cluster = app.cluster
    tag = IMAGE.rsplit(":", 1)[1]
    new_tag = f"{tag}-upgraded"
    app.apply(_stream(SINGLE))
    app.apply(_stream(PARTED, partitions=2))
    for name in (SINGLE, PARTED):
        app.ready("zepsstream", name, timeout=300)
    cluster.wait_for("every set's three replicas in sync, its preferred replica leading", lambda: _whole(app),
                     timeout=300, interval=2)  # fmt: skip
    for name in (SINGLE, PARTED):
        since = "0" if name == SINGLE else "'{\"last\": [0, 0]}'"
        app.run_pod(f"subscriber-{name}", f"exec zeps --json stream replay {name} --since {since} --count {COUNT} "
                    "--timeout 600")  # fmt: skip
    app.start_publisher(SINGLE, COUNT, RATE, GROUP, job=f"publisher-{SINGLE}")
    app.start_publisher(PARTED, COUNT, RATE, GROUP, keys=KEYS, job=f"publisher-{PARTED}")
    cluster.wait_for("300 confirmed on each", lambda: all(app.confirmed_past(300, f"publisher-{n}")
                     for n in (SINGLE, PARTED)), timeout=240, interval=1)  # fmt: skip

    leaders = _leaders(app)
    _retag(app, IMAGE, new_tag)
    began = time.time()
    try:
        cluster.kubectl("apply", "-f", str(ROOT / "crds"))  # the upgrade steps, in order
        _upgrade(f"image.tag={new_tag}", "operator.resyncSeconds=11")
        new_image = f"{IMAGE.rsplit(':', 1)[0]}:{new_tag}"
        cluster.wait_for("the operator's broker image changed", lambda: new_image in set(_images(app).values()),
                         timeout=180, interval=2)  # fmt: skip

        def rolled() -> bool:
            images = _images(app)
            return (len(images) == 9 and set(images.values()) == {new_image} and all(
                not app.status("zepsstream", n).get("roll") and app.condition(n, "Rolling").get("status") == "False"
                for n in (SINGLE, PARTED)) and _whole(app))  # fmt: skip

        cluster.wait_for("every broker pod on the new image, the rolls done, each set whole with its preferred "
                         "leader", rolled, timeout=900, interval=2)  # fmt: skip
        ended = time.time()
        still = {n: app.confirmed(f"publisher-{n}")[-1]["confirmed"] for n in (SINGLE, PARTED)}
        assert all(v < COUNT for v in still.values()), f"a publisher finished before the roll did: {still}"

        # each set's pods restarted once each, its leader at the upgrade last
        order: dict[str, list[str]] = defaultdict(list)
        for event in app.rolled_pods():
            pod = event["message"].split(" ", 1)[0]
            order[pod.rsplit("-", 1)[0]].append(pod)
        assert sorted(order) == sorted(leaders), f"rolled sets {sorted(order)}, not {sorted(leaders)}"
        for s, pods in order.items():
            assert sorted(pods) == [f"{s}-{i}" for i in range(3)], f"{s}: restarts {pods}, not one each"
            assert pods[-1] == leaders[s], f"{s}: restarts {pods}, its leader {leaders[s]} not last"

        for name in (SINGLE, PARTED):
            app.hurry(f"publisher-{name}")  # the roll is over: the rest at once
            cluster.wait_for(f"publisher-{name} to finish", lambda n=name: app.confirmed_past(COUNT, f"publisher-{n}"),
                             timeout=600, interval=2)  # fmt: skip
        _every_body_once_in_order(app)
    finally:  # the chart as make e2e installed it, for the tests after this one (the streams go first:
        # restoring the tag would roll them again)
        cluster.kubectl("delete", "zepsstream", "--all", "-n", app.ns, "--timeout=180s", timeout=210, check=False)
        _upgrade(f"image.tag={tag}", f"operator.resyncSeconds={_resync()}")
    print("\nFIGURE " + json.dumps({
        "fault": "helm upgrade to a new image tag: the operator's roll of an R3 stream and a 2-partition R3 stream",
        "restart_order": order, "leaders": leaders, "roll_s": round(ended - began, 1),
        "longest_confirmation_pause_s": {n: app.longest_pause(began, ended, f"publisher-{n}")
                                         for n in (SINGLE, PARTED)},
        "confirmed": 2 * COUNT, "lost": 0}), flush=True)  # fmt: skip


def _resync() -> str:
    """The operator's resync period as make e2e installed the chart."""
    values = dict(v.split("=", 1) for v in os.environ["ZEPS_E2E_CHART_VALUES"].split(","))
    return values.get("operator.resyncSeconds", "30")

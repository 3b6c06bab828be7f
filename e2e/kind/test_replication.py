"""A replicated ZepsStream on kind with three worker nodes (README, "Replicated streams"): its three
brokers on three nodes, a publisher Job and three subscriber pods on the control-plane node (never
stopped here). Under load, one fault after another, each healed before the next:

1. the leader's pod is deleted;
2. the node of the next leader is lost (its node container killed, as a power cut takes a
   machine); the node comes back and its replica catches up;
3. all three broker pods are deleted at once (the StatefulSet starts them again together,
   ``podManagementPolicy: Parallel``: the restart a power cut of the whole stream makes);
4. a node is lost while the pod of a replica on another node is deleted.

Every confirmed publish reaches every subscriber exactly once, in order, with no gap (a delivered
record is never taken back: a subscriber would see another body at its sequence, or a gap).

Each fault prints its figure (never a timed assertion). Without replication there is no leader to
find, no follower to take over, and the node's loss takes the one journal with it: the test fails
waiting for confirmations.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Callable
from typing import Any

import pytest
from kindapp import (
    OPERATOR_NAMESPACE,
    RELEASE,
    STACK_DUMP_LABEL,
    App,
    ZooKeeperShell,
    docker,
    dump_stacks,
    json_lines,
    on_control_plane,
)

from zeps_dev.kind import wire_pod_network

STREAM = "ledger"  # examples/zepsstream-replicated.yaml
COUNT, RATE, GROUP = 12000, 40.0, 20  # 300 s of publishing at least: the four faults happen within it (then hurried)


def _figure(**fields: object) -> None:
    print("\nFIGURE " + json.dumps(fields), flush=True)


def _brokers(app: App) -> dict[str, str]:
    """Each broker pod of the stream, and the node it is on."""
    pods = app.get("pods", "-l", f"app.kubernetes.io/instance={STREAM}")["items"]
    return {p["metadata"]["name"]: p["spec"].get("nodeName", "") for p in pods}


#: the ``zeps`` command, with every thread's stack printed to its log on SIGUSR1 (faulthandler): where a
#: subscriber that does not finish waits (:func:`_replayed`)
ZEPS_DUMPING_STACKS = (
    "python -c 'import faulthandler, signal; "
    "faulthandler.register(signal.SIGUSR1, all_threads=True); from zeps.cli import main; main()'"
)


def _start_clients(app: App) -> list[str]:
    """Three subscriber pods replaying from the journal's start through both faults until the last
    message, and the publisher Job (workers/ledger_publisher.py), all on the control-plane node;
    returns the subscribers' names."""
    subscribers = [f"subscriber-{i}" for i in range(3)]
    for name in subscribers:
        command = f"exec {ZEPS_DUMPING_STACKS} --json stream replay {STREAM} --since 0 --count {COUNT} --timeout 600"
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {STACK_DUMP_LABEL: "usr1"}},
               "spec": on_control_plane(App.pod_spec(command))}  # fmt: skip
        app.apply(pod)
    app.start_publisher(STREAM, COUNT, RATE, GROUP, control_plane=True)
    return subscribers


@pytest.mark.serial  # a node is stopped: every pod on it goes
@pytest.mark.timeout(1800)
def test_a_replicated_stream_loses_nothing_confirmed_to_pod_deletions_and_node_losses(
    cluster: Any, app: App, zk: ZooKeeperShell
) -> None:
    app.apply_example("zepsstream-replicated.yaml")
    app.ready("zepsstream", STREAM, timeout=300)
    cluster.wait_for("three replicas in sync", lambda: len(app.replication(STREAM).get("inSync", [])) == 3, timeout=180)
    brokers = _brokers(app)
    assert len(set(brokers.values())) == 3, f"the replicas share nodes: {brokers}"

    subscribers = _start_clients(app)

    # 1. the leader's pod deleted (its broker closes its ZooKeeper session as it stops)
    cluster.wait_for("1,000 confirmed", lambda: app.confirmed_past(1000), timeout=240, interval=1)
    first = app.replication(STREAM)
    deleted_at, before = time.time(), app.confirmed()[-1]["confirmed"]
    cluster.kubectl("delete", "pod", first["leader"], "-n", app.ns, "--wait=false")
    cluster.wait_for("confirmations after the deletion", lambda: app.confirmed_past(before + 10 * GROUP), timeout=240)
    cluster.wait_for(
        "a new leader in a later epoch, and three in sync again",
        lambda: (r := app.replication(STREAM)).get("leader") not in ("", first["leader"])
        and r["epoch"] > first["epoch"] and len(r.get("inSync", [])) == 3,
        timeout=240,
    )  # fmt: skip

    # 2. the new leader's node lost: its container killed (SIGKILL to its init, as a power cut: no
    # broker stops cleanly, so the leader's ZooKeeper session is left to expire; that node's
    # ZooKeeper server goes too, and maybe the operator's pod). (`docker stop -t 0` is no power cut:
    # systemd stops the pods first, and the leader closed its session in milliseconds.)
    second = app.replication(STREAM)
    placed = _brokers(app)
    node = placed[second["leader"]]
    cluster.wait_for("1,000 more confirmed", lambda: app.confirmed_past(before + 1000), timeout=240, interval=1)
    # what else the node takes with it (the figure's spread depends on it)
    zookeeper_leader = next((i for i, mode in zk.modes().items() if mode == "leader"), -1)
    zookeeper_pods = cluster.json("pods", "-n", OPERATOR_NAMESPACE, "-l", "app.kubernetes.io/name=zookeeper")["items"]
    coredns = cluster.json("pods", "-n", "kube-system", "-l", "k8s-app=kube-dns")["items"]
    also_lost = {
        "zookeeper_leader": any(p["metadata"]["name"].endswith(f"-{zookeeper_leader}") and p["spec"]["nodeName"] == node
                                for p in zookeeper_pods),
        "coredns_pods": sum(p["spec"].get("nodeName") == node for p in coredns),
    }  # fmt: skip
    killed_at, before = time.time(), app.confirmed()[-1]["confirmed"]
    docker("kill", node)
    try:
        cluster.wait_for("confirmations by a new leader", lambda: app.confirmed_past(before + 10 * GROUP), timeout=240)
    finally:  # 3. the node comes back (whatever happened): its routes are wired again, its pods restart
        docker("start", node)
        rejoined_at = time.monotonic()
        cluster.wait_for(f"node {node} back, its pod network wired", lambda: _wired(cluster, node), timeout=180,
                         interval=2)  # fmt: skip
    cluster.wait_for(
        f"the replica on {node} back in sync",
        lambda: (r := app.replication(STREAM)).get("leader")
        and r["epoch"] > second["epoch"]  # not the status of before
        and len(r.get("inSync", [])) == 3,  # it rejoins the set once it caught up
        timeout=360,
        interval=2,
    )  # fmt: skip
    caught_up_s = time.monotonic() - rejoined_at

    all_at, before = _all_pods_deleted(cluster, app, before + 2000)  # 3.
    both_at, before = _a_node_and_a_pod_lost(cluster, app, before + 500)  # 4.

    # every fault under load: the publisher had more to publish when the last was over
    assert not app.confirmed_past(COUNT), "the publisher finished before the faults did: raise COUNT"
    # everything confirmed, delivered to every subscriber once, in order, with no gap
    app.hurry()  # the faults are over: the rest at once
    cluster.wait_for("the publisher to finish", lambda: app.confirmed_past(COUNT), timeout=600, interval=2)
    expected = [str(i) for i in range(1, COUNT + 1)]
    for name in subscribers:
        received = _replayed(app, name, timeout=400)
        bodies = [m["body"] for m in received]
        assert bodies == expected, (
            f"{name}: {len(bodies)} messages; missing {sorted(set(expected) - set(bodies), key=int)[:5]}, "
            f"{len(bodies) - len(set(bodies))} twice"
        )
        sequences = [m["sequence"] for m in received]
        assert sequences == list(range(sequences[0], sequences[0] + COUNT)), f"{name}: a gap in the sequences"
    final = app.replication(STREAM)
    # the cluster as found, for the tests after this one: the lost node's ZooKeeper server back in the
    # ensemble, the operator serving (its pod may have been on that node)
    cluster.wait_for("the ensemble whole again", zk.whole, timeout=240, interval=2)
    cluster.kubectl("rollout", "status", f"deployment/{RELEASE}-operator", "-n", OPERATOR_NAMESPACE, "--timeout=240s",
                    timeout=270)  # fmt: skip
    _figure(
        fault="replicated stream: leader pod deleted; the next leader's node lost; all pods deleted; a node and a pod",
        longest_confirmation_pause_pod_deleted_s=app.longest_pause(deleted_at, killed_at),
        longest_confirmation_pause_node_lost_s=app.longest_pause(killed_at, killed_at + 60),
        longest_confirmation_pause_all_pods_deleted_s=app.longest_pause(all_at, all_at + 120),
        longest_confirmation_pause_node_and_pod_s=app.longest_pause(both_at, both_at + 120),
        node_lost=node,
        leader_on_it=second["leader"],
        also_on_it=also_lost,
        brokers=placed,
        node_back_to_replica_in_sync_s=round(caught_up_s, 1),
        epochs=[first["epoch"], second["epoch"], final["epoch"]],
        confirmed=COUNT,
        lost=0,
        stored_twice=0,
        flushes_retried=sum(1 for m in json_lines(app.logs("job/publisher")) if "waiting" in m),
    )


def _replayed(app: App, name: str, timeout: float) -> list[dict[str, Any]]:
    """The messages subscriber ``name`` printed, once its pod succeeded. If it has not within
    ``timeout``: what it received, where it waits (its threads' stacks), the stream's replication
    status and its subscriptions as the brokers report them, on the failure's first line (CI shows
    a failure's output only in part)."""
    try:
        return json_lines(app.wait_succeeded(name, timeout=timeout))
    except AssertionError as exc:  # still running (a failed pod fails the test at once)
        cluster = app.cluster
        dump_stacks(cluster, name, app.ns)
        log = app.logs(name)
        received = json_lines(log)
        last = received[-1].get("sequence") if received else None
        said = [_frame(line.strip()) for line in log.splitlines() if line.strip() and not line.startswith("{")]
        stacks = " | ".join(said[-30:])  # the dump's last threads, the main one last
        lag = cluster.kubectl("exec", name, "-n", app.ns, "--", "zeps", "--json", "stream", "lag", STREAM,
                              check=False, timeout=60)  # fmt: skip
        subscriptions = " ".join(line for line in str(lag).splitlines() if line.startswith("{"))
        raise AssertionError(
            f"{name} did not finish: {len(received)} received, the last sequence {last}; replication "
            f"{app.replication(STREAM)}; the brokers' subscriptions {subscriptions or lag!r}; its log: {stacks}"
        ) from exc


def _frame(line: str) -> str:
    """A stack dump's ``File "/opt/.../zeps/client/sync.py", line 276 in _pump`` as ``sync.py:276 _pump``;
    any other line as it is."""
    found = re.fullmatch(r'File "(?:.*/)?([^/"]+)", line (\d+) in (\S+)', line)
    return f"{found[1]}:{found[2]} {found[3]}" if found else line


def _whole_again(app: App, after: int) -> Callable[[], bool]:
    """A leader in an epoch after ``after``, with the three replicas in sync."""

    def whole() -> bool:
        r = app.replication(STREAM)
        return bool(r.get("leader")) and r.get("epoch", 0) > after and len(r.get("inSync", [])) == 3

    return whole


def _all_pods_deleted(cluster: Any, app: App, wait: int) -> tuple[float, int]:
    """3. Once ``wait`` are confirmed, every broker pod deleted at once: they start again together, each
    from its journal. Returns (when, confirmed then)."""
    epoch = app.replication(STREAM)["epoch"]
    cluster.wait_for(f"{wait} confirmed", lambda: app.confirmed_past(wait), timeout=240, interval=1)
    at, before = time.time(), app.confirmed()[-1]["confirmed"]
    cluster.kubectl("delete", "pod", "-n", app.ns, "-l", f"app.kubernetes.io/instance={STREAM}", "--wait=false",
                    "--grace-period=1")  # fmt: skip
    cluster.wait_for("confirmations after all three restarted", lambda: app.confirmed_past(before + 10 * GROUP),
                     timeout=300, interval=1)  # fmt: skip
    cluster.wait_for("three in sync again, in a later epoch", _whole_again(app, epoch), timeout=300, interval=2)
    return at, before


def _a_node_and_a_pod_lost(cluster: Any, app: App, wait: int) -> tuple[float, int]:
    """4. Once ``wait`` are confirmed, the leader's node lost while a follower's pod (on another node)
    is deleted: the third replica and the deleted one elect and serve; the node comes back."""
    r = app.replication(STREAM)
    placed = _brokers(app)
    lost_node = placed[r["leader"]]
    deleted_pod = next(p for p in sorted(placed) if p != r["leader"])
    cluster.wait_for(f"{wait} confirmed", lambda: app.confirmed_past(wait), timeout=240, interval=1)
    at, before = time.time(), app.confirmed()[-1]["confirmed"]
    docker("kill", lost_node)
    cluster.kubectl("delete", "pod", deleted_pod, "-n", app.ns, "--wait=false")
    try:
        cluster.wait_for("confirmations by a leader on the third node", lambda: app.confirmed_past(before + 10 * GROUP),
                         timeout=300)  # fmt: skip
    finally:
        docker("start", lost_node)
        cluster.wait_for(f"node {lost_node} back, its pod network wired", lambda: _wired(cluster, lost_node),
                         timeout=180, interval=2)  # fmt: skip
    cluster.wait_for("three in sync again after the node and the pod", _whole_again(app, r["epoch"]), timeout=360,
                     interval=2)  # fmt: skip
    return at, before


def _wired(cluster: Any, node: str) -> bool:
    """Once the restarted ``node``'s kubelet reports its address (a new one, maybe), every node's
    pod network wired again: the node's routes went with its network namespace."""
    address = docker("inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}", node)
    nodes = cluster.json("nodes")["items"]
    listed = next(n for n in nodes if n["metadata"]["name"] == node)
    if address not in {a["address"] for a in listed["status"].get("addresses", [])}:
        return False
    wire_pod_network(nodes, _docker_exec)
    return True


def _docker_exec(node: str, argv: Any, data: bytes | None) -> None:
    subprocess.run(["docker", "exec", "-i", node, *argv], input=data, capture_output=True, check=True, timeout=60)

"""Two tenants on one cluster (issue 48's suite): tenant A runs a replicated CURVE stream with ZooKeeper
ACLs, an idempotent publisher and a subscriber; tenant B, in its own namespace with its own
ZooKeeper identity and the examples' client RBAC, attacks A while A's traffic runs:

* every kind of node of A's in ZooKeeper, read or written with B's identity and with none (the
  replication state, manifest, spec, broker members, the election line, partitions, queue items,
  A's quota): refused (``NoAuth``);
* A's leader reached directly, attaching as a replica with a CURVE key of B's own and with no CURVE
  at all: no answer;
* the root of a third namespace C claimed in ZooKeeper before C used zeps: the operator takes it
  back when C's first object comes (C's ACL on it, B's gone);
* B's own Topic's spec node nested 100,000 deep (B may write its own nodes): the operator, which
  reads it, keeps serving A (a new Topic of A's becomes Ready; the operator never restarts);
* B's ZepsStream asking for an image off the chart's allow-list: not Ready (``PodNotAllowed``), no
  pod made; a ZepsStream named with a dot: refused by the API server (the CRD's CEL rule).

A's publisher has every publish confirmed and its subscriber reads each one once, in order: B
cost A nothing. The attacks on ZooKeeper run in a pod of B's (``workers/hostile_tenant.py``).
"""

from __future__ import annotations

import copy
import secrets
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kindapp import OPERATOR_NAMESPACE, App, client_namespace, json_lines

WORKERS = Path(__file__).resolve().parent / "workers"
COUNT, RATE, GROUP = 1200, 12.0, 4  # 100 s of publishing: B's attacks happen within it
CLIENT_DIR = "/etc/zeps/client"


def _namespace(app: App, suffix: str) -> App:
    """Another tenant's namespace beside ``app``'s, with the examples' client RBAC (deleted by the caller)."""
    return client_namespace(app.cluster, f"{app.ns}-{suffix}")


@pytest.fixture
def tenants(app: App) -> Iterator[tuple[App, App]]:
    """Tenant B's namespace and a third, C's (which uses zeps only late in the test)."""
    made = []
    try:
        for suffix in ("b", "c"):
            made.append(_namespace(app, suffix))
        yield made[0], made[1]
    finally:
        for other in made:
            app.cluster.kubectl("delete", "namespace", other.ns, "--wait=false", check=False)


def _identity(app: App) -> dict[str, Any]:
    """The namespace's ZooKeeper identity (its zeps-zookeeper-auth Secret, made here), as pod environment."""
    app.apply({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "zeps-zookeeper-auth"},
               "stringData": {"user": app.ns, "password": secrets.token_hex(8)}})  # fmt: skip
    return {key: {"secretKeyRef": {"name": "zeps-zookeeper-auth", "key": key.split("_")[-1].lower()}}
            for key in ("ZEPS_ZOOKEEPER_USER", "ZEPS_ZOOKEEPER_PASSWORD")}  # fmt: skip


def _pod(name: str, command: str, env: dict[str, Any], *, secret: str | None = None,
         worker: str | None = None) -> dict[str, Any]:  # fmt: skip
    """A client pod (the zeps image) with ``env`` (values or ``valueFrom``), a Secret mounted at
    CLIENT_DIR and a ConfigMap of workers at /worker."""
    spec = copy.deepcopy(App.pod_spec(command))
    container = spec["containers"][0]
    for key, value in env.items():
        container["env"].append(
            {"name": key, **({"valueFrom": value} if isinstance(value, dict) else {"value": value})}
        )
    spec["volumes"], container["volumeMounts"] = [], []
    if secret:
        spec["volumes"].append({"name": "client", "secret": {"secretName": secret}})
        container["volumeMounts"].append({"name": "client", "mountPath": CLIENT_DIR, "readOnly": True})
    if worker:
        spec["volumes"].append({"name": "worker", "configMap": {"name": worker}})
        container["volumeMounts"].append({"name": "worker", "mountPath": "/worker"})
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def _workers(app: App, *files: str) -> None:
    app.apply({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "workers"},
               "data": {f: (WORKERS / f).read_text() for f in files}})  # fmt: skip


def _refusal(app: App, kind: str, name: str) -> str:
    conditions = app.get(kind, name).get("status", {}).get("conditions", [])
    return next((c["message"] for c in conditions if c.get("reason") == "PodNotAllowed"), "")


def _operator_restarts(app: App) -> int:
    pods = app.cluster.json("pods", "-n", OPERATOR_NAMESPACE, "-l", "app.kubernetes.io/name=zeps-operator")["items"]
    return sum(s.get("restartCount", 0) for p in pods for s in p["status"].get("containerStatuses", []))


@pytest.mark.timeout(1200)
def test_a_hostile_tenant_is_refused_everywhere_and_costs_the_other_nothing(app: App, tenants: tuple[App, App]) -> None:
    b, c = tenants
    a_env = _identity(app)
    app.apply(
        {
            "apiVersion": "zeps.dev/v1alpha1",
            "kind": "ZepsStream",
            "metadata": {"name": "vault"},
            "spec": {"storage": {"size": "1Gi"}, "replicas": 3, "curve": True, "curveClients": ["teller"]},
        }
    )
    app.apply({"apiVersion": "zeps.dev/v1alpha1", "kind": "Queue", "metadata": {"name": "jobs"}, "spec": {}})
    app.ready("queue", "jobs")
    app.ready("zepsstream", "vault", timeout=420)
    app.cluster.wait_for(
        "vault's three replicas in sync",
        lambda: len(app.get("zepsstream", "vault")["status"].get("replication", {}).get("inSync", [])) == 3,
        timeout=240,
    )
    restarts = _operator_restarts(app)
    # each broker's memory budget, past which it takes on no new peering: 0.8 of its container's
    # memory limit (the CRD's default 1Gi), read from its cgroup
    assert "memory budget 819 MiB" in app.logs(app.replication("vault")["leader"])

    # A's traffic, through everything below
    teller = {**a_env, "ZEPS_STREAM_VAULT_CURVE_CLIENT": f"{CLIENT_DIR}/client.key_secret"}
    _workers(app, "ledger_publisher.py")
    app.apply(_pod("subscriber", f"exec zeps --json stream replay vault --since 0 --count {COUNT} --timeout 600",
                   teller, secret="vault-curve-teller"))  # fmt: skip
    app.apply(_pod("publisher", f"exec python /worker/ledger_publisher.py vault {COUNT} {RATE} {GROUP}", teller,
                   secret="vault-curve-teller", worker="workers"))  # fmt: skip

    # B: a namespace of its own, with an identity of its own, and a Topic (how its pods find ZooKeeper)
    b_env = _identity(b)
    b.apply({"apiVersion": "zeps.dev/v1alpha1", "kind": "Topic", "metadata": {"name": "decoy"}, "spec": {}})
    b.ready("topic", "decoy")
    status = app.get("zepsstream", "vault")["status"]
    leader = status["replication"]["leader"]
    address = app.get("pod", leader)["status"]["podIP"]
    server_key = app.get("secret", "vault-curve-teller")["metadata"]["annotations"]["zeps.dev/broker-public-key"]
    _workers(b, "hostile_tenant.py")
    arguments = shlex.join([app.ns, "vault", leader, "jobs", f"tcp://{address}:5555", server_key, "decoy", c.ns])
    b.apply(_pod("attacker", f"exec python /worker/hostile_tenant.py {arguments}", b_env, worker="workers"))
    report = json_lines(b.wait_succeeded("attacker"))[-1]

    for identity in ("as B", "anonymous"):  # every read and write of A's nodes refused
        assert report[identity] == dict.fromkeys(report[identity], "NoAuthError"), (identity, report[identity])
    assert len(report["as B"]) == 11, report["as B"]
    assert report["attach with own CURVE key"] == report["attach with no CURVE"] == "no answer", report
    assert report["claim C's root"] == report["claim C's topics"] == report["poison own spec"] == "done", report

    # the operator, which reads B's poisoned node, still serves A; C's claimed root is C's once C uses zeps
    app.apply({"apiVersion": "zeps.dev/v1alpha1", "kind": "Topic", "metadata": {"name": "after"}, "spec": {}})
    app.ready("topic", "after")
    c_env = _identity(c)
    c.apply({"apiVersion": "zeps.dev/v1alpha1", "kind": "Topic", "metadata": {"name": "fresh"}, "spec": {}})
    c.ready("topic", "fresh")
    read_acl = (  # as C (an ACL is readable by whom it admits): whose digest it names
        'python -c "import json; from zeps.config import resolve; from zeps.coordination import connect; '
        "s = resolve('Topic', 'fresh', needs=('zookeeper',)); "
        "zk = connect(s.zookeeper, auth=s.auth, ca=s.zookeeper_ca); "
        "acl = zk.get_acls(s.chroot + '/' + s.namespace)[0]; print(json.dumps([a.id.id.split(':')[0] for a in acl]))\""
    )
    c.apply(_pod("acl", read_acl, c_env))
    named = c.wait_succeeded("acl").strip().splitlines()[-1]
    assert named == f'["{c.ns}"]', named  # C's digest alone: B's claim is gone

    # B asking the operator for what the cluster admin did not allow
    b.apply({"apiVersion": "zeps.dev/v1alpha1", "kind": "ZepsStream", "metadata": {"name": "miner"},
             "spec": {"storage": {"size": "1Gi"}, "image": "evil.example/miner:latest"}})  # fmt: skip
    b.cluster.wait_for("the image refused", lambda: "brokers.allowedImages" in _refusal(b, "zepsstream", "miner"),
                       timeout=120)  # fmt: skip
    assert b.get("pods", "-l", "app.kubernetes.io/instance=miner")["items"] == []
    with pytest.raises(AssertionError, match="is a DNS label"):
        b.apply({"apiVersion": "zeps.dev/v1alpha1", "kind": "ZepsStream", "metadata": {"name": "a.b"},
                 "spec": {"storage": {"size": "1Gi"}}})  # fmt: skip

    # A lost nothing: every publish confirmed, read once each, in order; the operator never restarted
    confirmed = [m["confirmed"] for m in json_lines(app.wait_succeeded("publisher", timeout=600)) if "confirmed" in m]
    assert confirmed and confirmed[-1] == COUNT, confirmed[-5:]
    bodies = [m["body"] for m in json_lines(app.wait_succeeded("subscriber", timeout=300)) if "body" in m]
    assert bodies == [str(n) for n in range(1, COUNT + 1)], (len(bodies), bodies[:3], bodies[-3:])
    assert _operator_restarts(app) == restarts

"""On kind, everything in pods: the operator and ZooKeeper from the chart, brokers from the operator's
Deployments, and SDK traffic from application pods whose handles resolve through their ServiceAccount.

Nothing is mocked: the images are the ones ``make e2e`` built, pods really run on the kind node.
"""

from __future__ import annotations

import itertools
import json
import os
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
IMAGE = os.environ.get("ZEPS_E2E_IMAGE", "")
OPERATOR_NAMESPACE = os.environ.get("ZEPS_E2E_NAMESPACE", "zeps-system")
RELEASE = os.environ.get("ZEPS_E2E_RELEASE", "zeps")

_names = itertools.count()


@pytest.fixture
def app_namespace(cluster: Any) -> Iterator[str]:
    """A namespace for one test, with the examples' client RBAC (the SDK's ServiceAccount)."""
    name = f"e2e-{next(_names)}-{os.getpid() % 1000}"
    cluster.kubectl("create", "namespace", name)
    cluster.wait_for(
        f"the default ServiceAccount in {name}", lambda: cluster.kubectl("get", "sa", "default", "-n", name)
    )
    cluster.kubectl("apply", "-n", name, "-f", str(ROOT / "examples" / "client-rbac.yaml"))
    try:
        yield name
    finally:
        cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


def client_pod(name: str, command: str, *, restart: str = "Never") -> dict[str, Any]:
    """A pod running ``command`` (sh -c) in the zeps image as the examples' zeps-client ServiceAccount."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": name.rsplit("-", 1)[0]}},
        "spec": {
            "serviceAccountName": "zeps-client",
            "restartPolicy": restart,
            "securityContext": {"runAsNonRoot": True, "runAsUser": 10001, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [_client_container(command)],
        },
    }


def _client_container(command: str) -> dict[str, Any]:
    return {
        "name": "app",
        "image": IMAGE,
        "imagePullPolicy": "Never",
        "command": ["sh", "-c", command],
        "env": [{"name": "ZEPS_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}}],
        "securityContext": {
            "readOnlyRootFilesystem": True,
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
        },
    }


def _json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def _phase(cluster: Any, namespace: str, pod: str) -> str:
    return str(cluster.json("pod", pod, "-n", namespace)["status"].get("phase", ""))


def _wait_succeeded(cluster: Any, namespace: str, pod: str, timeout: float = 240) -> str:
    """Wait for a pod to succeed; its logs. A failed pod fails the test with its logs."""

    def done() -> bool:
        phase = _phase(cluster, namespace, pod)
        if phase == "Failed":
            raise AssertionError(f"pod {pod} failed:\n{cluster.kubectl('logs', pod, '-n', namespace, check=False)}")
        return phase == "Succeeded"

    cluster.wait_for(f"pod {namespace}/{pod} to succeed", done, timeout=timeout)
    return str(cluster.kubectl("logs", pod, "-n", namespace))


def _ready(cluster: Any, kind: str, name: str, namespace: str, timeout: int = 180) -> dict[str, Any]:
    cluster.kubectl("wait", "--for=condition=Ready", f"{kind}/{name}", "-n", namespace, f"--timeout={timeout}s",
                    timeout=timeout + 30)  # fmt: skip
    return dict(cluster.json(kind, name, "-n", namespace))


def test_operator_and_zookeeper_run_in_pods_with_the_charts_service_account(cluster: Any) -> None:
    deployment = cluster.json("deployment", f"{RELEASE}-operator", "-n", OPERATOR_NAMESPACE)
    assert deployment["status"].get("availableReplicas") == 1
    pod_spec = deployment["spec"]["template"]["spec"]
    assert pod_spec["serviceAccountName"] == f"{RELEASE}-operator"
    assert pod_spec["containers"][0]["image"] == IMAGE
    pods = cluster.json("pods", "-n", OPERATOR_NAMESPACE, "-l", "app.kubernetes.io/name=zeps-operator")["items"]
    assert [p["status"]["phase"] for p in pods] == ["Running"]
    # the operator's pod may do what the chart's ClusterRole grants, and nothing else
    sa = f"system:serviceaccount:{OPERATOR_NAMESPACE}:{RELEASE}-operator"
    assert cluster.kubectl("auth", "can-i", "patch", "topics.zeps.dev/status", "--as", sa).strip() == "yes"
    assert cluster.kubectl("auth", "can-i", "delete", "pods", "--as", sa, check=False).strip() == "no"
    zookeeper = cluster.json("statefulset", f"{RELEASE}-zookeeper", "-n", OPERATOR_NAMESPACE)
    assert zookeeper["status"].get("readyReplicas") == 3
    modes = Counter(
        cluster.kubectl(
            "exec", "-n", OPERATOR_NAMESPACE, f"{RELEASE}-zookeeper-{i}", "--", "bash", "-c",
            "exec 3<>/dev/tcp/127.0.0.1/2181; printf srvr >&3; cat <&3",
        ).split("Mode: ")[1].split()[0]
        for i in range(3)
    )  # fmt: skip
    assert modes == Counter({"leader": 1, "follower": 2})


def test_topic_broadcast_reaches_three_subscriber_pods(cluster: Any, app_namespace: str) -> None:
    ns = app_namespace
    cluster.kubectl("apply", "-n", ns, "-f", str(ROOT / "examples" / "topic.yaml"))
    _ready(cluster, "topic", "cache-invalidation", ns)
    count = 30
    subscribers = [f"subscriber-{i}" for i in range(3)]
    for name in subscribers:
        pod = client_pod(
            name,
            f"zeps --json topic subscribe cache-invalidation --consumer-id {name} --count {count} --timeout 240",
        )
        cluster.apply(json.dumps(pod), ns)
    cluster.wait_for(
        "3 live subscribers in the Topic's status",
        lambda: cluster.json("topic", "cache-invalidation", "-n", ns)["status"].get("subscribers") == 3,
        timeout=180,
    )
    bodies = [f"evict:{i}" for i in range(count)]
    publisher = client_pod("publisher-0", "zeps --json topic publish cache-invalidation " + " ".join(bodies))
    cluster.apply(json.dumps(publisher), ns)
    published = _json_lines(_wait_succeeded(cluster, ns, "publisher-0"))[0]["published"]
    assert len(published) == count
    for name in subscribers:
        received = [m["body"] for m in _json_lines(_wait_succeeded(cluster, ns, name))]
        assert received == bodies, f"{name} got {len(received)} of {count}, in this order: {received}"


def test_queue_drained_by_a_three_replica_worker_deployment(cluster: Any, app_namespace: str) -> None:
    ns = app_namespace
    cluster.kubectl("apply", "-n", ns, "-f", str(ROOT / "examples" / "queue.yaml"))
    _ready(cluster, "queue", "crawl-links", ns)
    items = [f"https://example.invalid/{i}" for i in range(90)]
    producer = client_pod("producer-0", "zeps --json queue put crawl-links " + " ".join(items))
    cluster.apply(json.dumps(producer), ns)
    assert len(_json_lines(_wait_succeeded(cluster, ns, "producer-0"))[0]["put"]) == len(items)
    worker = _client_container("while true; do zeps --json queue take crawl-links --count 3 --timeout 5 || true; done")
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "workers"},
        "spec": {
            "replicas": 3,
            "selector": {"matchLabels": {"app": "workers"}},
            "template": {
                "metadata": {"labels": {"app": "workers"}},
                "spec": {
                    "serviceAccountName": "zeps-client",
                    "securityContext": client_pod("x", "")["spec"]["securityContext"],
                    "containers": [worker],
                },
            },
        },
    }
    cluster.apply(json.dumps(deployment), ns)
    cluster.kubectl("rollout", "status", "deployment/workers", "-n", ns, "--timeout=180s", timeout=210)

    def drained() -> bool:
        status = cluster.json("queue", "crawl-links", "-n", ns)["status"]
        return status.get("depth") == 0 and status.get("inFlight", 0) == 0

    cluster.wait_for("the Queue's status to show it drained", drained, timeout=240, interval=2)
    pods = [p["metadata"]["name"] for p in cluster.json("pods", "-n", ns, "-l", "app=workers")["items"]]
    done: Counter[str] = Counter()
    per_pod = {}
    for pod in pods:
        taken = [m["body"] for m in _json_lines(cluster.kubectl("logs", pod, "-n", ns))]
        per_pod[pod] = len(taken)
        done.update(taken)
    assert set(done) == set(items), f"missing: {sorted(set(items) - set(done))[:5]}"
    assert max(done.values()) == 1, f"done twice: {[i for i, n in done.items() if n > 1][:5]}"
    assert len(pods) == 3 and sum(per_pod.values()) == len(items)


def test_stream_broker_pod_with_its_journal_on_a_pvc_reached_by_service_name(cluster: Any, app_namespace: str) -> None:
    ns = app_namespace
    manifest = (ROOT / "examples" / "zepsstream.yaml").read_text().replace("size: 20Gi", "size: 1Gi")
    cluster.apply(manifest, ns)
    status = _ready(cluster, "zepsstream", "prices", ns, timeout=240)["status"]
    assert status["endpoint"] == f"tcp://prices-broker.{ns}.svc:5555"
    pvc = cluster.json("pvc", "prices-journal", "-n", ns)
    assert pvc["status"]["phase"] == "Bound"
    broker = cluster.json("pods", "-n", ns, "-l", "app.kubernetes.io/instance=prices")["items"]
    assert [p["status"]["phase"] for p in broker] == ["Running"]
    assert broker[0]["spec"]["containers"][0]["image"] == IMAGE  # the operator's own image

    count = 200
    subscriber = client_pod("reader-0", f"zeps --json stream replay prices --since 0 --count {count} --timeout 120")
    cluster.apply(json.dumps(subscriber), ns)
    bodies = [f"{i}" for i in range(count)]
    publish = "zeps --json stream publish prices eu.fr.cac40 " + " ".join(bodies)
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "publisher"},
        "spec": {
            "backoffLimit": 0,
            "template": {
                "spec": {
                    **client_pod("x", "")["spec"],
                    "containers": [_client_container(publish)],
                }
            },
        },
    }
    cluster.apply(json.dumps(job), ns)
    cluster.kubectl("wait", "--for=condition=Complete", "job/publisher", "-n", ns, "--timeout=180s", timeout=210)
    received = _json_lines(_wait_succeeded(cluster, ns, "reader-0"))
    assert [m["body"] for m in received] == bodies
    sequences = [m["sequence"] for m in received]
    assert sequences == list(range(sequences[0], sequences[0] + count))
    assert {m["key"] for m in received} == {"eu.fr.cac40"}

"""On kind, everything in pods: the operator and ZooKeeper from the chart, brokers from the operator's
Deployments, and SDK traffic from application pods whose handles resolve through their ServiceAccount.

Nothing is mocked: the images are the ones ``make e2e`` built, pods really run on the kind node.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from kindapp import IMAGE, OPERATOR_NAMESPACE, RELEASE, App, ZooKeeperShell, json_lines


def test_operator_and_zookeeper_run_in_pods_with_the_charts_service_account(cluster: Any, zk: ZooKeeperShell) -> None:
    deployment = cluster.json("deployment", f"{RELEASE}-operator", "-n", OPERATOR_NAMESPACE)
    assert deployment["status"].get("availableReplicas") == 1
    pod_spec = deployment["spec"]["template"]["spec"]
    assert pod_spec["serviceAccountName"] == f"{RELEASE}-operator"
    assert pod_spec["containers"][0]["image"] == IMAGE
    pods = cluster.json("pods", "-n", OPERATOR_NAMESPACE, "-l", "app.kubernetes.io/name=zeps-operator")["items"]
    assert [p["status"]["phase"] for p in pods] == ["Running"]
    # it waited for the ZooKeeper ensemble to form instead of being restarted (the chart's startupProbe)
    assert [c["restartCount"] for p in pods for c in p["status"]["containerStatuses"]] == [0]
    # the operator's pod may do what the chart's ClusterRole grants, and nothing else
    sa = f"system:serviceaccount:{OPERATOR_NAMESPACE}:{RELEASE}-operator"
    assert cluster.kubectl("auth", "can-i", "patch", "topics.zeps.dev/status", "--as", sa).strip() == "yes"
    # it deletes a replicated stream's broker pods (its data-aware roll), and never makes a pod, enters
    # one or touches a node
    assert cluster.kubectl("auth", "can-i", "delete", "pods", "--as", sa).strip() == "yes"
    for verb, what in (("create", "pods"), ("create", "pods/exec"), ("delete", "nodes")):
        assert cluster.kubectl("auth", "can-i", verb, what, "--as", sa, check=False).strip() == "no", (verb, what)
    # its one cleaner Lease, in its own namespace, and no other
    lease = f"lease/{RELEASE}-operator-cleaner"
    assert cluster.kubectl("auth", "can-i", "update", lease, "-n", OPERATOR_NAMESPACE, "--as", sa).strip() == "yes"
    elsewhere = cluster.kubectl("auth", "can-i", "update", "leases", "-n", "default", "--as", sa, check=False)
    assert elsewhere.strip() == "no"
    # the image holds the runtime only: the developer tooling is not in the wheel, and `zeps dev` says so
    pod = pods[0]["metadata"]["name"]
    probe = "import importlib.util as u, zeps_operator; print('tooling', u.find_spec('zeps_dev'))"
    out = cluster.kubectl("exec", pod, "-n", OPERATOR_NAMESPACE, "--", "python", "-c", probe)
    assert out.strip() == "tooling None"
    said = cluster.kubectl("exec", pod, "-n", OPERATOR_NAMESPACE, "--", "sh", "-c", 'zeps dev up 2>&1; echo "exit=$?"')
    assert "source checkout" in said and said.strip().endswith("exit=3"), said
    assert zk.whole(), "three Ready ZooKeeper servers: a leader and two followers"


def test_topic_broadcast_reaches_three_subscriber_pods(cluster: Any, app: App) -> None:
    app.apply_example("topic.yaml")
    app.ready("topic", "cache-invalidation")
    count = 30
    subscribers = [f"subscriber-{i}" for i in range(3)]
    for name in subscribers:
        app.run_pod(
            name, f"zeps --json topic subscribe cache-invalidation --consumer-id {name} --count {count} --timeout 240"
        )
    cluster.wait_for(
        "3 live subscribers in the Topic's status",
        lambda: app.get("topic", "cache-invalidation")["status"].get("subscribers") == 3,
        timeout=180,
    )
    bodies = [f"evict:{i}" for i in range(count)]
    app.run_pod("publisher", "zeps --json topic publish cache-invalidation " + " ".join(bodies))
    assert len(json_lines(app.wait_succeeded("publisher"))[0]["published"]) == count
    for name in subscribers:
        received = [m["body"] for m in json_lines(app.wait_succeeded(name))]
        assert received == bodies, f"{name} got {len(received)} of {count}, in this order: {received}"


def test_queue_drained_by_a_three_replica_worker_deployment(cluster: Any, app: App) -> None:
    app.apply_example("queue.yaml")
    app.ready("queue", "crawl-links")
    items = [f"https://example.invalid/{i}" for i in range(90)]
    app.run_pod("producer", "zeps --json queue put crawl-links " + " ".join(items))
    assert len(json_lines(app.wait_succeeded("producer"))[0]["put"]) == len(items)
    app.deployment(
        "workers", "while true; do zeps --json queue take crawl-links --count 3 --timeout 5 || true; done", replicas=3
    )

    def taken() -> Counter[str]:
        done: Counter[str] = Counter()
        for pod in app.pods("workers"):
            done.update(m["body"] for m in json_lines(app.logs(pod["metadata"]["name"])))
        return done

    cluster.wait_for("the workers to take every item", lambda: set(taken()) >= set(items), timeout=240, interval=2)
    cluster.wait_for(
        "the Queue's status to show it drained",
        lambda: app.get("queue", "crawl-links")["status"].get("depth") == 0,
        timeout=60,
    )
    per_pod = {p["metadata"]["name"]: len(json_lines(app.logs(p["metadata"]["name"]))) for p in app.pods("workers")}
    done = taken()
    assert set(done) == set(items), f"missing: {sorted(set(items) - set(done))[:5]}"
    assert max(done.values()) == 1, f"done twice: {[i for i, n in done.items() if n > 1][:5]}"
    assert len(per_pod) == 3 and sum(per_pod.values()) == len(items)


def test_stream_broker_pod_with_its_journal_on_a_pvc_reached_by_service_name(app: App) -> None:
    app.apply_example("zepsstream.yaml", **{"size: 20Gi": "size: 1Gi"})
    status = app.ready("zepsstream", "prices", timeout=240)["status"]
    assert status["endpoint"] == f"tcp://prices-broker.{app.ns}.svc:5555"
    assert app.get("pvc", "prices-journal")["status"]["phase"] == "Bound"
    broker = app.get("pods", "-l", "app.kubernetes.io/instance=prices")["items"]
    assert [p["status"]["phase"] for p in broker] == ["Running"]
    assert broker[0]["spec"]["containers"][0]["image"] == IMAGE  # the operator's own image

    count = 200
    app.run_pod("reader", f"zeps --json stream replay prices --since 0 --count {count} --timeout 120")
    bodies = [f"{i}" for i in range(count)]
    app.apply(
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": "publisher"},
            "spec": {
                "backoffLimit": 0,
                "template": {"spec": App.pod_spec("zeps --json stream publish prices eu.fr.cac40 " + " ".join(bodies))},
            },
        }
    )
    app.cluster.kubectl(
        "wait", "--for=condition=Complete", "job/publisher", "-n", app.ns, "--timeout=180s", timeout=210
    )
    received = json_lines(app.wait_succeeded("reader"))
    assert [m["body"] for m in received] == bodies
    sequences = [m["sequence"] for m in received]
    assert sequences == list(range(sequences[0], sequences[0] + count))
    assert {m["key"] for m in received} == {"eu.fr.cac40"}

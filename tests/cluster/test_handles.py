"""SDK handles resolved from the resources on the real API server, with the operator and ZooKeeper."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

import zeps
from harness import ZooKeeperHarness
from zeps.errors import ConfigError
from zeps_dev import ControlPlane, OperatorProcess
from zeps_dev.process import wait_until

CHROOT = "/operator-tests"


def _apply(plane: ControlPlane, namespace: str, kind: str, name: str, spec: dict[str, Any] | None = None) -> None:
    body = {"apiVersion": "zeps.dev/v1alpha1", "kind": kind, "metadata": {"name": name}, "spec": spec or {}}
    plane.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(body))
    plane.kubectl("wait", "--for=condition=Ready", f"{kind.lower()}/{name}", "-n", namespace, "--timeout=60s")


def _conflicting_topic(crds: ControlPlane, zk: Any, namespace: str, name: str) -> None:
    """A Topic whose ZooKeeper path another cluster owns: the operator marks it Ready=False, Conflict."""
    foreign = {"formatVersion": 1, "owner": "elsewhere/1", "generation": 1, "spec": {}}
    zk.create(f"{CHROOT}/{namespace}/topics/{name}/spec", json.dumps(foreign).encode(), makepath=True)
    topic = {"apiVersion": "zeps.dev/v1alpha1", "kind": "Topic", "metadata": {"name": name}}
    crds.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(topic))
    wait_until(
        lambda: "Conflict" in crds.kubectl("get", "topic", name, "-n", namespace, "-o", "json"),
        timeout=30,
        what="the Conflict condition",
    )


@pytest.fixture
def kubeconfig(crds: ControlPlane, monkeypatch: pytest.MonkeyPatch) -> Path:
    for var in ("ZEPS_ZOOKEEPER", "ZEPS_CHROOT", "ZEPS_NAMESPACE", "KUBERNETES_SERVICE_HOST"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("KUBECONFIG", str(crds.kubeconfig))
    return crds.kubeconfig


def test_topic_and_queue_handles_resolve_from_status(
    operator: OperatorProcess, crds: ControlPlane, namespace: str, kubeconfig: Path
) -> None:
    _apply(crds, namespace, "Topic", "news", {"maxQueueDepth": 50})
    _apply(crds, namespace, "Queue", "work", {"maxAttempts": 2})
    news = zeps.topic("news", namespace=namespace)
    assert news.settings.chroot == CHROOT and news.settings.spec["maxQueueDepth"] == 50
    got: list[bytes] = []
    done = threading.Event()
    with news.subscribe(lambda m: (got.append(m.body), done.set()), consumer_id="reader"):
        news.publish(b"resolved from the Topic's status")
        assert done.wait(10)
    assert got == [b"resolved from the Topic's status"]
    work = zeps.queue("work", namespace=namespace)
    work.put(b"job")
    item = work.take(timeout=5)
    assert item is not None and item.body == b"job"
    item.ack()
    assert work.options.max_attempts == 2


def test_clear_errors_for_missing_not_ready_and_forbidden(  # noqa: PLR0917 — pytest fixtures
    operator: OperatorProcess,
    crds: ControlPlane,
    namespace: str,
    kubeconfig: Path,
    zookeeper: ZooKeeperHarness,
    kube_api: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with pytest.raises(ConfigError, match=f"Topic {namespace}/nope does not exist: create it"):
        zeps.topic("nope", namespace=namespace)

    zk = zookeeper.client()
    _conflicting_topic(crds, zk, namespace, "taken")
    with pytest.raises(ConfigError, match=f"Topic {namespace}/taken is not Ready \\(Conflict"):
        zeps.topic("taken", namespace=namespace)

    core = client.CoreV1Api(kube_api)
    core.create_namespaced_service_account(namespace, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name="app")))
    token = core.create_namespaced_service_account_token(
        "app", namespace, client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(audiences=[]))
    ).status.token
    config = json.loads(json.dumps(__import__("yaml").safe_load(Path(crds.kubeconfig).read_text())))
    config["users"] = [{"name": "admin", "user": {"token": token}}]
    config["contexts"][0]["context"]["user"] = "admin"
    limited = tmp_path / "app.kubeconfig"
    limited.write_text(json.dumps(config))
    monkeypatch.setenv("KUBECONFIG", str(limited))
    with pytest.raises(ConfigError, match=f"no permission to read topics.zeps.dev in namespace {namespace}: grant get"):
        zeps.topic("taken", namespace=namespace)


def test_a_pickled_handle_works_where_there_is_no_kubernetes(
    operator: OperatorProcess, crds: ControlPlane, namespace: str, kubeconfig: Path
) -> None:
    """What Spark does: the driver resolves and pickles; an executor (no KUBECONFIG) publishes."""
    _apply(crds, namespace, "Queue", "shipped")
    driver_side = zeps.queue("shipped", namespace=namespace)
    code = (
        "import pickle, sys; h = pickle.loads(sys.stdin.buffer.read()); h.put(b'from the executor'); "
        "print(h.stats().depth)"
    )
    env = {k: v for k, v in __import__("os").environ.items() if k != "KUBECONFIG"}
    out = subprocess.run(
        [sys.executable, "-c", code],
        input=pickle.dumps(driver_side),
        capture_output=True,
        env=env,
        timeout=60,
        check=True,
    ).stdout
    assert out.strip() == b"1"
    item = driver_side.take(timeout=5)
    assert item is not None and item.body == b"from the executor"
    item.ack()


def test_a_batches_handle_reads_its_queue_s_store_credentials_secret(  # noqa: PLR0917 — pytest fixtures
    operator: OperatorProcess,
    crds: ControlPlane,
    namespace: str,
    kubeconfig: Path,
    kube_api: Any,
    seaweedfs_server: Any,
    s3_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With no S3 credentials in the environment, ``zeps.batches()`` reads the Secret the Queue names
    (the real API server, the real S3 server): a missing Secret, or one lacking a key, is a ConfigError
    saying what to create; a pickled handle carries no credentials (the executor's come from envFrom)."""
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    store = {"inlineMaxBytes": 64, "storeUrl": s3_url, "storeEndpoint": seaweedfs_server.endpoint,
             "storeCredentialsSecret": "ledger-s3"}  # fmt: skip
    _apply(crds, namespace, "Queue", "ledger", {"mode": "batches", "batches": store})
    missing = rf"Secret {namespace}/ledger-s3 \(the batch store of Queue ledger\) does not exist: create it with"
    with pytest.raises(ConfigError, match=missing):
        zeps.batches("ledger", namespace=namespace).publish([b"x" * 100])
    core = client.CoreV1Api(kube_api)
    key, secret = seaweedfs_server.admin
    core.create_namespaced_secret(namespace, client.V1Secret(metadata=client.V1ObjectMeta(name="ledger-s3"),
                                                             string_data={"AWS_ACCESS_KEY_ID": key}))  # fmt: skip
    with pytest.raises(ConfigError, match=r"has no AWS_SECRET_ACCESS_KEY: add it"):
        zeps.batches("ledger", namespace=namespace).publish([b"x" * 100])
    core.patch_namespaced_secret("ledger-s3", namespace, {"stringData": {"AWS_SECRET_ACCESS_KEY": secret}})
    handle = zeps.batches("ledger", namespace=namespace)
    assert handle.publish([b"x" * 100]) == "ledger-1"
    assert handle.read(1).records == [b"x" * 100]
    assert secret.encode() not in pickle.dumps(handle) and secret.encode() not in pickle.dumps(handle.store)


def test_zeps_status_lists_resources_with_ready_and_facts(
    operator: OperatorProcess, crds: ControlPlane, namespace: str, kubeconfig: Path, zookeeper: ZooKeeperHarness
) -> None:
    import os  # noqa: PLC0415

    _apply(crds, namespace, "Topic", "seen")
    _apply(crds, namespace, "Queue", "jobs", {"maxAttempts": 2})
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZEPS_")}
    run = [sys.executable, "-m", "zeps.cli", "-n", namespace]
    out = subprocess.run([*run, "--json", "status"], capture_output=True, text=True, env=env, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    rows = {(r["kind"], r["name"]): r for r in map(json.loads, out.stdout.splitlines())}
    assert rows[("Topic", "seen")]["ready"] == "True" and rows[("Topic", "seen")]["subscribers"] == 0
    assert rows[("Queue", "jobs")]["depth"] == 0
    zk = zookeeper.client()  # a resource that is not Ready makes status exit 1
    _conflicting_topic(crds, zk, namespace, "blocked")
    human = subprocess.run([*run, "status"], capture_output=True, text=True, env=env, timeout=60, check=False)
    assert human.returncode == 1 and "blocked" in human.stdout and "Conflict" in human.stdout

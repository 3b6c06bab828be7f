"""The cluster tier is real: the pinned kube-apiserver, controller-manager, scheduler and kwok."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from harness import until
from zeps_dev import ControlPlane
from zeps_dev.controlplane import FAKE_NODE, binaries_dir

SMOKE_CHART = Path(__file__).parent / "testdata" / "smoke-chart"

WIDGET_CRD = """
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.smoke.zeps.dev
spec:
  group: smoke.zeps.dev
  scope: Namespaced
  names: {plural: widgets, singular: widget, kind: Widget}
  versions:
    - name: v1
      served: true
      storage: true
      schema:
        openAPIV3Schema:
          type: object
          properties:
            spec:
              type: object
              required: [size]
              properties:
                size: {type: integer, minimum: 1, maximum: 10}
"""


def test_crd_applied_with_kubectl_is_served_and_validated(
    control_plane: ControlPlane, kube_api: Any, namespace: str
) -> None:
    control_plane.kubectl("apply", "-f", "-", input=WIDGET_CRD)
    control_plane.kubectl("wait", "--for=condition=Established", "crd/widgets.smoke.zeps.dev", "--timeout=60s")
    custom = client.CustomObjectsApi(kube_api)
    body = {"apiVersion": "smoke.zeps.dev/v1", "kind": "Widget", "metadata": {"name": "w1"}}
    # the CRD may need a moment after Established before its endpoint serves
    until(lambda: "widgets" in control_plane.kubectl("api-resources", "--api-group=smoke.zeps.dev"), "widgets", 30)
    custom.create_namespaced_custom_object("smoke.zeps.dev", "v1", namespace, "widgets", {**body, "spec": {"size": 3}})
    got = custom.get_namespaced_custom_object("smoke.zeps.dev", "v1", namespace, "widgets", "w1")
    assert got["spec"] == {"size": 3}

    # the schema is enforced by the API server itself
    with pytest.raises(ApiException) as rejected:
        custom.create_namespaced_custom_object(
            "smoke.zeps.dev",
            "v1",
            namespace,
            "widgets",
            {**body, "metadata": {"name": "w2"}, "spec": {"size": 99}},
        )
    assert rejected.value.status == 422
    assert "spec.size" in rejected.value.body


def test_watch_sees_created_object(kube_api: Any, namespace: str) -> None:
    core = client.CoreV1Api(kube_api)
    seen: list[tuple[str, str]] = []
    ready = threading.Event()

    def watch_configmaps() -> None:
        w = watch.Watch()
        ready.set()
        for event in w.stream(core.list_namespaced_config_map, namespace, timeout_seconds=30):
            seen.append((event["type"], event["object"].metadata.name))
            if event["object"].metadata.name == "watched":
                w.stop()

    thread = threading.Thread(target=watch_configmaps, daemon=True)
    thread.start()
    ready.wait(5)
    time.sleep(0.5)  # let the watch request reach the server before the create
    core.create_namespaced_config_map(
        namespace, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="watched"), data={"k": "v"})
    )
    thread.join(35)
    assert ("ADDED", "watched") in seen


def test_deployment_gets_a_running_pod_on_the_kwok_node(kube_api: Any, namespace: str) -> None:
    apps, core = client.AppsV1Api(kube_api), client.CoreV1Api(kube_api)
    labels = {"app": "smoke"}
    deployment = client.V1Deployment(
        metadata=client.V1ObjectMeta(name="smoke"),
        spec=client.V1DeploymentSpec(
            replicas=1,
            selector=client.V1LabelSelector(match_labels=labels),
            template=client.V1PodTemplateSpec(
                metadata=client.V1ObjectMeta(labels=labels),
                spec=client.V1PodSpec(containers=[client.V1Container(name="app", image="example.invalid/smoke:1")]),
            ),
        ),
    )
    apps.create_namespaced_deployment(namespace, deployment)

    def running() -> bool:
        pods = core.list_namespaced_pod(namespace, label_selector="app=smoke").items
        return any(p.status.phase == "Running" and p.spec.node_name == FAKE_NODE for p in pods)

    until(running, "the Deployment's pod to be scheduled on the kwok node and Running", 90)
    until(
        lambda: (
            (apps.read_namespaced_deployment(name="smoke", namespace=namespace).status.available_replicas or 0) == 1
        ),
        "the Deployment to report 1 available replica",
        60,
    )


def test_kwok_renews_the_fake_nodes_lease(kube_api: Any) -> None:
    """The node heartbeat is a Lease kwok renews; without it the node-lifecycle controller calls the
    node unreachable after its grace period (50 s) and marks every pod on it not Ready, so a
    Deployment that was available stops being so halfway through a slow test."""
    leases = client.CoordinationV1Api(kube_api)

    def renew_time() -> Any:
        try:
            return leases.read_namespaced_lease(FAKE_NODE, "kube-node-lease").spec.renew_time
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    until(lambda: renew_time() is not None, f"kwok to create the Lease of {FAKE_NODE}", 30)
    first = renew_time()
    until(lambda: renew_time() != first, f"kwok to renew the Lease of {FAKE_NODE}", 40)


def test_rbac_is_enforced_for_service_accounts(kube_api: Any, namespace: str) -> None:
    core = client.CoreV1Api(kube_api)
    core.create_namespaced_service_account(
        namespace, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name="nobody"))
    )
    token = core.create_namespaced_service_account_token(
        "nobody", namespace, client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(audiences=[]))
    ).status.token

    cfg = client.Configuration()
    cfg.host = kube_api.configuration.host
    cfg.ssl_ca_cert = kube_api.configuration.ssl_ca_cert
    cfg.api_key = {"authorization": f"Bearer {token}"}
    with client.ApiClient(cfg) as as_nobody, pytest.raises(ApiException) as denied:
        client.CoreV1Api(as_nobody).list_namespaced_pod(namespace)
    assert denied.value.status == 403


def test_helm_renders_and_installs_a_chart(control_plane: ControlPlane, kube_api: Any, namespace: str) -> None:
    helm = str(binaries_dir() / "helm")
    rendered = subprocess.run(
        [helm, "template", "demo", str(SMOKE_CHART), "--set", "greeting=bonjour"],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout  # fmt: skip
    assert "name: demo-smoke" in rendered and 'greeting: "bonjour"' in rendered

    subprocess.run(
        [helm, "install", "demo", str(SMOKE_CHART), "--namespace", namespace,
         "--kubeconfig", str(control_plane.kubeconfig), "--wait", "--timeout", "60s"],
        capture_output=True, text=True, check=True, timeout=90,
    )  # fmt: skip
    cm = client.CoreV1Api(kube_api).read_namespaced_config_map("demo-smoke", namespace)
    assert cm.data == {"greeting": "hello"}
    releases = json.loads(
        subprocess.run(
            [helm, "list", "-n", namespace, "-o", "json", "--kubeconfig", str(control_plane.kubeconfig)],
            capture_output=True, text=True, check=True, timeout=60,
        ).stdout
    )  # fmt: skip
    assert [r["name"] for r in releases] == ["demo"]

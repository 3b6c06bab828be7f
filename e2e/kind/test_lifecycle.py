"""Lifecycle on kind, as the README's operations section tells users to do it: deletion policies,
``kubectl apply -f crds/`` + ``helm upgrade --reuse-values`` with resources staying Ready, and
``helm uninstall`` leaving no pod, Lease or RBAC behind (the chart is installed again afterwards, so
the tests after this file still have it)."""

from __future__ import annotations

import os
from typing import Any

import pytest
from kindapp import CHROOT, OPERATOR_NAMESPACE, RELEASE, ROOT, App, ZooKeeperShell, helm

OPERATOR_PODS = ("pods", "-n", OPERATOR_NAMESPACE, "-l", "app.kubernetes.io/name=zeps-operator")


def _topic(name: str, policy: str) -> str:
    return (
        f"apiVersion: zeps.dev/v1alpha1\nkind: Topic\nmetadata: {{name: {name}}}\nspec: {{deletionPolicy: {policy}}}\n"
    )


def test_deletion_policy_delete_and_retain(cluster: Any, app: App, zk: ZooKeeperShell) -> None:
    app.apply(_topic("kept", "Retain"))
    app.apply(_topic("gone", "Delete"))
    for name in ("kept", "gone"):
        app.ready("topic", name)
        assert zk.exists(f"{CHROOT}/{app.ns}/topics/{name}")
    cluster.kubectl("delete", "topic", "kept", "gone", "-n", app.ns, "--timeout=120s", timeout=150)
    assert zk.exists(f"{CHROOT}/{app.ns}/topics/kept/subscribers")
    assert not zk.exists(f"{CHROOT}/{app.ns}/topics/gone")


@pytest.mark.serial  # the operator is replaced
def test_helm_upgrade_keeps_resources_ready(cluster: Any, app: App) -> None:
    app.apply_example("topic.yaml")
    before = app.ready("topic", "cache-invalidation")["status"]["conditions"]
    old_pods = {p["metadata"]["name"] for p in cluster.json(*OPERATOR_PODS)["items"]}
    cluster.kubectl("apply", "-f", str(ROOT / "crds"))  # the README's upgrade steps, in order
    helm("upgrade", RELEASE, str(ROOT / "charts" / "zeps"), "--namespace", OPERATOR_NAMESPACE, "--reuse-values",
          "--set", "operator.resyncSeconds=12", "--wait", "--timeout", "5m")  # fmt: skip
    cluster.wait_for(
        "the upgraded operator's pod to replace the old one",
        lambda: {p["metadata"]["name"] for p in cluster.json(*OPERATOR_PODS)["items"]}.isdisjoint(old_pods),
        timeout=180,
    )
    env = cluster.json("deployment", f"{RELEASE}-operator", "-n", OPERATOR_NAMESPACE)["spec"]["template"]["spec"][
        "containers"
    ][0]["env"]
    assert {"name": "ZEPS_RESYNC_SECONDS", "value": "12"} in env
    after = app.ready("topic", "cache-invalidation")["status"]["conditions"]
    ready = next(c for c in after if c["type"] == "Ready")
    assert ready["status"] == "True"
    # Ready never dropped: the condition's transition time is the one from before the upgrade
    assert ready["lastTransitionTime"] == next(c for c in before if c["type"] == "Ready")["lastTransitionTime"]


@pytest.mark.serial  # the chart is removed and installed again
def test_helm_uninstall_leaves_no_pod_lease_or_rbac(cluster: Any, app: App) -> None:
    app.apply_example("topic.yaml")
    app.ready("topic", "cache-invalidation")
    lease = f"{RELEASE}-operator-cleaner"
    pod = cluster.json(*OPERATOR_PODS)["items"][0]["metadata"]["name"]
    cluster.wait_for(
        "the operator pod to hold the installation's cleaner Lease, and the Topic to say so",
        lambda: (
            cluster.json("lease", lease, "-n", OPERATOR_NAMESPACE).get("spec", {}).get("holderIdentity") == pod
            and cluster.json("topic", "cache-invalidation", "-n", app.ns)["status"].get("cleanerHolder") == pod
        ),
        timeout=120,
    )
    # one Lease for the installation, none per Topic
    assert not cluster.kubectl("get", "leases", "-n", app.ns, "-o", "name")
    cluster.kubectl("delete", "topic", "cache-invalidation", "-n", app.ns, "--timeout=120s", timeout=150)
    helm("uninstall", RELEASE, "--namespace", OPERATOR_NAMESPACE, "--wait", "--timeout", "5m")
    try:
        cluster.wait_for(
            "no pod left in the release's namespace",
            lambda: not cluster.json("pods", "-n", OPERATOR_NAMESPACE)["items"],
            timeout=180,
        )
        leases = cluster.kubectl("get", "leases", "-n", OPERATOR_NAMESPACE, "-o", "name")
        assert lease not in leases, "the cleaner Lease outlived the release"
        assert not cluster.json("leases", "-A", "-l", "app.kubernetes.io/managed-by=zeps-operator")["items"]
        rbac = cluster.kubectl("get", "clusterroles,clusterrolebindings", "-o", "name")
        rbac += cluster.kubectl("get", "roles,rolebindings", "-n", OPERATOR_NAMESPACE, "-o", "name")
        assert f"{RELEASE}-operator" not in rbac, "RBAC left behind"
        accounts = cluster.kubectl("get", "serviceaccounts", "-n", OPERATOR_NAMESPACE, "-o", "name")
        assert f"{RELEASE}-operator" not in accounts
    finally:  # the chart back, as make e2e installed it, for whatever runs after
        files = [arg for name in os.environ.get("ZEPS_E2E_CHART_FILES", "").split(",") if name for arg in ("-f", name)]
        sets = files + [arg for value in os.environ["ZEPS_E2E_CHART_VALUES"].split(",") for arg in ("--set", value)]
        helm("install", RELEASE, str(ROOT / "charts" / "zeps"), "--namespace", OPERATOR_NAMESPACE, *sets,
              "--wait", "--timeout", "10m")  # fmt: skip

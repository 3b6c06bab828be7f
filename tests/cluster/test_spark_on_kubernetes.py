"""The Spark-on-Kubernetes example manifests are valid for the real API server (server-side dry run):
the fast check. The kind suite runs them for real (e2e/kind/test_spark.py)."""

from __future__ import annotations

from pathlib import Path

import yaml

from zeps_dev import ControlPlane

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "spark"


def test_manifests_pass_server_side_dry_run(crds: ControlPlane, namespace: str) -> None:
    control_plane = crds  # the CRDs must be served for `kubectl auth can-i` to know zepsstreams
    # the RBAC for real: pod admission checks that the driver's ServiceAccount exists
    assert "serviceaccount/spark-driver created" in control_plane.kubectl(
        "apply", "-n", namespace, "-f", str(EXAMPLES / "driver-rbac.yaml")
    )
    for manifest in ("resources.yaml", "checkpoints-pvc.yaml", "driver-pod.yaml"):
        out = control_plane.kubectl("apply", "--dry-run=server", "-n", namespace, "-f", str(EXAMPLES / manifest))
        assert "(server dry run)" in out, manifest
    # the executor template has no image: Spark fills in spark.kubernetes.container.image, so do the same
    template = yaml.safe_load((EXAMPLES / "executor-pod-template.yaml").read_text())
    template["spec"]["containers"][0]["image"] = "zeps-spark:dry-run"
    out = control_plane.kubectl("apply", "--dry-run=server", "-n", namespace, "-f", "-", input=yaml.safe_dump(template))
    assert "(server dry run)" in out, "executor-pod-template.yaml"
    can = control_plane.kubectl(
        "auth",
        "can-i",
        "get",
        "zepsstreams.zeps.dev",
        "-n",
        namespace,
        f"--as=system:serviceaccount:{namespace}:spark-driver",
        check=False,
    )
    assert can.strip() == "yes", "the driver may read the resources it resolves"
    text = (EXAMPLES / "executor-pod-template.yaml").read_text()
    assert "automountServiceAccountToken: false" in text, "executors need no Kubernetes access"

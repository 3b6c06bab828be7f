"""The Spark-on-Kubernetes example manifests are valid for the real API server (server-side dry run)."""

from __future__ import annotations

from pathlib import Path

from zeps.dev import ControlPlane

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "spark"


def test_manifests_pass_server_side_dry_run(crds: ControlPlane, namespace: str) -> None:
    control_plane = crds  # the CRDs must be served for `kubectl auth can-i` to know zepsstreams
    # the RBAC for real: pod admission checks that the driver's ServiceAccount exists
    assert "serviceaccount/spark-driver created" in control_plane.kubectl(
        "apply", "-n", namespace, "-f", str(EXAMPLES / "driver-rbac.yaml")
    )
    for manifest in ("driver-pod-template.yaml", "executor-pod-template.yaml"):
        out = control_plane.kubectl("apply", "--dry-run=server", "-n", namespace, "-f", str(EXAMPLES / manifest))
        assert "(server dry run)" in out, manifest
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

"""End to end, as a user does it: kubectl apply the examples, wait for Ready, delete."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.cluster


@pytest.mark.parametrize(
    ("example", "kind", "name"), [("topic.yaml", "topic", "cache-invalidation"), ("queue.yaml", "queue", "crawl-links")]
)
def test_apply_example_wait_ready_delete(cluster: Any, example: str, kind: str, name: str) -> None:
    namespace = f"e2e-{kind}"
    cluster.kubectl("create", "namespace", namespace)
    try:
        cluster.kubectl("apply", "-n", namespace, "-f", str(ROOT / "examples" / example))
        cluster.kubectl("wait", "--for=condition=Ready", f"{kind}/{name}", "-n", namespace, "--timeout=120s")
        status = json.loads(cluster.kubectl("get", kind, name, "-n", namespace, "-o", "json"))["status"]
        assert status["observedGeneration"] == 1 and status["path"].endswith(f"/{name}")
        cluster.kubectl("delete", "-n", namespace, "-f", str(ROOT / "examples" / example), "--timeout=120s")
    finally:
        cluster.kubectl("delete", "namespace", namespace, "--wait=false")


def test_example_stream_is_accepted(cluster: Any) -> None:
    """The stream example passes the API server's validation (its broker runs only where pods run)."""
    out = cluster.kubectl(
        "apply", "--dry-run=server", "-n", "default", "-f", str(ROOT / "examples" / "zepsstream.yaml")
    )
    assert "zepsstream.zeps.dev/prices created (server dry run)" in out

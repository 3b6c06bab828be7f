"""Generated files match their single source (CI fails on drift)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_readme_generated_blocks_are_current() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "gen_docs.py"), "--check"], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr


def test_crds_match_their_models() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "zeps_operator.crdgen", "--check"], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr


def test_crd_schemas_are_structural_and_carry_the_sdk_defaults() -> None:
    from zeps.options import TopicOptions  # noqa: PLC0415
    from zeps_operator.crdgen import crd  # noqa: PLC0415
    from zeps_operator.models import KINDS  # noqa: PLC0415

    topic = crd(KINDS[0])["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    depth = topic["properties"]["maxQueueDepth"]
    assert depth == {"description": "Messages a subscriber queue may hold.", "type": "integer",
                     "minimum": 1, "maximum": 1_000_000, "default": TopicOptions().max_queue_depth}  # fmt: skip
    assert topic["properties"]["blockTimeout"]["exclusiveMinimum"] is True

    def walk(node: dict[str, object], path: str) -> None:  # every node typed: what "structural" demands
        assert "type" in node or "x-kubernetes-preserve-unknown-fields" in node, path
        assert "$ref" not in node and "anyOf" not in node, path
        for name, child in (node.get("properties") or {}).items():  # type: ignore[attr-defined]
            walk(child, f"{path}.{name}")

    for kind in KINDS:
        walk(crd(kind)["spec"]["versions"][0]["schema"]["openAPIV3Schema"], kind.kind)

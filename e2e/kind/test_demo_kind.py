"""``make demo CLUSTER=kind`` for real: a second kind cluster (``zeps-demo``) in the suite's engine,
the demo's traffic in pods and its Spark pipeline on this machine, the same summary and consistency
check as the local demo; the demo's cluster is gone afterwards."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(1600)  # the demo's own limit is 1500 s; it takes about 5 minutes on 2 cores
def test_make_demo_on_kind_is_consistent_and_cleans_up() -> None:
    env = {**os.environ, "CLUSTER": "kind"}
    env.pop("ZEPS_KEEP_CLUSTER", None)
    result = subprocess.run(
        [sys.executable, "-m", "zeps_dev.demo"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1500,
        check=False,
    )
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-4000:]
    assert "consistent: every message delivered, every item processed" in result.stdout, out[-4000:]
    for line in (
        "Topic/cache-invalidation: Ready=True",
        "Queue/crawl-links: Ready=True",
        "ZepsStream/orders: Ready=True",
    ):
        assert line in result.stdout
    print(result.stdout[result.stdout.index("primitive") :])
    left = subprocess.run(
        ["docker", "ps", "-a", "-q", "--filter", "label=io.x-k8s.kind.cluster=zeps-demo"],
        capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    assert not left, "the demo left its cluster's node container"

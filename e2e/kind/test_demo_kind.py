"""``make demo CLUSTER=kind`` for real, on the suite's cluster (``ZEPS_DEMO_KUBECONFIG``): the demo's
resources and traffic in pods of its namespace, its Spark pipeline on this machine, the same summary
and consistency check as the local demo; its namespace and port-forwards are gone afterwards. The
cluster a plain ``make demo CLUSTER=kind`` makes for itself is the one every ``make e2e`` makes (the
same ``KindStack``, one node instead of four): a second one here cost the suite minutes of both
cores and checked nothing more."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from kindapp import IMAGE

from zeps_dev.demo import NAMESPACE, ON_CLUSTER, ON_CLUSTER_IMAGE

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(1600)  # the demo's own limit is 1500 s; it takes about 5 minutes on 2 cores
def test_make_demo_on_kind_is_consistent_and_cleans_up(cluster: Any) -> None:
    env = {**os.environ, "CLUSTER": "kind", ON_CLUSTER: os.environ["ZEPS_E2E_KUBECONFIG"], ON_CLUSTER_IMAGE: IMAGE}
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
    assert not cluster.kubectl("get", "namespace", NAMESPACE, "--ignore-not-found"), "the demo left its namespace"
    forwards = subprocess.run(["pgrep", "-f", f"port-forward -n {NAMESPACE}"], capture_output=True, check=False)
    assert forwards.returncode == 1, f"the demo left a port-forward: {forwards.stdout!r}"

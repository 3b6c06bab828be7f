"""make bench-fairness: one namespace applies 5,000 Topics; how long another's one Topic takes to be Ready.

On one stack (everything real and local: ZooKeeper, the control plane, the operator run by kopf):

* the baseline, in the same run: the operator idle, a Topic applied in namespace ``quiet`` and
  waited for (``kubectl apply``, then ``kubectl wait`` for Ready), ``ZEPS_BENCH_SAMPLES`` times (5);
* then namespace ``busy`` applies ``ZEPS_BENCH_TOPICS`` Topics at once (5,000; bench_operator.py's
  ``apply_all``: 4 kubectl processes creating a share each) and, for as long as that apply runs,
  ``quiet`` applies one Topic at a time again (``ZEPS_BENCH_SAMPLES`` at least, four times as many at most);
* reported: the medians of both, their ratio (the operator's promise: the busy namespace's backlog
  costs the quiet one at most 2x: its handlers take namespaces in turn, ``zeps_operator.fairness``),
  and how many of busy's Topics existed and were not Ready yet at each quiet sample (the operator's
  backlog it was measured against).

Prints one JSON line last.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench_operator import apply_all
from zeps_dev import ControlPlane, OperatorProcess, ZooKeeperServer

ROOT = Path(__file__).resolve().parents[1]
TOPICS = int(os.environ.get("ZEPS_BENCH_TOPICS", "5000"))
SAMPLES = int(os.environ.get("ZEPS_BENCH_SAMPLES", "5"))


def say(message: str) -> None:
    print(f"[bench-fairness] {message}", flush=True)


def one_topic(kubectl: list[str], name: str) -> float:
    """Seconds from ``kubectl apply`` of Topic ``name`` in namespace quiet to its Ready condition."""
    topic = {"apiVersion": "zeps.dev/v1alpha1", "kind": "Topic", "metadata": {"name": name, "namespace": "quiet"}}
    start = time.monotonic()
    subprocess.run([*kubectl, "apply", "-f", "-"], input=json.dumps(topic), text=True, capture_output=True,
                   timeout=300, check=True)  # fmt: skip
    subprocess.run([*kubectl, "wait", "--for=condition=Ready", f"topic/{name}", "-n", "quiet", "--timeout=600s"],
                   capture_output=True, timeout=660, check=True)  # fmt: skip
    return time.monotonic() - start


def busy_not_ready(kubectl: list[str]) -> int:
    """Topics of namespace busy that exist and are not Ready yet."""
    listed = subprocess.run([*kubectl, "get", "topics", "-n", "busy", "-o", "json"], capture_output=True, text=True,
                            timeout=300, check=True)  # fmt: skip
    items = json.loads(listed.stdout)["items"]
    return sum(
        1
        for item in items
        if not any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in (item.get("status") or {}).get("conditions", [])
        )
    )


def run(kubectl: list[str]) -> dict[str, Any]:
    idle = [one_topic(kubectl, f"idle-{i}") for i in range(SAMPLES)]
    say(f"idle operator: one Topic Ready in {statistics.median(idle):.2f}s (median of {SAMPLES})")
    applier = threading.Thread(target=apply_all, args=(kubectl, TOPICS, "busy"), name="busy-apply", daemon=True)
    applier.start()
    loaded, backlogs = [], []
    while applier.is_alive() or len(loaded) < SAMPLES:  # quiet's Topics while busy applies its own
        if len(loaded) >= 4 * SAMPLES:
            break
        backlogs.append(busy_not_ready(kubectl))
        loaded.append(one_topic(kubectl, f"loaded-{len(loaded)}"))
        say(f"busy backlog {backlogs[-1]}: one quiet Topic Ready in {loaded[-1]:.2f}s")
    applier.join(timeout=1800)
    idle_s, loaded_s = statistics.median(idle), statistics.median(loaded)
    return {
        "scenario": "fairness",
        "busy_topics": TOPICS,
        "samples": SAMPLES,
        "idle_ready_s_median": round(idle_s, 3),
        "during_backlog_ready_s_median": round(loaded_s, 3),
        "ratio_backlog_to_idle": round(loaded_s / idle_s, 2),
        "busy_not_ready_at_each_sample": backlogs,
        "idle_ready_s": [round(t, 3) for t in idle],
        "during_backlog_ready_s": [round(t, 3) for t in loaded],
    }


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="zeps-bench-fairness-") as tmp_name:
        tmp = Path(tmp_name)
        with ZooKeeperServer(tmp / "zk") as zk, ControlPlane(tmp / "cp") as plane:
            plane.kubectl("apply", "-f", str(ROOT / "crds"))
            plane.kubectl("wait", "--for=condition=Established", "crd/topics.zeps.dev", "--timeout=60s")
            plane.kubectl("create", "namespace", "busy")
            plane.kubectl("create", "namespace", "quiet")
            with OperatorProcess(tmp / "op", kubeconfig=plane.kubeconfig, zookeeper=zk.connect_string):
                result = run(plane.kubectl_argv)
    print(json.dumps(result))


if __name__ == "__main__":
    main()

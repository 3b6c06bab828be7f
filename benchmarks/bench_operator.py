"""make bench-operator: 1,000 Topics applied at once; how long until all are Ready, and the operator's RSS.

Everything real and local: ZooKeeper, the control plane (etcd + kube-apiserver + …), the operator run
by kopf. Also p50 apply->Ready of single Topics applied one at a time afterwards (kubectl wait).
Prints one JSON line last. (No baseline runs here; the issue's reference is Strimzi's old topic
operator needing about 13 minutes for 1,000 topics.)
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from pathlib import Path

from zeps_dev import ControlPlane, OperatorProcess, ZooKeeperServer

ROOT = Path(__file__).resolve().parents[1]
TOPICS = 1000


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="zeps-bench-operator-") as tmp_name:
        tmp = Path(tmp_name)
        with ZooKeeperServer(tmp / "zk") as zk, ControlPlane(tmp / "cp") as plane:
            plane.kubectl("apply", "-f", str(ROOT / "crds"))
            plane.kubectl("wait", "--for=condition=Established", "crd/topics.zeps.dev", "--timeout=60s")
            plane.kubectl("create", "namespace", "bench")
            with OperatorProcess(tmp / "op", kubeconfig=plane.kubeconfig, zookeeper=zk.connect_string) as op:
                docs = [
                    json.dumps(
                        {
                            "apiVersion": "zeps.dev/v1alpha1",
                            "kind": "Topic",
                            "metadata": {"name": f"t-{i:04d}", "namespace": "bench"},
                        }
                    )
                    for i in range(TOPICS)
                ]
                start = time.monotonic()
                plane.kubectl("apply", "-f", "-", input="\n---\n".join(docs))
                applied = time.monotonic() - start
                ready = 0
                while ready < TOPICS and time.monotonic() - start < 900:
                    time.sleep(1)
                    listing = json.loads(plane.kubectl("get", "topics", "-n", "bench", "-o", "json"))
                    ready = sum(
                        any(
                            c["type"] == "Ready" and c["status"] == "True"
                            for c in t.get("status", {}).get("conditions", [])
                        )
                        for t in listing["items"]
                    )
                    print(f"[bench-operator] {time.monotonic() - start:6.1f}s: {ready}/{TOPICS} Ready", flush=True)
                all_ready = time.monotonic() - start
                rss = _rss_mb(op.pid or 0)
                singles = []
                for i in range(20):
                    t0 = time.monotonic()
                    plane.kubectl(
                        "apply",
                        "-n",
                        "bench",
                        "-f",
                        "-",
                        input=json.dumps(
                            {"apiVersion": "zeps.dev/v1alpha1", "kind": "Topic", "metadata": {"name": f"single-{i}"}}
                        ),
                    )
                    plane.kubectl("wait", "--for=condition=Ready", f"topic/single-{i}", "-n", "bench", "--timeout=60s")
                    singles.append(time.monotonic() - t0)
    print(
        json.dumps(
            {
                "scenario": "operator",
                "topics": TOPICS,
                "ready": ready,
                "seconds_to_all_ready": round(all_ready, 1),
                "apply_seconds": round(applied, 1),
                "p50_apply_to_ready_s": round(statistics.median(singles), 3),
                "operator_rss_mb": round(rss, 1),
            }
        )
    )


if __name__ == "__main__":
    main()

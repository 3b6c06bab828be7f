"""make bench-operator: 1,000 Topics applied at once; how long until all are Ready, and the operator's RSS.

Everything real and local: ZooKeeper, the control plane (etcd + kube-apiserver + …), the operator run
by kopf. Also p50 apply->Ready of single Topics applied one at a time afterwards (kubectl wait), and
the API server's request rate while everything is Ready and nothing changes, side by side with the
same control plane's rate before the operator started (the baseline): both from the API server's own
``apiserver_request_total``, over ``ZEPS_BENCH_IDLE_S`` seconds (60). Prints one JSON line last. (The
issue's reference for the time to Ready is Strimzi's old topic operator: about 13 minutes for 1,000.)
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from zeps_dev import ControlPlane, OperatorProcess, ZooKeeperServer

ROOT = Path(__file__).resolve().parents[1]
TOPICS = 1000
IDLE_S = float(os.environ.get("ZEPS_BENCH_IDLE_S", "60"))
WRITES = ("POST", "PUT", "PATCH", "DELETE", "DELETECOLLECTION")


def _label(line: str, name: str) -> str:
    return line.split(f'{name}="', 1)[1].split('"', 1)[0] if f'{name}="' in line else ""


def _requests(plane: ControlPlane) -> dict[str, int]:
    """The API server's request counters (its ``apiserver_request_total``) summed by "VERB resource"."""
    counts: dict[str, int] = {}
    for line in plane.kubectl("get", "--raw", "/metrics").splitlines():
        if line.startswith("apiserver_request_total{"):
            key = f"{_label(line, 'verb')} {_label(line, 'resource') or _label(line, 'subresource') or '-'}"
            counts[key] = counts.get(key, 0) + int(float(line.rsplit(" ", 1)[1]))
    return counts


def _rate(plane: ControlPlane, seconds: float) -> dict[str, float]:
    """Requests per second by "VERB resource" over ``seconds``. Requests without a resource (our own
    reads of /metrics among them) are counted under "VERB -"."""
    before = _requests(plane)
    time.sleep(seconds)
    after = _requests(plane)
    rates = {key: (after.get(key, 0) - before.get(key, 0)) / seconds for key in after}
    return {key: round(rate, 2) for key, rate in sorted(rates.items()) if rate > 0}


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
            print(f"[bench-operator] baseline: the control plane's own requests over {IDLE_S:.0f}s", flush=True)
            baseline = _rate(plane, IDLE_S)
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
                print(f"[bench-operator] all Ready; idle requests over {IDLE_S:.0f}s", flush=True)
                idle = _rate(plane, IDLE_S)
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
                "idle_requests_per_s": round(sum(idle.values()), 2),
                "idle_writes_per_s": round(sum(v for k, v in idle.items() if k.split()[0] in WRITES), 2),
                "idle_by_verb_resource": idle,
                "baseline_requests_per_s": round(sum(baseline.values()), 2),
                "baseline_by_verb_resource": baseline,
            }
        )
    )


if __name__ == "__main__":
    main()

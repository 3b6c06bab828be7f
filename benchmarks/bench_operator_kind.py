"""make bench-operator-kind: bench-operator's figures with the operator in a pod, on kind.

The stack of ``make e2e`` (the images built here, a kind cluster, the chart: the operator and a
3-server ZooKeeper ensemble in pods), then ``ZEPS_BENCH_TOPICS`` Topics (1,000) created at once by
``ZEPS_BENCH_APPLIERS`` kubectl processes, as in bench_operator.py:

* seconds from the start of the apply, and from its end, to all Ready;
* the API server's request rate while all are Ready and nothing changes, over ``ZEPS_BENCH_IDLE_S``
  seconds (60), beside the same cluster's rate with the operator scaled to 0 (the baseline), both
  from the API server's own ``apiserver_request_total``;
* the operator container's RSS (its PID 1, read inside the pod), and its restarts (none expected: a
  restart in the burst means its liveness probe went unanswered).

Everything is removed at the end (cluster and dockerd). Prints one JSON line last.
"""

from __future__ import annotations

import json
import os
import subprocess

from bench_operator import APPLIERS, IDLE_S, measure, rate, say
from zeps_dev.controlplane import request_counts
from zeps_dev.kind import OPERATOR_NAMESPACE, RELEASE, kind_stack_from_env

COUNT = int(os.environ.get("ZEPS_BENCH_TOPICS", "1000").split(",")[0])
OPERATOR_PODS = "app.kubernetes.io/name=zeps-operator"


def main() -> None:
    with kind_stack_from_env(cluster_name="zeps-bench") as stack:
        assert stack.cluster is not None
        kubectl = [str(stack.binaries / "kubectl"), f"--kubeconfig={stack.cluster.kubeconfig}"]

        def run(*args: str) -> str:
            return subprocess.run([*kubectl, *args], capture_output=True, text=True, timeout=600, check=True).stdout

        def counts() -> dict[str, int]:
            return request_counts(run("get", "--raw", "/metrics"))

        def operator_rss_mb() -> float:
            status = run("exec", "-n", OPERATOR_NAMESPACE, f"deploy/{RELEASE}-operator", "--", "cat", "/proc/1/status")
            kb = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:"))
            return round(kb / 1024, 1)

        def operator_restarts() -> int:
            pods = json.loads(run("get", "pods", "-n", OPERATOR_NAMESPACE, "-l", OPERATOR_PODS, "-o", "json"))["items"]
            return sum(c.get("restartCount", 0) for p in pods for c in p["status"].get("containerStatuses", []))

        deployment = f"deployment/{RELEASE}-operator"
        run("scale", "-n", OPERATOR_NAMESPACE, deployment, "--replicas=0")
        run("wait", "-n", OPERATOR_NAMESPACE, "--for=delete", "pod", "-l", OPERATOR_PODS, "--timeout=120s")
        say(f"kind: baseline, the cluster's own requests over {IDLE_S:.0f}s (operator scaled to 0)")
        baseline = rate(counts, IDLE_S)
        run("scale", "-n", OPERATOR_NAMESPACE, deployment, "--replicas=1")
        run("rollout", "status", "-n", OPERATOR_NAMESPACE, deployment, "--timeout=300s")
        run("create", "namespace", "bench")
        figures = measure(kubectl, counts, operator_rss_mb, COUNT, baseline=baseline, singles=True)
        result = {"scenario": "operator-kind", "appliers": APPLIERS, "idle_window_s": IDLE_S, **figures}
        result["operator_restarts"] = operator_restarts()  # a liveness probe unanswered in the burst restarts it
    print(json.dumps(result))


if __name__ == "__main__":
    main()

"""make bench-operator: 1,000 and then 10,000 Topics applied at once; how long until all are Ready.

For each size, on a fresh stack (everything real and local: ZooKeeper, the control plane with etcd
and kube-apiserver, the operator run by kopf):

* ``seconds_to_all_ready``: from the start of the apply to every Topic Ready; ``apply_seconds``: the
  apply alone (``ZEPS_BENCH_APPLIERS`` kubectl processes creating a share each, 4 by default);
  ``end_of_apply_to_all_ready_s``: what the operator still needed once the last Topic existed;
* the API server's request rate while all are Ready and nothing changes, side by side with the same
  control plane's rate before the operator started (the baseline): both from the API server's own
  ``apiserver_request_total``, over ``ZEPS_BENCH_IDLE_S`` seconds (60);
* the operator's RSS once all are Ready and after the idle minute;
* the CPU seconds of the operator, ZooKeeper, etcd and kube-apiserver from the start of the apply to
  all Ready (the apply's kubectl processes share the same two cores).

For the first size also the p50 apply->Ready of single Topics applied one at a time afterwards.
``ZEPS_BENCH_TOPICS`` sets the sizes (``1000,10000``). Prints one JSON line last. (The issue's
reference for the time to Ready is Strimzi's old topic operator: about 13 minutes for 1,000.)
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from zeps_dev import ControlPlane, OperatorProcess, ZooKeeperServer
from zeps_dev.process import cpu_seconds as process_cpu_seconds

ROOT = Path(__file__).resolve().parents[1]
SIZES = [int(n) for n in os.environ.get("ZEPS_BENCH_TOPICS", "1000,10000").split(",")]
APPLIERS = int(os.environ.get("ZEPS_BENCH_APPLIERS", "4"))
IDLE_S = float(os.environ.get("ZEPS_BENCH_IDLE_S", "60"))
WRITES = ("POST", "PUT", "PATCH", "DELETE", "DELETECOLLECTION")


def say(message: str) -> None:
    print(f"[bench-operator] {message}", flush=True)


def rate(counts: Callable[[], dict[str, int]], seconds: float) -> dict[str, float]:
    """Requests per second by "VERB resource" over ``seconds``, from ``counts()`` read before and after
    (:meth:`ControlPlane.request_counts`, or a kind cluster's :func:`zeps_dev.controlplane.request_counts`)."""
    before = counts()
    time.sleep(seconds)
    after = counts()
    rates = {key: (after.get(key, 0) - before.get(key, 0)) / seconds for key in after}
    return {key: round(rate, 2) for key, rate in sorted(rates.items()) if rate > 0}


def cpu_seconds(pids: dict[str, int]) -> dict[str, float]:
    """CPU seconds (user + system) each named process has used so far."""
    used = {}
    for name, pid in pids.items():
        with contextlib.suppress(OSError):  # gone
            used[name] = process_cpu_seconds(pid)
    return used


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def apply_all(kubectl_argv: list[str], count: int, namespace: str = "bench") -> None:
    """Create ``count`` Topics in ``namespace`` with APPLIERS kubectl processes at once, a share each."""
    shares: list[list[str]] = [[] for _ in range(APPLIERS)]
    for i in range(count):
        topic = {"apiVersion": "zeps.dev/v1alpha1", "kind": "Topic", "metadata": {"name": f"t-{i:05d}"}}
        shares[i % APPLIERS].append(json.dumps(topic))
    kubectl = [*kubectl_argv, "create", "-n", namespace, "-f", "-"]
    procs = [
        subprocess.Popen(kubectl, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        for _ in shares
    ]
    for proc, share in zip(procs, shares, strict=True):
        assert proc.stdin is not None
        proc.stdin.write("\n---\n".join(share))
        proc.stdin.close()
    for proc in procs:
        if proc.wait(timeout=1800) != 0:
            raise SystemExit(f"kubectl create failed: {proc.stderr.read() if proc.stderr else ''}")


class ReadyWatch:
    """Which Topics in namespace bench are Ready, from one ``kubectl get --watch`` started before the
    apply: each change arrives once, where polling listed all of them every second (at 1,000 Topics
    the polls' own LISTs cost the API server and kubectl several CPU seconds on the same two cores).
    A watch the server ends is started again; its first listing brings the count up to date."""

    COLUMNS = 'custom-columns=N:.metadata.name,R:.status.conditions[?(@.type=="Ready")].status'

    def __init__(self, kubectl_argv: list[str]) -> None:
        self._argv = [*kubectl_argv, "get", "topics", "-n", "bench", "--watch", "--no-headers", "-o", self.COLUMNS]
        self._ready: dict[str, bool] = {}
        self._changed = threading.Condition()
        self._stopping = False
        self._proc: subprocess.Popen[str] | None = None
        self._reader = threading.Thread(target=self._read, name="ready-watch", daemon=True)

    def __enter__(self) -> ReadyWatch:
        self._reader.start()
        return self

    def __exit__(self, *_: object) -> None:
        with self._changed:
            self._stopping = True
            proc = self._proc
        if proc is not None:
            proc.kill()
        self._reader.join(timeout=30)

    def _read(self) -> None:
        while True:
            with self._changed:
                if self._stopping:
                    return
                proc = self._proc = subprocess.Popen(
                    self._argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
                )
            assert proc.stdout is not None
            for line in proc.stdout:
                name, _, ready = line.strip().partition(" ")
                with self._changed:
                    self._ready[name] = ready.strip() == "True"
                    self._changed.notify_all()
            proc.wait()
            time.sleep(0.5)

    def count(self) -> int:
        with self._changed:
            return sum(self._ready.values())

    def wait(self, count: int, start: float) -> int:
        """Until ``count`` Topics are Ready (at most 30 minutes after ``start``); how many were."""
        last_said = 0.0
        with self._changed:
            while (ready := sum(self._ready.values())) < count and time.monotonic() - start < 1800:
                self._changed.wait(timeout=1.0)
                if time.monotonic() - last_said >= 5:
                    last_said = time.monotonic()
                    say(f"{count}: {last_said - start:6.1f}s: {ready}/{count} Ready")
        return ready


def p50_single(kubectl_argv: list[str]) -> float:
    """The median apply->Ready of 20 Topics applied one at a time (kubectl apply, then kubectl wait)."""
    times = []
    for i in range(20):
        t0 = time.monotonic()
        single = {"apiVersion": "zeps.dev/v1alpha1", "kind": "Topic", "metadata": {"name": f"single-{i}"}}
        subprocess.run([*kubectl_argv, "apply", "-n", "bench", "-f", "-"], input=json.dumps(single), text=True,
                       capture_output=True, timeout=120, check=True)  # fmt: skip
        subprocess.run([*kubectl_argv, "wait", "--for=condition=Ready", f"topic/single-{i}", "-n", "bench",
                        "--timeout=60s"], capture_output=True, timeout=120, check=True)  # fmt: skip
        times.append(time.monotonic() - t0)
    return round(statistics.median(times), 3)


def writes(rates: dict[str, float]) -> float:
    return round(sum(v for k, v in rates.items() if k.split()[0] in WRITES), 2)


def measure(
    kubectl_argv: list[str],
    counts: Callable[[], dict[str, int]],
    rss_mb: Callable[[], float],
    count: int,
    *,
    baseline: dict[str, float],
    singles: bool,
    pids: dict[str, int] | None = None,
) -> dict[str, Any]:
    """With the operator running: ``count`` Topics created at once and waited for, the idle request
    rate once all are Ready, the operator's RSS, and (``singles``) the p50 of one Topic at a time.
    ``baseline``: the same cluster's rate without the operator, reported beside the idle one.
    ``pids``: local processes (by name) whose CPU seconds from the start of the apply to all Ready
    are reported, to show who the two cores went to."""
    with ReadyWatch(kubectl_argv) as watch:
        time.sleep(2)  # kubectl started: its start costs nothing during the apply (its listing would see any Topic)
        cpu_before = cpu_seconds(pids or {})
        start = time.monotonic()
        apply_all(kubectl_argv, count)
        applied = time.monotonic() - start
        say(f"{count}: applied in {applied:.1f}s")
        ready = watch.wait(count, start)
        all_ready = time.monotonic() - start
        cpu_after = {k: v for k, v in cpu_seconds(pids or {}).items() if k in cpu_before}
    rss_ready = rss_mb()
    say(f"{count}: all Ready; idle requests over {IDLE_S:.0f}s")
    idle = rate(counts, IDLE_S)
    rss_idle = rss_mb()
    return {
        "topics": count,
        "ready": ready,
        "seconds_to_all_ready": round(all_ready, 1),
        "apply_seconds": round(applied, 1),
        "end_of_apply_to_all_ready_s": round(all_ready - applied, 1),
        "p50_apply_to_ready_s": p50_single(kubectl_argv) if singles else None,
        "cpu_seconds_apply_to_all_ready": {k: round(v - cpu_before[k], 1) for k, v in cpu_after.items()},
        "operator_rss_mb_all_ready": round(rss_ready, 1),
        "operator_rss_mb_after_idle": round(rss_idle, 1),
        "idle_requests_per_s": round(sum(idle.values()), 2),
        "idle_writes_per_s": writes(idle),
        "idle_by_verb_resource": idle,
        "baseline_requests_per_s": round(sum(baseline.values()), 2),
        "baseline_writes_per_s": writes(baseline),
        "baseline_by_verb_resource": baseline,
    }


def _one_size(count: int, *, singles: bool) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="zeps-bench-operator-") as tmp_name:
        tmp = Path(tmp_name)
        with ZooKeeperServer(tmp / "zk") as zk, ControlPlane(tmp / "cp") as plane:
            plane.kubectl("apply", "-f", str(ROOT / "crds"))
            plane.kubectl("wait", "--for=condition=Established", "crd/topics.zeps.dev", "--timeout=60s")
            plane.kubectl("create", "namespace", "bench")
            say(f"{count}: baseline, the control plane's own requests over {IDLE_S:.0f}s")
            baseline = rate(plane.request_counts, IDLE_S)
            with OperatorProcess(tmp / "op", kubeconfig=plane.kubeconfig, zookeeper=zk.connect_string) as op:
                return measure(
                    plane.kubectl_argv,
                    plane.request_counts,
                    lambda: _rss_mb(op.pid or 0),
                    count,
                    baseline=baseline,
                    singles=singles,
                    pids={"operator": op.pid or 0, "zookeeper": zk.pid or 0, **plane.pids()},
                )


def main() -> None:
    results = []
    for n, count in enumerate(SIZES):
        results.append(_one_size(count, singles=n == 0))
        say(json.dumps(results[-1]))
    print(json.dumps({"scenario": "operator", "appliers": APPLIERS, "idle_window_s": IDLE_S, "sizes": results}))


if __name__ == "__main__":
    main()

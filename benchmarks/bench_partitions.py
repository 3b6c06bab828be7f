"""``make bench-partitions``: a partitioned ZepsStream with 1, 2 and 4 partitions, one run, one machine.

Each partition is a ``zeps-broker --partition p`` process (fsync=group, registered in a real
ZooKeeper) on 127.0.0.1; 100-byte messages under 1,000 keys, so every partition gets its share.

* **Publish**: ``PUBLISHERS`` publisher processes, each a ``PartitionedStreamClient`` publishing
  ``publish_many`` bursts and flushing (every message confirmed): the aggregate rate, and the CPU µs
  per message of each broker (from /proc) and of the publishers.
* **Fan-out 1 -> 10**: ten subscriber processes each reading every partition while one publisher
  publishes: deliveries per second, in all.

The rounds alternate the partition counts (``ROUNDS`` each, medians). The machine's cores are
printed: on 2 cores the publishers, the brokers and the subscribers share them, so a second
partition adds a broker but no core. The last line is one JSON object.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from workers import finish
from zeps_dev import ZooKeeperServer
from zeps_dev.process import cpu_seconds, free_port

HERE = Path(__file__).parent
COUNTS = (1, 2, 4)
ROUNDS = int(os.environ.get("ZEPS_BENCH_ROUNDS", "3"))
PUBLISH_COUNT = int(os.environ.get("ZEPS_BENCH_COUNT", "600000"))  # in all, over the publishers
PUBLISHERS = 2
FANOUT, FANOUT_COUNT = 10, 30_000
CHROOT = "/bench"


class Partitions:
    """A broker per partition, registered in ZooKeeper under the stream's partition nodes."""

    def __init__(self, zk: ZooKeeperServer, tmp: Path, count: int) -> None:
        self.endpoints = [f"tcp://127.0.0.1:{free_port()}" for _ in range(count)]
        self.procs = []
        for p, endpoint in enumerate(self.endpoints):
            argv = [sys.executable, "-m", "zeps.broker.main", "--stream", "orders", "--data-dir", str(tmp / f"p{p}"),
                    "--bind", endpoint, "--fsync", "group", "--zookeeper", zk.connect_string, "--chroot", CHROOT,
                    "--namespace", "bench", "--member", f"b{p}", "--partition", str(p),
                    "--log-level", "WARNING"]  # fmt: skip
            proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
            assert proc.stdout is not None and "serving" in proc.stdout.readline()
            self.procs.append(proc)

    def cpu(self) -> list[float]:
        return [cpu_seconds(p.pid) for p in self.procs]

    def stop(self) -> None:
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            proc.wait(30)


def _workers(role: str, endpoints: list[str], count: int, n: int) -> list[subprocess.Popen[str]]:
    """``n`` worker processes of ``role``, each connected and ready (publishers then wait for "go")."""
    argv = [sys.executable, str(HERE / "partition_worker.py"), role, "--endpoints", ",".join(endpoints),
            "--count", str(count)]  # fmt: skip
    procs = [subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) for _ in range(n)]
    for proc in procs:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        if line != "ready":
            raise SystemExit(f"{role} worker failed to start: {line!r}")
    return procs


def _go(procs: list[subprocess.Popen[str]]) -> None:
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()


def publish(system: Partitions) -> dict[str, float]:
    """PUBLISHERS processes publish PUBLISH_COUNT messages in all, started together: the rate from
    the first start to the last confirmation, and CPU µs per message of the brokers (their mean) and
    of the publishers."""
    each = PUBLISH_COUNT // PUBLISHERS
    total = each * PUBLISHERS
    procs = _workers("publish", system.endpoints, each, PUBLISHERS)
    before = system.cpu()
    _go(procs)
    results = finish(procs)  # done <start> <end> <cpu seconds>
    after = system.cpu()
    start, end = min(r[0] for r in results), max(r[1] for r in results)
    per_broker = total / len(before)  # each broker's share of the messages
    return {
        "per_s": total / (end - start),
        "broker_cpu_us": statistics.mean((a - b) / per_broker * 1e6 for a, b in zip(after, before, strict=True)),
        "publisher_cpu_us": sum(r[2] for r in results) / total * 1e6,
    }


def fanout(system: Partitions) -> float:
    subs = _workers("subscribe", system.endpoints, FANOUT_COUNT, FANOUT)
    publisher = _workers("publish", system.endpoints, FANOUT_COUNT, 1)
    _go(publisher)
    [pub] = finish(publisher)
    end = max(r[0] for r in finish(subs))
    return FANOUT * FANOUT_COUNT / (end - pub[0])


def main() -> None:
    samples: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="zeps-bench-partitions-") as name:
        tmp = Path(name)
        zk = ZooKeeperServer(tmp / "zk")
        zk.start()
        try:
            for round_ in range(ROUNDS):
                for count in COUNTS:
                    system = Partitions(zk, tmp / f"r{round_}-{count}", count)
                    try:
                        result = publish(system)
                        for key, value in result.items():
                            samples.setdefault(f"publish_{key}_{count}", []).append(value)
                        samples.setdefault(f"fanout_deliveries_per_s_{count}", []).append(fanout(system))
                    finally:
                        system.stop()
                    print(json.dumps({"round": round_, "partitions": count,
                                      **{k: round(v, 2) for k, v in result.items()}}), flush=True)  # fmt: skip
        finally:
            zk.stop()
    out: dict[str, Any] = {"scenario": "partitions", "cores": os.cpu_count(), "publishers": PUBLISHERS,
                           "rounds": ROUNDS}  # fmt: skip
    out.update({k: round(statistics.median(v), 2) for k, v in sorted(samples.items())})
    out["publish_2_vs_1"] = round(out["publish_per_s_2"] / out["publish_per_s_1"], 3)
    out["publish_4_vs_1"] = round(out["publish_per_s_4"] / out["publish_per_s_1"], 3)
    out["fanout_2_vs_1"] = round(out["fanout_deliveries_per_s_2"] / out["fanout_deliveries_per_s_1"], 3)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()

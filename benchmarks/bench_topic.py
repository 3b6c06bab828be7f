"""make bench-topic: end-to-end broadcast throughput, the zkms design as written vs zeps Topic.

Both run in this one process against the same ZooKeeper server (same settings: forceSync on,
tickTime 500), with subscribers in separate processes. Measured: from the first publish until every
subscriber has seen every message; reported as messages per second (each delivered to all).
100-byte messages. Prints one JSON line last.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kazoo.client import KazooClient

from zeps.coordination import Topic
from zeps_dev import ZooKeeperServer

HERE = Path(__file__).parent
BODY = b"x" * 100
# messages per run: enough for a few seconds each (the baseline is much slower)
COUNTS = {"baseline": {1: 1000, 10: 300, 20: 200}, "zeps": {1: 100_000, 10: 20_000, 20: 10_000}}


def _spawn(mode: str, hosts: str, root: str, n: int, count: int) -> list[subprocess.Popen[str]]:
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                str(HERE / "topic_worker.py"),
                "--mode",
                mode,
                "--hosts",
                hosts,
                "--root",
                root,
                "--consumer",
                f"s{i}",
                "--count",
                str(count),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in range(n)
    ]
    for p in procs:
        assert p.stdout is not None
        line = p.stdout.readline().strip()
        if line != "ready":
            raise SystemExit(f"subscriber failed to start: {line!r}")
    return procs


def _finish(procs: list[subprocess.Popen[str]], timeout: float = 600) -> float:
    ends = []
    for p in procs:
        out, _ = p.communicate(timeout=timeout)
        ends.append(float(out.split()[-1]))
    return max(ends)


def run_baseline(hosts: str, root: str, n: int) -> float:
    """Seed 000's publisher: list the subscribers, then one synchronous create per subscriber."""
    count = COUNTS["baseline"][n]
    procs = _spawn("baseline", hosts, root, n, count)
    client = KazooClient(hosts=hosts)
    client.start(15)
    start = time.time()
    for _ in range(count):
        for sub in client.get_children(f"{root}/subscribers/bench"):
            client.create(f"{root}/messages/{sub}/bench/m-", BODY, sequence=True)
    end = _finish(procs)
    client.stop()
    client.close()
    return count / (end - start)


def run_zeps(hosts: str, root: str, n: int) -> float:
    count = COUNTS["zeps"][n]
    procs = _spawn("zeps", hosts, root, n, count)
    client = KazooClient(hosts=hosts)
    client.start(15)
    topic = Topic(client, "bench", chroot=root)
    while len(topic.queues()) < n:
        time.sleep(0.01)
    start = time.time()
    for _ in range(count):
        topic.publish_async(BODY)
    topic.flush()
    end = _finish(procs)
    topic.close()
    client.stop()
    client.close()
    return count / (end - start)


def main() -> None:
    results = {}
    with tempfile.TemporaryDirectory(prefix="zeps-bench-topic-") as tmp, ZooKeeperServer(Path(tmp)) as zk:
        for n in (1, 10, 20):
            base = run_baseline(zk.connect_string, f"/bench-base-{n}", n)
            ours = run_zeps(zk.connect_string, f"/bench-zeps-{n}", n)
            results[n] = (ours, base)
            line = {"subscribers": n, "zeps_msgs_per_s": round(ours, 1), "baseline_msgs_per_s": round(base, 1),
                    "ratio": round(ours / base, 2)}  # fmt: skip
            print(json.dumps({"scenario": "topic", **line}), flush=True)
    ours, base = results[20]
    print(
        json.dumps(
            {
                "scenario": "topic",
                "subscribers": 20,
                "zeps_msgs_per_s": round(ours, 1),
                "baseline_msgs_per_s": round(base, 1),
                "ratio": round(ours / base, 2),
                "ratio_1_subscriber": round(results[1][0] / results[1][1], 2),
                "by_subscribers": {
                    str(n): {"zeps": round(o, 1), "baseline": round(b, 1)} for n, (o, b) in results.items()
                },
            }
        )
    )


if __name__ == "__main__":
    main()

"""make bench-queue: drain throughput of zeps WorkQueue vs kazoo's LockingQueue, side by side.

Both run in this one process against the same ZooKeeper server (fsync on), with 1, 4 and 8
consumer processes draining a pre-filled queue of 100-byte items; items/s from "go" until the queue
is empty. zeps consumers use prefetch 10 (take_many + ack_all), its intended use; zeps with
prefetch 1 is reported beside it. Prints one JSON line last.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kazoo.client import KazooClient
from kazoo.recipe.queue import LockingQueue

from zeps.coordination.queue import WorkQueue
from zeps_dev import ZooKeeperServer

HERE = Path(__file__).parent
ITEM = b"x" * 100
COUNTS = {"kazoo": 1000, "zeps": 20_000, "zeps-single": 5_000}


def drain(hosts: str, mode: str, consumers: int, run: int) -> float:
    client = KazooClient(hosts=hosts)
    client.start(15)
    count = COUNTS[mode]
    if mode == "kazoo":
        path = f"/kazoo-{run}"
        LockingQueue(client, path).put_all([ITEM] * count)
        entries = f"{path}/entries"
    else:
        path = f"/zeps-{run}"
        work = WorkQueue(client, "bench", chroot=path)
        work.put_all([ITEM] * count)
        entries = work.paths.items
    prefetch = "10" if mode == "zeps" else "1"
    worker = "kazoo" if mode == "kazoo" else "zeps"
    argv = [sys.executable, str(HERE / "queue_worker.py"), "--mode", worker, "--hosts", hosts, "--path", path]
    argv += ["--prefetch", prefetch]
    procs = [subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) for _ in range(consumers)]
    for p in procs:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    start = time.monotonic()
    for p in procs:
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.flush()
    while (stat := client.exists(entries)) is not None and stat.numChildren > 0:
        time.sleep(0.01)
    elapsed = time.monotonic() - start
    total = 0
    for p in procs:
        out, _ = p.communicate(timeout=120)
        total += int(out.split()[-1])
    client.stop()
    client.close()
    if total != count:
        raise SystemExit(f"{mode}: consumed {total} of {count} items")
    return count / elapsed


def main() -> None:
    results: dict[str, dict[int, float]] = {"kazoo": {}, "zeps": {}, "zeps-single": {}}
    run = 0
    with tempfile.TemporaryDirectory(prefix="zeps-bench-queue-") as tmp, ZooKeeperServer(Path(tmp)) as zk:
        for consumers in (1, 4, 8):
            for mode, by_consumers in results.items():
                run += 1
                by_consumers[consumers] = drain(zk.connect_string, mode, consumers, run)
            line = {m: round(r[consumers], 1) for m, r in results.items()}
            print(json.dumps({"scenario": "queue", "consumers": consumers, **line}), flush=True)
    zeps, kazoo = results["zeps"], results["kazoo"]
    print(
        json.dumps(
            {
                "scenario": "queue",
                "consumers": 8,
                "zeps_items_per_s": round(zeps[8], 1),
                "kazoo_items_per_s": round(kazoo[8], 1),
                "ratio": round(zeps[8] / kazoo[8], 2),
                "zeps_scaling_8_vs_1": round(zeps[8] / zeps[1], 2),
                "kazoo_scaling_8_vs_1": round(kazoo[8] / kazoo[1], 2),
                "zeps_prefetch1_items_per_s": round(results["zeps-single"][8], 1),
                "by_consumers": {m: {str(c): round(v, 1) for c, v in r.items()} for m, r in results.items()},
            }
        )
    )


if __name__ == "__main__":
    main()

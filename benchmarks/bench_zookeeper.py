"""make bench-zookeeper: what a node costs a ZooKeeper server's heap, for sizing it against the
per-namespace quotas (docs: Operations > Install, "Sizing ZooKeeper").

On the project's pinned ZooKeeper (one server, started as the tests start it): the live heap after a
full GC (``jcmd GC.run``, then ``GC.heap_info``: every generation's used bytes) before and after
``ZEPS_BENCH_NODES`` nodes (50,000) are created, one request each (as a Queue's puts), for each data
size in ``ZEPS_BENCH_DATA`` (0, 100 and 1,000 bytes). Before the second reading 600 small writes push
the creates out of the server's log of its last 500 requests (``commitLogCount``), which a
steady-state server holds whatever they were. The baseline is the same server's heap before the
nodes, so the figure is the nodes' own cost.

Prints one JSON line per size, then the summary last: bytes per node besides its data.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile
import time
from pathlib import Path

from kazoo.client import KazooClient

from zeps_dev import ZooKeeperServer

NODES = int(os.environ.get("ZEPS_BENCH_NODES", "50000"))
SIZES = [int(s) for s in os.environ.get("ZEPS_BENCH_DATA", "0,100,1000").split(",")]
IN_FLIGHT = 1000


def live_heap(pid: int) -> int:
    """The server's used heap, every generation, after a full GC."""
    subprocess.run(["jcmd", str(pid), "GC.run"], capture_output=True, check=True)
    time.sleep(1.0)  # the collection settles before the heap is read
    out = subprocess.run(["jcmd", str(pid), "GC.heap_info"], capture_output=True, text=True, check=True).stdout
    return sum(int(used) * 1024 for line in out.splitlines() if "generation" in line
               for used in re.findall(r"used (\d+)K", line))  # fmt: skip


def measure(size: int) -> dict[str, int]:
    with tempfile.TemporaryDirectory(prefix="zeps-bench-zk-") as tmp, ZooKeeperServer(Path(tmp) / "zk") as server:
        pid = server.pid
        assert pid is not None
        zk = KazooClient(hosts=server.connect_string)
        zk.start()
        try:
            zk.ensure_path("/zeps/ns/queue/items")
            before = live_heap(pid)
            body = bytes(size)
            for start in range(0, NODES, IN_FLIGHT):
                pending = [zk.create_async(f"/zeps/ns/queue/items/item-{i:010d}", body)
                           for i in range(start, min(start + IN_FLIGHT, NODES))]  # fmt: skip
                for result in pending:
                    result.get(timeout=60)
            for _ in range(600):
                zk.set("/zeps/ns", b"")
            grown = live_heap(pid) - before
        finally:
            zk.stop()
            zk.close()
    per_node = round(grown / NODES)
    return {"data_bytes": size, "nodes": NODES, "heap_bytes_per_node": per_node, "besides_data": per_node - size}


def main() -> None:
    rows = [measure(size) for size in SIZES]
    for row in rows:
        print(json.dumps(row))
    besides = sorted(row["besides_data"] for row in rows)
    print(json.dumps({"scenario": "zookeeper-memory", "nodes": NODES, "sizes": SIZES,
                      "bytes_per_node_besides_data": besides[len(besides) // 2],
                      "range": [besides[0], besides[-1]]}))  # fmt: skip


if __name__ == "__main__":
    main()

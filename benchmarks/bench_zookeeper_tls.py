"""make bench-zookeeper-tls: what TLS to ZooKeeper costs zeps's clients (the chart's
``zookeeper.ensemble.tls.clientMode``), against the plain port of the same server in the same run.

One pinned ZooKeeper server serving both ports (``ZooKeeperServer(tls=...)``: the settings the
image's launcher writes for ``ZOO_CLIENT_TLS=accept``), certificates as the chart makes them. Two
measures, each on both ports, in alternating rounds (plain, TLS, plain, TLS, ...) so that neither
gets a warmer server:

* **sessions**: ``zeps.coordination.connect`` then close, ``ZEPS_BENCH_SESSIONS`` times (what each
  handle, broker or operator start pays: TCP, then for TLS the handshake, then ZooKeeper's session);
* **work items**: a work Queue's put, take and ack, one after the other, ``ZEPS_BENCH_ITEMS`` times
  (each a few ZooKeeper round trips: latency-bound, as a worker's loop is).

Prints one JSON line per measure and port, then the summary last: TLS's rate as a fraction of plain's.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import zeps
from zeps.coordination import connect
from zeps_dev import ZooKeeperServer
from zeps_dev.tls import certificates

SESSIONS = int(os.environ.get("ZEPS_BENCH_SESSIONS", "60"))
ITEMS = int(os.environ.get("ZEPS_BENCH_ITEMS", "1500"))
ROUNDS = 3


def sessions(hosts: str, ca: str, count: int) -> float:
    """Sessions opened and closed a second."""
    began = time.perf_counter()
    for _ in range(count):
        client = connect(hosts, ca=ca)
        client.stop()
        client.close()
    return count / (time.perf_counter() - began)


def items(queue: Any, count: int) -> float:
    """Work items put, taken and acked a second, one at a time."""
    began = time.perf_counter()
    for n in range(count):
        queue.put(b"x" * 100)
        item = queue.take(timeout=10)
        assert item is not None, f"item {n} was not taken"
        item.ack()
    return count / (time.perf_counter() - began)


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="zeps-bench-zk-tls-") as tmp:
        tls = certificates(Path(tmp) / "tls")
        ca = (tls / "ca.crt").read_text()
        with ZooKeeperServer(Path(tmp) / "zk", tls=tls) as server:
            ports = {"plain": (server.connect_string, ""), "tls": (server.secure_connect_string, ca)}
            queues = {name: zeps.queue(f"bench-{name}", namespace="bench", zookeeper=hosts, zookeeper_ca=pem)
                      for name, (hosts, pem) in ports.items()}  # fmt: skip
            for name, queue in queues.items():  # warm: the queue's paths, the session, the JIT of the server
                items(queue, 100)
                sessions(*ports[name], 5)
            rates: dict[str, dict[str, list[float]]] = {m: {p: [] for p in ports} for m in ("sessions", "items")}
            for _ in range(ROUNDS):
                for name, (hosts, pem) in ports.items():
                    rates["sessions"][name].append(sessions(hosts, pem, SESSIONS // ROUNDS))
                    rates["items"][name].append(items(queues[name], ITEMS // ROUNDS))
    summary: dict[str, Any] = {"benchmark": "zookeeper-tls", "sessions": SESSIONS, "items": ITEMS}
    for measure, by_port in rates.items():
        for port, values in by_port.items():
            print(json.dumps({"measure": measure, "port": port, "per_second": round(statistics.median(values), 1),
                              "rounds": [round(v, 1) for v in values]}))  # fmt: skip
        plain, secure = statistics.median(by_port["plain"]), statistics.median(by_port["tls"])
        summary[f"{measure}_tls_over_plain"] = round(secure / plain, 3)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()

"""make bench-connections: what the broker's connection budget costs a client that connects.

Since the connection budget, every handshake with a broker goes through its ZAP handler (pyzmq's
authenticator, a Python thread of the broker's), which answers before the connection carries a frame.
This measures a client's whole start, as an application pays it: a ``StreamClient`` connects, attaches,
publishes one message and waits for its confirmation, and closes. Two brokers in this process, one
with the budget (``max_connections`` 4,096: the gatekeeper asks about each handshake) and one without
(0: no ZAP handler, as before), same journal settings; rounds of ``STARTS`` client starts alternate
between them, ``REPEATS`` times each. Medians and their ratio (budget / none) are printed, one JSON
line last. What limits the figure: the client's own start (its socket, monitor and I/O), not the
broker.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from pathlib import Path

from zeps.broker.config import DEFAULT_MAX_CONNECTIONS, BrokerConfig
from zeps.broker.server import BrokerServer
from zeps.client import StreamClient
from zeps.journal import JournalConfig

STARTS, REPEATS = 200, 7


def starts_per_second(broker: BrokerServer) -> float:
    began = time.perf_counter()
    for _ in range(STARTS):
        with StreamClient(broker.endpoint, "bench", timeout=30, idempotent=False) as client:
            client.publish("k", b"x")
            client.flush(timeout=30)
    return STARTS / (time.perf_counter() - began)


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="zeps-bench-connections-") as tmp:
        journal = JournalConfig(fsync="never")
        brokers = {
            budget: BrokerServer(
                BrokerConfig(Path(tmp) / str(budget), ("bench",), max_connections=budget, journal=journal)
            ).start()
            for budget in (0, DEFAULT_MAX_CONNECTIONS)
        }
        try:
            rates: dict[int, list[float]] = {budget: [] for budget in brokers}
            for broker in brokers.values():  # warm both up
                starts_per_second(broker)
            for _ in range(REPEATS):
                for budget, broker in brokers.items():
                    rates[budget].append(starts_per_second(broker))
            refused = sum(broker.connections.refused for broker in brokers.values())
        finally:
            for broker in brokers.values():
                broker.stop()
    none, budgeted = (statistics.median(rates[b]) for b in (0, DEFAULT_MAX_CONNECTIONS))
    print(f"client starts/s (connect, attach, one confirmed publish, close): no budget {none:,.0f}, "
          f"budget {DEFAULT_MAX_CONNECTIONS} {budgeted:,.0f}")  # fmt: skip
    print(json.dumps({"benchmark": "connections", "starts_per_s_no_budget": round(none),
                      "starts_per_s_budget": round(budgeted), "ratio_budget_to_none": round(budgeted / none, 3),
                      "starts": STARTS, "repeats": REPEATS, "refused": refused}))  # fmt: skip


if __name__ == "__main__":
    main()

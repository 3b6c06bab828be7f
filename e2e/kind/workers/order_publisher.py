"""Publish orders FIRST..FIRST+COUNT-1 to the ZepsStream ``orders`` at about RATE a second (0: as
fast as the broker takes them), in confirmed groups of 500, printing a JSON line after each group.
On SIGTERM it stops after the group in flight is confirmed and exits 0: its last line names the last
order published (a test sends it with ``kubectl exec <pod> -- sh -c "kill -TERM 1"`` once it has seen
what it waited for, so the orders end then rather than after a fixed time).

Order ``i`` is ``{"country": COUNTRIES[i % 5], "amount": i % 97 + 0.25}`` under key ``order.<country>``,
so a test knows the exact totals of any range (e2e/kind/test_spark.py). Runs in the zeps image; the
handle resolves ``orders`` through the pod's ServiceAccount."""

import json
import signal
import sys
import time

import zeps

COUNTRIES = ["fr", "de", "it", "es", "nl"]


def order(i: int) -> tuple[str, bytes]:
    country = COUNTRIES[i % len(COUNTRIES)]
    return f"order.{country}", json.dumps({"country": country, "amount": i % 97 + 0.25}).encode()


def main() -> None:
    first, count, rate = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
    stream = zeps.stream("orders")
    started, sent = time.monotonic(), 0
    stopping: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, frame: stopping.append(signum))
    while sent < count and not stopping:
        group = min(500, count - sent)
        stream.publish_many([order(i) for i in range(first + sent, first + sent + group)])
        stream.flush(timeout=120)  # confirmed by the broker
        sent += group
        print(json.dumps({"published": first + sent - 1}), flush=True)
        if rate > 0 and not stopping:
            time.sleep(max(0.0, sent / rate - (time.monotonic() - started)))  # the workload's rate
    stream.close()


if __name__ == "__main__":
    main()

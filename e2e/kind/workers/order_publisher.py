"""Publish orders FIRST..FIRST+COUNT-1 to the ZepsStream ``orders`` at about RATE a second (0: as
fast as the broker takes them), in confirmed groups of 500, printing a JSON line after each group.

Order ``i`` is ``{"country": COUNTRIES[i % 5], "amount": i % 97 + 0.25}`` under key ``order.<country>``,
so a test knows the exact totals of any range (e2e/kind/test_spark.py). Runs in the zeps image; the
handle resolves ``orders`` through the pod's ServiceAccount."""

import json
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
    while sent < count:
        group = min(500, count - sent)
        stream.publish_many([order(i) for i in range(first + sent, first + sent + group)])
        stream.flush(timeout=120)  # confirmed by the broker
        sent += group
        print(json.dumps({"published": first + sent - 1}), flush=True)
        if rate > 0:
            time.sleep(max(0.0, sent / rate - (time.monotonic() - started)))
    stream.close()


if __name__ == "__main__":
    main()

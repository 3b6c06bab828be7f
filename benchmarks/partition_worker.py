"""Worker processes for bench_partitions.py, over every partition of stream "orders".

``publish``: connects, prints ``ready``, waits for ``go`` on stdin, publishes --count 100-byte
messages under 1,000 keys with ``publish_many`` and flushes, then prints ``done <start> <end> <cpu>``.
``subscribe``: subscribes to every partition, prints ``ready``, then ``done <end>`` after --count.
"""

from __future__ import annotations

import argparse
import sys
import time

from zeps.client import PartitionedStreamClient

BODY = b"x" * 100
KEYS = [f"customer-{i}" for i in range(1000)]


def publish(client: PartitionedStreamClient, count: int) -> None:
    burst = [(KEYS[i % len(KEYS)], BODY) for i in range(1000)]
    print("ready", flush=True)
    sys.stdin.readline()
    cpu, start = time.process_time(), time.time()
    for _ in range(count // len(burst)):
        client.publish_many(burst)
    client.publish_many(burst[: count % len(burst)])
    client.flush(timeout=300)
    print(f"done {start:.6f} {time.time():.6f} {time.process_time() - cpu:.6f}", flush=True)


def subscribe(client: PartitionedStreamClient, count: int) -> None:
    client.start("", since="latest")
    print("ready", flush=True)
    n = 0
    while n < count:
        got = client.receive_many(30)
        if not got:
            break
        n += len(got)
    print(f"done {time.time():.6f}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("role", choices=["publish", "subscribe"])
    parser.add_argument("--endpoints", required=True)
    parser.add_argument("--count", type=int, required=True)
    args = parser.parse_args()
    options = {"timeout": 120} if args.role == "publish" else {"timeout": 120, "credit_window": 16 << 20}
    with PartitionedStreamClient(args.endpoints.split(","), "orders", **options) as client:
        (publish if args.role == "publish" else subscribe)(client, args.count)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""One consumer process for bench_queue.py: ``--mode kazoo`` (kazoo's LockingQueue) or ``zeps``.

Prints ``ready`` once connected, starts on a line ``go`` from stdin, drains until the queue stays
empty, then prints ``done <items consumed>``.
"""

from __future__ import annotations

import argparse
import sys

from kazoo.client import KazooClient
from kazoo.recipe.queue import LockingQueue

from zeps.coordination.queue import WorkQueue


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=["kazoo", "zeps"], required=True)
    parser.add_argument("--hosts", required=True)
    parser.add_argument("--path", required=True)
    parser.add_argument("--prefetch", type=int, default=1)
    args = parser.parse_args()
    client = KazooClient(hosts=args.hosts)
    client.start(15)
    consumed = 0
    print("ready", flush=True)
    sys.stdin.readline()
    if args.mode == "kazoo":
        queue = LockingQueue(client, args.path)
        while (value := queue.get(timeout=1.0)) is not None:
            queue.consume()
            consumed += 1
            del value
    else:
        work = WorkQueue(client, "bench", chroot=args.path)
        items = work.take_many(args.prefetch, timeout=1.0)
        while items:  # each batch is acked in the transaction that locks the next
            consumed += len(items)
            items = work.take_many(args.prefetch, timeout=1.0, ack=items)
    print(f"done {consumed}", flush=True)
    client.stop()
    client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

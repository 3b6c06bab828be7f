"""One subscriber process for bench_topic.py: ``--mode baseline`` (the zkms design as written) or ``zeps``.

Prints ``ready`` once subscribed, then ``done <unix time>`` when it has seen --count messages.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import threading
import time

from kazoo.client import KazooClient
from kazoo.exceptions import NodeExistsError

from zeps.coordination import Message, Topic


def baseline(client: KazooClient, root: str, consumer: str, count: int, done: threading.Event) -> None:
    """Seed 000 exactly: ephemeral /clients/<id> and /subscribers/<topic>/<id>, a watch on the
    queue, and on every notification: list, sort, then read and delete one node at a time."""
    client.create(f"{root}/clients/{consumer}", ephemeral=True, makepath=True)
    client.create(f"{root}/subscribers/bench/{consumer}", ephemeral=True, makepath=True)
    queue = f"{root}/messages/{consumer}/bench"
    with contextlib.suppress(NodeExistsError):
        client.create(queue, makepath=True)
    seen = 0
    lock = threading.Lock()

    def on_change(_event: object = None) -> None:
        nonlocal seen
        with lock:
            for child in sorted(client.get_children(queue, watch=on_change)):
                client.get(f"{queue}/{child}")
                client.delete(f"{queue}/{child}")
                seen += 1
            if seen >= count:
                done.set()

    on_change()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=["baseline", "zeps"], required=True)
    parser.add_argument("--hosts", required=True)
    parser.add_argument("--root", required=True)
    parser.add_argument("--consumer", required=True)
    parser.add_argument("--count", type=int, required=True)
    args = parser.parse_args()
    client = KazooClient(hosts=args.hosts)
    client.start(15)
    done = threading.Event()
    if args.mode == "baseline":
        baseline(client, args.root, args.consumer, args.count, done)
    else:
        seen = 0

        def on_message(_m: Message) -> None:
            nonlocal seen
            seen += 1
            if seen >= args.count:
                done.set()

        topic = Topic(client, "bench", chroot=args.root)
        subscription = topic.subscribe(on_message, consumer_id=args.consumer)
    print("ready", flush=True)
    done.wait()
    print(f"done {time.time():.6f}", flush=True)
    if args.mode == "zeps":
        subscription.close()
    client.stop()
    client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A work-queue worker in its own process, for chaos tests and benchmarks.

Writes lines to --out, flushed at once: ``session <id> <password>`` (hex, after every new session,
so a test can expire it), ``ready``, ``acking <id>`` before an ack, ``acked <id>`` after it,
``lost <id>`` when the fenced ack refused, ``released <id>`` after a poison item was given back.
Items whose body starts with b"poison" always fail.
"""

from __future__ import annotations

import argparse
import random
import signal
import sys
import threading

from kazoo.client import KazooState
from workload import work

from zeps.coordination import connect
from zeps.coordination.queue import LockLostError, WorkQueue
from zeps.options import QueueOptions


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hosts", required=True)
    parser.add_argument("--queue", required=True)
    parser.add_argument("--chroot", default="/zeps")
    parser.add_argument("--out", required=True)
    parser.add_argument("--prefetch", type=int, default=1)
    parser.add_argument("--work-ms", type=float, default=2.0, help="mean simulated work per item")
    parser.add_argument("--max-attempts", type=int, default=5)
    parser.add_argument("--session-timeout", type=float, default=4.0)
    args = parser.parse_args()

    out = open(args.out, "a", buffering=1)  # noqa: SIM115 — line-buffered for the life of the process
    lock = threading.Lock()

    def say(line: str) -> None:
        with lock:
            out.write(line + "\n")

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    client = connect(args.hosts, session_timeout=args.session_timeout)

    def report_session(state: str = KazooState.CONNECTED) -> None:
        if state == KazooState.CONNECTED:
            session_id, password = client.client_id
            say(f"session {session_id:x} {password.hex()}")

    client.add_listener(lambda state: client.handler.spawn(report_session, state) and None)
    report_session()
    queue = WorkQueue(client, args.queue, chroot=args.chroot, options=QueueOptions.make(max_attempts=args.max_attempts))
    say("ready")
    while not stop.is_set():
        items = queue.take_many(args.prefetch, timeout=0.5)
        for item in items:
            work(random.expovariate(1000 / args.work_ms) if args.work_ms else 0)
            if item.body.startswith(b"poison"):
                try:
                    item.release()
                    say(f"released {item.id}")
                except LockLostError:
                    say(f"lost {item.id}")
                continue
            say(f"acking {item.id}")
            try:
                item.ack()
                say(f"acked {item.id}")
            except LockLostError:
                say(f"lost {item.id}")
    client.stop()
    client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

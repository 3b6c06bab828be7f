"""Batch-queue roles in their own process, for crash tests.

``consume``: process batches as consumer --name, writing ``processed <id>`` per batch; with
--die-at N it kills itself (SIGKILL) right after processing batch N, before committing its position.
``publish``: publish one batch of --size-mb MiB (for torn-write tests); writes ``published <id>``.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading

from zeps.coordination import connect
from zeps.coordination.batches import Batch, BatchQueue
from zeps.options import BatchOptions


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("role", choices=["consume", "publish"])
    parser.add_argument("--hosts", required=True)
    parser.add_argument("--queue", required=True)
    parser.add_argument("--chroot", default="/zeps")
    parser.add_argument("--out", required=True)
    parser.add_argument("--name", default="worker")
    parser.add_argument("--die-at", type=int, default=0)
    parser.add_argument("--store", default=None)
    parser.add_argument("--size-mb", type=int, default=1)
    args = parser.parse_args()
    out = open(args.out, "a", buffering=1)  # noqa: SIM115 — line-buffered for the life of the process
    client = connect(args.hosts)
    options = BatchOptions.make(store_url=args.store) if args.store else BatchOptions()
    queue = BatchQueue(client, args.queue, chroot=args.chroot, options=options)
    if args.role == "publish":
        out.write("ready\n")
        batch_id = queue.publish([b"x" * (1 << 20)] * args.size_mb)
        out.write(f"published {batch_id}\n")
        return 0
    consumer = queue.consumer(args.name)

    def handle(batch: Batch) -> None:
        out.write(f"processed {batch.id} {len(batch.records)}\n")
        if batch.number == args.die_at:
            os.kill(os.getpid(), signal.SIGKILL)  # after the work, before the commit

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    out.write("ready\n")
    consumer.run(handle, stop)
    return 0


if __name__ == "__main__":
    sys.exit(main())

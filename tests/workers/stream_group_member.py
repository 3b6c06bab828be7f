"""A member of consumer group "billing" of the partitioned stream "orders", in its own process (for
crash tests): writes each message it processed as a line "<partition> <sequence>", flushed before it
asks for more (which commits them), until killed."""

from __future__ import annotations

import argparse
import sys

from workload import work

from zeps.client import GroupConsumer


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--zookeeper", required=True)
    parser.add_argument("--chroot", required=True)
    parser.add_argument("--endpoints", required=True, help="each partition's, comma-separated")
    parser.add_argument("--member", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    consumer = GroupConsumer(args.endpoints.split(","), "orders", group="billing", member=args.member,
                             zookeeper=args.zookeeper, chroot=args.chroot, session_timeout=2.0)  # fmt: skip
    with consumer, open(args.out, "a", buffering=1) as out:
        while True:
            batch = consumer.receive_many(0.1, max_messages=20)
            out.write("".join(f"{m.partition} {m.sequence}\n" for m in batch))
            out.flush()
            if batch:
                work(0.02)


if __name__ == "__main__":
    sys.exit(main())

"""A Topic subscriber in its own process, for multi-process tests and benchmarks.

Appends one line per event to --out (flushed at once, so a kill -9 loses no written line):
``start <id>`` before the callback's work, ``done <id> <publisher-seq>`` after it, ``leader`` when
its cleaner is elected, ``ready`` once subscribed; ``holding`` when the callback of message number
--hold-at stops for good (a test then kills the process inside that callback, knowing it is there).
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading

from workload import work

from zeps.coordination import Message, Topic, connect
from zeps.options import TopicOptions


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hosts", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--namespace", default="default")
    parser.add_argument("--chroot", default="/zeps")
    parser.add_argument("--consumer", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--sleep", type=float, default=0.0, help="seconds of work per message")
    parser.add_argument("--session-timeout", type=float, default=10.0)
    parser.add_argument("--cleaner", action="store_true", help="also stand for cleaner")
    parser.add_argument("--cleaner-grace", type=float, default=60.0)
    parser.add_argument("--cleaner-interval", type=float, default=30.0)
    parser.add_argument("--no-subscribe", action="store_true", help="only run the cleaner")
    parser.add_argument("--hold-at", type=int, default=0, help="the callback of this message never returns")
    args = parser.parse_args()

    out = open(args.out, "a", buffering=1)  # noqa: SIM115 — line-buffered for the life of the process
    # SIGTERM stops it: blocked in every thread (before any starts), taken by the sigwait below
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    client = connect(args.hosts, session_timeout=args.session_timeout)
    options = TopicOptions.make(cleaner_grace=args.cleaner_grace, cleaner_interval=args.cleaner_interval)
    topic = Topic(client, args.topic, namespace=args.namespace, chroot=args.chroot, options=options)

    calls = [0]
    never = threading.Event()

    def on_message(message: Message) -> None:
        out.write(f"start {message.id}\n")
        calls[0] += 1
        if calls[0] == args.hold_at:
            out.write("holding\n")
            never.wait()
        work(args.sleep)
        out.write(f"done {message.id}\n")

    cleaner = None
    if args.cleaner:
        cleaner = topic.cleaner(identifier=args.consumer).start()
    sub = None if args.no_subscribe else topic.subscribe(on_message, consumer_id=args.consumer)
    out.write("ready\n")
    if cleaner is not None:
        leads = cleaner  # says "leader" once it leads

        def announce() -> None:
            if leads.wait_leading():
                out.write("leader\n")

        threading.Thread(target=announce, name="announce-leader", daemon=True).start()
    signal.sigwait({signal.SIGTERM})
    if sub is not None:
        sub.close()
    if cleaner is not None:
        cleaner.stop()
    client.stop()
    client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Publish bodies ``1`` .. ``COUNT`` to the ZepsStream ``NAME`` at about RATE a second, GROUP per
confirmed flush, as one idempotent producer; print ``{"confirmed": last, "t": unix time}`` after
each flush that returned. Under the key "ledger"; with a fifth argument KEYS, body n under key
``customer-<n % KEYS>`` (a partitioned stream: spread over its partitions).

The handle resolves ``NAME`` through the pod's ServiceAccount; for a replicated stream it finds the
leader in ZooKeeper and follows it on failover. A flush that fails (the leader went away, too few
replicas in sync) prints ``{"waiting": …}`` and waits again for the same publishes: the client
resends what was not confirmed, and the new leader's producer table keeps each stored once. Gives up
(exit 1) after 240 s without a confirmed flush: a fault the tests make may leave fewer than minInSync
replicas for a minute or more (a lost node's CoreDNS pod delays a restarting replica's ZooKeeper
lookups; it exits and is restarted), and the tests wait up to 300 s for confirmations to resume.
On SIGUSR2 it publishes the rest at once, without pacing (a test whose faults are over hurries it
to its end: ``App.hurry``). Runs in the zeps image."""

import faulthandler
import json
import signal
import sys
import time

import zeps
from zeps.errors import ZepsError


def say(**fields: object) -> None:
    print(json.dumps({**fields, "t": time.time()}), flush=True)


def main() -> None:
    name, count, rate, group = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
    keys = int(sys.argv[5]) if len(sys.argv) > 5 else 0

    def key(n: int) -> str:
        return f"customer-{n % keys}" if keys else "ledger"

    faulthandler.register(signal.SIGUSR1, all_threads=True)  # `kill -USR1 1`: every thread's stack, to the log
    paced = [True]
    signal.signal(signal.SIGUSR2, lambda *_: paced.clear())
    stream = zeps.stream(name)
    started, sent = time.monotonic(), 0
    while sent < count:
        n = min(group, count - sent)
        stream.publish_many([(key(i), str(i).encode()) for i in range(sent + 1, sent + n + 1)])
        sent += n
        since = time.monotonic()  # the last confirmed flush, or this group's first try
        while True:
            try:
                stream.flush(timeout=15)
            except ZepsError as exc:
                say(waiting=sent, error=f"{type(exc).__name__}: {exc}"[:200])
                if time.monotonic() - since > 240:
                    sys.exit(1)
                time.sleep(0.5)  # refused: try again shortly (the workload's retry)
                continue
            break
        say(confirmed=sent)
        if paced:
            time.sleep(max(0.0, sent / rate - (time.monotonic() - started)))  # the workload's rate
    stream.close()


if __name__ == "__main__":
    main()

"""A client of a replicated stream inside the network lab (the test's own process cannot reach the
lab's namespaces). One JSON object per line on stdout.

* ``state``: the stream's replication state in ZooKeeper, once: {"epoch", "leader", "isr"}.
* ``publish``: an idempotent producer publishing ``<tag>:1``, ``<tag>:2``, …, ``--group`` per flush,
  printing {"confirmed": n, "t": unix time} after each flush that returned. With ``--pinned
  ENDPOINT`` it talks to that broker only (no locator: it never follows a new leader). It prints
  {"refused": reason, "t": …} when a flush fails, or a publish is refused (a leader's full volume:
  the SDK raises the refusal once, then attaches again and resends what was unconfirmed; the
  refused publish was not taken, and is made again, as an application does). It stops once
  ``--stop-file`` exists, or after ``--seconds``.
* ``subscribe``: a subscriber from the start, following the leader: {"delivered": [[sequence, body],
  …], "t": …} per batch received; it stops as ``publish`` does.
"""

from __future__ import annotations

import argparse
import json
import os
import time

from workload import Pace

from zeps.client import StreamClient
from zeps.client.discovery import LeaderLocator
from zeps.coordination import connect
from zeps.coordination.replication import read_replication_state
from zeps.errors import PublishRefusedError, ZepsError
from zeps.paths import StreamPaths


def _say(**fields: object) -> None:
    print(json.dumps({**fields, "t": time.time()}), flush=True)


def state(args: argparse.Namespace) -> None:
    zk = connect(args.zookeeper, timeout=5)
    try:
        found = read_replication_state(zk, StreamPaths.of(args.namespace, args.stream, chroot=args.chroot))
    finally:
        zk.stop()
        zk.close()
    if found is None:
        _say(epoch=0, leader="", isr=[])
    else:
        _say(epoch=found.epoch, leader=found.leader, isr=sorted(found.isr))


def publish(args: argparse.Namespace) -> None:
    if args.pinned:
        client = StreamClient(args.pinned, args.stream, producer_id=args.tag, timeout=3)
    else:
        locator = LeaderLocator(args.zookeeper, args.namespace, args.stream, chroot=args.chroot)
        client = StreamClient(locator(), args.stream, producer_id=args.tag, locator=locator, timeout=60)
    # at most 50 flushes a second; refused, it tries again at most twice a second
    deadline, pace, tries = time.monotonic() + args.seconds, Pace(50), Pace(2)
    n = 0

    def going() -> bool:
        return time.monotonic() < deadline and not (args.stop_file and os.path.exists(args.stop_file))

    with client:
        while going():
            for _ in range(args.group):
                n += 1
                while True:
                    try:
                        client.publish("k", f"{args.tag}:{n}".encode())
                        break
                    except PublishRefusedError as exc:  # raised before this publish was taken: made again
                        _say(refused=str(exc)[:200], n=n)
                        if not going():
                            return  # stopping: n was never taken, so nothing more is said confirmed
                        tries.step()
            try:
                client.flush(timeout=3 if args.pinned else 60)
            except ZepsError as exc:
                _say(refused=str(exc)[:200], n=n)
                tries.step()
                continue
            _say(confirmed=n)
            pace.step()


def subscribe(args: argparse.Namespace) -> None:
    """Everything from the start, live after: {"delivered": [[sequence, body], …]} per batch received."""
    locator = LeaderLocator(args.zookeeper, args.namespace, args.stream, chroot=args.chroot)
    deadline = time.monotonic() + args.seconds
    with StreamClient(locator(), args.stream, locator=locator, timeout=60) as client:
        client.start("", since="earliest")
        while time.monotonic() < deadline and not (args.stop_file and os.path.exists(args.stop_file)):
            batch = client.receive_many(0.2)
            if batch:
                _say(delivered=[[m.sequence, m.body.decode()] for m in batch])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("what", choices=["state", "publish", "subscribe"])
    p.add_argument("--zookeeper", required=True)
    p.add_argument("--chroot", default="/zeps")
    p.add_argument("--namespace", default="default")
    p.add_argument("--stream", default="prices")
    p.add_argument("--tag", default="p")
    p.add_argument("--group", type=int, default=10)
    p.add_argument("--pinned", default=None)
    p.add_argument("--seconds", type=float, default=120)
    p.add_argument("--stop-file", default=None)
    args = p.parse_args()
    {"state": state, "publish": publish, "subscribe": subscribe}[args.what](args)


if __name__ == "__main__":
    main()

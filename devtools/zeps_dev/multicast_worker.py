"""The processes of the multicast tests and ``make bench-multicast``, each run in a lab host
(:mod:`zeps_dev.netlab`) with ``python -m zeps_dev.multicast_worker ROLE …``; each prints one JSON
line when done.

* ``publish``: ``--count`` messages at ``--rate`` per second (``publish_many`` every millisecond or
  so), keys cycling through ``--keys``, body ``b"<index>"``; then flush. Prints
  ``{"publishing": true}`` once connected, as it starts.
* ``multicast``: a multicast subscription from ``--since`` with key prefix ``--prefix`` until it has
  every record up to ``--count`` that matches (``--aio``: with the asyncio client); prints what it
  got (as sequence ranges), whether each body matched its sequence, the subscription's stats, and
  the seconds from its first record to its last; ``{"receiving": true}`` as its first record arrives.
* ``unicast``: the same through an ordinary subscription (``bench-multicast``'s baseline).

``--key`` (hex): the stream's multicast key, for a receiver of a signed stream. ``--start-on FILE``
(a receiver): connect, print ``{"connected": true}``, and subscribe only once ``FILE`` exists, so a
test can start a receiver late at a moment of its choosing, not after however long the process takes
to start on a loaded machine.

A fresh stream's sequences are the publish indexes plus one (one idempotent publisher), so a receiver
can check each record it got without being told what was sent.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import sys
import time
from pathlib import Path
from typing import Any

from zeps.client import AsyncStreamClient, Message, Seq, StreamClient
from zeps.client.reconcile import MulticastStats


def ranges(sequences: list[int]) -> list[list[int]]:
    """``sequences`` (increasing) as [first, last] runs of consecutive ones."""
    out: list[list[int]] = []
    for s in sequences:
        if out and s == out[-1][1] + 1:
            out[-1][1] = s
        else:
            out.append([s, s])
    return out


def _report(got: list[Message], started: float, **extra: Any) -> None:
    sequences = [m.sequence for m in got]
    print(json.dumps({
        "count": len(got),
        "ranges": ranges(sequences),
        "in_order": all(a < b for a, b in itertools.pairwise(sequences)),
        "bodies_ok": all(m.body == b"%d" % (m.sequence - 1) for m in got),
        "seconds": (time.monotonic() - started) if got else 0.0,
        **extra,
    }), flush=True)  # fmt: skip


def wanted_sequences(count: int, keys: list[str], prefix: str) -> list[int]:
    """The sequences of ``count`` publishes (keys cycling through ``keys``) that match ``prefix``."""
    return [i + 1 for i in range(count) if keys[i % len(keys)].startswith(prefix)]


def publish(args: argparse.Namespace) -> None:
    keys = args.keys.split(",")
    with StreamClient(args.endpoint, args.stream, timeout=60) as client:
        print(json.dumps({"publishing": True}), flush=True)
        start, sent = time.monotonic(), 0
        while sent < args.count:
            due = min(args.count, int((time.monotonic() - start) * args.rate) + 1)
            if due > sent:
                client.publish_many((keys[i % len(keys)], b"%d" % i) for i in range(sent, due))
                sent = due
            else:
                time.sleep(0.001)
        client.flush(timeout=60)
    print(json.dumps({"published": sent, "seconds": time.monotonic() - start}), flush=True)


def _wait_for_start(args: argparse.Namespace) -> None:
    """With ``--start-on``: say the client is connected, then wait (bounded by ``--timeout``) for the
    file that starts the subscription."""
    if args.start_on is None:
        return
    print(json.dumps({"connected": True}), flush=True)
    deadline = time.monotonic() + args.timeout
    while not args.start_on.exists():
        if time.monotonic() > deadline:
            raise SystemExit(f"{args.start_on} did not appear within {args.timeout} s")
        time.sleep(0.01)


def receive(args: argparse.Namespace) -> None:
    keys = args.keys.split(",")
    wanted = len(wanted_sequences(args.count, keys, args.prefix))
    got: list[Message] = []
    deadline = time.monotonic() + args.timeout
    started = 0.0
    with StreamClient(args.endpoint, args.stream, timeout=30) as client:
        _wait_for_start(args)
        if args.role == "multicast":
            subscription = client.subscribe_multicast(args.prefix, since=Seq(args.since), multicast=args.multicast,
                                                      key=args.key)  # fmt: skip
            take = subscription.receive_many
        else:
            client.start(args.prefix, since=Seq(args.since))
            take = client.receive_many
        print(json.dumps({"ready": True}), flush=True)
        while len(got) < wanted and time.monotonic() < deadline:
            batch = take(0.5)
            if batch and not started:
                started = time.monotonic()
                print(json.dumps({"receiving": True}), flush=True)
            got += batch
        extra = _stats(subscription.stats) if args.role == "multicast" else {}
        if args.role == "multicast":
            subscription.close()
    _report(got, started, wanted=wanted, **extra)


def _stats(stats: MulticastStats) -> dict[str, Any]:
    return {"multicast_records": stats.multicast_records, "fetched_records": stats.fetched_records,
            "gaps": stats.gaps, "gap_ranges": stats.gap_ranges[-10:], "duplicates": stats.duplicates,
            "fetches": stats.fetches, "bad_messages": stats.bad_messages, "forged": stats.forged,
            "relay_restarts": stats.relay_restarts}  # fmt: skip


async def receive_aio(args: argparse.Namespace) -> None:
    """``multicast`` with the asyncio client (the same names, awaited)."""
    wanted = len(wanted_sequences(args.count, args.keys.split(","), args.prefix))
    got: list[Message] = []
    deadline, started = time.monotonic() + args.timeout, 0.0
    async with AsyncStreamClient(args.endpoint, args.stream, timeout=30) as client:
        await asyncio.to_thread(_wait_for_start, args)
        subscription = await client.subscribe_multicast(args.prefix, since=Seq(args.since), multicast=args.multicast,
                                                        key=args.key)  # fmt: skip
        async with subscription:
            print(json.dumps({"ready": True}), flush=True)
            while len(got) < wanted and time.monotonic() < deadline:
                batch = await subscription.receive_many(0.5)
                if batch and not started:
                    started = time.monotonic()
                    print(json.dumps({"receiving": True}), flush=True)
                got += batch
            extra = _stats(subscription.stats)
    _report(got, started, wanted=wanted, aio=True, **extra)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m zeps_dev.multicast_worker")
    p.add_argument("role", choices=["publish", "multicast", "unicast"])
    p.add_argument("--endpoint", required=True)
    p.add_argument("--stream", default="prices")
    p.add_argument("--count", type=int, required=True)
    p.add_argument("--rate", type=float, default=5000.0)
    p.add_argument("--keys", default="eu.fr,us.ny,eu.de")
    p.add_argument("--prefix", default="")
    p.add_argument("--since", type=int, default=0)
    p.add_argument("--multicast", default="", help="the broker's multicast options, as JSON or a URL")
    p.add_argument("--timeout", type=float, default=120.0)
    p.add_argument("--aio", action="store_true", help="multicast: with the asyncio client")
    p.add_argument("--key", type=bytes.fromhex, default=None, help="a signed stream's multicast key (hex)")
    p.add_argument("--start-on", type=Path, default=None, help="a receiver: subscribe once this file exists")
    args = p.parse_args(argv)
    if args.multicast.startswith("{"):
        args.multicast = json.loads(args.multicast)
    if args.role == "publish":
        publish(args)
    elif args.aio:
        asyncio.run(receive_aio(args))
    else:
        receive(args)


if __name__ == "__main__":
    main(sys.argv[1:])

"""Subscriber processes for bench_stream.py.

Roles: ``zeps`` (live, or ``--replay`` from the start), ``jetstream`` (pull consumer), ``zmq`` (raw
SUB), ``relay`` (raw SUB forwarding each message to a PUB bound at --relay-to: one hop through a
Python process, what a broker is at the least). Each prints ``ready`` when subscribed, then
``done <unix time> <start> [p50 p99 p99.9 max ms, each second's p99]`` after --count messages
(latencies from a send time in the body, with --latency).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time

import zmq

from zeps.client import Seq, StreamClient


def _report(latencies: list[tuple[float, float]]) -> str:
    """p50, p99, p99.9 and max (ms), then the p99 of each second of the run, oldest first: the tail
    over time (a broker that slows down after a load shows in the first seconds)."""
    if not latencies:
        return ""
    values = [ms for _, ms in latencies]
    q = statistics.quantiles(values, n=1000, method="inclusive")
    seconds: dict[int, list[float]] = {}
    first = latencies[0][0]
    for at, ms in latencies:
        seconds.setdefault(int(at - first), []).append(ms)
    per_second = [statistics.quantiles(v, n=100, method="inclusive")[98] if len(v) > 1 else v[0]
                  for _, v in sorted(seconds.items())]  # fmt: skip
    return "".join(f" {x:.3f}" for x in (q[499], q[989], q[998], max(values), *per_second))


def _latency(body: bytes, out: list[tuple[float, float]]) -> None:
    now = time.time_ns()
    out.append((now / 1e9, (now - int(body[:19])) / 1e6))


def run_zeps(args: argparse.Namespace) -> None:
    latencies: list[tuple[float, float]] = []
    stamps: list[tuple[int, int]] = []  # with --stamps: (send time in the body, arrival), in ns
    with StreamClient(args.endpoint, "bench", credit_window=16 << 20) as client:
        client.start("", since=Seq(0) if args.replay else "latest")
        print("ready", flush=True)
        n = 0
        start = time.time()
        while n < args.count:
            message = client.receive(30)
            if message is None:
                break
            n += 1
            if args.latency:
                _latency(message.body, latencies)
            if args.stamps:
                stamps.append((int(message.body[:19]), time.time_ns()))
    if args.stamps:
        with open(args.stamps, "w") as out:
            out.writelines(f"{sent}\t{arrived}\n" for sent, arrived in stamps)
    print(f"done {time.time():.6f} {start:.6f}{_report(latencies)}", flush=True)


async def run_jetstream(args: argparse.Namespace) -> None:
    import nats  # noqa: PLC0415 — only the benchmark needs it
    from nats.js.api import ConsumerConfig, DeliverPolicy  # noqa: PLC0415

    nc = await nats.connect(args.endpoint)
    js = nc.jetstream()
    policy = DeliverPolicy.ALL if args.replay else DeliverPolicy.NEW
    sub = await js.pull_subscribe("bench.>", durable=args.name, stream="bench",
                                  config=ConsumerConfig(deliver_policy=policy, max_ack_pending=-1))  # fmt: skip
    print("ready", flush=True)
    latencies: list[tuple[float, float]] = []
    n = 0
    start = time.time()
    while n < args.count:
        try:
            batch = await sub.fetch(1000, timeout=5)
        except TimeoutError:
            continue
        for message in batch:
            n += 1
            if args.latency:
                _latency(message.data, latencies)
        await batch[-1].ack()  # AckAll policy would ack all; explicit ack of the last is enough here
    print(f"done {time.time():.6f} {start:.6f}{_report(latencies)}", flush=True)
    await nc.close()


def run_zmq(args: argparse.Namespace) -> None:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.SUB)
    sock.setsockopt(zmq.RCVHWM, 0)
    sock.setsockopt(zmq.SUBSCRIBE, b"")
    sock.connect(args.endpoint)
    time.sleep(0.5)  # PUB/SUB joins late: give the subscription time to reach the publisher
    relay = None
    if args.role == "relay":
        relay = ctx.socket(zmq.PUB)
        relay.setsockopt(zmq.SNDHWM, 0)
        relay.bind(args.relay_to)
        time.sleep(0.5)  # and the subscriber's subscription time to reach the relay
    print("ready", flush=True)
    latencies: list[tuple[float, float]] = []
    n = 0
    start = time.time()
    while n < args.count:
        body = sock.recv()
        n += 1
        if relay is not None:
            relay.send(body)
        elif args.latency:
            _latency(body, latencies)
    print(f"done {time.time():.6f} {start:.6f}{_report(latencies)}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("role", choices=["zeps", "jetstream", "zmq", "relay"])
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--name", default="sub")
    parser.add_argument("--replay", action="store_true")
    parser.add_argument("--latency", action="store_true")
    parser.add_argument("--relay-to", default="", help="relay: the endpoint its PUB binds")
    parser.add_argument("--stamps", default="", help="zeps: write each message's send and arrival times (ns) here")
    args = parser.parse_args()
    if (args.role == "relay") != bool(args.relay_to):
        parser.error("--relay-to goes with the relay role, and only with it")
    if args.role == "zeps":
        run_zeps(args)
    elif args.role == "jetstream":
        asyncio.run(run_jetstream(args))
    else:  # zmq, relay
        run_zmq(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())

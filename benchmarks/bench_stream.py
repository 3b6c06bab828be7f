"""make bench-stream: the zeps broker side by side with NATS JetStream, and raw pyzmq as the ceiling.

One run, one machine, 100-byte messages, every server and subscriber in its own process on
127.0.0.1, the publisher in this process:

* zeps: ``zeps-broker`` (fsync=group, the default) with the blocking Python client speaking ZEPS
  version 3: throughput scenarios publish with ``publish_many`` (PUBLISH-BATCH, the way nats-py
  buffers its publishes) and subscribers receive DELIVER-BATCH; the latency scenario publishes one
  message at a time; 1->1 is measured both ways, and one at a time also with ``linger=0`` (each
  publish its own frame: the client before it lingered by default, ``1to1_single_unlingered``);
* JetStream: ``nats-server -js`` built from its pinned Go module (file storage) with nats-py, pull
  consumers fetching 1,000 at a time, publishing with core NATS publish into the stream's subject
  (no per-message ack: the same asynchronous publishing ZEPS does);
* raw pyzmq PUB/SUB between two processes: no broker, no journal — the physical ceiling.

Scenarios: (a) 1 publisher -> 10 subscribers, deliveries/s; (b) replay of 100,000 messages to a late
joiner, msgs/s; (c) publish->deliver latency, one publish per message, at 1,000 and 20,000 msgs/s
for 5 s each: p50, p99, p99.9, max and the p99 of each second (the tail over time), zeps's on a fresh
broker and again right after the throughput rounds, JetStream's after its, and the floor: raw pyzmq
through one relay process (PUB -> SUB/PUB -> SUB) paced the same way; plus 1->1 throughput of the
broker against raw pyzmq. Prints one JSON line last.

Idempotence: zeps's throughput scenarios (a and both 1->1) run with plain publishes
(``idempotent=False``, at-least-once) and as an idempotent producer (the clients' default: PRODUCE,
PUBLISH-(BATCH-)SEQ, the broker's producer table and group marks), alternating, ``ROUNDS`` times each
on the same broker; the medians and their ratios (idempotent / plain) are reported. Beside the rates,
each run's CPU time per published message in the broker and in the publisher (µs; /proc/<pid>/stat
and ``time.process_time``): what idempotence costs, far less noisy here than a rate on 2 shared cores.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import zmq

from workers import finish, nats_server
from zeps.client import StreamClient
from zeps_dev.process import cpu_seconds, free_port, wait_until

HERE = Path(__file__).parent
BODY = b"x" * 100
FANOUT, FANOUT_COUNT = 10, 20_000
ONE_TO_ONE_COUNT = 300_000
REPLAY_COUNT = 100_000
RAW_COUNT = 500_000
LATENCY_RATES, LATENCY_SECONDS = (1000, 20_000), 5
ROUNDS = 5  # plain and idempotent zeps runs, alternating, per throughput scenario (single runs vary ±20% here)


def _spawn(role: str, endpoint: str, count: int, n: int = 1, *extra: str) -> list[subprocess.Popen[str]]:
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                str(HERE / "stream_worker.py"),
                role,
                "--endpoint",
                endpoint,
                "--count",
                str(count),
                "--name",
                f"sub{i}-{time.monotonic_ns()}",
                *extra,
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in range(n)
    ]
    for p in procs:
        assert p.stdout is not None
        line = p.stdout.readline().strip()
        if line != "ready":
            raise SystemExit(f"{role} subscriber failed to start: {line!r}")
    return procs


# -- zeps ---------------------------------------------------------------------------------------
class Zeps:
    def __init__(self, tmp: Path, fsync: str = "group") -> None:
        self.endpoint = f"tcp://127.0.0.1:{free_port()}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "zeps.broker.main", "--stream", "bench", "--data-dir", str(tmp / "zeps"),
             "--bind", self.endpoint, "--fsync", fsync, "--log-level", "WARNING"],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert self.proc.stdout is not None and "serving" in self.proc.stdout.readline()
        self.publisher_cpu = 0.0  # CPU seconds of the last publish() in this process

    def publish(
        self,
        count: int,
        rate: float | None = None,
        *,
        single: bool = False,
        idempotent: bool = False,
        linger: float | None = None,
    ) -> float:
        cpu = time.process_time()
        lingering = {} if linger is None else {"linger": linger}  # None: the client's default
        with StreamClient(self.endpoint, "bench", timeout=120, idempotent=idempotent, **lingering) as client:
            start = time.time()
            if rate or single:
                for i in range(count):
                    if rate:
                        _pace(start, i, rate)
                    client.publish("bench.k", _stamped() if rate else BODY)
            else:
                burst = [("bench.k", BODY)] * 1000
                for _ in range(count // len(burst)):
                    client.publish_many(burst)
                client.publish_many(burst[: count % len(burst)])
            client.flush(timeout=120)
        self.publisher_cpu = time.process_time() - cpu
        return start

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


# -- JetStream ----------------------------------------------------------------------------------
class JetStream:
    def __init__(self, tmp: Path) -> None:
        port = free_port()
        self.endpoint = f"nats://127.0.0.1:{port}"
        self.proc = subprocess.Popen(
            [nats_server(), "-a", "127.0.0.1", "-p", str(port), "-js", "-sd", str(tmp / "nats")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        wait_until(lambda: _listening(port), timeout=20, what="nats-server")
        asyncio.run(self._reset())

    async def _reset(self) -> None:
        import nats  # noqa: PLC0415

        nc = await nats.connect(self.endpoint)
        js = nc.jetstream()
        with contextlib.suppress(Exception):  # not there yet
            await js.delete_stream("bench")
        await js.add_stream(name="bench", subjects=["bench.>"], storage="file")
        await nc.close()

    def reset(self) -> None:
        asyncio.run(self._reset())

    def publish(self, count: int, rate: float | None = None) -> float:
        return asyncio.run(self._publish(count, rate))

    async def _publish(self, count: int, rate: float | None) -> float:
        import nats  # noqa: PLC0415

        nc = await nats.connect(self.endpoint, pending_size=64 << 20)
        start = time.time()
        for i in range(count):
            if rate:
                await asyncio.sleep(max(0.0, start + i / rate - time.time()))
                await nc.publish("bench.k", _stamped())
            else:
                await nc.publish("bench.k", BODY)
        await nc.flush(timeout=120)
        await nc.close()
        return start

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


def _listening(port: int) -> bool:
    import socket  # noqa: PLC0415

    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _stamped() -> bytes:
    return str(time.time_ns()).encode().ljust(100, b"x")


def _pace(start: float, i: int, rate: float) -> None:
    delay = start + i / rate - time.time()
    if delay > 0:
        time.sleep(delay)


# -- scenarios ----------------------------------------------------------------------------------
def fanout(system: Any, role: str, **how: Any) -> float:
    subs = _spawn(role, system.endpoint, FANOUT_COUNT, FANOUT)
    start = system.publish(FANOUT_COUNT, **how)
    end = max(r[0] for r in finish(subs))
    return FANOUT * FANOUT_COUNT / (end - start)


def one_to_one(system: Any, role: str, **how: Any) -> float:
    subs = _spawn(role, system.endpoint, ONE_TO_ONE_COUNT)
    start = system.publish(ONE_TO_ONE_COUNT, **how)
    end = finish(subs)[0][0]
    return ONE_TO_ONE_COUNT / (end - start)


def _plain_and_idempotent(system: Zeps, role: str) -> dict[str, float]:
    """zeps's throughput scenarios with plain and idempotent publishes, alternating; medians of the
    rates and of the broker's and the publisher's CPU µs per published message."""
    scenarios = {"deliveries": (FANOUT_COUNT, lambda idem: fanout(system, role, idempotent=idem)),
                 "1to1": (ONE_TO_ONE_COUNT, lambda idem: one_to_one(system, role, idempotent=idem)),
                 "1to1_single": (ONE_TO_ONE_COUNT,
                                 lambda idem: one_to_one(system, role, single=True, idempotent=idem)),
                 "1to1_single_unlingered": (ONE_TO_ONE_COUNT,
                                            lambda idem: one_to_one(system, role, single=True, idempotent=idem,
                                                                    linger=0.0))}  # fmt: skip
    samples: dict[str, list[float]] = {}
    for _ in range(ROUNDS):
        for key, (count, run) in scenarios.items():
            for idempotent in (False, True):
                name = f"zeps_idempotent_{key}" if idempotent else f"zeps_{key}"
                broker_cpu = cpu_seconds(system.proc.pid)
                samples.setdefault(f"{name}_per_s", []).append(run(idempotent))
                broker_us = (cpu_seconds(system.proc.pid) - broker_cpu) / count * 1e6
                samples.setdefault(f"{name}_broker_cpu_us", []).append(broker_us)
                samples.setdefault(f"{name}_publisher_cpu_us", []).append(system.publisher_cpu / count * 1e6)
    return {name: statistics.median(values) for name, values in samples.items()}


def replay(system: Any, role: str) -> float:
    system.publish(REPLAY_COUNT)
    [result] = finish(_spawn(role, system.endpoint, REPLAY_COUNT, 1, "--replay"))
    return REPLAY_COUNT / (result[0] - result[1])


def latency(system: Any, role: str, rate: int) -> dict[str, Any]:
    """Publish->deliver latency (ms) of one publish per message at ``rate`` msgs/s for LATENCY_SECONDS."""
    count = rate * LATENCY_SECONDS
    subs = _spawn(role, system.endpoint, count, 1, "--latency")
    system.publish(count, rate=rate)
    [result] = finish(subs)
    p50, p99, p999, worst, *per_second = result[2:]
    return {"p50": round(p50, 3), "p99": round(p99, 3), "p99.9": round(p999, 3), "max": round(worst, 3),
            "p99_per_second": [round(x, 3) for x in per_second]}  # fmt: skip


def latencies(system: Any, role: str, when: str) -> dict[str, dict[str, Any]]:
    return {f"{when}_{rate // 1000}k": latency(system, role, rate) for rate in LATENCY_RATES}


def raw_zmq() -> float:
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.SNDHWM, 0)
    pub.bind(endpoint)
    subs = _spawn("zmq", endpoint, RAW_COUNT)
    start = time.time()
    for _ in range(RAW_COUNT):
        pub.send(BODY)
    end = finish(subs)[0][0]
    pub.close()
    ctx.term()
    return RAW_COUNT / (end - start)


class ZmqRelay:
    """The floor of publish->deliver latency on this machine: raw pyzmq PUB (this process) -> a relay
    process (SUB, then PUB) -> SUB, paced as zeps's publisher is: the same hops, the same wake-ups, no
    journal, no protocol, no fsync. Measured by :func:`latency` like the systems (its subscriber role:
    ``zmq``)."""

    def __init__(self) -> None:
        self.upstream, self.endpoint = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
        self.ctx = zmq.Context()
        self.pub = self.ctx.socket(zmq.PUB)
        self.pub.setsockopt(zmq.SNDHWM, 0)
        self.pub.bind(self.upstream)

    def publish(self, count: int, rate: float) -> float:
        relay = _spawn("relay", self.upstream, count, 1, "--relay-to", self.endpoint)
        start = time.time()
        for i in range(count):
            _pace(start, i, rate)
            self.pub.send(_stamped())
        finish(relay)
        return start

    def stop(self) -> None:
        self.pub.close()
        self.ctx.term()


def main() -> None:
    nats_server()  # built, or a clear message now rather than after the zeps half
    results: dict[str, float] = {}
    tails: dict[str, dict[str, dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="zeps-bench-stream-") as tmp_name:
        tmp = Path(tmp_name)
        results["raw_zmq_per_s"] = raw_zmq()
        floor = ZmqRelay()
        try:
            relay = {f"{rate // 1000}k": latency(floor, "zmq", rate) for rate in LATENCY_RATES}
        finally:
            floor.stop()
        print(json.dumps({"scenario": "stream", "system": "zmq_relay", "latency_ms": relay}), flush=True)
        for name, factory, role in (("zeps", Zeps, "zeps"), ("jetstream", JetStream, "jetstream")):
            system = factory(tmp / name)
            try:
                if name == "zeps":
                    tails[name] = latencies(system, role, "fresh")
                    results.update(_plain_and_idempotent(system, role))
                else:
                    tails[name] = {}
                    results[f"{name}_deliveries_per_s"] = fanout(system, role)
                    results[f"{name}_1to1_per_s"] = one_to_one(system, role)
                tails[name].update(latencies(system, role, "after"))
                results[f"{name}_p50_ms"] = tails[name]["after_1k"]["p50"]
                results[f"{name}_p99_ms"] = tails[name]["after_1k"]["p99"]
                if name == "jetstream":
                    system.reset()  # an empty stream: the replay reads exactly REPLAY_COUNT
                results[f"{name}_replay_per_s"] = replay(system, role)
            finally:
                system.stop()
            mine = {k: round(v, 2) for k, v in results.items() if k.startswith(name)}
            print(json.dumps({"scenario": "stream", "system": name, **mine, "latency_ms": tails[name]}), flush=True)
    zeps, js = results["zeps_deliveries_per_s"], results["jetstream_deliveries_per_s"]
    print(json.dumps({
        "scenario": "stream",
        "zeps_deliveries_per_s": round(zeps, 1),
        "jetstream_deliveries_per_s": round(js, 1),
        "ratio": round(zeps / js, 2),
        "zeps_replay_per_s": round(results["zeps_replay_per_s"], 1),
        "jetstream_replay_per_s": round(results["jetstream_replay_per_s"], 1),
        "replay_ratio": round(results["zeps_replay_per_s"] / results["jetstream_replay_per_s"], 2),
        "raw_zmq_per_s": round(results["raw_zmq_per_s"], 1),
        "zeps_1to1_per_s": round(results["zeps_1to1_per_s"], 1),
        "zeps_1to1_vs_raw_zmq": round(results["zeps_1to1_per_s"] / results["raw_zmq_per_s"], 3),
        "zeps_1to1_single_per_s": round(results["zeps_1to1_single_per_s"], 1),
        "zeps_1to1_single_vs_raw_zmq": round(results["zeps_1to1_single_per_s"] / results["raw_zmq_per_s"], 3),
        "zeps_1to1_single_unlingered_vs_raw_zmq": round(results["zeps_1to1_single_unlingered_per_s"]
                                                        / results["raw_zmq_per_s"], 3),
        "p50_ms": round(results["zeps_p50_ms"], 3),
        "p99_ms": round(results["zeps_p99_ms"], 3),
        "jetstream_p99_ms": round(results["jetstream_p99_ms"], 3),
        # the floor: raw pyzmq through one relay process at the same rates; zeps after load against it
        **{f"zmq_relay_{rate}_{q}_ms": relay[rate][q] for rate in relay for q in ("p50", "p99", "p99.9")},
        "p50_vs_zmq_relay_1k": round(tails["zeps"]["after_1k"]["p50"] / relay["1k"]["p50"], 2),
        "p99_vs_zmq_relay_1k": round(tails["zeps"]["after_1k"]["p99"] / relay["1k"]["p99"], 2),
        # one publish per message: p50/p99/p99.9/max (ms) at 1k and 20k msgs/s, fresh and after load
        **{f"zeps_{when}_{q}_ms": tails["zeps"][when][q] for when in tails["zeps"] for q in ("p50", "p99", "p99.9")},
        **{f"zeps_{when}_max_ms": tails["zeps"][when]["max"] for when in tails["zeps"]},
        **{f"jetstream_{when}_{q}_ms": tails["jetstream"][when][q] for when in tails["jetstream"]
           for q in ("p50", "p99", "p99.9", "max")},
        # CPU µs per message of one publish per message (plain): the broker's and the publisher's
        "zeps_1to1_single_broker_cpu_us": round(results["zeps_1to1_single_broker_cpu_us"], 2),
        "zeps_1to1_single_publisher_cpu_us": round(results["zeps_1to1_single_publisher_cpu_us"], 2),
        "zeps_1to1_single_unlingered_broker_cpu_us": round(results["zeps_1to1_single_unlingered_broker_cpu_us"], 2),
        "zeps_1to1_single_unlingered_publisher_cpu_us": round(
            results["zeps_1to1_single_unlingered_publisher_cpu_us"], 2),
        "zeps_idempotent_deliveries_per_s": round(results["zeps_idempotent_deliveries_per_s"], 1),
        "zeps_idempotent_1to1_per_s": round(results["zeps_idempotent_1to1_per_s"], 1),
        "zeps_idempotent_1to1_single_per_s": round(results["zeps_idempotent_1to1_single_per_s"], 1),
        **{f"idempotent_vs_plain_{k}": round(results[f"zeps_idempotent_{k}_per_s"] / results[f"zeps_{k}_per_s"], 3)
           for k in ("deliveries", "1to1", "1to1_single", "1to1_single_unlingered")},
        # CPU µs per published message, idempotent / plain (above 1: idempotence costs that much more)
        **{f"idempotent_vs_plain_{who}_cpu_{k}": round(results[f"zeps_idempotent_{k}_{who}_cpu_us"]
                                                       / results[f"zeps_{k}_{who}_cpu_us"], 3)
           for who in ("broker", "publisher") for k in ("deliveries", "1to1", "1to1_single")},
    }))  # fmt: skip


if __name__ == "__main__":
    main()

"""``make bench-replication``: replicated ZepsStreams, side by side with NATS JetStream R3, one run.

* **Failover**: three replicas (zeps: three ``zeps-broker --min-insync 2`` processes and a real
  ZooKeeper; JetStream: a three-server ``nats-server -js`` cluster with an R3 file stream, nats-server
  built from its pinned Go module, tools/testbin/nats-server). A
  publisher confirms every message before the next (zeps: ``publish`` + ``flush``; JetStream:
  ``js.publish``, which waits for the ack) and a subscriber reads; the leader is killed (SIGKILL)
  ``KILLS`` times and started again. Per kill: seconds from the kill to the first publish the new
  leader confirms, and to the subscriber's first delivery after it. At the end every confirmed
  message is looked for in the stream: the number missing is printed as measured. A flush refused
  while fewer than minInSync replicas are in sync (the surviving follower out of the set for a moment
  after a kill) is retried, as the README tells clients to: the count is printed (``publish_refusals``).
* **Throughput**: ``publish_many`` + ``flush`` through replicas 3 / minInSync 2 against one broker
  without replication, same machine, alternating rounds (ratio of medians).
* **Latency**: publish -> deliver, one message at a time at ``LATENCY_RATE`` a second (bodies carry
  their send time; publisher and subscriber in this process), p50 and p99 of ``LATENCY_COUNT``
  messages through replicas 3 / minInSync 2 (a message is delivered once both in-sync followers
  hold it), a lone broker, and JetStream R3 (core publish to the stream's subject, a push consumer):
  the price of replication on the live path, against the baseline and against JetStream's.
* **Catch-up**: a follower rebuilt from an empty volume copies the journal (MB/s from its first byte
  on disk to the leader's size; and seconds from its start), while the publisher goes on (its rate
  during the copy against before).

Same ZooKeeper for both zeps set-ups (tickTime 500); the brokers' session timeout is their default
(``--zookeeper-session-timeout`` 4 s): a killed leader is replaced once its session expires, which
bounds zeps's failover from below. JetStream's election is its own Raft (defaults). The last line
is one JSON object.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workers import nats_server
from zeps.client import StreamClient
from zeps.client.discovery import LeaderLocator
from zeps.coordination import connect
from zeps.coordination.replication import read_replication_state
from zeps.errors import PublishRefusedError, SetupError
from zeps.paths import StreamPaths
from zeps_dev import ZooKeeperServer
from zeps_dev.process import free_port, wait_until

KILLS = int(os.environ.get("ZEPS_BENCH_KILLS", "20"))
THROUGHPUT_COUNT = int(os.environ.get("ZEPS_BENCH_COUNT", "1000000"))
ROUNDS = int(os.environ.get("ZEPS_BENCH_ROUNDS", "5"))  # throughput: alternating rounds; ratio of medians
CATCHUP_MB = int(os.environ.get("ZEPS_BENCH_CATCHUP_MB", "200"))
LATENCY_COUNT = int(os.environ.get("ZEPS_BENCH_LATENCY_COUNT", "3000"))
LATENCY_RATE = float(os.environ.get("ZEPS_BENCH_LATENCY_RATE", "500"))
BODY = b"x" * 100
STALL_S = 60.0  # a subscriber that has not resumed this long after a kill is counted as stalled
CHROOT = "/bench"


def _stop_all(procs: Iterable[subprocess.Popen[bytes]]) -> None:
    """SIGTERM to every process still running, then up to 20 s each before SIGKILL."""
    procs = list(procs)
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    for proc in procs:
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()


# -- zeps ---------------------------------------------------------------------------------------
class ZepsReplicas:
    def __init__(self, zk: ZooKeeperServer, tmp: Path, *, replicas: int = 3, min_insync: int = 2,
                 extra: tuple[str, ...] = ()) -> None:  # fmt: skip
        self.zk_server, self.tmp, self.min_insync, self.extra = zk, tmp, min_insync, extra
        self.names = [f"r{i}" for i in range(replicas)]
        self.ports = {n: free_port() for n in self.names}
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.stream = f"s{free_port()}"  # a fresh stream (ZooKeeper paths) per set-up
        self.zk = connect(zk.connect_string)
        self.paths = StreamPaths.of("bench", self.stream, chroot=CHROOT)
        for name in self.names:
            self.start(name)
        wait_until(lambda: self.isr() == len(self.names), timeout=60, what="all replicas in sync")

    def start(self, name: str) -> None:
        argv = [sys.executable, "-m", "zeps.broker.main", "--stream", self.stream, "--data-dir", str(self.tmp / name),
                "--bind", f"tcp://127.0.0.1:{self.ports[name]}", "--zookeeper", self.zk_server.connect_string,
                "--chroot", CHROOT, "--namespace", "bench", "--member", name, "--min-insync", str(self.min_insync),
                "--replica-lag", "4", "--log-level", "WARNING", *self.extra]  # fmt: skip
        self.procs[name] = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def state(self) -> Any:
        return read_replication_state(self.zk, self.paths)

    def isr(self) -> int:
        state = self.state()
        return len(state.isr) if state is not None else 0

    def locator(self) -> LeaderLocator:
        return LeaderLocator(self.zk_server.connect_string, "bench", self.stream, chroot=CHROOT)

    def client(self, **options: Any) -> StreamClient:
        locator = self.locator()
        wait_until(lambda: bool(locator()), timeout=30, what="a leader")
        return StreamClient(locator(), self.stream, locator=locator, timeout=60, **options)

    def kill(self, name: str) -> None:
        self.procs[name].send_signal(signal.SIGKILL)
        self.procs[name].wait(10)

    def stop(self) -> None:
        _stop_all(self.procs.values())
        self.zk.stop()
        self.zk.close()


@dataclass
class History:
    """What a failover run saw: each confirmed message and when, each delivery and when."""

    confirmed: list[int] = field(default_factory=list)
    times: list[float] = field(default_factory=list)
    sent: list[float] = field(default_factory=list)  # when each confirmed message was published
    received: list[tuple[int, float]] = field(default_factory=list)
    errors: list[BaseException] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    stalls: int = 0  # kills after which the subscriber did not resume within STALL_S
    refusals: int = 0  # flushes refused (NOT_ENOUGH_REPLICAS: a follower out of the in-sync set for a moment)

    def confirm(self, n: int, sent: float) -> None:
        self.confirmed.append(n)
        self.times.append(time.monotonic())
        self.sent.append(sent)

    def first_after(self, mark: int, killed: float) -> float | None:
        """When the first message published after ``killed`` was confirmed (None: not yet)."""
        return next((t for t, s in zip(self.times[mark:], self.sent[mark:], strict=False) if s > killed), None)


def measure_kills(
    history: History,
    leader: Callable[[], str],
    kill: Callable[[str], None],
    restart: Callable[[str], None],
    settled: Callable[[], bool],
) -> tuple[list[float], list[float]]:
    """Kill the leader KILLS times: seconds from each kill to the first confirmation after it, and to
    the first delivery of a message published after it."""
    to_confirm, to_deliver = [], []
    wait_until(lambda: len(history.confirmed) > 50, timeout=60, what="confirmations")
    for _ in range(KILLS):
        wait_until(settled, timeout=120, what="every replica back in sync")
        time.sleep(0.3)
        victim = leader()
        mark = len(history.confirmed)
        killed = time.monotonic()
        kill(victim)
        wait_until(lambda k=killed, m=mark: history.first_after(m, k) is not None or bool(history.errors),
                   timeout=120, what="a confirmation of a publish made after the kill")  # fmt: skip
        if history.errors:
            raise RuntimeError(f"the clients failed: {history.errors[0]!r}")
        to_confirm.append(history.first_after(mark, killed) - killed)  # type: ignore[operator]
        last_before = history.confirmed[mark - 1]
        try:
            wait_until(lambda lb=last_before: any(n > lb + 1 for n, _ in history.received[-500:]),
                       timeout=STALL_S, what="a delivery after the kill")  # fmt: skip
            to_deliver.append(next(t for n, t in history.received if n > last_before + 1) - killed)
        except SetupError:  # the subscriber did not resume: counted, and the figure capped
            history.stalls += 1
            to_deliver.append(STALL_S)
        restart(victim)
    return to_confirm, to_deliver


def zeps_failover(zk: ZooKeeperServer, tmp: Path) -> dict[str, Any]:
    replicas = ZepsReplicas(zk, tmp)
    history = History()

    def publish() -> None:
        try:
            with replicas.client(producer_id="failover") as c:
                n = 0
                while not history.stop.is_set():
                    n += 1
                    sent = time.monotonic()
                    c.publish("k", b"%d" % n)
                    for _ in range(200):
                        try:
                            c.flush(timeout=60)
                            break
                        except PublishRefusedError:  # too few in sync for a moment: it attaches again, resends
                            history.refusals += 1
                            time.sleep(0.1)
                    else:
                        raise RuntimeError("publishes refused 200 times in a row")
                    history.confirm(n, sent)
        except BaseException as exc:  # reported by measure_kills
            history.errors.append(exc)

    def subscribe() -> None:
        try:
            with replicas.client() as c:
                c.start("", since="earliest")
                while not history.stop.is_set():
                    now = time.monotonic()
                    history.received.extend((int(m.body), now) for m in c.receive_many(0.05))
        except BaseException as exc:
            history.errors.append(exc)

    threads = [threading.Thread(target=publish, daemon=True), threading.Thread(target=subscribe, daemon=True)]
    for t in threads:
        t.start()
    try:
        to_confirm, to_deliver = measure_kills(history, lambda: str(replicas.state().leader), replicas.kill,
                                               replicas.start, lambda: replicas.isr() == 3)  # fmt: skip
        history.stop.set()
        for t in threads:
            t.join(30)
        with replicas.client() as c:
            held = {int(m.body) for m in c.fetch("", first=1).messages}
    finally:
        history.stop.set()
        replicas.stop()
    return {"to_confirm": to_confirm, "to_deliver": to_deliver, "confirmed": len(history.confirmed),
            "missing": len(set(history.confirmed) - held), "stalls": history.stalls,
            "refusals": history.refusals}  # fmt: skip


def zeps_throughput(zk: ZooKeeperServer, tmp: Path) -> dict[str, float]:
    """Rates (msgs/s) of publish_many + flush, replicas 3 / minInSync 2 and a lone broker, alternating."""
    rates: dict[str, list[float]] = {"replicated": [], "single": []}
    for round_ in range(ROUNDS):
        for kind in ("replicated", "single"):
            where = tmp / f"tp-{kind}-{round_}"
            if kind == "replicated":
                system = ZepsReplicas(zk, where)
                client = system.client(producer_id=f"tp{round_}")
            else:
                system = None
                port = free_port()
                lone = subprocess.Popen([sys.executable, "-m", "zeps.broker.main", "--stream", "tp", "--data-dir",
                                         str(where), "--bind", f"tcp://127.0.0.1:{port}"],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
                client = StreamClient(f"tcp://127.0.0.1:{port}", "tp", producer_id=f"tp{round_}", timeout=60)
            try:
                with client:
                    burst = [("k", BODY)] * 1000
                    start = time.perf_counter()
                    for _ in range(THROUGHPUT_COUNT // len(burst)):
                        client.publish_many(burst)
                    client.flush(timeout=120)
                    rates[kind].append(THROUGHPUT_COUNT / (time.perf_counter() - start))
            finally:
                if system is not None:
                    system.stop()
                else:
                    lone.terminate()
                    lone.wait(30)
    return {k: statistics.median(v) for k, v in rates.items()}


def _paced(count: int, send: Callable[[int, float], None]) -> None:
    """``send(i, now)`` for i in 0..count-1 at LATENCY_RATE a second (a slow send is caught up, not skipped)."""
    start = time.perf_counter()
    for i in range(count):
        wait = start + i / LATENCY_RATE - time.perf_counter()
        if wait > 0:
            time.sleep(wait)
        send(i, time.perf_counter())


def zeps_latency(zk: ZooKeeperServer, tmp: Path, *, replicated: bool) -> list[float]:
    """Publish -> deliver milliseconds of LATENCY_COUNT paced messages (see the module's notes)."""
    lone: subprocess.Popen[bytes] | None = None
    system: ZepsReplicas | None = None
    if replicated:
        system = ZepsReplicas(zk, tmp / "lat-r3")
        publisher, subscriber = system.client(), system.client()
    else:
        port = free_port()
        lone = subprocess.Popen([sys.executable, "-m", "zeps.broker.main", "--stream", "lat", "--data-dir",
                                 str(tmp / "lat-r1"), "--bind", f"tcp://127.0.0.1:{port}", "--log-level", "WARNING"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        publisher = StreamClient(f"tcp://127.0.0.1:{port}", "lat", timeout=60)
        subscriber = StreamClient(f"tcp://127.0.0.1:{port}", "lat", timeout=60)
    latencies: list[float] = []
    try:
        with publisher, subscriber:
            subscriber.start("", since="latest")
            done = threading.Event()

            def read() -> None:
                while len(latencies) < LATENCY_COUNT and not done.is_set():
                    for m in subscriber.receive_many(0.2):
                        latencies.append((time.perf_counter() - float(m.body)) * 1000)

            reader = threading.Thread(target=read, daemon=True)
            reader.start()
            time.sleep(0.5)  # the subscription is live before the first publish
            _paced(LATENCY_COUNT, lambda _i, now: publisher.publish("k", b"%.9f" % now))
            publisher.flush(timeout=60)
            reader.join(60)
            done.set()
    finally:
        if system is not None:
            system.stop()
        if lone is not None:
            lone.terminate()
            lone.wait(30)
    return latencies


async def _jetstream_latency(cluster: JetStreamCluster) -> list[float]:
    import nats  # noqa: PLC0415

    nc = await nats.connect(servers=cluster.urls, connect_timeout=5)
    latencies: list[float] = []
    got = asyncio.Event()
    try:
        js = nc.jetstream(timeout=10)

        async def on_message(m: Any) -> None:
            latencies.append((time.perf_counter() - float(m.data)) * 1000)
            if len(latencies) >= LATENCY_COUNT:
                got.set()

        await js.subscribe("failover.lat", cb=on_message, ordered_consumer=True, deliver_policy="new")
        await asyncio.sleep(0.5)
        start = time.perf_counter()
        for i in range(LATENCY_COUNT):
            wait = start + i / LATENCY_RATE - time.perf_counter()
            if wait > 0:
                await asyncio.sleep(wait)
            await nc.publish("failover.lat", b"%.9f" % time.perf_counter())
        await asyncio.wait_for(got.wait(), 60)
    finally:
        await nc.close()
    return latencies


def jetstream_latency(tmp: Path) -> list[float]:
    cluster = JetStreamCluster(tmp)
    try:
        return asyncio.run(_jetstream_latency(cluster))
    finally:
        cluster.stop()


def _log_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*.log")) if folder.exists() else 0


def zeps_catchup(zk: ZooKeeperServer, tmp: Path) -> dict[str, float]:
    """A follower's volume emptied: how fast it copies the journal the leader held when it came back
    (its segment files' bytes on disk, looked at every 20 ms, from its first byte to the leader's
    size), and the publisher's rate during the copy against its rate before. The in-sync set is
    not the clock: the leader rewrites it once a second."""
    replicas = ZepsReplicas(zk, tmp)
    try:
        with replicas.client(producer_id="catchup") as c:
            burst = [("k", b"y" * 1000)] * 1000
            for _ in range(CATCHUP_MB):
                c.publish_many(burst)
            c.flush(timeout=300)
            leader = replicas.state().leader
            follower = next(n for n in replicas.names if n != leader)
            replicas.kill(follower)
            shutil.rmtree(tmp / follower)
            wait_until(lambda: follower not in replicas.state().isr, timeout=30, what="the follower out of sync")

            def publish_while(going: Callable[[], bool], most: float) -> float:
                """msgs/s of bursts of 1,000 confirmed one after another (at least one burst)."""
                count, start = 0, time.perf_counter()
                while not count or (going() and time.perf_counter() - start < most):
                    c.publish_many([("k", BODY)] * 1000)
                    c.flush(timeout=60)
                    count += 1000
                return count / (time.perf_counter() - start)

            before = publish_while(lambda: True, 3)
            target = _log_bytes(tmp / leader)
            first: list[float] = []  # when the follower's first bytes were on disk, then when all were
            copied: list[float] = []

            def watch() -> None:
                deadline = time.perf_counter() + 600
                while not copied and time.perf_counter() < deadline:
                    size = _log_bytes(tmp / follower)
                    if size and not first:
                        first.append(time.perf_counter())
                    if size >= target:
                        copied.append(time.perf_counter())
                    time.sleep(0.02)

            watcher = threading.Thread(target=watch, daemon=True)
            start = time.perf_counter()
            replicas.start(follower)
            watcher.start()
            wait_until(lambda: bool(first), timeout=60, what="the follower's first copied bytes")
            during = publish_while(lambda: not copied, 600)
            watcher.join(600)
            if not copied:
                raise SetupError(f"the rebuilt follower did not copy {target} bytes within 600 s")
            wait_until(lambda: follower in replicas.state().isr, timeout=600, what="the rebuilt follower in sync")
        return {"mb_per_s": target / (copied[0] - first[0]) / 1e6, "journal_mb": target / 1e6,
                "seconds_from_start": copied[0] - start, "publish_during_vs_before": during / before}  # fmt: skip
    finally:
        replicas.stop()


# -- JetStream R3 -------------------------------------------------------------------------------
class JetStreamCluster:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.ports = [free_port() for _ in range(3)]
        self.cluster_ports = [free_port() for _ in range(3)]
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        for i in range(3):
            self.start(i)
        self.urls = [f"nats://127.0.0.1:{p}" for p in self.ports]
        asyncio.run(self._create())

    def start(self, i: int) -> None:
        routes = ",".join(f"nats-route://127.0.0.1:{p}" for j, p in enumerate(self.cluster_ports) if j != i)
        argv = [nats_server(), "-a", "127.0.0.1", "-p", str(self.ports[i]), "-js", "-sd", str(self.tmp / f"n{i}"),
                "-n", f"n{i}", "--cluster_name", "bench", "--cluster", f"nats://127.0.0.1:{self.cluster_ports[i]}",
                "--routes", routes]  # fmt: skip
        self.procs[i] = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    async def _create(self) -> None:
        import nats  # noqa: PLC0415

        deadline = time.monotonic() + 60
        while True:
            try:
                nc = await nats.connect(servers=self.urls, connect_timeout=2)
                js = nc.jetstream()
                await js.add_stream(name="failover", subjects=["failover.>"], storage="file", num_replicas=3)
                await nc.close()
                return
            except Exception:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.5)

    async def leader(self) -> str:
        import nats  # noqa: PLC0415

        nc = await nats.connect(servers=self.urls, connect_timeout=2)
        try:
            info = await nc.jetstream().stream_info("failover")
            return str(info.cluster.leader).removeprefix("n")
        finally:
            await nc.close()

    async def current(self) -> int:
        """Replicas of the stream that are current (the leader and its caught-up followers)."""
        import nats  # noqa: PLC0415

        try:
            nc = await nats.connect(servers=self.urls, connect_timeout=2)
        except Exception:
            return 0
        try:
            info = await nc.jetstream().stream_info("failover")
            return 1 + sum(1 for r in info.cluster.replicas or [] if r.current)
        except Exception:
            return 0
        finally:
            await nc.close()

    async def held(self, deadline_s: float = 60.0) -> set[int]:
        """Every message the stream holds, read by a new consumer until it has read as many as the
        stream says it holds (call it once every replica is current again). A fetch can time out
        while a restarted server catches up: that is retried until the deadline, and a read that ends
        short raises, so that a failed read is never printed as lost messages."""
        import nats  # noqa: PLC0415
        from nats.js.api import AckPolicy, ConsumerConfig  # noqa: PLC0415

        nc = await nats.connect(servers=self.urls, connect_timeout=2)
        held: set[int] = set()
        read, deadline = 0, time.monotonic() + deadline_s
        try:
            js = nc.jetstream()
            expected = (await js.stream_info("failover")).state.messages  # the caller waited for a settled cluster
            sub = await js.pull_subscribe("failover.>", durable="audit",
                                          config=ConsumerConfig(ack_policy=AckPolicy.NONE))  # fmt: skip
            while read < expected and time.monotonic() < deadline:
                try:
                    batch = await sub.fetch(1000, timeout=2)
                except TimeoutError:  # nats' fetch timeouts are TimeoutErrors (asyncio's is the builtin)
                    continue
                read += len(batch)  # a resent publish is held twice: counted as read, once in the set
                held.update(int(m.data) for m in batch)
        finally:
            await nc.close()
        if read < expected:
            raise SetupError(f"read {read} of the {expected} messages the JetStream stream holds in {deadline_s:.0f} s")
        return held

    def kill(self, i: int) -> None:
        self.procs[i].send_signal(signal.SIGKILL)
        self.procs[i].wait(10)

    def stop(self) -> None:
        _stop_all(self.procs.values())


def jetstream_failover(tmp: Path) -> dict[str, Any]:
    cluster = JetStreamCluster(tmp)
    history = History()
    clients = threading.Thread(target=lambda: asyncio.run(_jetstream_clients(cluster, history)), daemon=True)
    clients.start()
    try:
        to_confirm, to_deliver = measure_kills(
            history, lambda: asyncio.run(cluster.leader()), lambda i: cluster.kill(int(i)),
            lambda i: cluster.start(int(i)), lambda: asyncio.run(cluster.current()) == 3,
        )  # fmt: skip
        history.stop.set()
        clients.join(30)
        wait_until(lambda: asyncio.run(cluster.current()) == 3, timeout=120, what="every replica back in sync")
        held = asyncio.run(cluster.held())
    finally:
        history.stop.set()
        cluster.stop()
    return {"to_confirm": to_confirm, "to_deliver": to_deliver, "confirmed": len(history.confirmed),
            "missing": len(set(history.confirmed) - held), "stalls": history.stalls,
            "refusals": history.refusals}  # fmt: skip


async def _jetstream_clients(cluster: JetStreamCluster, history: History) -> None:
    """A publisher waiting for each ack, and a pull subscriber, until ``history.stop``."""
    import nats  # noqa: PLC0415

    nc = await nats.connect(servers=cluster.urls, max_reconnect_attempts=-1, reconnect_time_wait=0.1)
    js = nc.jetstream(timeout=5)

    async def publish() -> None:
        n = 0
        while not history.stop.is_set():
            n += 1
            while not history.stop.is_set():
                sent = time.monotonic()
                try:
                    await js.publish("failover.k", b"%d" % n)
                    break
                except Exception:  # no leader yet, a timeout: the same message again
                    await asyncio.sleep(0.05)
            history.confirm(n, sent)

    async def subscribe() -> None:
        while True:  # the cluster may still be electing its meta leader: creating the consumer times out
            try:
                sub = await js.pull_subscribe("failover.>", durable="bench")
                break
            except Exception:
                if history.stop.is_set():
                    return
                await asyncio.sleep(0.2)
        while not history.stop.is_set():
            try:
                for m in await sub.fetch(100, timeout=0.2):
                    history.received.append((int(m.data), time.monotonic()))
                    await m.ack()
            except Exception:
                await asyncio.sleep(0.05)

    try:
        await asyncio.gather(publish(), subscribe())
    except BaseException as exc:
        history.errors.append(exc)
    finally:
        await nc.close()


def _quantiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return {"p50": round(statistics.median(ordered), 2), "p99": round(p99, 2), "max": round(ordered[-1], 2)}


def main() -> None:
    nats_server()  # built, or a clear message now rather than after the zeps half
    out: dict[str, Any] = {"scenario": "replication", "kills": KILLS, "cores": os.cpu_count()}
    with tempfile.TemporaryDirectory(prefix="zeps-bench-replication-") as name:
        tmp = Path(name)
        zk = ZooKeeperServer(tmp / "zk")
        zk.start()
        try:
            zeps = zeps_failover(zk, tmp / "failover")
            print(json.dumps({"system": "zeps", **{k: _quantiles(v) if isinstance(v, list) else v
                                                   for k, v in zeps.items()}}), flush=True)  # fmt: skip
            js = jetstream_failover(tmp / "jetstream")
            print(json.dumps({"system": "jetstream", **{k: _quantiles(v) if isinstance(v, list) else v
                                                        for k, v in js.items()}}), flush=True)  # fmt: skip
            latency = {"r3": zeps_latency(zk, tmp / "latency", replicated=True),
                       "r1": zeps_latency(zk, tmp / "latency", replicated=False),
                       "jetstream_r3": jetstream_latency(tmp / "jetstream-latency")}  # fmt: skip
            throughput = zeps_throughput(zk, tmp / "throughput")
            catchup = zeps_catchup(zk, tmp / "catchup")
        finally:
            zk.stop()
    for system, result in (("zeps", zeps), ("jetstream", js)):
        q_confirm, q_deliver = _quantiles(result["to_confirm"]), _quantiles(result["to_deliver"])
        out[f"{system}_failover_confirm_p50_s"] = q_confirm["p50"]
        out[f"{system}_failover_confirm_p99_s"] = q_confirm["p99"]
        out[f"{system}_failover_deliver_p50_s"] = q_deliver["p50"]
        out[f"{system}_failover_deliver_p99_s"] = q_deliver["p99"]
        out[f"{system}_confirmed"] = result["confirmed"]
        out[f"{system}_confirmed_lost"] = result["missing"]
        out[f"{system}_subscriber_stalls"] = result["stalls"]
        out[f"{system}_publish_refusals"] = result["refusals"]
    for kind, values in latency.items():
        q = _quantiles(values)
        out[f"latency_{kind}_p50_ms"], out[f"latency_{kind}_p99_ms"] = q["p50"], q["p99"]
        out[f"latency_{kind}_delivered"] = len(values)
    out["latency_r3_vs_r1_p50"] = round(out["latency_r3_p50_ms"] / out["latency_r1_p50_ms"], 2)
    out["latency_r3_vs_jetstream_r3_p50"] = round(out["latency_r3_p50_ms"] / out["latency_jetstream_r3_p50_ms"], 2)
    out["replicated_per_s"] = round(throughput["replicated"], 1)
    out["single_per_s"] = round(throughput["single"], 1)
    out["replicated_vs_single"] = round(throughput["replicated"] / throughput["single"], 3)
    out["catchup_mb_per_s"] = round(catchup["mb_per_s"], 1)
    out["catchup_journal_mb"] = round(catchup["journal_mb"], 1)
    out["catchup_seconds_from_start"] = round(catchup["seconds_from_start"], 2)
    out["publish_during_catchup_vs_before"] = round(catchup["publish_during_vs_before"], 3)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()

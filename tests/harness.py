"""Test harness objects shared by the fixtures in conftest.py (importable as ``harness``)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kazoo.client import KazooClient

from zeps.client import StreamClient
from zeps.client.discovery import LeaderLocator, discover
from zeps.coordination import connect
from zeps.coordination.replication import read_replication_state
from zeps.coordination.testing import count_znodes, expire_session
from zeps.errors import SetupError
from zeps.journal import Journal, JournalConfig, Record
from zeps.paths import StreamPaths
from zeps_dev import ZooKeeperServer
from zeps_dev.process import ManagedProcess, die_with_parent, free_port, wait_until
from zeps_dev.volume import PrivateVolume
from zeps_dev.wallclock import WallClock

#: the JVM flags of what a test starts in Java (its ZooKeeper servers, its Spark drivers and executors,
#: here and in kind's pods): they live seconds to minutes, so the JIT stops at C1, whose compilations
#: cost less CPU than C2's give back in that time (measured in benchmarks/README.md, "CI"), and one
#: thread collects garbage. Only the JIT changes, no behaviour. The JVMs of the benchmarks, of
#: `make demo`, of the examples as users run them and of the chart keep Java's defaults.
TEST_JVM_FLAGS = ("-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC")
#: the same as one option string: Spark's extraJavaOptions, the JVM's JAVA_TOOL_OPTIONS
TEST_JVM_OPTIONS = " ".join(TEST_JVM_FLAGS)


def until(check: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    """The tests' one way to wait: poll ``check`` every 50 ms until it is true; after ``timeout``
    seconds fail naming ``what`` (zeps_dev.process.wait_until underneath)."""
    wait_until(check, timeout=timeout, interval=0.05, what=what)


def next_millisecond() -> None:
    """Return once the wall clock is past the millisecond it is in (brokers stamp records in
    milliseconds: a time taken after this falls after every record stamped before it). A spin of
    at most one millisecond, whatever the machine's load: no guess of how long."""
    now = time.time_ns() // 1_000_000
    while time.time_ns() // 1_000_000 <= now:
        pass


class ZooKeeperHarness:
    """The ``zookeeper`` fixture: a real server plus helpers.

    ``root`` is a fresh znode path for the current test, so tests sharing the server never see
    each other's nodes. Clients made by :meth:`client` are stopped at teardown.
    """

    def __init__(self, server: ZooKeeperServer, root: str) -> None:
        self.server = server
        self.root = root
        self._clients: list[KazooClient] = []

    @property
    def connect_string(self) -> str:
        return self.server.connect_string

    def client(self, **kwargs: Any) -> KazooClient:
        client = connect(self.connect_string, **kwargs)
        self._clients.append(client)
        return client

    def expire_session(self, client: KazooClient, *, wait_reconnect: bool = True) -> None:
        expire_session(client, wait_reconnect=wait_reconnect)

    def count_znodes(self, path: str) -> int:
        helper = self.client()
        try:
            return count_znodes(helper, path)
        finally:
            self._clients.remove(helper)
            helper.stop()
            helper.close()

    def stop(self) -> None:
        self.server.stop()

    def kill(self) -> None:
        self.server.kill()

    def start(self) -> None:
        self.server.start()

    def restart(self) -> None:
        self.server.restart()

    def close(self) -> None:
        for client in self._clients:
            client.stop()
            client.close()
        self._clients.clear()


WORKERS = Path(__file__).parent / "workers"
#: the operator's ZooKeeper identity in tests; the session server trusts it as super user
OPERATOR_AUTH = ("zeps-operator", "operator-secret")
#: each test namespace's ZooKeeper quota (nodes, bytes) under the shared operator: every cluster test
#: runs under one, as under the chart; far above what any of them stores
CLUSTER_TESTS_QUOTA = (50_000, 256 << 20)


class WorkerProcess:
    """A worker script from tests/workers in its own Python process, reporting through a line file."""

    def __init__(self, workdir: Path, script: str, name: str, args: list[str]) -> None:
        self.out = workdir / f"{name}.out"
        self.process = ManagedProcess(
            name,
            [sys.executable, str(WORKERS / script), "--out", str(self.out), *args],
            log_path=workdir / f"{name}.log",
        )

    def start(self, *, ready_timeout: float = 30.0) -> WorkerProcess:
        self.process.start()
        self.process.wait_ready(lambda: "ready" in self.lines(), timeout=ready_timeout)
        return self

    def lines(self) -> list[str]:
        try:
            return self.out.read_text().splitlines()
        except FileNotFoundError:
            return []

    def done_ids(self) -> list[str]:
        """Ids whose callback finished, in the order they finished."""
        return [line.split()[1] for line in self.lines() if line.startswith("done ")]

    def started_ids(self) -> list[str]:
        return [line.split()[1] for line in self.lines() if line.startswith("start ")]

    def kill(self) -> None:
        self.process.kill()

    def stop(self) -> None:
        self.process.stop(grace=10)


class CuttingProxy:
    """A TCP proxy to ZooKeeper that can cut the connection around the next large request.

    ``arm("response")``: the next client request of at least ``min_bytes`` reaches the server, then
    the connection is cut before the server's answer reaches the client (the write applied, the
    client sees ConnectionLoss). ``arm("request")``: that request is dropped and the connection cut
    (nothing applied). Small packets (pings) pass untouched either way. One cut per arm;
    ``skip=n`` lets the next ``n`` large requests through first (so a test can cut at each step).
    ``refusing = True``: new connections are closed at once (the client cannot reconnect until it is
    False again), so a test can act while the client is away, e.g. expire its session.
    ``silent = True``: new connections are taken and never answered (held open until :meth:`close`;
    ``held`` counts them), as a server that hangs, or ZooKeeper 3.9 while it starts, does to a client.
    """

    def __init__(self, target: tuple[str, int], *, min_bytes: int = 200) -> None:
        self.target = target
        self.min_bytes = min_bytes
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._mode: str | None = None
        self._skip = 0
        self._cut_next_response = False
        self.cuts = 0
        self._lock = threading.Lock()
        self._closed = False
        self._conns: list[socket.socket] = []
        self.refusing = False
        self.silent = False
        self.held = 0
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def arm(self, mode: str, *, skip: int = 0) -> None:
        assert mode in ("request", "response")
        with self._lock:
            self._mode = mode
            self._skip = skip

    def close(self) -> None:
        self._closed = True
        self._listener.close()
        self.drop()

    def drop(self) -> None:
        """Close every connection through the proxy now (with ``refusing``: ZooKeeper is unreachable)."""
        for conn in self._conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                conn.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self.refusing:
                client.close()
                continue
            if self.silent:
                self._conns.append(client)
                self.held += 1
                continue
            try:
                server = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            self._conns += [client, server]
            threading.Thread(target=self._pump, args=(client, server, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, False), daemon=True).start()

    def _cut(self, a: socket.socket, b: socket.socket) -> None:
        self.cuts += 1
        for s in (a, b):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    def _pump(self, src: socket.socket, dst: socket.socket, upstream: bool) -> None:
        while True:
            try:
                data = src.recv(65536)
            except OSError:
                return
            if not data:
                with contextlib.suppress(OSError):
                    dst.close()
                return
            with self._lock:
                if upstream and self._mode and len(data) >= self.min_bytes:
                    if self._skip:  # a large request let through before the cut
                        self._skip -= 1
                    else:
                        mode, self._mode = self._mode, None
                        if mode == "request":
                            self._cut(src, dst)
                            return
                        self._cut_next_response = True
                elif not upstream and self._cut_next_response:
                    self._cut_next_response = False
                    self._cut(src, dst)
                    return
            try:
                dst.sendall(data)
            except OSError:
                return


#: a replica set's ZooKeeper session: a dead leader is replaced after about this long
REPLICA_SESSION_S = 2.0


class Publisher:
    """An idempotent publisher of ``<tag>:1``, ``<tag>:2``, … (``group`` a flush) in a process of its
    own (``tests/workers/replica_client.py``), following the leader of a replicated stream; what it
    had confirmed is read from its lines."""

    def __init__(self, zookeeper: ZooKeeperHarness, root: Path, *, tag: str = "p", group: int = 20) -> None:
        self.tag, self.log, self.stop_file = tag, root / f"publisher-{tag}.jsonl", root / f"stop-{tag}"
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen([sys.executable, str(WORKERS / "replica_client.py"), "publish", "--zookeeper",
                                          zookeeper.connect_string, "--chroot", zookeeper.root, "--tag", tag,
                                          "--group", str(group), "--stop-file", str(self.stop_file),
                                          "--seconds", "300"], stdout=out, stderr=subprocess.STDOUT)  # fmt: skip

    def confirmed(self) -> int:
        """The last count it had confirmed (0 before its first flush returned)."""
        lines = [json.loads(line) for line in self.log.read_text().splitlines() if line.startswith("{")]
        return max((e["confirmed"] for e in lines if "confirmed" in e), default=0)

    def goes_on(self, more: int, what: str, timeout: float = 60) -> None:
        """Wait until it has confirmed ``more`` publishes beyond what it had now."""
        target = self.confirmed() + more
        until(lambda: self.confirmed() >= target, what, timeout=timeout)

    def stop(self) -> int:
        """Stop it (its last flush first); what it had confirmed."""
        self.stop_file.touch()
        try:
            self.proc.wait(60)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(10)
        return self.confirmed()


def assert_published_once_in_order(journals: dict[str, list[tuple[int, bytes]]], confirmed: int, tag: str = "p"
                                   ) -> None:  # fmt: skip
    """Every replica's journal holds ``<tag>:1 .. <tag>:confirmed`` (at least), each once and in order,
    and the journals are the same."""
    for name, journal in journals.items():
        mine = [int(body.split(b":")[1]) for _, body in journal if body.startswith(tag.encode() + b":")]
        assert mine == list(range(1, len(mine) + 1)), f"{name}: publishes repeated or out of order"
        assert len(mine) >= confirmed, f"{name}: confirmed publishes {len(mine) + 1}..{confirmed} are lost"
    first, *others = journals.values()
    assert all(journal == first for journal in others), "the replicas' journals differ"


class ReplicaSet:
    """Three ``zeps-broker`` processes replicating one stream (``--min-insync 2`` by default) on
    127.0.0.1, each with its journal directory and port, electing their leader in ``zookeeper``."""

    def __init__(
        self,
        zookeeper: ZooKeeperHarness,
        root: Path,
        *,
        min_insync: int = 2,
        stream: str = "prices",
        partition: int = 0,
        replicas: int = 3,
        zookeeper_for: dict[str, str] | None = None,
    ) -> None:
        self.zookeeper, self.root, self.min_insync, self.stream = zookeeper, root, min_insync, stream
        #: the ZooKeeper address each replica is given (default: the server's; a chaos proxy's instead)
        self.zookeeper_for = zookeeper_for or {}
        self.extra: list[str] = []  #: more flags for every replica (CURVE's, say)
        #: how :meth:`records` opens a stopped replica's journal (a compacted stream's: ``cleanup`` compact)
        self.journal_config = JournalConfig()
        self.extra_for: dict[str, list[str]] = {}  #: and for one replica (after the others: they win)
        #: a replica whose journal lives on a volume of its own (a tmpfs that can be filled up)
        self.volumes: dict[str, PrivateVolume] = {}
        #: a replica whose wall clock can be made to jump (zeps_dev.wallclock)
        self.clocks: dict[str, WallClock] = {}
        self.partition = partition  # of a partitioned stream: its brokers pass --partition
        self.names = [f"r{i}" if not partition else f"p{partition}-r{i}" for i in range(replicas)]
        self.ports = {name: free_port() for name in self.names}
        self.metrics = {name: free_port() for name in self.names}  # each replica's Prometheus port
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.paths = StreamPaths.of("default", stream, chroot=zookeeper.root, partition=partition)
        self.zk = zookeeper.client()
        root.mkdir(parents=True, exist_ok=True)

    def start(self, name: str) -> None:
        argv = [sys.executable, "-m", "zeps.broker.main", "--stream", self.stream, "--data-dir", str(self.root / name),
                "--bind", f"tcp://127.0.0.1:{self.ports[name]}",
                "--zookeeper", self.zookeeper_for.get(name, self.zookeeper.connect_string),
                "--chroot", self.zookeeper.root, "--namespace", "default", "--member", name,
                "--min-insync", str(self.min_insync), "--zookeeper-session-timeout", str(REPLICA_SESSION_S),
                "--replica-lag", "4", "--fsync", "group", "--segment-bytes", str(256 << 10),
                "--metrics-port", str(self.metrics[name]), "--partition", str(self.partition),
                *self.extra, *self.extra_for.get(name, [])]  # fmt: skip
        if name in self.volumes:
            argv = self.volumes[name].wrap(argv)
        log = open(self.root / f"{name}.log", "ab")  # noqa: SIM115 — the process writes it; closed with it
        # started from the main thread: a test process that dies (SIGKILL, SIGTERM) takes its brokers along
        out = subprocess.STDOUT
        env = {**os.environ, **self.clocks[name].env()} if name in self.clocks else None
        self.procs[name] = subprocess.Popen(argv, stdout=log, stderr=out, env=env, preexec_fn=die_with_parent)  # noqa: PLW1509
        log.close()

    def start_in_sync(self) -> str:
        """Start every replica and wait until all are in sync; the leader."""
        for name in self.names:
            self.start(name)
        until(lambda: self.state() is not None and len(self.state().isr) == len(self.names),
              "every replica in sync", timeout=60)  # fmt: skip
        return self.leader()

    def scrape(self, name: str) -> str:
        """Replica ``name``'s Prometheus metrics, as text."""
        import urllib.request  # noqa: PLC0415

        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics[name]}/metrics", timeout=5) as answer:
            return str(answer.read().decode())

    def committed(self, name: str) -> int:
        """The last sequence replica ``name`` knows committed (its zeps_broker_last_sequence)."""
        from prometheus_client.parser import text_string_to_metric_families  # noqa: PLC0415

        for family in text_string_to_metric_families(self.scrape(name)):
            if family.name == "zeps_broker_last_sequence":
                return max((int(s.value) for s in family.samples if s.labels.get("stream") == self.stream), default=0)
        return 0

    def all_hold(self, sequence: int) -> bool:
        """Every running replica knows ``sequence`` committed (journaled, and learnt at a fetch)."""
        return all(self.committed(name) >= sequence for name, proc in self.procs.items() if proc.poll() is None)

    def state(self) -> Any:
        return read_replication_state(self.zk, self.paths)

    def leader(self) -> str:
        until(lambda: self.state() is not None, "a leader elected", timeout=30)
        return str(self.state().leader)

    def kill(self, name: str) -> None:
        self.procs[name].send_signal(signal.SIGKILL)
        self.procs[name].wait(10)

    def pause(self, names: list[str]) -> None:
        for name in names:
            self.procs[name].send_signal(signal.SIGSTOP)

    def resume(self, names: list[str]) -> None:
        for name in names:
            self.procs[name].send_signal(signal.SIGCONT)

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)

    def journal(self, name: str) -> list[tuple[int, bytes]]:
        return [(r.sequence, r.body) for r in self.records(name)]

    def records(self, name: str) -> list[Record]:
        """Every record of replica ``name``'s journal (read from its files: stop it first)."""
        path = self.root / name / self.stream
        if name in self.volumes:  # read through the volume's namespace (while it lives)
            path = self.volumes[name].path(path)
        j = Journal(path, self.journal_config, name=self.stream).open()
        out, seq = [], j.first_sequence
        while batch := j.read(seq, max_records=1000):
            out += batch
            seq = batch[-1].sequence + 1
        j.close()
        return out

    def locator(self) -> LeaderLocator:
        return LeaderLocator(self.zookeeper.connect_string, "default", self.stream, chroot=self.zookeeper.root,
                             partition=self.partition)  # fmt: skip

    def located(self) -> tuple[str, LeaderLocator]:
        """The leader's endpoint (once one is elected), and a locator that follows it (the caller
        closes it, or gives it to a client that does)."""
        locator = self.locator()
        found: list[str] = []
        try:  # no leader yet (the locator raises): ZooKeeper is asked again
            wait_until(lambda: bool(found.append(locator()) or found), timeout=30, what="a leader elected")
        except SetupError:
            locator.close()
            raise
        return found[-1], locator

    def endpoint(self) -> str:
        """The leader's endpoint, once one is elected."""
        endpoint, locator = self.located()
        locator.close()
        return endpoint

    def client(self, **options: Any) -> StreamClient:
        endpoint, locator = self.located()
        return StreamClient(endpoint, self.stream, locator=locator, **{"timeout": 60, **options})


class PlainPartitions:
    """One broker per partition, not replicated: ``--zookeeper --member b<p> --partition <p>``."""

    def __init__(self, zookeeper: ZooKeeperHarness, root: Path, partitions: int) -> None:
        self.zookeeper, self.root, self.procs = zookeeper, root, []
        for _ in range(partitions):
            self.add()

    def add(self) -> None:
        """One more partition's broker: the stream grows (its registration makes ``partitions/<p>``)."""
        p, zookeeper = len(self.procs), self.zookeeper
        argv = [sys.executable, "-m", "zeps.broker.main", "--stream", "orders", "--data-dir", str(self.root / f"b{p}"),
                "--bind", f"tcp://127.0.0.1:{free_port()}", "--zookeeper", zookeeper.connect_string,
                "--chroot", zookeeper.root, "--namespace", "default", "--member", f"b{p}",
                "--partition", str(p), "--fsync", "never"]  # fmt: skip
        quiet = subprocess.DEVNULL
        self.procs.append(subprocess.Popen(argv, stdout=quiet, stderr=quiet, preexec_fn=die_with_parent))  # noqa: PLW1509

    def endpoints(self) -> list[str]:
        """Each partition's broker, found in its own group in ZooKeeper."""
        found: list[str] = []
        for p in range(len(self.procs)):
            until(lambda p=p: self._registered(p), f"partition {p}'s broker registered", timeout=30)
            found.append(discover(self.zookeeper.connect_string, "default", "orders", chroot=self.zookeeper.root,
                                  partition=p)[0])  # fmt: skip
        return found

    def _registered(self, partition: int) -> bool:
        try:
            discover(self.zookeeper.connect_string, "default", "orders", chroot=self.zookeeper.root,
                     partition=partition)  # fmt: skip
            return True
        except Exception:
            return False

    def stop(self) -> None:
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            proc.wait(15)


def fresh_py4j_connection(session: Any) -> None:
    """Close the calling thread's Py4J connection to ``session``'s JVM (the next call opens another,
    on which the session is made the active one again), then cancel the jobs still running. A call
    interrupted midway (a test's timeout raises inside it) leaves its answer unread on that
    connection, and the next call would read it as its own."""
    gateway = session.sparkContext._gateway
    stale = gateway._gateway_client.get_thread_connection() if gateway is not None else None
    if stale is not None:
        stale.close(reset=True)
    # the new connection is served by a new JVM thread, and the JVM's active session is per thread:
    # set it again, as PySpark does for a thread of its own (a Python data source's streaming write
    # is looked up through it: DATA_SOURCE_NOT_FOUND without)
    session._get_j_spark_session_class(session._jvm).setActiveSession(session._jsparkSession)
    session.sparkContext.cancelAllJobs()


def tiered_records(reader: Any, journal: Any, *, start: int = 1, max_bytes: int = 1 << 20) -> list[Record]:
    """Every record of a tiered stream from ``start``: the object store's part (``reader``, a
    TierReader, in chunks of ``max_bytes``) below the journal's first record, then the journal's."""
    reader.refresh()
    out: list[Record] = []
    at = start
    while at < journal.first_sequence:
        chunk = reader.read_chunk(at, max_bytes=max_bytes, end=journal.first_sequence - 1)
        assert chunk is not None, f"neither the store nor the journal holds record {at}"
        out += chunk.records()
        at = chunk.last + 1
    while (local := journal.read_chunk(at)) is not None:
        out += local.records()
        at = local.last + 1
    return out

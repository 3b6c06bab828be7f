"""The simulated world a replicated stream runs in: one clock, one seeded random source, a
network, a ZooKeeper, disks that lose their unsynced tail, and the processes on them.

Every source of nondeterminism passes through :class:`Sim` (TigerBeetle's VOPR, FoundationDB's
simulation): time is a number the event queue moves, randomness is one ``random.Random(seed)``. The
replicas run zeps's own state machines unchanged: :class:`~zeps.broker.core.BrokerCore` on a real
journal in a folder (on ``/dev/shm`` when there is one), :class:`~zeps.broker.replica.ReplicaNode`,
the election recipe :class:`~zeps.replication.election.Election`; the clients run
:class:`~zeps.client.session.ClientSession`. What is simulated is only what they talk to:

* **Network** (:class:`Network`): each connection delivers in order after a random delay, as
  ZeroMQ over TCP does; a lost frame breaks its connection (everything after it on that connection
  is lost too: ZeroMQ never drops one frame and delivers the next), and a partition drops everything
  between two hosts. Frames of different connections overtake each other freely (an old leader's
  answer arriving after the new leader's). A process that restarts has new connections: frames for
  the old ones are lost, and a peer's frames reach the new process under a new routing id (as
  ZeroMQ's ROUTER sees them).
* **ZooKeeper** (:class:`SimZooKeeper`): nodes with versions, ephemeral owners, sequence counters
  and one-shot watches; sessions that expire when not heard from; operations that fail before they
  are applied, or after (the answer lost: ``ConnectionLoss``).
* **Disks**: the journals use the ``interval`` policy with a very long interval, and the simulation
  syncs each journal at random moments, so a machine crash (:meth:`Replica.crash` with
  ``lose_tail``) cuts each active segment back to what was synced.
* **Clocks**: each replica's ``now`` (monotonic) is the simulation's plus a skew that a fault jumps
  forward a few seconds; its wall clock (the idempotent producers' TTL) may jump days.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import logging
import os
import random
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from simulation.checker import key_of
from simulation.tiering import Check, SimStore, TierOptions, Uploads, snapshot
from zeps.broker.core import BrokerConfig, BrokerCore, Outgoing
from zeps.broker.replica import (
    Close,
    Connect,
    MarkData,
    RecordCommit,
    ReplicaNode,
    ReplicaSettings,
    Send,
    StepAside,
    WriteIsr,
)
from zeps.client.session import ClientSession
from zeps.errors import ZepsError
from zeps.journal import JournalConfig
from zeps.paths import StreamPaths
from zeps.protocol import Refusal
from zeps.replication import election as zk
from zeps.replication.election import Election, ReplicaEvent, ReplicationState

log = logging.getLogger("simulation")


class Acting(logging.Filter):
    """Log records say the simulated time and which replica was acting (``-v`` replays)."""

    who = "-"
    sim: Sim | None = None

    def filter(self, record: logging.LogRecord) -> bool:
        record.sim = f"{self.sim.now:9.4f}" if self.sim is not None else "-"
        record.who = Acting.who
        return True


ACTING = Acting()

STREAM = "prices"
PATHS = StreamPaths.of("default", STREAM, chroot="/zeps")
#: a compacting seed's journals: every closed, committed segment compacted as soon as it can be
COMPACTED: dict[str, Any] = {"cleanup": "compact", "min_cleanable_ratio": 0.0}
COMPACT_EVERY_S = 0.5  #: how often a compacting replica's loop runs a pass (when one is due)


def draws_compaction(seed: int) -> bool:
    """Whether a seed compacts, if it is not tiered: half of them, from a random source of its own."""
    return random.Random(f"compaction-{seed}").random() < 0.5


@dataclass(frozen=True)
class Options:
    """What a seed expands into (printed with every failure, so a run is understood before replayed)."""

    replicas: int
    min_insync: int
    producers: int
    subscribers: int
    messages: int  #: per producer
    fault_s: float  #: faults happen in [0, fault_s); then everything heals
    faults: int  #: how many
    drop: float  #: a frame is lost, and its connection with it, with this probability (during the fault phase)
    zk_fail: float  #: a ZooKeeper operation fails (half before, half after it is applied)
    segment_bytes: int
    session_s: float  #: ZooKeeper session timeout
    slow_disk: float  #: the chance a replica's disk syncs slowly (every 50-400 ms) after each of its starts
    #: the replica the others give the lead back to once it is in sync (None: no preference); the
    #: stream settles only once it leads
    preferred: str | None = None

    @classmethod
    def from_seed(cls, rng: random.Random) -> Options:
        replicas = 3
        return cls(
            replicas=replicas,
            min_insync=rng.choice([2, 2, 3]),
            producers=rng.choice([1, 2, 3]),
            subscribers=rng.choice([1, 2]),
            messages=rng.choice([60, 120, 200]),
            fault_s=rng.choice([6.0, 10.0, 15.0]),
            faults=rng.choice([rng.randint(2, 8), rng.randint(8, 25)]),
            drop=rng.choice([0.0, 0.0, 0.002, 0.01]),
            zk_fail=rng.choice([0.0, 0.02, 0.1]),
            segment_bytes=rng.choice([2048, 8192, 1 << 20]),
            session_s=rng.choice([2.0, 4.0]),
            slow_disk=rng.choice([0.0, 0.3, 0.6]),
            preferred=rng.choice([None, "r0", "r1"]),  # drawn last: the choices above stay what they were
        )


class Sim:
    """The clock and the event queue: ``at`` runs a callback at a time; ``step`` runs the next one."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.now = 0.0
        self._queue: list[tuple[float, int, Callable[[], None]]] = []
        self._order = itertools.count()
        self.steps = 0

    def at(self, when: float, fn: Callable[[], None]) -> None:
        heapq.heappush(self._queue, (max(when, self.now), next(self._order), fn))

    def after(self, delay: float, fn: Callable[[], None]) -> None:
        self.at(self.now + delay, fn)

    def step(self) -> bool:
        if not self._queue:
            return False
        self.now, _, fn = heapq.heappop(self._queue)
        self.steps += 1
        Acting.who = getattr(fn, "who", "-")
        fn()
        return True


# -- ZooKeeper --------------------------------------------------------------------------------------
@dataclass
class ZNode:
    data: bytes
    version: int = 0
    owner: int | None = None  # the session of an ephemeral node
    children_made: int = 0  # sequence numbers handed out under it
    cversion: int = 0  # one more with each child made or removed


@dataclass
class Session:
    id: int
    replica: Replica
    heard: float
    alive: bool = True
    connected: bool = True


class SimZooKeeper:
    """One ZooKeeper server's data and sessions (an ensemble behaves as one, to its clients)."""

    def __init__(self, sim: Sim, options: Options) -> None:
        self.sim, self.options = sim, options
        self.nodes: dict[str, ZNode] = {"/": ZNode(b"")}
        self.sessions: dict[int, Session] = {}
        self.watches: dict[tuple[str, str], list[tuple[int, Callable[[], None]]]] = {}  # (kind, path)
        self._ids = itertools.count(1)
        self.history: list[ReplicationState] = []  # every state written, in order

    def open_session(self, replica: Replica) -> Session:
        session = Session(next(self._ids), replica, self.sim.now)
        self.sessions[session.id] = session
        return session

    def expire(self, session: Session) -> None:
        if not session.alive:
            return
        session.alive = False
        for path, node in list(self.nodes.items()):
            if node.owner == session.id:
                self._remove(path)
        for key, watchers in list(self.watches.items()):
            self.watches[key] = [(s, fn) for s, fn in watchers if s != session.id]

    def check_sessions(self) -> None:
        for session in list(self.sessions.values()):
            if session.alive and self.sim.now - session.heard > self.options.session_s:
                self.expire(session)
                session.replica.session_expired(session)

    # -- operations --------------------------------------------------------------------------
    def execute(self, session: Session, op: zk.Op, watch: Callable[[str], None]) -> Any:
        """Apply ``op`` for ``session`` (raising the recipe's errors); ``watch(name)`` is called when
        a watch it set fires."""
        if not session.alive:
            raise zk.SessionExpiredError("session expired")
        match op:
            case zk.Create(path, data, ephemeral, sequence, makepath):
                parent = path.rsplit("/", 1)[0] or "/"
                if parent not in self.nodes:
                    if not makepath:
                        raise zk.NoNodeError(parent)
                    self._make_parents(parent)
                if sequence:
                    self.nodes[parent].children_made += 1
                    path = f"{path}{self.nodes[parent].children_made:010d}"
                if path in self.nodes:
                    raise zk.NodeExistsError(path)
                self.nodes[path] = ZNode(data, owner=session.id if ephemeral else None)
                self.nodes[parent].cversion += 1
                self._fire("exists", path)
                self._fire("children", parent)
                self._record(path, data)
                return path
            case zk.Get(path, name):
                node = self.nodes.get(path)
                if node is None:
                    raise zk.NoNodeError(path)
                if name:
                    self._watch("data", path, session, lambda: watch(name))
                return node.data, node.version
            case zk.Set(path, data, version):
                node = self.nodes.get(path)
                if node is None:
                    raise zk.NoNodeError(path)
                if version not in (-1, node.version):
                    raise zk.BadVersionError(path)
                node.data, node.version = data, node.version + 1
                self._fire("data", path)
                self._record(path, data)
                return None
            case zk.GetChildren(path, name):
                if path not in self.nodes:
                    raise zk.NoNodeError(path)
                if name:
                    self._watch("children", path, session, lambda: watch(name))
                prefix = path.rstrip("/") + "/"
                return [p[len(prefix) :] for p in self.nodes if p.startswith(prefix) and "/" not in p[len(prefix) :]]
            case zk.Exists(path, name):
                if name:
                    kind = "data" if path in self.nodes else "exists"
                    self._watch(kind, path, session, lambda: watch(name))
                return path in self.nodes
            case zk.Delete(path):
                if path not in self.nodes:
                    raise zk.NoNodeError(path)
                self._remove(path)
                return None
        raise AssertionError(f"unknown operation {op!r}")

    def multi(self, session: Session, ops: list[Any]) -> list[Any]:
        """A transaction (the tiering's: its nodes are watched by no one, so the watches its operations
        fire before one fails are harmless): every operation applied, or none. The outcome per
        operation: its result, or the error of the one that failed (the others then None)."""
        saved = snapshot(self.nodes)
        outcome: list[Any] = []
        for i, op in enumerate(ops):
            try:
                if isinstance(op, Check):
                    node = self.nodes.get(op.path)
                    if node is None:
                        raise zk.NoNodeError(op.path)
                    if op.version not in (-1, node.version):
                        raise zk.BadVersionError(op.path)
                    outcome.append(True)
                else:
                    outcome.append(self.execute(session, op, lambda _name: None))
            except zk.ZooKeeperError as exc:
                self.nodes = saved
                return [None] * i + [exc] + [None] * (len(ops) - i - 1)
        return outcome

    def state(self) -> ReplicationState | None:
        node = self.nodes.get(PATHS.replication_state)
        return None if node is None else ReplicationState.decode(node.data)

    def _record(self, path: str, data: bytes) -> None:
        if path == PATHS.replication_state and (state := ReplicationState.decode(data)) is not None:
            self.history.append(state)

    def _make_parents(self, path: str) -> None:
        parts = path.strip("/").split("/")
        for i in range(1, len(parts) + 1):
            p = "/" + "/".join(parts[:i])
            if p not in self.nodes:
                self.nodes[p] = ZNode(b"")
                self.nodes[p.rsplit("/", 1)[0] or "/"].cversion += 1
                self._fire("children", p.rsplit("/", 1)[0] or "/")

    def _remove(self, path: str) -> None:
        del self.nodes[path]
        self.nodes[path.rsplit("/", 1)[0] or "/"].cversion += 1
        self._fire("data", path)
        self._fire("children", path.rsplit("/", 1)[0] or "/")

    def _watch(self, kind: str, path: str, session: Session, fn: Callable[[], None]) -> None:
        self.watches.setdefault((kind, path), []).append((session.id, fn))

    def _fire(self, kind: str, path: str) -> None:
        kinds = ("data", "exists") if kind in ("data", "exists") else (kind,)
        for k in kinds:
            for _, fn in self.watches.pop((k, path), []):
                self.sim.after(self.sim.rng.uniform(0.0005, 0.003), fn)


class ElectionDriver:
    """Runs one replica's election tasks, one at a time, one ZooKeeper operation per event."""

    def __init__(self, replica: Replica, machine: Election) -> None:
        self.replica, self.machine = replica, machine
        self.sim, self.zk = replica.sim, replica.world.zk
        self.tasks: deque[zk.Task] = deque()
        self.current: zk.Task | None = None
        self.busy = False
        self.dead = False

    def submit(self, task: zk.Task) -> None:
        self.tasks.append(task)
        if not self.busy:
            self.busy = True
            self.sim.after(0.0, lambda: self._advance(None, None))

    def _advance(self, result: Any, error: BaseException | None) -> None:
        if self.dead:
            return
        Acting.who = self.replica.name
        if self.replica.paused:  # the process is stopped: its thread goes on when it resumes
            self.replica.on_resume.append(lambda: self._advance(result, error))
            return
        while True:
            if self.current is None:
                if not self.tasks:
                    self.busy = False
                    return
                self.current, result, error = self.tasks.popleft(), None, None
            try:
                op = self.current.throw(error) if error is not None else self.current.send(result)
            except StopIteration:
                self.current = None
                continue
            except zk.ZooKeeperError:  # a step the recipe let fail: the next event tries again
                self.current = None
                continue
            if isinstance(op, zk.Schedule):
                self.replica.later(op.delay, lambda o=op: self.submit(self.machine.timer(o.name, o.arg)))
                result, error = None, None
                continue
            self.sim.after(self.sim.rng.uniform(0.0005, 0.004), lambda op=op: self._execute(op))
            return

    def _execute(self, op: zk.Op) -> None:
        if self.dead:
            return
        replica, rng = self.replica, self.sim.rng
        session = replica.session
        fail = self.replica.world.options.zk_fail if self.replica.world.faulting else 0.0
        if session is None or not session.connected:
            self._advance(None, zk.ConnectionLossError("not connected"))
            return
        if rng.random() < fail / 2:  # lost before it reached the server
            self._advance(None, zk.ConnectionLossError("dropped before applied"))
            return
        try:
            result = self.zk.execute(session, op, lambda name: self._watched(name, session))
        except zk.ZooKeeperError as exc:
            self._advance(None, exc)
            return
        if rng.random() < fail / 2:  # applied, and the answer lost
            self._advance(None, zk.ConnectionLossError("answer lost after applied"))
            return
        self._advance(result, None)

    def _watched(self, name: str, session: Session) -> None:
        if not self.dead and self.replica.session is session:
            self.submit(self.machine.watched(name))


# -- the network -------------------------------------------------------------------------------------
class Network:
    """Connections between hosts: in-order delivery after a delay; while the world is faulting, a
    frame may be lost, and its connection with it; partitions drop everything between two hosts."""

    def __init__(self, sim: Sim, world: World) -> None:
        self.sim, self.world = sim, world
        self.last: dict[str, float] = {}  # connection -> the last arrival time on it
        self.broken: set[str] = set()  # connections that lost a frame: everything after it is lost
        self.cut: set[frozenset[str]] = set()  # partitioned host pairs
        self.frames = 0

    def send(self, src: str, dst: str, connection: str, deliver: Callable[[], None]) -> None:
        self.frames += 1
        if connection in self.broken or frozenset((src, dst)) in self.cut:
            return
        if self.world.faulting and self.sim.rng.random() < self.world.options.drop:
            self.broken.add(connection)
            return
        arrival = max(self.sim.now + self.sim.rng.uniform(0.0002, 0.002), self.last.get(connection, 0.0))
        self.last[connection] = arrival
        self.sim.at(arrival, deliver)


# -- a replica process ------------------------------------------------------------------------------
class Replica:
    """One broker process (an incarnation at a time) and its disk."""

    LOOP_S = 0.002

    def __init__(self, world: World, name: str) -> None:
        self.world, self.sim, self.name = world, world.sim, name
        self.dir = world.root / name
        self.up = False
        self.paused = False
        self.incarnation = 0
        self.skew = 0.0  # its monotonic clock's lead on the simulation's
        self.wall_skew = 0.0  # its wall clock's (a clock set wrong can lead by days)
        self.on_resume: list[Callable[[], None]] = []
        self.core: BrokerCore | None = None
        self.node: ReplicaNode | None = None
        self.session: Session | None = None
        self.driver: ElectionDriver | None = None
        self.events: deque[ReplicaEvent] = deque()
        self.link = 0  # the peering with the leader: its number (0: none) and where it goes
        self.link_to: tuple[str, int] | None = None
        self._loop_due = False
        self._last_tick = 0.0
        self._last_compaction = 0.0
        self.durable_at_crash = 0  # what the disk held durably when it last went down
        self.sync_every = (0.001, 0.02)  # how often its disk syncs (seconds, a range)
        self.uploads: Uploads | None = None  # a tiered stream's rounds (this incarnation's)

    @property
    def host(self) -> str:
        return self.name

    def local_now(self) -> float:
        return self.sim.now + self.skew

    def wall_ms(self) -> int:
        """Its wall clock (the producers' TTL, the records' time)."""
        return int((self.world.epoch + self.sim.now + self.wall_skew) * 1000)

    def later(self, delay: float, fn: Callable[[], None]) -> None:
        """A timer of this incarnation (gone with it)."""
        incarnation = self.incarnation
        self.sim.after(delay, lambda: fn() if self.up and self.incarnation == incarnation else None)

    # -- life --------------------------------------------------------------------------------
    def start(self) -> None:
        Acting.who = self.name
        if self.up:  # a start scheduled by an earlier fault, while it runs: a restart is a kill, then a start
            self.crash(lose_tail=False)
            Acting.who = self.name
        self.incarnation += 1
        self.up, self.paused = True, False
        journal = JournalConfig(fsync="interval", interval_ms=1e12, segment_bytes=self.world.options.segment_bytes)
        if self.world.compaction:  # small segments: many closed ones to compact, and to copy compacted
            journal = replace(journal, segment_bytes=min(journal.segment_bytes, 1024), **COMPACTED)
        config = BrokerConfig(self.dir, (STREAM,), journal=journal, replicated=True, heartbeat_s=1.0, ttl_s=5.0)
        self.core = BrokerCore(config, wall_ms=self.wall_ms).open()
        settings = ReplicaSettings(self.world.options.min_insync, lag_s=2.0, heartbeat_s=0.1, leader_silence_s=1.0)
        self.node = ReplicaNode(self.core, STREAM, self.name, settings)
        self.events.clear()
        self.link, self.link_to = 0, None
        self._loop_due = False  # a loop event of the last incarnation never runs
        slow = self.world.faulting and self.sim.rng.random() < self.world.options.slow_disk
        self.sync_every = (0.05, 0.4) if slow else (0.001, 0.02)
        self._open_session()
        self._schedule_loop(0.0)
        self._schedule_sync()
        if self.world.tier_store is not None:
            self.uploads = Uploads(self)

    def _open_session(self) -> None:
        self.session = self.world.zk.open_session(self)
        journal = self.core.streams[STREAM].journal  # type: ignore[union-attr]
        empty = lambda: journal.written == 0 and journal.epochs.latest == 0  # noqa: E731
        run = f"{self.incarnation}s{self.session.id}"
        node = self.node
        machine = Election(PATHS, self.name, run, self.events.append, empty=empty,
                           preferred=self.world.options.preferred,
                           caught_up=lambda name: node is not None and node.caught_up(name))  # fmt: skip
        if self.driver is not None:
            self.driver.dead = True
        self.driver = ElectionDriver(self, machine)
        self.driver.submit(machine.start())

    def crash(self, *, lose_tail: bool) -> None:
        """kill -9 (or, ``lose_tail``, the machine's power): nothing is closed or flushed; a machine
        crash also loses each journal's unsynced bytes."""
        Acting.who = self.name
        if not self.up:
            return
        assert self.core is not None
        journal = self.core.streams[STREAM].journal
        active, synced = journal._segments[-1].path, journal._synced_size
        self.durable_at_crash = journal.durable
        self._end_uploads()
        journal._readers.close()
        journal._close_files()
        if lose_tail and active.exists() and active.stat().st_size > synced:
            os.truncate(active, synced)
        self.up = False
        self.paused = False
        self.on_resume.clear()
        if self.session is not None:
            self.session.connected = False  # its connection drops; the server expires the session later
        if self.driver is not None:
            self.driver.dead = True
        self.core = self.node = None
        self.world.host_gone(self.name)

    def _end_uploads(self) -> None:
        if self.uploads is not None:
            self.uploads.kill()
            self.uploads = None

    def stop(self) -> None:
        """SIGTERM: as :meth:`zeps.broker.server.BrokerServer.hand_over` then ``stop`` do it: the
        replica stops fetching and fences a leadership, leaves the election line (and, a follower,
        the in-sync set), waits until another replica leads the next epoch (at most 10 s), then
        closes its journal and its session (its ephemeral nodes go at once)."""
        Acting.who = self.name
        if not self.up or self.paused or self.node is None or self.driver is None:
            return
        node, driver, began = self.node, self.driver, self.sim.now
        node.resign()
        asked = False

        def step() -> None:
            nonlocal asked
            Acting.who = self.name
            if not asked and (node.peered_off or self.sim.now - began > 1.0):
                asked = True
                driver.submit(driver.machine.resign(self.world.options.min_insync))
            if asked and (node.handed_over or self.sim.now - began > 10.0):
                self.later(0.1, self._closed)  # the loop's next turns send the NOT_LEADERs
            else:
                self.later(0.005, step)

        self.later(0.0, step)

    def _closed(self) -> None:
        """The end of a graceful stop: the journal closed (flushed, its checkpoint written), the session too."""
        assert self.core is not None
        journal = self.core.streams[STREAM].journal
        self.core.flush_appends()  # what closing flushes may move a leader's commit point: checked first
        self.world.observe(self)
        self._end_uploads()  # (the broker's waits for the round under way, at most 30 s: here it ends)
        self.core.close()  # flushed and synced: everything written is durable
        self.durable_at_crash = journal.written
        self.up = False
        if self.session is not None:
            self.world.zk.expire(self.session)  # a closed session: its ephemeral nodes go at once
        if self.driver is not None:
            self.driver.dead = True
        self.core = self.node = None
        self.world.host_gone(self.name)

    def pause(self) -> None:
        if self.up:
            self.paused = True

    def resume(self) -> None:
        if not (self.up and self.paused):
            return
        self.paused = False
        waiting, self.on_resume = self.on_resume, []
        for fn in waiting:
            self.sim.after(0.0, fn)
        self._schedule_loop(0.0)
        session = self.session
        if session is not None and not session.alive:  # the server expired it meanwhile: the client learns it
            self.later(self.sim.rng.uniform(0.0, 0.05), lambda: self.session_expired(session))

    def session_expired(self, session: Session) -> None:
        """The server expired ``session``: once the process runs, its client sees the connection drop
        (SUSPENDED), then LOST, then CONNECTED with a new session."""
        if not self.up or self.session is not session:
            return
        if self.paused:
            return  # resume() tells it
        assert self.node is not None and self.driver is not None
        self.node.connection("suspended")
        self.node.connection("lost")
        self.driver.submit(self.driver.machine.session("lost"))
        self.session = None
        self.later(self.sim.rng.uniform(0.05, 0.3), self._new_session)

    def _new_session(self) -> None:
        assert self.node is not None and self.driver is not None
        self.session = self.world.zk.open_session(self)
        self.node.connection("connected")
        self.driver.submit(self.driver.machine.session("connected"))

    def disconnect_zookeeper(self, seconds: float) -> None:
        """The connection to ZooKeeper drops for ``seconds`` (the session may outlive it)."""
        session = self.session
        if not self.up or session is None or not session.connected:
            return
        assert self.node is not None and self.driver is not None
        session.connected = False
        self.node.connection("suspended")
        self.driver.submit(self.driver.machine.session("suspended"))

        def back() -> None:
            if self.session is not session or self.paused:
                return
            if session.alive:
                session.connected = True
                session.heard = self.sim.now
                assert self.node is not None and self.driver is not None
                self.node.connection("connected")
                self.driver.submit(self.driver.machine.session("connected"))
            else:
                self.session_expired(session)

        self.later(seconds, back)

    # -- the loop ----------------------------------------------------------------------------
    def _schedule_loop(self, delay: float) -> None:
        if self._loop_due:
            return
        self._loop_due = True
        incarnation = self.incarnation
        self.sim.after(delay, lambda: self._loop(incarnation))

    def _schedule_sync(self) -> None:
        incarnation = self.incarnation

        def sync() -> None:
            if self.up and self.incarnation == incarnation:
                if not self.paused:
                    assert self.core is not None
                    self.core.streams[STREAM].journal.sync()
                    self._schedule_loop(0.0)
                self._schedule_sync()

        self.sim.after(self.sim.rng.uniform(*self.sync_every), sync)

    def _loop(self, incarnation: int) -> None:
        Acting.who = self.name
        if incarnation != self.incarnation:
            return
        self._loop_due = False
        if not self.up:
            return
        if self.paused:
            self.on_resume.append(lambda: self._schedule_loop(0.0))
            return
        core, node = self.core, self.node
        assert core is not None and node is not None
        now = self.local_now()
        if self.session is not None and self.session.connected and self.session.alive:
            self.session.heard = self.sim.now
        actions: list[Any] = []
        while self.events:
            actions += node.event(self.events.popleft(), now)
        actions += node.turn(now)
        self._act(actions)
        core.flush_appends(idle=True, now=now)
        if now - self._last_tick >= 1.0:  # as the broker's loop: once a second (the checkpoint among it)
            self._last_tick = now
            core.tick(now)
        self._send(core.pump(now))
        self.world.observe(self)
        if self.world.compaction and now - self._last_compaction >= COMPACT_EVERY_S:
            # after the checker read what this turn committed: a pass removes it only once superseded
            self._last_compaction = now
            journal = core.streams[STREAM].journal
            journal.compact(now_ms=self.wall_ms(), upto=journal.checkpoint.sequence)
        self._schedule_loop(self.LOOP_S if core.busy else 0.02)

    def _act(self, actions: list[Any]) -> None:
        for action in actions:
            if isinstance(action, Send):
                self._link_send(action.frame)
            elif isinstance(action, Close):
                self.link, self.link_to = 0, None
            elif isinstance(action, WriteIsr):
                assert self.driver is not None
                self.driver.submit(self.driver.machine.write_isr(action.epoch, action.isr))
            elif isinstance(action, MarkData):
                assert self.driver is not None
                self.driver.submit(self.driver.machine.mark_data(action.epoch))
            elif isinstance(action, StepAside):
                assert self.driver is not None
                self.driver.submit(self.driver.machine.step_aside(action.epoch))
            elif isinstance(action, RecordCommit):
                assert self.driver is not None
                self.driver.submit(self.driver.machine.record_commit(action.epoch, action.commit))
            elif isinstance(action, Connect):
                self._connect(action.epoch, action.leader)

    def _connect(self, epoch: int, leader: str) -> None:
        """The leader's endpoint, as its member node would give it: up, and registered in ZooKeeper."""

        def answer() -> None:
            if not self.up or self.node is None:
                return
            target = self.world.replicas.get(leader)
            if target is None or not target.up or target.session is None or not target.session.alive:
                self._act(self.node.unreachable(epoch, leader, self.local_now()))
                return
            self.link = self.world.new_link()
            self.link_to = (leader, target.incarnation)
            self._act(self.node.linked(epoch, leader, self.local_now()))

        self.later(self.sim.rng.uniform(0.001, 0.005), answer)

    def _link_send(self, frame: bytes) -> None:
        if not self.link or self.link_to is None:
            return
        leader, incarnation = self.link_to
        peer = f"L{self.name}.{self.link}".encode()
        target = self.world.replicas[leader]
        self.world.network.send(self.host, leader, peer.decode(), lambda: target.receive(peer, frame, incarnation))

    def link_frame(self, link: int, frame: bytes) -> None:
        """A frame from the leader on peering ``link`` (dropped if that peering is closed)."""
        Acting.who = self.name
        if not self.up or link != self.link or self.node is None:
            return
        if self.paused:
            self.on_resume.append(lambda: self.link_frame(link, frame))
            return
        self._act(self.node.frames([frame], self.local_now()))
        self._schedule_loop(0.0)

    def receive(self, peer: bytes, frame: bytes, incarnation: int) -> None:
        """A frame for this broker's ROUTER from ``peer``'s connection to ``incarnation``."""
        Acting.who = self.name
        if not self.up or incarnation != self.incarnation or self.core is None:
            return  # that connection died with the process
        if self.paused:
            self.on_resume.append(lambda: self.receive(peer, frame, incarnation))
            return
        self.core.receive(peer, frame, now=self.local_now())
        self._schedule_loop(0.0)

    def _send(self, outgoing: list[Outgoing]) -> None:
        for item in outgoing:
            self.world.deliver(self, item.peer, item.frame)
            if item.session is not None and self.core is not None:  # the network took it: it left
                self.core.released(item.session, item.cost)


# -- clients -----------------------------------------------------------------------------------------
@dataclass
class Client:
    """A producer (an idempotent one, named) or a subscriber from the start, following the leader."""

    world: World
    id: int
    kind: str
    session: ClientSession = field(init=False)
    conn: int = 0  # this connection's number (0: none)
    at: tuple[str, int] | None = None  # (replica, incarnation)
    published: list[bytes] = field(default_factory=list)
    confirmed: int = 0  # how many of ``published`` are confirmed (a prefix)
    delivered: list[tuple[int, bytes]] = field(default_factory=list)
    heard: float = 0.0
    attempt: float = -1.0
    generation: int = 0  # producer sessions started over: the broker refused the producer
    given_up: list[bytes] = field(default_factory=list)  # publishes of earlier generations never confirmed

    def __post_init__(self) -> None:
        self._new_session()

    def _new_session(self) -> None:
        name = f"p{self.id}.{self.generation}" if self.kind == "producer" else None
        self.session = ClientSession(STREAM, producer=name, idempotent=self.kind == "producer")
        if self.kind == "subscriber":
            self.session.subscribe("", "earliest")

    def _restart(self) -> None:
        """The broker refused the producer (PRODUCER_UNKNOWN: every replica lost its unconfirmed claim
        in a machine crash, or it expired): as an application would, it reports its unconfirmed
        publishes failed (they may or may not be committed, never twice) and goes on as a new producer."""
        self.given_up += self.published[self.confirmed :]
        del self.published[self.confirmed :]
        self.generation += 1
        self._new_session()
        self.connect()

    @property
    def host(self) -> str:
        return f"client{self.id}"

    @property
    def peer(self) -> bytes:
        return f"c{self.id}.{self.conn}".encode()

    def connect(self) -> None:
        """Attach to whoever ZooKeeper names leader (as the client's locator does)."""
        world = self.world
        self.attempt = world.sim.now
        state = world.zk.state()
        target = world.replicas.get(state.leader) if state is not None else None
        self.session.disconnected()
        self.conn, self.at = world.new_link(), None
        if target is None or not target.up:
            return
        self.at = (target.name, target.incarnation)
        self.heard = world.sim.now
        self._send([self.session.attach()])

    def _send(self, frames: list[bytes]) -> None:
        if self.at is None:
            return
        name, incarnation = self.at
        target, peer = self.world.replicas[name], self.peer
        for frame in frames:
            self.world.network.send(
                self.host, name, peer.decode(), lambda f=frame: target.receive(peer, f, incarnation)
            )

    def frame(self, conn: int, frame: bytes) -> None:
        if conn != self.conn:
            return
        self.heard = self.world.sim.now
        try:
            answers = self.session.receive(frame)
        except ZepsError:
            self.connect()
            return
        self._send(answers)
        for row in self.session.inbox.take(100_000):
            self.world.checker.delivered(self, row[0], row[2])
            self.delivered.append((row[0], row[2]))
        self._send(self.session.take_outbox())
        if self.session.producer_error is not None:
            self._restart()
            return
        confirmed = len(self.published) - self.session.unconfirmed
        if confirmed > self.confirmed:
            self.world.checker.confirmed(self, self.published[self.confirmed : confirmed], self.at)
            self.confirmed = confirmed
        with contextlib.suppress(ZepsError):  # refused (too few in sync): it attaches again at the next turn
            self.session.check_publishes()
        if self.session.forgotten or self.session.refused_code == Refusal.NOT_LEADER:
            self.world.sim.after(0.05, self.connect)

    def turn(self) -> None:
        """Every 20 ms: publish a little, put a barrier, and find the leader again if it went quiet."""
        sim = self.world.sim
        if self.kind == "producer" and self.session.ready and len(self.published) < self.world.options.messages:
            for _ in range(sim.rng.randint(1, 3)):
                body = b"p%d:%d" % (self.id, len(self.published) + len(self.given_up) + 1)
                self.published.append(body)
                self._send(self.session.publish(key_of(body) if self.world.compaction else "k", body))
            self._send(self.session.confirm())
        elif self.kind == "producer" and self.session.unconfirmed:
            self._send(self.session.confirm())
        quiet = sim.now - self.heard
        if self.session.forgotten or (not self.session.attached and sim.now - self.attempt > 0.5) or quiet > 1.5:
            self.connect()
        elif self.session.attached and quiet > 0.3:
            self._send([self.session.ping()])
        sim.after(0.02, self.turn)


# -- the world -------------------------------------------------------------------------------------
class World:
    stream = STREAM
    paths = PATHS
    tier_root = f"{PATHS.root}/tier"

    def __init__(self, seed: int, root: Path, options: Options | None = None,
                 tiering: TierOptions | bool = True, *, compaction: bool = False) -> None:  # fmt: skip
        """``tiering``: True draws the seed's (or none), False runs without. ``compaction``: True draws
        it for a seed without tiering (half of them, from a random source of its own): the replicas
        compact their journals and the producers publish under a few keys."""
        from simulation.checker import Checker  # noqa: PLC0415

        self.sim = Sim(seed)
        self.options = options or Options.from_seed(random.Random(seed))
        self.root = root
        self.tiering = TierOptions.from_seed(seed) if tiering is True else tiering or None
        self.tier_rng = random.Random(f"tiering-run-{seed}")  # never the simulation's: seeds replay without
        self.tier_store = SimStore(root / ".store", self.tiering, self) if self.tiering is not None else None
        self.compaction = compaction and draws_compaction(seed) and self.tiering is None
        self.zk = SimZooKeeper(self.sim, self.options)
        self.network = Network(self.sim, self)
        self.replicas = {f"r{i}": Replica(self, f"r{i}") for i in range(self.options.replicas)}
        self.clients: list[Client] = []
        self.checker = Checker(self)
        self.faulting = True
        self.epoch = time.time()  # the wall clock at the simulation's start (only producers' TTL reads it)
        self._links = itertools.count(1)
        self.sim.after(0.1, self._sessions)

    def _sessions(self) -> None:
        """ZooKeeper's server expires the sessions it has not heard from (every 100 ms)."""
        self.zk.check_sessions()
        self.sim.after(0.1, self._sessions)

    def new_link(self) -> int:
        return next(self._links)

    def host_gone(self, name: str) -> None:
        """A replica died: its clients' connections drop (they notice after a moment)."""
        for client in self.clients:
            if client.at is not None and client.at[0] == name:
                conn = client.conn
                self.sim.after(self.sim.rng.uniform(0.001, 0.05), lambda c=client, n=conn: c.conn == n and c.connect())

    def deliver(self, replica: Replica, peer: bytes, frame: bytes) -> None:
        """A frame from ``replica``'s ROUTER to ``peer``: a client's connection or a follower's peering."""
        text = peer.decode()
        if text.startswith("L"):  # a follower's peering: L<follower>.<link>
            follower, link = text[1:].rsplit(".", 1)
            target = self.replicas[follower]
            self.network.send(replica.host, follower, text, lambda: target.link_frame(int(link), frame))
        else:  # a client: c<id>.<conn>
            cid, conn = text[1:].split(".")
            client = self.clients[int(cid)]
            self.network.send(replica.host, client.host, text, lambda: client.frame(int(conn), frame))

    def observe(self, replica: Replica) -> None:
        self.checker.observe(replica)

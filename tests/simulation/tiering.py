"""Tiered uploads in the replication simulation: each replica runs zeps's own rounds
(:class:`zeps.broker.tiering.TierRounds`, so :class:`zeps.tiering.uploader.TierUploader` and the
fencing of :mod:`zeps.coordination.fenced`) against the simulated ZooKeeper and an object store.

Those rounds are blocking code, as they are on the broker's tier thread. Here each round runs in a
greenlet, a simulated thread: every call it makes to ZooKeeper (:class:`SimKazoo`, the few calls of
kazoo's client that zeps's code makes) or to the store (:class:`SimStore`) becomes an event of the
simulation, and the greenlet waits for it. So a round interleaves with everything else, one call at
a time, and a fault can land between any two of its calls: the replica killed between a manifest
entry's ``copy-started`` and its upload, a deposed leader's put arriving after the next leader
cleaned its entry, a call lost before or after it was applied.

What is modelled: a call that was sent is applied when its event comes, even if the process died or
stopped meanwhile (a request on the wire); its answer is lost with the process. While the world is
faulting, ZooKeeper calls fail at the seed's rate (half before, half after they are applied, as the
election's do), store calls at the tiering's own rate, and the store goes away for a few seconds now
and then. What is not: local retention (a replica deletes no segment here: its subscribers never
fall behind its journal, so no read goes to the store) and the store's reads.

The tiering draws from a random source of its own, so a seed without tiering runs exactly as it
did before tiering came to the simulation.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from greenlet import GreenletExit, greenlet
from kazoo import exceptions as kazoo

from simulation.checker import Violation
from zeps.batchstore import BatchStoreError, FileBatchStore
from zeps.broker.tiering import Offer, Tiering, TierRounds
from zeps.replication import election as zk

if TYPE_CHECKING:
    from simulation.world import Replica, World

#: how often the loop offers its news to the rounds (the broker's tick)
TICK_S = 1.0
#: the leader closes its active segment once its newest record is this old (a quiet stream uploads)
SEGMENT_IDLE_MS = 2000
#: a round's calls when nothing waits, at most this far apart (the broker's: 10 s)
ROUND_INTERVAL_S = 3.0


@dataclass(frozen=True)
class TierOptions:
    """What the tiering of a seed looks like (from its own random source)."""

    store_fail: float  #: a store call fails (half before, half after it is applied) while faulting
    outages: int  #: how often the store goes away (or slows down) for 0.5-5 s during the fault phase

    @classmethod
    def from_seed(cls, seed: int) -> TierOptions | None:
        """None for about a third of the seeds: those run without tiering."""
        rng = random.Random(f"tiering-{seed}")
        if rng.random() < 1 / 3:
            return None
        return cls(store_fail=rng.choice([0.0, 0.02, 0.1]), outages=rng.choice([0, 1, 3]))


@dataclass(frozen=True)
class Stat:
    version: int


@dataclass(frozen=True)
class ChildStat:
    cversion: int


class Later:
    def __init__(self, call: Callable[[], Any]) -> None:
        self.call = call

    def get(self) -> Any:
        return self.call()


@dataclass(frozen=True)
class Check:
    """A transaction's version check (kazoo's ``check``)."""

    path: str
    version: int


class Killed(GreenletExit):
    """Thrown into a round whose process died under one of its calls."""


class Thread:
    """A replica incarnation's tier thread: one greenlet at a time, whose blocking calls are events."""

    def __init__(self, replica: Replica, rng: random.Random) -> None:
        self.replica, self.sim, self.rng = replica, replica.sim, rng
        self.current: greenlet | None = None
        self.dead = False

    def run(self, fn: Callable[[], None]) -> None:
        """Start ``fn`` on the thread (the last one must have ended)."""
        assert self.current is None or self.current.dead
        self.current = greenlet(lambda _start: fn())
        self._switch(self.current, None)

    @property
    def busy(self) -> bool:
        return self.current is not None and not self.current.dead

    def call(self, apply: Callable[[], Any], *, slow: bool = False) -> Any:
        """From the thread: send a call, applied by ``apply`` at its event (after up to 20 ms, or up to
        3 s when ``slow``); wait for its answer (what ``apply`` returned or raised)."""
        me = greenlet.getcurrent()
        assert me is self.current, "a blocking call outside the tier thread"

        def arrive() -> None:
            try:
                answer: tuple[bool, Any] = (True, apply())
            except Violation:
                raise
            except Exception as exc:  # the call's failure, the thread's to handle
                answer = (False, exc)
            self._answer(me, answer)

        self.sim.after(self.rng.uniform(0.3, 3.0) if slow else self.rng.uniform(0.0005, 0.02), arrive)
        ok, value = me.parent.switch()
        if not ok:
            raise value
        return value

    def _answer(self, me: greenlet, answer: tuple[bool, Any]) -> None:
        if self.dead or me.dead:
            return  # the process died: the answer is lost with it
        if self.replica.paused:  # a stopped process reads it once it runs again
            self.replica.on_resume.append(lambda: self._answer(me, answer))
            return
        self._switch(me, answer)

    def _switch(self, to: greenlet, value: Any) -> None:
        """Run the thread until its next call (or its end); a violation the checker found meanwhile
        is raised here, in the simulation's event, whatever the round's own handling of errors."""
        from simulation.world import Acting  # noqa: PLC0415 (world imports this module)

        Acting.who = self.replica.name
        to.switch(value)
        broken = self.replica.world.checker.broken
        if broken is not None:
            raise broken

    def kill(self) -> None:
        """The process died: the call under way never returns (its request may still be applied)."""
        self.dead = True
        if self.busy:
            assert self.current is not None
            self.current.throw(Killed())


class SimStore:
    """The object store: objects in a directory (zeps's own file store, so the references and the
    object format are real), each call an event of the calling thread."""

    def __init__(self, root: Path, options: TierOptions, world: World) -> None:
        root.mkdir(parents=True, exist_ok=True)
        self.files = FileBatchStore(f"file://{root}")
        self.url = self.files.url
        self.options, self.world = options, world
        self.down = False  #: an outage: every call fails
        self.slow_until = 0.0  #: calls take up to 3 s until then (simulated time)
        self.puts: list[str] = []  #: every key put, in order

    def through(self, thread: Thread) -> BoundStore:
        return BoundStore(self, thread)

    def object_url(self, key: str) -> str:
        return self.files.object_url(key)

    def keys(self) -> set[str]:
        return {p.name.removesuffix(".batch") for p in self.files.root.glob("*.batch")}

    def _faulty(self, thread: Thread, what: str, apply: Callable[[], Any]) -> Any:
        rate = self.options.store_fail if self.world.faulting else 0.0
        before, after = thread.rng.random() < rate / 2, thread.rng.random() < rate / 2

        def at_the_store() -> Any:
            if self.down or before:
                raise BatchStoreError(f"{what}: the store did not answer")
            result = apply()
            if after:
                raise BatchStoreError(f"{what}: the answer was lost")
            return result

        return thread.call(at_the_store, slow=self.world.sim.now < self.slow_until)


class BoundStore:
    """The store as one thread calls it (what :class:`~zeps.tiering.uploader.TierUploader` holds)."""

    def __init__(self, store: SimStore, thread: Thread) -> None:
        self.store, self.thread, self.url = store, thread, store.url

    def put(self, key: str, data: bytes) -> str:
        self.store.world.checker.tier_upload(key, data)

        def put() -> str:
            self.store.puts.append(key)
            reference = self.store.files.put(key, data)
            self.store.world.checker.tier_put(key, reference)
            return reference

        reference: str = self.store._faulty(self.thread, f"put {key}", put)
        return reference

    def delete(self, url: str) -> None:
        def delete() -> None:
            self.store.world.checker.tier_object_deleted(url)
            self.store.files.delete(url)

        self.store._faulty(self.thread, f"delete {url}", delete)

    def object_url(self, key: str) -> str:
        return self.store.object_url(key)

    def get(self, url: str, prefetched: Any = None) -> bytes | memoryview:
        raise AssertionError("the simulation's uploads never read the store")

    def prefetch(self, key: str) -> None:
        return None


class SimKazoo:
    """The calls of kazoo's client that zeps's fencing and manifest code make, on the simulated
    ZooKeeper with the replica's session, each one an event of its tier thread (kazoo's exceptions)."""

    ERRORS: ClassVar[dict[type[zk.ZooKeeperError], type[kazoo.KazooException]]] = {
        zk.NoNodeError: kazoo.NoNodeError,
        zk.NodeExistsError: kazoo.NodeExistsError,
        zk.BadVersionError: kazoo.BadVersionError,
        zk.ConnectionLossError: kazoo.ConnectionLoss,
        zk.SessionExpiredError: kazoo.SessionExpiredError,
    }

    def __init__(self, replica: Replica, thread: Thread) -> None:
        self.replica, self.thread, self.world = replica, thread, replica.world
        self.epoch = -1  #: the epoch of the round under way (the checker's: who wrote what)

    def _call(self, apply: Callable[[Any], Any]) -> Any:
        session = self.replica.session
        rate = self.world.options.zk_fail if self.world.faulting else 0.0
        before, after = self.thread.rng.random() < rate / 2, self.thread.rng.random() < rate / 2

        def at_the_server() -> Any:
            if session is None or not session.connected or before:
                raise kazoo.ConnectionLoss("not connected" if not before else "dropped before applied")
            try:
                result = apply(session)
            except zk.ZooKeeperError as exc:
                raise self.ERRORS[type(exc)](str(exc)) from None
            if after:
                raise kazoo.ConnectionLoss("answer lost after applied")
            return result

        return self.thread.call(at_the_server)

    def _execute(self, op: zk.Op) -> Callable[[Any], Any]:
        return lambda session: self.world.zk.execute(session, op, lambda _name: None)

    def ensure_path(self, path: str, acl: Any = None) -> None:
        def ensure(session: Any) -> None:
            if path not in self.world.zk.nodes:
                self.world.zk.execute(session, zk.Create(path, makepath=True), lambda _name: None)

        self._call(ensure)

    def get(self, path: str) -> tuple[bytes, Stat]:
        data, version = self._call(self._execute(zk.Get(path)))
        return data, Stat(version)

    def get_children(self, path: str, include_data: bool = False) -> Any:
        def children(session: Any) -> Any:
            names = self.world.zk.execute(session, zk.GetChildren(path), lambda _name: None)
            return (names, ChildStat(self.world.zk.nodes[path].cversion)) if include_data else names

        return self._call(children)

    def get_async(self, path: str) -> Later:
        """kazoo's pipelined read: here the call is made when its answer is asked for."""
        return Later(lambda: self.get(path))

    def create(self, path: str, value: bytes = b"", acl: Any = None, makepath: bool = False) -> str:
        def create(session: Any) -> str:
            created: str = self.world.zk.execute(session, zk.Create(path, value, makepath=makepath), lambda _n: None)
            self.world.checker.tier_written(self.replica, self.epoch, [path])
            return created

        result: str = self._call(create)
        return result

    def set(self, path: str, value: bytes, version: int = -1) -> Stat:
        def set_(session: Any) -> Stat:
            self.world.zk.execute(session, zk.Set(path, value, version), lambda _name: None)
            self.world.checker.tier_written(self.replica, self.epoch, [path])
            return Stat(self.world.zk.nodes[path].version)

        result: Stat = self._call(set_)
        return result

    def transaction(self) -> Transaction:
        return Transaction(self)


class Transaction:
    """kazoo's transaction: every operation applied, or none; the outcome per operation."""

    def __init__(self, client: SimKazoo) -> None:
        self.client = client
        self.ops: list[zk.Op | Check] = []

    def create(self, path: str, value: bytes = b"", acl: Any = None) -> None:
        self.ops.append(zk.Create(path, value))

    def delete(self, path: str, version: int = -1) -> None:
        assert version == -1, "the tiering deletes whatever the version"
        self.ops.append(zk.Delete(path))

    def check(self, path: str, version: int) -> None:
        self.ops.append(Check(path, version))

    def set_data(self, path: str, value: bytes, version: int = -1) -> None:
        self.ops.append(zk.Set(path, value, version))

    def commit(self) -> list[Any]:
        client, ops = self.client, list(self.ops)
        world = client.world

        def multi(session: Any) -> list[Any]:
            outcome = world.zk.multi(session, ops)
            failed = [r for r in outcome if isinstance(r, zk.ZooKeeperError)]
            if not failed:
                world.checker.tier_written(client.replica, client.epoch, [op.path for op in ops])
                return outcome
            return [SimKazoo.ERRORS[type(r)]() if isinstance(r, zk.ZooKeeperError) else kazoo.RolledBackError()
                    for r in outcome]  # fmt: skip

        result: list[Any] = client._call(multi)
        return result


class Uploads:
    """One replica incarnation's tiering: the loop's tick offers what it knows to the rounds, which
    run on the tier thread when due, as :class:`zeps.broker.tiering.TierTask` runs them."""

    def __init__(self, replica: Replica) -> None:
        world = replica.world
        assert world.tier_store is not None
        self.replica, self.world = replica, world
        self.thread = Thread(replica, world.tier_rng)
        self.client = SimKazoo(replica, self.thread)
        tiering = Tiering(world.tier_store.url, segment_idle_ms=SEGMENT_IDLE_MS)
        self.rounds = TierRounds(replica.name, self.client, world.paths, world.tier_store.through(self.thread),
                                 tiering, wall_ms=replica.wall_ms, interval_s=ROUND_INTERVAL_S)  # fmt: skip
        self.offered: Offer | None = None
        replica.later(world.tier_rng.uniform(0.0, TICK_S), self.tick)

    def tick(self) -> None:
        """The broker's ``_offer_tiering``: a leader closes an idle segment; the offer goes to the rounds."""
        replica = self.replica
        if replica.paused:
            replica.on_resume.append(self.tick)
            return
        core = replica.core
        assert core is not None
        stream = core.streams[self.world.stream]
        leader = stream.leader
        if leader is not None:
            quiet = self.rounds.quiet(stream.journal.written, replica.local_now())
            stream.journal.close_idle_segment(now_ms=core.wall_ms(), idle_ms=0 if quiet else SEGMENT_IDLE_MS)
        offer = Offer(leading=leader is not None, epoch=leader.epoch if leader else 0,
                      segments=tuple(stream.journal.closed_segments()), commit=stream.committed,
                      local_bytes=stream.journal.size_bytes)  # fmt: skip
        self.offered = offer
        now = replica.local_now()
        if not self.thread.busy and self.rounds.due(offer, now):
            self.client.epoch = offer.epoch if offer.leading else -1
            self.thread.run(lambda: self.rounds.round(offer, now))
        replica.later(TICK_S, self.tick)

    def kill(self) -> None:
        self.thread.kill()


def outage(world: World, seconds: float, *, slow: bool) -> None:
    """The store goes away for ``seconds``, or (``slow``) answers within 0.3-3 s meanwhile."""
    store = world.tier_store
    assert store is not None
    if slow:
        store.slow_until = max(store.slow_until, world.sim.now + seconds)
        return
    store.down = True

    def back() -> None:
        store.down = False

    world.sim.after(seconds, back)


def snapshot(nodes: dict[str, Any]) -> dict[str, Any]:
    """A copy of the simulated ZooKeeper's nodes to roll a transaction back to."""
    return {path: replace(node) for path, node in nodes.items()}

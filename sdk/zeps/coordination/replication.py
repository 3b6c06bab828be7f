"""The replication election on a real ZooKeeper session: kazoo runs the recipe of
:mod:`zeps.replication.election` (the layout, the rules and the reasons are there).

:class:`ReplicaElection` is a driver: the machine's tasks run one at a time on a thread of its own,
each operation a kazoo call, each kazoo failure thrown into the task as the recipe's kind of error;
watches and timers queue new tasks. The session's SUSPENDED and CONNECTED are handed to
``on_connection`` at once, on kazoo's thread, in the order they happened (a leader fences itself
there); LOST goes to the machine, which steps down and reports it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import queue
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import (
    BadVersionError,
    ConnectionClosedError,
    ConnectionLoss,
    KazooException,
    NodeExistsError,
    NoNodeError,
    OperationTimeoutError,
    SessionExpiredError,
)
from kazoo.protocol.states import WatchedEvent

from zeps.coordination._util import zookeeper_errors
from zeps.errors import CoordinationError
from zeps.paths import StreamPaths, validate_member_id
from zeps.replication import election as recipe
from zeps.replication.election import Election, ReplicaEvent, ReplicationState, Task, recorded_commit

__all__ = [
    "ReplicaElection",
    "ReplicaEvent",
    "ReplicationState",
    "UncleanElection",
    "UncleanElectionError",
    "elect_unclean",
    "mark_stopping",
    "read_replication_state",
    "seed_replication_state",
    "stopping_replicas",
    "unmark_stopping",
]

log = logging.getLogger(__name__)


def seed_replication_state(client: KazooClient, paths: StreamPaths, first: str, *, acl: list[Any] | None = None
                           ) -> bool:  # fmt: skip
    """Name ``first`` the only replica in sync (epoch 0) unless a state exists: a stream of one broker
    growing replicas elects that broker, and the new replicas copy its journal. True if written (with
    ``acl``, the namespace's, on the nodes it makes)."""
    if client.exists(paths.replication_state) is not None:
        return False
    try:
        client.create(paths.replication_state, ReplicationState(0, first, frozenset({first})).encode(), makepath=True,
                      acl=acl)  # fmt: skip
    except NodeExistsError:
        return False
    return True


def mark_stopping(client: KazooClient, paths: StreamPaths, replica: str) -> None:
    """``replica`` stops on purpose (:attr:`StreamPaths.replication_stopped`): replicas of its set that
    hold their own stop do not wait for it."""
    with contextlib.suppress(NodeExistsError):
        client.create(f"{paths.replication_stopped}/{replica}", json.dumps({"at": int(time.time())}).encode(),
                      makepath=True)  # fmt: skip


def unmark_stopping(client: KazooClient, paths: StreamPaths, replica: str) -> None:
    """``replica`` runs again: no longer one that stopped on purpose."""
    with contextlib.suppress(NoNodeError):
        client.delete(f"{paths.replication_stopped}/{replica}")


def stopping_replicas(client: KazooClient, paths: StreamPaths) -> frozenset[str]:
    """The replicas that stopped, or are stopping, on purpose (empty when none ever did)."""
    try:
        return frozenset(client.get_children(paths.replication_stopped))
    except NoNodeError:
        return frozenset()


def read_replication_state(client: KazooClient, paths: StreamPaths) -> ReplicationState | None:
    try:
        data, _ = client.retry(client.get, paths.replication_state)
    except NoNodeError:
        return None
    return ReplicationState.decode(data)


class UncleanElectionError(CoordinationError):
    """An unclean election was refused: the message says why (an in-sync replica runs, the replica
    chosen does not, the state changed meanwhile)."""


@dataclass(frozen=True)
class UncleanElection:
    """What an unclean election did (or, dry, would do): ``replica`` made the only replica in sync of
    ``epoch``, so it leads the next; it holds records up to ``holds``, and the last commit point a
    leader recorded was ``recorded`` (it may have moved on since: :attr:`gives_up` is a floor)."""

    replica: str
    epoch: int
    in_sync_before: frozenset[str]
    holds: int
    recorded: int
    written: bool

    @property
    def gives_up(self) -> int:
        """Confirmed records the election gives up, at least: those beyond what ``replica`` holds."""
        return max(0, self.recorded - self.holds)


@zookeeper_errors
def elect_unclean(client: KazooClient, paths: StreamPaths, replica: str, *, dry_run: bool = False) -> UncleanElection:
    """Make ``replica`` (running, registered) the only replica in sync, so it leads the next epoch,
    when none of the in-sync replicas runs any more (Kafka's ``unclean.leader.election``): the
    stream serves again, and gives up what only they held. Refused while one of them runs (it leads
    once elected: wait for it). ``dry_run``: say what it would give up, write nothing."""
    from zeps.coordination.group import Group  # noqa: PLC0415

    replica = validate_member_id(replica)
    try:
        data, stat = client.retry(client.get, paths.replication_state)
    except NoNodeError:
        raise UncleanElectionError(f"{paths.root} has no replication state: not a replicated stream") from None
    state = ReplicationState.decode(data)
    if state is None:
        raise UncleanElectionError(f"{paths.replication_state} holds no replication state zeps wrote")
    members = Group(client, paths.brokers).members()
    running = sorted(r for r in state.isr if r in members)
    if running:
        raise UncleanElectionError(
            f"in-sync replica(s) {', '.join(running)} run: one of them leads once elected, "
            "losing nothing; an unclean election is for when none of them can come back"
        )
    chosen = members.get(replica)
    if chosen is None:
        raise UncleanElectionError(
            f"replica {replica} is not running (not registered in {paths.brokers.members}): "
            "start it first; an unclean election chooses among the replicas that run"
        )
    facts = chosen.metadata.get("replication")
    holds = facts.get("written") if isinstance(facts, dict) else None
    if not isinstance(holds, int) or isinstance(holds, bool):
        raise UncleanElectionError(
            f"replica {replica} has not published how far its journal goes yet: try again in a second"
        )
    try:
        recorded = recorded_commit(client.retry(client.get, paths.replication_committed)[0])
    except NoNodeError:
        recorded = 0
    report = UncleanElection(replica, state.epoch, state.isr, holds, recorded, written=not dry_run)
    if dry_run:
        return report
    try:
        client.retry(client.set, paths.replication_state,
                     ReplicationState(state.epoch, state.leader, frozenset({replica})).encode(),
                     version=stat.version)  # fmt: skip
    except BadVersionError:
        raise UncleanElectionError(f"{paths.replication_state} changed meanwhile (an election?): look again") from None
    log.warning("unclean election: %s is the only replica in sync of %s (epoch %d; in sync were %s); it gives up "
                "at least %d confirmed records", replica, paths.root, state.epoch, ", ".join(sorted(state.isr)),
                report.gives_up)  # fmt: skip
    return report


#: kazoo's exceptions -> the recipe's kinds (anything else: a plain ZooKeeperError)
_ERRORS: tuple[tuple[Any, type[recipe.ZooKeeperError]], ...] = (
    (NoNodeError, recipe.NoNodeError),
    (NodeExistsError, recipe.NodeExistsError),
    (BadVersionError, recipe.BadVersionError),
    (SessionExpiredError, recipe.SessionExpiredError),
    ((ConnectionLoss, ConnectionClosedError, OperationTimeoutError), recipe.ConnectionLossError),
)


class ReplicaElection:
    """One replica's part in its stream's election, on ``client``; :meth:`start` enters the line."""

    def __init__(self, client: KazooClient, paths: StreamPaths, replica: str,
                 report: Callable[[ReplicaEvent], None], *, acl: list[Any] | None = None,
                 empty: Callable[[], bool] = lambda: False,
                 on_connection: Callable[[str], None] = lambda state: None,
                 preferred: str | None = None,
                 caught_up: Callable[[str], bool] = lambda name: True) -> None:  # fmt: skip
        self.client, self.acl, self.on_connection = client, acl, on_connection
        self.machine = Election(paths, replica, uuid.uuid4().hex[:12], report, empty=empty, preferred=preferred,
                                caught_up=caught_up)  # fmt: skip
        self._tasks: queue.SimpleQueue[Task | None] = queue.SimpleQueue()
        self._worker = threading.Thread(target=self._work, name=f"zeps-election-{replica}", daemon=True)
        self._timers: set[threading.Timer] = set()
        self._lock = threading.Lock()

    def start(self) -> ReplicaElection:
        self.client.add_listener(self._on_session)
        self._tasks.put(self.machine.start())
        self._worker.start()
        return self

    def stop(self) -> None:
        self.client.remove_listener(self._on_session)
        with self._lock:
            for timer in self._timers:
                timer.cancel()
            self._timers.clear()
        self._tasks.put(self.machine.stop())
        self._tasks.put(None)
        self._worker.join(10)

    def write_isr(self, epoch: int, isr: frozenset[str]) -> None:
        """Write the in-sync set of ``epoch`` (in the background); reported as ``isr`` once written."""
        self._tasks.put(self.machine.write_isr(epoch, isr))

    def step_aside(self, epoch: int) -> None:
        """This replica cannot lead ``epoch``: to the back of the line (in the background)."""
        self._tasks.put(self.machine.step_aside(epoch))

    def mark_data(self, epoch: int) -> None:
        """Record that the stream may hold committed records (the leader of ``epoch``; reported as ``isr``)."""
        self._tasks.put(self.machine.mark_data(epoch))

    def record_commit(self, epoch: int, commit: int) -> None:
        """Record the leader's commit point (in the background)."""
        self._tasks.put(self.machine.record_commit(epoch, commit))

    def resign(self, min_insync: int = 0) -> None:
        """Leave the line before stopping (in the background); reported as ``resigned`` or ``stays``."""
        self._tasks.put(self.machine.resign(min_insync))

    # -- running tasks -----------------------------------------------------------------------
    def _work(self) -> None:
        while (task := self._tasks.get()) is not None:
            try:
                self._run(task)
            except recipe.ZooKeeperError as exc:  # a step the recipe let fail: the next event tries again
                log.warning("replica %s: election task ended with %s", self.machine.replica, type(exc).__name__)
            except Exception:
                log.exception("replica %s: election task failed", self.machine.replica)

    def _run(self, task: Task) -> None:
        recipe.drive(task, self._execute_mapped)

    def _execute_mapped(self, op: recipe.Op) -> Any:
        """:meth:`_execute`, kazoo's exceptions mapped to the recipe's kinds."""
        try:
            return self._execute(op)
        except KazooException as exc:
            raise next((kind(str(exc)) for cls, kind in _ERRORS if isinstance(exc, cls)),
                       recipe.ZooKeeperError(f"{type(exc).__name__}: {exc}")) from exc  # fmt: skip

    def _execute(self, op: recipe.Op) -> Any:
        client = self.client
        match op:
            case recipe.Create(path, data, ephemeral, sequence, makepath):
                return client.create(path, data, ephemeral=ephemeral, sequence=sequence, makepath=makepath,
                                     acl=self.acl)  # fmt: skip
            case recipe.Get(path, watch):
                data, stat = client.get(path, watch=self._watcher(watch))
                return data, stat.version
            case recipe.Set(path, data, version):
                client.set(path, data, version=version)
                return None
            case recipe.GetChildren(path, watch):
                return client.get_children(path, watch=self._watcher(watch))
            case recipe.Exists(path, watch):
                return client.exists(path, watch=self._watcher(watch)) is not None
            case recipe.Delete(path):
                client.delete(path)
                return None
            case recipe.Schedule(delay, name, arg):
                self._later(delay, name, arg)
                return None
        raise AssertionError(f"unknown operation {op!r}")

    def _watcher(self, name: str | None) -> Callable[[WatchedEvent], None] | None:
        if name is None:
            return None
        return lambda _event: self._tasks.put(self.machine.watched(name))

    def _later(self, delay: float, name: str, arg: Any) -> None:
        def fire() -> None:
            with self._lock:
                self._timers.discard(timer)
            self._tasks.put(self.machine.timer(name, arg))

        timer = threading.Timer(delay, fire)
        timer.daemon = True
        with self._lock:
            self._timers.add(timer)
        timer.start()

    def _on_session(self, state: str) -> bool:
        """kazoo's thread: the connection's news goes to the broker at once, the session's to the machine."""
        if state == KazooState.SUSPENDED:
            self.on_connection("suspended")
            self._tasks.put(self.machine.session("suspended"))
        elif state == KazooState.LOST:
            self.on_connection("lost")
            self._tasks.put(self.machine.session("lost"))
        elif state == KazooState.CONNECTED:
            self.on_connection("connected")
            self._tasks.put(self.machine.session("connected"))
        return False

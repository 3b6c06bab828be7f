"""Who leads a replicated stream, in which epoch, with which in-sync replicas (ZooKeeper recipes).

Layout (:class:`zeps.paths.StreamPaths`)::

    <stream>/replication/state                   persistent JSON {"version": 1, "epoch", "leader", "isr"}
    <stream>/replication/election/<replica>-<n>  ephemeral sequential: the replicas in line to lead

* **Election**, the ZooKeeper recipe without a herd: each replica creates an ephemeral sequential
  node and watches only the node just before its own; when that one goes, it looks again. The first
  in line leads if it is *eligible*: in the in-sync set the state holds (or no state exists yet: a
  new stream). An ineligible first steps to the back of the line, once the line changes (a replica
  that was in sync may have come back), so it never blocks one that may lead.
* **Epoch and fencing**: the new leader writes the state with ``epoch + 1`` by a conditional write
  (the version it read), so two replicas can never lead the same epoch; it drops the old leader (its
  node is gone) from the in-sync set. The in-sync set changes only by the leader of the state's epoch,
  by a conditional write too (:meth:`ReplicaElection.write_isr`).
* **Sessions**: SUSPENDED (the connection dropped; the session, and leadership, may still live) is
  reported at once, so a leader stops confirming before its session can expire and another be
  elected; a session that comes back is RESUMED; LOST (expired) makes the replica step down and
  take a place at the back of the line with its next session.

Everything is reported through one callback, from kazoo's threads, as :class:`ReplicaEvent`; the
broker's loop acts on them in order.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import BadVersionError, KazooException, NodeExistsError, NoNodeError
from kazoo.protocol.states import WatchedEvent, ZnodeStat

from zeps.paths import StreamPaths, validate_member_id

__all__ = ["ReplicaElection", "ReplicaEvent", "ReplicationState", "read_replication_state", "seed_replication_state"]

log = logging.getLogger(__name__)

STATE_VERSION = 1


@dataclass(frozen=True)
class ReplicationState:
    epoch: int
    leader: str
    isr: frozenset[str]

    def encode(self) -> bytes:
        body = {"version": STATE_VERSION, "epoch": self.epoch, "leader": self.leader, "isr": sorted(self.isr)}
        return json.dumps(body, sort_keys=True).encode()

    @classmethod
    def decode(cls, data: bytes) -> ReplicationState | None:
        """The state in a node's data; None (logged) if it is not one (a node written by someone else)."""
        try:
            raw = json.loads(data)
            state = cls(int(raw["epoch"]), validate_member_id(str(raw["leader"])),
                        frozenset(validate_member_id(str(r)) for r in raw["isr"]))  # fmt: skip
        except (ValueError, TypeError, KeyError) as exc:
            log.error("replication state %r is not valid (%s): ignored", data[:200], exc)
            return None
        return state


@dataclass(frozen=True)
class ReplicaEvent:
    """``lead``: this replica leads ``epoch`` with in-sync set ``isr``; ``follow``: ``leader`` leads
    ``epoch`` (or nobody yet: empty); ``isr``: the in-sync set of ``epoch`` is written; ``suspended``,
    ``resumed``, ``lost``: this replica's ZooKeeper session."""

    kind: Literal["lead", "follow", "isr", "suspended", "resumed", "lost"]
    epoch: int = 0
    leader: str = ""
    isr: frozenset[str] = frozenset()


def seed_replication_state(client: KazooClient, paths: StreamPaths, first: str) -> bool:
    """Name ``first`` the only replica in sync (epoch 0) unless a state exists: a stream of one broker
    growing replicas elects that broker, and the new replicas copy its journal. True if written."""
    if client.exists(paths.replication_state) is not None:
        return False
    try:
        client.create(paths.replication_state, ReplicationState(0, first, frozenset({first})).encode(), makepath=True)
    except NodeExistsError:
        return False
    return True


def read_replication_state(client: KazooClient, paths: StreamPaths) -> ReplicationState | None:
    try:
        data, _ = client.retry(client.get, paths.replication_state)
    except NoNodeError:
        return None
    return ReplicationState.decode(data)


class ReplicaElection:
    """One replica's part in its stream's election; :meth:`start` enters the line."""

    def __init__(self, client: KazooClient, paths: StreamPaths, replica: str,
                 report: Callable[[ReplicaEvent], None], *, acl: list[Any] | None = None,
                 empty: Callable[[], bool] = lambda: False) -> None:  # fmt: skip
        self.client, self.paths, self.replica, self.report = client, paths, validate_member_id(replica), report
        self.acl = acl
        #: whether this replica's journal holds nothing (a new or wiped volume): it may not lead a stream
        #: that has had a leader, and it leaves the in-sync set at start if ZooKeeper still lists it
        self.empty = empty
        self.node: str | None = None  # our place in line (its name)
        self.led: int = 0  # the epoch this replica leads (0: none)
        self._followed: tuple[int, str] | None = None
        self._lock = threading.RLock()
        self._stopped = False
        self._lost = False

    def start(self) -> ReplicaElection:
        self.client.ensure_path(self.paths.election)
        if self.empty():
            self._leave_isr()
        self.client.add_listener(self._on_session)
        self.client.DataWatch(self.paths.replication_state, self._state_changed)
        self.client.handler.spawn(self.check)
        return self

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
            self.client.remove_listener(self._on_session)
            if self.node is not None and self.client.connected:
                with contextlib.suppress(KazooException):
                    self.client.delete(f"{self.paths.election}/{self.node}")

    # -- the line ---------------------------------------------------------------------------
    def check(self) -> None:
        """Where are we in line: first (lead, if eligible), or watch the one before us."""
        try:
            with self._lock:
                if self._stopped:
                    return
                for _ in range(10):  # bounded: each turn either settles or saw the line change under it
                    if self._check_once():
                        return
        except KazooException as exc:  # the session went: LOST puts us back in line with the next one
            log.warning("replica %s: election step failed (%s); trying again when the session is back",
                        self.replica, exc)  # fmt: skip

    def _check_once(self) -> bool:
        if self.node is None:
            path = self.client.create(f"{self.paths.election}/{self.replica}-", b"", ephemeral=True, sequence=True,
                                      acl=self.acl)  # fmt: skip
            self.node = path.rsplit("/", 1)[1]
        line = sorted(self.client.get_children(self.paths.election), key=lambda n: n.rsplit("-", 1)[-1])
        if self.node not in line:  # our session lost it: a new place at the back
            self.node = None
            return False
        i = line.index(self.node)
        if i > 0:
            before = f"{self.paths.election}/{line[i - 1]}"
            return self.client.exists(before, watch=self._predecessor_gone) is not None
        return self._first()

    def _predecessor_gone(self, _event: WatchedEvent) -> None:
        self.client.handler.spawn(self.check)

    def _first(self) -> bool:
        """First in line: take the lead with a new epoch, if eligible; else step back when the line changes."""
        try:
            data, stat = self.client.get(self.paths.replication_state)
            state = ReplicationState.decode(data)
        except NoNodeError:
            state, stat = None, None
        if state is not None and self.led and state.leader == self.replica and state.epoch == self.led:
            return True  # leading already (a seeded state names us in epoch 0: we take epoch 1)
        why = None
        if state is not None and self.empty():
            why = "its journal is empty and the stream had leaders"
        elif state is not None and self.replica not in state.isr:
            why = f"it is not in sync ({', '.join(sorted(state.isr))})"
        if why is not None:  # ineligible: never in the way of one that may lead
            line = self.client.get_children(self.paths.election, watch=self._step_back)
            behind = len(line) > 1
            log.info("replica %s: first in line, but %s; stepping back %s", self.replica, why,
                     "behind the others" if behind else "when the line changes")  # fmt: skip
            if behind:  # after a second: ineligible replicas taking turns at the front do not spin
                self.client.handler.spawn(self._requeue, self.node, 1.0)
            return True
        epoch = (state.epoch if state else 0) + 1
        isr = ((state.isr - {state.leader}) if state else frozenset()) | {self.replica}
        new = ReplicationState(epoch, self.replica, isr)
        try:
            if stat is None:
                self.client.create(self.paths.replication_state, new.encode(), makepath=True, acl=self.acl)
            else:
                self.client.set(self.paths.replication_state, new.encode(), version=stat.version)
        except (BadVersionError, NodeExistsError):
            return False  # someone wrote it meanwhile: look again
        self.led = epoch
        log.info("replica %s leads epoch %d (in sync: %s)", self.replica, epoch, ", ".join(sorted(isr)))
        self.report(ReplicaEvent("lead", epoch, self.replica, isr))
        return True

    def _step_back(self, _event: WatchedEvent) -> None:
        self.client.handler.spawn(self._requeue, self.node, 0.0)

    def _requeue(self, node: str | None, delay: float) -> None:
        """Leave our place ``node`` in line (if it is still ours) for one at the back."""
        time.sleep(delay)
        with self._lock:
            if self._stopped or self.node is None or self.node != node or self.led:
                return
            try:
                self.client.delete(f"{self.paths.election}/{self.node}")
            except NoNodeError:
                pass
            except KazooException:
                return
            self.node = None
        self.check()

    # -- the in-sync set --------------------------------------------------------------------
    def _leave_isr(self) -> None:
        """Take this replica out of the in-sync set (a conditional write: the one change any replica may
        make, and only to itself): it lost its journal, so it must not be elected as if it held it."""
        for _ in range(5):
            try:
                data, stat = self.client.get(self.paths.replication_state)
            except NoNodeError:
                return
            state = ReplicationState.decode(data)
            if state is None or self.replica not in state.isr:
                return
            log.warning("replica %s: its journal is empty but the in-sync set lists it; leaving the set", self.replica)
            try:
                self.client.set(self.paths.replication_state,
                                ReplicationState(state.epoch, state.leader, state.isr - {self.replica}).encode(),
                                version=stat.version)  # fmt: skip
                return
            except BadVersionError:
                continue

    def write_isr(self, epoch: int, isr: frozenset[str]) -> None:
        """Write the in-sync set of ``epoch`` (in the background); reported as ``isr`` once written.
        Not written if this replica no longer leads that epoch."""
        self.client.handler.spawn(self._write_isr, epoch, isr | {self.replica})

    def _write_isr(self, epoch: int, isr: frozenset[str]) -> None:
        for _ in range(5):
            try:
                data, stat = self.client.get(self.paths.replication_state)
                state = ReplicationState.decode(data)
                if state is None or state.epoch != epoch or state.leader != self.replica:
                    return  # fenced: a newer epoch
                self.client.set(self.paths.replication_state, ReplicationState(epoch, self.replica, isr).encode(),
                                version=stat.version)  # fmt: skip
            except BadVersionError:
                continue
            except KazooException as exc:
                log.warning("replica %s: could not write the in-sync set (%s)", self.replica, exc)
                return
            self.report(ReplicaEvent("isr", epoch, self.replica, isr))
            return

    # -- watches ----------------------------------------------------------------------------
    def _state_changed(self, data: bytes | None, _stat: ZnodeStat | None) -> bool | None:
        if self._stopped:
            return False
        state = ReplicationState.decode(data) if data else None
        if state is None:
            return None
        if state.leader == self.replica and state.epoch == self.led:
            return None
        if state.leader != self.replica or state.epoch > self.led:
            if self.led:
                log.warning("replica %s: epoch %d was taken by %s; stepping down", self.replica, state.epoch,
                            state.leader)  # fmt: skip
                self.led = 0
            leader = state.leader if state.leader != self.replica else ""  # our own, from before a restart
            if self._followed != (state.epoch, leader):
                self._followed = (state.epoch, leader)
                self.report(ReplicaEvent("follow", state.epoch, leader, state.isr))
        return None

    def _rejoin(self) -> None:
        """A new session after LOST: a place in line again, and whoever leads now is followed."""
        self.check()
        try:
            data, stat = self.client.get(self.paths.replication_state)
        except KazooException:
            return
        with self._lock:
            self._state_changed(data, stat)

    def _on_session(self, state: str) -> bool:
        if self._stopped:
            return True
        if state == KazooState.SUSPENDED:
            self.report(ReplicaEvent("suspended", self.led))
        elif state == KazooState.LOST:
            self._lost = True
            self.node, self.led, self._followed = None, 0, None
            self.report(ReplicaEvent("lost"))
        elif state == KazooState.CONNECTED:
            if self._lost:
                self._lost = False
                self.client.handler.spawn(self._rejoin)
            else:
                self.report(ReplicaEvent("resumed", self.led))
        return False

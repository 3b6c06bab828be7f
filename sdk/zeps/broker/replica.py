"""One replica of a replicated stream, without sockets: what the election's news, the leader's frames
and the passing of time do to the broker's core and to the peering with the leader.

The adapter (:mod:`zeps.broker.server`) runs it on ZeroMQ and ZooKeeper; the deterministic
simulation (``tests/simulation``) runs the same object on a simulated network and ZooKeeper. It takes
``now`` and returns actions (:class:`Connect`, :class:`Send`, :class:`Close`, :class:`WriteIsr`);
the core (:class:`zeps.broker.core.BrokerCore`) does the leader's side of each peering (REPLICA-FETCH
in, REPLICA-DATA out) through the adapter's ROUTER like any other peer's frames.

* ``lead``: the core leads the epoch (:meth:`BrokerCore.lead`); a peering with an old leader closes.
* ``follow``: the core follows (its clients are sent to the leader); the adapter is asked to reach
  the leader (:class:`Connect`: its endpoint is in its member node, read off the broker's loop),
  and once it did, a :class:`~zeps.replication.follower.FollowerCopy` attaches and copies.
* A peering that the leader refused, or from which nothing came for ``leader_silence_s``, is closed
  and tried again 0.3 s later; a leader that cannot be reached yet (not registered) likewise.
* ``isr``: what ZooKeeper holds for the leader's epoch reaches its :class:`Leadership`; the sets the
  leader wants are asked for (:class:`WriteIsr`) every ``isr_check_s``, as is, on a stream that never
  held data, the state's ``data`` before the first record is committed (:class:`MarkData`); its commit
  point is recorded (:class:`RecordCommit`) every ``record_commit_s`` when it moved.
* ``lost`` (the session expired): no longer leading or following until the election says again.
* ``give-way``: the leadership leaves its lead to the preferred replica (:mod:`zeps.replication.election`)
  and confirms nothing until the next epoch's ``follow`` (or ``kept``: no one took it).
* A ``lead`` whose epoch the journal cannot begin because its volume is full (the epoch history is
  a file): the broker stays up and does not lead; the election is asked to step this replica aside
  (:class:`StepAside`), so another in-sync replica takes the next epoch. If none does (``kept``), it
  tries to begin the epoch again after ``RETRY_FULL_S``, and steps aside again if it still cannot.
* **Fencing**: the adapter tells :meth:`ReplicaNode.connection` the session's news at once, on the
  session's own thread, in order. A leadership confirms nothing while the connection is down, and
  nothing ever again once the session that elected it expired (a new one starts a new leadership).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from zeps.broker.core import BrokerCore
from zeps.errors import ProtocolError
from zeps.journal import JournalError, JournalWriteError
from zeps.replication.election import ReplicaEvent
from zeps.replication.follower import FollowerCopy

__all__ = [
    "Close",
    "Connect",
    "MarkData",
    "RecordCommit",
    "ReplicaNode",
    "ReplicaSettings",
    "Send",
    "StepAside",
    "WriteIsr",
]

log = logging.getLogger(__name__)

RETRY_FOLLOW_S = 0.3  #: a peering that failed is tried again after this
#: a follower whose volume is full tries again after this: it stays up, out of the in-sync set, and
#: catches up once there is space (its leader goes on with the others)
RETRY_FULL_S = 2.0


@dataclass(frozen=True)
class ReplicaSettings:
    min_insync: int  #: replicas (the leader included) that must hold a record durably before it is confirmed
    lag_s: float = 10.0  #: a follower that has not caught up for this long leaves the in-sync set
    heartbeat_s: float = 0.5  #: a follower hears from the leader at least this often
    leader_silence_s: float = 3.0  #: a follower that heard nothing this long connects again
    isr_check_s: float = 0.1  #: how often the leader looks at its in-sync set
    record_commit_s: float = 5.0  #: how often the leader records its commit point in ZooKeeper (if it moved)


@dataclass(frozen=True)
class Connect:
    """Reach ``leader`` (of ``epoch``) and call :meth:`ReplicaNode.linked` (or :meth:`ReplicaNode.unreachable`)."""

    epoch: int
    leader: str


@dataclass(frozen=True)
class Send:
    """Send ``frame`` to the leader over the peering."""

    frame: bytes


@dataclass(frozen=True)
class Close:
    """Close the peering with the leader."""


@dataclass(frozen=True)
class WriteIsr:
    """Write the in-sync set ``isr`` of ``epoch`` to ZooKeeper (the election's conditional write)."""

    epoch: int
    isr: frozenset[str]


@dataclass(frozen=True)
class MarkData:
    """Record in ZooKeeper's state that the stream may hold committed records (the election's
    conditional write, for the leader of ``epoch``), before the leader first commits one."""

    epoch: int


@dataclass(frozen=True)
class StepAside:
    """This replica cannot lead ``epoch`` (its volume is full): step to the back of the election's line,
    so that the next in-sync replica takes the lead (the election's ``kept`` if none does)."""

    epoch: int


@dataclass(frozen=True)
class RecordCommit:
    """Record the leader's commit point in ZooKeeper (what an unclean election would give up)."""

    epoch: int
    commit: int


Action = Connect | Send | Close | WriteIsr | MarkData | RecordCommit | StepAside


@dataclass
class _Peering:
    epoch: int
    leader: str
    copy: FollowerCopy | None = None  # None while the adapter reaches the leader
    heard: float = 0.0


class ReplicaNode:
    """The replica ``me`` of ``stream`` served by ``core`` (single-threaded, but :meth:`connection`)."""

    def __init__(self, core: BrokerCore, stream: str, me: str, settings: ReplicaSettings) -> None:
        self.core, self.stream, self.me, self.settings = core, stream, me, settings
        self.peering: _Peering | None = None
        self.again: tuple[float, int, str] | None = None  #: (when, epoch, leader): a follow to try again
        self.following: tuple[int, str] | None = None  #: the epoch and leader the election last named
        self._last_isr_check = float("-inf")
        self._recorded: tuple[float, int] = (float("-inf"), 0)  # (when, commit) last recorded
        #: since when this follower's journal volume is full (None: it is not), and when that was last logged
        self.full_since: float | None = None
        self._full_logged = float("-inf")
        self._handshake_logged = float("-inf")  # when a failed handshake with the leader was last logged
        # the session's state, written by the session's thread (plain attributes: one store each)
        self._connected = True
        self._sessions_lost = 0
        self._lead_session = -1  # the count of expired sessions when this broker began leading
        #: a controlled shutdown (:meth:`resign`): asked (from another thread), then what the election did
        self._resigning = False
        self.handover: str | None = None  #: None, then "resigned" (out of line) or "stays" (leads on)
        self.resigned_epoch = 0  #: the epoch it led when it resigned (0: it followed)
        #: the epoch whose lead it leaves to the preferred replica (0: none): it confirms nothing meanwhile
        self.giving_way = 0
        #: a ``lead`` the journal could not begin (its volume full), and when to try it again (None: once
        #: the election says ``kept``): this replica leads nothing meanwhile
        self.unled: ReplicaEvent | None = None
        self._lead_again: float | None = None
        self._now = float("-inf")  # the latest turn's time

    def caught_up(self, follower: str) -> bool:
        """Whether ``follower`` held, at a fetch within the last second of this replica's turns, all
        that this leader held at its fetch before (False when not leading). Read from the election's
        thread: plain reads of what the loop writes, a hint for handing the lead over, never safety."""
        leader = self.core.streams[self.stream].leader
        f = leader.followers.get(follower) if leader is not None else None
        return f is not None and self._now - f.caught_up < 1.0

    @property
    def leaderless(self) -> bool:
        """This replica knows no leader: it does not lead, and the election named nobody (or nothing yet)."""
        return self.core.streams[self.stream].leader is None and (self.following is None or not self.following[1])

    # -- the session (from its own thread) --------------------------------------------------
    def connection(self, state: str) -> None:
        """``suspended``, ``lost`` or ``connected``: called at once, in order, from the session's thread."""
        if state == "lost":
            self._sessions_lost += 1
        self._connected = state == "connected"
        leader = self.core.streams[self.stream].leader
        if leader is not None and state != "connected":
            leader.fenced = True  # at once: the loop may be between two confirmations

    def resign(self) -> None:
        """A controlled shutdown begins (called from another thread, before the election is asked to
        resign): a leadership stops confirming at once, as for a suspended session, so that nothing
        is confirmed that the next leader, elected once this replica leaves the line, may not hold."""
        self._resigning = True
        leader = self.core.streams[self.stream].leader
        if leader is not None:
            leader.fenced = True

    @property
    def peered_off(self) -> bool:
        """Resigning, and no longer fetching from a leader (the loop's turn closed the peering)."""
        return self._resigning and self.peering is None and self.again is None

    @property
    def handed_over(self) -> bool:
        """The controlled shutdown is done: out of line, and another replica leads the epoch after the
        one this replica led (its clients told NOT_LEADER), or it led nothing; or it could not resign."""
        if self.handover == "stays":
            return True
        if self.handover != "resigned":
            return False
        return not self.resigned_epoch or (
            self.following is not None and self.following[0] > self.resigned_epoch and bool(self.following[1])
        )

    # -- the election's news ----------------------------------------------------------------
    def event(self, event: ReplicaEvent, now: float) -> list[Action]:
        core, name = self.core, self.stream
        if event.kind != "isr":
            self.giving_way = event.epoch if event.kind == "give-way" else 0
        unled = self.unled
        if event.kind not in ("isr", "kept"):
            self.unled, self._lead_again = None, None
        if event.kind == "kept" and unled is not None and unled.epoch == event.epoch:
            self._lead_again = now + RETRY_FULL_S  # no one else took the lead: this replica tries again
            return []
        if event.kind in ("give-way", "kept"):  # fenced while the preferred replica takes the lead, or again not
            self._fence()
            return []
        if event.kind == "lead":
            out = self._close()
            self.following = None
            self._lead_session = self._sessions_lost
            return out + self._lead(event, now)
        if event.kind == "follow":
            self.following = (event.epoch, event.leader)
            return self._follow(event.epoch, event.leader)
        if event.kind == "isr":
            if unled is not None and unled.epoch == event.epoch:  # the set the lead begins with, when it can
                self.unled = ReplicaEvent("lead", event.epoch, self.me, event.isr, unled.data or event.data)
            core.isr_written(name, event.epoch, event.isr, data=event.data)
            return []
        if event.kind == "resigned":
            self.handover, self.resigned_epoch = "resigned", event.epoch
            return []
        if event.kind == "stays":  # no replica in sync to hand over to: it confirms again until it stops
            self.handover, self._resigning = "stays", False
            self._fence()
            return []
        # lost: the session expired; the next one's election says what to do
        log.warning("stream %s: ZooKeeper session expired: no longer leading or following", name)
        self.following = None
        out = self._close()
        core.follow(name)
        return out

    # -- the peering ------------------------------------------------------------------------
    def linked(self, epoch: int, leader: str, now: float) -> list[Action]:
        """The adapter reached ``leader``: the copy attaches."""
        p = self.peering
        if p is None or p.copy is not None or (p.epoch, p.leader) != (epoch, leader):
            return [Close()]  # a peering asked for earlier, no longer wanted
        p.copy = FollowerCopy(self.core.streams[self.stream].journal, self.stream, self.me, epoch)
        p.heard = now
        log.info("stream %s: following %s (epoch %d)", self.stream, leader, epoch)
        return [Send(frame) for frame in p.copy.start()]

    def unreachable(self, epoch: int, leader: str, now: float) -> list[Action]:
        """``leader`` has no endpoint yet (it has not registered, or is gone): try again soon."""
        p = self.peering
        if p is not None and p.copy is None and (p.epoch, p.leader) == (epoch, leader):
            return self._retry(now)
        return []

    def link_failed(self, now: float) -> list[Action]:
        """The adapter's peering with the leader failed its handshake (CURVE: the leader serves another
        key than the one tried, a rotation under way): closed and tried again soon, with the next key."""
        p = self.peering
        if p is None or p.copy is None:
            return []
        if now - self._handshake_logged >= 60:  # tried again every 0.3 s: said once a minute
            self._handshake_logged = now
            log.warning("stream %s: the leader %s did not complete the CURVE handshake (another key): trying the "
                        "next key the stream has", self.stream, p.leader)  # fmt: skip
        return self._retry(now)

    def frames(self, frames: list[bytes], now: float) -> list[Action]:
        """Frames from the leader over the peering."""
        p = self.peering
        if p is None or p.copy is None:
            return []
        out: list[Action] = []
        copy = p.copy
        journal = self.core.streams[self.stream].journal
        for frame in frames:
            written = journal.written
            try:
                answers = copy.receive(frame)
            except JournalWriteError as exc:
                if not exc.space:
                    raise  # a broken disk: fatal
                # a full volume: the journal undid the append; nothing is acknowledged, so the leader
                # leaves this replica out of the in-sync set once it lags (never counted meanwhile)
                self.full_since = now if self.full_since is None else self.full_since
                copy.refused = f"its volume is full ({exc})"
                break
            except (ProtocolError, JournalError) as exc:
                copy.refused = f"{type(exc).__name__}: {exc}"
                break
            out += [Send(answer) for answer in answers]
            self.core.copied(self.stream, copy.commit)
            if self.full_since is not None and journal.written > written:
                log.warning("stream %s: the journal's volume takes appends again after %.0fs full", self.stream,
                            now - self.full_since)  # fmt: skip
                self.full_since = None
        p.heard = now
        return out

    def turn(self, now: float) -> list[Action]:
        """Time passing: a follow or a lead to try again, a silent or refusing leader, the in-sync set to
        ask for."""
        self._now = now
        self._fence()
        out: list[Action] = []
        if self.unled is not None and self._lead_again is not None and now >= self._lead_again:
            self._lead_again = None
            out += self._lead(self.unled, now)
        if self._resigning and (self.peering is not None or self.again is not None):
            out += self._close()  # stopping: it fetches no more (its leader may drop it from the set at once)
        if self.again is not None and now >= self.again[0]:
            _, epoch, leader = self.again
            self.again = None
            out += self._follow(epoch, leader)
        p = self.peering
        if p is not None and p.copy is not None:
            silent = now - p.heard
            if p.copy.refused or silent > self.settings.leader_silence_s:
                why = p.copy.refused or f"nothing from the leader for {silent:.1f}s"
                full = self.full_since is not None
                if not full or now - self._full_logged >= 60:  # a full volume: said once a minute
                    self._full_logged = now if full else self._full_logged
                    log.warning("stream %s: following again (%s)", self.stream, why)
                out += self._retry(now, RETRY_FULL_S if full else RETRY_FOLLOW_S)
        if now - self._last_isr_check >= self.settings.isr_check_s:
            self._last_isr_check = now
            out += [WriteIsr(epoch, isr) for _, epoch, isr in self.core.isr_requests(now)]
            out += [MarkData(epoch) for _, epoch in self.core.data_requests(now)]
        leadership = self.core.streams[self.stream].leader
        when, recorded = self._recorded
        if leadership is not None and leadership.commit > recorded and now - when >= self.settings.record_commit_s:
            self._recorded = (now, leadership.commit)
            out.append(RecordCommit(leadership.epoch, leadership.commit))
        return out

    # -- inside ----------------------------------------------------------------------------
    def _lead(self, event: ReplicaEvent, now: float) -> list[Action]:
        """The core leads ``event``'s epoch; if its journal cannot begin the epoch for lack of space,
        it leads nothing and the election is asked to step aside (a broken disk is fatal)."""
        s = self.settings
        try:
            self.core.lead(self.stream, me=self.me, epoch=event.epoch, isr=event.isr, min_insync=s.min_insync,
                           now=now, data=event.data, lag_s=s.lag_s, heartbeat_s=s.heartbeat_s)  # fmt: skip
        except JournalWriteError as exc:
            if not exc.space:
                raise
            if self.unled is None:  # retried every RETRY_FULL_S while alone in line: said once
                log.warning("stream %s: elected for epoch %d, but cannot begin it (%s): stepping aside for "
                            "another in-sync replica", self.stream, event.epoch, exc)  # fmt: skip
            self.unled = event
            return [StepAside(event.epoch)]
        if self.unled is not None:
            log.warning("stream %s: the journal's volume takes writes again: leading epoch %d", self.stream,
                        event.epoch)  # fmt: skip
        self.unled = None
        self._fence()
        return []

    def _fence(self) -> None:
        leader = self.core.streams[self.stream].leader
        if leader is not None:
            leader.fenced = (self._resigning or bool(self.giving_way) or not self._connected
                             or self._lead_session != self._sessions_lost)  # fmt: skip

    def _follow(self, epoch: int, leader: str) -> list[Action]:
        out = self._close()
        self.core.follow(self.stream)
        if not leader or self._resigning:
            return out  # an election is on (the next event says who won), or it is stopping
        self.peering = _Peering(epoch, leader)
        return [*out, Connect(epoch, leader)]

    def _retry(self, now: float, after: float = RETRY_FOLLOW_S) -> list[Action]:
        p = self.peering
        assert p is not None
        out = self._close()
        self.again = (now + after, p.epoch, p.leader)
        return out

    def _close(self) -> list[Action]:
        """End the peering with the leader, and forget a follow waiting to be tried again (a leader
        must not step down for a retry left from before its election)."""
        had = self.peering is not None
        self.peering, self.again = None, None
        return [Close()] if had else []

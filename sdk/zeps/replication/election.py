"""Who leads a replicated stream, in which epoch, with which in-sync replicas: the ZooKeeper leader
election recipe as a state machine without I/O.

Layout (:class:`zeps.paths.StreamPaths`)::

    <stream>/replication/state                           persistent JSON {"version": 1, "epoch", "leader", "isr",
                                                         "data"}
    <stream>/replication/election/<replica>~<run>-<n>    ephemeral sequential: the replicas in line to lead
    <stream>/replication/committed                       persistent JSON {"epoch", "commit"}: the leader's
                                                         commit point, recorded every few seconds

* **Election**, the ZooKeeper recipe without a herd: each replica creates an ephemeral sequential
  node and watches only the node just before its own; when that one goes, it looks again. The first
  in line leads if it is *eligible*: once the stream may hold committed records (``data``), in the
  in-sync set the state holds and not empty; before that (or with no state yet: a new stream), any.
  An ineligible first steps to the back of the line, once the line changes (a replica that was in
  sync may have come back), so it never blocks one that may lead.
* **Data**: the state's ``data`` says whether anything may have been committed. A new stream starts
  without (``false``); its leader sets it (:meth:`Election.mark_data`, conditional on its epoch) before
  it first counts a record committed, and it never goes back (a state without it counts as ``true``).
  Until then an empty replica (a new or wiped volume, or one that lost its unsynced bytes) loses
  nothing by leading and stays in the in-sync set, so a stream that never held data is never left
  with no replica that may lead (every replica restarted empty, its first leader gone before a
  follower joined).
* **Epoch and fencing**: the new leader writes the state with ``epoch + 1`` by a conditional write
  (the version it read), so two replicas can never lead the same epoch. It drops the old leader from
  the in-sync set if that one is out of line (dead, or stopping); one still in line stepped aside for
  the preferred replica and holds everything committed, so it stays: were it dropped, the new
  leader's loss before it rejoined would leave no replica that may lead. The in-sync set changes
  only by the leader of the state's epoch, by a conditional write too (:meth:`Election.write_isr`).
* **Ambiguous operations**: a ZooKeeper call that fails with a lost connection may have been applied.
  Node names carry this run's id (``<replica>~<run>-``, Curator's protected mode), so a create
  whose answer was lost finds its node instead of making a second (a node of ours other than the
  one we hold is a leftover, and deleted); a state write whose answer was lost is read back (the
  state names us in the epoch we wrote, or it does not).
* **Retries**: an election step that fails while the session lives is tried again with a growing
  backoff (never left waiting for a watch that was not set); an in-sync set write that fails is
  asked again by the leader (:attr:`zeps.replication.isr.Leadership.wanted`).
* **Preferred leader** (Kafka's preferred-leader election): a stream may name the replica that should
  lead while it is in sync (the operator names one per partition, so leaderships spread over the
  pods). Every few seconds each other replica looks whether it stands before that one in line
  while it is in the in-sync set, twice in a row: a follower then steps to the back of the line; a
  leader with the preferred replica next in line gives the lead to it (reported ``give-way``: the
  broker stops confirming, as in a controlled shutdown's hand-over) and steps to the back too (its
  new place made before it leaves the old one, so it is always seen in line), so the preferred
  replica takes the next epoch, and the old leader follows it, in sync. If no one took the
  lead, the old one finds itself first again, leading the same epoch (reported ``kept``: it
  confirms again). After a roll or a failover, the lead so goes back where it belongs.
* **Stepping aside**: a replica elected while its broker cannot lead (its volume is full, so the
  epoch cannot be begun) steps to the back the same way (:meth:`Election.step_aside`), in sync, so
  the next in-sync replica takes the lead; first again, it is told ``kept`` and its broker tries again.
* **Sessions**: LOST (expired) makes the replica step down and take a place at the back of the line
  with its next session. SUSPENDED (the connection dropped; the session, and leadership, may still
  live) is the driver's to tell the broker at once, on the session's own thread, so a leader stops
  confirming before its session can expire and another be elected (:mod:`zeps.broker.replica`).

The machine speaks in *tasks*: generators that yield ZooKeeper operations (:class:`Create`,
:class:`Get`, …) and receive their results, or have the failure (:class:`ZooKeeperError` and its
kinds) thrown in. A driver runs one task of a machine at a time, in order: the kazoo driver
(:mod:`zeps.coordination.replication`) on a thread of its own, the simulation
(``tests/simulation``) one operation per step. Watches and timers come back as new tasks
(:meth:`Election.watched`, :meth:`Election.timer`); what the broker must know comes out through
``report`` as :class:`ReplicaEvent`, in order.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any, Literal

from zeps import _json as bounded_json
from zeps.errors import ConfigError
from zeps.paths import StreamPaths, validate_member_id

__all__ = [
    "BadVersionError",
    "ConnectionLossError",
    "Create",
    "Delete",
    "Election",
    "Exists",
    "Get",
    "GetChildren",
    "NoNodeError",
    "NodeExistsError",
    "Op",
    "ReplicaEvent",
    "ReplicationState",
    "Schedule",
    "SessionExpiredError",
    "Set",
    "Task",
    "ZooKeeperError",
    "drive",
    "election_node",
    "election_replica",
    "recorded_commit",
]

log = logging.getLogger(__name__)

STATE_VERSION = 1
MAX_STATE_BYTES = 64 << 10  #: a state node larger than this is not one (someone else wrote it)
BACKOFF_S = (0.2, 0.5, 1.0, 2.0, 5.0)  #: an election step that failed is tried again after these
REQUEUE_S = 1.0  #: an ineligible replica first in line, with others behind it, steps back after this
PREFER_CHECK_S = 5.0  #: how often a replica looks whether it stands in the preferred replica's way
#: it steps aside once that many looks in a row found the preferred replica in sync and behind it
#: (so a replica just back in the set gets a few seconds first)
PREFER_CHECKS = 2


# -- ZooKeeper operations and their failures (what a driver executes) -----------------------------
@dataclass(frozen=True)
class Create:
    path: str
    data: bytes = b""
    ephemeral: bool = False
    sequence: bool = False
    makepath: bool = False


@dataclass(frozen=True)
class Get:
    """-> (data, version); a watch named ``watch`` fires :meth:`Election.watched` once on a change."""

    path: str
    watch: str | None = None


@dataclass(frozen=True)
class Set:
    """-> None; conditional on ``version``."""

    path: str
    data: bytes
    version: int


@dataclass(frozen=True)
class GetChildren:
    path: str
    watch: str | None = None


@dataclass(frozen=True)
class Exists:
    """-> bool; the watch is set whether the node exists or not (it fires when it goes or comes)."""

    path: str
    watch: str | None = None


@dataclass(frozen=True)
class Delete:
    path: str


@dataclass(frozen=True)
class Schedule:
    """-> None at once: :meth:`Election.timer` is called with ``name`` and ``arg`` after ``delay`` seconds."""

    delay: float
    name: str
    arg: Any = None


Op = Create | Get | Set | GetChildren | Exists | Delete | Schedule
Task = Generator[Op, Any, None]


class ZooKeeperError(Exception):
    """A ZooKeeper operation failed (a driver maps its client's exceptions to these kinds)."""


class NoNodeError(ZooKeeperError):
    pass


class NodeExistsError(ZooKeeperError):
    pass


class BadVersionError(ZooKeeperError):
    pass


class ConnectionLossError(ZooKeeperError):
    """The connection dropped before the answer came: the operation may or may not have been applied."""


class SessionExpiredError(ZooKeeperError):
    """The session is gone (its ephemeral nodes too): nothing more until the next one (LOST)."""


def drive(task: Task, execute: Callable[[Op], Any]) -> None:
    """Run ``task`` to its end, one operation at a time: what ``execute(op)`` returns is sent back into
    the task, a :class:`ZooKeeperError` it raises is thrown into it (the task decides what a failed
    step means). A driver passes its client's call, its exceptions mapped to these kinds."""
    result: Any = None
    error: ZooKeeperError | None = None
    while True:
        try:
            op = task.throw(error) if error is not None else task.send(result)
        except StopIteration:
            return
        result, error = None, None
        try:
            result = execute(op)
        except ZooKeeperError as exc:
            error = exc


# -- what the election holds and reports ---------------------------------------------------------
@dataclass(frozen=True)
class ReplicationState:
    epoch: int
    leader: str
    isr: frozenset[str]
    data: bool = True  #: records may have been committed (false only for a stream that never held any)

    def encode(self) -> bytes:
        body = {"version": STATE_VERSION, "epoch": self.epoch, "leader": self.leader, "isr": sorted(self.isr),
                "data": self.data}  # fmt: skip
        return json.dumps(body, sort_keys=True).encode()

    @classmethod
    def decode(cls, data: bytes) -> ReplicationState | None:
        """The state in a node's data; None (logged) if it is not one (a node written by someone else:
        too large, too deep, not the shape, names that are no member ids)."""
        try:
            if len(data) > MAX_STATE_BYTES:
                raise ValueError(f"{len(data)} bytes, more than {MAX_STATE_BYTES}")
            raw = bounded_json.loads(data, max_bytes=MAX_STATE_BYTES)
            if not isinstance(raw, dict) or not isinstance(raw.get("isr"), list):
                raise ValueError("not an object with a list 'isr'")
            if not isinstance(raw.get("data", True), bool):
                raise ValueError("'data' is not true or false")
            state = cls(int(raw["epoch"]), validate_member_id(str(raw["leader"])),
                        frozenset(validate_member_id(str(r)) for r in raw["isr"]), raw.get("data", True))  # fmt: skip
        except (ValueError, TypeError, KeyError, ConfigError) as exc:
            log.error("replication state %r is not valid (%s): ignored", data[:200], exc)
            return None
        return state


@dataclass(frozen=True)
class ReplicaEvent:
    """``lead``: this replica leads ``epoch`` with in-sync set ``isr``; ``follow``: ``leader`` leads
    ``epoch`` (or nobody yet: empty); ``isr``: ZooKeeper holds in-sync set ``isr`` for this replica's
    ``epoch`` (``lead`` and ``isr`` say the state's ``data`` too); ``lost``: this replica's ZooKeeper
    session expired (it leads and follows nothing);
    ``resigned``: it left the line for good (:meth:`Election.resign`; ``epoch``: the one it led, 0 if
    none); ``stays``: it could not resign, and leads ``epoch`` on until it stops; ``give-way``: it
    leaves the lead of ``epoch`` to the preferred replica (it must confirm nothing more);
    ``kept``: no one took it, and it leads ``epoch`` on (it confirms again)."""

    kind: Literal["lead", "follow", "isr", "lost", "resigned", "stays", "give-way", "kept"]
    epoch: int = 0
    leader: str = ""
    isr: frozenset[str] = frozenset()
    data: bool = True


def election_node(replica: str, run: str) -> str:
    """The prefix of ``replica``'s node in line in its run ``run`` (ZooKeeper appends the sequence)."""
    return f"{replica}~{run}-"


def _committed(epoch: int, commit: int) -> bytes:
    return json.dumps({"epoch": epoch, "commit": commit}).encode()


def recorded_commit(data: bytes) -> int:
    """The commit point a ``replication/committed`` node holds (0 for one that is not ours to trust)."""
    try:
        raw = bounded_json.loads(data, max_bytes=4096) if data else {}
        commit = raw.get("commit", 0) if isinstance(raw, dict) else 0
    except ValueError:
        return 0
    return commit if isinstance(commit, int) and not isinstance(commit, bool) and commit >= 0 else 0


def election_replica(name: str) -> str:
    """The replica whose node in line ``name`` is (the inverse of :func:`election_node`)."""
    return name.split("~", 1)[0] if "~" in name else name.rsplit("-", 1)[0]


def _position(name: str) -> tuple[int, str]:
    """A node in line's place: its sequence (the 10 digits ZooKeeper appended), then its name."""
    tail = name.rsplit("-", 1)[-1]
    return (int(tail) if tail.isdigit() else 1 << 62, name)


# -- the machine ----------------------------------------------------------------------------------
class Election:
    """One replica's part in its stream's election. Tasks come from :meth:`start`, :meth:`watched`,
    :meth:`timer`, :meth:`session` and :meth:`write_isr`; the driver runs them one at a time."""

    def __init__(self, paths: StreamPaths, replica: str, run: str, report: Callable[[ReplicaEvent], None], *,
                 empty: Callable[[], bool] = lambda: False, preferred: str | None = None,
                 caught_up: Callable[[str], bool] = lambda name: True) -> None:  # fmt: skip
        self.paths, self.replica, self.report = paths, validate_member_id(replica), report
        self.prefix = election_node(replica, run)
        #: whether this replica's journal holds nothing (a new or wiped volume): it may not lead a stream
        #: that has had a leader, and it leaves the in-sync set at start if ZooKeeper still lists it
        self.empty = empty
        self.node: str | None = None  #: our place in line (its name)
        self.led = 0  #: the epoch this replica leads (0: none)
        self.claiming: ReplicationState | None = None  #: a state we wrote whose answer was lost
        self.followed: tuple[int, str] | None = None
        self.failures = 0  #: election steps failed in a row (the next waits BACKOFF_S[failures - 1])
        self.stopped = False
        self.resigned = False  #: out of line for good (a controlled shutdown): never takes a place again
        self.lost = False
        self.connected = True  #: the session's connection, as the last session event said
        #: the replica that should lead while it is in sync (None: this one, or no preference)
        self.preferred = validate_member_id(preferred) if preferred and preferred != replica else None
        #: whether a follower holds what this leader holds (its broker's view): the lead goes only to
        #: one that does (a follower whose volume is full stays in the set until it lags, and could
        #: not write the epoch it would lead)
        self.caught_up = caught_up
        self.giving_way = False  #: leading, and out of line so that the preferred replica takes the lead
        self._prefer_due = False  #: a look at the preferred replica is scheduled
        self._preferred_seen = 0  #: looks in a row that found it in sync and behind this replica

    # -- entry points (each returns a task) --------------------------------------------------
    def start(self) -> Task:
        if self.empty():
            try:
                yield from self._leave_isr("its journal is empty", only_with_data=True)
            except ZooKeeperError as exc:  # it still cannot lead (empty), and its leader drops it at its next fetch
                log.warning("replica %s: could not leave the in-sync set (%s)", self.replica, type(exc).__name__)
        yield from self._read_state()
        yield from self._check()
        yield from self._prefer_later()

    def stop(self) -> Task:
        self.stopped = True
        if self.node is not None and self.connected:
            with contextlib.suppress(ZooKeeperError):
                yield Delete(f"{self.paths.election}/{self.node}")

    def resign(self, min_insync: int = 0) -> Task:
        """Leave the line for good, before this replica stops (a controlled shutdown), so that it is
        neither elected meanwhile nor, if it leads, the reason for a failover that waits for its
        session to end: the next in line, an in-sync replica, takes the next epoch at once (the
        state's watch then reports it: ``follow``). A leader resigns only if another replica in sync
        stands in line (else the stream would have no leader until this one is back). Reported as
        ``resigned`` once it left the line, ``stays`` if it did not (the broker fenced its leadership
        before asking, and lifts the fence on ``stays``). A follower also leaves the in-sync set if
        ``min_insync`` others stay in it (its broker stopped fetching first), so that its leader
        confirms without waiting for it to be found lagging."""
        if self.resigned:
            return
        if self.stopped or self.lost:  # no session (or done): in no line, leading nothing; none to take again
            self.resigned = True
            self.report(ReplicaEvent("resigned", 0))
            return
        try:
            line = yield GetChildren(self.paths.election)
            data, _ = yield Get(self.paths.replication_state)
            state = ReplicationState.decode(data)
        except ZooKeeperError as exc:
            log.warning("replica %s: could not resign (%s): stopping as a failover", self.replica, type(exc).__name__)
            self.report(ReplicaEvent("stays", self.led))
            return
        others = {election_replica(n) for n in line} - {self.replica}
        if self.led and (state is None or not others & state.isr):
            log.warning("replica %s: no other replica in sync stands in line: leading until it stops", self.replica)
            self.report(ReplicaEvent("stays", self.led))
            return
        self.resigned = True
        if self.node is not None:
            try:
                yield Delete(f"{self.paths.election}/{self.node}")
            except NoNodeError:
                pass
            except ZooKeeperError as exc:  # its session's end removes it: a failover, as without resigning
                log.warning("replica %s: could not leave the line (%s)", self.replica, type(exc).__name__)
        self.node = None
        log.info("replica %s resigns%s", self.replica, f" the lead of epoch {self.led}" if self.led else "")
        if not self.led and state is not None and self.replica in state.isr and len(state.isr) > min_insync > 0:
            try:
                yield from self._leave_isr("it is stopping")
            except ZooKeeperError as exc:  # its leader finds it lagging instead
                log.warning("replica %s: could not leave the in-sync set (%s)", self.replica, type(exc).__name__)
        self.report(ReplicaEvent("resigned", self.led))

    def watched(self, name: str) -> Task:
        """A watch set by one of our operations fired."""
        if self.stopped:
            return
        if name == "state":
            yield from self._read_state()
            if not self.led and self.node is not None:  # the state may make us eligible (or not) where we stand
                yield from self._check()
        elif name == "predecessor":
            yield from self._check()
        elif name == "line":  # ineligible and first: the line changed, so step to its back
            yield from self._requeue(self.node)

    def timer(self, name: str, arg: Any = None) -> Task:
        if self.stopped:
            return
        if name == "check":
            yield from self._check()
        elif name == "state":
            yield from self._read_state()
        elif name == "requeue":
            yield from self._requeue(arg)
        elif name == "prefer":
            self._prefer_due = False
            yield from self._give_way()
            yield from self._prefer_later()

    def session(self, state: Literal["suspended", "lost", "connected"]) -> Task:
        """The session's state changed (kazoo's SUSPENDED, LOST and CONNECTED). A suspension is the
        driver's to report at once (the broker fences its leadership on its own thread); LOST makes
        this replica step down (reported), and the next session takes a place in line again."""
        if self.stopped:
            return
        self.connected = state == "connected"
        if state == "lost":
            self.lost = True
            self.node, self.led, self.followed, self.claiming, self.giving_way = None, 0, None, None, False
            self.report(ReplicaEvent("lost"))
        elif state == "connected" and self.lost:  # a new session: whoever leads now is followed
            self.lost = False
            yield from self._read_state()
            yield from self._check()

    def write_isr(self, epoch: int, isr: frozenset[str]) -> Task:
        """Write the in-sync set of ``epoch`` (conditional on the state's version); reported as ``isr``
        with what ZooKeeper holds once it is written or found written. Nothing if this replica no
        longer leads that epoch; a failure is left to the leader, which asks again."""
        isr = isr | {self.replica}
        yield from self._leader_write(epoch, "write the in-sync set",
                                      lambda state: ReplicationState(epoch, self.replica, isr, state.data))  # fmt: skip

    def mark_data(self, epoch: int) -> Task:
        """Record in the state that the stream may hold committed records (before this leader of
        ``epoch`` first counts one committed), as :meth:`write_isr` writes its set."""
        yield from self._leader_write(epoch, "record that the stream holds data",
                                      lambda state: ReplicationState(epoch, self.replica, state.isr, True))  # fmt: skip

    def _leader_write(self, epoch: int, what: str, change: Callable[[ReplicationState], ReplicationState]) -> Task:
        """The leader of ``epoch`` changes its state (``change`` makes the new one from ZooKeeper's), by
        a conditional write; reported as ``isr`` with what ZooKeeper holds once written or found
        written. Nothing if this replica no longer leads that epoch; a failure is logged and left to
        the leader, which asks again."""
        for _ in range(5):  # a conditional write that lost a race with another write reads again
            try:
                data, version = yield Get(self.paths.replication_state)
                state = ReplicationState.decode(data)
                if state is None or state.epoch != epoch or state.leader != self.replica:
                    return  # fenced: a newer epoch (the state's watch tells us whom to follow)
                wanted = change(state)
                if wanted != state:
                    yield Set(self.paths.replication_state, wanted.encode(), version)
            except BadVersionError:
                continue
            except ZooKeeperError as exc:
                log.warning("replica %s: could not %s (%s); the leader asks again", self.replica, what,
                            type(exc).__name__)  # fmt: skip
                return
            self.report(ReplicaEvent("isr", epoch, self.replica, wanted.isr, wanted.data))
            return

    def record_commit(self, epoch: int, commit: int) -> Task:
        """Record the leader's commit point (never lower than recorded): what an unclean election, if
        one is ever forced, reports it gives up. Best effort; the next record tries again."""
        try:
            try:
                data, version = yield Get(self.paths.replication_committed)
            except NoNodeError:
                yield Create(self.paths.replication_committed, _committed(epoch, commit), makepath=True)
                return
            if recorded_commit(data) < commit:
                yield Set(self.paths.replication_committed, _committed(epoch, commit), version)
        except ZooKeeperError:
            return

    # -- the line ----------------------------------------------------------------------------
    def _check(self) -> Task:
        """Where are we in line: first (lead, if eligible), or watch the one before us. A failure
        (not an expired session: LOST brings us back) is tried again after a backoff."""
        if self.stopped or self.lost or self.resigned:
            return
        try:
            for _ in range(10):  # bounded: each turn either settles or saw the line change under it
                settled = yield from self._check_once()
                if settled:
                    self.failures = 0
                    return
        except SessionExpiredError:
            return
        except ZooKeeperError as exc:
            self.failures += 1
            delay = BACKOFF_S[min(self.failures, len(BACKOFF_S)) - 1]
            log.warning("replica %s: election step failed (%s); trying again in %.1fs", self.replica,
                        type(exc).__name__, delay)  # fmt: skip
            yield Schedule(delay, "check")
            return
        yield Schedule(BACKOFF_S[0], "check")  # the line kept changing under us: look again soon

    def _check_once(self) -> Generator[Op, Any, bool]:
        try:
            line = sorted((yield GetChildren(self.paths.election)), key=_position)
        except NoNodeError:  # a new stream (or someone removed the line): make it
            with contextlib.suppress(NodeExistsError):
                yield Create(self.paths.election, makepath=True)
            return False
        mine = [n for n in line if n.startswith(self.prefix)]  # a create whose answer was lost made it
        if self.node is None:
            if mine:
                self.node = mine[0]
            else:
                path = yield Create(f"{self.paths.election}/{self.prefix}", ephemeral=True, sequence=True)
                self.node = str(path).rsplit("/", 1)[1]
                return False  # look at the line again, with our node in it
        if self.node not in line:  # our session lost it: a new place at the back
            self.node = None
            return False
        leftovers = [n for n in mine if n != self.node]  # a step to the back whose answer was lost
        for node in leftovers:
            with contextlib.suppress(NoNodeError):
                yield Delete(f"{self.paths.election}/{node}")
        if leftovers:
            return False  # look again, one place in line
        i = line.index(self.node)
        if i > 0:
            return bool((yield Exists(f"{self.paths.election}/{line[i - 1]}", watch="predecessor")))
        return (yield from self._first(line))

    def _first(self, line: list[str]) -> Generator[Op, Any, bool]:
        """First in ``line``: take the lead with a new epoch, if eligible; else step back when the line
        changes."""
        try:
            data, version = yield Get(self.paths.replication_state)
            state = ReplicationState.decode(data)
        except NoNodeError:
            state, version = None, None
        if state is not None and self.claiming is not None and state == self.claiming:
            self._won(state)  # our write went through; its answer was lost
            return True
        self.claiming = None
        if state is not None and self.led and state.leader == self.replica and state.epoch == self.led:
            if self.giving_way:  # first again: no one took the lead it left
                self.giving_way = False
                log.info("replica %s: no one took the lead of epoch %d: leading on", self.replica, self.led)
                self.report(ReplicaEvent("kept", self.led))
            return True  # leading already
        why = None
        if state is not None and state.data and self.empty():
            why = "its journal is empty and the stream may hold committed records"
        elif state is not None and state.data and self.replica not in state.isr:  # (without data, none was
            why = f"it is not in sync ({', '.join(sorted(state.isr))})"  # committed: any replica loses nothing)
        if why is not None:  # ineligible: never in the way of one that may lead
            line = yield GetChildren(self.paths.election)
            behind = len(line) > 1
            log.info("replica %s: first in line, but %s; stepping back %s", self.replica, why,
                     "behind the others" if behind else "when the line changes")  # fmt: skip
            if not behind:  # alone: whoever joins behind us may lead, so we step back when the line changes
                behind = len((yield GetChildren(self.paths.election, watch="line"))) > 1
            if behind:  # after a second: ineligible replicas taking turns at the front do not spin
                yield Schedule(REQUEUE_S, "requeue", self.node)
            return True
        epoch = (state.epoch if state else 0) + 1
        isr = frozenset() if state is None else state.isr
        if state is not None and state.leader not in {election_replica(n) for n in line if n != self.node}:
            isr -= {state.leader}  # out of line: dead or stopping (one that stepped aside for us stays)
        isr |= {self.replica}
        new = ReplicationState(epoch, self.replica, isr, state.data if state else False)
        self.claiming = new
        try:
            if version is None:
                yield Create(self.paths.replication_state, new.encode(), makepath=True)
            else:
                yield Set(self.paths.replication_state, new.encode(), version)
        except (BadVersionError, NodeExistsError):
            self.claiming = None
            return False  # someone wrote it meanwhile: look again
        self._won(new)
        return True

    def _won(self, state: ReplicationState) -> None:
        self.claiming = None
        self.led = state.epoch
        log.info("replica %s leads epoch %d (in sync: %s)", self.replica, state.epoch, ", ".join(sorted(state.isr)))
        self.report(ReplicaEvent("lead", state.epoch, self.replica, state.isr, state.data))

    def _requeue(self, node: str | None) -> Task:
        """Leave our place ``node`` in line (if it is still ours) for one at the back."""
        if self.node is None or self.node != node or self.led or self.lost:
            return
        try:
            yield Delete(f"{self.paths.election}/{self.node}")
        except NoNodeError:
            pass
        except ZooKeeperError:
            yield Schedule(BACKOFF_S[0], "requeue", node)
            return
        self.node = None
        yield from self._check()

    # -- the preferred leader -----------------------------------------------------------------
    def _prefer_later(self) -> Task:
        """Look at the preferred replica's place in :data:`PREFER_CHECK_S` (one look scheduled at a time)."""
        if self.preferred is not None and not (self._prefer_due or self.stopped or self.resigned):
            self._prefer_due = True
            yield Schedule(PREFER_CHECK_S, "prefer")

    def _give_way(self) -> Task:
        """Step aside if this replica stands before the preferred one in line while that one is in the
        in-sync set (at :data:`PREFER_CHECKS` looks in a row): a follower steps to the back of the
        line; a leader does too once the preferred replica is next in line (another between them steps
        aside first), after reporting ``give-way``, so that the preferred replica takes the next epoch."""
        if self.lost or self.resigned or self.giving_way or self.node is None or not self.connected:
            self._preferred_seen = 0
            return
        try:
            line = sorted((yield GetChildren(self.paths.election)), key=_position)
            data, _ = yield Get(self.paths.replication_state)
        except ZooKeeperError:
            return  # the next look
        state = ReplicationState.decode(data)
        theirs = next((i for i, n in enumerate(line) if election_replica(n) == self.preferred), None)
        if (state is None or self.preferred not in state.isr or theirs is None or self.node not in line
                or line.index(self.node) > theirs):  # fmt: skip
            self._preferred_seen = 0
            return
        self._preferred_seen += 1
        if self._preferred_seen < PREFER_CHECKS:
            return
        if self.led:
            if line.index(self.node) != 0 or theirs != 1 or (state.epoch, state.leader) != (self.led, self.replica):
                return  # another stands between us (it steps aside first), or the epoch moves on: the next look
            if not self.caught_up(self.preferred):
                return  # it lags (a full volume, a slow disk): the next look
        self._preferred_seen = 0
        old = yield from self._place_at_back()
        if old is None:  # the next look tries again
            yield from self._check()
            return
        if self.led:
            log.info("replica %s: the preferred replica %s is in sync: giving it the lead of epoch %d", self.replica,
                     self.preferred, self.led)  # fmt: skip
            self.giving_way = True
            self.report(ReplicaEvent("give-way", self.led))
        else:
            log.info("replica %s: the preferred replica %s is in sync: stepping behind it in line", self.replica,
                     self.preferred)  # fmt: skip
        yield from self._leave_place(old)

    def _place_at_back(self) -> Generator[Op, Any, str | None]:
        """A new place at the back of the line, made before the old one is left: whoever takes the lead
        meanwhile sees this replica in line, so a leader stepping aside stays in the in-sync set (see
        :meth:`_first`). Returns the old place (:meth:`_leave_place` leaves it), or None if the create
        failed (perhaps made: the next look deletes the leftover)."""
        try:
            path = yield Create(f"{self.paths.election}/{self.prefix}", ephemeral=True, sequence=True)
        except ZooKeeperError:
            return None
        old, self.node = self.node, str(path).rsplit("/", 1)[1]
        return old

    def _leave_place(self, old: str) -> Task:
        with contextlib.suppress(ZooKeeperError):  # gone, or perhaps not: the look below deletes a leftover
            yield Delete(f"{self.paths.election}/{old}")
        yield from self._check()

    def step_aside(self, epoch: int) -> Task:
        """This replica was elected for ``epoch`` but its broker cannot lead it (the journal's volume is
        full: the epoch cannot be begun): to the back of the line, as a leader giving way does (its new
        place made first, so it stays in the in-sync set: it holds everything committed and confirmed
        nothing in ``epoch``), so that the next in-sync replica takes the next epoch. First again (no
        one else may lead), it reports ``kept``, and its broker tries the epoch again."""
        if self.led != epoch or self.lost or self.resigned or self.stopped or self.giving_way or self.node is None:
            return
        self.giving_way = True  # first again, it is told kept
        old = yield from self._place_at_back()
        if old is None:  # still first in line: kept, and its broker tries again
            yield from self._check()
            return
        log.info("replica %s: cannot lead epoch %d: stepping to the back of the line", self.replica, epoch)
        yield from self._leave_place(old)

    # -- the state ---------------------------------------------------------------------------
    def _read_state(self) -> Task:
        """Read the state and watch it (again: a watch fires once)."""
        try:
            data, _ = yield Get(self.paths.replication_state, watch="state")
        except NoNodeError:
            try:
                if (yield Exists(self.paths.replication_state, watch="state")):
                    yield Schedule(0.0, "state")
            except ZooKeeperError:
                yield Schedule(BACKOFF_S[0], "state")
            return
        except SessionExpiredError:
            return
        except ZooKeeperError:  # the watch may not be set: read again soon
            yield Schedule(BACKOFF_S[0], "state")
            return
        self._state_changed(ReplicationState.decode(data))

    def _state_changed(self, state: ReplicationState | None) -> None:
        if state is None:
            return
        if state.leader == self.replica and state.epoch == self.led:
            self.report(ReplicaEvent("isr", state.epoch, self.replica, state.isr, state.data))  # what ZooKeeper holds
            return
        if state.leader != self.replica or state.epoch > self.led:
            if self.led:
                log.log(logging.INFO if self.resigned or self.giving_way else logging.WARNING, "replica %s: epoch %d "
                        "was taken by %s; stepping down", self.replica, state.epoch, state.leader)  # fmt: skip
                self.led, self.giving_way = 0, False
            leader = state.leader if state.leader != self.replica else ""  # our own, from before a restart
            if self.followed != (state.epoch, leader):
                self.followed = (state.epoch, leader)
                self.report(ReplicaEvent("follow", state.epoch, leader, state.isr))

    def _leave_isr(self, why: str, *, only_with_data: bool = False) -> Task:
        """Take this replica out of the in-sync set (a conditional write: the one change any replica may
        make, and only to itself): it lost its journal, so it must not be elected as if it held it, or
        it is stopping. ``only_with_data``: not from the set of a stream that never held data (an empty
        journal lost nothing there)."""
        for _ in range(5):
            try:
                data, version = yield Get(self.paths.replication_state)
            except NoNodeError:
                return
            state = ReplicationState.decode(data)
            if state is None or self.replica not in state.isr or (only_with_data and not state.data):
                return
            log.log(logging.INFO if why == "it is stopping" else logging.WARNING,
                    "replica %s: %s but the in-sync set lists it; leaving the set", self.replica, why)  # fmt: skip
            try:
                yield Set(
                    self.paths.replication_state,
                    ReplicationState(state.epoch, state.leader, state.isr - {self.replica}, state.data).encode(),
                    version,
                )
                return
            except BadVersionError:
                continue

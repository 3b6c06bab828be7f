"""Replication of a stream's journal, without sockets: the leader's view of its followers, and a
follower's copy. The adapter (:mod:`zeps.broker.server`) moves the frames; ZooKeeper
(:mod:`zeps.coordination.replication`) says who leads in which epoch and stores the in-sync set.

How it works (the model is Kafka's: in-sync replicas, a high watermark, epochs):

* Followers *pull*: each sends REPLICA-FETCH with where its copy ends and what of it is durable on its
  disk; the leader answers REPLICA-DATA with the next bytes of its segment files (whole entries, only
  what is durable on the leader), at once or as soon as it has more (a fetch waits at most
  ``heartbeat_s``: an empty answer tells the follower the leader lives). The follower writes the
  bytes as they are (:meth:`~zeps.journal.Journal.replica_write`), syncs them at the stream's fsync
  policy, and its next fetch acknowledges them.
* The **in-sync set** (ISR) is the leader and the followers that caught up with it within ``lag_s``.
  It lives in ZooKeeper: only its members may be elected, so it changes there first — the leader
  asks (:attr:`Leadership.wanted`), the adapter writes it conditionally on the leader's epoch, and
  only then is it used here (:meth:`Leadership.isr_written`).
* **Commit** (what is confirmed to publishers and delivered to subscribers): the last sequence every
  member of the in-sync set holds durably, provided the set has at least ``min_insync`` members. So
  any member the next election can choose holds everything ever confirmed.
* A leader whose ZooKeeper session is suspended (its connection dropped: a new leader may be elected
  once the session expires) stops confirming at once (:attr:`Leadership.valid`); it goes on if the
  session survives, and steps down if it expires.
* **Epochs**: each leader raises the epoch in ZooKeeper with a conditional write and starts an entry
  in its journal's epoch history; a returning replica cuts what it holds beyond the end of its last
  epoch in the leader's history (:class:`FollowerCopy`), then copies. Fetches and data of another
  epoch than the one a broker knows are refused or dropped.
"""

from __future__ import annotations

import logging
import struct
from dataclasses import dataclass, field

import crc32c

from zeps.errors import ProtocolError
from zeps.journal import Journal
from zeps.protocol import (
    Attach,
    AttachOk,
    Connection,
    Invalid,
    InvalidCode,
    Ping,
    PingOk,
    ReplicaData,
    ReplicaEpoch,
    ReplicaEpochEnd,
    ReplicaFetch,
)

__all__ = ["REPLICATION_VERSION", "FollowerCopy", "Leadership", "decode_epochs", "encode_epochs"]

log = logging.getLogger(__name__)

REPLICATION_VERSION = 8  #: the protocol version a follower attaches with
_PAIR = struct.Struct("!QQ")


def encode_epochs(entries: list[tuple[int, int]]) -> bytes:
    return b"".join(_PAIR.pack(e, f) for e, f in entries)


def decode_epochs(raw: bytes) -> list[tuple[int, int]]:
    if len(raw) % _PAIR.size:
        raise ProtocolError(f"REPLICA-DATA epochs: {len(raw)} bytes is not a whole number of (epoch, first) pairs")
    return [(int(e), int(f)) for e, f in _PAIR.iter_unpack(raw)]


@dataclass
class _Follower:
    durable: int = 0  # its last durable sequence, as its last fetch said
    seen: float = 0.0  # when it last fetched
    caught_up: float = 0.0  # when it last held everything the leader had at its previous fetch
    target: int = 0  # the leader's durable tail at its previous fetch


@dataclass(eq=False)
class Leadership:
    """The leader's view of its stream's replication (single-threaded, in the broker loop; only
    :attr:`valid` is set from ZooKeeper's thread)."""

    me: str
    epoch: int
    isr: frozenset[str]  #: the in-sync set as ZooKeeper holds it
    min_insync: int
    lag_s: float = 10.0  #: a follower that has not caught up for this long leaves the in-sync set
    heartbeat_s: float = 0.5  #: a fetch waits at most this long for data
    commit: int = 0  #: the last sequence confirmed
    valid: bool = True  #: False while the ZooKeeper session is suspended: nothing more is confirmed
    followers: dict[str, _Follower] = field(default_factory=dict)
    pending_isr: frozenset[str] | None = None  #: asked of ZooKeeper, not written yet

    @classmethod
    def begin(cls, me: str, epoch: int, isr: frozenset[str], *, min_insync: int, commit: int, now: float,
              **tuning: float) -> Leadership:  # fmt: skip
        """A new leader: the followers of the in-sync set count as caught up until ``lag_s`` passes."""
        leadership = cls(me, epoch, isr | {me}, min_insync, commit=commit, **tuning)  # type: ignore[arg-type]
        for replica in isr - {me}:
            leadership.followers[replica] = _Follower(0, now, now, 0)
        return leadership

    def fetched(self, replica: str, durable: int, leader_durable: int, now: float) -> None:
        """A follower fetched, holding ``durable`` durably."""
        f = self.followers.get(replica)
        if f is None:
            f = self.followers[replica] = _Follower(durable, now, 0.0, leader_durable)
        if durable < f.durable:  # it lost what it held (a new volume): out of the in-sync set at once
            f.caught_up = float("-inf")
        elif (durable >= f.target and f.caught_up != float("-inf")) or durable >= self.commit:
            f.caught_up = now
        f.durable, f.seen, f.target = durable, now, leader_durable

    def advance(self, leader_durable: int) -> int:
        """The commit point now (it never goes back): the lowest durable tail of the in-sync set, if
        the set is large enough and the leadership is valid."""
        if self.valid and len(self.isr) >= self.min_insync:
            tails = [leader_durable, *(self.followers[r].durable for r in self.isr if r in self.followers)]
            if all(r == self.me or r in self.followers for r in self.isr):
                self.commit = max(self.commit, min(tails))
        return self.commit

    @property
    def under_replicated(self) -> bool:
        return len(self.isr) < self.min_insync

    def wanted(self, leader_durable: int, now: float) -> frozenset[str] | None:
        """The in-sync set as it should be now, if that differs from ZooKeeper's (and is not asked
        already): followers that caught up within ``lag_s`` and hold everything committed."""
        isr = {self.me}
        for replica, f in self.followers.items():
            if now - f.caught_up < self.lag_s and (replica in self.isr or f.durable >= self.commit):
                isr.add(replica)
        wanted = frozenset(isr)
        if wanted in (self.isr, self.pending_isr):
            return None
        self.pending_isr = wanted
        return wanted

    def isr_written(self, isr: frozenset[str]) -> None:
        """ZooKeeper holds ``isr`` now (the adapter wrote it in this leader's epoch)."""
        self.isr = isr
        if self.pending_isr == isr:
            self.pending_isr = None


class FollowerCopy:
    """A follower's side of one peering with the leader: attach (version 8), cut what the leader never
    had (by epochs), then fetch and write. Frames in, frames out; the journal is written here."""

    def __init__(self, journal: Journal, stream: str, replica: str, epoch: int, *, most: int = 4 << 20) -> None:
        self.journal, self.stream, self.replica, self.epoch, self.most = journal, stream, replica, epoch, most
        self.conn = Connection("client")
        self.commit = 0  #: the leader's commit point, as it last said
        self.refused: str | None = None  #: the leader refused us (not the leader any more, another epoch)
        self.caught_up = False  #: the last answer had no more data for us
        self.bytes_copied = 0

    def start(self) -> list[bytes]:
        return [self.conn.send(Attach(stream=self.stream, version=REPLICATION_VERSION))]

    def fetch(self) -> bytes:
        base, offset, last = self.journal.replica_position()
        return self.conn.send(ReplicaFetch(epoch=self.epoch, replica=self.replica, base=base, offset=offset,
                                           last=last, durable=self.journal.durable, known=self.journal.epochs.latest,
                                           most=self.most))  # fmt: skip

    def receive(self, frame: bytes) -> list[bytes]:
        """Handle one frame from the leader; returns the frames to send back."""
        command = self.conn.receive(frame)
        if isinstance(command, AttachOk):
            return [self._ask_epoch()] if self.journal.written else [self.fetch()]
        if isinstance(command, ReplicaEpochEnd):
            return self._epoch_end(command)
        if isinstance(command, ReplicaData):
            return self._data(command)
        if isinstance(command, Ping):
            return [self.conn.send(PingOk())]
        if isinstance(command, InvalidCode | Invalid):
            self.refused = command.reason
        return []

    def _ask_epoch(self) -> bytes:
        return self.conn.send(ReplicaEpoch(epoch=self.epoch, asked=self.journal.epochs.latest))

    def _epoch_end(self, command: ReplicaEpochEnd) -> list[bytes]:
        """Cut what the leader never had: records after the end of epoch ``found`` (the largest the
        leader knows that is not above our last) in the leader's journal or in ours, whichever comes
        first (KIP-101, with KIP-279's refinement: one round trip, whatever epochs we missed)."""
        if command.epoch != self.epoch:
            self.refused = f"the leader answered in epoch {command.epoch}, not {self.epoch}"
            return []
        journal = self.journal
        _, mine = journal.epochs.end_of(command.found, journal.written)
        cut = min(command.end, mine)
        if cut < journal.written:
            journal.truncate_after(cut)
        return [self.fetch()]

    def _data(self, command: ReplicaData) -> list[bytes]:
        if command.epoch != self.epoch:  # an older leader's, still in flight: never written
            log.warning("replica %s: dropping REPLICA-DATA of epoch %d (following %d)", self.replica, command.epoch,
                        self.epoch)  # fmt: skip
            return []
        journal = self.journal
        crc = crc32c.crc32c(command.data, crc32c.crc32c(command.marks, crc32c.crc32c(command.index)))
        if crc != command.crc:
            raise ProtocolError(f"REPLICA-DATA at {command.offset} of segment {command.base} fails its CRC32C")
        if command.reset:
            journal.replica_reset(command.base)
        elif command.data:
            journal.replica_write(command.base, command.offset, command.data, starts=command.index,
                                  marks=command.marks)  # fmt: skip
            self.bytes_copied += len(command.data)
        elif command.next:
            journal.replica_roll(command.next)
        journal.epochs.adopt(decode_epochs(command.epochs), journal.written)
        journal.maybe_sync(idle=True)  # the acknowledgement is of durable bytes (at the stream's fsync policy)
        self.commit = max(self.commit, command.commit)
        self.caught_up = not (command.data or command.reset or command.next)
        return [self.fetch()]

"""A follower's side of one peering with its stream's leader (no sockets): attach, cut what the
leader never had, then fetch and write the leader's segment bytes as they are.

The design is Kafka's follower fetch with leader epochs (KIP-101, with KIP-279's one round trip):

* A returning replica asks the leader where its own last epoch ends in the leader's history
  (REPLICA-EPOCH), and cuts its journal there: what it wrote beyond that point was never committed
  (no in-sync set held it), and the leader never had it. Only then does it fetch, so every
  acknowledgement it sends is of records the leader holds in the same place.
* Followers *pull*: REPLICA-FETCH says where the copy ends and what of it is durable; REPLICA-DATA
  carries the next whole entries of the leader's segment files (only what is durable there), the
  leader's epoch history and its commit point. The follower writes them, syncs at the stream's fsync
  policy, and its next fetch acknowledges them (:class:`zeps.replication.isr.Leadership` counts them).
* Frames of another epoch than the one followed are dropped (an older leader's, still in flight);
  a refusal ends the peering (:attr:`FollowerCopy.refused`), and the adapter follows again.
"""

from __future__ import annotations

import logging
import struct

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

__all__ = ["GAPPED", "REPLICATION_VERSION", "FollowerCopy", "decode_epochs", "encode_epochs"]

log = logging.getLogger(__name__)

REPLICATION_VERSION = 8  #: the protocol version a follower attaches with
#: REPLICA-DATA's ``reset`` for a compacted segment's records, copied by sequence (:mod:`zeps.journal.copying`)
GAPPED = 2
_PAIR = struct.Struct("!QQ")


def encode_epochs(entries: list[tuple[int, int]]) -> bytes:
    return b"".join(_PAIR.pack(e, f) for e, f in entries)


def decode_epochs(raw: bytes) -> list[tuple[int, int]]:
    if len(raw) % _PAIR.size:
        raise ProtocolError(f"REPLICA-DATA epochs: {len(raw)} bytes is not a whole number of (epoch, first) pairs")
    return [(int(e), int(f)) for e, f in _PAIR.iter_unpack(raw)]


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
        journal.truncate_after(min(command.end, mine))  # records, or only marks, the leader may not share
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
        if command.reset not in (0, 1, GAPPED):
            raise ProtocolError(f"REPLICA-DATA with reset {command.reset}: 0, 1 or {GAPPED} were due")
        gapped = command.reset == GAPPED
        if command.reset == 1:
            journal.replica_reset(command.base)
        elif command.data:
            journal.replica_write(command.base, command.offset, command.data, starts=command.index,
                                  marks=command.marks, gapped=gapped)  # fmt: skip
            self.bytes_copied += len(command.data)
        elif command.next:
            journal.replica_roll(command.next, gapped=gapped)
        journal.epochs.adopt(decode_epochs(command.epochs), journal.written)
        journal.maybe_sync(idle=True)  # the acknowledgement is of durable bytes (at the stream's fsync policy)
        self.commit = max(self.commit, command.commit)
        self.caught_up = not (command.data or command.reset == 1 or command.next)
        return [self.fetch()]

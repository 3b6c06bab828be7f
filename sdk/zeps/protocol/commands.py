"""ZEPS commands: one dataclass per command, the table of ids, the refusal codes (no sockets).

Every frame is one command: signature (0xAA 0xA5), command id (1 byte), fields. Field types:
``string`` = 1-byte length + text; ``chunk`` = 4-byte length + bytes; ``number-N`` = N-byte unsigned
integer, network byte order. Version 1 commands (ids 1-12) are byte for byte those of the ZEPS ABNF
grammar; versions 2 to 7 add commands a peer negotiates at ATTACH. What each command and version
means, and the conventions zeps adds, are in ``docs/reference/protocol.md`` (the one description of the
protocol). The codec is :mod:`zeps.protocol.codec`; its hand-written paths for the commands that
carry messages, :mod:`zeps.protocol._fastpath`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import ClassVar

from zeps._records import Records, indexed_run

__all__ = [
    "CODES_SINCE",
    "COMMANDS",
    "LATEST",
    "PROTOCOL",
    "SIGNATURE",
    "Attach",
    "AttachOk",
    "Command",
    "Credit",
    "Deliver",
    "DeliverBatch",
    "DeliverRun",
    "DeliverTs",
    "Detach",
    "DetachOk",
    "Fetch",
    "FetchEnd",
    "Invalid",
    "InvalidCode",
    "Ping",
    "PingOk",
    "Produce",
    "ProduceOk",
    "Publish",
    "PublishBatch",
    "PublishBatchSeq",
    "PublishSeq",
    "Refusal",
    "ReplicaData",
    "ReplicaEpoch",
    "ReplicaEpochEnd",
    "ReplicaFetch",
    "Subscribe",
    "SubscribeOk",
    "SubscribeTime",
    "Tail",
]

SIGNATURE = b"\xaa\xa5"
PROTOCOL = "ZEPS"
LATEST = 2**64 - 1


@dataclass(frozen=True, slots=True)
class Command:
    ID: ClassVar[int] = 0
    NAME: ClassVar[str] = ""
    #: field name -> type ("string", "text" (string with spaces), "chunk", "number-2", "number-8")
    FIELDS: ClassVar[tuple[tuple[str, str], ...]] = ()


@dataclass(frozen=True, slots=True)
class Attach(Command):
    ID = 1
    NAME = "ATTACH"
    FIELDS = (("protocol", "string"), ("version", "number-2"), ("stream", "string"))
    stream: str
    version: int = 1
    protocol: str = PROTOCOL


@dataclass(frozen=True, slots=True)
class AttachOk(Command):
    ID = 2
    NAME = "ATTACH-OK"


@dataclass(frozen=True, slots=True)
class Subscribe(Command):
    ID = 3
    NAME = "SUBSCRIBE"
    FIELDS = (("pattern", "string"), ("latest", "number-8"))
    pattern: str
    latest: int = 0


@dataclass(frozen=True, slots=True)
class SubscribeOk(Command):
    ID = 4
    NAME = "SUBSCRIBE-OK"


@dataclass(frozen=True, slots=True)
class Credit(Command):
    ID = 5
    NAME = "CREDIT"
    FIELDS = (("credit", "number-8"),)
    credit: int


@dataclass(frozen=True, slots=True)
class Publish(Command):
    ID = 6
    NAME = "PUBLISH"
    FIELDS = (("key", "string"), ("body", "chunk"))
    key: str
    body: bytes


@dataclass(frozen=True, slots=True)
class Deliver(Command):
    ID = 7
    NAME = "DELIVER"
    FIELDS = (("sequence", "number-8"), ("key", "string"), ("body", "chunk"))
    sequence: int
    key: str
    body: bytes


@dataclass(frozen=True, slots=True)
class Ping(Command):
    ID = 8
    NAME = "PING"


@dataclass(frozen=True, slots=True)
class PingOk(Command):
    ID = 9
    NAME = "PING-OK"


@dataclass(frozen=True, slots=True)
class Detach(Command):
    ID = 10
    NAME = "DETACH"


@dataclass(frozen=True, slots=True)
class DetachOk(Command):
    ID = 11
    NAME = "DETACH-OK"


@dataclass(frozen=True, slots=True)
class Invalid(Command):
    ID = 12
    NAME = "INVALID"
    FIELDS = (("reason", "text"),)
    reason: str


CODES_SINCE = 5  #: the protocol version from which refusals carry a code (INVALID-CODE)


class Refusal(IntEnum):
    """INVALID-CODE's ``code``: why the broker refused (version 5). New codes may come; a client treats
    one it does not know as a refusal of what it just asked."""

    BAD_FRAME = 1  #: malformed, or not allowed in the peering's state (an attached peering lives on)
    VERSION_UNSUPPORTED = 2  #: ATTACH asked for a version this broker does not speak: try a lower one
    STREAM_UNKNOWN = 3  #: ATTACH named a stream this broker does not serve
    BUSY = 4  #: the broker is at its session limit or past its memory budget: try again later
    PATTERN_REFUSED = 5  #: a subscription pattern is invalid, or not accepted here (matching: prefix)
    LIMIT = 6  #: a limit is reached (subscriptions per peering, producers per stream)
    FENCED = 7  #: a newer client claimed this producer name (version 6)
    PRODUCER_UNKNOWN = 8  #: the broker does not know the producer epoch resumed: it expired (version 6)
    OUT_OF_SEQUENCE = 9  #: a producer sequence beyond the next one: publishes in between were lost (version 6)
    PRODUCER_LIMIT = 10  #: the stream's producer table is full: a new producer must wait for idle ones to expire (6)
    TOO_LARGE = 11  #: a message body over the stream's maxMessageBytes: nothing of the frame was journaled
    JOURNAL_FULL = 12  #: the journal's volume is full: the peering's publishes since its last PING-OK are not
    #: journaled (none of them is confirmed) and the broker forgot the peering: attach again, resend
    UNAUTHORIZED = 13  #: a CURVE broker does not (or no longer) admit this client's key: waiting cannot help
    NOT_LEADER = 14  #: this broker is not (or no longer) the leader of the replicated stream: find the leader
    #: in ZooKeeper and attach there (the broker forgot the peering; unconfirmed publishes are resent)
    NOT_ENOUGH_REPLICAS = 15  #: fewer replicas than minInSync are in sync: the publishes since the last
    #: PING-OK were not confirmed and the broker forgot the peering: attach again and resend


@dataclass(frozen=True, slots=True)
class InvalidCode(Command):
    """Version 5 extension: INVALID with a :class:`Refusal` code."""

    ID = 18
    NAME = "INVALID-CODE"
    FIELDS = (("code", "number-2"), ("reason", "text"))
    code: int
    reason: str


@dataclass(frozen=True, slots=True)
class SubscribeTime(Command):
    """Version 2 extension: subscribe from a point in time."""

    ID = 13
    NAME = "SUBSCRIBE-TIME"
    FIELDS = (("pattern", "string"), ("since", "number-8"))
    pattern: str
    since: int


@dataclass(frozen=True, slots=True)
class DeliverTs(Command):
    """Version 2 extension: DELIVER with the broker's timestamp."""

    ID = 14
    NAME = "DELIVER-TS"
    FIELDS = (("sequence", "number-8"), ("timestamp", "number-8"), ("key", "string"), ("body", "chunk"))
    sequence: int
    timestamp: int
    key: str
    body: bytes


@dataclass(frozen=True, slots=True)
class PublishBatch(Command):
    """Version 3 extension: several PUBLISHes in one frame."""

    ID = 15
    NAME = "PUBLISH-BATCH"
    FIELDS = (("entries", "chunk"),)
    entries: bytes  #: (key string, body chunk) repeated
    items: tuple[tuple[str, bytes], ...] = field(default=(), compare=False)  #: the entries, decoded


@dataclass(frozen=True, slots=True)
class DeliverBatch(Command):
    """Version 3 extension: several deliveries in one frame, as journal records."""

    ID = 16
    NAME = "DELIVER-BATCH"
    FIELDS = (("records", "chunk"),)
    records: bytes  #: journal records (zeps._records layout)
    run: Records | None = field(default=None, compare=False)  #: the records, checked (set when decoded)

    @property
    def items(self) -> list[tuple[int, str, bytes, int]]:
        """(sequence, key, body, timestamp) of every record."""
        return (self.run or Records(self.records)).rows()


@dataclass(frozen=True, slots=True)
class DeliverRun(Command):
    """Version 4 extension: DELIVER-BATCH's records with their index and one CRC32C over both."""

    ID = 17
    NAME = "DELIVER-RUN"
    FIELDS = (("crc", "number-4"), ("index", "chunk"), ("records", "chunk"))
    crc: int
    index: bytes  #: the offset of each record in ``records``, number-4 each
    records: bytes  #: journal records (zeps._records layout)
    run: Records | None = field(default=None, compare=False)  #: the records, checked (set when decoded)

    @property
    def items(self) -> list[tuple[int, str, bytes, int]]:
        """(sequence, key, body, timestamp) of every record."""
        return (self.run or indexed_run(self.records, self.index, self.crc)).rows()


@dataclass(frozen=True, slots=True)
class Produce(Command):
    """Version 6 extension: publish on this peering as an idempotent producer."""

    ID = 19
    NAME = "PRODUCE"
    FIELDS = (("producer", "string"), ("epoch", "number-4"), ("generation", "number-8"))
    producer: str
    epoch: int = 0  #: 0: claim the name afresh (fencing older clients); else resume this epoch
    generation: int = 0  #: the unit of work (a Spark micro-batch + 1); 0: none


@dataclass(frozen=True, slots=True)
class ProduceOk(Command):
    """Version 6 extension: the producer's epoch, the last sequence the journal holds from it, and
    the sequence its current generation started after."""

    ID = 20
    NAME = "PRODUCE-OK"
    FIELDS = (("epoch", "number-4"), ("sequence", "number-8"), ("base", "number-8"))
    epoch: int
    sequence: int
    base: int = 0


@dataclass(frozen=True, slots=True)
class PublishSeq(Command):
    """Version 6 extension: PUBLISH with the producer's sequence."""

    ID = 21
    NAME = "PUBLISH-SEQ"
    FIELDS = (("sequence", "number-8"), ("key", "string"), ("body", "chunk"))
    sequence: int
    key: str
    body: bytes


@dataclass(frozen=True, slots=True)
class PublishBatchSeq(Command):
    """Version 6 extension: PUBLISH-BATCH whose entries carry ``sequence``, ``sequence`` + 1, …"""

    ID = 22
    NAME = "PUBLISH-BATCH-SEQ"
    FIELDS = (("sequence", "number-8"), ("entries", "chunk"))
    sequence: int
    entries: bytes  #: (key string, body chunk) repeated
    items: tuple[tuple[str, bytes], ...] = field(default=(), compare=False)  #: the entries, decoded


@dataclass(frozen=True, slots=True)
class Fetch(Command):
    """Version 7 extension: the records ``first`` .. ``last`` matching ``pattern``, then FETCH-END."""

    ID = 23
    NAME = "FETCH"
    FIELDS = (("pattern", "string"), ("first", "number-8"), ("last", "number-8"), ("since", "number-8"))
    pattern: str
    first: int
    last: int = LATEST  #: up to the durable tail when the broker reads the FETCH
    since: int = 0  #: ms since the epoch: start at the first record at or after it, when later (0: none)


@dataclass(frozen=True, slots=True)
class FetchEnd(Command):
    """Version 7 extension: the fetch covered ``first`` .. ``last`` (``first`` = ``last`` + 1: nothing)."""

    ID = 24
    NAME = "FETCH-END"
    FIELDS = (("first", "number-8"), ("last", "number-8"))
    first: int
    last: int


@dataclass(frozen=True, slots=True)
class Tail(Command):
    """Version 7 extension, multicast only: every record up to ``sequence`` was sent to the group."""

    ID = 25
    NAME = "TAIL"
    FIELDS = (("sequence", "number-8"),)
    sequence: int


@dataclass(frozen=True, slots=True)
class ReplicaFetch(Command):
    """Version 8 extension (replication), follower -> leader: the follower's copy ends at ``offset``
    of segment ``base``, after sequence ``last``; ``durable`` of it is on its disk (the leader counts
    that as acknowledged); ``known`` is the last epoch in its history; ``epoch`` the leader's epoch it
    follows. Answered with REPLICA-DATA (at once, or when there is more)."""

    ID = 26
    NAME = "REPLICA-FETCH"
    FIELDS = (("epoch", "number-8"), ("replica", "string"), ("base", "number-8"), ("offset", "number-8"),
              ("last", "number-8"), ("durable", "number-8"), ("known", "number-8"), ("most", "number-8"))  # fmt: skip
    epoch: int
    replica: str
    base: int
    offset: int
    last: int
    durable: int
    known: int = 0
    most: int = 1 << 20  #: bytes wanted at most


@dataclass(frozen=True, slots=True)
class ReplicaData(Command):
    """Version 8 extension, leader -> follower: ``data`` (whole journal entries, as the leader's files hold
    them) goes at ``offset`` of segment ``base``; ``next`` (not 0): the segment ends there and the next
    begins at that base; ``reset`` (1): start the copy over, empty, at ``base``. ``commit``: the last
    sequence confirmed; ``epochs``: the leader's epoch history after the follower's ``known`` (pairs of
    number-8); ``index``: where each record of ``data`` starts in the segment, and ``marks``: each
    producer mark's (start, end) (number-4 each); ``crc``: CRC32C of ``index``, ``marks`` then ``data``."""

    ID = 27
    NAME = "REPLICA-DATA"
    FIELDS = (("epoch", "number-8"), ("base", "number-8"), ("offset", "number-8"), ("next", "number-8"),
              ("commit", "number-8"), ("reset", "number-2"), ("epochs", "chunk"), ("crc", "number-4"),
              ("index", "chunk"), ("marks", "chunk"), ("data", "chunk"))  # fmt: skip
    epoch: int
    base: int
    offset: int
    next: int = 0
    commit: int = 0
    reset: int = 0
    epochs: bytes = b""
    crc: int = 0
    index: bytes = b""
    marks: bytes = b""
    data: bytes = b""


@dataclass(frozen=True, slots=True)
class ReplicaEpoch(Command):
    """Version 8 extension, follower -> leader: where does epoch ``asked`` end in your journal?"""

    ID = 28
    NAME = "REPLICA-EPOCH"
    FIELDS = (("epoch", "number-8"), ("asked", "number-8"))
    epoch: int  #: the leader epoch the follower follows
    asked: int  #: the last epoch of the follower's own history


@dataclass(frozen=True, slots=True)
class ReplicaEpochEnd(Command):
    """Version 8 extension, leader -> follower: the largest epoch not above the one asked (``found``) and
    its last sequence in the leader's journal (``end``): the follower cuts what it holds after ``end``."""

    ID = 29
    NAME = "REPLICA-EPOCH-END"
    FIELDS = (("epoch", "number-8"), ("found", "number-8"), ("end", "number-8"))
    epoch: int
    found: int
    end: int


COMMANDS: dict[int, type[Command]] = {
    c.ID: c
    for c in (Attach, AttachOk, Subscribe, SubscribeOk, Credit, Publish, Deliver, Ping, PingOk, Detach, DetachOk,
              Invalid, SubscribeTime, DeliverTs, PublishBatch, DeliverBatch, DeliverRun, InvalidCode, Produce,
              ProduceOk, PublishSeq, PublishBatchSeq, Fetch, FetchEnd, Tail, ReplicaFetch, ReplicaData, ReplicaEpoch,
              ReplicaEpochEnd)
}  # fmt: skip

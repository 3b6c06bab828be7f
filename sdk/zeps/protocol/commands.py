"""ZEPS commands and their codec: bytes in, commands out, no sockets (the ZEPS ABNF grammar, exactly).

Every frame is one command::

    signature (0xAA 0xA5) | command id (1 byte) | fields…

Field types: ``string`` = 1-byte length + text; ``chunk`` = 4-byte length + bytes; ``number-N`` =
N-byte unsigned integer, network byte order. Version 1 commands (ids 1-12) are byte-for-byte those
of the grammar, so a codec generated from the original zproto definition interoperates.

**Version 2 extension** (negotiated: a client that sends ATTACH with version 2 and gets ATTACH-OK
may use it; a version 1 peer never sees it; a broker that only knows version 1 answers INVALID and
the client may attach again with version 1):

* ``SUBSCRIBE-TIME`` (id 13, client → broker): ``pattern`` string, ``since`` number-8 —
  milliseconds since the epoch; replay starts at the first message at or after that time.
* ``DELIVER-TS`` (id 14, broker → client): ``sequence`` number-8, ``timestamp`` number-8 (ms),
  ``key`` string, ``body`` chunk — DELIVER plus the broker's timestamp. A version 2 session gets
  DELIVER-TS instead of DELIVER.

**Version 3 extension** (negotiated the same way; a broker answers an unsupported version with
INVALID and the client tries the next lower one): many messages per frame, for throughput.

* ``PUBLISH-BATCH`` (id 15, client → broker): ``entries`` chunk — one or more ``key`` string +
  ``body`` chunk pairs, exactly PUBLISH's two fields repeated. The broker journals them in order.
* ``DELIVER-BATCH`` (id 16, broker → client): ``records`` chunk — one or more journal records in the
  journal's own layout (:mod:`zeps._records`: length, CRC32C, sequence, timestamp, key, body),
  increasing sequences. The client checks every CRC. A version 3 session gets DELIVER-BATCH instead
  of DELIVER / DELIVER-TS; credit is charged at the frame's size as for any delivery.

**Version 4 extension** (negotiated the same way): a run checked once instead of record by record.

* ``DELIVER-RUN`` (id 17, broker → client): ``crc`` number-4, ``index`` chunk, ``records`` chunk —
  the records of a DELIVER-BATCH, with ``index`` the byte offset of each record in ``records``
  (number-4 each, in order) and ``crc`` the CRC32C of ``index`` then ``records``. The client checks
  that one CRC and the index against the records' own lengths, key lengths and sequence order
  (:func:`zeps._records.indexed_run`), never a per-record CRC: the broker checked those when it
  opened the journal segment, and this CRC covers the bytes from the broker to the client. A version 4
  session gets DELIVER-RUN instead of DELIVER-BATCH; credit is charged at the frame's size.

**Version 5 extension** (negotiated the same way): refusals a program can decide on.

* ``INVALID-CODE`` (id 18, broker → client): ``code`` number-2, ``reason`` text — INVALID plus a
  :class:`Refusal` code. The broker sends it instead of INVALID to a peering attached with version 5
  or more, and in answer to an ATTACH asking for version 5 or more (refused or not: such a client
  reads it). Everyone else, a version 1 peer above all, gets the plain INVALID as before. A peer the
  broker does not know (it expired or restarted) gets plain INVALID: the broker cannot know its
  version, so a client attached with version 5 reads a plain INVALID as "attach again".

**Version 6 extension** (negotiated the same way): idempotent producers. A peering that claims a
producer name publishes with a per-producer sequence; the broker journals each sequence once, drops
a publish it already holds (and still confirms it: the PING barrier covers it), and refuses one that
skips a sequence. The producer table lives in the journal (:mod:`zeps.journal.producers`).

* ``PRODUCE`` (id 19, client → broker): ``producer`` string, ``epoch`` number-4, ``generation``
  number-8 — claim ``producer`` for this peering. Epoch 0 claims it afresh: the broker raises its
  epoch, so an older client still publishing under the name is fenced. The epoch PRODUCE-OK gave
  resumes it (after a reconnect). ``generation`` (0: none) numbers units of work such as a Spark
  micro-batch: a higher one starts a new generation at the producer's current sequence, the same one
  is a retry of that unit, a lower one is fenced.
* ``PRODUCE-OK`` (id 20, broker → client): ``epoch`` number-4, ``sequence`` number-8, ``base``
  number-8 — the producer's epoch now, the last sequence the journal holds from it (0: none; the
  next publish is that + 1), and the sequence its current generation started after (``sequence`` -
  ``base`` publishes of this generation are held: a retry skips that many).
* ``PUBLISH-SEQ`` (id 21, client → broker): ``sequence`` number-8, ``key`` string, ``body`` chunk.
* ``PUBLISH-BATCH-SEQ`` (id 22, client → broker): ``sequence`` number-8, ``entries`` chunk —
  PUBLISH-BATCH whose entries carry ``sequence``, ``sequence`` + 1, …
* Refusals (INVALID-CODE): ``FENCED`` (a newer client claimed the producer), ``PRODUCER_UNKNOWN`` (a
  resumed epoch the broker does not know: the producer expired, idle longer than the broker's
  producer TTL), ``OUT_OF_SEQUENCE`` (a sequence beyond the next one: publishes in between never
  reached the broker), ``PRODUCER_LIMIT`` (the producer table is full). A refused publish is not
  journaled.

Refusal codes added later, within version 5's INVALID-CODE (a client treats a code it does not know
as a refusal of what it just asked): ``TOO_LARGE`` (11: a body over the stream's message limit,
:mod:`zeps.protocol.limits`; nothing of the frame is journaled) and ``JOURNAL_FULL`` (12: the journal's
volume is full; the peering's publishes since its last PING-OK were not journaled, the broker forgot
the peering, and the client attaches again and resends them), ``UNAUTHORIZED`` (13: a CURVE broker
with a list of clients does not, or no longer, admit the key the peer's connection authenticated
with; its sessions are forgotten).

**Version 7 extension** (negotiated the same way): bounded replay and the multicast output (seed 004,
"Multicast Output": real-time data over NORM or PGM, history never; a client that wants both uses a
ZEPS peering and the multicast group, and reconciles them).

* ``FETCH`` (id 23, client → broker): ``pattern`` string, ``first`` number-8, ``last`` number-8,
  ``since`` number-8 — deliver the records ``first`` .. ``last`` (inclusive) whose key matches
  ``pattern``, then FETCH-END. ``last`` = 2^64-1 means "up to the durable tail as the broker reads
  it when the FETCH arrives"; ``since`` (ms since the epoch; 0: none) moves the start to the first
  record at or after that time when that is later. The deliveries are the peering's usual ones
  (DELIVER-RUN on a version 7 peering) and take credit as any; a fetch never turns into a live
  subscription. One fetch at a time per peering (another is refused with ``LIMIT``), and a peering
  that fetches should not also subscribe: deliveries do not say which of the two they answer.
* ``FETCH-END`` (id 24, broker → client): ``first`` number-8, ``last`` number-8 — the fetch covered
  ``first`` .. ``last``: every matching record in that range was delivered before this frame.
  ``first`` = ``last`` + 1 when it covered nothing. A ``first`` above the one asked for (not above
  the ``last`` asked for) means the records in between are gone: retention removed them.
* ``TAIL`` (id 25, broker → multicast group, never on a peering): ``sequence`` number-8 — the last
  durable sequence; every record up to it was sent to the group before this frame. Sent every
  multicast heartbeat, so a receiver learns of records it lost even when nothing follows them.

A multicast message is two ZeroMQ frames: the stream's name (a SUB socket subscribes to it) and one
ZEPS frame, DELIVER-RUN (a run of newly durable records, each sent once) or TAIL
(:mod:`zeps.protocol.multicast`).

Conventions zeps adds on top of the grammar (all within its bytes):

* SUBSCRIBE ``latest`` is the last sequence the client has: delivery starts after it. 0 means
  "from the oldest retained message"; 2^64-1 (:data:`LATEST`) means "only messages from now on".
* A pattern is a routing-key prefix ("" matches everything), or a regular expression when it starts
  with ``~`` (``~^eu\\.(fr|de)\\.``), searched for in the key (anywhere, as ``re.search`` does) by
  RE2, in time linear in the key (:mod:`zeps.broker.matching`).
* Stream names, keys and patterns are VCHAR (printable ASCII, no spaces) as the grammar says;
  INVALID's ``reason`` is printable ASCII and may contain spaces.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import IntEnum
from typing import ClassVar

from crc32c import crc32c

from zeps._records import RecordFormatError, Records, indexed_run
from zeps.errors import LocalProtocolError, RemoteProtocolError

__all__ = [
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
    "Subscribe",
    "SubscribeOk",
    "SubscribeTime",
    "Tail",
    "decode",
    "encode",
    "encode_deliver",
    "encode_deliver_batch",
    "encode_deliver_run",
    "encode_publish_batch",
    "encode_publish_seq",
]

SIGNATURE = b"\xaa\xa5"
PROTOCOL = "ZEPS"
LATEST = 2**64 - 1
_U8, _U16, _U32, _U64 = struct.Struct("!B"), struct.Struct("!H"), struct.Struct("!I"), struct.Struct("!Q")


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
    BUSY = 4  #: the broker is at its session limit: try again later
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


COMMANDS: dict[int, type[Command]] = {
    c.ID: c
    for c in (Attach, AttachOk, Subscribe, SubscribeOk, Credit, Publish, Deliver, Ping, PingOk, Detach, DetachOk,
              Invalid, SubscribeTime, DeliverTs, PublishBatch, DeliverBatch, DeliverRun, InvalidCode, Produce,
              ProduceOk, PublishSeq, PublishBatchSeq, Fetch, FetchEnd, Tail)
}  # fmt: skip
_NUMBERS = {"number-2": (_U16, 0xFFFF), "number-4": (_U32, 0xFFFFFFFF), "number-8": (_U64, 2**64 - 1)}


def _is_vchar(text: str) -> bool:
    """VCHAR: printable ASCII, no space (checked in C, not per character in Python)."""
    return text.isascii() and text.isprintable() and " " not in text


def _is_printable(text: str) -> bool:
    return text.isascii() and text.isprintable()


# Fast paths for the commands every message takes (PUBLISH in, DELIVER out): one struct call each
# instead of the generic field loop. Byte-for-byte the same frames (the golden tests check both).
_DELIVER_HEAD = struct.Struct("!2sBQB")  # signature, id, sequence, key length
_DELIVER_TS_HEAD = struct.Struct("!2sBQQB")  # signature, id, sequence, timestamp, key length


def encode_deliver(sequence: int, key: str, body: bytes, timestamp: int | None = None) -> bytes:
    """DELIVER (or DELIVER-TS with a timestamp) for a key already validated when it was published."""
    raw = key.encode("ascii")
    if timestamp is None:
        head = _DELIVER_HEAD.pack(SIGNATURE, Deliver.ID, sequence, len(raw))
    else:
        head = _DELIVER_TS_HEAD.pack(SIGNATURE, DeliverTs.ID, sequence, timestamp, len(raw))
    return b"".join((head, raw, _U32.pack(len(body)), body))


def _decode_deliver(frame: bytes) -> Deliver | DeliverTs:
    head = _DELIVER_TS_HEAD if frame[2] == DeliverTs.ID else _DELIVER_HEAD
    if len(frame) < head.size:
        raise RemoteProtocolError("DELIVER truncated")
    fields = head.unpack_from(frame)
    klen = fields[-1]
    end = head.size + klen
    if end + 4 > len(frame):
        raise RemoteProtocolError(f"DELIVER.key claims {klen} bytes, or the body length is missing")
    key = frame[head.size : end].decode("latin-1")
    if not _is_vchar(key):
        raise RemoteProtocolError("DELIVER.key is not printable ASCII")
    (length,) = _U32.unpack_from(frame, end)
    if end + 4 + length != len(frame):
        raise RemoteProtocolError(f"DELIVER body claims {length} bytes, {len(frame) - end - 4} follow")
    body = frame[end + 4 :]
    if head is _DELIVER_TS_HEAD:
        return DeliverTs(sequence=fields[2], timestamp=fields[3], key=key, body=body)
    return Deliver(sequence=fields[2], key=key, body=body)


def _key_and_body(frame: bytes, at: int, name: str) -> tuple[str, bytes]:
    """The ``key`` string and ``body`` chunk that end a PUBLISH (-SEQ) frame, from byte ``at``."""
    if len(frame) < at + 1:
        raise RemoteProtocolError(f"{name} truncated before key")
    klen = frame[at]
    end = at + 1 + klen
    if end + 4 > len(frame):
        raise RemoteProtocolError(f"{name}.key claims {klen} bytes, or the body length is missing")
    key = frame[at + 1 : end].decode("latin-1")
    if not _is_vchar(key):
        raise RemoteProtocolError(f"{name}.key is not printable ASCII")
    (length,) = _U32.unpack_from(frame, end)
    if end + 4 + length != len(frame):
        problem = "has bytes after its last field" if end + 4 + length < len(frame) else f"body claims {length} bytes"
        raise RemoteProtocolError(f"{name} {problem}")
    return key, frame[end + 4 :]


def _decode_publish(frame: bytes) -> Publish:
    key, body = _key_and_body(frame, 3, "PUBLISH")
    return Publish(key=key, body=body)


_PUBLISH_HEAD = struct.Struct("!2sBB")  # signature, id, key length
_BATCH_HEAD = struct.Struct("!2sBI")  # signature, id, chunk length
_BATCH_SEQ_HEAD = struct.Struct("!2sBQI")  # signature, id, sequence, chunk length
_PUBLISH_SEQ_HEAD = struct.Struct("!2sBQB")  # signature, id, sequence, key length


def encode_publish_batch(items: list[tuple[str, bytes]], sequence: int | None = None) -> bytes:
    """PUBLISH-BATCH for ``items`` (key, body) — PUBLISH-BATCH-SEQ with the producer ``sequence`` of
    the first; LocalProtocolError for a key PUBLISH could not carry."""
    entries = _encode_entries(items)
    if sequence is None:
        return _BATCH_HEAD.pack(SIGNATURE, PublishBatch.ID, len(entries)) + entries
    return _BATCH_SEQ_HEAD.pack(SIGNATURE, PublishBatchSeq.ID, sequence, len(entries)) + entries


def encode_publish_seq(sequence: int, key: str, body: bytes) -> bytes:
    """PUBLISH-SEQ (the hot path of an idempotent producer's single publishes)."""
    if not (_is_vchar(key) and len(key) < 256):
        raise LocalProtocolError(f"PUBLISH-SEQ.key must be printable ASCII without spaces, < 256: {key!r}")
    return b"".join((_PUBLISH_SEQ_HEAD.pack(SIGNATURE, PublishSeq.ID, sequence, len(key)), key.encode("ascii"),
                     _U32.pack(len(body)), body))  # fmt: skip


def _encode_entries(items: list[tuple[str, bytes]]) -> bytes:
    parts: list[bytes] = []
    pack_len, pack_u8 = _U32.pack, _U8.pack
    checked: set[str] = set()
    for key, body in items:
        if key not in checked:
            if not (_is_vchar(key) and len(key) < 256):
                raise LocalProtocolError(f"PUBLISH-BATCH key must be printable ASCII without spaces, < 256: {key!r}")
            checked.add(key)
        parts += (pack_u8(len(key)), key.encode("ascii"), pack_len(len(body)), body)
    return b"".join(parts)


def encode_deliver_batch(records: bytes) -> bytes:
    """DELIVER-BATCH carrying ``records``, journal records exactly as stored."""
    return _BATCH_HEAD.pack(SIGNATURE, DeliverBatch.ID, len(records)) + records


_RUN_HEAD = struct.Struct("!2sBII")  # signature, id, crc, index length


def encode_deliver_run(records: bytes, index: bytes) -> bytes:
    """DELIVER-RUN carrying ``records`` (journal records as stored) and ``index`` (the offset of each
    record in ``records``, number-4 each); the CRC32C is computed here."""
    crc = crc32c(records, crc32c(index))
    return b"".join(
        (_RUN_HEAD.pack(SIGNATURE, DeliverRun.ID, crc, len(index)), index, _U32.pack(len(records)), records)
    )


def _decode_deliver_run(frame: bytes) -> DeliverRun:
    if len(frame) < _RUN_HEAD.size:
        raise RemoteProtocolError("DELIVER-RUN truncated")
    _, _, crc, index_length = _RUN_HEAD.unpack_from(frame)
    records_at = _RUN_HEAD.size + index_length + 4
    if records_at > len(frame):
        raise RemoteProtocolError(f"DELIVER-RUN.index claims {index_length} bytes, or the records length is missing")
    (length,) = _U32.unpack_from(frame, records_at - 4)
    if records_at + length != len(frame):
        raise RemoteProtocolError(f"DELIVER-RUN.records claims {length} bytes, {len(frame) - records_at} follow")
    index, records = frame[_RUN_HEAD.size : records_at - 4], frame[records_at:]
    try:
        run = indexed_run(records, index, crc)
    except RecordFormatError as exc:
        raise RemoteProtocolError(f"DELIVER-RUN {exc}") from None
    return DeliverRun(crc=crc, index=index, records=records, run=run)


def _batch_body(frame: bytes, name: str) -> bytes:
    if len(frame) < _BATCH_HEAD.size:
        raise RemoteProtocolError(f"{name} truncated")
    (length,) = _U32.unpack_from(frame, 3)
    if _BATCH_HEAD.size + length != len(frame):
        raise RemoteProtocolError(f"{name} claims {length} bytes, {len(frame) - _BATCH_HEAD.size} follow")
    if not length:
        raise RemoteProtocolError(f"{name} is empty")
    return frame[_BATCH_HEAD.size :]


def _decode_publish_batch(frame: bytes) -> PublishBatch:
    entries = _batch_body(frame, "PUBLISH-BATCH")
    return PublishBatch(entries=entries, items=_decode_entries(entries, "PUBLISH-BATCH"))


def _decode_publish_batch_seq(frame: bytes) -> PublishBatchSeq:
    if len(frame) < _BATCH_SEQ_HEAD.size:
        raise RemoteProtocolError("PUBLISH-BATCH-SEQ truncated")
    _, _, sequence, length = _BATCH_SEQ_HEAD.unpack_from(frame)
    follow = len(frame) - _BATCH_SEQ_HEAD.size
    if length != follow:
        raise RemoteProtocolError(f"PUBLISH-BATCH-SEQ claims {length} bytes, {follow} follow")
    if not length:
        raise RemoteProtocolError("PUBLISH-BATCH-SEQ is empty")
    entries = frame[_BATCH_SEQ_HEAD.size :]
    items = _decode_entries(entries, "PUBLISH-BATCH-SEQ")
    return PublishBatchSeq(sequence=sequence, entries=entries, items=items)


def _decode_publish_seq(frame: bytes) -> PublishSeq:
    if len(frame) < 11:
        raise RemoteProtocolError("PUBLISH-SEQ truncated before key")
    (sequence,) = _U64.unpack_from(frame, 3)
    key, body = _key_and_body(frame, 11, "PUBLISH-SEQ")
    return PublishSeq(sequence=sequence, key=key, body=body)


def _decode_entries(entries: bytes, name: str) -> tuple[tuple[str, bytes], ...]:
    """The (key, body) entries of a PUBLISH-BATCH (-SEQ)."""
    items: list[tuple[str, bytes]] = []
    offset, size, checked = 0, len(entries), set[str]()
    while offset < size:
        klen = entries[offset]
        end = offset + 1 + klen
        if end + 4 > size:
            raise RemoteProtocolError(f"{name} entry {len(items)} is truncated")
        key = entries[offset + 1 : end].decode("latin-1")
        if key not in checked:
            if not _is_vchar(key):
                raise RemoteProtocolError(f"{name} entry {len(items)} key is not printable ASCII")
            checked.add(key)
        (length,) = _U32.unpack_from(entries, end)
        offset = end + 4 + length
        if offset > size:
            raise RemoteProtocolError(f"{name} entry {len(items)} body claims {length} bytes")
        items.append((key, entries[end + 4 : offset]))
    return tuple(items)


def _decode_deliver_batch(frame: bytes) -> DeliverBatch:
    records = _batch_body(frame, "DELIVER-BATCH")
    try:
        run = Records(records)
    except RecordFormatError as exc:
        raise RemoteProtocolError(f"DELIVER-BATCH {exc}") from None
    return DeliverBatch(records=records, run=run)


def encode(command: Command) -> bytes:
    """One frame for ``command``; LocalProtocolError if a field cannot be expressed."""
    if type(command) is Publish and _is_vchar(command.key) and len(command.key) < 256:  # the hot path
        return b"".join((_PUBLISH_HEAD.pack(SIGNATURE, Publish.ID, len(command.key)), command.key.encode("ascii"),
                         _U32.pack(len(command.body)), command.body))  # fmt: skip
    parts = [SIGNATURE, _U8.pack(command.ID)]
    for name, kind in command.FIELDS:
        value = getattr(command, name)
        if kind in ("string", "text"):
            ok = _is_vchar(value) if kind == "string" else _is_printable(value)
            if not ok:
                allowed = "printable ASCII without spaces" if kind == "string" else "printable ASCII"
                raise LocalProtocolError(f"{command.NAME}.{name} must be {allowed}: {value!r}")
            raw = value.encode("ascii")
            if len(raw) > 255:
                raise LocalProtocolError(f"{command.NAME}.{name} is {len(raw)} bytes; a string holds at most 255")
            parts += [_U8.pack(len(raw)), raw]
        elif kind == "chunk":
            if len(value) > 0xFFFFFFFF:
                raise LocalProtocolError(f"{command.NAME}.{name} is larger than a chunk can hold (4 GiB)")
            parts += [_U32.pack(len(value)), bytes(value)]
        else:
            packer, top = _NUMBERS[kind]
            if not 0 <= value <= top:
                raise LocalProtocolError(f"{command.NAME}.{name}={value} does not fit {kind}")
            parts.append(packer.pack(value))
    return b"".join(parts)


#: the commands that carry messages, decoded by hand (the generic field walk below is for the rest)
_FAST_DECODERS: dict[int, Callable[[bytes], Command]] = {
    Publish.ID: _decode_publish, PublishSeq.ID: _decode_publish_seq, PublishBatch.ID: _decode_publish_batch,
    PublishBatchSeq.ID: _decode_publish_batch_seq, Deliver.ID: _decode_deliver, DeliverTs.ID: _decode_deliver,
    DeliverBatch.ID: _decode_deliver_batch, DeliverRun.ID: _decode_deliver_run,
}  # fmt: skip


def decode(frame: bytes) -> Command:
    """The command in one frame; RemoteProtocolError (with a reason fit for INVALID) if malformed."""
    if len(frame) < 3:
        raise RemoteProtocolError(f"frame of {len(frame)} bytes is too short for a command")
    if frame[:2] != SIGNATURE:
        raise RemoteProtocolError(f"bad signature {frame[:2].hex()} (expected aaa5)")
    fast = _FAST_DECODERS.get(frame[2])
    if fast is not None:
        return fast(frame)
    cls = COMMANDS.get(frame[2])
    if cls is None:
        raise RemoteProtocolError(f"unknown command id {frame[2]}")
    offset, values = 3, dict[str, object]()
    for name, kind in cls.FIELDS:
        if kind in ("string", "text"):
            if offset + 1 > len(frame):
                raise RemoteProtocolError(f"{cls.NAME} truncated before {name}")
            length = frame[offset]
            raw = frame[offset + 1 : offset + 1 + length]
            if len(raw) != length:
                raise RemoteProtocolError(f"{cls.NAME}.{name} claims {length} bytes, {len(raw)} follow")
            text = raw.decode("latin-1")
            if not (_is_vchar(text) if kind == "string" else _is_printable(text)):
                raise RemoteProtocolError(f"{cls.NAME}.{name} is not printable ASCII")
            values[name] = text
            offset += 1 + length
        elif kind == "chunk":
            if offset + 4 > len(frame):
                raise RemoteProtocolError(f"{cls.NAME} truncated before {name}")
            (length,) = _U32.unpack_from(frame, offset)
            body = frame[offset + 4 : offset + 4 + length]
            if len(body) != length:
                raise RemoteProtocolError(f"{cls.NAME}.{name} claims {length} bytes, {len(body)} follow")
            values[name] = bytes(body)
            offset += 4 + length
        else:
            packer, _ = _NUMBERS[kind]
            if offset + packer.size > len(frame):
                raise RemoteProtocolError(f"{cls.NAME} truncated in {name}")
            values[name] = packer.unpack_from(frame, offset)[0]
            offset += packer.size
    if offset != len(frame):
        raise RemoteProtocolError(f"{cls.NAME} has {len(frame) - offset} bytes after its last field")
    return cls(**values)


def deliver_size(sequence: int, key: str, body_len: int, *, timestamps: bool) -> int:
    """Wire size of a DELIVER (or DELIVER-TS) frame: what a delivery costs in credit."""
    return 2 + 1 + 8 + (8 if timestamps else 0) + 1 + len(key) + 4 + body_len

"""The broker's logic without sockets: sessions, streams, routing, credit, replay, heartbeats.

The network adapter (:mod:`zeps.broker.server`) feeds frames in (:meth:`BrokerCore.receive`),
asks for work (:meth:`BrokerCore.pump`), and sends what comes out — and tells the core when a send
could not be made (:meth:`BrokerCore.unsent`), which rewinds that subscription as if it had no credit.

Routing. Each subscription has a cursor: the next sequence it will consider. A subscription whose
cursor is at the journal's durable tail is *live*: newly durable records are routed to it at once
(a prefix trie, plus the few regular-expression subscriptions). One that is behind — a late joiner,
or one that ran out of credit — *replays* from the journal with the same filter until it reaches
the tail, and then is live again. Live delivery is replay at the tail, so the switch is invisible.

Frames. Routing and replay work on journal chunks (runs of records as stored), not single records.
A version 3 session gets each run it matches as one DELIVER-BATCH — the journal's bytes as they are,
or the matching records cut out of them — so a message costs the broker almost nothing beyond its
journal write; a version 4 session gets the same bytes as DELIVER-RUN, with the run's index and one
CRC32C (computed in C per frame), so the client checks a run at once; older sessions get one
DELIVER (-TS) per record from the same chunks.

Credit. A delivery costs its frame's size. With too little credit a subscription stops and
keeps its cursor; CREDIT resumes it at once. A session's credit is shared by its subscriptions.

Fairness and memory. ``pump`` hands out at most ``pump_budget_bytes`` per call, visiting lagging
subscriptions round-robin, and never reads more than one journal batch per subscription per visit.
Sessions, subscriptions per session and pattern sizes are bounded.

Idempotent producers (version 6). A session that sent PRODUCE publishes with sequences; the stream's
journal keeps the producer table (:mod:`zeps.journal.producers`) and the broker asks it at once, as
each publish arrives: the leading entries it already holds are dropped (the PING barrier after them
still confirms them), the rest go to the journal with a group mark that records the table's change.
A flush cuts a stream's publishes into groups of about a quarter segment at the ends of idempotent
publishes (a group never spans segments, so this bounds how far a segment overshoots).
A fenced, expired or out-of-sequence publish is refused with INVALID-CODE and not journaled.

Fetches (version 7). FETCH is a subscription with an end: it replays the records of its range that
match its pattern, never goes live, and ends with FETCH-END once everything in the range was handed
to the adapter (a delivery or FETCH-END the adapter could not send reopens it, as for any replay).

Multicast output (version 7, ``multicast_heartbeat_s`` set). Every record that becomes durable is
also sent once to the multicast group (:meth:`BrokerCore.take_multicast`), whatever the
subscriptions: the broker's work per record does not depend on how many receivers there are. Runs
gather for ``multicast_linger_s`` (5 ms) or until they fill a message, so a trickle of publishes
does not become a packet each.
A stream that sent nothing for a heartbeat sends TAIL (its last durable sequence), so a receiver
learns of the records it lost even when nothing follows them.

Replication (version 8, :mod:`zeps.broker.replication`). The adapter tells the core who leads a
replicated stream (:meth:`BrokerCore.lead`, :meth:`BrokerCore.follow`), as ZooKeeper decides. A
leader answers its followers' REPLICA-FETCH with its segment bytes, holds PING-OK and PRODUCE-OK
until the in-sync replicas have the records durably, and routes only up to that commit point. A
follower's journal is written by its copy of the leader's (:meth:`BrokerCore.copied`); it refuses
clients that attach with a version below 8 (NOT_LEADER) and serves those of version 8 reads only
(SUBSCRIBE, FETCH: replay load taken off the leader), up to the leader's commit point as it last
heard it, never beyond what it holds durably; their publishes get NOT_LEADER.
"""

from __future__ import annotations

import bisect
import collections
import contextlib
import itertools
import logging
import re
import time
from array import array
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import crc32c

from zeps.broker.appends import AppendBuffer
from zeps.broker.matching import Matcher, PatternError, PrefixTrie, compile_pattern
from zeps.broker.outbox import MulticastOutbox
from zeps.broker.replication import REPLICATION_VERSION, Leadership, encode_epochs
from zeps.errors import ProtocolError
from zeps.journal import Chunk, Journal, JournalConfig, JournalWriteError, ReplicaSlice
from zeps.journal.producers import ProducerRefusedError, ProducerState
from zeps.protocol import (
    LATEST,
    Attach,
    AttachOk,
    Connection,
    Credit,
    Detach,
    DetachOk,
    Fetch,
    FetchEnd,
    Invalid,
    InvalidCode,
    Ping,
    PingOk,
    Produce,
    ProduceOk,
    Publish,
    PublishBatch,
    PublishBatchSeq,
    PublishSeq,
    Refusal,
    ReplicaData,
    ReplicaEpoch,
    ReplicaEpochEnd,
    ReplicaFetch,
    Subscribe,
    SubscribeOk,
    SubscribeTime,
    decode,
    encode,
    encode_deliver,
    encode_deliver_batch,
    encode_deliver_run,
    publish_fields,
    publish_seq_fields,
    run_index,
    stays_attached,
)
from zeps.protocol.commands import CODES_SINCE, PROTOCOL, SIGNATURE
from zeps.protocol.connection import SUPPORTED_VERSIONS
from zeps.protocol.limits import DEFAULT_MAX_MESSAGE_BYTES, MAX_CREDIT_BYTES, max_frame_bytes

__all__ = ["BrokerConfig", "BrokerCore", "Outgoing"]

#: PUBLISH-SEQ and PUBLISH, the frames of a client publishing one message at a time (idempotent or
#: not), skip the state machine's objects when it would take them (an attached session of a version
#: that has them): command id -> the version from which it may
_ONE_MESSAGE = {c.ID: v for c in (PublishSeq, Publish) if (v := stays_attached("broker", "receive", c)) is not None}

log = logging.getLogger(__name__)

_STREAM_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")


@dataclass(frozen=True)
class BrokerConfig:
    data_dir: Path
    streams: tuple[str, ...]  #: the streams this broker serves (from its manifest/config)
    journal: JournalConfig = field(default_factory=JournalConfig)
    heartbeat_s: float = 5.0  #: PING a peer silent this long
    ttl_s: float = 30.0  #: forget a peer silent this long (its state is freed)
    max_sessions: int = 10_000
    max_subscriptions: int = 64  #: per session
    pump_budget_bytes: int = 4 * 1024 * 1024  #: delivered per pump() call, across all sessions
    replay_batch: int = 512  #: records read from the journal per subscription visit (older sessions)
    batch_bytes: int = 1024 * 1024  #: the largest DELIVER-BATCH (a record larger than this goes alone)
    #: subscription patterns accepted: "prefix" refuses ``~regex`` patterns with INVALID (ZepsStream ``matching``)
    matching: Literal["prefix", "prefix-and-regex"] = "prefix-and-regex"
    #: with a multicast output: a stream silent this long sends TAIL to the group (None: no multicast output)
    multicast_heartbeat_s: float | None = None
    #: the largest multicast message (a DELIVER-RUN frame); a record that does not fit goes only to the journal
    multicast_max_bytes: int = 1024 * 1024
    #: newly durable records wait this long for more to fill a multicast message (fewer, fuller messages)
    multicast_linger_s: float = 0.005
    #: a message body's limit (ZepsStream ``maxMessageBytes``): a larger one is refused with TOO_LARGE
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    #: a session's credit at most: CREDIT beyond it is clamped (what a peer can make the broker queue)
    max_credit_bytes: int = MAX_CREDIT_BYTES
    #: a replicated stream with fewer in-sync replicas than minInSync: "refuse" publishes at once
    #: (NOT_ENOUGH_REPLICAS), or "wait" until enough are back (publishers see a pause, then confirmations)
    under_replicated: Literal["refuse", "wait"] = "refuse"
    #: bytes a follower gets per REPLICA-DATA at most (its fetch may ask for less)
    replica_fetch_bytes: int = 4 * 1024 * 1024
    #: bytes a second a follower outside the in-sync set (catching up) is sent at most (None: no limit),
    #: so that rebuilding a replica does not take the leader's disk and network from its publishers
    replica_catchup_bytes_per_s: int | None = None

    @property
    def max_frame_bytes(self) -> int:
        """The largest frame a peer may send (the adapter's ``ZMQ_MAXMSGSIZE``)."""
        return max_frame_bytes(self.max_message_bytes)


@dataclass
class Outgoing:
    """One frame to send; deliveries carry what is needed to undo them if the send fails."""

    peer: bytes
    frame: bytes
    subscription: _Subscription | None = None
    sequence: int = 0  #: the first sequence it delivers
    cost: int = 0
    count: int = 0  #: messages it delivers
    replayed: bool = False  #: read from the journal for a subscription behind the tail (not live routing)
    ends_fetch: bool = False  #: FETCH-END of ``subscription`` (a fetch): unsent, the fetch is reopened


@dataclass(eq=False)
class _Subscription:
    session: _Session
    matcher: Matcher
    cursor: int
    id: int = 0
    #: a fetch (FETCH): the last sequence of its range (it ends there, never live), and where its range began
    end: int | None = None
    start: int = 0

    @property
    def live(self) -> bool:
        return self in self.session.stream.live_set

    @property
    def lag(self) -> int:
        """Records between the cursor and the durable tail."""
        return max(0, self.session.stream.journal.durable + 1 - self.cursor)


@dataclass(eq=False)
class _Stream:
    name: str
    journal: Journal
    trie: PrefixTrie = field(default_factory=PrefixTrie)
    live_regex: set[_Subscription] = field(default_factory=set)
    live_set: set[_Subscription] = field(default_factory=set)
    routed: int = 0  # the durable sequence up to which new records have been routed
    messages_in: int = 0  # cumulative counters, read by the metrics exporter
    bytes_in: int = 0
    messages_out: int = 0
    bytes_out: int = 0
    messages_replayed: int = 0  # of messages_out: served from the journal to subscriptions behind the tail
    fell_behind: int = 0  # times a live subscription lost pace (no credit, a full socket) and went to replay
    duplicates: int = 0  # publishes of idempotent producers dropped: the journal held them already
    refused_too_large: int = 0  # frames refused: a message body over max_message_bytes
    refused_journal_full: int = 0  # publishes refused: the journal's volume was full
    journal_full_logged: float = 0.0  # when a full journal was last logged (once a minute at most)
    outbox: MulticastOutbox = field(default_factory=MulticastOutbox)  # the multicast output's (when there is one)
    #: replication (None, False: a stream of one broker): the leader's view of its followers, or
    #: whether this broker follows (its journal is a copy; it serves version 8 peers reads only)
    leader: Leadership | None = None
    following: bool = False
    #: a follower's view of the leader's commit point (it routes to its readers up to there)
    commit: int = 0
    #: the leader's confirmations (PING-OK, PRODUCE-OK) held until the commit point passes their
    #: sequence (-1: the sequence is set at the next flush): [sequence, peer, frame]
    held: deque[list[Any]] = field(default_factory=deque)
    waiting: dict[bytes, tuple[ReplicaFetch, float]] = field(default_factory=dict)  # followers' fetches, held
    catchup: dict[str, list[float]] = field(default_factory=dict)  # per follower catching up: [second began, bytes]
    refused_under_replicated: int = 0  # publishes refused: fewer in-sync replicas than minInSync

    @property
    def committed(self) -> int:
        """The last sequence confirmed and delivered: the durable tail, or a replicated leader's commit."""
        if self.leader is not None:
            return self.leader.commit
        return min(self.commit, self.journal.durable) if self.following else self.journal.durable


@dataclass(eq=False)
class _Session:
    peer: bytes
    conn: Connection
    stream: _Stream
    credit: int = 0
    subscriptions: list[_Subscription] = field(default_factory=list)
    last_heard: float = 0.0
    last_ping: float = 0.0
    blocked_until: float = 0.0  # the socket refused a send: wait before trying again
    producer: str | None = None  # the producer name this session claimed (PRODUCE), and its epoch
    epoch: int = 0
    key: str | None = None  # the CURVE public key its connection authenticated with (a CURVE broker)

    @property
    def timestamps(self) -> bool:
        return self.conn.version >= 2

    @property
    def batches(self) -> bool:
        return self.conn.version >= 3

    @property
    def indexed(self) -> bool:
        """DELIVER-RUN (records, their index and one CRC) rather than DELIVER-BATCH."""
        return self.conn.version >= 4


class BrokerCore:
    """All broker state; single-threaded (the adapter's loop owns it)."""

    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self.streams: dict[str, _Stream] = {}
        self.sessions: dict[bytes, _Session] = {}
        self._pending: deque[Outgoing] = deque()
        self._lagging: deque[_Subscription] = deque()
        self._ids = itertools.count(1)
        self._appends: dict[str, AppendBuffer] = {}
        self._queued_bytes = 0  # delivery bytes queued, ever: pump() measures its budget with it
        self._clock_ms = _now_ms()  # wall time for producers' last activity (TTL): set once per flush
        self.invalid_frames = 0
        #: refusals sent (INVALID, INVALID-CODE), by (the peer's stream, "" before ATTACH; the code's
        #: name): the labels are the streams served and the codes, never anything a peer chose
        self.refusals: collections.Counter[tuple[str, str]] = collections.Counter()
        #: the client public keys admitted (a CURVE broker with a list of clients; None: anyone)
        self.authorized: frozenset[str] | None = None
        #: the key a peer without a session authenticated with, for its next frame (the adapter sets it)
        self.peer_keys: dict[bytes, str | None] = {}
        self._max_body = config.max_message_bytes
        # what an attached session's commands do, by type (ATTACH comes before a session exists)
        self._handlers: dict[type, Callable[[_Session, Any], None]] = {
            PublishSeq: self._on_publish_seq, PublishBatchSeq: self._on_publish_batch_seq,
            Publish: self._on_publish, PublishBatch: self._on_publish_batch, Produce: self._produce,
            Credit: self._on_credit, Subscribe: self._subscribe, SubscribeTime: self._subscribe, Fetch: self._fetch,
            Ping: self._on_ping, Detach: self._on_detach, ReplicaFetch: self._on_replica_fetch,
            ReplicaEpoch: self._on_replica_epoch,
        }  # fmt: skip
        #: a follower's: the same, but writes get NOT_LEADER (only the leader journals publishes)
        self._following_handlers = {**self._handlers, **dict.fromkeys(
            (PublishSeq, PublishBatchSeq, Publish, PublishBatch, Produce), self._write_on_follower)}  # fmt: skip

    def open(self) -> BrokerCore:
        for name in self.config.streams:
            if not _STREAM_NAME.match(name):
                raise ValueError(f"stream name {name!r} is not valid (lower-case letters, digits, '-', '.')")
            journal = Journal(self.config.data_dir / name, self.config.journal, name=name).open()
            self.streams[name] = _Stream(name, journal, routed=journal.durable)
        return self

    def close(self) -> None:
        self.flush_appends()
        for stream in self.streams.values():
            stream.journal.close()

    # -- input ----------------------------------------------------------------------------------
    def receive(self, peer: bytes, frame: bytes, now: float | None = None) -> None:
        """Handle one frame from ``peer``. Bad input gets INVALID; other peers are unaffected."""
        now = time.monotonic() if now is None else now
        session = self.sessions.get(peer)
        if (
            session is not None
            and len(frame) > 2
            and session.conn.version >= _ONE_MESSAGE.get(frame[2], 1 << 30)
            and session.conn.state == "ATTACHED"
            and frame[:2] == SIGNATURE
            and not session.stream.following
            and self._one_message(session, frame, now)
        ):
            return
        key = self.peer_keys.pop(peer, None) if session is None and self.peer_keys else None
        conn = session.conn if session else Connection("broker")
        try:
            command = conn.receive(frame)
        except ProtocolError as exc:
            self.invalid_frames += 1
            code, asked = Refusal.BAD_FRAME, session.conn.version if session else 0
            if session is None:  # an ATTACH refused by the state machine says what its sender reads
                with contextlib.suppress(ProtocolError):
                    attach = decode(frame)
                    if isinstance(attach, Attach):
                        asked = attach.version
                        if attach.protocol == PROTOCOL and attach.version not in SUPPORTED_VERSIONS:
                            code = Refusal.VERSION_UNSUPPORTED
            self._invalid(peer, str(exc), code, version=asked, forget=session is None)
            return
        if session is not None:
            session.last_heard = now
        if isinstance(command, Attach):
            self._attach(peer, conn, command, now, key)
            return
        assert session is not None  # the state machine only allows other commands after ATTACH
        handlers = self._following_handlers if session.stream.following else self._handlers
        handler = handlers.get(type(command))  # a table: one lookup, whatever the command
        if handler is not None:
            handler(session, command)

    def _one_message(self, session: _Session, frame: bytes, now: float) -> bool:
        """A PUBLISH-SEQ or PUBLISH of an attached session, as :meth:`receive` would handle it (the
        state machine keeps the session attached), without a command object; False if the frame is
        malformed, for the general path to refuse it with its reason."""
        try:
            if frame[2] == PublishSeq.ID:
                sequence, key, body = publish_seq_fields(frame)
            else:
                sequence, (key, body) = -1, publish_fields(frame)
        except ProtocolError:
            return False
        session.last_heard = now
        if len(body) > self._max_body:
            self._too_large(session, len(body))
        elif sequence >= 0:
            self._publish_seq(session, sequence, ((key, body),), len(key) + len(body))
        else:
            self._append_plain(session, key, body)
        return True

    # -- the commands of an attached session (the table ``_handlers``) -------------------------
    # Publishes: a body over the limit refuses the frame (TOO_LARGE); an idempotent producer's go
    # through its table; the rest wait in the stream's append buffer for the loop's flush.
    def _on_publish_seq(self, session: _Session, command: PublishSeq) -> None:
        body = command.body  # the usual frame of every client: one message of an idempotent producer
        if len(body) > self._max_body:
            self._too_large(session, len(body))
            return
        self._publish_seq(session, command.sequence, ((command.key, body),), len(command.key) + len(body))

    def _on_publish_batch_seq(self, session: _Session, command: PublishBatchSeq) -> None:
        if len(command.entries) > self._max_body and self._oversized(session, command.items):
            return
        self._publish_seq(session, command.sequence, command.items, len(command.entries))

    def _on_publish(self, session: _Session, command: Publish) -> None:
        if len(command.body) > self._max_body:
            self._too_large(session, len(command.body))
            return
        self._append_plain(session, command.key, command.body)

    def _append_plain(self, session: _Session, key: str, body: bytes) -> None:
        stream = session.stream
        pending = self._appending(stream)
        pending.add(((key, body),), len(key) + len(body))
        pending.peers.add(session.peer)
        stream.messages_in += 1
        stream.bytes_in += len(body)

    def _on_publish_batch(self, session: _Session, command: PublishBatch) -> None:
        stream = session.stream
        if len(command.entries) > self._max_body and self._oversized(session, command.items):
            return
        pending = self._appending(stream)
        pending.add(command.items, len(command.entries))
        pending.peers.add(session.peer)
        stream.messages_in += len(command.items)
        stream.bytes_in += len(command.entries)

    def _write_on_follower(self, session: _Session, _command: Any) -> None:
        """A publish or PRODUCE sent to a follower (by a version 8 peer, attached to read): never
        journaled here; NOT_LEADER, and the peer finds the leader."""
        self._forget(session)
        self._invalid(session.peer, f"this broker follows the leader of stream {session.stream.name!r}: it serves "
                      "reads only; publish to the leader (ZooKeeper names it)", Refusal.NOT_LEADER,
                      version=session.conn.version, forget=False)  # fmt: skip

    def _on_credit(self, session: _Session, command: Credit) -> None:
        session.credit = min(session.credit + command.credit, self.config.max_credit_bytes)
        session.blocked_until = 0.0
        for sub in session.subscriptions:
            if not sub.live and sub not in self._lagging:
                self._lagging.append(sub)

    def _on_ping(self, session: _Session, _command: Ping) -> None:
        self._confirm(session, session.conn.send(PingOk()))

    def _confirm(self, session: _Session, frame: bytes) -> None:
        """Send a confirmation (PING-OK, PRODUCE-OK) — a replicated leader's once committed."""
        stream = session.stream
        if stream.leader is None:
            self._send(session.peer, frame)
        else:
            stream.held.append([-1, session.peer, frame])

    def _on_detach(self, session: _Session, _command: Detach) -> None:
        self._send(session.peer, session.conn.send(DetachOk()))
        self._forget(session)

    def _oversized(self, session: _Session, items: tuple[tuple[str, bytes], ...]) -> bool:
        """Whether a batch holds a body over the limit (then refused whole: nothing of it is journaled)."""
        largest = max(len(body) for _, body in items)
        if largest > self.config.max_message_bytes:
            self._too_large(session, largest)
            return True
        return False

    def _too_large(self, session: _Session, size: int) -> None:
        session.stream.refused_too_large += 1
        self._invalid(session.peer, f"a message body of {size} bytes is over this stream's limit of "
                      f"{self.config.max_message_bytes} (maxMessageBytes); nothing of the frame was journaled",
                      Refusal.TOO_LARGE, version=session.conn.version, forget=False)  # fmt: skip

    def _appending(self, stream: _Stream) -> AppendBuffer:
        pending = self._appends.get(stream.name)
        if pending is None:
            pending = self._appends[stream.name] = AppendBuffer(stream.journal.config.segment_bytes // 4)
        return pending

    def _produce(self, session: _Session, command: Produce) -> None:
        try:
            producer, changed = session.stream.journal.producers.claim(command.producer, command.epoch, self._clock_ms,
                                                                       command.generation)  # fmt: skip
        except ProducerRefusedError as exc:
            self._invalid(session.peer, str(exc), _REFUSALS[exc.reason], version=session.conn.version, forget=False)
            return
        if changed:  # a new producer or epoch: journaled (a group mark with no record) before PRODUCE-OK goes
            pending = self._appending(session.stream)
            pending.changes[command.producer] = session.stream.journal.producers.producers[command.producer]
            pending.peers.add(session.peer)
        session.producer, session.epoch = command.producer, producer.epoch
        answer = ProduceOk(epoch=producer.epoch, sequence=producer.sequence, base=producer.base)
        self._confirm(session, session.conn.send(answer))

    def _publish_seq(self, session: _Session, first: int, items: tuple[tuple[str, bytes], ...], size: int) -> None:
        """An idempotent producer's publishes: journal the ones the journal does not hold yet."""
        stream = session.stream
        if session.producer is None:
            self._invalid(session.peer, "PUBLISH-SEQ and PUBLISH-BATCH-SEQ need a PRODUCE first", Refusal.BAD_FRAME,
                          version=session.conn.version, forget=False)  # fmt: skip
            return
        table = stream.journal.producers
        known = table.producers.get(session.producer)
        if known is not None and known.epoch == session.epoch and first == known.sequence + 1:  # the usual case
            known.sequence = first + len(items) - 1  # in place: two stores, frozen when its group closes
            known.seen_ms = self._clock_ms
            pending = self._appending(stream)
            pending.changes[session.producer] = known  # before add(): a group it closes holds the change
            pending.add(items, size)
            pending.peers.add(session.peer)
            stream.messages_in += len(items)
            stream.bytes_in += size
            return
        try:
            held = table.admit(session.producer, session.epoch, first, len(items), self._clock_ms)
        except ProducerRefusedError as exc:
            self._invalid(session.peer, str(exc), _REFUSALS[exc.reason], version=session.conn.version, forget=False)
            return
        stream.duplicates += held
        if held < len(items):
            fresh = items[held:]
            size = sum(len(key) + len(body) + 5 for key, body in fresh)
            pending = self._appending(stream)
            pending.changes[session.producer] = table.producers[session.producer]
            pending.add(fresh, size)
            pending.peers.add(session.peer)
            stream.messages_in += len(fresh)
            stream.bytes_in += size

    def _invalid(self, peer: bytes, reason: str, code: Refusal, *, version: int, forget: bool) -> None:
        """Refuse: INVALID-CODE to a peer speaking (or asking for) version 5 or more, else plain INVALID."""
        text = "".join(c if 0x20 <= ord(c) <= 0x7E else "?" for c in reason)[:255]
        session = self.sessions.get(peer)
        self.refusals[(session.stream.name if session is not None else "", code.name.lower())] += 1
        refusal = InvalidCode(code=code, reason=text) if version >= CODES_SINCE else Invalid(reason=text)
        self._send(peer, encode(refusal))  # not through a Connection: the peer may have none
        if forget:
            self.sessions.pop(peer, None)

    def _attach(self, peer: bytes, conn: Connection, command: Attach, now: float, key: str | None = None) -> None:
        if self.authorized is not None and key not in self.authorized:
            self._invalid(peer, "this client's CURVE key is not (or no longer) among the stream's clients",
                          Refusal.UNAUTHORIZED, version=command.version, forget=True)  # fmt: skip
            return
        stream = self.streams.get(command.stream)
        if stream is None:
            self._invalid(peer, f"stream {command.stream!r} is not served by this broker", Refusal.STREAM_UNKNOWN,
                          version=command.version, forget=True)  # fmt: skip
            return
        if len(self.sessions) >= self.config.max_sessions:
            self._invalid(peer, "broker is at its session limit; try again later", Refusal.BUSY,
                          version=command.version, forget=True)  # fmt: skip
            return
        if stream.following and command.version < REPLICATION_VERSION:
            self._invalid(peer, f"this broker follows the leader of stream {stream.name!r}: attach to the leader "
                          "(ZooKeeper names it)", Refusal.NOT_LEADER, version=command.version, forget=True)  # fmt: skip
            return
        self.sessions[peer] = _Session(peer, conn, stream, last_heard=now, last_ping=now, key=key)
        self._send(peer, conn.send(AttachOk()))

    def authorize(self, keys: frozenset[str]) -> None:
        """The client keys admitted from now on: attached sessions whose key is no longer among them
        are forgotten at once and told so (UNAUTHORIZED); their connections' next ATTACH is refused."""
        self.authorized = keys
        for session in [s for s in self.sessions.values() if s.key not in keys]:
            self._forget(session)
            self._invalid(session.peer, "this client's CURVE key was revoked: it is no longer among the stream's "
                          "clients", Refusal.UNAUTHORIZED, version=session.conn.version, forget=False)  # fmt: skip

    def _subscribe(self, session: _Session, command: Subscribe | SubscribeTime) -> None:
        if len(session.subscriptions) >= self.config.max_subscriptions:
            self._invalid(session.peer, f"at most {self.config.max_subscriptions} subscriptions per peering",
                          Refusal.LIMIT, version=session.conn.version, forget=False)  # fmt: skip
            return
        matcher = self._matcher(session, command.pattern)
        if matcher is None:
            return
        journal = session.stream.journal
        if isinstance(command, SubscribeTime):
            cursor = journal.seek_time(command.since)
        elif command.latest == LATEST:
            cursor = session.stream.routed + 1
        else:
            cursor = max(command.latest + 1, journal.first_sequence)
        sub = _Subscription(session, matcher, cursor, next(self._ids))
        session.subscriptions.append(sub)
        self._send(session.peer, session.conn.send(SubscribeOk()))
        if cursor > session.stream.routed:
            self._go_live(sub)
        else:
            self._lagging.append(sub)

    def _matcher(self, session: _Session, pattern: str) -> Matcher | None:
        """The matcher of a subscription's or a fetch's ``pattern``; None (and INVALID) if refused."""
        try:
            return compile_pattern(pattern, allow_regex=self.config.matching == "prefix-and-regex")
        except PatternError as exc:
            self._invalid(session.peer, str(exc), Refusal.PATTERN_REFUSED, version=session.conn.version, forget=False)
            return None

    def _fetch(self, session: _Session, command: Fetch) -> None:
        """FETCH: a replay of ``first`` .. ``last`` that ends with FETCH-END (see the module's notes)."""
        if any(sub.end is not None for sub in session.subscriptions):
            self._invalid(session.peer, "one FETCH at a time per peering: wait for FETCH-END", Refusal.LIMIT,
                          version=session.conn.version, forget=False)  # fmt: skip
            return
        matcher = self._matcher(session, command.pattern)
        if matcher is None:
            return
        stream, journal = session.stream, session.stream.journal
        end = min(command.last, stream.routed)
        start = max(command.first, journal.first_sequence)
        if command.since:
            start = max(start, journal.seek_time(command.since))
        if start > end:  # nothing in range (yet, or any longer)
            self._send(session.peer, session.conn.send(FetchEnd(first=end + 1, last=end)))
            return
        sub = _Subscription(session, matcher, start, next(self._ids), end=end, start=start)
        session.subscriptions.append(sub)
        self._lagging.append(sub)

    def _end_fetch(self, sub: _Subscription) -> None:
        """Everything of the fetch's range went to the adapter: FETCH-END, and the fetch is gone."""
        session = sub.session
        assert sub.end is not None
        session.subscriptions.remove(sub)
        frame = session.conn.send(FetchEnd(first=sub.start, last=sub.end))
        self._pending.append(Outgoing(session.peer, frame, sub, sub.end + 1, ends_fetch=True))

    # -- routing --------------------------------------------------------------------------------
    def _go_live(self, sub: _Subscription) -> None:
        stream = sub.session.stream
        stream.live_set.add(sub)
        if sub.matcher.prefix is not None:
            stream.trie.add(sub.matcher.prefix, sub)
        else:
            stream.live_regex.add(sub)

    def _leave_live(self, sub: _Subscription, cursor: int) -> None:
        stream = sub.session.stream
        if sub in stream.live_set:
            stream.fell_behind += 1
            stream.live_set.discard(sub)
            if sub.matcher.prefix is not None:
                stream.trie.remove(sub.matcher.prefix, sub)
            else:
                stream.live_regex.discard(sub)
        sub.cursor = cursor
        if sub not in self._lagging:
            self._lagging.append(sub)

    def flush_appends(self, *, idle: bool = True) -> None:
        """Write buffered publishes to the journals, apply the fsync policy, and route what became
        durable to live subscriptions."""
        self._clock_ms = _now_ms()
        for name, pending in self._appends.items():
            stream = self.streams[name]
            if stream.leader is not None and not self._replicated_enough(stream, pending):
                continue
            try:
                pending.write_to(stream.journal)
            except JournalWriteError as exc:
                if not exc.space:  # not a full volume: a broken disk, fatal (the broker exits non-zero)
                    self._appends.clear()  # none of it was confirmed; closing must not try it again
                    raise
                self._refuse_writes(stream, pending, exc)
        self._appends.clear()
        for stream in self.streams.values():
            stream.journal.maybe_sync(idle=idle)
            if stream.leader is not None:
                self._replicate(stream)
            self._route(stream)

    def _replicated_enough(self, stream: _Stream, pending: AppendBuffer) -> bool:
        """Whether a replicated leader takes the flush's publishes: not while fewer replicas than
        minInSync are in sync, unless the stream waits for them (``under_replicated: wait``)."""
        leader = stream.leader
        assert leader is not None
        if not leader.under_replicated or self.config.under_replicated == "wait":
            return True
        reason = (f"stream {stream.name}: {len(leader.isr)} of its replicas are in sync, fewer than minInSync "
                  f"({leader.min_insync}); publishes since this peering's last confirmation were not journaled: "
                  "attach again and resend them")  # fmt: skip
        stream.refused_under_replicated += len(pending.entries)
        self._refuse(stream, pending, reason, Refusal.NOT_ENOUGH_REPLICAS)
        return False

    def _refuse_writes(self, stream: _Stream, pending: AppendBuffer, exc: JournalWriteError) -> None:
        """The journal's volume is full: the flush's publishes are refused, never confirmed. The
        journal undid the failed append; the producer table goes back to what the journal holds; the
        publishers lose the PING-OKs and PRODUCE-OKs queued for them in this loop (their barriers
        cover refused publishes), get JOURNAL_FULL, and are forgotten (their claims may be undone), so
        they attach again and resend. Publishes of groups written before the failure may come again:
        an idempotent producer's are dropped as duplicates, plain ones are at-least-once anyway."""
        stream.refused_journal_full += len(pending.entries)
        reason = (f"stream {stream.name}: its journal's volume is full ({exc.args[0]}); publishes since this "
                  "peering's last confirmation were not journaled: attach again and resend them")  # fmt: skip
        self._refuse(stream, pending, reason, Refusal.JOURNAL_FULL)
        now = time.monotonic()
        if now - stream.journal_full_logged >= 60:
            stream.journal_full_logged = now
            log.error("%s: refusing publishes (%d so far; retention or a larger volume makes room)", exc,
                      stream.refused_journal_full)  # fmt: skip

    def _refuse(self, stream: _Stream, pending: AppendBuffer, reason: str, code: Refusal) -> None:
        """Refuse a flush's publishes (none was journaled): the producer table goes back to what the
        journal holds, and the publishers lose the confirmations queued for them in this loop (their
        barriers cover refused publishes), get ``code`` and are forgotten, so they attach again and resend."""
        table, journaled = stream.journal.producers, stream.journal.journaled
        for name in pending.producers_changed():
            if name in journaled:
                table.producers[name] = ProducerState(*journaled[name])
            else:
                table.producers.pop(name, None)
        self._pending = deque(o for o in self._pending if o.subscription is not None or o.peer not in pending.peers)
        for peer in pending.peers:
            session = self.sessions.get(peer)
            version = session.conn.version if session is not None else 0
            if session is not None:
                self._forget(session)
            self._invalid(peer, reason, code, version=version, forget=False)

    # -- replication (a replicated stream's leader; see zeps.broker.replication) -----------------
    def lead(self, name: str, *, me: str, epoch: int, isr: frozenset[str], min_insync: int, now: float | None = None,
             **tuning: float) -> None:  # fmt: skip
        """This broker leads ``name`` from now on, in ``epoch`` (ZooKeeper raised it): its journal's epoch
        history gets an entry, and confirmations wait for the in-sync replicas."""
        stream = self.streams[name]
        journal = stream.journal
        journal.sync()
        if epoch > journal.epochs.latest:
            journal.epochs.begin(epoch, journal.next_sequence)
        now = time.monotonic() if now is None else now
        stream.leader = Leadership.begin(me, epoch, isr, min_insync=min_insync, commit=stream.routed, now=now,
                                         **tuning)  # fmt: skip
        stream.following = False
        log.info("stream %s: leading in epoch %d from sequence %d (in sync: %s; confirmed up to %d)", name, epoch,
                 journal.next_sequence, ", ".join(sorted(stream.leader.isr)), stream.routed)  # fmt: skip

    def follow(self, name: str) -> None:
        """This broker follows the leader of ``name`` (or waits for one). Coming from leading (or from
        serving alone), its client sessions are forgotten and told NOT_LEADER (they find the leader
        and resend what was not confirmed), and nothing held is confirmed; a follower following a new
        leader keeps its readers (what it routed to them was committed: every leader holds it)."""
        stream = self.streams[name]
        if stream.following:
            return
        stream.commit = stream.routed  # nothing beyond what was routed until a leader says so
        stream.leader, stream.following = None, True
        stream.held.clear()
        stream.waiting.clear()
        if self._appends.pop(name, None) is not None:  # publishes never written: the table forgets them too
            journal = stream.journal
            journal.producers.producers = {n: ProducerState(*p) for n, p in journal.journaled.items()}
        for session in [s for s in self.sessions.values() if s.stream is stream]:
            self._forget(session)
            self._invalid(session.peer, f"this broker no longer leads stream {name!r}: attach to the leader",
                          Refusal.NOT_LEADER, version=session.conn.version, forget=False)  # fmt: skip

    def copied(self, name: str, commit: int) -> None:
        """A follower's copy went on; the leader's commit point is ``commit``: its readers get what it
        holds durably up to there (and this broker starts confirming from there if it is elected)."""
        stream = self.streams[name]
        if not stream.following:
            return  # elected meanwhile: its own commit point counts
        stream.commit = max(stream.commit, commit)
        stream.routed = max(stream.routed, stream.journal.first_sequence - 1)  # a copy begun afresh at the
        self._route(stream)  # leader's oldest record has nothing before it to route

    def isr_requests(self, now: float | None = None) -> list[tuple[str, int, frozenset[str]]]:
        """(stream, epoch, in-sync set) to write to ZooKeeper: the leaders' sets as they should be now."""
        now = time.monotonic() if now is None else now
        out = []
        for stream in self.streams.values():
            leader = stream.leader
            if leader is not None and (isr := leader.wanted(stream.journal.durable, now)) is not None:
                out.append((stream.name, leader.epoch, isr))
        return out

    def isr_written(self, name: str, epoch: int, isr: frozenset[str]) -> None:
        """ZooKeeper holds ``isr`` for the leader of ``epoch`` (ignored if this broker no longer leads it)."""
        leader = self.streams[name].leader
        if leader is not None and leader.epoch == epoch:
            leader.isr_written(isr)
            log.info("stream %s: in sync now: %s", name, ", ".join(sorted(isr)))
            if leader.under_replicated and self.config.under_replicated == "refuse":
                self._refuse_held(self.streams[name])

    def _refuse_held(self, stream: _Stream) -> None:
        """Too few replicas in sync: confirmations still held will not come; their publishers are told."""
        peers = {peer for _, peer, _ in stream.held}
        stream.held.clear()
        for peer in peers:
            session = self.sessions.get(peer)
            if session is not None:
                self._forget(session)
                self._invalid(peer, f"stream {stream.name}: fewer replicas than minInSync are in sync; publishes "
                              "since this peering's last confirmation are not confirmed: attach again and resend "
                              "them", Refusal.NOT_ENOUGH_REPLICAS, version=session.conn.version,
                              forget=False)  # fmt: skip

    def _on_replica_fetch(self, session: _Session, command: ReplicaFetch) -> None:
        stream, now = session.stream, session.last_heard  # the time receive() was given
        leader = stream.leader
        if leader is None or command.epoch != leader.epoch:
            self._not_leader(session, command.epoch)
            return
        leader.fetched(command.replica, command.durable, stream.journal.durable, now)
        stream.waiting[session.peer] = (command, now)

    def _on_replica_epoch(self, session: _Session, command: ReplicaEpoch) -> None:
        stream = session.stream
        leader = stream.leader
        if leader is None or command.epoch != leader.epoch:
            self._not_leader(session, command.epoch)
            return
        found, end = stream.journal.epochs.end_of(command.asked, stream.journal.written)
        self._send(session.peer, session.conn.send(ReplicaEpochEnd(epoch=leader.epoch, found=found, end=end)))

    def _not_leader(self, session: _Session, epoch: int) -> None:
        leader = session.stream.leader
        mine = f"it leads epoch {leader.epoch}" if leader is not None else "it does not lead"
        self._forget(session)
        self._invalid(session.peer, f"not the leader of epoch {epoch} of stream {session.stream.name!r} ({mine})",
                      Refusal.NOT_LEADER, version=session.conn.version, forget=False)  # fmt: skip

    def _replicate(self, stream: _Stream, now: float | None = None) -> None:
        """A leader's turn: answer the followers' fetches that have data (or waited a heartbeat), move
        the commit point, and release the confirmations it covers."""
        leader, journal = stream.leader, stream.journal
        assert leader is not None
        now = time.monotonic() if now is None else now
        for held in stream.held:
            if held[0] < 0:  # everything the peer published before it is written now
                held[0] = journal.written
        for peer, (fetch, since) in list(stream.waiting.items()):
            session = self.sessions.get(peer)
            if session is None:
                del stream.waiting[peer]
                continue
            more = journal.replica_has_more(fetch.base, fetch.offset)
            if not more and now - since < leader.heartbeat_s:
                continue
            most = min(fetch.most, self.config.replica_fetch_bytes)
            window = self._catchup_window(stream, fetch.replica, now)
            if window is not None and window[1] <= 0:  # this second's bytes are spent: the rest in the next
                if now - since < leader.heartbeat_s:
                    continue
                part = ReplicaSlice(fetch.base, fetch.offset, b"")  # a heartbeat: nothing more yet
            else:
                if window is not None:
                    most = min(most, int(window[1]))
                part = journal.replica_read(fetch.base, fetch.offset, fetch.last, most)
                if window is not None:
                    window[1] -= len(part.data)
            epochs = encode_epochs(journal.epochs.newer_than(fetch.known))
            crc = crc32c.crc32c(part.data, crc32c.crc32c(part.marks, crc32c.crc32c(part.starts)))
            answer = ReplicaData(epoch=leader.epoch, base=part.base, offset=part.offset, next=part.next_base,
                                 commit=leader.commit, reset=int(part.reset), epochs=epochs, crc=crc,
                                 index=part.starts, marks=part.marks, data=part.data)  # fmt: skip
            self._send(peer, session.conn.send(answer))
            del stream.waiting[peer]
        commit = leader.advance(journal.durable)
        while stream.held and stream.held[0][0] <= commit:
            _, peer, frame = stream.held.popleft()
            self._send(peer, frame)

    def _catchup_window(self, stream: _Stream, replica: str, now: float) -> list[float] | None:
        """A follower catching up (not in sync) under ``replica_catchup_bytes_per_s``: [when this second
        began, the bytes it may still get in it]; None when it is not limited."""
        rate, leader = self.config.replica_catchup_bytes_per_s, stream.leader
        if not rate or leader is None or replica in leader.isr:
            stream.catchup.pop(replica, None)
            return None
        window = stream.catchup.setdefault(replica, [now, float(rate)])
        if now - window[0] >= 1.0:
            window[0], window[1] = now, float(rate)
        return window

    def _route(self, stream: _Stream) -> None:
        journal = stream.journal
        multicast = self.config.multicast_heartbeat_s is not None and not stream.following  # the leader's output
        if not stream.live_set and not multicast:  # nobody to route to (a follower without readers, say):
            stream.routed = max(stream.routed, stream.committed)  # reading the records back is wasted work;
            return  # a subscriber that comes later replays them from the journal
        while stream.routed < stream.committed:
            chunk = journal.read_chunk(stream.routed + 1, max_bytes=self.config.batch_bytes, end=stream.committed)
            if chunk is None:
                break
            for sub, picks in self._targets(stream, chunk).items():
                stop = self._deliver(sub, chunk, picks)
                if stop is not None:
                    self._leave_live(sub, stop)
            if multicast:
                stream.outbox.gather(chunk)
            stream.routed = chunk.last
        for sub in stream.live_set:
            sub.cursor = stream.routed + 1

    @property
    def multicast_pending(self) -> bool:
        """Records wait for the multicast group (the loop should come back within the linger)."""
        return any(stream.outbox.pending for stream in self.streams.values())

    def take_multicast(self, now: float | None = None) -> list[list[bytes]]:
        """The messages for the multicast group since the last call, oldest first (each two frames:
        the stream's topic and DELIVER-RUN or TAIL): a stream's gathered records once they fill a
        message or waited ``multicast_linger_s``; TAIL for each stream silent for a heartbeat
        (:class:`~zeps.broker.outbox.MulticastOutbox`). Empty without a multicast output."""
        heartbeat = self.config.multicast_heartbeat_s
        if heartbeat is None:
            return []
        now = time.monotonic() if now is None else now
        out: list[list[bytes]] = []
        for stream in self.streams.values():
            if not stream.following:  # a replicated stream's multicast output is its leader's
                out += stream.outbox.take(stream.name, stream.routed, now, heartbeat=heartbeat,
                                          linger=self.config.multicast_linger_s,
                                          max_bytes=self.config.multicast_max_bytes)  # fmt: skip
        return out

    @staticmethod
    def _targets(stream: _Stream, chunk: Chunk) -> dict[_Subscription, list[int] | None]:
        """Which live subscriptions get which records of ``chunk`` (None: all of them)."""
        if not stream.live_set:
            return {}
        by_key: dict[str, frozenset[_Subscription]] = {}
        for key in set(chunk.keys):
            targets = {s for s in stream.trie.match(key) if isinstance(s, _Subscription)}
            targets.update(s for s in stream.live_regex if s.matcher.matches(key))
            by_key[key] = frozenset(targets)
        if len(set(by_key.values())) == 1:  # every record goes to the same subscriptions (the usual case)
            return dict.fromkeys(next(iter(by_key.values())))
        picks: dict[_Subscription, list[int] | None] = {}
        for i, key in enumerate(chunk.keys):
            for sub in by_key[key]:
                picks.setdefault(sub, []).append(i)  # type: ignore[union-attr]
        return picks

    def _deliver(self, sub: _Subscription, chunk: Chunk, picks: list[int] | None) -> int | None:
        """Queue the records of ``chunk`` that ``sub`` takes (``picks``, or all) as far as its credit
        goes. Returns None when all went, else the sequence of the first one that did not."""
        if picks is not None and len(picks) == len(chunk):
            picks = None  # every record: a version 3 session gets the run's bytes as they are, uncut
        session = sub.session
        if session.blocked_until:
            return chunk.first + (picks[0] if picks else 0)
        if session.batches:
            return self._deliver_batch(sub, chunk, picks)
        timestamps = session.timestamps
        for i in range(len(chunk)) if picks is None else picks:
            r = chunk.record(i)
            # the session is attached (it has subscriptions), so DELIVER is allowed: the fast encoder
            # skips the state machine and the generic codec on this, the hottest path of older sessions
            frame = encode_deliver(r.sequence, r.key, r.body, r.timestamp_ms if timestamps else None)
            if session.credit < len(frame):
                return r.sequence
            self._queue(sub, frame, r.sequence, 1)
        sub.cursor = chunk.last + 1
        return None

    def _deliver_batch(self, sub: _Subscription, chunk: Chunk, picks: list[int] | None) -> int | None:
        """DELIVER-BATCH (version 3) or DELIVER-RUN (version 4: plus a 4-byte index entry per record)."""
        session, offsets = sub.session, chunk.offsets
        indexed = session.indexed
        per_record, room = (4, session.credit - 15) if indexed else (0, session.credit - 7)  # frame overhead
        if picks is None:  # a run: the journal's bytes as they are, as far as credit goes
            fits = bisect.bisect_right(range(len(offsets)), room, key=lambda i: offsets[i] + per_record * i) - 1
            if fits > 0:
                data = chunk.data[: offsets[fits]]
                frame = encode_deliver_run(data, run_index(offsets[:fits])) if indexed else encode_deliver_batch(data)
                self._queue(sub, frame, chunk.first, fits)
            if fits < len(chunk):
                return chunk.first + max(fits, 0)
        else:
            size, taken = 0, 0
            for i in picks:
                size += offsets[i + 1] - offsets[i] + per_record
                if size > room:
                    break
                taken += 1
            if taken:
                data, chosen = chunk.data, picks[:taken]
                records = b"".join(data[offsets[i] : offsets[i + 1]] for i in chosen)
                if indexed:
                    starts = array("I", itertools.accumulate((offsets[i + 1] - offsets[i] for i in chosen[:-1]),
                                                             initial=0))  # fmt: skip
                    frame = encode_deliver_run(records, run_index(starts))
                else:
                    frame = encode_deliver_batch(records)
                self._queue(sub, frame, chunk.first + picks[0], taken)
            if taken < len(picks):
                return chunk.first + picks[taken]
        sub.cursor = chunk.last + 1
        return None

    def _queue(self, sub: _Subscription, frame: bytes, first: int, count: int) -> None:
        session = sub.session
        cost = len(frame)
        self._queued_bytes += cost
        session.credit -= cost
        session.stream.messages_out += count
        session.stream.bytes_out += cost
        self._pending.append(Outgoing(session.peer, frame, sub, first, cost, count))

    @property
    def busy(self) -> bool:
        """Work waits that a loop should come back for soon (a millisecond, not a tick): subscriptions
        behind, publishes not yet written, records gathered for the multicast group."""
        return bool(self._lagging or self._appends or self.multicast_pending)

    def replay_ready(self, now: float) -> bool:
        """A lagging subscription can be served now (not waiting out a refused send): the loop
        should pump again at once rather than wait for traffic."""
        return any(sub.session.blocked_until <= now for sub in self._lagging)

    def pump(self, now: float | None = None) -> list[Outgoing]:
        """Replay for lagging subscriptions (fairly, within the budget) and return everything to send."""
        now = time.monotonic() if now is None else now
        budget = self.config.pump_budget_bytes
        for _ in range(len(self._lagging)):
            if budget <= 0:
                break
            sub = self._lagging.popleft()
            session = sub.session
            if session.peer not in self.sessions or sub not in session.subscriptions:
                continue  # gone
            if session.blocked_until > now:
                self._lagging.append(sub)
                continue
            session.blocked_until = 0.0
            stream = session.stream
            last = stream.routed if sub.end is None else sub.end
            if sub.cursor > last:  # a fetch all of whose range went out
                self._end_fetch(sub)
                continue
            chunk = stream.journal.read_chunk(
                sub.cursor,
                max_bytes=min(budget, self.config.batch_bytes),
                max_records=self.config.replay_batch if not session.batches else 1 << 30,
                end=last,
            )
            stalled = False
            queued = len(self._pending)
            if chunk is None:  # nothing left of cursor .. last: a damaged closed segment lost it
                sub.cursor = max(sub.cursor, last + 1)
            else:
                before = self._queued_bytes
                stalled = self._replay(sub, chunk)
                budget -= max(self._queued_bytes - before, 1)
            for item in itertools.islice(self._pending, queued, None):
                item.replayed = True
                stream.messages_replayed += item.count
            first = stream.journal.first_sequence
            if sub.cursor < first:  # retention removed what it missed
                sub.cursor = sub.start = first
            if stalled:
                continue  # out of credit: CREDIT puts it back in line
            if sub.end is not None:
                if sub.cursor > sub.end:
                    self._end_fetch(sub)
                else:
                    self._lagging.append(sub)
            elif sub.cursor > stream.routed:
                self._go_live(sub)
            else:
                self._lagging.append(sub)
        out = list(self._pending)
        self._pending.clear()
        return out

    def _replay(self, sub: _Subscription, chunk: Chunk) -> bool:
        """Deliver what ``sub`` takes of ``chunk`` (read from the journal at its cursor) and move the
        cursor on; True if it ran out of credit before the end (stalled)."""
        matches = sub.matcher.matches
        picks = None if sub.matcher.prefix == "" else [i for i, k in enumerate(chunk.keys) if matches(k)]
        if picks == []:
            sub.cursor = chunk.last + 1
            return False
        stop = self._deliver(sub, chunk, picks)
        if stop is None:
            return False
        sub.cursor = stop
        return True

    def unsent(self, item: Outgoing, now: float | None = None) -> None:
        """The adapter could not send ``item`` (the peer's queue is full): undo the delivery."""
        sub = item.subscription
        if sub is None:
            return
        session = sub.session
        if item.ends_fetch:  # FETCH-END did not go: the fetch is open again, and ends again later
            if session.peer in self.sessions and sub not in session.subscriptions:
                session.subscriptions.append(sub)
                if sub not in self._lagging:
                    self._lagging.append(sub)
            session.blocked_until = (time.monotonic() if now is None else now) + 0.01
            return
        session.credit += item.cost
        session.stream.messages_out -= item.count  # they were counted when queued; undo it
        if item.replayed:
            session.stream.messages_replayed -= item.count
        session.stream.bytes_out -= item.cost
        session.blocked_until = (time.monotonic() if now is None else now) + 0.01
        if sub.cursor > item.sequence:
            self._leave_live(sub, item.sequence)

    def _send(self, peer: bytes, frame: bytes) -> None:
        self._pending.append(Outgoing(peer, frame))

    # -- time -----------------------------------------------------------------------------------
    def tick(self, now: float | None = None) -> None:
        """Heartbeats: PING peers silent for heartbeat_s; forget those silent for ttl_s."""
        now = time.monotonic() if now is None else now
        self._clock_ms = _now_ms()
        for session in list(self.sessions.values()):
            silent = now - session.last_heard
            if silent > self.config.ttl_s:
                log.info("peer %s silent for %.0fs: forgetting it", session.peer.hex(), silent)
                self._forget(session)
            elif silent > self.config.heartbeat_s and now - session.last_ping > self.config.heartbeat_s:
                session.last_ping = now
                self._send(session.peer, session.conn.send(Ping()))
        for stream in self.streams.values():
            stream.journal.apply_retention()
            stream.journal.expire_producers(self._clock_ms)

    def _forget(self, session: _Session) -> None:
        for sub in session.subscriptions:
            self._leave_live(sub, sub.cursor)
        session.subscriptions.clear()
        self.sessions.pop(session.peer, None)
        stream = session.stream
        stream.waiting.pop(session.peer, None)
        if stream.held:  # never a confirmation on a later peering of the same peer
            stream.held = deque(h for h in stream.held if h[1] != session.peer)

    def disconnected(self, peer: bytes) -> None:
        """The adapter learnt the peer is gone (unroutable): free its state now."""
        session = self.sessions.get(peer)
        if session is not None:
            self._forget(session)

    # -- facts ----------------------------------------------------------------------------------
    def states(self, stream: str) -> tuple[int, int]:
        """(subscriptions of ``stream`` replaying from the journal — behind the tail, or a FETCH —,
        subscriptions stopped until their peer sends CREDIT)."""
        replaying = {id(sub) for sub in self._lagging if sub.session.stream.name == stream}
        starved = 0
        for session in self.sessions.values():
            if session.stream.name == stream:
                for sub in session.subscriptions:
                    if id(sub) not in replaying and not sub.live:
                        starved += 1  # out of line: its last delivery stopped for credit
        return len(replaying), starved

    def lag(self, stream: str, most: int = 20) -> tuple[int, list[tuple[str, _Subscription]]]:
        """(how many subscriptions ``stream`` has, the ``most`` furthest behind as (peer hex,
        subscription)), furthest first: a subscription's lag is the records between its cursor and the
        durable tail."""
        subs = [(sub.lag, session.peer.hex(), sub) for session in self.sessions.values()
                if session.stream.name == stream for sub in session.subscriptions]  # fmt: skip
        subs.sort(key=lambda t: (-t[0], t[1], t[2].id))
        return len(subs), [(peer, sub) for _, peer, sub in subs[:most]]

    def subscriptions(self, stream: str, most: int = 20) -> tuple[int, list[dict[str, object]]]:
        """(how many subscriptions ``stream`` has, the ``most`` furthest behind): peer, subscription
        id, pattern, lag and whether it is live — the facts a broker publishes for its operator."""
        count, furthest = self.lag(stream, most)
        return count, [{"peer": peer, "id": sub.id, "pattern": sub.matcher.pattern, "lag": sub.lag, "live": sub.live}
                       for peer, sub in furthest]  # fmt: skip


_REFUSALS = {"fenced": Refusal.FENCED, "unknown": Refusal.PRODUCER_UNKNOWN, "out-of-sequence": Refusal.OUT_OF_SEQUENCE,
             "full": Refusal.PRODUCER_LIMIT}  # fmt: skip


def _now_ms() -> int:
    return int(time.time() * 1000)

"""What the broker holds, and the two primitives every part of it uses (send a frame, refuse a peer).

:class:`BrokerCore` is built in layers, one concept a module, each a subclass of the one below it:

- :mod:`zeps.broker.state` (this one): the streams, the sessions and their subscriptions, the frames
  waiting to go out;
- :mod:`zeps.broker.routing`: subscriptions and fetches, live routing, replay and delivery under credit;
- :mod:`zeps.broker.leading`: a replicated stream's leader (its followers' fetches, the commit point);
- :mod:`zeps.broker.publishing`: publishes, idempotent producers and the journal's flush;
- :mod:`zeps.broker.core`: the peer's state machine (ATTACH, the command table), heartbeats.

A layer calls only what it or a layer below it defines; all of them share one instance's state,
on one thread (the adapter's loop owns it).
"""

from __future__ import annotations

import collections
import itertools
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from zeps.broker.appends import AppendBuffer
from zeps.broker.config import BrokerConfig
from zeps.broker.matching import Matcher, PrefixTrie
from zeps.broker.outbox import MulticastOutbox
from zeps.journal import Journal
from zeps.protocol import (
    Connection,
    Invalid,
    InvalidCode,
    Refusal,
    ReplicaFetch,
    encode,
)
from zeps.protocol.commands import CODES_SINCE
from zeps.replication.isr import Leadership

__all__ = ["BrokerState", "Outgoing", "Session", "Stream", "Subscription"]


@dataclass
class Outgoing:
    """One frame to send; deliveries carry what is needed to undo them if the send fails."""

    peer: bytes
    frame: bytes
    subscription: Subscription | None = None
    sequence: int = 0  #: the first sequence it delivers
    cost: int = 0
    count: int = 0  #: messages it delivers
    replayed: bool = False  #: read from the journal for a subscription behind the tail (not live routing)
    ends_fetch: bool = False  #: FETCH-END of ``subscription`` (a fetch): unsent, the fetch is reopened
    #: the session whose bytes in flight ``cost`` counts in (a delivery's, a follower's REPLICA-DATA)
    session: Session | None = None


@dataclass(eq=False)
class Subscription:
    """A subscription (SUBSCRIBE) or an open fetch (FETCH) of a session, and where it is."""

    session: Session
    matcher: Matcher
    cursor: int
    id: int = 0
    #: a fetch (FETCH): the last sequence of its range (it ends there, never live), and where its range began
    end: int | None = None
    start: int = 0
    #: a replay from a time the volume may no longer hold (a tiered stream's): the store is asked for its
    #: first record at or after it; 0 once found (timestamps never decrease: every later record is too)
    since_ms: int = 0

    @property
    def live(self) -> bool:
        return self in self.session.stream.live_set

    @property
    def lag(self) -> int:
        """Records between the cursor and the durable tail."""
        return max(0, self.session.stream.journal.durable + 1 - self.cursor)


@dataclass(frozen=True, eq=False)
class TierRead:
    """A read of a tiered stream's object store for a subscription behind the journal's first record:
    records ``start .. end`` within ``max_bytes`` (the adapter's thread does it; the loop never waits)."""

    sub: Subscription
    start: int
    end: int
    max_bytes: int
    max_records: int
    since_ms: int = 0  #: from the store's first record at or after this time (0: from ``start``)


@dataclass(eq=False)
class Stream:
    """A stream this broker serves: its journal, its live subscriptions, its counters, its replication."""

    name: str
    journal: Journal
    trie: PrefixTrie = field(default_factory=PrefixTrie)
    live_regex: set[Subscription] = field(default_factory=set)
    live_set: set[Subscription] = field(default_factory=set)
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
    #: a tiered stream whose object store is too far behind (its backlog past --tier-max-backlog-bytes):
    #: why publishes are refused ("" while they are not); the adapter sets it from its TierTask
    tier_behind: str = ""
    refused_tier_behind: int = 0  # publishes refused for it
    checkpoint_full_logged: float = float("-inf")  # when an unwritable commit checkpoint was last logged
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
class Session:
    """An attached peer: its connection's state machine, its credit and subscriptions."""

    peer: bytes
    conn: Connection
    stream: Stream
    credit: int = 0
    subscriptions: list[Subscription] = field(default_factory=list)
    last_heard: float = 0.0
    last_ping: float = 0.0
    blocked_until: float = 0.0  # the socket refused a send: wait before trying again
    #: delivery bytes handed to the socket that have not left this process yet (max_session_bytes_in_flight)
    in_flight: int = 0
    producer: str | None = None  # the producer name this session claimed (PRODUCE), and its epoch
    epoch: int = 0
    key: str | None = None  # the CURVE public key its connection authenticated with (a CURVE broker)
    replica: str = ""  # the replica this peering fetches as (a follower's: one name for its life)

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


class BrokerState:
    """All broker state; single-threaded (the adapter's loop owns it)."""

    def __init__(self, config: BrokerConfig, *, wall_ms: Callable[[], int] | None = None) -> None:
        self.config = config
        #: the wall clock, in milliseconds (idempotent producers' last activity, for their TTL): a
        #: simulation passes its own, as it passes ``now`` for the monotonic clock
        self.wall_ms = wall_ms or _now_ms
        self.streams: dict[str, Stream] = {}
        self.sessions: dict[bytes, Session] = {}
        self._pending: deque[Outgoing] = deque()
        self._lagging: deque[Subscription] = deque()
        self._ids = itertools.count(1)
        self._appends: dict[str, AppendBuffer] = {}
        self._queued_bytes = 0  # delivery bytes queued, ever: pump() measures its budget with it
        self.subscription_count = 0  #: subscriptions and open fetches of all sessions (max_total_subscriptions)
        self.regex_subscriptions = 0  #: of those, with a regular expression (max_regex_subscriptions)
        self.bytes_in_flight = 0  #: the sessions' ``in_flight`` together (max_bytes_in_flight)
        self.resident_bytes = 0  #: the process's resident memory as the adapter last read it (max_memory_bytes)
        #: a tiered stream's bound for local retention: the object store holds every record up to it (the
        #: adapter's TierTask sets it; a stream not in it is not tiered)
        self.tiered_to: dict[str, int] = {}
        #: streams whose object store serves what their journal no longer holds (a tiered broker's)
        self.tier_reads: set[str] = set()
        #: store reads for the adapter to start (it takes them each turn), and those under way, by
        #: subscription id: such a subscription waits for its answer out of the replay line
        self.tier_wanted: list[TierRead] = []
        self._tier_pending: dict[int, TierRead] = {}
        #: peers whose deliveries stopped for bytes in flight (not credit), in the order they stopped:
        #: they go on as bytes leave
        self._held: dict[bytes, None] = {}
        self._clock_ms = self.wall_ms()  # this broker's wall clock, read once per flush (see _stream_ms)
        self.invalid_frames = 0
        #: refusals sent (INVALID, INVALID-CODE), by (the peer's stream, "" before ATTACH; the code's
        #: name): the labels are the streams served and the codes, never anything a peer chose
        self.refusals: collections.Counter[tuple[str, str]] = collections.Counter()
        #: the client public keys admitted (a CURVE broker with a list of clients; None: anyone)
        self.authorized: frozenset[str] | None = None
        #: the replicas a replicated stream's manifest names (the operator's word, under the namespace's
        #: ACL): a follower naming another is refused; None: no manifest (a replica set run by hand)
        self.replica_members: frozenset[str] | None = None
        #: a CURVE replica set's replicas and their keys: a fetch as a replica is taken from that
        #: replica's key only (None: no CURVE replica list)
        self.replica_keys: dict[str, str] | None = None
        #: the key a peer without a session authenticated with, for its next frame (the adapter sets it)
        self.peer_keys: dict[bytes, str | None] = {}
        self._max_body = config.max_message_bytes

    def _over_memory(self) -> str | None:
        """Why nothing new is taken on (the memory budget is spent), or None."""
        budget = self.config.max_memory_bytes
        if not budget or self.resident_bytes <= budget:
            return None
        return (f"the broker uses {self.resident_bytes >> 20} MiB, past its memory budget of {budget >> 20} MiB "
                "(--max-memory-bytes); try again later")  # fmt: skip

    def _invalid(self, peer: bytes, reason: str, code: Refusal, *, version: int, forget: bool) -> None:
        """Refuse: INVALID-CODE to a peer speaking (or asking for) version 5 or more, else plain INVALID."""
        text = "".join(c if 0x20 <= ord(c) <= 0x7E else "?" for c in reason)[:255]
        session = self.sessions.get(peer)
        self.refusals[(session.stream.name if session is not None else "", code.name.lower())] += 1
        refusal = InvalidCode(code=code, reason=text) if version >= CODES_SINCE else Invalid(reason=text)
        self._send(peer, encode(refusal))  # not through a Connection: the peer may have none
        if forget:
            gone = self.sessions.pop(peer, None)
            if gone is not None:
                self._let_go(gone)

    def _let_go(self, session: Session) -> None:
        """A session goes: it waits for nothing now (its bytes in flight count until the adapter sees
        them leave: ZeroMQ's queue for its peer may outlive it)."""
        self._held.pop(session.peer, None)

    def _send(self, peer: bytes, frame: bytes) -> None:
        self._pending.append(Outgoing(peer, frame))


def _now_ms() -> int:
    return int(time.time() * 1000)

r"""The client side of a ZEPS peering, without sockets: what to send, what arrived, what to resend.

Both :class:`~zeps.client.sync.StreamClient` and :class:`~zeps.client.aio.AsyncStreamClient` drive
this object; they only move frames. It keeps the peering (attach, versions, refusals, subscriptions,
fetches) and holds two parts: the :class:`~zeps.client.inbox.Inbox` (deliveries not taken yet, and
their credit) and the publishing state of :mod:`zeps.client.publishing` (the idempotent producer, the
publishes not yet confirmed).

* **Attach.** Version 4 first (runs checked at once), then 3 (batches), then 2 (time replay,
  timestamps), then 1: a broker that refuses a version is attached with the next lower one; time
  replay raises on version 1.
* **Batches.** :meth:`ClientSession.publish_many` sends PUBLISH-BATCH frames (version 3; one PUBLISH
  per message on older brokers); a version 3 broker delivers DELIVER-BATCH (a version 4 one
  DELIVER-RUN: the same records with their index and one CRC32C), unpacked here into the same
  :class:`Message`\ s.
* **Credit.** The session grants ``credit_window`` bytes at subscribe and gives credit back as the
  application *takes* messages from the inbox (:meth:`Inbox.take <zeps.client.inbox.Inbox.take>` and
  its kin), once half the window was taken. The CREDIT frames due wait in
  :attr:`ClientSession.outbox`; the clients send them after every take.
* **Resume.** Each delivered sequence is remembered; after a reconnect every subscription is sent
  again with ``latest`` = the last sequence received: no gap, no duplicate.
* **Publishes survive a broker crash.** ZEPS has no publish acknowledgement, so the session puts a
  PING after publishes as a barrier: the broker answers in order, so a PING-OK confirms every
  publish before it. Publishes not yet confirmed are resent after a reconnect.
* **Exactly once** (version 6). The session is an idempotent producer: it claims a producer name
  (PRODUCE; a random one unless the caller names it; a named one at attach, a random one at its first
  publish, so a session that only subscribes claims none), again at every re-attach, and numbers its
  publishes 1, 2, …
  (PUBLISH-SEQ, PUBLISH-BATCH-SEQ), so the broker drops a resent publish it had journaled before it
  died. A named producer starts where the broker says its name stopped (PRODUCE-OK), so a restarted
  process neither repeats nor skips. Against a broker older than version 6 publishes are
  at-least-once (a resent one the broker had written may appear twice), and a named producer is
  refused with :class:`~zeps.errors.ProducerError`.
* **Fetches** (version 7). :meth:`ClientSession.fetch` asks for a range of the journal (FETCH); its
  records arrive in the inbox as any delivery and its end in :attr:`ClientSession.fetch_ends`. A
  peering that fetches does not subscribe (deliveries do not say which they answer). A fetch open
  when the peering drops is sent again after the re-attach, from after the last record it delivered.
"""

from __future__ import annotations

import re
import time
from collections import deque
from dataclasses import dataclass
from datetime import datetime
from typing import Literal, NamedTuple

from zeps._records import Records
from zeps.errors import (
    ConfigError,
    LocalProtocolError,
    MessageTooLargeError,
    ProducerError,
    ProtocolError,
    PublishRefusedError,
    RemoteProtocolError,
)
from zeps.protocol import (
    LATEST,
    Attach,
    AttachOk,
    Connection,
    Credit,
    Deliver,
    DeliverBatch,
    DeliverRun,
    DeliverTs,
    Detach,
    DetachOk,
    Fetch,
    FetchEnd,
    Invalid,
    InvalidCode,
    Ping,
    PingOk,
    ProduceOk,
    Publish,
    PublishBatch,
    PublishBatchSeq,
    PublishSeq,
    Refusal,
    Subscribe,
    SubscribeOk,
    SubscribeTime,
    decode,
    deliver_size,
    encode,
    encode_publish,
    encode_publish_batch,
    encode_publish_seq,
)
from zeps.protocol._fastpath import is_key
from zeps.protocol.commands import CODES_SINCE
from zeps.protocol.connection import CLIENT_VERSION, FOLLOWER_READS_VERSION, stays_attached
from zeps.protocol.limits import DEFAULT_MAX_MESSAGE_BYTES, MAX_CREDIT_BYTES, MAX_MESSAGE_BYTES_CEILING

from .inbox import Inbox, Row
from .publishing import Producer, Unconfirmed

__all__ = ["ClientSession", "Fetched", "Message", "Records", "Row", "Seq", "Since", "Time"]


#: from these versions an attached client's PUBLISH-SEQ and PUBLISH (one message at a time) need no
#: check by the state machine: it would take them and stay attached (never, if the rules said otherwise)
def _unchecked_since(command: type[Publish] | type[PublishSeq]) -> int:
    since = stays_attached("client", "send", command)
    return 1 << 30 if since is None else since


_PUBLISH_SEQ_SINCE, _PUBLISH_SINCE = _unchecked_since(PublishSeq), _unchecked_since(Publish)

# The exact refusals of brokers from before codes (their state machine's messages), for them alone:
# ATTACH of a version they do not speak, and a frame from a peer they do not know (expired, restarted).
_LEGACY_VERSION_REFUSAL = re.compile(r"ATTACH version \d+ is not supported \(use one of [\d, ]+\)$")
_LEGACY_NOT_ATTACHED = re.compile(r"^[A-Z-]+ is not allowed when await attach$")
_PRODUCES_SINCE = 6
_FETCHES_SINCE = 7
_PRODUCER_REFUSALS = (Refusal.FENCED, Refusal.PRODUCER_UNKNOWN, Refusal.OUT_OF_SEQUENCE, Refusal.PRODUCER_LIMIT)
_PUBLISH_REFUSALS = (Refusal.TOO_LARGE, Refusal.JOURNAL_FULL, Refusal.NOT_ENOUGH_REPLICAS)
#: refusals after which the broker forgot the peering: attach again (and resend what is unconfirmed)
_ATTACH_AGAIN = (Refusal.JOURNAL_FULL, Refusal.NOT_ENOUGH_REPLICAS)
_DELIVERY_OVERHEAD = 1024  # a delivery's bytes besides the body: frame, record header, key (255), index


@dataclass(frozen=True)
class Seq:
    """Start after this sequence: Seq(0) is everything retained, Seq(n) resumes after n."""

    after: int


@dataclass(frozen=True)
class Time:
    """Start at the first message at or after this moment (needs a version-2 broker)."""

    at: datetime | float  # a datetime, or seconds since the epoch

    @property
    def ms(self) -> int:
        seconds = self.at.timestamp() if isinstance(self.at, datetime) else self.at
        return int(seconds * 1000)


Since = Seq | Time | Literal["earliest", "latest"]


class Message(NamedTuple):
    """A delivered message (a named tuple: cheap to make by the million)."""

    sequence: int
    key: str
    body: bytes
    timestamp_ms: int | None  #: the broker's time (None from a version-1 broker)


class Fetched(NamedTuple):
    """What a fetch returned: the matching records of ``first`` .. ``last``, the range it covered
    (``first`` = ``last`` + 1: nothing; a ``first`` above the one asked for: retention removed the
    records in between)."""

    messages: list[Message]
    first: int
    last: int


def _check_settings(
    max_message_bytes: int, credit_window: int, producer: str | None, *, idempotent: bool, generation: int
) -> None:
    """ConfigError naming the setting unless the session's settings work (limits: a broker's, from
    :mod:`zeps.protocol.limits`)."""
    if producer is not None and not (producer.isascii() and producer.isprintable() and " " not in producer
                                     and 0 < len(producer) < 256):  # fmt: skip
        raise ConfigError(f"producer_id={producer!r}: a producer name is 1-255 printable ASCII, no spaces")
    if not 0 <= generation < 2**64:
        raise ConfigError(f"generation={generation}: a generation is 0 (none) to 2^64-1")
    if generation and producer is None:
        raise ConfigError("generation= numbers the units of work of a named producer: give producer_id= too")
    if producer is not None and not idempotent:
        raise ConfigError("producer_id= names an idempotent producer: leave idempotent=True, or drop producer_id")
    if not 0 < max_message_bytes <= MAX_MESSAGE_BYTES_CEILING:
        raise ConfigError(f"max_message_bytes={max_message_bytes}: must be between 1 and {MAX_MESSAGE_BYTES_CEILING}")
    if not max_message_bytes + _DELIVERY_OVERHEAD <= credit_window <= MAX_CREDIT_BYTES:
        raise ConfigError(f"credit_window={credit_window}: must be between max_message_bytes + {_DELIVERY_OVERHEAD} "
                          f"({max_message_bytes + _DELIVERY_OVERHEAD}: a delivery of the largest message must fit) "
                          f"and {MAX_CREDIT_BYTES} (the broker's cap)")  # fmt: skip


@dataclass
class _Sub:
    pattern: str
    since: Since


class ClientSession:
    """Client protocol state for one stream; produces frames and consumes frames."""

    def __init__(
        self,
        stream: str,
        *,
        credit_window: int = 4 << 20,
        confirm_every: int = 1000,
        producer: str | None = None,
        idempotent: bool = True,
        generation: int = 0,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        reads_only: bool = False,
    ) -> None:
        _check_settings(max_message_bytes, credit_window, producer, idempotent=idempotent, generation=generation)
        self.stream = stream
        #: a reader of followers: attaches with version 8 (a follower serves it reads) and never publishes
        self.reads_only = reads_only
        #: the idempotent producer (None: plain, at-least-once publishes); named by the caller or random
        self.producer = Producer(producer, generation) if idempotent else None
        self.unconfirmed_publishes = Unconfirmed(confirm_every)  #: kept until a barrier confirms them
        self.publish_frames = 0  #: publish frames made (PUBLISH carries one message, PUBLISH-BATCH many)
        self.producer_error: str | None = None  #: why the broker refused this producer (raise ProducerError)
        #: why the broker refused publishes (TOO_LARGE, JOURNAL_FULL), and its code: see :meth:`check_publishes`
        self.publish_refused: str | None = None
        self.publish_refused_code: int | None = None
        self.max_message_bytes = max_message_bytes
        self.credit_window = credit_window
        self.version = FOLLOWER_READS_VERSION if reads_only else CLIENT_VERSION
        self.conn = Connection("client")
        self.attached = False
        self.refused: str | None = None
        self.refused_code: int | None = None  #: the Refusal code, from a broker that sends codes
        self.forgotten = False  # the broker answered as if we had never attached
        self.last_sequence: int | None = None  # the last delivery received on any subscription
        self.subscriptions: list[_Sub] = []
        #: delivered, not yet taken by the application (take rows with ``inbox.take`` and its kin)
        self.inbox = Inbox(credit_window, self._give_credit, largest=max_message_bytes + _DELIVERY_OVERHEAD)
        self.outbox: list[bytes] = []  #: frames due to the broker now (CREDIT for what the application took)
        self.errors: deque[str] = deque()
        self.fetch_open: Fetch | None = None  #: the fetch asked for and not ended yet
        self.fetch_ends: deque[tuple[int, int]] = deque()  #: (first, last) of each ended fetch, oldest first
        self._fetching = False  # this peering fetches (so it never subscribes)
        self._fetch_sent: Fetch | None = None  # the FETCH on the wire (resent from later after a re-attach)
        self._fetched_to = 0  # the last sequence the open fetch delivered
        self._credited = False  # CREDIT granted on this peering since it attached
        self.last_heard = time.monotonic()

    # -- attaching ------------------------------------------------------------------------------
    def _plain_invalid(self, reason: str) -> list[bytes]:
        """INVALID without a code: from a broker that predates codes, or one that does not know us.

        A broker that speaks version 5 answers an ATTACH of 5 with INVALID-CODE, and a peering attached
        with 5 likewise, except when it has forgotten the peer (expired, restarted): so a plain INVALID
        means "an older broker" while attaching, and "attach again" once attached with 5. Older
        brokers are recognised by their exact messages (the state machine's), never by a word that a
        stream name or pattern could contain. Once the broker said it forgot us (NOT_LEADER, say) or
        refused us (UNAUTHORIZED: a revoked key), the frames we sent before we knew get plain INVALIDs:
        those answer nothing of the next attach (a client whose key was rotated attaches again)."""
        if self.forgotten or self.refused:
            return []
        if not self.attached:
            if self.version >= CODES_SINCE:
                self.version = CODES_SINCE - 1  # a broker from before codes: attach as the newest it may know
                return [self.attach()]
            if self.version > 1 and _LEGACY_VERSION_REFUSAL.match(reason):
                self.version -= 1
                return [self.attach()]
            self.refused = reason
        elif self.publish_refused_code in _ATTACH_AGAIN:
            pass  # it forgot us when it refused our publishes: we attach again once check_publishes says so
        elif self.conn.version >= CODES_SINCE or _LEGACY_NOT_ATTACHED.search(reason):
            self.forgotten = True  # it expired our session, or restarted: attach again
        else:
            self.errors.append(reason)
        return []

    def attach(self) -> bytes:
        self.conn = Connection("client")
        self.attached = False
        self._credited = False
        return self.conn.send(Attach(stream=self.stream, version=self.version))

    @property
    def sequencing(self) -> bool:
        """Publishes carry producer sequences (an idempotent producer on a version 6 peering)."""
        return self.producer is not None and self.conn.version >= _PRODUCES_SINCE

    @property
    def ready(self) -> bool:
        """Attached, and a named producer knows where its sequence goes on (PRODUCE-OK)."""
        producer = self.producer
        return self.attached and (producer is None or producer.producing or not (self.sequencing and producer.named))

    @property
    def producer_sequence(self) -> int:
        """The last producer sequence the broker confirmed holding (0: none): a restarted publisher with
        the same ``producer`` continues its input after this many items."""
        return 0 if self.producer is None else self.producer.confirmed(self.unconfirmed_publishes.messages)

    def on_attached(self) -> list[bytes]:
        """After ATTACH-OK: claim the producer, re-subscribe (resuming), resend unconfirmed publishes."""
        frames = []
        producer = self.producer
        if producer is not None:
            producer.reattached()
        if producer is not None and self.sequencing and producer.claimed:
            frames.append(self._produce())
        elif producer is not None and producer.named and not self.sequencing:
            self.producer_error = (f"the broker speaks ZEPS version {self.conn.version}, without idempotent "
                                   "producers (version 6): publish without producer_id=, or upgrade it")  # fmt: skip
        for sub in self.subscriptions:
            frames += self._subscribe_frames(sub)
        if self.fetch_open is not None:
            frames += self._fetch_frames()
        for frame, _ in self.unconfirmed_publishes.frames:
            frames += self._as_version(frame)
        if self.unconfirmed_publishes.frames:
            frames.append(self._barrier())
        return frames

    def _produce(self) -> bytes:
        """PRODUCE on this peering: claim the producer (afresh with epoch 0, or resuming its epoch)."""
        assert self.producer is not None
        return self.conn.send(self.producer.produce())

    def _as_version(self, frame: bytes) -> list[bytes]:
        """A remembered publish frame as this peering's version can take it (the broker may be older
        than the one it was made for: sequences dropped, batches split)."""
        kind, version = frame[2], self.conn.version
        if kind in (PublishSeq.ID, PublishBatchSeq.ID) and version < _PRODUCES_SINCE:
            command = decode(frame)
            if isinstance(command, PublishSeq):
                return [encode(Publish(key=command.key, body=command.body))]
            assert isinstance(command, PublishBatchSeq)
            if version >= 3:
                return [encode_publish_batch(list(command.items))]
            return [encode(Publish(key=key, body=body)) for key, body in command.items]
        if kind == PublishBatch.ID and version < 3:  # the broker is older now: one by one
            batch = decode(frame)
            assert isinstance(batch, PublishBatch)
            return [encode(Publish(key=key, body=body)) for key, body in batch.items]
        return [frame]

    # -- commands -------------------------------------------------------------------------------
    def fetch(self, command: Fetch) -> list[bytes]:
        """Ask for a range of the journal (version 7); its end arrives in :attr:`fetch_ends`."""
        if self.subscriptions:
            raise LocalProtocolError("a peering that subscribes cannot fetch (deliveries do not say which they "
                                     "answer): fetch on a client of its own")  # fmt: skip
        if self.fetch_open is not None:
            raise LocalProtocolError("one fetch at a time per peering: wait for the open one to end")
        self._fetching = True
        self.fetch_open, self._fetched_to = command, 0
        return self._fetch_frames() if self.attached else []

    def _fetch_frames(self) -> list[bytes]:
        assert self.fetch_open is not None
        if self.conn.version < _FETCHES_SINCE:
            raise ConfigError(f"the broker speaks ZEPS version {self.conn.version}, without FETCH and the multicast "
                              f"output (version {_FETCHES_SINCE}): upgrade it")  # fmt: skip
        command = self.fetch_open
        if self._fetched_to and self._fetched_to >= command.first:  # sent before the peering dropped: go on after it
            command = Fetch(pattern=command.pattern, first=self._fetched_to + 1, last=command.last, since=command.since)
        self._fetch_sent = command
        frames = [self.conn.send(command)]
        if not self._credited:
            self._credited = True
            frames += self._grant_window()
        return frames

    def fetched(self, messages: list[Message]) -> tuple[bool, Fetched | None]:
        """The open fetch's progress: its records delivered so far move into ``messages``; returns
        whether any came, and the result once its FETCH-END did (ProtocolError if the broker refused
        it: the fetch is over)."""
        rows = self.inbox.take(1 << 30)
        messages += map(Message._make, rows)
        if self.fetch_ends:
            first, last = self.fetch_ends.popleft()
            return bool(rows), Fetched(messages, first, last)
        if self.errors:
            self.fetch_open = self._fetch_sent = None
            raise ProtocolError(f"broker refused: {self.errors.popleft()}")
        return bool(rows), None

    def _fetch_ended(self, end: FetchEnd) -> None:
        asked, sent = self.fetch_open, self._fetch_sent
        if asked is None or sent is None:
            self.errors.append("FETCH-END without a FETCH")
            return
        # a fetch sent again from later covered the first part before: report the range as asked
        first = asked.first if sent is not asked and end.first <= sent.first else end.first
        self.fetch_ends.append((first, end.last))
        self.fetch_open = self._fetch_sent = None

    def subscribe(self, pattern: str, since: Since) -> list[bytes]:
        if self._fetching:
            raise LocalProtocolError("a peering that fetches cannot subscribe (deliveries do not say which they "
                                     "answer): subscribe on a client of its own")  # fmt: skip
        sub = _Sub(pattern, since)
        self.subscriptions.append(sub)
        return self._subscribe_frames(sub) if self.attached else []

    def _subscribe_frames(self, sub: _Sub) -> list[bytes]:
        if self.last_sequence is not None:  # resuming: continue right after what we have
            command: Subscribe | SubscribeTime = Subscribe(pattern=sub.pattern, latest=self.last_sequence)
        elif isinstance(sub.since, Time):
            if self.conn.version < 2:
                raise RemoteProtocolError("the broker speaks ZEPS version 1, which cannot replay from a time")
            command = SubscribeTime(pattern=sub.pattern, since=sub.since.ms)
        elif isinstance(sub.since, Seq):
            command = Subscribe(pattern=sub.pattern, latest=sub.since.after)
        else:
            command = Subscribe(pattern=sub.pattern, latest=0 if sub.since == "earliest" else LATEST)
        return [self.conn.send(command), *self._grant_window()]

    def _grant_window(self) -> list[bytes]:
        """CREDIT for a new subscription or fetch: the window, less what the inbox still holds (after a
        re-attach, deliveries of the old peering the application has not taken yet)."""
        grant = self.inbox.grant()
        return [self.conn.send(Credit(credit=grant))] if grant > 0 else []

    def _take_sequences(self, count: int) -> tuple[int | None, list[bytes]]:
        """The producer sequence of the first of ``count`` publishes (None: plain publishes), and the
        PRODUCE to send before them if this peering has not claimed the producer yet."""
        if self.reads_only:
            raise ConfigError(
                f"this client of stream {self.stream!r} reads from followers (follower_reads=True), which "
                "never take publishes: publish through a client without follower_reads"
            )
        if self.producer_error is not None:
            raise ProducerError(self.producer_error)
        producer = self.producer
        if producer is None or not self.sequencing:
            return None, []
        first = producer.number(count)
        if producer.claim_due(self.attached):  # detached: on_attached claims it
            if self.attached:
                return first, [self._produce()]
            producer.claimed = True
        return first, []

    def check_publishes(self) -> None:
        """Raise what the broker said of this client's publishes: :class:`ProducerError` (the producer
        was refused: every later publish would be too) or :class:`PublishRefusedError`. A refusal for
        a full journal is raised once: the broker forgot the peering, and the client attaches again
        at its next turn and resends what is unconfirmed (the volume may have room by then)."""
        if self.producer_error is not None:
            raise ProducerError(f"{self.producer_error} ({self.unconfirmed} publishes unconfirmed)")
        if self.publish_refused is not None:
            error = PublishRefusedError(f"broker refused publishes: {self.publish_refused} "
                                        f"({self.unconfirmed} publishes unconfirmed)")  # fmt: skip
            if self.publish_refused_code in _ATTACH_AGAIN:
                self.publish_refused = self.publish_refused_code = None
                self.forgotten = True  # attach again: the re-attach resends the unconfirmed publishes
            raise error

    def _check_size(self, body: bytes) -> None:
        if len(body) > self.max_message_bytes:
            raise MessageTooLargeError(f"a message body of {len(body)} bytes is over max_message_bytes="
                                       f"{self.max_message_bytes} (the stream's maxMessageBytes): nothing was "
                                       "sent; split the message, or raise both limits")  # fmt: skip

    def batchable(self, key: str, body: bytes) -> bool:
        """Whether a publish of ``key``, ``body`` can wait to go out in a PUBLISH-BATCH with the next
        ones (a lingering client, :class:`~zeps.client.StreamClient`'s ``linger``): attached at version
        3 or later, the producer's numbering known, a key PUBLISH-BATCH carries. A body over the limit
        raises here, as :meth:`publish` would; any other refusal is :meth:`publish`'s to say."""
        self._check_size(body)
        if not (self.attached and self.conn.version >= 3) or self.reads_only or self.producer_error is not None:
            return False
        producer = self.producer
        if producer is not None and self.sequencing and producer.next_sequence is None:
            return False
        return is_key(key)

    def _check_key(self, key: str) -> None:
        """A key PUBLISH cannot carry is refused (the codec says why) before a producer sequence is
        taken for it: a sequence taken and never sent would leave the producer's numbering a gap."""
        if not is_key(key):
            encode(Publish(key=key, body=b""))

    def publish(self, key: str, body: bytes) -> list[bytes]:
        self._check_size(body)
        self._check_key(key)
        sequence, claim = self._take_sequences(1)
        # while detached the frame waits for ATTACH-OK (on_attached resends it), so it is encoded
        # outside the state machine; it is checked like any other once it is sent
        conn = self.conn
        if sequence is None:
            fast = encode_publish(key, body)  # None for a key the generic codec refuses, saying why
            if fast is not None and (
                not self.attached or (conn.state == "ATTACHED" and conn.version >= _PUBLISH_SINCE)
            ):
                return claim + self._remember(fast, 1)  # the state machine would take it: no object to check
            command: Publish | PublishSeq = Publish(key=key, body=body)
            frame = encode(command)
        else:
            frame = encode_publish_seq(sequence, key, body)
            if not self.attached or (conn.state == "ATTACHED" and conn.version >= _PUBLISH_SEQ_SINCE):
                return claim + self._remember(frame, 1)
            command = PublishSeq(sequence=sequence, key=key, body=b"")
        if self.attached:
            conn.sent(command)
        return claim + self._remember(frame, 1)

    def publish_many(self, items: list[tuple[str, bytes]], *, batch_bytes: int = 256 * 1024) -> list[bytes]:
        """Frames publishing ``items`` in order: PUBLISH-BATCHes of up to ``batch_bytes`` on a
        version 3 peering, one PUBLISH per message otherwise."""
        checked: set[str] = set()
        for key, body in items:  # before any frame is made (or sequence taken): all of them go, or none
            self._check_size(body)
            if key not in checked:
                self._check_key(key)
                checked.add(key)
        if self.attached and self.conn.version < 3:
            return [f for key, body in items for f in self.publish(key, body)]
        frames: list[bytes] = []
        start, size = 0, 0
        for i, (key, body) in enumerate(items):
            size += len(key) + len(body) + 5
            if size >= batch_bytes or i == len(items) - 1:
                sequence, claim = self._take_sequences(i + 1 - start)
                frames += claim
                frame = encode_publish_batch(items[start : i + 1], sequence)
                if self.attached:
                    self.conn.sent(PublishBatch(entries=b"") if sequence is None
                                   else PublishBatchSeq(sequence=sequence, entries=b""))  # fmt: skip
                frames += self._remember(frame, i + 1 - start)
                start, size = i + 1, 0
        return frames

    def _remember(self, frame: bytes, count: int) -> list[bytes]:
        """Keep a publish frame until a barrier confirms it; returns the frames to send now."""
        self.publish_frames += 1
        barrier_due = self.unconfirmed_publishes.add(frame, count)
        if not self.attached:
            return []
        return [frame, self._barrier()] if barrier_due else [frame]

    def _barrier(self) -> bytes:
        self.unconfirmed_publishes.barrier()
        return self.conn.send(Ping())

    def ping(self) -> bytes:
        """A heartbeat; it doubles as a barrier for the publishes before it."""
        return self._barrier()

    def confirm(self) -> list[bytes]:
        """A barrier for the publishes not yet covered by one (call when idle, or before closing)."""
        if self.attached and self.unconfirmed_publishes.since_barrier:
            return [self._barrier()]
        return []

    @property
    def unconfirmed(self) -> int:
        """Messages published and not yet confirmed by the broker."""
        return self.unconfirmed_publishes.messages

    def detach(self) -> bytes | None:
        return self.conn.send(Detach()) if self.attached else None

    # -- input ----------------------------------------------------------------------------------
    def _delivered_run(self, run: Records, size: int) -> None:
        """A run of delivered records (a frame of ``size`` bytes) into the inbox, without what arrived
        before (a re-attach resends); a run with nothing new gives its credit back at once."""
        if self._fetching:  # a fetch's records: a range of its own, not a subscription's resume point
            if self._fetched_to and run.sequence(0) <= self._fetched_to:
                run = run.after(self._fetched_to)
            if len(run):
                self._fetched_to = run.sequence(-1)
        else:
            if self.last_sequence is not None and run.sequence(0) <= self.last_sequence:
                run = run.after(self.last_sequence)
            if len(run):
                self.last_sequence = run.sequence(-1)
        if len(run):
            self.inbox.hold(run, size)
        else:
            self.inbox.done(size)

    def _give_credit(self, grant: int) -> bool:
        """The inbox's credit of ``grant`` bytes for what the application took, as CREDIT in
        :attr:`outbox` (False while detached: the inbox counts it on until the next grant)."""
        if not self.attached:
            return False
        self.outbox.append(self.conn.send(Credit(credit=grant)))
        return True

    def take_outbox(self) -> list[bytes]:
        """The frames due to the broker now (CREDIT for what the application took), emptied."""
        frames, self.outbox = self.outbox, []
        return frames

    def receive(self, frame: bytes) -> list[bytes]:
        """Handle one frame from the broker; returns frames to send in answer."""
        self.last_heard = time.monotonic()
        command = self.conn.receive(frame)
        if isinstance(command, AttachOk):
            self.attached = True
            return self.on_attached()
        if isinstance(command, DeliverBatch | DeliverRun):
            assert command.run is not None  # decode() checks the records and sets it
            self._delivered_run(command.run, len(frame))
            return []
        if isinstance(command, Deliver | DeliverTs):
            ts = command.timestamp if isinstance(command, DeliverTs) else None
            size = deliver_size(command.sequence, command.key, len(command.body), timestamps=ts is not None)
            if self.last_sequence is None or command.sequence > self.last_sequence:
                self.inbox.hold((command.sequence, command.key, command.body, ts), size)
                self.last_sequence = command.sequence
            else:
                self.inbox.done(size)
            return []
        if isinstance(command, Ping):
            return [self.conn.send(PingOk())]
        if isinstance(command, ProduceOk):
            if self.producer is not None:
                self.producer.produced(command)
            return []
        if isinstance(command, FetchEnd):
            self._fetch_ended(command)
            return []
        if isinstance(command, PingOk):
            if self.producer_error is not None or self.publish_refused is not None:
                return []  # the broker refused publishes before this barrier: they stay unconfirmed
            self.unconfirmed_publishes.confirmed()
            return []
        if isinstance(command, InvalidCode):  # version 5: decided on the code, never on the text
            if self.attached and command.code in _PRODUCER_REFUSALS:  # PRODUCE or a publish refused
                name = self.producer.name if self.producer is not None else None
                self.producer_error = f"broker refused producer {name!r}: {command.reason}"
                return []
            if self.attached and command.code in _ATTACH_AGAIN and not self.unconfirmed:
                # nothing of ours is unconfirmed: the broker forgot this peering for what it held of
                # it (a reader's PING-OK, when too few replicas are in sync), and nobody would call
                # check_publishes to attach again: attach again now, as after NOT_LEADER (a reader
                # that waited stayed stuck, its PINGs answered "not attached", which kept it alive)
                self.attached = False
                self.forgotten = True
                return []
            if self.attached and command.code in _PUBLISH_REFUSALS:
                self.publish_refused, self.publish_refused_code = command.reason, command.code
                return []
            if command.code == Refusal.NOT_LEADER:  # a replica that does not lead: find the leader, attach there
                self.attached = False
                self.forgotten = True
                return []
            if command.code == Refusal.UNAUTHORIZED:  # revoked: no attach can help
                self.attached = False
                self.refused, self.refused_code = command.reason, command.code
                return []
            if not self.attached:
                if command.code == Refusal.VERSION_UNSUPPORTED and self.version > 1:
                    self.version -= 1  # attach again with the version below
                    return [self.attach()]
                self.refused, self.refused_code = command.reason, command.code
            else:
                self.errors.append(command.reason)
            return []
        if isinstance(command, Invalid):
            return self._plain_invalid(command.reason)
        if isinstance(command, Detach | DetachOk | SubscribeOk):
            if isinstance(command, Detach | DetachOk):
                self.attached = False
            return []
        return []

    def disconnected(self) -> None:
        """The transport dropped: everything since the last barrier will be resent on re-attach."""
        self.attached = False
        self.forgotten = False
        self.unconfirmed_publishes.disconnected()

"""The blocking ZEPS client (a DEALER socket); :mod:`zeps.client.aio` mirrors it for asyncio.

::

    with StreamClient("tcp://127.0.0.1:5555", "prices") as client:
        client.publish("eu.fr.cac40", b"7345.2")
        for message in client.subscribe("eu.", since=Seq(1000)):   # replay, then live
            ...

Heartbeats are answered and sent while the client is used (waiting in ``receive`` or iterating a
subscription counts). A broker silent for ``ttl`` seconds, a dropped connection, or a broker that
forgot this client makes it reconnect in the background, re-attach, resume its subscriptions after
the last sequence it received, and resend publishes the broker had not confirmed.

**Lingering** (``linger=`` seconds; ``DEFAULT_LINGER``, 0.5 ms, unless told; 0: never). A publish
that comes less than ``linger`` after the one before waits, up to ``linger``, to go out with the ones
that follow in one PUBLISH-BATCH: the broker's cost is per frame, so a loop of one-at-a-time
publishes then costs it what ``publish_many`` does. The first publish after a quiet spell goes at
once, so sparse publishes are never delayed. What waits goes out once ``HOLD_MESSAGES`` or
``HOLD_BYTES`` wait, at the client's next call of any kind, or, if the application calls nothing,
from the client's linger thread once ``linger`` has passed (Kafka's ``linger.ms``). Every call takes
the client's lock, so that thread never uses the socket while the application does.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

import zmq
import zmq.auth
from zmq.utils.monitor import recv_monitor_message

from zeps.client._transport import (
    DEFAULT_LINGER,
    GROUP,
    HOLD_BYTES,
    HOLD_MESSAGES,
    LOCATE_EVERY,
    MAX_LINGER,
    MONITORED,
    BrokerUnavailableError,
    CurveTrust,
    Locator,
    Opened,
    batched,
    check_endpoint,
    check_linger,
    close_dealer,
    configure_curve,
    configure_dealer,
    curve_options,
    failed_handshake,
    partition_endpoint,
    refused_handshake,
)
from zeps.client.discovery import locator_of
from zeps.client.multicast import Group, GroupSubscription
from zeps.client.session import ClientSession, Fetched, Message, Records, Row, Since, Time
from zeps.config import Resolved
from zeps.errors import ProducerError, ProtocolError, ZepsError
from zeps.options import MulticastOptions
from zeps.protocol import LATEST, Fetch, Refusal
from zeps.protocol.limits import DEFAULT_MAX_MESSAGE_BYTES

__all__ = ["MulticastSubscription", "StreamClient", "wait_any"]

_NOBLOCK = int(zmq.NOBLOCK)  # a plain int: pyzmq converts its enums at every call

log = logging.getLogger(__name__)


class StreamClient(Opened):
    """One peering with a broker for one stream. Not thread-safe: one thread uses it (a lingering
    client's own thread only sends what waits, under the client's lock)."""

    def __init__(
        self,
        endpoint: str,
        stream: str,
        *,
        credit_window: int = 4 << 20,
        heartbeat: float = 2.0,
        ttl: float = 10.0,
        timeout: float = 10.0,
        server_public_key: str | None = None,
        client_keys: tuple[str, str] | None = None,
        curve_certificate: str | Path | None = None,
        max_unconfirmed: int = 100_000,
        producer_id: str | None = None,
        idempotent: bool = True,
        generation: int = 0,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        locator: Locator | None = None,
        follower_reads: bool = False,
        linger: float = DEFAULT_LINGER,
    ) -> None:
        self.linger = check_linger(linger)
        self.endpoint = check_endpoint(endpoint)
        #: where the broker is now, asked at each reconnection (a replicated stream's leader moves)
        self.locator = locator
        self._located = 0.0
        self.session = ClientSession(stream, credit_window=credit_window, producer=producer_id, idempotent=idempotent,
                                     generation=generation, max_message_bytes=max_message_bytes,
                                     reads_only=follower_reads)  # fmt: skip
        self.heartbeat, self.ttl, self.timeout = heartbeat, ttl, timeout
        self.server_public_key = server_public_key
        self.client_keys = client_keys
        #: the keys of each (re)connection: with ``curve_certificate`` (what the operator's Secret holds),
        #: read again each time, so a key rotation reaches the client without a restart
        self._trust = CurveTrust(server_public_key, client_keys, curve_certificate)
        self.max_unconfirmed = max_unconfirmed
        self._ctx: zmq.Context[Any] = zmq.Context()
        self._sock: zmq.Socket[Any] | None = None
        self._monitor: zmq.Socket[Any] | None = None
        self._last_ping = 0.0
        self._last_pump = 0.0
        self._poller = zmq.Poller()
        self._watched: list[MulticastSubscription] = []  # their sockets wake the client's waits too
        self.reconnects = 0
        self._lock = threading.RLock()  # every call holds it: the linger thread sends only between calls
        self._held: list[tuple[str, bytes]] = []  # lingering publishes, not made into frames yet
        self._held_bytes = 0
        self._held_since = 0.0  # when the oldest of them was published
        self._last_publish = 0.0
        self._wake = threading.Event()  # set while publishes wait (and at close)
        self._sender: threading.Thread | None = None  # the linger thread, started at the first wait
        self._sender_error: BaseException | None = None  # what the linger thread's last send raised
        self._closing = False

    @classmethod
    def of(cls, settings: Resolved, partition: int = 0, **options: Any) -> StreamClient:
        """A client of a resolved stream (:func:`zeps.config.resolve`; what ``zeps.stream()``, the CLI and
        the Spark source use): its endpoint, CURVE keys (:func:`curve_keys`) and message limit; ``options``
        as for the constructor. Not connected yet."""
        followers = options.get("follower_reads", False)
        options.setdefault("locator", locator_of(settings, followers=followers, partition=partition))
        return cls(partition_endpoint(settings, partition), settings.name, **curve_options(settings),
                   max_message_bytes=settings.max_message_bytes, **options)  # fmt: skip

    # -- connection -----------------------------------------------------------------------------
    def connect(self) -> StreamClient:
        with self._lock:
            if self.session.reads_only:
                self._locate()  # a reader of followers goes to one from the start (the endpoint may be the leader)
            self._open_socket()
            self._attach()
        return self

    def _open_socket(self) -> None:
        sock = self._ctx.socket(zmq.DEALER)
        configure_dealer(sock)
        self.server_public_key, self.client_keys = self._trust.next_keys()
        configure_curve(sock, self.server_public_key, self.client_keys)
        self._monitor = sock.get_monitor_socket(MONITORED)
        sock.connect(self.endpoint)
        self._sock = sock
        self._poller = zmq.Poller()
        self._poller.register(sock, zmq.POLLIN)
        self._poller.register(self._monitor, zmq.POLLIN)
        for watched in self._watched:
            self._poller.register(watched.socket, zmq.POLLIN)

    def _watch(self, subscription: MulticastSubscription) -> None:
        """Wake the client's waits for the subscription's group socket too; closed with the client."""
        self._watched.append(subscription)
        self._poller.register(subscription.socket, zmq.POLLIN)

    def _unwatch(self, subscription: MulticastSubscription) -> None:
        if subscription in self._watched:
            self._watched.remove(subscription)
            self._poller.unregister(subscription.socket)

    def _attach(self) -> None:
        """The first attach: wait for the answer (a refusal or silence is an error)."""
        assert self._sock is not None
        deadline = time.monotonic() + self.timeout
        self._sock.send(self.session.attach())  # ZeroMQ sends it as soon as the connection is up
        while not self.session.ready:
            if self.session.refused:
                raise BrokerUnavailableError(f"broker at {self.endpoint} refused: {self.session.refused}")
            if self.session.producer_error:
                raise ProducerError(self.session.producer_error)
            # in slices: a broker that never answers (a dead leader) is looked for again meanwhile
            if not self._pump(min(deadline - time.monotonic(), 0.5)) and time.monotonic() >= deadline:
                raise BrokerUnavailableError(f"no broker answered at {self.endpoint} within {self.timeout:.0f}s")
        if self.session.producer_error:  # a named producer on a broker without version 6: say so now
            raise ProducerError(self.session.producer_error)
        self.session.last_heard = time.monotonic()

    def _reconnect(self) -> None:
        """Start over on a fresh socket, without waiting: ATTACH is queued and sent once the broker is
        reachable; its ATTACH-OK resumes the subscriptions and resends unconfirmed publishes. With a
        locator, at the broker's endpoint now (a replicated stream's leader)."""
        self.reconnects += 1
        self._locate()
        self.session.disconnected()
        self._close_socket()
        self._open_socket()
        assert self._sock is not None
        self._sock.send(self.session.attach())
        self.session.last_heard = time.monotonic()

    def _locate(self) -> bool:
        """Ask the locator where the broker is (at most every 0.2 s); True if it moved."""
        if self.locator is None:
            return False
        wait = self._located + LOCATE_EVERY - time.monotonic()
        if wait > 0:
            time.sleep(wait)  # a replica refused us (NOT_LEADER) or an election is on: do not spin
        self._located = time.monotonic()
        try:
            endpoint = check_endpoint(self.locator())
        except BrokerUnavailableError:
            return False  # no leader yet: the same endpoint for now, and asked again while detached
        except Exception as exc:
            log.debug("could not ask where the broker is (%r): staying at %s", exc, self.endpoint)
            return False
        moved, self.endpoint = endpoint != self.endpoint, endpoint
        return moved

    def _close_socket(self) -> None:
        close_dealer(self._sock, self._monitor)
        self._sock = self._monitor = None

    def close(self) -> None:
        """Confirm outstanding publishes (bounded by ``timeout``), detach, close. Publishes the broker
        did not confirm are an error (the one :meth:`flush` raises), raised once everything is closed."""
        self._stop_sender()  # what waits goes with the flush below
        with self._lock:
            unconfirmed: ZepsError | None = None
            if self._sock is not None:
                try:
                    self.flush()
                except ZepsError as exc:
                    unconfirmed = exc
                frame = self.session.detach()
                with contextlib.suppress(zmq.ZMQError):
                    if frame:
                        self._sock.send(frame, zmq.NOBLOCK)
                self._close_socket()
            for watched in list(self._watched):
                watched.close()
            if self.locator is not None:
                self.locator.close()
            self._ctx.term()
            if unconfirmed is not None:
                raise unconfirmed

    # -- I/O ------------------------------------------------------------------------------------
    def _send_all(self, frames: list[bytes], deadline: float) -> None:
        assert self._sock is not None
        send = self._sock.send
        for frame in frames:
            while True:
                try:
                    send(frame, _NOBLOCK)
                    break
                except zmq.Again:  # no connection yet, or the broker pushes back: wait, keep reading
                    if time.monotonic() >= deadline:
                        raise BrokerUnavailableError(f"broker at {self.endpoint} did not accept data in time") from None
                    self._pump(0.01, reading_only=True)

    def _pump(self, wait: float, *, reading_only: bool = False) -> bool:
        """Wait up to ``wait`` seconds for input and handle all of it; True if anything arrived."""
        assert self._sock is not None and self._monitor is not None
        self._last_pump = time.monotonic()
        for frame in self.session.take_outbox():  # CREDIT made due by takes since (a fetch's)
            self._sock.send(frame)
        events = dict(self._poller.poll(max(0, int(wait * 1000))))
        got = False
        if self._monitor in events:
            event = recv_monitor_message(self._monitor)
            refused = refused_handshake(event["event"], self.client_keys, event["value"])
            if refused is not None and self._trust.renewed():  # its key was rotated: the new one is used
                refused, event["event"] = None, zmq.EVENT_DISCONNECTED
            if refused is not None:
                self.session.refused = refused
            elif failed_handshake(event["event"]):  # the broker serves another key: the next trusted one
                self._trust.handshake_failed()  # is tried at the reconnection its DISCONNECTED brings
            elif event["event"] == zmq.EVENT_DISCONNECTED and not reading_only:
                # attached, or waiting for ATTACH-OK: an ATTACH that a broker read off the wire and
                # died before answering (it binds before its loop runs) is gone with it
                self._reconnect()
                return True
        if self._sock in events:
            answers: list[bytes] = []
            while True:
                try:
                    frame = self._sock.recv(zmq.NOBLOCK)
                except zmq.Again:
                    break
                got = True
                try:
                    answers += self.session.receive(frame)
                except ProtocolError as exc:
                    self.session.errors.append(str(exc))
            if answers:
                for frame in answers:
                    self._sock.send(frame)
            if self.session.attached and self._trust.worked != self.server_public_key:
                self._trust.attached()
            if self.session.refused_code == Refusal.UNAUTHORIZED and self._trust.renewed():
                self.session.refused = self.session.refused_code = None  # its key was rotated: the broker
                self.session.forgotten = True  # revoked the old one; it attaches again with the new
        if not reading_only:
            if self.session.forgotten:
                self._reconnect()
                return True
            self._keepalive()
        return got

    def _keepalive(self) -> None:
        now = time.monotonic()
        silent = now - self.session.last_heard
        if self.session.refused:
            raise BrokerUnavailableError(f"broker at {self.endpoint} refused: {self.session.refused}")
        if silent > self.ttl:  # attached and silent, or no ATTACH-OK: attach afresh (ATTACH may be lost)
            self._reconnect()
        elif not self.session.attached and self.locator is not None and now - self._located > 2 * LOCATE_EVERY:
            if self._locate():  # the broker we wait for is gone: its successor is elsewhere
                self._reconnect()
        elif self.session.attached and silent > self.heartbeat and now - self._last_ping > self.heartbeat:
            self._last_ping = now
            self._send_all([self.session.ping()], now + self.timeout)

    # -- lingering ------------------------------------------------------------------------------
    def _hold(self, key: str, body: bytes) -> bool:
        """Keep a publish to go out with the next ones if it lingers (True), sending what waits once
        enough does; False: it is to go out at once (after what waits)."""
        now = time.monotonic()
        recent = now - self._last_publish < self.linger
        self._last_publish = now
        held = self._held
        if not (held or recent) or not self.session.batchable(key, body):
            return False
        if not held:
            self._held_since = now
            if self._sender is None:
                self._sender = threading.Thread(target=self._linger_loop, daemon=True,
                                                name=f"zeps-linger-{self.session.stream}")  # fmt: skip
                self._sender.start()
            self._wake.set()
        held.append((key, body))
        self._held_bytes += len(key) + len(body)
        if len(held) >= HOLD_MESSAGES or self._held_bytes >= HOLD_BYTES or now - self._held_since >= self.linger:
            self._send_held()
        return True

    def _send_held(self) -> None:
        """Send the publishes that wait, in one PUBLISH-BATCH (the lock held)."""
        if not self._held:
            return
        deadline = self._room()  # may wait for room: what waits stays held if that fails
        items = self._held
        self._held, self._held_bytes = [], 0
        self._send_all(self.session.publish_many(items), deadline)

    def _linger_loop(self) -> None:
        """The linger thread: sends what waits once the oldest has waited ``linger`` and the
        application called nothing meanwhile; ends at :meth:`close`."""
        while not self._closing:
            self._wake.wait()
            delay = self._linger_turn()
            if delay is None:
                return
            if delay > 0:
                time.sleep(delay)  # not holding the lock

    def _linger_turn(self) -> float | None:
        """One turn of the linger thread: send what waits if it is due; the seconds until it is (0: go
        on waiting for a publish to wait), None at close."""
        with self._lock:
            if self._closing:
                return None
            if not self._held:
                self._wake.clear()
                return 0.0
            delay = self._held_since + self.linger - time.monotonic()
            if delay > 0:
                return delay
            self._wake.clear()
            try:
                self._send_held()
            except ZepsError as exc:  # raised by the application's next publish or flush
                self._sender_error = exc
            except Exception as exc:
                error = ZepsError(f"sending lingering publishes failed: {exc!r}")
                error.__cause__ = exc
                self._sender_error = error
            return 0.0

    def _raise_sender_error(self) -> None:
        error = self._sender_error
        if error is not None:
            self._sender_error = None
            raise error

    def _stop_sender(self) -> None:
        self._closing = True
        self._wake.set()
        sender = self._sender
        if sender is not None and sender is not threading.current_thread():
            sender.join(timeout=MAX_LINGER + 1.0)

    # -- the API --------------------------------------------------------------------------------
    @property
    def producer_id(self) -> str | None:
        """This client's idempotent producer name (None with ``idempotent=False``)."""
        producer = self.session.producer
        return None if producer is None else producer.name

    @property
    def producer_sequence(self) -> int:
        """The last publish the broker confirmed holding from this producer, counted from 1 over the
        producer's life (0: none). A publisher restarted with the same ``producer_id`` continues its
        input after this many items: nothing repeated, nothing skipped."""
        return self.session.producer_sequence

    @property
    def generation_sequence(self) -> int:
        """Publishes of this client's ``generation`` the broker held when the client claimed its
        producer: a retried unit of work (a Spark task) skips that many items and goes on."""
        producer = self.session.producer
        return 0 if producer is None else producer.generation_held or 0

    def publish(self, key: str, body: bytes) -> None:
        """Send a message (asynchronous, as ZEPS is). Blocks only while the broker pushes back, or
        while it is unreachable and ``max_unconfirmed`` messages already wait to be confirmed."""
        with self._lock:
            if self._sender_error is not None:
                self._raise_sender_error()
            if self.linger and self._hold(key, body):
                return
            self._send_held()  # in order: what waits goes first
            deadline = self._room()  # first: it may reconnect, and the frame must be made for the new peering
            self._send_all(self.session.publish(key, body), deadline)

    def publish_many(self, items: Iterable[tuple[str, bytes]]) -> None:
        """Publish ``items`` (key, body) in order, many per frame: PUBLISH-BATCH on a version 3 broker
        (one PUBLISH each on older ones). The fast way to publish a burst; same guarantees as
        :meth:`publish`."""
        with self._lock:
            self._raise_sender_error()
            self._send_held()
            for group in batched(items, GROUP):
                deadline = self._room()
                self._send_all(self.session.publish_many(group), deadline)

    def _room(self) -> float:
        """Read what arrived (at most every millisecond), wait while ``max_unconfirmed`` messages wait
        for confirmation; returns the deadline for sending."""
        now = time.monotonic()
        if now - self._last_pump > 0.001:
            self._pump(0)
        deadline = now + self.timeout
        self.session.check_publishes()
        while self.session.unconfirmed >= self.max_unconfirmed:
            self.session.check_publishes()
            if time.monotonic() >= deadline:
                raise BrokerUnavailableError(
                    f"broker at {self.endpoint} has not confirmed {self.session.unconfirmed} messages in time"
                )
            self._pump(0.05)
        return deadline

    def flush(self, timeout: float | None = None) -> None:
        """Wait until the broker confirmed every publish so far (a PING barrier)."""
        with self._lock:
            self._raise_sender_error()
            self._send_held()
            deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
            self._send_all(self.session.confirm(), deadline)
            while self.session.unconfirmed:
                self.session.check_publishes()
                if time.monotonic() >= deadline:
                    raise BrokerUnavailableError(f"{self.session.unconfirmed} publishes unconfirmed after the timeout")
                self._pump(0.05)

    def subscribe(self, pattern: str = "", *, since: Since = "latest") -> Iterator[Message]:
        """Messages whose key matches ``pattern`` (a prefix, or ``~regex``), from ``since`` on, forever."""
        with self._lock:
            self._send_held()
            self._send_all(self.session.subscribe(pattern, since), time.monotonic() + self.timeout)
        while True:
            row = self._next_row()  # the lock is not held while the application has a message
            if row is not None:
                yield Message._make(row)

    def _next_row(self) -> Row | None:
        """subscribe()'s step: the next delivered row, or None after waiting up to 0.1 s for input."""
        with self._lock:
            self._send_held()
            inbox = self.session.inbox
            if inbox:
                row = inbox.take_one()
                self._give_credit()
                return row
            if self.session.errors:
                raise ProtocolError(f"broker refused: {self.session.errors.popleft()}")
            self._pump(0.1)
            return None

    def receive(self, timeout: float) -> Message | None:
        """The next delivered message within ``timeout`` seconds, else None."""
        with self._lock:
            if not self._wait_for_messages(timeout):
                return None
            row = self.session.inbox.take_one()
            self._give_credit()
        return Message._make(row)

    def receive_many(self, timeout: float, max_messages: int = 100_000) -> list[Message]:
        """The messages delivered so far, up to ``max_messages``, waiting up to ``timeout`` seconds
        for the first; [] if none came. The fast way to consume a replay."""
        return list(map(Message._make, self.receive_rows(timeout, max_messages)))

    def receive_rows(self, timeout: float, max_messages: int = 100_000) -> list[Row]:
        """As :meth:`receive_many`, as plain ``(sequence, key, body, timestamp_ms)`` tuples (Message's
        field order) — the cheapest way to consume a replay in bulk (the Spark source uses it)."""
        with self._lock:
            if not self._wait_for_messages(timeout):
                return []
            rows = self.session.inbox.take(max_messages)
            self._give_credit()
        return rows

    def receive_records(self, timeout: float) -> list[Records]:
        """As :meth:`receive_rows`, undecoded: every run of records delivered so far (each checked:
        lengths, CRC32C, sequence order), for a reader that decodes them column by column."""
        with self._lock:
            if not self._wait_for_messages(timeout):
                return []
            runs = self.session.inbox.take_records()
            self._give_credit()
        return runs

    def _give_credit(self) -> None:
        """Send the CREDIT that taking messages made due (credit goes back as the application takes)."""
        if self.session.outbox:
            self._send_all(self.session.take_outbox(), time.monotonic() + self.timeout)

    def _wait_for_messages(self, timeout: float) -> bool:
        """Whether messages are in the inbox within ``timeout`` seconds; the socket is read at least
        once, so a ``timeout`` of 0 takes what has arrived without waiting (what lingers goes first)."""
        self._send_held()
        deadline = time.monotonic() + timeout
        read = False
        while not self.session.inbox:
            if self.session.errors:
                raise ProtocolError(f"broker refused: {self.session.errors.popleft()}")
            remaining = deadline - time.monotonic()
            if remaining <= 0 and read:
                return False
            self._pump(max(0.0, min(remaining, 0.1)))
            read = True
        return True

    def start(self, pattern: str = "", *, since: Since = "latest") -> None:
        """Subscribe without iterating (use :meth:`receive`)."""
        with self._lock:
            self._send_held()
            self._send_all(self.session.subscribe(pattern, since), time.monotonic() + self.timeout)

    def fetch(self, pattern: str = "", *, first: int = 0, last: int = LATEST, since: Time | None = None) -> Fetched:
        """The journal's records ``first`` .. ``last`` (inclusive; LATEST: up to the tail now; 0: from the
        oldest retained; ``since``: from that time on) whose key matches ``pattern``, and the range the
        broker covered (version 7, FETCH). A bounded replay: nothing live follows. A client that
        fetches does not subscribe. BrokerUnavailableError if the broker stays silent ``timeout`` seconds."""
        command = Fetch(pattern=pattern, first=first, last=last, since=since.ms if since is not None else 0)
        with self._lock:
            self._send_held()
            deadline = time.monotonic() + self.timeout
            self._send_all(self.session.fetch(command), deadline)
            messages: list[Message] = []
            while True:
                progress, result = self.session.fetched(messages)
                if result is not None:
                    return result
                if progress:
                    deadline = time.monotonic() + self.timeout  # silence counts, not the length of the fetch
                elif time.monotonic() >= deadline:
                    raise BrokerUnavailableError(
                        f"broker at {self.endpoint} did not end the fetch in {self.timeout:.0f}s"
                    )
                self._pump(0.05)

    def subscribe_multicast(
        self,
        pattern: str = "",
        *,
        since: Since = "latest",
        multicast: MulticastOptions | str | dict[str, Any],
        interface: str | None = None,
        stall: float | None = None,
        key: bytes | None = None,
    ) -> MulticastSubscription:
        """Records whose key starts with ``pattern``, from ``since`` on: history from the journal, then
        the broker's multicast group (``multicast``: its options, ``transport://group:port``, or the
        dict its member node holds), every gap filled from the journal, each record once in sequence
        order (see :mod:`zeps.client.multicast`). ``interface``: this host's interface for the group (a
        name or an IPv4 address; default: the one the route to the group uses). ``stall``: seconds
        without a word from the group before fetching what is missing (default: 3 heartbeats, at least 1.5).
        ``key``: a signed stream's multicast key (its clients' Secrets hold it): messages without its MAC
        are dropped and their records fetched. This client's peering becomes the subscription's: it
        fetches, and cannot also subscribe."""
        return MulticastSubscription(self, pattern, since, multicast=multicast, interface=interface, stall=stall,
                                     key=key)  # fmt: skip


def wait_any(clients: Iterable[StreamClient], timeout: float) -> None:
    """Wait up to ``timeout`` seconds until one of ``clients`` has input (a partitioned stream's
    readers wait on all their partitions' clients at once); their sockets change when they
    reconnect, so the poller is made anew for each wait. What lingers in them goes out first."""
    clients = list(clients)
    for client in clients:
        with client._lock:
            client._send_held()
    poller = zmq.Poller()
    for client in clients:
        for sock in (client._sock, client._monitor, *(w.socket for w in client._watched)):
            if sock is not None:
                poller.register(sock, zmq.POLLIN)
    poller.poll(max(0, int(timeout * 1000)))


class MulticastSubscription(GroupSubscription):
    """A multicast subscription of a :class:`~zeps.client.StreamClient` (see the module's notes):
    iterate it, or take what arrived with :meth:`receive_many`. Not thread-safe."""

    def __init__(
        self,
        client: StreamClient,
        pattern: str,
        since: Since,
        *,
        multicast: MulticastOptions | str | dict[str, Any],
        interface: str | None,
        stall: float | None,
        key: bytes | None = None,
    ) -> None:
        group = Group(client.session.stream, pattern, since, multicast=multicast, interface=interface, stall=stall,
                      key=key)  # fmt: skip
        super().__init__(zmq.Context(), group)
        self._client = client
        client._watch(self)
        with client._lock:
            client._send_held()  # what lingers goes before the start's fetch, as before a subscribe
        self._send(client.session.fetch(group.reconciler.start(time.monotonic())))

    def _send(self, frames: list[bytes]) -> None:
        if frames:
            with self._client._lock:
                self._client._send_all(frames, time.monotonic() + self._client.timeout)

    def _step(self, wait: float) -> None:
        self._client._pump(wait)
        now = time.monotonic()
        while True:
            try:
                frames = self.socket.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            self._group.on_message(frames, now)
        self._group.check(now)
        self._send(self._group.on_peering(self._client.session, now))

    def receive_many(self, timeout: float, max_messages: int = 100_000) -> list[Message]:
        """The records reconciled so far, up to ``max_messages``, waiting up to ``timeout`` seconds for
        the first; [] if none came."""
        with self._client._lock:
            self._client._send_held()
            deadline = time.monotonic() + timeout
            self._step(0)
            while not self._group.reconciler.output:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return []
                self._step(min(remaining, 0.05))
            return self._group.take(max_messages)

    def __iter__(self) -> Iterator[Message]:
        while True:
            yield from self.receive_many(1.0)

    #: close the client with the subscription (a handle's subscription has a peering of its own)
    owns_client = False

    def close(self) -> None:
        self._client._unwatch(self)
        self._close_group()
        if self.owns_client:
            self.owns_client = False
            self._client.close()

    def __enter__(self) -> MulticastSubscription:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

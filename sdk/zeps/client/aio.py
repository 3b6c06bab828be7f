"""The asyncio ZEPS client: :class:`AsyncStreamClient` has the blocking client's method names, awaited.

::

    async with AsyncStreamClient("tcp://127.0.0.1:5555", "prices") as client:
        await client.publish("eu.fr.cac40", b"7345.2")
        async for message in client.subscribe("eu.", since=Seq(1000)):
            ...

The protocol logic (credit, resume, resends) is :class:`~zeps.client.session.ClientSession`, shared
with the blocking client; this module only moves frames with ``zmq.asyncio``. A background task
reads the socket, so heartbeats are answered however the application awaits.

Lingering (``linger=``) as in the blocking client: a publish that comes less than ``linger`` after the
one before waits, up to ``linger``, to go out with the next ones in one PUBLISH-BATCH; here a timer of
the event loop sends what waits, and publishing coroutines take turns (a lock), so frames leave in
the order their publishes were made.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from types import TracebackType
from typing import Any

import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from zeps.client._transport import (
    DEFAULT_LINGER,
    GROUP,
    HOLD_BYTES,
    HOLD_MESSAGES,
    LOCATE_EVERY,
    MONITORED,
    BrokerUnavailableError,
    CurveTrust,
    Locator,
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

__all__ = ["AsyncMulticastSubscription", "AsyncStreamClient"]

log = logging.getLogger(__name__)


class AsyncStreamClient:
    """One peering with a broker for one stream, for asyncio programs."""

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
        self._trust = CurveTrust(server_public_key, client_keys, curve_certificate)  # as StreamClient's
        self.max_unconfirmed = max_unconfirmed
        self._ctx = zmq.asyncio.Context()
        self._sock: zmq.asyncio.Socket | None = None
        self._monitor: zmq.asyncio.Socket | None = None
        self._reader: asyncio.Task[None] | None = None
        self._arrived = asyncio.Event()
        self._last_ping = 0.0
        self._watched: list[AsyncMulticastSubscription] = []  # closed with the client
        self.reconnects = 0
        self._publishing = asyncio.Lock()  # publishes make and send their frames in turn
        self._held: list[tuple[str, bytes]] = []  # lingering publishes, not made into frames yet
        self._held_bytes = 0
        self._last_publish = 0.0
        self._linger_timer: asyncio.TimerHandle | None = None
        self._linger_tasks: set[asyncio.Task[None]] = set()  # (asyncio keeps only weak references to tasks)
        self._linger_error: ZepsError | None = None  # what the timer's send raised: the next publish or flush raises it

    @classmethod
    def of(cls, settings: Resolved, partition: int = 0, **options: Any) -> AsyncStreamClient:
        """A client of a resolved stream (see :meth:`StreamClient.of`). Not connected yet."""
        followers = options.get("follower_reads", False)
        options.setdefault("locator", locator_of(settings, followers=followers, partition=partition))
        return cls(partition_endpoint(settings, partition), settings.name, **curve_options(settings),
                   max_message_bytes=settings.max_message_bytes, **options)  # fmt: skip

    # -- connection -----------------------------------------------------------------------------
    async def connect(self) -> AsyncStreamClient:
        if self.session.reads_only:
            await self._locate()  # a reader of followers goes to one from the start (the endpoint given may lead)
        self._open_socket()
        self._reader = asyncio.create_task(self._read_loop())
        deadline = time.monotonic() + self.timeout
        while not self.session.ready:
            if self.session.refused:
                raise BrokerUnavailableError(f"broker at {self.endpoint} refused: {self.session.refused}")
            if self.session.producer_error:
                raise ProducerError(self.session.producer_error)
            if time.monotonic() >= deadline:
                raise BrokerUnavailableError(f"no broker answered at {self.endpoint} within {self.timeout:.0f}s")
            await self._wait(0.05)
        if self.session.producer_error:  # a named producer on a broker without version 6: say so now
            raise ProducerError(self.session.producer_error)
        return self

    def _open_socket(self) -> None:
        sock = self._ctx.socket(zmq.DEALER)
        configure_dealer(sock)
        self.server_public_key, self.client_keys = self._trust.next_keys()
        configure_curve(sock, self.server_public_key, self.client_keys)
        self._monitor = sock.get_monitor_socket(MONITORED)
        sock.connect(self.endpoint)
        sock.send(self.session.attach())  # queued until the connection is up
        self._sock = sock
        self.session.last_heard = time.monotonic()

    def _close_socket(self) -> None:
        close_dealer(self._sock, self._monitor)
        self._sock = self._monitor = None

    async def _reconnect(self) -> None:
        """Start over on a fresh socket; ATTACH-OK resumes the subscriptions and resends what is unconfirmed."""
        self.reconnects += 1
        await self._locate()
        self.session.disconnected()
        self._close_socket()
        self._open_socket()

    async def _locate(self) -> bool:
        """Ask the locator where the broker is (at most every 0.2 s, in a thread: it may ask
        ZooKeeper); True if it moved."""
        if self.locator is None:
            return False
        wait = self._located + LOCATE_EVERY - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)  # a replica refused us (NOT_LEADER) or an election is on: do not spin
        self._located = time.monotonic()
        try:
            endpoint = check_endpoint(await asyncio.to_thread(self.locator))
        except BrokerUnavailableError:
            return False
        except Exception as exc:
            log.debug("could not ask where the broker is (%r): staying at %s", exc, self.endpoint)
            return False
        moved, self.endpoint = endpoint != self.endpoint, endpoint
        return moved

    async def _disconnected(self) -> bool:
        """True if the monitor reported the connection lost: then reconnect at once."""
        monitor = self._monitor
        lost = False
        while monitor is not None:
            try:
                event = parse_monitor_message(await monitor.recv_multipart(zmq.NOBLOCK))
            except zmq.Again:
                break
            refused = refused_handshake(event["event"], self.client_keys, event["value"])
            if refused is not None and self._trust.renewed():  # its key was rotated: the new one is used
                refused, lost = None, True
            if refused is not None:
                self.session.refused = refused
            elif failed_handshake(event["event"]):  # the broker serves another key: the next trusted one
                self._trust.handshake_failed()  # is tried at the reconnection its DISCONNECTED brings
            # attached, or waiting for ATTACH-OK: an ATTACH that a broker read off the wire and died
            # before answering (it binds before its loop runs) is gone with it
            lost = lost or event["event"] == zmq.EVENT_DISCONNECTED
        return lost

    async def _read_loop(self) -> None:
        while True:
            sock = self._sock
            assert sock is not None
            try:
                if await self._disconnected():
                    await self._reconnect()
                    continue
                for frame in self.session.take_outbox():  # CREDIT made due by takes since (a fetch's)
                    await sock.send(frame)
                if await sock.poll(100):
                    answers: list[bytes] = []
                    while True:
                        try:
                            frame = await sock.recv(zmq.NOBLOCK)
                        except zmq.Again:
                            break
                        try:
                            answers += self.session.receive(frame)
                        except ProtocolError as exc:
                            self.session.errors.append(str(exc))
                    for frame in answers:
                        await sock.send(frame)
                    if self.session.attached and self._trust.worked != self.server_public_key:
                        self._trust.attached()
                    if self.session.refused_code == Refusal.UNAUTHORIZED and self._trust.renewed():
                        self.session.refused = self.session.refused_code = None  # as StreamClient's: its key
                        self.session.forgotten = True  # was rotated, it attaches again with the new one
                    self._arrived.set()
                await self._keepalive()
            except zmq.ZMQError:
                if sock is self._sock:  # not a socket we replaced on purpose
                    raise

    def _check_refused(self) -> None:
        """BrokerUnavailableError if the broker refused this client's (re-)attach: waiting cannot help."""
        if self.session.refused:
            raise BrokerUnavailableError(f"broker at {self.endpoint} refused: {self.session.refused}")

    async def _keepalive(self) -> None:
        now = time.monotonic()
        silent = now - self.session.last_heard
        if self.session.refused:
            return  # a refused attach: nothing to keep alive; the application's waits raise it
        if self.session.forgotten or silent > self.ttl:  # silent, or no ATTACH-OK: attach afresh
            await self._reconnect()
        elif not self.session.attached and self.locator is not None and now - self._located > 2 * LOCATE_EVERY:
            if await self._locate():  # the broker we wait for is gone: its successor is elsewhere
                await self._reconnect()
        elif self.session.attached and silent > self.heartbeat and now - self._last_ping > self.heartbeat:
            self._last_ping = now
            await self._send([self.session.ping()])

    async def _wait(self, timeout: float) -> None:
        """Wait up to ``timeout`` for the reader task to hand something in (BrokerUnavailableError if the
        broker refused the attach; the reader task's own failure, if it failed)."""
        self._check_refused()
        if self._reader is not None and self._reader.done() and not self._reader.cancelled():
            error = self._reader.exception()
            if error is not None:
                raise BrokerUnavailableError(f"the client's reader failed: {error!r}") from error
        self._arrived.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._arrived.wait(), timeout)

    async def _send(self, frames: list[bytes]) -> None:
        sock = self._sock
        assert sock is not None
        for frame in frames:
            if self._sock is not sock:  # reconnected while a send waited: these frames were for the old
                return  # peering; the new one's ATTACH-OK resends what matters (publishes, subscriptions)
            await sock.send(frame)

    async def close(self) -> None:
        """Confirm outstanding publishes (bounded by ``timeout``), detach, close (again: nothing).
        Publishes the broker did not confirm are an error (the one :meth:`flush` raises), raised once
        everything is closed."""
        unconfirmed: ZepsError | None = None
        if self._sock is not None:
            try:
                await self.flush()  # what lingers goes with it
            except ZepsError as exc:
                unconfirmed = exc
            frame = self.session.detach()
            with contextlib.suppress(zmq.ZMQError):
                if frame:
                    await self._send([frame])
        if self._linger_timer is not None:
            self._linger_timer.cancel()
            self._linger_timer = None
        for task in (self._reader, *self._linger_tasks):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, zmq.ZMQError, ZepsError):
                    await task
        self._close_socket()
        for watched in list(self._watched):
            await watched.close()
        if self.locator is not None:
            self.locator.close()
        self._ctx.term()
        if unconfirmed is not None:
            raise unconfirmed

    def _watch(self, subscription: AsyncMulticastSubscription) -> None:
        self._watched.append(subscription)

    def _unwatch(self, subscription: AsyncMulticastSubscription) -> None:
        if subscription in self._watched:
            self._watched.remove(subscription)

    async def __aenter__(self) -> AsyncStreamClient:
        try:
            return await self.connect()
        except BaseException:
            await self.close()  # its task, sockets and context
            raise

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            await self.close()
        except ZepsError as error:
            if exc is None:
                raise
            exc.add_note(f"and closing the client failed: {error}")  # the block's own error goes on

    # -- the API --------------------------------------------------------------------------------
    @property
    def producer_id(self) -> str | None:
        """This client's idempotent producer name (None with ``idempotent=False``)."""
        producer = self.session.producer
        return None if producer is None else producer.name

    @property
    def producer_sequence(self) -> int:
        """The last publish the broker confirmed holding from this producer (see StreamClient)."""
        return self.session.producer_sequence

    @property
    def generation_sequence(self) -> int:
        """Publishes of this client's ``generation`` the broker held at its claim (see StreamClient)."""
        producer = self.session.producer
        return 0 if producer is None else producer.generation_held or 0

    async def publish(self, key: str, body: bytes) -> None:
        self._raise_linger_error()
        if self.linger and self._hold(key, body):
            if len(self._held) < HOLD_MESSAGES and self._held_bytes < HOLD_BYTES:
                return
            async with self._publishing:
                await self._send_held()
            return
        async with self._publishing:
            await self._send_held()  # in order: what waits goes first
            await self._room()
            await self._send(self.session.publish(key, body))

    async def publish_many(self, items: Iterable[tuple[str, bytes]]) -> None:
        """Publish ``items`` (key, body) in order, many per frame (see StreamClient.publish_many)."""
        self._raise_linger_error()
        async with self._publishing:
            await self._send_held()
            for group in batched(items, GROUP):
                await self._room()
                await self._send(self.session.publish_many(group))

    # -- lingering ------------------------------------------------------------------------------
    def _hold(self, key: str, body: bytes) -> bool:
        """Keep a publish to go out with the next ones if it lingers (True); False: it goes at once."""
        now = time.monotonic()
        recent = now - self._last_publish < self.linger
        self._last_publish = now
        if not (self._held or recent) or not self.session.batchable(key, body):
            return False
        if not self._held and self._linger_timer is None:
            self._linger_timer = asyncio.get_running_loop().call_later(self.linger, self._linger_due)
        self._held.append((key, body))
        self._held_bytes += len(key) + len(body)
        return True

    async def _send_held(self) -> None:
        """Send the publishes that wait, in one PUBLISH-BATCH (``_publishing`` held)."""
        if self._linger_timer is not None:
            self._linger_timer.cancel()
            self._linger_timer = None
        if not self._held:
            return
        await self._room()  # what waits stays held if that fails
        items = self._held
        self._held, self._held_bytes = [], 0
        await self._send(self.session.publish_many(items))

    async def _send_held_first(self) -> None:
        """Before a call whose work follows the publishes made before it (a subscribe, a fetch, a wait
        for deliveries), what lingers goes out, as the blocking client does."""
        if self._held:
            async with self._publishing:
                await self._send_held()

    def _linger_due(self) -> None:
        """The timer: ``linger`` has passed since the first of what waits was published."""
        self._linger_timer = None
        if self._held:  # (one send may still be on its way: the lock puts this one after it)
            task = asyncio.ensure_future(self._send_lingering())
            self._linger_tasks.add(task)
            task.add_done_callback(self._linger_tasks.discard)

    async def _send_lingering(self) -> None:
        try:
            async with self._publishing:
                await self._send_held()
        except ZepsError as exc:
            self._linger_error = exc
        except zmq.ZMQError as exc:
            error = ZepsError(f"sending lingering publishes failed: {exc!r}")
            error.__cause__ = exc
            self._linger_error = error

    def _raise_linger_error(self) -> None:
        error = self._linger_error
        if error is not None:
            self._linger_error = None
            raise error

    async def _room(self) -> None:
        """Wait while max_unconfirmed messages wait for the broker's confirmation."""
        deadline = time.monotonic() + self.timeout
        self.session.check_publishes()
        while self.session.unconfirmed >= self.max_unconfirmed:
            self.session.check_publishes()
            if time.monotonic() >= deadline:
                raise BrokerUnavailableError(f"broker at {self.endpoint} has not confirmed messages in time")
            await self._wait(0.05)

    async def flush(self, timeout: float | None = None) -> None:
        self._raise_linger_error()
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        async with self._publishing:
            await self._send_held()
            await self._send(self.session.confirm())
        while self.session.unconfirmed:
            self.session.check_publishes()
            if time.monotonic() >= deadline:
                raise BrokerUnavailableError(f"{self.session.unconfirmed} publishes unconfirmed after the timeout")
            await self._wait(0.05)

    async def start(self, pattern: str = "", *, since: Since = "latest") -> None:
        await self._send_held_first()
        await self._send(self.session.subscribe(pattern, since))

    async def receive(self, timeout: float) -> Message | None:
        if not await self._wait_for_messages(timeout):
            return None
        row = self.session.inbox.take_one()
        await self._give_credit()
        return Message._make(row)

    async def receive_many(self, timeout: float, max_messages: int = 100_000) -> list[Message]:
        return list(map(Message._make, await self.receive_rows(timeout, max_messages)))

    async def receive_rows(self, timeout: float, max_messages: int = 100_000) -> list[Row]:
        if not await self._wait_for_messages(timeout):
            return []
        rows = self.session.inbox.take(max_messages)
        await self._give_credit()
        return rows

    async def receive_records(self, timeout: float) -> list[Records]:
        if not await self._wait_for_messages(timeout):
            return []
        runs = self.session.inbox.take_records()
        await self._give_credit()
        return runs

    async def _give_credit(self) -> None:
        """Send the CREDIT that taking messages made due (credit goes back as the application takes)."""
        if self.session.outbox:
            await self._send(self.session.take_outbox())

    async def _wait_for_messages(self, timeout: float) -> bool:
        await self._send_held_first()  # a reply to what lingers may be what the caller waits for
        deadline = time.monotonic() + timeout
        while not self.session.inbox:
            if self.session.errors:
                raise ProtocolError(f"broker refused: {self.session.errors.popleft()}")
            self._check_refused()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            await self._wait(min(remaining, 0.1))
        return True

    async def fetch(
        self, pattern: str = "", *, first: int = 0, last: int = LATEST, since: Time | None = None
    ) -> Fetched:
        """The journal's records ``first`` .. ``last`` matching ``pattern`` (see StreamClient.fetch)."""
        command = Fetch(pattern=pattern, first=first, last=last, since=since.ms if since is not None else 0)
        await self._send_held_first()  # in order: what lingers goes before the fetch
        await self._send(self.session.fetch(command))
        messages: list[Message] = []
        deadline = time.monotonic() + self.timeout
        while True:
            progress, result = self.session.fetched(messages)
            await self._give_credit()
            if result is not None:
                return result
            if progress:
                deadline = time.monotonic() + self.timeout  # silence counts, not the length of the fetch
            elif time.monotonic() >= deadline:
                raise BrokerUnavailableError(f"broker at {self.endpoint} did not end the fetch in {self.timeout:.0f}s")
            await self._wait(0.05)

    async def subscribe_multicast(
        self,
        pattern: str = "",
        *,
        since: Since = "latest",
        multicast: MulticastOptions | str | dict[str, Any],
        interface: str | None = None,
        stall: float | None = None,
        key: bytes | None = None,
    ) -> AsyncMulticastSubscription:
        """A multicast subscription (see StreamClient.subscribe_multicast), for ``async for``."""
        return await AsyncMulticastSubscription(
            self, pattern, since, multicast=multicast, interface=interface, stall=stall, key=key
        )._start()

    async def subscribe(self, pattern: str = "", *, since: Since = "latest") -> AsyncIterator[Message]:
        await self.start(pattern, since=since)
        while True:
            message = await self.receive(1.0)
            if message is not None:
                yield message


class AsyncMulticastSubscription(GroupSubscription):
    """A multicast subscription of an :class:`~zeps.client.AsyncStreamClient`: the same as
    :class:`MulticastSubscription`, awaited (``async for``, ``await receive_many``, ``async with``)."""

    def __init__(
        self,
        client: AsyncStreamClient,
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
        super().__init__(zmq.asyncio.Context(), group)
        self._client = client
        client._watch(self)

    async def _start(self) -> AsyncMulticastSubscription:
        await self._client._send_held_first()
        await self._client._send(self._client.session.fetch(self._group.reconciler.start(time.monotonic())))
        return self

    async def _step(self, wait: float) -> None:
        """Wait up to ``wait`` for the group or the peering, then handle what came from both."""
        client = self._client
        if not client.session.inbox and not client.session.fetch_ends:
            client._arrived.clear()
            waiters = {asyncio.ensure_future(self.socket.poll(int(wait * 1000))),
                       asyncio.ensure_future(client._arrived.wait())}  # fmt: skip
            _, pending = await asyncio.wait(waiters, timeout=wait, return_when=asyncio.FIRST_COMPLETED)
            for waiter in pending:
                waiter.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await waiter
        now = time.monotonic()
        while True:
            try:
                frames = await self.socket.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            self._group.on_message(frames, now)
        self._group.check(now)
        frames = self._group.on_peering(client.session, now)
        if frames:
            await client._send(frames)

    async def receive_many(self, timeout: float, max_messages: int = 100_000) -> list[Message]:
        await self._client._send_held_first()
        deadline = time.monotonic() + timeout
        await self._step(0)
        while not self._group.reconciler.output:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return []
            await self._step(min(remaining, 0.05))
        return self._group.take(max_messages)

    async def __aiter__(self) -> AsyncIterator[Message]:
        while True:
            for message in await self.receive_many(1.0):
                yield message

    async def close(self) -> None:
        self._client._unwatch(self)
        self._close_group()

    async def __aenter__(self) -> AsyncMulticastSubscription:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

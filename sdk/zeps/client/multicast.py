"""Multicast subscriptions: the real-time flow from the broker's multicast group, reconciled with the
journal through the client's peering (:mod:`zeps.client.reconcile` decides; this module moves frames).

::

    with StreamClient("tcp://broker:5555", "prices") as client:
        with client.subscribe_multicast("eu.", since=Seq(1000), multicast="epgm://239.192.0.1:5601") as sub:
            for message in sub:          # history, then the group's flow; each record once, in order
                ...

The client's peering is the subscription's own: it fetches history and gaps there, and cannot also
subscribe. The group is joined (a SUB socket subscribed to the stream's topic) before history is
fetched, so nothing falls between the two. Its socket lives in a ZeroMQ context of its own: libzmq
runs NORM and PGM in its I/O thread, which NORM can keep busy for long stretches (its congestion
control), and the peering's TCP I/O must not wait behind it. Over NORM the group is received in a
child process (:mod:`zeps.client.relay`): libzmq 4.3.4 aborts a process whose NORM stream breaks.
The settings both ends of a group share (rate and repair window of PGM, the heartbeat) come with
``multicast``: the broker publishes them in its member node (``broker_metadata(...)["multicast"]``),
and ``zeps.stream(name)`` handles pass them on.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Iterator
from types import TracebackType
from typing import TYPE_CHECKING, Any

import zmq
import zmq.asyncio

from zeps import _netif
from zeps.client.reconcile import MulticastStats, Reconciler
from zeps.client.relay import Relay, configure_group_socket
from zeps.client.session import ClientSession, Message, Since
from zeps.errors import ConfigError, ProtocolError, RemoteProtocolError
from zeps.options import MulticastOptions
from zeps.protocol import DeliverRun
from zeps.protocol.multicast import ForgedMessageError, decode_message, topic

if TYPE_CHECKING:
    from zeps.client.aio import AsyncStreamClient
    from zeps.client.sync import StreamClient

__all__ = ["AsyncMulticastSubscription", "MulticastSubscription", "multicast_options"]

_MIN_STALL = 1.5  # seconds


def multicast_options(multicast: MulticastOptions | str | dict[str, Any]) -> MulticastOptions:
    """``multicast`` as options: given as they are, a ``transport://group:port`` URL, or the dict a
    broker publishes in its member node."""
    if isinstance(multicast, MulticastOptions):
        return multicast
    if isinstance(multicast, str):
        return MulticastOptions.from_url(multicast)
    return MulticastOptions.make(**multicast)


class _Group:
    """What both clients' subscriptions share: the group's endpoint and socket options, and the
    reconciler fed from the group and from the peering."""

    def __init__(
        self,
        stream: str,
        pattern: str,
        since: Since,
        *,
        multicast: MulticastOptions | str | dict[str, Any],
        interface: str | None,
        stall: float | None,
        key: bytes | None = None,
    ) -> None:
        self.options = options = multicast_options(multicast)
        self.key = key  # a signed stream's: messages without its MAC are dropped
        _netif.require_transport(options.transport, zmq.has, zmq.zmq_version())
        self.interface = _netif.resolve(interface, options.group)
        self.endpoint = _netif.endpoint(options.transport, options.group, options.port, self.interface)
        self.stream = stream
        #: silent this long and the subscription fetches what it lacks: by default 3 heartbeats, and at
        #: least 1.5 s (NORM delivers in bursts up to about a second apart, under congestion control)
        self.stall = stall if stall is not None else max(_MIN_STALL, 3 * options.heartbeat_ms / 1000)
        self.reconciler = Reconciler(pattern, since, stall=self.stall)

        self._relay: Relay | None = None

    def open(self, ctx: Any) -> Any:
        """The socket the group's messages arrive on: a SUB on the group, or over NORM the PULL end of
        a relay child (ConfigError naming the endpoint when libzmq refuses it)."""
        try:
            if self.options.transport == "norm":
                self._relay = Relay(ctx, self.options, topic(self.stream), self.endpoint)
                return self._relay.socket
            sock = ctx.socket(zmq.SUB)
            configure_group_socket(sock, self.options, topic(self.stream), self.endpoint)
            return sock
        except zmq.ZMQError as exc:
            raise ConfigError(f"multicast group {self.endpoint}: {exc}") from None

    def check(self, now: float) -> None:
        """Start the relay child again if libzmq aborted it."""
        if self._relay is not None:
            self._relay.check(now)
            self.reconciler.stats.relay_restarts = self._relay.restarts

    def close(self) -> None:
        if self._relay is not None:
            self._relay.close()

    def on_message(self, frames: list[bytes], now: float) -> None:
        try:
            message = decode_message(frames, self.stream, self.key)
            if isinstance(message, DeliverRun):
                assert message.run is not None
                self.reconciler.on_run(message.run, now)
            else:
                self.reconciler.on_tail(message.sequence, now)
        except RemoteProtocolError as exc:
            self.reconciler.stats.bad_messages += 1  # a damaged run leaves a gap, fetched like any other
            if isinstance(exc, ForgedMessageError):
                self.reconciler.stats.forged += 1

    def on_peering(self, session: ClientSession, now: float) -> list[bytes]:
        """Hand what the peering delivered to the reconciler; the frames of the next fetch, if any."""
        if session.errors:
            raise ProtocolError(f"broker refused: {session.errors.popleft()}")
        rows = session.take(1 << 30)
        if rows:
            self.reconciler.on_fetched(rows)
        while session.fetch_ends:
            self.reconciler.on_fetch_end(*session.fetch_ends.popleft())
        fetch = self.reconciler.poll(now)
        return session.take_outbox() + (session.fetch(fetch) if fetch is not None else [])

    def take(self, most: int) -> list[Message]:
        output = self.reconciler.output
        return [Message._make(output.popleft()) for _ in range(min(most, len(output)))]


class _Subscription:
    """What both clients' subscriptions hold: the group (its socket in a context of its own), watched
    by the client's waits and closed with it."""

    def __init__(self, client: Any, ctx: Any, group: _Group) -> None:
        self._client, self._ctx, self._group = client, ctx, group
        try:
            self.socket = group.open(ctx)  #: where the group's messages arrive
        except ConfigError:
            ctx.destroy(linger=0)
            raise
        client._watch(self)

    @property
    def stats(self) -> MulticastStats:
        """Where the records came from (the group, fetches) and the gaps filled."""
        return self._group.reconciler.stats

    @property
    def endpoint(self) -> str:
        """The group's ZeroMQ endpoint on this host's interface."""
        return self._group.endpoint

    def _close_group(self) -> None:
        self._client._unwatch(self)
        self._group.close()
        self._ctx.destroy(linger=0)


class MulticastSubscription(_Subscription):
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
        group = _Group(client.session.stream, pattern, since, multicast=multicast, interface=interface, stall=stall,
                       key=key)  # fmt: skip
        super().__init__(client, zmq.Context(), group)
        self._client: StreamClient = client
        self._send(client.session.fetch(group.reconciler.start(time.monotonic())))

    def _send(self, frames: list[bytes]) -> None:
        if frames:
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


class AsyncMulticastSubscription(_Subscription):
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
        group = _Group(client.session.stream, pattern, since, multicast=multicast, interface=interface, stall=stall,
                       key=key)  # fmt: skip
        super().__init__(client, zmq.asyncio.Context(), group)
        self._client: AsyncStreamClient = client

    async def _start(self) -> AsyncMulticastSubscription:
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
        self._close_group()

    async def __aenter__(self) -> AsyncMulticastSubscription:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

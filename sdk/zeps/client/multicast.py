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
and ``zeps.stream(name)`` handles pass them on (from the resource's spec).

This module holds what both clients share (:class:`Group`: the group's socket and the reconciler;
:class:`GroupSubscription`); each subscription lives beside its client, in :mod:`zeps.client.sync`
and :mod:`zeps.client.aio`, which never import each other.
"""

from __future__ import annotations

from typing import Any

import zmq

from zeps import _netif
from zeps.client.reconcile import MulticastStats, Reconciler
from zeps.client.relay import Relay, configure_group_socket
from zeps.client.session import ClientSession, Message, Since
from zeps.errors import ConfigError, ProtocolError, RemoteProtocolError
from zeps.options import MulticastOptions
from zeps.protocol import DeliverRun
from zeps.protocol.multicast import ForgedMessageError, decode_message, topic

__all__ = ["Group", "GroupSubscription", "multicast_options"]

_MIN_STALL = 1.5  # seconds


def multicast_options(multicast: MulticastOptions | str | dict[str, Any]) -> MulticastOptions:
    """``multicast`` as options: given as they are, a ``transport://group:port`` URL, or the dict a
    broker publishes in its member node."""
    if isinstance(multicast, MulticastOptions):
        return multicast
    if isinstance(multicast, str):
        return MulticastOptions.from_url(multicast)
    return MulticastOptions.make(**multicast)


class Group:
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
        rows = session.inbox.take(1 << 30)
        if rows:
            self.reconciler.on_fetched(rows)
        while session.fetch_ends:
            self.reconciler.on_fetch_end(*session.fetch_ends.popleft())
        fetch = self.reconciler.poll(now)
        return session.take_outbox() + (session.fetch(fetch) if fetch is not None else [])

    def take(self, most: int) -> list[Message]:
        output = self.reconciler.output
        return [Message._make(output.popleft()) for _ in range(min(most, len(output)))]


class GroupSubscription:
    """What both clients' multicast subscriptions hold: the group (its socket in a context of its own)
    and its reconciler. The subscriptions themselves live beside their clients
    (:class:`zeps.client.sync.MulticastSubscription`, :class:`zeps.client.aio.AsyncMulticastSubscription`):
    each has its client's waits watch the socket, and closes with it; this part knows no client."""

    def __init__(self, ctx: Any, group: Group) -> None:
        self._ctx, self._group = ctx, group
        try:
            self.socket = group.open(ctx)  #: where the group's messages arrive
        except ConfigError:
            ctx.destroy(linger=0)
            raise

    @property
    def stats(self) -> MulticastStats:
        """Where the records came from (the group, fetches) and the gaps filled."""
        return self._group.reconciler.stats

    @property
    def endpoint(self) -> str:
        """The group's ZeroMQ endpoint on this host's interface."""
        return self._group.endpoint

    def _close_group(self) -> None:
        self._group.close()
        self._ctx.destroy(linger=0)

"""Who may open a connection to a broker: its connection budget (``--max-connections``).

ZeroMQ accepts every TCP connection a peer opens, and each costs the broker a file descriptor and
ZeroMQ's buffers before the peer has said a word: peers that only connect could take every
descriptor the broker has (its journal segments need them too) and its memory. So the broker counts
its open connections and refuses those past its budget before they carry a frame:

* :class:`ConnectionCount`: the connections open now, from the ROUTER's monitor (``ACCEPTED`` and
  ``DISCONNECTED``, each with the connection's descriptor).
* :class:`Gatekeeper`: the broker's ZAP handler (pyzmq's authenticator, in its own thread). ZeroMQ
  asks it about every handshake (CURVE, and NULL once the socket has a ZAP domain). Past the budget
  it answers status 500 with the reason; ZeroMQ closes the connection, and the client's monitor sees
  ``HANDSHAKE_FAILED_AUTH`` with 500, which the SDK reports as a full budget (a refused CURVE key is
  400). Otherwise pyzmq's own checks decide (the CURVE keys admitted).

A replica of the stream, known by its CURVE key, is admitted past the budget: a tenant that fills it
cannot cut a replica off its leader. Without CURVE a replica cannot be told from anyone else.

The gatekeeper reads the monitor's news itself before it decides: ZeroMQ reports a connection
``ACCEPTED`` before its handshake starts, so the count it decides on holds every connection open at
that moment, the one asking too (read in the broker's loop instead, the count lagged behind on a
busy machine and let connections past the budget). A burst that arrives at once is counted whole:
its connections past the budget are refused even if earlier ones of it are refused too and close.
The broker's loop reads the monitor too, once a second, for the gauge; a lock passes the monitor
between the two threads (ZeroMQ allows a socket to change threads behind a full memory barrier).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import zmq
from zmq.auth.thread import ThreadAuthenticator
from zmq.utils.monitor import recv_monitor_message

__all__ = ["FULL_STATUS", "ZAP_DOMAIN", "ConnectionCount", "Gatekeeper", "watch_connections"]

#: the broker ROUTER's ZAP domain (with none, ZeroMQ would not ask about NULL handshakes)
ZAP_DOMAIN = "zeps"

#: the ZAP status a connection past the budget gets (ZAP's "internal error": no client key is at fault)
FULL_STATUS = b"500"
#: the events the broker's monitor reports
WATCHED = zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED


class ConnectionCount:
    """The broker's open connections (their descriptors, as the monitor reported them) against its
    ``budget`` (0: none). Read and written by the gatekeeper's thread and the broker's loop, one at a
    time (the lock)."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self._open: set[int] = set()
        self._lock = threading.RLock()  # read() counts each event it takes with seen()
        self.refused = 0  #: connections refused for the budget so far
        self.monitor: zmq.Socket[Any] | None = None  #: the ROUTER's monitor, once :meth:`watch` ran

    @property
    def open(self) -> int:
        return len(self._open)

    def full(self) -> bool:
        """Whether the connections open now, the monitor's news read first, are more than the budget
        (the one asking is among them)."""
        self.read()
        return self.budget > 0 and len(self._open) > self.budget

    def seen(self, event: int, descriptor: int) -> None:
        """Count one monitor event."""
        with self._lock:
            if event == zmq.EVENT_ACCEPTED:
                self._open.add(descriptor)
            elif event == zmq.EVENT_DISCONNECTED:
                self._open.discard(descriptor)

    def watch(self, sock: zmq.Socket[Any]) -> None:
        """Count ``sock``'s connections from now on (its monitor: :func:`watch_connections`)."""
        self.monitor = watch_connections(sock)

    def read(self) -> None:
        """Take every event the monitor holds now, from whichever thread asks (the gatekeeper's before
        it decides, the broker loop's for the gauge)."""
        with self._lock:
            monitor = self.monitor
            while monitor is not None:
                try:
                    event = recv_monitor_message(monitor, zmq.NOBLOCK)
                except zmq.Again:
                    return
                self.seen(int(event["event"]), int(event["value"]))

    def unwatch(self, sock: zmq.Socket[Any]) -> None:
        """Stop counting (before ``sock`` closes)."""
        with self._lock:
            if self.monitor is not None:
                sock.disable_monitor()
                self.monitor.close(linger=0)
                self.monitor = None


def watch_connections(sock: zmq.Socket[Any]) -> zmq.Socket[Any]:
    """The monitor of ``sock``'s connections, with no high-water mark on its side: a burst of
    disconnections is never dropped (a dropped DISCONNECTED would count a connection forever)."""
    address = f"inproc://zeps-connections-{id(sock)}"
    sock.monitor(address, WATCHED)
    monitor: zmq.Socket[Any] = sock.context.socket(zmq.PAIR)
    monitor.setsockopt(zmq.RCVHWM, 0)
    monitor.setsockopt(zmq.LINGER, 0)
    monitor.connect(address)
    return monitor


class Gatekeeper(ThreadAuthenticator):
    """The broker's ZAP handler: refuses connections past ``count``'s budget (status 500) unless
    ``exempt(key)`` says the peer's CURVE public key (32 bytes) is a replica's; pyzmq's checks decide
    the rest. ``refused()`` is called on its thread for each connection refused (a metric)."""

    def __init__(self, context: zmq.Context[Any], count: ConnectionCount, *, exempt: Callable[[bytes], bool],
                 refused: Callable[[], None]) -> None:  # fmt: skip
        super().__init__(context)
        self.count, self.exempt, self.on_refused = count, exempt, refused

    async def handle_zap_message(self, msg: list[bytes]) -> None:
        # a ZAP request: version, request id, domain, address, identity, mechanism, credentials...
        if len(msg) >= 6 and self.count.full():
            key = msg[6] if msg[5] == b"CURVE" and len(msg) > 6 else b""
            if not (key and self.exempt(key)):
                self.count.refused += 1
                self.on_refused()
                self._send_zap_reply(msg[1], FULL_STATUS, f"connection budget full ({self.count.budget})".encode())
                return
        await super().handle_zap_message(msg)

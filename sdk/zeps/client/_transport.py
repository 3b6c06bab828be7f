"""What both ZEPS clients share (:mod:`zeps.client.sync` and :mod:`zeps.client.aio` import this, never
each other): their errors, the DEALER's options and monitor events, CURVE keys from settings."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from itertools import islice
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol, Self

import zmq
import zmq.auth

from zeps.config import Resolved
from zeps.errors import ConfigError, UnavailableError, ZepsError
from zeps.protocol.limits import max_delivery_frame_bytes

__all__ = [
    "GROUP",
    "LOCATE_EVERY",
    "MONITORED",
    "BrokerUnavailableError",
    "CurveTrust",
    "Locator",
    "Opened",
    "batched",
    "check_endpoint",
    "close_dealer",
    "configure_curve",
    "configure_dealer",
    "curve_keys",
    "curve_options",
    "failed_handshake",
    "multicast_key",
    "partition_endpoint",
    "refused_handshake",
]

GROUP = 4096  #: messages handed to the session at once by publish_many (back-pressure is checked per group)
LOCATE_EVERY = 0.2  #: seconds between two questions to a client's locator, at least
#: lingering publishes (the clients' ``linger``): the default, in seconds. A loop of one-at-a-time
#: publishes then costs the broker what publish_many does (benchmarks/bench_stream.py measures both),
#: and publishes less frequent than one per ``linger`` (2,000 a second) are never held
DEFAULT_LINGER = 0.0005
MAX_LINGER = 1.0  #: seconds, the most ``linger`` may be
HOLD_MESSAGES = 256  #: a lingering client sends what waits once this many messages wait
HOLD_BYTES = 64 << 10  #: or once their keys and bodies reach this many bytes


class Locator(Protocol):
    """Where a stream's broker is now (:class:`zeps.client.discovery.LeaderLocator`): asked at each
    reconnection, so a client follows a replicated stream's leader."""

    def __call__(self) -> str: ...

    def close(self) -> None: ...


def partition_endpoint(settings: Resolved, partition: int) -> str:
    """Where partition ``partition`` of a resolved stream is served (partition 0: the stream's
    endpoint, unless the partitions are listed); ConfigError for one the settings do not know."""
    if settings.partitions:
        if not 0 <= partition < len(settings.partitions):
            last = len(settings.partitions) - 1
            raise ConfigError(f"stream {settings.name} has partitions 0..{last}, not {partition}")
        return settings.partitions[partition]
    if partition:
        raise ConfigError(f"stream {settings.name}: no endpoint is known for partition {partition} (its settings list "
                          "no partitions: set ZEPS_STREAM_<NAME>_PARTITIONS, or read the stream's status)")  # fmt: skip
    return settings.endpoint


def batched(items: Iterable[tuple[str, bytes]], size: int) -> Iterator[list[tuple[str, bytes]]]:
    """Lists of up to ``size`` items (itertools.batched arrives in Python 3.12)."""
    iterator = iter(items)
    while group := list(islice(iterator, size)):
        yield group


class BrokerUnavailableError(UnavailableError):
    """No broker answered in time, went silent, or the broker refused this stream."""


def check_linger(linger: float) -> float:
    if not 0.0 <= linger <= MAX_LINGER:
        raise ConfigError(f"linger={linger!r}: the seconds a publish may wait to go out with the next ones, "
                          f"from 0 (each goes at once) to {MAX_LINGER:g}")  # fmt: skip
    return linger


def check_endpoint(endpoint: str) -> str:
    if not endpoint.startswith(("tcp://", "ipc://", "inproc://")):
        raise ConfigError(f"broker endpoint {endpoint!r} must look like tcp://host:port")
    return endpoint


def configure_dealer(sock: Any) -> None:
    """The DEALER options both clients use: bounded queues and frames, quick reconnects, a short linger."""
    sock.setsockopt(zmq.LINGER, 1000)
    sock.setsockopt(zmq.RCVHWM, 100_000)
    sock.setsockopt(zmq.SNDHWM, 100_000)
    sock.setsockopt(zmq.RECONNECT_IVL, 100)
    sock.setsockopt(zmq.RECONNECT_IVL_MAX, 2000)
    sock.setsockopt(zmq.MAXMSGSIZE, max_delivery_frame_bytes())  # a larger frame drops the connection unread


#: socket events both clients watch: a lost connection is re-attached at once, not after ``ttl``; a
#: CURVE handshake the broker refused (its ZAP handler: not an admitted key) is an error at once; a
#: CURVE handshake that failed otherwise (the broker serves another key than the one tried) makes
#: the client try the next broker key it trusts (:class:`CurveTrust`)
MONITORED = (zmq.EVENT_DISCONNECTED | zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_HANDSHAKE_FAILED_AUTH
             | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL)  # fmt: skip


def failed_handshake(event: int) -> bool:
    """Whether ``event`` says a CURVE handshake failed other than by the broker's refusal of the key."""
    return event in (zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL, zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL)


def refused_handshake(event: int, client_keys: tuple[str, str] | None, status: int = 400) -> str | None:
    """Why the broker refused this client, if ``event`` (a monitor event, with its ``status``: the ZAP
    status the broker answered) says it refused the handshake: its connection budget is full (500),
    or its ZAP handler does not admit the client's CURVE key (400)."""
    if event != zmq.EVENT_HANDSHAKE_FAILED_AUTH:
        return None
    if status == 500:
        return ("the broker refused the connection at its handshake: its connection budget is full (as many "
                "connections are open to it as its --max-connections allows); try again later, or raise the "
                "budget")  # fmt: skip
    if client_keys is None:
        return ("the broker refused the CURVE handshake: this client has no key of its own (a random one was "
                "used); give it the client certificate the operator made (ZEPS_STREAM_<NAME>_CURVE_CLIENT, or "
                "client_keys=) and list the client in the stream's spec.curveClients")  # fmt: skip
    return (f"the broker refused the CURVE handshake: client key {client_keys[0]} is not among the stream's "
            "clients (spec.curveClients), or was revoked")  # fmt: skip


def close_dealer(sock: Any, monitor: Any) -> None:
    """Close a client's socket and its monitor at once (no linger: unsent frames are resent after a
    re-attach, or were never confirmed)."""
    if sock is not None:
        sock.disable_monitor()
        if monitor is not None:
            monitor.close(linger=0)
        sock.close(linger=0)


def curve_keys(settings: Resolved) -> tuple[str | None, tuple[str, str] | None]:
    """(the broker's public key, this client's key pair) for a resolved stream. The client's pair from
    the certificate ``settings.curve_client`` names (``client.key_secret`` of the Secret the operator
    made for it); the broker's key as given, else from the ``server.key`` beside that certificate (the
    same Secret: the operator's word, which ZooKeeper cannot change), else the resource's status."""
    if not settings.curve_client:
        return settings.public_key or None, None
    path = Path(settings.curve_client)
    try:
        public, secret = zmq.auth.load_certificate(str(path))
    except (OSError, ValueError) as exc:
        raise ConfigError(
            f"ZEPS_STREAM_<NAME>_CURVE_CLIENT={path}: not a readable zmq certificate ({exc}); mount "
            "the Secret the operator made for this client and name its client.key_secret"
        ) from None
    if secret is None:
        raise ConfigError(f"ZEPS_STREAM_<NAME>_CURVE_CLIENT={path} holds no secret key: name client.key_secret, "
                          "not client.key")  # fmt: skip
    server = settings.public_key
    beside = path.with_name("server.key")
    if beside.exists():
        server = zmq.auth.load_certificate(str(beside))[0].decode()
    return server or None, (public.decode(), secret.decode())


def multicast_key(settings: Resolved) -> bytes | None:
    """A signed stream's multicast key (hex digits in a file): the one ``settings.multicast_key``
    names, else ``multicast.key`` beside the client certificate (its Secret holds both); None for a
    stream without CURVE (nothing is signed). A stream with CURVE signs its multicast messages: with
    its key missing, this fails (ConfigError) rather than take unsigned messages anyone on the group
    could send."""
    path = Path(settings.multicast_key) if settings.multicast_key else None
    if path is None and settings.curve_client:
        beside = Path(settings.curve_client).with_name("multicast.key")
        path = beside if beside.exists() else None
    if path is None:
        if settings.public_key or settings.curve_client:
            raise ConfigError(
                f"stream {settings.namespace}/{settings.name} has CURVE, so its multicast messages are signed, "
                "but no multicast key was found: mount its client Secret (multicast.key beside client.key_secret) "
                f"or set ZEPS_STREAM_<NAME>_MULTICAST_KEY; unsigned messages are never taken instead"
            )
        return None
    try:
        return bytes.fromhex(path.read_text().strip())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"multicast key {path}: not a readable file of hex digits ({exc})") from None


def curve_options(settings: Resolved) -> dict[str, Any]:
    """A client's CURVE arguments for a resolved stream: its keys (:func:`curve_keys`) and, with a
    client certificate, that certificate's path, read again at each (re)connection (:class:`CurveTrust`)."""
    server_key, client_keys = curve_keys(settings)
    return {"server_public_key": server_key, "client_keys": client_keys,
            "curve_certificate": settings.curve_client or None}  # fmt: skip


#: the broker keys a client trusts, beside its certificate in the Secret the operator made for it: the
#: key served now, and during a rotation (:mod:`zeps_operator.curve`) the one coming and the one going
SERVER_KEY_FILES = ("server.key", "server.next.key", "server.previous.key")


class CurveTrust:
    """The CURVE keys a client connects with, read again at each (re)connection from its certificate
    and the broker keys beside it, which a key rotation changes in place (the kubelet updates a mounted
    Secret): a broker that serves another key than the one tried fails the handshake, and the next
    trusted one is tried; a client key the broker refuses is read again, and a new one used.
    Without a certificate (keys given, or none), the keys given, as they are."""

    def __init__(self, server_key: str | None, client_keys: tuple[str, str] | None,
                 certificate: str | Path | None = None) -> None:  # fmt: skip
        self.server_key, self.client_keys = server_key, client_keys
        self.certificate = Path(certificate) if certificate else None
        self._given = server_key
        self._turn = 0  # handshakes failed in a row: the next trusted broker key is tried
        self.worked: str | None = None  #: the broker key of the last attach that succeeded

    def trusted(self) -> list[str]:
        """The broker keys trusted now, the one that last worked first (if still trusted)."""
        keys: list[str] = []
        if self.certificate is not None:
            for name in SERVER_KEY_FILES:
                path = self.certificate.with_name(name)
                try:
                    keys.append(zmq.auth.load_certificate(str(path))[0].decode())
                except (OSError, ValueError):
                    continue  # absent (no rotation under way), or being replaced: the others serve
        if not keys and self._given:
            keys.append(self._given)
        keys = list(dict.fromkeys(keys))
        if self.worked in keys:
            keys.remove(self.worked)
            keys.insert(0, self.worked)
        return keys

    def next_keys(self) -> tuple[str | None, tuple[str, str] | None]:
        """(broker key, own key pair) for the next connection."""
        if self.certificate is not None:
            try:
                public, secret = zmq.auth.load_certificate(str(self.certificate))
                if secret:
                    self.client_keys = (public.decode(), secret.decode())
            except (OSError, ValueError):
                pass  # being replaced: the pair read last serves
        trusted = self.trusted()
        self.server_key = trusted[self._turn % len(trusted)] if trusted else None
        return self.server_key, self.client_keys

    def handshake_failed(self) -> None:
        """A handshake the broker did not complete (it serves another key): the next connection tries
        the next trusted key."""
        self._turn += 1

    def attached(self) -> None:
        self.worked, self._turn = self.server_key, 0

    def renewed(self) -> bool:
        """The broker refused this client's key: True if its certificate holds another one now (a
        rotation), which the next connection uses."""
        if self.certificate is None or self.client_keys is None:
            return False
        try:
            public, _ = zmq.auth.load_certificate(str(self.certificate))
        except (OSError, ValueError):
            return False
        return bool(public) and public.decode() != self.client_keys[0]


def configure_curve(sock: Any, server_public_key: str | None, client_keys: tuple[str, str] | None) -> None:
    """CURVE on ``sock`` when the broker has a public key: the client's own key pair, or a fresh one."""
    if not server_public_key:
        return
    public, secret = client_keys or zmq.curve_keypair()
    sock.setsockopt(zmq.CURVE_SERVERKEY, server_public_key.encode())
    sock.setsockopt(zmq.CURVE_PUBLICKEY, public if isinstance(public, bytes) else public.encode())
    sock.setsockopt(zmq.CURVE_SECRETKEY, secret if isinstance(secret, bytes) else secret.encode())


class Opened:
    """``with``: :meth:`connect` on entry, :meth:`close` on exit (a close that fails after the block
    failed is noted on the block's error, which goes on)."""

    def connect(self) -> Self:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        try:
            return self.connect()
        except BaseException:
            self.close()  # what it opened so far
            raise

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            self.close()
        except ZepsError as error:
            if exc is None:
                raise
            exc.add_note(f"and closing the client failed: {error}")

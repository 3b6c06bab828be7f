"""Making kazoo clients: the one place connection settings become a ``KazooClient``."""

from __future__ import annotations

import atexit
import contextlib
import os
import socket
import ssl
import threading
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import ConnectionLoss
from kazoo.handlers.threading import KazooTimeoutError, SequentialThreadingHandler
from kazoo.protocol.connection import ConnectionHandler
from kazoo.protocol.serialization import Connect
from kazoo.protocol.states import KeeperState
from kazoo.retry import KazooRetry
from kazoo.security import make_digest_acl

from zeps.errors import ConfigError, CoordinationError

__all__ = [
    "BoundedAttemptsClient",
    "BoundedAttemptsHandler",
    "FailFastClient",
    "TLSHandler",
    "attempt_timeout",
    "connect",
    "digest_acl",
    "reconnect_policy",
    "shared_client",
]


def connect(
    hosts: str,
    *,
    timeout: float = 15.0,
    session_timeout: float = 10.0,
    auth: tuple[str, str] | None = None,
    acl_from_auth: bool = True,
    call_deadline: float | None = None,
    ca: str = "",
) -> KazooClient:
    """Start a kazoo client for ``hosts`` (``"host:port[,host:port…][/chroot]"``) and return it connected.

    ``auth`` is a ZooKeeper digest ``(user, password)``: the session authenticates with it, and every
    node this client creates — by zeps recipes and by kazoo's own (elections, locks) — gets the ACL
    that limits it to that user (:func:`digest_acl`). Raises
    :class:`CoordinationError` naming the address when no server answers within ``timeout``. The
    caller owns the client: ``client.stop(); client.close()`` when done. ``acl_from_auth=False``
    authenticates without that default ACL (the operator, a super user, sets ACLs per namespace).

    ``call_deadline`` (seconds) is for a caller that must never wait out an outage (the operator): a
    call made while the client has no connection fails at once with kazoo's ``ConnectionLoss``, which
    zeps's retries retry until their deadline, and kazoo's own retries (its watches' first read)
    give up after ``call_deadline``. Without it, such a call waits, as kazoo's do, until a server
    answers again, however long that takes (:class:`FailFastClient` says why).

    ``ca`` is the PEM of the certificate authority that signed the servers' certificates (the
    chart's ``<release>-zookeeper-tls``): given, the client speaks TLS and takes a server only if its
    certificate is that CA's and names the address dialled (:class:`TLSHandler`).
    """
    auth_data = [("digest", f"{auth[0]}:{auth[1]}")] if auth else None
    default_acl = digest_acl(*auth) if auth and acl_from_auth else None
    attempt = attempt_timeout(session_timeout)
    tls = TLSHandler(ca, attempt) if ca else None
    settings: dict[str, Any] = {
        "hosts": hosts,
        "timeout": session_timeout,
        "auth_data": auth_data,
        "default_acl": default_acl,
        "connection_retry": reconnect_policy(session_timeout),
        "handler": tls or BoundedAttemptsHandler(attempt),
        "attempt_timeout": attempt,
    }
    if call_deadline is None:
        client = BoundedAttemptsClient(**settings)
    else:
        command_retry = KazooRetry(max_tries=-1, delay=0.05, backoff=2, max_delay=1.0, deadline=call_deadline)
        client = FailFastClient(**settings, command_retry=command_retry)
    try:
        client.start(timeout=timeout)
    except KazooTimeoutError as exc:
        client.close()
        why = (f" (TLS: {tls.refusal}: give the CA that signed the servers' certificates, ZEPS_ZOOKEEPER_CA, and "
               "dial a name they carry)") if tls and tls.refusal else ""  # fmt: skip
        raise CoordinationError(f"no ZooKeeper server answered at {hosts!r} within {timeout:.0f}s{why}") from exc
    return client


def attempt_timeout(session_timeout: float) -> float:
    """How long one attempt to reach a server may take: a third of the session timeout (at least a
    second, at most kazoo's own, the whole of it), so a server that does not answer leaves the client
    time to try another, or the same one again, before the session expires."""
    return min(session_timeout, max(1.0, session_timeout / 3))


class BoundedAttemptsHandler(SequentialThreadingHandler):  # type: ignore[misc]  # kazoo has no type hints
    """kazoo's threading handler whose TCP connect to a server gives up after ``attempt_timeout``.

    kazoo gives one server's TCP connect the whole session timeout. A server whose machine is gone
    drops the packets instead of refusing them, so one attempt at it would use up the session, and a
    client that reached the next server of the connect string after it would find its session
    expired. Measured in tests/integration/test_coordination_client.py."""

    def __init__(self, attempt_timeout: float) -> None:
        super().__init__()
        self.attempt_timeout = attempt_timeout

    def create_connection(self, *args: Any, **kwargs: Any) -> socket.socket:
        timeout = kwargs.get("timeout")
        kwargs["timeout"] = self.attempt_timeout if timeout is None else min(timeout, self.attempt_timeout)
        sock: socket.socket = super().create_connection(*args, **kwargs)
        return sock


class BoundedAttemptsClient(KazooClient):  # type: ignore[misc]  # kazoo has no type hints
    """A kazoo client whose attempt to reopen its session gives up on a server that does not answer.

    Reconnecting, kazoo sends the session's id and waits for the server's answer up to the session
    timeout divided by the number of servers: with one server, all of it. Meanwhile the server, whose
    restart gave every session a fresh timeout, expires the session. A server can take the
    connection and never answer: ZooKeeper 3.9's while it starts (the connection it refuses is never
    closed: ZOOKEEPER-5051), or one that hangs. Here that wait is bounded by ``attempt_timeout``, so
    the next attempt comes in time. A new session's first connect keeps kazoo's wait: it has no
    session to lose, and its answer waits on the server writing the session to disk."""

    _connection: Any  # kazoo's ConnectionHandler

    def __init__(self, *args: Any, attempt_timeout: float, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        made = self._connection  # kazoo's, not started yet: replaced by one with the bound
        self._connection = _BoundedConnection(self, made.retry_sleeper, attempt_timeout, logger=made.logger,
                                              sasl_options=made.sasl_options)  # fmt: skip


class _BoundedConnection(ConnectionHandler):  # type: ignore[misc]  # kazoo has no type hints
    def __init__(self, client: KazooClient, retry_sleeper: Any, attempt_timeout: float, **kwargs: Any) -> None:
        super().__init__(client, retry_sleeper, **kwargs)
        self.attempt_timeout = attempt_timeout

    def _invoke(self, timeout: float, request: Any, xid: int | None = None) -> Any:
        if isinstance(request, Connect) and request.session_id:  # reopening a session
            timeout = min(timeout, self.attempt_timeout)
        return super()._invoke(timeout, request, xid)


class TLSHandler(BoundedAttemptsHandler):
    """kazoo's threading handler, its connections wrapped in TLS that trusts one CA alone.

    kazoo's own ``use_ssl`` also trusts every CA of the system's store (it loads the defaults before
    the given one), so with the server name unchecked, as is kazoo's default, any certificate a public
    CA signed would pass. Here the context holds the ensemble's CA only, checks the server's name
    against the host of the connect string, and speaks TLS 1.2 or newer. The last handshake refused
    is kept (``refusal``) for the error a client that never connected raises."""

    def __init__(self, ca: str, attempt_timeout: float) -> None:
        super().__init__(attempt_timeout)
        try:
            self.context = ssl.create_default_context(cadata=ca)
        except (ssl.SSLError, ValueError) as exc:
            raise ConfigError(f"the ZooKeeper CA is not a PEM certificate ({exc}): give the servers' ca.crt") from None
        self.context.minimum_version = ssl.TLSVersion.TLSv1_2
        self.refusal = ""

    def create_connection(self, *args: Any, **kwargs: Any) -> socket.socket:
        hostname = kwargs.pop("hostname", None)
        for kazoo_tls in ("use_ssl", "ca", "certfile", "keyfile", "keyfile_password", "verify_certs", "check_hostname"):
            kwargs.pop(kazoo_tls, None)
        plain: socket.socket = super().create_connection(*args, **kwargs)  # with kazoo's socket options
        try:
            return self.context.wrap_socket(plain, server_hostname=hostname)  # the handshake, in plain's timeout
        except ssl.SSLError as exc:
            self.refusal = str(exc)
            plain.close()
            raise
        except OSError:
            plain.close()
            raise


class FailFastClient(BoundedAttemptsClient):
    """A kazoo client whose calls fail with ``ConnectionLoss`` while it has no connection.

    kazoo queues a call made while it is reconnecting and sends it once a server answers: with
    ZooKeeper down, the call waits for as long as the outage lasts, and no retry deadline bounds it
    (the deadline is checked between attempts, and the first attempt never ends). A call queued
    before the connection dropped is failed by kazoo at the drop. Here the check of the state and the
    queueing hold one lock, and so does kazoo's change of state (this class wraps it), so a call is
    either failed by the drop or sees it: none is left waiting in between.

    Measured against a real server in tests/integration/test_coordination_client.py."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._state_lock = threading.RLock()  # before kazoo's __init__, which may change the state
        super().__init__(*args, **kwargs)

    def _call(self, request: Any, async_object: Any) -> Any:
        with self._state_lock:
            if self._state == KeeperState.CONNECTING:
                async_object.set_exception(ConnectionLoss("no connection to ZooKeeper: the call was not sent"))
                return False
            return super()._call(request, async_object)

    def _session_callback(self, state: Any) -> None:
        with self._state_lock:
            super()._session_callback(state)


def reconnect_policy(session_timeout: float) -> dict[str, float]:
    """How a client tries to reconnect after losing its server: forever, backing off from 0.1 s to at
    most a third of the session timeout between rounds. kazoo's default backs off up to an hour, so a
    client that failed for a while (ZooKeeper restarting, a leader election under load) could sleep
    through the servers' return and find its session expired, its ephemeral nodes and locks gone."""
    return {"max_tries": -1, "delay": 0.1, "backoff": 2, "max_jitter": 0.4, "max_delay": max(0.5, session_timeout / 3)}


def digest_acl(user: str, password: str) -> list[Any]:
    """The ACL for nodes only ``user`` (authenticated by digest) may read, write or delete."""
    return [make_digest_acl(user, password, all=True)]


_shared: dict[tuple[int, str, tuple[str, str] | None, str], KazooClient] = {}
_shared_lock = threading.Lock()


def shared_client(hosts: str, *, auth: tuple[str, str] | None = None, ca: str = "") -> KazooClient:
    """The process's one client for ``hosts`` (and identity, and TLS CA), made on first use.

    Keyed by process id: a forked child (a Spark worker, a multiprocessing pool) never reuses its
    parent's client, whose threads did not survive the fork. Clients are closed at interpreter exit.
    """
    key = (os.getpid(), hosts, auth, ca)
    with _shared_lock:
        client = _shared.get(key)
        if client is None or (not client.connected and client.state == "LOST"):
            client = connect(hosts, auth=auth, ca=ca)
            _shared[key] = client
        return client


def close_shared(hosts: str | None = None) -> None:
    """Close this process's shared clients (of ``hosts``, or all): before stopping a ZooKeeper they
    talk to, or at exit."""
    with _shared_lock:
        for key in [k for k in _shared if k[0] == os.getpid() and hosts in (None, k[1])]:
            client = _shared.pop(key)
            with contextlib.suppress(Exception):
                client.stop()
                client.close()


atexit.register(close_shared)

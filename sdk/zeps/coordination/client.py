"""Making kazoo clients: the one place connection settings become a ``KazooClient``."""

from __future__ import annotations

import atexit
import contextlib
import os
import threading
from typing import Any

from kazoo.client import KazooClient
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.security import make_digest_acl

from zeps.errors import CoordinationError

__all__ = ["connect", "digest_acl", "reconnect_policy", "shared_client"]


def connect(
    hosts: str,
    *,
    timeout: float = 15.0,
    session_timeout: float = 10.0,
    auth: tuple[str, str] | None = None,
    acl_from_auth: bool = True,
) -> KazooClient:
    """Start a kazoo client for ``hosts`` (``"host:port[,host:port…][/chroot]"``) and return it connected.

    ``auth`` is a ZooKeeper digest ``(user, password)``: the session authenticates with it, and every
    node this client creates — by zeps recipes and by kazoo's own (elections, locks) — gets the ACL
    that limits it to that user (:func:`digest_acl`). Raises
    :class:`CoordinationError` naming the address when no server answers within ``timeout``. The
    caller owns the client: ``client.stop(); client.close()`` when done. ``acl_from_auth=False``
    authenticates without that default ACL (the operator, a super user, sets ACLs per namespace).
    """
    auth_data = [("digest", f"{auth[0]}:{auth[1]}")] if auth else None
    default_acl = digest_acl(*auth) if auth and acl_from_auth else None
    client = KazooClient(
        hosts=hosts,
        timeout=session_timeout,
        auth_data=auth_data,
        default_acl=default_acl,
        connection_retry=reconnect_policy(session_timeout),
    )
    try:
        client.start(timeout=timeout)
    except KazooTimeoutError as exc:
        client.close()
        raise CoordinationError(f"no ZooKeeper server answered at {hosts!r} within {timeout:.0f}s") from exc
    return client


def reconnect_policy(session_timeout: float) -> dict[str, float]:
    """How a client tries to reconnect after losing its server: forever, backing off from 0.1 s to at
    most a third of the session timeout between rounds. kazoo's default backs off up to an hour, so a
    client that failed for a while (ZooKeeper restarting, a leader election under load) could sleep
    through the servers' return and find its session expired, its ephemeral nodes and locks gone."""
    return {"max_tries": -1, "delay": 0.1, "backoff": 2, "max_jitter": 0.4, "max_delay": max(0.5, session_timeout / 3)}


def digest_acl(user: str, password: str) -> list[Any]:
    """The ACL for nodes only ``user`` (authenticated by digest) may read, write or delete."""
    return [make_digest_acl(user, password, all=True)]


_shared: dict[tuple[int, str, tuple[str, str] | None], KazooClient] = {}
_shared_lock = threading.Lock()


def shared_client(hosts: str, *, auth: tuple[str, str] | None = None) -> KazooClient:
    """The process's one client for ``hosts`` (and identity), made on first use.

    Keyed by process id: a forked child (a Spark worker, a multiprocessing pool) never reuses its
    parent's client, whose threads did not survive the fork. Clients are closed at interpreter exit.
    """
    key = (os.getpid(), hosts, auth)
    with _shared_lock:
        client = _shared.get(key)
        if client is None or (not client.connected and client.state == "LOST"):
            client = connect(hosts, auth=auth)
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

"""Making kazoo clients: the one place connection settings become a ``KazooClient``."""

from __future__ import annotations

from kazoo.client import KazooClient
from kazoo.handlers.threading import KazooTimeoutError

from zeps.errors import CoordinationError

__all__ = ["connect"]


def connect(hosts: str, *, timeout: float = 15.0, session_timeout: float = 10.0) -> KazooClient:
    """Start a kazoo client for ``hosts`` (``"host:port[,host:port…][/chroot]"``) and return it connected.

    Raises :class:`CoordinationError` naming the address when no server answers within ``timeout``.
    The caller owns the client: ``client.stop(); client.close()`` when done.
    """
    client = KazooClient(hosts=hosts, timeout=session_timeout)
    try:
        client.start(timeout=timeout)
    except KazooTimeoutError as exc:
        client.close()
        raise CoordinationError(f"no ZooKeeper server answered at {hosts!r} within {timeout:.0f}s") from exc
    return client

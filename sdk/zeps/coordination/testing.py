"""Failure injection and inspection helpers for tests against a real ZooKeeper server.

They are part of the SDK (not only zeps' own tests) so applications built on zeps can test their
own behaviour under session expiry the same way.
"""

from __future__ import annotations

import threading

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import NoNodeError

from zeps.errors import CoordinationError

__all__ = ["count_znodes", "expire_session", "expire_session_by_id"]


def expire_session(client: KazooClient, *, wait_reconnect: bool = True, timeout: float = 20.0) -> None:
    """Make the server expire ``client``'s session, for real.

    A second connection attaches to the same session id and password, then closes it: the server
    ends the session, drops its ephemeral nodes and watches, and ``client`` sees LOST on its next
    reconnect. With ``wait_reconnect`` this returns once ``client`` has a new session.
    """
    session_id, password = client.client_id
    hosts = ",".join(f"{host}:{port}" for host, port in client.hosts)
    lost, back = threading.Event(), threading.Event()

    def listener(state: str) -> bool:
        if state == KazooState.LOST:
            lost.set()
        elif state == KazooState.CONNECTED and lost.is_set():
            back.set()
            return True  # done: kazoo removes the listener
        return False

    client.add_listener(listener)
    expire_session_by_id(hosts, session_id, password, timeout=timeout)
    if not lost.wait(timeout):
        client.remove_listener(listener)
        raise CoordinationError(f"session 0x{session_id:x} was not reported lost within {timeout:.0f}s")
    if wait_reconnect and not back.wait(timeout):
        raise CoordinationError(f"client did not reconnect within {timeout:.0f}s after session expiry")


def expire_session_by_id(hosts: str, session_id: int, password: bytes, *, timeout: float = 20.0) -> None:
    """Expire a session known only by its id and password — for example one held by another
    process — by attaching to it and closing it. The owner sees LOST on its next reconnect."""
    twin = KazooClient(hosts=hosts, client_id=(session_id, password))
    try:
        twin.start(timeout=timeout)
        twin.stop()
    finally:
        twin.close()


def count_znodes(client: KazooClient, path: str) -> int:
    """How many znodes lie below ``path`` (not counting ``path`` itself); 0 if it does not exist."""
    try:
        children = client.get_children(path)
    except NoNodeError:
        return 0
    return sum(1 + count_znodes(client, f"{path.rstrip('/')}/{child}") for child in children)

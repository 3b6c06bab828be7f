"""A line of waiters without a herd: the ZooKeeper lock recipe's trick, for idle workers.

Each waiter holds an ephemeral-sequential node under one parent. Only the head of the line watches
what it waits for; every other waiter watches the node just before its own, so a change wakes one
waiter, not all of them. A waiter keeps its place until it has what it waited for: leaving earlier
would wake the next one while the thing is still there, and that one the next… (a herd).

:class:`WaitingLine` does the line; what "ready" means is the caller's: :meth:`WaitingLine.wait`
asks its ``look`` function whenever this waiter is at the head (the work queue looks for an item
it can take).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from typing import Any, Literal

from kazoo.client import KazooClient
from kazoo.exceptions import ConnectionLoss, NoNodeError, SessionExpiredError

from zeps.paths import sequence_of

__all__ = ["Look", "WaitingLine"]

#: what ``look`` says at the head of the line: True (ready: stop waiting), a monotonic time to look
#: again by (something falls due then), or None (wait for a watch)
Look = Callable[[Callable[[Any], None]], "Literal[True] | float | None"]

_SAFETY_NET_S = 5.0  # a watch wakes a waiter; this bounds the wait if a watch were ever lost


class WaitingLine:
    """A line under ``path``. ``call`` runs a ZooKeeper request with the caller's bounded retry (and
    counts it); ``once`` runs one without a retry (a create a retry could duplicate)."""

    def __init__(self, client: KazooClient, path: str, *, call: Callable[..., Any], once: Callable[..., Any]) -> None:
        self.client = client
        self.path = path
        self._call, self._once = call, once
        self._changed = threading.Event()  # set by watch notifications
        self.notifications = 0  #: watch notifications received (the herd measurements)

    def join(self, marker: str) -> str:
        """Take a place at the end of the line; returns our node's name. A protected create: after a
        lost connection, our own node (its name starts with ``marker``) is found, never a second made."""
        try:
            path: str = self._once(self.client.create, f"{self.path}/{marker}", ephemeral=True, sequence=True)
        except (ConnectionLoss, SessionExpiredError):
            for name in self._call(self.client.get_children, self.path):
                if name.startswith(marker):
                    return str(name)
            path = self._call(self.client.create, f"{self.path}/{marker}", ephemeral=True, sequence=True)
        return path.rsplit("/", 1)[1]

    def leave(self, me: str) -> None:
        """Give up our place (gone already is fine)."""
        with contextlib.suppress(NoNodeError):
            self._call(self.client.delete, f"{self.path}/{me}")

    def wait(self, me: str, deadline: float | None, look: Look) -> bool:
        """Wait in line until ``look``, asked at the head, says ready, or a time it named comes, or the
        deadline (monotonic; None: no deadline): then True. False when our node is gone (our session
        expired): join again."""
        while deadline is None or time.monotonic() < deadline:
            line = sorted(self._call(self.client.get_children, self.path), key=sequence_of)
            if me not in line:
                return False
            position = line.index(me)
            self._changed.clear()
            wake = self._on_watch  # one bound method: kazoo keeps it once per path, whatever the rounds
            until = deadline
            if position == 0:
                seen = look(wake)
                if seen is True:
                    return True
                if isinstance(seen, float):
                    until = seen if deadline is None else min(deadline, seen)
            elif self._call(self.client.exists, f"{self.path}/{line[position - 1]}", watch=wake) is None:
                continue  # the one before us is already gone: look again
            remaining = None if until is None else max(0.0, until - time.monotonic())
            self._changed.wait(_SAFETY_NET_S if remaining is None else min(remaining, _SAFETY_NET_S))
            if until is not None and until != deadline and time.monotonic() >= until:
                return True  # the time look named has come: go and try
        return True

    def _on_watch(self, _event: Any) -> None:
        self.notifications += 1
        self._changed.set()

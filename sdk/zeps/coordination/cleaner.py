"""A Topic's cleaner: elected (one at a time), it removes the queues of consumers gone for longer
than ``cleaner_grace`` (the layout: :mod:`zeps.coordination.topic`)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import KazooException, NoNodeError

from zeps.coordination._util import delete_tree, zookeeper_errors
from zeps.coordination.topic_view import TopicView
from zeps.errors import CoordinationError

__all__ = ["TopicCleaner"]

log = logging.getLogger(__name__)


class TopicCleaner:
    """The topic's cleaner: elected (exactly one at a time), it removes the queues of consumers whose
    client has been gone for ``cleaner_grace`` seconds, every ``cleaner_interval`` seconds and
    whenever the set of live clients changes. ``clock`` (monotonic seconds) measures the grace: tests
    pass their own."""

    def __init__(self, topic: TopicView, *, identifier: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.topic = topic
        self.identifier = identifier
        self.clock = clock
        self._stopped = threading.Event()
        self._wake = threading.Event()
        self._leading = threading.Event()
        self._thread: threading.Thread | None = None
        self._election: Any = None
        self._missing_since: dict[str, float] = {}
        #: consumers whose queues this cleaner removed
        self.removed: list[str] = []

    @property
    def client(self) -> KazooClient:
        return self.topic.client

    def follow(self, topic: TopicView) -> None:
        """Go on cleaning through ``topic``, a new handle on the same topic (new options, say), keeping
        when each missing consumer was first missed: a caller running passes with :meth:`clean_once`
        keeps one cleaner across them, or the grace would start again at every pass."""
        if topic.paths != self.topic.paths:
            raise ValueError(f"a cleaner of {self.topic.paths.root} cannot follow {topic.paths.root}")
        self.topic = topic

    @property
    def is_leader(self) -> bool:
        return self._leading.is_set()

    def wait_leading(self, timeout: float | None = None) -> bool:
        """Wait until this instance leads: True once it does, False if ``timeout`` seconds passed first."""
        return self._leading.wait(timeout)

    def start(self) -> TopicCleaner:
        self.topic.ensure()
        self._thread = threading.Thread(target=self._run, name=f"zeps-cleaner-{self.topic.name}", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stopped.is_set():
            self._election = self.client.Election(self.topic.paths.cleaner, self.identifier)
            try:
                self._election.run(self._lead)
            except KazooException as exc:
                log.warning("cleaner election for %s interrupted (%r); retrying", self.topic.name, exc)
                self._stopped.wait(1)

    def _lead(self) -> None:
        lost = threading.Event()

        def on_state(state: str) -> bool:
            if state != KazooState.CONNECTED:
                lost.set()  # SUSPENDED: no longer sure we lead; LOST: we do not
                self._wake.set()
                return True
            return False

        def clients_changed(_children: list[str]) -> bool | None:
            if self._stopped.is_set() or lost.is_set():
                return False
            self._wake.set()
            return None

        self.client.add_listener(on_state)
        self.forget_missing()
        self._leading.set()
        log.info("cleaner for topic %s: %s leads", self.topic.name, self.identifier)
        try:
            self.client.ChildrenWatch(self.topic.paths.clients.members, clients_changed)
            while not self._stopped.is_set() and not lost.is_set():
                try:
                    self.clean_once()
                except CoordinationError as exc:
                    log.warning("cleaner for %s: pass failed (%r)", self.topic.name, exc)
                self._wake.wait(self._next_wait())
                self._wake.clear()
        finally:
            self._leading.clear()
            self.client.remove_listener(on_state)

    def _next_wait(self) -> float:
        interval = self.topic.options.cleaner_interval
        due = self.next_due()
        return interval if due is None else max(0.05, min(interval, due - self.clock()))

    @zookeeper_errors
    def watch_clients(self, changed: Callable[[], bool]) -> None:
        """Call ``changed()`` now and whenever the Topic's set of live clients changes, until it
        returns False: for a caller that runs :meth:`clean_once` itself, driven by the watch."""
        self.client.ChildrenWatch(self.topic.paths.clients.members, lambda _children: changed() or False)

    def next_due(self) -> float | None:
        """When (by :attr:`clock`) the grace of the first consumer found missing is up; None when
        no consumer is missing. A caller running :meth:`clean_once` itself passes again then."""
        if not self._missing_since:
            return None
        return min(self._missing_since.values()) + self.topic.options.cleaner_grace

    def forget_missing(self) -> None:
        """Count every consumer's grace from the next pass (a new leader: it did not see them go)."""
        self._missing_since.clear()

    @zookeeper_errors
    def clean_once(self) -> list[str]:
        """One pass: remove queues whose client has been gone for the grace period."""
        paths = self.topic.paths
        try:
            queues = set(self.client.get_children(paths.messages))
        except NoNodeError:
            return []
        live = set(self.client.get_children(paths.clients.members))
        now = self.clock()
        for consumer in list(self._missing_since):
            if consumer in live or consumer not in queues:
                del self._missing_since[consumer]
        removed = []
        for consumer in sorted(queues - live):
            since = self._missing_since.setdefault(consumer, now)
            if now - since >= self.topic.options.cleaner_grace:
                log.info(
                    "cleaner for topic %s: removing the queue of vanished consumer %s",
                    self.topic.name,
                    consumer,
                )
                delete_tree(self.client, paths.queue(consumer))
                del self._missing_since[consumer]
                removed.append(consumer)
        self.removed.extend(removed)
        return removed

    def stop(self) -> None:
        self._stopped.set()
        self._wake.set()
        if self._election is not None:
            self._election.cancel()
        if self._thread is not None:
            self._thread.join(30)

"""The Topics' cleaning in the replica that holds the cleaner Lease: driven by ZooKeeper's watches.

Every Topic the operator reconciles is followed here (:meth:`Cleaning.follow`): a children watch on
its live clients schedules a cleaner pass when one comes or goes, and a pass that finds a consumer
missing schedules another for the moment its ``cleanerGrace`` is up. So a vanished consumer's queue
goes once its grace is up, not at the next resync; the resync timer's pass (:meth:`Cleaning.sweep`)
is the slow safety sweep behind the watches.

One thread runs the scheduled passes. It cleans only while :attr:`leading` says this replica holds
the Lease. When the replica starts to lead, every Topic gets a pass at once (with a fresh memory of
who is missing: the former leader saw what this replica did not), so a takeover cleans within the
Lease's duration plus the grace. A pass costs two ZooKeeper reads; idle Topics cost nothing.
"""

from __future__ import annotations

import heapq
import logging
import threading
import time
from collections.abc import Callable

from zeps.coordination import Topic, TopicCleaner
from zeps.errors import CoordinationError
from zeps_operator import metrics

__all__ = ["Cleaning"]

log = logging.getLogger(__name__)

#: how often the thread looks at the Lease when nothing is due (a takeover is noticed this fast)
LEADERSHIP_CHECK_S = 1.0


class Cleaning:
    """Scheduled cleaner passes of every followed Topic, keyed by the Topic's ZooKeeper root."""

    def __init__(self, *, identity: str, leading: Callable[[], bool]) -> None:
        self.identity = identity
        self.leading = leading
        self._cleaners: dict[str, TopicCleaner] = {}
        self._removed: dict[str, list[str]] = {}  # root -> consumers removed, not yet reported
        self._due: list[tuple[float, str]] = []  # heap of (monotonic time, root)
        self._lock = threading.Lock()  # guards the maps and the heap
        self._passes = threading.Lock()  # one pass at a time (the thread's and the timers' sweeps)
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._led = False
        self._thread = threading.Thread(target=self._run, name="zeps-cleaning", daemon=True)

    def start(self) -> Cleaning:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(10)

    # -- what the handlers call -----------------------------------------------------------------
    def follow(self, topic: Topic) -> None:
        """Clean ``topic`` from now on (again with its current options, when they changed)."""
        root = topic.paths.root
        with self._lock:
            cleaner = self._cleaners.get(root)
            if cleaner is not None:
                if cleaner.topic.options != topic.options:
                    cleaner.follow(topic)
                return
            self._cleaners[root] = cleaner = topic.cleaner(identifier=self.identity)

        def clients_changed() -> bool:
            if root not in self._cleaners:
                return False  # forgotten: the watch ends
            self._schedule(root, time.monotonic())
            return True

        try:
            cleaner.watch_clients(clients_changed)
        except CoordinationError as exc:  # the sweep still cleans; the next follow() tries the watch again
            log.warning("cleaning: no watch on %s's clients yet (%s)", root, exc)
            with self._lock:
                self._cleaners.pop(root, None)

    def forget(self, root: str) -> None:
        """Stop cleaning the Topic at ``root`` (it is being deleted)."""
        with self._lock:
            self._cleaners.pop(root, None)
            self._removed.pop(root, None)

    def sweep(self, topic: Topic) -> list[str]:
        """The resync timer's pass over ``topic`` (when leading): the consumers whose queues were
        removed, by this pass or by a watch-driven one since the last sweep (for the Topic's event)."""
        self.follow(topic)
        root = topic.paths.root
        if self.leading():
            self._pass(root)
        with self._lock:
            return self._removed.pop(root, [])

    # -- the thread -----------------------------------------------------------------------------
    def _schedule(self, root: str, when: float) -> None:
        with self._lock:
            heapq.heappush(self._due, (when, root))
        self._wake.set()

    def _pass(self, root: str) -> None:
        with self._lock:
            cleaner = self._cleaners.get(root)
        if cleaner is None:
            return
        with self._passes:
            try:
                removed = cleaner.clean_once()
            except CoordinationError as exc:
                log.warning("cleaning: pass over %s failed (%r); the next watch or sweep tries again", root, exc)
                return
            due = cleaner.next_due()
        metrics.cleaner_pass(cleaner.topic.namespace, cleaner.topic.name, removed=len(removed))
        if removed:
            with self._lock:
                if root in self._cleaners:
                    self._removed.setdefault(root, []).extend(removed)
        if due is not None:
            self._schedule(root, due)

    def _leadership(self) -> bool:
        """Whether we lead; on becoming the leader, every Topic is due now with a fresh memory."""
        leading = self.leading()
        if leading and not self._led:
            now = time.monotonic()
            with self._lock:
                for root, cleaner in self._cleaners.items():
                    cleaner.forget_missing()
                    heapq.heappush(self._due, (now, root))
            log.info("cleaning: %s leads; a pass over every Topic", self.identity)
        self._led = leading
        return leading

    def _run(self) -> None:
        while not self._stop.is_set():
            leading = self._leadership()
            with self._lock:
                soonest = self._due[0][0] if self._due else None
            wait = LEADERSHIP_CHECK_S if soonest is None else min(LEADERSHIP_CHECK_S, soonest - time.monotonic())
            if wait > 0:
                self._wake.wait(wait)
                self._wake.clear()
                continue
            with self._lock:
                _, root = heapq.heappop(self._due)
                while self._due and self._due[0][1] == root and self._due[0][0] <= time.monotonic():
                    heapq.heappop(self._due)  # a burst of changes: one pass
            if leading:
                self._pass(root)

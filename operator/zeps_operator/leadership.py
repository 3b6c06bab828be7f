"""One Lease per operator installation decides which replica runs the Topics' cleaners.

Every replica tries to acquire or renew the Lease every third of its duration, on a thread of its
own: a constant cost (one read and one write per interval per replica), whatever the number of
resources. The holder cleans every Topic in its resync passes; when it dies, another replica takes
the Lease once it has not been renewed for its duration, and cleans from its next pass.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the adapter is passed in: this module's rule needs no Kubernetes client to test
    from zeps_operator.kube import Kube

__all__ = ["LeaseKeeper"]

log = logging.getLogger(__name__)


class LeaseKeeper:
    """Keeps trying to hold ``namespace/name`` for ``identity``. :meth:`leading` is True only while a
    renewal succeeded within the last two thirds of the duration, so a replica cut off from the API
    server stops cleaning before another one can take over. ``clock`` (monotonic seconds) is what
    "within" is measured by: tests pass their own."""

    def __init__(self, kube: Kube, namespace: str, name: str, *, identity: str, duration: int,
                 clock: Callable[[], float] = time.monotonic) -> None:  # fmt: skip
        self.kube, self.namespace, self.name = kube, namespace, name
        self.identity, self.duration, self.clock = identity, duration, clock
        self._holder = ""
        self._valid_until = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="zeps-cleaner-lease", daemon=True)

    def start(self) -> LeaseKeeper:
        self._thread.start()
        return self

    @property
    def holder(self) -> str:
        """Who held the Lease when this replica last looked ("" before the first look)."""
        return self._holder

    def leading(self) -> bool:
        return self._holder == self.identity and self.clock() < self._valid_until

    def try_once(self) -> str:
        """One acquire-or-renew; returns the holder."""
        asked = self.clock()
        holder = self.kube.hold_lease(self.namespace, self.name, identity=self.identity, duration=self.duration)
        self._holder = holder
        if holder == self.identity:
            self._valid_until = asked + self.duration * 2 / 3
        return holder

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.try_once()
            except Exception:
                log.warning("cannot renew the cleaner Lease %s/%s", self.namespace, self.name, exc_info=True)
            self._stop.wait(self.duration / 3)

    def stop(self) -> None:
        """Stop renewing and give the Lease up if held, so another replica need not wait out its duration."""
        self._stop.set()
        if self._thread.ident is not None:  # started
            self._thread.join(10)
        if self._holder == self.identity:
            self._holder = ""
            self.kube.release_lease(self.namespace, self.name, identity=self.identity)

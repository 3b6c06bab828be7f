"""Time the test workloads spend on purpose: the work a message or an item stands for, and a steady
pace of publishing. It is the workload's, not a test waiting for something to happen (tests wait on
events with ``harness.until``): every such sleep of the workers and workload threads is here.

Imported as ``workload`` by the worker scripts (their folder is first on ``sys.path``) and as
``workers.workload`` by tests that run a workload in a thread.
"""

from __future__ import annotations

import time
from collections.abc import Callable


def work(seconds: float) -> None:
    """The work one message or item stands for: ``seconds`` of it (none for 0 or less)."""
    if seconds > 0:
        time.sleep(seconds)  # the one sleep of the workloads: the work itself


class Pace:
    """At most ``rate`` steps a second: :meth:`step` returns no sooner than ``1 / rate`` seconds after
    the step before it returned (the first at once). Slower work than that sets the pace itself, and a
    stall (a failover the publisher waited through) is not made up for with a burst after it."""

    def __init__(self, rate: float, clock: Callable[[], float] = time.monotonic) -> None:
        if rate <= 0:
            raise ValueError(f"a pace of {rate} steps a second: give a positive rate")
        self.interval, self.clock = 1 / rate, clock
        self.last: float | None = None

    def step(self) -> None:
        if self.last is not None:
            work(self.last + self.interval - self.clock())
        self.last = self.clock()

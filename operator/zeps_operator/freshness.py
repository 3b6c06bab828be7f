"""Reads from the API server shared by the handlers that can use them: one read serves every handler
that needs a value at least as fresh as it.

The handlers of a namespace's Topics and Queues all need that namespace's credentials Secret. A new
object needs the Secret as it was when the object was created (a user creates the Secret, then the
Topic), so each create handler read it once: 1,000 GETs for 1,000 Topics applied at once. A read
that *started* after an object was created shows the Secret as it was then or later (a GET without a
resourceVersion is a quorum read), so it serves that object, and every object created before it.
During a burst the handlers run seconds behind the creations, and one read serves hundreds of them.

:class:`ReadCache` keeps, per key, the last value read and the wall-clock time its read started; a
caller asks for a value read after a time of its choosing (or within the last ``max_age`` seconds).
Reads of one key are made one at a time: callers that arrive during a read wait for it and take it
if it is fresh enough for them.

Tested on its own in ``tests/unit/test_freshness.py`` and with the operator in
``tests/cluster/test_operator.py`` (a Secret created after a namespace's first Topic is read for
the next one).
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

__all__ = ["CLOCK_SKEW_S", "ReadCache", "read_after_creation"]

T = TypeVar("T")

#: how far behind the API server's clock the operator's may be. The margin is added to an object's
#: creationTimestamp (whole seconds, rounded down, so one more second) before a read can serve it.
CLOCK_SKEW_S = 2.0


def read_after_creation(creation_timestamp: str) -> float:
    """The wall-clock time after which a read shows what existed when the object was created
    (``metadata.creationTimestamp``, e.g. ``2026-11-24T08:33:15Z``)."""
    created = dt.datetime.fromisoformat(creation_timestamp.replace("Z", "+00:00")).timestamp()
    return created + 1.0 + CLOCK_SKEW_S


class ReadCache(Generic[T]):
    """Per key, the last value ``read(key)`` returned and when that read started (``clock()``, the
    wall clock by default). What ``read`` raises reaches the caller and forgets the key's value."""

    def __init__(self, read: Callable[[str], T], *, max_age: float, clock: Callable[[], float] = time.time) -> None:
        self._read = read
        self._max_age = max_age
        self._clock = clock
        self._values: dict[str, tuple[float, T]] = {}  # key -> (when its read started, value)
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()  # over _locks
        self.reads = 0  # how many reads were made, for the tests and the curious

    def get(self, key: str, *, read_after: float | None = None) -> T:
        """The key's value from a read that started after ``read_after`` (a wall-clock time); for
        None, from a read that started within the last ``max_age`` seconds. Reads when there is none."""
        value = self._fresh(key, read_after)
        if value is not None:
            return value[1]
        with self._guard:
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:  # a read in flight for the key may be fresh enough: wait for it, then look again
            value = self._fresh(key, read_after)
            if value is not None:
                return value[1]
            started = self._clock()
            try:
                result = self._read(key)
            except BaseException:
                self._values.pop(key, None)
                raise
            self.reads += 1
            self._values[key] = (started, result)
            return result

    def _fresh(self, key: str, read_after: float | None) -> tuple[float, T] | None:
        value = self._values.get(key)
        if value is None:
            return None
        started = value[0]
        fresh = started >= read_after if read_after is not None else started >= self._clock() - self._max_age
        return value if fresh else None

"""One pass over a ZepsStream at a time, and no timer pass over a copy of the stream that an earlier
pass already acted on.

Two workers may take a stream's timer and one of its changes at once (:mod:`zeps_operator.fairness`):
two passes deciding a roll from the same pods would each restart one, so a stream's passes hold its
lock. That is not enough: kopf gives a stream's timer the object as its watch last delivered it, and
a pass's writes (its status and annotations, which kopf patches once the handler returned, or what
it writes itself) reach that copy only when the watch delivers them. Until then a timer pass would
decide again from what the last pass read: a move's phase it already left (the rebuilt replica's new
claim deleted as if it were the old one), a done move's annotation removed once more, after someone
asked for the next one. kopf's change handlers wait for the version their handler wrote (its
consistency timeout); its timers do not.

So each stream keeps the resourceVersion its last writing pass read, and a timer pass that finds the
same version skips (the watch brings the written version soon, and a pass with it). For ``hold``
seconds at most: a write the API server refused leaves the version as it was, and the timer must not
stop for good.

Pure: the caller gives the time. Tested in ``tests/unit/test_passes.py``.
"""

from __future__ import annotations

import threading

__all__ = ["StreamPasses"]

Key = tuple[str, str]  # (namespace, name)


class StreamPasses:
    """Per stream, the lock its passes hold and the version its last writing pass read."""

    def __init__(self, hold: float) -> None:
        self._hold = hold
        self._locks: dict[Key, threading.Lock] = {}
        self._reading: dict[Key, str] = {}  # the version the running pass read
        self._written: dict[Key, tuple[str, float]] = {}  # the version the last writing pass read, when it wrote
        self._guard = threading.Lock()

    def lock(self, key: Key) -> threading.Lock:
        """The lock a pass over the stream ``key`` holds while it runs."""
        with self._guard:
            return self._locks.setdefault(key, threading.Lock())

    def begin(self, key: Key, version: str, now: float, *, timer: bool) -> bool:
        """A pass of ``key`` holding its lock, over the object at ``version``: False when it is a timer's
        pass over the version the last writing pass read, written less than ``hold`` seconds ago."""
        written = self._written.get(key)
        if timer and written is not None and written[0] == version and now - written[1] < self._hold:
            return False
        self._reading[key] = version
        return True

    def wrote(self, key: Key, now: float) -> None:
        """The running pass of ``key`` wrote to the object (or kopf will, with its patch)."""
        version = self._reading.get(key)
        if version is not None:
            self._written[key] = (version, now)

    def forget(self, key: Key) -> None:
        """The stream is gone."""
        with self._guard:
            self._locks.pop(key, None)
        self._reading.pop(key, None)
        self._written.pop(key, None)

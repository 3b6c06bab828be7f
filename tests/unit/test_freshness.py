"""The shared reads of :mod:`zeps_operator.freshness` on their own: which callers a read serves, and
that callers arriving during a read wait for it. The reader and the clock are the test's own (the
operator reads the namespace Secret with them in tests/cluster/test_operator.py)."""

from __future__ import annotations

import threading
import time

import pytest

from zeps_dev.process import wait_until
from zeps_operator.freshness import CLOCK_SKEW_S, ReadCache, read_after_creation


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class CountingLock:
    """A lock counting how often it was taken."""

    def __init__(self) -> None:
        self._lock, self.taken = threading.Lock(), 0

    def __enter__(self) -> CountingLock:
        self._lock.acquire()
        self.taken += 1
        return self

    def __exit__(self, *_exc: object) -> None:
        self._lock.release()


def test_a_read_serves_every_caller_created_before_it_started_and_none_created_after() -> None:
    clock = Clock()
    versions = iter(["v1", "v2", "v3"])
    cache = ReadCache(lambda key: next(versions), max_age=30, clock=clock)
    assert cache.get("ns", read_after=999.0) == "v1"  # read at 1000
    clock.now = 1005.0
    assert cache.get("ns", read_after=1000.0) == "v1"  # the read at 1000 started late enough
    assert cache.get("ns", read_after=990.0) == "v1"
    assert cache.reads == 1
    assert cache.get("ns", read_after=1000.5) == "v2"  # created after the read began: read again
    assert cache.get("ns", read_after=1004.0) == "v2"
    assert cache.reads == 2


def test_without_a_time_any_read_within_max_age_serves() -> None:
    clock = Clock()
    versions = iter(["v1", "v2"])
    cache = ReadCache(lambda key: next(versions), max_age=30, clock=clock)
    assert cache.get("ns") == "v1"
    clock.now = 1029.0
    assert cache.get("ns") == "v1"
    clock.now = 1031.0
    assert cache.get("ns") == "v2"


def test_keys_are_read_apart() -> None:
    cache = ReadCache(lambda key: f"value of {key}", max_age=30, clock=Clock())
    assert cache.get("a") == "value of a"
    assert cache.get("b") == "value of b"
    assert cache.reads == 2


def test_a_failed_read_reaches_the_caller_and_forgets_the_value() -> None:
    clock = Clock()
    answers: list[object] = ["v1", ValueError("Secret lacks the key user"), "v3"]

    def read(key: str) -> str:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return str(answer)

    cache = ReadCache(read, max_age=30, clock=clock)
    assert cache.get("ns") == "v1"
    clock.now = 1001.0
    with pytest.raises(ValueError, match="lacks the key user"):
        cache.get("ns", read_after=1000.5)
    assert cache.get("ns") == "v3"  # the old value was forgotten, not served


def test_callers_arriving_during_a_read_wait_for_it_and_take_it_when_fresh_enough() -> None:
    """Ten callers, all created before the first read began, arrive while it is in flight: one read."""
    inside, release = threading.Event(), threading.Event()

    def slow_read(key: str) -> str:
        inside.set()
        assert release.wait(10)
        return "v1"

    cache = ReadCache(slow_read, max_age=30)
    cache._guard = guard = CountingLock()  # taken once per caller that found no fresh value: before its wait
    before = time.time() - 1
    got: list[str] = []
    first = threading.Thread(target=lambda: got.append(cache.get("ns", read_after=before)))
    first.start()
    assert inside.wait(10)
    others = [threading.Thread(target=lambda: got.append(cache.get("ns", read_after=before))) for _ in range(10)]
    for thread in others:
        thread.start()
    wait_until(lambda: guard.taken == 11, timeout=10, what="the ten past their first look, at the read in flight")
    release.set()
    for thread in [first, *others]:
        thread.join(10)
    assert got == ["v1"] * 11
    assert cache.reads == 1


def test_a_creation_is_served_only_by_reads_a_second_and_the_skew_margin_after_it() -> None:
    created = read_after_creation("2026-11-24T08:33:15Z")
    assert created - 1.0 - CLOCK_SKEW_S == pytest.approx(1795509195.0)

"""The resync loop (:mod:`zeps_operator.resync`) on its own: which objects a pass reconciles, and how a
deletion waits for a pass in flight. The reconcile function is the test's own (the operator's is
exercised with a real API server and ZooKeeper in tests/cluster/test_operator.py)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client import REGISTRY

from zeps_operator.resync import Entry, Resync


def _body(name: str, *, rv: str = "1", deleting: bool = False, spec: dict[str, Any] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"namespace": "ns", "name": name, "uid": f"uid-{name}", "generation": 2}
    meta["resourceVersion"] = rv
    if deleting:
        meta["deletionTimestamp"] = "2026-11-24T00:00:00Z"
    return {"kind": "Topic", "metadata": meta, "spec": spec or {"maxQueueDepth": 5}, "status": {"subscribers": 1}}


class Clock:
    """The resync's time: moved by the test, never by waiting."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Recorder:
    def __init__(self) -> None:
        self.passed: list[str] = []
        self.lock = threading.Lock()
        self.hold = threading.Event()
        self.hold.set()
        self.inside = threading.Event()
        self.fail: set[str] = set()

    def __call__(self, entry: Entry) -> None:
        self.inside.set()
        self.hold.wait(10)
        with self.lock:
            self.passed.append(entry.name)
        if entry.name in self.fail:
            raise RuntimeError("boom")


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def resync(recorder: Recorder, clock: Clock) -> Iterator[Resync]:
    """A loop whose thread is not started: the test makes each pass (``pass_once``) at the clock's time."""
    loop = Resync(recorder, interval=10, idle=3, workers=2, clock=clock)
    yield loop
    recorder.hold.set()
    loop.stop()


def test_the_entry_carries_what_a_pass_reads() -> None:
    body = _body("a", rv="42")
    body["status"]["kopf"] = {"last-handled-configuration": "{}"}  # kopf's bookkeeping: not kept
    entry = Entry.of(body, seen=1.0)
    assert entry.key == ("Topic", "ns", "a")
    assert entry.resource_version == "42"
    assert entry.body() == {
        "kind": "Topic",
        "metadata": {"namespace": "ns", "name": "a", "uid": "uid-a", "generation": 2},
        "spec": {"maxQueueDepth": 5},
        "status": {"subscribers": 1},
    }


def test_only_objects_unchanged_for_the_idle_time_are_passed(resync: Resync, recorder: Recorder, clock: Clock) -> None:
    exported = REGISTRY.get_sample_value("zeps_operator_resync_passes_total") or 0.0
    resync.saw(_body("quiet"))
    clock.now += 3
    assert resync.pass_once() == 1 and recorder.passed == ["quiet"]
    assert (
        REGISTRY.get_sample_value("zeps_operator_resync_passes_total") == exported + 1
    )  # what an operator's liveness is seen by
    for _ in range(5):  # changed every second: never idle for 3 s
        resync.saw(_body("busy"))
        clock.now += 1
        resync.pass_once()
    assert "busy" not in recorder.passed
    assert recorder.passed.count("quiet") == 6  # passed again at every pass
    clock.now += 2  # 3 s since its last change
    resync.pass_once()
    assert sorted(recorder.passed[-2:]) == ["busy", "quiet"]  # the busy one too, now idle


def test_an_object_being_deleted_or_gone_is_passed_no_more(resync: Resync, recorder: Recorder, clock: Clock) -> None:
    resync.saw(_body("a"))
    resync.saw(_body("b"))
    clock.now += 3
    assert resync.pass_once() == 2
    resync.saw(_body("a", deleting=True))
    resync.drop("Topic", "ns", "b")
    clock.now += 10
    assert resync.pass_once() == 0
    assert sorted(recorder.passed) == ["a", "b"] and len(resync) == 0


def test_forget_waits_for_the_pass_in_flight(resync: Resync, recorder: Recorder, clock: Clock) -> None:
    recorder.hold.clear()
    resync.saw(_body("slow"))
    clock.now += 3
    passing = threading.Thread(target=resync.pass_once)
    passing.start()
    assert recorder.inside.wait(5)
    forgetting = threading.Thread(target=resync.forget, args=("Topic", "ns", "slow"))
    forgetting.start()
    forgetting.join(0.2)
    assert forgetting.is_alive(), "forget returned while the pass was still reconciling the object"
    recorder.hold.set()  # the pass ends: forget returns
    forgetting.join(10)
    passing.join(10)
    assert not forgetting.is_alive() and recorder.passed == ["slow"]
    clock.now += 10
    assert resync.pass_once() == 0 and recorder.passed == ["slow"]


def test_a_failing_pass_is_logged_and_the_others_go_on(
    resync: Resync, recorder: Recorder, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    recorder.fail.add("bad")
    resync.saw(_body("bad"))
    resync.saw(_body("good"))
    clock.now += 3
    assert resync.pass_once() == 2
    assert resync.pass_once() == 2  # passed again: a failure is not remembered
    assert sorted(recorder.passed) == ["bad", "bad", "good", "good"]
    assert "resync of Topic ns/bad failed" in caplog.text


def test_the_thread_passes_every_interval(recorder: Recorder) -> None:
    """The loop's own thread, on the real clock (interval and idle 0: the first pass comes at once)."""
    loop = Resync(recorder, interval=0.01, idle=0, workers=1).start()
    try:
        loop.saw(_body("a"))
        deadline = time.monotonic() + 10
        while recorder.passed.count("a") < 2:  # two passes: it goes on after the first
            assert time.monotonic() < deadline, "the resync thread made no second pass"
            recorder.inside.wait(0.05)
    finally:
        loop.stop()

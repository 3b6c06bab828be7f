"""The resync loop (:mod:`zeps_operator.resync`) on its own: which objects a pass reconciles, and how a
deletion waits for a pass in flight. The reconcile function is the test's own (the operator's is
exercised with a real API server and ZooKeeper in tests/cluster/test_operator.py)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from zeps_operator.resync import Entry, Resync


def _body(name: str, *, rv: str = "1", deleting: bool = False, spec: dict[str, Any] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"namespace": "ns", "name": name, "uid": f"uid-{name}", "generation": 2}
    meta["resourceVersion"] = rv
    if deleting:
        meta["deletionTimestamp"] = "2026-11-24T00:00:00Z"
    return {"kind": "Topic", "metadata": meta, "spec": spec or {"maxQueueDepth": 5}, "status": {"subscribers": 1}}


def _until(check: Any, what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


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
def resync(recorder: Recorder) -> Iterator[Resync]:
    loop = Resync(recorder, interval=0.1, idle=0.3, workers=2).start()
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


def test_only_objects_unchanged_for_the_idle_time_are_passed(resync: Resync, recorder: Recorder) -> None:
    resync.saw(_body("quiet"))
    _until(lambda: "quiet" in recorder.passed, "the first pass over the quiet object")
    busy_until = time.monotonic() + 1.0
    while time.monotonic() < busy_until:  # changed every 50 ms: never idle for 0.3 s
        resync.saw(_body("busy"))
        time.sleep(0.05)
    assert "busy" not in recorder.passed
    _until(lambda: "busy" in recorder.passed, "the pass once it is idle")
    assert recorder.passed.count("quiet") >= 3  # passed again every interval


def test_an_object_being_deleted_or_gone_is_passed_no_more(resync: Resync, recorder: Recorder) -> None:
    resync.saw(_body("a"))
    resync.saw(_body("b"))
    _until(lambda: {"a", "b"} <= set(recorder.passed), "both passed")
    resync.saw(_body("a", deleting=True))
    resync.drop("Topic", "ns", "b")
    time.sleep(0.1)
    count = len(recorder.passed)
    time.sleep(0.6)
    assert len(recorder.passed) == count
    assert len(resync) == 0


def test_forget_waits_for_the_pass_in_flight(resync: Resync, recorder: Recorder) -> None:
    recorder.hold.clear()
    resync.saw(_body("slow"))
    assert recorder.inside.wait(5)
    released = threading.Timer(0.5, recorder.hold.set)
    released.start()
    started = time.monotonic()
    resync.forget("Topic", "ns", "slow")
    assert time.monotonic() - started >= 0.4  # returned only once the pass had ended
    assert recorder.passed == ["slow"]
    time.sleep(0.6)
    assert recorder.passed == ["slow"]


def test_a_failing_pass_is_logged_and_the_others_go_on(
    resync: Resync, recorder: Recorder, caplog: pytest.LogCaptureFixture
) -> None:
    recorder.fail.add("bad")
    resync.saw(_body("bad"))
    resync.saw(_body("good"))
    _until(lambda: recorder.passed.count("bad") >= 2 and recorder.passed.count("good") >= 2, "two passes of each")
    assert "resync of Topic ns/bad failed" in caplog.text

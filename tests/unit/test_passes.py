"""A ZepsStream's passes (:mod:`zeps_operator.passes`, :func:`zeps_operator.streams.one_pass_at_a_time`):
a timer's pass over the copy the last writing pass read is skipped, for a while at most, and a pass
reads one version of the object however the watch replaces kopf's live body meanwhile. kopf's Body and
Patch are the real ones; no API server is needed (nothing is written)."""

from __future__ import annotations

import threading
from typing import Any

import kopf

from zeps_operator.passes import StreamPasses
from zeps_operator.streams import PASSES, one_pass_at_a_time

KEY = ("ns", "prices")


def test_a_timer_pass_over_the_version_a_writing_pass_read_is_skipped_until_the_hold_ends() -> None:
    passes = StreamPasses(hold=30.0)
    assert passes.begin(KEY, "100", 0.0, timer=False)  # a change's pass over version 100 ...
    passes.wrote(KEY, 1.0)  # ... that wrote
    assert not passes.begin(KEY, "100", 2.0, timer=True)  # the timer still has 100: skipped
    assert passes.begin(KEY, "100", 2.0, timer=False)  # a change's pass is never skipped
    assert passes.begin(KEY, "101", 3.0, timer=True)  # the written version arrived
    assert passes.begin(KEY, "100", 30.9, timer=True) is False  # (had it not: still held)
    assert passes.begin(KEY, "100", 31.0, timer=True)  # the write was refused: the timer runs again


def test_a_pass_that_wrote_nothing_leaves_the_next_timer_pass_alone() -> None:
    passes = StreamPasses(hold=30.0)
    assert passes.begin(KEY, "100", 0.0, timer=True)  # nothing written
    assert passes.begin(KEY, "100", 1.0, timer=True)
    passes.wrote(KEY, 2.0)
    assert not passes.begin(KEY, "100", 3.0, timer=True)
    passes.forget(KEY)  # the stream deleted (and one of its name made again)
    assert passes.begin(KEY, "100", 4.0, timer=True)


def test_the_other_streams_are_not_held() -> None:
    passes = StreamPasses(hold=30.0)
    passes.begin(KEY, "100", 0.0, timer=False)
    passes.wrote(KEY, 0.0)
    assert passes.begin(("ns", "orders"), "100", 1.0, timer=True)
    assert passes.lock(KEY) is passes.lock(KEY) and passes.lock(KEY) is not passes.lock(("ns", "orders"))


def _body(version: str, move: str) -> dict[str, Any]:
    return {"apiVersion": "zeps.dev/v1alpha1", "kind": "ZepsStream",
            "metadata": {"namespace": "ns", "name": "passes-test", "resourceVersion": version,
                         "annotations": {"zeps.dev/move-replica": move}},
            "spec": {"replicas": 3}}  # fmt: skip


def test_the_handler_reads_one_version_and_a_stale_timer_pass_never_runs() -> None:
    """What the operator's stream handler goes through: a change's pass writes (a status), the timer
    then fires while kopf's live body is still the version that pass read (skipped); the watch
    replaces the body while a pass runs (the pass keeps the version it began with)."""
    raw = _body("7", "passes-test-broker-1")
    live = kopf.Body(raw)  # kopf's live view of the object
    seen: list[tuple[str, str]] = []

    @one_pass_at_a_time
    def handler(body: kopf.Body, spec: kopf.Spec, patch: kopf.Patch, **_: Any) -> str:
        raw["metadata"] = {**raw["metadata"], "resourceVersion": "8", "annotations": {}}  # the watch, meanwhile
        seen.append((body["metadata"]["resourceVersion"], body["metadata"]["annotations"].get("zeps.dev/move-replica")))
        assert spec["replicas"] == 3
        patch.status["move"] = {"replica": "passes-test-broker-1", "phase": "adding"}
        return "ran"

    PASSES.forget(("ns", "passes-test"))
    try:
        assert handler(body=live, spec=live.spec, patch=kopf.Patch(), reason="update") == "ran"
        assert seen == [("7", "passes-test-broker-1")]  # the version it began with, whole
        raw["metadata"] = {**raw["metadata"], "resourceVersion": "7"}  # as if the watch lagged behind
        assert handler(body=live, spec=live.spec, patch=kopf.Patch()) is None  # the timer: skipped
        raw["metadata"]["resourceVersion"] = "8"
        assert handler(body=live, spec=live.spec, patch=kopf.Patch()) == "ran"
        assert seen[1:] == [("8", None)]
    finally:
        PASSES.forget(("ns", "passes-test"))


def test_a_resume_that_wrote_nothing_does_not_hold_the_timer() -> None:
    """The operator's start resumes every stream: a pass that changes nothing writes nothing (kopf
    records no change it handled), so the timer's next pass over the same version runs."""
    live = kopf.Body(_body("12", "x"))
    runs: list[str | None] = []

    @one_pass_at_a_time
    def handler(**kwargs: Any) -> None:
        runs.append(kwargs.get("reason"))

    PASSES.forget(("ns", "passes-test"))
    try:
        handler(body=live, spec=live.spec, patch=kopf.Patch(), reason="resume")
        handler(body=live, spec=live.spec, patch=kopf.Patch())  # the timer, the same version
        handler(body=live, spec=live.spec, patch=kopf.Patch(), reason="update")  # kopf records it: a write
        handler(body=live, spec=live.spec, patch=kopf.Patch())  # skipped
        assert runs == ["resume", None, "update"]
    finally:
        PASSES.forget(("ns", "passes-test"))


def test_passes_over_one_stream_never_overlap() -> None:
    """Two workers take the stream's timer and a change at once: the second waits for the first."""
    live = kopf.Body(_body("9", "x"))
    inside, overlapped = threading.Semaphore(1), []

    @one_pass_at_a_time
    def handler(**_: Any) -> None:
        if not inside.acquire(blocking=False):
            overlapped.append(True)
            return
        threading.Event().wait(0.05)
        inside.release()

    PASSES.forget(("ns", "passes-test"))
    try:
        threads = [threading.Thread(target=handler, kwargs={"body": live, "spec": live.spec, "patch": kopf.Patch(),
                                                             "reason": "update"}) for _ in range(4)]  # fmt: skip
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(10)
        assert not overlapped
    finally:
        PASSES.forget(("ns", "passes-test"))

"""The operator's fair turns between namespaces (zeps_operator.fairness), on real threads: the order
in which work runs is observed, never timed."""

from __future__ import annotations

import asyncio
import contextvars
import threading
from typing import Any

import pytest
from kopf._core.actions.invocation import is_async_fn
from kopf._core.intents.registries import get_callable_id

from zeps_operator.fairness import FairExecutor, fair

_CALLER: contextvars.ContextVar[str] = contextvars.ContextVar("caller", default="nobody")


def _blocked(executor: FairExecutor, key: str, ran: list[str]) -> threading.Event:
    """An item of ``key`` that holds the executor's one worker until the returned event is set."""
    started, release = threading.Event(), threading.Event()

    def hold() -> None:
        ran.append(f"{key}-hold")
        started.set()
        release.wait(30)

    executor.submit(key, hold)
    assert started.wait(30)
    return release


def test_a_namespace_with_one_item_waits_for_one_item_of_a_busy_one_not_its_backlog() -> None:
    executor, ran = FairExecutor(1), list[str]()
    try:
        release = _blocked(executor, "busy", ran)
        done = [executor.submit("busy", lambda i=i: ran.append(f"busy-{i}")) for i in range(50)]
        done.append(executor.submit("quiet", lambda: ran.append("quiet")))
        done += [executor.submit("other", lambda i=i: ran.append(f"other-{i}")) for i in range(2)]
        assert executor.waiting() == {"busy": 50, "quiet": 1, "other": 2}
        release.set()
        for future in done:
            future.result(30)
    finally:
        executor.stop()
    assert ran[:6] == ["busy-hold", "busy-0", "quiet", "other-0", "busy-1", "other-1"]
    assert ran[6:] == [f"busy-{i}" for i in range(2, 50)]  # alone now: it gets every turn
    assert executor.waiting() == {}


def test_results_and_errors_reach_the_awaiting_handler() -> None:
    executor = FairExecutor(2)

    def fails() -> None:
        raise ValueError("bad spec")

    async def both() -> tuple[int, BaseException | None]:
        value = await executor.run("ns", lambda: 42)
        try:
            await executor.run("ns", fails)
        except ValueError as exc:
            return value, exc
        return value, None

    try:
        value, error = asyncio.run(both())
    finally:
        executor.stop()
    assert value == 42 and isinstance(error, ValueError) and str(error) == "bad spec"


def test_a_handler_cancelled_before_its_turn_never_runs() -> None:
    executor, ran = FairExecutor(1), list[str]()

    async def cancel_waiting() -> None:
        waiting = asyncio.ensure_future(executor.run("b", lambda: ran.append("cancelled one")))
        while not executor.waiting():
            await asyncio.sleep(0)  # yields to the loop only: until the item is queued
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting

    try:
        release = _blocked(executor, "a", ran)
        asyncio.run(cancel_waiting())
        release.set()
        executor.submit("a", lambda: ran.append("after")).result(30)
    finally:
        executor.stop()
    assert ran == ["a-hold", "after"]


def test_a_handler_cancelled_while_it_runs_is_waited_for_before_the_cancellation_returns() -> None:
    executor, ran = FairExecutor(1), list[str]()
    started, release = threading.Event(), threading.Event()

    def slow() -> None:
        started.set()
        release.wait(30)
        ran.append("slow ended")

    async def cancel_running() -> None:
        running = asyncio.ensure_future(executor.run("a", slow))
        assert await asyncio.to_thread(started.wait, 30)
        running.cancel()
        for _ in range(10):  # turns of the loop: the cancellation reaches run(), which must wait
            await asyncio.sleep(0)  # a turn of the loop, no time
        assert not running.done(), "the cancellation returned while the handler still ran"
        release.set()
        with pytest.raises(asyncio.CancelledError):
            await running
        assert ran == ["slow ended"]

    try:
        asyncio.run(cancel_running())
    finally:
        executor.stop()


def test_a_fair_handler_is_a_coroutine_to_kopf_with_the_same_id() -> None:
    executor = FairExecutor(1)
    seen: list[tuple[str, Any, str]] = []

    def topic_changed(body: Any, spec: Any, **_: Any) -> str:
        seen.append((threading.current_thread().name, spec, _CALLER.get()))  # kopf.info() reads context
        return "ok"

    async def as_kopf_calls_it() -> str:
        _CALLER.set("kopf's task")
        return await handler(body={"metadata": {"namespace": "a"}}, spec={"x": 1}, patch={})

    handler = fair(lambda: executor)(topic_changed)
    try:
        assert is_async_fn(handler) and get_callable_id(handler) == get_callable_id(topic_changed)
        result = asyncio.run(as_kopf_calls_it())
    finally:
        executor.stop()
    assert result == "ok" and seen == [("zeps-fair-0", {"x": 1}, "kopf's task")]


def test_a_stopped_executor_takes_no_more_work() -> None:
    executor = FairExecutor(1)
    executor.stop()
    with pytest.raises(RuntimeError, match="stopped"):
        executor.submit("a", lambda: None)
    with pytest.raises(ValueError, match="at least 1"):
        FairExecutor(0)

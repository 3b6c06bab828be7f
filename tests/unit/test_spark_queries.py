"""zeps.spark.start_query around Spark's query start-up.

The query is a stand-in here: the window it reproduces (Spark's query thread sets the status message
"Terminated with exception: ..." a moment before it marks the query inactive) is too short to catch
on purpose with a real Spark; a CI run of the Spark source tests met it once. The real retry, with a
real Spark and a planner made late, is tests/integration/test_spark_source.py's."""

from __future__ import annotations

from typing import Any

import pytest

from zeps.spark.queries import WORKER_DID_NOT_CONNECT, start_query


class _Query:
    """Spark's status messages in the order StreamExecution.runStream sets them, one per poll; the last
    is held. ``error``: the query ends with it, and stays active ``lag`` polls after saying so."""

    def __init__(self, messages: list[str], error: str | None = None, lag: int = 0) -> None:
        self.messages, self.error, self.lag = messages, error, lag
        self.polls = 0

    @property
    def status(self) -> dict[str, Any]:
        self.polls += 1
        return {"message": self.messages[min(self.polls - 1, len(self.messages) - 1)]}

    @property
    def isActive(self) -> bool:  # noqa: N802 — Spark's name
        ended = self.error is not None and self.polls >= len(self.messages) + self.lag
        return not ended

    def exception(self) -> Exception | None:
        return RuntimeError(self.error) if self.error is not None else None

    def stop(self) -> None:
        self.error = self.error or "stopped"


def test_a_query_that_fails_while_it_says_so_but_is_still_active_is_started_again() -> None:
    failing = _Query(["Initializing StreamExecution", "Initializing sources",
                      f"Terminated with exception: {WORKER_DID_NOT_CONNECT}"],
                     error=WORKER_DID_NOT_CONNECT, lag=3)  # fmt: skip
    healthy = _Query(["Initializing sources", "Waiting for data to arrive"])
    queries = iter([failing, healthy])
    assert start_query(lambda: next(queries), attempts=2, poll=0) is healthy


def test_a_query_that_fails_otherwise_raises_its_error_even_in_that_window() -> None:
    failing = _Query(["Initializing sources", "Terminated with exception: bad option"], error="bad option", lag=3)
    with pytest.raises(RuntimeError, match="bad option"):
        start_query(lambda: failing, attempts=3, poll=0)

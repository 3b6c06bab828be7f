"""An executor's read of one input partition, (start, end] of a stream, yields exactly those
sequences whatever the broker sends.

The broker is a stand-in here (a client object handing out prepared runs): what it stands for, a
broker that sends records before the range (an older broker delivered a replay asked from past its
durable tail from the tail on: a follower that had not learned the commit point yet), can no longer
be run. The real read against real brokers is tests/integration/test_spark_replication.py's."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from zeps._records import Records, encode_record
from zeps.config import Resolved
from zeps.spark import source
from zeps.spark.source import _Range, _StreamRead


def _run(first: int, last: int) -> Records:
    return Records(b"".join(encode_record(s, 1000 + s, b"k", b"%d" % s) for s in range(first, last + 1)))


class _Broker:
    """A StreamClient that hands out ``runs`` (one per receive) whatever it was asked."""

    def __init__(self, runs: list[Records]) -> None:
        self.runs = runs

    def __enter__(self) -> _Broker:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def start(self, pattern: str, *, since: Any) -> None:
        return None  # it sends what it holds, whatever was asked

    def receive_records(self, timeout: float) -> list[Records]:
        return [self.runs.pop(0)] if self.runs else []


@pytest.fixture
def broker(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Records]]:
    runs: list[Records] = []
    monkeypatch.setattr(source.StreamClient, "of", staticmethod(lambda *a, **k: _Broker(runs)))
    yield runs


@pytest.mark.parametrize(
    "runs",
    [[(1, 5), (6, 10)], [(3, 8), (9, 12)], [(1, 2), (3, 7), (6, 11)]],
    ids=["a run before the range", "a run across its start", "runs again after a resume"],
)
def test_a_range_yields_its_sequences_once_whatever_the_broker_sends(
    broker: list[Records], runs: list[tuple[int, int]]
) -> None:
    broker += [_run(first, last) for first, last in runs]
    reader = _StreamRead(Resolved(kind="ZepsStream", name="prices", namespace="spark", endpoint="tcp://x:1"), {})
    read = [s for batch in reader.read_range(_Range(5, 10)) for s in batch.column(0).to_pylist()]
    assert read == [6, 7, 8, 9, 10]

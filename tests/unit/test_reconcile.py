"""The multicast subscription's reconciliation (``zeps.client.reconcile.Reconciler``) without sockets:
runs and TAILs from the group and fetch results are fed by hand, with a fake clock; the output must
hold each record once, in sequence order, whatever order, loss or duplication the inputs had."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zeps._records import Records, encode_record
from zeps.client import Seq
from zeps.client.reconcile import Reconciler
from zeps.errors import ConfigError, DataLossError
from zeps.protocol import LATEST, Fetch


def _key(seq: int) -> str:
    return f"{'eu' if seq % 3 else 'us'}.{seq}"


def _run(first: int, last: int) -> Records:
    return Records(b"".join(encode_record(s, 1000 + s, _key(s).encode(), b"b%d" % s) for s in range(first, last + 1)))


def _rows(first: int, last: int, prefix: str = "") -> list[tuple[int, str, bytes, int]]:
    return [r for r in _run(first, last).rows() if r[1].startswith(prefix)]


def _answer(rec: Reconciler, fetch: Fetch, tail: int, prefix: str = "", retained: int = 1) -> None:
    """What a broker whose journal holds ``retained`` .. ``tail`` answers to ``fetch``."""
    last = tail if fetch.last == LATEST else min(fetch.last, tail)
    first = max(fetch.first, retained) if fetch.first != LATEST else tail + 1
    if first <= last:
        rec.on_fetched(_rows(first, last, prefix))
    rec.on_fetch_end(first if first <= last else last + 1, last)


def test_history_then_the_group_from_where_history_ended() -> None:
    rec = Reconciler("", Seq(0), stall=1.0)
    assert rec.start(now=0.0) == Fetch(pattern="", first=1)
    rec.on_run(_run(11, 12), now=0.1)  # the group runs ahead while history is fetched: it waits
    _answer(rec, Fetch(pattern="", first=1), tail=10)
    assert [r[0] for r in rec.output] == list(range(1, 13))
    rec.on_run(_run(12, 14), now=0.2)  # overlaps what went out: only 13 and 14 are new
    assert [r[0] for r in rec.output][-3:] == [12, 13, 14] and rec.stats.duplicates == 1
    assert rec.poll(now=0.3) is None


def test_a_jump_in_the_group_is_fetched_and_the_runs_behind_it_wait() -> None:
    rec = Reconciler("eu.", "latest", stall=1.0)
    rec.start(now=0.0)
    _answer(rec, Fetch(pattern="eu.", first=LATEST), tail=5, prefix="eu.")
    assert rec.next == 6 and not rec.output
    rec.on_run(_run(6, 8), now=0.1)
    rec.on_run(_run(12, 13), now=0.1)  # 9..11 lost on the way
    fetch = rec.poll(now=0.1)
    assert fetch == Fetch(pattern="eu.", first=9, last=11) and rec.poll(now=0.1) is None  # one at a time
    rec.on_run(_run(14, 14), now=0.2)  # meanwhile the group goes on: it waits
    _answer(rec, fetch, tail=14, prefix="eu.")
    assert [r[0] for r in rec.output] == [s for s in range(6, 15) if _key(s).startswith("eu.")]
    assert rec.stats.gaps == 1 and rec.stats.gap_ranges == [(9, 11)]


def test_a_tail_beyond_the_output_is_a_gap_even_when_nothing_follows() -> None:
    rec = Reconciler("", Seq(0), stall=5.0)
    _answer(rec, rec.start(now=0.0), tail=3)
    rec.on_run(_run(4, 4), now=0.1)
    rec.on_tail(6, now=0.5)  # 5 and 6 were sent and lost; nothing else comes
    fetch = rec.poll(now=0.5)
    assert fetch == Fetch(pattern="", first=5, last=6)
    _answer(rec, fetch, tail=6)
    assert [r[0] for r in rec.output] == [1, 2, 3, 4, 5, 6]


def test_a_silent_group_is_caught_up_by_fetching_each_stall() -> None:
    rec = Reconciler("", Seq(0), stall=1.0)
    _answer(rec, rec.start(now=0.0), tail=2)
    assert rec.poll(now=0.9) is None
    fetch = rec.poll(now=1.0)
    assert fetch == Fetch(pattern="", first=3, last=LATEST)
    _answer(rec, fetch, tail=7)
    assert rec.poll(now=1.5) is None and rec.poll(now=2.0) == Fetch(pattern="", first=8, last=LATEST)
    assert [r[0] for r in rec.output] == list(range(1, 8))


def test_records_retention_removed_before_a_gap_was_fetched_raise_data_loss() -> None:
    rec = Reconciler("", Seq(0), stall=5.0)
    _answer(rec, rec.start(now=0.0), tail=3)
    rec.on_run(_run(10, 11), now=0.1)
    fetch = rec.poll(now=0.1)
    assert fetch == Fetch(pattern="", first=4, last=9)
    with pytest.raises(DataLossError, match=r"records 4\.\.6 of the stream were removed by retention"):
        _answer(rec, fetch, tail=11, retained=7)


def test_history_starts_at_the_oldest_retained_as_subscribe_does() -> None:
    rec = Reconciler("", Seq(0), stall=5.0)
    _answer(rec, rec.start(now=0.0), tail=9, retained=5)
    assert [r[0] for r in rec.output] == [5, 6, 7, 8, 9]


def test_waiting_runs_are_bounded_and_what_is_let_go_is_fetched_later() -> None:
    run = _run(2, 2)
    rec = Reconciler("", Seq(0), stall=5.0, max_waiting_bytes=len(run.data))
    fetch = rec.start(now=0.0)
    rec.on_run(run, now=0.0)
    rec.on_run(_run(3, 3), now=0.0)  # over the bound: let go
    _answer(rec, fetch, tail=1)
    assert rec.stats.let_go == 1 and [r[0] for r in rec.output] == [1, 2]
    rec.on_run(_run(4, 4), now=0.1)
    gap = rec.poll(now=0.1)
    assert gap == Fetch(pattern="", first=3, last=3)
    _answer(rec, gap, tail=4)
    assert [r[0] for r in rec.output] == [1, 2, 3, 4]


def test_a_regex_pattern_is_refused_with_the_fix() -> None:
    with pytest.raises(ConfigError, match="takes a key prefix"):
        Reconciler("~^eu", "latest", stall=1.0)


@settings(max_examples=200)
@given(st.integers(0, 2**32), st.sampled_from(["", "eu.", "us."]))
def test_any_loss_reordering_and_duplication_of_the_group_still_gives_each_record_once_in_order(
    seed: int, prefix: str
) -> None:
    """A random stream of 60 records in runs; the group loses, repeats and reorders some runs and
    TAILs; history starts at a random point; fetches answer from the full journal."""
    rng = random.Random(seed)
    total, history_tail = 60, rng.randint(0, 20)
    runs, at = [], history_tail + 1
    while at <= total:
        end = min(total, at + rng.randint(0, 4))
        runs.append((at, end))
        at = end + 1
    sent = [r for r in runs if rng.random() > 0.3]  # lost
    sent += [r for r in runs if rng.random() < 0.1]  # repeated
    rng.shuffle(sent)
    rec = Reconciler(prefix, Seq(0), stall=1.0)
    fetch: Fetch | None = rec.start(now=0.0)
    pre = [sent.pop() for _ in range(min(len(sent), rng.randint(0, 3)))]  # arrive during history
    for first, last in pre:
        rec.on_run(_run(first, last), now=0.0)
    clock, known_tail = 0.0, history_tail
    events = [("run", r) for r in sent] + [("tail", (total, total))]
    for kind, (first, last) in events:
        if fetch is not None:
            _answer(rec, fetch, tail=known_tail, prefix=prefix)
        clock += 0.01
        known_tail = max(known_tail, last)
        if kind == "run":
            rec.on_run(_run(first, last), now=clock)
        else:
            rec.on_tail(last, now=clock)
        fetch = rec.poll(now=clock)
    for _ in range(100):
        if fetch is not None:
            _answer(rec, fetch, tail=total, prefix=prefix)
        clock += 0.5
        fetch = rec.poll(now=clock)
        if rec.next == total + 1 and fetch is None:
            break
    assert [r[0] for r in rec.output] == [s for s in range(1, total + 1) if _key(s).startswith(prefix)]

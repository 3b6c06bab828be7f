"""Idempotent producers: the table's rules, and the table kept in the journal as producer marks (a real
filesystem): rebuilt at open, all-or-nothing groups, snapshots that survive retention, marks never read
out as records."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zeps.journal import Journal, JournalConfig, Record
from zeps.journal.producers import (
    GROUP,
    SNAPSHOT,
    Producer,
    ProducerRefusedError,
    ProducerTable,
    decode_mark,
    encode_mark_body,
)

HOUR = 3600 * 1000


def _table(ttl_ms: int = HOUR, max_producers: int = 100) -> ProducerTable:
    return ProducerTable(ttl_ms=ttl_ms, max_producers=max_producers)


def _journal(path: Path, **config: object) -> Journal:
    return Journal(path, JournalConfig(**config), name="test").open()  # type: ignore[arg-type]


def _all(j: Journal) -> list[Record]:
    out, seq = [], j.first_sequence
    while batch := j.read(seq, max_records=100):
        out += batch
        seq = batch[-1].sequence + 1
    return out


def _publish(j: Journal, name: str, epoch: int, first: int, bodies: list[bytes], *, now_ms: int = 0) -> int:
    """What the broker does with a PUBLISH-BATCH-SEQ: admit, drop what is held, append the rest with
    the producer's change."""
    held = j.producers.admit(name, epoch, first, len(bodies), now_ms or _now())
    if held < len(bodies):
        j.append_many([("k", b) for b in bodies[held:]], changes={name: j.producers.producers[name].frozen()})
    return held


def _claim(j: Journal, name: str, epoch: int = 0) -> Producer:
    """What the broker does with a PRODUCE: claim, and journal the change (a mark with no record)."""
    producer, changed = j.producers.claim(name, epoch, _now())
    if changed:
        j.append_many([], changes={name: producer})
    return producer


def _now() -> int:
    import time  # noqa: PLC0415

    return int(time.time() * 1000)


def test_a_producer_s_sequences_are_held_once() -> None:
    t = _table()
    assert t.claim("p", 0, now_ms=1) == (Producer(epoch=1, sequence=0, seen_ms=1), True)
    assert t.admit("p", 1, first=1, count=500, now_ms=2) == 0  # all new
    assert t.admit("p", 1, first=1, count=500, now_ms=3) == 500  # all held: a resend
    assert t.admit("p", 1, first=400, count=201, now_ms=4) == 101  # 400..500 held, 501..600 new
    assert t.producers["p"].sequence == 600
    with pytest.raises(ProducerRefusedError, match=r"sent sequence 700, but the broker holds up to 600: publishes "
                       r"601\.\.699 never reached it") as refused:  # fmt: skip
        t.admit("p", 1, first=700, count=1, now_ms=5)
    assert refused.value.reason == "out-of-sequence"
    assert t.producers["p"].sequence == 600  # a refused publish changes nothing


def test_a_fresh_claim_fences_the_older_client_and_continues_the_sequence() -> None:
    t = _table()
    t.claim("p", 0, now_ms=1)
    t.admit("p", 1, 1, 10, now_ms=2)
    assert t.claim("p", 0, now_ms=3) == (Producer(epoch=2, sequence=10, seen_ms=3), True)  # a restarted process
    with pytest.raises(ProducerRefusedError, match=r"epoch 1 is fenced: a newer client claimed the name \(epoch 2\)"):
        t.admit("p", 1, 11, 1, now_ms=4)
    with pytest.raises(ProducerRefusedError, match="fenced") as refused:
        t.claim("p", 1, now_ms=4)  # the older client reconnecting
    assert refused.value.reason == "fenced"
    assert t.claim("p", 2, now_ms=5) == (Producer(epoch=2, sequence=10, seen_ms=5), False)  # it resumes: no change
    assert t.admit("p", 2, 11, 1, now_ms=6) == 0


def test_generations_let_a_retried_unit_of_work_skip_what_its_first_attempt_wrote() -> None:
    """A Spark sink's producer per (query, partition), its generation the micro-batch: a new
    generation starts after the producer's sequence; a retry of one learns how much of it is held."""
    t = _table()
    assert t.claim("q-p0", 0, now_ms=1, generation=1) == (Producer(1, 0, 1, generation=1, base=0), True)
    t.admit("q-p0", 1, 1, 100, now_ms=2)  # batch 0: rows 1..100, all held
    first, _ = t.claim("q-p0", 0, now_ms=3, generation=2)  # batch 1, first attempt
    assert (first.epoch, first.sequence, first.base) == (2, 100, 100)  # nothing of it held yet
    t.admit("q-p0", 2, 101, 30, now_ms=4)  # 30 of its rows reached the broker, then the task died
    retry, _ = t.claim("q-p0", 0, now_ms=5, generation=2)
    assert (retry.epoch, retry.sequence - retry.base) == (3, 30)  # skip 30 rows, go on at 131
    with pytest.raises(ProducerRefusedError, match="generation 1 is fenced: the producer has gone on to generation 2"):
        t.claim("q-p0", 0, now_ms=6, generation=1)  # a zombie of an older micro-batch
    with pytest.raises(ProducerRefusedError, match="fenced"):
        t.admit("q-p0", 2, 131, 1, now_ms=6)  # the first attempt, still alive: fenced by the retry's epoch
    assert t.claim("q-p0", 0, now_ms=7)[0].generation == 2  # generation 0: left as it is


def test_idle_producers_expire_and_a_stale_one_gets_a_clear_error() -> None:
    t = _table(ttl_ms=1000)
    t.claim("old", 0, now_ms=0)
    t.claim("young", 0, now_ms=1500)
    assert t.expire(now_ms=2000) == ["old"]
    with pytest.raises(ProducerRefusedError, match=r"'old' \(epoch 1\) is not known to this broker: it was idle "
                       r"longer than 1s and expired") as refused:  # fmt: skip
        t.claim("old", 1, now_ms=2100)
    assert refused.value.reason == "unknown"
    with pytest.raises(ProducerRefusedError, match="expired"):
        t.admit("old", 1, 1, 1, now_ms=2100)
    assert t.claim("old", 0, now_ms=2100)[0].epoch == 1  # claimed afresh: a new producer


def test_the_table_is_bounded_and_makes_room_by_expiry() -> None:
    t = _table(ttl_ms=1000, max_producers=2)
    t.claim("a", 0, now_ms=0)
    t.claim("b", 0, now_ms=900)
    with pytest.raises(ProducerRefusedError, match="holds 2 producers for this stream, its limit") as refused:
        t.claim("c", 0, now_ms=950)
    assert refused.value.reason == "full"
    t.claim("c", 0, now_ms=1500)  # "a" expired meanwhile
    assert sorted(t.producers) == ["b", "c"]


@given(st.dictionaries(st.text("abcxyz-._0123456789", min_size=1, max_size=20),
                       st.builds(Producer, st.integers(0, 2**32 - 1), st.integers(0, 2**64 - 1),
                                 st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1)),
                       max_size=20),
       st.sampled_from([GROUP, SNAPSHOT]), st.integers(0, 2**32 - 1))  # fmt: skip
def test_marks_round_trip(producers: dict[str, Producer], kind: int, follows: int) -> None:
    assert decode_mark(encode_mark_body(kind, follows, producers)) == (kind, follows, producers)


def test_the_table_is_rebuilt_from_the_journal(tmp_path: Path) -> None:
    j = _journal(tmp_path, fsync="always")
    _claim(j, "p")
    assert _publish(j, "p", 1, 1, [b"a", b"b", b"c"]) == 0
    _claim(j, "q")  # a claim alone is journaled too (a mark with no records)
    j.append_many([("plain", b"x")])  # a publish of a version-5 client: no mark
    j.close()
    again = _journal(tmp_path, fsync="always")
    assert {n: (p.epoch, p.sequence) for n, p in again.producers.producers.items()} == {"p": (1, 3), "q": (1, 0)}
    assert _publish(again, "p", 1, 1, [b"a", b"b", b"c", b"d"]) == 3  # only "d" is new after the restart
    assert [r.body for r in _all(again)] == [b"a", b"b", b"c", b"x", b"d"]
    assert [r.sequence for r in _all(again)] == [1, 2, 3, 4, 5]  # marks take no sequence


def test_a_group_that_did_not_reach_the_disk_whole_is_dropped_mark_included(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A machine crash tore the last append: its records after the tear are gone, and so are the ones
    before it and its group mark — else the table would say "held" of records lost, or the records
    would be held without the table knowing (a resend would store them twice)."""
    j = _journal(tmp_path, fsync="always")
    _claim(j, "p")
    _publish(j, "p", 1, 1, [b"1", b"2"])
    _publish(j, "p", 1, 3, [b"3", b"4", b"5"])
    j.close()
    segment = next(tmp_path.glob("*.log"))
    segment.write_bytes(segment.read_bytes()[:-3])  # the last record torn
    with caplog.at_level(logging.WARNING):
        again = _journal(tmp_path, fsync="always")
    assert "truncating" in caplog.text
    assert [r.body for r in _all(again)] == [b"1", b"2"]
    assert again.producers.producers["p"].sequence == 2
    assert _publish(again, "p", 1, 3, [b"3", b"4", b"5"]) == 0  # the resend is stored, once
    assert [r.body for r in _all(again)] == [b"1", b"2", b"3", b"4", b"5"]


def test_the_table_survives_retention_removing_the_segments_that_held_it(tmp_path: Path) -> None:
    j = _journal(tmp_path, segment_bytes=400, fsync="always", retention_bytes=900)
    now = _now()
    _claim(j, "early")
    _publish(j, "early", 1, 1, [b"e" * 50] * 3, now_ms=now)
    _claim(j, "busy")
    for n in range(30):  # another producer rolls many segments
        _publish(j, "busy", 1, n + 1, [b"b" * 50], now_ms=now)
        j.apply_retention()
    assert j.first_sequence > 4  # the segment with "early"'s records and marks is gone
    j.close()
    again = _journal(tmp_path, segment_bytes=400, retention_bytes=900, tail_cache_bytes=0)
    assert {n: p.sequence for n, p in again.producers.producers.items()} == {"early": 3, "busy": 30}
    assert _publish(again, "early", 1, 1, [b"e" * 50] * 3) == 3


@settings(max_examples=30, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.sampled_from(["p", "q", None]), st.integers(0, 6), st.integers(1, 120)), max_size=40),
       st.integers(150, 2000))  # fmt: skip
def test_reads_from_disk_never_show_marks_and_equal_the_tail_cache(
    tmp_path_factory: pytest.TempPathFactory, appends: list[tuple[str | None, int, int]], segment_bytes: int
) -> None:
    """Appends of idempotent producers (``p``, ``q``: a group mark each) and of plain ones (None), some
    with no records at all, across segment rolls: every read, from the tail cache or from disk, before
    and after a reopen, is the records alone with their sequences contiguous."""
    path = tmp_path_factory.mktemp("j")
    j = _journal(path, segment_bytes=segment_bytes, fsync="always")
    sequences: dict[str, int] = {}
    expected: list[tuple[int, bytes]] = []
    for producer, count, size in appends:
        bodies = [bytes([65 + len(expected) % 26]) * size for _ in range(count)]
        if producer is None:
            j.append_many([("k", b) for b in bodies])
        else:
            if producer not in sequences:
                _claim(j, producer)
                sequences[producer] = 0
            if count:
                _publish(j, producer, 1, sequences[producer] + 1, bodies)
            sequences[producer] += count
        expected += [(len(expected) + 1 + i, b) for i, b in enumerate(bodies)]
    cached = _all(j)
    j.close()
    cold = _journal(path, segment_bytes=segment_bytes, tail_cache_bytes=0)
    for records in (cached, _all(cold)):
        assert [(r.sequence, r.body) for r in records] == expected
    assert {n: p.sequence for n, p in cold.producers.producers.items()} == sequences
    cold.close()


def test_a_group_is_never_split_across_segments_and_segments_stay_near_their_size(tmp_path: Path) -> None:
    """A segment three quarters full is closed before a group; a group of a quarter segment (as the
    broker cuts them) therefore never makes a segment more than a group larger than asked."""
    j = _journal(tmp_path, segment_bytes=4000, fsync="always")
    _claim(j, "p")
    for n in range(100):
        _publish(j, "p", 1, n * 10 + 1, [b"x" * 60] * 10)  # ~1,000 bytes: a quarter segment
    j.close()
    sizes = [p.stat().st_size for p in sorted(tmp_path.glob("*.log"))]
    assert len(sizes) > 20 and max(sizes) <= 4000 + 1100, sizes
    again = _journal(tmp_path, fsync="always", tail_cache_bytes=0)
    assert [r.sequence for r in _all(again)] == list(range(1, 1001))
    assert again.producers.producers["p"].sequence == 1000

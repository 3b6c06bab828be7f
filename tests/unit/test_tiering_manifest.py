"""The tier manifest as pure data: entries written by anyone refused unless in shape, which run to
upload next (never above the commit point, never the active segment), how far the store holds every
record, what total retention deletes; and the journal's side: its closed segments, their records
without producer marks, and local retention that waits for the store."""

from __future__ import annotations

import itertools
import json
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from zeps._records import walk
from zeps.broker.tiering import Offer, Tiering, TierRounds
from zeps.journal import ClosedSegment, Journal, JournalConfig, JournalError
from zeps.journal.producers import Producer
from zeps.journal.segments import read_records
from zeps.paths import StreamPaths
from zeps.tiering.manifest import (
    State,
    TierEntry,
    current,
    decode_entry,
    encode_entry,
    expired,
    next_upload,
    node_name,
    object_key,
    superseded,
    tiered_to,
)


def _entry(first: int, last: int, state: State = State.COPY_FINISHED, *, ts: int = 0, size: int = 100) -> TierEntry:
    return TierEntry(first, last, 3, object_key(first, last, 3, "0123456789abcdef"), state, ts, ts, size,
                     "s3://b/p/x.batch#crc32c=00000000" if state == State.COPY_FINISHED else "")  # fmt: skip


def _segment(first: int, last: int, *, ts: int = 0, size: int = 100) -> ClosedSegment:
    return ClosedSegment(first, last, ts, size, Path(f"/nowhere/{first:020d}.log"))


def test_an_entry_reads_back_as_written() -> None:
    entry = _entry(5, 9, ts=1234)
    assert decode_entry(encode_entry(entry)) == entry
    started = _entry(10, 12, State.COPY_STARTED)
    assert decode_entry(encode_entry(started)) == started
    compacted = replace(entry, generation=2, records=3)
    assert decode_entry(encode_entry(compacted)) == compacted and compacted.count == 3
    emptied = replace(entry, generation=1, records=0)
    assert decode_entry(encode_entry(emptied)).count == 0
    assert b"generation" not in encode_entry(entry), "a run never compacted is written as before"
    assert (node_name(entry), node_name(compacted)) == ("00000000000000000005", "00000000000000000005.2")


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"first": -1}, "first must be a whole number"),
        ({"last": "9"}, "last must be a whole number"),
        ({"first": 9, "last": 5}, "are not a run"),
        ({"key": "../../etc/passwd"}, "is not an object name"),
        ({"key": object_key(1, 2, 3, "0123456789abcdef")}, "does not name the run"),
        ({"state": "copied"}, "state 'copied' is not one of"),
        ({"reference": ""}, "names its object's reference"),
        ({"epoch": 1.5}, "epoch must be a whole number"),
        ({"generation": -1}, "generation must be a whole number"),
        ({"records": 6}, "records must be a whole number from 0 to 5"),
        ({"records": "2"}, "records must be a whole number"),
    ],
)
def test_a_node_out_of_shape_is_refused_saying_why(change: dict[str, object], says: str) -> None:
    raw = json.loads(encode_entry(_entry(5, 9)))
    raw.update(change)
    with pytest.raises(ValueError, match=says):
        decode_entry(json.dumps(raw).encode())


def test_a_huge_or_deep_node_is_refused_unparsed() -> None:
    with pytest.raises(ValueError, match="more than 4096"):
        decode_entry(b" " * 5000)
    with pytest.raises(ValueError, match="nested deeper"):
        decode_entry(b"[" * 40 + b"]" * 40)
    with pytest.raises(ValueError, match="not a JSON object"):
        decode_entry(b"[1, 2]")


def test_the_store_holds_every_record_up_to_the_end_of_the_finished_run_from_the_lowest() -> None:
    assert tiered_to([]) == 0
    finished = [_entry(1, 10), _entry(11, 20), _entry(31, 40)]
    assert tiered_to(finished) == 20, "a gap (21..30 missing) ends it"
    assert tiered_to([*finished, _entry(21, 30, State.COPY_STARTED)]) == 20, "a copy not finished does not count"
    assert tiered_to([*finished, _entry(21, 30)]) == 40


def test_readers_read_each_run_s_newest_finished_generation_and_the_older_ones_are_superseded() -> None:
    old, new, started = (
        _entry(11, 20),
        replace(_entry(11, 20), generation=1, records=4),
        replace(_entry(11, 20), generation=2, state=State.COPY_STARTED, reference=""),
    )
    entries = [_entry(1, 10), old, new, started, _entry(21, 30)]
    assert current(entries) == [entries[0], new, entries[4]]
    assert superseded(entries) == [old], "a copy not finished supersedes nothing"
    assert tiered_to(entries) == 30
    assert next_upload([_segment(21, 30), _segment(31, 40)], 40, entries).first == 31  # type: ignore[union-attr]
    assert expired(entries, now_ms=0, retention_ms=None, retention_bytes=250, local_bytes=0) == [entries[0]], (
        "retention counts each run once, by its newest generation's bytes"
    )


def test_the_next_upload_is_the_oldest_closed_segment_wholly_committed_above_what_the_store_holds() -> None:
    segments = [_segment(1, 10), _segment(11, 20), _segment(21, 30)]
    assert next_upload(segments, 25, []).first == 1  # type: ignore[union-attr]
    assert next_upload(segments, 9, []) is None, "segment 1..10 is not all committed"
    done = next_upload(segments, 25, [_entry(1, 10)])
    assert done is not None and (done.segment, done.first, done.last) == (11, 11, 20)
    assert next_upload(segments, 25, [_entry(1, 20)]) is None, "21..30 is above the commit point"
    # boundaries that differ from the store's (a replica that started over): the rest of the segment
    moved = next_upload(segments, 30, [_entry(1, 15)])
    assert moved is not None and (moved.segment, moved.first, moved.last) == (11, 16, 20)
    assert next_upload([_segment(31, 30)], 100, [_entry(1, 30)]) is None, "an empty segment has nothing"


@given(
    lengths=st.lists(st.integers(1, 20), min_size=1, max_size=12),
    commit=st.integers(0, 300),
    done=st.integers(0, 300),
)
def test_an_upload_is_never_above_the_commit_point_and_always_continues_the_store(
    lengths: list[int], commit: int, done: int
) -> None:
    segments, first = [], 1
    for n in lengths:
        segments.append(_segment(first, first + n - 1))
        first += n
    entries = [_entry(1, done)] if done else []
    plan = next_upload(segments, commit, entries)
    if plan is None:
        # nothing to do only if every closed segment above the store is not all committed (or none is left)
        assert all(s.last <= done or s.last > commit for s in segments)
        return
    assert plan.last <= commit and plan.first == max(done + 1, plan.segment) and plan.first <= plan.last
    assert any(s.first == plan.segment and s.last == plan.last for s in segments)


def test_total_retention_deletes_the_oldest_finished_objects_by_age_and_by_bytes() -> None:
    entries = [_entry(1, 10, ts=1000), _entry(11, 20, ts=2000), _entry(21, 30, ts=3000)]
    old = expired(entries, now_ms=3500, retention_ms=1000, retention_bytes=None, local_bytes=0)
    assert [e.first for e in old] == [1, 11]
    big = expired(entries, now_ms=0, retention_ms=None, retention_bytes=250, local_bytes=100)
    assert [e.first for e in big] == [1, 11], "400 bytes in all: the two oldest go to reach 250"
    started = [_entry(1, 10, State.COPY_STARTED, ts=0)]
    assert expired(started, now_ms=10**9, retention_ms=1, retention_bytes=None, local_bytes=0) == []


def _journal(path: Path, **config: object) -> Journal:
    return Journal(path, JournalConfig(**config)).open()  # type: ignore[arg-type]


def test_a_closed_segment_s_records_read_back_without_producer_marks(tmp_path: Path) -> None:
    """Records of an idempotent producer (marks between them) read from a closed segment's file are
    the records alone, consecutive, intact; a range outside the segment is refused."""
    j = _journal(tmp_path, segment_bytes=400, fsync="always")
    for i in range(40):  # one idempotent producer: a group mark before each record, a snapshot atop each segment
        j.append_many([(f"k{i % 3}", b"v%03d" % i)], timestamp_ms=1000 + i, changes={"p": Producer(1, i + 1, 1000)})
    closed = j.closed_segments()
    assert all(s.size > len(read_records(s, s.first, s.last)[0]) for s in closed), "the files hold marks too"
    assert len(closed) >= 3 and closed[0].first == 1
    assert all(a.last + 1 == b.first for a, b in itertools.pairwise(closed))
    segment = closed[1]
    data, starts = read_records(segment, segment.first + 1, segment.last)
    offsets, problem = walk(data)
    assert problem is None and len(offsets) - 1 == segment.last - segment.first
    assert starts == offsets, "where each record starts, and where the last ends"
    assert data == b"".join(c.data for c in [j.read_chunk(segment.first + 1, end=segment.last)] if c)
    with pytest.raises(JournalError, match="not in segment"):
        read_records(segment, segment.first, segment.last + 1)
    j.close()


def test_local_retention_of_a_tiered_journal_waits_for_the_store(tmp_path: Path) -> None:
    j = _journal(tmp_path, segment_bytes=300, fsync="always", retention_bytes=1)
    for i in range(30):
        j.append("k", b"x" * 40, timestamp_ms=i)
    closed = j.closed_segments()
    assert j.apply_retention(tiered_to=0) == [], "the store holds nothing: every segment stays"
    removed = j.apply_retention(tiered_to=closed[1].last)
    assert removed == [closed[0].first, closed[1].first]
    assert j.first_sequence == closed[2].first
    j.close()


def test_a_quiet_segment_closes_by_the_loop_s_clock_even_behind_a_wall_clock_set_back(tmp_path: Path) -> None:
    """A leader closes its idle active segment once its newest record is old by the records' time, or
    once the journal took nothing for the idle interval by the loop's monotonic clock: with the wall
    clock set back days behind the records, only the second ever says so (the simulation found it)."""
    j = _journal(tmp_path, segment_bytes=1 << 20, fsync="always")
    j.append("k", b"v", timestamp_ms=10**12)  # written while the wall clock ran days ahead
    wall = 10**12 - 3 * 86_400_000  # now set back, behind the record
    assert not j.close_idle_segment(now_ms=wall, idle_ms=2000), "by the records' time it is never idle"
    rounds = TierRounds("s", None, StreamPaths.of("default", "s"), None, Tiering("file:///x", segment_idle_ms=2000))  # type: ignore[arg-type]
    assert not rounds.quiet(j.written, now=100.0), "the first look starts the interval"
    assert not rounds.quiet(j.written, now=101.9)
    assert rounds.quiet(j.written, now=102.0)
    assert j.close_idle_segment(now_ms=wall, idle_ms=0) and j.closed_segments()[-1].last == 1
    assert not j.close_idle_segment(now_ms=wall, idle_ms=0), "an empty active segment stays"
    j.append("k", b"w", timestamp_ms=wall)
    assert not rounds.quiet(j.written, now=102.5), "a record starts the interval again"
    assert rounds.quiet(j.written, now=104.5)
    j.close()


def test_a_compacted_segment_changed_since_the_last_round_holds_local_retention_and_calls_a_round() -> None:
    """Of a compacted stream, a segment the store holds that compaction rewrote since the last round
    (its size changed) bounds local retention below it, and makes a round due at once: the store
    gets the compacted records before the local copy goes."""
    rounds = TierRounds("s", None, StreamPaths.of("default", "s"), None, Tiering("file:///x"))  # type: ignore[arg-type]
    segments = (_segment(1, 10, size=500), _segment(11, 20, size=500), _segment(21, 30, size=500))
    offer = Offer(leading=True, epoch=0, segments=segments, commit=30, local_bytes=1500, compacts=True)
    rounds.tiered_to, rounds._synced = 30, {s.first: s.size for s in segments}
    rounds._last_round = 100.0
    assert rounds.retention_bound(offer) == 30 and not rounds.due(offer, 101.0)
    shrunk = Offer(leading=True, epoch=0, segments=(segments[0], _segment(11, 20, size=120), segments[2]),
                   commit=30, local_bytes=1120, compacts=True)  # fmt: skip
    assert rounds.retention_bound(shrunk) == 10 and rounds.due(shrunk, 101.0)
    plain = Offer(leading=True, epoch=0, segments=shrunk.segments, commit=30, local_bytes=1120)
    assert rounds.retention_bound(plain) == 30, "a stream that does not compact: the store's bound alone"

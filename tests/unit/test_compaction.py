"""Compaction of a journal's closed segments (zeps.journal.compaction), on real files.

A "crash" here is an exception raised at a step of the compaction: the process's writes are in the
kernel as they would be after kill -9, and a new Journal opens the directory as a restarted broker
would. Power loss is the fsync order's business (files fsynced before the commit marker, the
directory after each rename), which these tests cannot cut.
"""

from __future__ import annotations

import itertools
import random
import shutil
import time
from pathlib import Path

import pytest

from zeps._records import encode_record
from zeps.journal import Journal, JournalConfig, JournalError, Record
from zeps.journal.cleaned import CLEANED, SWAP
from zeps.journal.compaction import Throttle
from zeps.journal.producers import SNAPSHOT, Producer
from zeps.journal.segments import ClosedSegment, read_records, walk_segment

HOUR_MS = 3600 * 1000


def _journal(path: Path, **config: object) -> Journal:
    settings: dict[str, object] = {"cleanup": "compact", "fsync": "never", "index_interval_bytes": 64}
    settings.update(config)
    return Journal(path, JournalConfig(**settings), name="test").open()  # type: ignore[arg-type]


def _all(j: Journal, start: int | None = None) -> list[Record]:
    out, seq = [], j.first_sequence if start is None else start
    while batch := j.read(seq, max_records=7, max_bytes=300):
        assert all(a.sequence < b.sequence for a, b in itertools.pairwise(batch))
        out += batch
        seq = batch[-1].sequence + 1
    return out


def _latest(records: list[Record]) -> dict[str, bytes]:
    latest: dict[str, bytes] = {}
    for r in records:
        if r.body:
            latest[r.key] = r.body
        else:
            latest.pop(r.key, None)
    return latest


def test_a_key_set_twice_then_deleted_keeps_only_the_delete_until_its_retention_ends(tmp_path: Path) -> None:
    """The issue's case: k=v1, k=v2, tombstone(k), a roll: compaction keeps only the tombstone, at its
    own sequence; a reader from 0 inside the window sees the delete; after the tombstone retention
    nothing of k is left. Other keys' latest records stay throughout."""
    j = _journal(tmp_path, tombstone_retention_ms=HOUR_MS)
    j.append("other", b"kept", timestamp_ms=1000)
    j.append("k", b"v1", timestamp_ms=1000)
    j.append("k", b"v2", timestamp_ms=1000)
    j.append("k", b"", timestamp_ms=2000)
    j.close_idle_segment(now_ms=10_000, idle_ms=1)  # the roll
    j.append("live", b"in the active segment", timestamp_ms=3000)
    report = j.compact(now_ms=5000)
    assert report is not None and (report.records, report.keys, report.removed) == (4, 2, 2)
    assert [(r.sequence, r.key, r.body) for r in _all(j, 0)] == [
        (1, "other", b"kept"), (4, "k", b""), (5, "live", b"in the active segment")]  # fmt: skip
    assert j.compact(now_ms=5000) is None  # nothing changed: no scan
    report = j.compact(now_ms=2000 + HOUR_MS)  # the tombstone's retention ended
    assert report is not None and report.removed == 1
    assert [(r.sequence, r.key) for r in _all(j, 0)] == [(1, "other"), (5, "live")]
    assert j.next_sequence == 6  # sequences never change
    j.close()
    again = _journal(tmp_path)
    assert [(r.sequence, r.key) for r in _all(again, 0)] == [(1, "other"), (5, "live")]
    assert again.append("k", b"v3") == 6


def _fill(j: Journal, seed: int, count: int, keys: int) -> list[Record]:
    """``count`` records over ``keys`` keys (a tenth of them deletes), rolling every few; returns them."""
    rng = random.Random(seed)
    written = []
    for i in range(count):
        key = f"key-{rng.randrange(keys)}"
        body = b"" if rng.random() < 0.1 else b"v%d-" % i + b"x" * rng.randrange(40)
        seq = j.append(key, body, timestamp_ms=1000 + i)
        written.append(Record(seq, 1000 + i, key, body))
        if rng.random() < 0.04:
            j.close_idle_segment(now_ms=10**9, idle_ms=1)
    return written


@pytest.mark.parametrize("seed", range(6))
def test_compaction_keeps_each_keys_latest_record_and_every_reader_sees_the_same_values(
    tmp_path: Path, seed: int
) -> None:
    """Random keys, deletes and rolls: after compaction a reader from any sequence gets original
    records only (same sequence, key, body), in order, at least every key's latest record from there
    on, and the latest value per key is what it was; reopened from the seals, and read whole without
    them, it reads the same."""
    j = _journal(tmp_path, segment_bytes=2048, tombstone_retention_ms=HOUR_MS)
    written = _fill(j, seed, 600, 25)
    before = _all(j)
    report = j.compact(now_ms=2000)
    assert report is not None and report.removed > 0 and report.bytes_after < report.bytes_before
    after = _all(j)
    originals = {r.sequence: r for r in written}
    assert all(originals[r.sequence] == r for r in after)
    assert _latest(after) == _latest(before) == _latest(written)
    last_of = {r.key: r.sequence for r in written}
    for start in random.Random(seed).sample(range(1, len(written) + 1), 20):
        got = {r.sequence for r in _all(j, start)}
        assert {s for s in last_of.values() if s >= start} <= got
        assert got == {r.sequence for r in after if r.sequence >= start}
    active = j.replica_position()[0]  # the active segment is never compacted
    assert [r.sequence for r in after if r.sequence >= active] == list(range(active, len(written) + 1))
    latest_closed = {r.key: r.sequence for r in written if r.sequence < active}
    assert [r.sequence for r in after if r.sequence < active] == sorted(latest_closed.values())
    j.close()
    assert _all(_journal(tmp_path)) == after
    for seal in tmp_path.glob("*.seal"):
        seal.unlink()
    assert _all(_journal(tmp_path)) == after


def test_records_superseded_below_the_ratio_stay_until_it_is_passed(tmp_path: Path) -> None:
    """A pass rewrites nothing while the superseded share of the closed segments' records is below
    ``min_cleanable_ratio``, and does once it is reached."""
    j = _journal(tmp_path, min_cleanable_ratio=0.5)
    for i in range(10):
        j.append(f"k{i}", b"first")
    j.append("k0", b"second")
    j.close_idle_segment(now_ms=10**15, idle_ms=1)
    report = j.compact(now_ms=0)
    assert report is not None and (report.superseded, report.segments) == (1, 0)
    for i in range(1, 8):
        j.append(f"k{i}", b"second")
    j.close_idle_segment(now_ms=10**15, idle_ms=1)
    report = j.compact(now_ms=0)
    assert report is not None and report.ratio == 8 / 18 and report.segments == 0
    j.append("k8", b"second")
    j.close_idle_segment(now_ms=10**15, idle_ms=1)
    report = j.compact(now_ms=0)
    assert report is not None and report.ratio == 9 / 19 and report.segments == 0
    j.append("k9", b"second")
    j.close_idle_segment(now_ms=10**15, idle_ms=1)
    report = j.compact(now_ms=0)
    assert report is not None and report.ratio == 0.5 and report.removed == 10
    assert [r.body for r in _all(j)] == [b"second"] * 10


def test_a_journal_that_deletes_only_is_not_compacted_and_one_that_compacts_only_keeps_old_segments(
    tmp_path: Path,
) -> None:
    deleting = _journal(tmp_path / "d", cleanup="delete")
    deleting.append("k", b"1")
    deleting.append("k", b"2")
    deleting.close_idle_segment(now_ms=10**15, idle_ms=1)
    assert deleting.compact(now_ms=0) is None
    compacting = _journal(tmp_path / "c", retention_ms=1)
    compacting.append("k", b"1", timestamp_ms=1)
    compacting.close_idle_segment(now_ms=10**15, idle_ms=1)
    assert compacting.apply_retention(now_ms=10**15) == []  # compact alone: no retention by age
    assert [r.body for r in _all(compacting)] == [b"1"]


class _CrashError(Exception):
    pass


def test_a_crash_at_any_step_of_a_compaction_leaves_a_journal_that_reads_the_same_values(tmp_path: Path) -> None:
    """Stop a compaction after each step that changes the disk (one at a time, on a fresh copy): in
    the reopened journal each segment reads either as before or as a finished compaction left it,
    the latest value per key is the same, no .cleaned or .swap file is left, and compacting again
    gives the finished result (any superseded share starts a pass here: the ratio is another test's)."""
    source = tmp_path / "source"
    j = _journal(source, segment_bytes=1024, min_cleanable_ratio=0)
    _fill(j, 7, 150, 10)
    j.close()
    steps: list[str] = []
    shutil.copytree(source, tmp_path / "reference")
    reference = _journal(tmp_path / "reference", min_cleanable_ratio=0)
    before = _all(reference)
    assert reference.compact(now_ms=2000, step=steps.append) is not None
    finished = _all(reference)
    assert len(steps) > 10 and finished != before
    bases = [*sorted(int(p.stem) for p in source.glob("*.log")), 10**9]

    def per_segment(records: list[Record]) -> list[list[Record]]:
        return [[r for r in records if a <= r.sequence < b] for a, b in itertools.pairwise(bases)]

    for n, name in enumerate(steps):
        copy = tmp_path / f"crash-{n}"
        shutil.copytree(source, copy)
        crashing = _journal(copy, min_cleanable_ratio=0)
        seen = 0

        def crash(step: str, stop: int = n) -> None:
            nonlocal seen
            seen += 1
            if seen > stop:
                raise _CrashError(step)

        with pytest.raises(_CrashError):
            crashing.compact(now_ms=2000, step=crash)
        reopened = _journal(copy, min_cleanable_ratio=0)
        got = _all(reopened)
        for segment, old, new in zip(per_segment(got), per_segment(before), per_segment(finished), strict=True):
            assert segment in (old, new), f"after step {n} ({name})"  # each segment whole, old or new
        assert _latest(got) == _latest(before)
        assert not list(copy.glob(f"*{CLEANED}")) and not list(copy.glob(f"*{SWAP}"))
        reopened.compact(now_ms=2000, force=True)
        assert _all(reopened) == finished, f"after step {n} ({name})"
        reopened.close()
        shutil.rmtree(copy)


@pytest.mark.pure
def test_a_full_volume_during_a_rewrite_leaves_the_segment_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The file system refuses the compacted files (ENOSPC): JournalWriteError, no file left
    beside the segment, every record still read."""
    j = _journal(tmp_path)
    for body in (b"1", b"2", b"3"):
        j.append("k", body)
    j.close_idle_segment(now_ms=10**15, idle_ms=1)
    before = _all(j)

    def full(path: Path, data: bytes) -> None:
        path.write_bytes(data[: len(data) // 2])
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("zeps.journal.compaction.write_durably", full)
    with pytest.raises(JournalError, match="No space left"):
        j.compact(now_ms=0)
    assert not list(tmp_path.glob(f"*{CLEANED}"))
    assert _all(j) == before


def test_a_compacted_segment_keeps_the_producers_its_marks_left(tmp_path: Path) -> None:
    """Idempotent producers' marks in a compacted segment become one snapshot at its start holding the
    producers as the segment's end left them. A journal whose last segment lost its own snapshot (a
    crash right after a roll) rebuilds its table from the closed segments' marks: the same table
    with the segment compacted as without."""
    now = int(time.time() * 1000)
    j = _journal(tmp_path / "compacted")
    j.append_many([("k", b"1")], changes={"p": Producer(1, 1, now)})
    j.append_many([("k", b"2"), ("k", b"3")], changes={"p": Producer(1, 3, now), "q": Producer(2, 1, now)})
    j.close_idle_segment(now_ms=now + 10**9, idle_ms=1)
    table = dict(j.journaled)
    j.close()
    shutil.copytree(tmp_path / "compacted", tmp_path / "as written")
    j = _journal(tmp_path / "compacted")
    report = j.compact(now_ms=now)
    assert report is not None and report.removed == 2
    j.close()
    _, marks, _ = walk_segment((tmp_path / "compacted" / f"{1:020d}.log").read_bytes(), 1, gaps=True)
    assert [(kind, producers) for _, _, kind, producers in marks] == [(SNAPSHOT, table)]
    for directory in ("compacted", "as written"):
        (tmp_path / directory / f"{4:020d}.log").write_bytes(b"")  # the active segment, without its snapshot
    assert dict(_journal(tmp_path / "compacted").journaled) == dict(_journal(tmp_path / "as written").journaled)
    assert dict(_journal(tmp_path / "compacted").journaled) == table


def test_a_compacted_segment_hands_its_kept_records_to_another_thread(tmp_path: Path) -> None:
    """read_records (what the tiering uploader reads) of a compacted segment: the kept records of the
    range asked for, with their boundaries."""
    j = _journal(tmp_path)
    for i in range(6):
        j.append("ab"[i % 2], b"%d" % i)
    j.close_idle_segment(now_ms=10**15, idle_ms=1)
    j.compact(now_ms=0)
    (segment,) = j.closed_segments()
    assert isinstance(segment, ClosedSegment) and (segment.first, segment.last) == (1, 6)
    data, offsets = read_records(segment, 1, 6)
    assert len(offsets) == 3 and offsets[-1] == len(data)
    assert b"4" in data[: offsets[1]] and b"5" in data[offsets[1] :]
    data, offsets = read_records(segment, 1, 3)
    assert data == b"" and list(offsets) == [0]


def test_the_io_budget_holds_a_pass_to_its_rate() -> None:
    now = [0.0]
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        now[0] += seconds

    throttle = Throttle(1000, clock=lambda: now[0], sleep=sleep)
    for _ in range(10):
        throttle.spend(500)
    assert now[0] == pytest.approx(5.0) and throttle.slept == pytest.approx(5.0)
    unlimited = Throttle(None, clock=lambda: 0.0, sleep=sleep)
    unlimited.spend(10**9)
    assert len(slept) == 10


@pytest.mark.parametrize(
    ("config", "named"),
    [({"cleanup": "compacted"}, "cleanup"), ({"min_cleanable_ratio": 1.5}, "min_cleanable_ratio"),
     ({"tombstone_retention_ms": -1}, "tombstone_retention_ms"), ({"compaction_bytes_per_s": 0}, "compaction_bytes")],
)  # fmt: skip
def test_bad_compaction_settings_are_refused_by_name(config: dict[str, object], named: str) -> None:
    with pytest.raises(JournalError, match=named):
        JournalConfig(**config)  # type: ignore[arg-type]


def test_a_closed_segment_read_whole_ends_at_a_record_of_the_next_segments_sequences(tmp_path: Path) -> None:
    """A closed segment may have gaps (compacted), so one read whole (its seal lost) takes increasing
    sequences; a record at or past the next segment's base (a stray write) still ends it there."""
    j = _journal(tmp_path, cleanup="delete")
    for i in range(3):
        j.append("k", b"%d" % i)
    j.close_idle_segment(now_ms=10**15, idle_ms=1)
    j.append("k", b"3")
    before = _all(j)
    j.close()
    first = tmp_path / f"{1:020d}.log"
    size = first.stat().st_size
    with first.open("ab") as f:
        f.write(encode_record(7, 5, b"k", b"stray"))
    first.with_suffix(".seal").unlink()
    assert _all(_journal(tmp_path, cleanup="delete")) == before
    assert first.stat().st_size == size, "cut where the stray record began"


def test_a_pass_maps_at_most_its_keys_and_compacts_only_the_segments_it_mapped(tmp_path: Path) -> None:
    """compaction_max_keys bounds a pass's memory: once its map holds that many keys it stops, and only
    the segments mapped so far are compacted; the rest keep every record."""
    j = _journal(tmp_path, compaction_max_keys=2, min_cleanable_ratio=0)
    for key, body in (("a", b"1"), ("a", b"2"), ("b", b"1")):
        j.append(key, body)
    j.close_idle_segment(now_ms=10**15, idle_ms=1)
    for key, body in (("c", b"1"), ("c", b"2")):
        j.append(key, body)
    j.close_idle_segment(now_ms=10**15, idle_ms=1)
    report = j.compact(now_ms=0)
    assert report is not None and (report.records, report.keys, report.removed) == (3, 2, 1)
    assert [(r.key, r.body) for r in _all(j)] == [("a", b"2"), ("b", b"1"), ("c", b"1"), ("c", b"2")]

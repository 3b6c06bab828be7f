"""The journal on a real filesystem: formats, recovery, retention, fsync policies."""

from __future__ import annotations

import errno
import itertools
import logging
import os
import struct
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zeps._records import encode_record
from zeps.journal import Journal, JournalConfig, JournalError, JournalWriteError, Record
from zeps.journal.producers import Producer


def _journal(path: Path, **config: object) -> Journal:
    return Journal(path, JournalConfig(**config), name="test").open()  # type: ignore[arg-type]


def _all(j: Journal) -> list[Record]:
    out, seq = [], j.first_sequence
    while batch := j.read(seq, max_records=100):
        out += batch
        seq = batch[-1].sequence + 1
    return out


def test_append_read_and_reopen_across_segments(tmp_path: Path) -> None:
    j = _journal(tmp_path, segment_bytes=1000, fsync="always", index_interval_bytes=200)
    for i in range(100):
        assert j.append(f"k.{i % 3}", b"x" * i, timestamp_ms=1000 + i) == i + 1
    assert len(list(tmp_path.glob("*.log"))) > 3
    first = _all(j)
    assert [r.sequence for r in first] == list(range(1, 101))
    assert first[42] == Record(43, 1042, "k.0", b"x" * 42)
    j.close()
    again = _journal(tmp_path, segment_bytes=1000, tail_cache_bytes=0)  # every read from disk
    assert _all(again) == first
    assert again.next_sequence == 101


def test_readers_see_only_the_durable_tail(tmp_path: Path) -> None:
    j = _journal(tmp_path, fsync="group", group_commit_ms=10_000)
    j.append("k", b"1")
    assert j.written == 1 and j.durable == 0 and j.read(1) == []
    assert not j.maybe_sync()  # not due yet
    assert j.maybe_sync(idle=True)  # the writer ran out of work: group commit now
    assert [r.body for r in j.read(1)] == [b"1"]
    never = _journal(tmp_path / "never", fsync="never")
    never.append("k", b"1")
    assert never.durable == 1


def test_torn_tail_is_truncated_with_a_log_line(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    j = _journal(tmp_path, fsync="always")
    for i in range(10):
        j.append("k", b"%d" % i)
    j.close()
    segment = next(tmp_path.glob("*.log"))
    good = segment.stat().st_size
    with segment.open("ab") as f:
        f.write(b"\x00\x00\x00\x40\xde\xad")  # half a record: a crash mid-write
    caplog.set_level(logging.WARNING, logger="zeps.journal")
    again = _journal(tmp_path)
    assert "torn or corrupt record at offset" in caplog.text and "truncating 6 bytes" in caplog.text
    assert segment.stat().st_size == good
    assert again.next_sequence == 11
    assert again.append("k", b"next") == 11


def test_corruption_cuts_at_the_first_bad_record(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    j = _journal(tmp_path, fsync="always")
    for i in range(10):
        j.append("k", b"payload-%d" % i)
    j.close()
    segment = next(tmp_path.glob("*.log"))
    data = bytearray(segment.read_bytes())
    record = len(data) // 10
    data[record * 6 + 30] ^= 0xFF  # damage the 7th record's body
    segment.write_bytes(bytes(data))
    caplog.set_level(logging.WARNING, logger="zeps.journal")
    again = _journal(tmp_path)
    assert [r.sequence for r in _all(again)] == [1, 2, 3, 4, 5, 6]
    assert "records from sequence 7 on are dropped" in caplog.text
    assert again.next_sequence == 7


def test_an_intact_record_out_of_sequence_ends_the_segment(tmp_path: Path) -> None:
    """A record whose CRC is right but whose sequence does not continue the segment (a stray write,
    a file pieced together by hand) is cut like a corrupt one: sequences stay base, base + 1, …"""
    j = _journal(tmp_path, fsync="always")
    for i in range(3):
        j.append("k", b"%d" % i, timestamp_ms=5)
    j.close()
    segment = next(tmp_path.glob("*.log"))
    with segment.open("ab") as f:
        f.write(encode_record(9, 5, b"k", b"stray") + encode_record(10, 5, b"k", b"stray"))
    again = _journal(tmp_path)
    assert [r.sequence for r in _all(again)] == [1, 2, 3]
    assert again.append("k", b"next") == 4


def test_sequences_never_restart_even_when_retention_empties_the_journal(tmp_path: Path) -> None:
    j = _journal(tmp_path, segment_bytes=200, fsync="always", retention_bytes=1)
    for i in range(30):
        j.append("k", b"0123456789" * 3, timestamp_ms=i)
    removed = j.apply_retention()
    assert removed and j.first_sequence > 1
    assert len(list(tmp_path.glob("*.log"))) == 1, "only the active segment stays"
    j.close()
    again = _journal(tmp_path)
    assert again.next_sequence == 31
    assert again.append("k", b"more") == 31


def test_retention_by_age_keeps_young_segments(tmp_path: Path) -> None:
    j = _journal(tmp_path, segment_bytes=300, fsync="always", retention_ms=1000)
    for i in range(20):
        j.append("k", b"x" * 50, timestamp_ms=10_000 + i * 100)
    j.apply_retention(now_ms=10_000 + 1900 + 500)  # keeps what is younger than 1 s
    assert all(r.timestamp_ms >= 10_000 + 1900 + 500 - 1000 - 400 for r in _all(j))
    assert j.first_sequence > 1


def test_seek_time_finds_the_first_record_at_or_after(tmp_path: Path) -> None:
    j = _journal(tmp_path, segment_bytes=500, fsync="always", index_interval_bytes=100)
    for i in range(50):
        j.append("k", b"x", timestamp_ms=1000 + 10 * i)
    assert j.seek_time(0) == 1
    assert j.seek_time(1205) == 22  # 1210 is the first at or after 1205
    assert j.seek_time(1210) == 22
    assert j.seek_time(10**12) == j.next_sequence


def test_timestamps_never_go_backwards(tmp_path: Path) -> None:
    j = _journal(tmp_path, fsync="always")
    j.append("k", b"", timestamp_ms=5000)
    j.append("k", b"", timestamp_ms=4000)  # a clock step back
    assert [r.timestamp_ms for r in _all(j)] == [5000, 5000]


@settings(max_examples=25, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.lists(st.tuples(st.text(alphabet="abc.", max_size=8), st.binary(max_size=300)), max_size=60),
    st.integers(min_value=200, max_value=5000),
)
def test_what_is_written_is_read_back_after_reopen(
    tmp_path_factory: pytest.TempPathFactory, entries: list[tuple[str, bytes]], segment: int
) -> None:
    path = tmp_path_factory.mktemp("j")
    j = _journal(path, segment_bytes=segment, fsync="always", index_interval_bytes=150)
    for key, body in entries:
        j.append(key, body)
    j.close()
    again = _journal(path, tail_cache_bytes=0)
    assert [(r.key, r.body) for r in _all(again)] == entries


@settings(max_examples=25, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.lists(st.lists(st.tuples(st.sampled_from(["a", "b.c"]), st.binary(max_size=80)), min_size=1, max_size=20),
             min_size=1, max_size=10),
    st.integers(min_value=1, max_value=400),
    st.data(),
)  # fmt: skip
def test_chunks_from_the_tail_cache_and_from_disk_are_the_same_bytes(
    tmp_path_factory: pytest.TempPathFactory,
    appends: list[list[tuple[str, bytes]]],
    max_bytes: int,
    data: st.DataObject,
) -> None:
    path = tmp_path_factory.mktemp("chunks")
    cached = _journal(path, segment_bytes=1500, fsync="always", index_interval_bytes=100)
    for entries in appends:  # several appends: a read may span several cached chunks
        cached.append_many(entries, timestamp_ms=7)
    disk = _journal(path, segment_bytes=1500, tail_cache_bytes=0)
    total = cached.durable
    start = data.draw(st.integers(1, total))
    end = data.draw(st.integers(start, total))
    a = cached.read_chunk(start, max_bytes=max_bytes, end=end)
    b = disk.read_chunk(start, max_bytes=max_bytes, end=end)
    assert a is not None and b is not None
    # the same records, the same bytes (a read from disk may stop earlier, at a segment's end)
    assert b.first == a.first and len(b) <= len(a) and a.data.startswith(b.data)
    assert list(b.offsets) == list(a.offsets)[: len(b) + 1] and b.keys == a.keys[: len(b)]
    assert a.first == start and a.last <= end
    assert len(a.data) <= max_bytes or len(a) == 1, "within max_bytes, or the one record that does not fit"
    flat = [e for entries in appends for e in entries]
    assert [(r.key, r.body) for r in a.records()] == flat[start - 1 : a.last]
    assert a.offsets[-1] == len(a.data)
    assert cached.read_chunk(total + 1) is None


def test_a_record_larger_than_a_read_comes_back_whole_from_disk(tmp_path: Path) -> None:
    j = _journal(tmp_path, fsync="always")
    j.append("small", b"s")
    j.append("big", b"B" * 300_000)
    j.append("small", b"t")
    j.close()
    disk = _journal(tmp_path, tail_cache_bytes=0)
    chunk = disk.read_chunk(2, max_bytes=1000)
    assert chunk is not None and len(chunk) == 1, "one record, though larger than max_bytes"
    assert chunk.record(0).body == b"B" * 300_000
    assert [r.body for r in disk.read(1, max_bytes=10)] == [b"s"]


def test_offset_files_are_rebuilt_from_the_records_at_open(tmp_path: Path) -> None:
    """The .off files (where each record starts) are derived data: a missing, short or garbled one
    is rewritten from the segment's records when the journal opens, and reads stay exact."""
    j = _journal(tmp_path, segment_bytes=600, fsync="always")
    for i in range(60):
        j.append(f"k.{i % 4}", b"y" * (i % 23), timestamp_ms=i)
    expected = _all(j)
    j.close()
    off = sorted(tmp_path.glob("*.off"))
    assert len(off) == len(list(tmp_path.glob("*.log"))) > 3
    off[0].unlink()
    off[1].write_bytes(off[1].read_bytes()[:6])
    off[2].write_bytes(b"\xff" * 64)
    again = _journal(tmp_path, segment_bytes=600, tail_cache_bytes=0)
    assert _all(again) == expected
    rebuilt = sorted(tmp_path.glob("*.off"))
    for path, following in itertools.pairwise(rebuilt):
        assert path.stat().st_size == 4 * (int(following.stem) - int(path.stem)), f"{path.name}: one entry a record"


def test_a_read_skips_what_a_damaged_closed_segment_lost(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    j = _journal(tmp_path, segment_bytes=500, fsync="always")
    for i in range(40):
        j.append("k", b"%03d" % i + b"." * 40)
    j.close()
    first, second = sorted(tmp_path.glob("*.log"))[:2]
    data = bytearray(first.read_bytes())
    data[-10] ^= 0xFF  # the last record of the first (closed) segment
    first.write_bytes(bytes(data))
    caplog.set_level(logging.WARNING, logger="zeps.journal")
    again = _journal(tmp_path, segment_bytes=500, tail_cache_bytes=0)
    assert caplog.text == "", "open reads the closed segment's seal, not its records"
    lost = int(second.stem) - 1
    assert [r.sequence for r in _all(again)] == [s for s in range(1, 41) if s != lost]
    assert f"record {lost} (offset" in caplog.text and "is damaged" in caplog.text  # found when first read
    assert again.damaged_records == 1
    chunk = again.read_chunk(lost)
    assert chunk is not None and chunk.first == lost + 1, "the lost record reads as the next one there is"


def test_open_reads_only_the_active_segment_and_the_closed_ones_seals(tmp_path: Path) -> None:
    """Startup does not grow with retention: a closed segment's records are not read at open (here
    they are garbage, of the right size: open cannot tell), only when a reader first asks for them."""
    j = _journal(tmp_path, segment_bytes=1000, index_interval_bytes=200)
    for i in range(100):
        j.append(f"k{i}", b"x" * 60, timestamp_ms=1000 + i)
    j.close()
    logs = sorted(tmp_path.glob("*.log"))
    assert len(logs) > 5 and all(p.with_suffix(".seal").exists() for p in logs[:-1])
    for closed in logs[1:-1]:
        closed.write_bytes(bytes(closed.stat().st_size))  # zeros: every record fails its CRC
    again = _journal(tmp_path, segment_bytes=1000)
    assert again.next_sequence == 101 and again.first_sequence == 1
    assert again.seek_time(1000 + 5) == 6 and again.seek_time(1000 + 95) == 96  # intact segments serve seeks
    assert again.damaged_records == 0, "nothing damaged was read yet"
    survivors = [r.sequence for r in _all(again)]
    assert survivors[0] == 1 and survivors[-1] == 100 and again.damaged_records == 100 - len(survivors)
    assert again.damaged_records > 0


def test_a_seal_that_does_not_match_its_segment_is_ignored(tmp_path: Path) -> None:
    j = _journal(tmp_path, segment_bytes=1000)
    for i in range(30):
        j.append(f"k{i}", b"x" * 60)
    j.close()
    first = sorted(tmp_path.glob("*.log"))[0]
    first.with_suffix(".seal").write_bytes(b"ZEPSEAL1" + b"\0" * 40)  # damaged: read whole instead
    with first.open("ab") as f:
        f.write(b"torn")  # and the segment grew behind the seal's back
    again = _journal(tmp_path, segment_bytes=1000)
    assert [r.sequence for r in _all(again)] == list(range(1, 31))
    assert first.stat().st_size % 1 == 0 and _journal(tmp_path, segment_bytes=1000).next_sequence == 31


@pytest.mark.parametrize("segment_bytes", [0, -1, (1 << 31) + 1])
def test_segment_sizes_a_journal_cannot_index_are_refused(segment_bytes: int) -> None:
    with pytest.raises(JournalError, match=f"segment_bytes={segment_bytes}: must be between 1 and"):
        JournalConfig(segment_bytes=segment_bytes)


class FullDisk:
    """A volume with ``free`` bytes left, for the journal's writes: a write that does not fit is cut
    short, the next raises ENOSPC, as the kernel does. (Faked by replacing ``os.write``/``os.writev``
    in the journal module: filling a real volume needs root and a mount namespace, which the
    integration test of the broker does; here the undo logic is checked record by record.)"""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, free: int) -> None:
        self.free = free
        module = "zeps.journal.appending.os"
        real_write = os.write
        monkeypatch.setattr(f"{module}.write", lambda fd, data: real_write(fd, self._take(data)))
        monkeypatch.setattr(f"{module}.writev", lambda fd, parts: real_write(fd, self._take(b"".join(parts))))

    def _take(self, data: bytes | memoryview) -> bytes | memoryview:
        if self.free <= 0 and len(data):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        part = data[: self.free]
        self.free -= len(part)
        return part


def _files(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(path.iterdir())}


@pytest.mark.parametrize("segment_bytes", [1 << 20, 600])  # one segment; rolls in the middle of the append
def test_a_full_volume_fails_the_whole_append_and_leaves_the_journal_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, segment_bytes: int
) -> None:
    j = _journal(tmp_path, segment_bytes=segment_bytes, index_interval_bytes=100, fsync="always")
    for i in range(5):
        j.append(f"k{i}", b"x" * 50)
    before, state = _files(tmp_path), (j.next_sequence, j.durable, j.size_bytes)
    disk = FullDisk(monkeypatch, free=300)  # room for a few records of the next append, not all
    with pytest.raises(JournalWriteError, match="No space left on device") as failed:
        j.append_many([(f"n{i}", b"y" * 50) for i in range(20)])
    assert failed.value.space and failed.value.errno == errno.ENOSPC
    assert _files(tmp_path) == before, "nothing of the failed append is left on disk"
    assert (j.next_sequence, j.durable, j.size_bytes) == state
    disk.free = 1 << 20  # space again (retention, a bigger volume)
    assert j.append("after", b"z") == 6, "the next append takes the next sequence"
    j.close()
    again = _journal(tmp_path, segment_bytes=segment_bytes, tail_cache_bytes=0)
    assert [(r.sequence, r.key) for r in _all(again)] == [*((i + 1, f"k{i}") for i in range(5)), (6, "after")]


def test_a_failed_group_leaves_the_producer_marks_as_they_were(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    j, now = _journal(tmp_path, fsync="always"), int(time.time() * 1000)  # recent: not expired at open
    j.append_many([("a", b"1")], changes={"p": Producer(1, 1, now)})
    disk = FullDisk(monkeypatch, free=10)
    with pytest.raises(JournalWriteError):
        j.append_many([("a", b"2"), ("a", b"3")], changes={"p": Producer(1, 3, now), "q": Producer(1, 1, now)})
    disk.free = 1 << 20
    j.append_many([("b", b"4")], changes={"q": Producer(1, 1, now)})  # the next group's mark
    j.close()
    again = _journal(tmp_path)
    assert {name: p.sequence for name, p in again.producers.producers.items()} == {"p": 1, "q": 1}
    assert [r.body for r in _all(again)] == [b"1", b"4"]


def test_a_last_segment_without_a_snapshot_replays_every_segments_marks(tmp_path: Path) -> None:
    """A journal from before seals (no snapshot when the table was empty), or a crash right after a
    roll, leaves a last segment without a snapshot: the table then comes from every segment's marks."""
    j, now = _journal(tmp_path, segment_bytes=600), int(time.time() * 1000)
    j.append_many([("a", b"x" * 50)], changes={"p": Producer(1, 7, now)})
    while len(list(tmp_path.glob("*.log"))) < 2:
        j.append("b", b"y" * 50)
    j.append("b", b"after the roll")
    j.close()
    last = sorted(tmp_path.glob("*.log"))[-1]
    data = last.read_bytes()
    (length,) = struct.unpack_from("!I", data)
    last.write_bytes(data[4 + length :])  # the snapshot that opens it, gone
    again = _journal(tmp_path, segment_bytes=600)
    assert {name: p.sequence for name, p in again.producers.producers.items()} == {"p": 7}
    assert _all(again)[-1].body == b"after the roll"


def test_a_volume_full_in_the_middle_of_a_roll_leaves_the_journal_open_and_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A group rolls to a new segment before it writes (the old one is three quarters full): the
    volume fills while the old segment is being sealed. The roll is undone, the old segment is the
    active one again, and the journal takes appends once there is room."""
    j, now = _journal(tmp_path, segment_bytes=1000, fsync="always"), int(time.time() * 1000)
    while j.size_bytes < 800:
        j.append("k", b"x" * 40)
    before = _files(tmp_path)
    disk = FullDisk(monkeypatch, free=0)
    with pytest.raises(JournalWriteError):
        j.append_many([("k", b"grouped")], changes={"p": Producer(1, 1, now)})
    assert _files(tmp_path) == before, "no seal, no new segment left behind"
    disk.free = 1 << 20
    last = j.append_many([("k", b"grouped")], changes={"p": Producer(1, 1, now)})
    j.close()
    again = _journal(tmp_path, segment_bytes=1000)
    assert _all(again)[-1].sequence == last and again.producers.producers["p"].sequence == 1


def test_an_idle_active_segment_is_closed_and_the_journal_goes_on_from_the_next(tmp_path: Path) -> None:
    """close_idle_segment closes the active segment once its newest record is idle_ms old (the records'
    own time), never an empty one; the closed segment reads back the same after a reopen, and appends
    go on in a new segment."""
    j = _journal(tmp_path)
    for i in range(1, 11):
        j.append("k", b"%d" % i, timestamp_ms=1_000 + i)
    assert not j.close_idle_segment(now_ms=1_010 + 499, idle_ms=500), "not idle long enough yet"
    assert j.close_idle_segment(now_ms=1_010 + 500, idle_ms=500)
    assert [(s.first, s.last) for s in j.closed_segments()] == [(1, 10)]
    assert not j.close_idle_segment(now_ms=10_000, idle_ms=500), "an empty active segment stays open"
    assert j.append("k", b"11", timestamp_ms=2_000) == 11
    j.close()
    j = _journal(tmp_path)
    assert [(s.first, s.last) for s in j.closed_segments()] == [(1, 10)]
    read, at = [], 1
    while batch := j.read(at, max_records=20):  # a read ends at its segment's end
        read += [r.body for r in batch]
        at = batch[-1].sequence + 1
    assert read == [b"%d" % i for i in range(1, 12)]
    j.close()

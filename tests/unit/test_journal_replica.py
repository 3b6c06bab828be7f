"""A follower's journal copies the leader's byte for byte (real files): segment rolls, producer
marks, epochs, a diverged tail cut by epoch history (KIP-101), and a copy started over; a compacted
stream's segments, copied by sequence where one side compacted them."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from zeps.journal import Journal, JournalConfig, JournalError, Record
from zeps.journal.epochs import EpochHistory, EpochHistoryError
from zeps.journal.producers import Producer

_CONFIG = JournalConfig(segment_bytes=2000, fsync="always", index_interval_bytes=300)


def _journal(path: Path) -> Journal:
    return Journal(path, _CONFIG, name="test").open()


def _all(j: Journal) -> list[Record]:
    out, seq = [], j.first_sequence
    while batch := j.read(seq, max_records=100):
        out += batch
        seq = batch[-1].sequence + 1
    return out


def _copy(leader: Journal, follower: Journal, max_bytes: int = 700, *, indexed: bool = True) -> int:
    """Fetch from ``leader`` until ``follower`` has everything durable; returns the fetches made.
    ``indexed``: with the leader's record offsets and marks (as REPLICA-DATA carries them), else walked."""
    for fetches in range(1, 10_000):
        base, offset, last = follower.replica_position()
        part = leader.replica_read(base, offset, last, max_bytes)
        if part.reset:
            follower.replica_reset(part.base)
        elif part.data and (indexed or part.gapped):
            follower.replica_write(part.base, part.offset, part.data, starts=part.starts, marks=part.marks,
                                   gapped=part.gapped)  # fmt: skip
        elif part.data:
            follower.replica_write(part.base, part.offset, part.data)
        elif part.next_base:
            follower.replica_roll(part.next_base, gapped=part.gapped)
        else:
            return fetches
        follower.sync()
    raise AssertionError("the copy never caught up")


def _files(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(path.glob("*.log"))}


def _publish(j: Journal, start: int, count: int, producer: str = "p") -> None:
    """Records ``start + 1 ..`` of an idempotent producer, one append (and group mark) each."""
    now = int(time.time() * 1000)  # the producer table forgets producers idle for a day
    for i in range(start, start + count):
        j.append_many([(f"k.{i % 4}", b"body-%d" % i)], timestamp_ms=1000 + i,
                      changes={producer: Producer(1, i + 1, now)})  # fmt: skip


def test_a_follower_copies_segments_marks_and_producers_byte_for_byte(tmp_path: Path) -> None:
    leader = _journal(tmp_path / "leader")
    leader.epochs.begin(1, leader.next_sequence)
    _publish(leader, 0, 120)
    follower = _journal(tmp_path / "follower")
    _copy(leader, follower)
    assert len(_files(tmp_path / "leader")) > 3  # several rolls were copied
    assert _files(tmp_path / "follower") == _files(tmp_path / "leader")
    walked = _journal(tmp_path / "walked")  # the same, checking every record as recovery does
    _copy(leader, walked, indexed=False)
    assert _files(tmp_path / "walked") == _files(tmp_path / "leader")
    for path in (tmp_path / "leader").glob("*.off"):  # where each record starts: the leader's own entries
        assert (tmp_path / "follower" / path.name).read_bytes() == path.read_bytes(), path.name
    # the sparse time index is the follower's own (every ~300 bytes here): it finds the same records
    assert [follower.seek_time(1000 + i) for i in range(0, 121, 7)] == [leader.seek_time(1000 + i)
                                                                       for i in range(0, 121, 7)]  # fmt: skip
    assert _all(follower) == _all(leader)
    assert follower.producers.producers["p"].sequence == 120  # the idempotent table came with the marks
    follower.close()
    again = _journal(tmp_path / "follower")  # the copy is a journal like any other: it opens, and goes on
    assert _all(again) == _all(leader) and again.next_sequence == 121
    assert again.producers.producers["p"].sequence == 120
    again.append("k", b"as leader")
    assert again.written == 121


def test_a_copy_follows_a_live_leader_and_only_gets_durable_bytes(tmp_path: Path) -> None:
    config = JournalConfig(segment_bytes=2000, fsync="group", group_commit_ms=60_000)
    leader = Journal(tmp_path / "leader", config).open()
    follower = _journal(tmp_path / "follower")
    leader.append("k", b"written, not durable")
    _copy(leader, follower)
    assert follower.written == 0  # nothing a machine crash could take back leaves the leader
    leader.sync()
    _copy(leader, follower)
    assert follower.written == 1
    for i in range(50):
        leader.append("k", b"%d" % i)
        if i % 7 == 0:
            leader.sync()
            _copy(leader, follower, max_bytes=100)
    leader.sync()
    _copy(leader, follower)
    assert _files(tmp_path / "follower") == _files(tmp_path / "leader")


def test_a_diverged_tail_is_cut_where_the_leaders_epoch_ended(tmp_path: Path) -> None:
    """Old leader A wrote 1..30 in epoch 1 and 31..40 that nobody copied; B (copied 1..30) leads epoch
    2 and writes 31..45. A comes back: the end of its epoch 1 at B is 30, so it cuts 31..40 (its
    own) and copies B's 31..45."""
    a = _journal(tmp_path / "a")
    a.epochs.begin(1, 1)
    _publish(a, 0, 30)
    b = _journal(tmp_path / "b")
    _copy(a, b)
    b.epochs.adopt(a.epochs.newer_than(0), b.written)
    _publish(a, 30, 10)  # epoch 1, never copied
    b.epochs.begin(2, b.next_sequence)
    for i in range(15):
        b.append("new", b"epoch 2: %d" % i, timestamp_ms=5000)
    epoch, end = b.epochs.end_of(a.epochs.latest, b.written)
    assert (epoch, end) == (1, 30)
    a.truncate_after(end)
    assert a.written == 30 and a.epochs.entries == [(1, 1)]
    _copy(b, a)
    a.epochs.adopt(b.epochs.newer_than(a.epochs.latest), a.written)
    assert _all(a) == _all(b) and [r.key for r in _all(a)][30:] == ["new"] * 15
    assert _files(tmp_path / "a") == _files(tmp_path / "b")
    assert a.epochs.entries == [(1, 1), (2, 31)]
    assert a.producers.producers["p"].sequence == 30  # the cut producer marks went with their records


def test_an_epoch_begun_after_the_last_record_goes_with_a_cut_at_the_end(tmp_path: Path) -> None:
    """Replica A (1..5 of epoch 1) led epoch 2 from 6 but wrote nothing that lasted; C (1..9 of epoch 1)
    leads epoch 3, and A copies its 6..9. A's history must say those are epoch 1's: with its stale
    ``2 6`` kept (the cut at A's end used to return before the history was cut), a later leader
    holding the same 6..9 made A cut them, though it was in the in-sync set and they were committed
    (the simulation's seed 346)."""
    c = _journal(tmp_path / "c")
    c.epochs.begin(1, 1)
    _publish(c, 0, 9)
    a = _journal(tmp_path / "a")
    a.epochs.begin(1, 1)
    _publish(a, 0, 5)
    a.epochs.begin(2, 6)  # its leadership of epoch 2: nothing written in it lasted
    c.epochs.begin(3, c.next_sequence)
    found, end = c.epochs.end_of(a.epochs.latest, c.written)
    assert (found, end) == (1, 9)
    _, mine = a.epochs.end_of(found, a.written)
    a.truncate_after(min(end, mine))  # nothing to cut: A ends at 5
    assert a.written == 5 and a.epochs.entries == [(1, 1)]
    _copy(c, a)
    a.epochs.adopt(c.epochs.newer_than(a.epochs.latest), a.written)
    assert a.epochs.end_of(1, a.written) == (1, 9)  # a later leader's question: where does epoch 1 end here


def test_a_cut_back_into_a_closed_segment_reopens_it(tmp_path: Path) -> None:
    j = _journal(tmp_path)
    _publish(j, 0, 100)
    segments = len(_files(tmp_path))
    j.truncate_after(10)
    assert j.written == 10 and len(_files(tmp_path)) < segments
    assert [r.sequence for r in _all(j)] == list(range(1, 11))
    j.append("k", b"goes on")
    assert j.written == 11


def test_a_copy_behind_retention_starts_over(tmp_path: Path) -> None:
    config = JournalConfig(segment_bytes=2000, fsync="always", retention_bytes=4000)
    leader = Journal(tmp_path / "leader", config).open()
    follower = _journal(tmp_path / "follower")
    _publish(leader, 0, 20)
    _copy(leader, follower)
    _publish(leader, 20, 200, producer="q")
    leader.apply_retention()
    assert leader.first_sequence > follower.written + 1
    _copy(leader, follower)
    assert _files(tmp_path / "follower") == _files(tmp_path / "leader")
    assert follower.first_sequence == leader.first_sequence


def test_bytes_that_do_not_continue_the_copy_are_refused(tmp_path: Path) -> None:
    leader, follower = _journal(tmp_path / "l"), _journal(tmp_path / "f")
    _publish(leader, 0, 5)
    part = leader.replica_read(1, 0, 0)
    with pytest.raises(JournalError, match="segment 1 at 5, but this copy ends at 0 of segment 1"):
        follower.replica_write(1, 5, part.data)
    damaged = bytearray(part.data)
    damaged[-1] ^= 0xFF
    with pytest.raises(JournalError, match="damaged"):
        follower.replica_write(1, 0, bytes(damaged))
    with pytest.raises(JournalError, match=r"records 1\.\.4 where 1\.\.5 were due|the last entry ends"):
        follower.replica_write(1, 0, part.data, starts=part.starts[:-4], marks=part.marks)  # an index one short
    assert follower.written == 0
    assert leader.replica_read(1, 7, 0).reset  # not where an entry ends: start over


def test_epoch_history_file(tmp_path: Path) -> None:
    h = EpochHistory(tmp_path / "epochs").load()
    assert h.end_of(3, 10) == (0, 10)
    h.begin(1, 1)
    h.begin(4, 20)
    with pytest.raises(EpochHistoryError):
        h.begin(3, 30)
    assert EpochHistory(tmp_path / "epochs").load().entries == [(1, 1), (4, 20)]
    assert h.end_of(1, 25) == (1, 19) and h.end_of(3, 25) == (1, 19) and h.end_of(9, 25) == (4, 25)
    assert h.end_of(0, 25) == (0, 0)
    h.truncate(19)
    assert h.entries == [(1, 1)]
    (tmp_path / "epochs").write_text("2 5\n1 9\n")
    with pytest.raises(EpochHistoryError, match="line 2 goes backwards"):
        EpochHistory(tmp_path / "epochs").load()


def test_an_epoch_history_change_a_full_volume_refused_is_not_taken_in_memory_either(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The file's replacement fails (ENOSPC, put in its place here: a filled tmpfs is
    tests/integration/test_replication_disk.py's): ``begin``, ``adopt`` and ``truncate`` leave the
    entries as the file holds them, so the next try writes the change (before, an adopted epoch was
    taken in memory only, never written again: after a restart its records counted as the older
    epoch's, and a comeback cut them)."""
    import errno  # noqa: PLC0415

    import zeps.journal.epochs as epochs_module  # noqa: PLC0415
    from zeps.journal import JournalWriteError  # noqa: PLC0415

    h = EpochHistory(tmp_path / "epochs").load()
    h.begin(1, 1)

    def full(_path: Path, _data: bytes) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    real = epochs_module.replace_file
    monkeypatch.setattr(epochs_module, "replace_file", full)
    for change in (lambda: h.begin(2, 5), lambda: h.adopt([(1, 1), (3, 9)], written=20), lambda: h.truncate(0)):
        with pytest.raises(JournalWriteError) as failed:
            change()
        assert failed.value.space
        assert h.entries == [(1, 1)] == EpochHistory(tmp_path / "epochs").load().entries
    monkeypatch.setattr(epochs_module, "replace_file", real)
    assert h.adopt([(1, 1), (3, 9)], written=20)  # there is space again: the same change is made
    assert EpochHistory(tmp_path / "epochs").load().entries == [(1, 1), (3, 9)]


@pytest.mark.pure
def test_a_slice_cut_below_the_durable_end_comes_from_the_index_not_a_walk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A follower further behind than ``max_bytes``: the leader cuts each slice at a record's or a
    group mark's start found in its index and marks, without walking the records (what made a busy
    leader's loop slow); groups (a mark and its records) still go whole, and the copy is the leader's
    byte for byte. Plain appends and groups mixed; a group larger than ``max_bytes`` goes whole in a
    slice of its own."""
    import zeps.journal.copying as copying_module  # noqa: PLC0415

    config = JournalConfig(segment_bytes=1 << 20, fsync="always", index_interval_bytes=300)
    leader = Journal(tmp_path / "leader", config, name="test").open()
    now = int(time.time() * 1000)
    for i in range(300):
        if i % 3 == 0:  # an idempotent producer's group of three records (every tenth larger than a slice)
            body = b"G" * 200 if i % 30 == 0 else b"g" * 40
            leader.append_many([(f"k.{i}", body)] * 3, changes={"p": Producer(1, i + 3, now)})
        else:
            leader.append_many([(f"k.{i}", b"x" * (i % 60))])
    walks = []
    real_walk = copying_module.walk_segment
    monkeypatch.setattr(copying_module, "walk_segment", lambda data, base: walks.append(base) or real_walk(data, base))
    read = leader.replica_read
    slices = []

    def checked(base: int, offset: int, last: int, max_bytes: int) -> Any:
        part = read(base, offset, last, max_bytes)
        _, _, whole = real_walk(part.data, last + 1)  # where its last whole entry and group end
        slices.append((len(part.data), whole))
        return part

    monkeypatch.setattr(leader, "replica_read", checked)
    follower = Journal(tmp_path / "follower", config, name="test").open()
    fetches = _copy(leader, follower, max_bytes=500)
    assert all(size == whole for size, whole in slices), "a slice ended inside a group"
    assert fetches > 20 and walks == []  # many slices below the durable end, none walked by the leader
    assert 0 < sum(size > 500 for size, _ in slices) <= 10  # a slice that begins with a large group holds it whole
    assert _files(tmp_path / "follower") == _files(tmp_path / "leader")
    assert _all(follower) == _all(leader) and follower.producers.producers["p"].sequence == 300


def _open_journal_files(path: Path) -> list[str]:
    """This process's descriptors on files under ``path`` (deleted ones too: Linux shows them)."""
    fds = Path("/proc/self/fd")
    names = []
    for fd in fds.iterdir():
        try:
            target = str(fd.readlink())
        except OSError:
            continue  # closed since the listing
        if target.startswith(str(path)):
            names.append(target)
    return names


def test_the_readers_descriptors_are_bounded_and_closed_before_their_files_go(tmp_path: Path) -> None:
    """A leader keeps its segment files open for reading between fetches (a fetch reads them several
    times), at most 8 of them, and closes a descriptor before retention or a truncation removes its
    file, so no deleted segment stays open and nothing is read from one."""
    config = JournalConfig(segment_bytes=2000, fsync="always", retention_bytes=4000, index_interval_bytes=300)
    leader = Journal(tmp_path / "leader", config).open()
    _publish(leader, 0, 300)
    follower = _journal(tmp_path / "follower")
    _copy(leader, follower, max_bytes=300)  # from the oldest segment kept, through every later one
    readers = [p for p in _open_journal_files(tmp_path / "leader") if p.endswith(".log") or p.endswith(".off")]
    assert 2 <= len(readers) <= 8 + 2, readers  # the cache's 8, and the active segment's two writers
    _publish(leader, 300, 200)
    assert leader.apply_retention()
    assert not [p for p in _open_journal_files(tmp_path) if "(deleted)" in p]
    assert _all(leader)[0].sequence == leader.first_sequence  # reads open what they need again
    follower.truncate_after(follower.written - 50)  # a cut closes and reopens the follower's files
    assert not [p for p in _open_journal_files(tmp_path) if "(deleted)" in p]
    assert [r.sequence for r in _all(follower)][-1] == follower.written
    leader.close()
    follower.close()
    assert _open_journal_files(tmp_path) == []


def test_a_journal_that_copied_records_then_appends_again_reads_every_record_in_place(tmp_path: Path) -> None:
    """A replica leads (its appends go to the tail cache), follows (its copy is written around the
    cache), then leads again: reads must never join the old cached run to the new one as if
    consecutive (found by the replication simulation: the broker's loop failed with an IndexError
    reading a copied range, and a replay across the gap labelled later records with earlier sequences)."""
    f, leader = _journal(tmp_path / "f"), _journal(tmp_path / "l")
    for i in range(1, 4):
        f.append("k", b"f-%d" % i)
    _copy(f, leader)
    for i in range(4, 7):
        leader.append("k", b"l-%d" % i)
    _copy(leader, f)
    f.append("k", b"f-7")
    f.sync()
    assert [(r.sequence, r.body) for r in _all(f)] == [(1, b"f-1"), (2, b"f-2"), (3, b"f-3"), (4, b"l-4"),
                                                      (5, b"l-5"), (6, b"l-6"), (7, b"f-7")]  # fmt: skip
    assert [r.sequence for r in f.read(5)] == [5, 6, 7]
    assert [(r.sequence, r.body) for r in f.read(2, max_records=10)][:2] == [(2, b"f-2"), (3, b"f-3")]


_COMPACTED = JournalConfig(segment_bytes=1500, fsync="always", index_interval_bytes=300, cleanup="compact",
                           min_cleanable_ratio=0.0)  # fmt: skip


def _compacted(path: Path) -> Journal:
    return Journal(path, _COMPACTED, name="test").open()


def _keyed(j: Journal, start: int, count: int, keys: int = 6) -> dict[int, Record]:
    """Records ``start + 1 ..`` over ``keys`` keys (every fifth of a key of its own, never superseded),
    one append each; what was written, by sequence."""
    for i in range(start, start + count):
        j.append(f"k.{i % keys}" if i % 5 else f"own.{i}", b"value-%d" % i, timestamp_ms=1000 + i)
    return {r.sequence: r for r in _all(j) if r.sequence > start}


def _holds_only_what_was_written(j: Journal, written: dict[int, Record]) -> list[Record]:
    """Every record ``j`` reads back is the one written at its sequence; returns them."""
    records = _all(j)
    assert records and all(written[r.sequence] == r for r in records)
    return records


def test_a_follower_copies_a_compacted_leader_by_sequence_and_opens_the_copy_again(tmp_path: Path) -> None:
    """The leader compacted its closed segments (keeping a record in five, some ending in gaps): an empty
    follower copies them (gapped slices), and holds exactly the leader's records, each at its sequence;
    its copy opens again and goes on as a journal."""
    leader = _compacted(tmp_path / "leader")
    written = _keyed(leader, 0, 200)
    report = leader.compact(force=True)
    assert report is not None and report.removed > 100
    kept = {r.sequence for r in _all(leader)}
    gapped = [s for s in leader._segments[:-1] if s.gapped]
    # a segment whose last records are gone: the follower's roll lands beyond its next sequence
    assert any(max((q for q in kept if s.base <= q <= s.last_seq), default=0) < s.last_seq for s in gapped)
    follower = _compacted(tmp_path / "follower")
    _copy(leader, follower, max_bytes=200)
    assert _all(follower) == _all(leader) == _holds_only_what_was_written(leader, written)
    assert follower.written == leader.written == 200 and follower.next_sequence == 201
    assert [s.base for s in follower._segments] == [s.base for s in leader._segments]
    follower.close()
    again = _compacted(tmp_path / "follower")
    assert _all(again) == _all(leader) and again.next_sequence == 201
    more = _keyed(leader, 200, 40)
    _copy(leader, again)  # in step again: the leader's active segment, byte for byte
    assert _all(again) == _all(leader) and all(more[r.sequence] == r for r in _all(again) if r.sequence > 200)


def test_a_follower_part_way_through_a_segment_the_leader_then_compacts_goes_on_by_sequence(tmp_path: Path) -> None:
    """A follower copied part of a segment uncompacted; the leader closes and compacts it: the follower
    goes on from its last sequence (no start over), its copy ends holding each record the leader holds,
    every record it holds is the one written at its sequence, and each key's latest value is the
    leader's. A crash with gaps in its active segment: it opens, and the copy goes on."""
    leader = _compacted(tmp_path / "leader")
    written = _keyed(leader, 0, 60)
    follower = _compacted(tmp_path / "follower")
    _copy(leader, follower)
    assert follower.written == 60 and len(leader._segments) == 2  # within the leader's second segment
    written |= _keyed(leader, 60, 140)
    leader.compact(force=True)
    assert leader._segments[1].gapped  # the segment the follower is in was compacted
    follower_segment = follower._segments[-1].base
    part = leader.replica_read(follower_segment, follower._segments[-1].size, follower.written, 200)
    assert part.gapped and not part.reset and part.data
    follower.replica_write(part.base, part.offset, part.data, starts=part.starts, marks=part.marks, gapped=True)
    follower.sync()
    assert follower._segments[-1].gapped  # the gaps are in its active segment now
    follower.close()  # a crash: the active segment is opened from its bytes, gaps and all
    follower = _compacted(tmp_path / "follower")
    assert follower._segments[-1].gapped and follower.written > 60
    _copy(leader, follower, max_bytes=150)
    held = _holds_only_what_was_written(follower, written)
    leader_records = _all(leader)
    assert {r.sequence for r in leader_records} <= {r.sequence for r in held}
    assert {r.key: r.body for r in held} == {r.key: r.body for r in leader_records}
    assert follower.next_sequence == leader.next_sequence == 201


def test_a_follower_that_compacted_its_own_copy_goes_on_from_a_leader_that_did_not(tmp_path: Path) -> None:
    """Each replica compacts its own closed segments: a follower whose tail is cut back to where a
    segment it compacted ends (the epochs said so) keeps that segment closed and goes on after it."""
    leader = _compacted(tmp_path / "leader")
    written = _keyed(leader, 0, 120)
    follower = _compacted(tmp_path / "follower")
    _copy(leader, follower)
    follower.compact(force=True)
    closed = follower._segments[-2]
    assert closed.gapped
    follower.truncate_after(closed.last_seq)
    assert follower._segments[-1].base == closed.last_seq + 1 and follower._segments[-2].gapped
    _copy(leader, follower)
    assert not any(p.reset for p in [leader.replica_read(*follower.replica_position())])
    assert _holds_only_what_was_written(follower, written)[-1].sequence == 120
    assert follower.next_sequence == leader.next_sequence == 121
    leader.append("k.0", b"after", timestamp_ms=5000)
    _copy(leader, follower)
    assert _all(follower)[-1] == _all(leader)[-1]


def _last_kept(seg: Any, kept: set[int]) -> int:
    return max((q for q in kept if seg.base <= q <= seg.last_seq), default=0)


def test_a_cut_after_a_copied_compacted_segment_keeps_where_it_ends(tmp_path: Path) -> None:
    """A follower copied a segment its leader compacted down to an earlier last record (its roll made
    the last sequences gaps), then the leader's snapshot mark of the next segment; a new leader's
    history cuts it after that segment's last sequence: the compacted segment stays closed, ending
    where it did (opened again as the active one, it would seem to end at its last kept record, below
    what the follower had counted), and the copy goes on. (Found by the replication simulation.)"""
    leader = _compacted(tmp_path / "leader")
    _keyed(leader, 0, 200)
    leader.compact(force=True)
    kept = {r.sequence for r in _all(leader)}
    ending = next(s for s in leader._segments[:-1] if s.gapped and _last_kept(s, kept) < s.last_seq)
    follower = _compacted(tmp_path / "follower")
    for _ in range(1000):  # copy until past that segment's roll, and the next segment's first bytes
        base, offset, last = follower.replica_position()
        if base == ending.last_seq + 1 and offset > 0:
            break
        part = leader.replica_read(base, offset, last, 1)  # an entry at a time
        if part.data:
            follower.replica_write(part.base, part.offset, part.data, starts=part.starts, marks=part.marks,
                                   gapped=part.gapped)  # fmt: skip
        elif part.next_base:
            follower.replica_roll(part.next_base, gapped=part.gapped)
    assert follower.written == ending.last_seq and follower._segments[-2].gapped
    follower.truncate_after(ending.last_seq)
    assert follower.written == ending.last_seq and follower._segments[-1].base == ending.last_seq + 1
    _copy(leader, follower)
    assert _all(follower) == _all(leader) and follower.next_sequence == leader.next_sequence
    # caught up in a segment laid out its own way: the leader has nothing more for it (no busy answers)
    assert not leader.replica_has_more(*follower.replica_position())


def test_a_compacted_segment_read_whole_again_ends_where_the_next_begins(tmp_path: Path) -> None:
    """A closed segment whose last records compaction removed, opened without its seal (read whole):
    it still ends where the next segment begins, its last sequences gaps (before, it seemed to end
    at its last kept record, and a follower's cut after its real end failed on a missing offset,
    for good; found by the replication simulation)."""
    j = _compacted(tmp_path / "j")
    _keyed(j, 0, 200)
    j.compact(force=True)
    kept = {r.sequence for r in _all(j)}
    ending = next(s for s in j._segments[:-1] if s.gapped and _last_kept(s, kept) < s.last_seq)
    records = _all(j)
    j.close()
    ending.path.with_suffix(".seal").unlink()
    again = _compacted(tmp_path / "j")
    reopened = next(s for s in again._segments if s.base == ending.base)
    assert (reopened.last_seq, reopened.gapped) == (ending.last_seq, True)
    assert _all(again) == records
    again.truncate_after(again.written)  # a cut at the end: nothing to cut, no offset missing
    assert _all(again) == records

"""A compacted stream tiered to an object store, against a real ZooKeeper and a directory store:
runs uploaded before compaction are uploaded again once compaction shrank their local segments, as
the next generation of their manifest entry, and the older generation is deleted; a crash at any
step of that leaves what the next round finishes; a replay from the store reads each key's latest
record, the sequences with gaps, runs compaction emptied skipped.

A crash is an exception the uploader does not catch (a BaseException) raised inside the store at the
step under test, as in test_tiering.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness import ZooKeeperHarness
from zeps.batchstore import FileBatchStore
from zeps.journal import Journal, JournalConfig, Record
from zeps.paths import StreamPaths
from zeps.tiering import State, TierReader, TierUploader, read_manifest

KEYS = 7


class Crash(BaseException):
    """The uploader's process dies here."""


class _Crashing(FileBatchStore):
    """A directory store whose ``n``-th put or delete from now dies, before it is applied or after."""

    def __init__(self, url: str, n: int, after: bool) -> None:
        super().__init__(url)
        self.n, self.after = n, after

    def _before(self) -> None:
        self.n -= 1
        if self.n == 0 and not self.after:
            raise Crash

    def put(self, key: str, data: bytes) -> str:
        self._before()
        reference = super().put(key, data)
        if self.n == 0 and self.after:
            raise Crash
        return reference

    def delete(self, url: str) -> None:
        self._before()
        super().delete(url)
        if self.n == 0 and self.after:
            raise Crash


def _journal(path: Path) -> Journal:
    config = JournalConfig(segment_bytes=2000, fsync="always", cleanup="compact", min_cleanable_ratio=0.0,
                           tombstone_retention_ms=10**12, retention_bytes=1)  # fmt: skip
    return Journal(path, config).open()


def _fill(j: Journal, count: int) -> dict[str, bytes]:
    """``count`` records over KEYS keys (a delete of k.3 last but one); each key's latest body."""
    latest: dict[str, bytes] = {}
    for i in range(count):
        key, body = f"k.{i % KEYS}", b"body-%05d" % i
        if i == count - 2:
            key, body = "k.3", b""  # a tombstone
        j.append(key, body, timestamp_ms=10_000 + i)
        latest[key] = body
    return latest


def _paths(zookeeper: ZooKeeperHarness) -> StreamPaths:
    return StreamPaths.of("shop", "prices", chroot=zookeeper.root)


def _drain(uploader: TierUploader, j: Journal) -> None:
    for _ in range(3 * len(j.closed_segments()) + 3):
        result = uploader.step(j.closed_segments(), j.durable, now_ms=20_000, compacts=True)
        assert not result.error, result.error
        if result.uploaded is None and not result.deleted:
            return
    raise AssertionError("uploads did not end")


def _replay(reader: TierReader, j: Journal) -> list[Record]:
    """Every record from 1: the store's part below the journal's first record, then the journal's."""
    reader.refresh()
    out: list[Record] = []
    at = 1
    while at < j.first_sequence and (chunk := reader.read_chunk(at, max_bytes=300, end=j.first_sequence - 1)):
        out += chunk.records()
        at = chunk.last + 1
    return out + _local(j, max(at, j.first_sequence))


def _local(j: Journal, at: int) -> list[Record]:
    out: list[Record] = []
    while (chunk := j.read_chunk(at)) is not None:
        out += chunk.records()
        at = chunk.last + 1
    return out


def _store_matches_manifest(root: Path, zookeeper: ZooKeeperHarness) -> list:  # type: ignore[type-arg]
    entries, refused = read_manifest(zookeeper.client(), _paths(zookeeper))
    assert refused == 0 and all(e.state == State.COPY_FINISHED for e in entries)
    assert sorted(p.name for p in root.glob("*.batch")) == sorted(f"{e.key}.batch" for e in entries)
    assert len({e.first for e in entries}) == len(entries), "one generation of each run"
    return entries


def test_compacted_runs_are_uploaded_again_and_a_replay_from_the_store_reads_each_key_s_latest_record(
    zookeeper: ZooKeeperHarness, tmp_path: Path
) -> None:
    """Runs uploaded as they closed; compaction then removes what later records superseded: each
    shrunk run is uploaded again (generation 1; emptied ones as empty objects) and its older object
    deleted. After local retention a replay from 0 reads each key's latest record (the delete
    included), sequences rising with gaps, each record the one the journal held at its sequence."""
    j = _journal(tmp_path / "journal")
    latest = _fill(j, 600)
    full = {r.sequence: r for r in _local(j, 1)}
    root = tmp_path / "store"
    uploader = TierUploader(zookeeper.client(), _paths(zookeeper), FileBatchStore(root.as_uri()), epoch=0)
    _drain(uploader, j)
    before = _store_matches_manifest(root, zookeeper)
    assert all(e.generation == 0 and e.records is None for e in before) and len(before) >= 8

    stale = TierReader(zookeeper.client(), _paths(zookeeper), FileBatchStore(root.as_uri()))
    stale.refresh()  # the manifest as it is before compaction: generation 0 everywhere
    report = j.compact(now_ms=30_000, force=True)
    assert report is not None and report.removed > 0
    _drain(uploader, j)
    after = _store_matches_manifest(root, zookeeper)
    assert [(e.first, e.last) for e in after] == [(e.first, e.last) for e in before], "the same runs"
    assert any(e.generation == 1 for e in after), "shrunk runs uploaded again"
    assert any(e.records == 0 for e in after), "runs compaction emptied: empty objects"
    assert sum(e.size for e in after) < sum(e.size for e in before)

    j.apply_retention(tiered_to=after[-1].last)
    assert j.first_sequence > after[-1].last, "the local copies of the store's runs are gone"
    reader = TierReader(zookeeper.client(), _paths(zookeeper), FileBatchStore(root.as_uri()))
    replayed = _replay(reader, j)
    sequences = [r.sequence for r in replayed]
    assert sequences == sorted(set(sequences)) and len(sequences) < 600, "rising, with gaps"
    assert all(full[r.sequence] == r for r in replayed), "each record the journal held at its sequence"
    first = next(e for e in after if e.generation == 1 and e.records)
    chunk = stale.read_chunk(first.first, max_bytes=1 << 20, end=first.last)  # its generation 0 is gone
    assert chunk is not None and [r.sequence for r in chunk.records()] == [
        r.sequence for r in replayed if first.first <= r.sequence <= first.last
    ], "a reader that knew the older generation reads the newer one"
    table: dict[str, bytes] = {}
    for record in replayed:
        table[record.key] = record.body
    assert table == latest and table["k.3"] == b"", "each key's latest record, the delete included"
    reader.close()
    stale.close()
    j.close()


@pytest.mark.parametrize("n", [1, 2, 3])
@pytest.mark.parametrize("after", [False, True])
def test_an_upload_of_a_compacted_run_cut_off_at_any_step_is_finished_by_the_next_round(
    zookeeper: ZooKeeperHarness, tmp_path: Path, n: int, after: bool
) -> None:
    """The uploader dies at the first, second or third store call of a compacted run's new upload (its
    put, the older generation's delete, the next run's put), before the call is applied or after. The
    next uploader's rounds leave exactly one finished generation per run, the store's objects the
    manifest's, and a replay the same records as one never cut off."""
    j = _journal(tmp_path / "journal")
    _fill(j, 600)
    root = tmp_path / "store"
    _drain(TierUploader(zookeeper.client(), _paths(zookeeper), FileBatchStore(root.as_uri()), epoch=1), j)
    j.compact(now_ms=30_000, force=True)
    dying = TierUploader(zookeeper.client(), _paths(zookeeper), _Crashing(root.as_uri(), n, after), epoch=1)
    with pytest.raises(Crash):
        _drain(dying, j)
    _drain(TierUploader(zookeeper.client(), _paths(zookeeper), FileBatchStore(root.as_uri()), epoch=2), j)
    entries = _store_matches_manifest(root, zookeeper)
    j.apply_retention(tiered_to=entries[-1].last)
    reader = TierReader(zookeeper.client(), _paths(zookeeper), FileBatchStore(root.as_uri()))
    got = [r.sequence for r in _replay(reader, j)]
    expected_journal = _journal(tmp_path / "again")
    _fill(expected_journal, 600)
    expected_journal.compact(now_ms=30_000, force=True)
    assert got == [r.sequence for r in _local(expected_journal, 1)]
    expected_journal.close()
    reader.close()
    j.close()

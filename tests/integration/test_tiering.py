"""Tiered storage's uploads and reads against a real ZooKeeper and real object stores (SeaweedFS's S3,
and a directory): closed committed runs uploaded, the local journal trimmed only behind the store,
every record read back from 0; an upload or a deletion cut off at any step cleaned by the next
leader; a deposed leader fenced; the store stopped under writes losing nothing; manifest nodes and
cached objects written by someone else refused.

A crash is an exception the uploader does not catch (a BaseException) raised inside the store at the
step under test: the process would have died there with ZooKeeper and the store as they are then.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import obstore
import pytest
from obstore.store import S3Store

from harness import ZooKeeperHarness, tiered_records
from zeps.batchstore import BatchStore, FileBatchStore, ForeignObjectError, Prefetch, open_store
from zeps.coordination.fenced import FencedError
from zeps.journal import Journal, JournalConfig
from zeps.paths import StreamPaths
from zeps.tiering import Manifest, State, TierEntry, TierReader, TierUploader, read_manifest, tiered_to
from zeps.tiering.manifest import encode_entry, node_name, object_key
from zeps_dev.seaweedfs import SeaweedFS


class Crash(BaseException):
    """The uploader's process dies here."""


def _journal(path: Path) -> Journal:
    return Journal(path, JournalConfig(segment_bytes=2000, fsync="always", retention_bytes=1)).open()


def _fill(j: Journal, count: int) -> list[tuple[str, bytes, int]]:
    start = j.next_sequence
    for i in range(start, start + count):
        j.append(f"k.{i % 7}", b"body-%05d" % i, timestamp_ms=10_000 + i)
    return [(f"k.{i % 7}", b"body-%05d" % i, 10_000 + i) for i in range(start, start + count)]


def _paths(zookeeper: ZooKeeperHarness) -> StreamPaths:
    return StreamPaths.of("shop", "orders", chroot=zookeeper.root)


def _drain(uploader: TierUploader, j: Journal, commit: int) -> int:
    """Rounds until nothing is left to upload (at most one per closed segment, and a few); the last
    round's tiered_to."""
    for _ in range(len(j.closed_segments()) + 3):
        result = uploader.step(j.closed_segments(), commit, now_ms=20_000)
        assert not result.error, result.error
        if result.uploaded is None:
            return result.tiered_to
    raise AssertionError("uploads did not end")


def _bodies(reader: TierReader) -> list[bytes]:
    """The bodies of the first object's records, read from sequence 1."""
    chunk = reader.read_chunk(1, max_bytes=1 << 20)
    assert chunk is not None
    return [r.body for r in chunk.records()]


def _bucket_objects(server: SeaweedFS, bucket: str, prefix: str) -> list[str]:
    key, secret = server.admin
    raw = S3Store(bucket, endpoint=server.endpoint, region="us-east-1", access_key_id=key, secret_access_key=secret,
                  client_options={"allow_http": True})  # fmt: skip
    return sorted(o["path"] for batch in obstore.list(raw, prefix=prefix) for o in batch)


def test_committed_runs_go_to_s3_and_a_replay_from_0_after_local_deletion_reads_every_record(
    zookeeper: ZooKeeperHarness, seaweedfs_server: SeaweedFS, s3_url: str, tmp_path: Path
) -> None:
    """Runs wholly at or below the commit point are uploaded, oldest first, the active segment never;
    local retention then deletes only what the store holds; a replay from 0 reads the store's part and
    the journal's, every record once in order; the objects in the bucket are the manifest's."""
    j = _journal(tmp_path / "journal")
    written = _fill(j, 400)
    closed = j.closed_segments()
    assert len(closed) >= 6
    store = open_store(s3_url, endpoint=seaweedfs_server.endpoint)
    uploader = TierUploader(zookeeper.client(), _paths(zookeeper), store, epoch=1)

    commit = closed[4].last + 3  # the commit point inside the sixth segment: five are wholly below it
    assert _drain(uploader, j, commit) == closed[4].last
    assert j.apply_retention(tiered_to=closed[4].last) == [s.first for s in closed[:5]]
    assert j.apply_retention(tiered_to=closed[4].last) == [], "nothing the store lacks is deleted"

    done = _drain(uploader, j, j.durable)
    assert done == closed[-1].last < j.next_sequence - 1, "every closed segment, never the active one"
    j.apply_retention(tiered_to=done)
    assert j.first_sequence == closed[-1].last + 1

    reader = TierReader(zookeeper.client(), _paths(zookeeper), store, cache=tmp_path / "cache")
    replayed = tiered_records(reader, j, max_bytes=700)
    assert [(r.key, r.body, r.timestamp_ms) for r in replayed] == written
    assert [r.sequence for r in replayed] == list(range(1, 401))
    assert reader.seek_time(10_000 + 57) == 57
    entries, refused = read_manifest(zookeeper.client(), _paths(zookeeper))
    assert refused == 0 and all(e.state == State.COPY_FINISHED for e in entries)
    bucket, prefix = s3_url.removeprefix("s3://").split("/", 1)
    assert _bucket_objects(seaweedfs_server, bucket, prefix) == sorted(f"{prefix}/{e.key}.batch" for e in entries)
    j.close()


class _Crashing(FileBatchStore):
    """A directory store whose next put or delete dies: before its object is written, or after."""

    def __init__(self, url: str, when: str) -> None:
        super().__init__(url)
        self.when = when

    def put(self, key: str, data: bytes) -> str:
        if self.when == "before put":
            raise Crash
        reference = super().put(key, data)
        if self.when == "after put":
            raise Crash
        return reference

    def delete(self, url: str) -> None:
        if self.when == "before delete":
            raise Crash
        super().delete(url)


@pytest.mark.parametrize("when", ["before put", "after put", "before delete"])
def test_an_uploader_that_dies_at_any_step_leaves_what_the_next_leader_cleans_or_finishes(
    zookeeper: ZooKeeperHarness, tmp_path: Path, when: str
) -> None:
    """The leader dies before its object is written, after (its copy never marked finished), or while
    deleting what retention no longer keeps; the next leader's first round deletes the object and node
    left (nobody ever reads a copy-started entry), and the run is uploaded again under a new name. At
    the end the store's objects are exactly the manifest's, every one copy-finished, and the records
    read back whole."""
    j = _journal(tmp_path / "journal")
    written = _fill(j, 120)
    root = tmp_path / "store"
    url = root.as_uri()
    old = TierUploader(zookeeper.client(), _paths(zookeeper), _Crashing(url, when), epoch=1)
    if when == "before delete":
        _drain(old, j, j.durable)
        with pytest.raises(Crash):  # all of it past retention by age: the first deletion dies
            old.step(j.closed_segments(), j.durable, now_ms=10**9, retention_ms=1000)
    else:
        with pytest.raises(Crash):
            old.step(j.closed_segments(), j.durable, now_ms=20_000)
    left, _ = read_manifest(zookeeper.client(), _paths(zookeeper))
    assert [e.state for e in left if e.state != State.COPY_FINISHED] == [
        State.DELETE_STARTED if when == "before delete" else State.COPY_STARTED
    ]
    if when == "after put":
        assert len(list(root.glob("*.batch"))) == 1, "the object landed; no finished entry names it"

    new = TierUploader(zookeeper.client(), _paths(zookeeper), FileBatchStore(url), epoch=2)
    done = _drain(new, j, j.durable)
    entries, _ = read_manifest(zookeeper.client(), _paths(zookeeper))
    assert all(e.state == State.COPY_FINISHED for e in entries)
    assert sorted(p.name for p in root.glob("*.batch")) == sorted(f"{e.key}.batch" for e in entries)
    if when == "before delete":
        assert entries[0].first > 1, "the deletion the old leader began is finished; the rest stays as it was"
    else:
        assert done == j.closed_segments()[-1].last
        j.apply_retention(tiered_to=done)
        reader = TierReader(zookeeper.client(), _paths(zookeeper), FileBatchStore(url))
        assert [(r.key, r.body, r.timestamp_ms) for r in tiered_records(reader, j, max_bytes=700)] == written
    j.close()


def test_a_deposed_leader_is_fenced_from_the_manifest(zookeeper: ZooKeeperHarness, tmp_path: Path) -> None:
    """Once the leader of epoch 2 has claimed the uploads, the one of epoch 1 writes nothing more: its
    round fails with FencedError before any change, whatever it was about to do, and it cannot claim
    them back; the manifest is the new leader's alone."""
    j = _journal(tmp_path / "journal")
    _fill(j, 200)
    segments = j.closed_segments()
    store = FileBatchStore((tmp_path / "store").as_uri())
    old = TierUploader(zookeeper.client(), _paths(zookeeper), store, epoch=1)
    assert old.step(segments, segments[0].last, now_ms=0).uploaded is not None
    new = TierUploader(zookeeper.client(), _paths(zookeeper), store, epoch=2)
    assert new.step(segments, segments[1].last, now_ms=0).uploaded is not None
    before, _ = read_manifest(zookeeper.client(), _paths(zookeeper))
    with pytest.raises(FencedError, match="epoch 2, newer than 1"):
        old.step(segments, j.durable, now_ms=0)
    # a write already past its claim (the old leader paused between its claim and its write) is refused too
    old.nodes._version = 0
    with pytest.raises(FencedError, match="claimed by a newer epoch"):
        old.nodes.create("00000000000000099999", b"{}")
    after, _ = read_manifest(zookeeper.client(), _paths(zookeeper))
    assert after == before and [e.epoch for e in after] == [1, 2]
    j.close()


def test_the_store_stopped_under_writes_loses_nothing_and_the_backlog_drains_when_it_returns(
    zookeeper: ZooKeeperHarness, own_seaweedfs: SeaweedFS, tmp_path: Path
) -> None:
    """A server of its own (the session's must not stop). While it is down each round fails with the
    store's error and a growing backoff; the backlog (segments, bytes) grows with the journal; local
    retention deletes nothing the store lacks. Started again on the same data, the rounds upload the
    backlog and every record reads back from 0."""
    server = own_seaweedfs
    j = _journal(tmp_path / "journal")
    written = _fill(j, 100)
    store: BatchStore = open_store("s3://own/orders", endpoint=server.endpoint)
    uploader = TierUploader(zookeeper.client(), _paths(zookeeper), store, epoch=1)
    first = _drain(uploader, j, j.durable)
    server.stop()
    written += _fill(j, 300)
    delays, backlogs = [], []
    for _ in range(3):
        result = uploader.step(j.closed_segments(), j.durable, now_ms=20_000)
        assert result.uploaded is None and "cannot be reached" in result.error
        delays.append(result.delay_s)
        backlogs.append((result.backlog_segments, result.backlog_bytes))
        assert result.tiered_to == first
    assert delays[0] < delays[2], "the backoff grows"
    assert backlogs[0][0] == len([s for s in j.closed_segments() if s.last > first]) > 3
    assert backlogs[0][1] > 4000
    j.apply_retention(tiered_to=first)
    assert j.first_sequence == first + 1, "local retention waits for the store"
    server.start()
    done = _drain(uploader, j, j.durable)
    assert done == j.closed_segments()[-1].last
    result = uploader.step(j.closed_segments(), j.durable, now_ms=20_000)
    assert (result.backlog_segments, result.backlog_bytes, result.delay_s) == (0, 0, 0.0)
    j.apply_retention(tiered_to=done)
    reader = TierReader(zookeeper.client(), _paths(zookeeper), store)
    assert [(r.key, r.body, r.timestamp_ms) for r in tiered_records(reader, j, max_bytes=700)] == written
    j.close()


def test_nodes_and_cached_objects_written_by_someone_else_are_refused(
    zookeeper: ZooKeeperHarness, tmp_path: Path
) -> None:
    """A node out of shape in the manifest is refused and counted (the store is read only up to the
    gap it leaves); a well-formed entry naming an object of another store is refused when read; a
    cached object damaged on disk is read from the store again; a cache of another reader serves the
    same objects without a fetch."""
    j = _journal(tmp_path / "journal")
    written = _fill(j, 100)
    store = FileBatchStore((tmp_path / "store").as_uri())
    uploader = TierUploader(zookeeper.client(), _paths(zookeeper), store, epoch=1)
    done = _drain(uploader, j, j.durable)
    client, paths = zookeeper.client(), _paths(zookeeper)
    client.create(f"{paths.tier_segments}/00000000000099999999", b'{"first": "all of them"}')
    entries, refused = read_manifest(client, paths)
    assert refused == 1 and tiered_to(entries) == done
    # one where the next upload's node goes: the leader removes it and uploads (it stalled them before)
    client.create(f"{paths.tier_segments}/{done + 1:020d}", b"not an entry")
    written += _fill(j, 60)
    done = _drain(uploader, j, j.durable)
    assert done == j.closed_segments()[-1].last and read_manifest(client, paths)[1] == 1, "only the other stays"
    entries, _ = read_manifest(client, paths)

    cache = tmp_path / "cache"
    first_object = [w[1] for w in written[: entries[0].last]]
    reader = TierReader(client, paths, store, cache=cache)
    reader.refresh()
    assert _bodies(reader) == first_object
    assert reader.fetches == 1
    again = TierReader(client, paths, store, cache=cache)
    again.refresh()
    assert again.read_chunk(1) is not None and again.fetches == 0, "served from the cache"
    damaged = cache / f"{entries[0].key}.records"
    damaged.write_bytes(damaged.read_bytes()[:-1] + b"?")
    third = TierReader(client, paths, store, cache=cache)
    third.refresh()
    assert _bodies(third) == first_object
    assert third.fetches == 1, "the damaged copy was read from the store again"

    forged = entries[0].finished("file:///etc/passwd.batch#crc32c=00000000")
    client.set(f"{paths.tier_segments}/{entries[0].first:020d}", encode_entry(forged))
    fourth = TierReader(client, paths, store)
    fourth.refresh()
    with pytest.raises(ForeignObjectError):
        fourth.read_chunk(1)
    j.close()


class _Counting(FileBatchStore):
    """A directory store that notes which thread read which object."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.reads: list[tuple[str, str]] = []

    def get(self, url: str, prefetched: Prefetch | None = None) -> memoryview:
        self.reads.append((Path(url.partition("#")[0]).name, threading.current_thread().name))
        return super().get(url, prefetched)


def test_a_replay_reading_forward_gets_each_object_once_the_next_one_begun_ahead(
    zookeeper: ZooKeeperHarness, tmp_path: Path
) -> None:
    """A replay from 0 through several objects: each object is read from the store once; every one
    but the first by the read-ahead thread, begun while the one before was read; the records come
    out whole and in order."""
    j = _journal(tmp_path / "journal")
    written = _fill(j, 300)
    url = (tmp_path / "store").as_uri()
    done = _drain(TierUploader(zookeeper.client(), _paths(zookeeper), FileBatchStore(url), epoch=1), j, j.durable)
    j.apply_retention(tiered_to=done)
    store = _Counting(url)
    reader = TierReader(zookeeper.client(), _paths(zookeeper), store)
    try:
        assert [(r.key, r.body, r.timestamp_ms) for r in tiered_records(reader, j, max_bytes=700)] == written
    finally:
        reader.close()
    objects = [f"{e.key}.batch" for e in reader.refresh()]
    assert len(objects) >= 4
    assert sorted(name for name, _ in store.reads) == sorted(objects), "each object read once"
    assert [thread.startswith("zeps-tier-ahead") for _, thread in store.reads] == [False] + [True] * (len(objects) - 1)
    j.close()


class _CountingZooKeeper:
    """A kazoo client whose node reads are counted."""

    def __init__(self, client: Any) -> None:
        self.client, self.reads = client, 0

    def get_async(self, path: str) -> Any:
        self.reads += 1
        return self.client.get_async(path)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)


def test_a_manifest_read_again_reads_only_new_and_unfinished_nodes_and_notices_a_name_made_again(
    zookeeper: ZooKeeperHarness,
) -> None:
    """Read again, the manifest lists its nodes and reads only the new ones and those not
    copy-finished (a finished entry changes only on its way out); a name removed and made again
    between two reads (the listing looks the same) is noticed by the child version, and every node is
    read again. What each read returns is what a full read returns."""
    zk, paths = zookeeper.client(), _paths(zookeeper)
    counting = _CountingZooKeeper(zk)
    manifest = Manifest(counting, paths)  # type: ignore[arg-type]

    def put(first: int, state: State = State.COPY_FINISHED, token: str = "0123456789abcdef") -> None:
        entry = TierEntry(first, first + 9, 1, object_key(first, first + 9, 1, token), state, 1, 2, 100,
                          "s3://b/p/x.batch#crc32c=00000000" if state == State.COPY_FINISHED else "")  # fmt: skip
        zk.ensure_path(paths.tier_segments)
        path = f"{paths.tier_segments}/{node_name(entry)}"
        if zk.exists(path):
            zk.set(path, encode_entry(entry))
        else:
            zk.create(path, encode_entry(entry))

    def check(reads: int) -> None:
        counting.reads = 0
        assert manifest.read() == read_manifest(zk, paths)
        assert counting.reads == reads, f"{counting.reads} nodes read, not {reads}"

    for first in range(1, 100, 10):
        put(first)
    put(101, State.COPY_STARTED)
    check(11)
    check(1)  # only the copy-started one
    put(101)  # finished now
    put(111)
    zk.delete(f"{paths.tier_segments}/{1:020d}")
    check(2)  # 101 (was copy-started) and 111 (new)
    check(0)
    zk.delete(f"{paths.tier_segments}/{11:020d}")
    put(11, token="fedcba9876543210")  # the same name, another object
    check(11)  # noticed: all eleven read again
    assert manifest.read(full=True) == read_manifest(zk, paths)

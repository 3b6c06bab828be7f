"""Tiered storage's uploads under seeded faults, on a real ZooKeeper and a real directory store: a
journal written between rounds, the commit point moving, leaders replaced (the old one still trying),
the uploader's process dying at each kind of step, the store refusing, retention by age and local
retention running. The invariants are checked after every round:

* every ``copy-finished`` entry names an object that holds exactly its records, as they were written;
* finished entries never overlap, and what the store holds contiguously (``tiered_to``) never shrinks
  (unless total retention removed every object);
* nothing above a commit point the uploaders were given is ever uploaded;
* a deposed leader's round changes nothing (FencedError);
* every record not removed by total retention is in the store or in the local journal.

Once the faults stop, one more leader drains the rest: the store's objects are then exactly the
manifest's, and every retained record reads back from the store and the journal, in order.
Bounded: a few seeds of 60 rounds each (``ZEPS_TIER_SEEDS`` runs more).
"""

from __future__ import annotations

import collections
import itertools
import os
import random
from pathlib import Path

import pytest

from harness import ZooKeeperHarness
from zeps.batchstore import BatchStoreError, FileBatchStore
from zeps.batchstore.format import reference_crc
from zeps.coordination.fenced import FencedError
from zeps.journal import Journal, JournalConfig
from zeps.paths import StreamPaths
from zeps.tiering import State, TierEntry, TierReader, TierUploader, read_manifest, tiered_to
from zeps.tiering.objects import decode_object

SEEDS = [int(s) for s in os.environ.get("ZEPS_TIER_SEEDS", "1,2,3").split(",")]
ROUNDS = 60
RETENTION_MS = 400  # of the records' own time: 1 ms per record, so about the last 400 records


class Crash(BaseException):
    """The uploader's process dies here."""


class _Faulty(FileBatchStore):
    """A directory store whose next call may die before or after its work, or be refused."""

    def __init__(self, url: str, rng: random.Random) -> None:
        super().__init__(url)
        self.rng = rng
        self.faults = True

    def _maybe(self, where: str) -> None:
        if self.faults and self.rng.random() < 0.08:
            if where == "refuse":
                raise BatchStoreError("the store refused (a fault of the test)")
            raise Crash(where)

    def put(self, key: str, data: bytes) -> str:
        self._maybe("refuse")
        self._maybe("before put")
        reference = super().put(key, data)
        self._maybe("after put")
        return reference

    def delete(self, url: str) -> None:
        self._maybe("before delete")
        super().delete(url)
        self._maybe("after delete")


class _Run:
    """One seed's run: the journal, what was written (``truth``), the leaders, what was checked."""

    def __init__(self, zookeeper: ZooKeeperHarness, tmp_path: Path, seed: int) -> None:
        self.seed, self.rng = seed, random.Random(seed)
        self.journal = Journal(tmp_path / "journal", JournalConfig(segment_bytes=1500, fsync="always",
                                                                   retention_bytes=1)).open()  # fmt: skip
        self.paths = StreamPaths.of("shop", "orders", chroot=zookeeper.root)
        self.client = zookeeper.client()
        self.store = _Faulty((tmp_path / "store").as_uri(), self.rng)
        self.truth: dict[int, bytes] = {}
        self.epoch, self.commit, self.given_commit, self.done, self.floor = 0, 0, 0, 0, 1
        self.seen: dict[str, TierEntry] = {}  # finished entries checked, by key
        self.deposed: list[TierUploader] = []
        self.happened: collections.Counter[str] = collections.Counter()  # what the run went through
        self.leader = self._new_leader()

    def _new_leader(self) -> TierUploader:
        self.epoch += 1
        return TierUploader(self.client, self.paths, self.store, epoch=self.epoch,
                            rng=random.Random(self.seed * 1000 + self.epoch))  # fmt: skip

    def write(self, count: int) -> None:
        for _ in range(count):
            seq = self.journal.next_sequence
            body = b"r%06d-%d" % (seq, self.rng.randrange(1 << 30))
            self.journal.append(f"k.{seq % 5}", body, timestamp_ms=seq)
            self.truth[seq] = body

    def round(self, step: int) -> None:
        rng, journal = self.rng, self.journal
        self.write(rng.randrange(0, 40))
        self.commit = min(journal.durable, self.commit + rng.randrange(0, 60))
        self.given_commit = max(self.given_commit, self.commit)
        roll = rng.random()
        if roll < 0.1:  # a new leader; the old one may still try a round
            self.deposed.append(self.leader)
            self.leader = self._new_leader()
        elif roll < 0.2 and self.deposed:
            before = read_manifest(self.client, self.paths)
            self.happened["deposed round"] += 1
            with pytest.raises(FencedError):
                rng.choice(self.deposed).step(journal.closed_segments(), self.commit, now_ms=journal.last_timestamp_ms)
            assert read_manifest(self.client, self.paths) == before, f"seed {self.seed} round {step}: a deposed write"
        retention = RETENTION_MS if rng.random() < 0.3 else None
        try:
            result = self.leader.step(journal.closed_segments(), self.commit, now_ms=journal.last_timestamp_ms,
                                      retention_ms=retention)  # fmt: skip
            self.happened.update({"upload": result.uploaded is not None, "deleted": result.deleted,
                                  "refused": bool(result.error)})  # fmt: skip
        except Crash as crash:
            self.happened[str(crash)] += 1
            self.leader = self._new_leader()  # the process died: its replacement leads the next epoch
        entries, refused = read_manifest(self.client, self.paths)
        assert refused == 0
        where = f"seed {self.seed} round {step}"
        self.check(entries, where)
        # what the store holds from its first record on never shrinks, unless total retention took all of it
        assert tiered_to(entries) >= self.done or not any(e.state == State.COPY_FINISHED for e in entries), (
            f"{where}: the store held everything up to {self.done}, now less")  # fmt: skip
        self.done = tiered_to(entries)
        journal.apply_retention(tiered_to=self.done)

    def check(self, entries: list[TierEntry], where: str) -> None:
        """The invariants (the module's docstring) after one round; the floor moves up past what total
        retention removed."""
        finished = sorted((e for e in entries if e.state == State.COPY_FINISHED), key=lambda e: e.first)
        for a, b in itertools.pairwise(finished):
            assert a.last < b.first, f"{where}: entries {a.first}..{a.last} and {b.first}..{b.last} overlap"
        for entry in finished:
            assert entry.last <= self.given_commit, f"{where}: {entry.first}..{entry.last} is above the commit point"
            if entry.key not in self.seen:  # an object never changes: each is read once
                payload = bytes(self.store.get(entry.reference))
                chunk = decode_object(entry, payload, reference_crc(entry.reference) or 0)
                records = [(r.sequence, r.body) for r in chunk.records()]
                assert records == [(q, self.truth[q]) for q in range(entry.first, entry.last + 1)], where
        keys = {e.key for e in finished}
        for key, gone in list(self.seen.items()):
            if key not in keys:  # deleted by total retention (or being deleted): its records may go
                self.floor = max(self.floor, gone.last + 1)
                del self.seen[key]
        self.seen.update((e.key, e) for e in finished)
        for q in range(self.floor, self.journal.durable + 1):
            held = q >= self.journal.first_sequence or any(e.first <= q <= e.last for e in finished)
            assert held, f"{where}: record {q} is in neither the store nor the journal"

    def drain_and_read_back(self, root: Path) -> None:
        """Faults off, one more leader uploads the rest; the store holds the manifest's objects alone, and
        every record from the floor on reads back from the store and the journal."""
        self.store.faults = False
        last, journal = self._new_leader(), self.journal
        for _ in range(len(journal.closed_segments()) + 3):
            if last.step(journal.closed_segments(), journal.durable, now_ms=journal.last_timestamp_ms).uploaded is None:
                break
        entries, _ = read_manifest(self.client, self.paths)
        assert all(e.state == State.COPY_FINISHED for e in entries)
        assert sorted(p.name for p in root.glob("*.batch")) == sorted(f"{e.key}.batch" for e in entries)
        reader = TierReader(self.client, self.paths, FileBatchStore(root.as_uri()))
        reader.refresh()
        first = max(self.floor, reader.first_sequence or journal.first_sequence)
        at, read = first, {}
        while at <= journal.durable:
            chunk = reader.read_chunk(at) if at < journal.first_sequence else journal.read_chunk(at)
            assert chunk is not None, f"seed {self.seed}: record {at} is in neither the store nor the journal"
            read.update((r.sequence, r.body) for r in chunk.records())
            at = chunk.last + 1
        assert read == {q: b for q, b in self.truth.items() if q >= first}
        journal.close()


@pytest.mark.parametrize("seed", SEEDS)
def test_uploads_under_seeded_faults_keep_the_manifest_true_and_lose_nothing(
    zookeeper: ZooKeeperHarness, tmp_path: Path, seed: int
) -> None:
    run = _Run(zookeeper, tmp_path, seed)
    for step in range(ROUNDS):
        run.round(step)
    run.drain_and_read_back(tmp_path / "store")
    print(f"seed {seed}: {dict(run.happened)}")
    assert run.happened["upload"] > 0

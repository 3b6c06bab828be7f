"""The invariants of a replicated stream, checked as the simulation runs (safety, at every step
that could break one) and once the faults stop (liveness).

The *committed log* is what every leadership counted committed: each leader's journal up to its
commit point, read as its commit point moves. Any two leaderships must agree on it wherever both
reach. Then, at every step:

* a record delivered to a subscriber is the committed log's at its sequence (never taken back), and
  each subscriber sees sequences 1, 2, … without a gap or a repeat (a compacting seed's: a gap only
  where a later committed record of the same key superseded the one missing);
* a publish confirmed to a producer is in the committed log (once: producers are idempotent);
* no two replicas lead one epoch;
* every replica ZooKeeper lists in sync holds the committed log durably (the next leader is one);
* every replica's journal agrees with the committed log as far as both go, and never cuts it.

A tiered stream's uploads (:mod:`simulation.tiering`), at every write of its manifest or fence:

* only the replica that led an epoch writes the manifest in it, and never once a newer epoch claimed
  the fence (``tier/leader``);
* an object put into the store holds the committed log's records of its run, each committed already
  when it lands (nothing uploaded that no quorum held yet, so nothing a later leader takes back);
* ``copy-finished`` entries never overlap, and each one's object is whole and holds exactly the
  committed log's records of its run;
* no object of a ``copy-finished`` entry is ever deleted (no retention runs here).

Liveness (:meth:`Checker.settled`): once every fault is healed, a leader with every replica in sync,
every publish confirmed, every subscriber holding the whole committed log; a tiered stream's store
holding every closed segment the leader counts committed, and no entry left ``copy-started``. At the
end (:meth:`Checker.final`) the store's objects run from record 1 without a gap, and it holds at most
one object no entry names per leader epoch (a deposed leader's put that landed after its entry was
cleaned).
"""

from __future__ import annotations

import itertools
import json
from dataclasses import replace
from typing import TYPE_CHECKING

import crc32c

from zeps.batchstore import BatchLostError
from zeps.batchstore.format import reference_crc
from zeps.tiering.manifest import State, TierEntry, decode_entry, tiered_to
from zeps.tiering.objects import decode_object

if TYPE_CHECKING:
    from simulation.world import Client, Replica, World

STREAM = "prices"
KEYS = 4  #: a compacting seed's producers publish under this many keys


def key_of(body: bytes) -> str:
    """The key a compacting seed's producer publishes ``body`` (``p<producer>:<n>``) under."""
    return f"k{int(body.rsplit(b':', 1)[1]) % KEYS}"


def _entry_of(key: str) -> TierEntry:
    """The run an object's name says it holds (:func:`zeps.tiering.manifest.object_key`)."""
    first, last, epoch = (int(part.lstrip("e")) for part in key.split("-")[:3])
    return TierEntry(first, last, epoch, key, State.COPY_FINISHED)


class Violation(AssertionError):  # noqa: N818 — the checker's word: an invariant violated
    """An invariant broke: the message says which, where and when."""


class Checker:
    def __init__(self, world: World) -> None:
        self.world = world
        self.truth: dict[int, bytes] = {}  # the committed log
        self.where: dict[bytes, int] = {}  # body -> its sequence in the committed log
        self.latest: dict[str, int] = {}  # a compacting seed's: key -> its latest sequence in the committed log
        self.commit = 0  # the highest commit point any leadership reached
        self.leaders: dict[int, str] = {}  # epoch -> the replica that led it
        self.read_to: dict[tuple[str, int, int], int] = {}  # (replica, incarnation, epoch) -> committed records read
        self.agreed: dict[tuple[str, int], int] = {}  # (replica, incarnation) -> its journal checked up to here
        self.confirmed_bodies: list[bytes] = []
        #: the first violation (raised where it was found; a tier thread's is raised again in the event
        #: that ran it, past the round's own error handling)
        self.broken: Violation | None = None
        self.fence = -1  # the highest epoch that claimed a tiered stream's fence
        self.verified: set[str] = set()  # copy-finished objects checked against the committed log

    def fail(self, what: str) -> None:
        self.broken = Violation(
            f"seed {self.world.sim.seed} at t={self.world.sim.now:.4f}s (step {self.world.sim.steps}): {what}"
        )
        raise self.broken

    # -- what clients saw ------------------------------------------------------------------
    def delivered(self, client: Client, sequence: int, body: bytes) -> None:
        last = client.delivered[-1][0] if client.delivered else 0
        if sequence != last + 1 and not (self.world.compaction and sequence > last):
            self.fail(f"subscriber {client.id} was delivered sequence {sequence} after {last} (a gap or a repeat)")
        for skipped in range(last + 1, sequence):  # a compacted stream's gaps: records a later one superseded
            gone = self.truth.get(skipped)
            if gone is None or self.latest[key_of(gone)] <= skipped:
                what = "never committed" if gone is None else f"{gone!r}, the latest of its key"
                self.fail(f"subscriber {client.id} was delivered {sequence} after {last}: {skipped} was {what}")
        known = self.truth.get(sequence)
        if known is None:
            self.fail(f"subscriber {client.id} was delivered {sequence}={body!r}, which no leadership committed")
        if known != body:
            self.fail(
                f"subscriber {client.id} was delivered {sequence}={body!r}, but the committed log holds {known!r}"
            )

    def confirmed(self, client: Client, bodies: list[bytes], at: tuple[str, int] | None) -> None:
        for body in bodies:
            if body not in self.where:
                self.fail(f"producer {client.id}'s {body!r} was confirmed (by {at}) but is not in the committed log")
        self.confirmed_bodies += bodies

    # -- what the replicas hold ------------------------------------------------------------
    def observe(self, replica: Replica) -> None:
        """After each turn of ``replica``'s loop."""
        core = replica.core
        assert core is not None
        stream = core.streams[STREAM]
        journal = stream.journal
        leader = stream.leader
        if leader is not None:
            holder = self.leaders.setdefault(leader.epoch, replica.name)
            if holder != replica.name:
                self.fail(f"{replica.name} and {holder} both lead epoch {leader.epoch}")
            key = (replica.name, replica.incarnation, leader.epoch)
            start = self.read_to.get(key)
            if start is None:  # a leadership's first look: from its journal's start
                start = journal.first_sequence - 1
            if leader.commit > start:
                self._commit_from(replica, start, leader.commit)
                self.read_to[key] = leader.commit
            self.commit = max(self.commit, leader.commit)
        self._agree(replica)
        self.check_isr()

    def _commit_from(self, replica: Replica, start: int, end: int) -> None:
        journal = replica.core.streams[STREAM].journal  # type: ignore[union-attr]
        seq = start + 1
        while seq <= end:
            records = journal.read(seq, max_records=min(1000, end - seq + 1))
            if not records:
                self.fail(f"{replica.name} counts {seq}..{end} committed but its journal lacks them")
            for record in records:
                if record.sequence > end:
                    break
                self._truth(record.sequence, record.body, replica.name)
            seq = records[-1].sequence + 1

    def _truth(self, sequence: int, body: bytes, who: str) -> None:
        known = self.truth.get(sequence)
        if known is None:
            if body in self.where and self.where[body] != sequence:
                self.fail(f"{body!r} is committed twice: at {self.where[body]} and (by {who}) at {sequence}")
            self.truth[sequence] = body
            self.where[body] = sequence
            if self.world.compaction:
                key = key_of(body)
                self.latest[key] = max(self.latest.get(key, 0), sequence)
        elif known != body:
            self.fail(f"{who} committed {sequence}={body!r}, but {known!r} was committed there before")

    def _agree(self, replica: Replica) -> None:
        """The replica's journal holds the committed log as far as the replica itself counts it
        committed (beyond that it may hold a tail of its own, until a leader's history cuts it), and
        never cuts what it checked so."""
        stream = replica.core.streams[STREAM]  # type: ignore[union-attr]
        journal = stream.journal
        key = (replica.name, replica.incarnation)
        done = self.agreed.get(key, journal.first_sequence - 1)
        if journal.written < done:
            self.fail(f"{replica.name} cut its journal to {journal.written}, below {done}, which it counted committed")
        end = min(stream.committed, journal.durable)
        seq = done + 1
        while seq <= end:
            records = journal.read(seq, max_records=min(1000, end - seq + 1))
            if not records:
                break
            for record in records:
                known = self.truth.get(record.sequence)
                if known is None:
                    self.fail(f"{replica.name} counts {record.sequence} committed, but no leadership committed it")
                if known != record.body:
                    self.fail(
                        f"{replica.name} counts {record.sequence}={record.body!r} committed, the committed log "
                        f"holds {known!r}"
                    )
            seq = records[-1].sequence + 1
        self.agreed[key] = max(done, end)

    def check_isr(self) -> None:
        """Every replica ZooKeeper lists in sync holds the committed log durably."""
        state = self.world.zk.state()
        if state is None:
            return
        for name in state.isr:
            replica = self.world.replicas[name]
            core = replica.core
            held = core.streams[STREAM].journal.durable if replica.up and core is not None else replica.durable_at_crash
            if held < self.commit:
                self.fail(
                    f"ZooKeeper lists {name} in sync (epoch {state.epoch}), but it holds {held} durably, "
                    f"below the commit point {self.commit}"
                )

    # -- the tiering -------------------------------------------------------------------------------
    def tier_written(self, replica: Replica, epoch: int, paths: list[str]) -> None:
        """``replica``'s round of ``epoch`` changed ``paths`` (applied at the simulated ZooKeeper)."""
        world = self.world
        if world.paths.tier_leader in paths:
            held = json.loads(world.zk.nodes[world.paths.tier_leader].data)["epoch"]
            if held != epoch:
                self.fail(f"{replica.name}'s round of epoch {epoch} wrote epoch {held} into the tiering's fence")
            self.fence = max(self.fence, held)
        if any(p.startswith(world.paths.tier_segments + "/") for p in paths):
            if epoch < self.fence:
                self.fail(f"{replica.name} changed the manifest in epoch {epoch}, after epoch {self.fence} claimed it")
            if self.leaders.get(epoch) != replica.name:
                self.fail(f"{replica.name} changed the manifest in epoch {epoch}, which "
                          f"{self.leaders.get(epoch)} led")  # fmt: skip
            self._check_manifest()

    def manifest(self) -> list[TierEntry]:
        nodes, prefix = self.world.zk.nodes, self.world.paths.tier_segments + "/"
        entries = []
        for path in sorted(p for p in nodes if p.startswith(prefix)):
            try:
                entries.append(decode_entry(nodes[path].data))
            except ValueError as exc:
                self.fail(f"manifest node {path} is out of shape: {exc}")
        return entries

    def _check_manifest(self) -> None:
        finished = sorted((e for e in self.manifest() if e.state == State.COPY_FINISHED), key=lambda e: e.first)
        for before, after in itertools.pairwise(finished):
            if after.first <= before.last:
                self.fail(f"the store's objects {before.key} and {after.key} overlap")
        for entry in finished:
            if entry.key not in self.verified:
                self._verify(entry)
                self.verified.add(entry.key)

    def tier_upload(self, key: str, payload: bytes) -> None:
        """An upload begins: each record of the object is committed already (only runs wholly at or
        below the commit point are uploaded) and is the committed log's."""
        self._holds_committed(_entry_of(key), payload, crc32c.crc32c(payload))

    def tier_put(self, key: str, reference: str) -> None:
        """An object landed in the store: it is whole, and still the committed log's."""
        self._verify(replace(_entry_of(key), reference=reference))

    def _verify(self, entry: TierEntry) -> None:
        store = self.world.tier_store
        assert store is not None
        try:
            payload = bytes(store.files.get(entry.reference))
        except BatchLostError as exc:
            self.fail(f"copy-finished entry {entry.first}..{entry.last} names an object that is not whole: {exc}")
        self._holds_committed(entry, payload, reference_crc(entry.reference) or 0)

    def _holds_committed(self, entry: TierEntry, payload: bytes, crc: int) -> None:
        try:
            chunk = decode_object(entry, payload, crc)
        except BatchLostError as exc:
            self.fail(f"the object {entry.key} is not whole: {exc}")
        for record in chunk.records():
            known = self.truth.get(record.sequence)
            if known != record.body:
                self.fail(f"the store's object {entry.key} holds {record.sequence}={record.body!r}; the committed "
                          f"log holds {known!r}")  # fmt: skip

    def tier_object_deleted(self, url: str) -> None:
        for entry in self.manifest():
            if entry.state == State.COPY_FINISHED and entry.key in url:
                self.fail(f"the object of copy-finished entry {entry.first}..{entry.last} was deleted")

    def tier_settled(self, leader: Replica) -> bool:
        entries = self.manifest()
        if any(e.state != State.COPY_FINISHED for e in entries):
            return False
        done, stream = tiered_to(entries), leader.core.streams[STREAM]  # type: ignore[union-attr]
        return done >= stream.committed

    # -- after the faults --------------------------------------------------------------------
    def settled(self) -> bool:
        """Liveness: the stream is whole again and every client caught up."""
        world = self.world
        state = world.zk.state()
        if state is None or len(state.isr) != len(world.replicas):
            return False
        if world.options.preferred is not None and state.leader != world.options.preferred:
            return False  # the lead goes back to the preferred replica once it is in sync
        leader = world.replicas[state.leader]
        if not leader.up or leader.core is None or leader.core.streams[STREAM].leader is None:
            return False
        commit = leader.core.streams[STREAM].leader.commit
        if world.tier_store is not None and not self.tier_settled(leader):
            return False
        for client in world.clients:
            if client.kind == "producer" and client.confirmed < world.options.messages:
                return False
            if client.kind == "subscriber" and (not client.delivered or client.delivered[-1][0] < commit):
                return False
        return True

    def final(self) -> None:
        """Once settled: each producer's publishes all in the committed log, once each, in order."""
        for client in self.world.clients:
            if client.kind != "producer":
                continue
            places = [self.where.get(body) for body in client.published]
            missing = [b for b, p in zip(client.published, places, strict=True) if p is None]
            if missing:
                self.fail(f"producer {client.id}: {len(missing)} publishes never committed, first {missing[0]!r}")
            if places != sorted(places):  # type: ignore[type-var]
                self.fail(f"producer {client.id}'s publishes were committed out of order")
            # a refused producer's unconfirmed publishes may be committed or not, never twice (checked
            # as the committed log grows: no body is at two sequences)
        store = self.world.tier_store
        if store is None:
            return
        entries = self.manifest()
        finished = sorted((e for e in entries if e.state == State.COPY_FINISHED), key=lambda e: e.first)
        if finished and (finished[0].first != 1 or tiered_to(entries) != finished[-1].last):
            self.fail(f"the store's objects do not run from record 1 without a gap: "
                      f"{[(e.first, e.last) for e in finished]}")  # fmt: skip
        orphans = store.keys() - {e.key for e in entries}
        if len(orphans) > len(self.leaders):
            self.fail(f"{len(orphans)} objects in the store no manifest entry names, more than one per epoch "
                      f"({len(self.leaders)}): {sorted(orphans)[:5]}")  # fmt: skip

"""The leader's uploads: closed, committed runs of its journal into the object store, the manifest kept
in ZooKeeper, objects past the stream's retention deleted (the states: :mod:`zeps.tiering.manifest`).

Only one uploader writes a stream's manifest: the one holding ``tier/leader`` for the highest leader
epoch. Each round first writes its epoch there, never over a higher one, and every later change of
the manifest is a ZooKeeper transaction that checks that node's version first, so a leader
that lost its lead (a newer epoch claimed the node) has each write refused and stops
(:class:`~zeps.coordination.fenced.FencedError`), whatever its clock or its view of the election says.

:meth:`TierUploader.step` does one round: read the manifest, finish what an earlier uploader left
(``copy-started``: its object deleted, then its node, and the run uploaded again under a new name;
``delete-started``: the deletion finished; a generation a newer one superseded: deleted), delete
what total retention no longer keeps, upload the next closed run wholly at or below the commit point;
and, of a compacted stream with nothing new to upload, one run whose local segment compaction
shrank since its upload, as the run's next generation (the older one then deleted). A failure of
the object store or of ZooKeeper ends the round; the next round starts over from the manifest, after
a backoff that doubles up to :data:`MAX_BACKOFF_S` (the journal keeps its segments meanwhile:
nothing is lost while the store is away, the backlog grows). A step blocks on the store and on
ZooKeeper: the broker runs it on a thread of its own, never on its event loop.

Left as they are: a node in the manifest that is not in shape (refused, never read; the leader
removes it only when it sits where its next upload's node goes, with a warning); and an object a
deposed leader was still putting when its copy-started entry was cleaned (no entry names it: one
object per change of leader at most).
"""

from __future__ import annotations

import logging
import random
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from zeps._records import RECORD
from zeps.batchstore import BatchStore, BatchStoreError
from zeps.coordination.fenced import FencedError, FencedNodes, list_children, read_nodes
from zeps.errors import CoordinationError
from zeps.journal import ClosedSegment, JournalError
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
from zeps.tiering.objects import encode_object

__all__ = ["MAX_BACKOFF_S", "FencedError", "Manifest", "StepResult", "TierUploader", "read_manifest"]

log = logging.getLogger(__name__)

#: the longest wait between failed rounds (they double from MIN_BACKOFF_S, with jitter)
MAX_BACKOFF_S = 30.0
MIN_BACKOFF_S = 0.5
#: manifest nodes read in one round at most (a stream of 1 GiB segments holds 10,000 for 10 TB)
MAX_ENTRIES = 100_000


@dataclass(frozen=True, slots=True)
class StepResult:
    """What a round did, and when to run the next (``delay_s``)."""

    uploaded: TierEntry | None = None
    deleted: int = 0  #: objects deleted (past retention, or left by an earlier uploader)
    tiered_to: int = 0
    backlog_segments: int = 0  #: closed segments (wholly committed or not) the store does not hold yet
    backlog_bytes: int = 0
    error: str = ""  #: why the round stopped early ("" if it did not)
    delay_s: float = 0.0


def read_manifest(zk: Any, paths: StreamPaths) -> tuple[list[TierEntry], int]:
    """The manifest's entries, and how many nodes were refused (out of shape: logged, never trusted)."""
    return Manifest(zk, paths).read()


class Manifest:
    """A manifest read again and again (a leader's rounds, a follower's, a reader's refreshes), at the
    cost of what changed: the children are listed each time with the parent's child version, and only
    new nodes and entries not ``copy-finished`` are read. A finished entry changes only on its way out
    (``delete-started`` by the fence holder, then removed), so the copy kept of it stays true until its
    name goes; a name removed and made again between two reads shows as more child changes than the
    listing explains, and then every node is read again. A manifest of 10,000 runs costs a follower a
    listing every round instead of 10,000 reads (``make bench-tiered``: ``manifest_*``)."""

    def __init__(self, zk: Any, paths: StreamPaths) -> None:
        self.zk, self.paths = zk, paths
        self._finished: dict[str, TierEntry] = {}  #: copy-finished entries as read, by node name
        self._names: set[str] = set()  #: the names of the last listing
        self.refused: set[str] = set()  #: the last read's nodes out of shape
        self._version = -1  #: its child version

    def read(self, *, full: bool = False) -> tuple[list[TierEntry], int]:
        """The entries, and how many nodes were refused (out of shape: logged, never trusted, read again
        each time); ``full``: every node read again."""
        listed, version = list_children(self.zk, self.paths.tier_segments)
        names = sorted(listed)[:MAX_ENTRIES]
        current = set(names)
        explained = len(current - self._names) + len(self._names - current)
        if full or self._version < 0 or version - self._version != explained:
            self._finished = {}
        self._names, self._version = current, version
        kept = {name: self._finished[name] for name in names if name in self._finished}
        entries, refused = [], set()
        fetched = dict(read_nodes(self.zk, self.paths.tier_segments, [n for n in names if n not in kept]))
        for name in names:
            entry = kept.get(name)
            if entry is None:
                data = fetched.get(name)
                if data is None:
                    continue  # removed since the listing
                try:
                    entry = decode_entry(data)
                    if name != node_name(entry):
                        raise ValueError(f"the node of records {entry.first}.. is named {name!r}")
                except ValueError as exc:
                    log.warning("tier manifest %s/%s refused: %s", self.paths.tier_segments, name, exc)
                    refused.add(name)
                    continue
                if entry.state == State.COPY_FINISHED:
                    kept[name] = entry
            entries.append(entry)
        self._finished, self.refused = kept, refused
        return entries, len(refused)


class TierUploader:
    """Uploads one stream's (or partition's) journal for the leader of ``epoch``."""

    def __init__(self, zk: Any, paths: StreamPaths, store: BatchStore, *, epoch: int,
                 acl: list[Any] | None = None, token: Callable[[], str] = lambda: secrets.token_hex(8),
                 rng: random.Random | None = None) -> None:  # fmt: skip
        self.paths, self.store, self.epoch = paths, store, epoch
        self.nodes = FencedNodes(zk, paths.tier_segments, paths.tier_leader, epoch=epoch, acl=acl)
        self.manifest = Manifest(zk, paths)
        self._token = token
        self._rng = rng or random.Random()
        self._failures = 0
        #: (segment's first, its size, the entry's key) -> whether the segment's part of that run holds
        #: fewer bytes of records than the entry's object (compaction shrank it): each looked at once
        self._shrunk: dict[tuple[int, int, str], bool] = {}

    # -- a round ------------------------------------------------------------------------------------
    def step(self, segments: list[ClosedSegment], commit_point: int, *, now_ms: int, retention_ms: int | None = None,
             retention_bytes: int | None = None, local_bytes: int = 0,
             compacts: bool = False) -> StepResult:  # fmt: skip
        """One round (above) over the journal's closed ``segments`` (:meth:`Journal.closed_segments`)
        and its ``commit_point`` (``compacts``: the journal compacts its closed segments, so a run in
        the store may be uploaded again, compacted); FencedError when another leader took over."""
        entries: list[TierEntry] = []
        deleted = 0
        uploaded = None
        try:
            self.nodes.claim()
            entries, _ = self.manifest.read()
            for entry in [e for e in entries if e.state != State.COPY_FINISHED]:
                self._remove(entry)
                deleted += 1
            entries = [e for e in entries if e.state == State.COPY_FINISHED]
            old = superseded(entries)
            for entry in [*old, *expired(current(entries), now_ms=now_ms, retention_ms=retention_ms,
                                         retention_bytes=retention_bytes, local_bytes=local_bytes)]:  # fmt: skip
                self._delete(entry)
                entries.remove(entry)
                deleted += 1
            plan = next_upload(segments, commit_point, entries)
            if plan is not None:
                segment = next(s for s in segments if s.first == plan.segment)
                uploaded = self._upload(segment, plan.first, plan.last)
                entries.append(uploaded)
            elif compacts and (again := self._next_compacted(segments, commit_point, entries)) is not None:
                segment, older = again
                uploaded = self._upload(segment, older.first, older.last, generation=older.generation + 1)
                entries.append(uploaded)
                self._delete(older)  # superseded (a crash before this: the next round deletes it)
                entries.remove(older)
                deleted += 1
        except FencedError:
            raise
        except (BatchStoreError, CoordinationError, JournalError) as exc:
            self._failures += 1
            delay = min(MAX_BACKOFF_S, MIN_BACKOFF_S * 2 ** (self._failures - 1)) * self._rng.uniform(0.5, 1.0)
            log.warning("tiering %s: %s; trying again in %.1f s", self.paths.root, exc, delay)
            return self._result(segments, entries, uploaded, deleted, error=str(exc) or repr(exc), delay_s=delay)
        self._failures = 0
        return self._result(segments, entries, uploaded, deleted)

    def _result(self, segments: list[ClosedSegment], entries: list[TierEntry], uploaded: TierEntry | None,
                deleted: int, *, error: str = "", delay_s: float = 0.0) -> StepResult:  # fmt: skip
        done = tiered_to(entries)
        waiting = [s for s in segments if s.last > done and s.last >= s.first]
        return StepResult(uploaded, deleted, done, len(waiting), sum(s.size for s in waiting), error, delay_s)

    def _upload(self, segment: ClosedSegment, first: int, last: int, *, generation: int = 0) -> TierEntry:
        """Records ``first .. last`` of ``segment`` (those compaction kept, of a compacted one) into the
        store: copy-started, put, copy-finished."""
        records, offsets = read_records(segment, first, last)
        count = len(offsets) - 1
        if count:
            first_ts, last_ts = (int(RECORD.unpack_from(records, offsets[i])[3]) for i in (0, -2))
        else:  # compaction kept none: an empty object keeps the store's runs contiguous
            first_ts = last_ts = segment.last_ts
        entry = TierEntry(first, last, self.epoch, object_key(first, last, self.epoch, self._token()),
                          State.COPY_STARTED, first_ts, last_ts, len(records), generation=generation,
                          records=None if count == last - first + 1 else count)  # fmt: skip
        if node_name(entry) in self.manifest.refused:  # a node out of shape where this one goes: not zeps's
            log.warning("tiering %s: removing the node out of shape at %s/%s, where records %d..%d go",
                        self.paths.root, self.paths.tier_segments, node_name(entry), first, last)  # fmt: skip
            self.nodes.delete(node_name(entry))
        self.nodes.create(node_name(entry), encode_entry(entry))
        reference = self.store.put(entry.key, encode_object(records, offsets) if count else b"")
        done = entry.finished(reference)
        self.nodes.set(node_name(done), encode_entry(done))
        log.info("tiering %s: records %d..%d uploaded (%d of them, %d bytes%s)", self.paths.root, first, last, count,
                 len(records), f"; generation {generation}" if generation else "")  # fmt: skip
        return done

    def _next_compacted(self, segments: list[ClosedSegment], commit: int,
                        entries: list[TierEntry]) -> tuple[ClosedSegment, TierEntry] | None:  # fmt: skip
        """The oldest run the store holds whose local segment compaction shrank since (that segment,
        and the run's entry): each (segment, size, entry) is read once to find out."""
        live: set[tuple[int, int, str]] = set()
        found = None
        for entry in current(entries):
            segment = next((s for s in segments if s.first <= entry.first and entry.last <= s.last <= commit), None)
            if segment is None:
                continue
            key = (segment.first, segment.size, entry.key)
            live.add(key)
            if key not in self._shrunk:
                records, _ = read_records(segment, entry.first, entry.last)
                self._shrunk[key] = len(records) < entry.size
            if self._shrunk[key] and found is None:
                found = (segment, entry)
        self._shrunk = {k: v for k, v in self._shrunk.items() if k in live}  # bounded by the local segments
        return found

    def _delete(self, entry: TierEntry) -> None:
        """A finished entry readers no longer read (past retention, or superseded): delete-started,
        then its object, then its node."""
        self.nodes.set(node_name(entry), encode_entry(entry.deleting()))
        self._remove(entry)

    def _remove(self, entry: TierEntry) -> None:
        """An entry's object deleted, then its node (a copy that may not have finished, or a deletion
        that began: either way nobody reads it any more)."""
        self.store.delete(entry.reference or self.store.object_url(entry.key))
        self.nodes.delete(node_name(entry))

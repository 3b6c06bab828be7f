"""A tiered stream's uploads, and its reads of the object store, beside the broker's loop
(``zeps-broker --tier-store``).

The loop never waits on the object store or on ZooKeeper: once a second it *offers* what it knows of
each stream (its closed segments, its commit point, whether this broker leads and in which epoch) to
a :class:`TierTask`, a thread of its own per stream, and reads back how far the store holds the
journal (``tiered_to``), which bounds what local retention may delete. The thread runs rounds of
:class:`~zeps.tiering.uploader.TierUploader` while this broker leads (an unreplicated stream's broker
always does, in epoch 0); a follower, or a leader fenced out by a newer epoch, only reads the manifest
now and then to learn ``tiered_to``, so that it too deletes only what the store holds.

A round runs when a closed, committed segment waits that the store does not hold yet, and every
:data:`ROUND_INTERVAL_S` besides (the store's own retention, and a follower's view of the manifest):
each round reads the whole manifest from ZooKeeper, so rounds are not run once a second for nothing.

A subscription (or fetch) behind the journal's first record is served from the store: the loop asks
(``BrokerCore.tier_wanted``), a :class:`TierServe` thread per stream reads the records with a
:class:`~zeps.tiering.TierReader` (its cache of fetched objects on the journal's volume), and hands
them back to the loop, which delivers them as it delivers a replay from the journal: same frames,
same client code, any protocol version.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from zeps.batchstore import BatchStore
from zeps.errors import CoordinationError, ZepsError
from zeps.journal import Chunk, ClosedSegment
from zeps.options import DEFAULT_SEGMENT_IDLE_MS
from zeps.paths import StreamPaths
from zeps.tiering import FencedError, Manifest, StepResult, TierReader, TierUploader, tiered_to

__all__ = [
    "DEFAULT_SEGMENT_IDLE_MS",
    "NOT_KNOWN",
    "ROUND_INTERVAL_S",
    "TIER_CACHE",
    "Offer",
    "TierRounds",
    "TierServe",
    "TierTask",
    "Tiering",
]

log = logging.getLogger(__name__)

#: the longest time between two rounds when nothing waits for upload
ROUND_INTERVAL_S = 10.0
#: ``tiered_to`` before the manifest was read once: local retention deletes nothing
NOT_KNOWN = -1
#: under the broker's data directory: each stream's cache of objects fetched from the store (no
#: stream's name starts with a dot)
TIER_CACHE = ".tier-cache"


@dataclass(frozen=True)
class Tiering:
    """A broker's tiered storage: the store (a batch store URL and its options) and the stream's
    total retention, which the store's objects are kept for; the journal's own retention
    (``--retention-ms``, ``--retention-bytes``) is then the local one."""

    store_url: str
    endpoint: str | None = None
    region: str | None = None
    path_style: bool | None = None
    retention_ms: int | None = None
    retention_bytes: int | None = None
    #: the leader closes its active segment once its newest record is this old (a quiet stream's
    #: records reach the store within about this long, not when a segment fills)
    segment_idle_ms: int = DEFAULT_SEGMENT_IDLE_MS
    #: the leader refuses publishes (JOURNAL_FULL) while more than this many bytes of closed segments
    #: wait for the store, before the volume itself fills up (None: only a full volume refuses)
    max_backlog_bytes: int | None = None


@dataclass(frozen=True, slots=True)
class Offer:
    """What the loop knows of a stream at one tick."""

    leading: bool  #: this broker uploads (it leads the stream, or the stream is not replicated)
    epoch: int  #: its leadership's epoch (0 unreplicated)
    segments: tuple[ClosedSegment, ...]
    commit: int  #: the last record a quorum holds (an unreplicated stream: the last durable one)
    local_bytes: int  #: the journal's size on disk
    compacts: bool = False  #: the journal compacts its closed segments: the store's runs are uploaded again


class TierRounds:
    """One stream's rounds without a thread of their own: :meth:`due` says whether the loop's newest
    offer calls for one, :meth:`round` runs it, blocking on the store and on ZooKeeper. A
    :class:`TierTask` runs them on its thread; the replication simulation (``tests/simulation``) as
    events of a simulated process. The figures below are read by the loop and the metrics, written by
    the rounds alone."""

    def __init__(self, name: str, zk: Any, paths: StreamPaths, store: BatchStore, tiering: Tiering, *,
                 acl: list[Any] | None = None, wall_ms: Callable[[], int] = lambda: int(time.time() * 1000),
                 interval_s: float = ROUND_INTERVAL_S) -> None:  # fmt: skip
        self.name, self.zk, self.paths, self.store, self.tiering = name, zk, paths, store, tiering
        self.acl, self.wall_ms, self.interval_s = acl, wall_ms, interval_s
        self.tiered_to = NOT_KNOWN  #: the store holds every record up to here (local retention's bound)
        self.backlog_segments = 0  #: closed segments the store does not hold yet (the leader's view)
        self.backlog_bytes = 0
        self.uploaded = 0  #: objects this broker put
        self.failures = 0  #: rounds that stopped on an error of the store or ZooKeeper
        self.error = ""  #: the last round's error ("" once a round succeeds)
        self.stopping = False  #: a leader's rounds end after the upload under way
        self._fenced = -1  #: a newer leader fenced this epoch (and those below) out: no more uploads in it
        #: the last committed segment a round found nothing to upload up to (a gap in the manifest it
        #: cannot fill): a round for it again only after the interval
        self._idle_to = NOT_KNOWN
        self._uploader: TierUploader | None = None
        self._manifest = Manifest(zk, paths)  #: a follower's (or a fenced leader's) reads of it
        self._last_round = -float("inf")
        self._pause = 0.0  #: after a failed round: its backoff
        self._written, self._written_at = -1, 0.0  #: the journal's last record, and when it last changed
        #: a compacted stream's closed segments (first -> size) as the last whole round left them, the
        #: store in step with each it holds: one that compaction changed since waits for a round
        self._synced: dict[int, int] = {}

    def quiet(self, written: int, now: float) -> bool:
        """Whether the journal, whose last record is ``written``, took none for ``segment_idle_ms`` by
        the loop's monotonic clock (``now``, seconds). The leader closes its active segment then,
        whatever the records' own time says: a wall clock set back behind them (or records written
        under one running ahead) never makes the newest record look old."""
        if written != self._written:
            self._written, self._written_at = written, now
            return False
        return (now - self._written_at) * 1000 >= self.tiering.segment_idle_ms

    def due(self, offer: Offer, now: float) -> bool:
        """Whether a round is due at ``now`` (monotonic seconds): a closed, committed segment waits that
        the store does not hold, or the interval passed since the last round; never within a failed
        round's backoff."""
        waiting = self._waiting(offer) or self._changed(offer) is not None
        return now - self._last_round >= max(self._pause, 0.0 if waiting else self.interval_s)

    def retention_bound(self, offer: Offer) -> int:
        """How far local retention may delete: ``tiered_to``, but of a compacted stream not from a
        segment compaction changed since the last round (its object in the store may hold records the
        segment no longer does: the next round uploads it again first)."""
        changed = self._changed(offer)
        return self.tiered_to if changed is None else min(self.tiered_to, changed.first - 1)

    def _changed(self, offer: Offer) -> ClosedSegment | None:
        """The first segment the store holds that compaction changed since the last round (None: none,
        or the journal does not compact)."""
        if not offer.compacts:
            return None
        return next((s for s in offer.segments if s.last <= self.tiered_to and self._synced.get(s.first) != s.size),
                    None)  # fmt: skip

    def round(self, offer: Offer, now: float) -> None:
        """One round at ``now``: a leader's uploads (:meth:`_lead`), or a follower's (or a fenced
        leader's) read of the manifest to learn ``tiered_to``. A failure is counted and kept in
        ``error``, never raised."""
        self._last_round, self._pause = now, 0.0
        try:
            if offer.leading and offer.epoch > self._fenced:
                if self._uploader is None or self._uploader.epoch != offer.epoch:
                    self._uploader = TierUploader(self.zk, self.paths, self.store, epoch=offer.epoch, acl=self.acl)
                self._pause = self._lead(self._uploader, offer)
            else:
                entries, _refused = self._manifest.read()
                self.tiered_to = tiered_to(entries)
                self.error = ""
        except FencedError as exc:
            log.info("tiering %s: %s; this broker no longer uploads in epoch %d", self.name, exc, offer.epoch)
            self._fenced, self._uploader = offer.epoch, None
        except (CoordinationError, ZepsError, OSError) as exc:  # a round's reads: the next one tries again
            self.failures += 1
            self.error = str(exc) or repr(exc)
            log.warning("tiering %s: %s", self.name, self.error)
        except Exception:  # a bug must not end the uploads for good, nor the broker
            self.failures += 1
            self.error = "an unexpected error (logged)"
            log.exception("tiering %s: round failed", self.name)

    def _waiting(self, offer: Offer) -> bool:
        """Whether a closed, committed segment waits that the store does not hold (as last known)."""
        done = max(self.tiered_to, self._idle_to)
        return offer.leading and any(done < s.last <= offer.commit for s in offer.segments)

    def _lead(self, uploader: TierUploader, offer: Offer) -> float:
        """Rounds while each uploads something (a backlog drains at the store's pace, not one segment a
        second); returns the backoff after a failed one."""
        for _ in range(len(offer.segments) + 1):
            result: StepResult = uploader.step(
                list(offer.segments), offer.commit, now_ms=self.wall_ms(), retention_ms=self.tiering.retention_ms,
                retention_bytes=self.tiering.retention_bytes, local_bytes=offer.local_bytes, compacts=offer.compacts,
            )  # fmt: skip
            self.tiered_to = result.tiered_to
            self.backlog_segments, self.backlog_bytes = result.backlog_segments, result.backlog_bytes
            self.uploaded += result.uploaded is not None
            if result.error:
                self.failures += 1
                self.error = result.error
                return result.delay_s
            self.error = ""
            if result.uploaded is None:
                self._idle_to = max((s.last for s in offer.segments if s.last <= offer.commit), default=NOT_KNOWN)
                self._synced = {s.first: s.size for s in offer.segments}
                break
            if self.stopping:
                break
        return 0.0


class TierTask(TierRounds):
    """:class:`TierRounds` on a thread of their own (``zeps-tier-<stream>``), fed by the loop's offers."""

    def __init__(self, name: str, zk: Any, paths: StreamPaths, store: BatchStore, tiering: Tiering, *,
                 acl: list[Any] | None = None, wall_ms: Callable[[], int] = lambda: int(time.time() * 1000),
                 interval_s: float = ROUND_INTERVAL_S) -> None:  # fmt: skip
        super().__init__(name, zk, paths, store, tiering, acl=acl, wall_ms=wall_ms, interval_s=interval_s)
        self._offer: Offer | None = None
        self._wake = threading.Condition()
        self._thread = threading.Thread(target=self._run, name=f"zeps-tier-{name}", daemon=True)

    def start(self) -> TierTask:
        self._thread.start()
        return self

    def offer(self, offer: Offer) -> None:
        """The loop's news (never blocks: the thread takes the newest when it is free)."""
        with self._wake:
            self._offer = offer
            self._wake.notify()

    def stop(self, timeout: float = 30.0) -> None:
        """Ends after the round under way (an upload is not cut off midway)."""
        with self._wake:
            self.stopping = True
            self._wake.notify()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            with self._wake:
                self._wake.wait_for(lambda: self.stopping or self._offer is not None)
                if self.stopping:
                    return
                offer, self._offer = self._offer, None
            assert offer is not None
            now = time.monotonic()
            if self.due(offer, now):
                self.round(offer, now)


class TierServe:
    """One stream's reads of its object store for subscriptions behind its journal, on a thread
    (``zeps-tier-read-<stream>``), one at a time in the order asked. ``answer(read, chunk, failed)``
    is called on that thread with the records (None: the store does not hold ``read.start``), or
    ``failed`` when the store or ZooKeeper did not answer; the loop takes the answers from there."""

    def __init__(self, name: str, reader: TierReader, answer: Callable[[Any, Chunk | None, bool], None], *,
                 refresh_s: float = ROUND_INTERVAL_S) -> None:  # fmt: skip
        self.name, self.reader, self.answer, self.refresh_s = name, reader, answer, refresh_s
        self.reads = 0  #: reads answered with records
        self._asks: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._refreshed = -float("inf")
        self._thread = threading.Thread(target=self._run, name=f"zeps-tier-read-{name}", daemon=True)

    def start(self) -> TierServe:
        self._thread.start()
        return self

    def ask(self, read: Any) -> None:
        self._asks.put(read)

    def stop(self, timeout: float = 30.0) -> None:
        self._asks.put(None)
        if self._thread.is_alive():
            self._thread.join(timeout)
        self.reader.close()

    def _run(self) -> None:
        while (read := self._asks.get()) is not None:
            try:
                chunk = self._read(read)
            except (CoordinationError, ZepsError, OSError) as exc:  # the subscription asks again later
                log.warning("tiering %s: reading records from %d in the store: %s", self.name, read.start, exc)
                self.answer(read, None, True)
                continue
            except Exception:  # a bug: the subscription must not wait for ever
                log.exception("tiering %s: reading records from %d in the store", self.name, read.start)
                self.answer(read, None, True)
                continue
            self.reads += chunk is not None
            self.answer(read, chunk, False)

    def _read(self, read: Any) -> Chunk | None:
        """The records, the manifest read again when it is old, or when it does not name ``read.start``."""
        fresh = time.monotonic() - self._refreshed < self.refresh_s
        if not fresh:
            self.reader.refresh()
            self._refreshed = time.monotonic()
        chunk = self._read_from(read)
        if chunk is None and fresh:  # uploaded since the manifest was read: once more, read again
            self.reader.refresh()
            self._refreshed = time.monotonic()
            chunk = self._read_from(read)
        return chunk

    def _read_from(self, read: Any) -> Chunk | None:
        """``read``'s records from its start, or (a replay from a time) from the store's first record at
        or after ``read.since_ms``: the manifest's last timestamps find its object, one object is read."""
        start = read.start
        if read.since_ms:
            found = self.reader.seek_time(read.since_ms)
            if not found:  # the store holds nothing that late: the journal does
                return None
            start = max(start, found)
        return self.reader.read_chunk(start, max_bytes=read.max_bytes, max_records=read.max_records, end=read.end)

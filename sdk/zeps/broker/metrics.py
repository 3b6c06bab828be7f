"""A broker's Prometheus metrics: per stream (traffic, journal, subscriptions, refusals, producers)
and, for a replicated stream, its replica's role and its followers' lag.

The loop's state lives in :class:`~zeps.broker.core.BrokerCore` as plain counters; the broker
thread copies it here once a second (:meth:`BrokerMetrics.update`), so a scrape, served by
``prometheus_client``'s own thread, never touches the core. Every label is a stream the broker
serves, a refusal code, or one of the bounded set of subscriptions furthest behind: nothing a
peer chooses becomes a series of its own. The README's metrics table is generated from these
objects (``tools/gen_docs.py``).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge

from zeps.broker.core import BrokerCore

__all__ = ["LAG_SERIES", "BrokerMetrics", "ReplicationMetrics", "TieringMetrics"]

#: subscriber-lag series per stream: the furthest behind (subscriptions come and go by the thousand)
LAG_SERIES = 20


class _FreeSpace:
    """``zeps_broker_journal_free_bytes``: free bytes on each journal's volume (for an unprivileged
    writer), from statvfs at most once a second per stream."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.gauge = Gauge("zeps_broker_journal_free_bytes", "Free bytes on the journal's volume", ["stream"],
                           registry=registry)  # fmt: skip
        self._read: dict[str, float] = {}  # stream -> when its volume was last looked at

    def update(self, name: str, directory: Path) -> None:
        now = time.monotonic()
        if now - self._read.get(name, -1.0) < 1.0:
            return
        self._read[name] = now
        try:
            vfs = os.statvfs(directory)
        except OSError:
            return
        self.gauge.labels(name).set(vfs.f_bavail * vfs.f_frsize)


class ReplicationMetrics:
    """A replicated stream's gauges: this replica's role, the epoch, the in-sync set, followers' lag."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.leader = Gauge("zeps_broker_replica_leader", "1 while this replica leads the stream", ["stream"],
                            registry=registry)  # fmt: skip
        self.epoch = Gauge("zeps_broker_replica_epoch", "The leader epoch this replica leads (0: it follows)",
                           ["stream"], registry=registry)  # fmt: skip
        self.in_sync = Gauge("zeps_broker_replica_in_sync", "Replicas in sync, the leader included (leader only)",
                             ["stream"], registry=registry)  # fmt: skip
        self.lag = Gauge("zeps_broker_replica_follower_lag", "Records a follower lacks of the leader's durable tail "
                         "(leader only)", ["stream", "follower"], registry=registry)  # fmt: skip
        self.min_in_sync = Gauge("zeps_broker_replica_min_in_sync", "Replicas that must hold a record before it "
                                 "is confirmed (spec.minInSync)", ["stream"], registry=registry)  # fmt: skip
        self.leaderless = Gauge("zeps_broker_replica_leaderless", "1 while this replica knows no leader of the "
                                "stream (an election is on, or none of the in-sync replicas runs)", ["stream"],
                                registry=registry)  # fmt: skip
        self.shutdown_held = Gauge("zeps_broker_replica_shutdown_held", "1 while this replica, asked to stop, "
                                   "waits: its stop would leave fewer than minInSync replicas in sync", ["stream"],
                                   registry=registry)  # fmt: skip

    def update(self, name: str, stream: Any, min_insync: int, *, leaderless: bool, shutdown_held: bool = False) -> None:
        leader = stream.leader
        self.shutdown_held.labels(name).set(1 if shutdown_held else 0)
        self.min_in_sync.labels(name).set(min_insync)
        self.leaderless.labels(name).set(1 if leaderless else 0)
        self.leader.labels(name).set(1 if leader is not None else 0)
        self.epoch.labels(name).set(leader.epoch if leader is not None else 0)
        self.in_sync.labels(name).set(len(leader.isr) if leader is not None else 0)
        self.lag.clear()
        if leader is not None:
            for follower, f in leader.followers.items():
                self.lag.labels(name, follower).set(max(0, stream.journal.durable - f.durable))


class _TaskCounters:
    """Counters that follow a task thread's own running totals: each update adds what a total grew by
    since the last (a task counts in plain ints; the registry's counters only go up)."""

    def __init__(self) -> None:
        self._counted: dict[tuple[str, str], int] = {}

    def _count(self, name: str, counters: tuple[tuple[Counter, str, int], ...]) -> None:
        for counter, kind, value in counters:
            seen = self._counted.get((name, kind), 0)
            if value > seen:
                counter.labels(name).inc(value - seen)
                self._counted[(name, kind)] = value


class TieringMetrics(_TaskCounters):
    """A tiered stream's gauges (``zeps-broker --tier-store``), from its TierTask (zeps.broker.tiering)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__()
        self.tiered_to = Gauge("zeps_broker_tier_tiered_to", "The object store holds every record of the stream up "
                               "to this sequence (-1: not known yet); local retention deletes only below it",
                               ["stream"], registry=registry)  # fmt: skip
        self.backlog_bytes = Gauge("zeps_broker_tier_backlog_bytes", "Bytes of closed segments the object store "
                                   "does not hold yet (the leader's view): they stay on the volume until it does",
                                   ["stream"], registry=registry)  # fmt: skip
        self.backlog_segments = Gauge("zeps_broker_tier_backlog_segments", "Closed segments the object store does "
                                      "not hold yet", ["stream"], registry=registry)  # fmt: skip
        self.uploaded = Counter("zeps_broker_tier_uploads", "Objects this broker uploaded", ["stream"],
                                registry=registry)  # fmt: skip
        self.failures = Counter("zeps_broker_tier_failures", "Rounds of uploads that stopped on an error of the "
                                "object store or ZooKeeper (each is tried again, with backoff)", ["stream"],
                                registry=registry)  # fmt: skip

    def update(self, name: str, task: Any) -> None:
        self.tiered_to.labels(name).set(task.tiered_to)
        self.backlog_bytes.labels(name).set(task.backlog_bytes)
        self.backlog_segments.labels(name).set(task.backlog_segments)
        self._count(name, ((self.uploaded, "uploaded", task.uploaded), (self.failures, "failures", task.failures)))


class CompactionMetrics(_TaskCounters):
    """A compacted stream's counters (``zeps-broker --cleanup compact``), from its CompactionTask
    (zeps.broker.compacting)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__()
        self.passes = Counter("zeps_broker_compaction_passes", "Compaction passes finished (a pass maps the closed "
                              "segments' keys, and rewrites them if enough records are superseded)", ["stream"],
                              registry=registry)  # fmt: skip
        self.segments = Counter("zeps_broker_compaction_segments", "Closed segments rewritten by compaction",
                                ["stream"], registry=registry)  # fmt: skip
        self.removed = Counter("zeps_broker_compaction_removed_records", "Records compaction removed (superseded by "
                               "a later record of their key, or deletes past their retention)", ["stream"],
                               registry=registry)  # fmt: skip
        self.failures = Counter("zeps_broker_compaction_failures", "Compaction passes that failed (a full volume: "
                                "every segment stays as it was, the next pass a minute later)", ["stream"],
                                registry=registry)  # fmt: skip

    def update(self, name: str, task: Any) -> None:
        self._count(
            name,
            (
                (self.passes, "passes", task.passes),
                (self.segments, "segments", task.segments),
                (self.removed, "removed", task.removed),
                (self.failures, "failures", task.failures),
            ),
        )


class BrokerMetrics:
    """Every stream's series, in ``registry``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        def counter(name: str, doc: str, labels: tuple[str, ...] = ("stream",)) -> Counter:
            return Counter(name, doc, labels, registry=registry)

        def gauge(name: str, doc: str, labels: tuple[str, ...] = ("stream",)) -> Gauge:
            return Gauge(name, doc, labels, registry=registry)

        self.messages_in = counter("zeps_broker_messages_in", "Messages published")
        self.messages_out = counter("zeps_broker_messages_out", "Messages delivered")
        self.bytes_out = counter("zeps_broker_bytes_out", "DELIVER bytes sent")
        self.replayed = counter("zeps_broker_messages_replayed", "Messages delivered from the journal to "
                                "subscriptions behind the tail")  # fmt: skip
        self.fell_behind = counter("zeps_broker_fell_behind", "Times a live subscription lost pace and went to replay")
        self.duplicates = counter("zeps_broker_duplicates_dropped", "Publishes of idempotent producers dropped: the "
                                  "journal held them already")  # fmt: skip
        self.multicast_records = counter("zeps_broker_multicast_records", "Records queued for the multicast group")
        self.multicast_dropped = counter("zeps_broker_multicast_dropped", "Multicast messages dropped: the group's "
                                         "pipe stayed full past the backlog", ())  # fmt: skip
        self.refused = counter("zeps_broker_refused_frames", "Refusals sent (INVALID), by code; stream is empty for "
                               "a peer not attached", ("stream", "code"))  # fmt: skip
        self.journal_bytes = gauge("zeps_broker_journal_bytes", "Journal size")
        self.last_seq = gauge("zeps_broker_last_sequence", "Last durable sequence")
        self.first_seq = gauge("zeps_broker_first_sequence", "Oldest sequence the journal holds (retention removed "
                               "those before it)")  # fmt: skip
        self.producers = gauge("zeps_broker_producers", "Idempotent producers the stream's table holds (its limit: "
                               "maxProducers)")  # fmt: skip
        self.subscriptions = gauge("zeps_broker_subscriptions", "Subscriptions and open fetches")
        self.replaying = gauge("zeps_broker_replay_sessions", "Subscriptions reading from the journal (behind the "
                               "tail, or a fetch)")  # fmt: skip
        self.starved = gauge("zeps_broker_credit_starved_subscriptions", "Subscriptions stopped until their client "
                             "sends credit")  # fmt: skip
        self.lag = gauge("zeps_broker_subscriber_lag", f"Records a subscription is behind (the {LAG_SERIES} furthest "
                         "behind per stream)", ("stream", "peer", "sub"))  # fmt: skip
        self.in_flight = gauge("zeps_broker_bytes_in_flight", "Delivery bytes handed to peers' sockets and not yet "
                               "written to their connections, all peerings together (limit: --max-bytes-in-flight)",
                               ())  # fmt: skip
        self.held = gauge("zeps_broker_held_sessions", "Peerings whose deliveries wait for their bytes in flight to "
                          "be written out (a peer reading slowly, or not at all)", ())  # fmt: skip
        self.connections = gauge("zeps_broker_connections", "Connections open to the broker, handshakes under way "
                                 "included (limit: --max-connections)", ())  # fmt: skip
        self.connections_refused = counter("zeps_broker_connections_refused", "Connections refused at their "
                                           "handshake: the connection budget was full", ())  # fmt: skip
        self.free = _FreeSpace(registry)
        self._exported: dict[tuple[str, ...], int] = {}  # counter values already exported, by series

    def _count(self, counter: Counter, labels: tuple[str, ...], value: int) -> None:
        """Bring ``counter``'s series up to ``value`` (the core's cumulative count)."""
        series = (counter._name, *labels)
        seen = self._exported.get(series, 0)
        if value > seen:
            counter.labels(*labels).inc(value - seen)
            self._exported[series] = value

    def update(self, core: BrokerCore) -> None:
        """Copy the core's state (the broker thread calls this, at most once a second)."""
        self.lag.clear()
        for name, stream in core.streams.items():
            journal = stream.journal
            self.journal_bytes.labels(name).set(journal.size_bytes)
            self.last_seq.labels(name).set(stream.committed)
            self.first_seq.labels(name).set(journal.first_sequence)
            self.producers.labels(name).set(len(journal.producers))
            self.free.update(name, journal.directory)
            for counter, value in ((self.messages_in, stream.messages_in), (self.messages_out, stream.messages_out),
                                   (self.bytes_out, stream.bytes_out), (self.replayed, stream.messages_replayed),
                                   (self.fell_behind, stream.fell_behind), (self.duplicates, stream.duplicates),
                                   (self.multicast_records, stream.outbox.records)):  # fmt: skip
                self._count(counter, (name,), value)
            count, furthest = core.lag(name, most=LAG_SERIES)
            replaying, starved = core.states(name)
            self.subscriptions.labels(name).set(count)
            self.replaying.labels(name).set(replaying)
            self.starved.labels(name).set(starved)
            for peer, sub in furthest:
                self.lag.labels(name, peer, str(sub.id)).set(sub.lag)
        for labels, value in core.refusals.items():
            self._count(self.refused, labels, value)
        self.in_flight.set(core.bytes_in_flight)
        self.held.set(core.held)

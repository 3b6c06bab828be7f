"""The operator's metrics about the resources it reconciles: what each Topic, Queue and ZepsStream
looks like, as its status says, as Prometheus gauges (one series per resource, labelled
``namespace`` and the resource's name; removed when the resource goes), and the operator's own
health. Set by the facts the handlers and the resync gather (:mod:`zeps_operator.handlers`,
:mod:`zeps_operator.streams`), so a scrape costs no ZooKeeper read.

The alert rules (``charts/zeps/files/zeps-rules.yaml``) and the dashboards use these names; a test
checks that every name they use is one the code exports (``tests/unit/test_monitoring.py``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping

from prometheus_client import Counter, Gauge

from zeps_operator.models import BATCH_CONSUMERS_SHOWN

__all__ = [
    "BATCH_CONSUMERS_SHOWN",
    "DRIFT_REPAIRS",
    "RESYNC_PASSES",
    "ZOOKEEPER_CONNECTED",
    "cleaner_pass",
    "forget",
    "furthest_behind",
    "queue_facts",
    "stream_facts",
    "topic_facts",
    "watch_zookeeper",
]


QUEUE_ITEMS = Gauge("zeps_queue_items", "Items waiting in a work Queue, taken ones included", ["namespace", "queue"])
QUEUE_IN_FLIGHT = Gauge("zeps_queue_in_flight", "Items of a work Queue taken and not acked", ["namespace", "queue"])
QUEUE_DEAD_LETTERS = Gauge("zeps_queue_dead_letters", "Dead-lettered items of a work Queue", ["namespace", "queue"])
BATCH_CONSUMER_LAG = Gauge(
    "zeps_batch_consumer_lag_batches",
    f"Batches a batch Queue's consumer still has to process (the {BATCH_CONSUMERS_SHOWN} furthest behind)",
    ["namespace", "queue", "consumer"],
)
QUEUE_OLDEST_AGE = Gauge(
    "zeps_queue_oldest_item_age_seconds",
    "Age of a work Queue's oldest item (0: empty; not set above 10,000 items, which are not listed)",
    ["namespace", "queue"],
)
TOPIC_SUBSCRIBERS = Gauge("zeps_topic_subscribers", "Live subscribers of a Topic", ["namespace", "topic"])
TOPIC_UNDELIVERED = Gauge(
    "zeps_topic_undelivered_messages",
    "Messages waiting in a Topic's subscriber queues (the first 1,000 queues by name; not set above 10,000 queues)",
    ["namespace", "topic"],
)
TOPIC_CLEANER_PASSES = Counter(
    "zeps_topic_cleaner_passes", "Cleaner passes over a Topic (this operator replica's)", ["namespace", "topic"]
)
TOPIC_QUEUES_REMOVED = Counter(
    "zeps_topic_queues_removed", "Queues of vanished consumers the cleaner removed", ["namespace", "topic"]
)
STREAM_READY = Gauge(
    "zeps_stream_broker_ready",
    "1 while a ZepsStream's broker (its leader, with minInSync replicas running) serves and is registered",
    ["namespace", "stream"],
)
STREAM_ROLL_BLOCKED = Gauge(
    "zeps_stream_roll_blocked_seconds",
    "How long a ZepsStream's data-aware roll has been blocked: restarting its next pod would leave fewer than "
    "minInSync replicas in sync (0 while it rolls, or waits for a restarted replica; no series once it is done)",
    ["namespace", "stream", "statefulset"],
)
DRIFT_REPAIRS = Counter("zeps_operator_drift_repairs", "ZooKeeper paths restored by a resync pass", ["kind"])
RESYNC_PASSES = Counter(
    "zeps_operator_resync_passes", "Resync passes completed over every known object (stalled: drift goes unrepaired)"
)
ZOOKEEPER_CONNECTED = Gauge(
    "zeps_operator_zookeeper_connected", "1 while the operator's ZooKeeper session is connected"
)

_BY_KIND: Mapping[str, tuple[Gauge | Counter, ...]] = {
    "Queue": (QUEUE_ITEMS, QUEUE_IN_FLIGHT, QUEUE_DEAD_LETTERS, QUEUE_OLDEST_AGE),
    "Topic": (TOPIC_SUBSCRIBERS, TOPIC_UNDELIVERED, TOPIC_CLEANER_PASSES, TOPIC_QUEUES_REMOVED),
    "ZepsStream": (STREAM_READY,),
}


def furthest_behind(lag: Mapping[str, int]) -> list[tuple[str, int]]:
    """The ``BATCH_CONSUMERS_SHOWN`` consumers furthest behind, the furthest first."""
    return sorted(lag.items(), key=lambda kv: -kv[1])[:BATCH_CONSUMERS_SHOWN]


def queue_facts(namespace: str, name: str, *, items: int, in_flight: int, dead: int, lag: Mapping[str, int],
                oldest_age_s: float | None = None) -> None:  # fmt: skip
    QUEUE_ITEMS.labels(namespace, name).set(items)
    if oldest_age_s is not None:
        QUEUE_OLDEST_AGE.labels(namespace, name).set(oldest_age_s)
    else:
        with contextlib.suppress(KeyError):  # not known (too many items to list): no stale value either
            QUEUE_OLDEST_AGE.remove(namespace, name)
    QUEUE_IN_FLIGHT.labels(namespace, name).set(in_flight)
    QUEUE_DEAD_LETTERS.labels(namespace, name).set(dead)
    _forget_consumers(namespace, name)
    for consumer, behind in furthest_behind(lag):
        BATCH_CONSUMER_LAG.labels(namespace, name, consumer).set(behind)


def topic_facts(namespace: str, name: str, *, subscribers: int, undelivered: int | None) -> None:
    TOPIC_SUBSCRIBERS.labels(namespace, name).set(subscribers)
    if undelivered is not None:
        TOPIC_UNDELIVERED.labels(namespace, name).set(undelivered)
    else:
        with contextlib.suppress(KeyError):  # not known (too many queues to list): no stale value either
            TOPIC_UNDELIVERED.remove(namespace, name)


def cleaner_pass(namespace: str, name: str, *, removed: int) -> None:
    """A cleaner pass over the Topic ended, having removed ``removed`` queues."""
    TOPIC_CLEANER_PASSES.labels(namespace, name).inc()
    if removed:
        TOPIC_QUEUES_REMOVED.labels(namespace, name).inc(removed)


def stream_facts(namespace: str, name: str, *, ready: bool) -> None:
    STREAM_READY.labels(namespace, name).set(1 if ready else 0)


def roll_facts(namespace: str, name: str, statefulset: str, *, blocked_s: float | None) -> None:
    """A broker set's roll: how long it has been blocked (0: rolling, or waiting for a restarted
    replica); None: no roll (the series goes)."""
    if blocked_s is None:
        with contextlib.suppress(KeyError):
            STREAM_ROLL_BLOCKED.remove(namespace, name, statefulset)
    else:
        STREAM_ROLL_BLOCKED.labels(namespace, name, statefulset).set(round(blocked_s, 1))


def forget(kind: str, namespace: str, name: str) -> None:
    """Remove a deleted resource's series (a gauge frozen at its last value would page for nothing)."""
    for gauge in _BY_KIND.get(kind, ()):
        with contextlib.suppress(KeyError):  # never set
            gauge.remove(namespace, name)
    if kind == "Queue":
        _forget_consumers(namespace, name)
    if kind == "ZepsStream":
        _forget_series(STREAM_ROLL_BLOCKED, namespace, "stream", name, "statefulset")


def _forget_consumers(namespace: str, name: str) -> None:
    _forget_series(BATCH_CONSUMER_LAG, namespace, "queue", name, "consumer")


def _forget_series(gauge: Gauge, namespace: str, label: str, name: str, rest: str) -> None:
    """Remove every series of ``gauge`` for resource ``name``, whatever its third label ``rest``:
    prometheus_client has no "remove by partial labels", so they are found among the samples."""
    for metric in gauge.collect():
        for sample in metric.samples:
            labels = sample.labels
            if labels.get("namespace") == namespace and labels.get(label) == name:
                with contextlib.suppress(KeyError):
                    gauge.remove(namespace, name, labels[rest])


def watch_zookeeper(connected: Callable[[], bool]) -> None:
    """``zeps_operator_zookeeper_connected`` read at each scrape from ``connected``."""
    ZOOKEEPER_CONNECTED.set_function(lambda: 1.0 if connected() else 0.0)

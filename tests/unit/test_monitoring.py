"""Every metric the alert rules and the dashboards name is one zeps really exports, under that name (a counter's
samples end in _total), and the operator's resource gauges follow the resources (a deleted one's
series go)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml
from prometheus_client import REGISTRY, CollectorRegistry

import zeps_operator.state  # noqa: F401  (registers the reconcile counter)
from zeps.broker import BrokerConfig, BrokerServer
from zeps.broker.metrics import CompactionMetrics, ReplicationMetrics, TieringMetrics
from zeps_operator import metrics

FILES = Path(__file__).resolve().parents[2] / "charts" / "zeps" / "files"
RULES = FILES / "zeps-rules.yaml"


def expressions() -> list[str]:
    """Every PromQL expression zeps ships: the alert rules' and the dashboards' panels'."""
    rules = yaml.safe_load(RULES.read_text())
    found = [r["expr"] for g in rules["groups"] for r in g["rules"]]
    for dashboard in sorted((FILES / "dashboards").glob("*.json")):
        panels = json.loads(dashboard.read_text())["panels"]
        found += [t["expr"] for p in panels for t in p["targets"]]
    return found


def _sample_names(registry: CollectorRegistry) -> set[str]:
    names = set()
    for family in registry.collect():
        names.add(family.name)
        names |= {f"{family.name}_total"} if family.type == "counter" else set()
    return names


def _exported(tmp_path: Path) -> set[str]:
    broker = BrokerServer(BrokerConfig(data_dir=tmp_path, streams=("s",)))  # made, never started: no socket
    replication, tiering, compaction = CollectorRegistry(), CollectorRegistry(), CollectorRegistry()
    ReplicationMetrics(replication)
    TieringMetrics(tiering)
    CompactionMetrics(compaction)
    return (_sample_names(REGISTRY) | _sample_names(broker.registry) | _sample_names(replication)
            | _sample_names(tiering) | _sample_names(compaction))  # fmt: skip


def test_every_metric_the_rules_and_dashboards_name_is_exported(tmp_path: Path) -> None:
    named = {m for e in expressions() for m in re.findall(r"\bzeps_[a-z0-9_]+", e)}
    assert len(named) > 10, "the rules and dashboards name hardly any zeps metric"
    missing = named - _exported(tmp_path)
    assert not missing, f"the rules or dashboards name metrics zeps does not export: {sorted(missing)}"


def test_a_deleted_resource_s_series_go_and_batch_consumers_are_bounded() -> None:
    lag = {f"c{i}": i for i in range(50)}
    metrics.queue_facts("shop", "ledger", items=3, in_flight=1, dead=0, lag=lag, oldest_age_s=12.5)
    metrics.topic_facts("shop", "news", subscribers=2, undelivered=7)
    metrics.cleaner_pass("shop", "news", removed=2)
    consumers = {s.labels["consumer"] for f in metrics.BATCH_CONSUMER_LAG.collect() for s in f.samples
                 if s.labels["queue"] == "ledger"}  # fmt: skip
    assert consumers == {f"c{i}" for i in range(50 - metrics.BATCH_CONSUMERS_SHOWN, 50)}, "the furthest behind"
    assert REGISTRY.get_sample_value("zeps_queue_items", {"namespace": "shop", "queue": "ledger"}) == 3
    metrics.forget("Queue", "shop", "ledger")
    assert REGISTRY.get_sample_value("zeps_queue_items", {"namespace": "shop", "queue": "ledger"}) is None
    assert not [s for f in metrics.BATCH_CONSUMER_LAG.collect() for s in f.samples if s.labels["queue"] == "ledger"]
    assert REGISTRY.get_sample_value("zeps_topic_subscribers", {"namespace": "shop", "topic": "news"}) == 2
    queue, topic = {"namespace": "shop", "queue": "ledger"}, {"namespace": "shop", "topic": "news"}
    assert REGISTRY.get_sample_value("zeps_topic_queues_removed_total", topic) == 2
    metrics.forget("Topic", "shop", "news")
    for name in ("zeps_topic_subscribers", "zeps_topic_undelivered_messages", "zeps_topic_cleaner_passes_total",
                 "zeps_topic_queues_removed_total"):  # fmt: skip
        assert REGISTRY.get_sample_value(name, topic) is None, name
    assert REGISTRY.get_sample_value("zeps_queue_oldest_item_age_seconds", queue) is None


def test_an_oldest_age_not_known_removes_the_series_rather_than_leave_it_stale() -> None:
    queue = {"namespace": "shop", "queue": "huge"}
    metrics.queue_facts("shop", "huge", items=3, in_flight=0, dead=0, lag={}, oldest_age_s=30.0)
    assert REGISTRY.get_sample_value("zeps_queue_oldest_item_age_seconds", queue) == 30.0
    metrics.queue_facts("shop", "huge", items=20_000, in_flight=0, dead=0, lag={}, oldest_age_s=None)
    assert REGISTRY.get_sample_value("zeps_queue_oldest_item_age_seconds", queue) is None
    metrics.forget("Queue", "shop", "huge")


def test_undelivered_messages_not_known_remove_the_series() -> None:
    topic = {"namespace": "shop", "topic": "crowded"}
    metrics.topic_facts("shop", "crowded", subscribers=1, undelivered=4)
    assert REGISTRY.get_sample_value("zeps_topic_undelivered_messages", topic) == 4
    metrics.topic_facts("shop", "crowded", subscribers=1, undelivered=None)  # over 10,000 queues
    assert REGISTRY.get_sample_value("zeps_topic_undelivered_messages", topic) is None
    metrics.forget("Topic", "shop", "crowded")

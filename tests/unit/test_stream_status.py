"""What a replicated stream's status takes from its brokers' facts (their member nodes in ZooKeeper,
written by brokers, so bounded and typed before they reach status)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from zeps_operator.streams import follower_lag, held_shutdowns


@dataclass
class Member:
    metadata: Any = field(default_factory=dict)


def test_held_shutdowns_are_the_replicas_that_say_why_they_wait_bounded() -> None:
    members = {
        "orders-broker-1": Member({"shutdownHeld": "without orders-broker-1, 1 replicas would be in sync"}),
        "orders-broker-0": Member({"shutdownHeld": ""}),  # not waiting
        "orders-broker-2": Member({"shutdownHeld": {"not": "a string"}}),
        "odd": Member("not a mapping"),
        "long": Member({"shutdownHeld": "x" * 10_000}),
    }
    held = held_shutdowns(members)
    assert held == {"long": "x" * 300, "orders-broker-1": "without orders-broker-1, 1 replicas would be in sync"}
    many = {f"m{i:03d}": Member({"shutdownHeld": "waiting"}) for i in range(100)}
    assert len(held_shutdowns(many)) == 16


def test_follower_lag_keeps_names_and_numbers_only() -> None:
    facts = {"replication": {"followerLag": {"b": 3, "c": "x", "d": True, "e": 0}}}
    assert follower_lag(facts) == {"b": 3, "e": 0}
    assert follower_lag({"replication": "nonsense"}) == {}

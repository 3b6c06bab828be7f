"""A short chaos run on real processes (``make chaos-replication`` runs a long one): three replicas
and their ZooKeeper proxies, publishers and subscribers, random faults a round (see
chaos.replication), then the history checked. Nothing is mocked."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from chaos import replication
from zeps_dev import ZooKeeperServer

ROUNDS = int(os.environ.get("ZEPS_CHAOS_ROUNDS", "4"))


@pytest.mark.slow
def test_random_faults_lose_nothing_confirmed_and_take_back_nothing_delivered(
    zookeeper_server: ZooKeeperServer, tmp_path: Path
) -> None:
    seed = int(os.environ.get("ZEPS_CHAOS_SEED", "0")) or int.from_bytes(os.urandom(2), "big")
    reports = replication.run(zookeeper_server, tmp_path, rounds=ROUNDS, seed=seed)
    summary = {fault: vars(r) for fault, r in reports.items() if r.rounds or r.confirmed}
    print(f"chaos seed {seed} (replay: make chaos-replication SEED={seed} ROUNDS={ROUNDS}): {summary}")
    assert sum(r.confirmed for r in reports.values()) > 0, "nothing was confirmed: the run did not run"
    if replication.bad(reports):  # the seed first: pytest shortens a long assertion's message
        examples = [e for r in reports.values() for e in r.examples[:5]] + reports["none"].examples[-15:]
        pytest.fail(
            f"seed {seed} broke the promise (replay: make chaos-replication SEED={seed} ROUNDS={ROUNDS}): "
            f"{examples}; {summary}",
            pytrace=False,
        )

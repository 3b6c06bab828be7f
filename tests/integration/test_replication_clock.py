"""A replicated stream whose replicas' wall clocks jump, as after an NTP step or a mis-set host clock:
real processes (three ``zeps-broker`` replicas, ``--min-insync 2``), a real ZooKeeper, an idempotent
publisher (``tests/workers/replica_client.py``). Each replica's time of day is shifted by an
``LD_PRELOAD`` library (:mod:`zeps_dev.wallclock`: the one part not real, since this machine's clock
is not ours to set); its monotonic clock is left alone, as a real step leaves it.

Nothing in replication may read the wall clock: the leader's clock two days back and then half a day
ahead, a follower's a day ahead, and the stream goes on confirming with all three in sync, each
confirmed publish held once, in order, by every replica; the journal's timestamps never go back (a
record stamped while the leader's clock was ahead keeps later records from being stamped earlier)."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness import Publisher, ReplicaSet, ZooKeeperHarness, assert_published_once_in_order, until
from zeps_dev.wallclock import WallClock, available

pytestmark = pytest.mark.skipif(available() is not None, reason=str(available()))

DAY = 86400.0


def test_wall_clocks_jumping_back_and_ahead_lose_nothing_and_keep_the_in_sync_set(
    zookeeper: ZooKeeperHarness, tmp_path: Path
) -> None:
    replicas = ReplicaSet(zookeeper, tmp_path)
    replicas.clocks = {name: WallClock(tmp_path / f"{name}.clock") for name in replicas.names}
    publisher: Publisher | None = None
    try:
        leader = replicas.start_in_sync()
        follower = next(n for n in replicas.names if n != leader)
        publisher = Publisher(zookeeper, tmp_path)
        publisher.goes_on(1, "the publisher confirming")

        for who, jump in ((leader, -2 * DAY), (leader, DAY / 2), (follower, DAY)):
            replicas.clocks[who].jump(jump)
            publisher.goes_on(200, f"confirmations with {who}'s clock at {jump:+.0f} s")
            # all three in sync while the clock is off (a follower that fell behind on a busy machine
            # is back within the wait; one judged by a clock a day off would stay out)
            until(lambda: len(replicas.state().isr) == 3, f"all three in sync with {who}'s clock at {jump:+.0f} s",
                  timeout=30)  # fmt: skip
            replicas.clocks[who].reset()
        publisher.goes_on(50, "confirmations with every clock right again")
        until(lambda: len(replicas.state().isr) == 3, "all three in sync once the clocks are right", timeout=60)
        assert replicas.state().leader == leader, "a clock jump moved the leadership"
        confirmed = publisher.stop()
        replicas.stop()
        records = {name: replicas.records(name) for name in replicas.names}
    finally:
        if publisher is not None:
            publisher.stop()
        replicas.stop()
    assert_published_once_in_order({n: [(r.sequence, r.body) for r in j] for n, j in records.items()}, confirmed)
    for name, journal in records.items():
        stamps = [r.timestamp_ms for r in journal]
        assert stamps == sorted(stamps), f"{name}: a record stamped earlier than the one before it"
        assert stamps[-1] - stamps[0] >= DAY / 2 * 1000 * 0.9, f"{name}: no record stamped while the clock was ahead"
    held = {name: [(r.sequence, r.timestamp_ms) for r in journal] for name, journal in records.items()}
    assert held[replicas.names[0]] == held[replicas.names[1]] == held[replicas.names[2]], "the stamps differ"

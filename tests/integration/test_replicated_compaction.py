"""A compacted stream on three replicas: each replica compacts its own closed, committed segments,
and a replica that is behind copies the segments its leader compacted by sequence (gaps and all).
Real processes: three ``zeps-broker`` replicas (``--min-insync 2``, ``--cleanup compact``), a real
ZooKeeper, kill -9.

What holds: every record a replica holds is the one published at its sequence; a replica that
copied compacted segments, elected alone, delivers each key's latest value; and once all three are
back, every replica holds the same latest value per key."""

from __future__ import annotations

import time
from pathlib import Path

from harness import ReplicaSet as Replicas
from harness import ZooKeeperHarness, until
from zeps.journal import JournalConfig

KEYS = 20
FIRST, MORE = 40, 1500  # published with every replica in sync, then with one of them down
#: records the leader's compaction must have removed before the replica behind copies from it: then what
#: it delivers once elected alone (its own FIRST at most, and what it copied) is under half the stream,
#: whatever else compaction has still to do (compacted to the end, the leader removes about 1,500)
COMPACTED = (FIRST + MORE) - (FIRST + MORE) // 2 + FIRST


def _publish(replicas: Replicas, start: int, count: int, published: dict[int, tuple[str, bytes]]) -> None:
    """Records ``start + 1 .. start + count`` (the stream's sequences: it starts empty), confirmed."""
    with replicas.client() as client:
        for i in range(start, start + count):
            key, body = f"key.{i % KEYS}", b"value-%d" % i
            client.publish(key, body)
            published[i + 1] = (key, body)
        client.flush(timeout=60)


def _latest(records: dict[int, tuple[str, bytes]]) -> dict[str, bytes]:
    return {key: body for _, (key, body) in sorted(records.items())}


def _compaction(replicas: Replicas, name: str, what: str) -> float:
    """Replica ``name``'s ``zeps_broker_compaction_<what>_total``."""
    for line in replicas.scrape(name).splitlines():
        if line.startswith(f"zeps_broker_compaction_{what}_total{{"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_replicas_compact_their_own_copies_and_one_behind_copies_the_leader_s_compacted_segments(
    zookeeper: ZooKeeperHarness, tmp_path: Path
) -> None:
    replicas = Replicas(zookeeper, tmp_path)
    replicas.extra = ["--cleanup", "compact", "--min-cleanable-ratio", "0", "--segment-bytes", "4096"]
    replicas.journal_config = JournalConfig(cleanup="compact")
    published: dict[int, tuple[str, bytes]] = {}
    try:
        leader = replicas.start_in_sync()
        _publish(replicas, 0, FIRST, published)
        behind = next(name for name in replicas.names if name != leader)
        other = next(name for name in replicas.names if name not in (leader, behind))
        until(lambda: replicas.all_hold(FIRST), "every replica holding the first records", timeout=30)
        replicas.kill(behind)  # part way through the first segment
        # it never compacts its own copy (a ratio nothing reaches): what it holds compacted is the leader's
        replicas.extra_for[behind] = ["--min-cleanable-ratio", "1"]
        _publish(replicas, FIRST, MORE, published)
        for name in (leader, other):  # each compacts its own copy, once its commit checkpoint covers it
            until(lambda name=name: _compaction(replicas, name, "removed_records") > COMPACTED,  # type: ignore[misc]
                  f"{name} compacting", timeout=60)  # fmt: skip

        replicas.start(behind)  # it copies what the leader compacted, from the middle of a segment on
        until(lambda: len(replicas.state().isr) == 3 and replicas.all_hold(FIRST + MORE), "all three in sync",
              timeout=90)  # fmt: skip
        log = (tmp_path / f"{behind}.log").read_text()
        assert "starting the copy over" not in log  # by sequence, not from nothing
        assert _compaction(replicas, behind, "segments") == 0
        time.sleep(1.5)  # its commit checkpoint is saved once a second: the one it starts from when it leads
        replicas.kill(leader)
        replicas.kill(other)
        until(lambda: replicas.state() is not None and replicas.state().leader == behind, f"{behind} leading",
              timeout=60)  # fmt: skip
        delivered: dict[int, tuple[str, bytes]] = {}
        with replicas.client() as client:
            client.start("", since="earliest")
            deadline = time.monotonic() + 60
            while max(delivered, default=0) < FIRST + MORE and time.monotonic() < deadline:
                delivered |= {m.sequence: (m.key, m.body) for m in client.receive_many(0.2)}
        assert max(delivered) == FIRST + MORE
        assert all(published[sequence] == record for sequence, record in delivered.items())
        assert _latest(delivered) == _latest(published)
        assert len(delivered) < (FIRST + MORE) // 2  # what it copied was compacted (by the leader)

        replicas.start(leader)
        replicas.start(other)
        until(lambda: len(replicas.state().isr) == 3, "all three in sync again", timeout=90)
        _publish(replicas, FIRST + MORE, 1, published)
        until(lambda: replicas.all_hold(FIRST + MORE + 1), "every replica holding the last record", timeout=30)
    finally:
        replicas.stop()
    held = {name: {r.sequence: (r.key, r.body) for r in replicas.records(name)} for name in replicas.names}
    for name, records in held.items():
        assert all(published[sequence] == record for sequence, record in records.items()), name
        assert _latest(records) == _latest(published), name

"""A rolling restart of a replicated stream, as a StatefulSet's rollout does it: each replica stopped
with SIGTERM and started again, followers first, the leader last, while an idempotent publisher and
a subscriber run (``tests/workers/replica_client.py``). Real processes: three ``zeps-broker``
replicas (``--min-insync 2``) and a real ZooKeeper.

A stopping replica leaves the election line (a follower, the in-sync set too) and a stopping leader
hands its lead to an in-sync follower before it stops (``BrokerServer.hand_over``): the next epoch
is elected at once, not after its ZooKeeper session ends. After the roll the lead goes back to
the preferred replica (``--preferred-leader``): the interim leader gives way once it is in sync.
Nothing confirmed is lost or written twice, nothing delivered is taken back, the journals agree.
How long a publisher waits for a confirmation during the roll is measured by ``make bench-roll``,
against stopping without a hand-over."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from harness import WORKERS, ReplicaSet, ZooKeeperHarness, until


def _events(log: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]


def _confirmed(log: Path) -> int:
    return max((e["confirmed"] for e in _events(log) if "confirmed" in e), default=0)


def test_a_rolling_restart_hands_the_lead_over_and_loses_nothing(zookeeper: ZooKeeperHarness, tmp_path: Path) -> None:
    replicas = ReplicaSet(zookeeper, tmp_path)
    replicas.extra = ["--preferred-leader", "r0"]
    workers: dict[str, subprocess.Popen[bytes]] = {}
    common = ["--zookeeper", zookeeper.connect_string, "--chroot", zookeeper.root, "--stop-file",
              str(tmp_path / "stop"), "--seconds", "300"]  # fmt: skip
    try:
        for name in replicas.names:
            replicas.start(name)
        until(lambda: replicas.state() is not None and len(replicas.state().isr) == 3, "three in sync", timeout=60)
        # whoever the first election chose, the lead goes to the preferred replica (two looks, 5 s apart)
        until(lambda: replicas.state().leader == "r0", "r0, the preferred replica, leading", timeout=60)
        for worker, argv in (("publisher", ["publish", "--tag", "p", "--group", "5"]), ("subscriber", ["subscribe"])):
            with (tmp_path / f"{worker}.jsonl").open("wb") as out:
                workers[worker] = subprocess.Popen([sys.executable, str(WORKERS / "replica_client.py"), *argv,
                                                    *common], stdout=out, stderr=subprocess.STDOUT)  # fmt: skip
        publisher_log = tmp_path / "publisher.jsonl"
        until(lambda: _confirmed(publisher_log) > 0, "the publisher confirming", timeout=60)

        before = replicas.state()
        leader = before.leader
        for name in [*(n for n in replicas.names if n != leader), leader]:
            replicas.procs[name].send_signal(signal.SIGTERM)
            assert replicas.procs[name].wait(30) == 0, f"{name} did not stop cleanly"
            replicas.start(name)
            until(lambda: len(replicas.state().isr) == 3, f"{name} back in sync", timeout=60)
            confirmed = _confirmed(publisher_log)
            until(lambda c=confirmed: _confirmed(publisher_log) > c, f"confirming after {name}'s restart", timeout=60)
        interim = replicas.state()
        assert interim.leader != leader and interim.epoch == before.epoch + 1, (before, interim)  # one hand-over
        assert "handed over" in (tmp_path / f"{leader}.log").read_text()
        until(lambda: replicas.state().leader == leader, "the lead back at the preferred replica", timeout=60)
        after = replicas.state()
        assert after.epoch == interim.epoch + 1, (interim, after)  # given back once, not by a failover
        assert "giving it the lead" in (tmp_path / f"{interim.leader}.log").read_text()
        confirmed = _confirmed(publisher_log)
        until(lambda: _confirmed(publisher_log) > confirmed, "confirming after the lead came back", timeout=60)
        for name in replicas.names:  # the followers left the in-sync set before they stopped
            if name != leader:
                assert (
                    "it is stopping but the in-sync set lists it; leaving the set"
                    in (tmp_path / f"{name}.log").read_text()
                ), name

        (tmp_path / "stop").touch()
        for proc in workers.values():
            proc.wait(60)
        replicas.stop()
        journals = {name: replicas.journal(name) for name in replicas.names}
    finally:
        (tmp_path / "stop").touch()
        for proc in workers.values():
            if proc.poll() is None:
                proc.kill()
        replicas.stop()
    _check_history(journals, publisher_log, tmp_path / "subscriber.jsonl")


def _check_history(journals: dict[str, list[tuple[int, bytes]]], publisher_log: Path, subscriber_log: Path) -> None:
    """The journals agree; each publish is in them once, in order, every confirmed one among them;
    nothing delivered differs from them."""
    final, *others = journals.values()
    assert all(other == final for other in others), "the replicas' journals differ"
    mine = [int(body.split(b":")[1]) for _, body in final]
    assert mine == list(range(1, len(mine) + 1)), "publishes repeated or out of order"
    assert len(mine) >= _confirmed(publisher_log), "confirmed publishes are lost"
    held = dict(final)
    delivered = [(seq, body) for e in _events(subscriber_log) for seq, body in e.get("delivered", [])]
    assert delivered, "the subscriber read nothing"
    taken_back = [(seq, body) for seq, body in delivered if held.get(seq) != body.encode()]
    assert taken_back == [], f"delivered records the final log does not hold: {taken_back[:3]}"


def test_a_replica_whose_stop_would_leave_too_few_in_sync_holds_it_until_another_is_back(
    zookeeper: ZooKeeperHarness, tmp_path: Path
) -> None:
    """A drain the operator did not order: one follower is down (out of the in-sync set), and the
    other is asked to stop. Its stop would leave the leader alone, below minInSync 2, so it waits,
    saying so in its log, in its member node's facts (the operator's status and event) and a gauge;
    once the first is back in sync it hands over and stops cleanly."""
    from zeps.coordination import Group  # noqa: PLC0415

    replicas = ReplicaSet(zookeeper, tmp_path)
    try:
        leader = replicas.start_in_sync()
        down, held = (n for n in replicas.names if n != leader)
        replicas.kill(down)
        until(lambda: down not in replicas.state().isr, f"{down} out of the in-sync set", timeout=30)
        replicas.procs[held].send_signal(signal.SIGTERM)
        members = Group(replicas.zk, replicas.paths.brokers)

        def facts() -> str:
            member = members.members().get(held)
            return str(member.metadata.get("shutdownHeld", "")) if member is not None else ""

        until(lambda: "fewer than minInSync 2" in facts(), f"{held}'s facts saying it waits", timeout=30)
        assert replicas.procs[held].poll() is None, f"{held} stopped, leaving {leader} alone in sync"
        assert 'zeps_broker_replica_shutdown_held{stream="prices"} 1.0' in replicas.scrape(held)
        assert held in replicas.state().isr
        replicas.start(down)
        assert replicas.procs[held].wait(60) == 0
        log = (tmp_path / f"{held}.log").read_text()
        assert "holding the shutdown" in log and "the shutdown goes on" in log
        until(lambda: replicas.state().isr == {leader, down}, f"{down} back in sync, {held} gone", timeout=60)
    finally:
        replicas.stop()


def test_every_replica_stopped_at_once_waits_for_none_of_the_others(
    zookeeper: ZooKeeperHarness, tmp_path: Path
) -> None:
    """The whole set stopped together (the stream deleted, scaled to 0, every pod at once): the
    leaders hand over until one is left alone in sync, which would hold its stop for another to be
    back in sync. Each replica marks itself stopping in ZooKeeper as it begins to stop, so the last
    one sees that no one will be back and does not wait out its hand-over timeout (a crashed
    replica leaves no mark: one holding waits for it, as the test above). The journals keep
    everything, and a replica started again is no longer marked."""
    replicas = ReplicaSet(zookeeper, tmp_path)
    try:
        for name in replicas.names:
            replicas.start(name)
        until(lambda: replicas.state() is not None and len(replicas.state().isr) == 3, "three in sync", timeout=60)
        with replicas.client(producer_id="all-stop") as producer:
            producer.publish_many(("k", b"%d" % i) for i in range(1, 101))
            producer.flush(timeout=30)
        for proc in replicas.procs.values():
            proc.send_signal(signal.SIGTERM)
        for name, proc in replicas.procs.items():
            assert proc.wait(60) == 0, f"{name} did not stop cleanly"
        logs = {name: (tmp_path / f"{name}.log").read_text() for name in replicas.names}
        held = [name for name, log in logs.items() if "holding the shutdown" in log]
        for name in held:
            assert "no one to wait for" in logs[name], f"{name} waited for replicas stopping too"
        timed_out = {name: [line for line in log.splitlines() if "stream prices:" in line]
                     for name, log in logs.items() if "no hand-over (timed out" in log}  # fmt: skip
        assert not timed_out, f"waited out the hand-over timeout: {timed_out}"
        assert sorted(replicas.zk.get_children(replicas.paths.replication_stopped)) == replicas.names
        replicas.start("r0")
        until(lambda: sorted(replicas.zk.get_children(replicas.paths.replication_stopped)) == ["r1", "r2"],
              "r0 no longer marked once it runs again", timeout=30)  # fmt: skip
    finally:
        replicas.stop()
    for name in replicas.names:
        assert [body for _, body in replicas.journal(name)] == [b"%d" % i for i in range(1, 101)]

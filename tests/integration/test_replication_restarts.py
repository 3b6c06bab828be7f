"""Replicated streams through the fault every data centre sees: every replica restarting at once, in
any order (a StatefulSet with ``podManagementPolicy: Parallel`` after a power cut). Real processes:
three ``zeps-broker`` replicas (``--min-insync 2``), a real ZooKeeper, kill -9 and SIGSTOP.

The promise held here: a confirmed record is never lost, and a delivered record is never taken back
(the final log holds it at the sequence it was delivered with). A replica's journal may hold more
than was ever committed (a leader's tail no follower copied); after a restart that tail counts only
once the in-sync set holds it in a new epoch (zeps.journal.checkpoint, zeps.replication.isr).
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

import pytest

from harness import ReplicaSet as Replicas
from harness import until
from zeps.client import StreamClient
from zeps.errors import ZepsError
from zeps.replication.election import election_replica


def _read_for(client: StreamClient, seconds: float) -> list[tuple[int, bytes]]:
    """What a subscriber from the start is delivered within ``seconds``."""
    seen: list[tuple[int, bytes]] = []
    deadline = time.monotonic() + seconds
    client.start("", since="earliest")
    while time.monotonic() < deadline:
        seen += [(m.sequence, m.body) for m in client.receive_many(0.2)]
    return seen


def _final_log(replicas: Replicas) -> dict[int, bytes]:
    """The stream's log once all three are back and in sync, and one more record is confirmed by all
    (so every journal holds the same committed log): sequence -> body, from each journal, which must agree."""
    for name in replicas.names:
        if replicas.procs[name].poll() is not None:
            replicas.start(name)
    until(lambda: replicas.state() is not None and len(replicas.state().isr) == 3, "all three in sync", timeout=90)
    with replicas.client() as client:
        client.publish("k", b"final")
        client.flush(timeout=60)
    replicas.stop()
    logs = [dict(replicas.journal(name)) for name in replicas.names]
    assert logs[0] == logs[1] == logs[2], "the replicas' journals differ"
    return logs[0]


def test_a_full_restart_with_the_old_leader_first_loses_nothing_confirmed_and_takes_back_nothing_delivered(
    replicas: Replicas,
) -> None:
    """The issue's case, as a user would run it: the followers stop (SIGSTOP), the leader takes 20
    publishes no follower copies (not confirmed: right), then all three die (kill -9) and the old
    leader comes back first and alone. Before, it confirmed all 20 to the producer's resend and
    delivered them to a new subscriber within 6 s; then the other two, started without it, elected
    a leader that never had them: 20 confirmed records lost, 20 delivered records taken back."""
    leader = replicas.leader()
    until(lambda: len(replicas.state().isr) == 3, "all three replicas in sync", timeout=30)
    followers = [n for n in replicas.names if n != leader]
    producer = replicas.client(producer_id="restarts", timeout=10)  # its close's flush of the tail fails
    producer.connect()
    confirmed: list[bytes] = []
    try:
        for i in range(1, 31):
            producer.publish("k", b"before-%d" % i)
        producer.flush(timeout=30)
        confirmed += [b"before-%d" % i for i in range(1, 31)]

        replicas.pause(followers)
        for i in range(1, 21):
            producer.publish("k", b"tail-%d" % i)
        with pytest.raises(ZepsError):
            producer.flush(timeout=3)  # no follower holds them: not confirmed
        for name in replicas.names:
            replicas.kill(name)

        replicas.start(leader)  # first, and alone
        with replicas.client() as reader:
            delivered = _read_for(reader, 8.0)
        with pytest.raises(ZepsError):
            producer.flush(timeout=6)  # the resend: the old leader alone must not confirm it
        assert {body for _, body in delivered} <= set(confirmed), "records no quorum held were delivered"

        replicas.kill(leader)
        for name in followers:
            replicas.start(name)
        time.sleep(6)  # what the two elect without it (or refuse to) is what the final log must survive
    finally:
        with contextlib.suppress(ZepsError):  # its close flushes: the tail is still unconfirmed
            producer.close()
    final = _final_log(replicas)
    bodies = set(final.values())
    assert [b for b in confirmed if b not in bodies] == [], "confirmed records were lost"
    taken_back = [(s, b) for s, b in delivered if final.get(s) != b]
    assert taken_back == [], "delivered records the final log does not hold"


def _new_in_line(replicas: Replicas, old: set[str]) -> set[str]:
    """The replicas with a place in line to lead that is not one of ``old`` (a new run's)."""
    return {election_replica(n) for n in replicas.zk.get_children(replicas.paths.election) if n not in old}


@pytest.mark.parametrize("order", ["together", "followers-first", "staggered"])
def test_every_replica_restarted_in_any_order_keeps_every_confirmed_record(replicas: Replicas, order: str) -> None:
    """A publisher keeps going through a kill -9 of all three replicas and their restart (all at once,
    the followers before the old leader, or one by one with pauses): everything confirmed before and
    after is in the final log, once, in order of confirmation."""
    leader = replicas.leader()
    until(lambda: len(replicas.state().isr) == 3, "all three replicas in sync", timeout=30)
    followers = [n for n in replicas.names if n != leader]
    confirmed: list[bytes] = []
    with replicas.client(producer_id=f"restart-{order}") as producer:
        for i in range(1, 41):
            producer.publish("k", b"%d" % i)
            if i % 10 == 0:
                producer.flush(timeout=30)
                confirmed += [b"%d" % n for n in range(i - 9, i + 1)]
        for name in replicas.names:
            replicas.kill(name)
        starts = {"together": [replicas.names], "followers-first": [followers, [leader]],
                  "staggered": [[followers[1]], [leader], [followers[0]]]}[order]  # fmt: skip
        for group in starts:
            left = set(replicas.zk.get_children(replicas.paths.election))  # the killed runs' places, until they expire
            for name in group:
                replicas.start(name)
            # each group in line to lead before the next starts (staggered: a real restart's spread)
            until(lambda g=group, old=left: _new_in_line(replicas, old) >= set(g), f"{', '.join(group)} back in line",
                  timeout=60)  # fmt: skip
        for i in range(41, 61):
            producer.publish("k", b"%d" % i)
        producer.flush(timeout=90)
        confirmed += [b"%d" % n for n in range(41, 61)]
    final = _final_log(replicas)
    bodies = [b for _, b in sorted(final.items()) if b != b"final"]
    assert bodies == confirmed, "a confirmed record lost or repeated, or out of order"


def test_an_unclean_election_brings_back_a_stream_whose_in_sync_replicas_are_gone_and_says_what_it_gives_up(
    replicas: Replicas, tmp_path: Path
) -> None:
    """r2 stops early; the other two confirm more; then both are lost for good. r2 alone may not lead
    (it is not in sync): the stream has no leader. ``zeps stream elect-unclean --replica r2`` says
    what it would give up (the records confirmed after r2 stopped, at least as the leader recorded
    its commit point), elects it with ``--yes``, and the stream serves again from r2's journal."""
    import json  # noqa: PLC0415
    import os  # noqa: PLC0415
    import shutil  # noqa: PLC0415
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415

    leader = replicas.leader()
    until(lambda: len(replicas.state().isr) == 3, "all three replicas in sync", timeout=30)
    lagging = next(n for n in replicas.names if n != leader)
    with replicas.client(producer_id="unclean") as producer:
        for i in range(1, 51):
            producer.publish("k", b"%d" % i)
        producer.flush(timeout=30)
        until(lambda: replicas.committed(lagging) >= 50, f"{lagging} holding the first 50", timeout=30)
        replicas.kill(lagging)
        until(lambda: lagging not in replicas.state().isr, f"{lagging} out of the in-sync set", timeout=30)
        for i in range(51, 131):
            producer.publish("k", b"%d" % i)
        producer.flush(timeout=30)  # 80 more, confirmed by the other two
    recorded = replicas.paths.replication_committed
    until(lambda: json.loads(replicas.zk.get(recorded)[0])["commit"] >= 130, "the leader recording its commit point",
          timeout=30)  # fmt: skip
    survivors = [n for n in replicas.names if n != lagging]
    for name in survivors:
        replicas.kill(name)
        shutil.rmtree(replicas.root / name)  # lost for good
    replicas.start(lagging)
    until(lambda: "first in line, but it is not in sync" in (replicas.root / f"{lagging}.log").read_text(),
          f"{lagging} looking at the line and stepping back", timeout=30)  # fmt: skip
    assert replicas.state().leader != lagging, "a replica out of sync led"

    env = {k: v for k, v in os.environ.items() if not k.startswith(("ZEPS_", "KUBE"))}
    env["KUBECONFIG"] = str(tmp_path / "no-cluster")  # settings come from the flags

    def cli(*args: str) -> dict[str, object]:
        argv = [sys.executable, "-m", "zeps.cli", "--json", "-n", "default", "--zookeeper",
                replicas.zookeeper.connect_string, "--chroot", replicas.zookeeper.root, "stream", "elect-unclean",
                "prices", "--replica", lagging, *args]  # fmt: skip
        done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120, check=True)
        return dict(json.loads(done.stdout.splitlines()[-1]))

    dry = cli()
    assert dry["elected"] is False and dry["givesUpAtLeast"] == 80 and dry["holds"] == 50, dry
    assert replicas.state().leader != lagging
    done = cli("--yes")
    assert done["elected"] is True and done["givesUpAtLeast"] == 80
    until(lambda: replicas.state().leader == lagging, f"{lagging} leading", timeout=30)
    for name in survivors:  # new, empty replicas take their places and copy r2's journal
        replicas.start(name)
    until(lambda: len(replicas.state().isr) == 3, "three in sync again", timeout=60)
    with replicas.client(producer_id="after") as producer:
        producer.publish("k", b"after")
        producer.flush(timeout=30)
    replicas.stop()
    log = [b for _, b in replicas.journal(lagging)]
    assert log == [b"%d" % i for i in range(1, 51)] + [b"after"]

"""Replicated streams with real processes: three ``zeps-broker`` replicas (``--min-insync 2``) on
127.0.0.1, a real ZooKeeper electing their leader, clients that follow the leader through
ZooKeeper. Kills are SIGKILL. A history checker holds every run to the promise: every confirmed
publish is present exactly once, in order, in every subscriber's output and in every in-sync
replica's journal, and no subscriber sees a gap or a duplicate.

Each test fails with replication switched off (one broker: its kill loses the stream, and with it
confirmed publishes; or ``--min-insync 1``: a leader kill loses what only it held)."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness import ReplicaSet as Replicas
from harness import ZooKeeperHarness, until
from zeps.errors import PublishRefusedError, SetupError

KILLS = int(os.environ.get("ZEPS_REPLICATION_KILLS", "4"))  # the count: ZEPS_REPLICATION_KILLS=50


@pytest.fixture
def replicas(zookeeper: ZooKeeperHarness, tmp_path: Path) -> Iterator[Replicas]:
    r = Replicas(zookeeper, tmp_path)
    for name in r.names:
        r.start(name)
    try:
        yield r
    finally:
        r.stop()


class Publisher(threading.Thread):
    """An idempotent producer publishing "1", "2", … one at a time, flushing every ``group``; it keeps
    the numbers confirmed (a flush returned) and goes on through refusals and failovers."""

    def __init__(self, replicas: Replicas, group: int = 20) -> None:
        super().__init__(daemon=True)
        self.client = replicas.client(producer_id="history")
        self.group = group
        self.confirmed = 0
        self.refusals = 0
        self.stop_at: int | None = None
        self.done = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with self.client:
                n = 0
                while self.stop_at is None or n < self.stop_at:
                    for _ in range(self.group):
                        n += 1
                        self.client.publish("k", b"%d" % n)
                    self._flush()
                    self.confirmed = n
                    time.sleep(0.005)
        except BaseException as exc:  # reported by the test
            self.error = exc
        finally:
            self.done.set()

    def progressed(self, beyond: int) -> bool:
        """Whether more than ``beyond`` are confirmed; the publisher's failure (a confirmed publish the
        stream lost makes its next ones out of sequence) ends the wait."""
        if self.error is not None:
            raise SetupError(f"the publisher failed: {self.error!r}")
        return self.confirmed > beyond

    def _flush(self) -> None:
        for _ in range(200):
            try:
                self.client.flush(timeout=60)
                return
            except PublishRefusedError:  # too few in sync for a moment: it attaches again and resends
                self.refusals += 1
                time.sleep(0.1)
        raise AssertionError("publishes refused 200 times in a row")


class Subscriber(threading.Thread):
    def __init__(self, replicas: Replicas) -> None:
        super().__init__(daemon=True)
        self.client = replicas.client()
        self.seen: list[tuple[int, bytes]] = []
        self.stopping = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with self.client:
                self.client.start("", since="earliest")
                while not self.stopping.is_set():
                    self.seen += [(m.sequence, m.body) for m in self.client.receive_many(0.2)]
        except BaseException as exc:
            self.error = exc


def _check_history(output: list[tuple[int, bytes]], confirmed: int, who: str) -> None:
    """Sequences 1, 2, … without a gap or a repeat; the bodies "1", "2", … each once, in order, and
    every confirmed one among them."""
    sequences = [s for s, _ in output]
    assert sequences == list(range(1, len(output) + 1)), f"{who}: a gap or a duplicate sequence"
    bodies = [int(b) for _, b in output]
    assert bodies == list(range(1, len(bodies) + 1)), f"{who}: a body missing, repeated or out of order"
    assert len(bodies) >= confirmed, f"{who}: confirmed publishes {len(bodies) + 1}..{confirmed} are missing"


def test_leader_kills_during_a_steady_publish_lose_nothing_confirmed(replicas: Replicas) -> None:
    first = replicas.leader()
    until(lambda: len(replicas.state().isr) == 3, "all three replicas in sync", timeout=30)
    subscribers = [Subscriber(replicas) for _ in range(3)]
    for s in subscribers:
        s.start()
    publisher = Publisher(replicas)
    publisher.start()
    until(lambda: publisher.confirmed >= 200, "publishes confirmed", timeout=30)
    leaders = [first]
    for kill in range(KILLS):
        leader = replicas.leader()
        epoch = replicas.state().epoch
        before = publisher.confirmed
        # the followers stall (a long GC, a slow disk) while the publisher goes on, and then the leader
        # dies: what the leader confirmed meanwhile would be lost if it had not waited for them
        followers = [n for n in replicas.names if n != leader]
        replicas.pause(followers)
        time.sleep(0.5)
        replicas.kill(leader)
        replicas.resume(followers)
        until(lambda e=epoch: replicas.state().epoch > e, f"kill {kill + 1}: a new leader elected", timeout=30)
        until(lambda b=before: publisher.progressed(b + 100), f"kill {kill + 1}: confirmed again", timeout=60)
        leaders.append(replicas.leader())
        if kill % 2:  # its last write was torn: half a record at the end of its active segment
            active = max((replicas.root / leader / "prices").glob("*.log"))
            with open(active, "ab") as f:
                f.write(b"\x00\x00\x01\x00torn")
        replicas.start(leader)  # it comes back as a follower, cuts what the new leader never had, catches up
        until(lambda: len(replicas.state().isr) == 3, f"kill {kill + 1}: {leader} back in sync", timeout=60)
        assert publisher.error is None, publisher.error
    publisher.stop_at = publisher.confirmed + publisher.group
    assert publisher.done.wait(60) and publisher.error is None, publisher.error
    total = publisher.confirmed
    until(lambda: all(len(s.seen) >= total for s in subscribers), "subscribers got everything", timeout=60)
    for s in subscribers:
        s.stopping.set()
        s.join(10)
        assert s.error is None, s.error
        _check_history(s.seen, total, "a subscriber")
    replicas.stop()
    for name in replicas.names:  # all three were in sync at the end: each journal holds the history
        _check_history(replicas.journal(name), total, f"replica {name}'s journal")
    assert len(set(leaders)) >= 2  # the lead really moved


def test_a_killed_follower_returns_and_catches_up(replicas: Replicas) -> None:
    leader = replicas.leader()
    until(lambda: len(replicas.state().isr) == 3, "all three replicas in sync", timeout=30)
    follower = next(n for n in replicas.names if n != leader)
    publisher = Publisher(replicas)
    publisher.start()
    until(lambda: publisher.confirmed >= 100, "publishes confirmed", timeout=30)
    replicas.kill(follower)
    until(lambda: follower not in replicas.state().isr, f"{follower} out of the in-sync set", timeout=30)
    before = publisher.confirmed
    until(lambda: publisher.confirmed > before + 200, "publishes confirmed by two replicas", timeout=30)
    replicas.start(follower)
    until(lambda: follower in replicas.state().isr, f"{follower} back in sync", timeout=60)
    # what Prometheus sees: the leader and its in-sync set, a follower that follows
    until(lambda: 'zeps_broker_replica_in_sync{stream="prices"} 3.0' in replicas.scrape(leader),
          "the in-sync gauge", timeout=10)  # fmt: skip
    assert 'zeps_broker_replica_leader{stream="prices"} 1.0' in replicas.scrape(leader)
    assert f'zeps_broker_replica_follower_lag{{follower="{follower}",stream="prices"}}' in replicas.scrape(leader)
    assert 'zeps_broker_replica_leader{stream="prices"} 0.0' in replicas.scrape(follower)
    publisher.stop_at = publisher.confirmed + publisher.group
    assert publisher.done.wait(60) and publisher.error is None, publisher.error
    time.sleep(1)  # the last commit reaches every follower at its next fetch
    replicas.stop()
    for name in replicas.names:
        _check_history(replicas.journal(name), publisher.confirmed, f"replica {name}'s journal")


def test_the_asyncio_client_follows_the_leader_too(replicas: Replicas) -> None:
    """An asyncio publisher (idempotent) and subscriber across two leader kills: the same history."""
    import asyncio  # noqa: PLC0415

    from zeps.client import AsyncStreamClient  # noqa: PLC0415

    replicas.leader()
    until(lambda: len(replicas.state().isr) == 3, "all three replicas in sync", timeout=30)

    async def run() -> tuple[int, list[tuple[int, bytes]]]:
        locator = replicas.locator()
        endpoint = await asyncio.to_thread(locator)
        pub = AsyncStreamClient(endpoint, "prices", producer_id="aio", locator=locator, timeout=60)
        sub = AsyncStreamClient(endpoint, "prices", locator=replicas.locator(), timeout=60)
        await pub.connect()
        await sub.connect()
        await sub.start("", since="earliest")
        seen: list[tuple[int, bytes]] = []
        n = 0
        for kill in range(2):
            for _ in range(20):
                for _ in range(10):
                    n += 1
                    await pub.publish("k", b"%d" % n)
                await pub.flush(timeout=60)
            leader = await asyncio.to_thread(replicas.leader)
            await asyncio.to_thread(replicas.kill, leader)
            for _ in range(10):  # these wait for the election, then go to the new leader
                n += 1
                await pub.publish("k", b"%d" % n)
            await pub.flush(timeout=60)
            replicas.start(leader)
            await asyncio.to_thread(until, lambda: len(replicas.state().isr) == 3, f"kill {kill + 1}: back in sync",
                                    60)  # fmt: skip
        deadline = time.monotonic() + 60
        while len(seen) < n and time.monotonic() < deadline:
            seen += [(m.sequence, m.body) for m in await sub.receive_many(0.5)]
        await pub.close()
        await sub.close()
        return n, seen

    total, seen = asyncio.run(run())
    _check_history(seen, total, "the asyncio subscriber")
    assert len(seen) == total


def test_a_replica_rebuilt_from_an_empty_volume_is_not_elected_before_it_caught_up(replicas: Replicas) -> None:
    """A follower's volume is replaced by an empty one while ZooKeeper still lists it in sync; the
    leader then stalls and dies before the follower copies anything, with the empty replica first in
    line. The other follower, which holds everything confirmed, must be elected — never the empty one."""
    import shutil  # noqa: PLC0415

    leader = replicas.leader()
    until(lambda: len(replicas.state().isr) == 3, "all three replicas in sync", timeout=30)
    publisher = Publisher(replicas)
    publisher.start()
    until(lambda: publisher.progressed(300), "publishes confirmed", timeout=30)
    empty, other = (n for n in replicas.names if n != leader)
    replicas.kill(empty)
    shutil.rmtree(replicas.root / empty)
    replicas.pause([leader])  # it copies nothing from a stalled leader
    replicas.start(empty)
    until(lambda: any(n.startswith(f"{empty}-") for n in replicas.zk.get_children(replicas.paths.election)),
          "the empty replica in line", timeout=30)  # fmt: skip
    replicas.kill(other)  # back at once: its place in line is now behind the empty replica's
    replicas.start(other)
    until(lambda: sum(n.startswith(f"{other}-") for n in replicas.zk.get_children(replicas.paths.election)) == 1,
          "the other replica's old place in line gone", timeout=30)  # fmt: skip
    replicas.kill(leader)
    until(lambda: replicas.state().leader != leader, "a new leader", timeout=30)
    assert replicas.state().leader == other, "the replica with an empty journal was elected"
    before = publisher.confirmed
    until(lambda: publisher.progressed(before + 100), "publishes confirmed by the new leader", timeout=60)
    replicas.start(leader)
    until(lambda: len(replicas.state().isr) == 3, "everyone back in sync", timeout=60)
    publisher.stop_at = publisher.confirmed + publisher.group
    assert publisher.done.wait(60) and publisher.error is None, publisher.error
    time.sleep(1)
    replicas.stop()
    for name in replicas.names:
        _check_history(replicas.journal(name), publisher.confirmed, f"replica {name}'s journal")

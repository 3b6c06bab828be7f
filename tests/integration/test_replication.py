"""Replicated streams with real processes: three ``zeps-broker`` replicas (``--min-insync 2``) on
127.0.0.1, a real ZooKeeper electing their leader, clients that follow the leader through
ZooKeeper. Kills are SIGKILL. A history checker holds every run to the promise: every confirmed
publish is present exactly once, in order, in every subscriber's output and in every in-sync
replica's journal, and no subscriber sees a gap or a duplicate.

Each test fails with replication switched off (one broker: its kill loses the stream, and with it
confirmed publishes; or ``--min-insync 1``: a leader kill loses what only it held)."""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from harness import ReplicaSet as Replicas
from harness import ZooKeeperHarness, until
from workers.workload import Pace
from zeps.client import StreamClient
from zeps.errors import PublishRefusedError, SetupError
from zeps.replication.election import election_replica

KILLS = int(os.environ.get("ZEPS_REPLICATION_KILLS", "4"))  # the count: ZEPS_REPLICATION_KILLS=50


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
                n, pace = 0, Pace(200)  # flushes a second
                while self.stop_at is None or n < self.stop_at:
                    for _ in range(self.group):
                        n += 1
                        self.client.publish("k", b"%d" % n)
                    self._flush()
                    self.confirmed = n
                    pace.step()  # steady, not flat out
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
        tries = Pace(10)  # an election takes a moment: ten tries a second
        for _ in range(200):
            tries.step()
            try:
                self.client.flush(timeout=60)
                return
            except PublishRefusedError:  # too few in sync for a moment: it attaches again and resends
                self.refusals += 1
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
        time.sleep(0.5)  # the fault: the publisher goes on against stalled followers this long
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
    until(lambda: replicas.all_hold(publisher.confirmed), "the last commit at every replica", timeout=30)
    replicas.stop()
    for name in replicas.names:
        _check_history(replicas.journal(name), publisher.confirmed, f"replica {name}'s journal")


def test_a_subscriber_forgotten_while_too_few_replicas_are_in_sync_reads_on_once_they_are_back(
    replicas: Replicas,
) -> None:
    """Both followers killed: commits stop, the subscriber, hearing nothing, PINGs, and the leader holds
    its PING-OK; once the leader is alone in sync (minInSync 2) it refuses everything it holds,
    forgetting those peerings (NOT_ENOUGH_REPLICAS). The subscriber, with nothing unconfirmed,
    attaches again at once and, the followers back, reads every confirmed publish once, in order.
    Before, it waited for a check_publishes it never calls while the broker's "not attached" answers
    to its PINGs kept it from timing out: it stalled for good (found on kind)."""
    leader = replicas.leader()
    until(lambda: len(replicas.state().isr) == 3, "all three replicas in sync", timeout=30)
    subscriber, publisher = Subscriber(replicas), Publisher(replicas)
    subscriber.start()
    publisher.start()
    until(lambda: publisher.progressed(100) and len(subscriber.seen) > 100, "publishes read", timeout=30)
    followers = [name for name in replicas.names if name != leader]
    for name in followers:
        replicas.kill(name)
    until(lambda: set(replicas.state().isr) == {leader}, "the leader alone in sync", timeout=30)
    until(lambda: subscriber.client.reconnects > 0, "the forgotten subscriber attaching again", timeout=15)
    for name in followers:
        replicas.start(name)
    until(lambda: len(replicas.state().isr) == 3, "the followers back in sync", timeout=60)
    before = publisher.confirmed
    until(lambda: publisher.progressed(before + 100), "publishes confirmed again", timeout=60)
    publisher.stop_at = publisher.confirmed + publisher.group
    assert publisher.done.wait(60) and publisher.error is None, publisher.error
    until(lambda: len(subscriber.seen) >= publisher.confirmed, "the subscriber read every confirmed publish",
          timeout=30)  # fmt: skip
    subscriber.stopping.set()
    subscriber.join(30)
    assert subscriber.error is None, subscriber.error
    _check_history(subscriber.seen, publisher.confirmed, "the subscriber")


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
    in_line = lambda name: [n for n in replicas.zk.get_children(replicas.paths.election)  # noqa: E731
                            if election_replica(n) == name]  # fmt: skip
    until(lambda: in_line(empty), "the empty replica in line", timeout=30)
    replicas.kill(other)  # back at once: its place in line is now behind the empty replica's
    replicas.start(other)
    until(lambda: len(in_line(other)) == 1, "the other replica's old place in line gone", timeout=30)
    replicas.kill(leader)
    until(lambda: replicas.state().leader != leader, "a new leader", timeout=30)
    assert replicas.state().leader == other, "the replica with an empty journal was elected"
    before = publisher.confirmed
    until(lambda: publisher.progressed(before + 100), "publishes confirmed by the new leader", timeout=60)
    replicas.start(leader)
    until(lambda: len(replicas.state().isr) == 3, "everyone back in sync", timeout=60)
    publisher.stop_at = publisher.confirmed + publisher.group
    assert publisher.done.wait(60) and publisher.error is None, publisher.error
    until(lambda: replicas.all_hold(publisher.confirmed), "the last commit at every replica", timeout=30)
    replicas.stop()
    for name in replicas.names:
        _check_history(replicas.journal(name), publisher.confirmed, f"replica {name}'s journal")


def test_a_reader_of_followers_reads_from_one_and_moves_to_another_when_it_dies(replicas: Replicas) -> None:
    """``follower_reads=True``: the client reads from an in-sync follower (the leader serves only
    the publisher), everything committed, live too; its follower killed, it resumes on another
    replica after its last sequence. It may not publish (ConfigError naming the option)."""
    from zeps.errors import ConfigError  # noqa: PLC0415

    leader = replicas.leader()
    until(lambda: len(replicas.state().isr) == 3, "all three replicas in sync", timeout=30)
    publisher = Publisher(replicas)
    publisher.start()
    until(lambda: publisher.confirmed >= 200, "publishes confirmed", timeout=30)
    locator = replicas.locator()
    locator.followers = True
    reader = StreamClient(locator(), "prices", locator=locator, timeout=60, follower_reads=True)
    with reader:
        serving = next(n for n, port in replicas.ports.items() if reader.endpoint.endswith(f":{port}"))
        assert serving != leader, "a reader of followers went to the leader while two followers were in sync"
        with pytest.raises(ConfigError, match="follower_reads"):
            reader.publish("k", b"never")
        reader.start("", since="earliest")
        seen: list[tuple[int, bytes]] = []

        def read_to(count: int) -> bool:
            seen.extend((m.sequence, m.body) for m in reader.receive_many(0.2))
            return len(seen) >= count

        until(lambda: read_to(300), "the follower's reader to get 300", timeout=30)
        replicas.kill(serving)
        before = publisher.confirmed
        until(lambda: publisher.confirmed > before + 200, "publishes confirmed after the follower's loss", timeout=60)
        publisher.stop_at = publisher.confirmed + publisher.group
        assert publisher.done.wait(60) and publisher.error is None, publisher.error
        until(lambda: read_to(publisher.confirmed), "the reader to get everything confirmed", timeout=60)
        assert reader.reconnects >= 1 and not reader.endpoint.endswith(f":{replicas.ports[serving]}")
    _check_history(seen, publisher.confirmed, "the reader of followers")


def test_the_cli_replays_from_a_follower_with_follower_reads(replicas: Replicas, tmp_path: Path) -> None:
    """``zeps stream replay --follower-reads`` pointed at a follower is served by followers (their
    delivery counters say so, the leader's stays 0); without the flag the follower sends it on to the
    leader."""
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415

    leader = replicas.leader()
    until(lambda: len(replicas.state().isr) == 3, "all three replicas in sync", timeout=30)
    with replicas.client(producer_id="cli") as publisher:
        for n in range(1, 51):
            publisher.publish("k", b"%d" % n)
        publisher.flush(timeout=30)
    follower = next(n for n in replicas.names if n != leader)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ZEPS_", "KUBE"))}
    env["KUBECONFIG"] = str(tmp_path / "no-cluster")  # settings come from the flags

    def replay(*flags: str) -> list[str]:
        argv = [sys.executable, "-m", "zeps.cli", "--json", "-n", "default", "--zookeeper",
                replicas.zookeeper.connect_string, "--chroot", replicas.zookeeper.root, "--endpoint",
                f"tcp://127.0.0.1:{replicas.ports[follower]}", "stream", "replay", "prices", "--since", "0",
                "--count", "50", "--timeout", "15", *flags]  # fmt: skip
        done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120, check=True)
        return [json.loads(line)["body"] for line in done.stdout.splitlines()]

    def delivered(name: str) -> float:  # its exporter copies the count about once a second
        lines = replicas.scrape(name).splitlines()
        return sum(float(x.split()[-1]) for x in lines if x.startswith("zeps_broker_messages_out_total"))

    followers = [n for n in replicas.names if n != leader]
    assert replay("--follower-reads") == [str(n) for n in range(1, 51)]
    until(lambda: sum(map(delivered, followers)) == 50, "the followers to count 50 delivered", timeout=10)
    assert delivered(leader) == 0
    assert replay() == [str(n) for n in range(1, 51)]  # sent on to the leader
    until(lambda: delivered(leader) == 50, "the leader to count 50 delivered", timeout=10)
    assert sum(map(delivered, followers)) == 50


@pytest.mark.parametrize("emptied", [False, True], ids=["holding-its-journal", "journal-emptied-while-in-sync"])
def test_a_replica_whose_journal_is_empty_is_not_elected_even_while_listed_in_sync(
    zookeeper: ZooKeeperHarness, emptied: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """The election's own rule, apart from the replica leaving the in-sync set at start: a replica
    listed in sync whose journal became empty afterwards (a copy begun afresh at the leader's oldest
    record) comes first in line when the leader goes, and must not lead. The same replica holding its
    journal leads at once (epoch 2): the scene does reach the election."""
    from zeps.coordination.replication import ReplicaElection, ReplicationState  # noqa: PLC0415
    from zeps.paths import StreamPaths  # noqa: PLC0415

    caplog.set_level(logging.INFO, logger="zeps.replication.election")
    zk = zookeeper.client()
    paths = StreamPaths.of("default", "prices", chroot=zookeeper.root)
    zk.create(paths.replication_state, ReplicationState(1, "x", frozenset({"x", "e"})).encode(), makepath=True)
    zk.ensure_path(paths.election)
    leader_place = zk.create(f"{paths.election}/x-", b"", ephemeral=True, sequence=True)
    empty = threading.Event()
    events: list[Any] = []
    election = ReplicaElection(zookeeper.client(), paths, "e", events.append, empty=empty.is_set).start()
    try:
        until(lambda: len(zk.get_children(paths.election)) == 2, "e in line behind x", timeout=10)
        if emptied:
            empty.set()
        zk.delete(leader_place)  # the leader is gone: e is first in line
        if emptied:  # its machine looked at the line and said why it does not lead
            until(lambda: "first in line, but its journal is empty" in caplog.text, "e stepping back", timeout=10)
            state = ReplicationState.decode(zk.get(paths.replication_state)[0])
            assert state is not None and (state.epoch, state.leader) == (1, "x"), "an empty replica took the lead"
            assert not [e for e in events if e.kind == "lead"]
        else:
            until(lambda: any(e.kind == "lead" and e.epoch == 2 for e in events), "e to lead epoch 2", timeout=10)
    finally:
        election.stop()


def test_the_asyncio_client_reads_from_a_follower_too(replicas: Replicas) -> None:
    """``AsyncStreamClient(follower_reads=True)`` given the leader's endpoint goes to a follower from
    its first connection and reads everything committed there."""
    import asyncio  # noqa: PLC0415

    from zeps.client import AsyncStreamClient  # noqa: PLC0415

    leader = replicas.leader()
    until(lambda: len(replicas.state().isr) == 3, "all three replicas in sync", timeout=30)
    with replicas.client(producer_id="aio-reads") as publisher:
        publisher.publish_many([("k", b"%d" % n) for n in range(1, 101)])
        publisher.flush(timeout=30)

    async def run() -> tuple[str, list[tuple[int, bytes]]]:
        locator = replicas.locator()
        locator.followers = True
        given = f"tcp://127.0.0.1:{replicas.ports[leader]}"
        reader = AsyncStreamClient(given, "prices", locator=locator, timeout=30, follower_reads=True)
        await reader.connect()
        await reader.start("", since="earliest")
        seen: list[tuple[int, bytes]] = []
        deadline = time.monotonic() + 30
        while len(seen) < 100 and time.monotonic() < deadline:
            seen += [(m.sequence, m.body) for m in await reader.receive_many(0.5)]
        endpoint = reader.endpoint
        await reader.close()
        return endpoint, seen

    endpoint, seen = asyncio.run(run())
    assert endpoint != f"tcp://127.0.0.1:{replicas.ports[leader]}", "the reader of followers stayed with the leader"
    _check_history(seen, 100, "the asyncio reader of followers")


def test_a_peer_that_is_none_of_the_replicas_cannot_fetch_nor_acknowledge(
    zookeeper: ZooKeeperHarness, tmp_path: Path
) -> None:
    """Anyone who reaches a leader's port may attach with version 8. A peer fetching as a replica the
    stream's manifest does not name is refused (UNAUTHORIZED), and never enters the in-sync set:
    before, it was sent the journal, and once in the set its acknowledgements (of records it never
    wrote) counted for minInSync. A peering also fetches as one replica only."""
    import zmq  # noqa: PLC0415

    from zeps.coordination import Group  # noqa: PLC0415
    from zeps.protocol import Attach, AttachOk, InvalidCode, Refusal, ReplicaData, ReplicaFetch, decode, encode  # noqa: PLC0415

    replicas = Replicas(zookeeper, tmp_path)
    Group(replicas.zk, replicas.paths.brokers).set_manifest(replicas.names)
    for name in replicas.names:
        replicas.start(name)
    ctx: zmq.Context[Any] = zmq.Context()
    try:
        leader = replicas.leader()
        until(lambda: len(replicas.state().isr) == 3, "all three replicas in sync", timeout=30)
        epoch = replicas.state().epoch

        def fetch_as(*names: str) -> list[Any]:
            sock = ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(f"tcp://127.0.0.1:{replicas.ports[leader]}")
            sock.send(encode(Attach(stream="prices", version=8)))
            answers = [decode(sock.recv()) if sock.poll(5000) else None]
            for name in names:
                sock.send(encode(ReplicaFetch(epoch=epoch, replica=name, base=1, offset=0, last=0, durable=10**9)))
                answers.append(decode(sock.recv()) if sock.poll(5000) else None)
            sock.close()
            return answers

        attached, refused = fetch_as("evil")
        assert attached == AttachOk()
        assert isinstance(refused, InvalidCode) and refused.code == Refusal.UNAUTHORIZED, refused
        follower, third = (n for n in replicas.names if n != leader)
        answers = fetch_as(follower, third)  # both in the manifest: the second is one peering speaking for two
        assert isinstance(answers[1], ReplicaData)  # a member's name: served (CURVE binds it to a key)
        assert isinstance(answers[2], InvalidCode) and answers[2].code == Refusal.UNAUTHORIZED
        time.sleep(1.5)  # a negative check: the in-sync set it would have been admitted to by now
        assert "evil" not in replicas.state().isr
    finally:
        ctx.term()
        replicas.stop()


def test_a_curve_replica_set_peers_encrypted_and_takes_a_replicas_fetches_from_its_key_only(
    zookeeper: ZooKeeperHarness, tmp_path: Path
) -> None:
    """CURVE with replicas: the three share the stream's server certificate, each peers with a
    certificate of its own (replica.<member>.key_secret beside --curve-replicas), and a leader takes
    a replica's fetches from that replica's key only. A client admitted by its key publishes and
    reads through a failover; the same client fetching as a replica is refused (UNAUTHORIZED)."""
    import json as jsonlib  # noqa: PLC0415

    import zmq  # noqa: PLC0415
    import zmq.auth  # noqa: PLC0415

    from zeps.protocol import Attach, AttachOk, InvalidCode, Refusal, ReplicaFetch, decode, encode  # noqa: PLC0415

    keys = tmp_path / "curve"
    keys.mkdir()
    server_public, server_secret = zmq.auth.create_certificates(str(keys), "broker")
    _client_public_file, client_secret_file = zmq.auth.create_certificates(str(keys), "client")
    replicas = Replicas(zookeeper, tmp_path / "brokers")
    listed = {}
    for name in replicas.names:
        public_file, _secret_file = zmq.auth.create_certificates(str(keys), f"replica.{name}")
        listed[name] = zmq.auth.load_certificate(public_file)[0].decode()
    client_public, client_secret = (k.decode() for k in zmq.auth.load_certificate(client_secret_file))  # type: ignore[union-attr]
    (keys / "clients.json").write_text(jsonlib.dumps({"app": client_public}))
    (keys / "replicas.json").write_text(jsonlib.dumps(listed))
    replicas.extra = ["--curve-secret-key", server_secret, "--curve-clients", str(keys / "clients.json"),
                      "--curve-replicas", str(keys / "replicas.json")]  # fmt: skip
    for name in replicas.names:
        replicas.start(name)
    server_key = zmq.auth.load_certificate(server_public)[0].decode()
    ctx: zmq.Context[Any] = zmq.Context()
    try:
        leader = replicas.leader()
        until(lambda: len(replicas.state().isr) == 3, "all three replicas in sync over CURVE", timeout=60)
        with replicas.client(producer_id="curve", server_public_key=server_key,
                             client_keys=(client_public, client_secret)) as client:  # fmt: skip
            for i in range(1, 51):
                client.publish("k", b"%d" % i)
            client.flush(timeout=30)
            replicas.kill(leader)
            for i in range(51, 101):
                client.publish("k", b"%d" % i)
            client.flush(timeout=60)  # confirmed by a new leader: the other two still peer over CURVE
        leader = replicas.leader()
        sock = ctx.socket(zmq.DEALER)  # the admitted client, fetching as a replica
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.CURVE_SERVERKEY, server_key.encode())
        sock.setsockopt(zmq.CURVE_PUBLICKEY, client_public.encode())
        sock.setsockopt(zmq.CURVE_SECRETKEY, client_secret.encode())
        sock.connect(f"tcp://127.0.0.1:{replicas.ports[leader]}")
        sock.send(encode(Attach(stream="prices", version=8)))
        assert sock.poll(10_000) and decode(sock.recv()) == AttachOk()
        member = next(n for n in replicas.names if n != leader)
        sock.send(encode(ReplicaFetch(epoch=replicas.state().epoch, replica=member, base=1, offset=0, last=0,
                                      durable=10**9)))  # fmt: skip
        assert sock.poll(10_000)
        refused = decode(sock.recv())
        assert isinstance(refused, InvalidCode) and refused.code == Refusal.UNAUTHORIZED, refused
        sock.close()
    finally:
        ctx.term()
        replicas.stop()
    held = [b for _, b in replicas.journal(leader)]
    assert held == [b"%d" % i for i in range(1, 101)]

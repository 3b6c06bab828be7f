"""Replication in the broker's socket-free core: a leader core and follower cores (each a real
journal in a temporary directory) exchange their frames in-process, as the adapter would over
ZeroMQ. Elections are not here (ZooKeeper decides them: tests/integration/test_replication.py); the
cores are told who leads, in which epoch, as the adapter tells them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from zeps.broker.core import BrokerConfig, BrokerCore
from zeps.journal import JournalConfig
from zeps.protocol import (
    Attach,
    AttachOk,
    Credit,
    DeliverRun,
    InvalidCode,
    Ping,
    PingOk,
    Publish,
    Refusal,
    ReplicaFetch,
    Subscribe,
    decode,
    encode,
)
from zeps.replication.follower import FollowerCopy

ISR = frozenset({"a", "b", "c"})


def _core(path: Path, **config: Any) -> BrokerCore:
    journal = JournalConfig(fsync="always", segment_bytes=4096)
    return BrokerCore(BrokerConfig(path, ("prices",), journal=journal, **config)).open()


class Cluster:
    """Three cores: ``a`` leads epoch 1, ``b`` and ``c`` follow; frames travel when :meth:`turn` runs."""

    def __init__(self, root: Path, **config: Any) -> None:
        self.cores = {name: _core(root / name, **config) for name in "abc"}
        self.leader = "a"
        self.epoch = 1
        self.cores["a"].lead("prices", me="a", epoch=1, isr=ISR, min_insync=2, now=0.0)
        self.copies: dict[str, FollowerCopy] = {}
        self.to_client: dict[bytes, list[Any]] = {}
        self.in_flight: dict[str, list[bytes]] = {}  # frames for a follower, not delivered yet
        for name in "bc":
            self._follow(name)

    def _follow(self, name: str) -> None:
        self.cores[name].follow("prices")
        copy = FollowerCopy(self.cores[name].streams["prices"].journal, "prices", name, self.epoch)
        self.copies[name] = copy
        self.in_flight[name] = []
        for frame in copy.start():
            self.cores[self.leader].receive(name.encode(), frame, now=0.0)

    def send(self, peer: bytes, *commands: Any) -> None:
        for command in commands:
            self.cores[self.leader].receive(peer, encode(command), now=0.0)

    def turn(self, *, followers: str = "bc", rounds: int = 3) -> None:
        """Loops of every core: the leader flushes and answers; the followers named copy and fetch
        again (frames to the others wait, as on a slow network)."""
        leader = self.cores[self.leader]
        for _ in range(rounds):
            leader.flush_appends()
            for out in leader.pump(now=0.0):
                name = out.peer.decode()
                if name in self.copies:
                    self.in_flight.setdefault(name, []).append(out.frame)
                else:
                    self.to_client.setdefault(out.peer, []).append(decode(out.frame))
            for name in followers:
                frames, self.in_flight[name] = self.in_flight.get(name, []), []
                for frame in frames:
                    leader.released(leader.sessions[name.encode()], len(frame))  # it left: the follower read it
                    for answer in self.copies[name].receive(frame):
                        leader.receive(name.encode(), answer, now=0.0)
                    self.cores[name].copied("prices", self.copies[name].commit)  # as the adapter does

    def received(self, peer: bytes) -> list[Any]:
        return self.to_client.pop(peer, [])

    def close(self) -> None:
        for core in self.cores.values():
            core.close()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path)
    yield c
    c.close()


def _keys(answers: list[Any]) -> list[str]:
    return [row[1] for a in answers if isinstance(a, DeliverRun) for row in a.items]


def test_a_publish_is_confirmed_and_delivered_once_a_follower_has_it(cluster: Cluster) -> None:
    cluster.send(b"sub", Attach(stream="prices", version=7), Credit(credit=1 << 20), Subscribe(pattern=""))
    cluster.send(b"pub", Attach(stream="prices", version=7))
    cluster.turn(followers="")
    cluster.received(b"sub"), cluster.received(b"pub")
    cluster.send(b"pub", Publish(key="k", body=b"1"), Ping())
    cluster.turn(followers="")  # no follower answers: nothing is confirmed, nothing delivered
    assert cluster.received(b"pub") == [] and cluster.received(b"sub") == []
    assert cluster.cores["a"].streams["prices"].journal.written == 1
    cluster.turn(followers="b")  # one follower of two has it durably: 2 of 3 = minInSync
    assert cluster.received(b"pub") == []  # c is still in the in-sync set: everyone in it must hold it
    cluster.turn(followers="bc")
    assert cluster.received(b"pub") == [PingOk()]
    assert _keys(cluster.received(b"sub")) == ["k"]
    for name in "bc":
        assert cluster.cores[name].streams["prices"].journal.read(1)[0].body == b"1"


def test_the_copies_are_the_leaders_files_byte_for_byte(cluster: Cluster, tmp_path: Path) -> None:
    cluster.send(b"pub", Attach(stream="prices", version=7))
    for i in range(200):
        cluster.send(b"pub", Publish(key=f"k.{i % 5}", body=b"x" * (i % 50)))
        if i % 20 == 0:
            cluster.turn()
    cluster.turn(rounds=6)
    leader = {p.name: p.read_bytes() for p in (tmp_path / "a" / "prices").glob("*.log")}
    assert len(leader) >= 3  # segments rolled while they copied
    for name in "bc":
        assert {p.name: p.read_bytes() for p in (tmp_path / name / "prices").glob("*.log")} == leader
        assert cluster.cores[name].streams["prices"].journal.epochs.entries == [(1, 1)]


def test_a_follower_out_of_sync_leaves_the_set_and_too_few_refuse_publishes(cluster: Cluster) -> None:
    a = cluster.cores["a"]
    cluster.send(b"pub", Attach(stream="prices", version=7))
    cluster.turn()
    assert cluster.received(b"pub") == [AttachOk()]
    leader = a.streams["prices"].leader
    assert leader is not None
    (request,) = a.isr_requests(now=leader.lag_s + 1)  # b and c fetched at 0: past lag_s, both out
    assert request == ("prices", 1, frozenset({"a"}))
    a.isr_written("prices", 1, frozenset({"a"}))
    cluster.send(b"pub", Publish(key="k", body=b"lost?"), Ping())
    cluster.turn(followers="")
    (refusal,) = cluster.received(b"pub")
    assert isinstance(refusal, InvalidCode) and refusal.code == Refusal.NOT_ENOUGH_REPLICAS
    assert a.streams["prices"].journal.written == 0  # refused, never journaled
    assert a.streams["prices"].refused_under_replicated == 1


def test_under_replicated_wait_holds_confirmations_until_a_follower_returns(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, under_replicated="wait")
    try:
        a = cluster.cores["a"]
        cluster.send(b"pub", Attach(stream="prices", version=7))
        cluster.turn()
        a.isr_written("prices", 1, frozenset({"a"}))
        cluster.send(b"pub", Publish(key="k", body=b"waits"), Ping())
        cluster.turn(followers="")
        assert cluster.received(b"pub") == [AttachOk()]
        a.isr_written("prices", 1, ISR)
        cluster.turn()
        assert cluster.received(b"pub") == [PingOk()]
    finally:
        cluster.close()


def test_a_broker_that_follows_sends_clients_to_the_leader(cluster: Cluster) -> None:
    b = cluster.cores["b"]
    b.receive(b"client", encode(Attach(stream="prices", version=7)), now=0.0)
    (refusal,) = [decode(o.frame) for o in b.pump(now=0.0)]
    assert isinstance(refusal, InvalidCode) and refusal.code == Refusal.NOT_LEADER
    cluster.send(b"pub", Attach(stream="prices", version=7))
    cluster.turn()
    cluster.received(b"pub")
    cluster.cores["a"].follow("prices")  # a steps down (a newer epoch was elected)
    assert [c.code for c in cluster.received(b"pub") if isinstance(c, InvalidCode)] == []
    cluster.cores["a"].flush_appends()
    out = [decode(o.frame) for o in cluster.cores["a"].pump(now=0.0) if o.peer == b"pub"]
    assert [c.code for c in out if isinstance(c, InvalidCode)] == [Refusal.NOT_LEADER]


def test_fetches_of_another_epoch_are_refused(cluster: Cluster) -> None:
    a = cluster.cores["a"]
    a.receive(b"stale", encode(Attach(stream="prices", version=8)), now=0.0)
    a.receive(b"stale", encode(ReplicaFetch(epoch=0, replica="z", base=1, offset=0, last=0, durable=0)), now=0.0)
    out = [decode(o.frame) for o in a.pump(now=0.0) if o.peer == b"stale"]
    assert isinstance(out[-1], InvalidCode) and out[-1].code == Refusal.NOT_LEADER


def test_a_new_leader_keeps_the_producer_table_and_the_old_leaders_tail_is_cut(cluster: Cluster) -> None:
    """b is elected in epoch 2 with what it copied; a wrote more in epoch 1 that nobody copied. a
    follows b: it cuts those records (they were never confirmed) and copies b's."""
    from zeps.protocol import Produce, PublishSeq  # noqa: PLC0415

    cluster.send(b"pub", Attach(stream="prices", version=7), Produce(producer="p", epoch=0))
    for i in range(1, 6):
        cluster.send(b"pub", PublishSeq(sequence=i, key="k", body=b"%d" % i))
    cluster.turn()
    cluster.send(b"pub", PublishSeq(sequence=6, key="k", body=b"never copied"))
    cluster.turn(followers="")
    a, b = cluster.cores["a"], cluster.cores["b"]
    assert a.streams["prices"].journal.written == 6 and b.streams["prices"].journal.written == 5
    b.lead("prices", me="b", epoch=2, isr=frozenset({"b", "c"}), min_insync=2, now=0.0)
    assert b.streams["prices"].journal.producers.producers["p"].sequence == 5  # the table came with the marks
    cluster.leader, cluster.epoch = "b", 2
    cluster.copies.clear()
    cluster._follow("a")
    cluster._follow("c")
    cluster.send(b"pub2", Attach(stream="prices", version=7))
    cluster.send(b"pub2", Publish(key="k", body=b"epoch 2"))
    cluster.turn(followers="ac", rounds=5)
    rows = [r.body for r in a.streams["prices"].journal.read(1)]
    assert rows == [b"1", b"2", b"3", b"4", b"5", b"epoch 2"]
    assert a.streams["prices"].journal.epochs.entries == [(1, 1), (2, 6)]


def test_a_follower_whose_copy_went_backwards_leaves_the_in_sync_set_until_it_holds_the_commit() -> None:
    """A follower rebuilt from an empty volume while listed in sync must not stay listed: an election
    could choose it, and it lacks what was confirmed."""
    from zeps.replication.isr import Leadership  # noqa: PLC0415

    leader = Leadership.begin("a", 1, ISR, min_insync=2, commit=0, log_end=0, now=0.0)
    leader.fetched("b", 100, 100, now=1.0)
    leader.fetched("c", 100, 100, now=1.0)
    assert leader.advance(100) == 100
    leader.fetched("b", 0, 100, now=2.0)  # b came back empty
    assert leader.wanted(100, now=2.0) == frozenset({"a", "c"})
    leader.isr_written(frozenset({"a", "c"}))
    leader.fetched("b", 60, 120, now=3.0)
    assert leader.wanted(120, now=3.0) is None  # behind the commit: not yet
    leader.fetched("b", 100, 120, now=4.0)
    assert leader.wanted(120, now=4.0) is None  # it holds the commit, but not what the leader held: not caught up
    leader.fetched("b", 120, 120, now=5.0)
    assert leader.wanted(120, now=5.0) == ISR


def test_a_replica_catching_up_is_sent_at_most_the_catch_up_rate(tmp_path: Path) -> None:
    """With replica_catchup_bytes_per_s, a follower outside the in-sync set gets at most that many
    bytes a second; one in the set is never held back."""
    cluster = Cluster(tmp_path, replica_catchup_bytes_per_s=3000)
    try:
        a = cluster.cores["a"]
        cluster.send(b"pub", Attach(stream="prices", version=7))
        cluster.send(b"pub", *(Publish(key="k", body=b"x" * 90) for _ in range(100)))  # about 12 kB of records
        a.flush_appends()
        cluster.cores["a"].isr_written("prices", 1, frozenset({"a", "b"}))  # c is out: catching up
        cluster.turn(rounds=20)  # within one second of the monotonic clock
        copied = {n: cluster.cores[n].streams["prices"].journal.written for n in "bc"}
        assert copied["b"] == 100
        assert 0 < copied["c"] < 100  # about 3000 bytes' worth (whole records; a group may overshoot)
        journal = cluster.cores["c"].streams["prices"].journal
        assert journal.replica_position()[1] <= 3000 + 200
    finally:
        cluster.close()


def test_a_follower_that_reads_nothing_is_answered_at_most_its_bytes_in_flight(tmp_path: Path) -> None:
    """A peer fetching as a follower again and again, reading none of the answers, is answered as
    long as its bytes in flight allow (the answer after waits for earlier ones to leave): 64 KiB and
    an answer here, not 16 KiB per fetch. The follower that reads is served all along."""
    cluster = Cluster(tmp_path, max_session_bytes_in_flight=64 * 1024, replica_fetch_bytes=16 * 1024)
    try:
        a = cluster.cores["a"]
        cluster.turn()  # both attached and fetching
        cluster.send(b"pub", Attach(stream="prices", version=7))
        cluster.send(b"pub", *(Publish(key="k", body=b"x" * 1000) for _ in range(300)))  # about 300 KB
        for _ in range(40):
            a.receive(b"c", cluster.copies["c"].fetch(), now=0.0)  # the same fetch: its copy never moves
            cluster.turn(followers="b", rounds=1)  # b reads its answers; c's pile up unread
        queued = sum(len(frame) for frame in cluster.in_flight["c"])
        assert 16 * 1024 < queued <= 64 * 1024 + 17 * 1024, queued
        assert a.sessions[b"c"].in_flight == queued
        cluster.turn(followers="b", rounds=200)  # (a fetch reads one of the 4 KiB segments)
        assert cluster.cores["b"].streams["prices"].journal.written == 300
    finally:
        cluster.close()


def test_followers_are_still_answered_when_subscribers_reading_nothing_hold_the_shared_budget(
    tmp_path: Path,
) -> None:
    """A subscriber that reads nothing holds the leader's whole bytes-in-flight budget (256 KiB
    here): the followers' answers are cut to what a session with nothing in flight may still take,
    and replication goes on (publishes are confirmed) instead of waiting for room that never comes."""
    cluster = Cluster(tmp_path, max_bytes_in_flight=256 * 1024, max_session_bytes_in_flight=256 * 1024)
    try:
        a = cluster.cores["a"]
        cluster.turn()
        cluster.send(b"sub", Attach(stream="prices", version=7), Credit(credit=64 << 20), Subscribe(pattern=""))
        cluster.send(b"pub", Attach(stream="prices", version=7))
        cluster.send(b"pub", *(Publish(key="k", body=b"x" * 1000) for _ in range(300)))
        cluster.turn(rounds=400)  # the subscriber's deliveries are never read (never released)
        assert a.sessions[b"sub"].in_flight > 200 * 1024, "the subscriber holds the budget"
        assert all(cluster.cores[n].streams["prices"].journal.written == 300 for n in "bc")
    finally:
        cluster.close()


def _from(core: BrokerCore, peer: bytes) -> list[Any]:
    """What ``core`` (a follower, which the cluster's turns do not pump) sends ``peer`` now."""
    core.flush_appends()
    return [decode(o.frame) for o in core.pump(now=0.0) if o.peer == peer]


def test_a_follower_serves_a_version_8_reader_only_what_is_committed(cluster: Cluster) -> None:
    """Reads from a follower (replay load off the leader): a version 8 peer may subscribe and fetch
    there, and gets records only once the leader's commit point (as the follower heard it) covers
    them; a version 7 client is sent to the leader; a reader's publish is refused, never journaled."""
    b = cluster.cores["b"]
    for command in (Attach(stream="prices", version=8), Credit(credit=1 << 20), Subscribe(pattern="")):
        b.receive(b"reader", encode(command), now=0.0)
    assert _from(b, b"reader")[0] == AttachOk()
    cluster.send(b"pub", Attach(stream="prices", version=7), Publish(key="k.1", body=b"1"), Ping())
    cluster.turn(followers="b")  # b holds it, c does not: not committed, so b's reader gets nothing
    assert b.streams["prices"].journal.written == 1 and _keys(_from(b, b"reader")) == []
    cluster.turn(followers="bc", rounds=4)  # committed; the leader's next answer tells b so
    assert cluster.received(b"pub")[-1] == PingOk()
    assert _keys(_from(b, b"reader")) == ["k.1"]

    b.receive(b"late", encode(Attach(stream="prices", version=8)), now=0.0)  # a replay from the start
    b.receive(b"late", encode(Credit(credit=1 << 20)), now=0.0)
    b.receive(b"late", encode(Subscribe(pattern="k.", latest=0)), now=0.0)
    assert _keys(_from(b, b"late")) == ["k.1"]

    b.receive(b"reader", encode(Publish(key="k.2", body=b"not here")), now=0.0)
    (refusal,) = [c for c in _from(b, b"reader") if isinstance(c, InvalidCode)]
    assert refusal.code == Refusal.NOT_LEADER and "reads only" in refusal.reason
    assert b.streams["prices"].journal.written == 1  # the copy stays the leader's
    b.receive(b"old", encode(Attach(stream="prices", version=7)), now=0.0)
    (refusal,) = _from(b, b"old")
    assert isinstance(refusal, InvalidCode) and refusal.code == Refusal.NOT_LEADER


def test_a_followers_readers_stay_when_it_follows_a_new_leader_and_go_when_it_steps_down(cluster: Cluster) -> None:
    b = cluster.cores["b"]
    for command in (Attach(stream="prices", version=8), Credit(credit=1 << 20), Subscribe(pattern="")):
        b.receive(b"reader", encode(command), now=0.0)
    _from(b, b"reader")
    cluster.send(b"pub", Attach(stream="prices", version=7), Publish(key="k", body=b"1"), Ping())
    cluster.turn(rounds=4)
    assert _keys(_from(b, b"reader")) == ["k"]
    b.follow("prices")  # a new leader was elected (c, say): what b routed was committed, its readers stay
    assert b"reader" in b.sessions and _from(b, b"reader") == []
    b.lead("prices", me="b", epoch=2, isr=frozenset({"b", "c"}), min_insync=2, now=0.0)
    assert b"reader" in b.sessions  # it serves reads as a leader too
    b.follow("prices")  # and steps down: every client is sent to the new leader
    refusals = [c for c in _from(b, b"reader") if isinstance(c, InvalidCode)]
    assert [c.code for c in refusals] == [Refusal.NOT_LEADER] and b"reader" not in b.sessions


@pytest.mark.pure
def test_a_follower_without_readers_does_not_read_its_copy_back(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Routing is for readers: a follower nobody reads from only writes what it copies (reading each
    record back cost it half its time), and a reader that comes later replays all of it."""
    b = cluster.cores["b"]
    journal = b.streams["prices"].journal
    reads: list[int] = []
    read_chunk = journal.read_chunk
    monkeypatch.setattr(journal, "read_chunk", lambda first, **kw: reads.append(first) or read_chunk(first, **kw))
    cluster.send(b"pub", Attach(stream="prices", version=7))
    for i in range(50):
        cluster.send(b"pub", Publish(key=f"k.{i}", body=b"x"))
    cluster.turn(rounds=4)
    assert journal.written == 50 and b.streams["prices"].routed == 50
    assert reads == []  # copied and committed, never read back
    for command in (Attach(stream="prices", version=8), Credit(credit=1 << 20), Subscribe(pattern="", latest=0)):
        b.receive(b"late", encode(command), now=0.0)
    assert _keys(_from(b, b"late")) == [f"k.{i}" for i in range(50)]
    cluster.send(b"pub", Publish(key="k.new", body=b"y"))
    cluster.turn(rounds=4)
    assert _keys(_from(b, b"late")) == ["k.new"]  # live now: routed to it as it is copied

"""The leader's in-sync set and commit point (zeps.replication.isr), as a pure function of the
followers' fetches and ``now``; and a replica's restart from its commit checkpoint, through the
broker's core on real journals. Each case here is one a Kafka-style ISR got wrong once (the issue
names them); the deterministic simulation (tests/simulation) checks the same rules under faults."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from zeps.broker.core import BrokerConfig, BrokerCore
from zeps.journal import JournalConfig
from zeps.protocol import Attach, Credit, DeliverRun, Ping, PingOk, Publish, Subscribe, decode, encode
from zeps.replication.isr import Leadership

ISR = frozenset({"a", "b", "c"})


def _leader(commit: int = 0, log_end: int = 0, isr: frozenset[str] = ISR, **tuning: float) -> Leadership:
    return Leadership.begin("a", 1, isr, min_insync=2, commit=commit, log_end=log_end, now=0.0, **tuning)


def test_a_follower_that_fetches_often_but_never_catches_up_leaves_the_set_after_the_lag() -> None:
    """Time since it last caught up, not since it last fetched: a slow follower must not hold every
    confirmation back (with 'holds the commit point' as the test, it stayed for ever: the commit
    point waits for it, so it always held it)."""
    leader = _leader(lag_s=10.0)
    for t in range(1, 30):  # the leader gains 100 records a second; b copies 50
        leader.fetched("b", 50 * t, 100 * t, now=float(t))
        leader.fetched("c", 100 * t, 100 * t, now=float(t))
        leader.advance(100 * t)
        wanted = leader.wanted(100 * t, now=float(t))
        if wanted is not None:
            leader.isr_written(wanted)
    assert leader.isr == frozenset({"a", "c"})
    assert leader.commit == 2900  # no longer waiting for b


def test_a_follower_caught_up_at_its_previous_fetch_counts_as_caught_up_then() -> None:
    leader = _leader(isr=frozenset({"a", "b"}), lag_s=5.0)
    leader.fetched("b", 100, 100, now=1.0)  # holds all the leader has
    leader.fetched("b", 100, 200, now=2.0)  # the leader wrote more meanwhile: b held all it had at 1.0
    leader.fetched("b", 200, 300, now=7.5)  # at 7.5 it holds what the leader had at 2.0: caught up at 2.0
    assert leader.followers["b"].caught_up == 2.0
    assert leader.wanted(300, now=6.9) is None  # caught up 4.9 s ago: still in
    assert leader.wanted(300, now=7.1) == frozenset({"a"})  # 5.1 s ago: out


def test_a_follower_joins_only_holding_the_leaders_log_end_at_election() -> None:
    """KAFKA-7128: a new leader's commit point (its checkpoint) may lag what an earlier leader
    confirmed. A follower admitted against it could be elected without confirmed records."""
    leader = _leader(commit=90, log_end=100, isr=frozenset({"a", "b"}))
    leader.fetched("b", 100, 100, now=1.0)
    leader.fetched("d", 95, 100, now=1.0)  # not in the set; holds more than the commit point, not all
    assert leader.wanted(100, now=1.0) is None
    leader.fetched("d", 100, 100, now=2.0)  # ... and now all of it
    assert leader.wanted(100, now=2.0) == frozenset({"a", "b", "d"})


def test_a_member_that_left_the_set_by_itself_is_not_asked_back_until_a_fetch_shows_it_caught_up() -> None:
    """A follower that is stopping takes itself out of the set in ZooKeeper (the election's resign):
    the leader confirms without it at once, and does not write it back from its last fetch (it would
    wait for it again until the lag put it out)."""
    leader = _leader()
    for replica in ("b", "c"):
        leader.fetched(replica, 100, 100, now=1.0)
    assert leader.advance(100) == 100
    leader.isr_written(frozenset({"a", "c"}))  # b left by itself
    leader.fetched("c", 150, 150, now=1.5)
    assert leader.advance(150) == 150  # b's copy (100) holds nothing back
    assert leader.wanted(150, now=1.5) is None  # b is not asked back
    leader.fetched("b", 150, 150, now=9.0)  # back, restarted, and caught up
    assert leader.wanted(150, now=9.0) == ISR


def test_a_joining_follower_counts_for_the_commit_point_while_its_join_is_written() -> None:
    """KIP-497: while ZooKeeper is asked to add a follower, the commit point waits for it too.
    Otherwise the leader confirms records it lacks, the write lands, and the set lists a replica
    that lacks confirmed records."""
    leader = _leader(isr=frozenset({"a", "b"}))
    leader.fetched("b", 10, 10, now=1.0)
    leader.fetched("c", 10, 10, now=1.0)
    assert leader.wanted(10, now=1.0) == ISR  # asked, not written yet
    leader.fetched("b", 20, 20, now=1.5)
    assert leader.advance(20) == 10  # c holds 10 only: the commit point waits
    leader.isr_written(ISR)
    leader.fetched("c", 20, 20, now=2.0)
    assert leader.advance(20) == 20


def test_a_set_asked_with_no_answer_is_asked_again_and_counts_until_zookeeper_confirms_one() -> None:
    """A write whose answer was lost may have been applied: its members count for the commit point
    until ZooKeeper confirms a set, and the leader asks again after ``retry_s`` (before, a failed
    write was never asked again: the leader's set and ZooKeeper's stayed apart)."""
    leader = _leader(isr=frozenset({"a", "b"}), retry_s=2.0)
    leader.fetched("b", 10, 10, now=1.0)
    leader.fetched("c", 10, 10, now=1.0)
    assert leader.wanted(10, now=1.0) == ISR
    assert leader.wanted(10, now=2.0) is None  # being written
    assert leader.wanted(10, now=3.5) == ISR  # no answer: asked again
    # c falls behind: the leader no longer wants it, but an earlier ask may have landed
    leader.fetched("b", 30, 30, now=4.0)
    assert leader.advance(30) == 10  # c may be in the set ZooKeeper holds
    assert leader.wanted(30, now=13.0) == frozenset({"a", "b"})
    assert leader.advance(30) == 10
    leader.isr_written(frozenset({"a", "b"}))  # confirmed: c is out
    assert leader.advance(30) == 30


def test_a_fenced_leadership_confirms_nothing() -> None:
    leader = _leader()
    leader.fetched("b", 10, 10, now=1.0)
    leader.fetched("c", 10, 10, now=1.0)
    leader.fenced = True
    assert leader.advance(10) == 0
    leader.fenced = False
    assert leader.advance(10) == 10


# -- a replica's restart, through the broker's core -------------------------------------------------
def _core(path: Path) -> BrokerCore:
    journal = JournalConfig(fsync="always", segment_bytes=1 << 16)
    return BrokerCore(BrokerConfig(path, ("prices",), journal=journal, replicated=True)).open()


def _out(core: BrokerCore, peer: bytes) -> list[Any]:
    core.flush_appends(now=0.0)
    return [decode(o.frame) for o in core.pump(now=0.0) if o.peer == peer]


def _send(core: BrokerCore, peer: bytes, *commands: Any) -> None:
    for command in commands:
        core.receive(peer, encode(command), now=0.0)


def test_a_leader_restarted_alone_confirms_and_delivers_nothing_of_its_uncommitted_tail(tmp_path: Path) -> None:
    """The issue's case: a leader wrote records no follower copied (they were stopped), every replica
    restarted, and the old leader came back first and alone. Its journal's tail was never committed:
    it must not deliver it, nor confirm it to a producer's resend, before the in-sync set holds it in
    its new epoch (before, it treated its whole journal as committed)."""
    a = _core(tmp_path)
    a.lead("prices", me="a", epoch=1, isr=ISR, min_insync=2, now=0.0)
    _send(a, b"pub", Attach(stream="prices", version=7), *(Publish(key="k", body=b"%d" % i) for i in range(20)))
    assert _out(a, b"pub")  # ATTACH-OK only: no follower copied anything
    assert a.streams["prices"].journal.written == 20
    a.close()  # kill -9 loses nothing written: the journal holds 20, no quorum ever did

    a = _core(tmp_path)
    assert a.streams["prices"].routed == 0 and a.streams["prices"].journal.written == 20
    a.lead("prices", me="a", epoch=2, isr=ISR, min_insync=2, now=0.0)
    _send(a, b"sub", Attach(stream="prices", version=7), Credit(credit=1 << 20), Subscribe(pattern="", latest=0))
    _send(a, b"pub", Attach(stream="prices", version=7), Ping())
    assert [c for c in _out(a, b"sub") if isinstance(c, DeliverRun)] == []
    assert PingOk() not in _out(a, b"pub")
    assert a.streams["prices"].leader is not None and a.streams["prices"].leader.commit == 0
    a.close()


def test_a_replica_restarts_from_its_checkpoint_and_a_lone_brokers_journal_counts_as_committed(
    tmp_path: Path,
) -> None:
    lone = BrokerCore(BrokerConfig(tmp_path, ("prices",), journal=JournalConfig(fsync="always"))).open()
    _send(lone, b"pub", Attach(stream="prices", version=7), *(Publish(key="k", body=b"x") for _ in range(5)))
    _out(lone, b"pub")
    lone.close()
    grown = _core(tmp_path)  # the stream grew replicas: what the lone broker confirmed stays confirmed
    assert grown.streams["prices"].routed == 5
    grown.lead("prices", me="a", epoch=1, isr=frozenset({"a"}), min_insync=1, now=0.0)
    _send(grown, b"pub", Attach(stream="prices", version=7), Publish(key="k", body=b"y"), Ping())
    assert PingOk() in _out(grown, b"pub")  # alone in the set with minInSync 1: committed at once
    grown.close()  # the checkpoint is written at close (and once a second)
    assert (tmp_path / "prices" / "commit").read_text() == "6\n"
    again = _core(tmp_path)
    assert again.streams["prices"].routed == 6
    again.close()


def test_the_followers_that_fetch_are_those_heard_within_the_lag_allowed() -> None:
    """The leader's facts say who fetches (the operator's UnderReplicated condition tells a replica
    catching up from one that is down)."""
    leader = _leader(lag_s=10.0)
    leader.fetched("b", 5, 5, now=1.0)
    leader.fetched("c", 5, 5, now=8.0)
    assert leader.fetching(now=9.0) == ["b", "c"]
    assert leader.fetching(now=12.0) == ["c"]  # b silent for 11 s
    assert leader.lag(9) == {"b": 4, "c": 4}  # its lag stays reported: the last it said

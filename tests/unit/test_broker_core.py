"""The broker's socket-free core (``BrokerCore``) with a fake clock: heartbeats, TTL, credit and the
facts it reports, each decided by the ``now`` passed in, never by sleeping. The journal is real
(a temporary directory); no socket is opened."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from zeps.broker.core import BrokerConfig, BrokerCore
from zeps.journal import JournalConfig
from zeps.protocol import LATEST, Attach, AttachOk, Credit, Deliver, Invalid, Ping, Publish, Subscribe, decode, encode

HEARTBEAT, TTL = 5.0, 30.0


@pytest.fixture
def core(tmp_path: Path) -> Iterator[BrokerCore]:
    broker = BrokerCore(BrokerConfig(tmp_path, ("prices",), journal=JournalConfig(fsync="never"),
                                     heartbeat_s=HEARTBEAT, ttl_s=TTL)).open()  # fmt: skip
    yield broker
    broker.close()


def _send(core: BrokerCore, peer: bytes, *commands: Any, now: float, to: bytes | None = None) -> list[Any]:
    """Commands from ``peer`` at time ``now``; returns what the broker then sends to ``to`` (by
    default the same peer), decoded."""
    for command in commands:
        core.receive(peer, encode(command), now=now)
    core.flush_appends()
    return [decode(out.frame) for out in core.pump(now=now) if out.peer == (to or peer)]


def _attach(core: BrokerCore, peer: bytes, *, now: float = 0.0) -> None:
    assert _send(core, peer, Attach(stream="prices", version=1), now=now) == [AttachOk()]


def test_a_silent_peer_is_pinged_once_per_heartbeat(core: BrokerCore) -> None:
    _attach(core, b"a")
    core.tick(now=HEARTBEAT - 0.1)
    assert core.pump(now=HEARTBEAT) == []  # not silent long enough
    core.tick(now=HEARTBEAT + 0.1)
    assert [decode(o.frame) for o in core.pump(now=HEARTBEAT + 0.1)] == [Ping()]
    core.tick(now=HEARTBEAT + 1)
    assert core.pump(now=HEARTBEAT + 1) == []  # one PING per heartbeat, not one per tick
    core.tick(now=2 * HEARTBEAT + 0.3)
    assert [decode(o.frame) for o in core.pump(now=2 * HEARTBEAT + 0.3)] == [Ping()]


def test_a_peer_silent_past_the_ttl_is_forgotten_and_told_so(core: BrokerCore) -> None:
    _attach(core, b"a")
    _send(core, b"a", Subscribe(pattern="", latest=LATEST), now=1.0)
    core.tick(now=TTL)  # heard at 1.0: within the TTL, past the heartbeat
    assert b"a" in core.sessions and [decode(o.frame) for o in core.pump(now=TTL)] == [Ping()]
    core.tick(now=TTL + 1.1)
    assert not core.sessions and core.subscriptions("prices") == (0, [])
    [answer] = _send(core, b"a", Ping(), now=TTL + 2)  # it speaks again: plain INVALID, attach again
    assert isinstance(answer, Invalid) and answer.reason.endswith("when await attach")


def test_hearing_from_a_peer_keeps_it(core: BrokerCore) -> None:
    _attach(core, b"a")
    for now in (10.0, 20.0, 30.0, 40.0):  # a frame every 10 s: never silent for the 30 s TTL
        _send(core, b"a", Ping(), now=now)
        core.tick(now=now + 1)
    assert b"a" in core.sessions


def test_credit_bounds_what_is_delivered_and_facts_show_the_lag(core: BrokerCore) -> None:
    _attach(core, b"pub")
    _attach(core, b"sub")
    frame_size = len(encode(Deliver(sequence=1, key="k", body=b"x" * 10)))
    assert _send(core, b"sub", Subscribe(pattern="", latest=LATEST), Credit(credit=3 * frame_size), now=1.0)
    got = _send(core, b"pub", *[Publish(key="k", body=b"x" * 10) for _ in range(10)], now=2.0, to=b"sub")
    assert [d.sequence for d in got] == [1, 2, 3]  # credit for three deliveries, no more
    count, [facts] = core.subscriptions("prices")
    assert count == 1 and facts["lag"] == 7 and facts["live"] is False
    more = _send(core, b"sub", Credit(credit=100 * frame_size), now=3.0)
    assert [d.sequence for d in more] == list(range(4, 11))
    assert [(peer, sub.id, sub.lag) for peer, sub in core.lag("prices")[1]] == [(b"sub".hex(), facts["id"], 0)]


def test_the_states_a_stream_s_metrics_show_replaying_starved_and_refusals(core: BrokerCore) -> None:
    """What ``zeps_broker_replay_sessions``, ``_credit_starved_subscriptions`` and
    ``_refused_frames_total`` are made of."""
    frame_size = len(encode(Deliver(sequence=1, key="k", body=b"x" * 10)))
    _attach(core, b"pub")
    _send(core, b"pub", *[Publish(key="k", body=b"x" * 10) for _ in range(10)], now=1.0)
    _attach(core, b"late")
    _send(core, b"late", Subscribe(pattern="", latest=0), now=2.0)  # from the start: replays; no credit yet
    assert core.states("prices") == (0, 1)  # it stopped at once: starved, not replaying
    core.receive(b"late", encode(Credit(credit=3 * frame_size)), now=3.0)
    assert core.states("prices") == (1, 0)  # in line to replay
    core.pump(now=3.0)
    assert core.states("prices") == (0, 1)  # three delivered, starved again before the tail
    _send(core, b"late", Credit(credit=100 * frame_size), now=4.0)
    assert core.states("prices") == (0, 0)  # caught up: live
    _send(core, b"late", Subscribe(pattern="~(", latest=LATEST), now=5.0)  # a regex that does not compile
    core.receive(b"stranger", b"not a frame", now=6.0)
    assert core.refusals == {("prices", "pattern_refused"): 1, ("", "bad_frame"): 1}


def test_the_subscriber_lag_series_are_the_furthest_behind_and_bounded(core: BrokerCore) -> None:
    """The README's promise that no client adds series of its own: 25 subscriptions, 20 lag series
    (the furthest behind), whatever the peers; refusals are labelled by stream and code only."""
    from prometheus_client import CollectorRegistry  # noqa: PLC0415

    from zeps.broker.metrics import LAG_SERIES, BrokerMetrics  # noqa: PLC0415

    _attach(core, b"pub")
    _send(core, b"pub", *[Publish(key="k", body=b"x") for _ in range(30)], now=1.0)
    for i in range(25):  # subscriptions from sequence 1 + i, none with credit: lag 30 - i
        peer = b"peer-%02d" % i
        _attach(core, peer)
        _send(core, peer, Subscribe(pattern="", latest=i), now=2.0)
    core.receive(b"stranger", b"junk", now=3.0)
    registry = CollectorRegistry()
    BrokerMetrics(registry).update(core)
    lags = [s for f in registry.collect() if f.name == "zeps_broker_subscriber_lag" for s in f.samples]
    assert len(lags) == LAG_SERIES == 20
    assert sorted(int(s.value) for s in lags) == list(range(11, 31)), "the 20 furthest behind"
    refused = [s.labels for f in registry.collect() if f.name == "zeps_broker_refused_frames" for s in f.samples
               if s.name.endswith("_total")]  # fmt: skip
    assert refused == [{"stream": "", "code": "bad_frame"}]


@pytest.mark.parametrize("pattern", ["", "k", "~k.*"])
def test_a_subscription_from_past_the_tail_gets_nothing_before_its_sequence(core: BrokerCore, pattern: str) -> None:
    """A replay asked from a sequence the broker has not made durable yet (a follower that has not
    learned the commit point, a client ahead of a new leader) waits there: the records routed before
    it are not delivered (they were, as to a subscription from the tail: a Spark range read twice)."""
    frame_size = len(encode(Deliver(sequence=1, key="k", body=b"x")))
    _attach(core, b"pub")
    _send(core, b"pub", *[Publish(key="k", body=b"x") for _ in range(3)], now=1.0)
    _attach(core, b"sub")
    _send(core, b"sub", Subscribe(pattern=pattern, latest=5), Credit(credit=100 * frame_size), now=2.0)
    assert _send(core, b"pub", Publish(key="k", body=b"x"), now=2.5, to=b"sub") == []  # 4: all before it
    got = _send(core, b"pub", *[Publish(key="k", body=b"x") for _ in range(6)], now=3.0, to=b"sub")
    assert [d.sequence for d in got] == [6, 7, 8, 9, 10]  # 5 to 10 routed together: from 6 on
    got = _send(core, b"pub", Publish(key="k", body=b"x"), now=4.0, to=b"sub")
    assert [d.sequence for d in got] == [11]  # live from there on
    assert [sub.lag for _, sub in core.lag("prices")[1]] == [0]

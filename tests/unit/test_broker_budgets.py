"""Budgets of the whole broker, whoever the peers are, in its socket-free core (``BrokerCore``): the
subscriptions and open fetches of all sessions together, and of those the ``~regex`` ones (each runs
against every live record's key on the broker's one thread). Past either the peer is refused LIMIT
with a reason naming the budget, and nothing of the subscription is kept; a session forgotten, or a
fetch ended, gives its share back. The journal is real (a temporary directory); no socket."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from zeps.broker.core import BrokerConfig, BrokerCore
from zeps.journal import JournalConfig
from zeps.protocol import (
    Attach,
    AttachOk,
    Credit,
    Detach,
    Fetch,
    FetchEnd,
    InvalidCode,
    Publish,
    Refusal,
    Subscribe,
    SubscribeOk,
    decode,
    encode,
)


def _core(path: Path, **config: Any) -> BrokerCore:
    return BrokerCore(BrokerConfig(path, ("prices",), journal=JournalConfig(fsync="never"), **config)).open()


def _send(core: BrokerCore, peer: bytes, *commands: Any) -> list[Any]:
    for command in commands:
        core.receive(peer, encode(command), now=0.0)
    core.flush_appends()
    return [decode(out.frame) for out in core.pump(now=0.0) if out.peer == peer]


def _attach(core: BrokerCore, peer: bytes) -> None:
    assert _send(core, peer, Attach(stream="prices", version=7), Credit(credit=1 << 20)) == [AttachOk()]


def _refused(answers: list[Any]) -> str:
    [answer] = answers
    assert isinstance(answer, InvalidCode) and answer.code == Refusal.LIMIT, answer
    return answer.reason


def test_the_subscriptions_of_all_peers_together_are_bounded(tmp_path: Path) -> None:
    core = _core(tmp_path, max_total_subscriptions=3)
    for peer in (b"a", b"b", b"c"):
        _attach(core, peer)
    assert _send(core, b"a", Subscribe(pattern="x."), Subscribe(pattern="y.")) == [SubscribeOk(), SubscribeOk()]
    assert _send(core, b"b", Subscribe(pattern="z.")) == [SubscribeOk()]
    reason = _refused(_send(core, b"c", Subscribe(pattern="w.")))  # another peer, well under its own 64
    assert "holds 3 subscriptions across its peerings, its limit" in reason
    assert core.subscription_count == 3 and len(core.sessions[b"c"].subscriptions) == 0
    _refused(_send(core, b"c", Fetch(pattern="", first=1)))  # a fetch counts as one while open
    _send(core, b"a", Detach())  # a's two are given back
    assert core.subscription_count == 1
    assert _send(core, b"c", Subscribe(pattern="w."), Subscribe(pattern="v.")) == [SubscribeOk(), SubscribeOk()]
    core.disconnected(b"b")
    assert core.subscription_count == 2
    core.close()


def test_regular_expression_subscriptions_have_a_budget_of_their_own(tmp_path: Path) -> None:
    core = _core(tmp_path, max_regex_subscriptions=1)
    _send(core, b"pub", Attach(stream="prices", version=7), Publish(key="a.1", body=b"1"))
    _attach(core, b"a")
    _attach(core, b"b")
    assert _send(core, b"a", Subscribe(pattern="~^a\\.[0-9]+$"))[0] == SubscribeOk()  # then a.1 replayed
    reason = _refused(_send(core, b"b", Subscribe(pattern="~b$")))
    assert "1 regular-expression subscriptions, its limit" in reason and "subscribe by key prefix" in reason
    assert _send(core, b"b", Subscribe(pattern="b.")) == [SubscribeOk()]  # a prefix is still taken
    _refused(_send(core, b"b", Fetch(pattern="~a", first=1)))
    core.disconnected(b"a")
    assert core.regex_subscriptions == 0
    answers = _send(core, b"b", Fetch(pattern="~a", first=1))  # taken now: delivers, then FETCH-END
    assert isinstance(answers[-1], FetchEnd)
    assert core.regex_subscriptions == 0 and core.subscription_count == 1  # the fetch gave its share back
    core.close()


def test_the_budgets_are_flags_checked_before_the_broker_starts(tmp_path: Path) -> None:
    from zeps.broker.main import parse_args, settings  # noqa: PLC0415
    from zeps.errors import ConfigError  # noqa: PLC0415

    base = ["--stream", "prices", "--data-dir", str(tmp_path)]
    config, _, _ = settings(parse_args([*base, "--max-total-subscriptions", "500", "--max-regex-subscriptions", "0",
                                        "--max-sessions", "20"]))  # fmt: skip
    assert (config.max_total_subscriptions, config.max_regex_subscriptions, config.max_sessions) == (500, 0, 20)
    assert settings(parse_args(base))[0].max_regex_subscriptions == 1_000
    with pytest.raises(ConfigError, match="--max-total-subscriptions=0: must be at least 1"):
        settings(parse_args([*base, "--max-total-subscriptions", "0"]))


# -- bytes in flight ---------------------------------------------------------------------------------
KiB, MiB = 1 << 10, 1 << 20


def _delivered(core: BrokerCore, peer: bytes, outgoing: list[Any]) -> int:
    """The bytes of deliveries to ``peer`` among ``outgoing``."""
    return sum(out.cost for out in outgoing if out.peer == peer)


def _flood(core: BrokerCore, mib: int, body_kib: int = 64) -> list[Any]:
    """``mib`` MiB published (bodies of ``body_kib``) by another peer, and what the core has to send then."""
    body = bytes(body_kib * KiB)
    core.receive(b"pub", encode(Attach(stream="prices", version=7)), now=0.0)
    for _ in range(mib * 1024 // body_kib):
        core.receive(b"pub", encode(Publish(key="k", body=body)), now=0.0)
    core.flush_appends()
    return core.pump(now=0.0)


def _subscriber(core: BrokerCore, peer: bytes) -> None:
    assert _send(core, peer, Attach(stream="prices", version=7), Credit(credit=64 * MiB)) == [AttachOk()]
    assert _send(core, peer, Subscribe(pattern=""))[0] == SubscribeOk()  # (and what the journal holds)


def test_a_sessions_deliveries_stop_at_its_bytes_in_flight_and_go_on_as_they_leave(tmp_path: Path) -> None:
    """Credit allows 64 MiB, but what the adapter has not seen leave (``released``) counts as in
    flight: the deliveries stop at the session's 1 MiB and go on as bytes leave, not at CREDIT."""
    core = _core(tmp_path, max_session_bytes_in_flight=1 * MiB)
    _subscriber(core, b"a")
    sent = _delivered(core, b"a", _flood(core, 4))
    assert 0 < sent <= 1 * MiB and core.sessions[b"a"].in_flight == sent == core.bytes_in_flight
    assert core.held and _delivered(core, b"a", core.pump(now=0.0)) == 0, "held, though its credit allows more"
    core.receive(b"a", encode(Credit(credit=1)), now=0.0)  # CREDIT does not lift it: it proves nothing
    assert _delivered(core, b"a", core.pump(now=0.0)) == 0
    total = sent
    while total < 4 * MiB:  # each time the adapter sees bytes leave, as many more go
        core.released(core.sessions[b"a"], sent)
        sent = _delivered(core, b"a", core.pump(now=0.0))
        assert 0 < sent <= 1 * MiB
        total += sent
    assert total >= 4 * MiB and core.sessions[b"a"].credit == 64 * MiB + 1 - total
    core.close()


def test_the_bytes_in_flight_of_all_sessions_together_are_bounded(tmp_path: Path) -> None:
    """Four sessions each allowed 4 MiB in flight hold 2 MiB together (and one frame each at most:
    a session with nothing in flight may send one); bytes leaving one session's socket let the
    others go on; a delivery the socket refused gives its share back, and a session that goes gives
    its share back once its bytes leave (ZeroMQ's queue for its peer outlives it)."""
    core = _core(tmp_path, max_session_bytes_in_flight=4 * MiB, max_bytes_in_flight=2 * MiB)
    peers = [b"a", b"b", b"c", b"d"]
    for peer in peers:
        _subscriber(core, peer)
    outgoing = _flood(core, 4)
    assert core.bytes_in_flight == sum(_delivered(core, p, outgoing) for p in peers)
    assert 2 * MiB - 128 * KiB < core.bytes_in_flight <= 2 * MiB + 4 * core.config.batch_bytes  # (whole records)
    assert _delivered(core, b"d", core.pump(now=0.0)) == 0
    most = max(peers, key=lambda p: core.sessions[p].in_flight)
    core.released(core.sessions[most], core.sessions[most].in_flight)  # what one read makes room for all
    again = core.pump(now=0.0)
    assert sum(_delivered(core, p, again) for p in peers) > 0
    refused = next(out for out in again if out.cost)
    before = core.bytes_in_flight
    core.unsent(refused, now=0.0)
    assert core.bytes_in_flight == before - refused.cost
    gone = core.sessions[most]
    core.disconnected(most)
    assert core.bytes_in_flight == before - refused.cost, "counted until its bytes leave"
    core.released(gone, gone.in_flight)
    assert core.bytes_in_flight == sum(s.in_flight for s in core.sessions.values()) > 0
    core.close()


def test_a_record_larger_than_the_window_goes_alone(tmp_path: Path) -> None:
    """A session with nothing in flight may always take one frame: a record larger than its bytes in
    flight is delivered (alone), not held for ever."""
    core = _core(tmp_path, max_session_bytes_in_flight=64 * KiB, max_message_bytes=512 * KiB)
    _subscriber(core, b"a")
    core.receive(b"pub", encode(Attach(stream="prices", version=7)), now=0.0)
    core.receive(b"pub", encode(Publish(key="k", body=bytes(256 * KiB))), now=0.0)
    core.flush_appends()
    first = _delivered(core, b"a", core.pump(now=0.0))
    assert first > 256 * KiB
    core.receive(b"pub", encode(Publish(key="k", body=b"small")), now=0.0)
    core.flush_appends()
    assert _delivered(core, b"a", core.pump(now=0.0)) == 0, "the next waits for the large one to leave"
    core.released(core.sessions[b"a"], first)
    assert 0 < _delivered(core, b"a", core.pump(now=0.0)) < KiB
    core.close()


# -- memory --------------------------------------------------------------------------------------------
def test_past_its_memory_budget_the_broker_takes_on_nothing_new_and_serves_what_it_has(tmp_path: Path) -> None:
    """Past ``max_memory_bytes`` (the adapter reads the process's resident memory into
    ``resident_bytes``) a new peering is refused BUSY and a new subscription LIMIT, each naming the
    budget; an attached session still publishes; under the budget again, both are taken."""
    core = _core(tmp_path, max_memory_bytes=100 * MiB)
    core.resident_bytes = 60 * MiB
    _attach(core, b"a")
    core.resident_bytes = 120 * MiB
    [busy] = _send(core, b"b", Attach(stream="prices", version=7))
    assert isinstance(busy, InvalidCode) and busy.code == Refusal.BUSY, busy
    assert busy.reason == ("the broker uses 120 MiB, past its memory budget of 100 MiB (--max-memory-bytes); "
                           "try again later")  # fmt: skip
    assert b"b" not in core.sessions
    assert "memory budget" in _refused(_send(core, b"a", Subscribe(pattern="x.")))
    _send(core, b"a", Publish(key="x.1", body=b"1"))
    assert core.streams["prices"].journal.written == 1, "what is attached goes on"
    core.resident_bytes = 90 * MiB
    _attach(core, b"b")
    assert _send(core, b"b", Subscribe(pattern="x."))[0] == SubscribeOk()  # (and x.1, replayed)
    core.close()


def test_the_memory_budget_is_eighty_percent_of_the_containers_limit_unless_set(tmp_path: Path) -> None:
    from zeps.broker.main import memory_budget, parse_args, settings  # noqa: PLC0415
    from zeps.errors import ConfigError  # noqa: PLC0415

    v2, v1, none = tmp_path / "v2", tmp_path / "v1", tmp_path / "none"
    (v1 / "memory").mkdir(parents=True)
    v2.mkdir()
    none.mkdir()
    (v2 / "memory.max").write_text("1073741824\n")
    assert memory_budget(v2) == 858993459
    (v2 / "memory.max").write_text("max\n")
    assert memory_budget(v2) == 0, "no limit, no budget"
    (v1 / "memory" / "memory.limit_in_bytes").write_text("536870912\n")
    assert memory_budget(v1) == 429496729
    (v1 / "memory" / "memory.limit_in_bytes").write_text("9223372036854771712\n")  # v1's "no limit"
    assert memory_budget(v1) == 0
    assert memory_budget(none) == 0
    base = ["--stream", "prices", "--data-dir", str(tmp_path)]
    assert settings(parse_args([*base, "--max-memory-bytes", "0"]))[0].max_memory_bytes == 0
    assert settings(parse_args([*base, "--max-memory-bytes", str(64 * MiB)]))[0].max_memory_bytes == 64 * MiB
    with pytest.raises(ConfigError, match="--max-memory-bytes=-1: must be at least 0"):
        settings(parse_args([*base, "--max-memory-bytes", "-1"]))


def test_past_the_shared_budget_a_session_with_nothing_in_flight_gets_a_small_frame(tmp_path: Path) -> None:
    """Once the shared budget is spent, a session with nothing in flight still gets a frame (peers
    that read nothing cannot stop one that reads), of ``RESERVE_BYTES`` at most: twenty more sessions
    add 20 times 64 KiB at most, not 20 frames of 1 MiB. (A record larger than that waits for room.)"""
    from zeps.broker.routing import RESERVE_BYTES  # noqa: PLC0415

    core = _core(tmp_path, max_session_bytes_in_flight=4 * MiB, max_bytes_in_flight=2 * MiB)
    for peer in [b"a", b"b"]:
        _subscriber(core, peer)
    _flood(core, 4, body_kib=16)
    spent = core.bytes_in_flight
    assert spent > 2 * MiB - 128 * KiB  # (frames are cut at whole records of 64 KiB)
    late = [b"late-%d" % i for i in range(20)]
    for peer in late:
        _subscriber(core, peer)  # each replays the journal from its start, as far as the budgets let it
    assert all(0 < core.sessions[p].in_flight <= RESERVE_BYTES for p in late)
    assert core.bytes_in_flight <= spent + 20 * RESERVE_BYTES
    # a late one reads what it got: it goes on (with a small frame again: the budget is still spent)
    session = core.sessions[late[0]]
    core.released(session, session.in_flight)
    again = _delivered(core, late[0], core.pump(now=0.0))
    assert 0 < again <= RESERVE_BYTES
    core.close()

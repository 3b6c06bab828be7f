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

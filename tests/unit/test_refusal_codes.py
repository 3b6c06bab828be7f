"""Refusals a program decides on by code (version 5, INVALID-CODE), never by the reason's words.

Socket-free: the client's protocol state (``ClientSession``) talks to the broker's (``BrokerCore``)
frame by frame, so every ATTACH the client sends is counted. Brokers from before codes are played by
frames written out here with their exact messages (a broker of this tree speaks versions 1 to 6).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from zeps.broker.core import BrokerConfig, BrokerCore
from zeps.client.session import ClientSession
from zeps.protocol import Attach, AttachOk, Invalid, InvalidCode, Refusal, Subscribe, decode, encode


def _talk(core: BrokerCore, session: ClientSession, frames: list[bytes], peer: bytes = b"peer") -> list[int]:
    """Deliver ``frames`` to the broker and its answers back until both are quiet; returns the
    versions of the ATTACHes the broker received."""
    attaches: list[int] = []
    for _ in range(20):  # bounded: a conversation here takes a few rounds
        if not frames:
            return attaches
        answers: list[bytes] = []
        for frame in frames:
            command = decode(frame)
            if isinstance(command, Attach):
                attaches.append(command.version)
            core.receive(peer, frame, now=0.0)
            for out in core.pump(now=0.0):
                answers += session.receive(out.frame)
        frames = answers
    raise AssertionError("the conversation did not end")


@pytest.fixture
def core(tmp_path: Path) -> Iterator[BrokerCore]:
    broker = BrokerCore(BrokerConfig(tmp_path, ("prices",), matching="prefix")).open()
    yield broker
    broker.close()


@pytest.mark.parametrize("stream", ["version-feed", "unsupported-version", "nope"])
def test_a_refused_stream_is_reported_at_once_whatever_its_name(core: BrokerCore, stream: str) -> None:
    """The defect: a refused stream whose name contained "version" made the client step down the
    versions before reporting. Now the refusal has a code, and one ATTACH is all it takes."""
    session = ClientSession(stream)
    assert _talk(core, session, [session.attach()]) == [7]
    assert session.refused == f"stream {stream!r} is not served by this broker"
    assert session.refused_code == Refusal.STREAM_UNKNOWN


def test_an_attached_peering_gets_codes_for_refused_subscriptions(core: BrokerCore) -> None:
    session = ClientSession("prices")
    _talk(core, session, [session.attach()])
    assert session.ready and session.conn.version == 7
    core.receive(b"peer", encode(Subscribe(pattern="~version.*", latest=0)), now=0.0)
    [answer] = [decode(out.frame) for out in core.pump(now=0.0)]
    assert answer == InvalidCode(code=Refusal.PATTERN_REFUSED, reason=answer.reason)  # type: ignore[union-attr]
    assert "accepts key prefixes only" in answer.reason  # type: ignore[union-attr]
    session.receive(encode(answer))
    assert list(session.errors) == [answer.reason] and not session.forgotten  # type: ignore[union-attr]


@pytest.mark.parametrize("version", [1, 2, 3, 4])
def test_a_peer_below_version_5_never_sees_a_code(core: BrokerCore, version: int) -> None:
    """A version-1 peer (the zproto C codec) and every peer below 5 get the plain INVALID as before."""
    for frame in (encode(Attach(stream="nope", version=version)), b"\xaa\xa5\x63"):
        core.receive(b"old", frame, now=0.0)
        [answer] = [decode(out.frame) for out in core.pump(now=0.0)]
        assert isinstance(answer, Invalid) and not isinstance(answer, InvalidCode)


def test_a_version_the_broker_does_not_speak_is_refused_with_a_code(core: BrokerCore) -> None:
    core.receive(b"future", encode(Attach(stream="prices", version=9)), now=0.0)
    [answer] = [decode(out.frame) for out in core.pump(now=0.0)]
    assert isinstance(answer, InvalidCode) and answer.code == Refusal.VERSION_UNSUPPORTED
    session = ClientSession("prices")
    session.attach()
    [again] = session.receive(encode(answer))
    assert decode(again) == Attach(stream="prices", version=6)  # one version down, decided on the code


def test_a_broker_from_before_codes_is_negotiated_by_its_exact_messages() -> None:
    """An older broker answers ATTACH of 5 with plain INVALID: the client tries 4 (the newest such a
    broker may know), then below only on that broker's exact version message, and reports any
    other refusal as it is, even one naming a stream "version"."""
    session = ClientSession("version-feed")
    session.attach()
    [again] = session.receive(encode(Invalid(reason="ATTACH version 5 is not supported (use one of 1, 2, 3)")))
    assert decode(again) == Attach(stream="version-feed", version=4)
    [again] = session.receive(encode(Invalid(reason="ATTACH version 4 is not supported (use one of 1, 2, 3)")))
    assert decode(again) == Attach(stream="version-feed", version=3)
    refusal = "stream 'version-feed' is not served by this broker"
    assert session.receive(encode(Invalid(reason=refusal))) == []
    assert session.refused == refusal and session.refused_code is None and session.version == 3


def test_a_plain_invalid_to_an_attached_version_5_peering_means_attach_again() -> None:
    """Only a broker that does not know us (it expired our session, or restarted) sends plain INVALID
    to a version 5 peering; below 5 the old broker's exact message says it, and nothing else does."""
    session = ClientSession("prices")
    session.attach()
    session.receive(encode(AttachOk()))
    session.receive(encode(Invalid(reason="anything at all")))
    assert session.forgotten
    old = ClientSession("prices")
    old.version = 4
    old.attach()
    old.receive(encode(AttachOk()))
    old.receive(encode(Invalid(reason="pattern 'x when await attach' is refused")))
    assert not old.forgotten and list(old.errors) == ["pattern 'x when await attach' is refused"]
    old.receive(encode(Invalid(reason="PUBLISH is not allowed when await attach")))
    assert old.forgotten

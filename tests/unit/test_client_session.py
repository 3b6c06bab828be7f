"""The client's socket-free protocol state (``ClientSession``): credit grants, confirmation
barriers, and what a re-attach resends and resumes. Frames in, frames out; no socket, no sleep."""

from __future__ import annotations

from zeps.client.session import ClientSession, Seq
from zeps.protocol import AttachOk, Credit, Deliver, Ping, PingOk, Publish, Subscribe, decode, encode


def _attached(**kwargs: int) -> ClientSession:
    session = ClientSession("prices", **kwargs)
    session.attach()
    assert session.receive(encode(AttachOk())) == []  # nothing to resume or resend yet
    return session


def test_credit_is_granted_back_after_half_the_window_is_consumed() -> None:
    session = _attached(credit_window=1000)
    frames = session.subscribe("", Seq(0))
    assert [decode(f) for f in frames] == [Subscribe(pattern="", latest=0), Credit(credit=1000)]
    deliver = encode(Deliver(sequence=1, key="k", body=b"x" * 200))
    assert session.receive(deliver) == []  # about 215 bytes consumed: under half
    session.receive(encode(Deliver(sequence=2, key="k", body=b"x" * 200)))
    [grant] = [decode(f) for f in session.receive(encode(Deliver(sequence=3, key="k", body=b"x" * 200)))]
    assert isinstance(grant, Credit) and 500 <= grant.credit <= 700  # what was consumed, given back
    assert [row[0] for row in session.take(10)] == [1, 2, 3]


def test_a_ping_ok_confirms_the_publishes_before_its_ping() -> None:
    session = _attached(confirm_every=1000)
    session.publish("k", b"1")
    session.publish("k", b"2")
    [barrier] = session.confirm()
    assert decode(barrier) == Ping() and session.unconfirmed == 2
    session.publish("k", b"3")  # after the barrier: not covered by its PING-OK
    session.receive(encode(PingOk()))
    assert session.unconfirmed == 1


def test_a_reattach_resumes_after_the_last_delivery_and_resends_what_is_unconfirmed() -> None:
    session = _attached()
    session.subscribe("eu.", "latest")
    for sequence in (7, 8, 9):
        session.receive(encode(Deliver(sequence=sequence, key="eu.fr", body=b"v")))
    session.publish("eu.fr", b"unconfirmed")
    session.disconnected()  # the transport dropped
    assert not session.attached and session.publish("eu.de", b"while away") == []  # kept, sent on re-attach
    session.attach()
    frames = [decode(f) for f in session.receive(encode(AttachOk()))]
    assert frames[0] == Subscribe(pattern="eu.", latest=9)  # nothing delivered is asked for again
    assert isinstance(frames[1], Credit)
    assert frames[2:4] == [Publish(key="eu.fr", body=b"unconfirmed"), Publish(key="eu.de", body=b"while away")]
    assert frames[4] == Ping()  # a barrier for the resent publishes
    session.receive(encode(PingOk()))
    assert session.unconfirmed == 0

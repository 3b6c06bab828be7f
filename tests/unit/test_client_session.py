"""The client's socket-free protocol state (``ClientSession``): credit grants, confirmation
barriers, and what a re-attach resends and resumes. Frames in, frames out; no socket, no sleep."""

from __future__ import annotations

import pytest

from zeps._records import encode_record
from zeps.client.publishing import Unconfirmed
from zeps.client.session import ClientSession, Seq
from zeps.errors import ConfigError, LocalProtocolError, MessageTooLargeError, ProducerError, PublishRefusedError
from zeps.protocol import (
    Attach,
    AttachOk,
    Credit,
    Deliver,
    Fetch,
    FetchEnd,
    Invalid,
    InvalidCode,
    Ping,
    PingOk,
    Produce,
    ProduceOk,
    Publish,
    PublishBatch,
    PublishBatchSeq,
    PublishSeq,
    Refusal,
    Subscribe,
    decode,
    encode,
    encode_deliver_batch,
)


def _attached(**kwargs: int) -> ClientSession:
    """A session of plain (at-least-once) publishes, attached."""
    session = ClientSession("prices", idempotent=False, **kwargs)  # type: ignore[arg-type]
    session.attach()
    assert session.receive(encode(AttachOk())) == []  # nothing to resume or resend yet
    return session


def _producing(producer: str | None = None, held: int = 0, epoch: int = 1) -> ClientSession:
    """An idempotent producer's session, attached with the newest version (7), its producer claimed (PRODUCE-OK).
    A named producer claims at attach; a random one at its first publish (here: ``k``/``first``)."""
    session = ClientSession("prices", producer=producer)
    assert decode(session.attach()) == Attach(stream="prices", version=7)
    frames = [decode(f) for f in session.receive(encode(AttachOk()))]
    if producer is None:
        assert frames == [] and session.ready
        frames = [decode(f) for f in session.publish("k", b"first")]
        assert frames[1:] == [PublishSeq(sequence=1, key="k", body=b"first")]
    [produce] = frames[:1]
    assert (
        isinstance(produce, Produce)
        and produce.epoch == 0
        and session.producer is not None
        and produce.producer == session.producer.name
    )
    assert session.ready == (producer is None)  # a named one waits to know where its sequence goes on
    assert session.receive(encode(ProduceOk(epoch=epoch, sequence=held))) == []
    assert session.ready
    return session


def test_credit_goes_back_as_the_application_takes_half_the_window() -> None:
    """Credit is returned when the application takes deliveries, never when they merely arrive: a
    consumer that stops taking holds at most its window, and the broker stops sending."""
    session = _attached(credit_window=3000, max_message_bytes=400)
    frames = session.subscribe("", Seq(0))
    assert [decode(f) for f in frames] == [Subscribe(pattern="", latest=0), Credit(credit=3000)]
    for sequence in range(1, 8):
        assert session.receive(encode(Deliver(sequence=sequence, key="k", body=b"x" * 400))) == []
    assert session.outbox == [] and 2900 <= session.inbox.held_bytes <= 3000  # arrived, not taken: no credit back
    assert [row[0] for row in session.inbox.take(3)] == [1, 2, 3]
    assert session.take_outbox() == []  # about 1,250 bytes taken: under half the window
    assert session.inbox.take_one()[0] == 4
    [grant] = [decode(f) for f in session.take_outbox()]
    assert isinstance(grant, Credit) and 1500 <= grant.credit <= 1700  # what was taken, given back
    assert [row[0] for row in session.inbox.take(10)] == [5, 6, 7] and session.inbox.held_bytes == 0


def test_a_window_under_twice_the_largest_delivery_gives_credit_back_sooner() -> None:
    """The broker stops when the next record does not fit what credit it has left, so that is under
    one delivery. A window under twice the largest delivery gives back what was taken once the
    window less the largest delivery is (here: every take): with half the window as the mark, a
    first record just under half of it was never given back, and the broker waited for ever
    (tests/integration/test_stream.py shows it with a real broker)."""
    session = _attached(credit_window=1000 + 1024, max_message_bytes=1000)
    session.subscribe("", Seq(0))
    session.take_outbox()
    assert session.receive(encode(Deliver(sequence=1, key="k", body=b"x" * 900))) == []
    assert session.inbox.take_one()[0] == 1
    [grant] = [decode(f) for f in session.take_outbox()]
    assert isinstance(grant, Credit) and 900 < grant.credit < 1012  # under half the window, given back


def test_a_re_attach_grants_the_window_less_what_the_inbox_still_holds() -> None:
    session = _attached(credit_window=2000, max_message_bytes=500)
    session.subscribe("", Seq(0))
    session.receive(encode(Deliver(sequence=1, key="k", body=b"x" * 400)))
    held = session.inbox.held_bytes
    session.disconnected()
    session.attach()
    frames = [decode(f) for f in session.receive(encode(AttachOk()))]
    assert frames == [Subscribe(pattern="", latest=1), Credit(credit=2000 - held)]


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


def test_an_idempotent_producer_numbers_its_publishes_from_where_the_broker_says_it_stopped() -> None:
    session = _producing("orders-0", held=41)
    assert session.producer_sequence == 41  # a restarted publisher skips its first 41 items
    assert [decode(f) for f in session.publish("k", b"a")] == [PublishSeq(sequence=42, key="k", body=b"a")]
    [batch] = [decode(f) for f in session.publish_many([("k", b"b"), ("k", b"c")])]
    assert isinstance(batch, PublishBatchSeq) and batch.sequence == 43 and batch.items == (("k", b"b"), ("k", b"c"))
    assert session.producer_sequence == 41  # not confirmed yet
    assert [decode(f) for f in session.confirm()] == [Ping()]
    session.receive(encode(PingOk()))
    assert session.producer_sequence == 44


def test_a_key_publish_cannot_carry_is_refused_before_it_takes_a_producer_sequence() -> None:
    """Else the sequence it took is never sent, and the producer's numbering has a gap."""
    session = _producing("orders-0", held=41)
    with pytest.raises(LocalProtocolError, match="printable ASCII"):
        session.publish("a b", b"x")
    with pytest.raises(LocalProtocolError, match="at most 255"):
        session.publish_many([("k", b"ok"), ("k" * 300, b"x")])
    assert [decode(f) for f in session.publish("k", b"a")] == [PublishSeq(sequence=42, key="k", body=b"a")]
    assert session.publish_frames == 1


def test_batchable_says_whether_a_publish_may_wait_for_a_publish_batch() -> None:
    """A lingering client holds a publish only where a PUBLISH-BATCH can carry it; a body over the
    limit still fails the call."""
    session = _producing("orders-0", held=41)
    assert session.batchable("k", b"x") and not session.batchable("a b", b"x")
    with pytest.raises(MessageTooLargeError):
        session.batchable("k", bytes(session.max_message_bytes + 1))
    named = ClientSession("prices", producer="orders-1")
    named.attach()
    named.receive(encode(AttachOk()))
    assert not named.batchable("k", b"x")  # its numbering is not known before PRODUCE-OK
    assert not ClientSession("prices").batchable("k", b"x")  # detached


def test_a_reattach_resumes_the_producer_s_epoch_and_resends_with_the_same_sequences() -> None:
    session = _producing(epoch=3)  # published "first" as sequence 1
    session.publish("k", b"2")
    session.disconnected()
    session.publish("k", b"3")  # while away: numbered, kept
    session.attach()
    frames = [decode(f) for f in session.receive(encode(AttachOk()))]
    assert frames == [Produce(producer=session.producer.name if session.producer else "", epoch=3),
                      *(PublishSeq(sequence=n, key="k", body=b) for n, b in ((1, b"first"), (2, b"2"), (3, b"3"))),
                      Ping()]  # fmt: skip


def test_a_client_that_only_subscribes_never_claims_a_producer() -> None:
    """A random producer name is claimed at the first publish: subscribers (the Spark source's readers,
    a `zeps stream replay`) leave nothing in the broker's producer table."""
    session = ClientSession("prices")
    session.attach()
    assert session.receive(encode(AttachOk())) == [] and session.ready
    frames = [decode(f) for f in session.subscribe("", "earliest")]
    session.disconnected()
    session.attach()
    again = [decode(f) for f in session.receive(encode(AttachOk()))]
    assert not any(isinstance(f, Produce) for f in frames + again)


def test_a_broker_older_than_version_6_gets_plain_publishes() -> None:
    session = _producing()
    session.publish_many([("k", b"1"), ("k", b"2")])
    session.disconnected()
    session.attach()
    # the broker restarted as an older version: refused 7 and 6 with a code, then attached with 5
    [again] = session.receive(encode(InvalidCode(code=Refusal.VERSION_UNSUPPORTED, reason="no 7")))
    assert decode(again) == Attach(stream="prices", version=6)
    [again] = session.receive(encode(InvalidCode(code=Refusal.VERSION_UNSUPPORTED, reason="no 6")))
    assert decode(again) == Attach(stream="prices", version=5)
    frames = [decode(f) for f in session.receive(encode(AttachOk()))]
    assert frames[0] == Publish(key="k", body=b"first")  # no PRODUCE, no sequences
    assert isinstance(frames[1], PublishBatch)
    assert frames[1].items == (("k", b"1"), ("k", b"2")) and frames[2] == Ping()
    assert decode(session.publish("k", b"3")[0]) == Publish(key="k", body=b"3")


def test_a_named_producer_is_refused_by_an_older_broker_with_the_fix() -> None:
    session = ClientSession("prices", producer="orders-0")
    session.attach()
    session.receive(encode(InvalidCode(code=Refusal.VERSION_UNSUPPORTED, reason="no 7")))
    session.receive(encode(InvalidCode(code=Refusal.VERSION_UNSUPPORTED, reason="no 6")))
    session.receive(encode(AttachOk()))
    assert session.ready
    with pytest.raises(
        ProducerError, match=r"without idempotent producers \(version 6\): publish without producer_id="
    ):
        session.publish("k", b"1")


def test_plain_invalids_for_frames_sent_before_a_not_leader_do_not_make_the_client_downgrade() -> None:
    """A replica that stops leading forgets its clients (NOT_LEADER) and answers the publishes and
    PINGs they sent before they knew with plain INVALIDs ("not attached"). Those answer nothing of the
    next attach: before, a client that was not attached took one for an older broker's refusal of its
    ATTACH and went down to version 4, and its idempotent producer failed for good (found by the
    replication simulation)."""
    session = _producing("orders-0")
    session.publish("k", b"1")
    session.receive(encode(InvalidCode(code=Refusal.NOT_LEADER, reason="no longer leads")))
    assert session.forgotten and not session.attached
    assert session.receive(encode(Invalid(reason="PUBLISH-SEQ is not allowed in state START"))) == []
    session.disconnected()
    assert decode(session.attach()) == Attach(stream="prices", version=7)
    frames = [decode(f) for f in session.receive(encode(AttachOk()))]
    assert isinstance(frames[0], Produce)  # the producer is claimed again, with the same version


def test_plain_invalids_after_a_revoked_key_do_not_make_the_client_downgrade() -> None:
    """A broker that revokes a client's key (UNAUTHORIZED) forgets its session, and answers the frames
    sent before the client knew with plain INVALIDs. A client whose key was rotated attaches again
    with the new one: before, those INVALIDs made it take the broker for one older than version 5,
    and its idempotent producer failed ("the broker speaks ZEPS version 4")."""
    session = _producing("orders-0")
    session.publish("k", b"1")
    session.receive(encode(InvalidCode(code=Refusal.UNAUTHORIZED, reason="this client's CURVE key was revoked")))
    assert session.refused and not session.attached
    assert session.receive(encode(Invalid(reason="PUBLISH-SEQ is not allowed in state START"))) == []
    session.refused = None  # the client found a renewed certificate (zeps.client._transport.CurveTrust)
    session.disconnected()
    assert decode(session.attach()) == Attach(stream="prices", version=7)


def test_a_fenced_producer_raises_and_its_refused_publishes_stay_unconfirmed() -> None:
    session = _producing("orders-0")
    session.publish("k", b"1")
    session.confirm()
    session.receive(encode(InvalidCode(code=Refusal.FENCED, reason="producer 'orders-0' epoch 1 is fenced")))
    session.receive(encode(PingOk()))
    assert session.unconfirmed == 1  # the PING-OK does not confirm what the broker refused
    with pytest.raises(
        ProducerError, match="broker refused producer 'orders-0': producer 'orders-0' epoch 1 is fenced"
    ):
        session.publish("k", b"2")


@pytest.mark.parametrize("producer", ["", "has space", "x" * 256, "caf\u00e9"])
def test_a_bad_producer_name_names_the_field(producer: str) -> None:
    with pytest.raises(ConfigError, match=r"producer_id=.*printable ASCII"):
        ClientSession("prices", producer=producer)
    with pytest.raises(ConfigError, match="leave idempotent=True"):
        ClientSession("prices", producer="ok", idempotent=False)


def _run_frame(first: int, last: int) -> bytes:
    return encode_deliver_batch(b"".join(encode_record(s, 0, b"k", b"%d" % s) for s in range(first, last + 1)))


def test_a_fetch_open_when_the_peering_drops_goes_on_after_what_it_delivered() -> None:
    session = _attached(credit_window=2000, max_message_bytes=500)
    frames = [decode(f) for f in session.fetch(Fetch(pattern="", first=1, last=10))]
    assert frames == [Fetch(pattern="", first=1, last=10), Credit(credit=2000)]
    session.receive(_run_frame(1, 4))
    session.disconnected()
    session.attach()
    again = [decode(f) for f in session.receive(encode(AttachOk()))]
    held = session.inbox.held_bytes  # 1..4, not taken yet: their credit stays with them
    assert again == [Fetch(pattern="", first=5, last=10), Credit(credit=2000 - held)]  # after what came
    session.receive(_run_frame(4, 10))  # 4 again (sent before the drop): kept once
    session.receive(encode(FetchEnd(first=5, last=10)))
    assert [row[0] for row in session.inbox.take(100)] == list(range(1, 11))
    assert list(session.fetch_ends) == [(1, 10)]  # reported as asked: 1..4 came before the drop


def test_a_peering_fetches_or_subscribes_never_both() -> None:
    fetching = _attached()
    fetching.fetch(Fetch(pattern="", first=1))
    with pytest.raises(LocalProtocolError, match="one fetch at a time"):
        fetching.fetch(Fetch(pattern="", first=1))
    with pytest.raises(LocalProtocolError, match="cannot subscribe"):
        fetching.subscribe("", Seq(0))
    subscribing = _attached()
    subscribing.subscribe("", Seq(0))
    with pytest.raises(LocalProtocolError, match="cannot fetch"):
        subscribing.fetch(Fetch(pattern="", first=1))


def test_a_full_journal_is_raised_once_and_the_client_attaches_again_only_then() -> None:
    """JOURNAL_FULL: publishes stay unconfirmed (a PING-OK after it confirms nothing); the broker forgot
    the peering, but the client does not attach again by itself (each attach resends everything: a
    loop while the volume stays full) until check_publishes has told the application."""
    session = _attached()
    session.publish("k", b"1")
    session.receive(
        encode(InvalidCode(code=Refusal.JOURNAL_FULL, reason="stream prices: its journal's volume is full"))
    )
    session.receive(encode(PingOk()))
    assert session.unconfirmed == 1, "refused publishes stay unconfirmed"
    session.receive(encode(Invalid(reason="PUBLISH is not allowed when await attach")))  # it forgot us
    assert not session.forgotten, "no attach until the application has seen the refusal"
    with pytest.raises(PublishRefusedError, match="volume is full"):
        session.check_publishes()
    assert session.forgotten, "now the client attaches again, and resends"
    session.check_publishes()  # raised once


@pytest.mark.parametrize("code", [Refusal.NOT_ENOUGH_REPLICAS, Refusal.JOURNAL_FULL])
def test_a_client_with_nothing_unconfirmed_that_the_broker_forgot_attaches_again_at_once(code: int) -> None:
    """A leader left with fewer in-sync replicas than minInSync forgets every peering whose
    confirmation it holds, a subscriber's PING-OK too, and tells it NOT_ENOUGH_REPLICAS. A client
    with nothing unconfirmed has no publishes to be told about (and a subscriber never calls
    check_publishes): it attaches again at once and resumes after its last delivery. Before, it
    waited for check_publishes, and the broker's "not attached" answers to its PINGs kept it from
    timing out: its subscription stalled for good (found on kind: three subscribers stuck at one
    sequence after a node's loss)."""
    session = _attached()
    session.subscribe("", Seq(0))
    session.receive(encode_deliver_batch(encode_record(1, 0, b"k", b"a")))
    session.receive(encode(InvalidCode(code=code, reason="fewer replicas than minInSync are in sync")))
    assert session.forgotten and not session.attached and session.publish_refused is None
    session.disconnected()
    session.attach()
    frames = [decode(f) for f in session.receive(encode(AttachOk()))]
    assert Subscribe(pattern="", latest=1) in frames, frames


def test_a_client_with_publishes_unconfirmed_waits_for_check_publishes_to_attach_again() -> None:
    """With publishes unconfirmed, NOT_ENOUGH_REPLICAS is the application's to hear first
    (check_publishes raises it once), then the client attaches again and resends them."""
    session = _attached()
    session.publish("k", b"1")
    session.receive(encode(InvalidCode(code=Refusal.NOT_ENOUGH_REPLICAS, reason="too few in sync")))
    assert session.attached and not session.forgotten
    with pytest.raises(PublishRefusedError, match="too few in sync"):
        session.check_publishes()
    assert session.forgotten


def test_a_reader_of_followers_attaches_with_version_8_and_never_publishes() -> None:
    session = ClientSession("prices", reads_only=True)
    assert decode(session.attach()) == Attach(stream="prices", version=8)
    session.receive(encode(AttachOk()))
    with pytest.raises(ConfigError, match="follower_reads"):
        session.publish("k", b"x")
    with pytest.raises(ConfigError, match="follower_reads"):
        session.publish_many([("k", b"x")])
    assert decode(session.subscribe("", "earliest")[0]) == Subscribe(pattern="", latest=0)


def test_a_barrier_confirms_exactly_the_publishes_before_it() -> None:
    """Two PINGs out: the first PING-OK confirms what went before the first only, the second the rest;
    a dropped peering loses the barriers (no PING-OK will come) and keeps every frame for the resend."""
    kept = Unconfirmed(every=3)
    assert kept.add(b"a", 1) is False and kept.add(b"b", 1) is False
    kept.barrier()
    assert kept.add(b"batch", 5) is True  # 5 since the barrier: another is due
    kept.barrier()
    kept.confirmed()
    assert [frame for frame, _ in kept.frames] == [b"batch"] and kept.messages == 5
    kept.add(b"c", 1)
    kept.disconnected()
    kept.confirmed()  # a late answer from the dropped peering: no barrier is out, nothing is dropped
    assert [frame for frame, _ in kept.frames] == [b"batch", b"c"] and kept.messages == 6

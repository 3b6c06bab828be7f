"""ZEPS codec and state machine: byte-exact with the ZEPS ABNF grammar, robust to any input."""

from __future__ import annotations

import contextlib
import struct

import crc32c
import pytest
from hypothesis import given
from hypothesis import strategies as st

from zeps._records import encode_record
from zeps.errors import LocalProtocolError, RemoteProtocolError
from zeps.protocol import (
    LATEST,
    Attach,
    AttachOk,
    Command,
    Connection,
    Credit,
    Deliver,
    DeliverBatch,
    DeliverRun,
    DeliverTs,
    Detach,
    DetachOk,
    Invalid,
    Ping,
    PingOk,
    Produce,
    ProduceOk,
    Publish,
    PublishBatch,
    PublishBatchSeq,
    PublishSeq,
    ReplicaData,
    ReplicaEpoch,
    ReplicaEpochEnd,
    ReplicaFetch,
    Subscribe,
    SubscribeOk,
    SubscribeTime,
    decode,
    deliver_size,
    encode,
    encode_deliver,
    encode_deliver_batch,
    encode_deliver_run,
    encode_publish_batch,
    encode_publish_seq,
)

SIG = b"\xaa\xa5"


def s(text: str) -> bytes:  # string = number-1 *VCHAR
    return bytes([len(text)]) + text.encode()


def chunk(data: bytes) -> bytes:  # chunk = number-4 *OCTET
    return struct.pack("!I", len(data)) + data


_RUN_CRC = crc32c.crc32c(encode_record(7, 9, b"k", b"v"), crc32c.crc32c(b"\0\0\0\0"))  # index then records


# Frames written out from the ABNF by hand, field by field.
GOLDEN = [
    (Attach(stream="prices"), SIG + b"\x01" + s("ZEPS") + b"\x00\x01" + s("prices")),
    (AttachOk(), SIG + b"\x02"),
    (Subscribe(pattern="eu.", latest=1000), SIG + b"\x03" + s("eu.") + struct.pack("!Q", 1000)),
    (SubscribeOk(), SIG + b"\x04"),
    (Credit(credit=1 << 20), SIG + b"\x05" + struct.pack("!Q", 1 << 20)),
    (Publish(key="eu.fr.cac40", body=b"7345.2"), SIG + b"\x06" + s("eu.fr.cac40") + chunk(b"7345.2")),
    (Deliver(sequence=42, key="k", body=b""), SIG + b"\x07" + struct.pack("!Q", 42) + s("k") + chunk(b"")),
    (Ping(), SIG + b"\x08"),
    (PingOk(), SIG + b"\x09"),
    (Detach(), SIG + b"\x0a"),
    (DetachOk(), SIG + b"\x0b"),
    (Invalid(reason="bad pattern"), SIG + b"\x0c" + s("bad pattern")),
    (SubscribeTime(pattern="", since=1_700_000_000_000), SIG + b"\x0d" + s("") + struct.pack("!Q", 1_700_000_000_000)),
    (
        DeliverTs(sequence=1, timestamp=2, key="a", body=b"x"),
        SIG + b"\x0e" + struct.pack("!QQ", 1, 2) + s("a") + chunk(b"x"),
    ),
    (
        PublishBatch(entries=s("a") + chunk(b"1") + s("bc") + chunk(b"")),
        SIG + b"\x0f" + chunk(s("a") + chunk(b"1") + s("bc") + chunk(b"")),
    ),
    (DeliverBatch(records=encode_record(7, 9, b"k", b"v")), SIG + b"\x10" + chunk(encode_record(7, 9, b"k", b"v"))),
    (
        DeliverRun(crc=_RUN_CRC, index=b"\0\0\0\0", records=encode_record(7, 9, b"k", b"v")),
        SIG + b"\x11" + struct.pack("!I", _RUN_CRC) + chunk(b"\0\0\0\0") + chunk(encode_record(7, 9, b"k", b"v")),
    ),
    (Produce(producer="orders-0", epoch=3, generation=7), SIG + b"\x13" + s("orders-0") + struct.pack("!IQ", 3, 7)),
    (ProduceOk(epoch=4, sequence=500, base=450), SIG + b"\x14" + struct.pack("!IQQ", 4, 500, 450)),
    (PublishSeq(sequence=9, key="k", body=b"v"), SIG + b"\x15" + struct.pack("!Q", 9) + s("k") + chunk(b"v")),
    (
        PublishBatchSeq(sequence=501, entries=s("a") + chunk(b"1") + s("bc") + chunk(b"")),
        SIG + b"\x16" + struct.pack("!Q", 501) + chunk(s("a") + chunk(b"1") + s("bc") + chunk(b"")),
    ),
]


def test_a_journal_record_is_laid_out_as_documented() -> None:
    body = struct.pack("!QQ", 7, 9) + s("k") + b"v"
    import crc32c  # noqa: PLC0415

    assert encode_record(7, 9, b"k", b"v") == struct.pack("!II", len(body) + 4, crc32c.crc32c(body)) + body


@pytest.mark.parametrize(("command", "frame"), GOLDEN, ids=[c.NAME for c, _ in GOLDEN])
def test_frames_match_the_grammar_byte_for_byte(command: Command, frame: bytes) -> None:
    assert encode(command) == frame
    assert decode(frame) == command


def test_the_run_encoder_computes_the_crc_the_grammar_asks_for() -> None:
    golden = next(frame for command, frame in GOLDEN if isinstance(command, DeliverRun))
    assert encode_deliver_run(encode_record(7, 9, b"k", b"v"), b"\0\0\0\0") == golden


def test_deliver_size_is_the_wire_size() -> None:
    d = Deliver(sequence=9, key="eu.fr", body=b"x" * 100)
    assert deliver_size(9, "eu.fr", 100, timestamps=False) == len(encode(d))
    t = DeliverTs(sequence=9, timestamp=1, key="eu.fr", body=b"x" * 100)
    assert deliver_size(9, "eu.fr", 100, timestamps=True) == len(encode(t))


vchar = st.text(alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E), max_size=40)
printable = st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=60)
u64 = st.integers(min_value=0, max_value=LATEST)
commands = st.one_of(
    st.builds(Attach, stream=vchar, version=st.integers(0, 0xFFFF)),
    st.builds(Subscribe, pattern=vchar, latest=u64),
    st.builds(Credit, credit=u64),
    st.builds(Publish, key=vchar, body=st.binary(max_size=300)),
    st.builds(Deliver, sequence=u64, key=vchar, body=st.binary(max_size=300)),
    st.builds(Invalid, reason=printable),
    st.builds(SubscribeTime, pattern=vchar, since=u64),
    st.builds(DeliverTs, sequence=u64, timestamp=u64, key=vchar, body=st.binary(max_size=100)),
    st.lists(st.tuples(vchar, st.binary(max_size=50)), min_size=1, max_size=5).map(
        lambda items: decode(encode_publish_batch(items))
    ),
    st.lists(st.tuples(u64, vchar, st.binary(max_size=50)), min_size=1, max_size=5).map(
        lambda items: decode(
            encode_deliver_batch(
                b"".join(encode_record(n, ts, key.encode(), body) for n, (ts, key, body) in enumerate(items))
            )
        )
    ),
    st.lists(st.tuples(u64, vchar, st.binary(max_size=50)), min_size=1, max_size=5).map(
        lambda items: decode(
            encode_deliver_run(
                b"".join(encode_record(n, ts, key.encode(), body) for n, (ts, key, body) in enumerate(items)),
                b"".join(
                    struct.pack("!I", sum(len(key) + len(body) + 25 for _, key, body in items[:i]))
                    for i in range(len(items))
                ),
            )
        )
    ),
    st.sampled_from([AttachOk(), SubscribeOk(), Ping(), PingOk(), Detach(), DetachOk()]),
    st.builds(Produce, producer=vchar, epoch=st.integers(0, 0xFFFFFFFF), generation=u64),
    st.builds(ProduceOk, epoch=st.integers(0, 0xFFFFFFFF), sequence=u64, base=u64),
    st.builds(PublishSeq, sequence=u64, key=vchar, body=st.binary(max_size=300)),
    st.builds(
        lambda seq, items: decode(encode_publish_batch(items, seq)),
        u64,
        st.lists(st.tuples(vchar, st.binary(max_size=50)), min_size=1, max_size=5),
    ),
)


@given(u64, u64, vchar, st.binary(max_size=200))
def test_fast_deliver_encoder_matches_the_generic_codec(seq: int, ts: int, key: str, body: bytes) -> None:
    assert encode_deliver(seq, key, body) == encode(Deliver(sequence=seq, key=key, body=body))
    assert encode_deliver(seq, key, body, ts) == encode(DeliverTs(sequence=seq, timestamp=ts, key=key, body=body))


@given(u64, vchar, st.binary(max_size=200))
def test_fast_publish_encoders_match_the_generic_codec(seq: int, key: str, body: bytes) -> None:
    assert encode_publish_seq(seq, key, body) == encode(PublishSeq(sequence=seq, key=key, body=body))
    batch = encode_publish_batch([(key, body), ("k", b"")], seq)
    assert batch == encode(PublishBatchSeq(sequence=seq, entries=encode_publish_batch([(key, body), ("k", b"")])[7:]))


@given(commands)
def test_round_trip(command: Command) -> None:
    assert decode(encode(command)) == command


@given(commands, st.data())
def test_mutated_frames_decode_or_raise_remote_protocol_error(command: Command, data: st.DataObject) -> None:
    frame = bytearray(encode(command))
    for _ in range(data.draw(st.integers(1, 4))):
        action = data.draw(st.sampled_from(["flip", "cut", "grow"]))
        if action == "flip" and frame:
            i = data.draw(st.integers(0, len(frame) - 1))
            frame[i] ^= data.draw(st.integers(1, 255))
        elif action == "cut":
            del frame[data.draw(st.integers(0, len(frame))) :]
        else:
            frame += data.draw(st.binary(min_size=1, max_size=8))
    with contextlib.suppress(RemoteProtocolError):  # the only acceptable failure
        decode(bytes(frame))


@given(st.binary(max_size=64))
def test_any_bytes_decode_or_raise_remote_protocol_error(frame: bytes) -> None:
    with contextlib.suppress(RemoteProtocolError):
        decode(frame)


@pytest.mark.parametrize(
    ("command", "reason"),
    [
        (Publish(key="has space", body=b""), "printable ASCII without spaces"),
        (Publish(key="x" * 256, body=b""), "at most 255"),
        (Credit(credit=-1), "does not fit number-8"),
        (Attach(stream="s", version=70000), "does not fit number-2"),
        (Invalid(reason="tab\there"), "printable ASCII"),
    ],
)
def test_we_cannot_send_what_the_grammar_cannot_express(command: Command, reason: str) -> None:
    with pytest.raises(LocalProtocolError, match=reason):
        encode(command)


@pytest.mark.parametrize(
    ("frame", "reason"),
    [
        (b"\xaa", "too short"),
        (b"\xab\xa5\x08", "bad signature"),
        (SIG + b"\x63", "unknown command id 99"),
        (SIG + b"\x06\x05ab", "claims 5 bytes"),
        (SIG + b"\x08extra", "bytes after its last field"),
        (SIG + b"\x06\x02a b\x00\x00\x00\x00", "not printable"),
    ],
)
def test_malformed_frames_say_why(frame: bytes, reason: str) -> None:
    with pytest.raises(RemoteProtocolError, match=reason):
        decode(frame)


def test_a_full_conversation_both_sides() -> None:
    client, broker = Connection("client"), Connection("broker")
    for sender, receiver, command in [
        (client, broker, Attach(stream="prices", version=2)),
        (broker, client, AttachOk()),
        (client, broker, SubscribeTime(pattern="eu.", since=0)),
        (broker, client, SubscribeOk()),
        (client, broker, Credit(credit=100)),
        (client, broker, Publish(key="eu.fr", body=b"1")),
        (broker, client, DeliverTs(sequence=1, timestamp=5, key="eu.fr", body=b"1")),
        (broker, client, Ping()),
        (client, broker, PingOk()),
        (client, broker, Detach()),
        (broker, client, DetachOk()),
    ]:
        assert receiver.receive(sender.send(command)) == command
    assert client.state == broker.state == "CLOSED"


def test_order_is_enforced_both_ways() -> None:
    broker = Connection("broker")
    with pytest.raises(RemoteProtocolError, match="SUBSCRIBE is not allowed when await attach"):
        broker.receive(encode(Subscribe(pattern="")))
    client = Connection("client")
    with pytest.raises(LocalProtocolError, match="PUBLISH is not allowed when await attach"):
        client.send(Publish(key="k", body=b""))
    client.send(Attach(stream="s"))
    with pytest.raises(RemoteProtocolError, match="DELIVER is not allowed when attaching"):
        client.receive(encode(Deliver(sequence=1, key="k", body=b"")))


def test_version_2_commands_need_version_2() -> None:
    broker = Connection("broker")
    broker.receive(encode(Attach(stream="s", version=1)))
    broker.send(AttachOk())
    with pytest.raises(RemoteProtocolError, match="needs protocol version 2"):
        broker.receive(encode(SubscribeTime(pattern="", since=0)))
    with pytest.raises(LocalProtocolError, match="needs protocol version 2"):
        broker.send(DeliverTs(sequence=1, timestamp=1, key="k", body=b""))


def test_version_3_batches_need_version_3() -> None:
    broker = Connection("broker")
    broker.receive(encode(Attach(stream="s", version=2)))
    broker.send(AttachOk())
    with pytest.raises(RemoteProtocolError, match="needs protocol version 3"):
        broker.receive(encode_publish_batch([("k", b"")]))
    with pytest.raises(LocalProtocolError, match="needs protocol version 3"):
        broker.send(DeliverBatch(records=encode_record(1, 1, b"k", b"")))


def test_version_6_producers_need_version_6() -> None:
    """An idempotent producer's commands exist only for a peering attached with 6: a version-5 peer
    (and the zproto C codec, version 1) never sees them."""
    broker = Connection("broker")
    broker.receive(encode(Attach(stream="s", version=5)))
    broker.send(AttachOk())
    for frame in (
        encode(Produce(producer="p")),
        encode_publish_seq(1, "k", b""),
        encode_publish_batch([("k", b"")], 1),
    ):
        with pytest.raises(RemoteProtocolError, match="needs protocol version 6"):
            broker.receive(frame)
    with pytest.raises(LocalProtocolError, match="needs protocol version 6"):
        broker.send(ProduceOk(epoch=1, sequence=0))
    client, broker = Connection("client"), Connection("broker")
    for sender, receiver, command in [
        (client, broker, Attach(stream="s", version=6)),
        (broker, client, AttachOk()),
        (client, broker, Produce(producer="p", epoch=0)),
        (broker, client, ProduceOk(epoch=1, sequence=0)),
        (client, broker, PublishSeq(sequence=1, key="k", body=b"")),
    ]:
        assert receiver.receive(sender.send(command)) == command


@pytest.mark.parametrize(
    ("frame", "reason"),
    [
        (SIG + b"\x16" + struct.pack("!Q", 1) + chunk(b""), "PUBLISH-BATCH-SEQ is empty"),
        (SIG + b"\x16" + struct.pack("!Q", 1) + chunk(s("k") + b"\x00\x00\x00\x09ab"), "entry 0 body claims 9"),
        (SIG + b"\x16\x00\x00", "PUBLISH-BATCH-SEQ truncated"),
        (SIG + b"\x15" + struct.pack("!Q", 1) + s("k") + chunk(b"v") + b"x", "PUBLISH-SEQ has bytes after"),
        (SIG + b"\x15" + struct.pack("!Q", 1) + s("a b") + chunk(b"v"), "PUBLISH-SEQ.key is not printable"),
    ],
)
def test_malformed_sequenced_publishes_say_why(frame: bytes, reason: str) -> None:
    with pytest.raises(RemoteProtocolError, match=reason):
        decode(frame)


@given(st.lists(st.tuples(vchar, st.binary(max_size=200)), min_size=1, max_size=20))
def test_publish_batch_carries_exactly_its_entries(items: list[tuple[str, bytes]]) -> None:
    decoded = decode(encode_publish_batch(items))
    assert isinstance(decoded, PublishBatch) and list(decoded.items) == items


@pytest.mark.parametrize(
    ("frame", "reason"),
    [
        (SIG + b"\x0f" + chunk(b""), "PUBLISH-BATCH is empty"),
        (SIG + b"\x0f" + chunk(s("k") + b"\x00\x00\x00\x09ab"), "entry 0 body claims 9 bytes"),
        (SIG + b"\x0f" + chunk(s("k") + chunk(b"") + s("a b") + chunk(b"")), "entry 1 key is not printable"),
        (SIG + b"\x10" + chunk(encode_record(1, 1, b"k", b"v")[:-1] + b"w"), "fails its CRC32C"),
        (SIG + b"\x10" + chunk(encode_record(2, 1, b"k", b"") + encode_record(2, 1, b"k", b"")), "sequence 2"),
        (SIG + b"\x10" + chunk(encode_record(1, 1, b"k", b"v")[:-3]), "truncated"),
        (SIG + b"\x10" + chunk(encode_record(1, 1, b"key", b"body")[:-3]), "claims 28 bytes; 25 follow"),
        (SIG + b"\x10\x00\x00\x00\x09", "claims 9 bytes, 0 follow"),
    ],
)
def test_malformed_batches_say_why(frame: bytes, reason: str) -> None:
    with pytest.raises(RemoteProtocolError, match=reason):
        decode(frame)


def test_we_cannot_batch_a_key_publish_could_not_carry() -> None:
    with pytest.raises(LocalProtocolError, match="printable ASCII without spaces"):
        encode_publish_batch([("ok", b""), ("not ok", b"")])


def test_unsupported_versions_and_protocols_are_refused() -> None:
    with pytest.raises(RemoteProtocolError, match="version 9 is not supported"):
        Connection("broker").receive(encode(Attach(stream="s", version=9)))
    with pytest.raises(RemoteProtocolError, match="protocol must be 'ZEPS'"):
        Connection("broker").receive(encode(Attach(stream="s", protocol="AMQP")))


def test_replication_commands_need_version_8_and_round_trip() -> None:
    """A version 7 peering never sees (or may send) the replication extension; version 8 may."""
    fetch = ReplicaFetch(epoch=3, replica="prices-1", base=1, offset=77, last=5, durable=4, known=2)
    data = ReplicaData(epoch=3, base=1, offset=77, next=0, commit=4, epochs=b"\0" * 16, data=b"records")
    for command in (fetch, data, ReplicaEpoch(epoch=3, asked=2), ReplicaEpochEnd(epoch=3, found=2, end=9)):
        assert decode(encode(command)) == command
    old = Connection("broker")
    old.receive(encode(Attach(stream="s", version=7)))
    old.send(AttachOk())
    with pytest.raises(RemoteProtocolError, match="REPLICA-FETCH needs protocol version 8"):
        old.receive(encode(fetch))
    new = Connection("broker")
    new.receive(encode(Attach(stream="s", version=8)))
    new.send(AttachOk())
    assert new.receive(encode(fetch)) == fetch
    assert new.send(data) == encode(data)


def test_the_hot_paths_skip_the_state_machine_only_where_it_would_keep_a_session_attached() -> None:
    """The broker's and the client's one-message paths skip the state machine for PUBLISH-SEQ of an
    attached session of version 6 or later: what ``stays_attached`` reads from the rules. A command
    the rules do not keep attached (ATTACH, DETACH) gets None, so no hot path may skip it."""
    from zeps.protocol import Attach, Detach, PublishSeq, stays_attached  # noqa: PLC0415

    assert stays_attached("broker", "receive", PublishSeq) == 6
    assert stays_attached("client", "send", PublishSeq) == 6
    assert stays_attached("broker", "receive", Attach) is None
    assert stays_attached("broker", "receive", Detach) is None
    assert stays_attached("client", "receive", PublishSeq) is None  # a broker never sends one

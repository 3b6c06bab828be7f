"""Idempotent producers in the broker's socket-free core (``BrokerCore``): a publish journaled once
however often it is resent, fencing, refusals with codes, the table surviving a broker restart, and
a version-1 peer that sees none of it. The journal is real (a temporary directory); no socket."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from zeps._records import RECORD
from zeps.broker.core import BrokerConfig, BrokerCore
from zeps.journal import JournalConfig
from zeps.journal.producers import GROUP
from zeps.journal.segments import walk_segment
from zeps.protocol import (
    Attach,
    AttachOk,
    InvalidCode,
    Ping,
    PingOk,
    Produce,
    ProduceOk,
    Publish,
    PublishSeq,
    Refusal,
    decode,
    encode,
    encode_publish_batch,
    encode_publish_seq,
)


def _config(path: Path, **journal: Any) -> BrokerConfig:
    return BrokerConfig(path, ("prices",), journal=JournalConfig(fsync="always", **journal))


@pytest.fixture
def core(tmp_path: Path) -> Iterator[BrokerCore]:
    broker = BrokerCore(_config(tmp_path)).open()
    yield broker
    broker.close()


def _send(core: BrokerCore, peer: bytes, *frames: bytes | Any) -> list[Any]:
    """Frames (or commands) from ``peer``; what the broker then sends it, decoded."""
    for frame in frames:
        core.receive(peer, frame if isinstance(frame, bytes) else encode(frame), now=0.0)
    core.flush_appends()
    return [decode(out.frame) for out in core.pump(now=0.0) if out.peer == peer]


def _producer(core: BrokerCore, peer: bytes, name: str, epoch: int = 0) -> ProduceOk:
    assert _send(core, peer, Attach(stream="prices", version=6)) == [AttachOk()]
    [answer] = _send(core, peer, Produce(producer=name, epoch=epoch))
    assert isinstance(answer, ProduceOk)
    return answer


def _bodies(core: BrokerCore) -> list[bytes]:
    return [r.body for r in core.streams["prices"].journal.read(1, max_records=1000)]


def _batch(first: int, *bodies: bytes) -> bytes:
    return encode_publish_batch([("k", b) for b in bodies], first)


def test_a_resent_publish_is_journaled_once_and_still_confirmed(core: BrokerCore) -> None:
    assert _producer(core, b"a", "orders-0") == ProduceOk(epoch=1, sequence=0)
    assert _send(core, b"a", _batch(1, b"1", b"2", b"3"), Ping()) == [PingOk()]
    # the client did not see that PING-OK (the connection dropped): it resends everything since
    assert _send(core, b"a", _batch(1, b"1", b"2", b"3"), _batch(4, b"4"), Ping()) == [PingOk()]
    assert _send(core, b"a", PublishSeq(sequence=4, key="k", body=b"4"), Ping()) == [PingOk()]
    assert _bodies(core) == [b"1", b"2", b"3", b"4"]
    assert core.streams["prices"].duplicates == 4 and core.streams["prices"].messages_in == 4


def test_a_sequence_gap_is_refused_with_a_code_and_journals_nothing(core: BrokerCore) -> None:
    _producer(core, b"a", "orders-0")
    [refusal] = _send(core, b"a", _batch(5, b"x"))
    assert isinstance(refusal, InvalidCode) and refusal.code == Refusal.OUT_OF_SEQUENCE
    assert "publishes 1..4 never reached it" in refusal.reason
    assert _bodies(core) == []


def test_a_second_client_with_the_same_name_fences_the_first(core: BrokerCore) -> None:
    _producer(core, b"old", "orders-0")
    _send(core, b"old", _batch(1, b"1"))
    assert _producer(core, b"new", "orders-0") == ProduceOk(epoch=2, sequence=1)  # continues at 2
    [refusal] = _send(core, b"old", _batch(2, b"from the old one"))
    assert isinstance(refusal, InvalidCode) and refusal.code == Refusal.FENCED
    assert "a newer client claimed the name (epoch 2)" in refusal.reason
    [refusal] = _send(core, b"old", Produce(producer="orders-0", epoch=1))  # nor may it resume
    assert isinstance(refusal, InvalidCode) and refusal.code == Refusal.FENCED
    _send(core, b"new", _batch(2, b"2"))
    assert _bodies(core) == [b"1", b"2"]


def test_a_sequenced_publish_without_produce_is_refused(core: BrokerCore) -> None:
    assert _send(core, b"a", Attach(stream="prices", version=6)) == [AttachOk()]
    [refusal] = _send(core, b"a", PublishSeq(sequence=1, key="k", body=b"x"))
    assert isinstance(refusal, InvalidCode) and refusal.code == Refusal.BAD_FRAME
    assert "need a PRODUCE first" in refusal.reason and _bodies(core) == []


def test_the_table_survives_a_broker_restart(tmp_path: Path) -> None:
    core = BrokerCore(_config(tmp_path)).open()
    _producer(core, b"a", "orders-0")
    _send(core, b"a", _batch(1, b"1", b"2"))
    _producer(core, b"b", "idle")  # a claim alone is journaled as well
    core.close()  # as a SIGKILL would leave it: everything appended was written (fsync=always)
    again = BrokerCore(_config(tmp_path)).open()
    assert _producer(again, b"a2", "orders-0", epoch=1) == ProduceOk(epoch=1, sequence=2)  # the client resumes
    _send(again, b"a2", _batch(1, b"1", b"2", b"3"))
    assert _bodies(again) == [b"1", b"2", b"3"]
    assert _producer(again, b"b2", "idle", epoch=1) == ProduceOk(epoch=1, sequence=0)
    again.close()


def test_an_expired_producer_resuming_is_refused_clearly(tmp_path: Path) -> None:
    """A producer idle past its TTL in the stream's own time (a newer record's stamp) is forgotten."""
    wall = [1_000_000]
    core = BrokerCore(_config(tmp_path, producer_ttl_ms=1000), wall_ms=lambda: wall[0]).open()
    _producer(core, b"a", "orders-0")
    _send(core, b"a", _batch(1, b"1"))
    wall[0] += 5000
    _send(core, b"c", Attach(stream="prices", version=6), Publish(key="k", body=b"later"))  # the stream moves on
    core.tick(now=1.0)  # orders-0 idle past its TTL: forgotten
    [refusal] = _send(core, b"a", _batch(2, b"2"))
    assert isinstance(refusal, InvalidCode) and refusal.code == Refusal.PRODUCER_UNKNOWN
    assert "expired (idle longer than 1s)" in refusal.reason
    [refusal] = _send(core, b"b", Attach(stream="prices", version=6), Produce(producer="orders-0", epoch=1))[1:]
    assert isinstance(refusal, InvalidCode) and refusal.code == Refusal.PRODUCER_UNKNOWN
    assert _bodies(core) == [b"1", b"later"]
    core.close()


def test_a_brokers_clock_set_days_ahead_forgets_no_producer(tmp_path: Path) -> None:
    """Expiry reads the stream's time, not the broker's clock: replicas of one journal forget a
    producer at the same point of it. (With each replica's own clock, one set two days ahead forgot
    every producer; elected, it took their resent publishes for new ones: the replication simulation
    saw them committed twice.)"""
    wall = [1_000_000]
    core = BrokerCore(_config(tmp_path, producer_ttl_ms=1000), wall_ms=lambda: wall[0]).open()
    _producer(core, b"a", "orders-0")
    _send(core, b"a", _batch(1, b"1"))
    wall[0] += 2 * 86_400_000
    core.tick(now=1.0)
    assert _send(core, b"a", _batch(1, b"1"), Ping()) == [PingOk()]  # still known: the resend is dropped
    assert _bodies(core) == [b"1"]
    core.close()
    again = BrokerCore(_config(tmp_path, producer_ttl_ms=1000), wall_ms=lambda: wall[0]).open()
    assert "orders-0" in again.streams["prices"].journal.producers.producers  # nor at a restart
    again.close()


def test_a_leaders_clock_stepped_days_back_forgets_no_producer(tmp_path: Path) -> None:
    """A producer's last activity is the stream's time too: with the broker's clock two days back, the
    journal keeps stamping at its newest record's time, and a producer publishing meanwhile is seen
    then, not two days before it. (Stamped with the clock instead, every producer publishing during
    the step looked idle for two days and was forgotten at the next tick: the chaos run's clock
    jumps saw every publisher refused PRODUCER_UNKNOWN.)"""
    wall = [1_000_000_000]
    core = BrokerCore(_config(tmp_path, producer_ttl_ms=86_400_000), wall_ms=lambda: wall[0]).open()
    _producer(core, b"a", "orders-0")
    _send(core, b"a", _batch(1, b"1"))
    wall[0] -= 2 * 86_400_000
    _send(core, b"a", _batch(2, b"2"))
    _producer(core, b"b", "orders-1")  # a claim during the step
    core.tick(now=1.0)
    assert _send(core, b"a", _batch(3, b"3"), Ping()) == [PingOk()]
    wall[0] += 2 * 86_400_000 + 1000  # the clock right again
    core.tick(now=2.0)
    assert _send(core, b"a", _batch(3, b"3"), _batch(4, b"4"), Ping()) == [PingOk()]  # known: the resend dropped
    assert set(core.streams["prices"].journal.producers.producers) == {"orders-0", "orders-1"}
    assert _bodies(core) == [b"1", b"2", b"3", b"4"]
    core.close()


def test_the_producer_table_is_bounded(tmp_path: Path) -> None:
    core = BrokerCore(_config(tmp_path, max_producers=1)).open()
    _producer(core, b"a", "one")
    [refusal] = _send(core, b"b", Attach(stream="prices", version=6), Produce(producer="two"))[1:]
    assert isinstance(refusal, InvalidCode) and refusal.code == Refusal.PRODUCER_LIMIT
    assert "holds 1 producers for this stream, its limit" in refusal.reason
    core.close()


@pytest.mark.parametrize("version", [1, 5])
def test_a_peer_below_version_6_is_unchanged(core: BrokerCore, version: int) -> None:
    """A version-1 peer (the zproto C codec) publishes as before: at-least-once, no new commands."""
    _producer(core, b"idem", "orders-0")  # an idempotent producer on the same stream meanwhile
    _send(core, b"idem", _batch(1, b"i"))
    assert _send(core, b"old", Attach(stream="prices", version=version)) == [AttachOk()]
    assert _send(core, b"old", Publish(key="k", body=b"p"), Publish(key="k", body=b"p"), Ping()) == [PingOk()]
    assert _bodies(core) == [b"i", b"p", b"p"]
    [refusal] = _send(core, b"old", Produce(producer="x"))
    assert "needs protocol version 6" in refusal.reason


def test_each_group_mark_of_one_flush_holds_the_producer_as_the_group_ends(tmp_path: Path) -> None:
    """The table's entries change in place as publishes arrive; a group closed mid-flush must record
    the producer as it was then, not as later publishes of the same flush left it (else a crash that
    tears a later group would leave the table claiming records the journal lost)."""
    segment = 64 * 1024  # groups of a quarter segment: 16 KiB
    core = BrokerCore(_config(tmp_path, segment_bytes=segment)).open()
    _producer(core, b"a", "orders-0")
    for sequence in range(1, 41):  # 40 one-message frames of 1 KiB in one flush: about 3 groups
        core.receive(b"a", encode_publish_seq(sequence, "k", bytes(1024)), now=0.0)
    core.flush_appends()
    core.close()
    [segment_file] = (tmp_path / "prices").glob("*.log")
    data = segment_file.read_bytes()
    starts, marks, _ = walk_segment(data, 1)
    groups = [(start, producers) for start, _, kind, producers in marks if kind == GROUP and producers]
    assert len(groups) >= 3, groups
    for i, (start, producers) in enumerate(groups):
        end = groups[i + 1][0] if i + 1 < len(groups) else len(data)
        held = [RECORD.unpack_from(data, at)[2] for at in starts if start < at < end]
        if held:  # a group's mark: the producer as it is once the group's records are written
            assert producers["orders-0"].sequence == held[-1]


@pytest.mark.parametrize(
    ("frame", "reason"),
    [
        (encode_publish_seq(1, "k", b"body")[:9], "PUBLISH-SEQ truncated before key"),
        (encode_publish_seq(1, "k", b"body") + b"!", "has bytes after its last field"),
        (encode_publish_seq(1, "k", b"body").replace(b"\x01k", b"\x01\x01"), "key is not printable ASCII"),
    ],
)  # fmt: skip
def test_a_malformed_publish_seq_of_an_attached_producer_gets_invalid_and_the_session_goes_on(
    core: BrokerCore, frame: bytes, reason: str
) -> None:
    """The broker takes an attached session's PUBLISH-SEQ without the state machine's objects (its
    hot path); a malformed one still gets INVALID with the codec's reason, journals nothing, and the
    session publishes on."""
    _producer(core, b"p", "feed")
    [refusal] = _send(core, b"p", frame)
    assert isinstance(refusal, InvalidCode) and refusal.code == Refusal.BAD_FRAME and reason in refusal.reason
    assert _send(core, b"p", encode_publish_seq(1, "k", b"fine"), Ping()) == [PingOk()]
    assert _bodies(core) == [b"fine"]


def test_a_malformed_plain_publish_of_an_attached_session_gets_invalid_and_the_session_goes_on(
    core: BrokerCore,
) -> None:
    """The same for a plain PUBLISH (a client with ``idempotent=False``), the other one-message frame."""
    assert _send(core, b"p", Attach(stream="prices", version=6)) == [AttachOk()]
    [refusal] = _send(core, b"p", encode(Publish(key="k", body=b"body"))[:-1])
    assert isinstance(refusal, InvalidCode) and refusal.code == Refusal.BAD_FRAME and "body claims" in refusal.reason
    assert _send(core, b"p", Publish(key="k", body=b"fine"), Ping()) == [PingOk()]
    assert _bodies(core) == [b"fine"]

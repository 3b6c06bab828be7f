"""Version 7 in the broker's socket-free core (``BrokerCore``): FETCH (a bounded replay ending with
FETCH-END) and the multicast output (each newly durable run queued once for the group, TAIL on a
silent stream), each decided by the ``now`` passed in. The journal is real (a temporary directory);
no socket is opened."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from zeps.broker.core import BrokerConfig, BrokerCore
from zeps.journal import JournalConfig
from zeps.protocol import (
    LATEST,
    Attach,
    AttachOk,
    Credit,
    DeliverRun,
    Fetch,
    FetchEnd,
    InvalidCode,
    Publish,
    Refusal,
    Tail,
    decode,
    encode,
)
from zeps.protocol.multicast import decode_message

HEARTBEAT, LINGER = 0.5, 0.01  # LINGER: past the broker's 5 ms


def _core(path: Path, **config: Any) -> BrokerCore:
    return BrokerCore(BrokerConfig(path, ("prices",), journal=JournalConfig(fsync="never"), **config)).open()


@pytest.fixture
def core(tmp_path: Path) -> Iterator[BrokerCore]:
    broker = _core(tmp_path)
    yield broker
    broker.close()


def _send(core: BrokerCore, peer: bytes, *commands: Any, now: float = 0.0) -> list[Any]:
    for command in commands:
        core.receive(peer, encode(command), now=now)
    core.flush_appends()
    return [decode(out.frame) for out in core.pump(now=now) if out.peer == peer]


def _publish(core: BrokerCore, keys: list[str]) -> None:
    """One record per key, published by a peer of its own (sequences 1, 2, … in a fresh journal)."""
    _send(core, b"pub", Attach(stream="prices", version=7))
    _send(core, b"pub", *(Publish(key=key, body=key.encode()) for key in keys))


def _fetcher(core: BrokerCore, peer: bytes = b"f", credit: int = 1 << 20) -> None:
    assert _send(core, peer, Attach(stream="prices", version=7), Credit(credit=credit)) == [AttachOk()]


def _rows(frames: list[Any]) -> list[tuple[int, str]]:
    return [(seq, key) for f in frames if isinstance(f, DeliverRun) for seq, key, _, _ in f.items]


def test_a_fetch_delivers_the_matching_records_of_its_range_then_fetch_end(core: BrokerCore) -> None:
    _publish(core, [f"{'a' if i % 2 else 'b'}.{i}" for i in range(1, 11)])
    _fetcher(core)
    frames = _send(core, b"f", Fetch(pattern="a.", first=3, last=8))
    assert _rows(frames) == [(3, "a.3"), (5, "a.5"), (7, "a.7")]
    assert frames[-1] == FetchEnd(first=3, last=8)
    assert core.sessions[b"f"].subscriptions == []  # a fetch never goes live
    _publish(core, ["a.11"])
    assert _rows(_send(core, b"f")) == []


def test_a_fetch_to_latest_stops_at_the_tail_and_one_past_it_covers_nothing(core: BrokerCore) -> None:
    _publish(core, ["k"] * 5)
    _fetcher(core)
    frames = _send(core, b"f", Fetch(pattern="", first=4))
    assert _rows(frames) == [(4, "k"), (5, "k")] and frames[-1] == FetchEnd(first=4, last=5)
    assert _send(core, b"f", Fetch(pattern="", first=LATEST)) == [FetchEnd(first=6, last=5)]  # the tail: 5


def test_fetch_end_says_which_records_retention_removed(tmp_path: Path) -> None:
    core = BrokerCore(BrokerConfig(tmp_path, ("prices",), journal=JournalConfig(
        fsync="never", segment_bytes=4096, retention_bytes=8192))).open()  # fmt: skip
    _send(core, b"pub", Attach(stream="prices", version=7))
    for _ in range(10):  # about 1.3 KiB per round: retention keeps the last two segments or so
        _send(core, b"pub", *(Publish(key="k", body=bytes(100)) for _ in range(10)))
    core.tick(now=1.0)
    oldest = core.streams["prices"].journal.first_sequence
    assert oldest > 1
    _fetcher(core)
    frames = _send(core, b"f", Fetch(pattern="", first=1, last=oldest + 1))
    assert [seq for seq, _ in _rows(frames)] == [oldest, oldest + 1]
    assert frames[-1] == FetchEnd(first=oldest, last=oldest + 1)  # 1 .. oldest-1 are gone
    assert _send(core, b"f", Fetch(pattern="", first=1, last=oldest - 1)) == [FetchEnd(first=oldest, last=oldest - 1)]
    core.close()


def test_one_fetch_at_a_time_and_only_from_version_7(core: BrokerCore) -> None:
    _publish(core, ["k"] * 3)
    _fetcher(core, credit=10)  # too little credit for one record: the fetch stays open
    assert _send(core, b"f", Fetch(pattern="", first=1)) == []
    [refusal] = _send(core, b"f", Fetch(pattern="", first=1))
    assert isinstance(refusal, InvalidCode) and refusal.code == Refusal.LIMIT
    frames = _send(core, b"f", Credit(credit=1 << 20))  # credit: the open fetch goes on and ends
    assert [seq for seq, _ in _rows(frames)] == [1, 2, 3] and frames[-1] == FetchEnd(first=1, last=3)
    assert _send(core, b"old", Attach(stream="prices", version=6)) == [AttachOk()]
    [refusal] = _send(core, b"old", Fetch(pattern="", first=1))
    assert "needs protocol version 7" in refusal.reason


def test_a_fetch_end_the_adapter_could_not_send_is_sent_again(core: BrokerCore) -> None:
    _publish(core, ["k"] * 3)
    _fetcher(core)
    core.receive(b"f", encode(Fetch(pattern="", first=1)), now=0.0)
    out = core.pump(now=0.0)
    assert [type(decode(o.frame)) for o in out] == [DeliverRun, FetchEnd]
    for item in out:  # the peer's queue was full: neither went
        core.unsent(item, now=0.0)
    again = [decode(o.frame) for o in core.pump(now=1.0)]
    assert [seq for seq, _ in _rows(again)] == [1, 2, 3] and again[-1] == FetchEnd(first=1, last=3)


def test_every_durable_run_is_queued_once_for_the_group_and_a_silent_stream_sends_tail(tmp_path: Path) -> None:
    core = _core(tmp_path, multicast_heartbeat_s=HEARTBEAT)
    _send(core, b"sub", Attach(stream="prices", version=7), Credit(credit=1 << 20))  # receivers do not matter
    _publish(core, ["a", "b"])
    assert core.take_multicast(now=0.0) == []  # runs gather for the linger (more may come)
    _publish(core, ["c"])
    [run] = [decode_message(m, "prices") for m in core.take_multicast(now=LINGER)]  # one message for both flushes
    assert isinstance(run, DeliverRun) and [(s, k) for s, k, _, _ in run.items] == [(1, "a"), (2, "b"), (3, "c")]
    _publish(core, ["d"])
    core.take_multicast(now=1.0)
    [run] = [decode_message(m, "prices") for m in core.take_multicast(now=1.0 + LINGER)]
    assert isinstance(run, DeliverRun) and [s for s, _, _, _ in run.items] == [4]
    later = 1.0 + LINGER + HEARTBEAT
    assert [decode_message(m, "prices") for m in core.take_multicast(now=later)] == [Tail(sequence=4)]
    assert core.take_multicast(now=later + HEARTBEAT / 2) == []  # one TAIL per heartbeat
    assert core.streams["prices"].outbox.records == 4
    core.close()


def test_no_multicast_output_unless_configured(core: BrokerCore) -> None:
    _publish(core, ["a"])
    assert core.take_multicast(now=100.0) == []


def test_runs_are_cut_to_the_largest_multicast_message_and_an_oversize_record_is_left_out(tmp_path: Path) -> None:
    """NORM in libzmq 4.3.4 loses messages over about 2 KiB: the broker cuts runs to fit, and leaves a
    record that cannot fit alone to the journal (receivers see the gap and fetch it)."""
    core = _core(tmp_path, multicast_heartbeat_s=HEARTBEAT, multicast_max_bytes=200)
    _send(core, b"pub", Attach(stream="prices", version=7))
    _send(core, b"pub", *(Publish(key="k", body=bytes(60 if i != 4 else 300)) for i in range(8)))
    messages = core.take_multicast(now=0.0) + core.take_multicast(now=LINGER)  # full messages go at once
    assert all(len(frames[1]) <= 200 for frames in messages) and len(messages) >= 3
    runs = [decode_message(m, "prices") for m in messages]
    sent = [s for run in runs for s, _, _, _ in run.items]  # type: ignore[union-attr]
    assert sent == [1, 2, 3, 4, 6, 7, 8]  # record 5 (300 bytes) does not fit a message
    stream = core.streams["prices"]
    assert stream.outbox.records == 7 and stream.outbox.oversize == 1
    core.close()
